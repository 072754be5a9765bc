//! Test support: scripted raw-TCP backends and a pdbmux process on loopback.
//!
//! Shared by both runtimes' `tests/runtime.rs`: the binary under test is a parameter, see
//! [`binary`].

#![allow(dead_code, missing_docs, clippy::unwrap_used)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

/// A backend that answers every request with the bytes a script returns for its request line.
pub struct FakeBackend {
    pub addr: SocketAddr,
    pub requests: Arc<Mutex<Vec<String>>>,
    pub connections_opened: Arc<AtomicUsize>,
    pub connections_closed: Arc<AtomicUsize>,
}

/// The binary under test: `RUNTIME_TEST_BIN` when set (to run one crate's cases against the
/// other runtime's binary), else `default` (the crate's own, `env!("CARGO_BIN_EXE_...")`).
pub fn binary(default: &str) -> PathBuf {
    std::env::var_os("RUNTIME_TEST_BIN").map_or_else(|| PathBuf::from(default), PathBuf::from)
}

/// What the fake writes back: raw bytes, with optional pauses between pieces, or a close.
#[derive(Clone)]
pub enum Piece {
    Bytes(Vec<u8>),
    Pause(Duration),
    /// Close the connection here.
    Close,
}

impl FakeBackend {
    pub fn start(script: impl Fn(&str) -> Vec<Piece> + Send + Sync + 'static) -> FakeBackend {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let opened = Arc::new(AtomicUsize::new(0));
        let closed = Arc::new(AtomicUsize::new(0));
        let script = Arc::new(script);
        let (log, opened_count, closed_count) = (requests.clone(), opened.clone(), closed.clone());
        thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                opened_count.fetch_add(1, Ordering::SeqCst);
                let (script, log, closed_count) =
                    (script.clone(), log.clone(), closed_count.clone());
                thread::spawn(move || serve(stream, &*script, &log, &closed_count));
            }
        });
        FakeBackend {
            addr,
            requests,
            connections_opened: opened,
            connections_closed: closed,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn request_lines(&self) -> Vec<String> {
        self.requests.lock().unwrap().clone()
    }
}

fn serve(
    stream: TcpStream,
    script: &dyn Fn(&str) -> Vec<Piece>,
    log: &Mutex<Vec<String>>,
    closed: &AtomicUsize,
) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut writer = stream;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            closed.fetch_add(1, Ordering::SeqCst);
            return;
        }
        loop {
            let mut header = String::new();
            if reader.read_line(&mut header).unwrap_or(0) == 0 || header == "\r\n" {
                break;
            }
        }
        let line = line.trim_end().to_owned();
        log.lock().unwrap().push(line.clone());
        for piece in script(&line) {
            match piece {
                Piece::Bytes(bytes) => {
                    if writer.write_all(&bytes).is_err() {
                        closed.fetch_add(1, Ordering::SeqCst);
                        return;
                    }
                    let _ = writer.flush();
                }
                Piece::Pause(duration) => thread::sleep(duration),
                Piece::Close => {
                    closed.fetch_add(1, Ordering::SeqCst);
                    return;
                }
            }
        }
    }
}

