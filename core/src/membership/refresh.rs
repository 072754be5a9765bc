//! The membership map as a machine of its own: each backend's last good part, the ownership
//! snapshot built from them, the corrections learned against that snapshot, and the refresh
//! under way. Its inputs are the estate's: a request that needs the map, upstream answers and
//! failures, time; its outputs, drained with [`MembershipMap::poll_output`], are requests to
//! send or cancel and waiters to resume.
//!
//! A refresh is one round (docs/merging.md, "Who owns a node"): every backend in service is
//! asked, at once, its nodes and when each node's facts and catalog were produced. Nothing is
//! carried from one refresh to the next, so a copy a backend replaced between two of those reads
//! is read right by the next refresh.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{parse_membership, BackendNodes, Ownership, MEMBERSHIP_QUERIES};
use crate::broadcast::Broadcast;
use crate::config::Config;
use crate::corrections::{Corrections, Learned};
use crate::ids::{BackendId, Counter, UpstreamId, WaiterId};
use crate::message::{Purpose, UpstreamFailure, UpstreamRequest, UpstreamResponse};
use crate::status::{Failure, Unusable};

/// What the membership map asks of the estate; drain with [`MembershipMap::poll_output`]. `P`
/// is what a waiter parks while it waits (the estate's planned request).
#[derive(Debug)]
pub(crate) enum MembershipOutput<P> {
    /// Send this request upstream; its answer goes to [`MembershipMap::handle_response`].
    Send(UpstreamRequest),
    /// Abandon this upstream request.
    Cancel(UpstreamId),
    /// The map this waiter waited for is built: admit its request again; after a refresh,
    /// leaving out the backends it waited for in vain (`waited_out`).
    Resume {
        waiter: WaiterId,
        planned: Box<P>,
        waited_out: Option<Vec<BackendId>>,
    },
}

/// The membership map (see the module doc); `P` is what a waiter parks while it waits.
#[derive(Debug)]
pub(crate) struct MembershipMap<P> {
    /// Each backend's last good part (configured order; `None`: never answered).
    per_backend: Vec<Option<BackendNodes>>,
    /// When each backend's part was last renewed (or, until then, when the map was made).
    renewed_at: Vec<Instant>,
    /// Refreshes that did not renew each backend's part.
    failures: Vec<u64>,
    snapshot: Arc<Ownership>,
    corrections: Arc<Corrections>,
    generations: Counter,
    refreshed_at: Option<Instant>,
    refreshes: u64,
    last_refresh_duration: Option<Duration>,
    refresh: Option<Refresh<P>>,
    outputs: VecDeque<MembershipOutput<P>>,
}

/// A refresh under way.
#[derive(Debug)]
struct Refresh<P> {
    started: Instant,
    /// Each backend's [`MEMBERSHIP_QUERIES`].
    calls: Broadcast,
    /// The backends whose calls all have results, each read into its part (or why not) as soon
    /// as its last answer came: its bodies are let go then, not held until every backend's
    /// answers are in.
    parts: Vec<(BackendId, Result<BackendNodes, Failure>)>,
    waiters: Vec<(WaiterId, Box<P>)>,
}

impl<P> Refresh<P> {
    /// Reads the part of every backend whose calls all have results and is not read yet.
    fn read_answered(&mut self) {
        let mut backends: Vec<BackendId> = self.calls.0.iter().map(|call| call.backend).collect();
        backends.dedup();
        for backend in backends {
            if self.parts.iter().any(|(read, _)| *read == backend) || !self.calls.answered(backend)
            {
                continue;
            }
            let part = self
                .calls
                .take_bodies_of(backend)
                .and_then(|bodies| match &bodies[..] {
                    [nodes, factsets, catalogs] => parse_membership(nodes, factsets, catalogs)
                        .ok_or_else(not_a_membership_answer),
                    _ => Err(not_a_membership_answer()),
                });
            self.parts.push((backend, part));
        }
    }
}

/// The membership map's numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MembershipStats {
    /// Distinct active certnames.
    pub nodes: usize,
    /// Active certnames more than one backend holds.
    pub shared_nodes: usize,
    /// Active certnames whose kinds of data are newest in different backends.
    pub split_nodes: usize,
    /// Refreshes completed since start.
    pub refreshes: u64,
    /// How long the last refresh took, from the first request sent to the last answer.
    pub last_refresh_duration: Option<Duration>,
    /// How old the map is; `None` before the first refresh.
    pub age: Option<Duration>,
}

