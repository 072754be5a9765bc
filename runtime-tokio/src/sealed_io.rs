//! The client connection's byte stream: a tokio `TcpStream` that sends sealed cache bodies by
//! reference, through a pipe it borrows while the pipe holds bytes ([`SealedSender`]).
//!
//! hyper's HTTP/1 writer queues a response body's `Bytes` as they are (no copy into its own
//! buffer) when the IO says it writes vectored, and hands them to `poll_write_vectored` behind
//! the head. Each slice is looked up with [`pdbmux_sealed::find`]: one that lies in a sealed
//! mapping (a large cached body, see `pdbmux_sealed`) is handed to the kernel with `vmsplice`
//! and `splice`, so its bytes reach the socket without being copied out of user memory;
//! anything before it (the head) is written first with `MSG_MORE` and that count returned, so
//! that hyper's next call starts at the sealed slice. A short send returns its count; hyper
//! advances and calls again with the rest of the slice, which is still inside the mapping.
//! Bytes the socket could not take yet wait in the pipe, and the call that took them reports
//! them to hyper only once the pipe is empty (it answers `Pending` until then, and hyper calls
//! again with the same slice): hyper must not take a response as written while part of it is
//! in a pipe that would be closed with the connection. Slices not in a sealed mapping go
//! through the plain vectored write.
//!
//! Writes are bounded by a send timeout: when the client has taken no bytes for that long while
//! a write waits, the write fails with `TimedOut` and hyper drops the connection (nginx's
//! `send_timeout`), so that a client that stops reading cannot hold its connection, buffers and
//! pipe for ever. A client that takes bytes within every timeout is never cut.

use std::future::Future;
use std::io::{self, IoSlice};
use std::os::fd::{AsFd, BorrowedFd};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use pdbmux_driver::SentBytes;
use pdbmux_sealed::{Sealed, SealedSender};
use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::Sleep;

/// What a connection sent which way: logged at debug when it ends, and read by tests.
#[derive(Debug, Default)]
pub struct WriteCounts {
    /// Bytes of sealed bodies sent (by reference through a pipe, or copied from the mapping
    /// when no usable pipe could be had).
    pub sealed_bytes: AtomicU64,
    /// Times the socket was full while sealed bytes were still in the pipe.
    pub pipe_waits: AtomicU64,
    /// Bytes written from user memory (heads, small and unsealed bodies).
    pub written_bytes: AtomicU64,
    /// Every connection's bytes sent, in pdbmux's metrics (when they are served).
    total: Option<SentBytes>,
}

impl WriteCounts {
    fn written(&self, bytes: usize) {
        self.written_bytes
            .fetch_add(bytes as u64, Ordering::Relaxed);
        if let Some(total) = &self.total {
            total.add(bytes as u64);
        }
    }

    fn sealed(&self, bytes: usize) {
        self.sealed_bytes.fetch_add(bytes as u64, Ordering::Relaxed);
        if let Some(total) = &self.total {
            total.add(bytes as u64);
        }
    }
}

/// A client connection's stream; see the module docs.
#[derive(Debug)]
pub struct SealedIo {
    stream: TcpStream,
    sender: SealedSender,
    /// A sealed send that took bytes the pipe still holds: the address its slice starts at (only
    /// compared with the next call's) and the count to report once the pipe is empty.
    unreported: Option<(usize, usize)>,
    send_timeout: Duration,
    /// Armed when a write starts waiting for the client, disarmed when one completes.
    stall: Option<Pin<Box<Sleep>>>,
    stalled: bool,
    counts: Arc<WriteCounts>,
}

