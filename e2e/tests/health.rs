//! The backend health prober through pdbmux in front of two real PuppetDBs (run through
//! `e2e/run`).
//!
//! Covered (README "Backend health", issue 5): probed backends become `healthy`; a backend that
//! starts hanging (a TCP proxy in this process accepts and never answers, the PuppetDB behind it
//! untouched) is taken out after `health_probe_failures` probes, after which /nodes no longer
//! waits on it (latency measured before, during and after) and says `X-Backends: 1/2`; it comes
//! back after `health_probe_successes` probes once the proxy forwards again; a probe path that
//! 404s from the start leaves the backends in service as `probe_unsupported` (`unreachable` once
//! its probes get no reply), even when one of
//! them hangs; every backend down fails open (queries still go to all of them).

mod common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use common::{certname, direct_records, env, healthz, healthz_backend, pdbmux_at, records};
use pdbmux_e2e::{Pdbmux, Proxy, ProxyMode, Response};
use serde_json::Value;

const NODES: &str = "/pdb/query/v4/nodes";
/// The per-upstream request timeout these tests give pdbmux.
const TIMEOUT_SECS: u64 = 3;

/// Probing on: every second, 2 failures out, 2 successes back in; no response cache (every
/// /nodes is a live fan-out).
fn probe_vars<'a>(extra: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
    let mut vars = vec![
        ("PDBMUX_HEALTH_PROBE_ENABLED", "true"),
        ("PDBMUX_HEALTH_PROBE_INTERVAL", "1s"),
        ("PDBMUX_HEALTH_PROBE_TIMEOUT", "500ms"),
        ("PDBMUX_HEALTH_PROBE_FAILURES", "2"),
        ("PDBMUX_HEALTH_PROBE_SUCCESSES", "2"),
        ("PDBMUX_TIMEOUT", "3s"),
        ("PDBMUX_FACTS_TTL", "0"),
    ];
    for (k, v) in extra {
        vars.retain(|(key, _)| key != k);
        vars.push((k, v));
    }
    vars
}

fn proxy_for(url: &str) -> Proxy {
    Proxy::start(url).unwrap_or_else(|e| panic!("start a proxy in front of {url}: {e}"))
}

