//! # pdbmux-driver
//!
//! What both binaries run around the sans-IO core, so that they cannot drift apart:
//!
//! - [`EstateHost`], the estate shared by every connection: starting and stopping
//!   ([`EstateHost::start`], [`EstateHost::shut_down`]), reloads, admitting requests, the queue
//!   of waiting clients, single-flight tasks and their cancellation, the task that drives the
//!   estate's own outputs and deadline, and each exchange's loop (`drive`: send what the core
//!   asks for, feed the answers and timeouts back, cancel what it cancels, hold the body it
//!   streams). It runs on a [`Runtime`]: upstream clients, a clock and timers, a task spawner
//!   and a blocking pool.
//! - The sans-IO HTTP/1 pieces both binaries share: request-head checks ([`http1`]), what an
//!   upstream call carries and how its answer is taken ([`upstream`]), the streamed answer's
//!   JSON check ([`StreamedBody`]).
//! - pdbmux's own metrics ([`Metrics`]) and the shared cache store's client ([`Clients`]).
//! - The memory budget of buffered merges ([`budget`]), which both runtimes' upstream clients
//!   count bodies against as they read them.

#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::pin::pin;
use std::time::Instant;

mod access;
pub mod budget;
mod context;
mod flight_merge;
mod host;
pub mod http1;
mod json_check;
mod lifecycle;
mod merged;
mod metrics;
#[cfg(target_os = "linux")]
mod process;
mod redis_store;
mod request_counts;
mod timing;
pub mod upstream;

pub use context::{ClientContext, REQUEST_ID, TRACEPARENT};
pub use host::{ClientAnswer, EstateHost, Runtime, Task, TaskRole};
pub use json_check::{CheckedStream, NotJson, StreamFailure, StreamedBody};
pub use lifecycle::StartError;
pub use merged::MergedBody;
pub use metrics::{Build, ConnectionGuard, Metrics, SentBytes};
pub use redis_store::{prefer_runtime, Clients};
pub(crate) use timing::Timings;

use futures_util::future::{self, AbortHandle, Abortable, Either};
use futures_util::stream::{FuturesUnordered, StreamExt};
use pdbmux_core::{
    Exchange, ExchangeOutput, Response, ResponseBody, UpstreamFailure, UpstreamId, UpstreamResponse,
};
use std::pin::Pin;

/// One upstream answer as a runtime's client gives it: the response, and its body still held
/// (unread) when the core asked to stream it.
pub type UpstreamResult<H> = Result<(UpstreamResponse, Option<H>), UpstreamFailure>;

/// A response's streamed body, as [`drive`] hands it on, with the instant it must be complete by.
pub(crate) enum Streamed<R: Runtime> {
    /// A held upstream body, verbatim ([`ResponseBody::Upstream`]).
    Upstream(R::Held, Instant),
    /// A streamed merge ([`ResponseBody::Merged`]).
    Merged(MergedBody<R>, Instant),
}

