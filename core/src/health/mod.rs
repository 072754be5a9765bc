//! Backend health: the prober's decisions as a pure state machine (README, "Backend health").
//!
//! The [`HealthTable`] keeps one record per backend and is driven by the [`crate::Estate`]: it says
//! which probes are due ([`HealthTable::due_probes`]), takes each probe's result
//! ([`HealthTable::record`]) and answers which backends queries should ask
//! ([`HealthTable::roster`]). It sends nothing and reads no clock; time comes in as `now`.
//!
//! The rules, per backend:
//!
//! - **The latch.** Set by the first reply readable as healthy or unhealthy ([`classify`] says
//!   which: [`ProbeVerdict::sets_latch`]); never by a rejection or a transport failure; never cleared.
//! - **Before the latch** the backend stays in service whatever happens. It is `unprobed` until its
//!   first result; after it `unreachable` while its last probe got no reply (refused, DNS, TLS,
//!   timeout) and `probe_unsupported` while the backend refuses the probe path. Its unsuccessful probes are counted; when the count
//!   reaches `failures`, [`Transition::ProbeUnsupported`] is emitted once per process, and the
//!   first answer after that emits [`Transition::FirstAnswerAfterUnsupported`].
//! - **After the latch** the count restarts (probes before the latch do not count) and the
//!   ordinary hysteresis applies: an in-service backend leaves after `failures` consecutive
//!   unsuccessful probes of any kind, a down one returns after `successes` consecutive successes,
//!   and only a success resets the failure run. A run of rejections emits
//!   [`Transition::RejectionRunStarted`] when it starts; an answer (healthy or unhealthy) ends the
//!   run, a transport failure neither starts nor ends one.
//! - **Fail open.** When every backend is down, the roster is every backend.
//! - **Disabled.** No probe is ever due, every state is `unmonitored`, the roster is every backend.
//!
//! Only transitions come out, never individual probes, so logging them stays quiet (README,
//! "Backend health").

mod classify;
mod prober;

use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::config::Config;
use crate::ids::BackendId;
use crate::message::{ConnectCause, UpstreamBody, UpstreamFailure, UpstreamResponse};

pub use classify::{classify, ProbeVerdict};
pub(crate) use prober::{Prober, ProberOutput};

/// How backends are probed; build it with [`ProbeSettings::from_config`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeSettings {
    /// Whether backends are probed at all (`health_probe_enabled`).
    pub enabled: bool,
    /// The path probed on each backend (`health_probe_path`).
    pub path: String,
    /// Time from one probe's result to the next probe of that backend (`health_probe_interval`).
    pub interval: Duration,
    /// Per-probe deadline (`health_probe_timeout`).
    pub timeout: Duration,
    /// Consecutive unsuccessful probes before a backend leaves the pool, and before a probe that
    /// never answered is reported (`health_probe_failures`; below 1 reads as 1).
    pub failures: u32,
    /// Consecutive successes before a down backend rejoins (`health_probe_successes`; below 1
    /// reads as 1).
    pub successes: u32,
}

impl ProbeSettings {
    /// The settings in a validated configuration; use it when building the estate.
    pub fn from_config(config: &Config) -> ProbeSettings {
        ProbeSettings {
            enabled: config.health_probe_enabled,
            path: config.health_probe_path.clone(),
            interval: config.health_probe_interval,
            timeout: config.health_probe_timeout,
            failures: config.health_probe_failures,
            successes: config.health_probe_successes,
        }
    }
}

/// The result of one probe, as handed to [`HealthTable::record`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProbeResult {
    /// The backend replied with this status and body.
    Answered {
        /// The status.
        status: u16,
        /// The whole body (empty if none was read).
        body: Bytes,
    },
    /// No reply: connect, DNS or TLS failure, a broken connection, an oversized body, or the
    /// probe's deadline passed. Never sets the latch.
    TransportFailure(UpstreamFailure),
}

