//! The estate's answers: the cache and its flights (one fan-out per key, shared by every
//! client that asks for it meanwhile), with the shared tier (`shared_tier.rs`) in front of the
//! store when one is configured, and refreshes ahead of expiry. A part of the estate like the
//! membership map and the prober: the estate hands it what is about answers and drains its
//! outputs (clients to answer, flights to start or cancel, store requests).

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::HeaderValue;

use super::shared_tier::SharedTier;
use super::{Admission, EstateOutput};
use crate::cache::shared::StoreId;
use crate::cache::{self, Cache, CacheStatus, Cacheable, Lookup, MemoryStore};
use crate::clock::ClockAnchor;
use crate::config::{Config, Renews};
use crate::exchange::Exchange;
use crate::fanout::Context;
use crate::ids::{Counter, FlightId, WaiterId};
use crate::merge::filter_source_records;
use crate::message::{Response, ResponseBody};
use crate::policy::Planned;
use crate::route::RouteClass;

/// A shared fan-out for one flight key and the clients waiting on it.
#[derive(Debug)]
pub(super) struct Flight {
    pub(super) key: String,
    /// How long its answer is fresh (the class TTL of the key it was started for).
    pub(super) ttl: std::time::Duration,
    /// The cache it was started against; its answer is stored only while that cache is kept.
    pub(super) cache_generation: u64,
    /// Each participant: the key its answer is stored under, and the drilldown value that
    /// filters the shared answer first.
    pub(super) participants: BTreeMap<WaiterId, Participant>,
    /// For a refresh ahead of expiry (docs/caching.md, "Refresh ahead"): the entry it renews,
    /// stored when the fan-out succeeds, with no client waiting; it runs to its end even when
    /// every client that joined it leaves.
    pub(super) refresh: Option<Participant>,
    /// Where it stands with the shared cache tier; [`Stage::Fetching`] without one.
    pub(super) stage: Stage,
    /// The fan-out to start, while the shared tier is asked first.
    pub(super) fetch: Option<PendingFetch>,
    /// The shared lock it holds (key, token), released when it answers.
    pub(super) lock: Option<(String, String)>,
    /// An expired shared entry, for the stale fallback.
    pub(super) stale: Option<cache::CachedResponse>,
    /// Once its merge streams to its clients ([`Answers::stream_flight`]): the keys its answer
    /// is stored under when it completes.
    pub(super) streamed_to: Option<Vec<String>>,
}

/// Where a flight stands (docs/caching.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Stage {
    /// Its fan-out runs on a task of its own.
    Fetching,
    /// Asking the shared store for the entry.
    Looking(StoreId),
    /// Asking for the key's lock.
    Locking(StoreId),
    /// Holding the lock, looking in the store once more before fanning out: another replica
    /// may have stored the entry (and let go of the lock) between this one's miss and its lock.
    Confirming(StoreId),
    /// Another replica holds the lock: look again at `poll_at`, fan out at `until`.
    Waiting { poll_at: Instant, until: Instant },
    /// Looking again, while waiting until `until`.
    Polling { id: StoreId, until: Instant },
}

/// A fan-out planned and not started yet: started when the shared tier does not answer.
#[derive(Debug)]
pub(super) struct PendingFetch {
    pub(super) context: Context,
    pub(super) class: RouteClass,
    pub(super) target: String,
    pub(super) plan: Box<dyn crate::fanout::Plan>,
}

impl PendingFetch {
    pub(super) fn start(self, now: Instant) -> Exchange {
        Exchange::new(now, self.context, (self.class, self.target), self.plan)
    }
}

/// One client of a flight.
#[derive(Debug)]
pub(super) struct Participant {
    pub(super) key: String,
    pub(super) filter: Option<Vec<String>>,
}

impl Participant {
    pub(super) fn of(cacheable: &Cacheable) -> Participant {
        Participant {
            key: cacheable.key.clone(),
            filter: cacheable.value_filter.clone(),
        }
    }
}

/// The cache, its flights and the shared tier (see the module doc).
#[derive(Debug)]
pub(super) struct Answers {
    pub(super) config: Arc<Config>,
    pub(super) clock: ClockAnchor,
    pub(super) cache: Option<Cache>,
    pub(super) flights: BTreeMap<FlightId, Flight>,
    pub(super) flight_keys: BTreeMap<String, FlightId>,
    flight_ids: Counter,
    /// Bumped each time a reload replaces the cache: flights of an older one store nothing.
    pub(super) cache_generation: u64,
    /// The shared cache tier, when a shared store is configured.
    pub(super) shared: Option<SharedTier>,
    counts: AnswerCounts,
    pub(super) outputs: VecDeque<EstateOutput>,
}

