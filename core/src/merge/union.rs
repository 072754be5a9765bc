//! Union merges: every backend's records, each distinct record once. `/reports` dedupes on the
//! hash, `/events`, `/fact-paths` and `/packages` on the record (less each backend's own receive
//! time), `/environments` and `/producers` on the name (sorted by name unless the request orders
//! otherwise). History asked with `latest_report?` is a node's own: other owners' copies are
//! dropped as in the node-owned merges.

use std::collections::HashSet;

use serde_json::value::RawValue;

use super::rows::{Collected, Page, Raw, Row};
use super::{parse_answers, BackendPage, Merged, RecordPlan};
use crate::entity::Identity;
use crate::ownership::{Holding, Owning};
use crate::records::{parse_records, Fields};
use crate::sort::{ColumnKind, Direction, OrderBy, OrderField};

pub(crate) fn merge(
    plan: &RecordPlan,
    answers: &[BackendPage<'_>],
    identity: Identity,
    owning: Option<Owning<'_>>,
) -> Merged {
    let (parsed, unusable) = match parse_answers(answers, parse_records) {
        Ok(parsed) => parsed,
        Err(unusable) => return Merged::nothing(unusable),
    };
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
    let mut seen: HashSet<String> = HashSet::new();
    let mut rows = Collected::new(
        order,
        plan.window,
        parsed.iter().map(|(_, records)| records.len()).sum(),
        answers.iter().map(|answer| answer.body.len()).sum(),
    );
    let mut pages = Vec::with_capacity(parsed.len());
    for (answer, records) in &parsed {
        let backend = answer.backend;
        let mut page = Page::new(backend.0, answer.limit);
        page.returned = records.len();
        for (index, record) in records.iter().enumerate() {
            let fields = Fields::of(record.get());
            let depth = if depth_ordered {
                fact_path_depth(fields.as_ref())
            } else {
                None
            };
            let lookup = |name: &str| match (name, &depth) {
                ("depth", Some(depth)) => Some(&**depth),
                _ => fields.as_ref().and_then(|f| f.raw(name)),
            };
            if index + 1 == records.len() {
                page.last_key = order.map(|order| crate::sort::sort_key(order, lookup));
            }
            if let (Some(owning), Some(certname)) =
                (owning, fields.as_ref().and_then(|f| f.str("certname")))
            {
                if owning.holding(backend, &certname) == Holding::Other {
                    continue;
                }
            }
            // A record deduped away is still one the page filled: its copy is kept and sorts
            // where it does.
            page.kept += 1;
            let key = match identity {
                Identity::Verbatim => Some(match &fields {
                    Some(fields) => fields.identity_without("report_receive_time"),
                    None => record.get().to_owned(),
                }),
                Identity::Hash => fields
                    .as_ref()
                    .and_then(|f| f.str("hash"))
                    .map(|h| h.into_owned()),
                Identity::Name => fields
                    .as_ref()
                    .and_then(|f| f.str("name"))
                    .map(|n| n.into_owned()),
            };
            if let Some(key) = key {
                if !seen.insert(key) {
                    continue;
                }
            }
            // Fields asked for only to tell copies apart leave before the record is served.
            let raw = match plan.history_helpers().is_empty() {
                true => Raw::Borrowed(record.get()),
                false => crate::records::without_keys(record.get(), plan.history_helpers())
                    .and_then(|text| RawValue::from_string(text).ok())
                    .map_or(Raw::Borrowed(record.get()), Raw::Owned),
            };
            rows.push(Row::new(backend.0, raw, order, lookup));
        }
        pages.push(page);
    }
    Merged {
        body: rows.finish(order, plan.window, &pages),
        contributed: parsed.len(),
        unusable,
    }
}

/// A `/fact-paths` record's `depth` (its path's length less one), which orders but is not
/// projected.
fn fact_path_depth(fields: Option<&Fields<'_>>) -> Option<Box<RawValue>> {
    let path: Vec<serde_json::Value> = serde_json::from_str(fields?.raw("path")?.get()).ok()?;
    RawValue::from_string(path.len().saturating_sub(1).to_string()).ok()
}