/// How soon a refresh asks again when a backend in the roster has never been placed: soon, as
/// answers leave it out meanwhile, but not so soon that a backend whose membership keeps failing
/// while its probes pass has every backend asked for its nodes every second.
const UNPLACED_RETRY: Duration = Duration::from_secs(5);

/// The context an input that may send requests needs: the estate's id counter and its
/// configuration (timeout, freshness, backend names).
pub(crate) type Sending<'a> = (&'a mut Counter, &'a Config);

impl<P> MembershipMap<P> {
    /// An empty map of `backends` backends, none of them answered yet.
    pub(crate) fn new(now: Instant, backends: usize) -> MembershipMap<P> {
        MembershipMap {
            per_backend: vec![None; backends],
            renewed_at: vec![now; backends],
            failures: vec![0; backends],
            snapshot: Ownership::empty(),
            corrections: Arc::new(Corrections::new(0)),
            generations: Counter::default(),
            refreshed_at: None,
            refreshes: 0,
            last_refresh_duration: None,
            refresh: None,
            outputs: VecDeque::new(),
        }
    }

    /// The current snapshot.
    pub(crate) fn snapshot(&self) -> &Arc<Ownership> {
        &self.snapshot
    }

    /// The corrections learned against the current snapshot.
    pub(crate) fn corrections(&self) -> &Arc<Corrections> {
        &self.corrections
    }

    /// Keeps what an exchange learned against snapshot `generation` while it is current.
    pub(crate) fn learn(&mut self, generation: u64, learned: Vec<Learned>) {
        self.corrections = self.corrections.with(generation, learned);
    }

    /// Whether the map places any backend's nodes: not before the first refresh, nor while every
    /// refresh so far failed. A request that needs ownership waits for the next refresh then.
    pub(crate) fn places_any(&self) -> bool {
        (0..self.per_backend.len()).any(|backend| self.part(BackendId(backend)).is_some())
    }

    /// The backends whose nodes the map does not place: none of their refreshes answered yet.
    /// A merge that needs ownership leaves them out (a partial answer) rather than guess whose
    /// copy of their nodes is newest.
    pub(crate) fn unplaced(&self) -> Vec<BackendId> {
        (0..self.per_backend.len())
            .map(BackendId)
            .filter(|backend| self.part(*backend).is_none())
            .collect()
    }

    /// Starts a refresh of the backends in `roster` when the map is older than
    /// `freshness_ttl` (or was never built) and none is under way.
    pub(crate) fn refresh_if_due(
        &mut self,
        now: Instant,
        roster: &[BackendId],
        (ids, config): Sending<'_>,
    ) {
        // A backend in the roster the map has never placed is asked again sooner: answers that
        // need ownership leave it out until it is placed.
        // A map that places nobody is refreshed whenever asked: requests wait for it.
        let unplaced = roster.iter().any(|backend| self.part(*backend).is_none());
        let due = !self.places_any()
            || self.refreshed_at.is_none_or(|at| {
                now >= at + config.freshness_ttl
                    || (unplaced && now >= at + UNPLACED_RETRY.min(config.freshness_ttl))
            });
        if !due || self.refresh.is_some() {
            return;
        }
        let (calls, requests) = Broadcast::send(
            ids,
            (roster, Purpose::Membership),
            &MEMBERSHIP_QUERIES,
            now + config.timeout,
        );
        self.outputs
            .extend(requests.into_iter().map(MembershipOutput::Send));
        self.refresh = Some(Refresh {
            started: now,
            calls,
            parts: Vec::new(),
            waiters: Vec::new(),
        });
        // A roster of nobody completes at once.
        self.advance(now, config);
    }

    /// Makes `waiter` wait for the refresh under way, resumed when it completes; with none
    /// under way (the map is there already), resumed at once.
    pub(crate) fn wait(&mut self, waiter: WaiterId, planned: Box<P>) {
        match &mut self.refresh {
            Some(refresh) => refresh.waiters.push((waiter, planned)),
            None => self.outputs.push_back(MembershipOutput::Resume {
                waiter,
                planned,
                waited_out: None,
            }),
        }
    }