/// Polls /healthz (every 100 ms) until `done` holds for its body; panics with the last body after
/// `within`. Returns the body and every body seen.
fn wait_healthz(
    p: &Pdbmux,
    what: &str,
    within: Duration,
    done: impl Fn(&Value) -> bool,
) -> (Value, Vec<Value>) {
    let deadline = Instant::now() + within;
    let mut seen = Vec::new();
    loop {
        let (_, body) = healthz(p);
        seen.push(body.clone());
        if done(&body) {
            return (body, seen);
        }
        assert!(
            Instant::now() < deadline,
            "{what}: not within {within:?}; last /healthz: {body}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn state<'a>(body: &'a Value, name: &str) -> &'a str {
    healthz_backend(body, name)["state"].as_str().unwrap_or("?")
}

fn timed(p: &Pdbmux, path: &str) -> (Duration, Response) {
    let start = Instant::now();
    let r = p
        .get(path)
        .unwrap_or_else(|e| panic!("GET {path} through pdbmux: {e}"));
    (start.elapsed(), r)
}

fn ms(d: Duration) -> String {
    format!("{:.0} ms", d.as_secs_f64() * 1000.0)
}

fn served_certnames(r: &Response) -> BTreeSet<String> {
    records(r).iter().map(|n| certname(n).to_owned()).collect()
}

#[test]
fn a_hanging_backend_is_taken_out_and_brought_back() {
    let env = env();
    let (first, second) = (env.first(), env.second());
    let proxy = proxy_for(&second.url);
    let proxied = proxy.url();
    let p = pdbmux_at(
        "health-hang",
        &[
            (first.name.as_str(), first.url.as_str()),
            (second.name.as_str(), proxied.as_str()),
        ],
        &probe_vars(&[]),
    );
    let names = [first.name.as_str(), second.name.as_str()];
    let (body, _) = wait_healthz(&p, "both backends healthy", Duration::from_secs(10), |b| {
        names.iter().all(|n| state(b, n) == "healthy")
    });
    for n in names {
        let b = healthz_backend(&body, n);
        assert!(b["last_probe"].is_string(), "{n}: last_probe in {b}");
        assert_eq!(b["reachable"], true, "{b}");
    }

    let mut before = Vec::new();
    for _ in 0..5 {
        let (d, r) = timed(&p, NODES);
        assert_eq!(r.status, 200, "{r:?}");
        assert_eq!(r.header("x-backends"), Some("2/2"), "{:?}", r.headers);
        before.push(d);
    }

    proxy.set_mode(ProxyMode::Hang);
    let hung_at = Instant::now();
    // Until the prober has seen enough failed probes, a query still waits for the hung backend.
    let (stalled, r) = timed(&p, NODES);
    assert_eq!(r.status, 200, "{r:?}");
    eprintln!(
        "/nodes right after {} started hanging: {} (X-Backends {:?})",
        second.name,
        ms(stalled),
        r.header("x-backends")
    );

    let (body, _) = wait_healthz(
        &p,
        &format!("{} unhealthy after 2 failed probes", second.name),
        Duration::from_secs(20),
        |b| state(b, &second.name) == "unhealthy",
    );
    let out_after = hung_at.elapsed();
    let b = healthz_backend(&body, &second.name);
    assert!(
        b["consecutive_failures"].as_u64() >= Some(2),
        "consecutive_failures in {b}"
    );
    assert!(b["last_error"].is_string(), "last_error in {b}");
    assert_eq!(state(&body, &first.name), "healthy", "{body}");
    // The reachability check still asks the hung backend.
    assert_eq!(b["reachable"], false, "{b}");

    let mut after = Vec::new();
    let mut missing = BTreeSet::new();
    let alone = direct_records(NODES, &[]).swap_remove(0);
    let alone: BTreeSet<String> = alone.iter().map(|n| certname(n).to_owned()).collect();
    for _ in 0..5 {
        let (d, r) = timed(&p, NODES);
        assert_eq!(r.status, 200, "{r:?}");
        assert_eq!(
            r.header("x-backends"),
            Some("1/2"),
            "only {} answers: {:?}",
            first.name,
            r.headers
        );
        // Checked at the end, so the latency and recovery checks run whatever this finds.
        missing.extend(alone.difference(&served_certnames(&r)).cloned());
        after.push(d);
    }
    let worst_after = after.iter().max().copied().unwrap_or_default();
    eprintln!(
        "/nodes latency: before the hang {:?}; while the prober still trusted {}: {}; \
         after it was taken out ({} after the hang began): {:?}; timeout {TIMEOUT_SECS} s",
        before.iter().map(|d| ms(*d)).collect::<Vec<_>>(),
        second.name,
        ms(stalled),
        ms(out_after),
        after.iter().map(|d| ms(*d)).collect::<Vec<_>>()
    );
    assert!(
        worst_after < Duration::from_secs(TIMEOUT_SECS) / 3,
        "/nodes still waits on the hung backend: {} (timeout {TIMEOUT_SECS} s)",
        ms(worst_after)
    );

    // Forwarding again: back only after 2 consecutive successful probes.
    proxy.set_mode(ProxyMode::Forward);
    let resumed = Instant::now();
    let (body, seen) = wait_healthz(
        &p,
        &format!("{} healthy again", second.name),
        Duration::from_secs(15),
        |b| state(b, &second.name) == "healthy",
    );
    let back_after = resumed.elapsed();
    let b = healthz_backend(&body, &second.name);
    assert!(
        b["consecutive_successes"].as_u64() >= Some(2),
        "readmitted after {} successes: {b}",
        b["consecutive_successes"]
    );
    let one_success_seen = seen.iter().any(|s| {
        let b = healthz_backend(s, &second.name);
        b["state"] == "unhealthy" && b["consecutive_successes"] == 1
    });
    assert!(
        one_success_seen,
        "one successful probe did not readmit it (a state with 1 success was seen): {seen:?}"
    );
    eprintln!(
        "{} healthy again {} after forwarding resumed",
        second.name,
        ms(back_after)
    );
    let (d, r) = timed(&p, NODES);
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.header("x-backends"), Some("2/2"), "{:?}", r.headers);
    eprintln!("/nodes after recovery: {}", ms(d));

    assert!(
        missing.is_empty(),
        "/nodes while {} was out served only part of what {} holds: missing {missing:?} (the \
         nodes both hold whose newer report is in {}: the surviving backend's records of them \
         were held back, so they vanished from the merged view)",
        second.name,
        first.name,
        second.name
    );
}

#[test]
fn a_probe_path_that_404s_leaves_backends_in_service() {
    let env = env();
    let (first, second) = (env.first(), env.second());
    let proxy = proxy_for(&second.url);
    let proxied = proxy.url();
    let p = pdbmux_at(
        "health-probe-404",
        &[
            (first.name.as_str(), first.url.as_str()),
            (second.name.as_str(), proxied.as_str()),
        ],
        &probe_vars(&[
            ("PDBMUX_HEALTH_PROBE_PATH", "/nope"),
            ("PDBMUX_TIMEOUT", "1s"),
        ]),
    );
    let names = [first.name.as_str(), second.name.as_str()];
    // probe_unsupported from the first 404; the warning once the failure threshold is reached.
    let (body, _) = wait_healthz(
        &p,
        "both backends probe_unsupported, 2 failed probes each",
        Duration::from_secs(10),
        |b| {
            names.iter().all(|n| {
                let b = healthz_backend(b, n);
                b["state"] == "probe_unsupported" && b["consecutive_failures"].as_u64() >= Some(2)
            })
        },
    );
    for n in names {
        let b = healthz_backend(&body, n);
        assert_eq!(b["reachable"], true, "{b}");
        assert!(b["last_error"].is_string(), "{n}: last_error in {b}");
    }
    let r = p.get(NODES).expect("GET /nodes");
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.header("x-backends"), Some("2/2"), "{:?}", r.headers);
    let warned = |n: &str| -> Vec<String> {
        p.log()
            .lines()
            .filter(|l| l.contains("/nope") && l.contains(&format!("\"{n}\"")))
            .map(str::to_owned)
            .collect()
    };
    let deadline = Instant::now() + Duration::from_secs(3);
    while names.iter().any(|n| warned(n).is_empty()) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_millis(1200)); // another probe round: still one line
    for n in names {
        let lines = warned(n);
        assert_eq!(
            lines.len(),
            1,
            "the misconfigured probe of {n} is logged once, naming backend and path: {lines:#?}"
        );
        assert!(lines[0].contains("404"), "the status in {lines:?}");
        eprintln!("{n}: {}", lines[0]);
    }

    // A probe that never answered gates nothing: a hanging backend stays in service, and is
    // named for what its probes now find (no reply), not for the probe path.
    proxy.set_mode(ProxyMode::Hang);
    std::thread::sleep(Duration::from_millis(2500)); // more than 2 probe intervals
    let (body, _) = wait_healthz(&p, "state after the hang", Duration::from_secs(5), |_| true);
    assert_eq!(state(&body, &second.name), "unreachable", "{body}");
    assert_eq!(
        healthz_backend(&body, &second.name)["last_probe_result"],
        "timeout",
        "{body}"
    );
    let (d, r) = timed(&p, NODES);
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(
        r.header("x-backends"),
        Some("1/2"),
        "still asked, it timed out: {:?}",
        r.headers
    );
    assert!(
        d >= Duration::from_millis(900),
        "/nodes must still wait for the hanging, ungated backend (timeout 1 s): {}",
        ms(d)
    );
    eprintln!(
        "/nodes with an ungated hanging backend: {} (timeout 1 s)",
        ms(d)
    );
}

