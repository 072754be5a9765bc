//! The node-owned entities other than `/nodes` and `/facts`: `/fact-contents`, `/factsets`,
//! `/catalogs`, `/edges`, `/resources`, `/inventory`, `/package-inventory`. Every record names
//! its node; a node's records come from its owner alone, the other backends' copies are dropped
//! (a node the map does not know, or whose owner is not asked: the first backend's that returned
//! it). Records are written byte for byte.

use std::borrow::Cow;
use std::collections::HashMap;

use serde_json::value::RawValue;

use super::collect::{collect_pages, RecordFate};
use super::rows::{Raw, Row};
use super::{BackendPage, Merged, RecordPlan};
use crate::ids::BackendId;
use crate::ownership::{Holding, Owning};
use crate::records::{parse_picked, raw_str, Fields, Picked};

pub(crate) fn merge(
    plan: &RecordPlan,
    answers: &[BackendPage<'_>],
    owning: Option<Owning<'_>>,
) -> Merged {
    let order = plan.order.as_ref();
    let key_of = |text: &str| {
        order.map(|order| {
            let fields = Fields::of(text);
            crate::sort::sort_key(order, |name| fields.as_ref()?.raw(name))
        })
    };
    let mut owners = OwnerFilter {
        owning,
        first_holder: HashMap::new(),
        previous: None,
    };
    collect_pages(
        plan,
        order,
        answers,
        |body| parse_picked(body, ["certname"]),
        |record: &Picked<'_, 1>| key_of(record.text),
        |backend, record| {
            let [certname] = record.fields;
            if !owners.keeps(backend, certname) {
                return RecordFate::Dropped;
            }
            RecordFate::Served(Row {
                backend: backend.0,
                raw: Raw::Borrowed(record.text),
                key: key_of(record.text),
            })
        },
    )
}

/// Which copies of a node's records a node-owned merge keeps: its owner's, or (a node the map
/// does not place) the first backend's, in configured order, that returned it.
struct OwnerFilter<'a, 'o> {
    owning: Option<Owning<'o>>,
    first_holder: HashMap<Cow<'a, str>, usize>,
    /// The backend and raw certname of the record before, and whether it was kept: records come
    /// grouped by node, so the ownership lookup runs once per node and backend.
    previous: Option<(BackendId, &'a str, bool)>,
}

impl<'a> OwnerFilter<'a, '_> {
    /// Whether `backend`'s record naming `certname` (raw JSON) is kept; one naming no node is.
    fn keeps(&mut self, backend: BackendId, certname: Option<&'a RawValue>) -> bool {
        let Some(raw) = certname else {
            return true;
        };
        if let Some((from, last, keep)) = self.previous {
            if from == backend && raw.get() == last {
                return keep;
            }
        }
        let keep = match raw_str(raw) {
            Some(certname) => {
                match self
                    .owning
                    .map_or(Holding::Unknown, |o| o.holding(backend, &certname))
                {
                    Holding::Own => true,
                    Holding::Other => false,
                    Holding::Unknown => {
                        *self.first_holder.entry(certname).or_insert(backend.0) == backend.0
                    }
                }
            }
            None => true,
        };
        self.previous = Some((backend, raw.get(), keep));
        keep
    }
}
