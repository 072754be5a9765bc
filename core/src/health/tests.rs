use super::*;

use proptest::prelude::*;

const RUNNING: &str =
    r#"{"puppetdb-status":{"state":"running"},"status-service":{"state":"running"}}"#;
const STARTING: &str =
    r#"{"puppetdb-status":{"state":"starting"},"status-service":{"state":"running"}}"#;
const PATH: &str = "/status/v1/services";

#[allow(clippy::disallowed_methods)] // tests need some instant to start from
fn start() -> Instant {
    Instant::now()
}

fn settings(failures: u32, successes: u32) -> ProbeSettings {
    ProbeSettings {
        enabled: true,
        path: PATH.to_owned(),
        interval: Duration::from_secs(10),
        timeout: Duration::from_secs(5),
        failures,
        successes,
    }
}

fn ok() -> ProbeResult {
    answered(200, RUNNING)
}

fn degraded() -> ProbeResult {
    answered(200, STARTING)
}

fn status(status: u16) -> ProbeResult {
    answered(status, "")
}

fn answered(status: u16, body: &str) -> ProbeResult {
    ProbeResult::Answered {
        status,
        body: Bytes::from(body.to_owned()),
    }
}

fn refused() -> ProbeResult {
    ProbeResult::from_failure(&UpstreamFailure::Connect {
        cause: crate::ConnectCause::Refused,
        detail: "connection refused".into(),
    })
}

/// A table on a simulated clock that probes one backend at a time, each as soon as it is due.
struct Sim {
    table: HealthTable,
    now: Instant,
}

impl Sim {
    fn new(failures: u32, successes: u32, backends: usize) -> Sim {
        let now = start();
        Sim {
            table: HealthTable::new(now, settings(failures, successes), backends),
            now,
        }
    }

    /// Waits until `backend`'s probe is due, sends it, and records `result` for it.
    fn probe(&mut self, backend: usize, result: ProbeResult) -> Vec<Transition> {
        let entry = &self.table.backends[backend];
        if entry.in_flight.is_none() {
            self.now = self.now.max(entry.next_due);
            self.table.due_probes(self.now);
        }
        assert!(self.table.backends[backend].in_flight.is_some());
        self.now += Duration::from_millis(10);
        self.table.record(self.now, BackendId(backend), result)
    }

    /// Probes `backend` with each result and returns every transition.
    fn run(&mut self, backend: usize, results: Vec<ProbeResult>) -> Vec<Transition> {
        results
            .into_iter()
            .flat_map(|result| self.probe(backend, result))
            .collect()
    }

    fn state(&self, backend: usize) -> HealthState {
        self.report(backend).state
    }

    fn report(&self, backend: usize) -> BackendHealthReport {
        self.table
            .report(BackendId(backend))
            .expect("known backend")
    }

    fn roster(&self) -> Vec<usize> {
        self.table.roster().into_iter().map(|b| b.0).collect()
    }
}

fn down(backend: usize, finding: ProbeFinding, reason: &str) -> Transition {
    Transition::Down {
        backend: BackendId(backend),
        finding,
        reason: reason.to_owned(),
    }
}

fn up(backend: usize) -> Transition {
    Transition::Up {
        backend: BackendId(backend),
    }
}

fn rejection_run(backend: usize, status: u16) -> Transition {
    Transition::RejectionRunStarted {
        backend: BackendId(backend),
        path: PATH.to_owned(),
        status,
    }
}

fn unsupported(
    backend: usize,
    finding: ProbeFinding,
    status: Option<u16>,
    reason: &str,
) -> Transition {
    Transition::ProbeUnsupported {
        backend: BackendId(backend),
        path: PATH.to_owned(),
        finding,
        status,
        reason: reason.to_owned(),
    }
}

#[test]
fn unprobed_backends_serve_immediately_and_the_first_round_is_due_at_start() {
    let mut sim = Sim::new(3, 2, 3);
    assert_eq!(sim.roster(), vec![0, 1, 2]);
    assert_eq!(sim.state(1), HealthState::Unprobed);
    assert_eq!(sim.table.next_deadline(), Some(sim.now));
    assert_eq!(
        sim.table.due_probes(sim.now),
        vec![BackendId(0), BackendId(1), BackendId(2)]
    );
    assert_eq!(
        sim.state(1),
        HealthState::Unprobed,
        "in flight is not probed"
    );
}

