//! Foundation smoke tests: pdbmux in front of two real PuppetDBs (run through `e2e/run`).
//!
//! Covered: meta (version, server-time), first-success pass-through (a route pdbmux does not
//! merge), status replay,
//! per-certname and report-hash routes, the path allowlist (docs/decisions.md D6), backend TLS with a
//! client certificate (D8) and /healthz. Every expectation comes from the fixture or from the
//! backends asked directly, never from pdbmux's own output.

mod common;

use std::cmp::Ordering;
use std::time::Duration;

use common::{certname_query, direct, env, get, json_of, node_of, pdbmux};
use pdbmux_e2e::{closed_backend, cmp_version, epoch_seconds, marker, AccessLog, Pdbmux, Response};
use serde_json::{json, Value};

// --- meta -------------------------------------------------------------------------------------

#[test]
fn version_is_the_lowest_any_backend_runs() {
    let env = env();
    let versions: Vec<String> = env
        .backends
        .iter()
        .map(|b| {
            let r = direct(b, "/pdb/meta/v1/version", &[]);
            assert_eq!(r.status, 200, "{} /pdb/meta/v1/version: {r:?}", b.name);
            json_of(&r)["version"]
                .as_str()
                .expect("a version string")
                .to_owned()
        })
        .collect();
    let lowest = versions
        .iter()
        .min_by(|a, b| cmp_version(a, b))
        .expect("two versions");

    let p = pdbmux("version");
    let r = get(&p, "/pdb/meta/v1/version", &[]);
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(json_of(&r), json!({ "version": lowest }));
    assert_eq!(r.header("x-backends"), Some("2/2"), "{r:?}");
    assert!(r.content_type().starts_with("application/json"), "{r:?}");
}

#[test]
fn server_time_is_a_backend_clock() {
    let env = env();
    let before = json_of(&direct(env.first(), "/pdb/meta/v1/server-time", &[]))["server_time"]
        .as_str()
        .and_then(epoch_seconds)
        .expect("the first backend's server_time");
    let p = pdbmux("server-time");
    let r = get(&p, "/pdb/meta/v1/server-time", &[]);
    assert_eq!(r.status, 200, "{r:?}");
    assert!(r.content_type().starts_with("application/json"), "{r:?}");
    let body = json_of(&r);
    let served = body["server_time"]
        .as_str()
        .and_then(epoch_seconds)
        .unwrap_or_else(|| panic!("no ISO-8601 server_time in {body}"));
    assert!(
        (served - before).abs() <= 60,
        "server_time {served} is not within a minute of the backend's clock {before}"
    );
}

// --- pass-through -----------------------------------------------------------------------------

/// A route any one backend answers: whether a producer is known (every backend that knows it
/// says the same). The fixture's producer, its first letter percent-encoded (PuppetDB decodes it), so
/// that this test's request is told apart from any other in the backends' access logs.
const PASS_THROUGH: &str = "/pdb/query/v4/producers/%70uppet.pdbmux.test";

#[test]
fn pass_through_serves_the_first_backend_that_succeeds() {
    let env = env();
    let logs = AccessLog::mark_all(env).expect("mark the backends' access logs");
    let p = pdbmux("pass-through");
    let r = get(&p, PASS_THROUGH, &[]);
    assert_eq!(r.status, 200, "{r:?}");
    assert!(
        r.content_type().starts_with("application/json"),
        "{:?}",
        r.headers
    );
    assert_eq!(
        json_of(&r),
        json_of(&direct(env.first(), PASS_THROUGH, &[])),
        "the first backend's answer"
    );
    let asked = "%70uppet.pdbmux.test";
    let (first, second) = (&logs[0], &logs[1]);
    assert!(
        first
            .wait_for(asked, Duration::from_secs(5))
            .expect("read the first access log"),
        "{first} was asked"
    );
    assert!(
        !second
            .new_lines()
            .expect("read the second access log")
            .iter()
            .any(|line| line.contains(asked)),
        "{second} is never asked once the first succeeded"
    );
}

// --- status replay ----------------------------------------------------------------------------

