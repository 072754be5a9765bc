//! The shared tier of the cache (docs/caching.md): entries every replica reads and writes in a
//! Redis-protocol store, and a lock per key so that concurrent misses on different replicas make
//! one fan-out. The core decides everything (hit, miss, stale, store, lock, wait, give up); the
//! runtime only carries each [`StoreRequest`] to the store and hands back its [`StoreAnswer`].
//!
//! A stored value is pdbmux's own envelope: a version line with the wall-clock time it was stored
//! (so a hit on another replica carries the right `Age`), the headers, the body. A value that does
//! not parse as one (another program's, a truncated one) is ignored, never served.

use std::time::{Duration, Instant};

use bytes::{BufMut, Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue};

/// One request to the shared store, issued by the [`crate::Estate`]; the runtime answers it with
/// [`crate::Estate::handle_store_answer`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct StoreId(pub u64);

/// What to ask the shared store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreOp {
    /// `GET key`: answered with [`StoreAnswer::Value`].
    Get {
        /// The full key, prefix included.
        key: String,
    },
    /// `SET key value PX keep`: answered with [`StoreAnswer::Done`].
    Put {
        /// The full key.
        key: String,
        /// The envelope (`encode`).
        value: Bytes,
        /// How long the store keeps it: the TTL plus the stale window.
        keep: Duration,
    },
    /// `SET key token NX PX lease`: answered with [`StoreAnswer::Locked`].
    Lock {
        /// The lock's full key.
        key: String,
        /// This replica's token, so only the holder releases it.
        token: String,
        /// The lock's lifetime: a holder that dies frees it by then.
        lease: Duration,
    },
    /// Delete `key` if it still holds `token`: answered with [`StoreAnswer::Done`].
    Unlock {
        /// The lock's full key.
        key: String,
        /// The token it was taken with.
        token: String,
    },
}

/// One store request for the runtime to carry out by `deadline` (after it, the core has counted
/// it as failed and ignores a late answer).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreRequest {
    /// Hand it back with the answer.
    pub id: StoreId,
    /// What to do.
    pub op: StoreOp,
    /// When the core stops waiting.
    pub deadline: Instant,
}

/// What the store answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreAnswer {
    /// A `Get`: the value, or `None` when the key holds nothing.
    Value(Option<Bytes>),
    /// A `Lock`: whether this replica now holds it.
    Locked(bool),
    /// A `Put` or `Unlock` was carried out.
    Done,
    /// The store could not be asked or answered an error (its text, for the log).
    Failed(String),
}

/// The first bytes of every value pdbmux stores.
const MAGIC: &[u8] = b"pdbmux-cache-v1 ";

/// One entry read from the shared store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SharedEntry {
    /// When it was stored, in milliseconds since the Unix epoch (the writer's clock).
    pub stored_at_ms: u64,
    /// The headers it was served with.
    pub headers: HeaderMap,
    /// The merged body.
    pub body: Bytes,
}

/// The envelope of an entry: `pdbmux-cache-v1 <stored_at_ms> <header bytes> <body bytes>\n`,
/// then the headers as `name: value\n` lines, then the body (both lengths checked on reading, so
/// a truncated value is no entry).
pub(crate) fn encode(stored_at_ms: u64, headers: &HeaderMap, body: &Bytes) -> Bytes {
    let mut head = Vec::new();
    for (name, value) in headers {
        head.extend_from_slice(name.as_str().as_bytes());
        head.extend_from_slice(b": ");
        head.extend_from_slice(value.as_bytes());
        head.push(b'\n');
    }
    let line = format!("{stored_at_ms} {} {}\n", head.len(), body.len());
    let mut out = BytesMut::with_capacity(MAGIC.len() + line.len() + head.len() + body.len());
    out.put_slice(MAGIC);
    out.put_slice(line.as_bytes());
    out.put_slice(&head);
    out.put_slice(body);
    out.freeze()
}

