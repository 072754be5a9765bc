//! The body of a streamed merge (docs/merging.md, "Streamed merges"): the held upstream bodies
//! read at once, each piece fed to the core's [`MergeStream`] as it arrives, and what the merge
//! writes handed to the client; or, for a client of a cached flight, the pieces the flight's
//! task writes to each of its clients ([`SharedPiece`]). Both binaries wrap it in their own body
//! type, with the deadline.

use std::marker::PhantomData;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures_channel::mpsc;
use futures_util::StreamExt;
use pdbmux_core::MergeStream;

use crate::access::BodyWatch;
use crate::budget::BodyBudget;
use crate::metrics::StreamedMerges;
use crate::{Runtime, StreamFailure};

/// A streamed merge's body: poll it with [`MergedBody::poll_next`] and send each piece; an
/// error is given once, and means the answer cannot be completed: end the client's body so
/// that it does not parse (the connection aborted). Dropped early (the client left), it drops
/// the upstream bodies, closing their connections.
pub struct MergedBody<R: Runtime> {
    /// `None` once it failed: the held bodies (or the flight's channel) are let go.
    source: Option<Source<R>>,
    /// Ended: whole, or cut off.
    done: bool,
    /// The request's access line, written when the body ends.
    watch: BodyWatch,
    /// Where it counts how it ended.
    counts: Option<StreamedMerges>,
    /// The request a failure is logged under when no access line is watched (a flight's own
    /// merge, whose clients each have theirs).
    request_id: Option<String>,
    runtime: PhantomData<fn() -> R>,
}

/// Where a [`MergedBody`]'s bytes come from.
enum Source<R: Runtime> {
    /// The merge, fed by the held bodies.
    Merge {
        stream: Box<MergeStream>,
        /// Each input's held body, until its end.
        bodies: Vec<(usize, Option<R::Held>)>,
        /// The input polled first next time: the bodies take turns.
        next: usize,
        /// What the merge's own memory is counted in, and how much of it is taken.
        budget: (BodyBudget, usize),
    },
    /// A cached flight's merge, as its task writes it to each of its clients.
    Shared(mpsc::Receiver<SharedPiece>),
}

/// What a cached flight's task writes to each of its clients' [`MergedBody`].
#[derive(Debug, Clone)]
pub(crate) enum SharedPiece {
    /// The next bytes of the answer.
    Bytes(Bytes),
    /// The answer is whole.
    End,
    /// The answer cannot be completed, and why.
    Failed(String),
}

impl<R: Runtime> MergedBody<R> {
    /// The merge `stream` fed by `bodies` (each with its input, as [`MergeStream::bodies`]
    /// names them), the memory it holds as it grows ([`MergeStream::held_bytes`]) counted in
    /// `budget`.
    pub fn new(
        stream: MergeStream,
        bodies: Vec<(usize, R::Held)>,
        budget: BodyBudget,
    ) -> MergedBody<R> {
        MergedBody::of(Source::Merge {
            stream: Box::new(stream),
            bodies: bodies
                .into_iter()
                .map(|(input, body)| (input, Some(body)))
                .collect(),
            next: 0,
            budget: (budget, 0),
        })
    }

    /// A client's body of a cached flight's merge: the pieces its task sends to `pieces`. The
    /// task stopping before [`SharedPiece::End`] cuts the body off.
    pub(crate) fn shared(pieces: mpsc::Receiver<SharedPiece>) -> MergedBody<R> {
        MergedBody::of(Source::Shared(pieces))
    }

    fn of(source: Source<R>) -> MergedBody<R> {
        MergedBody {
            source: Some(source),
            done: false,
            watch: BodyWatch::default(),
            counts: None,
            request_id: None,
            runtime: PhantomData,
        }
    }

    /// Logs its failure, if any, under `request_id` (for a merge no client reads directly).
    pub(crate) fn failure_logged_under(&mut self, request_id: &str) {
        self.request_id = Some(request_id.to_owned());
    }

    /// Writes the request's access line (`watch`) when the body ends, and counts how it ended in
    /// `counts`.
    pub(crate) fn watched(&mut self, watch: BodyWatch, counts: Option<StreamedMerges>) {
        self.watch = watch;
        self.counts = counts;
    }

