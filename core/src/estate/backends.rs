//! The part of the estate that watches its backends: the prober (each backend's health from its
//! probes), the last query rounds, and the `/healthz` reachability check under way. Its inputs
//! are time, the answers to the requests it sent and a reload; what it asks of the runtime goes
//! on the estate's output queue, handed to each call.

use std::collections::VecDeque;
use std::time::Instant;

use super::asked::UpstreamEnd;
use super::EstateOutput;
use crate::cache::CacheReport;
use crate::clock::ClockAnchor;
use crate::config::Config;
use crate::health::{ProbeSettings, Prober, ProberOutput};
use crate::healthz::{QueryRounds, Reachability, Round};
use crate::ids::{BackendId, Counter, UpstreamId, WaiterId};
use crate::stats::BackendStats;

/// The estate's output queue, which every part pushes onto.
pub(super) type Outputs = VecDeque<EstateOutput>;

/// The backends as the estate watches them (see the module doc).
#[derive(Debug)]
pub(super) struct BackendWatch {
    prober: Prober,
    rounds: QueryRounds,
    reachability: Reachability,
}

impl BackendWatch {
    /// Watches `config`'s backends, none probed yet.
    pub(super) fn new(now: Instant, config: &Config) -> BackendWatch {
        BackendWatch {
            prober: Prober::new(
                now,
                ProbeSettings::from_config(config),
                config.backends.len(),
            ),
            rounds: QueryRounds::default(),
            reachability: Reachability::default(),
        }
    }

    /// The backends in service, in configured order.
    pub(super) fn roster(&self) -> Vec<BackendId> {
        self.prober.roster()
    }

    /// The roster less `left_out`, unless that leaves nobody (then the whole roster).
    pub(super) fn roster_without(&self, left_out: &[BackendId]) -> Vec<BackendId> {
        self.prober.roster_without(left_out)
    }

    /// Counts a finished merged fan-out for `/healthz`.
    pub(super) fn record_round(&mut self, now: Instant, round: Round) {
        self.rounds.record(now, round);
    }

    /// Sends the probes that are due.
    pub(super) fn send_due_probes(
        &mut self,
        now: Instant,
        ids: &mut Counter,
        outputs: &mut Outputs,
    ) {
        self.prober.send_due(now, ids);
        self.drain_prober(outputs);
    }

    fn drain_prober(&mut self, outputs: &mut Outputs) {
        outputs.extend(std::iter::from_fn(|| self.prober.poll_output()).map(
            |output| match output {
                ProberOutput::Send(request) => EstateOutput::Send(request),
                ProberOutput::Cancel(id) => EstateOutput::Cancel(id),
            },
        ));
    }

