//! The TLS side of talking to https backends (docs/decisions.md D8), shared by both runtimes: the
//! system roots plus a backend's `tls_ca_file`, and its client certificate. Only rustls; each
//! runtime wraps the result in its own connector.

#![forbid(unsafe_code)]

use std::path::Path;
use std::sync::Arc;

use pdbmux_core::config::BackendConfig;
use pdbmux_core::{ConnectCause, UpstreamFailure};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// Why a backend's TLS client could not be set up at startup.
#[derive(Debug, thiserror::Error)]
pub enum ClientSetupError {
    /// A TLS file could not be read or parsed.
    #[error("backend {backend}: {what} {path}: {reason}")]
    TlsFile {
        /// The backend's name.
        backend: String,
        /// Which file (CA bundle, certificate, key).
        what: &'static str,
        /// The path.
        path: String,
        /// What went wrong (never the key's contents).
        reason: String,
    },
    /// rustls refused the configuration.
    #[error("backend {backend}: tls setup: {reason}")]
    Tls {
        /// The backend's name.
        backend: String,
        /// What went wrong.
        reason: String,
    },
}

/// The system's CA certificates; load once at startup and pass to [`client_config`] for each
/// backend. An image without any still works with a backend's own `tls_ca_file`.
pub fn native_roots() -> Vec<CertificateDer<'static>> {
    let loaded = rustls_native_certs::load_native_certs();
    for error in &loaded.errors {
        tracing::debug!("loading system CA certificates: {error}");
    }
    loaded.certs
}

/// The rustls client configuration for one backend: `system_roots` plus its CA file, and its
/// client certificate and key when both are set (one without the other is an error). Keys are
/// never logged or quoted in errors.
pub fn client_config(
    backend: &BackendConfig,
    system_roots: &[CertificateDer<'static>],
) -> Result<rustls::ClientConfig, ClientSetupError> {
    let file_error = |what: &'static str, path: &Path, reason: String| ClientSetupError::TlsFile {
        backend: backend.name.clone(),
        what,
        path: path.display().to_string(),
        reason,
    };
    let tls_error = |reason: String| ClientSetupError::Tls {
        backend: backend.name.clone(),
        reason,
    };
    let mut roots = rustls::RootCertStore::empty();
    roots.add_parsable_certificates(system_roots.iter().cloned());
    if let Some(path) = &backend.tls.ca_file {
        let certs = read_certs(path).map_err(|reason| file_error("CA file", path, reason))?;
        let (added, _) = roots.add_parsable_certificates(certs);
        if added == 0 {
            return Err(file_error("CA file", path, "no usable certificate".into()));
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| tls_error(e.to_string()))?
        .with_root_certificates(roots);
    match (&backend.tls.cert_file, &backend.tls.key_file) {
        (Some(cert_path), Some(key_path)) => {
            let certs = read_certs(cert_path)
                .map_err(|reason| file_error("certificate file", cert_path, reason))?;
            let key = PrivateKeyDer::from_pem_file(key_path).map_err(|_| {
                file_error("key file", key_path, "no readable PEM private key".into())
            })?;
            builder
                .with_client_auth_cert(certs, key)
                .map_err(|e| tls_error(e.to_string()))
        }
        (None, None) => Ok(builder.with_no_client_auth()),
        _ => Err(tls_error(
            "tls_cert_file and tls_key_file must be set together".into(),
        )),
    }
}

fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| e.to_string())?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| e.to_string())?;
    if certs.is_empty() {
        return Err("no PEM certificate found".into());
    }
    Ok(certs)
}

/// An error and its sources on one line, for logs and 502 bodies.
pub fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

