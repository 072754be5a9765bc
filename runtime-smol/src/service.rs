//! One client request end to end: admit it through the estate and drive its exchange on this
//! task, to the core's response (plus the held upstream body it streams, if any).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use futures_util::future::{AbortHandle, Abortable};
use futures_util::stream::{FuturesUnordered, StreamExt};
use pdbmux_core::{
    ClientRequest, Exchange, ExchangeOutput, Response, ResponseBody, UpstreamFailure, UpstreamId,
};
use smol::future::FutureExt;
use smol::Timer;

use crate::body::HeldBody;
use crate::estate_task::{Admitted, Shared, WaiterEvent};

/// The answer to a client: the core's response, and for [`ResponseBody::Upstream`] the held body
/// to stream with the instant it must be complete by.
pub struct Answer {
    /// Status, headers and (whole) body.
    pub response: Response,
    /// The streamed body, when `response.body` is [`ResponseBody::Upstream`].
    pub stream: Option<(HeldBody, Instant)>,
}

/// Answers one client request and writes its access log line. Never fails: every outcome is a
/// response. Dropping the future (the client went away) drops its upstream requests.
pub async fn handle(shared: &Arc<Shared>, client_request: &ClientRequest) -> Answer {
    let started = Instant::now();
    let mut admission = shared.admit(started, client_request);
    let answer = loop {
        match admission {
            Admitted::Respond(response) => break checked(response, None),
            Admitted::Exchange(exchange) => {
                let (response, held) = drive(shared, exchange).await;
                break checked(response, held);
            }
            Admitted::Wait(ticket) => match ticket.wait().await {
                Some(WaiterEvent::Respond(response)) => break checked(response, None),
                Some(WaiterEvent::Resume) => {
                    admission = shared.readmit(Instant::now(), client_request)
                }
                None => {
                    break checked(
                        Response::text(
                            http::StatusCode::SERVICE_UNAVAILABLE,
                            "pdbmux: shutting down",
                        ),
                        None,
                    )
                }
            },
        }
    };
    tracing::info!(
        target: "pdbmux::access",
        method = %client_request.method,
        target = %client_request.target,
        status = answer.response.status.as_u16(),
        ms = started.elapsed().as_millis() as u64,
    );
    answer
}

/// Pairs a response with its held body; a streamed response whose body is missing becomes a 502.
fn checked(response: Response, stream: Option<(HeldBody, Instant)>) -> Answer {
    match (&response.body, stream) {
        (ResponseBody::Upstream(id), None) => {
            tracing::error!("no held body for upstream {id}; answering 502");
            Answer {
                response: Response::text(
                    http::StatusCode::BAD_GATEWAY,
                    "pdbmux: upstream body lost",
                ),
                stream: None,
            }
        }
        (ResponseBody::Upstream(_), stream) => Answer { response, stream },
        (ResponseBody::Full(_), _) => Answer {
            response,
            stream: None,
        },
    }
}

type UpstreamResult = Result<(pdbmux_core::UpstreamResponse, Option<HeldBody>), UpstreamFailure>;

/// Drives an exchange to its response on the current task, with the held upstream body when the
/// response streams one. Upstream requests run concurrently inside this task; dropping it (client
/// gone, flight cancelled) drops them all and closes their connections.
pub async fn drive(
    shared: &Shared,
    mut exchange: Exchange,
) -> (Response, Option<(HeldBody, Instant)>) {
    let mut in_flight = FuturesUnordered::new();
    let mut aborts: BTreeMap<UpstreamId, AbortHandle> = BTreeMap::new();
    let mut held: BTreeMap<UpstreamId, (HeldBody, Instant)> = BTreeMap::new();
    let mut deadlines: BTreeMap<UpstreamId, Instant> = BTreeMap::new();
    loop {
        while let Some(output) = exchange.poll_output() {
            match output {
                ExchangeOutput::Send(request) => {
                    let (handle, registration) = AbortHandle::new_pair();
                    aborts.insert(request.id, handle);
                    deadlines.insert(request.id, request.deadline);
                    let upstreams = Arc::clone(&shared.upstreams);
                    let id = request.id;
                    in_flight.push(Abortable::new(
                        async move {
                            let result: UpstreamResult = upstreams.send(&request).await;
                            (id, result)
                        },
                        registration,
                    ));
                }
                ExchangeOutput::Cancel(id) => {
                    if let Some(handle) = aborts.remove(&id) {
                        handle.abort();
                    }
                    held.remove(&id);
                }
                ExchangeOutput::Respond(response) => {
                    let stream = match &response.body {
                        ResponseBody::Upstream(id) => held.remove(id),
                        ResponseBody::Full(_) => None,
                    };
                    return (response, stream);
                }
            }
        }
        let deadline = exchange.poll_timeout();
        // `None` from an empty set would end the race at once; wait for the deadline instead.
        let answered = async {
            match in_flight.next().await {
                Some(finished) => Some(finished),
                None => std::future::pending().await,
            }
        };
        let timed_out = async {
            sleep_until(deadline).await;
            None
        };
        match answered.or(timed_out).await {
            Some(Ok((id, result))) => {
                aborts.remove(&id);
                let now = Instant::now();
                match result {
                    Ok((response, held_body)) => {
                        if let Some(body) = held_body {
                            let deadline = deadlines.get(&id).copied().unwrap_or(now);
                            held.insert(id, (body, deadline));
                        }
                        exchange.handle_upstream_response(now, id, response);
                    }
                    Err(failure) => exchange.handle_upstream_failure(now, id, failure),
                }
            }
            // Aborted: its answer is no longer wanted.
            Some(Err(_)) => {}
            None => exchange.handle_timeout(Instant::now()),
        }
    }
}

/// Sleeps until `deadline`, or forever without one.
pub async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => {
            Timer::at(deadline).await;
        }
        None => std::future::pending().await,
    }
}
