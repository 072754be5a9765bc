//! The upstream client: one pooled hyper client per backend (rustls for https), requests bounded
//! by the core's deadline and bodies bounded by `max_body_bytes` while they are read.

use std::time::Duration;

use bytes::Bytes;
use http::header::{ACCEPT, CONTENT_LENGTH, CONTENT_TYPE, USER_AGENT};
use http::{HeaderValue, Request};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use pdbmux_core::config::{BackendConfig, Config};
use pdbmux_core::{BackendId, UpstreamBody, UpstreamFailure, UpstreamRequest, UpstreamResponse};

type HttpsClient = Client<HttpsConnector<HttpConnector>, Full<Bytes>>;

pub use pdbmux_tls::{error_chain, ClientSetupError};

/// The clients for every backend, in configured order.
pub struct Upstreams {
    backends: Vec<Backend>,
    max_body_bytes: u64,
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
            max_body_bytes: config.max_body_bytes,
        })
    }

    /// Sends one upstream request and reads its answer as the request's body mode says. The caller
    /// bounds it by the request's deadline.
    pub async fn send(
        &self,
        request: &UpstreamRequest,
    ) -> Result<(UpstreamResponse, Option<HeldBody>), UpstreamFailure> {
        let backend = self.backend(request.backend)?;
        let uri = format!("{}{}", backend.base, request.path_and_query);
        let mut builder = Request::builder()
            .method(request.method.clone())
            .uri(&uri)
            .header(ACCEPT, HeaderValue::from_static("application/json"))
            .header(USER_AGENT, concat!("pdbmux/", env!("CARGO_PKG_VERSION")));
        if request.body.is_some() {
            builder = builder.header(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        }
        let http_request = builder
            .body(Full::new(request.body.clone().unwrap_or_default()))
            .map_err(|e| UpstreamFailure::Transport(format!("bad upstream request: {e}")))?;
        let response = backend
            .client
            .request(http_request)
            .await
            .map_err(classify_client_error)?;
        let (parts, body) = response.into_parts();
        let length = parts
            .headers
            .get(CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if length.is_some_and(|length| length > self.max_body_bytes) {
            return Err(UpstreamFailure::BodyTooLarge {
                limit: self.max_body_bytes,
            });
        }
        let limit = usize::try_from(self.max_body_bytes).unwrap_or(usize::MAX);
        let body = Limited::new(body, limit);
        if request.body_mode.holds(parts.status, length) {
            let response = UpstreamResponse {
                status: parts.status,
                headers: parts.headers,
                body: UpstreamBody::Held,
            };
            return Ok((response, Some(body)));
        }
        let bytes = body
            .collect()
            .await
            .map_err(|e| self.body_error(e))?
            .to_bytes();
        let response = UpstreamResponse {
            status: parts.status,
            headers: parts.headers,
            body: UpstreamBody::Full(bytes),
        };
        Ok((response, None))
    }

    fn backend(&self, id: BackendId) -> Result<&Backend, UpstreamFailure> {
        self.backends
            .get(id.0)
            .ok_or_else(|| UpstreamFailure::Transport(format!("no backend {id}")))
    }

    /// Maps a body read error: over the limit, or a transport failure.
    pub fn body_error(&self, error: Box<dyn std::error::Error + Send + Sync>) -> UpstreamFailure {
        if error.is::<http_body_util::LengthLimitError>() {
            UpstreamFailure::BodyTooLarge {
                limit: self.max_body_bytes,
            }
        } else {
            UpstreamFailure::Transport(error_chain(&*error))
        }
    }
}

fn classify_client_error(error: hyper_util::client::legacy::Error) -> UpstreamFailure {
    if error.is_connect() {
        UpstreamFailure::Connect(error_chain(&error))
    } else {
        UpstreamFailure::Transport(error_chain(&error))
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
    Ok(Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(90))
        .pool_max_idle_per_host(64)
        .build(connector))
}
