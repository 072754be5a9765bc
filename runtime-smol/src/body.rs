//! Upstream bodies: read within `max_body_bytes` (whole, or held and streamed to the client), with
//! the connection returned to its pool at a clean end; and the deadline on a streamed body.

use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Instant;

use bytes::{Buf, Bytes};
use pdbmux_core::UpstreamFailure;
use pdbmux_driver::budget::BodyBudget;
use pdbmux_driver::upstream::BodyLimit;
use pdbmux_driver::{MergedBody, StreamFailure, StreamedBody};
use smol::io::{AsyncBufRead, AsyncRead, AsyncReadExt};
use smol::Timer;

use crate::pool::Lease;
use crate::runtime::Smol;

/// The body went over `max_body_bytes`; carried inside an `io::Error`.
#[derive(Debug, thiserror::Error)]
#[error("body over {limit} bytes")]
pub struct OverLimit {
    /// The configured limit.
    pub limit: u64,
}

/// An upstream answer's body, not yet read: async-h1's decoded body (Content-Length or chunked),
/// bounded by the byte limit. At its end the connection goes back to the pool; dropped before
/// then, the connection is closed.
pub struct HeldBody {
    body: Option<http_types::Body>,
    lease: Option<Lease>,
    read: u64,
    limit: u64,
    length: Option<u64>,
    /// Where a streamed merge's reads land ([`poll_piece`]), made at the first.
    scratch: Option<Box<[u8]>>,
}

impl HeldBody {
    /// Wraps a decoded body of `length` bytes if the backend declared it.
    pub fn new(body: http_types::Body, lease: Lease, limit: u64, length: Option<u64>) -> HeldBody {
        HeldBody {
            body: Some(body),
            lease: Some(lease),
            read: 0,
            limit,
            length,
            scratch: None,
        }
    }

    /// The length the backend declared (Content-Length), if any.
    pub fn length(&self) -> Option<u64> {
        self.length
    }

    /// Reads the whole body, each chunk counted in `budget` as it is read; going over `limit`
    /// or the budget, or the connection failing, is the call's failure.
    pub async fn read_all(
        mut self,
        limit: BodyLimit,
        budget: &BodyBudget,
    ) -> Result<Bytes, UpstreamFailure> {
        let count = budget.body(self.length)?;
        let capacity = self.length.unwrap_or(0).min(self.limit);
        let mut bytes = Vec::with_capacity(usize::try_from(capacity).unwrap_or(0));
        let mut chunk = vec![0; READ_SIZE];
        loop {
            let read = self.read(&mut chunk).await.map_err(|error| {
                let over = error.get_ref().is_some_and(|inner| inner.is::<OverLimit>());
                limit.read_failure(over, &error)
            })?;
            if read == 0 {
                return Ok(bytes.into());
            }
            count.chunk(read)?;
            bytes.extend_from_slice(&chunk[..read]);
        }
    }

    fn finish(&mut self) {
        // The decoder holds a handle on the connection: drop it before the pool can hand the
        // connection to anyone else.
        self.body = None;
        if let Some(lease) = self.lease.take() {
            lease.release();
        }
    }
}

impl AsyncRead for HeldBody {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut [u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let Some(body) = this.body.as_mut() else {
            return Poll::Ready(Ok(0));
        };
        // One byte past the limit is enough to know the body is over it.
        let room =
            usize::try_from((this.limit - this.read).saturating_add(1)).unwrap_or(usize::MAX);
        let wanted = buf.len().min(room);
        let n = match ready!(Pin::new(body).poll_read(cx, &mut buf[..wanted])) {
            Ok(n) => n,
            Err(error) => {
                this.body = None;
                this.lease = None;
                return Poll::Ready(Err(error));
            }
        };
        if n == 0 {
            if this.length.is_some_and(|length| this.read < length) {
                this.body = None;
                this.lease = None;
                return Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "connection closed before the end of the body",
                )));
            }
            this.finish();
            return Poll::Ready(Ok(0));
        }
        this.read += n as u64;
        if this.read > this.limit {
            this.body = None;
            this.lease = None;
            return Poll::Ready(Err(io::Error::other(OverLimit { limit: this.limit })));
        }
        if this.length == Some(this.read) {
            // Complete: release the connection now, as a reader bounded by the same length (the
            // client response's body) never asks again.
            this.finish();
        }
        Poll::Ready(Ok(n))
    }
}

/// Streams a held body to the client until its end; going over the byte limit, past `deadline`
/// or a body that is not JSON is an error, so the client connection is aborted rather than sent
/// a truncated or broken 200. The JSON check holds back the latest chunk until the body is known
/// to continue or to end as one value ([`StreamedBody`]).
pub struct Deadlined {
    inner: HeldBody,
    timer: Timer,
    body: StreamedBody,
    /// Read from `inner`, not yet checked.
    scratch: Box<[u8]>,
    /// Checked, not yet handed out.
    ready: Bytes,
}

/// How much of a streamed body is read from the backend at a time.
const READ_SIZE: usize = 16 * 1024;

/// How much of a held body a streamed merge reads at a time: each piece costs a parse resumed at
/// its start, so pieces as large as a socket's buffer.
const MERGE_READ_SIZE: usize = 64 * 1024;

impl Deadlined {
    /// Bounds `inner` by `deadline`; every piece goes through `check` (the driver's, which
    /// writes the request's access line when the body ends).
    pub fn new(inner: HeldBody, check: StreamedBody, deadline: Instant) -> Deadlined {
        Deadlined {
            inner,
            timer: Timer::at(deadline),
            body: check,
            scratch: vec![0; READ_SIZE].into_boxed_slice(),
            ready: Bytes::new(),
        }
    }

