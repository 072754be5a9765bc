//! The backend health prober (README "Backend health"; issue 5), on the simulated clock: probes are
//! the estate's `GET /status/v1/services` sends, every `health_probe_interval`; queries
//! (`/pdb/query/v4/reports`, a merged fan-out that needs no membership map) ask only the backends
//! the prober has in service, or every backend when it has none (fail open).
//!
//! Every scenario runs with probing on, a 1 s interval, a 250 ms probe timeout and the thresholds
//! 3 (failures) / 2 (successes); probe replies arrive without delay, so probe `k` of a backend
//! that never timed out is sent and answered at `k` seconds. A prober keeps a timer for ever, so
//! runs end at a chosen time ([`Harness::run_until`]) rather than at quiescence.

mod common;

use common::{version, URL_A, URL_B, URL_C, URL_D};
use http::StatusCode;
use pdbmux_conformance::{
    ms, probe_degraded, probe_running, probe_status, Asked, ClientId, FakeBackend, Harness,
    Machine, Reply, PROBE_PATH,
};
use pdbmux_core::config::Config;
use proptest::prelude::*;
use serde_json::Value;

const INTERVAL_MS: u64 = 1_000;
const PROBE_TIMEOUT_MS: u64 = 250;
const STEPS: usize = 100_000;
const QUERY: &str = "/pdb/query/v4/reports";

/// Probing on, a 1 s interval, a 250 ms probe timeout, thresholds 3/2.
fn probing(config: &mut Config) {
    config.health_probe_enabled = true;
    config.health_probe_interval = ms(INTERVAL_MS);
    config.health_probe_timeout = ms(PROBE_TIMEOUT_MS);
    config.health_probe_failures = 3;
    config.health_probe_successes = 2;
}

/// What a reachable backend answers besides its probes, 1 ms later: a version to `/healthz`'s
/// reachability check, `[]` to anything else.
fn serving(asked: &Asked<'_>) -> Reply {
    if asked.path_and_query == "/pdb/meta/v1/version" {
        version("7.12.1").after(ms(1))
    } else {
        Reply::ok("[]").after(ms(1))
    }
}

/// A backend answering its probes with `probes`, then `then` for ever, and serving queries.
fn backend(name: &str, url: &str, probes: Vec<Reply>, then: Reply) -> FakeBackend {
    FakeBackend::probed(name, url, probes, then, serving)
}

/// A backend whose probes always answer healthy.
fn healthy(name: &str, url: &str) -> FakeBackend {
    backend(name, url, Vec::new(), probe_running())
}

fn harness(backends: Vec<FakeBackend>) -> Harness {
    Harness::with_config(backends, probing).expect("valid test backends")
}

/// Runs to `at_ms` (every probe due by then is sent and, unless it hangs, answered).
fn run_to(h: &mut Harness, at_ms: u64) {
    if let Err(error) = h.run_until(ms(at_ms), STEPS) {
        panic!("{error}\n{}", h.transcript());
    }
}

/// Submits the query at `at_ms`, lets it finish, and returns the backends it asked.
fn query_at(h: &mut Harness, at_ms: u64) -> Vec<String> {
    run_to(h, at_ms);
    let client = h.get(QUERY);
    run_to(h, at_ms + 20);
    assert_eq!(
        h.responses(client).expect("known client").len(),
        1,
        "{}",
        h.transcript()
    );
    h.exchange_backends(client)
}

/// Asks `/healthz` at `at_ms` and returns its body.
fn healthz_at(h: &mut Harness, at_ms: u64) -> Value {
    run_to(h, at_ms);
    let client = h.get("/healthz");
    run_to(h, at_ms + 20);
    body_json(h, client)
}

fn body_json(h: &Harness, client: ClientId) -> Value {
    let response = h.response(client).expect("one response");
    serde_json::from_slice(&response.body)
        .unwrap_or_else(|e| panic!("{e}: {}", response.body_str()))
}

/// One backend's object in a `/healthz` body.
fn backend_report<'a>(healthz: &'a Value, name: &str) -> &'a Value {
    healthz["backends"]
        .as_array()
        .and_then(|backends| backends.iter().find(|b| b["name"] == name))
        .unwrap_or_else(|| panic!("no {name} in {healthz}"))
}

/// `state`, `consecutive_failures`, `consecutive_successes`, `last_error` of one backend.
fn prober_fields(healthz: &Value, name: &str) -> (String, u64, u64, Value) {
    let report = backend_report(healthz, name);
    (
        report["state"].as_str().unwrap_or_default().to_owned(),
        report["consecutive_failures"].as_u64().unwrap_or(u64::MAX),
        report["consecutive_successes"].as_u64().unwrap_or(u64::MAX),
        report["last_error"].clone(),
    )
}

/// Ends a run at `at_ms`: every client answered, no contract broken; the transcript.
fn end(h: &mut Harness, at_ms: u64) -> String {
    run_to(h, at_ms);
    if let Err(error) = h.check_answered() {
        panic!("{error}\n{}", h.transcript());
    }
    h.transcript()
}

fn names(names: &[&str]) -> Vec<String> {
    names.iter().map(|n| (*n).to_owned()).collect()
}

#[test]
fn unprobed_backends_count_as_healthy_and_queries_do_not_wait_for_a_probe() {
    // pdb-a's first probe hangs; queries before any probe result ask everyone at once.
    let mut h = harness(vec![
        backend("pdb-a", URL_A, vec![Reply::never()], probe_running()),
        healthy("pdb-b", URL_B),
    ]);
    let first = h.get(QUERY);
    assert_eq!(h.exchange_backends(first), names(&["pdb-a", "pdb-b"]));
    let healthz = healthz_at(&mut h, 100);
    assert_eq!(
        prober_fields(&healthz, "pdb-a"),
        ("unprobed".to_owned(), 0, 0, Value::Null)
    );
    assert_eq!(backend_report(&healthz, "pdb-a")["last_probe"], Value::Null);
    assert_eq!(prober_fields(&healthz, "pdb-b").0, "healthy");
    assert_eq!(h.response(first).expect("one").at, ms(1));
    insta::assert_snapshot!(end(&mut h, 150));
}

