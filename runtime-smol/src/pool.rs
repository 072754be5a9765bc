//! Upstream connections (plain TCP or TLS) and a small per-backend pool of idle keep-alive ones.
//!
//! A connection goes back to its pool only when its response body was read to a clean end
//! ([`Lease::release`]); one dropped mid-body is closed, so an abandoned request never leaves a
//! half-read connection for the next one.

use std::io;
use std::net::TcpStream;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures_rustls::client::TlsStream;
use futures_rustls::TlsConnector;
use rustls_pki_types::ServerName;
use smol::io::{AsyncRead, AsyncWrite};
use smol::Async;

/// The most idle connections kept per backend (as `pool_max_idle_per_host` in the tokio binary).
const MAX_IDLE: usize = 64;
/// How long an idle connection is kept: less than PuppetDB's Jetty closes an idle one after
/// (30 s by default), so that a request never goes out on a connection the backend is closing
/// at that moment ("connection closed before message completed"). As the tokio binary's.
const IDLE_TIMEOUT: Duration = Duration::from_secs(20);
/// How often idle connections are looked at ([`Pool::sweep`]), so that one the backend closed
/// does not sit in CLOSE-WAIT until the next request.
pub const SWEEP_INTERVAL: Duration = Duration::from_secs(2);

enum Io {
    Plain(Async<TcpStream>),
    Tls(Box<TlsStream<Async<TcpStream>>>),
}

impl Io {
    fn tcp(&self) -> &TcpStream {
        match self {
            Io::Plain(tcp) => tcp.get_ref(),
            Io::Tls(tls) => tls.get_ref().0.get_ref(),
        }
    }
}

/// One connection to a backend. Cloning shares it: async-h1's response decoder owns one handle
/// (inside the body it returns) while the pool logic keeps another to reuse the socket later.
#[derive(Clone)]
pub struct Conn(Arc<Mutex<Io>>);

impl Conn {
    fn io(&self) -> MutexGuard<'_, Io> {
        // Only one task uses a connection at a time; a poisoned lock means a panic mid-read, and
        // such a connection is never released to the pool.
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Whether an idle connection still looks usable: nothing to read and not closed. A backend
    /// that closed it (EOF), reset it, or sent anything unasked (a TLS close_notify) fails.
    fn is_idle_and_open(&self) -> bool {
        let mut byte = [0u8; 1];
        matches!(self.io().tcp().peek(&mut byte), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut [u8],
    ) -> Poll<io::Result<usize>> {
        match &mut *self.io() {
            Io::Plain(tcp) => Pin::new(tcp).poll_read(cx, buf),
            Io::Tls(tls) => Pin::new(&mut **tls).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match &mut *self.io() {
            Io::Plain(tcp) => Pin::new(tcp).poll_write(cx, buf),
            Io::Tls(tls) => Pin::new(&mut **tls).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut *self.io() {
            Io::Plain(tcp) => Pin::new(tcp).poll_flush(cx),
            Io::Tls(tls) => Pin::new(&mut **tls).poll_flush(cx),
        }
    }

    fn poll_close(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut *self.io() {
            Io::Plain(tcp) => Pin::new(tcp).poll_close(cx),
            Io::Tls(tls) => Pin::new(&mut **tls).poll_close(cx),
        }
    }
}

/// Where a backend's connections go: host and port, and TLS when the scheme is https.
pub struct Endpoint {
    /// Host name or IP literal (IPv6 without brackets).
    pub host: String,
    /// The port.
    pub port: u16,
    /// The TLS connector and the name to verify, for https.
    pub tls: Option<(TlsConnector, ServerName<'static>)>,
}

/// A backend's idle connections, most recently used last.
pub struct Pool {
    endpoint: Endpoint,
    idle: Mutex<Vec<(Conn, Instant)>>,
}

/// A connection checked out of a pool; [`Lease::release`] puts it back.
pub struct Lease {
    conn: Conn,
    pool: Arc<Pool>,
    /// Whether it came from the pool (a failure before any answer is then worth one retry).
    pub reused: bool,
    /// Whether the response allows reuse (HTTP/1.1 keep-alive, framed body); set by the caller.
    pub reusable: bool,
}

impl Lease {
    /// The connection (a shared handle).
    pub fn conn(&self) -> Conn {
        self.conn.clone()
    }

    /// The response was read to its end: keep the connection for the next request, if allowed.
    pub fn release(self) {
        if self.reusable {
            self.pool.put(self.conn);
        }
    }
}

impl Pool {
    /// An empty pool for `endpoint`.
    pub fn new(endpoint: Endpoint) -> Arc<Pool> {
        Arc::new(Pool {
            endpoint,
            idle: Mutex::new(Vec::new()),
        })
    }

    fn idle(&self) -> MutexGuard<'_, Vec<(Conn, Instant)>> {
        self.idle
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// An idle connection that still looks open, or a new one (`fresh` skips the idle ones).
    pub async fn checkout(self: &Arc<Self>, fresh: bool) -> io::Result<Lease> {
        if !fresh {
            let now = Instant::now();
            loop {
                let Some((conn, since)) = self.idle().pop() else {
                    break;
                };
                if now.duration_since(since) < IDLE_TIMEOUT && conn.is_idle_and_open() {
                    return Ok(self.lease(conn, true));
                }
            }
        }
        let conn = self.connect().await?;
        Ok(self.lease(conn, false))
    }

    fn lease(self: &Arc<Self>, conn: Conn, reused: bool) -> Lease {
        Lease {
            conn,
            pool: Arc::clone(self),
            reused,
            reusable: false,
        }
    }

    /// Closes the idle connections the backend closed (or reset, or sent anything on) and those
    /// idle past [`IDLE_TIMEOUT`]; run every [`SWEEP_INTERVAL`].
    pub fn sweep(&self) {
        let now = Instant::now();
        self.idle().retain(|(conn, since)| {
            now.duration_since(*since) < IDLE_TIMEOUT && conn.is_idle_and_open()
        });
    }

    fn put(&self, conn: Conn) {
        let mut idle = self.idle();
        if idle.len() >= MAX_IDLE {
            // Drop the oldest.
            idle.remove(0);
        }
        idle.push((conn, Instant::now()));
    }

    async fn connect(&self) -> io::Result<Conn> {
        let endpoint = &self.endpoint;
        let addrs = smol::net::resolve((endpoint.host.as_str(), endpoint.port)).await?;
        let mut last_error = io::Error::new(
            io::ErrorKind::NotFound,
            format!("{} resolves to no address", endpoint.host),
        );
        for addr in addrs {
            match Async::<TcpStream>::connect(addr).await {
                Ok(tcp) => {
                    let _ = tcp.get_ref().set_nodelay(true);
                    let io = match &endpoint.tls {
                        None => Io::Plain(tcp),
                        Some((connector, name)) => {
                            let tls = connector.connect(name.clone(), tcp).await?;
                            Io::Tls(Box::new(tls))
                        }
                    };
                    return Ok(Conn(Arc::new(Mutex::new(io))));
                }
                Err(error) => last_error = error,
            }
        }
        Err(last_error)
    }
}
