//! A TCP proxy inside the test process, in front of one backend: it lets a test make a real
//! PuppetDB hang or go away without touching the PuppetDB itself (the other tests keep using it).
//!
//! Modes ([`ProxyMode`]):
//! - `Forward`: bytes are copied both ways, as if pdbmux talked to the backend directly;
//! - `Hang`: connections are accepted and requests read, but nothing is ever answered; a
//!   connection that was forwarding when the proxy started hanging freezes too (pdbmux keeps
//!   pooled connections, so a hang must reach them);
//! - `Fail`: each connection's request head is read and recorded
//!   ([`Proxy::failed_requests`], [`Proxy::failed_heads`]) and the connection closed without an answer: a transport failure
//!   that still shows which requests were sent;
//! - `Closed`: the listening socket is closed, so connections are refused (a stopped server);
//!   the port stays bound to a socket that does not listen, so no other listener (another
//!   proxy, a pdbmux's metrics port) can be given it meanwhile and answer in the stopped
//!   server's place;
//! - `Unavailable`: every request is answered `503 Service Unavailable`, as a PuppetDB that is
//!   up but not serving (starting, or its database gone) answers;
//! - `Faulty`: each new connection has one fault in its answers drawn at random ([`Fault`]): cut
//!   off, stalled, or one byte garbled to NUL, at a random offset in its first 64 KiB (or none).
//!
//! Leaving `Forward` for `Fail` or `Closed`, and returning to `Forward`, closes every open
//! connection, so no stale pooled connection survives a change.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crate::Error;

/// What the proxy does with connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProxyMode {
    /// Copy bytes both ways.
    Forward,
    /// Accept and read, never answer.
    Hang,
    /// Read the request head, record its request line, close without answering.
    Fail,
    /// Not listening: connections are refused.
    Closed,
    /// Every request answered 503.
    Unavailable,
    /// Forward, with a random fault per connection (the fault soak).
    Faulty,
}

/// What `Faulty` does to one connection's answers, at a byte offset of what the backend sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Nothing: forwarded.
    None,
    /// The connection is closed after this many bytes.
    Truncate(usize),
    /// Nothing more is forwarded after this many bytes (the backend hangs mid-answer).
    Stall(usize),
    /// The byte at this offset becomes NUL, which no JSON text and no HTTP head may hold.
    Garble(usize),
}

/// How many connections got each fault, in [`Fault`]'s order: none, truncate, stall, garble.
pub type FaultCounts = [usize; 4];

/// How often blocked sockets wake up to look at the mode.
const TICK: Duration = Duration::from_millis(20);

