//! The estate's own fan-outs (the `/healthz` check, the membership refresh): one request per
//! backend and query, each with a deadline, complete when every one has a result.

use std::time::Instant;

use bytes::Bytes;
use http::Method;

use crate::ids::{BackendId, Counter, UpstreamId};
use crate::message::{
    BodyMode, Purpose, UpstreamBody, UpstreamFailure, UpstreamRequest, UpstreamResponse,
};
use crate::status::{Failure, Rejected};

/// One backend's part: its request and, once known, its result.
#[derive(Debug)]
pub(crate) struct BroadcastCall {
    pub(crate) backend: BackendId,
    /// Which of the broadcast's queries (index into the paths it was sent with).
    pub(crate) query: usize,
    pub(crate) id: UpstreamId,
    pub(crate) deadline: Instant,
    /// `Ok(body)` for a 2xx; why not for anything else.
    pub(crate) result: Option<Result<Bytes, Failure>>,
}

/// One request to each of several backends, sent together.
#[derive(Debug)]
pub(crate) struct Broadcast(pub(crate) Vec<BroadcastCall>);

impl Broadcast {
    /// Plans one GET of each of `queries` (paths and queries) per backend, all at once; returns
    /// the calls and the requests to send.
    pub(crate) fn send(
        ids: &mut Counter,
        (backends, purpose): (&[BackendId], Purpose),
        queries: &[&str],
        deadline: Instant,
    ) -> (Broadcast, Vec<UpstreamRequest>) {
        let each: Vec<(BackendId, Vec<String>)> = backends
            .iter()
            .map(|backend| (*backend, queries.iter().map(|q| (*q).to_owned()).collect()))
            .collect();
        Broadcast::send_each(ids, purpose, &each, deadline)
    }

    /// Plans one GET of each backend's own queries, all at once; a call's `query` is its index
    /// in its backend's list. Returns the calls and the requests to send.
    pub(crate) fn send_each(
        ids: &mut Counter,
        purpose: Purpose,
        each: &[(BackendId, Vec<String>)],
        deadline: Instant,
    ) -> (Broadcast, Vec<UpstreamRequest>) {
        let mut calls = Vec::new();
        let mut requests = Vec::new();
        for (backend, queries) in each {
            for (query, path_and_query) in queries.iter().enumerate() {
                let id = UpstreamId(ids.next());
                requests.push(UpstreamRequest {
                    id,
                    backend: *backend,
                    method: Method::GET,
                    path_and_query: path_and_query.clone(),
                    body: None,
                    body_mode: BodyMode::Buffer,
                    deadline,
                    purpose,
                    correlation: Vec::new(),
                });
                calls.push(BroadcastCall {
                    backend: *backend,
                    query,
                    id,
                    deadline,
                    result: None,
                });
            }
        }
        (Broadcast(calls), requests)
    }

    /// Whether every one of `backend`'s calls has a result.
    pub(crate) fn answered(&self, backend: BackendId) -> bool {
        self.0
            .iter()
            .filter(|call| call.backend == backend)
            .all(|call| call.result.is_some())
    }

    /// Takes the results of `backend`'s calls in query order: its answers' bodies (moved out,
    /// so each backend's are let go once read rather than held until every one is; the calls
    /// stay answered, with empty bodies), or the first reason one is unusable (a call with no
    /// result counts as timed out).
    pub(crate) fn take_bodies_of(&mut self, backend: BackendId) -> Result<Vec<Bytes>, Failure> {
        let mut mine: Vec<&mut BroadcastCall> = self
            .0
            .iter_mut()
            .filter(|call| call.backend == backend)
            .collect();
        mine.sort_by_key(|call| call.query);
        mine.into_iter()
            .map(|call| match &mut call.result {
                Some(Ok(body)) => Ok(std::mem::take(body)),
                Some(Err(failure)) => Err(failure.clone()),
                None => Err(UpstreamFailure::Timeout.into()),
            })
            .collect()
    }

    /// The backends whose calls had no answer within their deadline: each backend once, in the
    /// order first asked.
    pub(crate) fn timed_out(&self) -> Vec<BackendId> {
        let mut backends: Vec<BackendId> = self
            .0
            .iter()
            .filter(|call| {
                matches!(
                    &call.result,
                    None | Some(Err(Failure::Upstream(UpstreamFailure::Timeout)))
                )
            })
            .map(|call| call.backend)
            .collect();
        backends.dedup();
        backends
    }

    /// Records an answer; returns whether the ID belonged to these calls.
    pub(crate) fn record_response(&mut self, id: UpstreamId, response: &UpstreamResponse) -> bool {
        let result = match (&response.body, response.status.is_success()) {
            (UpstreamBody::Full(body), true) => Ok(body.clone()),
            (UpstreamBody::Held, true) => Err(Failure::HeldBody(response.status)),
            (body, false) => {
                let detail = match body {
                    UpstreamBody::Full(body) => {
                        String::from_utf8_lossy(&body[..body.len().min(200)])
                            .trim()
                            .to_owned()
                    }
                    UpstreamBody::Held => String::new(),
                };
                Err(Failure::Rejected(Rejected {
                    status: response.status,
                    detail,
                }))
            }
        };
        self.record(id, result)
    }

    /// The IDs of the calls still unanswered.
    pub(crate) fn pending_ids(&self) -> Vec<UpstreamId> {
        self.0
            .iter()
            .filter(|call| call.result.is_none())
            .map(|call| call.id)
            .collect()
    }

    /// Records a failure; returns whether the ID belonged to these calls.
    pub(crate) fn record_failure(&mut self, id: UpstreamId, failure: &UpstreamFailure) -> bool {
        self.record(id, Err(failure.clone().into()))
    }

    fn record(&mut self, id: UpstreamId, result: Result<Bytes, Failure>) -> bool {
        match self
            .0
            .iter_mut()
            .find(|call| call.id == id && call.result.is_none())
        {
            Some(call) => {
                call.result = Some(result);
                true
            }
            None => false,
        }
    }

    /// Marks calls past their deadline as timed out; returns their IDs (to cancel).
    pub(crate) fn expire(&mut self, now: Instant) -> Vec<UpstreamId> {
        let mut expired = Vec::new();
        for call in &mut self.0 {
            if call.result.is_none() && call.deadline <= now {
                call.result = Some(Err(UpstreamFailure::Timeout.into()));
                expired.push(call.id);
            }
        }
        expired
    }

    /// The earliest deadline of an unanswered call.
    pub(crate) fn deadline(&self) -> Option<Instant> {
        self.0
            .iter()
            .filter(|call| call.result.is_none())
            .map(|call| call.deadline)
            .min()
    }

    /// Whether every call has a result.
    pub(crate) fn is_complete(&self) -> bool {
        self.0.iter().all(|call| call.result.is_some())
    }
}