/// What the answers count for pdbmux's metrics; counts only grow.
#[derive(Debug, Default)]
struct AnswerCounts {
    flight_joins: u64,
    /// Background refreshes started by hits past their share of the TTL.
    refreshes_ahead: u64,
    /// Evictions of caches a reload replaced.
    earlier_evictions: u64,
}

/// A fresh (or stale-served) entry for a request: its response, and whether a hit should also
/// refresh it ahead of expiry.
pub(super) struct Hit {
    pub(super) response: Response,
    pub(super) refresh: bool,
}

impl Answers {
    /// The answers of `config`, empty.
    pub(super) fn new(config: &Arc<Config>, clock: ClockAnchor) -> Answers {
        Answers {
            shared: SharedTier::of(config, token_base(&clock)),
            cache: new_cache(config),
            config: Arc::clone(config),
            clock,
            flights: BTreeMap::new(),
            flight_keys: BTreeMap::new(),
            flight_ids: Counter::default(),
            cache_generation: 0,
            counts: AnswerCounts::default(),
            outputs: VecDeque::new(),
        }
    }

    /// Runs on `config` from now on (a reload): the cache starts empty when something that
    /// shapes an answer changed (and no request joins a flight of the old one), and the shared
    /// tier is made again when it or the answers changed. Returns whether answers changed.
    pub(super) fn reconfigure(&mut self, now: Instant, old: &Config, config: &Arc<Config>) -> bool {
        self.config = Arc::clone(config);
        // What each key renews is written once, beside the keys (`Config::KEYS`).
        let same_answers = !old.renewed_by(config, Renews::Answers);
        if !same_answers {
            let old_cache = std::mem::replace(&mut self.cache, new_cache(config));
            if let Some(old_cache) = old_cache {
                self.counts.earlier_evictions += old_cache.report(now).evictions;
            }
            self.cache_generation += 1;
            // A request admitted from now on never joins a flight of the old configuration
            // (whose clients are still answered by it).
            self.flight_keys.clear();
        }
        if !same_answers || old.renewed_by(config, Renews::SharedTier) {
            // Flights still asking the old tier fan out now; the new tier serves what follows.
            let asking: Vec<FlightId> = self
                .flights
                .iter()
                .filter(|(_, flight)| flight.stage != Stage::Fetching)
                .map(|(id, _)| *id)
                .collect();
            for flight in asking {
                self.start_fetch(now, flight);
            }
            let refused = self.shared.as_ref().map(SharedTier::refused);
            self.shared = SharedTier::of(config, token_base(&self.clock));
            if let (Some(tier), Some(refused)) = (self.shared.as_mut(), refused) {
                tier.keep_counts(refused);
            }
        }
        !same_answers
    }

    /// Whether `planned` goes through the cache at all (a cache is kept and it has a key).
    pub(super) fn caches(&self, planned: &Planned) -> Option<Cacheable> {
        planned.cache.clone().filter(|_| self.cache.is_some())
    }

    /// A fresh entry (or the stale one a recent failure serves) for `planned`: a hit does no
    /// JSON work.
    pub(super) fn lookup(&mut self, now: Instant, planned: &Planned) -> Option<Hit> {
        let (Some(cache), Some(keyed)) = (&mut self.cache, &planned.cache) else {
            return None;
        };
        let may_refresh = cache.may_refresh(now, &keyed.key);
        let (entry, status) = match cache.lookup(now, &keyed.key) {
            Lookup::Fresh(entry) => (entry, CacheStatus::Hit),
            Lookup::Stale(entry) => (entry, CacheStatus::Stale),
            Lookup::Miss => return None,
        };
        let age = now.saturating_duration_since(entry.stored_at);
        let refresh = status == CacheStatus::Hit
            && may_refresh
            && self.config.refreshes_ahead(age, entry.ttl)
            && !self.flight_keys.contains_key(&keyed.flight_key);
        let response = Response {
            status: http::StatusCode::OK,
            headers: entry.headers,
            body: ResponseBody::Full(entry.body),
        };
        Some(Hit {
            response: finish_cached(response, status, age),
            refresh,
        })
    }

