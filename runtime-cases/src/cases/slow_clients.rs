//! Slow clients: one that dribbles its request head is cut at `client_header_timeout`, one that
//! stops reading at `client_send_timeout` (whatever the answer: streamed, sealed from the cache,
//! merged), one that reads slowly is never cut, and none of them holds up a normal client.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::thread;
use std::time::{Duration, Instant};

use super::{chunked, End};
use crate::support::{closed_by_server, respond, tcp_sockets, FakeBackend, Pdbmux};

/// The state of pdbmux's side of each connection to it, by the client's port (`/proc/net/tcp`'s
/// hex code: 01 is established).
fn server_side_states(pdbmux: &Pdbmux) -> HashMap<u16, String> {
    tcp_sockets()
        .into_iter()
        .filter(|socket| socket.local_port == pdbmux.addr.port())
        .map(|socket| (socket.remote_port, socket.state))
        .collect()
}

/// Whether pdbmux still holds the connection from `client` open (its side ESTABLISHED).
fn held_open(states: &HashMap<u16, String>, client: &TcpStream) -> bool {
    let port = client.local_addr().unwrap().port();
    states.get(&port).map(String::as_str) == Some("01")
}

/// Waits (up to 20 s) until the answer's first byte can be read from `stream`, reading none.
fn first_byte(stream: &TcpStream) {
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    assert_eq!(stream.peek(&mut [0u8; 1]).unwrap(), 1, "no answer");
}

/// How long until pdbmux no longer holds the connection from `client` open (its side left
/// ESTABLISHED), polled every 50 ms up to `limit`.
fn until_server_lets_go(pdbmux: &Pdbmux, client: &TcpStream, limit: Duration) -> Duration {
    let started = Instant::now();
    while held_open(&server_side_states(pdbmux), client) {
        assert!(
            started.elapsed() < limit,
            "pdbmux still holds the connection after {limit:?}"
        );
        thread::sleep(Duration::from_millis(50));
    }
    started.elapsed()
}

/// About `bytes` bytes of records, as a JSON array.
fn records(bytes: usize) -> String {
    let record = |i: usize| {
        format!(
            r#"{{"certname":"n{i}.example","name":"motd","value":"{}","environment":"production"}}"#,
            "x".repeat(900)
        )
    };
    let records: Vec<String> = (0..bytes / 1000).map(record).collect();
    format!("[{}]", records.join(","))
}

pub fn a_client_that_sends_its_head_slowly_is_cut_at_the_header_timeout(bin: &Path) {
    let backend = FakeBackend::start(|_| respond("200 OK", "application/json", "[]"));
    let pdbmux = Pdbmux::start(
        bin,
        &[
            ("PDBMUX_BACKENDS", format!("a={}", backend.url())),
            ("PDBMUX_CLIENT_HEADER_TIMEOUT", "2s".into()),
            ("PDBMUX_LOG_LEVEL", "warn".into()),
        ],
    );
    // 200 clients send a head one byte every 250 ms; it would take them minutes. Each one's
    // timeout starts when pdbmux accepts it, after `started`.
    let started = Instant::now();
    let mut slow: Vec<TcpStream> = (0..200)
        .map(|_| {
            let stream = TcpStream::connect(pdbmux.addr).unwrap();
            stream.set_nodelay(true).unwrap();
            stream
        })
        .collect();
    let head = b"GET /pdb/query/v4/environments/production HTTP/1.1\r\nHost: x\r\nX-Padding: ";
    let mut served = 0;
    let mut cut = vec![None; slow.len()];
    let mut sent = 0;
    while cut.iter().any(Option::is_none) {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{} slow clients still connected after 10 s",
            cut.iter().filter(|c| c.is_none()).count()
        );
        for (stream, cut) in slow.iter_mut().zip(cut.iter_mut()) {
            let byte = head.get(sent).copied().unwrap_or(b'x');
            if cut.is_none() && (closed_by_server(stream) || stream.write_all(&[byte]).is_err()) {
                *cut = Some(started.elapsed());
            }
        }
        sent += 1;
        // Meanwhile a normal client is answered at once.
        let asked = Instant::now();
        let response = pdbmux.get("/pdb/query/v4/environments/production");
        assert_eq!(response.status(), 200, "{}", response.text);
        assert!(
            asked.elapsed() < Duration::from_secs(1),
            "a normal client waited {:?}",
            asked.elapsed()
        );
        served += 1;
        thread::sleep(Duration::from_millis(250));
    }
    let earliest = cut.iter().flatten().min().unwrap();
    assert!(
        *earliest >= Duration::from_millis(1500),
        "a slow client was cut before the header timeout: {earliest:?}"
    );
    assert!(
        served >= 4,
        "{served} normal requests while the slow clients waited"
    );
}

pub fn a_client_that_stops_reading_is_cut_at_the_send_timeout(bin: &Path) {
    let body = records(24 << 20);
    let streamed = body.clone();
    let backend = FakeBackend::start(move |line| {
        if line.contains("environments/production") {
            // Chunked, as PuppetDB streams: pdbmux streams it on.
            chunked(&streamed, End::Terminated)
        } else if line.contains("/facts") {
            respond("200 OK", "application/json", &streamed)
        } else {
            respond("200 OK", "application/json", "[]")
        }
    });
    for (name, target, ttl) in [
        (
            "a streamed pass-through answer",
            "/pdb/query/v4/environments/production",
            "0s",
        ),
        ("a merged answer, not cached", "/pdb/query/v4/facts", "0s"),
        (
            "a large answer from the cache (sealed)",
            "/pdb/query/v4/facts",
            "30s",
        ),
    ] {
        let pdbmux = Pdbmux::start(
            bin,
            &[
                ("PDBMUX_BACKENDS", format!("a={}", backend.url())),
                ("PDBMUX_CLIENT_SEND_TIMEOUT", "2s".into()),
                ("PDBMUX_FACTS_TTL", ttl.into()),
                ("PDBMUX_LOG_LEVEL", "warn".into()),
            ],
        );
        if ttl != "0s" {
            let warm = pdbmux.get(target);
            assert_eq!(warm.status(), 200);
        }
        let mut client = TcpStream::connect(pdbmux.addr).unwrap();
        client
            .write_all(format!("GET {target} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
            .unwrap();
        // Never read: pdbmux fills the socket buffers, then waits for the send timeout. Timed
        // from the answer's first byte, after whatever planning and merging took.
        first_byte(&client);
        let held = until_server_lets_go(&pdbmux, &client, Duration::from_secs(20));
        // Once, not twice: a write the kernel takes at the deadline must not start another.
        assert!(
            held >= Duration::from_millis(1500) && held < Duration::from_millis(3600),
            "{name}: a client that stopped reading was let go after {held:?}, not about 2 s"
        );
        // A client that keeps reading is never cut, though its answer takes longer than the
        // timeout: 64 KiB every 50 ms frees the third of a socket buffer the kernel waits for
        // before it wakes a writer well within 2 s.
        let mut slow = TcpStream::connect(pdbmux.addr).unwrap();
        slow.write_all(format!("GET {target} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
            .unwrap();
        first_byte(&slow);
        slow.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
        let mut buffer = vec![0u8; 64 * 1024];
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(3) {
            let n = slow.read(&mut buffer).unwrap();
            assert!(
                n > 0,
                "{name}: a slow reader was cut after {:?}",
                started.elapsed()
            );
            thread::sleep(Duration::from_millis(50));
        }
        assert!(held_open(&server_side_states(&pdbmux), &slow), "{name}");
    }
}