#[test]
fn the_latch_is_set_by_answers() {
    for result in [
        ok(),
        status(503),
        degraded(),
        status(500),
        status(502),
        status(429),
    ] {
        let mut sim = Sim::new(3, 2, 1);
        sim.probe(0, result.clone());
        assert_eq!(sim.state(0), HealthState::Healthy, "{result:?}");
        assert!(sim.table.backends[0].latched, "{result:?}");
    }
}

#[test]
fn the_latch_is_not_set_by_refusals_or_transport_failures() {
    for result in [
        status(204),
        status(404),
        status(401),
        status(403),
        status(405),
        status(410),
        status(501),
        status(302),
        refused(),
        ProbeResult::timed_out(),
    ] {
        let mut sim = Sim::new(3, 2, 1);
        let transitions = sim.run(0, vec![result.clone(); 50]);
        let never_reached = matches!(result, ProbeResult::TransportFailure(_));
        let want = if never_reached {
            HealthState::Unreachable
        } else {
            HealthState::ProbeUnsupported
        };
        assert_eq!(sim.state(0), want, "{result:?}");
        assert!(!sim.table.backends[0].latched, "{result:?}");
        assert_eq!(sim.roster(), vec![0], "never gated: {result:?}");
        assert_eq!(transitions.len(), 1, "one warning: {result:?}");
        assert_eq!(sim.report(0).consecutive_failures, 50);
    }
}

#[test]
fn three_failures_take_a_backend_out_and_two_successes_bring_it_back() {
    let mut sim = Sim::new(3, 2, 2);
    assert!(sim.run(0, vec![ok(), status(503), status(503)]).is_empty());
    assert_eq!(sim.roster(), vec![0, 1]);
    assert_eq!(
        sim.probe(0, status(503)),
        vec![down(0, ProbeFinding::Unhealthy, "answered 503")]
    );
    assert_eq!(sim.state(0), HealthState::Unhealthy);
    assert_eq!(sim.roster(), vec![1]);
    assert!(
        sim.run(0, vec![status(503); 5]).is_empty(),
        "down stays down"
    );
    assert!(
        sim.probe(0, ok()).is_empty(),
        "one lucky reply does not flap"
    );
    assert_eq!(sim.roster(), vec![1]);
    assert_eq!(sim.probe(0, ok()), vec![up(0)]);
    assert_eq!(sim.state(0), HealthState::Healthy);
    assert_eq!(sim.roster(), vec![0, 1]);
    assert!(sim.run(0, vec![ok(); 5]).is_empty());
    assert_eq!(sim.report(0).consecutive_successes, 7);
}

#[test]
fn one_blip_does_not_flap_and_alternation_never_flips() {
    let mut sim = Sim::new(3, 2, 1);
    assert!(sim.run(0, vec![ok(), status(503), ok()]).is_empty());
    for _ in 0..20 {
        assert!(sim.run(0, vec![status(503), ok()]).is_empty());
        assert!(sim.run(0, vec![refused(), ok(), status(404), ok()]).len() <= 1);
    }
    assert_eq!(sim.state(0), HealthState::Healthy);
    // and once down, alternation never brings it back
    let mut sim = Sim::new(3, 2, 1);
    sim.run(0, vec![ok(), status(503), status(503), status(503)]);
    for _ in 0..20 {
        assert!(sim.run(0, vec![ok(), status(503)]).is_empty());
    }
    assert_eq!(sim.state(0), HealthState::Unhealthy);
}

#[test]
fn mixed_failure_kinds_trip_the_threshold() {
    let mut sim = Sim::new(3, 2, 1);
    sim.probe(0, ok());
    assert!(sim.probe(0, status(503)).is_empty());
    assert_eq!(sim.probe(0, status(404)), vec![rejection_run(0, 404)]);
    assert_eq!(
        sim.probe(0, ProbeResult::timed_out()),
        vec![down(0, ProbeFinding::Timeout, "timed out")]
    );
    assert_eq!(sim.report(0).consecutive_failures, 3);
    assert_eq!(sim.report(0).last_error.as_deref(), Some("timed out"));
}

