//! The status policy: what a fan-out answers when some or all backends fail.
//!
//! Every backend in a fan-out is asked the same question, so a status every one of them answered
//! with is the estate's own answer and is replayed; 502 is kept for backends that disagree or did
//! not answer at all.

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, StatusCode};

use crate::config::BackendConfig;
use crate::ids::BackendId;
use crate::message::{Response, UpstreamFailure, TEXT_CONTENT_TYPE};
use crate::scrub::scrub_addresses;

/// One backend's part in a fan-out, once it is over.
#[derive(Debug, Clone)]
pub enum Outcome {
    /// A 2xx with a usable body.
    Success {
        /// Its status (200, or another 2xx).
        status: StatusCode,
        /// Its headers (for X-Records and the like).
        headers: HeaderMap,
        /// The whole body.
        body: Bytes,
    },
    /// A status of 400 or above: the backend refused or failed the request and said why.
    Rejected(Rejection),
    /// No usable answer: transport failure, timeout, an oversized or unparseable body, or a status
    /// that is neither success nor error.
    Failed(Failure),
}

/// Why one backend's part in a fan-out gave no usable answer. Kept typed until a log line or a
/// 502 body is written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Failure {
    /// The request got no answer (connect, timeout, body too large, transport).
    #[error(transparent)]
    Upstream(#[from] UpstreamFailure),
    /// A status that is neither a success nor an error (1xx, 3xx).
    #[error("unexpected status {}", .0.as_u16())]
    UnexpectedStatus(StatusCode),
    /// The runtime held a body it had to buffer (a runtime contract violation).
    #[error("unexpected held body on status {}", .0.as_u16())]
    HeldBody(StatusCode),
    /// A 2xx whose body the merge cannot use (D7).
    #[error(transparent)]
    Unusable(#[from] Unusable),
    /// An error status on a request the estate makes itself (a health check, a membership
    /// refresh), with the start of the backend's explanation.
    #[error(transparent)]
    Rejected(Rejected),
}

/// An error answer to one of the estate's own requests.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("answered {}{}", .status.as_u16(), if .detail.is_empty() { String::new() } else { format!(": {}", .detail) })]
pub struct Rejected {
    /// The backend's status.
    pub status: StatusCode,
    /// The first 200 bytes of its body, trimmed.
    pub detail: String,
}

/// Why a 2xx body cannot be merged: that backend counts as failed for the request (D7).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unusable {
    /// The body is not the JSON the merge expects (truncated, malformed, another shape).
    #[error("unparseable body: {0}")]
    Unparseable(String),
    /// A row is not a JSON object.
    #[error("row {index} is not an object")]
    NotAnObject {
        /// The row's position in the body.
        index: usize,
    },
    /// A count or sum column holds something other than a number or null.
    #[error("row {index} column {column} is not a number")]
    NotANumber {
        /// The row's position in the body.
        index: usize,
        /// The column.
        column: String,
    },
    /// An event-counts row without `subject_type` and `subject`.
    #[error("event-counts row {index} has no subject")]
    NoSubject {
        /// The row's position in the body.
        index: usize,
    },
    /// One of the backend's requests in this fan-out did not succeed, so its others cannot be
    /// used alone.
    #[error("a companion request failed")]
    IncompleteParts,
    /// A Jolokia answer with no usable envelope.
    #[error("unusable jolokia body")]
    Jolokia,
    /// A `/pdb/meta/v1/version` answer without a version.
    #[error("unparseable version body")]
    Version,
}

/// An error answer a backend gave, kept so it can be replayed.
#[derive(Debug, Clone)]
pub struct Rejection {
    /// The backend's status (400 or above).
    pub status: StatusCode,
    /// The backend's body.
    pub body: Bytes,
}

impl Outcome {
    /// A one-line description for logs and 502 bodies.
    pub fn describe(&self) -> String {
        match self {
            Outcome::Success { .. } => "ok".to_owned(),
            Outcome::Rejected(rejection) => format!("answered {}", rejection.status.as_u16()),
            Outcome::Failed(failure) => failure.to_string(),
        }
    }
}

/// What a fan-out with no usable success answers.
#[derive(Debug, Clone)]
pub enum FailureVerdict {
    /// Every backend answered the same error status: replay the first one's answer.
    Unanimous(Response),
    /// Backends disagreed or some answered nothing: 502.
    BadGateway(Response),
}

impl FailureVerdict {
    /// The response to send.
    pub fn into_response(self) -> Response {
        match self {
            FailureVerdict::Unanimous(response) | FailureVerdict::BadGateway(response) => response,
        }
    }
}

/// Decides the answer of a fan-out in which no backend succeeded.
///
/// `outcomes` holds every asked backend's outcome in configured order. A status every backend
/// answered with (400 and up) is replayed from the first of them, with backend addresses replaced
/// by names; anything else is a 502 naming each backend's failure.
pub fn failure_verdict(
    outcomes: &[(BackendId, Outcome)],
    backends: &[BackendConfig],
) -> FailureVerdict {
    let mut rejections = outcomes.iter().map(|(_, outcome)| match outcome {
        Outcome::Rejected(rejection) => Some(rejection),
        _ => None,
    });
    let first = rejections.next().flatten();
    if let Some(first) = first {
        if rejections.all(|r| r.is_some_and(|r| r.status == first.status)) {
            return FailureVerdict::Unanimous(replay(first, backends));
        }
    }
    FailureVerdict::BadGateway(bad_gateway(outcomes, backends))
}

/// Replays a backend's error answer: its status and body, addresses scrubbed, as JSON when the
/// body is JSON and as plain text otherwise, whatever type the backend named: an error page a
/// backend labels `text/html` is never relayed as HTML (docs/reliability.md).
pub fn replay(rejection: &Rejection, backends: &[BackendConfig]) -> Response {
    let body = scrub_addresses(&rejection.body, backends);
    let content_type = if crate::records::check_json(&body).is_ok() {
        crate::message::JSON_CONTENT_TYPE
    } else {
        TEXT_CONTENT_TYPE
    };
    let mut headers = HeaderMap::new();
    headers.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static(content_type),
    );
    Response {
        status: rejection.status,
        headers,
        body: crate::message::ResponseBody::Full(Bytes::from(body)),
    }
}

/// A 502 naming what each asked backend did.
pub fn bad_gateway(outcomes: &[(BackendId, Outcome)], backends: &[BackendConfig]) -> Response {
    let parts: Vec<String> = outcomes
        .iter()
        .map(|(id, outcome)| format!("{}: {}", backend_name(backends, *id), outcome.describe()))
        .collect();
    let message = format!(
        "pdbmux: no usable answer from any backend ({})",
        parts.join("; ")
    );
    let scrubbed = scrub_addresses(message.as_bytes(), backends);
    Response::with_body(StatusCode::BAD_GATEWAY, TEXT_CONTENT_TYPE, {
        let mut body = scrubbed;
        body.push(b'\n');
        body
    })
}

/// The configured name of a backend.
pub fn backend_name(backends: &[BackendConfig], id: BackendId) -> &str {
    backends.get(id.0).map_or("?", |b| b.name.as_str())
}