/// Runs a non-blocking call on `stream`'s socket once it is writable, until it does not block.
fn poll_socket<T>(
    stream: &TcpStream,
    cx: &mut Context<'_>,
    mut call: impl FnMut(BorrowedFd<'_>) -> io::Result<T>,
) -> Poll<io::Result<T>> {
    loop {
        ready!(stream.poll_write_ready(cx))?;
        // try_io clears the readiness on WouldBlock, so the next poll_write_ready registers
        // this task's waker instead of spinning.
        match stream.try_io(Interest::WRITABLE, || call(stream.as_fd())) {
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => continue,
            result => return Poll::Ready(result),
        }
    }
}

impl SealedIo {
    /// Wraps an accepted connection whose writes may each wait `send_timeout` for the client;
    /// what it sends is also added to `total` (pdbmux's metrics) when given.
    pub fn new(stream: TcpStream, send_timeout: Duration, total: Option<SentBytes>) -> SealedIo {
        SealedIo {
            stream,
            sender: SealedSender::new(),
            unreported: None,
            send_timeout,
            stall: None,
            stalled: false,
            counts: Arc::new(WriteCounts {
                total,
                ..WriteCounts::default()
            }),
        }
    }

    /// Bytes handed to the socket so far (written, or spliced out of the pipe).
    fn sent(&self) -> u64 {
        let handed = self.counts.written_bytes.load(Ordering::Relaxed)
            + self.counts.sealed_bytes.load(Ordering::Relaxed);
        handed.saturating_sub(self.sender.pending() as u64)
    }

    /// `poll` as it is, except that a write left waiting while the client takes no bytes (none
    /// handed to the socket since `sent_before`, nor since the wait began) for the send timeout
    /// becomes a `TimedOut` error.
    fn bounded<T>(
        &mut self,
        cx: &mut Context<'_>,
        sent_before: u64,
        poll: Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        if poll.is_ready() {
            self.stalled = false;
            return poll;
        }
        let deadline = tokio::time::Instant::now() + self.send_timeout;
        let restart = !self.stalled || self.sent() != sent_before;
        self.stalled = true;
        let stall = self
            .stall
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        if restart {
            stall.as_mut().reset(deadline);
        }
        ready!(stall.as_mut().poll(cx));
        Poll::Ready(Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("the client took no bytes for {:?}", self.send_timeout),
        )))
    }

    /// This connection's counters (shared: they keep counting after the stream moves into hyper;
    /// the listener logs them at debug when the connection ends).
    pub fn counts(&self) -> Arc<WriteCounts> {
        Arc::clone(&self.counts)
    }

    /// Sends what a sealed body left in the pipe; ready once the pipe is empty.
    fn poll_pending(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.sender.pending() == 0 {
            return Poll::Ready(Ok(()));
        }
        let SealedIo {
            stream,
            sender,
            counts,
            ..
        } = self;
        poll_socket(stream, cx, |socket| {
            let flushed = sender.flush(socket);
            if matches!(&flushed, Err(error) if error.kind() == io::ErrorKind::WouldBlock) {
                counts.pipe_waits.fetch_add(1, Ordering::Relaxed);
            }
            flushed
        })
    }

    /// Sends the start of a sealed slice that begins at address `at`; the count is reported
    /// once none of it is left in the pipe.
    fn poll_sealed(
        &mut self,
        cx: &mut Context<'_>,
        sealed: Sealed<'_>,
        at: usize,
    ) -> Poll<io::Result<usize>> {
        ready!(self.poll_pending(cx))?;
        let SealedIo { stream, sender, .. } = self;
        let taken = ready!(poll_socket(stream, cx, |socket| sender.send(socket, sealed)))?;
        self.counts.sealed(taken);
        self.unreported = Some((at, taken));
        self.poll_unreported(cx, at)
    }

    /// Reports the sealed send that took bytes from the slice at `at`, once the pipe is empty;
    /// an error when hyper writes anything else first (its bytes would follow the pipe's).
    fn poll_unreported(&mut self, cx: &mut Context<'_>, at: usize) -> Poll<io::Result<usize>> {
        let Some((from, taken)) = self.unreported else {
            return Poll::Ready(Err(io::Error::other("no sealed send to report")));
        };
        if from != at {
            return Poll::Ready(Err(io::Error::other(
                "a sealed send was not resumed with the same bytes",
            )));
        }
        ready!(self.poll_pending(cx))?;
        self.unreported = None;
        Poll::Ready(Ok(taken))
    }

    fn poll_plain(
        &mut self,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        ready!(self.poll_pending(cx))?;
        let written = ready!(Pin::new(&mut self.stream).poll_write_vectored(cx, bufs))?;
        self.counts.written(written);
        Poll::Ready(Ok(written))
    }
}