    /// The next bytes of the answer: `Ready(None)` once it is whole.
    pub fn poll_next(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Bytes, StreamFailure>>> {
        let Some(source) = self.source.as_mut().filter(|_| !self.done) else {
            return Poll::Ready(None);
        };
        let polled = match source {
            Source::Merge {
                stream,
                bodies,
                next,
                budget,
            } => poll_merge::<R>(stream, bodies, next, budget, cx),
            Source::Shared(pieces) => match pieces.poll_next_unpin(cx) {
                Poll::Pending => Poll::Pending,
                Poll::Ready(Some(SharedPiece::Bytes(bytes))) => Poll::Ready(Some(Ok(bytes))),
                Poll::Ready(Some(SharedPiece::End)) => Poll::Ready(None),
                Poll::Ready(Some(SharedPiece::Failed(why))) => {
                    Poll::Ready(Some(Err(StreamFailure::Upstream(why))))
                }
                Poll::Ready(None) => Poll::Ready(Some(Err(StreamFailure::Upstream(
                    "the flight let this client go (it fell behind) or stopped before its end"
                        .to_owned(),
                )))),
            },
        };
        match polled {
            Poll::Ready(None) => {
                self.done = true;
                self.count("complete");
                self.watch.complete();
                Poll::Ready(None)
            }
            Poll::Ready(Some(Err(failure))) => Poll::Ready(Some(Err(self.fail(failure)))),
            Poll::Ready(Some(Ok(bytes))) => {
                self.watch.sent(bytes.len());
                Poll::Ready(Some(Ok(bytes)))
            }
            Poll::Pending => Poll::Pending,
        }
    }

    /// The answer's deadline passed: the failure to end the body with.
    pub fn deadline_passed(&mut self) -> StreamFailure {
        self.fail(StreamFailure::DeadlinePassed)
    }

    fn fail(&mut self, failure: StreamFailure) -> StreamFailure {
        self.done = true;
        // The held bodies (or the flight's channel) go now: their connections close.
        self.source = None;
        if !self.watch.cut_off(&failure) {
            let request_id = self.request_id.as_deref().unwrap_or("-");
            tracing::warn!(request_id, "aborting a streamed merge: {failure}");
        }
        self.count("cut_off");
        failure
    }

    fn count(&self, outcome: &'static str) {
        if let Some(counts) = &self.counts {
            counts.observe(outcome);
        }
    }
}

/// The next bytes a merge writes: fed from the held bodies until it writes some, `Ready(None)`
/// once it is whole; what the merge holds as it grows taken from `budget` after each piece.
fn poll_merge<R: Runtime>(
    stream: &mut MergeStream,
    bodies: &mut [(usize, Option<R::Held>)],
    next: &mut usize,
    (budget, taken): &mut (BodyBudget, usize),
    cx: &mut Context<'_>,
) -> Poll<Option<Result<Bytes, StreamFailure>>> {
    loop {
        let held = stream.held_bytes();
        if held > *taken {
            if let Err(over) = budget.take(held - *taken) {
                return Poll::Ready(Some(Err(StreamFailure::OverBudget(over))));
            }
            *taken = held;
        }
        let out = match stream.take() {
            Ok(out) => out,
            Err(broken) => {
                return Poll::Ready(Some(Err(StreamFailure::Upstream(broken.to_string()))))
            }
        };
        if !out.is_empty() {
            return Poll::Ready(Some(Ok(out)));
        }
        if stream.is_finished() {
            return Poll::Ready(None);
        }
        if let Some(merged) = stream.merge_read_ahead() {
            if let Err(broken) = merged {
                return Poll::Ready(Some(Err(StreamFailure::Upstream(broken.to_string()))));
            }
            continue;
        }
        match read_one::<R>(stream, bodies, next, cx) {
            Ok(true) => {}
            Ok(false) => return Poll::Pending,
            Err(failure) => return Poll::Ready(Some(Err(failure))),
        }
    }
}

/// Polls the bodies in turn, from `next`, until one gives something: `Ok(true)` when the merge
/// was fed, `Ok(false)` when every body is waiting.
fn read_one<R: Runtime>(
    stream: &mut MergeStream,
    bodies: &mut [(usize, Option<R::Held>)],
    next: &mut usize,
    cx: &mut Context<'_>,
) -> Result<bool, StreamFailure> {
    let count = bodies.len();
    for turn in 0..count {
        let slot = (*next + turn) % count;
        let (input, body) = &mut bodies[slot];
        let Some(held) = body.as_mut() else {
            continue;
        };
        // Left unread (its connection pushes back on the backend) while the merge holds
        // enough of it; another body is then wanted, and feeding it changes this.
        if !stream.wants(*input) {
            continue;
        }
        let fed = match R::poll_piece(Pin::new(held), cx) {
            Poll::Pending => continue,
            Poll::Ready(Some(Ok(piece))) => stream.push(*input, &piece),
            Poll::Ready(None) => {
                *body = None;
                stream.end(*input)
            }
            Poll::Ready(Some(Err(error))) => return Err(StreamFailure::Upstream(error)),
        };
        *next = (slot + 1) % count;
        return fed
            .map(|()| true)
            .map_err(|broken| StreamFailure::Upstream(broken.to_string()));
    }
    if bodies.iter().all(|(_, body)| body.is_none()) {
        return Err(StreamFailure::Upstream(
            "every body ended before the merge did".to_owned(),
        ));
    }
    Ok(false)
}

impl<R: Runtime> Drop for MergedBody<R> {
    fn drop(&mut self) {
        if !self.done {
            self.count("client_left");
        }
    }
}