    /// Joins the flight under way for `cacheable`'s key, if any: the waiter it answers.
    pub(super) fn join(
        &mut self,
        cacheable: &Cacheable,
        waiter_ids: &mut Counter,
    ) -> Option<WaiterId> {
        let flight = self.flight_keys.get(&cacheable.flight_key).copied()?;
        let flight = self.flights.get_mut(&flight)?;
        let waiter = WaiterId(waiter_ids.next());
        flight
            .participants
            .insert(waiter, Participant::of(cacheable));
        self.counts.flight_joins += 1;
        Some(waiter)
    }

    /// Starts the flight of `cacheable`'s key with `fetch`, its first client a new waiter:
    /// asking the shared store first when there is one (the fan-out waits for its answer).
    pub(super) fn fly(
        &mut self,
        now: Instant,
        cacheable: &Cacheable,
        fetch: PendingFetch,
        waiter_ids: &mut Counter,
    ) -> Admission {
        let waiter = WaiterId(waiter_ids.next());
        let participants = BTreeMap::from([(waiter, Participant::of(cacheable))]);
        match self.open_flight(now, cacheable, fetch, (participants, None)) {
            (flight, Some(exchange)) => Admission::Flight {
                flight,
                waiter,
                exchange,
            },
            (_, None) => Admission::Wait(waiter),
        }
    }

    /// Starts the one background refresh of `cacheable`'s entry with `fetch` (docs/caching.md,
    /// "Refresh ahead"): a flight with no client, asking the shared store first like a miss
    /// (another replica may have refreshed it already), whose answer renews the entry. A miss
    /// for the key meanwhile joins it.
    pub(super) fn refresh(&mut self, now: Instant, cacheable: &Cacheable, fetch: PendingFetch) {
        self.counts.refreshes_ahead += 1;
        let refresh = Some(Participant::of(cacheable));
        if let (flight, Some(exchange)) =
            self.open_flight(now, cacheable, fetch, (BTreeMap::new(), refresh))
        {
            self.outputs
                .push_back(EstateOutput::StartFlight { flight, exchange });
        }
    }

    /// Opens a flight for `cacheable`'s key with these participants (clients, and the refresh
    /// ahead when it is one): its exchange to start now, or none while the shared store is
    /// asked first (the fetch waits in the flight).
    fn open_flight(
        &mut self,
        now: Instant,
        cacheable: &Cacheable,
        fetch: PendingFetch,
        (participants, refresh): (BTreeMap<WaiterId, Participant>, Option<Participant>),
    ) -> (FlightId, Option<Exchange>) {
        let flight = FlightId(self.flight_ids.next());
        self.flight_keys
            .insert(cacheable.flight_key.clone(), flight);
        let mut record = Flight {
            key: cacheable.flight_key.clone(),
            ttl: cacheable.ttl,
            cache_generation: self.cache_generation,
            participants,
            refresh,
            stage: Stage::Fetching,
            fetch: None,
            lock: None,
            stale: None,
            streamed_to: None,
        };
        let exchange = match self.shared_lookup(now, &cacheable.flight_key, flight) {
            Some(id) => {
                record.stage = Stage::Looking(id);
                record.fetch = Some(fetch);
                None
            }
            None => Some(fetch.start(now)),
        };
        self.flights.insert(flight, record);
        (flight, exchange)
    }

    /// Forgets `key`'s flight when it is still `flight` (after a reload a newer one may hold it).
    pub(super) fn forget_flight_key(&mut self, key: &str, flight: FlightId) {
        if self.flight_keys.get(key) == Some(&flight) {
            self.flight_keys.remove(key);
        }
    }

