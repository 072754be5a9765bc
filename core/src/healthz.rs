//! `/healthz`: a live reachability check of every backend, shared by concurrent callers.
//!
//! Each check asks every backend `GET /pdb/meta/v1/version` within `timeout`, whether or not
//! queries are currently skipping it; callers that arrive while a check runs share its result.

use http::StatusCode;
use serde::Serialize;

use crate::broadcast::Broadcast;
use crate::cache::CacheReport;
use crate::clock::ClockAnchor;
use crate::config::Config;
use crate::health::BackendHealthReport;
use crate::ids::WaiterId;
use crate::message::Response;
use crate::scrub::scrub_addresses;

/// The path asked of every backend by the reachability check.
pub const REACHABILITY_PATH: &str = "/pdb/meta/v1/version";

/// One finished merged fan-out, as `/healthz` counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Round {
    /// Backends asked.
    pub asked: usize,
    /// Backends whose records went into the answer.
    pub contributed: usize,
    /// Every backend refused the request with the same 4xx: the request's fault, not a partial.
    pub refused: bool,
}

impl Round {
    /// Fewer contributors than configured backends, unless every backend refused the request (a
    /// unanimous 4xx is the request's fault): the answer lacks part of the estate.
    pub fn is_partial(&self) -> bool {
        !self.refused && self.contributed < self.asked
    }
}

/// The `/healthz` query object: the last merged fan-out and the partial rounds so far.
#[derive(Debug, Clone, Default)]
pub struct QueryRounds {
    last: Option<Round>,
    partial_rounds: u64,
    last_partial: Option<std::time::Instant>,
}

impl QueryRounds {
    /// Counts a finished merged fan-out; fewer contributors than asked is a partial round,
    /// unless every backend refused the request (a unanimous 4xx).
    pub fn record(&mut self, now: std::time::Instant, round: Round) {
        if round.refused {
            return;
        }
        if round.is_partial() {
            self.partial_rounds += 1;
            self.last_partial = Some(now);
        }
        self.last = Some(round);
    }
}

/// A reachability check in flight and the callers waiting on it.
#[derive(Debug)]
pub(crate) struct ReachabilityCheck {
    pub(crate) waiters: Vec<WaiterId>,
    pub(crate) calls: Broadcast,
}

impl ReachabilityCheck {
    /// The `/healthz` response for a complete check, with the cache's state (`None`: no cache).
    pub(crate) fn response(
        &self,
        config: &Config,
        health: &[Option<BackendHealthReport>],
        rounds: &QueryRounds,
        (cache, shared): (Option<&CacheReport>, Option<bool>),
        clock: &ClockAnchor,
    ) -> Response {
        let backends: Vec<BackendReport<'_>> = self
            .calls
            .0
            .iter()
            .map(|leg| {
                let error = match &leg.result {
                    Some(Err(error)) => Some(
                        String::from_utf8_lossy(&scrub_addresses(
                            error.to_string().as_bytes(),
                            &config.backends,
                        ))
                        .into_owned(),
                    ),
                    _ => None,
                };
                let probe = health.get(leg.backend.0).and_then(Option::as_ref);
                let scrub = |text: &str| {
                    String::from_utf8_lossy(&scrub_addresses(text.as_bytes(), &config.backends))
                        .into_owned()
                };
                BackendReport {
                    name: config
                        .backends
                        .get(leg.backend.0)
                        .map_or("?", |b| b.name.as_str()),
                    reachable: error.is_none(),
                    error,
                    state: probe.map_or("unmonitored", |p| p.state.as_str()),
                    consecutive_failures: probe.map_or(0, |p| p.consecutive_failures),
                    consecutive_successes: probe.map_or(0, |p| p.consecutive_successes),
                    last_probe: probe.and_then(|p| p.last_probe).map(|at| clock.rfc3339(at)),
                    last_error: probe.and_then(|p| p.last_error.as_deref()).map(scrub),
                    last_probe_result: probe.and_then(|p| p.last_result).map(|r| r.as_str()),
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
                backend: if shared.is_some() { "redis" } else { "memory" },
                store_reachable: shared,
                ttl: format!("{}s", config.facts_ttl.as_secs()),
                history_ttl: format!("{}s", config.history_ttl.as_secs()),
                aggregate_ttl: format!("{}s", config.aggregate_ttl.as_secs()),
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
                history_ttl: "0s".to_owned(),
                aggregate_ttl: "0s".to_owned(),
                ..CacheSection::default()
            },
        };
        let query = QuerySection {
            partial: rounds.last.is_some_and(|r| r.contributed < r.asked),
            contributed: rounds.last.map(|r| r.contributed),
            configured: config.backends.len(),
            partial_rounds: rounds.partial_rounds,
            last_partial: rounds.last_partial.map(|at| clock.rfc3339(at)),
        };
        let body = HealthReport {
            status: word,
            backends,
            query,
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
    query: QuerySection,
    cache: CacheSection,
}

#[derive(Serialize)]
struct QuerySection {
    partial: bool,
    contributed: Option<usize>,
    configured: usize,
    partial_rounds: u64,
    last_partial: Option<String>,
}

#[derive(Serialize, Default)]
struct CacheSection {
    backend: &'static str,
    /// With a shared store: whether it answers (docs/caching.md); absent for memory only.
    #[serde(skip_serializing_if = "Option::is_none")]
    store_reachable: Option<bool>,
    /// The record sets' TTL (`facts_ttl`).
    ttl: String,
    history_ttl: String,
    aggregate_ttl: String,
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
    state: &'static str,
    consecutive_failures: u32,
    consecutive_successes: u32,
    last_probe: Option<String>,
    last_error: Option<String>,
    /// What the last probe found ([`crate::health::ProbeFinding::as_str`]).
    last_probe_result: Option<&'static str>,
}
