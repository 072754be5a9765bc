//! The shared tier of the cache (docs/caching.md): entries every replica reads and writes in a
//! Redis-protocol store, and a lock per key so that concurrent misses on different replicas make
//! one fan-out. The core decides everything (hit, miss, stale, store, lock, wait, give up); the
//! runtime only carries each [`StoreRequest`] to the store and hands back its [`StoreAnswer`].
//!
//! A stored value is pdbmux's own envelope: a version line with the wall-clock time it was stored
//! (so a hit on another replica carries the right `Age`) and the few fields its headers are built
//! from, an HMAC tag, the body. The store is untrusted (docs/reliability.md, "The shared store is
//! untrusted"): a value whose tag does not authenticate it under the deployment's secret, that is
//! too long, misdated or not JSON is a miss, never served, and no header is ever read from it.

use std::time::{Duration, Instant};

use bytes::{BufMut, Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};

use crate::config::Secret;
use crate::message::JSON_CONTENT_TYPE;
use crate::message::{X_BACKENDS, X_RECORDS};

/// One request to the shared store, issued by the [`crate::Estate`]; the runtime answers it with
/// [`crate::Estate::handle_store_answer`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct StoreId(pub u64);

/// What to ask the shared store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreOp {
    /// `GETRANGE key 0 limit`: answered with [`StoreAnswer::Value`]; a value longer than
    /// `limit` bytes is cut after `limit + 1` (so it is known to be too long without reading it
    /// whole), and an empty one means the key holds nothing.
    Get {
        /// The full key, prefix included.
        key: String,
        /// The most bytes an entry may have; at most one more is read.
        limit: u64,
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
const MAGIC: &[u8] = b"pdbmux-cache-v2 ";
/// The bytes of the authentication tag after the envelope's first line (HMAC-SHA256).
const TAG_BYTES: usize = 32;
/// The most bytes an envelope holds besides its body: the first line and the tag. A value
/// longer than `cache_max_entry_bytes` plus this is refused unread (`StoreOp::Get::limit`).
pub const ENVELOPE_BYTES: u64 = 128 + TAG_BYTES as u64;
/// How far in the future a writer's clock may date an entry before it is refused: replicas'
/// clocks differ by this much at most under NTP, a forged or replayed date by more.
pub(crate) const CLOCK_SKEW: Duration = Duration::from_secs(1);

/// One entry read from the shared store and authenticated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SharedEntry {
    /// When it was stored, in milliseconds since the Unix epoch (the writer's clock).
    pub stored_at_ms: u64,
    /// Its status (a 2xx).
    pub status: StatusCode,
    /// The headers it is served with, built by pdbmux from the entry's fields (content type,
    /// `X-Records`, `X-Backends`): nothing in the store names a header.
    pub headers: HeaderMap,
    /// The merged body, checked to be JSON.
    pub body: Bytes,
}

/// Why a value read from the store is not served: each is a miss, counted by reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryRefusal {
    /// Not pdbmux's envelope (another program's value, an older version's, a truncated one).
    Malformed,
    /// The envelope's tag does not authenticate it under this deployment's secret.
    Forged,
    /// Longer than `cache_max_entry_bytes` allows (not read past the limit).
    Oversized,
    /// Dated later than now, beyond the clock skew replicas may have (1 s).
    FromTheFuture,
    /// Older than its TTL and the stale window: it should have expired in the store.
    Expired,
    /// Authenticated, yet its body is not JSON (as `records::check_json` judges a backend's
    /// body: at most 128 levels deep).
    NotJson,
}

impl EntryRefusal {
    /// Every reason, in the order [`crate::stats::CacheStats::shared_refused`] counts them.
    pub const ALL: [EntryRefusal; 6] = [
        EntryRefusal::Malformed,
        EntryRefusal::Forged,
        EntryRefusal::Oversized,
        EntryRefusal::FromTheFuture,
        EntryRefusal::Expired,
        EntryRefusal::NotJson,
    ];