impl AsyncRead for SealedIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for SealedIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.poll_write_vectored(cx, &[IoSlice::new(buf)])
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let before = self.sent();
        let written = self.poll_write_unbounded(cx, bufs);
        self.bounded(cx, before, written)
    }

    fn is_write_vectored(&self) -> bool {
        // hyper then queues body `Bytes` instead of copying them into its own buffer, so a
        // sealed body reaches poll_write_vectored as a slice of its mapping.
        true
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let before = self.sent();
        let flushed = self.poll_pending(cx);
        self.bounded(cx, before, flushed)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let before = self.sent();
        let flushed = self.poll_pending(cx);
        ready!(self.bounded(cx, before, flushed))?;
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

impl SealedIo {
    /// A vectored write as the module docs describe it, without the send timeout.
    fn poll_write_unbounded(
        &mut self,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        if self.unreported.is_some() {
            let at = bufs.first().map_or(0, |buf| buf.as_ptr() as usize);
            return self.poll_unreported(cx, at);
        }
        let Some((index, sealed)) = bufs
            .iter()
            .enumerate()
            .find_map(|(index, buf)| Some((index, pdbmux_sealed::find(buf)?)))
        else {
            return self.poll_plain(cx, bufs);
        };
        if index == 0 {
            let at = bufs[0].as_ptr() as usize;
            return self.poll_sealed(cx, sealed, at);
        }
        // The head (and anything else) before the sealed slice: written on its own, held back
        // by MSG_MORE to leave with the body's first segment.
        ready!(self.poll_pending(cx))?;
        let before = &bufs[..index];
        let written = ready!(poll_socket(&self.stream, cx, |socket| {
            pdbmux_sealed::send_head(socket, before)
        }))?;
        self.counts.written(written);
        Poll::Ready(Ok(written))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::convert::Infallible;
    use std::io::{Read, Write};
    use std::net::SocketAddr;
    use std::time::Duration;

    use bytes::Bytes;
    use http_body_util::Full;
    use hyper::service::service_fn;
    use hyper_util::rt::TokioIo;
    use tokio::net::{TcpListener, TcpSocket};

    use super::*;

    fn pattern(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 31 % 253) as u8).collect()
    }

    /// A listener whose accepted sockets inherit a small send buffer, so that one send cannot
    /// take a whole large body.
    fn small_buffer_listener() -> TcpListener {
        let socket = TcpSocket::new_v4().unwrap();
        socket.set_send_buffer_size(16 * 1024).unwrap();
        socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        socket.listen(8).unwrap()
    }

    /// Serves one connection with hyper over [`SealedIo`], answering every request with `body`;
    /// returns the connection's counters once it is closed.
    async fn serve_one(listener: TcpListener, body: Bytes) -> Arc<WriteCounts> {
        let (stream, _) = listener.accept().await.unwrap();
        let io = SealedIo::new(stream, Duration::from_secs(60), None);
        let counts = io.counts();
        let service = service_fn(move |_request| {
            let body = body.clone();
            async move { Ok::<_, Infallible>(hyper::Response::new(Full::new(body))) }
        });
        hyper::server::conn::http1::Builder::new()
            .serve_connection(TokioIo::new(io), service)
            .await
            .unwrap();
        counts
    }

    /// A slow blocking client: asks `requests` times on one connection (the last asks to
    /// close), reads everything with small reads and pauses, and returns each answer's body.
    fn slow_client(addr: SocketAddr, requests: usize, body_len: usize) -> Vec<Vec<u8>> {
        let mut stream = std::net::TcpStream::connect(addr).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        let mut bodies = Vec::new();
        for n in 0..requests {
            let close = if n + 1 == requests {
                "Connection: close\r\n"
            } else {
                ""
            };
            write!(stream, "GET / HTTP/1.1\r\nHost: x\r\n{close}\r\n").unwrap();
            let mut seen = Vec::new();
            let mut chunk = [0u8; 4096];
            let head_end = loop {
                if let Some(at) = seen.windows(4).position(|w| w == b"\r\n\r\n") {
                    break at + 4;
                }
                let read = stream.read(&mut chunk).unwrap();
                assert!(read > 0, "closed inside the head");
                seen.extend_from_slice(&chunk[..read]);
            };
            let head = String::from_utf8_lossy(&seen[..head_end]).to_lowercase();
            assert!(head.starts_with("http/1.1 200"), "{head}");
            assert!(
                head.contains(&format!("content-length: {body_len}\r\n")),
                "{head}"
            );
            let mut reads = 0;
            while seen.len() < head_end + body_len {
                let read = stream.read(&mut chunk).unwrap();
                assert!(read > 0, "closed inside the body");
                seen.extend_from_slice(&chunk[..read]);
                reads += 1;
                if reads % 16 == 0 {
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
            assert_eq!(seen.len(), head_end + body_len, "nothing past the body");
            bodies.push(seen.split_off(head_end));
        }
        let mut rest = Vec::new();
        stream.read_to_end(&mut rest).unwrap();
        assert!(rest.is_empty(), "the server closes after the last answer");
        bodies
    }

    #[tokio::test]
    async fn a_sealed_body_goes_out_through_the_pipe_in_short_pieces_and_arrives_whole() {
        let original = pattern(600 * 1024 + 3);
        let body = pdbmux_sealed::Sealer::new(u64::MAX).seal(Bytes::from(original.clone()));
        assert!(pdbmux_sealed::find(&body).is_some(), "the body is sealed");
        let listener = small_buffer_listener();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(serve_one(listener, body));
        let len = original.len();
        let bodies = tokio::task::spawn_blocking(move || slow_client(addr, 2, len))
            .await
            .unwrap();
        let counts = server.await.unwrap();
        assert_eq!(bodies.len(), 2);
        for received in bodies {
            assert!(received == original, "the received body differs");
        }
        assert_eq!(
            counts.sealed_bytes.load(Ordering::Relaxed),
            2 * len as u64,
            "every body byte through the pipe"
        );
        let waits = counts.pipe_waits.load(Ordering::Relaxed);
        assert!(waits > 2, "a full socket was waited for ({waits} times)");
        let written = counts.written_bytes.load(Ordering::Relaxed);
        assert!(
            written > 0 && written < 1024,
            "only the heads written: {written}"
        );
    }

    #[tokio::test]
    async fn a_sealed_write_is_reported_only_once_the_pipe_is_empty() {
        let original = pattern(600 * 1024);
        let body = pdbmux_sealed::Sealer::new(u64::MAX).seal(Bytes::from(original.clone()));
        let listener = small_buffer_listener();
        let mut client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (stream, _) = listener.accept().await.unwrap();
        let mut io = SealedIo::new(stream, Duration::from_secs(60), None);
        let mut write = |buf: &[u8]| {
            let waker = std::task::Waker::noop();
            let mut cx = Context::from_waker(waker);
            Pin::new(&mut io).poll_write(&mut cx, buf)
        };
        // Nobody reads yet: the socket takes its buffer's worth, the pipe holds the rest, and
        // the write is not reported.
        assert!(write(&body).is_pending());
        assert!(
            matches!(write(&body[1..]), Poll::Ready(Err(_))),
            "other bytes may not overtake the pipe's"
        );
        let reader = std::thread::spawn(move || {
            let mut received = Vec::new();
            client.read_to_end(&mut received).unwrap();
            received
        });
        let taken = std::future::poll_fn(|cx| Pin::new(&mut io).poll_write(cx, &body))
            .await
            .unwrap();
        assert!(taken > 0 && taken <= original.len());
        assert_eq!(io.sender.pending(), 0, "reported once the pipe is empty");
        drop(io);
        let received = reader.join().unwrap();
        assert!(
            received == original[..taken],
            "the bytes reported are the bytes sent"
        );
    }

    #[tokio::test]
    async fn a_client_that_takes_no_bytes_is_timed_out_and_a_slow_one_is_not() {
        use tokio::io::AsyncWriteExt;
        let timeout = Duration::from_millis(300);
        let listener = small_buffer_listener();
        let addr = listener.local_addr().unwrap();

        // Never reads: the buffers fill, then the write fails once it has waited `timeout`.
        let _silent = std::net::TcpStream::connect(addr).unwrap();
        let (stream, _) = listener.accept().await.unwrap();
        let mut io = SealedIo::new(stream, timeout, None);
        let chunk = vec![7u8; 64 * 1024];
        let started = std::time::Instant::now();
        let error = loop {
            if let Err(error) = io.write(&chunk).await {
                break error;
            }
        };
        let waited = started.elapsed();
        assert_eq!(error.kind(), io::ErrorKind::TimedOut, "{error}");
        assert!(
            waited >= timeout && waited < timeout + Duration::from_secs(5),
            "{waited:?}"
        );

        // Reads 16 KiB every 5 ms: 1 MiB takes longer than the timeout in all, but no write
        // waits that long (on loopback the window opens in steps of up to 64 KiB), so it goes
        // through whole.
        let mut slow = std::net::TcpStream::connect(addr).unwrap();
        let (stream, _) = listener.accept().await.unwrap();
        let mut io = SealedIo::new(stream, timeout, None);
        let reader = std::thread::spawn(move || {
            let mut received = Vec::new();
            let mut buf = [0u8; 16 * 1024];
            while received.len() < 1024 * 1024 {
                let read = slow.read(&mut buf).unwrap();
                assert!(read > 0, "closed early");
                received.extend_from_slice(&buf[..read]);
                std::thread::sleep(Duration::from_millis(5));
            }
            received
        });
        let body = pattern(1024 * 1024);
        let started = std::time::Instant::now();
        io.write_all(&body).await.expect("a slow reader is served");
        io.flush().await.unwrap();
        assert!(reader.join().unwrap() == body);
        assert!(
            started.elapsed() > timeout,
            "the whole took longer than one wait may"
        );
    }

    #[tokio::test]
    async fn an_unsealed_body_goes_through_the_plain_write() {
        let original = pattern(300 * 1024);
        // A sealed body elsewhere in the process: the lookup runs, and finds nothing for this one.
        let _sealed = pdbmux_sealed::Sealer::new(u64::MAX).seal(Bytes::from(pattern(300 * 1024)));
        let listener = small_buffer_listener();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(serve_one(listener, Bytes::from(original.clone())));
        let len = original.len();
        let bodies = tokio::task::spawn_blocking(move || slow_client(addr, 1, len))
            .await
            .unwrap();
        let counts = server.await.unwrap();
        assert!(bodies[0] == original, "the received body differs");
        assert_eq!(counts.sealed_bytes.load(Ordering::Relaxed), 0);
        assert!(counts.written_bytes.load(Ordering::Relaxed) > len as u64);
    }
}
