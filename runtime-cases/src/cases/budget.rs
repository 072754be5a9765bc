//! The memory budget of buffered merges on real sockets: bodies of unknown length (chunked) are
//! counted while they are read, so a merge over `merge_request_bytes` is refused with a 503 and
//! `Retry-After`, counted in the metrics, and its bytes are given back. (That reading stops at the
//! refusal is the runtimes' code, not asserted here: the backend cannot see how much was read.)
//! A streamed history merge counts the digests that tell copies apart as they grow: past the
//! budget its body is cut off.

use std::net::SocketAddr;
use std::path::Path;

use super::metrics::{metrics_addr, scrape_until, Scrape};
use super::verbatim::dechunk;
use super::{chunked, ends_a_chunked_body, End};
use crate::support::{access_line, FakeBackend, Pdbmux};

/// `count` distinct reports from `backend`, about 100 bytes each.
fn reports(backend: &str, count: usize) -> String {
    let records: Vec<String> = (0..count)
        .map(|i| {
            format!(
                r#"{{"hash":"{backend}-{i:06}","certname":"node-{i:06}.example.com","status":"unchanged"}}"#
            )
        })
        .collect();
    format!("[{}]", records.join(","))
}

/// The metrics once `counted` (a metric and its labels) is 1, asserting that the merge it
/// counts gave its bytes back to the process budget.
fn given_back_once_counted(metrics: SocketAddr, (name, labels): (&str, &str)) -> Scrape {
    let scrape = scrape_until(metrics, |s| s.value(name, labels) == 1.0);
    assert_eq!(
        scrape.value("pdbmux_merge_memory_bytes", ""),
        0.0,
        "the merge {name}{{{labels}}} counts gave its bytes back:\n{}",
        scrape.text
    );
    scrape
}

pub fn a_merge_over_its_memory_budget_is_refused_while_it_reads_and_gives_its_bytes_back(
    bin: &Path,
) {
    // Two chunked answers of about 190 KB each; one request may hold 250 KB.
    // Asked with a limit, a backend answers that many.
    let answer = |backend: &'static str| {
        move |request: &str| {
            let count = if request.contains("limit=") { 10 } else { 2000 };
            chunked(&reports(backend, count), End::Terminated)
        }
    };
    let backend_a = FakeBackend::start(answer("a"));
    let backend_b = FakeBackend::start(answer("b"));
    let metrics = metrics_addr();
    let pdbmux = Pdbmux::start(
        bin,
        &[
            (
                "PDBMUX_BACKENDS",
                format!("a={},b={}", backend_a.url(), backend_b.url()),
            ),
            ("PDBMUX_MERGE_REQUEST_BYTES", "250000".into()),
            ("PDBMUX_HISTORY_TTL", "0".into()),
            ("PDBMUX_METRICS_LISTEN", metrics.to_string()),
        ],
    );
    let response = pdbmux.get("/pdb/query/v4/reports");
    assert_eq!(response.status(), 503, "{}", response.text);
    assert_eq!(response.header("retry-after").as_deref(), Some("2"));
    assert!(
        response
            .body()
            .contains("merge_request_bytes (250000 bytes)"),
        "{}",
        response.body()
    );
    let scrape = given_back_once_counted(
        metrics,
        ("pdbmux_merge_budget_refusals_total", "scope=request"),
    );
    assert_eq!(
        scrape.value(
            "pdbmux_upstream_requests_total",
            "backend=a,outcome=over_budget,purpose=query"
        ) + scrape.value(
            "pdbmux_upstream_requests_total",
            "backend=b,outcome=over_budget,purpose=query"
        ),
        1.0,
        "{}",
        scrape.text
    );

    // A narrower question fits, on the same process: both backends' records, once each.
    let response =
        pdbmux.get("/pdb/query/v4/reports?limit=10&order_by=%5B%7B%22field%22%3A%22hash%22%7D%5D");
    assert_eq!(response.status(), 200, "{}", response.text);
    let records: Vec<serde_json::Value> =
        serde_json::from_str(response.body()).expect("a JSON array");
    assert_eq!(records.len(), 10);
}

pub fn a_streamed_history_merge_past_its_memory_budget_is_cut_off_and_gives_its_bytes_back(
    bin: &Path,
) {
    // Every answer that can stream streams; each backend answers 20,000 distinct reports (about
    // 2 MB). The reads before the merge streams (each body's first 64 KiB) fit in the 600 KB one
    // request may hold; the digests of 40,000 reports (about 20 bytes each) do not.
    let answer = |backend: &'static str| {
        move |_request: &str| chunked(&reports(backend, 20_000), End::Terminated)
    };
    let backend_a = FakeBackend::start(answer("a"));
    let backend_b = FakeBackend::start(answer("b"));
    let metrics = metrics_addr();
    let start = |request_bytes: &str, metrics: Option<SocketAddr>| {
        let mut env = vec![
            (
                "PDBMUX_BACKENDS",
                format!("a={},b={}", backend_a.url(), backend_b.url()),
            ),
            ("PDBMUX_MERGE_REQUEST_BYTES", request_bytes.to_owned()),
            ("PDBMUX_STREAM_ABOVE_BYTES", "0".into()),
            ("PDBMUX_HISTORY_TTL", "0".into()),
        ];
        if let Some(metrics) = metrics {
            env.push(("PDBMUX_METRICS_LISTEN", metrics.to_string()));
        }
        Pdbmux::start(bin, &env)
    };
    let mut pdbmux = start("600000", Some(metrics));
    let response = pdbmux.get("/pdb/query/v4/reports");
    assert_eq!(response.status(), 200, "streamed: its head left first");
    assert!(
        !ends_a_chunked_body(&response.text),
        "the client must not see a complete body"
    );
    given_back_once_counted(metrics, ("pdbmux_streamed_merges_total", "outcome=cut_off"));
    // Its one access line says why (read once pdbmux stopped).
    let log = pdbmux.stderr();
    let line = access_line(&log, "/pdb/query/v4/reports");
    for field in [" body=cut_off ", "merge_request_bytes (600000 bytes)"] {
        assert!(line.contains(field), "{field} in {line}");
    }

    // With room for its digests the same question is whole: every report once.
    let pdbmux = start("8000000", None);
    let response = pdbmux.get("/pdb/query/v4/reports");
    assert_eq!(response.status(), 200, "{}", response.text);
    let (body, whole) = dechunk(response.body());
    assert!(whole, "a whole chunked body");
    let records: Vec<serde_json::Value> = serde_json::from_str(&body).expect("a JSON array");
    assert_eq!(records.len(), 40_000);
}
