//! What the fuzz targets share: the configuration they run the core on.

#![forbid(unsafe_code)]

use pdbmux_core::config::{BackendConfig, BackendUrl, Config, TlsFiles};

/// The defaults with `backends` loopback backends named `a`, `b`, … (never asked: the targets
/// answer for them), the prober off.
pub fn config(backends: u16) -> Config {
    let backends = (0..backends)
        .map(|i| BackendConfig {
            name: char::from(b'a' + u8::try_from(i % 26).unwrap_or(0)).to_string(),
            url: BackendUrl {
                scheme: "http".into(),
                host: "127.0.0.1".into(),
                port: Some(1 + i),
            },
            tls: TlsFiles::default(),
        })
        .collect();
    Config {
        health_probe_enabled: false,
        ..Config::with_backends(backends)
    }
}