/// An entry from its envelope; `None` for anything else.
pub(crate) fn decode(value: &Bytes) -> Option<SharedEntry> {
    let rest = value.strip_prefix(MAGIC)?;
    let newline = rest.iter().position(|b| *b == b'\n')?;
    let line = std::str::from_utf8(&rest[..newline]).ok()?;
    let mut numbers = line.split(' ');
    let stored_at_ms: u64 = numbers.next()?.parse().ok()?;
    let head_len: usize = numbers.next()?.parse().ok()?;
    let body_len: usize = numbers.next()?.parse().ok()?;
    if numbers.next().is_some() {
        return None;
    }
    let start = MAGIC.len() + newline + 1;
    let body_start = start.checked_add(head_len)?;
    if value.len() != body_start.checked_add(body_len)? {
        return None;
    }
    let head = value.get(start..body_start)?;
    let mut headers = HeaderMap::new();
    for line in head.split(|b| *b == b'\n').filter(|line| !line.is_empty()) {
        let text = std::str::from_utf8(line).ok()?;
        let (name, value) = text.split_once(": ")?;
        headers.append(
            HeaderName::from_bytes(name.as_bytes()).ok()?,
            HeaderValue::from_str(value).ok()?,
        );
    }
    Some(SharedEntry {
        stored_at_ms,
        headers,
        body: value.slice(body_start..),
    })
}

/// How the shared tier is set up; from the configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SharedSettings {
    /// Prefixed to every key this deployment uses.
    pub prefix: String,
    /// How long past the TTL an entry is kept for the stale fallback.
    pub stale_keep: Duration,
    /// Larger bodies are not stored in the shared tier.
    pub max_entry_bytes: u64,
    /// How long the store may take to answer before it counts as failing.
    pub timeout: Duration,
    /// How long a lock lives (the upstream timeout and a margin): its holder dying frees it then.
    pub lease: Duration,
    /// How long a replica waits for another's fan-out before it fans out itself.
    pub wait: Duration,
}

impl SharedSettings {
    /// The entry key of a cache key.
    pub fn entry_key(&self, key: &str) -> String {
        format!("{}entry:{key}", self.prefix)
    }

    /// The lock key of a cache key.
    pub fn lock_key(&self, key: &str) -> String {
        format!("{}lock:{key}", self.prefix)
    }
}

/// How often a replica waiting for another's fan-out looks for the stored answer.
pub(crate) const POLL_INTERVAL: Duration = Duration::from_millis(25);

#[cfg(test)]
mod tests {
    use super::*;

    fn headers() -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert("content-type", HeaderValue::from_static("application/json"));
        headers.insert("x-records", HeaderValue::from_static("3"));
        headers
    }

    #[test]
    fn an_entry_round_trips_through_its_envelope() {
        let body = Bytes::from_static(b"[{\"certname\":\"a\"}]");
        let value = encode(1_700_000_000_123, &headers(), &body);
        let entry = decode(&value).expect("decodes");
        assert_eq!(entry.stored_at_ms, 1_700_000_000_123);
        assert_eq!(entry.headers, headers());
        assert_eq!(entry.body, body);
        let empty = encode(5, &HeaderMap::new(), &Bytes::new());
        assert_eq!(decode(&empty).map(|e| e.body.len()), Some(0));
    }

    #[test]
    fn a_foreign_or_damaged_value_is_no_entry() {
        let value = encode(7, &headers(), &Bytes::from_static(b"[]"));
        for bad in [
            Bytes::from_static(b"[]"),
            Bytes::from_static(b"pdbmux-cache-v2 7 0 2\n[]"),
            Bytes::from_static(b"pdbmux-cache-v1 x 0 2\n[]"),
            Bytes::from_static(b"pdbmux-cache-v1 7 999 2\n[]"),
            Bytes::from_static(b"pdbmux-cache-v1 7 9 2\nno-colon\n[]"),
            Bytes::from_static(b"pdbmux-cache-v1 7 0 3\n[]"),
            value.slice(..20),
            value.slice(..value.len() - 1),
        ] {
            assert_eq!(decode(&bad), None, "{bad:?}");
        }
    }
}
