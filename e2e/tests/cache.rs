//! The merged-response cache through pdbmux in front of two real PuppetDBs (run through
//! `e2e/run`).
//!
//! Covered (README "Caching", issue 6): X-Cache miss then hit with Age on /facts, /nodes,
//! /facts/<name> and /fact-names, the hit served without asking a backend (access logs), Age
//! growing, the key independent of parameter order, a new miss after the TTL, uncached paths
//! without the headers; facts_ttl 0 (no headers, /healthz cache backend none, every request
//! asked upstream); stale on failure only (both backends behind TCP proxies in this process,
//! cut after the TTL: the earlier body with X-Cache stale; one backend left: a live partial
//! answer instead), the /healthz cache object (entries, serving_stale, stale_served); a /facts
//! answer over 256 KiB kept in a sealed (read-only anonymous) mapping, seen in /proc/<pid>/maps,
//! and its hits, one after another and 20 from four clients at once, byte-identical to the miss.

mod common;

use std::time::Duration;

use common::{env, get, healthz, json_of, pdbmux_at, pdbmux_env, sealed_bytes};
use pdbmux_e2e::{marker, AccessLog, Pdbmux, Proxy, ProxyMode, Response};
use serde_json::{json, Value};

const NODES: &str = "/pdb/query/v4/nodes";
const FACTS: &str = "/pdb/query/v4/facts";
const FACT_NAMES: &str = "/pdb/query/v4/fact-names";

fn age(r: &Response) -> Option<u64> {
    r.header("age").and_then(|v| v.trim().parse().ok())
}

/// GET and assert 200 with the given X-Cache; returns the response.
fn cached(p: &Pdbmux, path: &str, params: &[(&str, &str)], x_cache: &str) -> Response {
    let r = get(p, path, params);
    assert_eq!(r.status, 200, "GET {path} {params:?}: {r:?}");
    assert_eq!(
        r.header("x-cache"),
        Some(x_cache),
        "GET {path} {params:?}: X-Cache in {:?}",
        r.headers
    );
    assert!(
        age(&r).is_some(),
        "GET {path} {params:?}: Age in {:?}",
        r.headers
    );
    r
}

/// Lines of every backend's access log (since the marks) that contain `needle`.
fn reached(logs: &[AccessLog], needle: &str) -> usize {
    logs.iter()
        .map(|l| {
            l.new_lines()
                .expect("read an access log")
                .iter()
                .filter(|line| line.contains(needle))
                .count()
        })
        .sum()
}

fn not_certname(tag: &str) -> String {
    json!(["not", ["=", "certname", tag]]).to_string()
}

