//! Helpers shared by the conformance tests.

#![allow(dead_code)]

use http::StatusCode;
use pdbmux_conformance::{FakeBackend, Harness, Reply};

/// Step budget for one scenario; far above what any scenario needs.
pub const STEPS: usize = 1_000;

/// URL of the first test backend.
pub const URL_A: &str = "http://pdb-a.example.com:8080";
/// URL of the second test backend.
pub const URL_B: &str = "http://pdb-b.example.com:8080";
/// URL of the third test backend.
pub const URL_C: &str = "http://pdb-c.example.com:8080";

/// Drives to quiescence, checks the end state and returns the transcript.
pub fn finish(harness: &mut Harness) -> String {
    if let Err(error) = harness.drive_bounded(STEPS) {
        panic!("{error}\n{}", harness.transcript());
    }
    if let Err(error) = harness.check_quiescent() {
        panic!("{error}\n{}", harness.transcript());
    }
    harness.transcript()
}

/// A harness over these backends; panics on a bad script (test data).
pub fn harness(backends: Vec<FakeBackend>) -> Harness {
    Harness::new(backends).expect("valid test backends")
}

/// `{"version":"<v>"}`.
pub fn version(v: &str) -> Reply {
    Reply::ok(format!("{{\"version\":\"{v}\"}}"))
}

/// A PuppetDB-style 404 for an unknown node.
pub fn node_404(certname: &str) -> Reply {
    Reply::json(
        StatusCode::NOT_FOUND,
        format!("{{\"error\":\"No information is known about node {certname}\"}}"),
    )
}

/// A membership answer (`["extract",["certname","report_timestamp"]]` on `/nodes`): these
/// certnames with these report timestamps.
pub fn members(rows: &[(&str, Option<&str>)]) -> Reply {
    let rows: Vec<serde_json::Value> = rows
        .iter()
        .map(|(certname, timestamp)| serde_json::json!({ "certname": certname, "report_timestamp": timestamp }))
        .collect();
    Reply::ok(serde_json::Value::Array(rows).to_string())
}

/// A backend answering the membership query with `membership` (after 3 ms) and everything else
/// from `replies` in order.
pub fn member_backend(
    name: &str,
    url: &str,
    membership: Reply,
    replies: Vec<Reply>,
) -> FakeBackend {
    FakeBackend::queue(name, url, replies).on(
        pdbmux_core::membership::MEMBERSHIP_QUERY,
        membership.after(pdbmux_conformance::ms(3)),
    )
}
