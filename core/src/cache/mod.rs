//! The merged-response cache: which requests are cached and under which key, the store, each
//! entry's TTL and the stale-on-failure rule, and the counters `/healthz` reports.
//!
//! Every merged answer of an entity route (record sets, history, combined answers, and the
//! sub-routes that are an entity with a constraint) is cached, each for its class's TTL
//! (docs/caching.md, "What is cached"); a node's own verbatim answer, pass-throughs and pdbmux's
//! own routes are served live. An entry holds the fully merged body, provenance applied, so a
//! hit serves stored bytes with no JSON work.

pub mod shared;
mod store;

use std::time::{Duration, Instant};

use http::{HeaderMap, HeaderValue};

pub use store::{CacheStore, CachedResponse, MemoryStore, StoreStats};

use crate::query::Params;
use crate::route::{MetricsRoute, Route};

/// Header saying where a cached-path response came from: `hit`, `miss` or `stale`.
pub const X_CACHE: http::HeaderName = http::HeaderName::from_static("x-cache");

/// How a cached-path response was produced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheStatus {
    /// Served from a fresh entry.
    Hit,
    /// Built by a live fan-out (this request's, or a flight it shared).
    Miss,
    /// The expired entry, served because every backend failed.
    Stale,
}

impl CacheStatus {
    fn as_str(self) -> &'static str {
        match self {
            CacheStatus::Hit => "hit",
            CacheStatus::Miss => "miss",
            CacheStatus::Stale => "stale",
        }
    }
}

/// A cacheable request: its key and how long its answer lives, and for the provenance drilldown
/// the shared fan-out it joins and the value that filters it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cacheable {
    /// The canonical key its answer is stored and looked up under.
    pub key: String,
    /// How long its answer is fresh: its class's TTL (never zero: such a class is not cached).
    pub ttl: Duration,
    /// The key of the fan-out it joins: [`Cacheable::key`], except for the provenance drilldown,
    /// whose every value shares the fan-out of the whole record set.
    pub flight_key: String,
    /// For the provenance drilldown, the target to fan out to instead of the request's (its
    /// `<value>` removed); `None` for every other request.
    pub fan_out_target: Option<String>,
    /// `/facts/<source_fact>/<value>` (or a `/facts` query constraining the provenance fact's
    /// value): the values the shared answer is filtered by before it is stored under
    /// [`Cacheable::key`].
    pub value_filter: Option<Vec<String>>,
}

/// Whether `response` may be stored: a success holding every configured backend's part
/// ([`crate::Coverage::Whole`]). A partial answer is served but never stored, so the next request
/// asks again and sees a backend that is back at once, not one TTL later (docs/caching.md).
pub fn is_storable(response: &crate::message::Response) -> bool {
    response.status.is_success() && crate::Coverage::of(response) == crate::Coverage::Whole
}

/// The key a cached-path request is stored under for `ttl` (`None` for a path that is never
/// cached), from the route and the parameters alone (no query analysis): what a lookup needs,
/// so a hit does no JSON work.
///
/// The key is the path plus every query parameter, decoded and re-encoded, keys sorted ascending
/// and a repeated parameter's values sorted too, so parameter order never splits entries. The
/// provenance drilldown `/facts/<source_fact>/<value>` is stored under its own key, already
/// filtered, so a hit does no JSON work; its fan-out is the one of `/facts/<source_fact>`,
/// which every value shares.
pub fn cache_key(
    route: &Route,
    (path, raw_query, params): (&str, Option<&str>, &Params),
    source_fact: &str,
    ttl: Duration,
) -> Option<Cacheable> {
    let mut value_filter = None;
    let mut drilldown_path = None;
    match route {
        Route::Query(_) | Route::ResourcesByType | Route::Metrics(MetricsRoute::Read) => {}
        Route::FactsByName { name, value } => {
            let decoded = percent_encoding::percent_decode_str(name).decode_utf8_lossy();
            if let (true, Some(value)) = (decoded == source_fact, value) {
                value_filter = Some(vec![percent_encoding::percent_decode_str(value)
                    .decode_utf8_lossy()
                    .into_owned()]);
                drilldown_path = Some(format!("/pdb/query/v4/facts/{name}"));
            }
        }
        _ => return None,
    }
    let mut pairs: Vec<(&str, &str)> = params.iter().map(|p| (p.key(), p.value())).collect();
    pairs.sort_unstable();
    let canonical = form_urlencoded::Serializer::new(String::new())
        .extend_pairs(pairs)
        .finish();
    let keyed = |path: &str| {
        if canonical.is_empty() {
            path.to_owned()
        } else {
            format!("{path}?{canonical}")
        }
    };
    let key = keyed(path);
    let flight_key = keyed(drilldown_path.as_deref().unwrap_or(path));
    let fan_out_target = drilldown_path.map(|path| match raw_query {
        Some(query) => format!("{path}?{query}"),
        None => path,
    });
    Some(Cacheable {
        key,
        ttl,
        flight_key,
        fan_out_target,
        value_filter,
    })
}

