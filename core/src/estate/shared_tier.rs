//! The estate's side of the shared cache tier (docs/caching.md): for a flight whose key the
//! memory layer could not answer, look in the shared store first; on a miss take the key's lock
//! and fan out, or wait (polling) for the replica that holds it; store the answer for every
//! replica. The store failing is never an outage: every failure ends in this replica fanning out
//! itself, as with the memory cache alone.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::answers::{Answers, Flight, Participant, Stage};
use super::EstateOutput;
use crate::cache::shared::{
    decode, encode, EntryRefusal, SharedSettings, StoreAnswer, StoreId, StoreOp, StoreRequest,
    CLOCK_SKEW, ENVELOPE_BYTES, POLL_INTERVAL,
};
use crate::cache::{CacheStatus, CachedResponse};
use crate::config::{CacheBackend, Config, Secret};
use crate::ids::Counter;
use crate::ids::FlightId;
use crate::message::{Response, ResponseBody};

/// How long one store request may take before it counts as the store failing.
const STORE_TIMEOUT: Duration = Duration::from_millis(500);
/// After the store failed, how long this replica answers without it before trying it again.
const RETRY_AFTER: Duration = Duration::from_secs(1);
/// How many keys a refused entry is logged for before the list starts again: each key's refusal
/// is logged once, without a forger being able to grow the list without bound.
const REFUSALS_REMEMBERED: usize = 1024;

/// The shared tier's state: the requests out, and whether the store is answering.
#[derive(Debug)]
pub(super) struct SharedTier {
    settings: SharedSettings,
    ids: Counter,
    asked: BTreeMap<StoreId, StoreCall>,
    reachable: bool,
    /// While the store is failing: when to try it again.
    retry_at: Option<Instant>,
    /// Makes lock tokens unique to this process.
    token_base: String,
    /// Signs what this replica stores and authenticates what it reads.
    secret: Secret,
    /// Entries refused since start, by [`EntryRefusal::index`].
    refused: [u64; EntryRefusal::ALL.len()],
    /// Keys whose refusal was logged (each once, until [`REFUSALS_REMEMBERED`]).
    refusals_logged: std::collections::BTreeSet<String>,
}

/// A store request out: for which flight, until when, and the lock it would take.
#[derive(Debug)]
struct StoreCall {
    flight: Option<FlightId>,
    deadline: Instant,
    lock: Option<(String, String)>,
}

impl SharedTier {
    /// The tier `config` asks for, if any; `token_base` is unique to this process (its start).
    pub(super) fn of(config: &Config, token_base: String) -> Option<SharedTier> {
        let CacheBackend::Redis { secret, .. } = &config.cache_backend else {
            return None;
        };
        if !config.caches_anything() {
            return None;
        }
        Some(SharedTier {
            settings: SharedSettings {
                prefix: config.cache_key_prefix.clone(),
                stale_keep: config.cache_stale_ttl,
                max_entry_bytes: config.cache_max_entry_bytes,
                timeout: STORE_TIMEOUT,
                lease: config.timeout + Duration::from_secs(2),
                wait: config.timeout,
            },
            ids: Counter::default(),
            asked: BTreeMap::new(),
            reachable: true,
            retry_at: None,
            token_base,
            secret: secret.clone(),
            refused: [0; EntryRefusal::ALL.len()],
            refusals_logged: std::collections::BTreeSet::new(),
        })
    }

    /// Entries refused since start, by [`EntryRefusal::index`].
    pub(super) fn refused(&self) -> [u64; EntryRefusal::ALL.len()] {
        self.refused
    }

    /// Carries the refusal counts of the tier a reload replaced, so the counters only grow.
    pub(super) fn keep_counts(&mut self, refused: [u64; EntryRefusal::ALL.len()]) {
        self.refused = refused;
    }

    /// The `GET` of the entry for cache key `key`, read no further than the largest entry.
    fn get(&self, key: &str) -> StoreOp {
        StoreOp::Get {
            key: self.settings.entry_key(key),
            limit: self.settings.max_entry_bytes.saturating_add(ENVELOPE_BYTES),
        }
    }

