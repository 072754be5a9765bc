//! The shared machine: everything requests have in common. It holds no JSON work on records and
//! is touched only briefly per request, so it never serializes merges.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::Instant;

use http::HeaderValue;

use crate::broadcast::Broadcast;
use crate::cache::{self, Cache, CacheStatus, Cacheable, Lookup, MemoryStore};
use crate::clock::ClockAnchor;
use crate::config::{Config, Renews};
use crate::exchange::{Exchange, ExchangeReport};
use crate::fanout::Context;
use crate::health::{ProbeSettings, Prober, ProberOutput};
use crate::healthz::{QueryRounds, ReachabilityCheck, REACHABILITY_PATH};
use crate::ids::{BackendId, Counter, FlightId, UpstreamId, WaiterId};
use crate::membership::{MembershipMap, MembershipOutput, Ownership};
use crate::merge::filter_source_records;
use crate::message::{Response, ResponseBody, UpstreamFailure, UpstreamRequest, UpstreamResponse};
use crate::policy::{Planned, Work};
use crate::root::{Pql, Translating};
use crate::route::RouteClass;
use crate::sequence::Sequence;
use crate::translations::Translations;

mod shared_tier;

use crate::cache::shared::{StoreId, StoreRequest};
use shared_tier::SharedTier;

/// What to do with a client request; returned by [`Estate::admit`].
#[derive(Debug)]
pub enum Admission {
    /// Answer with this right away (a refusal); no backend is asked.
    Respond(Response),
    /// Drive this exchange on the request's own task until it responds.
    Exchange(Exchange),
    /// Wait: the estate later emits [`EstateOutput::Respond`] or [`EstateOutput::Resume`] for this
    /// waiter.
    Wait(WaiterId),
    /// Start a shared flight: drive `exchange` on a task of its own (not the client's, so the
    /// client leaving cannot cancel it), hand its response to [`Estate::handle_flight_done`], and
    /// wait for this waiter's [`EstateOutput::Respond`] like any other waiter.
    Flight {
        /// The flight to report back on.
        flight: FlightId,
        /// The client that started it.
        waiter: WaiterId,
        /// The fan-out to drive.
        exchange: Exchange,
    },
    /// PQL whose translation is not known: drive `exchange` (the translation request) on the
    /// request's own task and hand its response, with `translating`, to
    /// [`Estate::handle_translated`], which admits the translated query.
    Translate {
        /// The translation request to drive.
        exchange: Exchange,
        /// The request it translates.
        translating: Translating,
    },
}

/// What the [`Estate`] asks of the runtime; drain with [`Estate::poll_output`].
#[derive(Debug)]
pub enum EstateOutput {
    /// Send this request upstream; report the answer to [`Estate::handle_upstream_response`] or
    /// [`Estate::handle_upstream_failure`].
    Send(UpstreamRequest),
    /// Abandon this upstream request.
    Cancel(UpstreamId),
    /// Answer the client behind this waiter.
    Respond {
        /// Who is waiting.
        waiter: WaiterId,
        /// The answer.
        response: Response,
    },
    /// What the waiter waited for (the first membership map) is ready: admit its request again
    /// with [`Estate::readmit`].
    Resume {
        /// Who is waiting.
        waiter: WaiterId,
        /// Its request, as planned.
        planned: Box<Planned>,
    },
    /// Every participant of this flight left: abort its task, releasing its upstream requests.
    CancelFlight(FlightId),
    /// Carry this request to the shared cache store; hand its answer to
    /// [`Estate::handle_store_answer`].
    Store(StoreRequest),
    /// Start this flight's fan-out now (the shared store did not answer it): drive `exchange` on
    /// a task of its own and hand its response to [`Estate::handle_flight_done`], as for
    /// [`Admission::Flight`].
    StartFlight {
        /// The flight.
        flight: FlightId,
        /// Its fan-out.
        exchange: Exchange,
    },
}

/// A shared fan-out for one flight key and the clients waiting on it.
#[derive(Debug)]
struct Flight {
    key: String,
    /// How long its answer is fresh (the class TTL of the key it was started for).
    ttl: std::time::Duration,
    /// The cache it was started against; its answer is stored only while that cache is kept.
    cache_generation: u64,
    /// Each participant: the key its answer is stored under, and the drilldown value that
    /// filters the shared answer first.
    participants: BTreeMap<WaiterId, Participant>,
    /// For a refresh ahead of expiry (docs/caching.md, "Refresh ahead"): the entry it renews,
    /// stored when the fan-out succeeds, with no client waiting; it runs to its end even when
    /// every client that joined it leaves.
    refresh: Option<Participant>,
    /// Where it stands with the shared cache tier; [`Stage::Fetching`] without one.
    stage: Stage,
    /// The fan-out to start, while the shared tier is asked first.
    fetch: Option<PendingFetch>,
    /// The shared lock it holds (key, token), released when it answers.
    lock: Option<(String, String)>,
    /// An expired shared entry, for the stale fallback.
    stale: Option<cache::CachedResponse>,
}

/// Where a flight stands (docs/caching.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
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
struct PendingFetch {
    context: Context,
    class: RouteClass,
    target: String,
    plan: Box<dyn crate::fanout::Plan>,
}

impl PendingFetch {
    fn start(self, now: Instant) -> Exchange {
        Exchange::new(now, self.context, (self.class, self.target), self.plan)
    }
}