    /// A flight's merge streams (docs/merging.md, "Streamed merges"): its clients, each with
    /// `head` as its answer's status and headers, read the merge's pieces as its driver writes
    /// them. From now on a request for its key starts a flight of its own (it would have missed
    /// what was written), so the flight lets go of the shared tier's lock now (the next flight,
    /// here or on another replica, is not kept waiting for an entry that may never be put), and
    /// [`Answers::handle_flight_done`] gets the whole answer to store, or a failure. `None` when
    /// the flight's answer must be whole first: it refreshes an entry ahead of expiry (no
    /// client waits), or a client's drilldown filters it (its route never streams today; the
    /// check keeps a filtered client from ever being sent the whole record set); its driver
    /// then reads it whole.
    pub(super) fn stream_flight(
        &mut self,
        now: Instant,
        flight: FlightId,
        head: &Response,
    ) -> Option<Vec<(WaiterId, Response)>> {
        let record = self.flights.get_mut(&flight)?;
        let whole_first =
            record.refresh.is_some() || record.participants.values().any(|p| p.filter.is_some());
        if whole_first || record.streamed_to.is_some() {
            return None;
        }
        let participants = std::mem::take(&mut record.participants);
        let mut keys: Vec<String> = participants.values().map(|p| p.key.clone()).collect();
        keys.sort_unstable();
        keys.dedup();
        record.streamed_to = Some(keys);
        let (key, lock) = (record.key.clone(), record.lock.take());
        self.forget_flight_key(&key, flight);
        if let Some((lock_key, token)) = lock {
            self.shared_unlock(now, lock_key, token);
        }
        if let Some(cache) = self.cache.as_mut() {
            cache.served_live();
        }
        let head = Response {
            status: head.status,
            headers: head.headers.clone(),
            body: ResponseBody::Merged,
        };
        Some(
            participants
                .into_keys()
                .map(|waiter| {
                    let head = finish_cached(head.clone(), CacheStatus::Miss, Duration::ZERO);
                    (waiter, head)
                })
                .collect(),
        )
    }

    /// A flight's exchange responded: per participant key, store the answer (filtered by the
    /// drilldown's value, once per key) or fall back to that key's stale entry, and answer every
    /// participant. An answer for an unknown (cancelled) flight is ignored.
    pub(super) fn handle_flight_done(
        &mut self,
        now: Instant,
        flight: FlightId,
        response: Response,
    ) {
        let Some(done) = self.flights.remove(&flight) else {
            return;
        };
        self.forget_flight_key(&done.key, flight);
        self.shared_flight_done(now, &done, &response);
        if let Some(keys) = &done.streamed_to {
            self.store_streamed(now, &done, keys, response);
            return;
        }
        let flight = done;
        let mut settled: BTreeMap<String, (Response, CacheStatus, std::time::Duration)> =
            BTreeMap::new();
        for (waiter, participant) in flight.participants {
            if !settled.contains_key(&participant.key) {
                let answer = match &participant.filter {
                    Some(values) => filtered_by_source(response.clone(), values),
                    None => response.clone(),
                };
                let current = flight.cache_generation == self.cache_generation;
                // The shared tier's expired entry is the whole record set's: no drilldown's.
                let stale = flight
                    .stale
                    .clone()
                    .filter(|_| participant.filter.is_none());
                let outcome =
                    self.settle_flight(now, (&participant.key, flight.ttl, current), answer, stale);
                settled.insert(participant.key.clone(), outcome);
            }
            let (served, status, age) = &settled[&participant.key];
            let response = finish_cached(served.clone(), *status, *age);
            self.outputs
                .push_back(EstateOutput::Respond { waiter, response });
        }
        // A refresh renews its entry with a whole success; anything else leaves the entry to
        // expire as it would have (no stale serving: nobody asked), and starts no other.
        if let Some(refresh) = flight.refresh.filter(|r| !settled.contains_key(&r.key)) {
            let current = flight.cache_generation == self.cache_generation;
            let Some(cache) = self.cache.as_mut().filter(|_| current) else {
                return;
            };
            let answer = match &refresh.filter {
                Some(values) => filtered_by_source(response, values),
                None => response,
            };
            match (&answer.body, cache::is_storable(&answer)) {
                (ResponseBody::Full(body), true) => {
                    cache.store(
                        (now, flight.ttl),
                        &refresh.key,
                        body.clone(),
                        answer.headers,
                    );
                }
                _ => {
                    tracing::warn!(key = %refresh.key, status = answer.status.as_u16(), "cache refresh ahead of expiry failed; the entry expires as it is");
                    cache.refresh_failed(now, &refresh.key, now + flight.ttl);
                }
            }
        }
    }

    /// Stores a streamed flight's answer under each of its clients' keys, once it is whole and
    /// a success its clients were answered with already; a failure stores nothing.
    fn store_streamed(&mut self, now: Instant, flight: &Flight, keys: &[String], answer: Response) {
        let current = flight.cache_generation == self.cache_generation;
        let Some(cache) = self.cache.as_mut().filter(|_| current) else {
            return;
        };
        if let (true, ResponseBody::Full(body)) = (cache::is_storable(&answer), &answer.body) {
            for key in keys {
                cache.store((now, flight.ttl), key, body.clone(), answer.headers.clone());
            }
        }
    }

