//! The runtime cases both binaries must pass, against scripted raw-TCP backends: body limits while
//! streaming, request limits, keep-alive, graceful shutdown and cancellation.
//!
//! Each case is a function of the binary under test; [`runtime_cases!`](crate::runtime_cases)
//! turns the list into `#[test]`s for one binary. A new case is a function here plus its name in
//! the macro.

#![allow(dead_code, missing_docs, clippy::unwrap_used)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use crate::support::{access_line, respond, tcp_sockets, FakeBackend, Pdbmux, Piece};

mod metrics;
pub use metrics::*;
mod dashboard;
pub use dashboard::*;
mod reload;
pub use reload::*;
mod verbatim;
pub use verbatim::*;
mod slow_clients;
pub use slow_clients::*;
mod corpus;
pub use corpus::*;
mod untrusted;
pub use untrusted::*;
mod budget;
pub use budget::*;

fn chunk(data: &[u8]) -> Vec<u8> {
    let mut out = format!("{:x}\r\n", data.len()).into_bytes();
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
    out
}

/// `body` as a chunked 200 in pieces of 8 KiB, ending as `end` says.
pub(crate) fn chunked(body: &str, end: End) -> Vec<Piece> {
    let mut pieces = vec![Piece::Bytes(
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
            .to_vec(),
    )];
    pieces.extend(
        body.as_bytes()
            .chunks(8192)
            .map(|piece| Piece::Bytes(chunk(piece))),
    );
    pieces.push(match end {
        End::Terminated => Piece::Bytes(b"0\r\n\r\n".to_vec()),
        End::WithTrailers => Piece::Bytes(b"0\r\nX-Checksum: 1\r\n\r\n".to_vec()),
    });
    pieces
}

/// How a chunked body ends.
#[derive(Clone, Copy)]
pub(crate) enum End {
    /// With its terminating chunk.
    Terminated,
    /// With its terminating chunk and a trailer field (hyper hands trailers on as a frame of
    /// their own, which must end the check too).
    WithTrailers,
}

pub fn a_streamed_body_over_the_limit_aborts_the_connection(bin: &Path) {
    let backend = FakeBackend::start(|_| {
        let mut pieces = vec![Piece::Bytes(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec(),
        )];
        for _ in 0..10 {
            pieces.push(Piece::Bytes(chunk(&[b' '; 500])));
            pieces.push(Piece::Pause(Duration::from_millis(5)));
        }
        pieces.push(Piece::Bytes(b"0\r\n\r\n".to_vec()));
        pieces
    });
    let pdbmux = Pdbmux::start(
        bin,
        &[
            ("PDBMUX_BACKENDS", format!("a={}", backend.url())),
            ("PDBMUX_MAX_BODY_BYTES", "2000".into()),
        ],
    );
    let response = pdbmux.get("/pdb/query/v4/environments/production");
    assert_eq!(response.status(), 200, "{}", response.text);
    assert!(
        !ends_a_chunked_body(&response.text),
        "the client must not see a complete chunked body: {:?}",
        &response.text[response.text.len().saturating_sub(40)..]
    );
    assert!(response.body().len() < 5000);
}

pub fn a_declared_length_over_the_limit_fails_that_backend_and_the_next_one_answers(bin: &Path) {
    let big = FakeBackend::start(|_| respond("200 OK", "application/json", &" ".repeat(3000)));
    let small = FakeBackend::start(|_| respond("200 OK", "application/json", "[1]"));
    let pdbmux = Pdbmux::start(
        bin,
        &[
            (
                "PDBMUX_BACKENDS",
                format!("a={},b={}", big.url(), small.url()),
            ),
            ("PDBMUX_MAX_BODY_BYTES", "2000".into()),
        ],
    );
    let response = pdbmux.get("/pdb/query/v4/environments/production");
    assert_eq!(response.status(), 200);
    assert_eq!(response.body(), "[1]");

    let alone = Pdbmux::start(
        bin,
        &[
            ("PDBMUX_BACKENDS", format!("a={}", big.url())),
            ("PDBMUX_MAX_BODY_BYTES", "2000".into()),
        ],
    );
    let response = alone.get("/pdb/query/v4/environments/production");
    assert_eq!(response.status(), 502);
    assert!(
        response.body().contains("body over 2000 bytes"),
        "{}",
        response.body()
    );
}