/// One client of a flight.
#[derive(Debug)]
struct Participant {
    key: String,
    filter: Option<Vec<String>>,
}

impl Participant {
    fn of(cacheable: &Cacheable) -> Participant {
        Participant {
            key: cacheable.key.clone(),
            filter: cacheable.value_filter.clone(),
        }
    }
}

/// The state every request shares: configuration, backend health, the membership map, the cache
/// and its flights, and the `/healthz` check in flight.
///
/// Contract: after every `admit` or `handle_*` call, drain [`Estate::poll_output`] until `None`,
/// then read [`Estate::poll_timeout`]; call [`Estate::handle_timeout`] when it passes. `now` never
/// goes backwards; a spurious `handle_timeout` is a no-op.
#[derive(Debug)]
pub struct Estate {
    config: Arc<Config>,
    upstream_ids: Counter,
    waiter_ids: Counter,
    flight_ids: Counter,
    clock: ClockAnchor,
    reachability: Option<ReachabilityCheck>,
    membership: MembershipMap,
    cache: Option<Cache>,
    flights: BTreeMap<FlightId, Flight>,
    flight_keys: BTreeMap<String, FlightId>,
    prober: Prober,
    rounds: QueryRounds,
    /// PQL translations backends gave.
    translations: Translations,
    counts: Counts,
    /// Bumped each time a reload replaces the cache: flights of an older one store nothing.
    cache_generation: u64,
    /// The shared cache tier, when a shared store is configured.
    shared: Option<SharedTier>,
    outputs: VecDeque<EstateOutput>,
}

/// What the estate counts for pdbmux's metrics ([`Estate::stats`]) besides its parts' own
/// counts. Counts only grow.
#[derive(Debug, Default)]
struct Counts {
    flight_joins: u64,
    /// Background refreshes started by hits past their share of the TTL.
    refreshes_ahead: u64,
    /// Evictions of caches a reload replaced.
    earlier_evictions: u64,
}

impl Estate {
    /// A fresh estate for this configuration, caching in a [`MemoryStore`] of
    /// `facts_cache_bytes`. `clock` maps instants to wall time for `/healthz`.
    pub fn new(config: Config, clock: ClockAnchor) -> Estate {
        let backends = config.backends.len();
        let cache = new_cache(&config);
        let prober = Prober::new(clock.instant, ProbeSettings::from_config(&config), backends);
        let shared = SharedTier::of(&config, token_base(&clock));
        Estate {
            shared,
            prober,
            rounds: QueryRounds::default(),
            config: Arc::new(config),
            upstream_ids: Counter::default(),
            waiter_ids: Counter::default(),
            flight_ids: Counter::default(),
            clock,
            reachability: None,
            cache,
            flights: BTreeMap::new(),
            flight_keys: BTreeMap::new(),
            membership: MembershipMap::new(clock.instant, backends),
            translations: Translations::default(),
            counts: Counts::default(),
            cache_generation: 0,
            outputs: VecDeque::new(),
        }
    }

    /// The configuration this estate runs on.
    pub fn config(&self) -> &Arc<Config> {
        &self.config
    }

    /// Runs on `config` from now on (a reload, docs/operating.md). Requests admitted before keep
    /// the configuration they were planned with; a waiting one is planned again when resumed.
    /// What the change leaves valid is kept: each backend that stays (same name, URL and TLS
    /// files) keeps its health and counts; the cache stays when nothing that shapes an answer
    /// changed, else it starts empty and no later request joins a flight of the old one. With
    /// other backends (added, removed, reordered, changed), the membership map is asked afresh
    /// (its waiters wait for that), a `/healthz` check in flight starts again, and the estate's
    /// own requests to the old backends are dropped or cancelled.
    pub fn reconfigure(&mut self, now: Instant, config: Arc<Config>) {
        let old = std::mem::replace(&mut self.config, Arc::clone(&config));
        let same_backends = old.backends == config.backends;
        // What each key renews is written once, beside the keys (`Config::KEYS`).
        let same_answers = !old.renewed_by(&config, Renews::Answers);
        if !same_answers {
            let old_cache = std::mem::replace(&mut self.cache, new_cache(&config));
            if let Some(old_cache) = old_cache {
                self.counts.earlier_evictions += old_cache.report(now).evictions;
            }
            self.cache_generation += 1;
            self.translations = Translations::default();
            // A request admitted from now on never joins a flight of the old configuration
            // (whose clients are still answered by it).
            self.flight_keys.clear();
        }
        let shared_changed = old.renewed_by(&config, Renews::SharedTier);
        if !same_answers || shared_changed {
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
            self.shared = SharedTier::of(&config, token_base(&self.clock));
            if let (Some(tier), Some(refused)) = (self.shared.as_mut(), refused) {
                tier.keep_counts(refused);
            }
        }
        if !old.renewed_by(&config, Renews::Probes) {
            return;
        }
        // Each new backend's index in the old configuration, when it is the same backend.
        let carried: Vec<Option<usize>> = config
            .backends
            .iter()
            .map(|backend| old.backends.iter().position(|b| b == backend))
            .collect();
        let probes = self
            .prober
            .reconfigure(now, ProbeSettings::from_config(&config), &carried);
        // Requests queued for the runtime to send still name old backends' indices.
        self.outputs
            .retain(|output| !matches!(output, EstateOutput::Send(r) if probes.contains(&r.id)));
        self.outputs
            .extend(probes.into_iter().map(EstateOutput::Cancel));
        if same_backends {
            self.send_due_probes(now);
            return;
        }
        self.rounds = QueryRounds::default();
        // The estate's own requests to the old backends are abandoned: their answers would
        // land on the new backends' indices.
        let (mut abandoned, waiting) = self.membership.reset(now, &carried);
        let checking = self.reachability.take().map(|check| {
            abandoned.extend(check.calls.pending_ids());
            check.waiters
        });
        self.outputs
            .retain(|output| !matches!(output, EstateOutput::Send(r) if abandoned.contains(&r.id)));
        self.outputs
            .extend(abandoned.into_iter().map(EstateOutput::Cancel));
        if !waiting.is_empty() {
            self.refresh_membership_if_due(now);
            for (waiter, planned) in waiting {
                self.membership.wait(waiter, planned);
            }
            self.drain_membership();
        }
        if let Some(waiters) = checking {
            self.start_reachability_check(now, waiters);
        }
        self.send_due_probes(now);
    }

