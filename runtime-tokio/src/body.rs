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

use crate::upstream::HeldBody;

/// The error type of response bodies; an error aborts the client connection mid-body.
pub type BodyError = Box<dyn std::error::Error + Send + Sync>;

/// The body type every response uses.
pub type ResponseBody = BoxBody<Bytes, BodyError>;

/// A whole body.
pub fn full(bytes: Bytes) -> ResponseBody {
    Full::new(bytes).map_err(|never| match never {}).boxed()
}

/// Streams a held upstream body. Going over `max_body_bytes` or past `deadline` ends the body
/// with an error, so the client connection is aborted rather than sent a truncated 200.
pub fn streamed(body: HeldBody, deadline: Instant) -> ResponseBody {
    Deadlined {
        inner: body,
        sleep: Box::pin(tokio::time::sleep_until(deadline.into())),
    }
    .boxed()
}

struct Deadlined {
    inner: HeldBody,
    sleep: Pin<Box<tokio::time::Sleep>>,
}

#[derive(Debug, thiserror::Error)]
#[error("upstream body not complete before the deadline")]
struct DeadlinePassed;

impl Body for Deadlined {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        if let Poll::Ready(frame) = Pin::new(&mut self.inner).poll_frame(cx) {
            return Poll::Ready(frame);
        }
        match self.sleep.as_mut().poll(cx) {
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
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