    /// Stores a whole success (a partial one is served, not stored), serves the stale entry for
    /// a failure (5xx) when one is kept, and serves a unanimous refusal (4xx) as it is.
    fn settle_flight(
        &mut self,
        now: Instant,
        (key, ttl, current): (&str, std::time::Duration, bool),
        response: Response,
        shared_stale: Option<cache::CachedResponse>,
    ) -> (Response, CacheStatus, std::time::Duration) {
        let Some(cache) = self.cache.as_mut().filter(|_| current) else {
            return (response, CacheStatus::Miss, std::time::Duration::ZERO);
        };
        if response.status.is_server_error() {
            // Another replica's expired entry stands in when this one holds none.
            if let Some(entry) = shared_stale.filter(|_| !cache.holds(key)) {
                cache.store((entry.stored_at, ttl), key, entry.body, entry.headers);
            }
            if let Some(entry) = cache.stale(now, key) {
                tracing::warn!(%key, status = response.status.as_u16(), "every backend failed; serving the expired cache entry");
                let age = now.saturating_duration_since(entry.stored_at);
                let stale = Response {
                    status: http::StatusCode::OK,
                    headers: entry.headers,
                    body: ResponseBody::Full(entry.body),
                };
                return (stale, CacheStatus::Stale, age);
            }
        }
        cache.served_live();
        if cache::is_storable(&response) {
            if let ResponseBody::Full(body) = &response.body {
                cache.store((now, ttl), key, body.clone(), response.headers.clone());
            }
        }
        (response, CacheStatus::Miss, std::time::Duration::ZERO)
    }

    /// A waiting client went away: a flight whose last participant left (and that is no
    /// refresh) is cancelled, and the lock it took is released.
    pub(super) fn waiter_gone(&mut self, now: Instant, waiter: WaiterId) {
        let emptied: Vec<FlightId> = self
            .flights
            .iter_mut()
            .filter_map(|(id, flight)| {
                (flight.participants.remove(&waiter).is_some()
                    && flight.participants.is_empty()
                    && flight.refresh.is_none())
                .then_some(*id)
            })
            .collect();
        for id in emptied {
            let Some(flight) = self.flights.remove(&id) else {
                continue;
            };
            self.forget_flight_key(&flight.key, id);
            // Only a started fan-out has a task to cancel; a lock taken for it is released.
            if flight.stage == Stage::Fetching {
                self.outputs.push_back(EstateOutput::CancelFlight(id));
            }
            if let Some((key, token)) = flight.lock {
                self.shared_unlock(now, key, token);
            }
        }
    }

    /// The cache's numbers for the metrics (`None`: no cache).
    pub(super) fn stats(&self, now: Instant) -> Option<crate::stats::CacheStats> {
        self.cache.as_ref().map(|cache| {
            let report = cache.report(now);
            crate::stats::CacheStats {
                store: report.stats,
                evictions: self.counts.earlier_evictions + report.evictions,
                flight_joins: self.counts.flight_joins,
                refreshes_ahead: self.counts.refreshes_ahead,
                shared_reachable: self.shared.as_ref().map(SharedTier::reachable),
                shared_refused: self.shared.as_ref().map(SharedTier::refused),
            }
        })
    }

    /// The cache's part of `/healthz`: its report and, with a shared store, whether it answers.
    pub(super) fn health(&self, now: Instant) -> (Option<cache::CacheReport>, Option<bool>) {
        (
            self.cache.as_ref().map(|c| c.report(now)),
            self.shared.as_ref().map(SharedTier::reachable),
        )
    }
}

/// What makes this process's lock tokens its own: its start, to the nanosecond.
pub(super) fn token_base(clock: &ClockAnchor) -> String {
    let since = clock
        .wall
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    format!("{}.{:09}", since.as_secs(), since.subsec_nanos())
}

/// The cache `config` asks for: none when every cache TTL is zero.
fn new_cache(config: &Config) -> Option<Cache> {
    config
        .caches_anything()
        .then(|| Cache::new(Box::new(MemoryStore::new(config.facts_cache_bytes))))
}

/// Adds the cache headers to a cached-path response.
pub(super) fn finish_cached(
    mut response: Response,
    status: CacheStatus,
    age: std::time::Duration,
) -> Response {
    cache::mark(&mut response.headers, status, age);
    response
}

