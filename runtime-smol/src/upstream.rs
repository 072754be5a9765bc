//! The upstream client: the request head written verbatim, the answer decoded by async-h1, a small
//! pool of keep-alive connections per backend (futures-rustls for https), bodies bounded by
//! `max_body_bytes` while they are read. The caller bounds each request by its deadline (by
//! dropping it).

use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures_rustls::TlsConnector;
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use pdbmux_core::config::{BackendConfig, Config};
use pdbmux_core::{UpstreamFailure, UpstreamRequest, UpstreamResponse};
use pdbmux_driver::budget::BodyBudget;
use pdbmux_driver::upstream::{answer_framing, request_bytes, take_answer, BodyLimit};
use pdbmux_tls::connect_cause;
use rustls::pki_types::ServerName;
use smol::future::FutureExt;
use smol::io::AsyncWriteExt;

use crate::body::HeldBody;
use crate::pool::{Endpoint, Lease, Pool};

pub use pdbmux_tls::{error_chain, ClientSetupError};

/// The clients for every backend, in configured order.
pub struct Upstreams {
    backends: Vec<Backend>,
    limit: BodyLimit,
}

impl Upstreams {
    /// Closes every backend's idle connections that are no longer usable ([`Pool::sweep`]).
    pub fn sweep(&self) {
        for backend in &self.backends {
            backend.pool.sweep();
        }
    }
}

struct Backend {
    /// The Host header: the configured authority.
    authority: String,
    pool: Arc<Pool>,
}

/// A failed attempt, and whether it failed before the backend answered anything (a reused
/// connection the backend had already closed; worth one retry on a new connection).
struct AttemptError {
    failure: UpstreamFailure,
    before_answer: bool,
}

impl Upstreams {
    /// Builds one connection pool per backend; fails on unreadable TLS files.
    pub fn new(config: &Config) -> Result<Upstreams, ClientSetupError> {
        let roots = pdbmux_tls::native_roots();
        let backends = config
            .backends
            .iter()
            .map(|backend| {
                // Read for every backend, as the tokio binary does: a TLS file that cannot be
                // read is refused at start whatever the scheme, and used for https only.
                let connector = tls_for(backend, &roots)?;
                let tls = (backend.url.scheme == "https").then_some(connector);
                let authority = match backend.url.port {
                    Some(port) => format!("{}:{port}", backend.url.host_for_authority()),
                    None => backend.url.host_for_authority(),
                };
                Ok(Backend {
                    authority,
                    pool: Pool::new(Endpoint {
                        host: backend.url.host.clone(),
                        port: backend.url.effective_port(),
                        tls,
                    }),
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
        let backend = self
            .backends
            .get(request.backend.0)
            .ok_or_else(|| UpstreamFailure::Transport(format!("no backend {}", request.backend)))?;
        let wire = request_bytes(&backend.authority, request);
        let (lease, response) = match self.attempt(backend, &wire, false).await {
            Err(error) if error.before_answer => {
                tracing::debug!(
                    backend = %request.backend,
                    "reused connection failed before an answer ({}); retrying on a new one",
                    error.failure
                );
                self.attempt(backend, &wire, true).await
            }
            other => other,
        }
        .map_err(|error| error.failure)?;
        self.read_answer(request, (lease, response), budget).await
    }

    /// Writes the request on a pooled (or, when `fresh`, a new) connection and decodes the head of
    /// the answer.
    async fn attempt(
        &self,
        backend: &Backend,
        wire: &[u8],
        fresh: bool,
    ) -> Result<(Lease, http_types::Response), AttemptError> {
        let lease = backend
            .pool
            .checkout(fresh)
            .await
            .map_err(|error| AttemptError {
                failure: UpstreamFailure::Connect {
                    cause: connect_cause(&error),
                    detail: error_chain(&error),
                },
                before_answer: false,
            })?;
        let retry = lease.reused;
        let mut conn = lease.conn();
        let written = async {
            conn.write_all(wire).await?;
            conn.flush().await
        }
        .await;
        if let Err(error) = written {
            return Err(AttemptError {
                failure: pdbmux_tls::transport_failure(&error),
                before_answer: retry,
            });
        }
        // async-h1 panics on a header value that is UTF-8 but not ASCII; such an answer is a
        // transport failure, not a crash.
        let decoded = AssertUnwindSafe(async_h1::client::decode(lease.conn()))
            .catch_unwind()
            .await;
        match decoded {
            Ok(Ok(response)) => Ok((lease, response)),
            Ok(Err(error)) => Err(AttemptError {
                failure: match error.downcast_ref::<std::io::Error>() {
                    Some(io) => match pdbmux_tls::transport_failure(io) {
                        UpstreamFailure::Transport(detail) => {
                            UpstreamFailure::Transport(format!("reading the answer: {detail}"))
                        }
                        tls => tls,
                    },
                    None => UpstreamFailure::Transport(format!("reading the answer: {error}")),
                },
                before_answer: retry,
            }),
            Err(_) => Err(AttemptError {
                failure: UpstreamFailure::Transport("malformed answer header".into()),
                before_answer: false,
            }),
        }
    }

    async fn read_answer(
        &self,
        request: &UpstreamRequest,
        (mut lease, mut response): (Lease, http_types::Response),
        budget: &BodyBudget,
    ) -> Result<(UpstreamResponse, Option<HeldBody>), UpstreamFailure> {
        let status = StatusCode::from_u16(u16::from(response.status()))
            .map_err(|e| UpstreamFailure::Transport(format!("bad status: {e}")))?;
        let headers = convert_headers(&response);
        let framing = answer_framing(status, &headers)?;
        self.limit.check_declared(framing.length)?;
        lease.reusable = framing.reusable;
        let body = HeldBody::new(
            response.take_body(),
            lease,
            self.limit.bytes(),
            framing.length,
        );
        let limit = self.limit;
        let read_whole = |body: HeldBody| body.read_all(limit, budget);
        take_answer(request, (status, headers), framing.length, body, read_whole).await
    }
}

/// async-h1's headers as an `http::HeaderMap` (values that do not convert are dropped).
fn convert_headers(response: &http_types::Response) -> HeaderMap {
    let mut headers = HeaderMap::new();
    for (name, values) in response.iter() {
        let Ok(name) = HeaderName::from_bytes(name.as_str().as_bytes()) else {
            continue;
        };
        for value in values.iter() {
            if let Ok(value) = HeaderValue::from_str(value.as_str()) {
                headers.append(name.clone(), value);
            }
        }
    }
    headers
}

/// The TLS connector for an https backend: system roots plus its CA file, its client certificate.
fn tls_for(
    backend: &BackendConfig,
    system_roots: &[rustls::pki_types::CertificateDer<'static>],
) -> Result<(TlsConnector, ServerName<'static>), ClientSetupError> {
    let config = pdbmux_tls::client_config(backend, system_roots)?;
    let name =
        ServerName::try_from(backend.url.host.clone()).map_err(|e| ClientSetupError::Tls {
            backend: backend.name.clone(),
            reason: format!("server name {}: {e}", backend.url.host),
        })?;
    Ok((TlsConnector::from(Arc::new(config)), name))
}
