//! What pdbmux takes from outside and never relays as it came (docs/reliability.md): a status no
//! HTTP server sends, a backend's content type, a TLS file that cannot be read, an owner's answer
//! that is not JSON, a scrape with ambiguous framing.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::metrics::metrics_addr;
use crate::support::{respond, FakeBackend, Pdbmux, Piece};

/// A whole answer with any status line.
fn with_status(status: &str, content_type: &str, body: &str) -> Vec<Piece> {
    vec![Piece::Bytes(
        format!(
            "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .into_bytes(),
    )]
}

/// A status from 600 to 999 is no answer to relay: that backend failed, the next one answers, and
/// alone it is a 502 (on both binaries).
pub fn a_status_past_599_is_a_failed_backend(bin: &Path) {
    let weird = FakeBackend::start(|_| with_status("700 Weird", "application/json", "[]"));
    let good = FakeBackend::start(|_| respond("200 OK", "application/json", r#"["kernel"]"#));
    let pdbmux = Pdbmux::start(
        bin,
        &[
            (
                "PDBMUX_BACKENDS",
                format!("a={},b={}", weird.url(), good.url()),
            ),
            ("PDBMUX_FACTS_TTL", "0s".into()),
        ],
    );
    let passed = pdbmux.get("/pdb/query/v4/environments/production");
    assert_eq!(passed.status(), 200, "{}", passed.text);
    assert_eq!(passed.body(), r#"["kernel"]"#);
    let merged = pdbmux.get("/pdb/query/v4/fact-names");
    assert_eq!(merged.status(), 200, "{}", merged.text);
    assert_eq!(merged.header("x-backends").as_deref(), Some("1/2"));
    let alone = Pdbmux::start(bin, &[("PDBMUX_BACKENDS", format!("a={}", weird.url()))]);
    let refused = alone.get("/pdb/query/v4/environments/production");
    assert_eq!(refused.status(), 502, "{}", refused.text);
}

/// JSON a backend labels `text/html` goes out as JSON, an HTML error page as plain text, and
/// every answer says `nosniff`: a browser never runs what a backend sends.
pub fn a_backends_content_type_is_never_relayed(bin: &Path) {
    let html = FakeBackend::start(|line| {
        if line.contains("/pdb/query/v4/nodes/web1") {
            with_status(
                "404 Not Found",
                "text/html",
                "<html><script>x()</script></html>",
            )
        } else if line.contains("/pdb/query/v4/nodes") {
            respond("200 OK", "application/json", "[]")
        } else {
            with_status("200 OK", "text/html", r#""<script>alert(1)</script>""#)
        }
    });
    let pdbmux = Pdbmux::start(bin, &[("PDBMUX_BACKENDS", format!("a={}", html.url()))]);
    for target in [
        "/pdb/query/v4/environments/production",
        "/pdb/meta/v1/server-time",
        "/pdb/query/v4?query=%5B%22from%22%2C%22catalog_inputs%22%5D&ast_only=true",
    ] {
        let answer = pdbmux.get(target);
        assert_eq!(answer.status(), 200, "{target}: {}", answer.text);
        assert_eq!(
            answer.header("content-type").as_deref(),
            Some("application/json;charset=utf-8"),
            "{target}"
        );
        assert_eq!(
            answer.header("x-content-type-options").as_deref(),
            Some("nosniff"),
            "{target}"
        );
    }
    let error = pdbmux.get("/pdb/query/v4/nodes/web1");
    assert_eq!(error.status(), 404, "{}", error.text);
    assert_eq!(
        error.header("content-type").as_deref(),
        Some("text/plain;charset=utf-8")
    );
    let refused = pdbmux.get("/pdb/admin/v1/archive");
    assert_eq!(
        refused.header("x-content-type-options").as_deref(),
        Some("nosniff"),
        "pdbmux's own refusals too"
    );
}

/// A TLS file that cannot be read is refused at start by both binaries, whatever the backends'
/// scheme, with a message naming it.
pub fn an_unreadable_tls_file_is_refused_at_start_for_http_backends_too(bin: &Path) {
    let home = tempfile::tempdir().unwrap();
    let mut child = Command::new(bin)
        .env_clear()
        .env("HOME", home.path())
        .env("PDBMUX_LISTEN", "127.0.0.1:0")
        .env("PDBMUX_METRICS_LISTEN", "")
        .env("PDBMUX_BACKENDS", "a=http://127.0.0.1:9")
        .env("PDBMUX_TLS_CA_FILE", "/nonexistent/pdbmux-ca.pem")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "still running with a missing CA file"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(!status.success(), "{stderr}");
    assert!(stderr.contains("/nonexistent/pdbmux-ca.pem"), "{stderr}");
}

/// When the node's owner answers something that is not JSON, another backend's answer stands in
/// (an unreachable owner must not take the node with it) and pdbmux says so in its log.
pub fn an_owner_whose_answer_is_not_json_is_logged(bin: &Path) {
    let owner = FakeBackend::start(|line| {
        if line.contains("/pdb/query/v4/nodes/web1") {
            respond(
                "200 OK",
                "application/json",
                "{\"certname\": \"web1\", trunc",
            )
        } else {
            respond(
                "200 OK",
                "application/json",
                r#"[{"certname":"web1","report_timestamp":"2024-05-01T10:00:00.000Z"}]"#,
            )
        }
    });
    let other = FakeBackend::start(|line| {
        if line.contains("/pdb/query/v4/nodes/web1") {
            respond(
                "404 Not Found",
                "application/json",
                r#"{"error":"No information is known about node web1"}"#,
            )
        } else {
            respond("200 OK", "application/json", "[]")
        }
    });
    let mut pdbmux = Pdbmux::start(
        bin,
        &[(
            "PDBMUX_BACKENDS",
            format!("a={},b={}", owner.url(), other.url()),
        )],
    );
    let answer = pdbmux.get("/pdb/query/v4/nodes/web1");
    assert_eq!(answer.status(), 404, "{}", answer.text);
    let log = pdbmux.stderr();
    assert!(
        log.contains("the node's owner failed") && log.contains("owner=\"a\"")
            || log.contains("the node's owner failed") && log.contains("owner=a"),
        "{log}"
    );
}

/// The metrics listener applies the query listener's head checks: a request with ambiguous
/// framing is refused and its connection closed.
pub fn the_metrics_listener_refuses_ambiguous_framing(bin: &Path) {
    let backend = FakeBackend::start(|_| respond("200 OK", "application/json", "[]"));
    let metrics = metrics_addr();
    let _pdbmux = Pdbmux::start(
        bin,
        &[
            ("PDBMUX_BACKENDS", format!("a={}", backend.url())),
            ("PDBMUX_METRICS_LISTEN", metrics.to_string()),
        ],
    );
    let smuggled = Pdbmux::raw_at(
        metrics,
        "GET /metrics HTTP/1.1\r\nHost: m\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    );
    assert_eq!(smuggled.status(), 400, "{}", smuggled.text);
    let plain = Pdbmux::raw_at(
        metrics,
        "GET /metrics HTTP/1.1\r\nHost: m\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(plain.status(), 200, "{}", plain.text);
    assert_eq!(
        plain.header("x-content-type-options").as_deref(),
        Some("nosniff")
    );
}
