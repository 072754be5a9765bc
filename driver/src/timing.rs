//! Where one request's time went: planning, waiting in the estate (a flight, the first
//! membership map), each upstream call from send to answer, and the core's own work on the
//! answers (parsing and merging happen inside its `handle_*` calls). Logged at debug under the
//! target `pdbmux::timing`, one line per request, so a benchmark can read the phases of the
//! requests it timed (`PDBMUX_LOG_LEVEL=warn,pdbmux::timing=debug`, `bench/latency/`).

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use pdbmux_core::BackendId;

/// The phases of one request, filled in as it is answered.
#[derive(Debug)]
pub struct Timings {
    started: Instant,
    planned: Option<Duration>,
    exchange_started: Option<Duration>,
    upstream: Vec<(BackendId, Duration)>,
    core: Duration,
}

impl Timings {
    /// Starts the clock of a request that has just arrived.
    pub fn start() -> Timings {
        Timings {
            started: Instant::now(),
            planned: None,
            exchange_started: None,
            upstream: Vec::new(),
            core: Duration::ZERO,
        }
    }

    /// The request is planned.
    pub(crate) fn planned(&mut self) {
        self.planned = Some(self.started.elapsed());
    }

    /// Its exchange starts on this task (after any wait in the estate).
    pub(crate) fn exchange_started(&mut self) {
        self.exchange_started = Some(self.started.elapsed());
    }

    /// One upstream call to `backend` took `took`, from send to answer (or failure).
    pub(crate) fn upstream(&mut self, backend: BackendId, took: Duration) {
        self.upstream.push((backend, took));
    }

    /// Each upstream call so far: its backend and how long it took.
    pub(crate) fn upstream_calls(&self) -> &[(BackendId, Duration)] {
        &self.upstream
    }

    /// When the request arrived.
    pub(crate) fn started(&self) -> Instant {
        self.started
    }

    /// Time since the request arrived.
    pub(crate) fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// The core spent `took` in one `handle_*` call.
    pub(crate) fn core(&mut self, took: Duration) {
        self.core += took;
    }

    /// Logs the line, naming backends with `name`; `how` says how the request was answered
    /// (`exchange`, `flight`, `local`).
    pub(crate) fn log(&self, target: &str, how: &str, name: impl Fn(BackendId) -> String) {
        if !tracing::enabled!(target: "pdbmux::timing", tracing::Level::DEBUG) {
            return;
        }
        let micros = |d: Option<Duration>| d.map_or(0, |d| d.as_micros() as u64);
        let mut upstream = String::new();
        for (backend, took) in &self.upstream {
            let _ = write!(upstream, "{}:{} ", name(*backend), took.as_micros());
        }
        let planned = micros(self.planned);
        tracing::debug!(
            target: "pdbmux::timing",
            target = %target,
            how,
            plan_us = planned,
            wait_us = micros(self.exchange_started).saturating_sub(planned),
            upstream_us = upstream.trim_end(),
            core_us = self.core.as_micros() as u64,
            total_us = self.started.elapsed().as_micros() as u64,
        );
    }
}