#[test]
fn one_blip_does_not_flap() {
    let mut h = harness(vec![
        backend(
            "pdb-a",
            URL_A,
            vec![probe_running(), probe_running(), probe_status(503)],
            probe_running(),
        ),
        healthy("pdb-b", URL_B),
    ]);
    assert_eq!(query_at(&mut h, 2_500), names(&["pdb-a", "pdb-b"]));
    let healthz = healthz_at(&mut h, 2_600);
    assert_eq!(
        prober_fields(&healthz, "pdb-a"),
        ("healthy".to_owned(), 1, 0, Value::from("answered 503"))
    );
    assert_eq!(query_at(&mut h, 3_500), names(&["pdb-a", "pdb-b"]));
    let healthz = healthz_at(&mut h, 3_600);
    assert_eq!(
        prober_fields(&healthz, "pdb-a"),
        ("healthy".to_owned(), 0, 1, Value::Null)
    );
    insta::assert_snapshot!(end(&mut h, 3_700));
}

#[test]
fn alternating_success_and_failure_never_flips() {
    // Up: success and failure alternate, so the failure run never reaches 3. Then three failures
    // take pdb-a out, and alternating again never brings it back (a run of 2 successes does).
    let ok = probe_running;
    let bad = || probe_status(503);
    let probes = vec![
        ok(),
        bad(),
        ok(),
        bad(),
        ok(),
        bad(),
        ok(),
        bad(),
        bad(),
        bad(), // 9 s: the third failure in a row
        ok(),
        bad(),
        ok(),
        bad(),
        ok(),
        bad(),
    ];
    let count = probes.len() as u64;
    let mut h = harness(vec![
        backend("pdb-a", URL_A, probes, bad()),
        healthy("pdb-b", URL_B),
    ]);
    let mut timeline = Vec::new();
    for second in 0..count {
        let asked = query_at(&mut h, second * INTERVAL_MS + 500);
        let expected = if second < 9 {
            names(&["pdb-a", "pdb-b"])
        } else {
            names(&["pdb-b"])
        };
        assert_eq!(asked, expected, "after the probe at {second} s");
        timeline.push(format!("{second}s: {}", asked.join(",")));
    }
    let healthz = healthz_at(&mut h, count * INTERVAL_MS + 600);
    assert_eq!(prober_fields(&healthz, "pdb-a").0, "unhealthy");
    end(&mut h, count * INTERVAL_MS + 700);
    insta::assert_snapshot!(timeline.join("\n"));
}

#[test]
fn mixed_failure_kinds_trip_the_threshold() {
    // 0 s healthy (the latch is set), then a 503, a 404 and a probe that times out (sent at 3 s,
    // given up at 3.25 s): three unsuccessful probes of three kinds in a row.
    let mut h = harness(vec![
        backend(
            "pdb-a",
            URL_A,
            vec![
                probe_running(),
                probe_status(503),
                probe_status(404),
                Reply::never(),
            ],
            probe_status(503),
        ),
        healthy("pdb-b", URL_B),
    ]);
    assert_eq!(query_at(&mut h, 2_500), names(&["pdb-a", "pdb-b"]));
    assert_eq!(query_at(&mut h, 3_100), names(&["pdb-a", "pdb-b"]));
    assert_eq!(query_at(&mut h, 3_300), names(&["pdb-b"]));
    let healthz = healthz_at(&mut h, 3_400);
    assert_eq!(
        prober_fields(&healthz, "pdb-a"),
        ("unhealthy".to_owned(), 3, 0, Value::from("timed out"))
    );
    assert_eq!(
        backend_report(&healthz, "pdb-a")["last_probe"],
        "1970-01-01T00:00:03.250Z"
    );
    insta::assert_snapshot!(end(&mut h, 3_500));
}

#[test]
fn a_probe_path_that_404s_from_the_start_is_probe_unsupported_for_ever() {
    // Never answered: refusals and transport failures alike leave it in service, unverified.
    let probes = vec![
        probe_status(404),
        probe_status(404),
        probe_status(404),
        Reply::refused(),
        probe_status(404),
        Reply::never(),
        probe_status(404),
        probe_status(404),
    ];
    let mut h = harness(vec![
        backend("pdb-a", URL_A, probes, probe_status(404)),
        healthy("pdb-b", URL_B),
    ]);
    for at in [500, 3_500, 6_500, 9_500] {
        assert_eq!(query_at(&mut h, at), names(&["pdb-a", "pdb-b"]), "at {at}");
    }
    let healthz = healthz_at(&mut h, 9_600);
    // Probes at 0..=4 s, 5 s (timed out at 5.25 s), then 6.25, 7.25, 8.25, 9.25 s.
    assert_eq!(
        prober_fields(&healthz, "pdb-a"),
        (
            "probe_unsupported".to_owned(),
            10,
            0,
            Value::from("answered 404")
        )
    );
    assert_eq!(
        backend_report(&healthz, "pdb-a")["last_probe_result"],
        "probe_path_not_found"
    );
    assert_eq!(backend_report(&healthz, "pdb-a")["reachable"], true);
    assert_eq!(healthz["status"], "ok");
    insta::assert_snapshot!(end(&mut h, 9_700));
}

