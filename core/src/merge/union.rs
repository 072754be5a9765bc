//! Union merges: `/reports` (deduped by hash), `/events` (deduped by the verbatim record) and
//! `/environments` (deduped by name, sorted by name unless the request orders otherwise).

use std::collections::HashSet;

use super::rows::{Collected, Raw, Row};
use super::{parse_answers, Answer, Merged, RecordPlan};
use crate::records::Fields;
use crate::sort::{Direction, OrderBy, OrderField};

/// What makes two records the same record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Identity {
    /// The `hash` field (reports are immutable; the same report can be stored in two backends).
    Hash,
    /// The record's exact bytes except `report_receive_time` (events carry no id of their own;
    /// a node reporting to two backends stores identical events in each, but each backend stamps
    /// its own receive time).
    Verbatim,
    /// The `name` field (environments).
    Name,
}

pub(crate) fn merge(plan: &RecordPlan, answers: &[Answer<'_>], identity: Identity) -> Merged {
    let (parsed, unusable) = match parse_answers(answers) {
        Ok(parsed) => parsed,
        Err(unusable) => return Merged::nothing(unusable),
    };
    let by_name = OrderBy {
        fields: vec![OrderField {
            field: "name".to_owned(),
            direction: Direction::Ascending,
            kind: crate::sort::ColumnKind::Text,
        }],
    };
    let order = match (identity, plan.order.as_ref()) {
        (_, Some(order)) => Some(order),
        (Identity::Name, None) => Some(&by_name),
        (_, None) => None,
    };
    let mut seen: HashSet<String> = HashSet::new();
    let mut rows = Collected::new(
        order,
        plan.window,
        parsed.iter().map(|(_, records)| records.len()).sum(),
        answers.iter().map(|answer| answer.body.len()).sum(),
    );
    for (backend, records) in &parsed {
        for record in records {
            let fields = Fields::of(record.get());
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
            rows.push(Row::new(
                backend.0,
                Raw::Borrowed(record.get()),
                order,
                |name| fields.as_ref().and_then(|f| f.raw(name)),
            ));
        }
    }
    let (body, merged) = rows.finish(order, plan.window);
    let total = plan.total(merged, answers);
    Merged {
        response: Some(plan.respond(body, total)),
        contributed: parsed.len(),
        unusable,
    }
}
