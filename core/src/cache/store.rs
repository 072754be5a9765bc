//! The cache store interface and its in-memory implementation: a byte budget over stored bodies,
//! evicted least-recently-used, where reads count as use.

use std::collections::BTreeMap;
use std::time::Instant;

use bytes::Bytes;
use http::HeaderMap;

/// One stored response: the fully merged body (provenance already applied) and the headers it
/// was served with (content type, X-Records, X-Backends).
#[derive(Debug, Clone)]
pub struct CachedResponse {
    /// The body bytes, served as they are on a hit.
    pub body: Bytes,
    /// The headers stored with it.
    pub headers: HeaderMap,
    /// When it was stored; its age is measured from here.
    pub stored_at: Instant,
    /// How long after `stored_at` it is fresh (its class's TTL).
    pub ttl: std::time::Duration,
}

/// Counters a store reports for `/healthz`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StoreStats {
    /// Entries held, fresh or expired.
    pub entries: usize,
    /// Entries past the TTL (kept for stale-on-failure).
    pub stale_entries: usize,
    /// Bytes of stored bodies.
    pub bytes: u64,
}

/// Where merged responses are kept. The estate uses only this interface, so another store (for
/// example an object store for `/reports`) can replace the memory one without handler changes.
pub trait CacheStore: std::fmt::Debug + Send {
    /// The entry for `key`, marking it used; `None` when absent.
    fn get(&mut self, key: &str) -> Option<CachedResponse>;
    /// Stores `value` under `key`, replacing an older entry and evicting as the budget requires.
    /// Returns the keys evicted (for logs); a body larger than the whole budget is not stored.
    fn put(&mut self, key: String, value: CachedResponse) -> Vec<String>;
    /// What the store holds; `ttl` decides which entries count as stale at `now`.
    fn stats(&self, now: Instant) -> StoreStats;
}

/// The in-memory store: a body-byte budget, least-recently-used eviction.
#[derive(Debug)]
pub struct MemoryStore {
    budget: u64,
    bytes: u64,
    tick: u64,
    entries: BTreeMap<String, (CachedResponse, u64)>,
    /// Use order: tick of last use → key.
    recency: BTreeMap<u64, String>,
}

impl MemoryStore {
    /// An empty store with a budget of `budget` body bytes.
    pub fn new(budget: u64) -> MemoryStore {
        MemoryStore {
            budget,
            bytes: 0,
            tick: 0,
            entries: BTreeMap::new(),
            recency: BTreeMap::new(),
        }
    }

    fn next_tick(&mut self) -> u64 {
        self.tick += 1;
        self.tick
    }

    fn remove(&mut self, key: &str) {
        if let Some((old, tick)) = self.entries.remove(key) {
            self.bytes -= old.body.len() as u64;
            self.recency.remove(&tick);
        }
    }
}

impl CacheStore for MemoryStore {
    fn get(&mut self, key: &str) -> Option<CachedResponse> {
        let tick = self.next_tick();
        let (value, old_tick) = self.entries.get_mut(key)?;
        let old = std::mem::replace(old_tick, tick);
        let value = value.clone();
        if let Some(key) = self.recency.remove(&old) {
            self.recency.insert(tick, key);
        }
        Some(value)
    }

    fn put(&mut self, key: String, value: CachedResponse) -> Vec<String> {
        let size = value.body.len() as u64;
        self.remove(&key);
        if size > self.budget {
            return Vec::new();
        }
        let mut evicted = Vec::new();
        while self.bytes + size > self.budget {
            let Some((_, oldest)) = self.recency.pop_first() else {
                break;
            };
            if let Some((old, _)) = self.entries.remove(&oldest) {
                self.bytes -= old.body.len() as u64;
            }
            evicted.push(oldest);
        }
        let tick = self.next_tick();
        self.bytes += size;
        self.recency.insert(tick, key.clone());
        self.entries.insert(key, (value, tick));
        evicted
    }

    fn stats(&self, now: Instant) -> StoreStats {
        StoreStats {
            entries: self.entries.len(),
            stale_entries: self
                .entries
                .values()
                .filter(|(value, _)| now.saturating_duration_since(value.stored_at) >= value.ttl)
                .count(),
            bytes: self.bytes,
        }
    }
}

#[cfg(test)]
#[allow(clippy::disallowed_methods)] // tests need one real instant to start from
mod tests {
    use super::*;
    use std::time::Duration;

    fn entry(size: usize, at: Instant) -> CachedResponse {
        CachedResponse {
            body: Bytes::from(vec![b'x'; size]),
            headers: HeaderMap::new(),
            stored_at: at,
            ttl: Duration::from_secs(30),
        }
    }

    #[test]
    fn least_recently_used_goes_first_and_reads_count_as_use() {
        let t0 = Instant::now();
        let mut store = MemoryStore::new(30);
        assert!(store.put("a".into(), entry(10, t0)).is_empty());
        assert!(store.put("b".into(), entry(10, t0)).is_empty());
        assert!(store.put("c".into(), entry(10, t0)).is_empty());
        assert!(store.get("a").is_some(), "a is now the most recent");
        assert_eq!(store.put("d".into(), entry(10, t0)), vec!["b".to_owned()]);
        assert_eq!(
            store.put("e".into(), entry(15, t0)),
            vec!["c".to_owned(), "a".to_owned()]
        );
        assert_eq!(store.stats(t0).bytes, 25);
        assert!(store.get("b").is_none());
    }

    #[test]
    fn a_body_over_the_budget_is_not_stored_and_the_budget_holds() {
        let t0 = Instant::now();
        let mut store = MemoryStore::new(10);
        store.put("small".into(), entry(4, t0));
        assert!(store.put("huge".into(), entry(11, t0)).is_empty());
        assert!(store.get("huge").is_none());
        assert!(store.get("small").is_some());
        store.put("small".into(), entry(10, t0));
        assert_eq!(
            store.stats(t0),
            StoreStats {
                entries: 1,
                stale_entries: 0,
                bytes: 10
            }
        );
    }

    #[test]
    fn stale_entries_are_counted_not_dropped() {
        let t0 = Instant::now();
        let mut store = MemoryStore::new(100);
        store.put("old".into(), entry(1, t0));
        store.put("new".into(), entry(1, t0 + Duration::from_secs(20)));
        let stats = store.stats(t0 + Duration::from_secs(31));
        assert_eq!((stats.entries, stats.stale_entries), (2, 1));
    }
}