#[test]
fn every_backend_down_fails_open() {
    let env = env();
    let (first, second) = (env.first(), env.second());
    let proxies = [proxy_for(&first.url), proxy_for(&second.url)];
    let urls: Vec<String> = proxies.iter().map(Proxy::url).collect();
    let p = pdbmux_at(
        "health-all-down",
        &[
            (first.name.as_str(), urls[0].as_str()),
            (second.name.as_str(), urls[1].as_str()),
        ],
        // 3 successes to come back: a wide window in which both are still marked down.
        &probe_vars(&[("PDBMUX_HEALTH_PROBE_SUCCESSES", "3")]),
    );
    let names = [first.name.as_str(), second.name.as_str()];
    wait_healthz(&p, "both backends healthy", Duration::from_secs(10), |b| {
        names.iter().all(|n| state(b, n) == "healthy")
    });
    for proxy in &proxies {
        proxy.set_mode(ProxyMode::Fail);
    }
    let (body, _) = wait_healthz(
        &p,
        "both backends unhealthy",
        Duration::from_secs(15),
        |b| names.iter().all(|n| state(b, n) == "unhealthy"),
    );
    let (status, _) = healthz(&p);
    assert_eq!(status, 503, "/healthz with nothing reachable: {body}");

    // Queries still go to every backend (they fail): the request reaches both proxies.
    let r = p.get(NODES).expect("GET /nodes");
    eprintln!(
        "/nodes with every backend down: {} X-Backends {:?} {:?}",
        r.status,
        r.header("x-backends"),
        r.body.chars().take(200).collect::<String>()
    );
    assert_eq!(r.status, 502, "every backend failed: {r:?}");
    assert_eq!(r.header("x-backends"), Some("0/2"), "{:?}", r.headers);
    for (proxy, n) in proxies.iter().zip(names) {
        let asked: Vec<String> = proxy
            .failed_requests()
            .into_iter()
            .filter(|l| l.starts_with(&format!("GET {NODES}")))
            .collect();
        assert!(
            !asked.is_empty(),
            "fail-open: {n} must still be asked for /nodes; it saw {:?}",
            proxy.failed_requests()
        );
    }

    // The backends answer again before the prober has readmitted them: fail-open serves both.
    for proxy in &proxies {
        proxy.set_mode(ProxyMode::Forward);
    }
    let r = p.get(NODES).expect("GET /nodes");
    let (_, body) = healthz(&p);
    let still_down: Vec<&str> = names
        .iter()
        .copied()
        .filter(|n| state(&body, n) == "unhealthy")
        .collect();
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(
        r.header("x-backends"),
        Some("2/2"),
        "both asked while marked down ({still_down:?}): {:?}",
        r.headers
    );
    assert_eq!(
        still_down.len(),
        2,
        "the check needs both still marked down after the query: {body}"
    );
    let merged = served_certnames(&r);
    let all: BTreeSet<String> = direct_records(NODES, &[])
        .iter()
        .flatten()
        .map(|n| certname(n).to_owned())
        .collect();
    assert_eq!(merged, all, "every active node of both backends");
}