/// How long after a refresh every backend failed its key's expired entry is served without
/// asking again (at most its TTL): failing backends are not asked once per client request.
pub const STALE_RETRY: Duration = Duration::from_secs(5);

/// The cache as the estate uses it: a store of entries (each with its TTL) and the
/// stale-serving counters.
#[derive(Debug)]
pub struct Cache {
    store: Box<dyn CacheStore>,
    /// Keys whose last refresh failed: when to ask again; until then the stale entry answers.
    retry_at: std::collections::BTreeMap<String, Instant>,
    /// Keys whose refresh ahead of expiry failed: until when (their entry's expiry) no other
    /// refresh starts, so failing backends are not asked once per hit.
    no_refresh_until: std::collections::BTreeMap<String, Instant>,
    serving_stale: bool,
    stale_served: u64,
    last_stale_served: Option<Instant>,
    evictions: u64,
}

/// What a lookup found.
#[derive(Debug)]
pub enum Lookup {
    /// A fresh entry: serve it.
    Fresh(CachedResponse),
    /// The key's last refresh failed moments ago: serve its expired entry without asking.
    Stale(CachedResponse),
    /// No fresh entry: fan out (an expired one may still be there for a failure).
    Miss,
}

/// The `/healthz` cache object's values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheReport {
    /// What the store holds.
    pub stats: StoreStats,
    /// A stale fallback was the last cached-path answer.
    pub serving_stale: bool,
    /// Stale fallbacks served since start.
    pub stale_served: u64,
    /// When the last one was served.
    pub last_stale_served: Option<Instant>,
    /// Entries evicted to stay within the byte budget since start.
    pub evictions: u64,
}

impl Cache {
    /// A cache over `store`.
    pub fn new(store: Box<dyn CacheStore>) -> Cache {
        Cache {
            store,
            retry_at: std::collections::BTreeMap::new(),
            no_refresh_until: std::collections::BTreeMap::new(),
            serving_stale: false,
            stale_served: 0,
            last_stale_served: None,
            evictions: 0,
        }
    }

    /// Looks a key up at `now`; an expired entry is a miss (the backends are always asked again).
    pub fn lookup(&mut self, now: Instant, key: &str) -> Lookup {
        match self.store.get(key) {
            Some(entry) if now.saturating_duration_since(entry.stored_at) < entry.ttl => {
                self.serving_stale = false;
                Lookup::Fresh(entry)
            }
            Some(entry) if self.retry_at.get(key).is_some_and(|at| now < *at) => {
                self.count_stale(now);
                Lookup::Stale(entry)
            }
            _ => Lookup::Miss,
        }
    }

