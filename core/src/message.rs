//! The HTTP messages that cross the core's boundary: client requests in, upstream requests out,
//! upstream answers in, client responses out. Bodies are owned [`Bytes`]; no borrowed lifetimes.

use std::time::Instant;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, StatusCode};

use crate::ids::{BackendId, UpstreamId};

/// The content type PuppetDB (and so pdbmux) answers JSON with.
pub const JSON_CONTENT_TYPE: &str = "application/json;charset=utf-8";
/// The content type of pdbmux's own error messages (PuppetDB sends its 400s as text too).
pub const TEXT_CONTENT_TYPE: &str = "text/plain;charset=utf-8";

/// A client request as the runtime parsed it; the core decides everything else.
#[derive(Debug, Clone)]
pub struct ClientRequest {
    /// The request method.
    pub method: Method,
    /// The request target exactly as received: the raw path plus `?` and the raw query, if any.
    pub target: String,
    /// How many header fields the request carried.
    pub header_count: usize,
    /// Total size of the header block in bytes (names, values and separators).
    pub header_bytes: usize,
}

impl ClientRequest {
    /// A GET for `target` with no notable headers; for tests and internal callers.
    pub fn get(target: impl Into<String>) -> ClientRequest {
        ClientRequest {
            method: Method::GET,
            target: target.into(),
            header_count: 0,
            header_bytes: 0,
        }
    }

    /// The raw path (before `?`).
    pub fn path(&self) -> &str {
        self.target
            .split_once('?')
            .map_or(&self.target, |(path, _)| path)
    }

    /// The raw query string (after `?`), if any.
    pub fn query(&self) -> Option<&str> {
        self.target.split_once('?').map(|(_, query)| query)
    }
}

/// The header naming how many backends' records went into a merged answer.
pub const X_BACKENDS: http::HeaderName = http::HeaderName::from_static("x-backends");
/// PuppetDB's total-count header.
pub const X_RECORDS: http::HeaderName = http::HeaderName::from_static("x-records");

/// What the runtime does with an upstream answer's body before handing it to the core.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyMode {
    /// Read the whole body (bounded by `max_body_bytes`) and deliver it as [`UpstreamBody::Full`].
    Buffer,
    /// On a 2xx, hold the body unread and deliver [`UpstreamBody::Held`]; the core will either
    /// stream it to the client ([`ResponseBody::Upstream`]) or cancel it. Any other status, and a
    /// 2xx declared at most [`HELD_ABOVE_BYTES`] long: read it whole as in [`BodyMode::Buffer`]
    /// ([`BodyMode::holds`] decides).
    StreamSuccess,
}

/// A streamed answer declared at most this long is read whole instead: the core can then check
/// it is JSON and ask the next backend when it is not, where a held body can only be cut off
/// once its first bytes went out (docs/reliability.md).
pub const HELD_ABOVE_BYTES: u64 = 256 * 1024;

/// The default of `stream_above_bytes` (`Config::stream_above_bytes`): a merge that can stream
/// reads its backends' held bodies whole while they hold at most this many bytes together, and
/// merges them as a buffered answer; past it, the merge streams (docs/merging.md, "Streamed
/// merges"). Below it a backend failing mid-body still leaves a partial answer, and the answer
/// is cached and shared like any other; 8 MiB is a few thousand nodes' facts, a small part of
/// the per-request budget, and reads in tens of milliseconds.
pub const STREAM_ABOVE_BYTES: u64 = 8 * 1024 * 1024;

impl BodyMode {
    /// Whether the runtime holds an answer with this status and declared `Content-Length`
    /// (`None` for chunked) for streaming, rather than reading it whole. Use it in every
    /// runtime's upstream client, so they agree.
    pub fn holds(self, status: http::StatusCode, declared_length: Option<u64>) -> bool {
        self == BodyMode::StreamSuccess
            && status.is_success()
            && declared_length.is_none_or(|length| length > HELD_ABOVE_BYTES)
    }
}

