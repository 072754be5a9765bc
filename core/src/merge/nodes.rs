//! `/nodes`: dedupe by certname; the strictly newer `report_timestamp` wins, ties to configured
//! order; each merged record gains a `pdbmux_source` key naming the winner.

use std::collections::HashMap;

use serde_json::value::RawValue;

use super::rows::{sort_rows, Raw, Row};
use super::{parse_answers, Answer, Merged, RecordPlan};
use crate::membership::compare_report_timestamps;
use crate::records::{with_key, write_array, Fields};

/// The key naming the winning backend on each merged node record.
pub(crate) const SOURCE_KEY: &str = "pdbmux_source";

pub(crate) fn merge(plan: &RecordPlan, answers: &[Answer<'_>]) -> Merged {
    let (parsed, unusable) = match parse_answers(answers) {
        Ok(parsed) => parsed,
        Err(unusable) => return Merged::nothing(unusable),
    };
    let order = plan.order.as_ref();
    let mut rows: Vec<Option<(Row<'_>, Option<&str>)>> = Vec::new();
    let mut by_certname: HashMap<std::borrow::Cow<'_, str>, usize> = HashMap::new();
    for (backend, records) in &parsed {
        for record in records {
            let fields = Fields::of(record.get());
            let certname = fields.as_ref().and_then(|f| f.str("certname"));
            let timestamp = fields
                .as_ref()
                .and_then(|f| f.raw("report_timestamp"))
                .map(RawValue::get);
            let row = Row::new(backend.0, Raw::Borrowed(record.get()), order, |name| {
                fields.as_ref().and_then(|f| f.raw(name))
            });
            let Some(certname) = certname else {
                rows.push(Some((row, timestamp)));
                continue;
            };
            match by_certname.get(&certname) {
                Some(&index) => {
                    let newer = rows[index].as_ref().is_some_and(|(_, kept)| {
                        compare_report_timestamps(json_str(timestamp), json_str(*kept)).is_gt()
                    });
                    if newer {
                        rows[index] = None;
                        by_certname.insert(certname, rows.len());
                        rows.push(Some((row, timestamp)));
                    }
                }
                None => {
                    by_certname.insert(certname, rows.len());
                    rows.push(Some((row, timestamp)));
                }
            }
        }
    }
    let mut rows: Vec<Row<'_>> = rows.into_iter().flatten().map(|(row, _)| row).collect();
    let merged = rows.len();
    sort_rows(&mut rows, order);
    let rows = plan.window.apply(rows);
    let stamp = !plan.is_projection();
    let backends = &plan.config().backends;
    let records: Vec<String> = rows
        .iter()
        .map(|row| match (&row.raw, stamp) {
            (Raw::Borrowed(raw), true) => {
                let name = backends.get(row.backend).map_or("", |b| b.name.as_str());
                with_key(raw, SOURCE_KEY, name)
            }
            (raw, _) => raw.get().to_owned(),
        })
        .collect();
    let capacity = records.iter().map(String::len).sum::<usize>() + records.len();
    let body = write_array(records.iter().map(String::as_str), capacity);
    let total = plan.total(merged, answers);
    Merged {
        response: Some(plan.respond(body, total)),
        contributed: parsed.len(),
        unusable,
    }
}

/// A raw JSON timestamp (`"…"` or `null`) as text; `None` for null or anything else.
fn json_str(raw: Option<&str>) -> Option<&str> {
    raw.and_then(|raw| raw.strip_prefix('"')?.strip_suffix('"'))
}