pub fn request_limits_are_enforced_before_any_backend_is_asked(bin: &Path) {
    let backend = FakeBackend::start(|_| respond("200 OK", "application/json", "[]"));
    let pdbmux = Pdbmux::start(bin, &[("PDBMUX_BACKENDS", format!("a={}", backend.url()))]);

    let long = format!(
        "/pdb/query/v4/environments/production?query={}",
        "x".repeat(8200)
    );
    assert_eq!(pdbmux.get(&long).status(), 414);

    let mut request = String::from(
        "GET /pdb/query/v4/environments/production HTTP/1.1\r\nHost: pdbmux\r\nConnection: close\r\n",
    );
    for i in 0..100 {
        request.push_str(&format!("X-Filler-{i}: 1\r\n"));
    }
    request.push_str("\r\n");
    assert_eq!(pdbmux.raw(&request).status(), 431);

    let big_header = format!(
        "GET /pdb/query/v4/environments/production HTTP/1.1\r\nHost: pdbmux\r\nConnection: close\r\nX-Big: {}\r\n\r\n",
        "y".repeat(17 * 1024)
    );
    assert_eq!(pdbmux.raw(&big_header).status(), 431);

    let post = pdbmux.raw("POST /pdb/query/v4/nodes HTTP/1.1\r\nHost: pdbmux\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
    assert_eq!(post.status(), 405);
    assert_eq!(post.header("allow").as_deref(), Some("GET"));

    for target in [
        "/pdb/query/v4/../../pdb/admin/v1/archive",
        "/pdb/query/v4/%2e%2e/x",
        "/pdb/admin/v1/archive",
        "/status/v1/services",
    ] {
        let status = pdbmux.get(target).status();
        assert!(status == 400 || status == 404, "{target}: {status}");
    }
    assert!(
        backend.request_lines().is_empty(),
        "nothing may reach the backend: {:?}",
        backend.request_lines()
    );
}

pub fn sigterm_lets_in_flight_requests_finish_then_exits_zero(bin: &Path) {
    let backend = FakeBackend::start(|_| {
        let mut pieces = vec![Piece::Pause(Duration::from_millis(800))];
        pieces.extend(respond("200 OK", "application/json", "[\"slow\"]"));
        pieces
    });
    let mut pdbmux = Pdbmux::start(bin, &[("PDBMUX_BACKENDS", format!("a={}", backend.url()))]);
    let addr = pdbmux.addr;
    let in_flight = thread::spawn(move || {
        Pdbmux::raw_at(
            addr,
            "GET /pdb/query/v4/environments/production HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        )
    });
    thread::sleep(Duration::from_millis(200));
    pdbmux.terminate();
    let response = in_flight.join().unwrap();
    assert_eq!(response.status(), 200, "{}", response.text);
    assert_eq!(response.body(), "[\"slow\"]");
    assert_eq!(pdbmux.wait_exit(Duration::from_secs(10)), Some(0));
    assert!(
        std::net::TcpStream::connect(addr).is_err(),
        "the listener is closed after shutdown"
    );
}

pub fn a_client_that_leaves_releases_the_upstream_request(bin: &Path) {
    let backend = FakeBackend::start(|_| {
        let mut pieces = vec![Piece::Pause(Duration::from_millis(1500))];
        pieces.extend(respond("200 OK", "application/json", "[]"));
        pieces
    });
    let pdbmux = Pdbmux::start(bin, &[("PDBMUX_BACKENDS", format!("a={}", backend.url()))]);
    leave_once_asked(&pdbmux, &backend, "/pdb/query/v4/environments/production");
}

/// Sends a GET for `target` and leaves (closes the connection) as soon as `backend` has been
/// asked; then waits until pdbmux drops its upstream request, which the backend sees as its
/// connection closing as soon as it writes (or reads) again, well before a second request could
/// reuse it.
fn leave_once_asked(pdbmux: &Pdbmux, backend: &FakeBackend, target: &str) {
    {
        let mut stream = TcpStream::connect(pdbmux.addr).unwrap();
        stream
            .write_all(format!("GET {target} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
            .unwrap();
        let started = Instant::now();
        while backend.request_lines().is_empty() {
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "request never reached the backend"
            );
            thread::sleep(Duration::from_millis(10));
        }
    }
    let started = Instant::now();
    while backend.connections_closed.load(Ordering::SeqCst) == 0 {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the upstream connection of {target} was not released"
        );
        thread::sleep(Duration::from_millis(20));
    }
}

/// Sockets to `port` in CLOSE-WAIT (the peer closed, this side has not), from /proc/net/tcp.
fn close_wait_to(port: u16) -> usize {
    tcp_sockets()
        .iter()
        .filter(|socket| socket.remote_port == port && socket.state == "08")
        .count()
}

/// A pooled upstream connection the backend closes while idle (as Jetty does after its idle
/// timeout) is closed by pdbmux too within a few seconds, not left in CLOSE-WAIT until the next
/// request.
pub fn idle_upstream_connections_the_backend_closed_are_closed_too(bin: &Path) {
    let backend = FakeBackend::start(|_| {
        let mut pieces = respond("200 OK", "application/json", r#"["kernel"]"#);
        pieces.push(Piece::Pause(Duration::from_millis(50)));
        pieces.push(Piece::Close);
        pieces
    });
    let pdbmux = Pdbmux::start(
        bin,
        &[
            ("PDBMUX_BACKENDS", format!("a={}", backend.url())),
            ("PDBMUX_FACTS_TTL", "0s".to_owned()),
        ],
    );
    // Spaced out, as a backend's idle timeout closes connections between requests.
    for _ in 0..3 {
        assert_eq!(pdbmux.get("/pdb/query/v4/fact-names").status(), 200);
        thread::sleep(Duration::from_millis(300));
    }
    if !cfg!(target_os = "linux") {
        return;
    }
    let port = backend.addr.port();
    let started = Instant::now();
    while close_wait_to(port) > 0 {
        assert!(
            started.elapsed() < Duration::from_secs(6),
            "{} sockets to the backend still in CLOSE-WAIT",
            close_wait_to(port)
        );
        thread::sleep(Duration::from_millis(100));
    }
}

/// A client waiting on a shared fan-out (a cacheable route: a single-flight) that leaves is its
/// last participant: the flight is cancelled and its upstream request released.
pub fn a_client_that_leaves_a_shared_fan_out_cancels_it(bin: &Path) {
    let backend = FakeBackend::start(|_| {
        let mut pieces = vec![Piece::Pause(Duration::from_millis(1500))];
        pieces.extend(respond("200 OK", "application/json", "[]"));
        pieces
    });
    let metrics = metrics::metrics_addr();
    let pdbmux = Pdbmux::start(
        bin,
        &[
            ("PDBMUX_BACKENDS", format!("a={}", backend.url())),
            ("PDBMUX_METRICS_LISTEN", metrics.to_string()),
        ],
    );
    leave_once_asked(&pdbmux, &backend, "/pdb/query/v4/fact-names");
    // Counted as nginx counts a client that closed first.
    metrics::scrape_until(metrics, |s| {
        s.value("pdbmux_requests_total", "code=499,route=query") == 1.0
    });
}

pub fn a_streamed_body_past_its_deadline_aborts_the_connection(bin: &Path) {
    let backend = FakeBackend::start(|_| {
        vec![
            Piece::Bytes(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec(),
            ),
            Piece::Bytes(chunk(b"[\"first\"")),
            Piece::Pause(Duration::from_secs(4)),
            Piece::Bytes(chunk(b"]")),
            Piece::Bytes(b"0\r\n\r\n".to_vec()),
        ]
    });
    let pdbmux = Pdbmux::start(
        bin,
        &[
            ("PDBMUX_BACKENDS", format!("a={}", backend.url())),
            ("PDBMUX_TIMEOUT", "1s".into()),
        ],
    );
    let started = Instant::now();
    let response = pdbmux.get("/pdb/query/v4/environments/production");
    assert_eq!(response.status(), 200, "{}", response.text);
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "the stream was not cut at its deadline: {:?}",
        started.elapsed()
    );
    // The JSON check holds each chunk back until the body continues, so the first never left.
    assert!(!response.body().contains("first"), "{}", response.text);
    assert!(
        !ends_a_chunked_body(&response.text) && !response.body().contains(']'),
        "the client must not see a complete body: {:?}",
        response.text
    );
}

pub fn a_backend_closing_mid_body_aborts_the_connection(bin: &Path) {
    // Chunked, as PuppetDB streams: the body is held and streamed, so the connection is cut.
    let backend = FakeBackend::start(|_| {
        vec![
            Piece::Bytes(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
                    .to_vec(),
            ),
            Piece::Bytes(chunk(b"[\"partial\"")),
            Piece::Close,
        ]
    });
    let mut pdbmux = Pdbmux::start(bin, &[("PDBMUX_BACKENDS", format!("a={}", backend.url()))]);
    let response = pdbmux.get("/pdb/query/v4/environments/production");
    assert_eq!(response.status(), 200, "{}", response.text);
    match response.header("content-length") {
        Some(length) => assert!(
            response.body().len() < length.parse().unwrap(),
            "the body must fall short of its length: {:?}",
            response.text
        ),
        None => assert!(
            !ends_a_chunked_body(&response.text),
            "the client must not see a complete chunked body: {:?}",
            response.text
        ),
    }
    // One access line, written when the body was cut off: at warn, with why.
    let log = pdbmux.stderr();
    let line = access_line(&log, "/pdb/query/v4/environments/production");
    for field in [
        "WARN",
        " status=200 ",
        " body=cut_off ",
        " why=cut off after ",
    ] {
        assert!(line.contains(field), "{field} in {line}");
    }
    let id = response
        .header("x-request-id")
        .expect("a request id")
        .to_owned();
    let warned = log
        .lines()
        .filter(|l| l.contains("WARN") && l.contains(&id))
        .count();
    assert_eq!(warned, 1, "the request's one line at warn:\n{log}");
}

/// Whether a raw response's body (after its head: the head itself may end in a `0`, a request
/// id's last digit) ends with the last chunk of a chunked body.
pub(crate) fn ends_a_chunked_body(text: &str) -> bool {
    text.split_once("\r\n\r\n")
        .is_some_and(|(_, body)| body.ends_with("0\r\n\r\n"))
}

pub fn keep_alive_answers_pipelined_requests_in_order(bin: &Path) {
    let backend = FakeBackend::start(|line| {
        let body = if line.contains("first") { "[1]" } else { "[2]" };
        respond("200 OK", "application/json", body)
    });
    let pdbmux = Pdbmux::start(bin, &[("PDBMUX_BACKENDS", format!("a={}", backend.url()))]);
    let both = pdbmux.raw(
        "GET /pdb/query/v4/environments/production?first HTTP/1.1\r\nHost: x\r\n\r\n\
         GET /pdb/query/v4/environments/production?second HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(
        both.text.matches("HTTP/1.1 200").count(),
        2,
        "{}",
        both.text
    );
    let (first, second) = (both.text.find("[1]"), both.text.find("[2]"));
    assert!(
        first.is_some() && second.is_some() && first < second,
        "answers out of order: {}",
        both.text
    );
}

pub fn upstream_connections_are_kept_alive_and_reused(bin: &Path) {
    let backend = FakeBackend::start(|_| respond("200 OK", "application/json", "[]"));
    let pdbmux = Pdbmux::start(bin, &[("PDBMUX_BACKENDS", format!("a={}", backend.url()))]);
    for _ in 0..5 {
        assert_eq!(
            pdbmux.get("/pdb/query/v4/environments/production").status(),
            200
        );
        thread::sleep(Duration::from_millis(50));
    }
    let opened = backend.connections_opened.load(Ordering::SeqCst);
    assert!(
        opened < 5,
        "{opened} upstream connections for 5 sequential requests"
    );
}

/// A pooled upstream connection the backend closes without answering the request just sent on
/// it (as a backend closing an idle connection does when the request crosses the close): the
/// request is sent once more on a new connection and answered, not failed.
pub fn a_request_on_a_connection_the_backend_closed_is_sent_again(bin: &Path) {
    let asked = Arc::new(AtomicUsize::new(0));
    let count = asked.clone();
    let backend = FakeBackend::start(move |line| {
        if !line.contains("/environments/production") {
            return respond("200 OK", "application/json", "[]");
        }
        // The second request, on the connection the first left in the pool, is read and the
        // connection closed with no answer.
        match count.fetch_add(1, Ordering::SeqCst) {
            1 => vec![Piece::Close],
            _ => respond("200 OK", "application/json", r#"{"name":"production"}"#),
        }
    });
    let pdbmux = Pdbmux::start(bin, &[("PDBMUX_BACKENDS", format!("a={}", backend.url()))]);
    let first = pdbmux.get("/pdb/query/v4/environments/production");
    assert_eq!(first.status(), 200, "{}", first.text);
    thread::sleep(Duration::from_millis(50));
    let second = pdbmux.get("/pdb/query/v4/environments/production");
    assert_eq!(second.status(), 200, "sent again: {}", second.text);
    assert_eq!(second.body(), r#"{"name":"production"}"#);
    assert_eq!(
        asked.load(Ordering::SeqCst),
        3,
        "the first, the closed one, once more"
    );
}

pub fn an_http10_client_gets_a_whole_body_without_chunks(bin: &Path) {
    let backend = FakeBackend::start(|_| {
        vec![
            Piece::Bytes(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec(),
            ),
            Piece::Bytes(chunk(b"[\"a\",")),
            Piece::Bytes(chunk(b"\"b\"]")),
            Piece::Bytes(b"0\r\n\r\n".to_vec()),
        ]
    });
    let pdbmux = Pdbmux::start(bin, &[("PDBMUX_BACKENDS", format!("a={}", backend.url()))]);
    let response =
        pdbmux.raw("GET /pdb/query/v4/environments/production HTTP/1.0\r\nHost: x\r\n\r\n");
    assert_eq!(response.status(), 200, "{}", response.text);
    assert_eq!(
        response.header("transfer-encoding"),
        None,
        "{}",
        response.text
    );
    assert_eq!(response.body(), "[\"a\",\"b\"]");
}

pub fn the_request_target_reaches_the_backend_verbatim(bin: &Path) {
    let backend = FakeBackend::start(|_| respond("200 OK", "application/json", "[]"));
    let pdbmux = Pdbmux::start(bin, &[("PDBMUX_BACKENDS", format!("a={}", backend.url()))]);
    let target =
        "/pdb/query/v4/environments/production?query=%5B%22%3D%22%2C%22certname%22%2C%22a%22%5D&limit=1";
    assert_eq!(pdbmux.get(target).status(), 200);
    assert_eq!(
        backend.request_lines(),
        vec![format!("GET {target} HTTP/1.1")]
    );
}

pub fn shutdown_closes_idle_keep_alive_connections_at_once(bin: &Path) {
    let backend = FakeBackend::start(|_| respond("200 OK", "application/json", "[]"));
    let mut pdbmux = Pdbmux::start(bin, &[("PDBMUX_BACKENDS", format!("a={}", backend.url()))]);
    let mut idle = TcpStream::connect(pdbmux.addr).unwrap();
    idle.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    idle.write_all(b"GET /pdb/query/v4/environments/production HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut seen = Vec::new();
    let mut buffer = [0u8; 1024];
    while !String::from_utf8_lossy(&seen).ends_with("[]") {
        let n = idle.read(&mut buffer).unwrap();
        assert!(
            n > 0,
            "closed before the answer: {:?}",
            String::from_utf8_lossy(&seen)
        );
        seen.extend_from_slice(&buffer[..n]);
    }
    let started = Instant::now();
    pdbmux.terminate();
    // The default timeout is 10 s: draining idle connections must not wait for it.
    assert_eq!(pdbmux.wait_exit(Duration::from_secs(5)), Some(0));
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(
        matches!(idle.read(&mut buffer), Ok(0) | Err(_)),
        "the idle connection is closed"
    );
}

/// Splits pipelined responses read off one connection: (head, body) pairs by Content-Length.
fn split_responses(mut bytes: &[u8]) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    while !bytes.is_empty() {
        let end = bytes
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .expect("a complete head")
            + 4;
        let head = String::from_utf8_lossy(&bytes[..end]).to_lowercase();
        let length: usize = head
            .lines()
            .find_map(|line| line.strip_prefix("content-length:"))
            .expect("a Content-Length")
            .trim()
            .parse()
            .unwrap();
        assert!(bytes.len() >= end + length, "a truncated body: {head}");
        out.push((head, bytes[end..end + length].to_vec()));
        bytes = &bytes[end + length..];
    }
    out
}

/// A merged body large enough to be stored sealed (pdbmux_sealed's 256 KiB threshold; on Linux
/// the log says it was) is served byte-identical from the cache (through the connection's pipe), on a keep-alive
/// connection whose next answer still frames.
pub fn a_large_cached_body_is_served_identical_on_a_hit(bin: &Path) {
    let certname = "node-1.example.com";
    let facts: Vec<String> = (0..700)
        .map(|n| {
            format!(
                r#"{{"certname":"{certname}","environment":"production","name":"fact_{n:04}","value":"{}"}}"#,
                "v".repeat(500 + n % 7)
            )
        })
        .collect();
    let facts = format!("[{}]", facts.join(","));
    let membership = format!(
        r#"[{{"certname":"{certname}","to_string":"2024-05-01T10:00:00.000000+00","deactivated":null,"expired":null}}]"#
    );
    let backend = FakeBackend::start(move |line| {
        if line.contains("/pdb/query/v4/nodes") {
            respond("200 OK", "application/json", &membership)
        } else if line.contains("/pdb/query/v4/fact-names") {
            respond("200 OK", "application/json", r#"["fact_0000"]"#)
        } else {
            respond("200 OK", "application/json", &facts)
        }
    });
    let mut pdbmux = Pdbmux::start(bin, &[("PDBMUX_BACKENDS", format!("a={}", backend.url()))]);
    let get = "GET /pdb/query/v4/facts HTTP/1.1\r\nHost: x\r\n\r\n";
    let mut stream = TcpStream::connect(pdbmux.addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    stream.write_all(get.as_bytes()).unwrap();
    stream.write_all(get.as_bytes()).unwrap();
    stream
        .write_all(b"GET /pdb/query/v4/fact-names HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut bytes = Vec::new();
    stream.read_to_end(&mut bytes).unwrap();
    let responses = split_responses(&bytes);
    assert_eq!(responses.len(), 3, "three answers on one connection");
    let (miss_head, miss) = &responses[0];
    let (hit_head, hit) = &responses[1];
    assert!(
        miss_head.starts_with("http/1.1 200"),
        "{miss_head}{}",
        String::from_utf8_lossy(miss)
    );
    assert!(miss_head.contains("x-cache: miss"), "{miss_head}");
    assert!(hit_head.contains("x-cache: hit"), "{hit_head}");
    assert!(miss.len() >= 256 * 1024, "{} bytes", miss.len());
    assert!(miss == hit, "the hit's body differs from the miss's");
    assert!(
        miss.windows(certname.len())
            .filter(|w| *w == certname.as_bytes())
            .count()
            > 700,
        "the merged records"
    );
    let (names_head, names) = &responses[2];
    assert!(names_head.starts_with("http/1.1 200"), "{names_head}");
    assert_eq!(names, br#"["fact_0000","pdbmux_source"]"#);
    drop(stream);
    let log = pdbmux.stderr();
    if cfg!(target_os = "linux") {
        assert!(log.contains("cache body sealed"), "{log}");
    }
}

/// A fan-out that one backend fails is counted as a partial round in `/healthz` (the runtime
/// hands each exchange's round to the estate when it answers).
pub fn a_partial_fan_out_is_counted_in_healthz(bin: &Path) {
    let good = FakeBackend::start(|line| {
        if line.contains("/pdb/query/v4/fact-names") {
            respond("200 OK", "application/json", r#"["kernel"]"#)
        } else {
            respond("200 OK", "application/json", r#"{"version":"7.12.1"}"#)
        }
    });
    let failing = FakeBackend::start(|line| {
        if line.contains("/pdb/query/v4/fact-names") {
            respond("500 Server Error", "text/plain", "boom")
        } else {
            respond("200 OK", "application/json", r#"{"version":"7.12.1"}"#)
        }
    });
    let pdbmux = Pdbmux::start(
        bin,
        &[
            (
                "PDBMUX_BACKENDS",
                format!("a={},b={}", good.url(), failing.url()),
            ),
            ("PDBMUX_FACTS_TTL", "0s".to_owned()),
        ],
    );
    let names = pdbmux.get("/pdb/query/v4/fact-names");
    assert_eq!(names.status(), 200, "{}", names.body());
    assert_eq!(names.header("x-backends").as_deref(), Some("1/2"));
    let healthz = pdbmux.get("/healthz");
    let body: serde_json::Value = serde_json::from_str(healthz.body()).unwrap();
    assert_eq!(body["query"]["partial_rounds"], 1, "{body}");
    assert_eq!(body["query"]["partial"], true, "{body}");
}

/// `#[test]`s running every case against one binary, e.g.
/// `runtime_cases!(env!("CARGO_BIN_EXE_pdbmux-smol"));` (`RUNTIME_TEST_BIN` overrides it).
/// The `#[test]`s of every case for the binary at `$binary` (`env!("CARGO_BIN_EXE_<name>")`).
#[macro_export]
macro_rules! runtime_cases {
    ($binary:expr) => {
        $crate::runtime_cases!(@each $binary;
            a_streamed_body_over_the_limit_aborts_the_connection,
            a_declared_length_over_the_limit_fails_that_backend_and_the_next_one_answers,
            request_limits_are_enforced_before_any_backend_is_asked,
            sigterm_lets_in_flight_requests_finish_then_exits_zero,
            a_client_that_leaves_releases_the_upstream_request,
            a_client_that_leaves_a_shared_fan_out_cancels_it,
            idle_upstream_connections_the_backend_closed_are_closed_too,
            a_streamed_body_past_its_deadline_aborts_the_connection,
            a_backend_closing_mid_body_aborts_the_connection,
            keep_alive_answers_pipelined_requests_in_order,
            upstream_connections_are_kept_alive_and_reused,
            a_request_on_a_connection_the_backend_closed_is_sent_again,
            an_http10_client_gets_a_whole_body_without_chunks,
            the_request_target_reaches_the_backend_verbatim,
            shutdown_closes_idle_keep_alive_connections_at_once,
            a_large_cached_body_is_served_identical_on_a_hit,
            a_partial_fan_out_is_counted_in_healthz,
            a_scripted_run_shows_in_the_metrics_with_exact_counts,
            the_metrics_listener_serves_metrics_only_and_the_query_port_none,
            a_scrape_during_load_is_well_formed,
            every_metric_the_dashboard_and_rules_use_is_exported,
            sighup_adds_and_removes_backends_while_requests_run,
            a_bad_configuration_on_sighup_is_refused_and_the_old_one_serves,
            a_configmap_update_is_read_again_without_a_sighup,
            a_request_in_flight_finishes_on_the_configuration_it_started_with,
            reloaded_client_timeouts_apply_to_new_connections,
            a_small_verbatim_answer_that_is_not_json_falls_back_to_the_next_backend,
            a_streamed_answer_that_is_not_json_is_never_complete,
            a_large_streamed_answer_passes_whole,
            a_client_that_sends_its_head_slowly_is_cut_at_the_header_timeout,
            a_client_that_stops_reading_is_cut_at_the_send_timeout,
            request_smuggling_shapes_are_refused_and_never_reach_a_backend,
            bad_input_is_refused_locally_with_a_clear_status,
            a_status_past_599_is_a_failed_backend,
            a_backends_content_type_is_never_relayed,
            an_unreadable_tls_file_is_refused_at_start_for_http_backends_too,
            an_owner_whose_answer_is_not_json_is_logged,
            the_metrics_listener_refuses_ambiguous_framing,
            a_merge_over_its_memory_budget_is_refused_while_it_reads_and_gives_its_bytes_back,
            a_streamed_history_merge_past_its_memory_budget_is_cut_off_and_gives_its_bytes_back,
        );
    };
    (@each $binary:expr; $($case:ident),* $(,)?) => {
        $(
            #[test]
            fn $case() {
                $crate::cases::$case(&$crate::support::binary($binary));
            }
        )*
    };
}