    /// An upstream answer: whether it was one of the refresh's.
    pub(crate) fn handle_response(
        &mut self,
        now: Instant,
        id: UpstreamId,
        response: &UpstreamResponse,
        sending: Sending<'_>,
    ) -> bool {
        let Some(refresh) = &mut self.refresh else {
            return false;
        };
        let mine = refresh.calls.record_response(id, response);
        if mine {
            self.advance(now, sending.1);
        }
        mine
    }

    /// An upstream failure: whether it was one of the refresh's.
    pub(crate) fn handle_failure(
        &mut self,
        now: Instant,
        id: UpstreamId,
        failure: &UpstreamFailure,
        sending: Sending<'_>,
    ) -> bool {
        let Some(refresh) = &mut self.refresh else {
            return false;
        };
        let mine = refresh.calls.record_failure(id, failure);
        if mine {
            self.advance(now, sending.1);
        }
        mine
    }

    /// Time passed: calls past their deadline time out (and are cancelled).
    pub(crate) fn handle_timeout(&mut self, now: Instant, sending: Sending<'_>) {
        let Some(refresh) = &mut self.refresh else {
            return;
        };
        let expired = refresh.calls.expire(now);
        if !expired.is_empty() {
            self.outputs
                .extend(expired.into_iter().map(MembershipOutput::Cancel));
            self.advance(now, sending.1);
        }
    }

    /// The next instant [`MembershipMap::handle_timeout`] is due, if any.
    pub(crate) fn deadline(&self) -> Option<Instant> {
        self.refresh.as_ref()?.calls.deadline()
    }

    /// A waiting client left.
    pub(crate) fn waiter_gone(&mut self, waiter: WaiterId) {
        if let Some(refresh) = &mut self.refresh {
            refresh.waiters.retain(|(w, _)| *w != waiter);
        }
    }

    /// Other backends (a reload): the map starts empty for `carried.len()` backends, each
    /// keeping the failure count of its old index in `carried` when it is the same backend.
    /// Returns the ids of the refresh's unanswered requests (to drop or cancel: their answers
    /// would land on other backends' indices) and its waiters (to wait for the next map).
    pub(crate) fn reset(
        &mut self,
        now: Instant,
        carried: &[Option<usize>],
    ) -> (Vec<UpstreamId>, Vec<(WaiterId, Box<P>)>) {
        let (abandoned, waiters) = match self.refresh.take() {
            Some(refresh) => (refresh.calls.pending_ids(), refresh.waiters),
            None => (Vec::new(), Vec::new()),
        };
        let failures = carried
            .iter()
            .map(|old| old.and_then(|i| self.failures.get(i).copied()).unwrap_or(0))
            .collect();
        let backends = carried.len();
        let generation = self.generations.next();
        self.per_backend = vec![None; backends];
        self.renewed_at = vec![now; backends];
        self.failures = failures;
        self.snapshot = Arc::new(Ownership::build(&self.per_backend, generation));
        self.corrections = Arc::new(Corrections::new(generation));
        self.refreshed_at = None;
        (abandoned, waiters)
    }

    /// The next thing to do, if any.
    pub(crate) fn poll_output(&mut self) -> Option<MembershipOutput<P>> {
        self.outputs.pop_front()
    }

    /// How long ago `backend`'s part was renewed.
    pub(crate) fn part_age(&self, now: Instant, backend: BackendId) -> Duration {
        self.renewed_at
            .get(backend.0)
            .map(|at| now.saturating_duration_since(*at))
            .unwrap_or_default()
    }

    /// How many refreshes did not renew `backend`'s part.
    pub(crate) fn failures(&self, backend: BackendId) -> u64 {
        self.failures.get(backend.0).copied().unwrap_or(0)
    }

    /// How old the map is (`None`: never built).
    pub(crate) fn age(&self, now: Instant) -> Option<Duration> {
        self.refreshed_at
            .map(|at| now.saturating_duration_since(at))
    }

    /// The map's numbers for the metrics.
    pub(crate) fn stats(&self, now: Instant) -> MembershipStats {
        let ownership = &self.snapshot;
        MembershipStats {
            nodes: ownership.node_count(),
            shared_nodes: ownership.shared_count(),
            split_nodes: ownership.split_count(),
            refreshes: self.refreshes,
            last_refresh_duration: self.last_refresh_duration,
            age: self.age(now),
        }
    }

    fn part(&self, backend: BackendId) -> Option<&BackendNodes> {
        self.per_backend.get(backend.0).and_then(Option::as_ref)
    }

