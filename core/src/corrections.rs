//! Corrections: what a backend answers about the nodes it shares with other backends, kept for
//! as long as the membership snapshot they were asked against (docs/merging.md, "Corrections").
//!
//! A count over node-owned records (`/nodes` in an environment, the resources of an
//! environment, a paged total) is exact once each backend's count of the nodes it holds but does
//! not own is subtracted; a count over history once each report stored twice is subtracted.
//! Asking for that correction names the shared certnames, and a long list of certnames makes a
//! PuppetDB query slower (docs/merging.md, "What it costs"), so a correction is asked once per
//! snapshot and reused by every request with the same question until the next membership
//! refresh, which is when the nodes it is about can change owner.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use bytes::Bytes;

use crate::ids::BackendId;

/// The most correction bodies kept at once, and their byte budget; the oldest go first.
const MAX_ENTRIES: usize = 4096;
const MAX_BYTES: usize = 8 << 20;

/// One correction an exchange learned: the backend, the request it answered (path and query),
/// and its body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Learned {
    pub(crate) backend: BackendId,
    pub(crate) target: String,
    pub(crate) body: Bytes,
}

/// The corrections learned against one membership snapshot: each backend's answer to one
/// correction request (its path and query), as the body it sent.
#[derive(Debug, Default, Clone)]
pub(crate) struct Corrections {
    generation: u64,
    entries: BTreeMap<(BackendId, String), Bytes>,
    order: VecDeque<(BackendId, String)>,
    bytes: usize,
}

impl Corrections {
    /// No corrections yet for the snapshot `generation`.
    pub(crate) fn new(generation: u64) -> Corrections {
        Corrections {
            generation,
            ..Corrections::default()
        }
    }

    /// The body `backend` answered `target` with, if it was learned against snapshot
    /// `generation`.
    pub(crate) fn get(&self, generation: u64, backend: BackendId, target: &str) -> Option<&Bytes> {
        if generation != self.generation {
            return None;
        }
        self.entries.get(&(backend, target.to_owned()))
    }

    /// How many bodies are kept.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.entries.len()
    }

    /// These corrections with `learned` added (learned against snapshot `generation`; ignored
    /// when that is not this snapshot), within the budget. Copy on write: exchanges keep the
    /// `Arc` they started with.
    pub(crate) fn with(
        self: &Arc<Self>,
        generation: u64,
        learned: Vec<Learned>,
    ) -> Arc<Corrections> {
        if generation != self.generation || learned.is_empty() {
            return Arc::clone(self);
        }
        let mut next = (**self).clone();
        for Learned {
            backend,
            target,
            body,
        } in learned
        {
            if body.len() > MAX_BYTES {
                continue;
            }
            let key = (backend, target);
            if let Some(old) = next.entries.insert(key.clone(), body.clone()) {
                next.bytes -= old.len();
            } else {
                next.order.push_back(key);
            }
            next.bytes += body.len();
            while next.entries.len() > MAX_ENTRIES || next.bytes > MAX_BYTES {
                let Some(oldest) = next.order.pop_front() else {
                    break;
                };
                if let Some(old) = next.entries.remove(&oldest) {
                    next.bytes -= old.len();
                }
            }
        }
        Arc::new(next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn corrections_belong_to_one_snapshot_and_stay_within_budget() {
        let empty = Arc::new(Corrections::new(7));
        let a = BackendId(0);
        let learned = vec![Learned {
            backend: a,
            target: "/x".to_owned(),
            body: Bytes::from_static(b"[1]"),
        }];
        let one = empty.with(7, learned.clone());
        assert_eq!(one.get(7, a, "/x").map(|b| &b[..]), Some(&b"[1]"[..]));
        assert!(one.get(8, a, "/x").is_none(), "another snapshot's");
        assert!(empty.get(7, a, "/x").is_none(), "copy on write");
        assert!(
            one.with(6, learned).get(6, a, "/x").is_none(),
            "learned too late"
        );
        let mut many = Arc::new(Corrections::new(1));
        for i in 0..(MAX_ENTRIES + 10) {
            let learned = Learned {
                backend: a,
                target: format!("/{i}"),
                body: Bytes::from_static(b"[]"),
            };
            many = many.with(1, vec![learned]);
        }
        assert_eq!(many.len(), MAX_ENTRIES);
        assert!(many.get(1, a, "/0").is_none(), "the oldest went first");
        assert!(many.get(1, a, &format!("/{}", MAX_ENTRIES + 9)).is_some());
    }
}
