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
use crate::ids::{BackendId, Counter, UpstreamId, WaiterId};
use crate::message::{Purpose, Response, UpstreamFailure, UpstreamRequest, UpstreamResponse};
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

/// The `/healthz` check as a part of the estate: at most one under way, asking every configured
/// backend, shared by every client that asks meanwhile.
#[derive(Debug, Default)]
pub(crate) struct Reachability {
    check: Option<ReachabilityCheck>,
}

impl Reachability {
    /// Makes `waiters` wait for the check under way, or starts one asking `backends` for them;
    /// returns the requests to send.
    pub(crate) fn join(
        &mut self,
        waiters: Vec<WaiterId>,
        (backends, ids): (&[BackendId], &mut Counter),
        deadline: std::time::Instant,
    ) -> Vec<UpstreamRequest> {
        if let Some(check) = &mut self.check {
            check.waiters.extend(waiters);
            return Vec::new();
        }
        let (calls, requests) = Broadcast::send(
            ids,
            (backends, Purpose::Healthz),
            &[REACHABILITY_PATH],
            deadline,
        );
        self.check = Some(ReachabilityCheck { waiters, calls });
        requests
    }

    /// An upstream answer (one of the check's or not).
    pub(crate) fn record_response(&mut self, id: UpstreamId, response: &UpstreamResponse) {
        if let Some(check) = &mut self.check {
            check.calls.record_response(id, response);
        }
    }

    /// An upstream failure (one of the check's or not).
    pub(crate) fn record_failure(&mut self, id: UpstreamId, failure: &UpstreamFailure) {
        if let Some(check) = &mut self.check {
            check.calls.record_failure(id, failure);
        }
    }

    /// Time passed: the calls past their deadline, timed out (to cancel).
    pub(crate) fn expire(&mut self, now: std::time::Instant) -> Vec<UpstreamId> {
        self.check
            .as_mut()
            .map(|check| check.calls.expire(now))
            .unwrap_or_default()
    }

    /// The next deadline of the check under way.
    pub(crate) fn deadline(&self) -> Option<std::time::Instant> {
        self.check.as_ref().and_then(|c| c.calls.deadline())
    }

    /// A waiting client left.
    pub(crate) fn waiter_gone(&mut self, waiter: WaiterId) {
        if let Some(check) = &mut self.check {
            check.waiters.retain(|w| *w != waiter);
        }
    }

    /// The check, once every call has a result (it is no longer under way).
    pub(crate) fn take_complete(&mut self) -> Option<ReachabilityCheck> {
        match &self.check {
            Some(check) if check.calls.is_complete() => self.check.take(),
            _ => None,
        }
    }

    /// Abandons the check under way (other backends): its unanswered calls, and its waiters
    /// (to start it again for).
    pub(crate) fn abandon(&mut self) -> Option<(Vec<UpstreamId>, Vec<WaiterId>)> {
        self.check
            .take()
            .map(|check| (check.calls.pending_ids(), check.waiters))
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
