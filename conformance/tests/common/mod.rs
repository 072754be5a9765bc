//! Helpers shared by the conformance tests.

#![allow(dead_code)]

use http::StatusCode;
use pdbmux_conformance::{
    membership_rows, node_record, written_by_postgresql, FakeBackend, Harness, Reply,
};
use pdbmux_core::membership::TIME_KEY;

/// Step budget for one scenario; far above what any scenario needs.
pub const STEPS: usize = 1_000;

/// URL of the first test backend.
pub const URL_A: &str = "http://pdb-a.example.com:8080";
/// URL of the second test backend.
pub const URL_B: &str = "http://pdb-b.example.com:8080";
/// URL of the third test backend.
pub const URL_C: &str = "http://pdb-c.example.com:8080";
/// URL of the fourth test backend.
pub const URL_D: &str = "http://pdb-d.example.com:8080";

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

/// Runs the simulation to `at` after its start (every timer due by then fires); panics with
/// the transcript when it cannot.
pub fn run_to(harness: &mut Harness, at: std::time::Duration) {
    if let Err(error) = harness.run_until(at, STEPS) {
        panic!("{error}\n{}", harness.transcript());
    }
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

/// A membership answer (`MEMBERSHIP_QUERY` on `/nodes`): these active certnames with these
/// report timestamps, written as PuppetDB writes them there.
pub fn members(rows: &[(&str, Option<&str>)]) -> Reply {
    let nodes: Vec<serde_json::Value> = rows
        .iter()
        .map(|(certname, timestamp)| node_record(certname, *timestamp))
        .collect();
    Reply::ok(membership_rows(&nodes).to_string())
}

/// A producer-time answer (`FACTS_PRODUCED_QUERY` or `CATALOGS_PRODUCED_QUERY`): these
/// certnames produced at these times, written as PuppetDB writes them there.
pub fn produced(rows: &[(&str, &str)]) -> Reply {
    let rows: Vec<serde_json::Value> = rows
        .iter()
        .map(|(certname, at)| {
            serde_json::json!({ "certname": certname, (TIME_KEY): written_by_postgresql(at) })
        })
        .collect();
    Reply::ok(serde_json::Value::Array(rows).to_string())
}

/// A backend answering the membership query with `membership` (after 3 ms), the producer-time
/// queries as if each node's facts and catalog came with its latest report (a failing
/// membership answer fails them too), and everything else from `replies` in order.
pub fn member_backend(
    name: &str,
    url: &str,
    membership: Reply,
    replies: Vec<Reply>,
) -> FakeBackend {
    let produced = pdbmux_conformance::produced_in_runs(&membership);
    member_backend_produced(name, url, membership, (produced.clone(), produced), replies)
}

/// [`member_backend`] whose factsets and catalogs were produced as `(facts, catalogs)` say.
pub fn member_backend_produced(
    name: &str,
    url: &str,
    membership: Reply,
    (facts, catalogs): (Reply, Reply),
    replies: Vec<Reply>,
) -> FakeBackend {
    let after = pdbmux_conformance::ms(3);
    FakeBackend::queue(name, url, replies)
        .on(
            pdbmux_core::membership::MEMBERSHIP_QUERY,
            membership.after(after),
        )
        .on(
            pdbmux_core::membership::FACTS_PRODUCED_QUERY,
            facts.after(after),
        )
        .on(
            pdbmux_core::membership::CATALOGS_PRODUCED_QUERY,
            catalogs.after(after),
        )
}

/// What the harness sent for clients' requests: every upstream request but the estate's own
/// (the membership refresh, probes, the `/healthz` check).
pub fn exchange_sends(h: &pdbmux_conformance::Harness) -> Vec<&pdbmux_conformance::SentRequest> {
    h.sends()
        .iter()
        .filter(|s| s.machine != pdbmux_conformance::Machine::Estate)
        .collect()
}

/// The core's source files (`core/src`, every `.rs` below it), for the checks of its shape.
pub fn core_sources() -> (std::path::PathBuf, Vec<std::path::PathBuf>) {
    fn walk(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
        for entry in std::fs::read_dir(dir).expect("core/src").flatten() {
            let path = entry.path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../core/src");
    let mut all = Vec::new();
    walk(&root, &mut all);
    (root, all)
}
