//! The metrics listener (`metrics_listen`): pdbmux's own `/metrics` on an address of its own,
//! never on the PuppetDB-facing one. What it answers is the shared driver's
//! ([`pdbmux_driver::EstateHost::scrape`]); this is only its socket.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use pdbmux_core::ResponseBody;
use tokio::net::TcpListener;

use crate::body;
use crate::runtime::Host;

/// How long a scraper may take to send a request's headers.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Serves `/metrics` on `listener` until the task is aborted.
pub async fn serve(listener: TcpListener, host: Arc<Host>) {
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .keep_alive(true);
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(error) => {
                tracing::warn!("metrics listener: accept failed: {error}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let host = Arc::clone(&host);
        let connection = http.serve_connection(
            TokioIo::new(stream),
            service_fn(move |request| {
                let host = Arc::clone(&host);
                async move { Ok::<_, Infallible>(scrape(&host, &request)) }
            }),
        );
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::debug!("metrics connection ended: {error}");
            }
        });
    }
}

fn scrape<B>(host: &Host, request: &http::Request<B>) -> http::Response<body::ResponseBody> {
    if let Some(refused) = crate::service::refusal(request, None) {
        return refused;
    }
    let accept = request
        .headers()
        .get(http::header::ACCEPT)
        .and_then(|value| value.to_str().ok());
    let answer = host.scrape(request.method(), request.uri().path(), accept);
    let bytes = match answer.body {
        ResponseBody::Full(bytes) => bytes,
        ResponseBody::Upstream(_) | ResponseBody::Merged => bytes::Bytes::new(),
    };
    let mut response = http::Response::new(body::full(bytes));
    *response.status_mut() = answer.status;
    *response.headers_mut() = answer.headers;
    response
}