#[test]
fn a_path_that_answered_once_and_then_404s_takes_the_backend_out() {
    let mut h = harness(vec![
        backend("pdb-a", URL_A, vec![probe_running()], probe_status(404)),
        healthy("pdb-b", URL_B),
    ]);
    assert_eq!(query_at(&mut h, 2_500), names(&["pdb-a", "pdb-b"]));
    assert_eq!(query_at(&mut h, 3_500), names(&["pdb-b"]));
    let healthz = healthz_at(&mut h, 3_600);
    assert_eq!(
        prober_fields(&healthz, "pdb-a"),
        ("unhealthy".to_owned(), 3, 0, Value::from("answered 404"))
    );
    // Still reachable: the probe path moved, the backend did not go away.
    assert_eq!(backend_report(&healthz, "pdb-a")["reachable"], true);
    insta::assert_snapshot!(end(&mut h, 3_700));
}

#[test]
fn a_backend_unreachable_since_start_stays_in_service_until_it_answers_once() {
    // Refused five times (0..=4 s): never answered, so not gated, and queries still ask it. It
    // answers at 5 s, and from then on the thresholds apply: refused at 6, 7 and 8 s, it is out.
    let mut probes: Vec<Reply> = (0..5).map(|_| Reply::refused()).collect();
    probes.push(probe_running());
    let unreachable = FakeBackend::probed("pdb-a", URL_A, probes, Reply::refused(), |_| {
        Reply::refused().after(ms(1))
    });
    let mut h = harness(vec![unreachable, healthy("pdb-b", URL_B)]);
    assert_eq!(query_at(&mut h, 4_500), names(&["pdb-a", "pdb-b"]));
    let healthz = healthz_at(&mut h, 4_600);
    assert_eq!(
        prober_fields(&healthz, "pdb-a"),
        (
            "unreachable".to_owned(),
            5,
            0,
            Value::from("connect failed: connection refused")
        )
    );
    // Named as what it is, not as a probe-path problem.
    assert_eq!(
        backend_report(&healthz, "pdb-a")["last_probe_result"],
        "connection_refused"
    );
    assert_eq!(backend_report(&healthz, "pdb-a")["reachable"], false);
    assert_eq!(healthz["status"], "degraded");
    assert_eq!(query_at(&mut h, 7_500), names(&["pdb-a", "pdb-b"]));
    assert_eq!(query_at(&mut h, 8_500), names(&["pdb-b"]));
    let healthz = healthz_at(&mut h, 8_600);
    assert_eq!(
        prober_fields(&healthz, "pdb-a"),
        (
            "unhealthy".to_owned(),
            3,
            0,
            Value::from("connect failed: connection refused")
        )
    );
    insta::assert_snapshot!(end(&mut h, 8_700));
}

#[test]
fn a_backend_taken_out_is_asked_when_every_backend_in_service_fails() {
    // The prober takes pdb-a out (its probes fail, its queries work); pdb-b probes healthy but
    // refuses every query. A query the roster (pdb-b) cannot answer is asked of pdb-a before it
    // fails: fail open per request, not only when the prober has every backend out.
    let mut h = harness(vec![
        backend("pdb-a", URL_A, vec![probe_running()], probe_status(503)),
        FakeBackend::probed("pdb-b", URL_B, Vec::new(), probe_running(), |_| {
            Reply::refused().after(ms(1))
        }),
    ]);
    run_to(&mut h, 3_500);
    let client = h.get(QUERY);
    run_to(&mut h, 3_520);
    let response = h.response(client).expect("one response");
    assert_eq!(response.status, http::StatusCode::OK, "{}", h.transcript());
    assert_eq!(response.header("x-backends"), Some("1/2"));
    assert_eq!(h.exchange_backends(client), names(&["pdb-b", "pdb-a"]));
    let healthz = healthz_at(&mut h, 3_600);
    assert_eq!(prober_fields(&healthz, "pdb-a").0, "unhealthy");
    end(&mut h, 3_700);
}

/// Every route class fails open as the merged ones do: the prober keeps pdb-a out (its probes
/// fail, its queries work) and pdb-b, in service, answers every query 500. A per-certname,
/// report-hash, pass-through, sub-route or PQL request is asked of pdb-a before it fails, and
/// pdb-a's answer is served.
#[test]
fn every_route_class_asks_the_backends_kept_out_when_every_one_in_service_fails() {
    let answering = |asked: &Asked<'_>| {
        let path = asked.path_and_query;
        let body = if path.starts_with("/pdb/query/v4/nodes/web1") {
            r#"{"certname":"web1","from":"pdb-a"}"#.to_owned()
        } else if path.contains("ast_only=true") {
            r#"["from","nodes",["=","certname","web1"]]"#.to_owned()
        } else if path.starts_with("/pdb/meta/v1/version") {
            r#"{"version":"7.12.1"}"#.to_owned()
        } else if path.starts_with("/pdb/query/v4/nodes") {
            r#"[{"certname":"web1","report_timestamp":"2024-05-01T10:00:00.000Z"}]"#.to_owned()
        } else {
            r#"[{"from":"pdb-a"}]"#.to_owned()
        };
        Reply::ok(body).after(ms(1))
    };
    for (class, target) in [
        ("per-certname", "/pdb/query/v4/nodes/web1"),
        ("report hash", "/pdb/query/v4/reports/0123abcd/events"),
        ("pass-through", "/pdb/query/v4/environments/production"),
        ("sub-route", "/pdb/query/v4/environments/production/facts"),
        (
            "translation (PQL)",
            "/pdb/query/v4?query=nodes%20%7B%20certname%20%3D%20%22web1%22%20%7D",
        ),
    ] {
        let mut h = harness(vec![
            FakeBackend::probed(
                "pdb-a",
                URL_A,
                vec![probe_running()],
                probe_status(503),
                answering,
            ),
            FakeBackend::probed("pdb-b", URL_B, Vec::new(), probe_running(), |_| {
                Reply::text(StatusCode::INTERNAL_SERVER_ERROR, "boom").after(ms(1))
            }),
        ]);
        run_to(&mut h, 3_500);
        let client = h.get(target);
        run_to(&mut h, 3_560);
        let response = h.response(client).expect("one response");
        assert_eq!(
            response.status,
            StatusCode::OK,
            "{class}: {}",
            h.transcript()
        );
        assert!(
            response.body_str().contains("pdb-a") || response.body_str().contains("web1"),
            "{class}: {}",
            response.body_str()
        );
        let healthz = healthz_at(&mut h, 3_600);
        assert_eq!(prober_fields(&healthz, "pdb-a").0, "unhealthy", "{class}");
        end(&mut h, 3_700);
    }
}