    /// Takes in a request planned with [`crate::plan`]: answers it, hands back an [`Exchange`] to
    /// drive, or registers a waiter the estate answers (or resumes) itself.
    pub fn admit(&mut self, now: Instant, planned: Planned) -> Admission {
        let admission = self.admit_inner(now, planned, false);
        self.send_due_probes(now);
        admission
    }

    /// Admits a request again after [`EstateOutput::Resume`]; it no longer waits for a refresh.
    pub fn readmit(&mut self, now: Instant, planned: Planned) -> Admission {
        let admission = self.admit_inner(now, planned, true);
        self.send_due_probes(now);
        admission
    }

    /// Sends the probes that are due.
    fn send_due_probes(&mut self, now: Instant) {
        self.prober.send_due(now, &mut self.upstream_ids);
        self.drain_prober();
    }

    /// Moves what the prober asks for to the estate's outputs.
    fn drain_prober(&mut self) {
        while let Some(output) = self.prober.poll_output() {
            self.outputs.push_back(match output {
                ProberOutput::Send(request) => EstateOutput::Send(request),
                ProberOutput::Cancel(id) => EstateOutput::Cancel(id),
            });
        }
    }

    /// A finished exchange's report ([`Exchange::report`]): its round for `/healthz`, and the
    /// corrections it learned, kept while their membership snapshot is current.
    pub fn handle_report(&mut self, now: Instant, report: ExchangeReport) {
        if let Some(round) = report.round {
            self.rounds.record(now, round);
        }
        if let Some((generation, learned)) = report.learned {
            self.membership.learn(generation, learned);
        }
    }

    fn admit_inner(&mut self, now: Instant, planned: Planned, resumed: bool) -> Admission {
        // A request planned against another configuration (reloaded meanwhile) is planned again.
        let planned = if Arc::ptr_eq(&planned.config, &self.config) {
            planned
        } else {
            crate::policy::plan(
                &crate::ClientRequest::get(planned.target.clone()),
                &self.config,
            )
        };
        if matches!(planned.work, Work::Healthz) {
            return Admission::Wait(self.join_reachability_check(now));
        }
        // A fresh entry answers before anything else: a hit does no JSON work.
        if let (Some(cache), Some(keyed)) = (&mut self.cache, &planned.cache) {
            let may_refresh = cache.may_refresh(now, &keyed.key);
            let (entry, status) = match cache.lookup(now, &keyed.key) {
                Lookup::Fresh(entry) => (Some(entry), CacheStatus::Hit),
                Lookup::Stale(entry) => (Some(entry), CacheStatus::Stale),
                Lookup::Miss => (None, CacheStatus::Miss),
            };
            if let Some(entry) = entry {
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
                if refresh {
                    self.refresh_ahead(now, planned);
                }
                return Admission::Respond(finish_cached(response, status, age));
            }
        }
        let cacheable = planned.cache.clone().filter(|_| self.cache.is_some());
        let needs_ownership = planned.needs_ownership();
        let plan = match planned.work {
            Work::Local(response) => {
                // Answered from the request and the configuration alone: no fan-out, no wait
                // for the membership map.
                return Admission::Respond(if cacheable.is_some() {
                    finish_cached(response, CacheStatus::Miss, std::time::Duration::ZERO)
                } else {
                    response
                });
            }
            Work::Healthz => return Admission::Wait(self.join_reachability_check(now)),
            Work::Translate(pql) => return self.translate(now, pql, planned.target, resumed),
            Work::Fanout(plan) => plan,
        };
        if let Some(cacheable) = &cacheable {
            if let Some(flight) = self.flight_keys.get(&cacheable.flight_key).copied() {
                let waiter = WaiterId(self.waiter_ids.next());
                if let Some(flight) = self.flights.get_mut(&flight) {
                    flight
                        .participants
                        .insert(waiter, Participant::of(cacheable));
                    self.counts.flight_joins += 1;
                    return Admission::Wait(waiter);
                }
            }
        }
        let ownership = if needs_ownership {
            self.refresh_membership_if_due(now);
            if !self.membership.is_built() && !resumed {
                let waiter = WaiterId(self.waiter_ids.next());
                let planned = Box::new(Planned {
                    config: planned.config,
                    class: planned.class,
                    target: planned.target,
                    cache: planned.cache,
                    work: Work::Fanout(plan),
                    waited_out: planned.waited_out,
                });
                self.membership.wait(waiter, planned);
                self.drain_membership();
                return Admission::Wait(waiter);
            }
            Some(Arc::clone(self.membership.snapshot()))
        } else {
            None
        };
        let context = Context {
            config: Arc::clone(&self.config),
            roster: without(self.prober.roster(), &planned.waited_out),
            ownership,
            corrections: Arc::clone(self.membership.corrections()),
        };
        let fetch = PendingFetch {
            context,
            class: planned.class,
            target: planned.target,
            plan,
        };
        let Some(cacheable) = cacheable else {
            return Admission::Exchange(fetch.start(now));
        };
        let flight = FlightId(self.flight_ids.next());
        let waiter = WaiterId(self.waiter_ids.next());
        self.flight_keys
            .insert(cacheable.flight_key.clone(), flight);
        let mut record = Flight {
            key: cacheable.flight_key.clone(),
            ttl: cacheable.ttl,
            cache_generation: self.cache_generation,
            participants: BTreeMap::from([(waiter, Participant::of(&cacheable))]),
            refresh: None,
            stage: Stage::Fetching,
            fetch: None,
            lock: None,
            stale: None,
        };
        // With a shared tier, its store is asked first; the fan-out waits for its answer.
        if let Some(id) = self.shared_lookup(now, &cacheable.flight_key, flight) {
            record.stage = Stage::Looking(id);
            record.fetch = Some(fetch);
            self.flights.insert(flight, record);
            return Admission::Wait(waiter);
        }
        self.flights.insert(flight, record);
        Admission::Flight {
            flight,
            waiter,
            exchange: fetch.start(now),
        }
    }

