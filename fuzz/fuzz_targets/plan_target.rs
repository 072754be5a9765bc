//! Any request target through routing, parameter and query parsing, query analysis, cache-key
//! derivation and the route policy: planning never panics, whatever the bytes.

#![no_main]
#![forbid(unsafe_code)]

use libfuzzer_sys::fuzz_target;
use pdbmux_core::ClientRequest;

fuzz_target!(|data: &[u8]| {
    let target = String::from_utf8_lossy(data);
    let target = if target.starts_with('/') {
        target.into_owned()
    } else {
        format!("/pdb/query/v4/{target}")
    };
    let config = std::sync::Arc::new(pdbmux_fuzz::config(2));
    let planned = pdbmux_core::plan(&ClientRequest::get(target), &config);
    let _ = (planned.class(), planned.is_cacheable());
});