    /// The metrics label and log word.
    pub fn as_str(self) -> &'static str {
        match self {
            EntryRefusal::Malformed => "malformed",
            EntryRefusal::Forged => "forged",
            EntryRefusal::Oversized => "oversized",
            EntryRefusal::FromTheFuture => "future",
            EntryRefusal::Expired => "expired",
            EntryRefusal::NotJson => "not_json",
        }
    }

    /// Its index in [`EntryRefusal::ALL`].
    pub fn index(self) -> usize {
        EntryRefusal::ALL
            .iter()
            .position(|r| *r == self)
            .unwrap_or(0)
    }
}

/// The tag of an envelope: HMAC-SHA256 under `secret` over the full key (length first, so no
/// two keys share an input), the envelope's first line (date, status, counts, body length) and
/// the body.
fn tag(secret: &Secret, key: &str, line: &[u8], body: &[u8]) -> ring::hmac::Tag {
    let key_bytes = key.as_bytes();
    let mut context = ring::hmac::Context::with_key(&signing_key(secret));
    context.update(&(key_bytes.len() as u64).to_be_bytes());
    context.update(key_bytes);
    context.update(line);
    context.update(body);
    context.sign()
}

fn signing_key(secret: &Secret) -> ring::hmac::Key {
    ring::hmac::Key::new(ring::hmac::HMAC_SHA256, secret.expose())
}

/// The envelope of a successful JSON answer stored under the full `key`:
/// `pdbmux-cache-v2 <stored_at_ms> <status> <x-records|-> <x-backends|-> <body length>\n`, the
/// 32-byte tag, the body. `None` for an answer the store does not take (not a 2xx, not JSON).
/// The estate stores what it fans out with it; public for tests and tools that write a store as
/// a replica would.
pub fn encode(
    secret: &Secret,
    key: &str,
    stored_at_ms: u64,
    status: StatusCode,
    headers: &HeaderMap,
    body: &Bytes,
) -> Option<Bytes> {
    let json = headers
        .get(http::header::CONTENT_TYPE)
        .is_some_and(|value| value.as_bytes() == JSON_CONTENT_TYPE.as_bytes());
    if !status.is_success() || !json {
        return None;
    }
    let field = |name: &HeaderName| -> Option<String> {
        match headers.get(name) {
            None => Some("-".to_owned()),
            Some(value) => value
                .to_str()
                .ok()
                .filter(|text| !text.is_empty() && !text.contains(char::is_whitespace))
                .map(str::to_owned),
        }
    };
    let records = field(&X_RECORDS)?;
    let backends = field(&X_BACKENDS)?;
    let mut line = MAGIC.to_vec();
    line.extend_from_slice(
        format!(
            "{stored_at_ms} {} {records} {backends} {}\n",
            status.as_u16(),
            body.len()
        )
        .as_bytes(),
    );
    let tag = tag(secret, key, &line, body);
    let mut out = BytesMut::with_capacity(line.len() + TAG_BYTES + body.len());
    out.put_slice(&line);
    out.put_slice(tag.as_ref());
    out.put_slice(body);
    Some(out.freeze())
}