    /// Starts the one background refresh of a hit's entry past its share of the TTL (docs/caching.md,
    /// "Refresh ahead"): a flight with no client, asking the shared store first like a miss
    /// (another replica may have refreshed it already), whose answer renews the entry. A miss
    /// for the key meanwhile joins it. Nothing starts before the first membership map.
    fn refresh_ahead(&mut self, now: Instant, planned: Planned) {
        let needs_ownership = planned.needs_ownership();
        let (Some(cacheable), Work::Fanout(plan)) = (planned.cache, planned.work) else {
            return;
        };
        let ownership = if needs_ownership {
            if !self.membership.is_built() {
                return;
            }
            self.refresh_membership_if_due(now);
            Some(Arc::clone(self.membership.snapshot()))
        } else {
            None
        };
        let fetch = PendingFetch {
            context: Context {
                config: Arc::clone(&self.config),
                roster: self.prober.roster(),
                ownership,
                corrections: Arc::clone(self.membership.corrections()),
            },
            class: planned.class,
            target: planned.target,
            plan,
        };
        let flight = FlightId(self.flight_ids.next());
        self.flight_keys
            .insert(cacheable.flight_key.clone(), flight);
        self.counts.refreshes_ahead += 1;
        let mut record = Flight {
            key: cacheable.flight_key.clone(),
            ttl: cacheable.ttl,
            cache_generation: self.cache_generation,
            participants: BTreeMap::new(),
            refresh: Some(Participant::of(&cacheable)),
            stage: Stage::Fetching,
            fetch: None,
            lock: None,
            stale: None,
        };
        if let Some(id) = self.shared_lookup(now, &cacheable.flight_key, flight) {
            record.stage = Stage::Looking(id);
            record.fetch = Some(fetch);
            self.flights.insert(flight, record);
            return;
        }
        self.flights.insert(flight, record);
        self.outputs.push_back(EstateOutput::StartFlight {
            flight,
            exchange: fetch.start(now),
        });
    }

    /// Forgets `key`'s flight when it is still `flight` (after a reload a newer one may hold it).
    fn forget_flight_key(&mut self, key: &str, flight: FlightId) {
        if self.flight_keys.get(key) == Some(&flight) {
            self.flight_keys.remove(key);
        }
    }

    /// PQL: planned at once from a kept translation, else the translation request to drive.
    fn translate(&mut self, now: Instant, pql: Pql, target: String, resumed: bool) -> Admission {
        if let Some(body) = self.translations.get(now, &pql.text) {
            if let Some(planned) = crate::policy::plan_translated(body, &pql, &target, &self.config)
            {
                return self.admit_inner(now, planned, resumed);
            }
        }
        let asked = pql.translation_target();
        let context = Context {
            config: Arc::clone(&self.config),
            roster: self.prober.roster(),
            ownership: None,
            corrections: Arc::clone(self.membership.corrections()),
        };
        let plan = Box::new(Sequence::translation(asked.clone()));
        Admission::Translate {
            exchange: Exchange::new(now, context, (RouteClass::Root, asked), plan),
            translating: Translating { pql, target },
        }
    }

    /// A translation request ([`Admission::Translate`]) responded: a translation is kept and the
    /// query it translates to admitted like any request; a refusal (PuppetDB's 400 for bad PQL,
    /// replayed) or a 502 is the answer; a 200 that is not a query AST is 502.
    pub fn handle_translated(
        &mut self,
        now: Instant,
        translating: Translating,
        response: Response,
    ) -> Admission {
        let ResponseBody::Full(body) = &response.body else {
            return Admission::Respond(response);
        };
        if !response.status.is_success() {
            return Admission::Respond(response);
        }
        let Translating { pql, target } = translating;
        match crate::policy::plan_translated(body, &pql, &target, &self.config) {
            Some(planned) => {
                self.translations.put(now, &pql.text, body.clone());
                self.admit_inner(now, planned, false)
            }
            None => Admission::Respond(Response::text(
                http::StatusCode::BAD_GATEWAY,
                "pdbmux: the backend's translation of the PQL query is not a query AST",
            )),
        }
    }

