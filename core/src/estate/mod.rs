//! The shared machine: everything requests have in common. It holds no JSON work on records and
//! is touched only briefly per request, so it never serializes merges.
//!
//! [`Estate`] is the contract with the runtime and the composition of its parts, each with its
//! own state and tests (docs/architecture.md, "The estate's parts"): `backends` (probes, query
//! rounds, the `/healthz` check), `membership` (the membership map and its refreshes), `answers`
//! (the cache, its flights, refresh ahead and the shared tier) and the PQL translations. The
//! estate decides what a request waits for and which part answers it, and what a reload keeps;
//! an upstream answer goes to the part that asked it (`asked`).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use crate::cache::CacheStatus;
use crate::clock::ClockAnchor;
use crate::config::{Config, Renews};
use crate::exchange::{Exchange, ExchangeReport};
use crate::fanout::Plan;
use crate::ids::{BackendId, Counter, FlightId, UpstreamId, WaiterId};
use crate::membership::Ownership;
use crate::message::{Response, UpstreamFailure, UpstreamResponse};
use crate::parsed::ParsedRequest;
use crate::policy::{Planned, Work};
use crate::root::{Pql, Translating};
use crate::route::RouteClass;
use crate::sequence::Sequence;
use crate::translations::Translations;

mod answers;
mod asked;
mod backends;
mod membership;
mod output;
mod shared_tier;

pub use output::{Admission, EstateOutput};

use crate::cache::shared::{StoreAnswer, StoreId};
use answers::{finish_cached, Answers, PendingFetch};
use asked::{AskedBy, Asker, UpstreamEnd};
use backends::BackendWatch;
use membership::MembershipPart;

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
    clock: ClockAnchor,
    /// Probes, query rounds and the `/healthz` check.
    backends: BackendWatch,
    /// The membership map.
    membership: MembershipPart,
    /// The cache, its flights and the shared tier.
    answers: Answers,
    /// PQL translations backends gave.
    translations: Translations,
    outputs: VecDeque<EstateOutput>,
    /// The part that asked each upstream request in flight.
    asked: AskedBy,
}

