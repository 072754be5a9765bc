//! Response bodies: whole bytes, or a held upstream body streamed through to the client until its
//! end, its byte limit or its deadline.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::Bytes;
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
        ended: false,
    }
    .boxed()
}

struct Deadlined {
    inner: HeldBody,
    sleep: Pin<Box<tokio::time::Sleep>>,
    check: CheckedStream,
    ended: bool,
}

#[derive(Debug, thiserror::Error)]
#[error("upstream body not complete before the deadline")]
struct DeadlinePassed;

impl Deadlined {
    /// The checked form of what the upstream body gave: `None` to read on.
    fn checked(
        &mut self,
        frame: Option<Result<Frame<Bytes>, BodyError>>,
    ) -> Option<Option<Result<Frame<Bytes>, BodyError>>> {
        let checked = match frame {
            Some(Ok(frame)) => match frame.into_data() {
                Ok(data) => self.check.push(data),
                // Trailers pass as they are.
                Err(frame) => return Some(Some(Ok(frame))),
            },
            Some(Err(error)) => {
                tracing::warn!("aborting a streamed response: {error}");
                return Some(Some(Err(error)));
            }
            None => {
                self.ended = true;
                self.check.finish()
            }
        };
        match checked {
            Ok(Some(data)) => Some(Some(Ok(Frame::data(data)))),
            Ok(None) if self.ended => Some(None),
            Ok(None) => None,
            Err(not_json) => {
                tracing::warn!("aborting a streamed response: {not_json}");
                Some(Some(Err(Box::new(not_json))))
            }
        }
    }
}

impl Body for Deadlined {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = &mut *self;
        if this.ended {
            return Poll::Ready(None);
        }
        while let Poll::Ready(frame) = Pin::new(&mut this.inner).poll_frame(cx) {
            if let Some(checked) = this.checked(frame) {
                return Poll::Ready(checked);
            }
        }
        match this.sleep.as_mut().poll(cx) {
            Poll::Ready(()) => {
                tracing::warn!(
                    "aborting a streamed response: upstream body not complete before the deadline"
                );
                Poll::Ready(Some(Err(Box::new(DeadlinePassed))))
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        // Never the inner body's end: the held chunk is still to go.
        self.ended
    }

    fn size_hint(&self) -> SizeHint {
        // The same bytes go out, so the backend's length stays the client's.
        self.inner.size_hint()
    }
}
