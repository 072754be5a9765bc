//! Any request target through routing, parameter and query parsing, query analysis, cache-key
//! derivation and the route policy: planning never panics, whatever the bytes.

#![no_main]
#![forbid(unsafe_code)]

use libfuzzer_sys::fuzz_target;
use pdbmux_core::config::{BackendConfig, BackendUrl, Config, TlsFiles};
use pdbmux_core::ClientRequest;

fn config() -> std::sync::Arc<Config> {
    let backend = |name: &str, port| BackendConfig {
        name: name.into(),
        url: BackendUrl {
            scheme: "http".into(),
            host: "127.0.0.1".into(),
            port: Some(port),
        },
        tls: TlsFiles::default(),
    };
    std::sync::Arc::new(Config::with_backends(vec![
        backend("a", 1),
        backend("b", 2),
    ]))
}

fuzz_target!(|data: &[u8]| {
    let target = String::from_utf8_lossy(data);
    let target = if target.starts_with('/') {
        target.into_owned()
    } else {
        format!("/pdb/query/v4/{target}")
    };
    let planned = pdbmux_core::plan(&ClientRequest::get(target), &config());
    let _ = (planned.class(), planned.is_cacheable());
});