    /// Stores a successful merged answer, fresh for `ttl` from `stored_at` (now, or when another
    /// replica stored it in the shared tier: its age counts from then).
    pub fn store(
        &mut self,
        (stored_at, ttl): (Instant, Duration),
        key: &str,
        body: bytes::Bytes,
        headers: HeaderMap,
    ) {
        self.serving_stale = false;
        self.retry_at.remove(key);
        self.no_refresh_until.remove(key);
        let evicted = self.store.put(
            key.to_owned(),
            CachedResponse {
                body,
                headers,
                stored_at,
                ttl,
            },
        );
        self.evictions += evicted.len() as u64;
        for key in evicted {
            tracing::debug!(%key, "cache entry evicted to stay within facts_cache_bytes");
        }
    }

    /// Whether a hit on `key` may start a refresh ahead of expiry: not after one failed, until
    /// the entry expires.
    pub fn may_refresh(&self, now: Instant, key: &str) -> bool {
        self.no_refresh_until
            .get(key)
            .is_none_or(|until| now >= *until)
    }

    /// A refresh of `key`'s entry failed: no other starts before `expires` (when the entry has
    /// expired at the latest).
    pub fn refresh_failed(&mut self, now: Instant, key: &str, expires: Instant) {
        self.no_refresh_until.retain(|_, until| now < *until);
        self.no_refresh_until.insert(key.to_owned(), expires);
    }

    /// Whether the store holds an entry for `key`, fresh or expired (a read: it counts as use).
    pub fn holds(&mut self, key: &str) -> bool {
        self.store.get(key).is_some()
    }

    /// The expired entry for a failed fan-out, if one is kept; counts it as a stale serve, and
    /// has the key's next lookups served it for [`STALE_RETRY`] (at most its TTL) without a
    /// fan-out.
    pub fn stale(&mut self, now: Instant, key: &str) -> Option<CachedResponse> {
        let entry = self.store.get(key)?;
        self.count_stale(now);
        self.retry_at
            .retain(|_, at| now.saturating_duration_since(*at).is_zero());
        self.retry_at
            .insert(key.to_owned(), now + STALE_RETRY.min(entry.ttl));
        Some(entry)
    }

    fn count_stale(&mut self, now: Instant) {
        self.serving_stale = true;
        self.stale_served += 1;
        self.last_stale_served = Some(now);
    }

    /// A response built live (not from an entry) ends a run of stale serves.
    pub fn served_live(&mut self) {
        self.serving_stale = false;
    }

    /// The values `/healthz` shows.
    pub fn report(&self, now: Instant) -> CacheReport {
        CacheReport {
            stats: self.store.stats(now),
            serving_stale: self.serving_stale,
            stale_served: self.stale_served,
            last_stale_served: self.last_stale_served,
            evictions: self.evictions,
        }
    }
}

/// Adds `X-Cache` and `Age` (whole seconds since `stored_at`; 0 on a miss) to a response.
pub fn mark(headers: &mut HeaderMap, status: CacheStatus, age: Duration) {
    headers.insert(X_CACHE, HeaderValue::from_static(status.as_str()));
    headers.insert(http::header::AGE, HeaderValue::from(age.as_secs()));
}

#[cfg(test)]
#[allow(clippy::disallowed_methods)] // tests need one real instant to start from
mod tests {
    use super::*;
    use crate::message::ClientRequest;
    use crate::route::classify;

    fn key(target: &str) -> Option<Cacheable> {
        let request = ClientRequest::get(target);
        let route = classify(&request).ok()?;
        cache_key(
            &route,
            (
                request.path(),
                request.query(),
                &Params::parse(request.query()),
            ),
            "pdbmux_source",
            Duration::from_secs(30),
        )
    }