/// A complete response with a Content-Length.
pub fn respond(status: &str, content_type: &str, body: &str) -> Vec<Piece> {
    vec![Piece::Bytes(
        format!(
            "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .into_bytes(),
    )]
}

/// A client thread that GETs `target` from `addr` (one connection each) until `stop`, asserting
/// every answer is a 200, with `pause` between requests; joins to the number answered.
pub fn keep_getting(
    addr: SocketAddr,
    target: &'static str,
    stop: Arc<std::sync::atomic::AtomicBool>,
    pause: Duration,
) -> thread::JoinHandle<usize> {
    thread::spawn(move || {
        let mut answered = 0;
        while !stop.load(Ordering::SeqCst) {
            let response = Pdbmux::raw_at(
                addr,
                &format!("GET {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"),
            );
            assert_eq!(
                response.status(),
                200,
                "{} {:?}",
                response.text,
                response.read_error
            );
            answered += 1;
            thread::sleep(pause);
        }
        answered
    })
}

/// A running pdbmux; killed on drop.
pub struct Pdbmux {
    pub child: Child,
    pub addr: SocketAddr,
    home: tempfile::TempDir,
}

impl Pdbmux {
    /// Starts `binary` (see [`binary`]) on a free loopback port with `env`. The port is found
    /// free and then given to pdbmux: another process can take it in between (a client's
    /// ephemeral port), so a start refused with "Address already in use" is tried again on
    /// another port; any other exit before listening fails with pdbmux's own words.
    pub fn start(binary: &std::path::Path, env: &[(&str, String)]) -> Pdbmux {
        for _attempt in 0..3 {
            let port = TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port();
            let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
            let home = tempfile::tempdir().unwrap();
            let mut command = Command::new(binary);
            command
                .env_clear()
                .env("HOME", home.path())
                .env("PDBMUX_LISTEN", addr.to_string())
                .env("PDBMUX_HEALTH_PROBE_ENABLED", "false")
                .env("PDBMUX_METRICS_LISTEN", "")
                .env("PDBMUX_LOG_LEVEL", "debug")
                .stdout(Stdio::null())
                .stderr(Stdio::piped());
            for (key, value) in env {
                command.env(key, value);
            }
            let mut pdbmux = Pdbmux {
                child: command.spawn().unwrap(),
                addr,
                home,
            };
            // Generous: a debug build on a loaded 2-core machine starts slowly.
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                let exited = pdbmux.child.try_wait().ok().flatten();
                match exited {
                    None if TcpStream::connect(addr).is_ok() => return pdbmux,
                    None => {}
                    Some(status) => {
                        let log = pdbmux.stderr();
                        if log.contains("Address already in use") {
                            break;
                        }
                        panic!("pdbmux exited ({status}) before listening on {addr}:\n{log}");
                    }
                }
                assert!(
                    Instant::now() < deadline,
                    "pdbmux did not start listening on {addr} within 30 s"
                );
                thread::sleep(Duration::from_millis(20));
            }
        }
        panic!("pdbmux found each of three free ports taken before it could listen")
    }

    /// Sends raw request bytes and reads until the server closes the connection.
    pub fn raw(&self, request: &str) -> RawResponse {
        Pdbmux::raw_at(self.addr, request)
    }

    /// Sends `request` as given, byte for byte (not UTF-8 necessarily), and reads until the
    /// server closes the connection.
    pub fn raw_bytes(&self, request: &[u8]) -> RawResponse {
        Pdbmux::raw_bytes_at(self.addr, request)
    }

    /// Sends raw request bytes to `addr` and reads until the server closes the connection.
    pub fn raw_at(addr: SocketAddr, request: &str) -> RawResponse {
        Pdbmux::raw_bytes_at(addr, request.as_bytes())
    }

    fn raw_bytes_at(addr: SocketAddr, request: &[u8]) -> RawResponse {
        let mut stream = TcpStream::connect(addr).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        stream.write_all(request).unwrap();
        let mut bytes = Vec::new();
        let result = stream.read_to_end(&mut bytes);
        RawResponse {
            text: String::from_utf8_lossy(&bytes).into_owned(),
            read_error: result.err().map(|e| e.to_string()),
        }
    }

    /// A GET with `Connection: close`.
    pub fn get(&self, target: &str) -> RawResponse {
        self.raw(&format!(
            "GET {target} HTTP/1.1\r\nHost: pdbmux\r\nConnection: close\r\n\r\n"
        ))
    }

    /// Sends SIGTERM.
    pub fn terminate(&self) {
        let status = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status()
            .unwrap();
        assert!(status.success());
    }

    /// Sends the signal `name` (`HUP`, `TERM`, …).
    pub fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .arg(format!("-{name}"))
            .arg(self.child.id().to_string())
            .status()
            .unwrap();
        assert!(status.success());
    }

    /// Waits for the process to exit, at most `limit`; returns its exit code.
    pub fn wait_exit(&mut self, limit: Duration) -> Option<i32> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.code();
            }
            if Instant::now() > deadline {
                return None;
            }
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// Everything the process wrote to stderr (kills it first).
    pub fn stderr(&mut self) -> String {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let mut text = String::new();
        if let Some(mut stderr) = self.child.stderr.take() {
            let _ = stderr.read_to_string(&mut text);
        }
        text
    }
}

/// The access line of the request for `target` in a pdbmux log (see [`Pdbmux::stderr`]).
pub fn access_line<'a>(log: &'a str, target: &str) -> &'a str {
    let field = format!(" target={target} ");
    log.lines()
        .find(|line| line.contains("pdbmux::access") && line.contains(&field))
        .unwrap_or_else(|| panic!("no access line for {target} in:\n{log}"))
}

impl Drop for Pdbmux {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A raw HTTP response as read off the socket.
pub struct RawResponse {
    pub text: String,
    pub read_error: Option<String>,
}

impl RawResponse {
    pub fn status(&self) -> u16 {
        self.text
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0)
    }

    pub fn header(&self, name: &str) -> Option<String> {
        let head = self.text.split("\r\n\r\n").next()?;
        head.lines().skip(1).find_map(|line| {
            let (key, value) = line.split_once(':')?;
            key.trim()
                .eq_ignore_ascii_case(name)
                .then(|| value.trim().to_owned())
        })
    }

    pub fn body(&self) -> &str {
        self.text
            .split_once("\r\n\r\n")
            .map_or("", |(_, body)| body)
    }
}

/// One IPv4 TCP socket of this machine, from `/proc/net/tcp`.
pub struct TcpSocket {
    pub local_port: u16,
    pub remote_port: u16,
    /// The kernel's state code in hex: `01` established, `08` CLOSE-WAIT.
    pub state: String,
}

/// Every IPv4 TCP socket of this machine (`/proc/net/tcp`; empty where there is none).
pub fn tcp_sockets() -> Vec<TcpSocket> {
    let port_of = |addr: &str| {
        addr.rsplit(':')
            .next()
            .and_then(|hex| u16::from_str_radix(hex, 16).ok())
    };
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            Some(TcpSocket {
                local_port: port_of(fields.get(1)?)?,
                remote_port: port_of(fields.get(2)?)?,
                state: (*fields.get(3)?).to_owned(),
            })
        })
        .collect()
}

/// Whether the server has closed `stream`, looked at without waiting: a read sees its end or a
/// reset, or an answer it sent before closing.
pub fn closed_by_server(mut stream: &TcpStream) -> bool {
    stream.set_nonblocking(true).unwrap();
    let closed = match stream.read(&mut [0u8; 512]) {
        // Its end (0), or an answer before it.
        Ok(_read) => true,
        Err(error) => error.kind() != std::io::ErrorKind::WouldBlock,
    };
    stream.set_nonblocking(false).unwrap();
    closed
}
