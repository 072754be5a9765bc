//! The TLS side of talking to https backends (docs/decisions.md D8), shared by both runtimes: the
//! system roots plus a backend's `tls_ca_file`, and its client certificate. Only rustls; each
//! runtime wraps the result in its own connector.

#![forbid(unsafe_code)]

use std::path::Path;
use std::sync::Arc;

use pdbmux_core::config::BackendConfig;
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

#[cfg(test)]
mod tests {
    use super::*;
    use pdbmux_core::config::{BackendUrl, TlsFiles};

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