impl ProbeResult {
    /// The result for an upstream answer to a probe request.
    pub fn from_response(response: &UpstreamResponse) -> ProbeResult {
        ProbeResult::Answered {
            status: response.status.as_u16(),
            body: match &response.body {
                UpstreamBody::Full(body) => body.clone(),
                UpstreamBody::Held => Bytes::new(),
            },
        }
    }

    /// The result for an upstream failure of a probe request.
    pub fn from_failure(failure: &UpstreamFailure) -> ProbeResult {
        ProbeResult::TransportFailure(failure.clone())
    }

    /// The result for a probe whose deadline passed with no answer (see
    /// [`HealthTable::overdue`]).
    pub fn timed_out() -> ProbeResult {
        ProbeResult::from_failure(&UpstreamFailure::Timeout)
    }
}

/// A change worth one log line; [`HealthTable::record`] returns these, never individual probes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transition {
    /// The backend left the pool: its failure run reached the threshold. Queries skip it.
    Down {
        /// Which backend.
        backend: BackendId,
        /// What the last probe found.
        finding: ProbeFinding,
        /// The last probe's error.
        reason: String,
    },
    /// The backend rejoined the pool after enough consecutive successes.
    Up {
        /// Which backend.
        backend: BackendId,
    },
    /// The backend's probe has never answered and its unsuccessful probes reached the failure
    /// threshold; it stays in service, unmonitored. Emitted once per backend per process. Whether
    /// the backend could not be reached or refused the probe path is in `finding`.
    ProbeUnsupported {
        /// Which backend.
        backend: BackendId,
        /// The probe path (`health_probe_path`).
        path: String,
        /// What the probe that reached the threshold found.
        finding: ProbeFinding,
        /// The status of that probe; `None` for a transport failure.
        status: Option<u16>,
        /// That probe's error.
        reason: String,
    },
    /// The first answer after [`Transition::ProbeUnsupported`]: the backend is monitored from now.
    FirstAnswerAfterUnsupported {
        /// Which backend.
        backend: BackendId,
    },
    /// A probe that used to answer is refused: the path moved or its authorization changed. The
    /// refusals count as failures. Emitted when such a run starts.
    RejectionRunStarted {
        /// Which backend.
        backend: BackendId,
        /// The probe path (`health_probe_path`).
        path: String,
        /// The refusal's status.
        status: u16,
    },
}

impl Transition {
    /// The backend the transition is about.
    pub fn backend(&self) -> BackendId {
        match self {
            Transition::Down { backend, .. }
            | Transition::Up { backend }
            | Transition::ProbeUnsupported { backend, .. }
            | Transition::FirstAnswerAfterUnsupported { backend }
            | Transition::RejectionRunStarted { backend, .. } => *backend,
        }
    }

    /// Its kind, as the metrics label it (one of [`crate::stats::TRANSITIONS`]).
    pub fn kind(&self) -> &'static str {
        match self {
            Transition::Down { .. } => "down",
            Transition::Up { .. } => "up",
            Transition::ProbeUnsupported { finding, .. } if finding.is_unreachable() => {
                "unreachable"
            }
            Transition::ProbeUnsupported { .. } => "probe_unsupported",
            Transition::FirstAnswerAfterUnsupported { .. } => "first_answer",
            Transition::RejectionRunStarted { .. } => "rejection_run",
        }
    }

    /// Writes the transition's one log line at its level (down, never answered: WARN; up, first
    /// answer: INFO; rejection run: ERROR). Call it once per transition, with the backend's
    /// configured name; scrub `reason` first if the log must not carry backend addresses.
    pub fn log(&self, backend_name: &str) {
        match self {
            Transition::Down {
                finding, reason, ..
            } => tracing::warn!(
                backend = backend_name,
                cause = finding.as_str(),
                reason = reason.as_str(),
                "backend down: health probes failing; queries skip it"
            ),
            Transition::Up { .. } => tracing::info!(
                backend = backend_name,
                "backend up: health probes succeeding; queries use it again"
            ),
            Transition::ProbeUnsupported {
                finding, reason, ..
            } if finding.is_unreachable() => tracing::warn!(
                backend = backend_name,
                cause = finding.as_str(),
                reason = reason.as_str(),
                "backend unreachable since start: no probe has reached it; kept in service until one \
                 does, and queries it is asked fail meanwhile (check that it runs and its url)"
            ),
            Transition::ProbeUnsupported {
                path,
                finding,
                status,
                reason,
                ..
            } => tracing::warn!(
                backend = backend_name,
                path = path.as_str(),
                cause = finding.as_str(),
                status = status.map(u64::from),
                reason = reason.as_str(),
                "health probe path refused since start; backend kept in service without health \
                 checks (check health_probe_path)"
            ),
            Transition::FirstAnswerAfterUnsupported { .. } => tracing::info!(
                backend = backend_name,
                "health probe answered; backend is health-checked from now on"
            ),
            Transition::RejectionRunStarted { path, status, .. } => tracing::error!(
                backend = backend_name,
                path = path.as_str(),
                status = u64::from(*status),
                "health probe path that used to answer is refused; counting as failures \
                 (fix health_probe_path or set health_probe_enabled: false)"
            ),
        }
    }
}