/// Asks every backend directly, checks they agree on `status`, and that pdbmux replays the
/// first backend's answer: status, body, content type.
fn assert_replayed(label: &str, path: &str, params: &[(&str, &str)], status: u16) {
    let env = env();
    let answers: Vec<Response> = env
        .backends
        .iter()
        .map(|b| direct(b, path, params))
        .collect();
    for (b, a) in env.backends.iter().zip(&answers) {
        assert_eq!(
            a.status, status,
            "{} answers {path} {params:?}: {a:?}",
            b.name
        );
    }
    let p = pdbmux(label);
    let r = get(&p, path, params);
    assert_eq!(r.status, answers[0].status, "{r:?}");
    assert_eq!(r.body, answers[0].body, "replayed body");
    assert_eq!(
        r.content_type(),
        answers[0].content_type(),
        "{:?}",
        r.headers
    );
}

#[test]
fn unanimous_400_on_a_merged_route_is_replayed() {
    assert_replayed(
        "replay-400-nodes",
        "/pdb/query/v4/nodes",
        &[("query", r#"["=","name"]"#)],
        400,
    );
}

#[test]
fn unanimous_500_on_a_merged_route_is_replayed() {
    // PuppetDB answers the same malformed query with 500 on /facts (README, "When backends fail").
    assert_replayed(
        "replay-500-facts",
        "/pdb/query/v4/facts",
        &[("query", r#"["=","name"]"#)],
        500,
    );
}

#[test]
fn unanimous_400_on_a_pass_through_route_replays_the_first_error() {
    assert_replayed(
        "replay-400-environment",
        "/pdb/query/v4/environments/production",
        &[("limit", "1")],
        400,
    );
}

// --- per-certname and report-hash routes ------------------------------------------------------

#[test]
fn per_certname_route_finds_the_backend_holding_the_node() {
    let env = env();
    let node = node_of("second-only");
    let path = format!("/pdb/query/v4/nodes/{node}");
    let p = pdbmux("per-certname");
    let r = get(&p, &path, &[]);
    assert_eq!(r.status, 200, "{r:?}");
    let body = json_of(&r);
    assert!(body.is_object(), "{body}");
    assert_eq!(body["certname"], node);
    let state = env
        .fixture
        .state(node, &env.second().name)
        .expect("fixture state");
    assert_eq!(
        body["report_timestamp"].as_str(),
        state.report_timestamp.as_deref()
    );
    assert_eq!(body, json_of(&direct(env.second(), &path, &[])));

    let unknown = format!("{}.{}", marker("unknown"), env.fixture.domain);
    let path = format!("/pdb/query/v4/nodes/{unknown}");
    let expected = direct(env.first(), &path, &[]);
    assert_eq!(expected.status, 404, "{expected:?}");
    let r = get(&p, &path, &[]);
    assert_eq!(r.status, 404, "{r:?}");
    assert!(r.content_type().starts_with("application/json"), "{r:?}");
    assert_eq!(json_of(&r), json_of(&expected));
}

#[test]
fn report_hash_routes_find_the_backend_holding_the_report() {
    let env = env();
    let second = env.second();
    let report = env
        .fixture
        .reports_only_in(&second.name)
        .into_iter()
        .find(|r| r.status.as_deref() == Some("failed"))
        .expect("a failed report only the second backend stored");
    let payload = env
        .fixture
        .report_payload(report)
        .expect("the report's store_report payload");
    let p = pdbmux("report-hash");

    let r = get(
        &p,
        &format!("/pdb/query/v4/reports/{}/metrics", report.hash),
        &[],
    );
    assert_eq!(r.status, 200, "{r:?}");
    let triple = |m: &Value| {
        (
            m["category"].to_string(),
            m["name"].to_string(),
            m["value"].as_f64(),
        )
    };
    let mut served: Vec<_> = json_of(&r)
        .as_array()
        .expect("an array")
        .iter()
        .map(triple)
        .collect();
    let mut loaded: Vec<_> = payload["metrics"]
        .as_array()
        .expect("metrics")
        .iter()
        .map(triple)
        .collect();
    served.sort_by(|a, b| a.partial_cmp(b).unwrap_or(Ordering::Equal));
    loaded.sort_by(|a, b| a.partial_cmp(b).unwrap_or(Ordering::Equal));
    assert_eq!(served, loaded);

    let r = get(
        &p,
        &format!("/pdb/query/v4/reports/{}/logs", report.hash),
        &[],
    );
    assert_eq!(r.status, 200, "{r:?}");
    let messages = |v: &Value| -> Vec<String> {
        v.as_array()
            .into_iter()
            .flatten()
            .map(|l| l["message"].to_string())
            .collect()
    };
    assert_eq!(messages(&json_of(&r)), messages(&payload["logs"]));

    // 7.12.1 answers /reports/<hash>/events with a 500 (a server bug); pdbmux replays the
    // answer of the backend holding the report, whatever it is.
    let path = format!("/pdb/query/v4/reports/{}/events", report.hash);
    let expected = direct(second, &path, &[]);
    let r = get(&p, &path, &[]);
    assert_eq!(r.status, expected.status, "{r:?}");
    if expected.status == 200 {
        assert_eq!(json_of(&r), json_of(&expected));
    } else {
        assert_eq!(r.body, expected.body);
    }

    let unknown = "0000000000000000000000000000000000000000";
    let r = get(&p, &format!("/pdb/query/v4/reports/{unknown}/metrics"), &[]);
    assert_eq!(r.status, 404, "{r:?}");
}

// --- allowlist (D6) ---------------------------------------------------------------------------

#[test]
fn paths_outside_the_allowlist_never_reach_a_backend() {
    let env = env();
    let logs = AccessLog::mark_all(env).expect("mark the backends' access logs");
    let forbidden = marker("forbidden");
    let p = pdbmux("allowlist");

    for path in [
        "/pdb/admin/v1/archive",
        "/pdb/cmd/v1",
        "/status/v1/services",
        "/status/v1/simple",
        "/pdb/query/v3/nodes",
        "/pdb/dashboard/index.html",
        "/",
        // No PuppetDB endpoint: PuppetDB would redirect these to its dashboard.
        "/pdb/query/v4/nosuch",
        "/pdb/query/v4/nodes;jsessionid=1",
    ] {
        let target = format!("{path}?{forbidden}=1");
        let r = p.get(&target).expect("GET through pdbmux");
        assert_eq!(r.status, 404, "GET {target}: {r:?}");
    }
    for target in [
        "/pdb/query/v4/../../pdb/admin/v1/archive",
        "/pdb/query/v4/./nodes",
        "/pdb/query/v4/%2e%2e/%2e%2e/pdb/admin/v1/archive",
        "/pdb/query/v4/%2E%2E/%2E%2E/pdb/admin/v1/archive",
        "/pdb/query/v4/nodes/a%2fb",
        "/pdb/query/v4/nodes/a%2Fb",
        "/pdb/query/v4/nodes/a%5cb",
        "/pdb/query/v4//nodes",
        "/pdb/query/v4/nodes/a%zz",
        "/pdb/query/v4/nodes/a%00",
        "/pdb/query/v4/nodes/%252e%252e",
    ] {
        let target = format!("{target}?{forbidden}=1");
        let r = p.raw_get(&target).expect("raw GET through pdbmux");
        assert_eq!(r.status, 400, "GET {target}: {r:?}");
    }
    let body = r#"{"query":["=","certname","x"]}"#;
    let r = p
        .raw(
            format!(
                "POST /pdb/query/v4/nodes?{forbidden}=1 HTTP/1.1\r\nHost: {}\r\n\
                 Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                p.addr(),
                body.len()
            )
            .as_bytes(),
        )
        .expect("raw POST through pdbmux");
    assert_eq!(r.status, 405, "{r:?}");
    assert_eq!(r.header("allow"), Some("GET"), "{r:?}");

    if logs.is_empty() {
        eprintln!("no E2E_ACCESS_LOGS: backend access logs not checked");
        return;
    }
    // Control: a request pdbmux does forward shows up in the first backend's access log.
    let control = marker("control");
    let q = certname_query(&control);
    let r = get(&p, "/pdb/query/v4/catalogs", &[("query", &q)]);
    assert_eq!(r.status, 200, "{r:?}");
    let first_log = logs
        .iter()
        .find(|l| l.backend == env.first().name)
        .expect("the first backend's access log");
    assert!(
        first_log
            .wait_for(&control, Duration::from_secs(10))
            .expect("read the access log"),
        "the forwarded control request never appeared in {first_log}"
    );
    for log in &logs {
        let leaked: Vec<String> = log
            .new_lines()
            .expect("read the access log")
            .into_iter()
            .filter(|l| l.contains(&forbidden))
            .collect();
        assert!(leaked.is_empty(), "reached {log}: {leaked:#?}");
    }
}

#[test]
fn non_get_is_405_with_allow_get() {
    let p = pdbmux("method");
    for method in ["POST", "PUT", "DELETE", "HEAD"] {
        let r = p
            .raw(
                format!(
                    "{method} /pdb/query/v4/nodes HTTP/1.1\r\nHost: {}\r\nContent-Length: 0\r\n\
                     Connection: close\r\n\r\n",
                    p.addr()
                )
                .as_bytes(),
            )
            .unwrap_or_else(|e| panic!("{method}: {e}"));
        assert_eq!(r.status, 405, "{method}: {r:?}");
        assert_eq!(r.header("allow"), Some("GET"), "{method}: {r:?}");
    }
}

#[test]
fn url_over_8_kib_is_414() {
    let p = pdbmux("uri-too-long");
    let long = "a".repeat(9 * 1024);
    let r = p
        .raw_get(&format!("/pdb/query/v4/nodes?query={long}"))
        .expect("raw GET");
    assert_eq!(r.status, 414, "{r:?}");
}

#[test]
fn oversized_request_headers_are_431() {
    let p = pdbmux("headers-too-large");
    let big = format!("X-Filler: {}\r\n", "a".repeat(17 * 1024));
    let many: String = (0..101).map(|i| format!("X-Field-{i}: {i}\r\n")).collect();
    for (what, headers) in [("17 KiB of headers", big), ("101 header fields", many)] {
        let request = format!(
            "GET /pdb/meta/v1/version HTTP/1.1\r\nHost: {}\r\n{headers}Connection: close\r\n\r\n",
            p.addr()
        );
        let r = p
            .raw(request.as_bytes())
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(r.status, 431, "{what}: {r:?}");
    }
}

// --- TLS backends (D8) ------------------------------------------------------------------------

#[test]
fn https_backend_with_a_client_certificate() {
    let env = env();
    let Some(tls) = &env.tls else {
        eprintln!("E2E_TLS_URL not set: no TLS backend to test");
        return;
    };
    let second = env.second();
    let expected = json_of(&direct(second, "/pdb/meta/v1/version", &[]));
    let with_cert = |label: &str, backends: &[(&str, &str)]| {
        env.pdbmux_with(backends)
            .env("PDBMUX_TLS_CA_FILE", &tls.ca_file.to_string_lossy())
            .env("PDBMUX_TLS_CERT_FILE", &tls.cert_file.to_string_lossy())
            .env("PDBMUX_TLS_KEY_FILE", &tls.key_file.to_string_lossy())
            .label(label)
            .spawn()
            .unwrap_or_else(|e| panic!("start pdbmux with a TLS backend: {e}"))
    };

    let p = with_cert("tls-only", &[("tls", tls.url.as_str())]);
    let r = get(&p, "/pdb/meta/v1/version", &[]);
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(json_of(&r), expected);
    // Data really comes through the TLS port: a node only the second backend holds.
    let node = node_of("second-only");
    let path = format!("/pdb/query/v4/nodes/{node}");
    let r = get(&p, &path, &[]);
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(json_of(&r), json_of(&direct(second, &path, &[])));
    let log = p.log();
    let key_pem = std::fs::read_to_string(&tls.key_file).expect("read the client key");
    let key_line = key_pem.lines().nth(1).expect("a key body line");
    assert!(
        !log.contains(key_line),
        "the client key appears in pdbmux's log"
    );
    drop(p);

    let p = with_cert(
        "tls-mixed",
        &[
            (env.first().name.as_str(), env.first().url.as_str()),
            ("tls", tls.url.as_str()),
        ],
    );
    let r = get(&p, "/pdb/meta/v1/version", &[]);
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.header("x-backends"), Some("2/2"), "{r:?}");
}

#[test]
fn https_backend_without_a_client_certificate_fails() {
    let env = env();
    let Some(tls) = &env.tls else {
        eprintln!("E2E_TLS_URL not set: no TLS backend to test");
        return;
    };
    // Trusted CA but no client certificate: PuppetDB's TLS port refuses the handshake.
    let p = env
        .pdbmux_with(&[("tls", tls.url.as_str())])
        .env("PDBMUX_TLS_CA_FILE", &tls.ca_file.to_string_lossy())
        .label("tls-no-cert")
        .spawn()
        .unwrap_or_else(|e| panic!("start pdbmux: {e}"));
    let r = get(&p, "/pdb/meta/v1/version", &[]);
    assert_eq!(r.status, 502, "{r:?}");
    drop(p);

    // Neither CA nor certificate: the throwaway CA is not among the system roots.
    let p = env
        .pdbmux_with(&[("tls", tls.url.as_str())])
        .label("tls-untrusted")
        .spawn()
        .unwrap_or_else(|e| panic!("start pdbmux: {e}"));
    let r = get(&p, "/pdb/meta/v1/version", &[]);
    assert_eq!(r.status, 502, "{r:?}");
}

/// Runs `openssl` with `args` in `dir`, failing the test on an error.
fn openssl(dir: &std::path::Path, args: &[&str]) {
    let out = std::process::Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run openssl");
    assert!(out.status.success(), "openssl {args:?}: {out:?}");
}

/// A TLS server on loopback (`openssl s_server`) presenting `cert`; killed on drop.
struct TlsServer {
    child: std::process::Child,
    url: String,
}

impl TlsServer {
    fn start(dir: &std::path::Path, cert: &str, key: &str) -> TlsServer {
        let port = pdbmux_e2e::free_port().expect("a free port");
        let child = std::process::Command::new("openssl")
            .args(["s_server", "-quiet", "-www", "-accept"])
            .arg(format!("127.0.0.1:{port}"))
            .args(["-cert", cert, "-key", key])
            .current_dir(dir)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("start openssl s_server");
        // Seen listening in /proc/net/tcp rather than by connecting: s_server takes a connection
        // that never handshakes as a failed session, and was once seen gone after such a probe.
        let listening = || {
            let wanted = format!("0100007F:{port:04X}");
            std::fs::read_to_string("/proc/net/tcp").is_ok_and(|table| {
                table.lines().skip(1).any(|line| {
                    let fields: Vec<&str> = line.split_whitespace().collect();
                    fields.get(1) == Some(&wanted.as_str()) && fields.get(3) == Some(&"0A")
                })
            })
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !listening() {
            assert!(
                std::time::Instant::now() < deadline,
                "s_server never listened"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        TlsServer {
            child,
            url: format!("https://127.0.0.1:{port}"),
        }
    }
}

impl Drop for TlsServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An https backend whose certificate another CA signed, or that expired, is that backend
/// failing: the others answer (`X-Backends: 1/2`), alone it is a 502 that names the TLS failure,
/// and nothing is served from it.
#[test]
fn https_backends_with_a_wrong_ca_or_an_expired_certificate_fail_cleanly() {
    let env = env();
    let Some(tls) = &env.tls else {
        eprintln!("E2E_TLS_URL not set: no TLS backend to test");
        return;
    };
    let dir = tempfile::tempdir().expect("a temporary directory");
    let dir = dir.path();
    // Another throwaway CA, which signed nothing the PuppetDB presents.
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-sha256",
            "-days",
            "1",
            "-subj",
            "/CN=pdbmux e2e wrong CA",
            "-keyout",
            "wrong-ca.key",
            "-out",
            "wrong-ca.pem",
        ],
    );
    // A certificate for 127.0.0.1 from the e2e CA, expired a day ago.
    let pki = tls.ca_file.parent().expect("the PKI directory");
    std::fs::write(dir.join("san.ext"), "subjectAltName=IP:127.0.0.1\n").expect("write");
    openssl(
        dir,
        &[
            "req",
            "-new",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            "/CN=127.0.0.1",
            "-keyout",
            "expired.key",
            "-out",
            "expired.csr",
        ],
    );
    let ca_key = pki.join("ca.key");
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "expired.csr",
            "-CA",
            &tls.ca_file.to_string_lossy(),
            "-CAkey",
            &ca_key.to_string_lossy(),
            "-CAcreateserial",
            "-days",
            "-1",
            "-sha256",
            "-extfile",
            "san.ext",
            "-out",
            "expired.pem",
        ],
    );
    let expired = TlsServer::start(dir, "expired.pem", "expired.key");
    let wrong_ca = dir.join("wrong-ca.pem");
    let first = (env.first().name.as_str(), env.first().url.as_str());
    let cases = [
        (
            "wrong CA",
            tls.url.as_str(),
            wrong_ca.to_string_lossy().into_owned(),
            "issuer",
        ),
        (
            "expired certificate",
            expired.url.as_str(),
            tls.ca_file.to_string_lossy().into_owned(),
            "expired",
        ),
    ];
    for (name, url, ca, reason) in cases {
        let start = |label: &str, backends: &[(&str, &str)]| {
            env.pdbmux_with(backends)
                .env("PDBMUX_TLS_CA_FILE", &ca)
                .env("PDBMUX_TLS_CERT_FILE", &tls.cert_file.to_string_lossy())
                .env("PDBMUX_TLS_KEY_FILE", &tls.key_file.to_string_lossy())
                .env("PDBMUX_HEALTH_PROBE_ENABLED", "false")
                .label(label)
                .spawn()
                .unwrap_or_else(|e| panic!("{name}: start pdbmux: {e}"))
        };
        let alone = start("tls-bad-alone", &[("tls", url)]);
        let r = get(&alone, "/pdb/meta/v1/version", &[]);
        assert_eq!(r.status, 502, "{name}: {r:?}");
        assert!(
            r.body.to_ascii_lowercase().contains(reason),
            "{name}: the 502 names the TLS failure: {r:?}"
        );
        drop(alone);
        let mixed = start("tls-bad-mixed", &[first, ("tls", url)]);
        let r = get(&mixed, "/pdb/query/v4/nodes", &[]);
        assert_eq!(r.status, 200, "{name}: {r:?}");
        assert_eq!(r.header("x-backends"), Some("1/2"), "{name}: {r:?}");
    }
}

// --- /healthz ---------------------------------------------------------------------------------

fn healthz(p: &Pdbmux) -> (u16, Value) {
    let r = get(p, "/healthz", &[]);
    let body = json_of(&r);
    (r.status, body)
}

/// `reachable` of each backend in a /healthz body, by name.
fn reachable(body: &Value) -> Vec<(String, Option<bool>)> {
    body["backends"]
        .as_array()
        .unwrap_or_else(|| panic!("no backends array in {body}"))
        .iter()
        .map(|b| {
            (
                b["name"].as_str().unwrap_or_default().to_owned(),
                b["reachable"].as_bool(),
            )
        })
        .collect()
}

#[test]
fn healthz_ok_when_every_backend_answers() {
    let env = env();
    let p = pdbmux("healthz-ok");
    let (status, body) = healthz(&p);
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["status"], "ok", "{body}");
    let expected: Vec<(String, Option<bool>)> = env
        .backends
        .iter()
        .map(|b| (b.name.clone(), Some(true)))
        .collect();
    assert_eq!(reachable(&body), expected, "{body}");
}

#[test]
fn healthz_degraded_when_one_backend_is_down() {
    let env = env();
    let dead = closed_backend().expect("a closed port");
    let p = env
        .pdbmux_with(&[
            (env.first().name.as_str(), env.first().url.as_str()),
            ("dead", dead.url()),
        ])
        .label("healthz-degraded")
        .spawn()
        .unwrap_or_else(|e| panic!("start pdbmux: {e}"));
    let (status, body) = healthz(&p);
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["status"], "degraded", "{body}");
    assert_eq!(
        reachable(&body),
        vec![
            (env.first().name.clone(), Some(true)),
            ("dead".to_owned(), Some(false))
        ],
        "{body}"
    );
}

