//! Union merges: every backend's records, each distinct record once. `/reports` dedupes on the
//! hash, `/events`, `/fact-paths` and `/packages` on the record (less each backend's own receive
//! time), `/environments` and `/producers` on the name (sorted by name unless the request orders
//! otherwise). History asked with `latest_report?` is a node's own: other owners' copies are
//! dropped as in the node-owned merges.

use std::borrow::Cow;
use std::collections::HashSet;

use serde_json::value::RawValue;

use super::collect::{collect_pages, RecordFate};
use super::rows::{Raw, Row};
use super::{BackendPage, Merged, RecordPlan};
use crate::entity::{ColumnKind, Digest, Identity};
use crate::ownership::{Holding, Owning};
use crate::records::{parse_records, Fields};
use crate::sort::{Direction, OrderBy, OrderField};

pub(crate) fn merge(
    plan: &RecordPlan,
    answers: &[BackendPage<'_>],
    identity: Identity,
    owning: Option<Owning<'_>>,
) -> Merged {
    let by_name = OrderBy {
        fields: vec![OrderField {
            field: "name".to_owned(),
            direction: Direction::Ascending,
            kind: ColumnKind::Text,
        }],
    };
    let order = match (identity, plan.order.as_ref()) {
        (_, Some(order)) => Some(order),
        (Identity::Name, None) => Some(&by_name),
        (_, None) => None,
    };
    let depth_ordered = plan.entity.depth_from_path()
        && order.is_some_and(|o| o.fields.iter().any(|f| f.field == "depth"));
    let mut seen: HashSet<Digest> = HashSet::new();
    collect_pages(
        plan,
        order,
        answers,
        parse_records,
        |record| {
            order.map(|order| {
                let record = UnionRecord::read(record, depth_ordered);
                crate::sort::sort_key(order, |name| record.field(name))
            })
        },
        |backend, record| {
            let record = *record;
            let union_record = UnionRecord::read(record, depth_ordered);
            let fields = &union_record.fields;
            if let (Some(owning), Some(certname)) =
                (owning, fields.as_ref().and_then(|f| f.str("certname")))
            {
                if owning.holding(backend, &certname) == Holding::Other {
                    return RecordFate::Dropped;
                }
            }
            let key = identity.digest(
                record.get(),
                fields.as_ref().and_then(|f| f.raw(identity.field())),
            );
            if let Some(key) = key {
                if !seen.insert(key) {
                    // Still one the page filled: its copy is kept and sorts where it does.
                    return RecordFate::Deduped;
                }
            }
            // Fields asked for only to tell copies apart leave before the record is served.
            let helpers: Vec<&RawValue> = plan
                .history_helpers()
                .iter()
                .filter_map(|helper| fields.as_ref()?.raw(helper))
                .collect();
            let raw = match crate::records::without_entries(record.get(), &helpers) {
                Some(Cow::Owned(text)) => Raw::Owned(text),
                _ => Raw::Borrowed(record.get()),
            };
            RecordFate::Served(Row::new(backend.0, raw, order, |name| {
                union_record.field(name)
            }))
        },
    )
}

/// A union record as the merge reads it: its top-level fields, and `/fact-paths`' `depth` when
/// the request orders by it (computed from the path; not projected).
struct UnionRecord<'a> {
    fields: Option<Fields<'a>>,
    depth: Option<Box<RawValue>>,
}

impl<'a> UnionRecord<'a> {
    /// Reads `record`, with its depth when `depth_ordered`.
    fn read(record: &'a RawValue, depth_ordered: bool) -> UnionRecord<'a> {
        let fields = Fields::of(record.get());
        let depth = match depth_ordered {
            true => fact_path_depth(fields.as_ref()),
            false => None,
        };
        UnionRecord { fields, depth }
    }

    /// The raw value the sort reads for the column `name`.
    fn field(&self, name: &str) -> Option<&RawValue> {
        match (name, &self.depth) {
            ("depth", Some(depth)) => Some(&**depth),
            _ => self.fields.as_ref().and_then(|f| f.raw(name)),
        }
    }
}

/// A `/fact-paths` record's `depth` (its path's length less one), which orders but is not
/// projected.
fn fact_path_depth(fields: Option<&Fields<'_>>) -> Option<Box<RawValue>> {
    let path: Vec<serde_json::Value> = serde_json::from_str(fields?.raw("path")?.get()).ok()?;
    RawValue::from_string(path.len().saturating_sub(1).to_string()).ok()
}