#[test]
fn only_a_success_resets_the_run() {
    let mut sim = Sim::new(3, 2, 1);
    let transitions = sim.run(
        0,
        vec![
            ok(),
            status(503),
            status(503),
            ok(),
            status(503),
            status(503),
            ok(),
        ],
    );
    assert!(transitions.is_empty());
    assert_eq!(sim.state(0), HealthState::Healthy);
    assert_eq!(sim.report(0).consecutive_failures, 0);
    assert_eq!(sim.report(0).last_error, None);
}

#[test]
fn probes_before_the_latch_do_not_count_toward_the_threshold() {
    let mut sim = Sim::new(3, 2, 1);
    assert!(sim.run(0, vec![status(404), refused()]).is_empty());
    assert_eq!(sim.report(0).consecutive_failures, 2);
    assert!(
        sim.probe(0, status(503)).is_empty(),
        "latched; count restarts"
    );
    assert_eq!(sim.report(0).consecutive_failures, 1);
    assert_eq!(sim.state(0), HealthState::Healthy);
    assert!(sim.probe(0, status(503)).is_empty());
    assert_eq!(
        sim.probe(0, status(503)),
        vec![down(0, ProbeFinding::Unhealthy, "answered 503")]
    );
}

#[test]
fn probe_unsupported_is_reported_once_at_the_threshold_and_the_first_answer_after_it() {
    let mut sim = Sim::new(3, 2, 1);
    assert!(sim.run(0, vec![status(404), status(404)]).is_empty());
    assert_eq!(sim.state(0), HealthState::ProbeUnsupported);
    assert_eq!(
        sim.probe(0, status(404)),
        vec![unsupported(
            0,
            ProbeFinding::PathNotFound,
            Some(404),
            "answered 404"
        )]
    );
    assert!(sim.run(0, vec![status(404); 30]).is_empty(), "logged once");
    assert_eq!(sim.roster(), vec![0]);
    assert_eq!(
        sim.probe(0, ok()),
        vec![Transition::FirstAnswerAfterUnsupported {
            backend: BackendId(0)
        }]
    );
    assert_eq!(sim.state(0), HealthState::Healthy);
    // latched now: refusals count as failures and take it out
    assert_eq!(sim.probe(0, status(404)), vec![rejection_run(0, 404)]);
    assert!(sim.probe(0, status(404)).is_empty());
    assert_eq!(
        sim.probe(0, status(404)),
        vec![down(0, ProbeFinding::PathNotFound, "answered 404")]
    );
    assert_eq!(
        sim.run(0, vec![status(404), ok(), status(404)]),
        vec![rejection_run(0, 404)],
        "the success ended the run"
    );
    assert!(
        sim.run(0, vec![status(404); 10]).is_empty(),
        "ProbeUnsupported never again"
    );
}

#[test]
fn a_first_answer_with_no_warning_before_it_is_quiet() {
    let mut sim = Sim::new(3, 2, 1);
    assert!(sim.run(0, vec![status(404), status(404), ok()]).is_empty());
    assert_eq!(sim.state(0), HealthState::Healthy);
}

#[test]
fn a_backend_unreachable_since_start_stays_in_service_until_it_answers() {
    let mut sim = Sim::new(3, 2, 2);
    sim.probe(1, ok());
    let transitions = sim.run(0, vec![refused(); 3]);
    assert_eq!(
        transitions,
        vec![unsupported(
            0,
            ProbeFinding::Connect(crate::ConnectCause::Refused),
            None,
            "connect failed: connection refused"
        )]
    );
    assert_eq!(transitions[0].kind(), "unreachable");
    assert_eq!(sim.state(0), HealthState::Unreachable);
    assert_eq!(
        sim.report(0).last_result,
        Some(ProbeFinding::Connect(crate::ConnectCause::Refused))
    );
    assert!(sim.run(0, vec![ProbeResult::timed_out(); 20]).is_empty());
    assert_eq!(sim.roster(), vec![0, 1]);
    assert_eq!(sim.state(0), HealthState::Unreachable);
    assert_eq!(sim.report(0).last_result, Some(ProbeFinding::Timeout));
    // A refused probe path after it is a probe problem again, not a reachability one.
    assert!(sim.probe(0, status(404)).is_empty());
    assert_eq!(sim.state(0), HealthState::ProbeUnsupported);
    assert_eq!(sim.report(0).last_result, Some(ProbeFinding::PathNotFound));
    assert_eq!(
        sim.probe(0, status(503)),
        vec![Transition::FirstAnswerAfterUnsupported {
            backend: BackendId(0)
        }]
    );
    assert_eq!(
        sim.run(0, vec![refused(), refused()]),
        vec![down(
            0,
            ProbeFinding::Connect(crate::ConnectCause::Refused),
            "connect failed: connection refused"
        )]
    );
    assert_eq!(sim.roster(), vec![1]);
}