/// A join's part failing on every backend in service answers at once, and fails open: the
/// other part's call still under way (pdb-b's records, slow) is cancelled, not waited for, and
/// the backend the prober kept out answers.
#[test]
fn a_join_failing_over_gives_up_the_calls_still_under_way() {
    let mut h = harness(vec![
        FakeBackend::probed(
            "pdb-a",
            URL_A,
            vec![probe_running()],
            probe_status(503),
            |asked: &Asked<'_>| {
                let body = if asked.path_and_query.contains("extract") {
                    r#"[{"certname":"web1","environment":"production"}]"#
                } else if asked.path_and_query.starts_with("/pdb/query/v4/facts") {
                    r#"[{"certname":"web1","name":"os","value":"Linux","environment":"production"}]"#
                } else {
                    r#"[{"certname":"web1","report_timestamp":"2024-05-01T10:00:00.000Z"}]"#
                };
                Reply::ok(body).after(ms(1))
            },
        ),
        FakeBackend::probed(
            "pdb-b",
            URL_B,
            Vec::new(),
            probe_running(),
            |asked: &Asked<'_>| {
                if asked.path_and_query.contains("extract") {
                    Reply::text(StatusCode::INTERNAL_SERVER_ERROR, "boom").after(ms(1))
                } else if asked.path_and_query.starts_with("/pdb/query/v4/facts") {
                    Reply::ok("[]").after(ms(5_000))
                } else {
                    Reply::ok("[]").after(ms(1))
                }
            },
        ),
    ]);
    run_to(&mut h, 3_500);
    let query: String = form_urlencoded::byte_serialize(
        br#"["or",["=","name","os"],["=","name","pdbmux_source"]]"#,
    )
    .collect();
    let client = h.get(&format!("/pdb/query/v4/facts?query={query}"));
    run_to(&mut h, 3_560);
    let response = h
        .response(client)
        .unwrap_or_else(|e| panic!("{e}: not answered within 60 ms\n{}", h.transcript()));
    assert_eq!(response.status, StatusCode::OK, "{}", h.transcript());
    let body = response.body_str();
    assert!(
        body.contains("Linux") && body.contains("pdbmux_source"),
        "pdb-a's records and its provenance record: {body}"
    );
    end(&mut h, 3_700);
}

#[test]
fn all_down_fails_open() {
    let mut h = harness(vec![
        backend("pdb-a", URL_A, vec![probe_running()], probe_status(503)),
        backend(
            "pdb-b",
            URL_B,
            vec![probe_running(), probe_running()],
            probe_status(503),
        ),
    ]);
    assert_eq!(query_at(&mut h, 2_500), names(&["pdb-a", "pdb-b"]));
    // pdb-a is out after its probe at 3 s, pdb-b after its probe at 4 s.
    assert_eq!(query_at(&mut h, 3_500), names(&["pdb-b"]));
    assert_eq!(query_at(&mut h, 4_500), names(&["pdb-a", "pdb-b"]));
    let healthz = healthz_at(&mut h, 4_600);
    assert_eq!(prober_fields(&healthz, "pdb-a").0, "unhealthy");
    assert_eq!(prober_fields(&healthz, "pdb-b").0, "unhealthy");
    insta::assert_snapshot!(end(&mut h, 4_700));
}

#[test]
fn recovery_after_health_probe_successes() {
    let mut h = harness(vec![
        backend(
            "pdb-a",
            URL_A,
            vec![
                probe_running(),
                probe_status(503),
                probe_degraded("starting"),
                probe_status(429),
                probe_running(),
            ],
            probe_running(),
        ),
        healthy("pdb-b", URL_B),
    ]);
    assert_eq!(query_at(&mut h, 3_500), names(&["pdb-b"]));
    // One success (4 s) is not enough; the second (5 s) brings it back.
    assert_eq!(query_at(&mut h, 4_500), names(&["pdb-b"]));
    let healthz = healthz_at(&mut h, 4_600);
    assert_eq!(
        prober_fields(&healthz, "pdb-a"),
        ("unhealthy".to_owned(), 0, 1, Value::Null)
    );
    assert_eq!(query_at(&mut h, 5_500), names(&["pdb-a", "pdb-b"]));
    let healthz = healthz_at(&mut h, 5_600);
    assert_eq!(
        prober_fields(&healthz, "pdb-a"),
        ("healthy".to_owned(), 0, 2, Value::Null)
    );
    insta::assert_snapshot!(end(&mut h, 5_700));
}

/// `/reports` answers for the `/healthz` scenario: each backend's in order.
fn scripted_queries(name: &str, url: &str, probes: Vec<Reply>, answers: Vec<Reply>) -> FakeBackend {
    let mut answers: std::collections::VecDeque<Reply> = answers.into();
    FakeBackend::probed(name, url, probes, probe_running(), move |asked| {
        if asked.path_and_query.starts_with(QUERY) {
            answers
                .pop_front()
                .unwrap_or_else(|| Reply::ok("[]"))
                .after(ms(1))
        } else {
            serving(asked)
        }
    })
}