/// Drives `exchange` to its response on the current task, with its streamed body when it has
/// one. Upstream requests (and the reads of held bodies a merge asks for) run concurrently
/// inside this future; dropping it (client gone, flight cancelled) drops them all and releases
/// their connections. Each call's time and the core's own work go into `timings`.
pub(crate) async fn drive<R: Runtime>(
    bound: &host::Bound<'_, R>,
    mut exchange: Exchange,
    timings: &mut Timings,
) -> (Response, Option<Streamed<R>>) {
    if let Some(refusal) = bound.refusal() {
        return (refusal, None);
    }
    let mut in_flight = FuturesUnordered::new();
    let mut aborts: BTreeMap<UpstreamId, AbortHandle> = BTreeMap::new();
    let mut held: BTreeMap<UpstreamId, (R::Held, Instant)> = BTreeMap::new();
    // Reads of held bodies under way: each owns its body until its piece arrives.
    let mut reads = FuturesUnordered::new();
    // The held bodies being read, and whether the exchange still wants each: one it gave up
    // meanwhile is dropped when its read ends.
    let mut reading: BTreeMap<UpstreamId, bool> = BTreeMap::new();
    let mut deadlines: BTreeMap<UpstreamId, Instant> = BTreeMap::new();
    // Calls in flight: their backend and when they were sent (an abandoned one is timed too).
    let mut sent: BTreeMap<UpstreamId, (pdbmux_core::BackendId, Instant)> = BTreeMap::new();
    loop {
        while let Some(output) = exchange.poll_output() {
            match output {
                ExchangeOutput::Send(request) => {
                    let (handle, registration) = AbortHandle::new_pair();
                    let (id, backend, sent_at) = (request.id, request.backend, bound.now());
                    aborts.insert(id, handle);
                    deadlines.insert(id, request.deadline);
                    sent.insert(id, (backend, sent_at));
                    let sent = bound.send(request);
                    in_flight.push(Abortable::new(
                        async move { (id, backend, sent_at, sent.await) },
                        registration,
                    ));
                }
                ExchangeOutput::Read(id) => {
                    if let Some((mut body, deadline)) = held.remove(&id) {
                        reading.insert(id, true);
                        reads.push(async move {
                            let piece =
                                future::poll_fn(|cx| R::poll_piece(Pin::new(&mut body), cx)).await;
                            (id, body, deadline, piece)
                        });
                    }
                }
                ExchangeOutput::Cancel(id) => {
                    if let Some(handle) = aborts.remove(&id) {
                        handle.abort();
                    }
                    held.remove(&id);
                    if let Some(wanted) = reading.get_mut(&id) {
                        *wanted = false;
                    }
                    // Timed out or no longer wanted: it took this long until it was given up.
                    if let Some((backend, sent_at)) = sent.remove(&id) {
                        let took = bound.now().saturating_duration_since(sent_at);
                        timings.upstream(backend, took);
                    }
                }
                ExchangeOutput::Respond(response) => {
                    let stream = match &response.body {
                        ResponseBody::Upstream(id) => held
                            .remove(id)
                            .map(|(body, deadline)| Streamed::Upstream(body, deadline)),
                        ResponseBody::Merged => exchange.take_stream().map(|stream| {
                            let mut deadline = None;
                            let bodies = stream
                                .bodies()
                                .iter()
                                .filter_map(|(input, id)| {
                                    let (body, until) = held.remove(id)?;
                                    deadline = deadline.max(Some(until));
                                    Some((*input, body))
                                })
                                .collect();
                            let deadline = deadline.unwrap_or_else(|| bound.now());
                            let budget = bound.stream_budget();
                            Streamed::Merged(MergedBody::new(stream, bodies, budget), deadline)
                        }),
                        ResponseBody::Full(_) => None,
                    };
                    bound.report(exchange.report());
                    return (response, stream);
                }
            }
        }
        let deadline = exchange.poll_timeout();
        // An empty set would end the race at once; wait for the deadline instead.
        let answered = pin!(async {
            match in_flight.next().await {
                Some(finished) => finished,
                None => future::pending().await,
            }
        });
        let read = pin!(async {
            match reads.next().await {
                Some(read) => read,
                None => future::pending().await,
            }
        });
        let timer = pin!(async {
            match deadline {
                Some(deadline) => bound.sleep_until(deadline).await,
                None => future::pending().await,
            }
        });
        let event = match future::select(read, future::select(answered, timer)).await {
            Either::Left(((id, body, deadline, piece), _)) => {
                if reading.remove(&id) == Some(false) {
                    drop(body);
                    continue;
                }
                let now = bound.now();
                let work = Instant::now();
                // What a merge reads before it streams is held: it counts in the memory budget.
                let counted = match &piece {
                    Some(Ok(bytes)) => bound.take_budget(bytes.len()),
                    _ => Ok(()),
                };
                match (piece, counted) {
                    (_, Err(failure)) => {
                        if let UpstreamFailure::OverBudget { scope, .. } = failure {
                            bound.observe_budget_refusal(scope);
                        }
                        exchange.handle_upstream_failure(now, id, failure);
                    }
                    (Some(Ok(piece)), Ok(())) => {
                        held.insert(id, (body, deadline));
                        exchange.handle_upstream_piece(now, id, piece);
                    }
                    (None, Ok(())) => exchange.handle_upstream_end(now, id),
                    (Some(Err(error)), Ok(())) => {
                        exchange.handle_upstream_failure(now, id, UpstreamFailure::Transport(error))
                    }
                }
                timings.core(work.elapsed());
                continue;
            }
            Either::Right((event, _)) => event,
        };
        match event {
            Either::Left((Ok((id, backend, sent_at, result)), _)) => {
                aborts.remove(&id);
                sent.remove(&id);
                let now = bound.now();
                timings.upstream(backend, now.saturating_duration_since(sent_at));
                // The core's own work is timed on the system clock, whatever clock the
                // transport keeps.
                let work = Instant::now();
                match result {
                    Ok((response, held_body)) => {
                        if let Some(body) = held_body {
                            let deadline = deadlines.get(&id).copied().unwrap_or(now);
                            held.insert(id, (body, deadline));
                        }
                        exchange.handle_upstream_response(now, id, response);
                    }
                    Err(failure) => {
                        if let UpstreamFailure::OverBudget { scope, .. } = failure {
                            bound.observe_budget_refusal(scope);
                        }
                        exchange.handle_upstream_failure(now, id, failure)
                    }
                }
                timings.core(work.elapsed());
            }
            // Aborted: its answer is no longer wanted.
            Either::Left((Err(_), _)) => {}
            Either::Right(((), _)) => {
                let work = Instant::now();
                exchange.handle_timeout(bound.now());
                timings.core(work.elapsed());
            }
        }
    }
}
