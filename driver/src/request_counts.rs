//! The per-request metrics, kept cheap enough for a cache hit (docs/operating.md, "Metrics"): a
//! hit costs a few microseconds, so one shared counter line bounced between cores per request
//! would show. Each worker thread adds to its own shard (its own cache lines, relaxed atomics no
//! other core writes); a scrape sums the shards and hands the totals to `prometheus-client`'s
//! encoder. Status codes outside the common set go to one locked map, off the hot path.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use pdbmux_core::RouteClass;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Unit;

/// Bucket bounds of the duration histograms, in seconds: from a cache hit to a slow fan-out.
pub(crate) const DURATION_BUCKETS: [f64; 14] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// The status codes counted in the shards; others go to the locked map.
const CODES: [u16; 13] = [
    200, 304, 400, 404, 405, 414, 429, 431, 499, 500, 502, 503, 504,
];

/// The codes every route class shows from the start, at zero until one is answered: the
/// success and server-error ratios (an alert, a dashboard panel) divide by and into them, and a
/// ratio over a series that does not exist yet is no data rather than 0.
const CODES_FROM_START: [u16; 5] = [200, 500, 502, 503, 504];

/// Cache results, in `X-Cache`'s spelling, as the `result` label.
pub(crate) const CACHE_RESULTS: [&str; 3] = ["hit", "miss", "stale"];

const ROUTES: usize = RouteClass::ALL.len();
const BUCKETS: usize = DURATION_BUCKETS.len() + 1;
/// Shards: threads beyond this many share them (still exact: the adds are atomic).
const SHARDS: usize = 16;

/// One thread's counts, on cache lines of its own.
#[repr(align(128))]
#[derive(Default)]
struct Shard {
    requests: [[AtomicU64; CODES.len()]; ROUTES],
    /// Per route: observations per bucket (not cumulative; the last is +Inf).
    buckets: [[AtomicU64; BUCKETS]; ROUTES],
    nanos: [AtomicU64; ROUTES],
    cache: [AtomicU64; CACHE_RESULTS.len()],
    sent_bytes: AtomicU64,
}

/// Which shard this thread adds to, assigned on its first request.
fn shard_index() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static INDEX: usize = NEXT.fetch_add(1, Ordering::Relaxed) % SHARDS;
    }
    INDEX.with(|index| *index)
}

/// The requests, their durations, cache results and bytes sent, summed over every thread.
pub(crate) struct RequestCounts {
    shards: Box<[Shard]>,
    /// Requests with a status outside [`CODES`], by route and status.
    other_codes: Mutex<BTreeMap<(usize, u16), u64>>,
}

impl fmt::Debug for RequestCounts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RequestCounts").finish_non_exhaustive()
    }
}

impl Default for RequestCounts {
    fn default() -> Self {
        RequestCounts {
            shards: (0..SHARDS).map(|_| Shard::default()).collect(),
            other_codes: Mutex::new(BTreeMap::new()),
        }
    }
}

impl RequestCounts {
    fn shard(&self) -> &Shard {
        &self.shards[shard_index()]
    }

    /// One request of route class `route` answered `code` after `took`, with cache result
    /// `cache` (an index into [`CACHE_RESULTS`]) on the cached path.
    pub(crate) fn observe(
        &self,
        class: RouteClass,
        code: u16,
        took: Duration,
        cache: Option<usize>,
    ) {
        let route = class.index();
        let shard = self.shard();
        match CODES.iter().position(|known| *known == code) {
            Some(index) => {
                shard.requests[route][index].fetch_add(1, Ordering::Relaxed);
            }
            None => {
                let mut other = self
                    .other_codes
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner());
                *other.entry((route, code)).or_default() += 1;
            }
        }
        let seconds = took.as_secs_f64();
        let bucket = DURATION_BUCKETS
            .iter()
            .position(|bound| seconds <= *bound)
            .unwrap_or(BUCKETS - 1);
        shard.buckets[route][bucket].fetch_add(1, Ordering::Relaxed);
        let nanos = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        shard.nanos[route].fetch_add(nanos, Ordering::Relaxed);
        if let Some(result) = cache.filter(|result| *result < CACHE_RESULTS.len()) {
            shard.cache[result].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// `bytes` more were written to a client.
    pub(crate) fn sent(&self, bytes: u64) {
        self.shard().sent_bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    fn sum(&self, read: impl Fn(&Shard) -> &AtomicU64) -> u64 {
        self.shards
            .iter()
            .map(|shard| read(shard).load(Ordering::Relaxed))
            .sum()
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    route: &'static str,
    code: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteLabels {
    route: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CacheLabels {
    result: &'static str,
}

impl Collector for RequestCounts {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        let mut requests = encoder.encode_descriptor(
            "pdbmux_requests",
            "Client requests answered, by route class and status code",
            None,
            MetricType::Counter,
        )?;
        let other = self
            .other_codes
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone();
        for (route, class) in RouteClass::ALL.iter().map(|c| c.as_str()).enumerate() {
            let mut counts: BTreeMap<u16, u64> = CODES
                .iter()
                .enumerate()
                .map(|(index, code)| (*code, self.sum(|s| &s.requests[route][index])))
                .filter(|(code, count)| *count > 0 || CODES_FROM_START.contains(code))
                .collect();
            for ((_, code), count) in other.range((route, 0)..=(route, u16::MAX)) {
                counts.insert(*code, *count);
            }
            for (code, count) in counts {
                let labels = RequestLabels { route: class, code };
                ConstCounter::new(count).encode(requests.encode_family(&labels)?)?;
            }
        }
        let seconds = Unit::Seconds;
        let mut durations = encoder.encode_descriptor(
            "pdbmux_request_duration",
            "Time from a client request's arrival to its response head, by route class",
            Some(&seconds),
            MetricType::Histogram,
        )?;
        for (route, class) in RouteClass::ALL.iter().map(|c| c.as_str()).enumerate() {
            // Per bucket, not cumulative: the encoder adds them up (as for its own histograms).
            let buckets: Vec<(f64, u64)> = DURATION_BUCKETS
                .iter()
                .copied()
                .chain(std::iter::once(f64::INFINITY))
                .enumerate()
                .map(|(bucket, bound)| (bound, self.sum(|s| &s.buckets[route][bucket])))
                .collect();
            let count: u64 = buckets.iter().map(|(_, n)| n).sum();
            let sum = self.sum(|s| &s.nanos[route]) as f64 / 1e9;
            let labels = RouteLabels { route: class };
            durations
                .encode_family(&labels)?
                .encode_histogram::<RouteLabels>(sum, count, &buckets, None)?;
        }
        let mut cache = encoder.encode_descriptor(
            "pdbmux_cache_requests",
            "Cacheable requests by what answered them (hit, miss, stale)",
            None,
            MetricType::Counter,
        )?;
        for (index, result) in CACHE_RESULTS.iter().enumerate() {
            let count = self.sum(|s| &s.cache[index]);
            let labels = CacheLabels { result };
            ConstCounter::new(count).encode(cache.encode_family(&labels)?)?;
        }
        let bytes = Unit::Bytes;
        let sent = encoder.encode_descriptor(
            "pdbmux_client_sent",
            "Bytes written to clients' connections",
            Some(&bytes),
            MetricType::Counter,
        )?;
        ConstCounter::new(self.sum(|s| &s.sent_bytes)).encode(sent)
    }
}