/// The provenance drilldown's answer from the shared record set's: the records of the backends
/// `values` names, before it is stored (docs/merging.md, "Provenance"). A failure is left as it is.
pub(super) fn filtered_by_source(mut response: Response, values: &[String]) -> Response {
    if let (ResponseBody::Full(body), true) = (&response.body, response.status.is_success()) {
        let (filtered, count) = filter_source_records(body, values);
        if response.headers.contains_key(crate::message::X_RECORDS) {
            response
                .headers
                .insert(crate::message::X_RECORDS, HeaderValue::from(count));
        }
        response.body = ResponseBody::Full(filtered);
    }
    response
}

#[cfg(test)]
#[allow(clippy::disallowed_methods)] // tests need one real instant to start from
pub(in crate::estate) mod tests {
    use super::*;
    use crate::cache::X_CACHE;
    use crate::corrections::Corrections;
    use crate::estate::tests::config;
    use crate::ids::BackendId;
    use crate::message::ClientRequest;
    use crate::policy::Work;

    pub(in crate::estate) const TARGET: &str = "/pdb/query/v4/fact-names";

    /// The answers of a one-backend configuration, changed by `with`.
    pub(in crate::estate) fn answers(with: impl FnOnce(&mut Config)) -> (Answers, Instant) {
        let mut config = config(&[("a", 1)]);
        with(&mut config);
        let now = Instant::now();
        let clock = ClockAnchor {
            instant: now,
            wall: std::time::UNIX_EPOCH + Duration::from_secs(1_700_000_000),
        };
        (Answers::new(&Arc::new(config), clock), now)
    }

    /// `target`'s cache key and the fan-out a miss would start.
    pub(in crate::estate) fn asked(answers: &Answers, target: &str) -> (Cacheable, PendingFetch) {
        let planned = crate::policy::plan(&ClientRequest::get(target), &answers.config);
        let cacheable = answers.caches(&planned).expect("a cacheable request");
        let Work::Fanout(plan) = planned.work else {
            panic!("a fan-out");
        };
        let context = Context {
            config: Arc::clone(&answers.config),
            roster: vec![BackendId(0)],
            ownership: None,
            corrections: Arc::new(Corrections::new(0)),
            uncounted: Vec::new(),
            may_stream: false,
        };
        let fetch = PendingFetch {
            context,
            class: planned.class,
            target: target.to_owned(),
            plan,
        };
        (cacheable, fetch)
    }

    /// Everything the answers asked for, drained.
    pub(in crate::estate) fn drained(answers: &mut Answers) -> Vec<EstateOutput> {
        answers.outputs.drain(..).collect()
    }

    /// The waiters answered among `outputs`, each with its body and `X-Cache`.
    pub(in crate::estate) fn answered(outputs: &[EstateOutput]) -> Vec<(WaiterId, String, String)> {
        outputs
            .iter()
            .filter_map(|output| match output {
                EstateOutput::Respond { waiter, response } => Some((
                    *waiter,
                    String::from_utf8_lossy(response.full_body().expect("a whole body"))
                        .into_owned(),
                    response.headers[X_CACHE].to_str().unwrap_or("").to_owned(),
                )),
                _ => None,
            })
            .collect()
    }

    /// A miss for [`TARGET`] at `now`: the flight it starts at once (no shared tier) and its
    /// first waiter.
    fn miss(answers: &mut Answers, now: Instant, waiters: &mut Counter) -> (FlightId, WaiterId) {
        let (cacheable, fetch) = asked(answers, TARGET);
        match answers.fly(now, &cacheable, fetch, waiters) {
            Admission::Flight { flight, waiter, .. } => (flight, waiter),
            other => panic!("without a shared tier the fan-out starts at once: {other:?}"),
        }
    }

    /// A request for [`TARGET`] joining the flight under way, if any: its waiter.
    fn join(answers: &mut Answers, waiters: &mut Counter) -> Option<WaiterId> {
        let (cacheable, _) = asked(answers, TARGET);
        answers.join(&cacheable, waiters)
    }

    /// The refresh ahead of [`TARGET`]'s entry started at `now`: its flight.
    fn refreshing(answers: &mut Answers, now: Instant) -> FlightId {
        let (cacheable, fetch) = asked(answers, TARGET);
        answers.refresh(now, &cacheable, fetch);
        match drained(answers).as_slice() {
            [EstateOutput::StartFlight { flight, .. }] => *flight,
            other => panic!("a refresh starts a flight of its own: {other:?}"),
        }
    }

