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

use pdbmux_driver::{MergedBody, StreamFailure, StreamedBody};

use crate::runtime::Tokio;
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
/// continue or to end as one value ([`StreamedBody`]: the driver's `check`, which writes the
/// request's access line when the body ends).
pub fn streamed(body: HeldBody, check: StreamedBody, deadline: Instant) -> ResponseBody {
    Deadlined {
        inner: body,
        sleep: Box::pin(tokio::time::sleep_until(deadline.into())),
        body: check,
        trailers: None,
    }
    .boxed()
}

/// The next piece of a held body a streamed merge reads (trailers are skipped: a merged
/// answer has none of its own).
pub fn poll_piece(
    mut held: Pin<&mut HeldBody>,
    cx: &mut Context<'_>,
) -> Poll<Option<Result<Bytes, String>>> {
    loop {
        return match held.as_mut().poll_frame(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Ready(Some(Err(error))) => Poll::Ready(Some(Err(error.to_string()))),
            Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                Ok(data) => Poll::Ready(Some(Ok(data))),
                Err(_) => continue,
            },
        };
    }
}

/// Streams a merge of held upstream bodies ([`MergedBody`]). Its failure, or `deadline` passing
/// first, ends the body with an error, so the client connection is aborted rather than sent a
/// truncated 200.
pub fn merged(body: MergedBody<Tokio>, deadline: Instant) -> ResponseBody {
    Merged {
        body,
        sleep: Box::pin(tokio::time::sleep_until(deadline.into())),
        ended: false,
    }
    .boxed()
}

struct Merged {
    body: MergedBody<Tokio>,
    sleep: Pin<Box<tokio::time::Sleep>>,
    ended: bool,
}

impl Body for Merged {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Polled {
        let this = &mut *self;
        if this.ended {
            return Poll::Ready(None);
        }
        match this.body.poll_next(cx) {
            Poll::Ready(Some(Ok(data))) => Poll::Ready(Some(Ok(Frame::data(data)))),
            Poll::Ready(Some(Err(failure))) => {
                this.ended = true;
                failed(failure)
            }
            Poll::Ready(None) => {
                this.ended = true;
                Poll::Ready(None)
            }
            Poll::Pending => match this.sleep.as_mut().poll(cx) {
                Poll::Ready(()) => {
                    this.ended = true;
                    failed(this.body.deadline_passed())
                }
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.ended
    }
}

struct Deadlined {
    inner: HeldBody,
    sleep: Pin<Box<tokio::time::Sleep>>,
    body: StreamedBody,
    /// The backend's trailers, sent after the last chunk.
    trailers: Option<HeaderMap>,
}

type Polled = Poll<Option<Result<Frame<Bytes>, BodyError>>>;

fn failed(failure: StreamFailure) -> Polled {
    Poll::Ready(Some(Err(Box::new(failure))))
}

impl Deadlined {
    /// The upstream body ended (its last frame, or its trailers): the check decides whether the
    /// held chunk goes out.
    fn end(&mut self) -> Polled {
        match self.body.end() {
            Ok(Some(data)) => Poll::Ready(Some(Ok(Frame::data(data)))),
            Ok(None) => self.rest(),
            Err(failure) => failed(failure),
        }
    }

    /// What follows the checked end: the trailers, if any.
    fn rest(&mut self) -> Polled {
        Poll::Ready(self.trailers.take().map(|t| Ok(Frame::trailers(t))))
    }
}

impl Body for Deadlined {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Polled {
        let this = &mut *self;
        if let Some(failure) = this.body.failure() {
            return failed(failure.clone());
        }
        if this.body.ended() {
            return this.rest();
        }
        while let Poll::Ready(frame) = Pin::new(&mut this.inner).poll_frame(cx) {
            match frame {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => match this.body.chunk(data) {
                        Ok(Some(ready)) => return Poll::Ready(Some(Ok(Frame::data(ready)))),
                        Ok(None) => {}
                        Err(failure) => return failed(failure),
                    },
                    // Trailers end the body: the held chunk goes first, if the body is JSON.
                    Err(frame) => {
                        this.trailers = frame.into_trailers().ok();
                        return this.end();
                    }
                },
                Some(Err(error)) => return failed(this.body.upstream_failed(&error)),
                None => return this.end(),
            }
        }
        match this.sleep.as_mut().poll(cx) {
            Poll::Ready(()) => failed(this.body.deadline_passed()),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        // Never the inner body's end: the held chunk is still to go.
        self.body.ended() && self.trailers.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        // The same bytes go out: what the backend has still to send, and the held chunk.
        let inner = self.inner.size_hint();
        let held = self.body.held_len() as u64;
        let mut hint = SizeHint::new();
        hint.set_lower(inner.lower() + held);
        if let Some(upper) = inner.upper() {
            hint.set_upper(upper + held);
        }
        hint
    }
}
