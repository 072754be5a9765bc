//! The metrics listener (`metrics_listen`): pdbmux's own `/metrics` on an address of its own,
//! never on the PuppetDB-facing one, served with async-h1's server. What it answers is the
//! shared driver's ([`pdbmux_driver::EstateHost::scrape`]); this is only its socket.

use std::io;
use std::net::{TcpListener, TcpStream};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use pdbmux_core::ResponseBody;
use smol::io::{AsyncRead, AsyncWrite};
use smol::{Async, Executor, Timer};

use crate::runtime::{spawn_guarded, Host};

/// One scraper's connection, shared by async-h1's reader and writer.
#[derive(Clone)]
struct Shared(Arc<Async<TcpStream>>);

impl AsyncRead for Shared {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut [u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut &*self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for Shared {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut &*self.0).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut &*self.0).poll_flush(cx)
    }

    fn poll_close(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut &*self.0).poll_close(cx)
    }
}

/// Serves `/metrics` on `listener` until the task is dropped.
pub async fn serve(
    listener: Async<TcpListener>,
    host: Arc<Host>,
    executor: Arc<Executor<'static>>,
) {
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(error) => {
                tracing::warn!("metrics listener: accept failed: {error}");
                Timer::after(Duration::from_millis(50)).await;
                continue;
            }
        };
        let host = Arc::clone(&host);
        spawn_guarded(&executor, "metrics connection", async move {
            let served = async_h1::accept(Shared(Arc::new(stream)), |request| {
                let response = scrape(&host, &request);
                async move { Ok(response) }
            });
            if let Err(error) = served.await {
                tracing::debug!("metrics connection ended: {error}");
            }
        })
        .detach();
    }
}

fn scrape(host: &Host, request: &http_types::Request) -> http_types::Response {
    // The head checks the query listener applies (framing, Host), here too.
    let http10 = request.version() == Some(http_types::Version::Http1_0);
    let fields: Vec<(String, Vec<u8>)> = request
        .iter()
        .flat_map(|(name, values)| {
            values
                .iter()
                .map(move |value| (name.as_str().to_owned(), value.as_str().as_bytes().to_vec()))
        })
        .collect();
    let fields = fields
        .iter()
        .map(|(name, value)| (name.as_str(), value.as_slice()));
    let answer = match pdbmux_driver::http1::check_head(http10, fields) {
        Err(why) => {
            let mut refused = pdbmux_core::Response::text(
                http::StatusCode::BAD_REQUEST,
                format!("pdbmux: {why}"),
            );
            pdbmux_driver::http1::finish_response_headers(&mut refused.headers);
            refused.headers.insert(
                http::header::CONNECTION,
                http::HeaderValue::from_static("close"),
            );
            refused
        }
        Ok(_) => {
            let method = match request.method() {
                http_types::Method::Get => http::Method::GET,
                http_types::Method::Head => http::Method::HEAD,
                _ => http::Method::POST,
            };
            let accept = request.header("accept").map(|values| values.as_str());
            host.scrape(&method, request.url().path(), accept)
        }
    };
    let status = http_types::StatusCode::try_from(answer.status.as_u16())
        .unwrap_or(http_types::StatusCode::InternalServerError);
    let mut response = http_types::Response::new(status);
    for (name, value) in &answer.headers {
        if let Ok(value) = value.to_str() {
            response.insert_header(name.as_str(), value);
        }
    }
    if let ResponseBody::Full(bytes) = answer.body {
        response.set_body(bytes.to_vec());
    }
    response
}