#[derive(Debug)]
struct Shared {
    mode: Mutex<ProxyMode>,
    /// Bumped on every mode change: a pump started under an older generation stops forwarding.
    generation: AtomicU64,
    stop: AtomicBool,
    /// Every open socket (both ends of each connection), to close them on a mode change.
    sockets: Mutex<Vec<TcpStream>>,
    /// Request heads seen in `Fail` mode (request line and header fields).
    failed: Mutex<Vec<String>>,
    /// Connections accepted so far.
    accepted: AtomicUsize,
    /// The state of the fault draw (xorshift64).
    draw: AtomicU64,
    /// Faults drawn so far, by kind.
    faults: Mutex<FaultCounts>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Shared {
    fn mode(&self) -> ProxyMode {
        *lock(&self.mode)
    }

    /// The next fault: one connection in ten is forwarded whole; the others are cut off,
    /// stalled or garbled somewhere in their first 64 KiB, so pooled connections keep dying
    /// (and pdbmux keeps opening new ones) while most answers on them still get through.
    fn draw_fault(&self) -> Fault {
        let mut x = self.draw.load(Ordering::SeqCst);
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.draw.store(x, Ordering::SeqCst);
        let offset = usize::try_from((x >> 8) % 65_536).unwrap_or(0);
        let mut counts = lock(&self.faults);
        // Every kind once first, in turn, then at random: a soak that opens few connections (a
        // pooled client reuses the ones that live) still sees each kind, rather than missing
        // the rare one by chance (with 18 connections, no "none" in 15% of runs).
        let drawn = counts.iter().sum::<usize>();
        let kind = match drawn {
            0..=3 => drawn,
            _ => match x % 10 {
                0 => 0,
                1..=4 => 1,
                5..=6 => 2,
                _ => 3,
            },
        };
        counts[kind] += 1;
        match kind {
            0 => Fault::None,
            1 => Fault::Truncate(offset),
            2 => Fault::Stall(offset),
            _ => Fault::Garble(offset),
        }
    }

    fn register(&self, stream: &TcpStream) {
        if let Ok(clone) = stream.try_clone() {
            lock(&self.sockets).push(clone);
        }
    }

    fn close_all(&self) {
        for s in lock(&self.sockets).drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
    }
}

/// A proxy on a loopback port in front of `upstream`; stopped (every socket closed) on drop.
#[derive(Debug)]
pub struct Proxy {
    addr: SocketAddr,
    upstream: SocketAddr,
    shared: Arc<Shared>,
    accept: Option<JoinHandle<()>>,
}

impl Proxy {
    /// Starts a proxy in `Forward` mode in front of `upstream_url` (`http://host:port`).
    pub fn start(upstream_url: &str) -> Result<Self, Error> {
        let hostport = upstream_url
            .strip_prefix("http://")
            .unwrap_or(upstream_url)
            .trim_end_matches('/');
        let upstream: SocketAddr = hostport.parse().map_err(|e| Error::BadEnv {
            name: "proxy upstream",
            reason: format!("{upstream_url:?} is not http://<ip>:<port>: {e}"),
        })?;
        let listener = TcpListener::bind("127.0.0.1:0").map_err(|source| Error::Io {
            what: "bind the proxy".to_owned(),
            source,
        })?;
        let addr = listener.local_addr().map_err(|source| Error::Io {
            what: "the proxy's address".to_owned(),
            source,
        })?;
        listener.set_nonblocking(true).map_err(|source| Error::Io {
            what: "make the proxy's listener non-blocking".to_owned(),
            source,
        })?;
        let shared = Arc::new(Shared {
            mode: Mutex::new(ProxyMode::Forward),
            generation: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            sockets: Mutex::new(Vec::new()),
            failed: Mutex::new(Vec::new()),
            accepted: AtomicUsize::new(0),
            draw: AtomicU64::new(0x9e37_79b9_7f4a_7c15 ^ u64::from(addr.port())),
            faults: Mutex::new([0; 4]),
        });
        let accept = {
            let shared = Arc::clone(&shared);
            thread::Builder::new()
                .name(format!("proxy-{}", addr.port()))
                .spawn(move || accept_loop(listener, addr, upstream, &shared))
                .map_err(|source| Error::Io {
                    what: "spawn the proxy thread".to_owned(),
                    source,
                })?
        };
        Ok(Self {
            addr,
            upstream,
            shared,
            accept: Some(accept),
        })
    }

    /// `http://127.0.0.1:<port>`: the URL to give pdbmux instead of the backend's.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The proxy's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The backend it forwards to.
    pub fn upstream(&self) -> SocketAddr {
        self.upstream
    }

    /// The current mode.
    pub fn mode(&self) -> ProxyMode {
        self.shared.mode()
    }

    /// Switches the mode (see the module documentation for what happens to open connections).
    /// Returns once the listener is in the new state (closed or listening again).
    pub fn set_mode(&self, mode: ProxyMode) {
        {
            let mut current = lock(&self.shared.mode);
            *current = mode;
            self.shared.generation.fetch_add(1, Ordering::SeqCst);
        }
        if mode != ProxyMode::Hang {
            self.shared.close_all();
        }
        // The accept loop applies Closed / re-listen within a tick; wait until it has.
        let deadline = Instant::now() + Duration::from_secs(2);
        while Instant::now() < deadline {
            let refused = TcpStream::connect_timeout(&self.addr, Duration::from_millis(200))
                .map(|s| {
                    let _ = s.shutdown(Shutdown::Both);
                })
                .is_err();
            if refused == (mode == ProxyMode::Closed) {
                break;
            }
            thread::sleep(TICK);
        }
    }

    /// Request lines received in `Fail` mode so far.
    pub fn failed_requests(&self) -> Vec<String> {
        lock(&self.shared.failed)
            .iter()
            .map(|head| head.split("\r\n").next().unwrap_or_default().to_owned())
            .collect()
    }

    /// Whole request heads (request line and header fields, CRLF-separated) received in `Fail`
    /// mode so far: what pdbmux sent a backend, headers included.
    pub fn failed_heads(&self) -> Vec<String> {
        lock(&self.shared.failed).clone()
    }

    /// How many connections got each fault in `Faulty` mode so far.
    pub fn faults(&self) -> FaultCounts {
        *lock(&self.shared.faults)
    }

