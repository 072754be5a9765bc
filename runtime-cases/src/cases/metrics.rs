//! pdbmux's own metrics, scraped from the metrics listener of the binary under test and parsed
//! with a Prometheus text parser (`prometheus-parse`).

use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpListener};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use crate::support::{keep_getting, respond, FakeBackend, Pdbmux};

/// A free loopback address for the metrics listener.
pub(crate) fn metrics_addr() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

/// One scrape, parsed: each sample's name and labels (sorted `k=v` pairs, joined by `,`) to its
/// value, with the raw text for messages.
pub(crate) struct Scrape {
    samples: BTreeMap<(String, String), f64>,
    pub(crate) text: String,
}

impl Scrape {
    pub(crate) fn of(addr: SocketAddr) -> Scrape {
        let response = Pdbmux::raw_at(
            addr,
            "GET /metrics HTTP/1.1\r\nHost: m\r\nConnection: close\r\n\r\n",
        );
        assert_eq!(response.status(), 200, "{}", response.text);
        assert!(
            response
                .header("content-type")
                .unwrap()
                .starts_with("text/plain; version=0.0.4"),
            "{}",
            response.text
        );
        let text = response.body().to_owned();
        let lines = text.lines().map(|line| Ok(line.to_owned()));
        let parsed = prometheus_parse::Scrape::parse(lines).expect("a well-formed scrape");
        let mut samples = BTreeMap::new();
        for sample in parsed.samples {
            let mut labels: Vec<String> = sample
                .labels
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            labels.sort();
            let value = match sample.value {
                prometheus_parse::Value::Counter(v)
                | prometheus_parse::Value::Gauge(v)
                | prometheus_parse::Value::Untyped(v) => v,
                // Histogram and summary lines are checked by the parser, not compared here.
                _ => continue,
            };
            samples.insert((sample.metric, labels.join(",")), value);
        }
        Scrape { samples, text }
    }

    /// The value of `name{labels}` (labels as `k=v,k=v`, sorted); 0 when absent.
    pub(crate) fn value(&self, name: &str, labels: &str) -> f64 {
        self.samples
            .get(&(name.to_owned(), labels.to_owned()))
            .copied()
            .unwrap_or(0.0)
    }
}

/// Scrapes until `ready` holds (at most 10 s).
pub(crate) fn scrape_until(addr: SocketAddr, ready: impl Fn(&Scrape) -> bool) -> Scrape {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let scrape = Scrape::of(addr);
        if ready(&scrape) {
            return scrape;
        }
        assert!(Instant::now() < deadline, "never ready:\n{}", scrape.text);
        thread::sleep(Duration::from_millis(50));
    }
}

/// A backend serving one node and `["kernel"]` for fact-names; while `failing`, every query is
/// a 500, and its health probe a 503 too when `probe_follows`.
fn scripted(failing: Arc<AtomicBool>, probe_follows: bool) -> FakeBackend {
    FakeBackend::start(move |line| {
        if line.contains("/status/v1/services") {
            return if probe_follows && failing.load(Ordering::SeqCst) {
                respond("503 Service Unavailable", "application/json", "{}")
            } else {
                respond("200 OK", "application/json", "{}")
            };
        }
        if failing.load(Ordering::SeqCst) {
            return respond("500 Server Error", "text/plain", "boom");
        }
        one_node(line)
    })
}

