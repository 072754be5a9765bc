//! One client request end to end: refuse a head both binaries refuse, else answer it through the
//! estate host (which drives its exchange on this task and logs it), as a hyper response.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use hyper::body::Incoming;
use pdbmux_core::{ClientRequest, ResponseBody};
use pdbmux_driver::{ClientAnswer, ClientContext};

use crate::body;
use crate::runtime::{Host, Tokio};

/// Answers one client request. Never fails: every outcome is an HTTP response.
pub async fn handle(
    host: Arc<Host>,
    peer: SocketAddr,
    request: http::Request<Incoming>,
) -> Result<http::Response<body::ResponseBody>, Infallible> {
    if let Some(refused) = refusal(&request, Some(peer)) {
        return Ok(refused);
    }
    let fields = request
        .headers()
        .iter()
        .map(|(name, value)| (name.as_str(), value.as_bytes()));
    let context = ClientContext::new(Some(peer), fields);
    Ok(into_hyper(
        host.answer(&client_request(&request), &context).await,
    ))
}

/// A 400 that closes the connection for a head hyper accepted but both binaries refuse (on the
/// query and the metrics listener alike)
/// ([`pdbmux_driver::http1::check_head`]: framing hyper resolves one way and another reader
/// could resolve another, a missing or repeated Host).
pub(crate) fn refusal<B>(
    request: &http::Request<B>,
    peer: Option<SocketAddr>,
) -> Option<http::Response<body::ResponseBody>> {
    let http10 = request.version() == http::Version::HTTP_10;
    let fields = || {
        request
            .headers()
            .iter()
            .map(|(name, value)| (name.as_str(), value.as_bytes()))
    };
    let why = pdbmux_driver::http1::check_head(http10, fields()).err()?;
    let context = ClientContext::new(peer, fields());
    let target = request.uri().path_and_query().map_or("-", |pq| pq.as_str());
    let mut refused = into_hyper(ClientAnswer::refused_head(
        &context,
        Some((request.method(), target)),
        http::StatusCode::BAD_REQUEST,
        why,
    ));
    refused.headers_mut().insert(
        http::header::CONNECTION,
        http::HeaderValue::from_static("close"),
    );
    Some(refused)
}

/// The core's view of a request: method, raw target and header sizes.
fn client_request(request: &http::Request<Incoming>) -> ClientRequest {
    let target = request.uri().path_and_query().map_or_else(
        || request.uri().path().to_owned(),
        |pq| pq.as_str().to_owned(),
    );
    let header_bytes = request
        .headers()
        .iter()
        .map(|(name, value)| name.as_str().len() + value.len() + 4)
        .sum();
    ClientRequest {
        method: request.method().clone(),
        target,
        header_count: request.headers().len(),
        header_bytes,
    }
}

/// Converts the driver's answer, attaching a held upstream body when it is streamed.
fn into_hyper(answer: ClientAnswer<Tokio>) -> http::Response<body::ResponseBody> {
    let (response, body) = match answer {
        ClientAnswer::Whole(response) => {
            // Never `Upstream`: the driver pairs those with their bodies (`ClientAnswer::Streamed`).
            let body = match &response.body {
                ResponseBody::Full(bytes) => body::full(bytes.clone()),
                ResponseBody::Upstream(_) | ResponseBody::Merged => body::full(bytes::Bytes::new()),
            };
            (response, body)
        }
        ClientAnswer::Streamed {
            response,
            body,
            check,
            deadline,
        } => (response, body::streamed(body, check, deadline)),
        ClientAnswer::Merged {
            response,
            body,
            deadline,
        } => (response, body::merged(body, deadline)),
    };
    let mut out = http::Response::new(body);
    *out.status_mut() = response.status;
    *out.headers_mut() = response.headers;
    out
}