    /// Connections accepted so far (every mode but `Closed`).
    pub fn accepted(&self) -> usize {
        self.shared.accepted.load(Ordering::SeqCst)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.shared.generation.fetch_add(1, Ordering::SeqCst);
        self.shared.close_all();
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
    }
}

fn accept_loop(
    listener: TcpListener,
    addr: SocketAddr,
    upstream: SocketAddr,
    shared: &Arc<Shared>,
) {
    let mut listener = Some(listener);
    // While closed: the port, bound but not listening.
    let mut reserved: Option<socket2::Socket> = None;
    while !shared.stop.load(Ordering::SeqCst) {
        let mode = shared.mode();
        if mode == ProxyMode::Closed {
            // Dropping the listener refuses new connections (and resets any in the backlog).
            if listener.take().is_some() || reserved.is_none() {
                reserved = reserve(addr).ok();
            }
            thread::sleep(TICK / 4);
            continue;
        }
        let Some(l) = listener.as_ref() else {
            // The reservation's socket listens in the listener's place (no moment unbound);
            // without one, std sets SO_REUSEADDR on Unix listeners, so the port can be bound
            // again.
            let relisten = match reserved.take() {
                Some(socket) => socket.listen(128).map(|()| TcpListener::from(socket)),
                None => TcpListener::bind(addr),
            };
            match relisten.and_then(|l| l.set_nonblocking(true).map(|()| l)) {
                Ok(l) => listener = Some(l),
                Err(_) => thread::sleep(TICK),
            }
            continue;
        };
        match l.accept() {
            Ok((client, _)) => {
                shared.accepted.fetch_add(1, Ordering::SeqCst);
                let _ = client.set_nonblocking(false);
                let _ = client.set_nodelay(true);
                handle(client, upstream, shared, mode);
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => thread::sleep(TICK / 4),
            Err(_) => thread::sleep(TICK),
        }
    }
}

/// The listener's port held while closed ([`crate::bound_not_listening`]); `SO_REUSEADDR` lets it
/// bind over connections of the closed listener in TIME_WAIT.
fn reserve(addr: SocketAddr) -> std::io::Result<socket2::Socket> {
    crate::bound_not_listening(addr, true)
}

fn handle(client: TcpStream, upstream: SocketAddr, shared: &Arc<Shared>, mode: ProxyMode) {
    match mode {
        ProxyMode::Closed => {}
        ProxyMode::Forward | ProxyMode::Faulty => {
            let Ok(server) = TcpStream::connect_timeout(&upstream, Duration::from_secs(2)) else {
                return; // the backend itself is down: the client sees the connection close
            };
            // Drawn (and counted) only for a connection that reaches the backend.
            let fault = if mode == ProxyMode::Faulty {
                shared.draw_fault()
            } else {
                Fault::None
            };
            let _ = server.set_nodelay(true);
            shared.register(&client);
            shared.register(&server);
            let generation = shared.generation.load(Ordering::SeqCst);
            // Requests go through untouched; answers get the connection's fault.
            for (from, to, fault) in [(&client, &server, Fault::None), (&server, &client, fault)] {
                let (Ok(from), Ok(to)) = (from.try_clone(), to.try_clone()) else {
                    return;
                };
                let shared = Arc::clone(shared);
                let _ = thread::Builder::new()
                    .name("proxy-pump".to_owned())
                    .spawn(move || pump(from, to, &shared, generation, fault));
            }
        }
        ProxyMode::Hang => {
            shared.register(&client);
            let shared = Arc::clone(shared);
            let _ = thread::Builder::new()
                .name("proxy-hang".to_owned())
                .spawn(move || discard(client, &shared));
        }
        ProxyMode::Fail => {
            let shared = Arc::clone(shared);
            let _ = thread::Builder::new()
                .name("proxy-fail".to_owned())
                .spawn(move || fail(client, &shared));
        }
        ProxyMode::Unavailable => {
            shared.register(&client);
            let _ = thread::Builder::new()
                .name("proxy-unavailable".to_owned())
                .spawn(move || unavailable(client));
        }
    }
}

/// Answers every request on the connection 503 until the client closes it (or the mode changes
/// and closes it); request bodies are not expected (pdbmux's GETs, and POSTs it never sends
/// here while unavailable would be read as heads and answered alike).
fn unavailable(mut client: TcpStream) {
    const ANSWER: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\nContent-Length: 25\r\n\r\nPuppetDB is unavailable.\n";
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match client.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
        while let Some(end) = head.windows(4).position(|w| w == b"\r\n\r\n") {
            head.drain(..end + 4);
            if client.write_all(ANSWER).is_err() {
                return;
            }
        }
    }
}

/// Copies `from` to `to` while the proxy is in the generation it started in; afterwards reads
/// and drops (a frozen connection), until either side closes. `fault` is applied on the way.
fn pump(mut from: TcpStream, mut to: TcpStream, shared: &Shared, generation: u64, fault: Fault) {
    let _ = from.set_read_timeout(Some(TICK));
    let mut buf = [0u8; 16 * 1024];
    // Bytes of `from` seen so far, for the fault's offset.
    let mut seen = 0usize;
    loop {
        if shared.stop.load(Ordering::SeqCst) {
            break;
        }
        match from.read(&mut buf) {
            Ok(0) => {
                let _ = to.shutdown(Shutdown::Write);
                return;
            }
            Ok(n) => {
                if shared.generation.load(Ordering::SeqCst) != generation {
                    continue; // frozen: swallow
                }
                let (start, end) = (seen, seen + n);
                seen = end;
                let mut send = n;
                match fault {
                    Fault::None => {}
                    Fault::Garble(at) if (start..end).contains(&at) => buf[at - start] = 0,
                    Fault::Garble(_) => {}
                    Fault::Truncate(at) | Fault::Stall(at) if at < start => send = 0,
                    Fault::Truncate(at) | Fault::Stall(at) => send = send.min(at - start),
                }
                if to.write_all(&buf[..send]).is_err() {
                    break;
                }
                if matches!(fault, Fault::Truncate(at) if end > at) {
                    break;
                }
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) => break,
        }
    }
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}

/// Reads and drops everything until the client or the proxy closes the connection.
fn discard(mut client: TcpStream, shared: &Shared) {
    let _ = client.set_read_timeout(Some(TICK));
    let mut buf = [0u8; 16 * 1024];
    while !shared.stop.load(Ordering::SeqCst) {
        match client.read(&mut buf) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) => break,
        }
    }
    let _ = client.shutdown(Shutdown::Both);
}

