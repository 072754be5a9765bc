//! The upstream client: the request head written verbatim, the answer decoded by async-h1, a small
//! pool of keep-alive connections per backend (futures-rustls for https), bodies bounded by
//! `max_body_bytes` while they are read. The caller bounds each request by its deadline (by
//! dropping it).

use std::io;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures_rustls::TlsConnector;
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use pdbmux_core::config::{BackendConfig, Config};
use pdbmux_core::{UpstreamBody, UpstreamFailure, UpstreamRequest, UpstreamResponse};
use rustls::pki_types::ServerName;
use smol::future::FutureExt;
use smol::io::AsyncWriteExt;

use crate::body::{HeldBody, OverLimit};
use crate::pool::{Endpoint, Lease, Pool};

pub use pdbmux_tls::{error_chain, ClientSetupError};

/// The clients for every backend, in configured order.
pub struct Upstreams {
    backends: Vec<Backend>,
    max_body_bytes: u64,
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
                let tls = match backend.url.scheme.as_str() {
                    "https" => Some(tls_for(backend, &roots)?),
                    _ => None,
                };
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
            max_body_bytes: config.max_body_bytes,
        })
    }

    /// Sends one upstream request and reads its answer as the request's body mode says. The caller
    /// bounds it by the request's deadline.
    pub async fn send(
        &self,
        request: &UpstreamRequest,
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
        self.read_answer(request, lease, response).await
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
                failure: UpstreamFailure::Connect(error_chain(&error)),
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
                failure: UpstreamFailure::Transport(error_chain(&error)),
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
                failure: UpstreamFailure::Transport(format!("reading the answer: {error}")),
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
        mut lease: Lease,
        mut response: http_types::Response,
    ) -> Result<(UpstreamResponse, Option<HeldBody>), UpstreamFailure> {
        let status = StatusCode::from_u16(u16::from(response.status()))
            .map_err(|e| UpstreamFailure::Transport(format!("bad status: {e}")))?;
        let headers = convert_headers(&response);
        let length = match headers.get(http::header::CONTENT_LENGTH) {
            Some(value) => Some(
                value
                    .to_str()
                    .ok()
                    .and_then(|v| v.trim().parse::<u64>().ok())
                    .ok_or_else(|| UpstreamFailure::Transport("bad Content-Length".into()))?,
            ),
            None => None,
        };
        if length.is_some_and(|length| length > self.max_body_bytes) {
            return Err(UpstreamFailure::BodyTooLarge {
                limit: self.max_body_bytes,
            });
        }
        let chunked = headers
            .get(http::header::TRANSFER_ENCODING)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.trim().to_ascii_lowercase().ends_with("chunked"));
        let bodiless = status.is_informational()
            || status == StatusCode::NO_CONTENT
            || status == StatusCode::NOT_MODIFIED;
        if length.is_none() && !chunked && !bodiless {
            // async-h1 does not read a body delimited by the connection's close.
            return Err(UpstreamFailure::Transport(
                "answer without Content-Length or chunked framing".into(),
            ));
        }
        lease.reusable = !has_token(&headers, "close");
        let body = HeldBody::new(response.take_body(), lease, self.max_body_bytes, length);
        if request.body_mode.holds(status, length) {
            let response = UpstreamResponse {
                status,
                headers,
                body: UpstreamBody::Held,
            };
            return Ok((response, Some(body)));
        }
        let bytes = body.read_all().await.map_err(|e| self.body_error(&e))?;
        let response = UpstreamResponse {
            status,
            headers,
            body: UpstreamBody::Full(bytes),
        };
        Ok((response, None))
    }

    /// Maps a body read error: over the limit, or a transport failure.
    pub fn body_error(&self, error: &io::Error) -> UpstreamFailure {
        if error.get_ref().is_some_and(|inner| inner.is::<OverLimit>()) {
            UpstreamFailure::BodyTooLarge {
                limit: self.max_body_bytes,
            }
        } else {
            UpstreamFailure::Transport(error_chain(error))
        }
    }
}

/// The request head (and JSON body), exactly as sent: the core's path and query go out verbatim.
fn request_bytes(authority: &str, request: &UpstreamRequest) -> Vec<u8> {
    let body: &[u8] = request.body.as_deref().unwrap_or_default();
    let mut wire = Vec::with_capacity(256 + request.path_and_query.len() + body.len());
    wire.extend_from_slice(request.method.as_str().as_bytes());
    wire.push(b' ');
    wire.extend_from_slice(request.path_and_query.as_bytes());
    wire.extend_from_slice(b" HTTP/1.1\r\nhost: ");
    wire.extend_from_slice(authority.as_bytes());
    wire.extend_from_slice(b"\r\naccept: application/json\r\nuser-agent: pdbmux/");
    wire.extend_from_slice(env!("CARGO_PKG_VERSION").as_bytes());
    wire.extend_from_slice(b"\r\n");
    if request.body.is_some() {
        wire.extend_from_slice(b"content-type: application/json\r\ncontent-length: ");
        wire.extend_from_slice(body.len().to_string().as_bytes());
        wire.extend_from_slice(b"\r\n");
    }
    wire.extend_from_slice(b"\r\n");
    wire.extend_from_slice(body);
    wire
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

/// Whether a `Connection` header names `token`.
fn has_token(headers: &HeaderMap, token: &str) -> bool {
    headers
        .get_all(http::header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case(token))
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

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use pdbmux_core::{BackendId, BodyMode, UpstreamId};

    use super::*;

    fn request(method: http::Method, target: &str, body: Option<&'static str>) -> UpstreamRequest {
        UpstreamRequest {
            id: UpstreamId(0),
            backend: BackendId(0),
            method,
            path_and_query: target.to_owned(),
            body: body.map(bytes::Bytes::from),
            body_mode: BodyMode::Buffer,
            deadline: Instant::now(),
        }
    }

    #[test]
    fn the_target_goes_out_verbatim() {
        let target = "/pdb/query/v4/nodes?query=%5B%22=%22%5D&x='y'";
        let wire = request_bytes("db:8081", &request(http::Method::GET, target, None));
        let text = String::from_utf8(wire).unwrap_or_default();
        assert!(text.starts_with(&format!("GET {target} HTTP/1.1\r\nhost: db:8081\r\n")));
        assert!(text.ends_with("\r\n\r\n") && !text.contains("content-length"));
    }

    #[test]
    fn a_post_carries_its_json_body_with_a_length() {
        let wire = request_bytes(
            "db",
            &request(http::Method::POST, "/pdb/query/v4/nodes", Some("{\"q\":1}")),
        );
        let text = String::from_utf8(wire).unwrap_or_default();
        assert!(text.starts_with("POST /pdb/query/v4/nodes HTTP/1.1\r\n"));
        assert!(text.contains("content-type: application/json\r\ncontent-length: 7\r\n"));
        assert!(text.ends_with("\r\n\r\n{\"q\":1}"));
    }
}
