//! A scripted shared cache store for the harness: the Redis semantics pdbmux relies on (`GETRANGE`,
//! `SET PX`, `SET NX PX` locks, delete-if-token) on the harness's simulated clock, shared between
//! harnesses (replicas) through a handle, with a switch that makes every request fail.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::Bytes;
use pdbmux_core::cache::shared::{StoreAnswer, StoreOp};

/// One key's value and when it expires, in the store's own time (see [`FakeStore::answer`]).
#[derive(Debug, Clone)]
struct Held {
    value: Bytes,
    expires: Duration,
}

#[derive(Debug, Default)]
struct State {
    keys: BTreeMap<String, Held>,
    failing: bool,
    ops: Vec<String>,
    /// An entry another replica stores (and whose lock it lets go of) just before the next
    /// lock request: the race between one replica's miss and its lock.
    stored_before_next_lock: Option<(String, Held)>,
}

/// A store every replica's harness shares: clone the handle into each. Time is each caller's
/// time since its own start, so replicas started together agree on it.
#[derive(Debug, Clone, Default)]
pub struct FakeStore(Arc<Mutex<State>>);

impl FakeStore {
    fn state(&self) -> MutexGuard<'_, State> {
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// From now on every request fails (`true`), as when the store is unreachable, or not.
    pub fn set_failing(&self, failing: bool) {
        self.state().failing = failing;
    }

    /// Sets `key` to `value` for `keep` from `at` (another replica's write).
    pub fn put(&self, at: Duration, key: &str, value: Bytes, keep: Duration) {
        let held = Held {
            value,
            expires: at + keep,
        };
        self.state().keys.insert(key.to_owned(), held);
    }

    /// Has another replica store `value` under `key` (for `keep` from `at`) right before the next
    /// lock request arrives, after the requester's own look missed: the moment a replica that
    /// took the lock must look again rather than fan out.
    pub fn store_before_next_lock(&self, at: Duration, key: &str, value: Bytes, keep: Duration) {
        let held = Held {
            value,
            expires: at + keep,
        };
        self.state().stored_before_next_lock = Some((key.to_owned(), held));
    }

    /// The value of `key` at `at`, if any.
    pub fn get(&self, at: Duration, key: &str) -> Option<Bytes> {
        let state = self.state();
        state
            .keys
            .get(key)
            .filter(|held| held.expires > at)
            .map(|held| held.value.clone())
    }

    /// Every request answered so far, one line each (`get k hit`, `lock k taken`, …).
    pub fn ops(&self) -> Vec<String> {
        self.state().ops.clone()
    }

    /// Answers `op` at `at` (the caller's time since its start).
    pub fn answer(&self, at: Duration, op: &StoreOp) -> StoreAnswer {
        let mut state = self.state();
        state.keys.retain(|_, held| held.expires > at);
        if state.failing {
            state.ops.push(format!("{} failed", describe(op)));
            return StoreAnswer::Failed("scripted failure".to_owned());
        }
        let (answer, word) = match op {
            // `GETRANGE key 0 limit`: at most `limit + 1` bytes, and an empty value for a key
            // that holds nothing, as Redis answers.
            StoreOp::Get { key, limit } => match state.keys.get(key) {
                Some(held) => {
                    let end = usize::try_from(limit.saturating_add(1))
                        .map_or(held.value.len(), |end| end.min(held.value.len()));
                    (StoreAnswer::Value(Some(held.value.slice(..end))), "hit")
                }
                None => (StoreAnswer::Value(Some(Bytes::new())), "none"),
            },
            StoreOp::Put { key, value, keep } => {
                let held = Held {
                    value: value.clone(),
                    expires: at + *keep,
                };
                state.keys.insert(key.clone(), held);
                (StoreAnswer::Done, "stored")
            }
            StoreOp::Lock { key, token, lease } => {
                if let Some((stored, held)) = state.stored_before_next_lock.take() {
                    state.ops.push(format!("(another replica stored {stored})"));
                    state.keys.insert(stored, held);
                }
                if state.keys.contains_key(key) {
                    (StoreAnswer::Locked(false), "held elsewhere")
                } else {
                    let held = Held {
                        value: Bytes::from(token.clone()),
                        expires: at + *lease,
                    };
                    state.keys.insert(key.clone(), held);
                    (StoreAnswer::Locked(true), "taken")
                }
            }
            StoreOp::Unlock { key, token } => {
                let ours = state
                    .keys
                    .get(key)
                    .is_some_and(|held| held.value == token.as_bytes());
                if ours {
                    state.keys.remove(key);
                }
                (
                    StoreAnswer::Done,
                    if ours { "released" } else { "not ours" },
                )
            }
        };
        state.ops.push(format!("{} {word}", describe(op)));
        answer
    }
}

/// One line for a store answer, in transcripts.
pub(crate) fn answer_text(answer: &StoreAnswer) -> String {
    match answer {
        StoreAnswer::Value(Some(value)) => format!("value ({} bytes)", value.len()),
        StoreAnswer::Value(None) => "none".to_owned(),
        StoreAnswer::Locked(held) => format!("locked {held}"),
        StoreAnswer::Done => "done".to_owned(),
        StoreAnswer::Failed(error) => format!("failed: {error}"),
    }
}

/// One line for a store request, in transcripts and [`FakeStore::ops`].
pub(crate) fn describe(op: &StoreOp) -> String {
    match op {
        StoreOp::Get { key, .. } => format!("get {key}"),
        StoreOp::Put { key, .. } => format!("put {key}"),
        StoreOp::Lock { key, .. } => format!("lock {key}"),
        StoreOp::Unlock { key, .. } => format!("unlock {key}"),
    }
}

/// The time since `start` (what [`FakeStore`] measures in).
pub(crate) fn since(start: Instant, now: Instant) -> Duration {
    now.saturating_duration_since(start)
}