/// Reads the request head (up to 2 s), records it and closes.
fn fail(mut client: TcpStream, shared: &Shared) {
    let _ = client.set_read_timeout(Some(TICK));
    let deadline = Instant::now() + Duration::from_secs(2);
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    while Instant::now() < deadline && !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match client.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => head.extend_from_slice(&buf[..n]),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) => break,
        }
    }
    let text = String::from_utf8_lossy(&head);
    let head = text.split("\r\n\r\n").next().unwrap_or_default().to_owned();
    if !head.is_empty() {
        lock(&shared.failed).push(head);
    }
    let _ = client.shutdown(Shutdown::Both);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A one-shot HTTP server: answers every connection's first request with `body`.
    fn server(body: &'static str) -> (SocketAddr, JoinHandle<()>) {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = l.local_addr().expect("addr");
        let t = thread::spawn(move || {
            for mut s in l.incoming().flatten().take(3) {
                let mut buf = [0u8; 1024];
                let _ = s.read(&mut buf);
                let _ = write!(
                    s,
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
            }
        });
        (addr, t)
    }

    fn ask(addr: SocketAddr) -> std::io::Result<String> {
        let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(1))?;
        s.set_read_timeout(Some(Duration::from_millis(500)))?;
        s.write_all(b"GET /x HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n")?;
        let mut out = String::new();
        s.read_to_string(&mut out)?;
        Ok(out)
    }

    #[test]
    fn forwards_fails_closes_and_hangs() {
        let (up, _t) = server("hello");
        let proxy = Proxy::start(&format!("http://{up}")).expect("proxy");
        assert!(ask(proxy.addr()).expect("forwarded").ends_with("hello"));

        proxy.set_mode(ProxyMode::Fail);
        assert_eq!(ask(proxy.addr()).expect("closed without an answer"), "");
        assert_eq!(proxy.failed_requests(), vec!["GET /x HTTP/1.1".to_owned()]);

        proxy.set_mode(ProxyMode::Closed);
        assert!(TcpStream::connect_timeout(&proxy.addr(), Duration::from_millis(300)).is_err());

        proxy.set_mode(ProxyMode::Hang);
        let err = ask(proxy.addr()).expect_err("no answer within the read timeout");
        assert!(
            matches!(err.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut),
            "{err}"
        );

        proxy.set_mode(ProxyMode::Forward);
        assert!(ask(proxy.addr())
            .expect("forwarded again")
            .ends_with("hello"));
    }

    #[test]
    fn a_closed_proxy_keeps_its_port() {
        let (up, _t) = server("hello");
        let proxy = Proxy::start(&format!("http://{up}")).expect("proxy");
        proxy.set_mode(ProxyMode::Closed);
        // A socket that does not share addresses cannot bind the port while it is closed (the
        // reservation follows the listener's close within a tick).
        let bind_alone = || {
            let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
            socket.bind(&proxy.addr().into())
        };
        let deadline = Instant::now() + Duration::from_secs(1);
        while bind_alone().is_ok() {
            assert!(Instant::now() < deadline, "the closed proxy's port is free");
            thread::sleep(TICK / 4);
        }
        assert!(TcpStream::connect_timeout(&proxy.addr(), Duration::from_millis(300)).is_err());
        proxy.set_mode(ProxyMode::Forward);
        assert!(ask(proxy.addr())
            .expect("forwarded again")
            .ends_with("hello"));
    }
}