/// The entry in `value` read under the full `key`, authenticated and its body checked; the
/// reason it is refused otherwise. Dates are judged by the caller ([`EntryRefusal::FromTheFuture`],
/// [`EntryRefusal::Expired`]), which knows the clock.
pub(crate) fn decode(
    secret: &Secret,
    key: &str,
    value: &Bytes,
    max_body_bytes: u64,
) -> Result<SharedEntry, EntryRefusal> {
    if value.len() as u64 > max_body_bytes.saturating_add(ENVELOPE_BYTES) {
        return Err(EntryRefusal::Oversized);
    }
    let rest = value.strip_prefix(MAGIC).ok_or(EntryRefusal::Malformed)?;
    let newline = rest
        .iter()
        .take(ENVELOPE_BYTES as usize)
        .position(|b| *b == b'\n')
        .ok_or(EntryRefusal::Malformed)?;
    let line_end = MAGIC.len() + newline + 1;
    let fields = std::str::from_utf8(&rest[..newline]).map_err(|_| EntryRefusal::Malformed)?;
    let mut fields = fields.split(' ');
    let mut next = || fields.next().ok_or(EntryRefusal::Malformed);
    let stored_at_ms: u64 = next()?.parse().map_err(|_| EntryRefusal::Malformed)?;
    let status: u16 = next()?.parse().map_err(|_| EntryRefusal::Malformed)?;
    let records = header_field(next()?, |text| text.parse::<u64>().is_ok())?;
    let backends = header_field(next()?, |text| {
        text.split_once('/')
            .is_some_and(|(a, b)| a.parse::<u32>().is_ok() && b.parse::<u32>().is_ok())
    })?;
    let body_len: usize = next()?.parse().map_err(|_| EntryRefusal::Malformed)?;
    if next().is_ok() {
        return Err(EntryRefusal::Malformed);
    }
    let body_start = line_end + TAG_BYTES;
    if body_len as u64 > max_body_bytes {
        return Err(EntryRefusal::Oversized);
    }
    if value.len()
        != body_start
            .checked_add(body_len)
            .ok_or(EntryRefusal::Malformed)?
    {
        return Err(EntryRefusal::Malformed);
    }
    let status = StatusCode::from_u16(status)
        .ok()
        .filter(StatusCode::is_success)
        .ok_or(EntryRefusal::Malformed)?;
    let body = value.slice(body_start..);
    let expected = tag(secret, key, &value[..line_end], &body);
    let authentic: bool =
        subtle::ConstantTimeEq::ct_eq(expected.as_ref(), &value[line_end..body_start]).into();
    if !authentic {
        return Err(EntryRefusal::Forged);
    }
    if crate::records::check_json(&body).is_err() {
        return Err(EntryRefusal::NotJson);
    }
    let mut headers = HeaderMap::new();
    headers.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static(JSON_CONTENT_TYPE),
    );
    for (name, value) in [(X_RECORDS, records), (X_BACKENDS, backends)] {
        if let Some(value) = value {
            headers.insert(name, value);
        }
    }
    Ok(SharedEntry {
        stored_at_ms,
        status,
        headers,
        body,
    })
}