    /// Counts a refused entry and logs it, once per key.
    fn refuse(&mut self, key: &str, refusal: EntryRefusal) {
        self.refused[refusal.index()] += 1;
        if self.refusals_logged.len() >= REFUSALS_REMEMBERED {
            self.refusals_logged.clear();
        }
        if self.refusals_logged.insert(key.to_owned()) {
            tracing::warn!(
                key,
                reason = refusal.as_str(),
                "shared cache store entry refused and treated as a miss (docs/reliability.md, \
                 \"The shared store is untrusted\"); later refusals of this key are only counted"
            );
        }
    }

    /// Whether the store answers (as far as this replica knows).
    pub(super) fn reachable(&self) -> bool {
        self.reachable
    }

    /// Whether a new flight should ask the store: it answers, or it is time to try it again.
    fn usable(&self, now: Instant) -> bool {
        self.reachable || self.retry_at.is_none_or(|at| now >= at)
    }

    fn ask(
        &mut self,
        now: Instant,
        op: StoreOp,
        flight: Option<FlightId>,
        lock: Option<(String, String)>,
    ) -> StoreRequest {
        let id = StoreId(self.ids.next());
        let deadline = now + self.settings.timeout;
        self.asked.insert(
            id,
            StoreCall {
                flight,
                deadline,
                lock,
            },
        );
        StoreRequest { id, op, deadline }
    }

    /// Logs the store's state changing, once per change.
    fn observe(&mut self, now: Instant, answer: &StoreAnswer) {
        match answer {
            StoreAnswer::Failed(error) => {
                if self.reachable {
                    tracing::warn!(
                        "shared cache store failing; answering without it until it is back: {error}"
                    );
                }
                self.reachable = false;
                self.retry_at = Some(now + RETRY_AFTER);
            }
            _ => {
                if !self.reachable {
                    tracing::info!("shared cache store answering again; sharing resumes");
                }
                self.reachable = true;
                self.retry_at = None;
            }
        }
    }

    /// The earliest deadline of a request out.
    pub(super) fn next_deadline(&self) -> Option<Instant> {
        self.asked.values().map(|asked| asked.deadline).min()
    }
}

impl Answers {
    /// For a new flight on `key`: the request asking the shared store for its entry, when the
    /// tier is on and usable (the flight then waits in [`Stage::Looking`]).
    pub(super) fn shared_lookup(
        &mut self,
        now: Instant,
        key: &str,
        flight: FlightId,
    ) -> Option<StoreId> {
        let tier = self.shared.as_mut().filter(|tier| tier.usable(now))?;
        let op = tier.get(key);
        let request = tier.ask(now, op, Some(flight), None);
        let id = request.id;
        self.outputs.push_back(EstateOutput::Store(request));
        Some(id)
    }

