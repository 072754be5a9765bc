//! The upstream client: one pooled hyper client per backend (rustls for https), requests bounded
//! by the core's deadline and bodies bounded by `max_body_bytes` while they are read.

use std::time::Duration;

use bytes::Bytes;
use http::header::CONTENT_LENGTH;
use http::Request;
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use hyper::body::Incoming;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use pdbmux_core::config::{BackendConfig, Config};
use pdbmux_core::{BackendId, UpstreamFailure, UpstreamRequest, UpstreamResponse};
use pdbmux_driver::budget::BodyBudget;
use pdbmux_driver::upstream::{request_headers, take_answer, BodyLimit};
use pdbmux_tls::connect_cause;

type HttpsClient = Client<HttpsConnector<HttpConnector>, Full<Bytes>>;

pub use pdbmux_tls::{error_chain, ClientSetupError};

/// The clients for every backend, in configured order.
pub struct Upstreams {
    backends: Vec<Backend>,
    limit: BodyLimit,
}

struct Backend {
    base: String,
    client: HttpsClient,
}

/// A successful upstream answer whose body is still to be streamed (`BodyMode::StreamSuccess`).
pub type HeldBody = Limited<Incoming>;

impl Upstreams {
    /// Builds one pooled client per backend; fails on unreadable TLS files.
    pub fn new(config: &Config) -> Result<Upstreams, ClientSetupError> {
        let roots = pdbmux_tls::native_roots();
        let backends = config
            .backends
            .iter()
            .map(|backend| {
                Ok(Backend {
                    base: backend.url.base(),
                    client: client_for(backend, &roots, config.timeout)?,
                })
            })
            .collect::<Result<Vec<_>, ClientSetupError>>()?;
        Ok(Upstreams {
            backends,
            limit: BodyLimit::of(config),
        })
    }

    /// Sends one upstream request and reads its answer as the request's body mode says. The caller
    /// bounds it by the request's deadline.
    /// A body read whole is counted in `budget` as it is read.
    pub async fn send(
        &self,
        request: &UpstreamRequest,
        budget: &BodyBudget,
    ) -> Result<(UpstreamResponse, Option<HeldBody>), UpstreamFailure> {
        let backend = self.backend(request.backend)?;
        let uri = format!("{}{}", backend.base, request.path_and_query);
        let build = || {
            let mut builder = Request::builder().method(request.method.clone()).uri(&uri);
            for (name, value) in request_headers(request) {
                builder = builder.header(name, value);
            }
            builder
                .body(Full::new(request.body.clone().unwrap_or_default()))
                .map_err(|e| UpstreamFailure::Transport(format!("bad upstream request: {e}")))
        };
        let response = match backend.client.request(build()?).await {
            // A pooled connection the backend closed as the request went out on it (Jetty
            // closes idle ones): hyper retries only a request it had not written yet; a GET is
            // sent once more on another connection. hyper does not say whether the connection
            // was reused, so a fresh one that closes so is tried again too (pdbmux-smol retries
            // only a reused one).
            Err(error) if request.method == http::Method::GET && closed_before_answer(&error) => {
                tracing::debug!(
                    backend = %request.backend,
                    "connection closed before an answer ({}); retrying on another",
                    error_chain(&error)
                );
                backend.client.request(build()?).await
            }
            other => other,
        }
        .map_err(classify_client_error)?;
        let (parts, body) = response.into_parts();
        let length = parts
            .headers
            .get(CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        self.limit.check_declared(length)?;
        let body = Limited::new(
            body,
            usize::try_from(self.limit.bytes()).unwrap_or(usize::MAX),
        );
        let limit = self.limit;
        let read_whole = |mut body: HeldBody| async move {
            let count = budget.body(length)?;
            let capacity = length.unwrap_or(0).min(limit.bytes());
            let mut bytes = Vec::with_capacity(usize::try_from(capacity).unwrap_or(0));
            while let Some(frame) = body.frame().await {
                let frame = frame
                    .map_err(|error| limit.read_failure(error.is::<LengthLimitError>(), &*error))?;
                if let Ok(data) = frame.into_data() {
                    count.chunk(data.len())?;
                    bytes.extend_from_slice(&data);
                }
            }
            Ok(Bytes::from(bytes))
        };
        take_answer(
            request,
            (parts.status, parts.headers),
            length,
            body,
            read_whole,
        )
        .await
    }

    fn backend(&self, id: BackendId) -> Result<&Backend, UpstreamFailure> {
        self.backends
            .get(id.0)
            .ok_or_else(|| UpstreamFailure::Transport(format!("no backend {id}")))
    }
}

/// Whether the connection closed before the answer's head was whole ("connection closed before
/// message completed"): no answer was taken, so a GET can be sent again.
fn closed_before_answer(error: &hyper_util::client::legacy::Error) -> bool {
    std::iter::successors(std::error::Error::source(error), |e| e.source())
        .filter_map(|e| e.downcast_ref::<hyper::Error>())
        .any(hyper::Error::is_incomplete_message)
}

fn classify_client_error(error: hyper_util::client::legacy::Error) -> UpstreamFailure {
    if error.is_connect() {
        UpstreamFailure::Connect {
            cause: connect_cause(&error),
            detail: error_chain(&error),
        }
    } else {
        pdbmux_tls::transport_failure(&error)
    }
}

fn client_for(
    backend: &BackendConfig,
    system_roots: &[rustls::pki_types::CertificateDer<'static>],
    timeout: Duration,
) -> Result<HttpsClient, ClientSetupError> {
    let tls = pdbmux_tls::client_config(backend, system_roots)?;
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_connect_timeout(Some(timeout));
    http.set_nodelay(true);
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .wrap_connector(http);
    // Idle connections are dropped before PuppetDB's Jetty closes them (30 s by default), so
    // that a request never goes out on one the backend is closing at that moment ("connection
    // closed before message completed", seen once on both backends at once; connections made
    // together, as the membership refresh makes them, come due together).
    Ok(Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(20))
        .pool_max_idle_per_host(64)
        .build(connector))
}