/// A request the runtime must send to one backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamRequest {
    /// Hand this back with the answer.
    pub id: UpstreamId,
    /// Which backend to ask.
    pub backend: BackendId,
    /// GET, or POST when a rewritten query is too long for a URL (docs/decisions.md D4).
    pub method: Method,
    /// Path and query to append to the backend's base URL, verbatim.
    pub path_and_query: String,
    /// The JSON body of a POST (sent as `application/json`); `None` for a GET.
    pub body: Option<Bytes>,
    /// How to deliver the body.
    pub body_mode: BodyMode,
    /// When the core gives up on this request. The core enforces it through `poll_timeout`; the
    /// runtime also stops streaming a held body to the client at this instant.
    pub deadline: Instant,
    /// What the request is for.
    pub purpose: Purpose,
    /// Headers that tie the call to the client request it is made for (its request id and
    /// trace context); the core leaves it empty and the driver fills it in. Send them as given.
    pub correlation: Vec<(http::HeaderName, http::HeaderValue)>,
}

/// An upstream answer's body as delivered to the core.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UpstreamBody {
    /// The whole body.
    Full(Bytes),
    /// The body is still unread in the runtime (only for [`BodyMode::StreamSuccess`] on a 2xx).
    Held,
}

/// An upstream answer: status line, headers and body.
#[derive(Debug, Clone)]
pub struct UpstreamResponse {
    /// The backend's status.
    pub status: StatusCode,
    /// The backend's headers.
    pub headers: HeaderMap,
    /// The body, whole or held.
    pub body: UpstreamBody,
}

impl UpstreamResponse {
    /// A buffered answer with a content type; for tests and fakes.
    pub fn full(
        status: StatusCode,
        content_type: &str,
        body: impl Into<Bytes>,
    ) -> UpstreamResponse {
        let mut headers = HeaderMap::new();
        if let Ok(value) = HeaderValue::from_str(content_type) {
            headers.insert(http::header::CONTENT_TYPE, value);
        }
        UpstreamResponse {
            status,
            headers,
            body: UpstreamBody::Full(body.into()),
        }
    }
}

/// What an upstream request is for, as `pdbmux_upstream_requests_total` labels it: a client's
/// query, a correction a merge asks besides it, a PQL translation, or one of the estate's own (a
/// health probe, the membership refresh, a `/healthz` reachability check). Counting them apart
/// lets single-flight be checked from pdbmux's own metrics: one fan-out is one `query` call
/// per backend, whatever the probes and refreshes do meanwhile.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    /// A client request's own fan-out.
    Query,
    /// A correction a merge asks for its count or total (docs/merging.md, "Corrections").
    Correction,
    /// PQL sent with `ast_only=true` to learn its AST.
    Translation,
    /// A health probe (`health_probe_path`).
    Probe,
    /// The membership refresh.
    Membership,
    /// `/healthz`'s live reachability check.
    Healthz,
}

impl Purpose {
    /// Every purpose, in the order the metrics list them.
    pub const ALL: [Purpose; 6] = [
        Purpose::Query,
        Purpose::Correction,
        Purpose::Translation,
        Purpose::Probe,
        Purpose::Membership,
        Purpose::Healthz,
    ];

    /// Its label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Purpose::Query => "query",
            Purpose::Correction => "correction",
            Purpose::Translation => "translation",
            Purpose::Probe => "probe",
            Purpose::Membership => "membership",
            Purpose::Healthz => "healthz",
        }
    }
}

/// Why no connection could be made to a backend: what an operator does next differs for each
/// (start the PuppetDB, fix the name, fix the certificates, look at the network), so `/healthz`,
/// the log and the metrics name them apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnectCause {
    /// Nothing listens on the address (the PuppetDB is down or on another port).
    Refused,
    /// The host name does not resolve.
    Dns,
    /// The TLS handshake failed (certificates, CA, protocol).
    Tls,
    /// The connection was not made within the timeout (a firewall dropping packets, a host down).
    Timeout,
    /// Anything else (no route to host, ...).
    Other,
}

impl ConnectCause {
    /// Every cause, in the order the metrics list them.
    pub const ALL: [ConnectCause; 5] = [
        ConnectCause::Refused,
        ConnectCause::Dns,
        ConnectCause::Tls,
        ConnectCause::Timeout,
        ConnectCause::Other,
    ];