#[test]
fn healthz_down_when_no_backend_answers() {
    let env = env();
    let (d1, d2) = (
        closed_backend().expect("a closed port"),
        closed_backend().expect("a closed port"),
    );
    let p = env
        .pdbmux_with(&[("dead-1", d1.url()), ("dead-2", d2.url())])
        .label("healthz-down")
        .spawn()
        .unwrap_or_else(|e| panic!("start pdbmux: {e}"));
    let (status, body) = healthz(&p);
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["status"], "down", "{body}");
    assert_eq!(
        reachable(&body),
        vec![
            ("dead-1".to_owned(), Some(false)),
            ("dead-2".to_owned(), Some(false))
        ],
        "{body}"
    );
}

/// A rotated client certificate is read from disk again on SIGHUP and used for new connections
/// to the TLS PuppetDB: files replaced by an untrusted certificate make the backend fail after
/// the reload, and the trusted one put back makes it answer again, with no restart.
#[test]
fn sighup_rereads_a_rotated_client_certificate() {
    let env = env();
    let Some(tls) = &env.tls else {
        eprintln!("E2E_TLS_URL not set: no TLS backend to test");
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let (cert, key) = (dir.path().join("client.pem"), dir.path().join("client.key"));
    let install = |from_cert: &std::path::Path, from_key: &std::path::Path| {
        std::fs::copy(from_cert, &cert).expect("copy the certificate");
        std::fs::copy(from_key, &key).expect("copy the key");
    };
    install(&tls.cert_file, &tls.key_file);
    let p = env
        .pdbmux_with(&[("tls", tls.url.as_str())])
        .env("PDBMUX_TLS_CA_FILE", &tls.ca_file.to_string_lossy())
        .env("PDBMUX_TLS_CERT_FILE", &cert.to_string_lossy())
        .env("PDBMUX_TLS_KEY_FILE", &key.to_string_lossy())
        .env("PDBMUX_HEALTH_PROBE_ENABLED", "false")
        .label("tls-rotate")
        .spawn()
        .unwrap_or_else(|e| panic!("start pdbmux with a TLS backend: {e}"));
    assert_eq!(get(&p, "/pdb/meta/v1/version", &[]).status, 200);

    // A certificate from no CA the PuppetDB trusts, at the same paths.
    let rogue = dir.path().join("rogue");
    std::fs::create_dir(&rogue).expect("mkdir");
    let made = std::process::Command::new("openssl")
        .args([
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-sha256", "-days", "1",
        ])
        .args(["-subj", "/CN=pdbmux-e2e-rogue", "-keyout"])
        .arg(rogue.join("client.key"))
        .arg("-out")
        .arg(rogue.join("client.pem"))
        .output()
        .expect("run openssl");
    assert!(made.status.success(), "{made:?}");
    install(&rogue.join("client.pem"), &rogue.join("client.key"));
    p.signal("HUP").expect("SIGHUP");
    p.wait_for_log("configuration reloaded", 1)
        .unwrap_or_else(|e| panic!("{e}"));
    let refused = get(&p, "/pdb/meta/v1/version", &[]);
    assert_eq!(
        refused.status, 502,
        "the untrusted certificate is used now: {refused:?}"
    );

    install(&tls.cert_file, &tls.key_file);
    p.signal("HUP").expect("SIGHUP");
    p.wait_for_log("configuration reloaded", 2)
        .unwrap_or_else(|e| panic!("{e}"));
    let r = get(&p, "/pdb/meta/v1/version", &[]);
    assert_eq!(r.status, 200, "the trusted certificate again: {r:?}");
}