    /// Reads each backend's part once its calls have results, and builds the new map once
    /// every call of the refresh has one.
    fn advance(&mut self, now: Instant, config: &Config) {
        match &mut self.refresh {
            Some(refresh) => {
                refresh.read_answered();
                if !refresh.calls.is_complete() {
                    return;
                }
            }
            None => return,
        }
        if let Some(refresh) = self.refresh.take() {
            self.complete(now, refresh, config);
        }
    }

    /// The new map from a finished refresh: each answered backend's part renewed, every other
    /// one kept (and counted as a failure); its waiters resumed.
    fn complete(&mut self, now: Instant, mut refresh: Refresh<P>, config: &Config) {
        // Backends that gave no answer in the whole timeout: a request that waited for this map
        // does not wait for them again (one timeout per request).
        let mut waited_out = refresh.calls.timed_out();
        waited_out.sort_unstable();
        waited_out.dedup();
        for index in 0..self.per_backend.len() {
            let backend = BackendId(index);
            let part = refresh
                .parts
                .iter()
                .position(|(read, _)| *read == backend)
                .map(|at| refresh.parts.swap_remove(at).1);
            match part {
                Some(Ok(nodes)) => {
                    self.per_backend[index] = Some(nodes);
                    self.renewed_at[index] = now;
                    continue;
                }
                Some(Err(failure)) => tracing::warn!(
                    backend = crate::status::backend_name(&config.backends, backend),
                    "membership refresh failed; keeping this backend's previous entries: {failure}"
                ),
                // Not asked: the prober keeps it out of service.
                None => {}
            }
            self.failures[index] += 1;
        }
        self.refreshes += 1;
        self.last_refresh_duration = Some(now.saturating_duration_since(refresh.started));
        let generation = self.generations.next();
        self.snapshot = Arc::new(Ownership::build(&self.per_backend, generation));
        self.corrections = Arc::new(Corrections::new(generation));
        self.refreshed_at = Some(now);
        self.outputs
            .extend(refresh.waiters.into_iter().map(|(waiter, planned)| {
                MembershipOutput::Resume {
                    waiter,
                    planned,
                    waited_out: Some(waited_out.clone()),
                }
            }));
    }
}

fn not_a_membership_answer() -> Failure {
    Unusable::Unparseable("not a membership answer".to_owned()).into()
}

#[cfg(test)]
#[allow(clippy::disallowed_methods)] // tests need one real instant to start from
mod tests {
    use super::*;
    use crate::membership::{Kind, Scope, MEMBERSHIP_QUERY, TIME_KEY};

    const A: BackendId = BackendId(0);
    const B: BackendId = BackendId(1);

    fn config() -> Config {
        Config::on_loopback(&[("a", 1), ("b", 2)])
    }

    /// A node row of the membership query: active, its latest report at `at`.
    fn node(certname: &str, at: &str) -> serde_json::Value {
        serde_json::json!({
            "certname": certname, TIME_KEY: at, "deactivated": null, "expired": null,
        })
    }

    fn produced(rows: &[(&str, &str)]) -> String {
        let rows: Vec<serde_json::Value> = rows
            .iter()
            .map(|(c, at)| serde_json::json!({"certname": c, TIME_KEY: at}))
            .collect();
        serde_json::Value::Array(rows).to_string()
    }

    struct Rig {
        map: MembershipMap<()>,
        ids: Counter,
        config: Config,
        now: Instant,
    }

    impl Rig {
        fn new() -> Rig {
            let now = Instant::now();
            Rig {
                map: MembershipMap::new(now, 2),
                ids: Counter::default(),
                config: config(),
                now,
            }
        }

        fn sends(&mut self) -> Vec<UpstreamRequest> {
            std::iter::from_fn(|| self.map.poll_output())
                .filter_map(|output| match output {
                    MembershipOutput::Send(request) => Some(request),
                    _ => None,
                })
                .collect()
        }

        /// Starts a refresh (the map is due) and returns what it sends.
        fn refresh(&mut self) -> Vec<UpstreamRequest> {
            self.now += self.config.freshness_ttl;
            let now = self.now;
            self.map
                .refresh_if_due(now, &[A, B], (&mut self.ids, &self.config));
            self.sends()
        }