/// A header's value from an envelope field: `-` for none, else `valid` must accept it.
fn header_field(
    text: &str,
    valid: impl Fn(&str) -> bool,
) -> Result<Option<HeaderValue>, EntryRefusal> {
    match text {
        "-" => Ok(None),
        text if valid(text) => HeaderValue::from_str(text)
            .map(Some)
            .map_err(|_| EntryRefusal::Malformed),
        _ => Err(EntryRefusal::Malformed),
    }
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

    const KEY: &str = "pdbmux:entry:/pdb/query/v4/fact-names";

    fn secret() -> Secret {
        Secret::new(b"0123456789abcdef0123456789abcdef".to_vec())
    }

    fn headers() -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static(JSON_CONTENT_TYPE),
        );
        headers.insert(X_RECORDS, HeaderValue::from_static("3"));
        headers.insert(X_BACKENDS, HeaderValue::from_static("2/2"));
        headers
    }

    fn stored(body: &'static [u8]) -> Bytes {
        let body = Bytes::from_static(body);
        encode(
            &secret(),
            KEY,
            1_700_000_000_123,
            StatusCode::OK,
            &headers(),
            &body,
        )
        .expect("a JSON 200 is stored")
    }

    #[test]
    fn an_entry_round_trips_through_its_envelope() {
        let value = stored(b"[{\"certname\":\"a\"}]");
        let entry = decode(&secret(), KEY, &value, 1024).expect("decodes");
        assert_eq!(entry.stored_at_ms, 1_700_000_000_123);
        assert_eq!(entry.status, StatusCode::OK);
        assert_eq!(entry.headers, headers());
        assert_eq!(&entry.body[..], b"[{\"certname\":\"a\"}]");
    }

    #[test]
    fn only_a_json_success_is_stored_and_only_its_own_headers_are_kept() {
        let body = Bytes::from_static(b"[]");
        let mut text = headers();
        text.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("text/html"),
        );
        assert_eq!(
            encode(&secret(), KEY, 1, StatusCode::OK, &text, &body),
            None
        );
        let not_found = encode(&secret(), KEY, 1, StatusCode::NOT_FOUND, &headers(), &body);
        assert_eq!(not_found, None);
        let mut extra = headers();
        extra.insert(http::header::SET_COOKIE, HeaderValue::from_static("a=b"));
        extra.insert(http::header::CONTENT_LENGTH, HeaderValue::from_static("5"));
        let value = encode(&secret(), KEY, 1, StatusCode::OK, &extra, &body).expect("stored");
        let entry = decode(&secret(), KEY, &value, 1024).expect("decodes");
        assert_eq!(entry.headers, headers(), "nothing but the three fields");
    }

    #[test]
    fn an_entry_altered_anywhere_or_read_under_another_key_or_secret_is_forged() {
        let value = stored(b"[1,2,3]");
        let other = Secret::new(b"another secret of the same length".to_vec());
        assert_eq!(decode(&other, KEY, &value, 1024), Err(EntryRefusal::Forged));
        let other_key = "pdbmux:entry:/pdb/query/v4/nodes";
        assert_eq!(
            decode(&secret(), other_key, &value, 1024),
            Err(EntryRefusal::Forged)
        );
        // The date moved on, the counts changed, the body swapped for one of the same length.
        for (from, to) in [
            ("1700000000123", "1800000000123"),
            (" 3 2/2", " 9 2/2"),
            ("[1,2,3]", "[7,8,9]"),
        ] {
            let mut bytes = value.to_vec();
            let at = bytes
                .windows(from.len())
                .position(|window| window == from.as_bytes())
                .expect("field present");
            bytes.splice(at..at + from.len(), to.bytes());
            assert_eq!(
                decode(&secret(), KEY, &Bytes::from(bytes), 1024),
                Err(EntryRefusal::Forged),
                "{from} -> {to}"
            );
        }
    }

    #[test]
    fn a_foreign_damaged_oversized_or_non_json_value_is_refused_with_its_reason() {
        let value = stored(b"[]");
        for bad in [
            Bytes::from_static(b"[]"),
            Bytes::from_static(b"pdbmux-cache-v1 7 0 2\n[]"),
            Bytes::from_static(b"pdbmux-cache-v2 x 200 - - 2\n"),
            Bytes::from_static(b"pdbmux-cache-v2 7 302 - - 0\n"),
            Bytes::from_static(b"pdbmux-cache-v2 7 200 a - 0\n"),
            Bytes::from_static(b"pdbmux-cache-v2 7 200 - 1 0\n"),
            value.slice(..20),
            value.slice(..value.len() - 1),
        ] {
            assert_eq!(
                decode(&secret(), KEY, &bad, 1024),
                Err(EntryRefusal::Malformed),
                "{bad:?}"
            );
        }
        let large = Bytes::from(vec![b' '; 2048]);
        assert_eq!(
            decode(&secret(), KEY, &large, 1024),
            Err(EntryRefusal::Oversized)
        );
        let declared = stored(b"[1,2,3,4,5,6,7,8,9]");
        assert_eq!(
            decode(&secret(), KEY, &declared, 8),
            Err(EntryRefusal::Oversized)
        );
        let html = stored(b"<script>alert(1)</script>");
        assert_eq!(
            decode(&secret(), KEY, &html, 1024),
            Err(EntryRefusal::NotJson)
        );
        // Found by the shared_value fuzz target: a string that is not UTF-8, which serde_json
        // lets by when it only skips a value.
        let not_utf8 = stored(b"\"\xc2\xc2\xc2\"");
        assert_eq!(
            decode(&secret(), KEY, &not_utf8, 1024),
            Err(EntryRefusal::NotJson)
        );
    }
}