/// The answer of a backend holding one node, `n1`, with the fact `kernel`: `["kernel"]` for
/// fact-names, the node's record for anything else.
pub(crate) fn one_node(line: &str) -> Vec<crate::support::Piece> {
    if line.contains("/pdb/query/v4/fact-names") {
        respond("200 OK", "application/json", r#"["kernel"]"#)
    } else {
        respond(
            "200 OK",
            "application/json",
            r#"[{"certname":"n1","report_timestamp":"2024-05-01T10:00:00.000Z","deactivated":null,"expired":null}]"#,
        )
    }
}

/// One whole answer, one partial answer, one stale hit and one health transition, counted
/// exactly: the first `/fact-names` is answered by both backends and stored; then backend b
/// fails (its probe too, so it goes down) and, past the entry's TTL, the second is answered by a
/// alone (served, not stored); then a fails too and the expired whole entry answers.
pub fn a_scripted_run_shows_in_the_metrics_with_exact_counts(bin: &Path) {
    let a_failing = Arc::new(AtomicBool::new(false));
    let b_failing = Arc::new(AtomicBool::new(false));
    let a = scripted(Arc::clone(&a_failing), false);
    let b = scripted(Arc::clone(&b_failing), true);
    let metrics = metrics_addr();
    let pdbmux = Pdbmux::start(
        bin,
        &[
            ("PDBMUX_BACKENDS", format!("a={},b={}", a.url(), b.url())),
            ("PDBMUX_METRICS_LISTEN", metrics.to_string()),
            ("PDBMUX_HEALTH_PROBE_ENABLED", "true".to_owned()),
            ("PDBMUX_HEALTH_PROBE_INTERVAL", "100ms".to_owned()),
            ("PDBMUX_HEALTH_PROBE_FAILURES", "1".to_owned()),
            ("PDBMUX_FACTS_TTL", "1s".to_owned()),
        ],
    );
    let whole = pdbmux.get("/pdb/query/v4/fact-names");
    assert_eq!(whole.status(), 200, "{}", whole.text);
    assert_eq!(whole.header("x-backends").as_deref(), Some("2/2"));
    b_failing.store(true, Ordering::SeqCst);
    thread::sleep(Duration::from_millis(1100));
    let down = scrape_until(metrics, |s| {
        s.value("pdbmux_backend_state", "backend=b,state=unhealthy") == 1.0
    });
    assert_eq!(
        down.value(
            "pdbmux_backend_transitions_total",
            "backend=b,transition=down"
        ),
        1.0,
        "{}",
        down.text
    );
    assert_eq!(
        down.value("pdbmux_backend_state", "backend=a,state=healthy"),
        1.0
    );
    let partial = pdbmux.get("/pdb/query/v4/fact-names");
    assert_eq!(partial.status(), 200, "{}", partial.text);
    assert_eq!(partial.header("x-backends").as_deref(), Some("1/2"));
    a_failing.store(true, Ordering::SeqCst);
    let stale = pdbmux.get("/pdb/query/v4/fact-names");
    assert_eq!(stale.status(), 200, "{}", stale.text);
    assert_eq!(stale.header("x-cache").as_deref(), Some("stale"));
    assert_eq!(
        stale.header("x-backends").as_deref(),
        Some("2/2"),
        "the whole entry: the partial answer was not stored"
    );

    let scrape = Scrape::of(metrics);
    let value = |name: &str, labels: &str| scrape.value(name, labels);
    let text = &scrape.text;
    assert_eq!(
        value("pdbmux_partial_answers_total", "route=query"),
        1.0,
        "{text}"
    );
    // The stale answer was a fan-out no backend answered.
    assert_eq!(
        value("pdbmux_unanswered_total", "route=query"),
        1.0,
        "{text}"
    );
    let count = "pdbmux_request_duration_seconds_count{route=\"query\"} 3\n";
    let inf = "pdbmux_request_duration_seconds_bucket{route=\"query\",le=\"+Inf\"} 3\n";
    assert!(text.contains(count) && text.contains(inf), "{text}");
    assert_eq!(
        value("pdbmux_cache_requests_total", "result=miss"),
        2.0,
        "{text}"
    );
    assert_eq!(
        value("pdbmux_cache_requests_total", "result=stale"),
        1.0,
        "{text}"
    );
    assert_eq!(
        value("pdbmux_cache_requests_total", "result=hit"),
        0.0,
        "{text}"
    );
    assert_eq!(
        value("pdbmux_requests_total", "code=200,route=query"),
        3.0,
        "{text}"
    );
    assert_eq!(
        value(
            "pdbmux_backend_transitions_total",
            "backend=b,transition=down"
        ),
        1.0,
        "{text}"
    );
    assert_eq!(value("pdbmux_cache_entries", ""), 1.0, "{text}");
    // a answered the first two fact-names and failed the third; b answered the first, then
    // (down) was asked only when a failed.
    assert_eq!(
        value(
            "pdbmux_upstream_requests_total",
            "backend=a,outcome=5xx,purpose=query"
        ),
        1.0,
        "{text}"
    );
    assert!(
        value(
            "pdbmux_upstream_requests_total",
            "backend=a,outcome=ok,purpose=query"
        ) >= 2.0,
        "{text}"
    );
    assert!(
        value(
            "pdbmux_upstream_requests_total",
            "backend=b,outcome=5xx,purpose=query"
        ) >= 1.0,
        "{text}"
    );
    // The last client's connection ends on the server's side a moment after its answer.
    scrape_until(metrics, |s| s.value("pdbmux_client_connections", "") == 0.0);
    assert!(value("pdbmux_client_sent_bytes_total", "") > 0.0, "{text}");
    assert!(text.contains("pdbmux_build_info{"), "{text}");
    if cfg!(target_os = "linux") {
        assert!(value("process_resident_memory_bytes", "") > 0.0, "{text}");
        assert!(value("process_open_fds", "") > 0.0, "{text}");
    }
}

/// The metrics listener answers `/metrics` and 404 for anything else (a PuppetDB path too); the
/// PuppetDB-facing port does not serve `/metrics`.
pub fn the_metrics_listener_serves_metrics_only_and_the_query_port_none(bin: &Path) {
    let a = scripted(Arc::new(AtomicBool::new(false)), false);
    let metrics = metrics_addr();
    let pdbmux = Pdbmux::start(
        bin,
        &[
            ("PDBMUX_BACKENDS", format!("a={}", a.url())),
            ("PDBMUX_METRICS_LISTEN", metrics.to_string()),
        ],
    );
    // Before any request: the families with known label values are there, at zero.
    let first = Scrape::of(metrics);
    for class in ["query", "root", "per-certname", "pass-through"] {
        for family in ["pdbmux_partial_answers_total", "pdbmux_unanswered_total"] {
            let line = format!("{family}{{route=\"{class}\"}} 0\n");
            assert!(first.text.contains(&line), "{line}{}", first.text);
        }
    }
    // The latency objective the alert compares with, and every route's duration histogram and
    // every shared-store operation's outcome, at zero before the first request.
    assert!(
        first
            .text
            .contains("\npdbmux_latency_objective_seconds 2.0\n")
            || first
                .text
                .contains("\npdbmux_latency_objective_seconds 2\n"),
        "{}",
        first.text
    );
    for class in ["query", "root", "per-certname", "pass-through", "healthz"] {
        let line = format!("pdbmux_request_duration_seconds_count{{route=\"{class}\"}} 0\n");
        assert!(first.text.contains(&line), "{line}{}", first.text);
        // The 5xx ratio's numerator and denominator exist before the first answer (a healthy
        // instance's ratio is 0, not no data); other codes appear with their first answer.
        for code in [200, 500, 502, 503, 504] {
            let line = format!("pdbmux_requests_total{{route=\"{class}\",code=\"{code}\"}} 0\n");
            assert!(first.text.contains(&line), "{line}{}", first.text);
        }
        let line = format!("pdbmux_requests_total{{route=\"{class}\",code=\"404\"}}");
        assert!(!first.text.contains(&line), "{line}{}", first.text);
    }
    for op in ["get", "put", "lock", "unlock"] {
        for outcome in ["ok", "failed"] {
            let line = format!(
                "pdbmux_cache_store_requests_total{{op=\"{op}\",outcome=\"{outcome}\"}} 0\n"
            );
            assert!(first.text.contains(&line), "{line}{}", first.text);
        }
    }
    // Every purpose and outcome of each configured backend's calls, before the first of them
    // fails (a rate() of connection failures has a series to start from).
    for (purpose, outcome) in [
        ("query", "timeout"),
        ("correction", "5xx"),
        ("translation", "4xx"),
        ("probe", "connection_refused"),
        ("membership", "tls_error"),
        ("healthz", "cancelled"),
    ] {
        let labels = format!("backend=a,outcome={outcome},purpose={purpose}");
        assert!(
            first
                .samples
                .contains_key(&("pdbmux_upstream_requests_total".to_owned(), labels.clone())),
            "{labels}: {}",
            first.text
        );
    }
    for path in [
        "/",
        "/pdb/query/v4/nodes",
        "/healthz",
        "/metrics/v2",
        "/metricsx",
    ] {
        let response = Pdbmux::raw_at(
            metrics,
            &format!("GET {path} HTTP/1.1\r\nHost: m\r\nConnection: close\r\n\r\n"),
        );
        assert_eq!(response.status(), 404, "{path}: {}", response.text);
    }
    let openmetrics = Pdbmux::raw_at(
        metrics,
        "GET /metrics HTTP/1.1\r\nHost: m\r\nAccept: application/openmetrics-text;version=1.0.0\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(openmetrics.status(), 200);
    assert!(openmetrics
        .header("content-type")
        .unwrap()
        .starts_with("application/openmetrics-text"));
    assert!(
        openmetrics.body().ends_with("# EOF\n"),
        "{}",
        openmetrics.body()
    );
    let on_query_port = pdbmux.get("/metrics");
    assert_eq!(on_query_port.status(), 404, "{}", on_query_port.text);
    assert_eq!(
        Scrape::of(metrics).value("pdbmux_requests_total", "code=404,route=refused"),
        1.0
    );
}

/// Scrapes taken while eight clients keep pdbmux busy all parse, the request counter only
/// grows, and at the end every answer and upstream call is counted; the membership gauges show
/// the node both backends hold.
pub fn a_scrape_during_load_is_well_formed(bin: &Path) {
    let a = scripted(Arc::new(AtomicBool::new(false)), false);
    let b = scripted(Arc::new(AtomicBool::new(false)), false);
    let metrics = metrics_addr();
    let pdbmux = Pdbmux::start(
        bin,
        &[
            ("PDBMUX_BACKENDS", format!("a={},b={}", a.url(), b.url())),
            ("PDBMUX_METRICS_LISTEN", metrics.to_string()),
            ("PDBMUX_FACTS_TTL", "0s".to_owned()),
            // Nobody reads the log while the load runs: a full pipe would stall the server.
            ("PDBMUX_LOG_LEVEL", "warn".to_owned()),
        ],
    );
    // One membership refresh (three queries per backend) besides the two /nodes calls.
    let nodes = pdbmux.get("/pdb/query/v4/nodes");
    assert_eq!(nodes.status(), 200, "{}", nodes.text);
    let addr = pdbmux.addr;
    let stop = Arc::new(AtomicBool::new(false));
    let clients: Vec<_> = (0..8)
        .map(|_| {
            let target = "/pdb/query/v4/fact-names";
            keep_getting(addr, target, Arc::clone(&stop), Duration::ZERO)
        })
        .collect();
    let mut last = 0.0;
    for _ in 0..20 {
        let scrape = Scrape::of(metrics);
        let answered = scrape.value("pdbmux_requests_total", "code=200,route=query");
        assert!(answered >= last, "{answered} after {last}");
        last = answered;
        thread::sleep(Duration::from_millis(25));
    }
    stop.store(true, Ordering::SeqCst);
    let answered: usize = clients.into_iter().map(|c| c.join().unwrap()).sum();
    let scrape = Scrape::of(metrics);
    assert_eq!(
        scrape.value("pdbmux_requests_total", "code=200,route=query"),
        answered as f64 + 1.0,
        "every fact-names answer and the /nodes one"
    );
    // Counted by purpose, the fan-outs can be checked apart from the estate's own calls.
    let ok = |purpose: &str| {
        ["a", "b"]
            .iter()
            .map(|backend| {
                let labels = format!("backend={backend},outcome=ok,purpose={purpose}");
                scrape.value("pdbmux_upstream_requests_total", &labels)
            })
            .sum::<f64>()
    };
    assert_eq!(
        ok("query"),
        (2 * answered) as f64 + 2.0,
        "two calls per answer, plus /nodes:\n{}",
        scrape.text
    );
    assert_eq!(
        ok("membership"),
        2.0 * 3.0,
        "each backend's three membership queries:\n{}",
        scrape.text
    );
    // n1 is in both backends, with the same report: a owns it (configured order breaks the tie).
    assert_eq!(scrape.value("pdbmux_membership_nodes", ""), 1.0);
    assert_eq!(scrape.value("pdbmux_membership_shared_nodes", ""), 1.0);
    assert_eq!(scrape.value("pdbmux_membership_split_nodes", ""), 0.0);
    assert_eq!(scrape.value("pdbmux_backend_owned_nodes", "backend=a"), 1.0);
    assert_eq!(scrape.value("pdbmux_backend_owned_nodes", "backend=b"), 0.0);
    assert_eq!(scrape.value("pdbmux_membership_refreshes_total", ""), 1.0);
}