#[test]
fn healthz_reports_the_prober_and_the_query_object() {
    let bad_request = || Reply::text(StatusCode::BAD_REQUEST, "Unrecognized column 'x'");
    let mut h = harness(vec![
        scripted_queries(
            "pdb-a",
            URL_A,
            vec![
                probe_running(),
                probe_status(503),
                probe_status(503),
                probe_status(503),
            ],
            vec![Reply::ok("[]"), bad_request(), Reply::ok("[]")],
        ),
        scripted_queries(
            "pdb-b",
            URL_B,
            Vec::new(),
            vec![
                Reply::text(StatusCode::INTERNAL_SERVER_ERROR, "boom"),
                bad_request(),
                Reply::ok("[]"),
                Reply::ok("[]"),
            ],
        ),
    ]);
    let mut bodies = Vec::new();
    let mut snap = |label: &str, body: &Value| {
        bodies.push(format!(
            "--- {label}\n{}",
            serde_json::to_string_pretty(body).expect("json")
        ));
    };
    // No merged fan-out yet.
    let healthz = healthz_at(&mut h, 300);
    assert_eq!(healthz["query"]["contributed"], Value::Null);
    snap("300ms, before any query", &healthz);
    // A partial round: pdb-b answers 500, pdb-a's records are served (1 of 2).
    query_at(&mut h, 500);
    let healthz = healthz_at(&mut h, 600);
    assert_eq!(healthz["query"]["partial"], true);
    assert_eq!(healthz["query"]["partial_rounds"], 1);
    assert_eq!(healthz["query"]["last_partial"], "1970-01-01T00:00:00.501Z");
    snap("600ms, after a partial round", &healthz);
    // A unanimous 400 blames the request: not a partial round, and not the last round either.
    let refused = {
        run_to(&mut h, 1_500);
        let client = h.get(QUERY);
        run_to(&mut h, 1_520);
        client
    };
    assert_eq!(
        h.response(refused).expect("one").status,
        StatusCode::BAD_REQUEST
    );
    let after_refusal = healthz_at(&mut h, 1_600);
    assert_eq!(after_refusal["query"], healthz["query"]);
    // A full round.
    query_at(&mut h, 2_500);
    let healthz = healthz_at(&mut h, 2_600);
    assert_eq!(healthz["query"]["partial"], false);
    assert_eq!(healthz["query"]["contributed"], 2);
    assert_eq!(healthz["query"]["partial_rounds"], 1);
    snap("2600ms, after a full round", &healthz);
    // pdb-a is out after its probe at 3 s: the query asks pdb-b only, and its answer lacks
    // pdb-a's part of the estate: partial, as its X-Backends says.
    assert_eq!(query_at(&mut h, 3_500), names(&["pdb-b"]));
    let response = h
        .response(ClientId(h.client_count() - 1))
        .expect("one response");
    assert_eq!(response.header("x-backends"), Some("1/2"));
    let healthz = healthz_at(&mut h, 3_600);
    assert_eq!(healthz["query"]["partial"], true);
    assert_eq!(healthz["query"]["partial_rounds"], 2);
    assert_eq!(healthz["query"]["contributed"], 1);
    assert_eq!(healthz["query"]["configured"], 2);
    assert_eq!(
        prober_fields(&healthz, "pdb-a"),
        ("unhealthy".to_owned(), 3, 0, Value::from("answered 503"))
    );
    // /healthz's own reachability check still asks the backend queries skip.
    assert_eq!(backend_report(&healthz, "pdb-a")["reachable"], true);
    snap("3600ms, pdb-a out of the pool", &healthz);
    end(&mut h, 3_700);
    insta::assert_snapshot!(bodies.join("\n"));
}

#[test]
fn probing_disabled_sends_no_probe_and_reports_unmonitored() {
    let mut h = Harness::new(vec![
        backend("pdb-a", URL_A, Vec::new(), probe_status(503)),
        backend("pdb-b", URL_B, Vec::new(), probe_status(503)),
    ])
    .expect("valid test backends");
    assert!(!h.config().health_probe_enabled);
    let query = h.get(QUERY);
    let healthz = h.get("/healthz");
    let transcript = common::finish(&mut h);
    assert!(
        h.sends()
            .iter()
            .all(|sent| sent.request.path_and_query != PROBE_PATH),
        "{transcript}"
    );
    assert_eq!(h.exchange_backends(query), names(&["pdb-a", "pdb-b"]));
    let body = body_json(&h, healthz);
    for name in ["pdb-a", "pdb-b"] {
        assert_eq!(
            prober_fields(&body, name),
            ("unmonitored".to_owned(), 0, 0, Value::Null)
        );
        assert_eq!(backend_report(&body, name)["last_probe"], Value::Null);
    }
    assert_eq!(
        h.response(query).expect("one").header("x-backends"),
        Some("2/2")
    );
    insta::assert_snapshot!(transcript);
}

// ---------------------------------------------------------------------------------------------
// Property: no query goes to a backend the prober excludes, unless it excludes every backend.

/// One probe outcome, and what the spec says it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Probe {
    Running,
    /// A 200 whose body is not trapperkeeper's: judged on its status.
    Plain200,
    Degraded,
    S500,
    S503,
    S429,
    S404,
    S403,
    S501,
    Refused,
    Timeout,
}

const PROBES: [Probe; 11] = [
    Probe::Running,
    Probe::Plain200,
    Probe::Degraded,
    Probe::S500,
    Probe::S503,
    Probe::S429,
    Probe::S404,
    Probe::S403,
    Probe::S501,
    Probe::Refused,
    Probe::Timeout,
];

