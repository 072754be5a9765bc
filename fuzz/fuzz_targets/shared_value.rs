//! Any value under a key of the shared cache store (another program's, a damaged one, a forged
//! envelope): the estate reads it, and never panics; what it serves from the store is only what
//! decodes as pdbmux's own envelope.

#![no_main]
#![forbid(unsafe_code)]

use libfuzzer_sys::fuzz_target;
use pdbmux_core::cache::shared::{StoreAnswer, StoreOp};
use pdbmux_core::config::{CacheBackend, Config, TlsFiles};
use pdbmux_core::{Admission, ClientRequest, ClockAnchor, Estate, EstateOutput};

/// One backend and a shared store.
fn config() -> Config {
    Config {
        cache_backend: CacheBackend::Redis {
            url: "redis://127.0.0.1:6379".into(),
            tls: TlsFiles::default(),
        },
        ..pdbmux_fuzz::config(1)
    }
}

fuzz_target!(|data: &[u8]| {
    let now = std::time::Instant::now();
    let clock = ClockAnchor {
        instant: now,
        wall: std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_700_000_000),
    };
    let mut estate = Estate::new(config(), clock);
    let planned = pdbmux_core::plan(
        &ClientRequest::get("/pdb/query/v4/fact-names"),
        estate.config(),
    );
    let Admission::Wait(_) = estate.admit(now, planned) else {
        panic!("a miss with a shared store asks the store first");
    };
    let value = bytes::Bytes::copy_from_slice(data);
    for _ in 0..4 {
        let outputs: Vec<EstateOutput> = std::iter::from_fn(|| estate.poll_output()).collect();
        for output in outputs {
            if let EstateOutput::Store(request) = output {
                let answer = match request.op {
                    StoreOp::Get { .. } => StoreAnswer::Value(Some(value.clone())),
                    StoreOp::Lock { .. } => StoreAnswer::Locked(false),
                    _ => StoreAnswer::Done,
                };
                estate.handle_store_answer(now, request.id, answer);
            }
        }
    }
});