    /// A flight's exchange responded: per participant key, store the answer (filtered by the
    /// drilldown's value, once per key) or fall back to that key's stale entry, and answer every
    /// participant. An answer for an unknown (cancelled) flight is ignored.
    pub fn handle_flight_done(&mut self, now: Instant, flight: FlightId, response: Response) {
        let Some(done) = self.flights.remove(&flight) else {
            return;
        };
        self.forget_flight_key(&done.key, flight);
        self.shared_flight_done(now, &done, &response);
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

    /// Every configured backend (the `/healthz` reachability check asks them all).
    fn all_backends(&self) -> Vec<BackendId> {
        (0..self.config.backends.len()).map(BackendId).collect()
    }

    fn refresh_membership_if_due(&mut self, now: Instant) {
        let roster = self.prober.roster();
        self.membership
            .refresh_if_due(now, &roster, (&mut self.upstream_ids, &self.config));
        self.drain_membership();
    }

    /// Moves what the membership map asks for to the estate's outputs.
    fn drain_membership(&mut self) {
        while let Some(output) = self.membership.poll_output() {
            self.outputs.push_back(match output {
                MembershipOutput::Send(request) => EstateOutput::Send(request),
                MembershipOutput::Cancel(id) => EstateOutput::Cancel(id),
                MembershipOutput::Resume { waiter, planned } => {
                    EstateOutput::Resume { waiter, planned }
                }
            });
        }
    }

    fn join_reachability_check(&mut self, now: Instant) -> WaiterId {
        let waiter = WaiterId(self.waiter_ids.next());
        if let Some(check) = &mut self.reachability {
            check.waiters.push(waiter);
            return waiter;
        }
        self.start_reachability_check(now, vec![waiter]);
        waiter
    }

    /// Asks every configured backend for the `/healthz` check `waiters` wait on.
    fn start_reachability_check(&mut self, now: Instant, waiters: Vec<WaiterId>) {
        let roster = self.all_backends();
        let (calls, requests) = Broadcast::send(
            &mut self.upstream_ids,
            (&roster, crate::message::Purpose::Healthz),
            &[REACHABILITY_PATH],
            now + self.config.timeout,
        );
        self.outputs
            .extend(requests.into_iter().map(EstateOutput::Send));
        self.reachability = Some(ReachabilityCheck { waiters, calls });
        self.finish(now);
    }

    /// An upstream answer for a request the estate sent.
    pub fn handle_upstream_response(
        &mut self,
        now: Instant,
        id: UpstreamId,
        response: UpstreamResponse,
    ) {
        if self.prober.handle_response(
            now,
            (id, &response),
            (&mut self.upstream_ids, &self.config.backends),
        ) {
            self.drain_prober();
            return;
        }
        if let Some(check) = &mut self.reachability {
            check.calls.record_response(id, &response);
        }
        if self.membership.handle_response(
            now,
            id,
            &response,
            (&mut self.upstream_ids, &self.config),
        ) {
            self.drain_membership();
        }
        self.finish(now);
    }

    /// An upstream failure for a request the estate sent.
    pub fn handle_upstream_failure(
        &mut self,
        now: Instant,
        id: UpstreamId,
        failure: UpstreamFailure,
    ) {
        if self.prober.handle_failure(
            now,
            (id, &failure),
            (&mut self.upstream_ids, &self.config.backends),
        ) {
            self.drain_prober();
            return;
        }
        if let Some(check) = &mut self.reachability {
            check.calls.record_failure(id, &failure);
        }
        if self
            .membership
            .handle_failure(now, id, &failure, (&mut self.upstream_ids, &self.config))
        {
            self.drain_membership();
        }
        self.finish(now);
    }

    /// A waiting client went away; nothing is sent to it any more. A flight whose last
    /// participant left is cancelled ([`EstateOutput::CancelFlight`]).
    pub fn handle_waiter_gone(&mut self, now: Instant, waiter: WaiterId) {
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
        if let Some(check) = &mut self.reachability {
            check.waiters.retain(|w| *w != waiter);
        }
        self.membership.waiter_gone(waiter);
    }

    /// Time passed: expire what is past its deadline. A call before any deadline is a no-op.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.prober
            .handle_timeout(now, (&mut self.upstream_ids, &self.config.backends));
        self.drain_prober();
        let mut expired = Vec::new();
        if let Some(check) = &mut self.reachability {
            expired.extend(check.calls.expire(now));
        }
        if !expired.is_empty() {
            self.outputs
                .extend(expired.into_iter().map(EstateOutput::Cancel));
            self.finish(now);
        }
        self.membership
            .handle_timeout(now, (&mut self.upstream_ids, &self.config));
        self.drain_membership();
        self.shared_timeouts(now);
    }

    /// Whether [`Estate::poll_output`] has something: an answer from the cache may have queued
    /// work (a refresh ahead of expiry) for the runtime's driver to pick up.
    pub fn has_output(&self) -> bool {
        !self.outputs.is_empty()
    }

    /// The next thing the runtime must do, if any.
    pub fn poll_output(&mut self) -> Option<EstateOutput> {
        self.outputs.pop_front()
    }