    #[test]
    fn keys_are_canonical() {
        assert_eq!(
            key("/pdb/query/v4/nodes").map(|c| c.key).as_deref(),
            Some("/pdb/query/v4/nodes")
        );
        let a = key("/pdb/query/v4/facts?limit=5&query=%5B%22%3D%22%2C%22certname%22%2C%22a%22%5D")
            .map(|c| c.key);
        let b = key("/pdb/query/v4/facts?query=[%22=%22,%22certname%22,%22a%22]&limit=5")
            .map(|c| c.key);
        assert_eq!(a, b);
        assert_eq!(
            a.as_deref(),
            Some("/pdb/query/v4/facts?limit=5&query=%5B%22%3D%22%2C%22certname%22%2C%22a%22%5D")
        );
        let x = key("/pdb/query/v4/fact-names?x=2&x=1").map(|c| c.key);
        assert_eq!(x.as_deref(), Some("/pdb/query/v4/fact-names?x=1&x=2"));
        let plus = key("/pdb/query/v4/facts?query=a+b").map(|c| c.key);
        let space = key("/pdb/query/v4/facts?query=a%20b").map(|c| c.key);
        assert_eq!(plus, space);
    }

    #[test]
    fn every_entity_route_is_keyed_and_nothing_else() {
        for target in [
            "/pdb/query/v4/facts/kernel/Linux",
            "/pdb/query/v4/reports",
            "/pdb/query/v4/environments",
            "/pdb/query/v4/nodes?query=%5B%22extract%22%2C%5B%5B%22function%22%2C%22count%22%5D%5D%5D",
            "/pdb/query/v4/event-counts?summarize_by=certname",
        ] {
            assert!(key(target).is_some(), "{target}");
        }
        for target in [
            "/pdb/meta/v1/version",
            "/metrics/v2/list",
            "/pdb/query/v4/catalogs/x",
            "/pdb/query/v4/environments/production",
        ] {
            assert!(key(target).is_none(), "{target}");
        }
    }

    #[test]
    fn the_drilldown_keys_by_its_value_and_shares_the_fan_out() {
        let one = key("/pdb/query/v4/facts/pdbmux_source/pdb-a?query=%5B%5D").expect("cached");
        let other = key("/pdb/query/v4/facts/pdbmux_source/pdb-b?query=%5B%5D").expect("cached");
        let all = key("/pdb/query/v4/facts/pdbmux_source?query=%5B%5D").expect("cached");
        assert_eq!(
            one.key,
            "/pdb/query/v4/facts/pdbmux_source/pdb-a?query=%5B%5D"
        );
        assert_ne!(one.key, other.key);
        assert_eq!(all.flight_key, all.key);
        assert_eq!(one.flight_key, all.key);
        assert_eq!(other.flight_key, all.key);
        assert_eq!(one.value_filter, Some(vec!["pdb-a".to_owned()]));
        assert_eq!(
            one.fan_out_target.as_deref(),
            Some("/pdb/query/v4/facts/pdbmux_source?query=%5B%5D")
        );
        let kernel = key("/pdb/query/v4/facts/kernel/Linux").expect("cached");
        assert_eq!(kernel.value_filter, None);
        assert_eq!(kernel.fan_out_target, None, "fans out to its own target");
        assert_eq!(kernel.key, "/pdb/query/v4/facts/kernel/Linux");
        assert_eq!(kernel.flight_key, kernel.key);
    }

    #[test]
    fn fresh_then_expired_then_stale() {
        let t0 = Instant::now();
        let mut cache = Cache::new(Box::new(MemoryStore::new(1024)));
        assert!(matches!(cache.lookup(t0, "k"), Lookup::Miss));
        cache.store(
            (t0, Duration::from_secs(30)),
            "k",
            bytes::Bytes::from_static(b"[1]"),
            HeaderMap::new(),
        );
        assert!(matches!(
            cache.lookup(t0 + Duration::from_secs(29), "k"),
            Lookup::Fresh(_)
        ));
        assert!(matches!(
            cache.lookup(t0 + Duration::from_secs(30), "k"),
            Lookup::Miss
        ));
        let stale = cache
            .stale(t0 + Duration::from_secs(40), "k")
            .expect("kept");
        assert_eq!(&stale.body[..], b"[1]");
        let report = cache.report(t0 + Duration::from_secs(40));
        assert!(report.serving_stale);
        assert_eq!((report.stale_served, report.stats.stale_entries), (1, 1));
        cache.served_live();
        assert!(!cache.report(t0).serving_stale);
    }
}