    /// The shared store answered (or, from [`Estate::handle_timeout`], did not in time). A late
    /// or unknown answer is ignored; a lock taken for a flight nobody waits on any more is
    /// released.
    pub(super) fn handle_store_answer(&mut self, now: Instant, id: StoreId, answer: StoreAnswer) {
        let Some(tier) = self.shared.as_mut() else {
            return;
        };
        let Some(asked) = tier.asked.remove(&id) else {
            return;
        };
        tier.observe(now, &answer);
        let Some(flight_id) = asked.flight else {
            return;
        };
        if !self.flights.contains_key(&flight_id) {
            if let (StoreAnswer::Locked(true), Some((key, token))) = (&answer, asked.lock) {
                self.shared_unlock(now, key, token);
            }
            return;
        }
        let stage = self.flights.get(&flight_id).map(|f| f.stage);
        match (stage, answer) {
            (Some(Stage::Looking(expected)), StoreAnswer::Value(value)) if expected == id => {
                let served = self.take_shared_entry(now, flight_id, (value, false));
                if !served {
                    self.shared_lock(now, flight_id);
                }
            }
            (
                Some(Stage::Polling {
                    id: expected,
                    until,
                }),
                StoreAnswer::Value(value),
            ) if expected == id => {
                let served = self.take_shared_entry(now, flight_id, (value, false));
                if !served {
                    if now >= until {
                        self.start_fetch(now, flight_id);
                    } else if let Some(flight) = self.flights.get_mut(&flight_id) {
                        flight.stage = Stage::Waiting {
                            poll_at: now + POLL_INTERVAL,
                            until,
                        };
                    }
                }
            }
            (Some(Stage::Locking(expected)), StoreAnswer::Locked(held)) if expected == id => {
                let wait = self
                    .shared
                    .as_ref()
                    .map_or(Duration::ZERO, |t| t.settings.wait);
                match (held, self.flights.get_mut(&flight_id)) {
                    (true, Some(flight)) => {
                        flight.lock = asked.lock;
                        self.shared_confirm(now, flight_id);
                    }
                    (false, Some(flight)) => {
                        flight.stage = Stage::Waiting {
                            poll_at: now + POLL_INTERVAL,
                            until: now + wait,
                        };
                    }
                    (_, None) => {}
                }
            }
            (Some(Stage::Confirming(expected)), StoreAnswer::Value(value)) if expected == id => {
                // Stored by another replica meanwhile: served from it, and the lock let go.
                let lock = self.flights.get_mut(&flight_id).and_then(|f| f.lock.take());
                if self.take_shared_entry(now, flight_id, (value, true)) {
                    if let Some((key, token)) = lock {
                        self.shared_unlock(now, key, token);
                    }
                } else {
                    if let Some(flight) = self.flights.get_mut(&flight_id) {
                        flight.lock = lock;
                    }
                    self.start_fetch(now, flight_id);
                }
            }
            // The store failed: fan out as without it.
            (Some(_), StoreAnswer::Failed(_)) => self.start_fetch(now, flight_id),
            _ => {}
        }
    }

    /// A fresh entry answers the flight (`true`); an expired one within the stale window is
    /// kept for the stale fallback and `false` is returned, as for none or a value refused
    /// (counted and logged by [`SharedTier::refuse`], unless `looked_again`: the second look of
    /// one miss, [`Stage::Confirming`], counts no refusal the first already counted).
    fn take_shared_entry(
        &mut self,
        now: Instant,
        flight_id: FlightId,
        (value, looked_again): (Option<bytes::Bytes>, bool),
    ) -> bool {
        // A `GETRANGE` of a key that holds nothing answers an empty value.
        let Some(value) = value.filter(|value| !value.is_empty()) else {
            return false;
        };
        let (Some(tier), Some((key, ttl, refreshing))) = (
            self.shared.as_mut(),
            self.flights
                .get(&flight_id)
                .map(|f| (f.key.clone(), f.ttl, f.refresh.is_some())),
        ) else {
            return false;
        };
        let config = Arc::clone(&self.config);
        let now_ms = self.clock.unix_millis(now);
        let kept = ttl + tier.settings.stale_keep;
        let entry = decode(
            &tier.secret,
            &tier.settings.entry_key(&key),
            &value,
            tier.settings.max_entry_bytes,
        )
        .and_then(|entry| {
            let age_ms = now_ms.saturating_sub(entry.stored_at_ms);
            if u128::from(entry.stored_at_ms) > u128::from(now_ms) + CLOCK_SKEW.as_millis() {
                Err(EntryRefusal::FromTheFuture)
            } else if u128::from(age_ms) >= kept.as_millis() {
                Err(EntryRefusal::Expired)
            } else {
                let age = Duration::from_millis(age_ms);
                // A refresh wants an entry newer than the one it renews: another replica's
                // refresh; one as old as its own would start the same refresh again.
                let fresh = age < ttl && !(refreshing && config.refreshes_ahead(age, ttl));
                Ok((entry, fresh))
            }
        });
        let (entry, fresh) = match entry {
            Ok(found) => found,
            Err(refusal) => {
                if !looked_again {
                    tier.refuse(&key, refusal);
                }
                return false;
            }
        };
        // Dated up to the allowed skew ahead: its age counts from now.
        let stored_at = self
            .clock
            .instant_at_unix_millis(entry.stored_at_ms.min(now_ms));
        let status = entry.status;
        let cached = CachedResponse {
            body: entry.body,
            headers: entry.headers,
            stored_at,
            ttl,
        };
        if !fresh {
            if let Some(flight) = self.flights.get_mut(&flight_id) {
                flight.stale = Some(cached);
            }
            return false;
        }
        let Some(flight) = self.flights.remove(&flight_id) else {
            return true;
        };
        self.forget_flight_key(&flight.key, flight_id);
        let response = Response {
            status,
            headers: cached.headers.clone(),
            body: ResponseBody::Full(cached.body.clone()),
        };
        let mut answers: BTreeMap<String, Response> = BTreeMap::new();
        let mut answer_for = |estate: &mut Answers, participant: &Participant| {
            answers
                .entry(participant.key.clone())
                .or_insert_with(|| {
                    let answer = match &participant.filter {
                        Some(value) => super::answers::filtered_by_source(response.clone(), value),
                        None => response.clone(),
                    };
                    if let (Some(cache), ResponseBody::Full(body)) =
                        (estate.cache.as_mut(), &answer.body)
                    {
                        cache.store(
                            (stored_at, ttl),
                            &participant.key,
                            body.clone(),
                            answer.headers.clone(),
                        );
                    }
                    answer
                })
                .clone()
        };
        for (waiter, participant) in &flight.participants {
            let answer = answer_for(self, participant);
            let age = now.saturating_duration_since(stored_at);
            let response = super::answers::finish_cached(answer, CacheStatus::Hit, age);
            self.outputs.push_back(EstateOutput::Respond {
                waiter: *waiter,
                response,
            });
        }
        // A refresh renews its entry from another replica's newer one.
        if let Some(refresh) = &flight.refresh {
            answer_for(self, refresh);
        }
        true
    }