    /// Reads and checks the next piece of the upstream body into `ready`.
    fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.ready.is_empty() && !self.body.ended() {
            if let Some(failure) = self.body.failure() {
                return Poll::Ready(Err(io_error(failure)));
            }
            if let Poll::Ready(result) = Pin::new(&mut self.inner).poll_read(cx, &mut self.scratch)
            {
                let checked = match result {
                    Ok(0) => self.body.end(),
                    Ok(n) => self.body.chunk(Bytes::copy_from_slice(&self.scratch[..n])),
                    Err(error) => Err(self.body.upstream_failed(&error)),
                };
                match checked {
                    Ok(ready) => self.ready = ready.unwrap_or_default(),
                    Err(failure) => return Poll::Ready(Err(io_error(&failure))),
                }
                continue;
            }
            return match std::future::Future::poll(Pin::new(&mut self.timer), cx) {
                Poll::Ready(_) => Poll::Ready(Err(io_error(&self.body.deadline_passed()))),
                Poll::Pending => Poll::Pending,
            };
        }
        Poll::Ready(Ok(()))
    }
}

/// The next piece of a held body a streamed merge reads.
pub fn poll_piece(
    held: Pin<&mut HeldBody>,
    cx: &mut Context<'_>,
) -> Poll<Option<Result<Bytes, String>>> {
    let this = held.get_mut();
    let mut scratch = this
        .scratch
        .take()
        .unwrap_or_else(|| vec![0; MERGE_READ_SIZE].into_boxed_slice());
    let piece = match Pin::new(&mut *this).poll_read(cx, &mut scratch) {
        Poll::Pending => Poll::Pending,
        Poll::Ready(Ok(0)) => Poll::Ready(None),
        Poll::Ready(Ok(n)) => Poll::Ready(Some(Ok(Bytes::copy_from_slice(&scratch[..n])))),
        Poll::Ready(Err(error)) => Poll::Ready(Some(Err(error.to_string()))),
    };
    this.scratch = Some(scratch);
    piece
}

/// A streamed merge of held bodies as the encoder reads it ([`MergedBody`]): its failure, or
/// `deadline` passing first, is an error, so the client connection is aborted rather than sent
/// a truncated 200.
pub struct MergedReader {
    body: MergedBody<Smol>,
    timer: Timer,
    /// Written by the merge, not yet handed out.
    ready: Bytes,
    ended: bool,
}

impl MergedReader {
    /// Bounds `body` by `deadline`.
    pub fn new(body: MergedBody<Smol>, deadline: Instant) -> MergedReader {
        MergedReader {
            body,
            timer: Timer::at(deadline),
            ready: Bytes::new(),
            ended: false,
        }
    }

    /// Polls the merge for its next bytes into `ready`.
    fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.ready.is_empty() && !self.ended {
            match self.body.poll_next(cx) {
                Poll::Ready(Some(Ok(bytes))) => self.ready = bytes,
                Poll::Ready(None) => self.ended = true,
                Poll::Ready(Some(Err(failure))) => {
                    self.ended = true;
                    return Poll::Ready(Err(io_error(&failure)));
                }
                Poll::Pending => {
                    return match std::future::Future::poll(Pin::new(&mut self.timer), cx) {
                        Poll::Ready(_) => {
                            self.ended = true;
                            Poll::Ready(Err(io_error(&self.body.deadline_passed())))
                        }
                        Poll::Pending => Poll::Pending,
                    }
                }
            }
        }
        Poll::Ready(Ok(()))
    }
}

impl AsyncBufRead for MergedReader {
    fn poll_fill_buf(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<&[u8]>> {
        let this = self.get_mut();
        ready!(this.poll_next(cx))?;
        Poll::Ready(Ok(&this.ready))
    }

    fn consume(self: Pin<&mut Self>, amt: usize) {
        self.get_mut().ready.advance(amt);
    }
}

impl AsyncRead for MergedReader {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut [u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        ready!(this.poll_next(cx))?;
        let n = this.ready.len().min(buf.len());
        buf[..n].copy_from_slice(&this.ready[..n]);
        this.ready.advance(n);
        Poll::Ready(Ok(n))
    }
}

/// A failed streamed body as the encoder reads it.
fn io_error(failure: &StreamFailure) -> io::Error {
    let kind = match failure {
        StreamFailure::NotJson(_) => io::ErrorKind::InvalidData,
        StreamFailure::Upstream(_) | StreamFailure::OverBudget(_) => io::ErrorKind::Other,
        StreamFailure::DeadlinePassed => io::ErrorKind::TimedOut,
    };
    io::Error::new(kind, failure.clone())
}

impl AsyncBufRead for Deadlined {
    fn poll_fill_buf(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<&[u8]>> {
        let this = self.get_mut();
        ready!(this.poll_next(cx))?;
        Poll::Ready(Ok(&this.ready))
    }

    fn consume(self: Pin<&mut Self>, amt: usize) {
        self.get_mut().ready.advance(amt);
    }
}

impl AsyncRead for Deadlined {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut [u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        ready!(this.poll_next(cx))?;
        let n = this.ready.len().min(buf.len());
        buf[..n].copy_from_slice(&this.ready[..n]);
        this.ready.advance(n);
        Poll::Ready(Ok(n))
    }
}
