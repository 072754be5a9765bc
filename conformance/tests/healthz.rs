//! `/healthz`: a live reachability check of every backend; concurrent callers share one check.

mod common;

use common::{finish, harness, version, URL_A, URL_B};
use http::StatusCode;
use pdbmux_conformance::{ms, FakeBackend, Machine, Reply};

#[test]
fn all_reachable_is_ok_200() {
    let mut h = harness(vec![
        FakeBackend::queue("pdb-a", URL_A, [version("7.12.1").after(ms(3))]),
        FakeBackend::queue("pdb-b", URL_B, [version("7.12.1").after(ms(4))]),
    ]);
    let c = h.get("/healthz");
    let transcript = finish(&mut h);
    let response = h.response(c).expect("one response");
    assert_eq!(response.status, StatusCode::OK);
    assert!(
        response.body_str().starts_with(r#"{"status":"ok""#),
        "{}",
        response.body_str()
    );
    insta::assert_snapshot!(transcript);
}

#[test]
fn one_down_is_degraded_200() {
    let mut h = harness(vec![
        FakeBackend::queue("pdb-a", URL_A, [version("7.12.1").after(ms(3))]),
        FakeBackend::queue("pdb-b", URL_B, [Reply::refused().after(ms(1))]),
    ]);
    let c = h.get("/healthz");
    let transcript = finish(&mut h);
    let response = h.response(c).expect("one response");
    assert_eq!(response.status, StatusCode::OK);
    assert!(
        response.body_str().starts_with(r#"{"status":"degraded""#),
        "{}",
        response.body_str()
    );
    insta::assert_snapshot!(transcript);
}

#[test]
fn all_down_is_down_503() {
    // One refuses, one answers 500 (non-2xx counts as unreachable), a third never answers.
    let mut h = harness(vec![
        FakeBackend::queue("pdb-a", URL_A, [Reply::refused().after(ms(1))]),
        FakeBackend::queue(
            "pdb-b",
            URL_B,
            [Reply::text(
                StatusCode::INTERNAL_SERVER_ERROR,
                "broken at pdb-b.example.com:8080",
            )
            .after(ms(2))],
        ),
        FakeBackend::queue("pdb-c", "http://10.0.0.3:8080", [Reply::never()]),
    ]);
    let c = h.get("/healthz");
    let transcript = finish(&mut h);
    let response = h.response(c).expect("one response");
    assert_eq!(response.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(
        response.body_str().starts_with(r#"{"status":"down""#),
        "{}",
        response.body_str()
    );
    assert!(
        !response.body_str().contains("example.com"),
        "addresses are scrubbed"
    );
    assert_eq!(response.at, h.config().timeout);
    insta::assert_snapshot!(transcript);
}

#[test]
fn concurrent_calls_share_one_check() {
    let mut h = harness(vec![
        FakeBackend::queue("pdb-a", URL_A, [version("7.12.1").after(ms(8))]),
        FakeBackend::queue("pdb-b", URL_B, [version("7.12.1").after(ms(6))]),
    ]);
    let first = h.get("/healthz");
    h.run_until(ms(2), common::STEPS).expect("runs");
    let second = h.get("/healthz");
    let transcript = finish(&mut h);
    assert_eq!(
        h.sends().len(),
        2,
        "one set of upstream sends:\n{transcript}"
    );
    assert!(h.sends().iter().all(|s| s.machine == Machine::Estate));
    let a = h.response(first).expect("one response");
    let b = h.response(second).expect("one response");
    assert_eq!((a.status, a.at), (b.status, b.at));
    assert_eq!(a.body, b.body);
    insta::assert_snapshot!(transcript);
}

#[test]
fn a_check_after_the_last_one_finished_asks_again() {
    let mut h = harness(vec![FakeBackend::always(
        "pdb-a",
        URL_A,
        version("7.12.1").after(ms(1)),
    )]);
    let first = h.get("/healthz");
    h.run_until(ms(5), common::STEPS).expect("runs");
    let second = h.get("/healthz");
    finish(&mut h);
    assert_eq!(h.sends().len(), 2);
    assert_eq!(h.response(first).expect("one").at, ms(1));
    assert_eq!(h.response(second).expect("one").at, ms(6));
}

#[test]
fn a_waiter_that_left_gets_nothing_and_the_other_is_answered() {
    let mut h = harness(vec![FakeBackend::queue(
        "pdb-a",
        URL_A,
        [version("7.12.1").after(ms(5))],
    )]);
    let first = h.get("/healthz");
    let second = h.get("/healthz");
    h.disconnect(first).expect("known client");
    finish(&mut h);
    assert!(h.responses(first).expect("known").is_empty());
    assert_eq!(h.response(second).expect("one").status, StatusCode::OK);
}

#[test]
fn livez_and_readyz_answer_at_once_with_every_backend_down_and_ask_none() {
    // Every backend refuses everything: /healthz would be 503. /livez and /readyz say only that
    // the process serves and can answer (stale entries, PuppetDB's errors and partial answers
    // are answers), so a backend outage neither empties the Service nor restarts the replicas.
    let mut h = harness(vec![
        FakeBackend::queue("pdb-a", URL_A, []),
        FakeBackend::queue("pdb-b", URL_B, []),
    ]);
    let live = h.get("/livez");
    let ready = h.get("/readyz");
    let transcript = finish(&mut h);
    let live = h.response(live).expect("one response");
    let ready = h.response(ready).expect("one response");
    assert_eq!(live.status, StatusCode::OK);
    assert_eq!(live.body_str(), r#"{"status":"live"}"#);
    assert_eq!(ready.status, StatusCode::OK);
    assert_eq!(ready.body_str(), r#"{"backends":2,"status":"ready"}"#);
    assert_eq!(live.at, std::time::Duration::ZERO, "answered at once");
    assert_eq!(ready.at, std::time::Duration::ZERO, "answered at once");
    assert!(
        !transcript.contains(" GET /pdb/meta") && !transcript.contains("/status/v1"),
        "no backend is asked for them:\n{transcript}"
    );
    insta::assert_snapshot!(transcript);
}