    /// Asks for the flight's lock.
    fn shared_lock(&mut self, now: Instant, flight_id: FlightId) {
        let Some(key) = self.flights.get(&flight_id).map(|f| f.key.clone()) else {
            return;
        };
        let Some(tier) = self.shared.as_mut() else {
            return self.start_fetch(now, flight_id);
        };
        let lock_key = tier.settings.lock_key(&key);
        let token = format!("{}-{}", tier.token_base, flight_id.0);
        let op = StoreOp::Lock {
            key: lock_key.clone(),
            token: token.clone(),
            lease: tier.settings.lease,
        };
        let request = tier.ask(now, op, Some(flight_id), Some((lock_key, token)));
        if let Some(flight) = self.flights.get_mut(&flight_id) {
            flight.stage = Stage::Locking(request.id);
        }
        self.outputs.push_back(EstateOutput::Store(request));
    }

    /// With the flight's lock taken, asks the store for its entry once more
    /// ([`Stage::Confirming`]).
    fn shared_confirm(&mut self, now: Instant, flight_id: FlightId) {
        let Some(key) = self.flights.get(&flight_id).map(|f| f.key.clone()) else {
            return;
        };
        let Some(tier) = self.shared.as_mut() else {
            return self.start_fetch(now, flight_id);
        };
        let op = tier.get(&key);
        let request = tier.ask(now, op, Some(flight_id), None);
        if let Some(flight) = self.flights.get_mut(&flight_id) {
            flight.stage = Stage::Confirming(request.id);
        }
        self.outputs.push_back(EstateOutput::Store(request));
    }

    /// Releases a lock this replica holds.
    pub(super) fn shared_unlock(&mut self, now: Instant, key: String, token: String) {
        if let Some(tier) = self.shared.as_mut() {
            let request = tier.ask(now, StoreOp::Unlock { key, token }, None, None);
            self.outputs.push_back(EstateOutput::Store(request));
        }
    }

    /// Starts the flight's fan-out: the runtime spawns it like an admitted flight.
    pub(super) fn start_fetch(&mut self, now: Instant, flight_id: FlightId) {
        let Some(flight) = self.flights.get_mut(&flight_id) else {
            return;
        };
        let Some(fetch) = flight.fetch.take() else {
            return;
        };
        flight.stage = Stage::Fetching;
        self.outputs.push_back(EstateOutput::StartFlight {
            flight: flight_id,
            exchange: fetch.start(now),
        });
    }