/// A backend's health as `/healthz` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HealthState {
    /// The probe has answered at least once and the backend is in the pool.
    Healthy,
    /// The probe has answered at least once and the backend is out of the pool.
    Unhealthy,
    /// Probed, but the probe has never answered: the backend refused the probe path (a 404, a
    /// 401); in service, not verified.
    ProbeUnsupported,
    /// Probed, but no probe has ever reached the backend (refused, DNS, TLS, timeout): in service
    /// until one does, and not verified.
    Unreachable,
    /// No probe result yet: in service.
    Unprobed,
    /// Probing is off (`health_probe_enabled: false`): always in service.
    Unmonitored,
}

impl HealthState {
    /// The spelling `/healthz` uses.
    pub fn as_str(self) -> &'static str {
        match self {
            HealthState::Healthy => "healthy",
            HealthState::Unhealthy => "unhealthy",
            HealthState::ProbeUnsupported => "probe_unsupported",
            HealthState::Unreachable => "unreachable",
            HealthState::Unprobed => "unprobed",
            HealthState::Unmonitored => "unmonitored",
        }
    }
}

/// One backend's prober fields for `/healthz`; from [`HealthTable::report`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendHealthReport {
    /// The prober's verdict.
    pub state: HealthState,
    /// Unsuccessful probes in the current run (before the latch: since start).
    pub consecutive_failures: u32,
    /// Successful probes in the current run.
    pub consecutive_successes: u32,
    /// When the last probe result came in; render it with [`crate::ClockAnchor::rfc3339`].
    pub last_probe: Option<Instant>,
    /// The latest probe's error; `None` when it succeeded or there was none.
    pub last_error: Option<String>,
    /// What the latest probe found; `None` before the first.
    pub last_result: Option<ProbeFinding>,
}

/// What one probe found, named so that an operator can tell the causes apart: the PuppetDB down
/// (`connection_refused`), a wrong name (`dns_error`), certificates (`tls_error`), the network
/// (`connect_timeout`, `timeout`), the probe path (`probe_path_not_found`, `probe_rejected`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeFinding {
    /// A healthy answer.
    Ok,
    /// An answer saying the backend is unwell (a 5xx, a 429, a service not running).
    Unhealthy,
    /// The probe path is not there (404, 410).
    PathNotFound,
    /// Another refusal of the probe request (401, 403, 405, 501, a 3xx, ...).
    Rejected,
    /// No connection could be made, for this cause.
    Connect(ConnectCause),
    /// Connected, but no answer within `health_probe_timeout`.
    Timeout,
    /// Connected, but the exchange broke (reset, malformed HTTP).
    TransportError,
    /// The probe was answered with a body over `max_body_bytes`: an answer, but not one to read.
    AnswerTooLarge,
}

