//! `/facts` and `/facts/<name>[/<value>]`: node-level granularity. Each node's facts come from one
//! backend, its owner; the synthetic provenance fact names it.
//!
//! The owner is the membership map's (freshness or static, pushed upstream by D4) when that
//! backend returned the node's facts, else the first backend in configured order that did, so a
//! node only one backend holds always appears. Upstream records named like the provenance fact
//! are dropped on every shape while it is enabled.

use std::borrow::Cow;
use std::collections::HashMap;

use serde_json::value::RawValue;

use super::rows::{sort_rows, Raw, Row};
use super::{parse_answers, Answer, Merged, Provenance, RecordPlan};
use crate::ids::BackendId;
use crate::records::{parse_array, write_array, Fields};

struct Record<'a> {
    backend: usize,
    raw: &'a RawValue,
    fields: Option<Fields<'a>>,
    certname: Option<Cow<'a, str>>,
}

pub(crate) fn merge(plan: &RecordPlan, answers: &[Answer<'_>]) -> Merged {
    let (parsed, unusable) = match parse_answers(answers) {
        Ok(parsed) => parsed,
        Err(unusable) => return Merged::nothing(unusable),
    };
    let config = plan.config();
    let source_fact = config.source_fact.as_str();
    let drop_source = plan.provenance != Provenance::Off;

    // Pass 1: read each record once; note which backends returned each node.
    let mut records: Vec<Record<'_>> = Vec::new();
    let mut holders: HashMap<Cow<'_, str>, Vec<usize>> = HashMap::new();
    let mut dropped = 0usize;
    for (backend, raws) in &parsed {
        for raw in raws {
            let fields = Fields::of(raw);
            if drop_source
                && fields.as_ref().and_then(|f| f.str("name")).as_deref() == Some(source_fact)
            {
                dropped += 1;
                continue;
            }
            let certname = fields.as_ref().and_then(|f| f.str("certname"));
            if let Some(certname) = &certname {
                let held = holders.entry(certname.clone()).or_default();
                if held.last() != Some(&backend.0) {
                    held.push(backend.0);
                }
            }
            records.push(Record {
                backend: backend.0,
                raw,
                fields,
                certname,
            });
        }
    }
    if dropped > 0 {
        tracing::info!("dropped {dropped} upstream fact records named {source_fact} (the synthetic provenance fact)");
    }

    // Pass 2: keep each node's records from its effective owner only.
    let owner_of = |certname: &str| -> Option<usize> {
        let held = holders.get(certname)?;
        match plan.owner(certname) {
            Some(BackendId(owner)) if held.contains(&owner) => Some(owner),
            _ => held.first().copied(),
        }
    };
    let order = plan.order.as_ref();
    let mut rows: Vec<Row<'_>> = Vec::with_capacity(records.len());
    let mut node_rows: Vec<(Cow<'_, str>, usize, Option<&RawValue>)> = Vec::new();
    let mut last_row: HashMap<Cow<'_, str>, usize> = HashMap::new();
    for record in &records {
        if let Some(certname) = &record.certname {
            if owner_of(certname) != Some(record.backend) {
                continue;
            }
            if !last_row.contains_key(certname) {
                let environment = record.fields.as_ref().and_then(|f| f.raw("environment"));
                node_rows.push((certname.clone(), record.backend, environment));
            }
            last_row.insert(certname.clone(), rows.len());
        }
        rows.push(Row::new(
            record.backend,
            Raw::Borrowed(record.raw),
            record.fields.as_ref(),
            order,
        ));
    }

    // Provenance: one synthetic record per node, after the node's last record.
    let synthetic: Vec<(usize, Row<'_>)> = match &plan.provenance {
        Provenance::Inject | Provenance::SyntheticOnly { .. } => node_rows
            .iter()
            .filter_map(|(certname, backend, environment)| {
                let name = config.backends.get(*backend)?.name.as_str();
                if let Provenance::SyntheticOnly { value: Some(value) } = &plan.provenance {
                    if value != name {
                        return None;
                    }
                }
                let raw = synthetic_record(certname, source_fact, name, *environment)?;
                let fields = Fields::of(&raw).map(|f| owned_fields(&f));
                let row = Row::new(*backend, Raw::Owned(raw), None, None);
                let row = match (order, fields) {
                    (Some(order), Some(fields)) => Row {
                        key: Some(crate::sort::sort_key(order, |field| {
                            fields
                                .iter()
                                .find(|(k, _)| k == field)
                                .map(|(_, v)| v.as_ref())
                        })),
                        ..row
                    },
                    _ => row,
                };
                Some((last_row.get(certname).copied().unwrap_or(0), row))
            })
            .collect(),
        _ => Vec::new(),
    };
    let rows = match &plan.provenance {
        Provenance::SyntheticOnly { .. } => synthetic.into_iter().map(|(_, row)| row).collect(),
        _ if synthetic.is_empty() => rows,
        _ => interleave(rows, synthetic),
    };
    let mut rows = rows;
    let merged = rows.len();
    sort_rows(&mut rows, order);
    let rows = plan.window.apply(rows);
    let capacity = rows.iter().map(|r| r.raw.get().len() + 1).sum();
    let body = write_array(rows.iter().map(|r| r.raw.get()), capacity);
    let total = plan.total(merged, answers);
    Merged {
        response: Some(plan.respond(body, total)),
        contributed: parsed.len(),
        unusable,
    }
}

/// `rows` with each synthetic row placed right after the row index it names.
fn interleave<'a>(rows: Vec<Row<'a>>, synthetic: Vec<(usize, Row<'a>)>) -> Vec<Row<'a>> {
    let mut after: HashMap<usize, Vec<Row<'a>>> = HashMap::new();
    for (index, row) in synthetic {
        after.entry(index).or_default().push(row);
    }
    let mut out = Vec::with_capacity(rows.len() + after.len());
    for (index, row) in rows.into_iter().enumerate() {
        out.push(row);
        if let Some(extra) = after.remove(&index) {
            out.extend(extra);
        }
    }
    out
}

/// The synthetic fact record: all four keys, the environment copied from the node's own facts.
fn synthetic_record(
    certname: &str,
    name: &str,
    value: &str,
    environment: Option<&RawValue>,
) -> Option<Box<RawValue>> {
    let environment = environment.map_or("null", RawValue::get);
    let text = format!(
        "{{\"certname\":{},\"name\":{},\"value\":{},\"environment\":{}}}",
        serde_json::to_string(certname).ok()?,
        serde_json::to_string(name).ok()?,
        serde_json::to_string(value).ok()?,
        environment
    );
    RawValue::from_string(text).ok()
}

/// Copies a record's fields out of a borrow of its own text (the synthetic record owns it).
fn owned_fields(fields: &Fields<'_>) -> Vec<(String, Box<RawValue>)> {
    ["certname", "name", "value", "environment"]
        .iter()
        .filter_map(|key| Some(((*key).to_owned(), fields.raw(key)?.to_owned())))
        .collect()
}

/// The provenance drilldown's filter on a shared `/facts/<source_fact>` record set: the records
/// whose `value` is `value`, and how many there are.
pub(crate) fn filter_source_records(body: &[u8], value: &str) -> (bytes::Bytes, usize) {
    let Ok(records) = parse_array(body) else {
        return (bytes::Bytes::from_static(b"[]"), 0);
    };
    let kept: Vec<&str> = records
        .iter()
        .filter(|raw| Fields::of(raw).and_then(|f| f.str("value")).as_deref() == Some(value))
        .map(|raw| raw.get())
        .collect();
    let count = kept.len();
    (bytes::Bytes::from(write_array(kept, body.len())), count)
}