    /// A flight's fan-out answered: its answer goes to the shared store for every replica (when
    /// it is a success small enough), and the lock it held is released.
    pub(super) fn shared_flight_done(
        &mut self,
        now: Instant,
        flight: &Flight,
        response: &Response,
    ) {
        let Some(tier) = self.shared.as_mut() else {
            return;
        };
        // Nothing is stored in a store known to be failing (until it is tried again).
        let current = flight.cache_generation == self.cache_generation && tier.usable(now);
        if let (true, true, ResponseBody::Full(body)) =
            (current, crate::cache::is_storable(response), &response.body)
        {
            let key = tier.settings.entry_key(&flight.key);
            let stored_at_ms = self.clock.unix_millis(now);
            let value = (body.len() as u64 <= tier.settings.max_entry_bytes)
                .then(|| {
                    let status = response.status;
                    encode(
                        &tier.secret,
                        &key,
                        stored_at_ms,
                        status,
                        &response.headers,
                        body,
                    )
                })
                .flatten();
            if let Some(value) = value {
                let op = StoreOp::Put {
                    key,
                    value,
                    keep: flight.ttl + tier.settings.stale_keep,
                };
                let request = tier.ask(now, op, None, None);
                self.outputs.push_back(EstateOutput::Store(request));
            }
        }
        if let Some((key, token)) = flight.lock.clone() {
            self.shared_unlock(now, key, token);
        }
    }

    /// Time passed: store requests past their deadline fail (the store is slow), and waiting
    /// flights look again or, past their wait, fan out themselves.
    pub(super) fn shared_timeouts(&mut self, now: Instant) {
        let Some(tier) = self.shared.as_ref() else {
            return;
        };
        let expired: Vec<StoreId> = tier
            .asked
            .iter()
            .filter(|(_, asked)| asked.deadline <= now)
            .map(|(id, _)| *id)
            .collect();
        for id in expired {
            let answer = StoreAnswer::Failed("no answer in time".to_owned());
            self.handle_store_answer(now, id, answer);
        }
        let due: Vec<(FlightId, Instant)> = self
            .flights
            .iter()
            .filter_map(|(id, flight)| match flight.stage {
                Stage::Waiting { poll_at, until } if poll_at <= now => Some((*id, until)),
                _ => None,
            })
            .collect();
        for (flight_id, until) in due {
            if now >= until {
                self.start_fetch(now, flight_id);
                continue;
            }
            let Some(key) = self.flights.get(&flight_id).map(|f| f.key.clone()) else {
                continue;
            };
            let Some(tier) = self.shared.as_mut() else {
                continue;
            };
            let op = tier.get(&key);
            let request = tier.ask(now, op, Some(flight_id), None);
            if let Some(flight) = self.flights.get_mut(&flight_id) {
                flight.stage = Stage::Polling {
                    id: request.id,
                    until,
                };
            }
            self.outputs.push_back(EstateOutput::Store(request));
        }
    }

    /// The next instant the shared tier needs [`Estate::handle_timeout`] at.
    pub(super) fn shared_deadline(&self) -> Option<Instant> {
        let tier = self.shared.as_ref()?;
        let polls = self
            .flights
            .values()
            .filter_map(|flight| match flight.stage {
                Stage::Waiting { poll_at, .. } => Some(poll_at),
                _ => None,
            });
        polls.chain(tier.next_deadline()).min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::TlsFiles;
    use crate::estate::answers::tests::{answered, answers, asked, drained, TARGET};
    use crate::estate::Admission;
    use crate::ids::WaiterId;
    use bytes::Bytes;

    fn secret() -> Secret {
        Secret::new(b"0123456789abcdef0123456789abcdef".to_vec())
    }

    /// Answers whose flights ask a shared store signing with [`secret`].
    fn shared() -> (Answers, Instant) {
        answers(|config| {
            config.cache_backend = CacheBackend::Redis {
                url: "redis://127.0.0.1:6379/0".into(),
                tls: TlsFiles::default(),
                secret: secret(),
                password: None,
            };
        })
    }

    /// The store requests among `outputs`.
    fn store_requests(outputs: &[EstateOutput]) -> Vec<&StoreRequest> {
        outputs
            .iter()
            .filter_map(|output| match output {
                EstateOutput::Store(request) => Some(request),
                _ => None,
            })
            .collect()
    }

    /// The one store request `outputs` hold.
    fn one_store_request(outputs: &[EstateOutput]) -> (StoreId, StoreOp) {
        match store_requests(outputs).as_slice() {
            [request] => (request.id, request.op.clone()),
            other => panic!("one store request: {other:?} in {outputs:?}"),
        }
    }

    /// A miss's flight, which asks the store first: its waiter and the `GET`.
    fn flight(answers: &mut Answers, now: Instant) -> (WaiterId, StoreId, StoreOp) {
        let (cacheable, fetch) = asked(answers, TARGET);
        let Admission::Wait(waiter) = answers.fly(now, &cacheable, fetch, &mut Counter::default())
        else {
            panic!("with a shared store the fan-out waits for its answer");
        };
        let (id, op) = one_store_request(&drained(answers));
        (waiter, id, op)
    }

    /// The envelope another replica would have stored for `TARGET` at `stored_at_ms`.
    fn entry(answers: &Answers, stored_at_ms: u64, body: &str, signed_by: &Secret) -> Bytes {
        let tier = answers.shared.as_ref().expect("a shared tier");
        let mut headers = http::HeaderMap::new();
        headers.insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static(crate::message::JSON_CONTENT_TYPE),
        );
        let key = tier.settings.entry_key(TARGET);
        let body = Bytes::from(body.to_owned());
        encode(
            signed_by,
            &key,
            stored_at_ms,
            http::StatusCode::OK,
            &headers,
            &body,
        )
        .expect("an envelope")
    }

