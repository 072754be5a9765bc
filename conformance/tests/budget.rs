//! The memory budget of buffered merges (docs/operating.md, "Memory"): a request whose backend
//! answers are more than `merge_request_bytes`, or that finds the merges in flight holding
//! `merge_memory_bytes`, gets a 503 with `Retry-After` instead of growing the process; the
//! bytes return when a merge ends, and no backend is counted as failing for it.

mod common;

use std::time::Duration;

use common::{finish, URL_A, URL_B};
use http::StatusCode;
use pdbmux_conformance::{ms, FakeBackend, Harness, Reply};

/// `count` distinct reports from `backend`, about 100 bytes each.
fn reports(backend: &str, count: usize) -> String {
    let records: Vec<String> = (0..count)
        .map(|i| {
            format!(
                r#"{{"hash":"{backend}-{i:04}","certname":"node-{i:04}.example.com","status":"unchanged"}}"#
            )
        })
        .collect();
    format!("[{}]", records.join(","))
}

/// Two backends answering `/reports` with 20 records each, pdb-b `slow` behind pdb-a.
fn backends(slow: Duration) -> Vec<FakeBackend> {
    let a = reports("a", 20);
    let b = reports("b", 20);
    vec![
        FakeBackend::by_path("pdb-a", URL_A, move |_| Reply::ok(a.clone()).after(ms(5))),
        FakeBackend::by_path("pdb-b", URL_B, move |_| Reply::ok(b.clone()).after(slow)),
    ]
}

fn with_budget(slow: Duration, request: u64, process: u64) -> Harness {
    Harness::with_config(backends(slow), |config| {
        config.merge_request_bytes = request;
        config.merge_memory_bytes = process;
        // Every answer is a fan-out (no hit hides a merge).
        config.facts_ttl = Duration::ZERO;
        config.history_ttl = Duration::ZERO;
        config.aggregate_ttl = Duration::ZERO;
    })
    .expect("valid test backends")
}

fn body_len(backend: &str) -> u64 {
    reports(backend, 20).len() as u64
}

#[test]
fn a_merge_whose_answers_are_over_the_request_budget_is_refused_with_retry_after() {
    // One backend's answer fits; both do not.
    let budget = body_len("a") + body_len("b") / 2;
    let mut h = with_budget(ms(20), budget, 1 << 30);
    let refused = h.get("/pdb/query/v4/reports");
    let transcript = finish(&mut h);
    let response = h.response(refused).expect("one response");
    assert_eq!(
        response.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{transcript}"
    );
    assert_eq!(response.header("retry-after"), Some("2"));
    let body = response.body_str();
    assert!(
        body.contains("merge_request_bytes") && body.contains(&format!("{budget} bytes")),
        "{body}"
    );
    assert_eq!(response.header("x-backends"), None, "no backend failed");

    // Within budget, the same merge answers whole: 40 reports.
    let mut h = with_budget(ms(20), body_len("a") + body_len("b"), 1 << 30);
    let answered = h.get("/pdb/query/v4/reports");
    finish(&mut h);
    let response = h.response(answered).expect("one response");
    assert_eq!(response.status, StatusCode::OK);
    let records: Vec<serde_json::Value> =
        serde_json::from_slice(&response.body).expect("a JSON array");
    assert_eq!(records.len(), 40);
}

#[test]
fn a_request_finding_the_process_budget_held_is_refused_at_once_and_admitted_once_it_is_free() {
    // pdb-a's answer alone fills the process budget while pdb-b takes 500 ms.
    let full = body_len("a");
    let mut h = with_budget(ms(500), 1 << 30, full);
    let holding = h.get("/pdb/query/v4/reports");
    h.run_until(ms(100), 1_000).expect("runs");
    let refused = h.get("/pdb/query/v4/events");
    h.run_until(ms(200), 1_000).expect("runs");
    let response = h.response(refused).expect("answered at once");
    assert_eq!(response.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(response.at, ms(100), "refused before asking anyone");
    assert_eq!(response.header("retry-after"), Some("2"));
    assert!(
        response.body_str().contains("merge_memory_bytes"),
        "{}",
        response.body_str()
    );
    // The merge holding the budget goes over it with its second answer, and is refused too.
    let transcript = finish(&mut h);
    let held = h.response(holding).expect("one response");
    assert_eq!(held.status, StatusCode::SERVICE_UNAVAILABLE, "{transcript}");
    // Both merges ended and their bytes are back: with room for one whole merge, a new one is
    // admitted and answers (had the refused merge kept its bytes, it would hold all of it).
    h.reload(|config| config.merge_memory_bytes = body_len("a") + body_len("b"));
    let admitted = h.get("/pdb/query/v4/reports");
    finish(&mut h);
    let response = h.response(admitted).expect("one response");
    assert_eq!(response.status, StatusCode::OK, "{}", h.transcript());
}