#[test]
fn cached_paths_miss_then_hit_with_a_growing_age() {
    let env = env();
    let logs = AccessLog::mark_all(env).expect("mark the access logs");
    let p = pdbmux_env("cache-hit", &[("PDBMUX_FACTS_TTL", "10s")]);
    let tag = marker("cache-hit");
    let q = not_certname(&tag);
    let kernel = format!("{FACTS}/kernel");
    let paths: [(&str, Vec<(&str, &str)>); 5] = [
        (FACTS, vec![("query", q.as_str())]),
        (NODES, vec![("query", q.as_str())]),
        (kernel.as_str(), vec![("query", q.as_str())]),
        (FACT_NAMES, vec![]),
        (NODES, vec![]),
    ];
    let mut misses = Vec::new();
    for (path, params) in &paths {
        let miss = cached(&p, path, params, "miss");
        assert_eq!(age(&miss), Some(0), "{path}: Age on a miss");
        assert_eq!(miss.header("x-backends"), Some("2/2"), "{:?}", miss.headers);
        misses.push(miss);
    }
    if !logs.is_empty() {
        // Each marked query reached every backend once (the membership map carries no marker).
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while reached(&logs, &tag) < 3 * logs.len() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        assert_eq!(
            reached(&logs, &tag),
            3 * logs.len(),
            "the misses reached the backends"
        );
    }
    std::thread::sleep(Duration::from_millis(1100));
    let mut ages = Vec::new();
    for ((path, params), miss) in paths.iter().zip(&misses) {
        let hit = cached(&p, path, params, "hit");
        assert_eq!(
            hit.body, miss.body,
            "{path}: the hit serves the stored body"
        );
        assert_eq!(hit.header("x-backends"), Some("2/2"), "{:?}", hit.headers);
        assert!(
            age(&hit) >= Some(1),
            "{path}: Age after 1.1 s: {:?}",
            hit.headers
        );
        ages.push(age(&hit).unwrap_or(0));
    }
    std::thread::sleep(Duration::from_millis(1100));
    for ((path, params), before) in paths.iter().zip(&ages) {
        let hit = cached(&p, path, params, "hit");
        assert!(
            age(&hit) > Some(*before),
            "{path}: Age grows: {before} then {:?}",
            age(&hit)
        );
    }
    eprintln!("Age after 1.1 s: {ages:?}");
    if !logs.is_empty() {
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(
            reached(&logs, &tag),
            3 * logs.len(),
            "a hit asks no backend"
        );
    }

    // The key does not depend on parameter order.
    let params = [("query", q.as_str()), ("limit", "3")];
    cached(&p, NODES, &params, "miss");
    let swapped = [("limit", "3"), ("query", q.as_str())];
    cached(&p, NODES, &swapped, "hit");

    // History and combined answers are cached too, each for its class's TTL.
    let count = json!(["extract", [["function", "count"]], ["=", "name", "kernel"]]).to_string();
    for (path, params) in [
        ("/pdb/query/v4/reports", vec![("limit", "1")]),
        ("/pdb/query/v4/events", vec![("limit", "1")]),
        (FACTS, vec![("query", count.as_str())]),
        (
            NODES,
            vec![("query", r#"["extract",[["function","count"]]]"#)],
        ),
        (
            "/pdb/query/v4/event-counts",
            vec![
                ("summarize_by", "certname"),
                ("query", r#"["=","latest_report?",true]"#),
            ],
        ),
        // The population figures Puppetboard's overview of all environments reads: counts of
        // the estate, cached as counts are.
        (
            "/metrics/v2/read/puppetlabs.puppetdb.population:name=num-resources",
            vec![],
        ),
    ] {
        cached(&p, path, &params, "miss");
        cached(&p, path, &params, "hit");
    }

    // Uncached paths carry neither header.
    let node = env
        .fixture
        .nodes
        .keys()
        .next()
        .expect("a fixture node")
        .clone();
    let node_path = format!("/pdb/query/v4/nodes/{node}");
    for (path, params) in [
        ("/pdb/meta/v1/version", vec![]),
        // A backend's own figure (its command processing) is live: asked every time.
        (
            "/metrics/v2/read/puppetlabs.puppetdb.mq:name=global.processing-time",
            vec![],
        ),
        (node_path.as_str(), vec![]),
    ] {
        let r = get(&p, path, &params);
        assert_eq!(r.status, 200, "{path} {params:?}: {r:?}");
        assert_eq!(
            (r.header("x-cache"), r.header("age")),
            (None, None),
            "{path} {params:?}: {:?}",
            r.headers
        );
    }

    let (_, body) = healthz(&p);
    let cache = &body["cache"];
    assert_eq!(cache["backend"], "memory", "{cache}");
    assert_eq!(cache["ttl"], "10s", "{cache}");
    assert!(cache["entries"].as_u64() >= Some(6), "{cache}");
    assert!(cache["bytes"].as_u64() > Some(0), "{cache}");
    assert_eq!(cache["serving_stale"], false, "{cache}");
    assert_eq!(cache["stale_served"], 0, "{cache}");
}

/// The body length from which pdbmux keeps a cached body sealed (`pdbmux_sealed::SEAL_THRESHOLD`).
const SEAL_THRESHOLD: usize = 256 * 1024;

#[test]
fn a_large_answer_is_kept_sealed_and_hits_are_byte_identical() {
    // The fixture's package-inventory fact makes the whole /facts answer larger than the
    // threshold above which a cached body is sealed and hits go out through the pipe.
    let p = pdbmux_env("cache-sealed", &[("PDBMUX_FACTS_TTL", "10s")]);
    let tag = marker("cache-sealed");
    let q = not_certname(&tag);
    let params = [("query", q.as_str())];
    assert_eq!(sealed_bytes(&p), 0, "nothing cached yet");
    let miss = cached(&p, FACTS, &params, "miss");
    assert!(
        miss.body.len() >= SEAL_THRESHOLD,
        "the fixture's /facts answer is {} bytes, below the sealing threshold",
        miss.body.len()
    );
    let records = json_of(&miss);
    assert!(
        records.as_array().is_some_and(|r| !r.is_empty()),
        "{records}"
    );
    let fresh = cached(&p, FACTS, &params, "hit");
    assert_eq!(fresh.body, miss.body, "the hit is the miss, byte for byte");
    let sealed = sealed_bytes(&p);
    assert!(
        sealed >= miss.body.len(),
        "{sealed} bytes sealed: {:?}",
        p.memory_maps()
    );
    // Many hits on one connection each and on several at once stay whole.
    let hits: Vec<Response> = std::thread::scope(|scope| {
        let clients: Vec<_> = (0..4)
            .map(|_| {
                scope.spawn(|| {
                    (0..5)
                        .map(|_| p.get_query(FACTS, &params).expect("a hit"))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        clients
            .into_iter()
            .flat_map(|client| client.join().expect("a client thread"))
            .collect()
    });
    for hit in hits {
        assert_eq!(hit.status, 200);
        assert_eq!(hit.header("x-cache"), Some("hit"));
        assert!(
            hit.body == miss.body,
            "a concurrent hit differs from the stored body"
        );
    }
    // Small answers stay in ordinary memory.
    cached(&p, NODES, &params, "miss");
    assert_eq!(sealed_bytes(&p), sealed, "{:?}", p.memory_maps());
}

#[test]
fn an_expired_entry_is_fetched_again() {
    let p = pdbmux_env("cache-expiry", &[("PDBMUX_FACTS_TTL", "2s")]);
    let q = not_certname(&marker("cache-expiry"));
    let params = [("query", q.as_str())];
    let first = cached(&p, FACTS, &params, "miss");
    cached(&p, FACTS, &params, "hit");
    std::thread::sleep(Duration::from_millis(2200));
    let again = cached(&p, FACTS, &params, "miss");
    assert_eq!(age(&again), Some(0), "{:?}", again.headers);
    assert_eq!(json_of(&again), json_of(&first));
    cached(&p, FACTS, &params, "hit");
}

#[test]
fn every_ttl_zero_disables_the_cache() {
    let env = env();
    let logs = AccessLog::mark_all(env).expect("mark the access logs");
    let p = pdbmux_env(
        "cache-off",
        &[
            ("PDBMUX_FACTS_TTL", "0"),
            ("PDBMUX_HISTORY_TTL", "0"),
            ("PDBMUX_AGGREGATE_TTL", "0"),
        ],
    );
    let tag = marker("cache-off");
    let q = not_certname(&tag);
    for _ in 0..2 {
        for path in [FACTS, NODES] {
            let r = get(&p, path, &[("query", &q)]);
            assert_eq!(r.status, 200, "{r:?}");
            assert_eq!(
                (r.header("x-cache"), r.header("age")),
                (None, None),
                "{path}: {:?}",
                r.headers
            );
        }
    }
    let (_, body) = healthz(&p);
    assert_eq!(body["cache"]["backend"], "none", "{body}");
    assert_eq!(body["cache"]["entries"], 0, "{body}");
    if !logs.is_empty() {
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while reached(&logs, &tag) < 4 * logs.len() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        assert_eq!(
            reached(&logs, &tag),
            4 * logs.len(),
            "every request asked every backend"
        );
    }
}

fn cache_of(p: &Pdbmux) -> Value {
    let (_, body) = healthz(p);
    body["cache"].clone()
}

/// pdbmux (`label`, with `extra` settings) over the two e2e PuppetDBs, each behind a proxy the
/// test can break.
fn behind_proxies(label: &str, extra: &[(&str, &str)]) -> (Pdbmux, [Proxy; 2]) {
    let env = env();
    let (first, second) = (env.first(), env.second());
    let proxies = [
        Proxy::start(&first.url).expect("proxy"),
        Proxy::start(&second.url).expect("proxy"),
    ];
    let urls: Vec<String> = proxies.iter().map(Proxy::url).collect();
    let p = pdbmux_at(
        label,
        &[
            (first.name.as_str(), urls[0].as_str()),
            (second.name.as_str(), urls[1].as_str()),
        ],
        extra,
    );
    (p, proxies)
}

#[test]
fn stale_is_served_only_when_every_backend_fails() {
    let (p, proxies) = behind_proxies("cache-stale", &[("PDBMUX_FACTS_TTL", "2s")]);
    let stale_q = not_certname(&marker("cache-stale"));
    let partial_q = not_certname(&marker("cache-partial"));
    let stale_facts = [("query", stale_q.as_str())];
    let partial_facts = [("query", partial_q.as_str())];
    let facts = cached(&p, FACTS, &stale_facts, "miss");
    let nodes = cached(&p, NODES, &[], "miss");
    let partial = cached(&p, FACTS, &partial_facts, "miss");
    assert_eq!(facts.header("x-backends"), Some("2/2"));

    // One backend gone, the TTL passed: a live answer from the other, not the stale copy.
    proxies[1].set_mode(ProxyMode::Closed);
    std::thread::sleep(Duration::from_millis(2200));
    let r = cached(&p, FACTS, &partial_facts, "miss");
    assert_eq!(r.header("x-backends"), Some("1/2"), "{:?}", r.headers);
    assert_ne!(r.body, partial.body, "the survivor's records only");
    assert_eq!(cache_of(&p)["serving_stale"], false);

    // Both gone: the expired entries are served.
    proxies[0].set_mode(ProxyMode::Closed);
    let r = cached(&p, FACTS, &stale_facts, "stale");
    assert_eq!(r.body, facts.body, "the earlier /facts body");
    assert!(age(&r) >= Some(2), "Age of the stale copy: {:?}", r.headers);
    assert_eq!(
        r.header("x-backends"),
        Some("2/2"),
        "the stored body's X-Backends: {:?}",
        r.headers
    );
    let cache = cache_of(&p);
    eprintln!("/healthz cache after a stale serve: {cache}");
    assert_eq!(cache["serving_stale"], true, "{cache}");
    assert_eq!(cache["stale_served"], 1, "{cache}");
    assert!(cache["entries"].as_u64() >= Some(3), "{cache}");
    assert!(cache["stale_entries"].as_u64() >= Some(2), "{cache}");
    assert!(cache["last_stale_served"].is_string(), "{cache}");
    let r = cached(&p, NODES, &[], "stale");
    assert_eq!(r.body, nodes.body, "the earlier /nodes body");
    assert_eq!(cache_of(&p)["stale_served"], 2);
    // Nothing stored for this one: every backend failed, so 502.
    let never = not_certname(&marker("cache-never"));
    let r = get(&p, FACTS, &[("query", &never)]);
    assert_eq!(r.status, 502, "{r:?}");

    // Back: for the rest of the retry window (5 s, at most the 2 s TTL) after the failed
    // refresh the stale copy still answers without asking; then a live answer again, and
    // serving_stale clears.
    for proxy in &proxies {
        proxy.set_mode(ProxyMode::Forward);
    }
    let r = cached(&p, FACTS, &stale_facts, "stale");
    assert_eq!(r.body, facts.body, "within the retry window");
    std::thread::sleep(Duration::from_millis(2200));
    let r = cached(&p, FACTS, &stale_facts, "miss");
    assert_eq!(r.header("x-backends"), Some("2/2"), "{:?}", r.headers);
    assert_eq!(json_of(&r), json_of(&facts));
    let cache = cache_of(&p);
    assert_eq!(cache["serving_stale"], false, "{cache}");
    assert_eq!(cache["stale_served"], 3, "{cache}");
}

/// A partial answer (a backend answering 503) is served but not stored: the same question asks
/// every backend again, so the backend that is back is in the very next answer, which is
/// stored (docs/decisions.md, D27).
#[test]
fn a_partial_answer_is_served_not_stored_and_a_backend_back_is_answered_at_once() {
    // No prober: the failing backend stays asked, so the answers show what is stored.
    let (p, proxies) = behind_proxies(
        "cache-partial-unstored",
        &[
            ("PDBMUX_FACTS_TTL", "30s"),
            ("PDBMUX_HEALTH_PROBE_ENABLED", "false"),
        ],
    );
    // The membership map first, with both backends.
    let warm = cached(&p, NODES, &[], "miss");
    assert_eq!(warm.header("x-backends"), Some("2/2"));
    let query = not_certname(&marker("cache-partial-unstored"));
    let params = [("query", query.as_str())];

    proxies[1].set_mode(ProxyMode::Unavailable);
    for attempt in ["first", "again"] {
        let r = cached(&p, FACTS, &params, "miss");
        assert_eq!(
            r.header("x-backends"),
            Some("1/2"),
            "{attempt}: {:?}",
            r.headers
        );
    }
    assert_eq!(cache_of(&p)["entries"], 1, "only /nodes is stored");

    proxies[1].set_mode(ProxyMode::Forward);
    let whole = cached(&p, FACTS, &params, "miss");
    assert_eq!(
        whole.header("x-backends"),
        Some("2/2"),
        "{:?}",
        whole.headers
    );
    let hit = cached(&p, FACTS, &params, "hit");
    assert_eq!(hit.header("x-backends"), Some("2/2"));
    assert_eq!(json_of(&hit), json_of(&whole));
}