/// What kind of connect failure `error` is, from the errors in its chain: a rustls error is TLS,
/// an I/O error says refused or timed out by its kind, and a failed name lookup is known by the
/// resolver's words (getaddrinfo's error has no kind of its own: std reports it as "failed to
/// lookup address information", hyper-util as "dns error"). An I/O error's `source` skips the
/// error it wraps, so that one is looked into as well (TLS connectors wrap rustls's error in one,
/// and sometimes that in another). Call it on the error a runtime got while connecting.
pub fn connect_cause(error: &(dyn std::error::Error + 'static)) -> ConnectCause {
    let mut found = ConnectCause::Other;
    let mut next = Some(error);
    while let Some(error) = next {
        if let Some(cause) = wrapped_cause(error, &mut found) {
            return cause;
        }
        next = error.source();
    }
    found
}

/// The failure of an exchange that broke after its connection was made: a TLS failure when
/// rustls is in the chain (under TLS 1.3 a PuppetDB that refuses pdbmux's client certificate
/// says so with an alert after the handshake, so it surfaces here, not while connecting), else
/// a transport failure. Call it on the error a runtime got while writing a request or reading
/// its answer.
pub fn transport_failure(error: &(dyn std::error::Error + 'static)) -> UpstreamFailure {
    let mut found = ConnectCause::Other;
    let mut next = Some(error);
    while let Some(link) = next {
        if wrapped_cause(link, &mut found) == Some(ConnectCause::Tls) {
            return UpstreamFailure::Connect {
                cause: ConnectCause::Tls,
                detail: error_chain(error),
            };
        }
        next = link.source();
    }
    UpstreamFailure::Transport(error_chain(error))
}

/// TLS when `error`, or an error an I/O error in it wraps, is rustls's; otherwise notes in
/// `found` the refusal, timeout or failed lookup it shows.
fn wrapped_cause(
    error: &(dyn std::error::Error + 'static),
    found: &mut ConnectCause,
) -> Option<ConnectCause> {
    if error.downcast_ref::<rustls::Error>().is_some() {
        return Some(ConnectCause::Tls);
    }
    if let Some(io) = error.downcast_ref::<std::io::Error>() {
        match io.kind() {
            std::io::ErrorKind::ConnectionRefused => *found = ConnectCause::Refused,
            std::io::ErrorKind::TimedOut => *found = ConnectCause::Timeout,
            _ => {}
        }
        if let Some(inner) = io.get_ref() {
            if let Some(cause) = wrapped_cause(inner, found) {
                return Some(cause);
            }
        }
    }
    let text = error.to_string();
    if *found == ConnectCause::Other
        && (text.contains("failed to lookup address") || text.starts_with("dns error"))
    {
        *found = ConnectCause::Dns;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use pdbmux_core::config::{BackendUrl, TlsFiles};

    /// An error wrapping `source`, as connectors wrap the I/O error they got.
    #[derive(Debug, thiserror::Error)]
    #[error("client error (Connect)")]
    struct Wrapped(#[source] std::io::Error);

    #[test]
    fn connect_causes_are_told_apart_through_the_chain() {
        // A port nothing listens on: bind one, learn it, close it.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("bind")
            .port();
        let refused = std::net::TcpStream::connect(("127.0.0.1", port)).expect_err("refused");
        assert_eq!(connect_cause(&Wrapped(refused)), ConnectCause::Refused);

        let timed_out = std::io::Error::from(std::io::ErrorKind::TimedOut);
        assert_eq!(connect_cause(&Wrapped(timed_out)), ConnectCause::Timeout);

        let tls = std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer),
        );
        assert_eq!(connect_cause(&Wrapped(tls)), ConnectCause::Tls);
        let bare_tls = rustls::Error::General("handshake".into());
        assert_eq!(connect_cause(&bare_tls), ConnectCause::Tls);
        // As hyper-rustls hands it over: rustls's error in an I/O error in another.
        let twice = std::io::Error::other(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            rustls::Error::InvalidMessage(rustls::InvalidMessage::InvalidContentType),
        ));
        assert_eq!(connect_cause(&Wrapped(twice)), ConnectCause::Tls);

        let lookup = std::io::Error::other(
            "failed to lookup address information: Name or service not known",
        );
        assert_eq!(connect_cause(&Wrapped(lookup)), ConnectCause::Dns);

        let unreachable = std::io::Error::other("No route to host");
        assert_eq!(connect_cause(&Wrapped(unreachable)), ConnectCause::Other);
    }

    #[test]
    fn a_tls_alert_after_the_handshake_is_a_tls_failure_and_a_reset_a_transport_one() {
        let alert = std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            rustls::Error::AlertReceived(rustls::AlertDescription::CertificateRequired),
        );
        assert!(matches!(
            transport_failure(&Wrapped(alert)),
            UpstreamFailure::Connect {
                cause: ConnectCause::Tls,
                ..
            }
        ));
        let reset = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
        assert!(matches!(
            transport_failure(&Wrapped(reset)),
            UpstreamFailure::Transport(_)
        ));
    }

    fn backend(tls: TlsFiles) -> BackendConfig {
        BackendConfig {
            name: "pdb-a".into(),
            url: BackendUrl {
                scheme: "https".into(),
                host: "127.0.0.1".into(),
                port: Some(8081),
            },
            tls,
        }
    }

    #[test]
    fn a_missing_file_names_the_backend_and_the_path() {
        let error = client_config(
            &backend(TlsFiles {
                ca_file: Some("/nonexistent/ca.pem".into()),
                ..TlsFiles::default()
            }),
            &[],
        )
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
        assert!(
            error.starts_with("backend pdb-a: CA file /nonexistent/ca.pem:"),
            "{error}"
        );
    }

    #[test]
    fn a_certificate_without_its_key_is_refused() {
        let error = client_config(
            &backend(TlsFiles {
                cert_file: Some("/nonexistent/cert.pem".into()),
                ..TlsFiles::default()
            }),
            &[],
        )
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
        assert_eq!(
            error,
            "backend pdb-a: tls setup: tls_cert_file and tls_key_file must be set together"
        );
    }

    #[test]
    fn no_files_is_a_plain_client() {
        assert!(client_config(&backend(TlsFiles::default()), &[]).is_ok());
    }
}
