//! The body of a streamed merge (docs/merging.md, "Streamed merges"): the held upstream bodies
//! read at once, each piece fed to the core's [`MergeStream`] as it arrives, and what the merge
//! writes handed to the client. Both binaries wrap it in their own body type, with the deadline.

use std::marker::PhantomData;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use pdbmux_core::MergeStream;

use crate::metrics::StreamedMerges;
use crate::{Runtime, StreamFailure};

/// A streamed merge's body: poll it with [`MergedBody::poll_next`] and send each piece; an
/// error is given once, and means the answer cannot be completed: end the client's body so
/// that it does not parse (the connection aborted). Dropped early (the client left), it drops
/// the upstream bodies, closing their connections.
pub struct MergedBody<R: Runtime> {
    stream: Box<MergeStream>,
    /// Each input's held body, until its end.
    bodies: Vec<(usize, Option<R::Held>)>,
    /// The input polled first next time: the bodies take turns.
    next: usize,
    /// Ended: whole, or cut off.
    done: bool,
    /// The request it answers, for its log line, and where it counts how it ended.
    watch: Option<(String, Option<StreamedMerges>)>,
    runtime: PhantomData<fn() -> R>,
}

impl<R: Runtime> MergedBody<R> {
    /// The merge `stream` fed by `bodies` (each with its input, as [`MergeStream::bodies`]
    /// names them).
    pub fn new(stream: MergeStream, bodies: Vec<(usize, R::Held)>) -> MergedBody<R> {
        MergedBody {
            stream: Box::new(stream),
            bodies: bodies
                .into_iter()
                .map(|(input, body)| (input, Some(body)))
                .collect(),
            next: 0,
            done: false,
            watch: None,
            runtime: PhantomData,
        }
    }

    /// Names the request it answers (in its log line if it is cut off) and where it counts
    /// how it ends.
    pub(crate) fn watched(&mut self, request_id: &str, counts: Option<StreamedMerges>) {
        self.watch = Some((request_id.to_owned(), counts));
    }

    /// The next bytes of the answer: `Ready(None)` once it is whole.
    pub fn poll_next(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Bytes, StreamFailure>>> {
        if self.done {
            return Poll::Ready(None);
        }
        loop {
            let out = self.stream.take();
            if !out.is_empty() {
                return Poll::Ready(Some(Ok(out)));
            }
            if self.stream.is_finished() {
                self.done = true;
                self.count("complete");
                return Poll::Ready(None);
            }
            match self.read_one(cx) {
                Ok(true) => {}
                Ok(false) => return Poll::Pending,
                Err(failure) => return Poll::Ready(Some(Err(self.fail(failure)))),
            }
        }
    }

    /// Polls the bodies in turn until one gives something: `Ok(true)` when the merge was fed,
    /// `Ok(false)` when every body is waiting.
    fn read_one(&mut self, cx: &mut Context<'_>) -> Result<bool, StreamFailure> {
        let count = self.bodies.len();
        for turn in 0..count {
            let slot = (self.next + turn) % count;
            let (input, body) = &mut self.bodies[slot];
            let Some(held) = body.as_mut() else {
                continue;
            };
            // Left unread (its connection pushes back on the backend) while the merge holds
            // enough of it; another body is then wanted, and feeding it changes this.
            if !self.stream.wants(*input) {
                continue;
            }
            let fed = match R::poll_piece(Pin::new(held), cx) {
                Poll::Pending => continue,
                Poll::Ready(Some(Ok(piece))) => self.stream.push(*input, &piece),
                Poll::Ready(None) => {
                    *body = None;
                    self.stream.end(*input)
                }
                Poll::Ready(Some(Err(error))) => return Err(StreamFailure::Upstream(error)),
            };
            self.next = (slot + 1) % count;
            return fed
                .map(|()| true)
                .map_err(|broken| StreamFailure::Upstream(broken.to_string()));
        }
        if self.bodies.iter().all(|(_, body)| body.is_none()) {
            return Err(StreamFailure::Upstream(
                "every body ended before the merge did".to_owned(),
            ));
        }
        Ok(false)
    }

    /// The answer's deadline passed: the failure to end the body with.
    pub fn deadline_passed(&mut self) -> StreamFailure {
        self.fail(StreamFailure::DeadlinePassed)
    }

    fn fail(&mut self, failure: StreamFailure) -> StreamFailure {
        self.done = true;
        self.bodies.clear();
        let request_id = self.watch.as_ref().map_or("-", |(id, _)| id.as_str());
        tracing::warn!(request_id, "aborting a streamed merge: {failure}");
        self.count("cut_off");
        failure
    }

    fn count(&self, outcome: &'static str) {
        if let Some((_, Some(counts))) = &self.watch {
            counts.observe(outcome);
        }
    }
}

impl<R: Runtime> Drop for MergedBody<R> {
    fn drop(&mut self) {
        if !self.done {
            self.count("client_left");
        }
    }
}