    /// Its spelling in `/healthz`, log lines and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            ConnectCause::Refused => "connection_refused",
            ConnectCause::Dns => "dns_error",
            ConnectCause::Tls => "tls_error",
            ConnectCause::Timeout => "connect_timeout",
            ConnectCause::Other => "connect_error",
        }
    }
}

/// Why an upstream request produced no answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UpstreamFailure {
    /// No connection could be made.
    #[error("connect failed: {detail}")]
    Connect {
        /// Which kind of failure it was.
        cause: ConnectCause,
        /// The error, as the runtime's libraries describe it.
        detail: String,
    },
    /// The deadline passed before the answer was complete.
    #[error("timed out")]
    Timeout,
    /// The body went over `max_body_bytes`.
    #[error("body over {limit} bytes")]
    BodyTooLarge {
        /// The configured limit.
        limit: u64,
    },
    /// The connection failed after it was made (reset, malformed HTTP, aborted body).
    #[error("transport error: {0}")]
    Transport(String),
    /// Reading the body would have gone over a memory budget of buffered merges (see the
    /// `budget` module): not the backend's failure, the whole request is refused.
    #[error("over {} ({limit} bytes)", scope.key())]
    OverBudget {
        /// Which budget.
        scope: BudgetScope,
        /// Its limit in bytes.
        limit: u64,
    },
}

/// Which budget a request went over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BudgetScope {
    /// `merge_request_bytes`: this request's answers alone are more than one request may hold.
    Request,
    /// `merge_memory_bytes`: the merges in flight hold the whole process's budget already.
    Process,
}

impl BudgetScope {
    /// The configuration key that sets this budget.
    pub fn key(self) -> &'static str {
        match self {
            BudgetScope::Request => "merge_request_bytes",
            BudgetScope::Process => "merge_memory_bytes",
        }
    }

    /// Its metrics label value.
    pub fn as_str(self) -> &'static str {
        match self {
            BudgetScope::Request => "request",
            BudgetScope::Process => "process",
        }
    }
}

/// The body of a response to a client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResponseBody {
    /// These bytes.
    Full(Bytes),
    /// Stream the held body of this upstream answer, verbatim, until its end or its deadline.
    Upstream(UpstreamId),
    /// A streamed merge: the bytes [`crate::MergeStream`] writes as it is fed the held bodies
    /// it names (take it with [`crate::Exchange::take_stream`]), until their end or the deadline.
    Merged,
}

/// A response to a client.
#[derive(Debug, Clone)]
pub struct Response {
    /// The status.
    pub status: StatusCode,
    /// Headers pdbmux sets or forwards (the runtime adds framing headers itself).
    pub headers: HeaderMap,
    /// The body.
    pub body: ResponseBody,
}

impl Response {
    /// A response with these bytes and this content type.
    pub fn with_body(
        status: StatusCode,
        content_type: &'static str,
        body: impl Into<Bytes>,
    ) -> Response {
        let mut headers = HeaderMap::new();
        headers.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static(content_type),
        );
        Response {
            status,
            headers,
            body: ResponseBody::Full(body.into()),
        }
    }

    /// A JSON response under PuppetDB's content type.
    pub fn json(status: StatusCode, body: impl Into<Bytes>) -> Response {
        Response::with_body(status, JSON_CONTENT_TYPE, body)
    }

    /// A 400 worded as PuppetDB words it (paging, extract, parameter refusals pdbmux makes
    /// before any backend is asked): the text exactly, as PuppetDB sends it, without a newline.
    pub fn refusal(message: impl Into<String>) -> Response {
        Response::with_body(StatusCode::BAD_REQUEST, TEXT_CONTENT_TYPE, message.into())
    }

    /// pdbmux's own plain-text error message.
    pub fn text(status: StatusCode, message: impl Into<String>) -> Response {
        let mut text = message.into();
        text.push('\n');
        Response::with_body(status, TEXT_CONTENT_TYPE, text)
    }

    /// The full body, if it is not streamed.
    pub fn full_body(&self) -> Option<&Bytes> {
        match &self.body {
            ResponseBody::Full(bytes) => Some(bytes),
            ResponseBody::Upstream(_) | ResponseBody::Merged => None,
        }
    }
}
