//! The estate's own fan-outs (the `/healthz` check, the membership refresh): one request per
//! backend, each with a deadline, complete when every one has a result.

use std::time::Instant;

use bytes::Bytes;
use http::Method;

use crate::ids::{BackendId, Counter, UpstreamId};
use crate::message::{BodyMode, UpstreamBody, UpstreamFailure, UpstreamRequest, UpstreamResponse};

/// One backend's part: its request and, once known, its result.
#[derive(Debug)]
pub(crate) struct Leg {
    pub(crate) backend: BackendId,
    pub(crate) id: UpstreamId,
    pub(crate) deadline: Instant,
    /// `Ok(body)` for a 2xx; `Err(reason)` for anything else.
    pub(crate) result: Option<Result<Bytes, String>>,
}

/// A set of legs sent together.
#[derive(Debug)]
pub(crate) struct Legs(pub(crate) Vec<Leg>);

impl Legs {
    /// Plans one GET of `path_and_query` per backend; returns the legs and the requests to send.
    pub(crate) fn send(
        ids: &mut Counter,
        backends: &[BackendId],
        path_and_query: &str,
        deadline: Instant,
    ) -> (Legs, Vec<UpstreamRequest>) {
        let mut legs = Vec::with_capacity(backends.len());
        let mut requests = Vec::with_capacity(backends.len());
        for &backend in backends {
            let id = UpstreamId(ids.next());
            requests.push(UpstreamRequest {
                id,
                backend,
                method: Method::GET,
                path_and_query: path_and_query.to_owned(),
                body: None,
                body_mode: BodyMode::Buffer,
                deadline,
            });
            legs.push(Leg {
                backend,
                id,
                deadline,
                result: None,
            });
        }
        (Legs(legs), requests)
    }

    /// Records an answer; returns whether the ID belonged to these legs.
    pub(crate) fn record_response(&mut self, id: UpstreamId, response: &UpstreamResponse) -> bool {
        let result = match (&response.body, response.status.is_success()) {
            (UpstreamBody::Full(body), true) => Ok(body.clone()),
            (UpstreamBody::Held, true) => Err("unexpected held body".to_owned()),
            (body, false) => {
                let detail = match body {
                    UpstreamBody::Full(body) => {
                        String::from_utf8_lossy(&body[..body.len().min(200)])
                            .trim()
                            .to_owned()
                    }
                    UpstreamBody::Held => String::new(),
                };
                let status = response.status.as_u16();
                Err(if detail.is_empty() {
                    format!("answered {status}")
                } else {
                    format!("answered {status}: {detail}")
                })
            }
        };
        self.record(id, result)
    }

    /// Records a failure; returns whether the ID belonged to these legs.
    pub(crate) fn record_failure(&mut self, id: UpstreamId, failure: &UpstreamFailure) -> bool {
        self.record(id, Err(failure.to_string()))
    }

    fn record(&mut self, id: UpstreamId, result: Result<Bytes, String>) -> bool {
        match self
            .0
            .iter_mut()
            .find(|leg| leg.id == id && leg.result.is_none())
        {
            Some(leg) => {
                leg.result = Some(result);
                true
            }
            None => false,
        }
    }

    /// Marks legs past their deadline as timed out; returns their IDs (to cancel).
    pub(crate) fn expire(&mut self, now: Instant) -> Vec<UpstreamId> {
        let mut expired = Vec::new();
        for leg in &mut self.0 {
            if leg.result.is_none() && leg.deadline <= now {
                leg.result = Some(Err(UpstreamFailure::Timeout.to_string()));
                expired.push(leg.id);
            }
        }
        expired
    }

    /// The earliest deadline of an unanswered leg.
    pub(crate) fn deadline(&self) -> Option<Instant> {
        self.0
            .iter()
            .filter(|leg| leg.result.is_none())
            .map(|leg| leg.deadline)
            .min()
    }

    /// Whether every leg has a result.
    pub(crate) fn is_complete(&self) -> bool {
        self.0.iter().all(|leg| leg.result.is_some())
    }
}
