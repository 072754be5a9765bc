//! The cache store the runtimes use: the core's memory store, with large bodies sealed.

use std::time::{Duration, Instant};

use pdbmux_core::cache::{CacheStore, CachedResponse, MemoryStore, StoreStats};

use crate::{Sealer, SEAL_THRESHOLD};

/// [`MemoryStore`] (the same budget, eviction and counters), except that a body of at least
/// [`SEAL_THRESHOLD`] bytes is stored sealed ([`Sealer::seal`]), so that hits and stale serves of
/// it are sent from the sealed mapping. A body the runtime sealed already
/// ([`Sealer::seal_flight_answer`]) is stored as it is.
#[derive(Debug)]
pub struct SealingStore {
    inner: MemoryStore,
    budget: u64,
    sealer: Sealer,
}

impl SealingStore {
    /// An empty store with a budget of `budget` body bytes (`facts_cache_bytes`).
    pub fn new(budget: u64) -> SealingStore {
        SealingStore {
            inner: MemoryStore::new(budget),
            budget,
            sealer: Sealer::new(budget),
        }
    }

    /// The store's sealer, for the runtimes to seal flights' answers with
    /// ([`Sealer::seal_flight_answer`]): the padding it allows is shared with the store's.
    pub fn sealer(&self) -> Sealer {
        self.sealer.clone()
    }
}

impl CacheStore for SealingStore {
    fn get(&mut self, key: &str) -> Option<CachedResponse> {
        self.inner.get(key)
    }

    fn put(&mut self, key: String, mut value: CachedResponse) -> Vec<String> {
        let size = value.body.len();
        // A body over the whole budget is not stored: do not seal it for nothing.
        if size >= SEAL_THRESHOLD
            && size as u64 <= self.budget
            && crate::find(&value.body).is_none()
        {
            value.body = self.sealer.seal(value.body);
        }
        self.inner.put(key, value)
    }

    fn stats(&self, now: Instant, ttl: Duration) -> StoreStats {
        self.inner.stats(now, ttl)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::disallowed_methods)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use http::HeaderMap;

    fn entry(body: Vec<u8>) -> CachedResponse {
        CachedResponse {
            body: Bytes::from(body),
            headers: HeaderMap::new(),
            stored_at: Instant::now(),
        }
    }

    #[test]
    fn large_bodies_are_stored_sealed_and_small_ones_as_they_are() {
        let mut store = SealingStore::new(4 << 20);
        let large: Vec<u8> = (0..SEAL_THRESHOLD + 3).map(|i| i as u8).collect();
        store.put("large".into(), entry(large.clone()));
        store.put("small".into(), entry(vec![b'x'; 100]));
        let hit = store.get("large").unwrap();
        assert_eq!(&hit.body[..], &large[..]);
        assert_eq!(
            crate::find(&hit.body).is_some(),
            cfg!(target_os = "linux"),
            "sealed on Linux"
        );
        assert!(crate::find(&store.get("small").unwrap().body).is_none());
        assert_eq!(
            store.stats(Instant::now(), Duration::from_secs(30)).bytes,
            (SEAL_THRESHOLD + 3 + 100) as u64
        );
    }

    #[test]
    fn a_flight_answer_is_sealed_once_and_stored_as_it_is() {
        let large: Vec<u8> = (0..SEAL_THRESHOLD).map(|i| (i % 251) as u8).collect();
        let answer = |status: http::StatusCode, body: &[u8]| pdbmux_core::Response {
            status,
            headers: HeaderMap::new(),
            body: pdbmux_core::ResponseBody::Full(Bytes::copy_from_slice(body)),
        };
        let body_of = |response: &pdbmux_core::Response| match &response.body {
            pdbmux_core::ResponseBody::Full(body) => body.clone(),
            other => panic!("unexpected body {other:?}"),
        };
        let mut store = SealingStore::new(4 << 20);
        let sealer = store.sealer();
        let sealed = body_of(&sealer.seal_flight_answer(answer(http::StatusCode::OK, &large)));
        assert_eq!(&sealed[..], &large[..]);
        assert_eq!(crate::find(&sealed).is_some(), cfg!(target_os = "linux"));
        // Errors and small bodies stay on the heap.
        let error = sealer.seal_flight_answer(answer(http::StatusCode::BAD_GATEWAY, &large));
        assert!(crate::find(&body_of(&error)).is_none());
        let small = sealer.seal_flight_answer(answer(http::StatusCode::OK, b"[]"));
        assert!(crate::find(&body_of(&small)).is_none());
        // The store keeps the sealed body it is given instead of sealing a second copy.
        store.put(
            "k".into(),
            CachedResponse {
                body: sealed.clone(),
                headers: HeaderMap::new(),
                stored_at: Instant::now(),
            },
        );
        assert_eq!(store.get("k").unwrap().body.as_ptr(), sealed.as_ptr());
    }
}