    /// The answer to one of the prober's probes: recorded, and the next ones sent.
    pub(super) fn probe_answered(
        &mut self,
        now: Instant,
        (id, answer): (UpstreamId, UpstreamEnd<'_>),
        (ids, config): (&mut Counter, &Config),
        outputs: &mut Outputs,
    ) {
        let backends = &config.backends;
        match answer {
            UpstreamEnd::Response(response) => {
                self.prober
                    .handle_response(now, (id, response), (ids, backends))
            }
            UpstreamEnd::Failure(failure) => {
                self.prober
                    .handle_failure(now, (id, failure), (ids, backends))
            }
        };
        self.drain_prober(outputs);
    }

    /// The answer to one of the `/healthz` check's calls, noted for the check under way (one of
    /// an abandoned check is ignored).
    pub(super) fn check_answered(&mut self, id: UpstreamId, answer: UpstreamEnd<'_>) {
        match answer {
            UpstreamEnd::Response(response) => self.reachability.record_response(id, response),
            UpstreamEnd::Failure(failure) => self.reachability.record_failure(id, failure),
        }
    }

    /// Makes `waiters` wait for the `/healthz` check under way, or starts one asking every
    /// configured backend within `config.timeout`.
    pub(super) fn join_check(
        &mut self,
        now: Instant,
        waiters: Vec<WaiterId>,
        (ids, config): (&mut Counter, &Config),
        outputs: &mut Outputs,
    ) {
        let backends: Vec<BackendId> = (0..config.backends.len()).map(BackendId).collect();
        let sends = self
            .reachability
            .join(waiters, (&backends, ids), now + config.timeout);
        outputs.extend(sends.into_iter().map(EstateOutput::Send));
    }

    /// Answers every waiter of the `/healthz` check once it has every result; `cache` gives the
    /// cache's state then (it is read only for a complete check).
    pub(super) fn finish_check(
        &mut self,
        (config, clock): (&Config, &ClockAnchor),
        cache: impl FnOnce() -> (Option<CacheReport>, Option<bool>),
        outputs: &mut Outputs,
    ) {
        let Some(check) = self.reachability.take_complete() else {
            return;
        };
        let (cache, shared) = cache();
        let health: Vec<_> = (0..config.backends.len())
            .map(|b| self.prober.report(BackendId(b)))
            .collect();
        let response = check.response(
            config,
            &health,
            &self.rounds,
            (cache.as_ref(), shared),
            clock,
        );
        outputs.extend(
            check
                .waiters
                .into_iter()
                .map(|waiter| EstateOutput::Respond {
                    waiter,
                    response: response.clone(),
                }),
        );
    }

    /// Time passed: overdue probes count as timed out and the due ones are sent; the check's
    /// calls past their deadline are cancelled. Whether any were (the check may be complete).
    pub(super) fn handle_timeout(
        &mut self,
        now: Instant,
        (ids, config): (&mut Counter, &Config),
        outputs: &mut Outputs,
    ) -> bool {
        self.prober.handle_timeout(now, (ids, &config.backends));
        self.drain_prober(outputs);
        let expired = self.reachability.expire(now);
        let any = !expired.is_empty();
        outputs.extend(expired.into_iter().map(EstateOutput::Cancel));
        any
    }

    /// The next instant [`BackendWatch::handle_timeout`] is due, if any.
    pub(super) fn deadline(&self) -> Option<Instant> {
        [self.reachability.deadline(), self.prober.deadline()]
            .into_iter()
            .flatten()
            .min()
    }

    /// A client waiting on the check left.
    pub(super) fn waiter_gone(&mut self, waiter: WaiterId) {
        self.reachability.waiter_gone(waiter);
    }

    /// A reload with new probe settings or backends: each backend that stays (`carried[i]`: its
    /// old index) keeps its health and transitions; probes in flight are dropped. With other
    /// backends the rounds start again and the check under way is abandoned: its waiters are
    /// returned, to join a new one.
    pub(super) fn reconfigure(
        &mut self,
        now: Instant,
        (config, carried): (&Config, &[Option<usize>]),
        same_backends: bool,
        outputs: &mut Outputs,
    ) -> Option<Vec<WaiterId>> {
        let probes = self
            .prober
            .reconfigure(now, ProbeSettings::from_config(config), carried);
        abandon(outputs, probes);
        if same_backends {
            return None;
        }
        self.rounds = QueryRounds::default();
        let (pending, waiters) = self.reachability.abandon()?;
        abandon(outputs, pending);
        Some(waiters)
    }

    /// Each configured backend's health for the metrics; its part of the membership map is the
    /// membership part's to fill in (left at zero here).
    pub(super) fn stats(&self, config: &Config) -> Vec<BackendStats> {
        (0..config.backends.len())
            .map(BackendId)
            .map(|backend| BackendStats {
                name: crate::status::backend_name(&config.backends, backend).to_owned(),
                state: self
                    .prober
                    .report(backend)
                    .map_or("unmonitored", |r| r.state.as_str()),
                transitions: self.prober.transitions(backend),
                owned_nodes: 0,
                membership_age: std::time::Duration::ZERO,
                membership_failures: 0,
            })
            .collect()
    }
}

/// Drops `ids` from the requests still queued to send and cancels them (the rest may be in
/// flight): the estate's own requests to backends a reload replaced.
pub(super) fn abandon(outputs: &mut Outputs, ids: Vec<UpstreamId>) {
    outputs.retain(|output| !matches!(output, EstateOutput::Send(r) if ids.contains(&r.id)));
    outputs.extend(ids.into_iter().map(EstateOutput::Cancel));
}

#[cfg(test)]
#[allow(clippy::disallowed_methods)] // tests need one real instant to start from
mod tests {
    use super::*;
    use crate::estate::tests::config;
    use crate::message::{Purpose, UpstreamRequest, UpstreamResponse};

