//! The tokio runtime against scripted raw-TCP backends: body limits while streaming, request
//! limits, graceful shutdown and cancellation.

#![allow(clippy::unwrap_used)]

mod support;

use std::sync::atomic::Ordering;
use std::thread;
use std::time::{Duration, Instant};

use support::{respond, FakeBackend, Pdbmux, Piece};

fn chunk(data: &[u8]) -> Vec<u8> {
    let mut out = format!("{:x}\r\n", data.len()).into_bytes();
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
    out
}

#[test]
fn a_streamed_body_over_the_limit_aborts_the_connection() {
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
    let pdbmux = Pdbmux::start(&[
        ("PDBMUX_BACKENDS", format!("a={}", backend.url())),
        ("PDBMUX_MAX_BODY_BYTES", "2000".into()),
    ]);
    let response = pdbmux.get("/pdb/query/v4/catalogs");
    assert_eq!(response.status(), 200, "{}", response.text);
    assert!(
        !response.text.ends_with("0\r\n\r\n"),
        "the client must not see a complete chunked body: {:?}",
        &response.text[response.text.len().saturating_sub(40)..]
    );
    assert!(response.body().len() < 5000);
}

#[test]
fn a_declared_length_over_the_limit_fails_that_backend_and_the_next_one_answers() {
    let big = FakeBackend::start(|_| respond("200 OK", "application/json", &" ".repeat(3000)));
    let small = FakeBackend::start(|_| respond("200 OK", "application/json", "[1]"));
    let pdbmux = Pdbmux::start(&[
        (
            "PDBMUX_BACKENDS",
            format!("a={},b={}", big.url(), small.url()),
        ),
        ("PDBMUX_MAX_BODY_BYTES", "2000".into()),
    ]);
    let response = pdbmux.get("/pdb/query/v4/catalogs");
    assert_eq!(response.status(), 200);
    assert_eq!(response.body(), "[1]");

    let alone = Pdbmux::start(&[
        ("PDBMUX_BACKENDS", format!("a={}", big.url())),
        ("PDBMUX_MAX_BODY_BYTES", "2000".into()),
    ]);
    let response = alone.get("/pdb/query/v4/catalogs");
    assert_eq!(response.status(), 502);
    assert!(
        response.body().contains("body over 2000 bytes"),
        "{}",
        response.body()
    );
}

#[test]
fn request_limits_are_enforced_before_any_backend_is_asked() {
    let backend = FakeBackend::start(|_| respond("200 OK", "application/json", "[]"));
    let pdbmux = Pdbmux::start(&[("PDBMUX_BACKENDS", format!("a={}", backend.url()))]);

    let long = format!("/pdb/query/v4/catalogs?query={}", "x".repeat(8200));
    assert_eq!(pdbmux.get(&long).status(), 414);

    let mut request = String::from(
        "GET /pdb/query/v4/catalogs HTTP/1.1\r\nHost: pdbmux\r\nConnection: close\r\n",
    );
    for i in 0..100 {
        request.push_str(&format!("X-Filler-{i}: 1\r\n"));
    }
    request.push_str("\r\n");
    assert_eq!(pdbmux.raw(&request).status(), 431);

    let big_header = format!(
        "GET /pdb/query/v4/catalogs HTTP/1.1\r\nHost: pdbmux\r\nConnection: close\r\nX-Big: {}\r\n\r\n",
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

#[test]
fn sigterm_lets_in_flight_requests_finish_then_exits_zero() {
    let backend = FakeBackend::start(|_| {
        let mut pieces = vec![Piece::Pause(Duration::from_millis(800))];
        pieces.extend(respond("200 OK", "application/json", "[\"slow\"]"));
        pieces
    });
    let mut pdbmux = Pdbmux::start(&[("PDBMUX_BACKENDS", format!("a={}", backend.url()))]);
    let addr = pdbmux.addr;
    let in_flight = thread::spawn(move || {
        Pdbmux::raw_at(
            addr,
            "GET /pdb/query/v4/catalogs HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
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

#[test]
fn a_client_that_leaves_releases_the_upstream_request() {
    let backend = FakeBackend::start(|_| {
        let mut pieces = vec![Piece::Pause(Duration::from_millis(1500))];
        pieces.extend(respond("200 OK", "application/json", "[]"));
        pieces
    });
    let pdbmux = Pdbmux::start(&[("PDBMUX_BACKENDS", format!("a={}", backend.url()))]);
    {
        use std::io::Write;
        let mut stream = std::net::TcpStream::connect(pdbmux.addr).unwrap();
        stream
            .write_all(b"GET /pdb/query/v4/catalogs HTTP/1.1\r\nHost: x\r\n\r\n")
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
    // The client is gone: pdbmux drops the upstream request, so the backend sees its connection
    // close as soon as it writes (or reads) again, well before a second request could reuse it.
    let started = Instant::now();
    while backend.connections_closed.load(Ordering::SeqCst) == 0 {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the upstream connection was not released"
        );
        thread::sleep(Duration::from_millis(20));
    }
}