impl Probe {
    fn reply(self) -> Reply {
        match self {
            Probe::Running => probe_running(),
            Probe::Plain200 => Reply::ok(r#"{"ok":true}"#),
            Probe::Degraded => probe_degraded("error"),
            Probe::S500 => probe_status(500),
            Probe::S503 => probe_status(503),
            Probe::S429 => probe_status(429),
            Probe::S404 => probe_status(404),
            Probe::S403 => probe_status(403),
            Probe::S501 => probe_status(501),
            Probe::Refused => Reply::refused(),
            Probe::Timeout => Reply::never(),
        }
    }

    fn healthy(self) -> bool {
        matches!(self, Probe::Running | Probe::Plain200)
    }

    /// An answer readable as healthy or unhealthy: a 2xx, a 5xx but 501, a 429.
    fn sets_latch(self) -> bool {
        matches!(
            self,
            Probe::Running
                | Probe::Plain200
                | Probe::Degraded
                | Probe::S500
                | Probe::S503
                | Probe::S429
        )
    }

    /// When its result comes in, after a send at `sent`.
    fn result_at(self, sent: u64) -> u64 {
        match self {
            Probe::Timeout => sent + PROBE_TIMEOUT_MS,
            _ => sent,
        }
    }
}

/// The health rules for one backend (README, "Backend health"), written from the README rather
/// than from the core.
#[derive(Debug, Clone, Copy, Default)]
struct Model {
    latched: bool,
    down: bool,
    failures: u32,
    successes: u32,
}

impl Model {
    fn record(&mut self, probe: Probe, failures: u32, successes: u32) {
        if !self.latched {
            if !probe.sets_latch() {
                return;
            }
            *self = Model {
                latched: true,
                ..Model::default()
            };
        }
        if probe.healthy() {
            self.failures = 0;
            self.successes += 1;
            if self.down && self.successes >= successes {
                self.down = false;
            }
        } else {
            self.successes = 0;
            self.failures += 1;
            if !self.down && self.failures >= failures {
                self.down = true;
            }
        }
    }