/// Each way a backend can be out of reach is named apart in `/healthz` and in its one warning:
/// nothing listening (`connection_refused`), an https URL on a plain-HTTP PuppetDB (`tls_error`),
/// a backend that accepts and never answers (`timeout`) — none of them a probe-path problem.
#[test]
fn unreachable_backends_are_named_by_their_cause() {
    let e = env();
    let closed_port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind")
        .port();
    let refused = format!("http://127.0.0.1:{closed_port}");
    let plain = e.backends[1]
        .url
        .strip_prefix("http://")
        .expect("plain-HTTP backend");
    let tls = format!("https://{plain}");
    let hang = proxy_for(&e.backends[0].url);
    hang.set_mode(ProxyMode::Hang);
    let hang_url = hang.url();
    let backends = [
        ("pdb-a", e.backends[0].url.as_str()),
        ("down", refused.as_str()),
        ("plaintext", tls.as_str()),
        ("hung", hang_url.as_str()),
    ];
    let p = pdbmux_at("unreachable-causes", &backends, &probe_vars(&[]));
    let want = [
        ("down", "connection_refused"),
        ("plaintext", "tls_error"),
        ("hung", "timeout"),
    ];
    let (body, _) = wait_healthz(&p, "every cause named", Duration::from_secs(10), |body| {
        want.iter().all(|(name, cause)| {
            let b = healthz_backend(body, name);
            b["state"] == "unreachable" && b["last_probe_result"] == *cause
        })
    });
    assert_eq!(state(&body, "pdb-a"), "healthy", "{body}");
    assert_eq!(healthz_backend(&body, "pdb-a")["last_probe_result"], "ok");
    // Two failed probes (the threshold) bring the one warning, with the cause as a field.
    let deadline = Instant::now() + Duration::from_secs(5);
    let warned = |name: &str, cause: &str| {
        p.log().lines().any(|l| {
            l.contains("backend unreachable since start")
                && l.contains(&format!("\"{name}\""))
                && l.contains(cause)
        })
    };
    while !want.iter().all(|(n, c)| warned(n, c)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    for (name, cause) in want {
        assert!(
            warned(name, cause),
            "no warning for {name} ({cause}):\n{}",
            p.log()
        );
    }
    assert!(
        !p.log().contains("check health_probe_path"),
        "an unreachable backend is not a probe-path problem:\n{}",
        p.log()
    );
}

/// With every backend out of reach, `/healthz` says so (503) while `/livez` and `/readyz` stay
/// 200 and answer at once: the probes the manifests use keep the replica in its Service.
#[test]
fn readiness_and_liveness_do_not_follow_the_backends() {
    let closed = |_| {
        std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("bind")
            .port()
    };
    let urls: Vec<String> = (0..2)
        .map(closed)
        .map(|port| format!("http://127.0.0.1:{port}"))
        .collect();
    let backends = [("a", urls[0].as_str()), ("b", urls[1].as_str())];
    let p = pdbmux_at("probes-all-down", &backends, &probe_vars(&[]));
    let (status, body) = healthz(&p);
    assert_eq!(status, 503, "{body}");
    for (path, want) in [
        ("/livez", r#"{"status":"live"}"#),
        ("/readyz", r#"{"backends":2,"status":"ready"}"#),
    ] {
        let (took, r) = timed(&p, path);
        assert_eq!(r.status, 200, "{path}: {r:?}");
        assert_eq!(r.body, want, "{path}");
        assert!(took < Duration::from_millis(500), "{path} took {took:?}");
    }
}

/// A request id travels end to end: the client's `X-Request-Id` is echoed, is on pdbmux's access
/// line (with the route, the backends that answered and why the answer is partial), and reaches
/// the backend with a `traceparent` continuing the client's trace (seen by a recording proxy).
#[test]
fn a_request_id_goes_from_the_client_to_the_log_and_the_backend() {
    let e = env();
    let recorder = proxy_for(&e.backends[1].url);
    recorder.set_mode(ProxyMode::Fail);
    let recorder_url = recorder.url();
    let backends = [
        ("pdb-a", e.backends[0].url.as_str()),
        ("recorder", recorder_url.as_str()),
    ];
    let p = pdbmux_at("request-ids", &backends, &probe_vars(&[]));
    let trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    // A union no ownership decides: a node-owned query would leave the recorder out, as the
    // membership map never places a backend whose every call fails.
    let request = format!(
        "GET /pdb/query/v4/environments HTTP/1.1\r\nHost: pdbmux\r\nAccept: application/json\r\n\
         X-Request-Id: e2e-follow-me\r\ntraceparent: 00-{trace}-00f067aa0ba902b7-01\r\n\
         Connection: close\r\n\r\n"
    );
    let r = p.raw(request.as_bytes()).expect("GET /environments");
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.header("x-request-id"), Some("e2e-follow-me"));
    assert_eq!(
        r.header("x-backends"),
        Some("1/2"),
        "the recorder fails every call"
    );

    // The request's calls carry its id; the estate's own (probes, the membership refresh) none.
    let heads = recorder.failed_heads();
    let (ours, own): (Vec<&String>, Vec<&String>) = heads
        .iter()
        .partition(|h| h.to_ascii_lowercase().contains("\r\nx-request-id:"));
    assert!(
        !ours.is_empty(),
        "the query reached the recorder: {heads:#?}"
    );
    for head in own {
        let estate = head.starts_with("GET /status/")
            || head.contains("report_timestamp")
            || head.contains("producer_timestamp");
        assert!(
            estate,
            "a call without the request id that is not the estate's: {head}"
        );
    }
    for head in ours {
        let lower = head.to_ascii_lowercase();
        assert!(lower.contains("\r\nx-request-id: e2e-follow-me"), "{head}");
        assert!(
            lower.contains(&format!("\r\ntraceparent: 00-{trace}-")),
            "{head}"
        );
        assert!(!lower.contains("00f067aa0ba902b7"), "a child span: {head}");
    }

    let deadline = Instant::now() + Duration::from_secs(3);
    let line = loop {
        let found = p
            .log()
            .lines()
            .find(|l| l.contains("pdbmux::access") && l.contains("e2e-follow-me"))
            .map(str::to_owned);
        match found {
            Some(line) => break line,
            None if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(50)),
            None => panic!("no access line with the request id:\n{}", p.log()),
        }
    };
    for field in [
        "WARN",
        "route=query",
        "status=200",
        "backends=1/2",
        "cache=",
        "client=127.0.0.1:",
        "why=partial: 1/2 backends answered",
    ] {
        assert!(line.contains(field), "{field} in {line}");
    }
}
