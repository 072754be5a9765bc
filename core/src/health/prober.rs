//! The prober as a part of the estate: the health table, the probes in flight and the
//! transitions counted, with inputs (time, a probe's answer or failure, a reload) and outputs
//! (probes to send, probes to cancel), drained with [`Prober::poll_output`].

use std::collections::{BTreeMap, VecDeque};
use std::time::Instant;

use super::{BackendHealthReport, HealthTable, ProbeResult, ProbeSettings};
use crate::config::BackendConfig;
use crate::ids::{BackendId, Counter, UpstreamId};
use crate::message::{BodyMode, Purpose, UpstreamFailure, UpstreamRequest, UpstreamResponse};

/// What the prober asks of the estate.
#[derive(Debug)]
pub(crate) enum ProberOutput {
    /// Send this probe.
    Send(UpstreamRequest),
    /// Abandon this probe.
    Cancel(UpstreamId),
}

/// The prober (see the module doc).
#[derive(Debug)]
pub(crate) struct Prober {
    table: HealthTable,
    /// Probes in flight: which backend each answers for.
    in_flight: BTreeMap<UpstreamId, BackendId>,
    /// Transitions per backend, by [`crate::stats::TRANSITIONS`]; they only grow.
    transitions: Vec<[u64; crate::stats::TRANSITIONS.len()]>,
    outputs: VecDeque<ProberOutput>,
}

impl Prober {
    /// A prober of `backends` backends, none probed yet.
    pub(crate) fn new(now: Instant, settings: ProbeSettings, backends: usize) -> Prober {
        Prober {
            table: HealthTable::new(now, settings, backends),
            in_flight: BTreeMap::new(),
            transitions: vec![[0; crate::stats::TRANSITIONS.len()]; backends],
            outputs: VecDeque::new(),
        }
    }

    /// The backends in service, in configured order.
    pub(crate) fn roster(&self) -> Vec<BackendId> {
        self.table.roster()
    }

    /// The roster less `left_out` (backends a request already waited out), unless that leaves
    /// nobody: then every one of them is asked.
    pub(crate) fn roster_without(&self, left_out: &[BackendId]) -> Vec<BackendId> {
        let roster = self.roster();
        let kept: Vec<BackendId> = roster
            .iter()
            .copied()
            .filter(|backend| !left_out.contains(backend))
            .collect();
        if kept.is_empty() {
            roster
        } else {
            kept
        }
    }

    /// One backend's health, for `/healthz` and the metrics (`None`: not configured).
    pub(crate) fn report(&self, backend: BackendId) -> Option<BackendHealthReport> {
        self.table.report(backend)
    }

    /// The transitions `backend` went through since start.
    pub(crate) fn transitions(&self, backend: BackendId) -> [u64; crate::stats::TRANSITIONS.len()] {
        self.transitions.get(backend.0).copied().unwrap_or_default()
    }

    /// Sends the probes that are due.
    pub(crate) fn send_due(&mut self, now: Instant, ids: &mut Counter) {
        for backend in self.table.due_probes(now) {
            let id = UpstreamId(ids.next());
            self.in_flight.insert(id, backend);
            self.outputs.push_back(ProberOutput::Send(UpstreamRequest {
                id,
                backend,
                method: http::Method::GET,
                path_and_query: self.table.settings().path.clone(),
                body: None,
                body_mode: BodyMode::Buffer,
                deadline: now + self.table.settings().timeout,
                purpose: Purpose::Probe,
                correlation: Vec::new(),
            }));
        }
    }

    /// A probe's answer: recorded, and the next probes due sent. One for a probe no longer in
    /// flight (timed out, or dropped by a reload) is ignored.
    pub(crate) fn handle_response(
        &mut self,
        now: Instant,
        (id, response): (UpstreamId, &UpstreamResponse),
        (ids, backends): (&mut Counter, &[BackendConfig]),
    ) {
        let Some(backend) = self.in_flight.remove(&id) else {
            return;
        };
        self.record(now, backend, ProbeResult::from_response(response), backends);
        self.send_due(now, ids);
    }

    /// A probe's failure, as [`Prober::handle_response`] takes an answer.
    pub(crate) fn handle_failure(
        &mut self,
        now: Instant,
        (id, failure): (UpstreamId, &UpstreamFailure),
        (ids, backends): (&mut Counter, &[BackendConfig]),
    ) {
        let Some(backend) = self.in_flight.remove(&id) else {
            return;
        };
        self.record(now, backend, ProbeResult::from_failure(failure), backends);
        self.send_due(now, ids);
    }

    /// Time passed: a probe past its timeout is cancelled and counts as timed out; the probes
    /// due are sent.
    pub(crate) fn handle_timeout(
        &mut self,
        now: Instant,
        (ids, backends): (&mut Counter, &[BackendConfig]),
    ) {
        for backend in self.table.overdue(now) {
            let id = self
                .in_flight
                .iter()
                .find_map(|(id, b)| (*b == backend).then_some(*id));
            if let Some(id) = id {
                self.in_flight.remove(&id);
                self.outputs.push_back(ProberOutput::Cancel(id));
            }
            self.record(now, backend, ProbeResult::timed_out(), backends);
        }
        self.send_due(now, ids);
    }

    /// The next instant [`Prober::handle_timeout`] is due, if any.
    pub(crate) fn deadline(&self) -> Option<Instant> {
        self.table.next_deadline()
    }

    /// New settings or backends (a reload): each backend that stays (`carried[i]`: its old
    /// index) keeps its health and transitions. Returns the probes in flight, abandoned: their
    /// answers would land on other indices (the caller drops or cancels them).
    pub(crate) fn reconfigure(
        &mut self,
        now: Instant,
        settings: ProbeSettings,
        carried: &[Option<usize>],
    ) -> Vec<UpstreamId> {
        let table = std::mem::replace(&mut self.table, HealthTable::new(now, settings.clone(), 0));
        self.table = table.carried(now, settings, carried);
        self.transitions = carried
            .iter()
            .map(|old| {
                old.and_then(|i| self.transitions.get(i).copied())
                    .unwrap_or_default()
            })
            .collect();
        std::mem::take(&mut self.in_flight).into_keys().collect()
    }

    /// The next thing to do, if any.
    pub(crate) fn poll_output(&mut self) -> Option<ProberOutput> {
        self.outputs.pop_front()
    }

    fn record(
        &mut self,
        now: Instant,
        backend: BackendId,
        result: ProbeResult,
        backends: &[BackendConfig],
    ) {
        for transition in self.table.record(now, backend, result) {
            let kind = crate::stats::TRANSITIONS
                .iter()
                .position(|kind| *kind == transition.kind());
            if let (Some(counts), Some(kind)) = (self.transitions.get_mut(backend.0), kind) {
                counts[kind] += 1;
            }
            transition.log(crate::status::backend_name(backends, transition.backend()));
        }
    }
}
