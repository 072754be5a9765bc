//! The memory budget of buffered merges on real sockets: bodies of unknown length (chunked) are
//! counted while they are read, so a merge over `merge_request_bytes` is refused with a 503 and
//! `Retry-After`, counted in the metrics, and its bytes are given back. (That reading stops at the
//! refusal is the runtimes' code, not asserted here: the backend cannot see how much was read.)

use std::path::Path;

use super::metrics::{metrics_addr, scrape_until};
use super::{chunked, End};
use crate::support::{FakeBackend, Pdbmux};

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
    let scrape = scrape_until(metrics, |s| {
        s.value("pdbmux_merge_budget_refusals_total", "scope=request") == 1.0
    });
    assert_eq!(
        scrape.value("pdbmux_merge_memory_bytes", ""),
        0.0,
        "the refused merge gave its bytes back:\n{}",
        scrape.text
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
