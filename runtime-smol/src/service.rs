//! One client request end to end: admit it through the estate and drive its exchange on this
//! task, to the core's response (plus the held upstream body it streams, if any).

use std::sync::Arc;
use std::time::Instant;

use pdbmux_core::{ClientRequest, Response, ResponseBody};

use crate::body::HeldBody;
use crate::runtime::Host;

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
pub async fn handle(host: &Arc<Host>, client_request: &ClientRequest) -> Answer {
    let started = Instant::now();
    let (response, held) = host.answer(client_request).await;
    let answer = checked(response, held);
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
