//! `/healthz`: a live reachability check of every backend, shared by concurrent callers.
//!
//! Each check asks every backend `GET /pdb/meta/v1/version` within `timeout`, whether or not
//! queries are currently skipping it; callers that arrive while a check runs share its result.

use http::StatusCode;
use serde::Serialize;

use crate::cache::CacheReport;
use crate::clock::ClockAnchor;
use crate::config::Config;
use crate::ids::WaiterId;
use crate::legs::Legs;
use crate::message::Response;
use crate::scrub::scrub_addresses;

/// The path asked of every backend by the reachability check.
pub const REACHABILITY_PATH: &str = "/pdb/meta/v1/version";

/// A reachability check in flight and the callers waiting on it.
#[derive(Debug)]
pub(crate) struct ReachabilityCheck {
    pub(crate) waiters: Vec<WaiterId>,
    pub(crate) legs: Legs,
}

impl ReachabilityCheck {
    /// The `/healthz` response for a complete check, with the cache's state (`None`: no cache).
    pub(crate) fn response(
        &self,
        config: &Config,
        cache: Option<&CacheReport>,
        clock: &ClockAnchor,
    ) -> Response {
        let backends: Vec<BackendReport<'_>> = self
            .legs
            .0
            .iter()
            .map(|leg| {
                let error = match &leg.result {
                    Some(Err(error)) => Some(
                        String::from_utf8_lossy(&scrub_addresses(
                            error.as_bytes(),
                            &config.backends,
                        ))
                        .into_owned(),
                    ),
                    _ => None,
                };
                BackendReport {
                    name: config
                        .backends
                        .get(leg.backend.0)
                        .map_or("?", |b| b.name.as_str()),
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
        let cache = match cache {
            Some(report) => CacheSection {
                backend: "memory",
                ttl: format!("{}s", report.ttl.as_secs()),
                entries: report.stats.entries,
                stale_entries: report.stats.stale_entries,
                bytes: report.stats.bytes,
                serving_stale: report.serving_stale,
                stale_served: report.stale_served,
                last_stale_served: report.last_stale_served.map(|at| clock.rfc3339(at)),
            },
            None => CacheSection {
                backend: "none",
                ttl: "0s".to_owned(),
                ..CacheSection::default()
            },
        };
        let body = HealthReport {
            status: word,
            backends,
            cache,
        };
        match serde_json::to_vec(&body) {
            Ok(bytes) => Response::json(status, bytes),
            Err(error) => Response::text(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("pdbmux: {error}"),
            ),
        }
    }
}

#[derive(Serialize)]
struct HealthReport<'a> {
    status: &'static str,
    backends: Vec<BackendReport<'a>>,
    cache: CacheSection,
}

#[derive(Serialize, Default)]
struct CacheSection {
    backend: &'static str,
    ttl: String,
    entries: usize,
    stale_entries: usize,
    bytes: u64,
    serving_stale: bool,
    stale_served: u64,
    last_stale_served: Option<String>,
}

#[derive(Serialize)]
struct BackendReport<'a> {
    name: &'a str,
    reachable: bool,
    error: Option<String>,
}