    #[test]
    fn a_miss_looks_locks_looks_again_fans_out_then_puts_and_unlocks() {
        let (mut answers, now) = shared();
        let (waiter, get, op) = flight(&mut answers, now);
        assert!(
            matches!(&op, StoreOp::Get { key, .. } if key.ends_with(&format!("entry:{TARGET}")))
        );
        answers.handle_store_answer(now, get, StoreAnswer::Value(None));
        let (lock, op) = one_store_request(&drained(&mut answers));
        assert!(matches!(op, StoreOp::Lock { .. }), "{op:?}");
        answers.handle_store_answer(now, lock, StoreAnswer::Locked(true));
        let (confirm, op) = one_store_request(&drained(&mut answers));
        assert!(matches!(op, StoreOp::Get { .. }), "looks once more: {op:?}");
        answers.handle_store_answer(now, confirm, StoreAnswer::Value(Some(Bytes::new())));
        let started = match drained(&mut answers).as_slice() {
            [EstateOutput::StartFlight { flight: id, .. }] => *id,
            other => panic!("fans out itself: {other:?}"),
        };
        answers.handle_flight_done(now, started, Response::json(http::StatusCode::OK, "[1]"));
        let outputs = drained(&mut answers);
        let ops: Vec<&StoreOp> = store_requests(&outputs).iter().map(|r| &r.op).collect();
        assert!(
            matches!(ops.as_slice(), [StoreOp::Put { keep, .. }, StoreOp::Unlock { .. }]
                if *keep == answers.config.facts_ttl + answers.config.cache_stale_ttl),
            "{ops:?}"
        );
        assert_eq!(answered(&outputs), [(waiter, "[1]".into(), "miss".into())]);
    }