impl ProbeFinding {
    /// Its spelling in `/healthz` (`last_probe_result`) and the log's `cause` field.
    pub fn as_str(self) -> &'static str {
        match self {
            ProbeFinding::Ok => "ok",
            ProbeFinding::Unhealthy => "unhealthy",
            ProbeFinding::PathNotFound => "probe_path_not_found",
            ProbeFinding::Rejected => "probe_rejected",
            ProbeFinding::Connect(cause) => cause.as_str(),
            ProbeFinding::Timeout => "timeout",
            ProbeFinding::TransportError => "transport_error",
            ProbeFinding::AnswerTooLarge => "probe_answer_too_large",
        }
    }

    /// Whether the probe got no readable reply (no connection, none in time, an exchange that
    /// broke): evidence about the backend's reachability, not about the probe path.
    pub fn is_unreachable(self) -> bool {
        matches!(
            self,
            ProbeFinding::Connect(_) | ProbeFinding::Timeout | ProbeFinding::TransportError
        )
    }

    fn of_failure(failure: &UpstreamFailure) -> ProbeFinding {
        match failure {
            UpstreamFailure::Connect { cause, .. } => ProbeFinding::Connect(*cause),
            UpstreamFailure::Timeout => ProbeFinding::Timeout,
            UpstreamFailure::Transport(_) => ProbeFinding::TransportError,
            // Probes are read outside the merge budget; were one counted, it is still an
            // answer, just not one to read.
            UpstreamFailure::BodyTooLarge { .. } | UpstreamFailure::OverBudget { .. } => {
                ProbeFinding::AnswerTooLarge
            }
        }
    }

    fn of_refusal(status: u16) -> ProbeFinding {
        if matches!(status, 404 | 410) {
            ProbeFinding::PathNotFound
        } else {
            ProbeFinding::Rejected
        }
    }
}

/// What one probe says, once read.
enum Observation {
    Healthy,
    /// Evidence against the backend; `answered` when it was a reply (which sets the latch).
    Unhealthy {
        reason: String,
        answered: bool,
    },
    Rejected {
        reason: String,
        status: u16,
    },
}

impl Observation {
    /// What the probe says, its status when it got one, and what it found.
    fn read(result: ProbeResult) -> (Observation, Option<u16>, ProbeFinding) {
        match result {
            ProbeResult::Answered { status, body } => {
                let (observation, finding) = match classify(status, &body) {
                    ProbeVerdict::Healthy => (Observation::Healthy, ProbeFinding::Ok),
                    ProbeVerdict::Unhealthy(reason) => (
                        Observation::Unhealthy {
                            reason,
                            answered: true,
                        },
                        ProbeFinding::Unhealthy,
                    ),
                    ProbeVerdict::Rejected(reason) => (
                        Observation::Rejected { reason, status },
                        ProbeFinding::of_refusal(status),
                    ),
                };
                (observation, Some(status), finding)
            }
            ProbeResult::TransportFailure(failure) => (
                Observation::Unhealthy {
                    reason: failure.to_string(),
                    answered: false,
                },
                None,
                ProbeFinding::of_failure(&failure),
            ),
        }
    }

    fn sets_latch(&self) -> bool {
        match self {
            Observation::Healthy => true,
            Observation::Unhealthy { answered, .. } => *answered,
            Observation::Rejected { .. } => false,
        }
    }
}

/// One backend's record: plain data, Pingora-style hysteresis plus the latch.
#[derive(Debug, Clone)]
struct BackendHealth {
    /// The probe has answered at least once (never cleared).
    latched: bool,
    /// In the pool; only consulted once latched.
    up: bool,
    /// At least one result came in.
    probed: bool,
    failures: u32,
    successes: u32,
    /// [`Transition::ProbeUnsupported`] was emitted.
    unsupported_reported: bool,
    /// In a run of rejections after the latch.
    rejecting: bool,
    /// The deadline of the probe in flight.
    in_flight: Option<Instant>,
    /// When the next probe is due (when none is in flight).
    next_due: Instant,
    last_probe: Option<Instant>,
    last_error: Option<String>,
    last_result: Option<ProbeFinding>,
}

impl BackendHealth {
    fn new(now: Instant) -> BackendHealth {
        BackendHealth {
            latched: false,
            up: true,
            probed: false,
            failures: 0,
            successes: 0,
            unsupported_reported: false,
            rejecting: false,
            in_flight: None,
            next_due: now,
            last_probe: None,
            last_error: None,
            last_result: None,
        }
    }