        /// Answers each request with `answer(request)` (a 200 with that body) and returns what
        /// the map sends next.
        fn answer(
            &mut self,
            requests: &[UpstreamRequest],
            answer: impl Fn(&UpstreamRequest) -> String,
        ) -> Vec<UpstreamRequest> {
            for request in requests {
                let response = UpstreamResponse::full(
                    http::StatusCode::OK,
                    "application/json",
                    answer(request),
                );
                let now = self.now;
                assert!(self.map.handle_response(
                    now,
                    request.id,
                    &response,
                    (&mut self.ids, &self.config)
                ));
            }
            self.sends()
        }

        fn facts_owner(&self, certname: &str) -> Option<BackendId> {
            self.map
                .snapshot()
                .owners(certname, Scope::Any)
                .map(|owners| owners.under(crate::config::MergeStrategy::Freshness, Kind::Facts))
        }
    }

    fn is_nodes(request: &UpstreamRequest) -> bool {
        request.path_and_query == MEMBERSHIP_QUERY
    }

    #[test]
    fn a_backend_is_read_when_its_answers_are_in_and_its_bodies_let_go() {
        let mut rig = Rig::new();
        let requests = rig.refresh();
        let (of_a, of_b): (Vec<_>, Vec<_>) = requests.into_iter().partition(|r| r.backend == A);
        rig.answer(&of_a, |request| match is_nodes(request) {
            true => serde_json::json!([node("a1", T10)]).to_string(),
            false => produced(&[("a1", T10)]),
        });
        let refresh = rig.map.refresh.as_ref().expect("b has not answered");
        assert!(
            matches!(&refresh.parts[..], [(A, Ok(part))] if part.get("a1").is_some()),
            "a is read: {:?}",
            refresh.parts
        );
        for call in refresh.calls.0.iter().filter(|call| call.backend == A) {
            assert!(
                matches!(&call.result, Some(Ok(body)) if body.is_empty()),
                "a's bodies are let go, its calls still answered"
            );
        }
        rig.answer(&of_b, |request| match is_nodes(request) {
            true => serde_json::json!([node("b1", T10)]).to_string(),
            false => "[]".to_owned(),
        });
        assert!(rig.map.refresh.is_none());
        let snapshot = rig.map.snapshot();
        assert_eq!(snapshot.holders("a1", Scope::Any), [A]);
        assert_eq!(snapshot.holders("b1", Scope::Any), [B]);
    }

    const T10: &str = "2026-12-01T10:00:00.000Z";
    const T11: &str = "2026-12-01T11:00:00.000Z";
    const T12: &str = "2026-12-01T12:00:00.000Z";

    /// Answers a refresh's requests: both backends hold `shared` (with a report at T10), its
    /// facts and catalog produced at `a_at` in a and at T11 in b.
    fn answer_shared(rig: &mut Rig, requests: &[UpstreamRequest], a_at: &'static str) {
        let done = rig.answer(requests, |request| {
            match (request.backend, is_nodes(request)) {
                (_, true) => serde_json::json!([node("shared", T10)]).to_string(),
                (A, false) => produced(&[("shared", a_at)]),
                (_, false) => produced(&[("shared", T11)]),
            }
        });
        assert!(done.is_empty(), "one round: {done:?}");
    }

    #[test]
    fn every_refresh_asks_each_backend_its_nodes_and_producer_times_at_once() {
        let mut rig = Rig::new();
        for (round, a_at, owner) in [(1, T10, B), (2, T12, A)] {
            let requests = rig.refresh();
            let asked: Vec<(BackendId, &str)> = requests
                .iter()
                .map(|r| (r.backend, r.path_and_query.as_str()))
                .collect();
            let expected: Vec<(BackendId, &str)> = [A, B]
                .into_iter()
                .flat_map(|b| MEMBERSHIP_QUERIES.map(|q| (b, q)))
                .collect();
            assert_eq!(asked, expected, "refresh {round}");
            answer_shared(&mut rig, &requests, a_at);
            assert_eq!(rig.map.stats(rig.now).refreshes, round);
            assert_eq!(rig.facts_owner("shared"), Some(owner), "refresh {round}");
        }
    }