    fn sends(outputs: &mut Outputs) -> Vec<UpstreamRequest> {
        outputs
            .drain(..)
            .filter_map(|output| match output {
                EstateOutput::Send(request) => Some(request),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_probe_answer_is_taken_and_the_check_answers_its_waiters_once_every_backend_did() {
        let now = Instant::now();
        let config = Config {
            health_probe_enabled: true,
            ..config(&[("a", 1), ("b", 2)])
        };
        let (mut watch, mut ids, mut outputs) = (
            BackendWatch::new(now, &config),
            Counter::default(),
            Outputs::new(),
        );
        watch.send_due_probes(now, &mut ids, &mut outputs);
        let probes = sends(&mut outputs);
        assert_eq!(probes.len(), 2);
        assert!(probes.iter().all(|r| r.purpose == Purpose::Probe));
        let ok = || UpstreamResponse::full(http::StatusCode::OK, "application/json", "{}");
        watch.probe_answered(
            now,
            (probes[0].id, UpstreamEnd::Response(&ok())),
            (&mut ids, &config),
            &mut outputs,
        );
        assert_eq!(watch.stats(&config)[0].state, "healthy");

        let clock = ClockAnchor {
            instant: now,
            wall: std::time::UNIX_EPOCH,
        };
        watch.join_check(now, vec![WaiterId(7)], (&mut ids, &config), &mut outputs);
        let calls = sends(&mut outputs);
        assert_eq!(calls.len(), 2, "the check asks every configured backend");
        for call in &calls {
            watch.finish_check((&config, &clock), || (None, None), &mut outputs);
            assert!(outputs.is_empty(), "no answer before every call has one");
            watch.check_answered(call.id, UpstreamEnd::Response(&ok()));
        }
        watch.finish_check((&config, &clock), || (None, None), &mut outputs);
        match outputs.pop_front() {
            Some(EstateOutput::Respond { waiter, response }) => {
                assert_eq!(waiter, WaiterId(7));
                assert_eq!(response.status, http::StatusCode::OK);
            }
            other => panic!("the waiter is answered: {other:?}"),
        }
    }

    #[test]
    fn a_reload_with_other_backends_abandons_the_check_and_hands_back_its_waiters() {
        let now = Instant::now();
        let old = config(&[("a", 1), ("b", 2)]);
        let (mut watch, mut ids, mut outputs) = (
            BackendWatch::new(now, &old),
            Counter::default(),
            Outputs::new(),
        );
        watch.join_check(now, vec![WaiterId(1)], (&mut ids, &old), &mut outputs);
        let queued: Vec<UpstreamId> = outputs
            .iter()
            .filter_map(|o| match o {
                EstateOutput::Send(r) => Some(r.id),
                _ => None,
            })
            .collect();
        assert_eq!(queued.len(), 2);
        let new = config(&[("c", 3)]);
        let waiters = watch.reconfigure(now, (&new, &[None]), false, &mut outputs);
        assert_eq!(waiters, Some(vec![WaiterId(1)]));
        assert!(
            !outputs.iter().any(|o| matches!(o, EstateOutput::Send(_))),
            "the old calls are not sent"
        );
        let cancelled: Vec<UpstreamId> = outputs
            .iter()
            .filter_map(|o| match o {
                EstateOutput::Cancel(id) => Some(*id),
                _ => None,
            })
            .collect();
        assert_eq!(cancelled, queued);
        assert_eq!(watch.deadline(), None, "no check is under way");
    }
}