    fn in_service(&self) -> bool {
        !self.latched || self.up
    }
}

/// Every backend's health, in configured order: the prober's whole state.
///
/// Owned by the [`crate::Estate`]. Call [`HealthTable::due_probes`] whenever the estate runs (and
/// at [`HealthTable::next_deadline`]), [`HealthTable::record`] for every probe result, and
/// [`HealthTable::roster`] whenever a request is planned.
#[derive(Debug, Clone)]
pub struct HealthTable {
    settings: ProbeSettings,
    backends: Vec<BackendHealth>,
}

impl HealthTable {
    /// A table for `backends` backends, none probed yet (all in service); the first round of
    /// probes is due at `now`. Create it with the estate.
    pub fn new(now: Instant, settings: ProbeSettings, backends: usize) -> HealthTable {
        HealthTable {
            settings,
            backends: vec![BackendHealth::new(now); backends],
        }
    }

    /// The table for a reload: `settings` from now on, and for each new backend the state of the
    /// old one `carried[i]` names (the same backend under the new configuration), else a fresh
    /// one. Probes in flight are forgotten (the estate cancels them) and every backend's next
    /// probe is due at `now`.
    pub fn carried(
        self,
        now: Instant,
        settings: ProbeSettings,
        carried: &[Option<usize>],
    ) -> HealthTable {
        let backends = carried
            .iter()
            .map(|old| {
                let mut health = old
                    .and_then(|old| self.backends.get(old).cloned())
                    .unwrap_or_else(|| BackendHealth::new(now));
                health.in_flight = None;
                health.next_due = now;
                health
            })
            .collect();
        HealthTable { settings, backends }
    }

    /// The settings the table runs on (the probe path and timeout for the requests).
    pub fn settings(&self) -> &ProbeSettings {
        &self.settings
    }

    /// The backends whose probe is due at `now`, in configured order, now marked in flight with
    /// the deadline `now + timeout`. Turn each into a `GET settings().path` upstream request with
    /// that deadline. A backend with a probe in flight is never returned; none is when disabled.
    pub fn due_probes(&mut self, now: Instant) -> Vec<BackendId> {
        if !self.settings.enabled {
            return Vec::new();
        }
        let deadline = now + self.settings.timeout;
        let mut due = Vec::new();
        for (index, backend) in self.backends.iter_mut().enumerate() {
            if backend.in_flight.is_none() && backend.next_due <= now {
                backend.in_flight = Some(deadline);
                due.push(BackendId(index));
            }
        }
        due
    }

    /// The backends whose probe in flight is past its deadline at `now`, in configured order.
    /// Cancel each one's request and record [`ProbeResult::timed_out`] for it.
    pub fn overdue(&self, now: Instant) -> Vec<BackendId> {
        self.backends
            .iter()
            .enumerate()
            .filter(|(_, backend)| backend.in_flight.is_some_and(|deadline| deadline <= now))
            .map(|(index, _)| BackendId(index))
            .collect()
    }