#[test]
fn threshold_one_can_emit_two_transitions_at_once() {
    let mut sim = Sim::new(1, 1, 1);
    assert_eq!(
        sim.probe(0, status(404)),
        vec![unsupported(
            0,
            ProbeFinding::PathNotFound,
            Some(404),
            "answered 404"
        )]
    );
    assert_eq!(
        sim.probe(0, status(503)),
        vec![
            Transition::FirstAnswerAfterUnsupported {
                backend: BackendId(0)
            },
            down(0, ProbeFinding::Unhealthy, "answered 503"),
        ]
    );
    assert_eq!(sim.probe(0, ok()), vec![up(0)]);
    assert_eq!(
        sim.probe(0, status(401)),
        vec![
            rejection_run(0, 401),
            down(0, ProbeFinding::Rejected, "answered 401")
        ]
    );
}

#[test]
fn a_rejection_run_after_the_latch_is_reported_once_per_run() {
    let mut sim = Sim::new(5, 2, 1);
    sim.probe(0, ok());
    assert_eq!(sim.probe(0, status(404)), vec![rejection_run(0, 404)]);
    assert!(
        sim.run(0, vec![status(403), refused(), status(404)])
            .is_empty(),
        "a transport failure does not end the run"
    );
    assert_eq!(
        sim.probe(0, status(501)),
        vec![down(0, ProbeFinding::Rejected, "answered 501")]
    );
    assert!(
        sim.probe(0, status(503)).is_empty(),
        "an answer ends the run"
    );
    assert_eq!(sim.probe(0, status(404)), vec![rejection_run(0, 404)]);
    sim.probe(0, ok());
    assert_eq!(sim.probe(0, status(410)), vec![rejection_run(0, 410)]);
}

#[test]
fn the_roster_fails_open_when_every_backend_is_down() {
    let mut sim = Sim::new(1, 1, 3);
    sim.probe(0, status(503));
    sim.probe(1, status(503));
    assert_eq!(sim.roster(), vec![2], "unprobed counts as in service");
    sim.probe(2, status(500));
    assert_eq!(sim.roster(), vec![0, 1, 2], "all down: ask them all");
    sim.probe(1, ok());
    assert_eq!(sim.roster(), vec![1]);
}

#[test]
fn disabled_probes_nothing_and_serves_every_backend() {
    let now = start();
    let mut table = HealthTable::new(
        now,
        ProbeSettings {
            enabled: false,
            ..settings(3, 2)
        },
        2,
    );
    assert!(table.due_probes(now).is_empty());
    assert!(table.due_probes(now + Duration::from_secs(3600)).is_empty());
    assert_eq!(table.next_deadline(), None);
    assert!(table.overdue(now + Duration::from_secs(3600)).is_empty());
    assert!(table.record(now, BackendId(0), status(503)).is_empty());
    assert_eq!(table.roster(), vec![BackendId(0), BackendId(1)]);
    let report = table.report(BackendId(1)).expect("known");
    assert_eq!(report.state, HealthState::Unmonitored);
    assert_eq!(report.state.as_str(), "unmonitored");
    assert_eq!(report.last_probe, None);
}

