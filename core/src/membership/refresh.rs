//! The membership map as a machine of its own: each backend's last good part, the ownership
//! snapshot built from them, the corrections learned against that snapshot, and the refresh
//! under way. Its inputs are the estate's: a request that needs the map, upstream answers and
//! failures, time; its outputs, drained with [`MembershipMap::poll_output`], are requests to
//! send or cancel and waiters to resume.
//!
//! A refresh has up to two rounds (docs/merging.md, "Who owns a node"). The first asks every
//! backend in service for its nodes and, beside them, the producer times of the nodes it held
//! that another backend held too at the last refresh. The second asks, only where needed, the
//! producer times of the nodes shared now that the first did not ask about (a node that moved,
//! a backend's first refresh). Ownership weighs producer times only between holders, so a node
//! one backend holds alone never needs them; a shared node's are read anew at every refresh, so
//! a copy replaced between two reads of one refresh is right again at the next (no receive time
//! is needed to tell a changed copy). In a steady estate the second round is rarely sent.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{
    learn_produced, parse_nodes, produced_queries, BackendNodes, Ownership, MEMBERSHIP_QUERY,
};
use crate::broadcast::{Broadcast, EstateQuery};
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
    /// The first round: each backend's nodes (query 0) and the producer times of the nodes
    /// in `asked_first` (queries 1 factsets, 2 catalogs).
    nodes: Broadcast,
    /// The certnames (sorted) whose producer times the first round asked each backend: those
    /// it held that were shared at the last refresh.
    asked_first: BTreeMap<BackendId, Vec<String>>,
    /// The second round, once sent: producer times (query 0 factsets, 1 catalogs).
    produced: Option<Broadcast>,
    /// Each backend the first round asked: its new part as far as known, or why not.
    parts: BTreeMap<BackendId, Result<BackendNodes, Failure>>,
    /// The certnames (sorted) whose producer times the second round asks each backend.
    asking: BTreeMap<BackendId, Vec<String>>,
    waiters: Vec<(WaiterId, Box<P>)>,
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
        let shared = shared_certnames((0..self.per_backend.len()).map(|i| self.part(BackendId(i))));
        let mut asked_first = BTreeMap::new();
        let each: Vec<(BackendId, Vec<EstateQuery>)> = roster
            .iter()
            .map(|backend| {
                let mut queries = vec![EstateQuery::get(MEMBERSHIP_QUERY)];
                let was_shared: Vec<String> = self
                    .part(*backend)
                    .into_iter()
                    .flat_map(BTreeMap::keys)
                    .filter(|certname| shared.contains(certname.as_str()))
                    .cloned()
                    .collect();
                if !was_shared.is_empty() {
                    queries.extend(produced_queries(&was_shared));
                    asked_first.insert(*backend, was_shared);
                }
                (*backend, queries)
            })
            .collect();
        let (nodes, requests) =
            Broadcast::send_each(ids, Purpose::Membership, &each, now + config.timeout);
        self.outputs
            .extend(requests.into_iter().map(MembershipOutput::Send));
        self.refresh = Some(Refresh {
            started: now,
            nodes,
            asked_first,
            produced: None,
            parts: BTreeMap::new(),
            asking: BTreeMap::new(),
            waiters: Vec::new(),
        });
        // A roster of nobody completes at once.
        self.advance(now, (ids, config));
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
        let mine = refresh.nodes.record_response(id, response)
            || refresh
                .produced
                .as_mut()
                .is_some_and(|calls| calls.record_response(id, response));
        if mine {
            self.advance(now, sending);
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
        let mine = refresh.nodes.record_failure(id, failure)
            || refresh
                .produced
                .as_mut()
                .is_some_and(|calls| calls.record_failure(id, failure));
        if mine {
            self.advance(now, sending);
        }
        mine
    }

    /// Time passed: calls past their deadline time out (and are cancelled).
    pub(crate) fn handle_timeout(&mut self, now: Instant, sending: Sending<'_>) {
        let Some(refresh) = &mut self.refresh else {
            return;
        };
        let mut expired = refresh.nodes.expire(now);
        if let Some(calls) = &mut refresh.produced {
            expired.extend(calls.expire(now));
        }
        if !expired.is_empty() {
            self.outputs
                .extend(expired.into_iter().map(MembershipOutput::Cancel));
            self.advance(now, sending);
        }
    }

    /// The next instant [`MembershipMap::handle_timeout`] is due, if any.
    pub(crate) fn deadline(&self) -> Option<Instant> {
        let refresh = self.refresh.as_ref()?;
        match &refresh.produced {
            Some(calls) => calls.deadline(),
            None => refresh.nodes.deadline(),
        }
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
            Some(refresh) => {
                let mut pending = refresh.nodes.pending_ids();
                if let Some(calls) = &refresh.produced {
                    pending.extend(calls.pending_ids());
                }
                (pending, refresh.waiters)
            }
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

    /// Moves the refresh on once a round has every result: from the first round to the second
    /// (when some backend needs one), from the last round to the new map.
    fn advance(&mut self, now: Instant, (ids, config): Sending<'_>) {
        let Some(refresh) = &mut self.refresh else {
            return;
        };
        match &refresh.produced {
            None if refresh.nodes.is_complete() => {
                refresh.parts = first_round(&refresh.nodes, &refresh.asked_first);
                let mut each = Vec::new();
                for (backend, unknown) in second_round(&refresh.parts, &self.per_backend) {
                    each.push((backend, produced_queries(&unknown).to_vec()));
                    refresh.asking.insert(backend, unknown);
                }
                if !each.is_empty() {
                    let (calls, requests) =
                        Broadcast::send_each(ids, Purpose::Membership, &each, now + config.timeout);
                    self.outputs
                        .extend(requests.into_iter().map(MembershipOutput::Send));
                    refresh.produced = Some(calls);
                    return;
                }
            }
            Some(calls) if calls.is_complete() => {
                for (backend, asked) in &refresh.asking {
                    let learned = calls
                        .bodies_of(*backend)
                        .and_then(|bodies| match &bodies[..] {
                            [factsets, catalogs] => Ok((factsets.clone(), catalogs.clone())),
                            _ => Err(not_a_membership_answer()),
                        });
                    let Some(part) = refresh.parts.get_mut(backend) else {
                        continue;
                    };
                    let result = learned.and_then(|(factsets, catalogs)| {
                        let nodes = part.as_mut().map_err(|failure| failure.clone())?;
                        learn_produced(nodes, asked, (&factsets, &catalogs))
                            .ok_or_else(not_a_membership_answer)
                    });
                    if let Err(failure) = result {
                        *part = Err(failure);
                    }
                }
            }
            _ => return,
        }
        if let Some(refresh) = self.refresh.take() {
            self.complete(now, refresh, config);
        }
    }

    /// The new map from a finished refresh: each answered backend's part renewed, every other
    /// one kept (and counted as a failure); its waiters resumed.
    fn complete(&mut self, now: Instant, refresh: Refresh<P>, config: &Config) {
        // Backends that gave no answer in the whole timeout: a request that waited for this map
        // does not wait for them again (one timeout per request).
        let mut waited_out = refresh.nodes.timed_out();
        if let Some(calls) = &refresh.produced {
            waited_out.extend(calls.timed_out());
        }
        waited_out.sort_unstable();
        waited_out.dedup();
        let mut parts = refresh.parts;
        for index in 0..self.per_backend.len() {
            let backend = BackendId(index);
            match parts.remove(&backend) {
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

/// Each backend the first round asked: its nodes, with the producer times of those in
/// `asked_first` when it was asked about some.
fn first_round(
    calls: &Broadcast,
    asked_first: &BTreeMap<BackendId, Vec<String>>,
) -> BTreeMap<BackendId, Result<BackendNodes, Failure>> {
    let mut asked: Vec<BackendId> = calls.0.iter().map(|call| call.backend).collect();
    asked.dedup();
    asked
        .into_iter()
        .map(|backend| {
            let part = calls.bodies_of(backend).and_then(|bodies| {
                let mut nodes = parse_nodes(&bodies[0]).ok_or_else(not_a_membership_answer)?;
                if let ([factsets, catalogs], Some(named)) =
                    (&bodies[1..], asked_first.get(&backend))
                {
                    learn_produced(&mut nodes, named, (factsets, catalogs))
                        .ok_or_else(not_a_membership_answer)?;
                }
                Ok(nodes)
            });
            (backend, part)
        })
        .collect()
}

/// The certnames more than one of these parts holds (in any node state).
fn shared_certnames<'a>(
    parts: impl Iterator<Item = Option<&'a BackendNodes>>,
) -> BTreeSet<&'a str> {
    let mut seen = BTreeSet::new();
    let mut shared = BTreeSet::new();
    for certname in parts.flatten().flat_map(BTreeMap::keys) {
        if !seen.insert(certname.as_str()) {
            shared.insert(certname.as_str());
        }
    }
    shared
}

/// What the second round must ask each backend: the certnames it holds that another backend
/// holds too (in the new parts, or the parts kept for backends not renewed) whose producer
/// times are not known. A backend that needs nothing is left out.
fn second_round(
    parts: &BTreeMap<BackendId, Result<BackendNodes, Failure>>,
    per_backend: &[Option<BackendNodes>],
) -> BTreeMap<BackendId, Vec<String>> {
    let part = |index: usize| -> Option<&BackendNodes> {
        match parts.get(&BackendId(index)) {
            Some(Ok(nodes)) => Some(nodes),
            _ => per_backend.get(index).and_then(Option::as_ref),
        }
    };
    let shared = shared_certnames((0..per_backend.len()).map(part));
    parts
        .iter()
        .filter_map(|(backend, part)| {
            let nodes = part.as_ref().ok()?;
            let unknown: Vec<String> = nodes
                .iter()
                .filter(|(certname, member)| {
                    !member.produced_known() && shared.contains(certname.as_str())
                })
                .map(|(certname, _)| certname.clone())
                .collect();
            (!unknown.is_empty()).then_some((*backend, unknown))
        })
        .collect()
}

#[cfg(test)]
#[allow(clippy::disallowed_methods)] // tests need one real instant to start from
mod tests {
    use super::*;
    use crate::config::{BackendConfig, BackendUrl, TlsFiles};
    use crate::membership::{Kind, Scope};

    const A: BackendId = BackendId(0);
    const B: BackendId = BackendId(1);

    fn config() -> Config {
        let backend = |name: &str, port: u16| BackendConfig {
            name: name.into(),
            url: BackendUrl {
                scheme: "http".into(),
                host: "127.0.0.1".into(),
                port: Some(port),
            },
            tls: TlsFiles::default(),
        };
        Config::with_backends(vec![backend("a", 1), backend("b", 2)])
    }

    /// A node row of the membership query: active, its latest report at `at`.
    fn node(certname: &str, at: &str) -> serde_json::Value {
        serde_json::json!({
            "certname": certname, "report_timestamp": at, "deactivated": null, "expired": null,
        })
    }

    fn produced(rows: &[(&str, &str)]) -> String {
        let rows: Vec<serde_json::Value> = rows
            .iter()
            .map(|(c, at)| serde_json::json!({"certname": c, "producer_timestamp": at}))
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

    fn decoded(request: &UpstreamRequest) -> String {
        percent_encoding::percent_decode_str(&request.path_and_query)
            .decode_utf8_lossy()
            .into_owned()
    }

    const T10: &str = "2026-12-01T10:00:00.000Z";
    const T11: &str = "2026-12-01T11:00:00.000Z";
    const T12: &str = "2026-12-01T12:00:00.000Z";

    /// The certnames a producer-time request names, as the JSON list's inside.
    fn named(request: &UpstreamRequest) -> String {
        const ARRAY: &str = r#"["array",["#;
        let asked = decoded(request);
        let at = asked.find(ARRAY).map_or(asked.len(), |at| at + ARRAY.len());
        asked[at..].chars().take_while(|c| *c != ']').collect()
    }

    #[test]
    fn a_refresh_asks_the_producer_times_of_shared_nodes_beside_their_nodes() {
        let mut rig = Rig::new();
        let first = rig.refresh();
        assert!(first.iter().all(is_nodes) && first.len() == 2, "{first:?}");
        let nodes_of = |backend: BackendId| -> String {
            let alone = if backend == A { "only-a" } else { "only-b" };
            serde_json::json!([node("shared", T10), node(alone, T10)]).to_string()
        };
        // A first refresh learns which nodes are shared, then asks their producer times.
        let round_two = rig.answer(&first, |request| nodes_of(request.backend));
        assert_eq!(round_two.len(), 4, "{round_two:?}");
        assert!(round_two.iter().all(|r| named(r) == r#""shared""#));
        assert_eq!(rig.map.stats(rig.now).refreshes, 0, "not before round two");
        let done = rig.answer(&round_two, |request| match request.backend {
            A => produced(&[("shared", T10)]),
            _ => produced(&[("shared", T11)]),
        });
        assert!(done.is_empty(), "{done:?}");
        assert_eq!(rig.map.stats(rig.now).refreshes, 1);
        assert_eq!(rig.facts_owner("shared"), Some(B));

        // Later refreshes ask them beside the nodes, in one round: a's copy was replaced.
        let second = rig.refresh();
        assert_eq!(second.len(), 6, "{second:?}");
        assert!(second
            .iter()
            .filter(|r| !is_nodes(r))
            .all(|r| named(r) == r#""shared""#));
        let answer = |at_a: &'static str| {
            move |request: &UpstreamRequest| match (request.backend, is_nodes(request)) {
                (backend, true) => nodes_of(backend),
                (A, false) => produced(&[("shared", at_a)]),
                (_, false) => produced(&[("shared", T11)]),
            }
        };
        let done = rig.answer(&second, answer(T12));
        assert!(done.is_empty(), "one round: {done:?}");
        assert_eq!(rig.map.stats(rig.now).refreshes, 2);
        assert_eq!(
            rig.facts_owner("shared"),
            Some(A),
            "a's facts are newer now"
        );

        // A read of a's producer times from before a replacement that `/nodes` saw is no
        // worse than an older map: the next refresh reads them anew.
        let third = rig.refresh();
        rig.answer(&third, answer(T10));
        assert_eq!(rig.facts_owner("shared"), Some(B));
        let fourth = rig.refresh();
        rig.answer(&fourth, answer(T12));
        assert_eq!(rig.facts_owner("shared"), Some(A));
    }

    #[test]
    fn a_node_that_becomes_shared_is_asked_of_every_holder_in_a_second_round() {
        let mut rig = Rig::new();
        let first = rig.refresh();
        let round_two = rig.answer(&first, |_| {
            serde_json::json!([node("base", T10)]).to_string()
        });
        rig.answer(&round_two, |_| produced(&[("base", T10)]));
        // x appears in a alone: held once, nobody asks when it was produced.
        let second = rig.refresh();
        let done = rig.answer(&second, |request| {
            match (request.backend, is_nodes(request)) {
                (A, true) => serde_json::json!([node("base", T10), node("x", T11)]).to_string(),
                (_, true) => serde_json::json!([node("base", T10)]).to_string(),
                (_, false) => produced(&[("base", T10)]),
            }
        });
        assert!(done.is_empty(), "{done:?}");
        // x reaches b too: both copies are asked about, x only, once `/nodes` answered.
        let third = rig.refresh();
        assert!(third
            .iter()
            .filter(|r| !is_nodes(r))
            .all(|r| named(r) == r#""base""#));
        let round_two = rig.answer(&third, |request| match is_nodes(request) {
            true => serde_json::json!([node("base", T10), node("x", T11)]).to_string(),
            false => produced(&[("base", T10)]),
        });
        let mut asked: Vec<BackendId> = round_two.iter().map(|r| r.backend).collect();
        asked.dedup();
        assert_eq!(asked, [A, B]);
        assert!(round_two.iter().all(|r| named(r) == r#""x""#));
        rig.answer(&round_two, |request| match request.backend {
            A => produced(&[("x", T11)]),
            _ => produced(&[("x", T12)]),
        });
        assert_eq!(rig.facts_owner("x"), Some(B));
    }

    #[test]
    fn a_failed_second_round_keeps_that_backends_previous_part() {
        let mut rig = Rig::new();
        let first = rig.refresh();
        let round_two = rig.answer(&first, |_| {
            serde_json::json!([node("shared", T10)]).to_string()
        });
        rig.answer(&round_two, |request| match request.backend {
            A => produced(&[("shared", T11)]),
            _ => produced(&[("shared", T10)]),
        });
        assert_eq!(rig.facts_owner("shared"), Some(A));
        // y reaches both: the second round asks each about it; b's fails.
        let second = rig.refresh();
        let round_two = rig.answer(&second, |request| match is_nodes(request) {
            true => serde_json::json!([node("shared", T10), node("y", T10)]).to_string(),
            false if request.backend == A => produced(&[("shared", T11)]),
            false => produced(&[("shared", T12)]),
        });
        assert_eq!(round_two.len(), 4, "{round_two:?}");
        let now = rig.now;
        for request in &round_two {
            if request.backend == B {
                rig.map.handle_failure(
                    now,
                    request.id,
                    &UpstreamFailure::Timeout,
                    (&mut rig.ids, &rig.config),
                );
            }
        }
        let done = rig.answer(
            &round_two
                .into_iter()
                .filter(|r| r.backend == A)
                .collect::<Vec<_>>(),
            |_| produced(&[("y", T10)]),
        );
        assert!(done.is_empty(), "{done:?}");
        assert_eq!(rig.map.stats(rig.now).refreshes, 2);
        assert_eq!(rig.map.failures(B), 1);
        assert_eq!(rig.map.failures(A), 0);
        assert_eq!(rig.map.part_age(now, A), Duration::ZERO, "a renewed");
        assert_eq!(
            rig.facts_owner("shared"),
            Some(A),
            "b's previous part, with what it learned then (not the T12 of its failed refresh)"
        );
        assert_eq!(
            rig.map.snapshot().holders("y", Scope::Any),
            [A],
            "b's previous part has no y"
        );
    }
}