    /// History seed 19 over four backends: a backend stored a node's newer factset between two
    /// reads of one refresh, and a producer time carried from refresh to refresh (by its receive
    /// time) kept a deactivated node's older facts for good. Read anew each time, a stale read
    /// lasts one refresh.
    #[test]
    fn a_copy_read_before_it_was_replaced_is_read_right_by_the_next_refresh() {
        let mut rig = Rig::new();
        let first = rig.refresh();
        answer_shared(&mut rig, &first, T12);
        assert_eq!(rig.facts_owner("shared"), Some(A));
        // a's producer times were read just before a replacement that its `/nodes` shows.
        let second = rig.refresh();
        answer_shared(&mut rig, &second, T10);
        assert_eq!(rig.facts_owner("shared"), Some(B), "an older map's answer");
        let third = rig.refresh();
        answer_shared(&mut rig, &third, T12);
        assert_eq!(rig.facts_owner("shared"), Some(A));
    }

    #[test]
    fn a_failed_query_keeps_that_backends_previous_part() {
        let mut rig = Rig::new();
        let first = rig.refresh();
        answer_shared(&mut rig, &first, T12);
        assert_eq!(rig.facts_owner("shared"), Some(A));
        let second = rig.refresh();
        let now = rig.now;
        let (failed, answered): (Vec<_>, Vec<_>) = second
            .into_iter()
            .partition(|r| r.backend == B && !is_nodes(r));
        rig.map.handle_failure(
            now,
            failed[0].id,
            &UpstreamFailure::Timeout,
            (&mut rig.ids, &rig.config),
        );
        assert_eq!(rig.map.stats(rig.now).refreshes, 1, "not complete yet");
        let failed_rest: Vec<UpstreamRequest> = failed[1..].to_vec();
        let answered: Vec<UpstreamRequest> = answered.into_iter().chain(failed_rest).collect();
        // a's copy is now the older one; b answers T12 in the queries that did not fail.
        let done = rig.answer(&answered, |request| {
            match (request.backend, is_nodes(request)) {
                (_, true) => serde_json::json!([node("shared", T10)]).to_string(),
                (A, false) => produced(&[("shared", T10)]),
                (_, false) => produced(&[("shared", T12)]),
            }
        });
        assert!(done.is_empty(), "{done:?}");
        assert_eq!(rig.map.stats(rig.now).refreshes, 2);
        assert_eq!(rig.map.failures(B), 1);
        assert_eq!(rig.map.failures(A), 0);
        assert_eq!(rig.map.part_age(now, A), Duration::ZERO, "a renewed");
        assert_eq!(
            rig.facts_owner("shared"),
            Some(B),
            "b's previous part (T11), newer than a's renewed one (T10)"
        );
    }

    /// A backend whose refreshes fail keeps its last part (its age says how stale it is), but
    /// its owned count is not frozen: each refresh builds ownership again, so a node the others
    /// now hold newer leaves it.
    #[test]
    fn a_stale_backends_owned_count_follows_the_refreshes_of_the_others() {
        let mut rig = Rig::new();
        let first = rig.refresh();
        rig.answer(&first, |request| {
            match (request.backend, is_nodes(request)) {
                (A, true) => {
                    serde_json::json!([node("moved", T10), node("a-only", T10)]).to_string()
                }
                (_, true) => {
                    serde_json::json!([node("moved", T11), node("b-only", T10)]).to_string()
                }
                _ => "[]".to_owned(),
            }
        });
        let fresh = crate::config::MergeStrategy::Freshness;
        assert_eq!(rig.map.snapshot().owned_counts(fresh, 2), [1, 2]);
        let second = rig.refresh();
        let now = rig.now;
        let (of_b, of_a): (Vec<_>, Vec<_>) = second.into_iter().partition(|r| r.backend == B);
        for request in &of_b {
            let refused = UpstreamFailure::Connect {
                cause: crate::message::ConnectCause::Refused,
                detail: "connection refused".to_owned(),
            };
            rig.map
                .handle_failure(now, request.id, &refused, (&mut rig.ids, &rig.config));
        }
        rig.answer(&of_a, |request| match is_nodes(request) {
            true => serde_json::json!([node("moved", T12), node("a-only", T10)]).to_string(),
            false => "[]".to_owned(),
        });
        assert_eq!(rig.map.failures(B), 1);
        assert_eq!(
            rig.map.part_age(rig.now, B),
            rig.config.freshness_ttl,
            "b's part is the first refresh's"
        );
        assert_eq!(
            rig.map.snapshot().owned_counts(fresh, 2),
            [2, 1],
            "moved is newest in a now; b still owns the node only it holds"
        );
    }
}