#[test]
fn probes_are_scheduled_an_interval_after_each_result_and_never_doubled() {
    let t0 = start();
    let s = Duration::from_secs;
    let mut table = HealthTable::new(t0, settings(3, 2), 2);
    assert_eq!(table.next_deadline(), Some(t0));
    assert_eq!(table.due_probes(t0), vec![BackendId(0), BackendId(1)]);
    assert!(
        table.due_probes(t0).is_empty(),
        "in flight is not re-issued"
    );
    assert!(table.due_probes(t0 + s(60)).is_empty(), "still in flight");
    assert_eq!(table.next_deadline(), Some(t0 + s(5)), "the probe deadline");
    assert!(table.overdue(t0 + s(4)).is_empty());

    assert!(table.record(t0 + s(1), BackendId(0), ok()).is_empty());
    assert_eq!(
        table.next_deadline(),
        Some(t0 + s(5)),
        "backend 1 in flight"
    );
    assert_eq!(table.overdue(t0 + s(5)), vec![BackendId(1)]);
    table.record(t0 + s(5), BackendId(1), ProbeResult::timed_out());
    assert!(table.overdue(t0 + s(5)).is_empty());
    assert_eq!(table.next_deadline(), Some(t0 + s(11)));
    assert!(table.due_probes(t0 + s(10)).is_empty(), "spurious wake-up");
    assert_eq!(table.due_probes(t0 + s(11)), vec![BackendId(0)]);
    assert_eq!(table.next_deadline(), Some(t0 + s(15)));
    assert_eq!(table.due_probes(t0 + s(15)), vec![BackendId(1)]);
    assert_eq!(table.next_deadline(), Some(t0 + s(16)));

    let report = table.report(BackendId(1)).expect("known");
    assert_eq!(report.last_probe, Some(t0 + s(5)));
    assert_eq!(report.last_error.as_deref(), Some("timed out"));
    assert_eq!(report.state.as_str(), "unreachable");
    assert_eq!(
        report.last_result.map(ProbeFinding::as_str),
        Some("timeout")
    );
}

#[test]
fn results_with_no_probe_in_flight_are_ignored() {
    let t0 = start();
    let mut table = HealthTable::new(t0, settings(1, 1), 1);
    assert!(table.record(t0, BackendId(0), status(503)).is_empty());
    assert!(table.record(t0, BackendId(7), status(503)).is_empty());
    assert_eq!(
        table.report(BackendId(0)).map(|r| r.state),
        Some(HealthState::Unprobed)
    );
    assert_eq!(table.report(BackendId(7)), None);
    table.due_probes(t0);
    table.record(t0, BackendId(0), ok());
    assert!(
        table.record(t0, BackendId(0), status(503)).is_empty(),
        "a late second result"
    );
    assert_eq!(table.roster(), vec![BackendId(0)]);
}

#[test]
fn probe_results_come_from_upstream_messages() {
    let response = UpstreamResponse::full(http::StatusCode::SERVICE_UNAVAILABLE, "text/plain", "x");
    assert_eq!(
        ProbeResult::from_response(&response),
        ProbeResult::Answered {
            status: 503,
            body: Bytes::from_static(b"x")
        }
    );
    assert_eq!(
        ProbeResult::timed_out(),
        ProbeResult::TransportFailure(UpstreamFailure::Timeout)
    );
    assert_eq!(
        ProbeSettings::from_config(&Config::with_backends(Vec::new())),
        settings(3, 2)
    );
}

#[test]
fn transitions_name_their_backend_and_log() {
    for transition in [
        down(1, ProbeFinding::Unhealthy, "x"),
        up(1),
        unsupported(1, ProbeFinding::Timeout, None, "x"),
        unsupported(1, ProbeFinding::PathNotFound, Some(404), "x"),
        Transition::FirstAnswerAfterUnsupported {
            backend: BackendId(1),
        },
        rejection_run(1, 404),
    ] {
        assert_eq!(transition.backend(), BackendId(1));
        transition.log("pdb-b");
    }
}

/// A probe result by index, for the property test.
fn result_of(kind: u8) -> ProbeResult {
    match kind % 10 {
        0 => ok(),
        1 => degraded(),
        2 => status(503),
        3 => status(500),
        4 => status(429),
        5 => status(404),
        6 => status(401),
        7 => status(501),
        8 => refused(),
        _ => ProbeResult::timed_out(),
    }
}

