//! Any value under a key of the shared cache store: another program's, a damaged one, a forged
//! envelope (raw bytes), or an envelope signed with the deployment's own secret around any body
//! and any date (the fuzzer chooses them). The estate reads it and never panics; raw bytes are
//! never served (they cannot carry a valid tag); a signed envelope is served only when its body is
//! JSON and its date is within the TTL, and then with only the headers pdbmux builds.

#![no_main]
#![forbid(unsafe_code)]

use libfuzzer_sys::fuzz_target;
use pdbmux_core::cache::shared::{encode, StoreAnswer, StoreOp};
use pdbmux_core::config::{CacheBackend, Config, Secret, TlsFiles};
use pdbmux_core::{Admission, ClientRequest, ClockAnchor, Estate, EstateOutput, ResponseBody};

const TARGET: &str = "/pdb/query/v4/fact-names";
/// The wall clock of the run, in milliseconds since the epoch.
const NOW_MS: u64 = 1_700_000_000_000;

fn secret() -> Secret {
    Secret::new(b"fuzzing-secret-0123456789abcdef".to_vec())
}

/// One backend and a shared store.
fn config() -> Config {
    Config {
        cache_backend: CacheBackend::Redis {
            url: "redis://127.0.0.1:6379".into(),
            tls: TlsFiles::default(),
            secret: secret(),
            password: None,
        },
        ..pdbmux_fuzz::config(1)
    }
}

/// The stored value: the raw bytes, or (first byte odd) an envelope signed with the secret,
/// dated by the next 8 bytes' offset from now, around the rest as the body.
fn value(data: &[u8], key: &str) -> (bytes::Bytes, Option<bytes::Bytes>) {
    match data.split_first() {
        Some((mode, rest)) if mode % 2 == 1 && rest.len() >= 8 => {
            let (offset, body) = rest.split_at(8);
            let offset = i64::from_le_bytes(offset.try_into().unwrap_or_default()) % 3_600_000;
            let stored_at = NOW_MS.saturating_add_signed(offset);
            let mut headers = http::HeaderMap::new();
            headers.insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static(pdbmux_core::JSON_CONTENT_TYPE),
            );
            let body = bytes::Bytes::copy_from_slice(body);
            let value = encode(&secret(), key, stored_at, http::StatusCode::OK, &headers, &body)
                .unwrap_or_default();
            (value, Some(body))
        }
        _ => (bytes::Bytes::copy_from_slice(data), None),
    }
}

fuzz_target!(|data: &[u8]| {
    let now = std::time::Instant::now();
    let clock = ClockAnchor {
        instant: now,
        wall: std::time::UNIX_EPOCH + std::time::Duration::from_millis(NOW_MS),
    };
    let mut estate = Estate::new(config(), clock);
    let planned = pdbmux_core::plan(&ClientRequest::get(TARGET), estate.config());
    let Admission::Wait(_) = estate.admit(now, planned) else {
        panic!("a miss with a shared store asks the store first");
    };
    let key = format!("pdbmux:entry:{TARGET}");
    let (value, signed_body) = value(data, &key);
    for _ in 0..4 {
        let outputs: Vec<EstateOutput> = std::iter::from_fn(|| estate.poll_output()).collect();
        for output in outputs {
            match output {
                EstateOutput::Store(request) => {
                    let answer = match request.op {
                        StoreOp::Get { .. } => StoreAnswer::Value(Some(value.clone())),
                        StoreOp::Lock { .. } => StoreAnswer::Locked(false),
                        _ => StoreAnswer::Done,
                    };
                    estate.handle_store_answer(now, request.id, answer);
                }
                EstateOutput::Respond { response, .. } => {
                    let Some(body) = &signed_body else {
                        panic!("raw bytes served from the store: {value:?}");
                    };
                    let ResponseBody::Full(served) = &response.body else {
                        panic!("a hit is a whole body");
                    };
                    assert_eq!(served, body, "served a body other than the one signed");
                    assert!(pdbmux_core::check_json(served).is_ok());
                    for name in response.headers.keys() {
                        assert!(
                            ["content-type", "x-cache", "age"].contains(&name.as_str()),
                            "a header from the store: {name}"
                        );
                    }
                }
                _ => {}
            }
        }
    }
});
