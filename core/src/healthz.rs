//! `/healthz`: a live reachability check of every backend, shared by concurrent callers.
//!
//! Each call asks every backend `GET /pdb/meta/v1/version` within `timeout`, whether or not
//! queries are currently skipping it; callers that arrive while a check runs share its result.

use std::time::Instant;

use http::StatusCode;
use serde::Serialize;

use crate::config::Config;
use crate::ids::{BackendId, UpstreamId, WaiterId};
use crate::message::{Response, UpstreamBody, UpstreamFailure, UpstreamResponse};
use crate::scrub::scrub_addresses;

/// The path asked of every backend by the reachability check.
pub const REACHABILITY_PATH: &str = "/pdb/meta/v1/version";

/// One backend's part in a running check.
#[derive(Debug)]
pub(crate) struct Probe {
    pub(crate) backend: BackendId,
    pub(crate) id: UpstreamId,
    pub(crate) deadline: Instant,
    pub(crate) result: Option<Result<(), String>>,
}

/// A reachability check in flight and the callers waiting on it.
#[derive(Debug)]
pub(crate) struct ReachabilityCheck {
    pub(crate) waiters: Vec<WaiterId>,
    pub(crate) probes: Vec<Probe>,
}

impl ReachabilityCheck {
    /// Records an answer; returns whether the ID belonged to this check.
    pub(crate) fn record_response(&mut self, id: UpstreamId, response: &UpstreamResponse) -> bool {
        let result = if response.status.is_success() {
            Ok(())
        } else {
            let detail = match &response.body {
                UpstreamBody::Full(body) => String::from_utf8_lossy(&body[..body.len().min(200)]).trim().to_owned(),
                UpstreamBody::Held => String::new(),
            };
            Err(format!("answered {}: {detail}", response.status.as_u16()).trim_end_matches([' ', ':']).to_owned())
        };
        self.record(id, result)
    }

    /// Records a failure; returns whether the ID belonged to this check.
    pub(crate) fn record_failure(&mut self, id: UpstreamId, failure: &UpstreamFailure) -> bool {
        self.record(id, Err(failure.to_string()))
    }

    /// Marks probes past their deadline as timed out; returns their IDs.
    pub(crate) fn expire(&mut self, now: Instant) -> Vec<UpstreamId> {
        let mut expired = Vec::new();
        for probe in &mut self.probes {
            if probe.result.is_none() && probe.deadline <= now {
                probe.result = Some(Err(UpstreamFailure::Timeout.to_string()));
                expired.push(probe.id);
            }
        }
        expired
    }

    fn record(&mut self, id: UpstreamId, result: Result<(), String>) -> bool {
        match self.probes.iter_mut().find(|p| p.id == id && p.result.is_none()) {
            Some(probe) => {
                probe.result = Some(result);
                true
            }
            None => false,
        }
    }

    /// The earliest deadline of an unanswered probe.
    pub(crate) fn deadline(&self) -> Option<Instant> {
        self.probes.iter().filter(|p| p.result.is_none()).map(|p| p.deadline).min()
    }

    /// Whether every probe has a result.
    pub(crate) fn is_complete(&self) -> bool {
        self.probes.iter().all(|p| p.result.is_some())
    }

    /// The `/healthz` response for a complete check.
    pub(crate) fn response(&self, config: &Config) -> Response {
        let backends: Vec<BackendReport<'_>> = self
            .probes
            .iter()
            .map(|probe| {
                let error = match &probe.result {
                    Some(Err(error)) => Some(
                        String::from_utf8_lossy(&scrub_addresses(error.as_bytes(), &config.backends)).into_owned(),
                    ),
                    _ => None,
                };
                BackendReport {
                    name: config.backends.get(probe.backend.0).map_or("?", |b| b.name.as_str()),
                    reachable: error.is_none(),
                    error,
                }
            })
            .collect();
        let reachable = backends.iter().filter(|b| b.reachable).count();
        let (status, word) = if reachable == backends.len() {
            (StatusCode::OK, "ok")
        } else if reachable > 0 {
            (StatusCode::OK, "degraded")
        } else {
            (StatusCode::SERVICE_UNAVAILABLE, "down")
        };
        let body = HealthReport { status: word, backends };
        match serde_json::to_vec(&body) {
            Ok(bytes) => Response::json(status, bytes),
            Err(error) => Response::text(StatusCode::INTERNAL_SERVER_ERROR, format!("pdbmux: {error}")),
        }
    }
}

#[derive(Serialize)]
struct HealthReport<'a> {
    status: &'static str,
    backends: Vec<BackendReport<'a>>,
}

#[derive(Serialize)]
struct BackendReport<'a> {
    name: &'a str,
    reachable: bool,
    error: Option<String>,
}