    fn looked_up(answers: &mut Answers, now: Instant) -> Option<(String, String, bool)> {
        let planned = crate::policy::plan(&ClientRequest::get(TARGET), &answers.config);
        let hit = answers.lookup(now, &planned)?;
        let body = String::from_utf8_lossy(hit.response.full_body()?).into_owned();
        let status = hit.response.headers[X_CACHE].to_str().ok()?.to_owned();
        Some((body, status, hit.refresh))
    }

    fn ok(body: &str) -> Response {
        Response::json(http::StatusCode::OK, body.to_owned())
    }

    #[test]
    fn one_flight_answers_every_client_that_joins_it_and_stores_its_answer_once() {
        let (mut answers, now) = answers(|_| {});
        let mut waiters = Counter::default();
        let (flight, waiter) = miss(&mut answers, now, &mut waiters);
        let joined = join(&mut answers, &mut waiters).expect("joins");
        assert!(looked_up(&mut answers, now).is_none(), "nothing stored yet");
        answers.handle_flight_done(now, flight, ok(r#"["kernel"]"#));
        let outputs = drained(&mut answers);
        let kernel = r#"["kernel"]"#.to_owned();
        assert_eq!(
            answered(&outputs),
            [
                (waiter, kernel.clone(), "miss".into()),
                (joined, kernel.clone(), "miss".into())
            ]
        );
        assert_eq!(
            looked_up(&mut answers, now + Duration::from_secs(1)),
            Some((kernel, "hit".into(), false))
        );
        assert!(
            join(&mut answers, &mut waiters).is_none(),
            "the flight is over: a later miss starts another"
        );
        let stats = answers.stats(now).expect("a cache");
        assert_eq!(stats.flight_joins, 1);
    }

    #[test]
    fn a_failed_flight_serves_the_expired_entry_and_a_partial_success_is_served_unstored() {
        let (mut answers, now) = answers(|_| {});
        let mut waiters = Counter::default();
        let (flight, _) = miss(&mut answers, now, &mut waiters);
        answers.handle_flight_done(now, flight, ok(r#"["old"]"#));
        drained(&mut answers);

        let later = now + answers.config.facts_ttl + Duration::from_secs(5);
        assert!(looked_up(&mut answers, later).is_none(), "expired");
        let (flight, waiter) = miss(&mut answers, later, &mut waiters);
        let failed = Response::text(http::StatusCode::BAD_GATEWAY, "every backend failed");
        answers.handle_flight_done(later, flight, failed);
        let served = answered(&drained(&mut answers));
        assert_eq!(served, [(waiter, r#"["old"]"#.into(), "stale".into())]);

        // A partial success (one backend of two missing) is served, never stored.
        let retry = later + Duration::from_secs(60);
        let (flight, _) = miss(&mut answers, retry, &mut waiters);
        let mut partial = ok(r#"["new"]"#);
        partial
            .headers
            .insert(crate::message::X_BACKENDS, HeaderValue::from_static("1/2"));
        answers.handle_flight_done(retry, flight, partial);
        let served = answered(&drained(&mut answers));
        assert_eq!(served[0].1, r#"["new"]"#);
        assert_eq!(served[0].2, "miss");
        assert!(
            looked_up(&mut answers, retry).is_none_or(|(body, ..)| body != r#"["new"]"#),
            "a partial answer is not stored"
        );
    }

    #[test]
    fn the_last_client_leaving_cancels_a_flight_but_never_a_refresh_ahead() {
        let (mut answers, now) = answers(|_| {});
        let mut waiters = Counter::default();
        let (flight, waiter) = miss(&mut answers, now, &mut waiters);
        let joined = join(&mut answers, &mut waiters).expect("joins");
        answers.waiter_gone(now, waiter);
        assert!(drained(&mut answers).is_empty(), "one client still waits");
        answers.waiter_gone(now, joined);
        assert!(matches!(
            drained(&mut answers).as_slice(),
            [EstateOutput::CancelFlight(id)] if *id == flight
        ));

        let refresh = refreshing(&mut answers, now);
        let joined = join(&mut answers, &mut waiters).expect("a miss joins it");
        answers.waiter_gone(now, joined);
        assert!(
            drained(&mut answers).is_empty(),
            "a refresh runs on with no client"
        );
        answers.handle_flight_done(now, refresh, ok(r#"["renewed"]"#));
        assert!(answered(&drained(&mut answers)).is_empty());
        assert_eq!(
            looked_up(&mut answers, now).map(|(body, ..)| body),
            Some(r#"["renewed"]"#.into())
        );
        assert_eq!(answers.stats(now).map(|s| s.refreshes_ahead), Some(1));
    }

    #[test]
    fn a_hit_past_its_share_of_the_ttl_asks_for_a_refresh_and_a_failed_refresh_keeps_the_entry() {
        let (mut answers, now) = answers(|_| {});
        let mut waiters = Counter::default();
        let (flight, _) = miss(&mut answers, now, &mut waiters);
        answers.handle_flight_done(now, flight, ok(r#"["kept"]"#));
        drained(&mut answers);
        let ttl = answers.config.facts_ttl;
        let early = now + ttl / 2;
        let due = now + ttl * 9 / 10;
        assert_eq!(looked_up(&mut answers, early).map(|hit| hit.2), Some(false));
        assert_eq!(looked_up(&mut answers, due).map(|hit| hit.2), Some(true));

        let refresh = refreshing(&mut answers, due);
        assert_eq!(
            looked_up(&mut answers, due).map(|hit| hit.2),
            Some(false),
            "one refresh at a time"
        );
        let failed = Response::text(http::StatusCode::BAD_GATEWAY, "down");
        answers.handle_flight_done(due, refresh, failed);
        assert_eq!(
            looked_up(&mut answers, due).map(|(body, status, _)| (body, status)),
            Some((r#"["kept"]"#.into(), "hit".into())),
            "the entry serves on until its TTL"
        );
        assert!(
            looked_up(&mut answers, now + ttl).is_none(),
            "then it expires"
        );
    }

    #[test]
    fn a_streamed_flight_heads_every_client_and_stores_only_a_whole_success() {
        let (mut answers, now) = answers(|_| {});
        let mut waiters = Counter::default();
        let (flight, waiter) = miss(&mut answers, now, &mut waiters);
        let joined = join(&mut answers, &mut waiters).expect("joins");
        let head = Response {
            status: http::StatusCode::OK,
            headers: http::HeaderMap::new(),
            body: ResponseBody::Merged,
        };
        let heads = answers.stream_flight(now, flight, &head).expect("streams");
        let clients: Vec<(WaiterId, &str)> = heads
            .iter()
            .map(|(w, r)| (*w, r.headers[X_CACHE].to_str().unwrap_or("")))
            .collect();
        assert_eq!(clients, [(waiter, "miss"), (joined, "miss")]);
        assert!(
            join(&mut answers, &mut waiters).is_none(),
            "a request once it streams starts a flight of its own"
        );
        answers.handle_flight_done(now, flight, ok(r#"["whole"]"#));
        assert!(
            answered(&drained(&mut answers)).is_empty(),
            "its clients were answered by the stream"
        );
        assert_eq!(
            looked_up(&mut answers, now).map(|(body, ..)| body),
            Some(r#"["whole"]"#.into())
        );

        // A stream cut off stores nothing (the earlier entry stays).
        let later = now + answers.config.facts_ttl * 2;
        let (flight, _) = miss(&mut answers, later, &mut waiters);
        answers
            .stream_flight(later, flight, &head)
            .expect("streams");
        let cut = Response::text(http::StatusCode::BAD_GATEWAY, "cut off");
        answers.handle_flight_done(later, flight, cut);
        assert!(looked_up(&mut answers, later).is_none());
    }

    #[test]
    fn a_reload_that_changes_answers_starts_an_empty_cache_and_one_that_does_not_keeps_it() {
        let (mut answers, now) = answers(|_| {});
        let mut waiters = Counter::default();
        let (flight, _) = miss(&mut answers, now, &mut waiters);
        answers.handle_flight_done(now, flight, ok(r#"["kernel"]"#));
        drained(&mut answers);
        let old = Arc::clone(&answers.config);
        let timeout = Arc::new(Config {
            timeout: Duration::from_secs(3),
            ..(*old).clone()
        });
        assert!(!answers.reconfigure(now, &old, &timeout));
        assert!(looked_up(&mut answers, now).is_some(), "kept");
        let ttl = Arc::new(Config {
            facts_ttl: Duration::from_secs(20),
            ..(*timeout).clone()
        });
        assert!(answers.reconfigure(now, &timeout, &ttl));
        assert!(looked_up(&mut answers, now).is_none(), "emptied");
    }
}
