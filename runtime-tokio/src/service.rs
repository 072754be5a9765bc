//! One client request end to end: admit it through the estate, drive its exchange on this task,
//! and turn the core's response into a hyper response.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Instant;

use hyper::body::Incoming;
use pdbmux_core::{ClientRequest, Response, ResponseBody};

use crate::body;
use crate::runtime::Host;
use crate::upstream::HeldBody;

/// Answers one client request. Never fails: every outcome is an HTTP response.
pub async fn handle(
    host: Arc<Host>,
    request: http::Request<Incoming>,
) -> Result<http::Response<body::ResponseBody>, Infallible> {
    let started = Instant::now();
    let client_request = client_request(&request);
    let response = match refusal(&request) {
        Some(refused) => refused,
        None => {
            let (response, held) = host.answer(&client_request).await;
            into_hyper(response, held)
        }
    };
    tracing::info!(
        target: "pdbmux::access",
        method = %client_request.method,
        target = %client_request.target,
        status = response.status().as_u16(),
        ms = started.elapsed().as_millis() as u64,
    );
    Ok(response)
}

/// A 400 that closes the connection for a head hyper accepted but both binaries refuse
/// ([`pdbmux_driver::http1::check_head`]: framing hyper resolves one way and another reader
/// could resolve another, a missing or repeated Host).
fn refusal(request: &http::Request<Incoming>) -> Option<http::Response<body::ResponseBody>> {
    let http10 = request.version() == http::Version::HTTP_10;
    let fields = request
        .headers()
        .iter()
        .map(|(name, value)| (name.as_str(), value.as_bytes()));
    let why = pdbmux_driver::http1::check_head(http10, fields).err()?;
    let refused = Response::text(http::StatusCode::BAD_REQUEST, format!("pdbmux: {why}"));
    let mut refused = into_hyper(refused, None);
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

/// Converts the core's response, attaching a held upstream body when it is streamed.
fn into_hyper(
    response: Response,
    stream: Option<(HeldBody, Instant)>,
) -> http::Response<body::ResponseBody> {
    let body = match (response.body, stream) {
        (ResponseBody::Full(bytes), _) => body::full(bytes),
        (ResponseBody::Upstream(_), Some((held, deadline))) => body::streamed(held, deadline),
        (ResponseBody::Upstream(id), None) => {
            tracing::error!("no held body for upstream {id}; answering 502");
            let mut fallback =
                http::Response::new(body::full("pdbmux: upstream body lost\n".into()));
            *fallback.status_mut() = http::StatusCode::BAD_GATEWAY;
            return fallback;
        }
    };
    let mut out = http::Response::new(body);
    *out.status_mut() = response.status;
    *out.headers_mut() = response.headers;
    out
}
