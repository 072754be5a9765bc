//! Response bodies: whole bytes, or a held upstream body streamed through to the client until its
//! end, its byte limit or its deadline.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use http::HeaderMap;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::{Body, Frame, SizeHint};

use pdbmux_driver::CheckedStream;

use crate::upstream::HeldBody;

/// The error type of response bodies; an error aborts the client connection mid-body.
pub type BodyError = Box<dyn std::error::Error + Send + Sync>;

/// The body type every response uses.
pub type ResponseBody = BoxBody<Bytes, BodyError>;

/// A whole body.
pub fn full(bytes: Bytes) -> ResponseBody {
    Full::new(bytes).map_err(|never| match never {}).boxed()
}

/// Streams a held upstream body. Going over `max_body_bytes`, past `deadline` or a body that is
/// not JSON ends the body with an error, so the client connection is aborted rather than sent a
/// truncated or broken 200. The JSON check holds back the latest chunk until the body is known to
/// continue or to end as one value ([`CheckedStream`]).
pub fn streamed(body: HeldBody, deadline: Instant) -> ResponseBody {
    Deadlined {
        inner: body,
        sleep: Box::pin(tokio::time::sleep_until(deadline.into())),
        check: CheckedStream::new(),
        phase: Phase::Streaming,
        trailers: None,
    }
    .boxed()
}

struct Deadlined {
    inner: HeldBody,
    sleep: Pin<Box<tokio::time::Sleep>>,
    check: CheckedStream,
    phase: Phase,
    /// The backend's trailers, sent after the last chunk.
    trailers: Option<HeaderMap>,
}

/// Where a streamed body stands.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Phase {
    Streaming,
    /// Checked to its end: only the trailers (if any) are left to send.
    Ended,
    /// Failed; every later poll fails too, so nothing can complete it.
    Failed,
}

#[derive(Debug, thiserror::Error)]
#[error("upstream body not complete before the deadline")]
struct DeadlinePassed;

#[derive(Debug, thiserror::Error)]
#[error("the streamed body failed")]
struct AlreadyFailed;

type Polled = Poll<Option<Result<Frame<Bytes>, BodyError>>>;

impl Deadlined {
    /// The upstream body ended (its last frame, or its trailers): the check decides whether the
    /// held chunk goes out.
    fn end(&mut self) -> Polled {
        match self.check.finish() {
            Ok(last) => {
                self.phase = Phase::Ended;
                match last {
                    Some(data) => Poll::Ready(Some(Ok(Frame::data(data)))),
                    None => Poll::Ready(self.trailers.take().map(|t| Ok(Frame::trailers(t)))),
                }
            }
            Err(not_json) => self.fail(Box::new(not_json)),
        }
    }

    fn fail(&mut self, error: BodyError) -> Polled {
        tracing::warn!("aborting a streamed response: {error}");
        self.phase = Phase::Failed;
        Poll::Ready(Some(Err(error)))
    }
}

impl Body for Deadlined {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Polled {
        let this = &mut *self;
        match this.phase {
            Phase::Failed => return Poll::Ready(Some(Err(Box::new(AlreadyFailed)))),
            Phase::Ended => {
                return Poll::Ready(this.trailers.take().map(|t| Ok(Frame::trailers(t))))
            }
            Phase::Streaming => {}
        }
        while let Poll::Ready(frame) = Pin::new(&mut this.inner).poll_frame(cx) {
            match frame {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => match this.check.push(data) {
                        Ok(Some(ready)) => return Poll::Ready(Some(Ok(Frame::data(ready)))),
                        Ok(None) => {}
                        Err(not_json) => return this.fail(Box::new(not_json)),
                    },
                    // Trailers end the body: the held chunk goes first, if the body is JSON.
                    Err(frame) => {
                        this.trailers = frame.into_trailers().ok();
                        return this.end();
                    }
                },
                Some(Err(error)) => return this.fail(error),
                None => return this.end(),
            }
        }
        match this.sleep.as_mut().poll(cx) {
            Poll::Ready(()) => this.fail(Box::new(DeadlinePassed)),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        // Never the inner body's end: the held chunk is still to go.
        self.phase == Phase::Ended && self.trailers.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        // The same bytes go out: what the backend has still to send, and the held chunk.
        let inner = self.inner.size_hint();
        let held = self.check.held_len() as u64;
        let mut hint = SizeHint::new();
        hint.set_lower(inner.lower() + held);
        if let Some(upper) = inner.upper() {
            hint.set_upper(upper + held);
        }
        hint
    }
}