    #[test]
    fn an_entry_another_replica_stored_answers_with_no_fan_out_and_is_kept_in_memory() {
        let (mut answers, now) = shared();
        let (waiter, get, _) = flight(&mut answers, now);
        let stored_at = answers.clock.unix_millis(now) - 2_000;
        let value = entry(&answers, stored_at, r#"["shared"]"#, &secret());
        answers.handle_store_answer(now, get, StoreAnswer::Value(Some(value)));
        let outputs = drained(&mut answers);
        assert_eq!(
            answered(&outputs),
            [(waiter, r#"["shared"]"#.into(), "hit".into())]
        );
        assert!(store_requests(&outputs).is_empty(), "no lock, no put");
        let planned =
            crate::policy::plan(&crate::message::ClientRequest::get(TARGET), &answers.config);
        let hit = answers.lookup(now, &planned).expect("kept in memory");
        assert_eq!(hit.response.headers[http::header::AGE], "2");
    }

    #[test]
    fn an_entry_this_deployment_did_not_sign_is_refused_counted_and_treated_as_a_miss() {
        let (mut answers, now) = shared();
        let (_, get, _) = flight(&mut answers, now);
        let forged = entry(
            &answers,
            answers.clock.unix_millis(now),
            r#"["forged"]"#,
            &Secret::new(b"another deployment's secret key!".to_vec()),
        );
        answers.handle_store_answer(now, get, StoreAnswer::Value(Some(forged)));
        let outputs = drained(&mut answers);
        assert!(answered(&outputs).is_empty(), "nobody is served it");
        let (_, op) = one_store_request(&outputs);
        assert!(matches!(op, StoreOp::Lock { .. }), "a miss: {op:?}");
        let refused = answers.shared.as_ref().map(SharedTier::refused);
        let forged_index = EntryRefusal::Forged.index();
        assert_eq!(refused.map(|counts| counts[forged_index]), Some(1));
    }

    #[test]
    fn a_store_that_fails_is_left_alone_for_a_second_and_the_flight_fans_out_at_once() {
        let (mut answers, now) = shared();
        let (_, get, _) = flight(&mut answers, now);
        answers.handle_store_answer(now, get, StoreAnswer::Failed("refused".into()));
        assert!(matches!(
            drained(&mut answers).as_slice(),
            [EstateOutput::StartFlight { .. }]
        ));
        assert_eq!(
            answers.shared.as_ref().map(SharedTier::reachable),
            Some(false)
        );

        let (cacheable, fetch) = asked(&answers, TARGET);
        let soon = now + Duration::from_millis(10);
        let admission = answers.fly(soon, &cacheable, fetch, &mut Counter::default());
        assert!(
            matches!(admission, Admission::Flight { .. }),
            "the store is not asked while it fails"
        );
        assert!(store_requests(&drained(&mut answers)).is_empty());

        // A store that does not answer in time fails the same way.
        let (mut answers, now) = shared();
        let (_, _, _) = flight(&mut answers, now);
        let deadline = answers.shared_deadline().expect("the GET's deadline");
        assert_eq!(deadline, now + STORE_TIMEOUT);
        answers.shared_timeouts(deadline);
        assert!(matches!(
            drained(&mut answers).as_slice(),
            [EstateOutput::StartFlight { .. }]
        ));
    }

    #[test]
    fn another_replica_holding_the_lock_is_waited_for_and_its_entry_taken_when_it_lands() {
        let (mut answers, now) = shared();
        let (waiter, get, _) = flight(&mut answers, now);
        answers.handle_store_answer(now, get, StoreAnswer::Value(None));
        let (lock, _) = one_store_request(&drained(&mut answers));
        answers.handle_store_answer(now, lock, StoreAnswer::Locked(false));
        assert!(drained(&mut answers).is_empty(), "waits");
        let poll_at = answers.shared_deadline().expect("a poll");
        assert_eq!(poll_at, now + POLL_INTERVAL);
        answers.shared_timeouts(poll_at);
        let (poll, op) = one_store_request(&drained(&mut answers));
        assert!(matches!(op, StoreOp::Get { .. }));
        let value = entry(
            &answers,
            answers.clock.unix_millis(poll_at),
            r#"["theirs"]"#,
            &secret(),
        );
        answers.handle_store_answer(poll_at, poll, StoreAnswer::Value(Some(value)));
        let outputs = drained(&mut answers);
        assert_eq!(
            answered(&outputs),
            [(waiter, r#"["theirs"]"#.into(), "hit".into())]
        );
        assert!(
            store_requests(&outputs).is_empty(),
            "no lock of its own to release"
        );
    }

    #[test]
    fn a_lock_granted_after_its_flight_was_cancelled_is_released() {
        let (mut answers, now) = shared();
        let (waiter, get, _) = flight(&mut answers, now);
        answers.handle_store_answer(now, get, StoreAnswer::Value(None));
        let (lock, _) = one_store_request(&drained(&mut answers));
        answers.waiter_gone(now, waiter);
        assert!(
            drained(&mut answers).is_empty(),
            "no task to cancel before the fan-out starts"
        );
        answers.handle_store_answer(now, lock, StoreAnswer::Locked(true));
        let (_, op) = one_store_request(&drained(&mut answers));
        assert!(matches!(op, StoreOp::Unlock { .. }), "{op:?}");
    }
}