impl Estate {
    /// A fresh estate for this configuration, caching in memory within `facts_cache_bytes`.
    /// `clock` maps instants to wall time for `/healthz`.
    pub fn new(config: Config, clock: ClockAnchor) -> Estate {
        let config = Arc::new(config);
        Estate {
            answers: Answers::new(&config, clock),
            backends: BackendWatch::new(clock.instant, &config),
            membership: MembershipPart::new(clock.instant, config.backends.len()),
            config,
            upstream_ids: Counter::default(),
            waiter_ids: Counter::default(),
            clock,
            translations: Translations::default(),
            outputs: VecDeque::new(),
            asked: AskedBy::default(),
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
        if self.answers.reconfigure(now, &old, &config) {
            self.translations = Translations::default();
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
        let same_backends = old.backends == config.backends;
        let checking =
            self.backends
                .reconfigure(now, (&config, &carried), same_backends, &mut self.outputs);
        if !same_backends {
            self.membership.reset(
                now,
                (&carried, &self.backends.roster()),
                (&mut self.upstream_ids, &self.config),
                &mut self.outputs,
            );
        }
        if let Some(waiters) = checking {
            self.join_reachability_check(now, waiters);
        }
        self.send_due_probes(now);
    }

    /// Takes in a request planned with [`crate::plan`]: answers it, hands back an [`Exchange`] to
    /// drive, or registers a waiter the estate answers (or resumes) itself.
    pub fn admit(&mut self, now: Instant, planned: Planned) -> Admission {
        let admission = self.admit_inner(now, planned);
        self.send_due_probes(now);
        admission
    }

    /// Admits a request again after [`EstateOutput::Resume`]: it waits for another refresh only
    /// while the map still places no backend, and for two at most in all.
    pub fn readmit(&mut self, now: Instant, planned: Planned) -> Admission {
        self.admit(now, planned)
    }

    /// Sends the probes that are due.
    fn send_due_probes(&mut self, now: Instant) {
        self.backends
            .send_due_probes(now, &mut self.upstream_ids, &mut self.outputs);
    }

    /// A finished exchange's report ([`Exchange::report`]): its round for `/healthz`, and the
    /// corrections it learned, kept while their membership snapshot is current.
    pub fn handle_report(&mut self, now: Instant, report: ExchangeReport) {
        if let Some(round) = report.round {
            self.backends.record_round(now, round);
        }
        if let Some((generation, learned)) = report.learned {
            self.membership.map.learn(generation, learned);
        }
    }

    fn admit_inner(&mut self, now: Instant, planned: Planned) -> Admission {
        // A request planned against another configuration (reloaded meanwhile) is planned again.
        let planned = if Arc::ptr_eq(&planned.config, &self.config) {
            planned
        } else {
            planned.again(&self.config)
        };
        // A fresh entry answers before anything else: a hit does no JSON work.
        if let Some(hit) = self.answers.lookup(now, &planned) {
            if hit.refresh {
                self.refresh_ahead(now, planned);
            }
            return Admission::Respond(hit.response);
        }
        let cacheable = self.answers.caches(&planned);
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
            Work::Healthz => return Admission::Wait(self.healthz_waiter(now)),
            Work::Translate(pql) => {
                return self.translate(now, pql, (planned.request, planned.map_waits))
            }
            Work::Fanout(plan) => plan,
        };
        if let Some(waiter) = cacheable
            .as_ref()
            .and_then(|c| self.answers.join(c, &mut self.waiter_ids))
        {
            return Admission::Wait(waiter);
        }
        let ownership = if needs_ownership {
            self.refresh_membership_if_due(now);
            if self.membership.must_wait(planned.map_waits) {
                let waiter = WaiterId(self.waiter_ids.next());
                let planned = Box::new(Planned {
                    work: Work::Fanout(plan),
                    map_waits: planned.map_waits + 1,
                    ..planned
                });
                self.membership.wait(waiter, planned, &mut self.outputs);
                return Admission::Wait(waiter);
            }
            Some(self.membership.snapshot())
        } else {
            None
        };
        // A flight's merge streams too: its driver reads it whole, to share and cache.
        let fetch = self.fetch(
            (planned.class, &planned.request, plan),
            (ownership, planned.waited_out),
        );
        match cacheable {
            None => Admission::Exchange(fetch.start(now)),
            Some(cacheable) => self
                .answers
                .fly(now, &cacheable, fetch, &mut self.waiter_ids),
        }
    }

    /// Starts the one background refresh of a hit's entry past its share of the TTL (docs/caching.md,
    /// "Refresh ahead"), planned as a miss would be. Nothing starts before the first membership
    /// map.
    fn refresh_ahead(&mut self, now: Instant, planned: Planned) {
        let needs_ownership = planned.needs_ownership();
        let (Some(cacheable), Work::Fanout(plan)) = (planned.cache, planned.work) else {
            return;
        };
        let ownership = if needs_ownership {
            if !self.membership.map.places_any() {
                return;
            }
            self.refresh_membership_if_due(now);
            Some(self.membership.snapshot())
        } else {
            None
        };
        let fetch = self.fetch(
            (planned.class, &planned.request, plan),
            (ownership, Vec::new()),
        );
        self.answers.refresh(now, &cacheable, fetch);
    }

    /// The fan-out of `plan` for `request` over the backends as they are now, ownership decided
    /// by `ownership` and the backends a wait for the map did not hear from left out.
    fn fetch(
        &self,
        (class, request, plan): (RouteClass, &ParsedRequest, Box<dyn Plan>),
        placing: (Option<Arc<Ownership>>, Vec<BackendId>),
    ) -> PendingFetch {
        PendingFetch {
            context: (self.membership).context((&self.config, &self.backends), placing),
            class,
            target: request.target().to_owned(),
            plan,
        }
    }

    /// PQL: planned at once from a kept translation, else the translation request to drive.
    fn translate(
        &mut self,
        now: Instant,
        pql: Pql,
        (request, map_waits): (Arc<ParsedRequest>, u8),
    ) -> Admission {
        if let Some(planned) = self
            .translations
            .planned(now, (&pql, &request), &self.config)
        {
            return self.admit_inner(
                now,
                Planned {
                    map_waits,
                    ..planned
                },
            );
        }
        let asked = pql.translation_target();
        let context = self
            .membership
            .context((&self.config, &self.backends), (None, Vec::new()));
        let plan = Box::new(Sequence::translation(asked.clone()));
        Admission::Translate {
            exchange: Exchange::new(now, context, (RouteClass::Root, asked), plan),
            translating: Translating { pql, request },
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
        match self
            .translations
            .learn(now, (translating, response), &self.config)
        {
            Ok(planned) => self.admit_inner(now, planned),
            Err(response) => Admission::Respond(*response),
        }
    }

    /// A flight's exchange responded: per participant key, store the answer (filtered by the
    /// drilldown's value, once per key) or fall back to that key's stale entry, and answer every
    /// participant. An answer for an unknown (cancelled) flight is ignored.
    pub fn handle_flight_done(&mut self, now: Instant, flight: FlightId, response: Response) {
        self.answers.handle_flight_done(now, flight, response);
    }

    /// A flight's exchange answered with a streamed merge whose head is `head`: the clients to
    /// answer with that head (each its own, with `X-Cache`) and to write the merge's pieces to
    /// as they come, or `None` when the flight's answer must be read whole first (a drilldown
    /// filters it, or it refreshes an entry). Either way [`Estate::handle_flight_done`] follows
    /// with the whole answer (stored when it may be) or the failure. A request for the key that
    /// comes once the flight streams starts a flight of its own.
    pub fn stream_flight(
        &mut self,
        now: Instant,
        flight: FlightId,
        head: &Response,
    ) -> Option<Vec<(WaiterId, Response)>> {
        self.answers.stream_flight(now, flight, head)
    }

    /// The shared store answered (or, from [`Estate::handle_timeout`], did not in time). A late
    /// or unknown answer is ignored; a lock taken for a flight nobody waits on any more is
    /// released.
    pub fn handle_store_answer(&mut self, now: Instant, id: StoreId, answer: StoreAnswer) {
        self.answers.handle_store_answer(now, id, answer);
    }

    fn refresh_membership_if_due(&mut self, now: Instant) {
        self.membership.refresh_if_due(
            now,
            &self.backends.roster(),
            (&mut self.upstream_ids, &self.config),
            &mut self.outputs,
        );
    }

    /// A new waiter on the `/healthz` check.
    fn healthz_waiter(&mut self, now: Instant) -> WaiterId {
        let waiter = WaiterId(self.waiter_ids.next());
        self.join_reachability_check(now, vec![waiter]);
        waiter
    }

    /// Makes `waiters` wait for the `/healthz` check under way, or starts one asking every
    /// configured backend.
    fn join_reachability_check(&mut self, now: Instant, waiters: Vec<WaiterId>) {
        self.backends.join_check(
            now,
            waiters,
            (&mut self.upstream_ids, &self.config),
            &mut self.outputs,
        );
        self.finish(now);
    }

    /// An upstream answer for a request the estate sent.
    pub fn handle_upstream_response(
        &mut self,
        now: Instant,
        id: UpstreamId,
        response: UpstreamResponse,
    ) {
        self.answered(now, id, UpstreamEnd::Response(&response));
    }

    /// An upstream failure for a request the estate sent.
    pub fn handle_upstream_failure(
        &mut self,
        now: Instant,
        id: UpstreamId,
        failure: UpstreamFailure,
    ) {
        self.answered(now, id, UpstreamEnd::Failure(&failure));
    }

    /// Hands an upstream request's end to the part that asked it; one cancelled, or dropped by
    /// a reload, is nobody's.
    fn answered(&mut self, now: Instant, id: UpstreamId, answer: UpstreamEnd<'_>) {
        let sending = (&mut self.upstream_ids, &*self.config);
        match self.asked.take(id) {
            Some(Asker::Prober) => {
                self.backends
                    .probe_answered(now, (id, answer), sending, &mut self.outputs)
            }
            Some(Asker::Reachability) => {
                self.backends.check_answered(id, answer);
                self.finish(now);
            }
            Some(Asker::Membership) => {
                self.membership
                    .answered(now, (id, answer), sending, &mut self.outputs)
            }
            None => {}
        }
    }

    /// A waiting client went away; nothing is sent to it any more. A flight whose last
    /// participant left is cancelled ([`EstateOutput::CancelFlight`]).
    pub fn handle_waiter_gone(&mut self, now: Instant, waiter: WaiterId) {
        self.answers.waiter_gone(now, waiter);
        self.backends.waiter_gone(waiter);
        self.membership.map.waiter_gone(waiter);
    }

    /// Time passed: expire what is past its deadline. A call before any deadline is a no-op.
    pub fn handle_timeout(&mut self, now: Instant) {
        if self.backends.handle_timeout(
            now,
            (&mut self.upstream_ids, &self.config),
            &mut self.outputs,
        ) {
            self.finish(now);
        }
        self.membership.handle_timeout(
            now,
            (&mut self.upstream_ids, &self.config),
            &mut self.outputs,
        );
        self.answers.shared_timeouts(now);
    }

    /// Whether [`Estate::poll_output`] has something: an answer from the cache may have queued
    /// work (a refresh ahead of expiry) for the runtime's driver to pick up.
    pub fn has_output(&self) -> bool {
        !self.outputs.is_empty() || !self.answers.outputs.is_empty()
    }

    /// The next thing the runtime must do, if any.
    pub fn poll_output(&mut self) -> Option<EstateOutput> {
        let output = self
            .outputs
            .pop_front()
            .or_else(|| self.answers.outputs.pop_front())?;
        self.asked.note(&output);
        Some(output)
    }

    /// The one next deadline the runtime must wake the estate at, if any.
    pub fn poll_timeout(&self) -> Option<Instant> {
        [
            self.backends.deadline(),
            self.membership.map.deadline(),
            self.answers.shared_deadline(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// The estate's numbers now, for pdbmux's own metrics (docs/operating.md).
    pub fn stats(&self, now: Instant) -> crate::stats::EstateStats {
        let mut backends = self.backends.stats(&self.config);
        self.membership.fill_stats(now, &self.config, &mut backends);
        crate::stats::EstateStats {
            backends,
            membership: self.membership.map.stats(now),
            cache: self.answers.stats(now),
        }
    }

    /// The current ownership snapshot (for tests and `/healthz`).
    pub fn ownership(&self) -> Arc<Ownership> {
        self.membership.snapshot()
    }

    /// Answers the `/healthz` check once it has every result.
    fn finish(&mut self, now: Instant) {
        let answers = &self.answers;
        self.backends.finish_check(
            (&self.config, &self.clock),
            || answers.health(now),
            &mut self.outputs,
        );
    }
}

#[cfg(test)]
#[allow(clippy::disallowed_methods)] // tests need one real instant to start from
mod tests {
    use super::*;
    use crate::exchange::ExchangeOutput;
    use crate::ids::BackendId;
    use crate::membership::MEMBERSHIP_QUERIES;
    use crate::message::{
        ClientRequest, ResponseBody, UpstreamBody, UpstreamRequest, UpstreamResponse,
    };

    /// A configuration of these backends on loopback, probes off.
    pub(super) fn config(backends: &[(&str, u16)]) -> Config {
        Config {
            health_probe_enabled: false,
            ..Config::on_loopback(backends)
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

    pub(super) const MEMBERSHIP: &str = r#"[{"certname":"n1","to_string":"2024-05-01T10:00:00.000000+00","deactivated":null,"expired":null}]"#;

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
