//! One client request end to end: admit it through the estate and drive its exchange on this
//! task, to the core's response (plus the held upstream body it streams, if any).

use std::sync::Arc;
use std::time::Instant;

use pdbmux_core::{ClientRequest, Response, ResponseBody};
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
                let (response, held) = pdbmux_driver::drive(&**shared, exchange).await;
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

/// Sleeps until `deadline`, or forever without one.
pub async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => {
            Timer::at(deadline).await;
        }
        None => std::future::pending().await,
    }
}
