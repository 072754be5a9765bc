//! Building the core's configuration from fake backends.

use std::time::Duration;

use pdbmux_core::config::{BackendConfig, BackendUrl, Config, TlsFiles};

use crate::error::HarnessError;
use crate::script::FakeBackend;

/// The per-upstream timeout the harness configures unless told otherwise.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// Parses `http(s)://host[:port]` (IPv6 literals in brackets, an optional trailing `/`) the way
/// pdbmux's configuration holds it: scheme lower-cased, host as written, IPv6 without brackets.
pub fn parse_backend_url(url: &str) -> Result<BackendUrl, HarnessError> {
    let bad = || HarnessError::BadUrl(url.to_owned());
    let (scheme, rest) = url.split_once("://").ok_or_else(bad)?;
    let scheme = scheme.to_ascii_lowercase();
    if scheme != "http" && scheme != "https" {
        return Err(bad());
    }
    let authority = rest.strip_suffix('/').unwrap_or(rest);
    if authority.is_empty() || authority.contains('/') {
        return Err(bad());
    }
    let (host, port) = if let Some(bracketed) = authority.strip_prefix('[') {
        let (host, after) = bracketed.split_once(']').ok_or_else(bad)?;
        match after {
            "" => (host, None),
            _ => (host, Some(after.strip_prefix(':').ok_or_else(bad)?)),
        }
    } else {
        match authority.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        }
    };
    if host.is_empty() {
        return Err(bad());
    }
    let port = match port {
        Some(port) => Some(port.parse::<u16>().map_err(|_| bad())?),
        None => None,
    };
    Ok(BackendUrl {
        scheme,
        host: host.to_owned(),
        port,
    })
}

/// A configuration with the core's defaults, these backends (in this order) and
/// [`DEFAULT_TIMEOUT`]. The background prober is off: the harness scripts only what requests ask.
pub fn config_for(backends: &[FakeBackend]) -> Result<Config, HarnessError> {
    let mut configured = Vec::with_capacity(backends.len());
    for backend in backends {
        configured.push(BackendConfig {
            name: backend.name.clone(),
            url: parse_backend_url(&backend.url)?,
            tls: TlsFiles::default(),
        });
    }
    let mut config = Config::with_backends(configured);
    config.timeout = DEFAULT_TIMEOUT;
    config.health_probe_enabled = false;
    // The cache is off unless a test turns it on, so transcripts show live fan-outs.
    config.facts_ttl = std::time::Duration::ZERO;
    config.history_ttl = std::time::Duration::ZERO;
    config.aggregate_ttl = std::time::Duration::ZERO;
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let url = parse_backend_url("http://pdb1.example.com").expect("valid");
        assert_eq!(
            (url.scheme.as_str(), url.host.as_str(), url.port),
            ("http", "pdb1.example.com", None)
        );
        let url = parse_backend_url("HTTP://[::1]:8080/").expect("valid");
        assert_eq!(
            (url.scheme.as_str(), url.host.as_str(), url.port),
            ("http", "::1", Some(8080))
        );
        let url = parse_backend_url("https://PDB2.Example.COM:8081").expect("valid");
        assert_eq!(url.host, "PDB2.Example.COM");
        for bad in [
            "pdb1:8080",
            "ftp://x",
            "http://",
            "http://x:port",
            "http://[::1",
            "http://x/y",
        ] {
            assert!(parse_backend_url(bad).is_err(), "{bad}");
        }
    }
}