    fn in_service(&self) -> bool {
        !self.latched || !self.down
    }
}

const PROPERTY_END_MS: u64 = 16_000;

#[derive(Debug, Clone)]
struct Scenario {
    failures: u32,
    successes: u32,
    /// Per backend: its probe outcomes, then the one it repeats.
    probes: Vec<(Vec<Probe>, Probe)>,
    /// When queries are submitted, ascending.
    queries: Vec<u64>,
}

fn scenario() -> impl Strategy<Value = Scenario> {
    let probe = proptest::sample::select(PROBES.to_vec());
    // Runs of the same outcome make thresholds reachable; mixed runs test the counting.
    let runs = proptest::collection::vec((probe.clone(), 1usize..5), 0..8).prop_map(|runs| {
        runs.into_iter()
            .flat_map(|(probe, n)| std::iter::repeat_n(probe, n))
            .collect::<Vec<_>>()
    });
    (
        1u32..5,
        1u32..4,
        proptest::collection::vec((runs, probe), 2..5),
        proptest::collection::vec(0..PROPERTY_END_MS - 100, 1..16),
    )
        .prop_map(|(failures, successes, probes, mut queries)| {
            queries.sort_unstable();
            Scenario {
                failures,
                successes,
                probes,
                queries,
            }
        })
}

fn backend_name(index: usize) -> String {
    format!("pdb-{index}")
}

fn check_scenario(scenario: &Scenario) -> Result<(), TestCaseError> {
    let backends: Vec<FakeBackend> = scenario
        .probes
        .iter()
        .enumerate()
        .map(|(index, (probes, then))| {
            FakeBackend::probed(
                &backend_name(index),
                &format!("http://pdb{index}.example.com:8080"),
                probes.iter().map(|p| p.reply()),
                then.reply(),
                serving,
            )
        })
        .collect();
    let (failures, successes) = (scenario.failures, scenario.successes);
    let mut h = Harness::with_config(backends, |config| {
        probing(config);
        config.health_probe_failures = failures;
        config.health_probe_successes = successes;
    })
    .expect("valid backends");
    let mut clients = Vec::new();
    for at in &scenario.queries {
        h.run_until(ms(*at), STEPS)
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        clients.push((*at, h.get(QUERY)));
    }
    h.run_until(ms(PROPERTY_END_MS), STEPS)
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    h.check_answered()
        .map_err(|e| TestCaseError::fail(e.to_string()))?;

    // Every probe result, from the probe sends and the scripted outcomes: (time, backend, probe).
    let mut results: Vec<(u64, usize, Probe)> = Vec::new();
    for (index, (probes, then)) in scenario.probes.iter().enumerate() {
        let name = backend_name(index);
        let sent = h.sends().iter().filter(|s| {
            s.machine == Machine::Estate
                && s.backend_name == name
                && s.request.path_and_query == PROBE_PATH
        });
        for (k, send) in sent.enumerate() {
            let probe = probes.get(k).copied().unwrap_or(*then);
            let at = send.at.as_millis() as u64;
            results.push((probe.result_at(at), index, probe));
        }
    }
    results.sort_by_key(|(at, _, _)| *at);

    let mut models = vec![Model::default(); scenario.probes.len()];
    let mut next = 0;
    for (at, client) in clients {
        while next < results.len() && results[next].0 <= at {
            let (_, index, probe) = results[next];
            models[index].record(probe, failures, successes);
            next += 1;
        }
        let in_service: Vec<String> = models
            .iter()
            .enumerate()
            .filter(|(_, m)| m.in_service())
            .map(|(index, _)| backend_name(index))
            .collect();
        let expected = if in_service.is_empty() {
            (0..models.len()).map(backend_name).collect()
        } else {
            in_service
        };
        let asked = h.exchange_backends(client);
        prop_assert_eq!(
            &asked,
            &expected,
            "query at {} ms; models {:?}\n{}",
            at,
            models,
            h.transcript()
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn no_query_goes_to_an_excluded_backend_unless_all_are(scenario in scenario()) {
        check_scenario(&scenario)?;
    }
}

#[test]
fn the_property_holds_on_a_hand_written_scenario() {
    // Three backends: pdb-0 goes down and comes back, pdb-1 never answers its probe, pdb-2 goes
    // down for good; thresholds 2/2.
    let scenario = Scenario {
        failures: 2,
        successes: 2,
        probes: vec![
            (
                vec![
                    Probe::Running,
                    Probe::S503,
                    Probe::Timeout,
                    Probe::Running,
                    Probe::Running,
                ],
                Probe::Running,
            ),
            (vec![Probe::S404, Probe::Refused], Probe::S501),
            (vec![Probe::Plain200, Probe::Degraded], Probe::S404),
        ],
        queries: vec![0, 500, 1_500, 2_100, 2_300, 3_000, 4_600, 6_000, 9_000],
    };
    check_scenario(&scenario).expect("holds");
    // And with pdb-1 answering 503 once, so that every backend can be out at once: fail open.
    let scenario = Scenario {
        probes: vec![
            (vec![Probe::Running], Probe::S503),
            (vec![Probe::S503], Probe::Refused),
        ],
        queries: vec![500, 1_500, 2_500, 3_500],
        ..scenario
    };
    check_scenario(&scenario).expect("holds");
}

#[test]
fn a_third_backend_is_not_special() {
    // Three backends, the middle one out: the others are asked in configured order.
    let mut h = harness(vec![
        healthy("pdb-a", URL_A),
        backend("pdb-b", URL_B, vec![probe_running()], probe_status(500)),
        healthy("pdb-c", URL_C),
    ]);
    assert_eq!(query_at(&mut h, 3_500), names(&["pdb-a", "pdb-c"]));
    end(&mut h, 3_600);
}

/// A backend the prober keeps out is not asked for its membership: each refresh counts it as one
/// that did not renew its part of the map, and the age of its part grows from its last renewal
/// while the backend in service is renewed at every refresh (what the `PdbmuxMembershipStale`
/// alert reads).
#[test]
fn a_backend_kept_out_ages_its_part_of_the_membership_map_and_counts_each_refresh() {
    let mut h = Harness::with_config(
        vec![
            backend("pdb-a", URL_A, vec![probe_running()], probe_status(404)),
            healthy("pdb-b", URL_B),
        ],
        |config| {
            probing(config);
            config.freshness_ttl = ms(1_000);
        },
    )
    .expect("valid test backends");
    let nodes_at = |h: &mut Harness, at_ms: u64| {
        run_to(h, at_ms);
        let client = h.get("/pdb/query/v4/nodes");
        run_to(h, at_ms + 20);
        h.exchange_backends(client)
    };
    assert_eq!(nodes_at(&mut h, 500), names(&["pdb-a", "pdb-b"]));
    // pdb-a's probe path answers 404 from 2 s: it is out by 4 s.
    assert_eq!(nodes_at(&mut h, 5_000), names(&["pdb-b"]));
    assert_eq!(nodes_at(&mut h, 7_000), names(&["pdb-b"]));
    let stats = h.stats();
    let (a, b) = (&stats.backends[0], &stats.backends[1]);
    assert_eq!(stats.membership.refreshes, 3);
    assert_eq!(
        (a.membership_failures, b.membership_failures),
        (2, 0),
        "pdb-a not renewed by the two refreshes it was out for"
    );
    assert!(
        a.membership_age >= ms(6_500),
        "pdb-a's part dates from the first refresh: {:?}",
        a.membership_age
    );
    assert!(
        b.membership_age <= ms(100),
        "pdb-b's part is renewed at each refresh: {:?}",
        b.membership_age
    );
}

/// pdb-a holding web1 and web2 (10:00), pdb-b a newer web2 (11:00), `freshness_ttl` 10 s and
/// no cache: each backend answers `/nodes` and the membership queries, failing every membership
/// query while it has been asked the membership extract at most `failures` times (pdb-a's,
/// pdb-b's).
fn web_nodes_failing_membership(failures: [usize; 2]) -> Harness {
    use pdbmux_core::membership::MEMBERSHIP_QUERY;
    let node = |certname: &str, at: &str| {
        serde_json::json!({"certname": certname, "report_timestamp": at, "deactivated": null,
            "expired": null, "facts_timestamp": at, "catalog_timestamp": at})
    };
    let a_nodes = serde_json::json!([
        node("web1", "2024-05-01T10:00:00.000Z"),
        node("web2", "2024-05-01T10:00:00.000Z")
    ])
    .to_string();
    let b_nodes = serde_json::json!([node("web2", "2024-05-01T11:00:00.000Z")]).to_string();
    let answering = |nodes: String, failures: usize| {
        let mut memberships = 0;
        move |asked: &Asked<'_>| {
            let produced =
                pdbmux_conformance::produced_query_entity(asked.path_and_query).is_some();
            if asked.path_and_query == MEMBERSHIP_QUERY {
                memberships += 1;
            }
            let membership = asked.path_and_query == MEMBERSHIP_QUERY || produced;
            if membership && (1..=failures).contains(&memberships) {
                return Reply::text(StatusCode::INTERNAL_SERVER_ERROR, "busy").after(ms(3));
            }
            if membership {
                let records: Vec<Value> = serde_json::from_str(&nodes).unwrap_or_default();
                let rows = if produced {
                    pdbmux_conformance::produced_at_report_time(&records)
                } else {
                    pdbmux_conformance::membership_rows(&records)
                };
                return Reply::ok(rows.to_string()).after(ms(3));
            }
            Reply::ok(nodes.clone()).after(ms(3))
        }
    };
    Harness::with_config(
        vec![
            FakeBackend::by_request("pdb-a", URL_A, answering(a_nodes, failures[0])),
            FakeBackend::by_request("pdb-b", URL_B, answering(b_nodes, failures[1])),
        ],
        |config| {
            config.freshness_ttl = ms(10_000);
            config.facts_ttl = std::time::Duration::ZERO;
        },
    )
    .expect("valid test backends")
}

/// `/pdb/query/v4/nodes` asked at `at_ms`: its `X-Backends` and its body.
fn nodes_at(h: &mut Harness, at_ms: u64) -> (Option<String>, Value) {
    run_to(h, at_ms);
    let client = h.get("/pdb/query/v4/nodes");
    run_to(h, at_ms + 50);
    let response = h.response(client).expect("answered");
    let backends = response.header("x-backends").map(str::to_owned);
    let body: Value = serde_json::from_slice(&response.body).expect("JSON");
    (backends, body)
}

/// When the map places no backend at all (every refresh so far failed), a request waits for a
/// second refresh (the first may have begun before the backends came back); when that one too
/// places nobody it asks every backend (an answer beats none) but counts none of them:
/// ownership could not be decided, so the answer says it is partial (`0/2`) rather than
/// passing a guess off as whole. The next request waits for a new refresh, as for the first
/// map, and is whole, with web2 from its owner.
#[test]
fn an_answer_while_the_map_places_no_backend_is_not_whole() {
    let mut h = web_nodes_failing_membership([2, 2]);
    let (first, body) = nodes_at(&mut h, 0);
    assert_eq!(first.as_deref(), Some("0/2"), "{body}");
    let (whole, body) = nodes_at(&mut h, 200);
    assert_eq!(whole.as_deref(), Some("2/2"), "{body}");
    let web2 = body
        .as_array()
        .and_then(|nodes| nodes.iter().find(|n| n["certname"] == "web2"))
        .cloned()
        .unwrap_or_default();
    assert_eq!(
        web2["report_timestamp"], "2024-05-01T11:00:00.000Z",
        "{body}"
    );
}

/// A backend whose membership the map has never placed (its first refresh failed) is left out of
/// every answer that needs ownership until a refresh places it: a partial answer, never a whole
/// one that guesses whose copy of its nodes is newest (web2's newer copy is pdb-b's). The map is
/// asked again five seconds after, not a `freshness_ttl` after.
#[test]
fn a_backend_the_map_never_placed_is_left_out_until_a_refresh_places_it() {
    // Long freshness: the map is asked again sooner only because pdb-b is not placed.
    let mut h = web_nodes_failing_membership([0, 1]);
    // The first refresh does not hear from pdb-b: the request that waited for it, and one
    // after it while the map is fresh, leave pdb-b out.
    let (first, _) = nodes_at(&mut h, 0);
    assert_eq!(first.as_deref(), Some("1/2"));
    let (second, body) = nodes_at(&mut h, 200);
    assert_eq!(second.as_deref(), Some("1/2"), "{body}");
    // A request five seconds after that refresh starts the next one (pdb-b is not placed, so
    // the map does not wait for its `freshness_ttl`) and is answered from the map it finds;
    // once that refresh placed pdb-b, a whole answer, with web2 from pdb-b.
    let (third, body) = nodes_at(&mut h, 5_500);
    assert_eq!(third.as_deref(), Some("1/2"), "{body}");
    let (fourth, body) = nodes_at(&mut h, 5_600);
    assert_eq!(fourth.as_deref(), Some("2/2"), "{body}");
    let web2 = body
        .as_array()
        .and_then(|nodes| nodes.iter().find(|n| n["certname"] == "web2"))
        .cloned()
        .unwrap_or_default();
    assert_eq!(
        web2["report_timestamp"], "2024-05-01T11:00:00.000Z",
        "{body}"
    );
}

#[test]
fn each_cause_of_an_unreachable_backend_counts_under_its_own_probe_outcome_and_state() {
    // Refused, a failed TLS handshake, a probe that never answers (timed out at 250 ms) and a
    // probe path the backend does not have (404), every second for 4 s: the metrics name each
    // cause, as /healthz and the log line do.
    let tls = Reply::fail(pdbmux_core::UpstreamFailure::Connect {
        cause: pdbmux_core::ConnectCause::Tls,
        detail: "invalid peer certificate: UnknownIssuer".to_owned(),
    });
    let mut h = Harness::with_config(
        vec![
            backend("pdb-a", URL_A, Vec::new(), Reply::refused()),
            backend("pdb-b", URL_B, Vec::new(), tls),
            backend("pdb-c", URL_C, Vec::new(), Reply::never()),
            backend("pdb-d", URL_D, Vec::new(), probe_status(404)),
        ],
        |config| {
            probing(config);
            config.metrics_listen = Some("127.0.0.1:0".to_owned());
        },
    )
    .expect("valid test backends");
    run_to(&mut h, 4_500);
    let text = h.metrics_text().expect("metrics are on");
    let sample = |family: &str, labels: &str| -> f64 {
        let prefix = format!("{family}{{{labels}}} ");
        text.lines()
            .find_map(|line| line.strip_prefix(&prefix))
            .unwrap_or_else(|| panic!("no {prefix}in\n{text}"))
            .parse()
            .expect("a number")
    };
    for (backend, outcome, state) in [
        ("pdb-a", "connection_refused", "unreachable"),
        ("pdb-b", "tls_error", "unreachable"),
        ("pdb-c", "timeout", "unreachable"),
        ("pdb-d", "4xx", "probe_unsupported"),
    ] {
        let labels = format!("backend=\"{backend}\",purpose=\"probe\",outcome=\"{outcome}\"");
        assert!(
            sample("pdbmux_upstream_requests_total", &labels) >= 4.0,
            "{labels}\n{text}"
        );
        for other in ["connection_refused", "tls_error", "timeout", "4xx", "ok"] {
            if other != outcome {
                let labels = format!("backend=\"{backend}\",purpose=\"probe\",outcome=\"{other}\"");
                assert_eq!(
                    sample("pdbmux_upstream_requests_total", &labels),
                    0.0,
                    "{labels}"
                );
            }
        }
        let state = format!("backend=\"{backend}\",state=\"{state}\"");
        assert_eq!(
            sample("pdbmux_backend_state", &state),
            1.0,
            "{state}\n{text}"
        );
    }
    let healthz = healthz_at(&mut h, 4_600);
    for (backend, result) in [
        ("pdb-a", "connection_refused"),
        ("pdb-b", "tls_error"),
        ("pdb-c", "timeout"),
        ("pdb-d", "probe_path_not_found"),
    ] {
        assert_eq!(
            backend_report(&healthz, backend)["last_probe_result"],
            result,
            "{healthz:#}"
        );
    }
}