proptest! {
    /// No sequence of results brings a never-answered backend out of the roster, the roster is
    /// never empty, it is exactly the in-service backends (or all), and the warnings keep their
    /// once-only promises.
    #[test]
    fn the_roster_never_loses_unlatched_backends_and_is_never_empty(
        backends in 1usize..4,
        failures in 1u32..4,
        successes in 1u32..4,
        steps in proptest::collection::vec((0usize..4, 0u8..10, 0u64..20), 0..200),
    ) {
        let mut now = start();
        let mut table = HealthTable::new(now, settings(failures, successes), backends);
        let mut answered = vec![false; backends];
        let mut up = vec![true; backends];
        let mut unsupported = vec![0u32; backends];
        let mut first_answers = vec![0u32; backends];
        for (backend, kind, wait) in steps {
            now += Duration::from_secs(wait);
            let mut results = Vec::new();
            for overdue in table.overdue(now) {
                results.push((overdue, ProbeResult::timed_out()));
            }
            table.due_probes(now);
            let backend = backend % backends;
            if table.backends[backend].in_flight.is_some()
                && !results.iter().any(|(b, _)| b.0 == backend)
            {
                results.push((BackendId(backend), result_of(kind)));
            }
            for (id, result) in results {
                if let ProbeResult::Answered { status, body } = &result {
                    answered[id.0] |= classify(*status, body).sets_latch();
                }
                for transition in table.record(now, id, result) {
                    let b = transition.backend().0;
                    match transition {
                        Transition::Down { .. } => {
                            prop_assert!(up[b] && answered[b]);
                            up[b] = false;
                        }
                        Transition::Up { .. } => {
                            prop_assert!(!up[b]);
                            up[b] = true;
                        }
                        Transition::ProbeUnsupported { .. } => {
                            prop_assert!(!answered[b]);
                            unsupported[b] += 1;
                        }
                        Transition::FirstAnswerAfterUnsupported { .. } => {
                            prop_assert!(answered[b] && unsupported[b] == 1);
                            first_answers[b] += 1;
                        }
                        Transition::RejectionRunStarted { .. } => prop_assert!(answered[b]),
                    }
                }
            }
            let roster: Vec<usize> = table.roster().into_iter().map(|b| b.0).collect();
            prop_assert!(!roster.is_empty());
            let in_service: Vec<usize> =
                (0..backends).filter(|&b| !answered[b] || up[b]).collect();
            for (b, answered) in answered.iter().enumerate() {
                if !answered {
                    prop_assert!(roster.contains(&b));
                }
            }
            if in_service.is_empty() {
                prop_assert_eq!(roster, (0..backends).collect::<Vec<_>>());
            } else {
                prop_assert_eq!(roster, in_service);
            }
            prop_assert!(unsupported.iter().all(|&n| n <= 1));
            prop_assert!(first_answers.iter().all(|&n| n <= 1));
            prop_assert!(table.next_deadline().is_some());
        }
    }
}

/// Each kind of failed probe is named apart in `/healthz` and the log: the PuppetDB down, a wrong
/// name, certificates, the network, the probe path.
#[test]
fn each_probe_failure_is_named_by_its_cause() {
    use crate::ConnectCause;
    let connect = |cause| {
        ProbeResult::from_failure(&UpstreamFailure::Connect {
            cause,
            detail: "x".into(),
        })
    };
    let cases = [
        (ok(), "ok"),
        (status(503), "unhealthy"),
        (status(404), "probe_path_not_found"),
        (status(410), "probe_path_not_found"),
        (status(401), "probe_rejected"),
        (status(501), "probe_rejected"),
        (connect(ConnectCause::Refused), "connection_refused"),
        (connect(ConnectCause::Dns), "dns_error"),
        (connect(ConnectCause::Tls), "tls_error"),
        (connect(ConnectCause::Timeout), "connect_timeout"),
        (connect(ConnectCause::Other), "connect_error"),
        (ProbeResult::timed_out(), "timeout"),
        (
            ProbeResult::from_failure(&UpstreamFailure::Transport("reset".into())),
            "transport_error",
        ),
        (
            ProbeResult::from_failure(&UpstreamFailure::BodyTooLarge { limit: 1 }),
            "probe_answer_too_large",
        ),
    ];
    for (result, want) in cases {
        let mut sim = Sim::new(3, 2, 1);
        sim.probe(0, result.clone());
        let found = sim.report(0).last_result.map(ProbeFinding::as_str);
        assert_eq!(found, Some(want), "{result:?}");
    }
}