    /// Takes the result of `backend`'s probe in flight and returns the transitions it caused
    /// (usually none; at most a few). The next probe is due `interval` after `now`. A result for
    /// a backend with no probe in flight (late, doubled, unknown) is ignored.
    pub fn record(
        &mut self,
        now: Instant,
        backend: BackendId,
        result: ProbeResult,
    ) -> Vec<Transition> {
        let settings = &self.settings;
        let Some(health) = self.backends.get_mut(backend.0) else {
            return Vec::new();
        };
        if health.in_flight.take().is_none() {
            return Vec::new();
        }
        health.next_due = now + settings.interval;
        health.last_probe = Some(now);
        health.probed = true;
        let failures = settings.failures.max(1);
        let successes = settings.successes.max(1);
        let (observation, status, finding) = Observation::read(result);
        health.last_result = Some(finding);
        let mut transitions = Vec::new();

        if !health.latched {
            if !observation.sets_latch() {
                let reason = match observation {
                    Observation::Unhealthy { reason, .. }
                    | Observation::Rejected { reason, .. } => reason,
                    Observation::Healthy => String::new(),
                };
                health.failures = health.failures.saturating_add(1);
                health.successes = 0;
                if !health.unsupported_reported && health.failures >= failures {
                    health.unsupported_reported = true;
                    transitions.push(Transition::ProbeUnsupported {
                        backend,
                        path: settings.path.clone(),
                        finding,
                        status,
                        reason: reason.clone(),
                    });
                }
                health.last_error = Some(reason);
                return transitions;
            }
            // The first answer: the probe works, so it is trusted from here on, counting afresh.
            health.latched = true;
            health.up = true;
            health.failures = 0;
            health.successes = 0;
            if health.unsupported_reported {
                transitions.push(Transition::FirstAnswerAfterUnsupported { backend });
            }
        }

        let reason = match observation {
            Observation::Healthy => {
                health.failures = 0;
                health.successes = health.successes.saturating_add(1);
                health.rejecting = false;
                health.last_error = None;
                if !health.up && health.successes >= successes {
                    health.up = true;
                    transitions.push(Transition::Up { backend });
                }
                return transitions;
            }
            Observation::Unhealthy { reason, answered } => {
                if answered {
                    health.rejecting = false;
                }
                reason
            }
            Observation::Rejected { reason, status } => {
                if !health.rejecting {
                    health.rejecting = true;
                    transitions.push(Transition::RejectionRunStarted {
                        backend,
                        path: settings.path.clone(),
                        status,
                    });
                }
                reason
            }
        };
        health.successes = 0;
        health.failures = health.failures.saturating_add(1);
        if health.up && health.failures >= failures {
            health.up = false;
            transitions.push(Transition::Down {
                backend,
                finding,
                reason: reason.clone(),
            });
        }
        health.last_error = Some(reason);
        transitions
    }

    /// The earliest instant the table needs attention: a probe falling due or a probe in flight
    /// reaching its deadline. `None` when disabled. Fold it into the estate's `poll_timeout`.
    pub fn next_deadline(&self) -> Option<Instant> {
        if !self.settings.enabled {
            return None;
        }
        self.backends
            .iter()
            .map(|backend| backend.in_flight.unwrap_or(backend.next_due))
            .min()
    }

    /// The backends queries should ask, in configured order: those in service (latched and up,
    /// or never latched), or every backend when none is (fail open); every backend when disabled.
    /// Call it for each request's fan-out.
    pub fn roster(&self) -> Vec<BackendId> {
        let all = || (0..self.backends.len()).map(BackendId).collect();
        if !self.settings.enabled {
            return all();
        }
        let in_service: Vec<BackendId> = self
            .backends
            .iter()
            .enumerate()
            .filter(|(_, backend)| backend.in_service())
            .map(|(index, _)| BackendId(index))
            .collect();
        if in_service.is_empty() {
            all()
        } else {
            in_service
        }
    }

    /// The prober's fields for `backend` on `/healthz`; `None` for an unknown backend.
    pub fn report(&self, backend: BackendId) -> Option<BackendHealthReport> {
        let health = self.backends.get(backend.0)?;
        if !self.settings.enabled {
            return Some(BackendHealthReport {
                state: HealthState::Unmonitored,
                consecutive_failures: 0,
                consecutive_successes: 0,
                last_probe: None,
                last_error: None,
                last_result: None,
            });
        }
        let state = match (health.latched, health.up, health.probed) {
            (true, true, _) => HealthState::Healthy,
            (true, false, _) => HealthState::Unhealthy,
            (false, _, true) if health.last_result.is_some_and(ProbeFinding::is_unreachable) => {
                HealthState::Unreachable
            }
            (false, _, true) => HealthState::ProbeUnsupported,
            (false, _, false) => HealthState::Unprobed,
        };
        Some(BackendHealthReport {
            state,
            consecutive_failures: health.failures,
            consecutive_successes: health.successes,
            last_probe: health.last_probe,
            last_error: health.last_error.clone(),
            last_result: health.last_result,
        })
    }
}

#[cfg(test)]
mod tests;