    /// The one next deadline the runtime must wake the estate at, if any.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let reachability = self.reachability.as_ref().and_then(|c| c.calls.deadline());
        let membership = self.membership.deadline();
        [
            reachability,
            membership,
            self.prober.deadline(),
            self.shared_deadline(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// The estate's numbers now, for pdbmux's own metrics (docs/operating.md).
    pub fn stats(&self, now: Instant) -> crate::stats::EstateStats {
        let ownership = self.membership.snapshot();
        let owned = ownership.owned_counts(self.config.merge, self.config.backends.len());
        let backends = self
            .all_backends()
            .into_iter()
            .map(|backend| crate::stats::BackendStats {
                name: crate::status::backend_name(&self.config.backends, backend).to_owned(),
                state: self
                    .prober
                    .report(backend)
                    .map_or("unmonitored", |r| r.state.as_str()),
                transitions: self.prober.transitions(backend),
                owned_nodes: owned.get(backend.0).copied().unwrap_or(0),
                membership_age: self.membership.part_age(now, backend),
                membership_failures: self.membership.failures(backend),
            })
            .collect();
        let membership = crate::stats::MembershipStats {
            nodes: ownership.node_count(),
            shared_nodes: ownership.shared_count(),
            split_nodes: ownership.split_count(),
            refreshes: self.membership.refreshes(),
            last_refresh_duration: self.membership.last_refresh_duration(),
            age: self.membership.age(now),
        };
        let cache = self.cache.as_ref().map(|cache| {
            let report = cache.report(now);
            crate::stats::CacheStats {
                store: report.stats,
                evictions: self.counts.earlier_evictions + report.evictions,
                flight_joins: self.counts.flight_joins,
                refreshes_ahead: self.counts.refreshes_ahead,
                shared_reachable: self.shared.as_ref().map(SharedTier::reachable),
                shared_refused: self.shared.as_ref().map(SharedTier::refused),
            }
        });
        crate::stats::EstateStats {
            backends,
            membership,
            cache,
        }
    }

    /// The current ownership snapshot (for tests and `/healthz`).
    pub fn ownership(&self) -> Arc<Ownership> {
        Arc::clone(self.membership.snapshot())
    }

    /// Answers the `/healthz` check once it has every result.
    fn finish(&mut self, now: Instant) {
        if self
            .reachability
            .as_ref()
            .is_some_and(|c| c.calls.is_complete())
        {
            if let Some(check) = self.reachability.take() {
                let cache = self.cache.as_ref().map(|c| c.report(now));
                let health: Vec<_> = self
                    .all_backends()
                    .into_iter()
                    .map(|b| self.prober.report(b))
                    .collect();
                let response = check.response(
                    &self.config,
                    &health,
                    &self.rounds,
                    (
                        cache.as_ref(),
                        self.shared.as_ref().map(SharedTier::reachable),
                    ),
                    &self.clock,
                );
                for waiter in check.waiters {
                    self.outputs.push_back(EstateOutput::Respond {
                        waiter,
                        response: response.clone(),
                    });
                }
            }
        }
    }
}

/// `roster` less `left_out`, unless that leaves nobody (then every one of them is asked).
fn without(roster: Vec<BackendId>, left_out: &[BackendId]) -> Vec<BackendId> {
    let kept: Vec<BackendId> = roster
        .iter()
        .copied()
        .filter(|backend| !left_out.contains(backend))
        .collect();
    if kept.is_empty() {
        roster
    } else {
        kept
    }
}

/// What makes this process's lock tokens its own: its start, to the nanosecond.
fn token_base(clock: &ClockAnchor) -> String {
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
fn finish_cached(
    mut response: Response,
    status: CacheStatus,
    age: std::time::Duration,
) -> Response {
    cache::mark(&mut response.headers, status, age);
    response
}

/// The provenance drilldown's answer from the shared record set's: the records of the backends
/// `values` names, before it is stored (docs/merging.md, "Provenance"). A failure is left as it is.
fn filtered_by_source(mut response: Response, values: &[String]) -> Response {
    if let (ResponseBody::Full(body), true) = (&response.body, response.status.is_success()) {
        let (filtered, count) = filter_source_records(body, values);
        if response.headers.contains_key(crate::exchange::X_RECORDS) {
            response
                .headers
                .insert(crate::exchange::X_RECORDS, HeaderValue::from(count));
        }
        response.body = ResponseBody::Full(filtered);
    }
    response
}

#[cfg(test)]
#[allow(clippy::disallowed_methods)] // tests need one real instant to start from
mod tests {
    use super::*;
    use crate::config::{BackendConfig, BackendUrl, TlsFiles};
    use crate::exchange::ExchangeOutput;
    use crate::membership::MEMBERSHIP_QUERIES;
    use crate::message::{ClientRequest, UpstreamBody, UpstreamResponse};

    fn config(backends: &[(&str, u16)]) -> Config {
        let backends = backends
            .iter()
            .map(|(name, port)| BackendConfig {
                name: (*name).into(),
                url: BackendUrl {
                    scheme: "http".into(),
                    host: "127.0.0.1".into(),
                    port: Some(*port),
                },
                tls: TlsFiles::default(),
            })
            .collect();
        Config {
            health_probe_enabled: false,
            ..Config::with_backends(backends)
        }
    }

    fn estate(config: Config) -> (Estate, Instant) {
        let now = Instant::now();
        let clock = ClockAnchor {
            instant: now,
            wall: std::time::UNIX_EPOCH,
        };
        (Estate::new(config, clock), now)
    }

    fn admit(estate: &mut Estate, now: Instant, target: &str) -> Admission {
        let planned = crate::policy::plan(&ClientRequest::get(target), estate.config());
        estate.admit(now, planned)
    }

    /// The requests the estate asks to send, drained.
    fn sends(estate: &mut Estate) -> Vec<UpstreamRequest> {
        std::iter::from_fn(|| estate.poll_output())
            .filter_map(|output| match output {
                EstateOutput::Send(request) => Some(request),
                _ => None,
            })
            .collect()
    }

    const MEMBERSHIP: &str = r#"[{"certname":"n1","report_timestamp":"2024-05-01T10:00:00.000Z","deactivated":null,"expired":null}]"#;

    /// The exchange's contract (`Exchange`'s doc): an answer for a cancelled or unknown id is
    /// ignored, and a held body among them is cancelled again. The driver never delivers one
    /// (it drops a cancelled call's future), so the conformance harness cannot show this; a
    /// runtime that did would still be safe.
    #[test]
    fn answers_for_cancelled_or_unknown_ids_are_ignored_and_a_held_one_cancelled_again() {
        let (mut estate, start) = estate(config(&[("a", 1), ("b", 2)]));
        let target = "/pdb/query/v4/environments/production";
        let Admission::Exchange(mut exchange) = admit(&mut estate, start, target) else {
            panic!("a pass-through is an exchange of its own");
        };
        let outputs = |exchange: &mut Exchange| {
            std::iter::from_fn(|| exchange.poll_output()).collect::<Vec<_>>()
        };
        let first = match outputs(&mut exchange).as_slice() {
            [ExchangeOutput::Send(request)] => request.id,
            other => panic!("one send first: {other:?}"),
        };
        let deadline = exchange.poll_timeout().expect("a deadline");
        exchange.handle_timeout(deadline);
        let second = match outputs(&mut exchange).as_slice() {
            [ExchangeOutput::Cancel(id), ExchangeOutput::Send(request)] if *id == first => {
                request.id
            }
            other => panic!("cancel, then the next backend: {other:?}"),
        };
        let held = || UpstreamResponse {
            status: http::StatusCode::OK,
            headers: http::HeaderMap::new(),
            body: UpstreamBody::Held,
        };
        exchange.handle_upstream_response(deadline, first, held());
        assert!(
            matches!(outputs(&mut exchange).as_slice(), [ExchangeOutput::Cancel(id)] if *id == first),
            "a late held answer is cancelled again"
        );
        let unknown = UpstreamResponse {
            body: UpstreamBody::Full(bytes::Bytes::from_static(b"[]")),
            ..held()
        };
        exchange.handle_upstream_response(deadline, UpstreamId(99), unknown);
        assert!(
            outputs(&mut exchange).is_empty(),
            "an unknown id is ignored"
        );
        exchange.handle_upstream_response(deadline, second, held());
        let respond = outputs(&mut exchange);
        assert!(
            matches!(respond.as_slice(), [ExchangeOutput::Respond(r)] if r.body == ResponseBody::Upstream(second)),
            "{respond:?}"
        );
    }

    #[test]
    fn a_reload_with_other_backends_asks_the_membership_of_the_new_ones_for_its_waiters() {
        let (mut estate, now) = estate(config(&[("a", 1), ("b", 2)]));
        let Admission::Wait(waiter) = admit(&mut estate, now, "/pdb/query/v4/nodes") else {
            panic!("the first /nodes waits for the membership map");
        };
        let old = sends(&mut estate);
        assert_eq!(old.len(), 2 * 3, "three membership queries per backend");
        estate.reconfigure(now, Arc::new(config(&[("c", 3)])));
        let new = sends(&mut estate);
        assert_eq!(new.len(), 3, "the new backend is asked: {new:?}");
        assert!(new.iter().all(|r| r.backend == BackendId(0)));
        let answer = |request: &UpstreamRequest| {
            let body = if request.path_and_query == MEMBERSHIP_QUERIES[0] {
                MEMBERSHIP
            } else {
                "[]"
            };
            UpstreamResponse::full(http::StatusCode::OK, "application/json", body)
        };
        // The old backends' answers belong to no refresh any more.
        for request in &old {
            estate.handle_upstream_response(now, request.id, answer(request));
        }
        assert!(
            estate.poll_output().is_none(),
            "nothing resumes on old answers"
        );
        for request in &new {
            estate.handle_upstream_response(now, request.id, answer(request));
        }
        match estate.poll_output() {
            Some(EstateOutput::Resume {
                waiter: resumed, ..
            }) => assert_eq!(resumed, waiter),
            other => panic!("the waiter resumes on the new map: {other:?}"),
        }
        let stats = estate.stats(now);
        assert_eq!(stats.backends.len(), 1);
        assert_eq!(stats.backends[0].name, "c");
        assert_eq!(stats.backends[0].owned_nodes, 1);
        assert_eq!(stats.membership.refreshes, 1);
    }

    #[test]
    fn a_backend_kept_through_a_reload_keeps_its_health_and_counts() {
        let probing = |backends: &[(&str, u16)]| Config {
            health_probe_enabled: true,
            health_probe_failures: 1,
            ..config(backends)
        };
        let (mut estate, now) = estate(probing(&[("a", 1), ("b", 2)]));
        let _ = admit(&mut estate, now, "/pdb/query/v4/fact-names");
        let probes: Vec<UpstreamRequest> = sends(&mut estate)
            .into_iter()
            .filter(|request| request.path_and_query == "/status/v1/services")
            .collect();
        assert_eq!(probes.len(), 2, "{probes:?}");
        let refused =
            UpstreamResponse::full(http::StatusCode::SERVICE_UNAVAILABLE, "text/plain", "down");
        estate.handle_upstream_response(now, probes[1].id, refused);
        assert_eq!(estate.stats(now).backends[1].state, "unhealthy");
        estate.reconfigure(now, Arc::new(probing(&[("b", 2), ("c", 3)])));
        let stats = estate.stats(now);
        let named: Vec<(&str, &str)> = stats
            .backends
            .iter()
            .map(|backend| (backend.name.as_str(), backend.state))
            .collect();
        assert_eq!(named, [("b", "unhealthy"), ("c", "unprobed")]);
        let down = crate::stats::TRANSITIONS.iter().position(|t| *t == "down");
        assert_eq!(down.map(|i| stats.backends[0].transitions[i]), Some(1));
        // a's probe answer arrives late: it is nobody's now.
        let ok = UpstreamResponse::full(http::StatusCode::OK, "application/json", "{}");
        estate.handle_upstream_response(now, probes[0].id, ok);
        assert_eq!(estate.stats(now).backends[0].state, "unhealthy");
    }

    #[test]
    fn requests_queued_for_old_backends_are_dropped_by_a_reload() {
        let (mut estate, now) = estate(config(&[("a", 1), ("b", 2)]));
        assert!(matches!(
            admit(&mut estate, now, "/pdb/query/v4/nodes"),
            Admission::Wait(_)
        ));
        // Not drained yet: the runtime's driver has not run since the admission.
        estate.reconfigure(now, Arc::new(config(&[("c", 3)])));
        let outputs: Vec<EstateOutput> = std::iter::from_fn(|| estate.poll_output()).collect();
        let sent: Vec<&UpstreamRequest> = outputs
            .iter()
            .filter_map(|output| match output {
                EstateOutput::Send(request) => Some(request),
                _ => None,
            })
            .collect();
        let asked: Vec<(BackendId, &str)> = sent
            .iter()
            .map(|r| (r.backend, r.path_and_query.as_str()))
            .collect();
        let new_backend = MEMBERSHIP_QUERIES.map(|q| (BackendId(0), q));
        assert_eq!(
            asked, new_backend,
            "only the new backend is asked: {outputs:?}"
        );
    }

    #[test]
    fn a_flight_started_before_a_reload_that_replaces_the_cache_stores_nothing() {
        let (mut estate, now) = estate(config(&[("a", 1)]));
        let Admission::Flight { flight, .. } = admit(&mut estate, now, "/pdb/query/v4/fact-names")
        else {
            panic!("a cacheable miss starts a flight");
        };
        let ttl_changed = Config {
            facts_ttl: std::time::Duration::from_secs(20),
            ..config(&[("a", 1)])
        };
        estate.reconfigure(now, Arc::new(ttl_changed));
        let Admission::Flight { flight: newer, .. } =
            admit(&mut estate, now, "/pdb/query/v4/fact-names")
        else {
            panic!("a request after the reload never joins the old configuration's flight");
        };
        assert_ne!(newer, flight);
        let answer = Response::text(http::StatusCode::OK, "[\"kernel\"]");
        estate.handle_flight_done(now, flight, answer.clone());
        assert!(
            matches!(estate.poll_output(), Some(EstateOutput::Respond { .. })),
            "its clients are answered"
        );
        assert!(
            estate.poll_output().is_none(),
            "the newer flight's client is not"
        );
        assert!(
            matches!(
                admit(&mut estate, now, "/pdb/query/v4/fact-names"),
                Admission::Wait(_)
            ),
            "the new cache holds nothing: a request joins the newer flight"
        );
        estate.handle_flight_done(now, newer, answer);
        let _ = std::iter::from_fn(|| estate.poll_output()).count();
        assert!(
            matches!(
                admit(&mut estate, now, "/pdb/query/v4/fact-names"),
                Admission::Respond(_)
            ),
            "the newer flight's answer is stored"
        );
    }

    #[test]
    fn a_reload_that_changes_no_answer_keeps_the_cache_and_asks_nothing_again() {
        let (mut estate, now) = estate(config(&[("a", 1)]));
        let Admission::Flight { flight, .. } = admit(&mut estate, now, "/pdb/query/v4/fact-names")
        else {
            panic!("a cacheable miss starts a flight");
        };
        let answer = Response::text(http::StatusCode::OK, "[\"kernel\"]");
        estate.handle_flight_done(now, flight, answer);
        let _ = sends(&mut estate);
        let timeout_changed = Config {
            timeout: std::time::Duration::from_secs(3),
            ..config(&[("a", 1)])
        };
        estate.reconfigure(now, Arc::new(timeout_changed));
        assert!(sends(&mut estate).is_empty(), "nothing is asked again");
        assert!(
            matches!(
                admit(&mut estate, now, "/pdb/query/v4/fact-names"),
                Admission::Respond(_)
            ),
            "a hit"
        );
        assert_eq!(estate.config().timeout, std::time::Duration::from_secs(3));
    }
}
