//! `/facts` and `/facts/<name>[/<value>]`: node-level granularity. Each node's facts come from one
//! backend, its owner; the synthetic provenance fact names it.
//!
//! The owner is the membership map's (freshness or static) when this request asks it: its
//! records are kept and every other backend's copy dropped, even when the owner returned none
//! (its facts do not match the query). A node the map does not know, or whose owner is not
//! asked, is taken from the first backend in configured order that returned it. Upstream
//! records named like the provenance fact are dropped on every shape while it is enabled.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};

use serde_json::value::RawValue;

use super::rows::{Collected, Page, Raw, Row};
use super::{parse_answers, BackendPage, Merged, Provenance, RecordPlan};
use crate::ids::BackendId;
use crate::ownership::{Holding, Owning};
use crate::records::{
    is_str, parse_array, parse_picked, provenance_record, provenance_record_bytes, raw_str,
    same_text, write_array, write_provenance_record, Fields,
};
use crate::sort::{OrderBy, SortKey};

/// Where pass 1 put an upstream record.
#[derive(Clone, Copy)]
enum Place {
    /// Named like the provenance fact: dropped.
    Dropped,
    /// No certname to group it by: kept as it is.
    Loose,
    /// One of this node's records (an index into [`FactNodes::list`]).
    FactNode(usize),
}

/// A node seen in the answers: the backend whose records of it are kept (none when no backend
/// that returned it may keep it), that backend's last record of it (answer index, record
/// index), and the environment of its first kept record.
struct FactNode<'a> {
    certname: Cow<'a, str>,
    owner: Option<usize>,
    last: Option<(usize, usize)>,
    environment: Option<Option<&'a RawValue>>,
}

/// The nodes of a merge, indexed by certname. Records come grouped by node, so the index is
/// consulted only when the certname changes from the record before.
#[derive(Default)]
struct FactNodes<'a> {
    list: Vec<FactNode<'a>>,
    index: HashMap<Cow<'a, str>, usize>,
}

impl<'a> FactNodes<'a> {
    /// The node named `certname`, which `backend` returned, claimed for `backend` when its
    /// records are the ones kept. The map's owner claims it when asked (the other backends'
    /// copies are [`Holding::Other`]); when the map does not place the node among those asked,
    /// every backend's holding is [`Holding::Unknown`] and the first to return it (answers come
    /// in configured order) claims it: the rule `provenance_merge` keeps too.
    fn seen(
        &mut self,
        certname: Cow<'a, str>,
        backend: usize,
        owning: Option<Owning<'_>>,
    ) -> usize {
        let next = self.list.len();
        let node = *self.index.entry(certname.clone()).or_insert(next);
        if node == next {
            self.list.push(FactNode {
                certname,
                owner: None,
                last: None,
                environment: None,
            });
        }
        let node_ref = &mut self.list[node];
        if node_ref.owner.is_none() {
            let holding = owning.map_or(Holding::Unknown, |o| {
                o.holding(BackendId(backend), &node_ref.certname)
            });
            if holding != Holding::Other {
                node_ref.owner = Some(backend);
            }
        }
        node
    }
}

/// The fields the merge reads from each record, in the pass that validates the body: what
/// placing it needs, and every column a `/facts` request can order by, so that a sort key needs
/// no second parse.
const PICKED: [&str; 4] = ["certname", "name", "environment", "value"];

pub(crate) fn merge(
    plan: &RecordPlan,
    answers: &[BackendPage<'_>],
    owning: Option<Owning<'_>>,
) -> Merged {
    if let Provenance::SyntheticOnly { values } = &plan.provenance {
        return provenance_merge(plan, answers, owning, values.as_deref());
    }
    let (parsed, unusable) = match parse_answers(answers, |body| parse_picked(body, PICKED)) {
        Ok(parsed) => parsed,
        Err(unusable) => return Merged::nothing(unusable),
    };
    let config = plan.config();
    let source_fact = config.source_fact.as_str();
    let drop_source = plan.provenance != Provenance::Off;
    let inject = plan.provenance == Provenance::Inject;

    // Pass 1: place each record; each node claimed by the backend whose records are kept.
    let mut nodes = FactNodes::default();
    let mut dropped = 0usize;
    let mut places: Vec<Vec<Place>> = Vec::with_capacity(parsed.len());
    for (answer, records) in &parsed {
        let backend = answer.backend;
        let mut backend_places = Vec::with_capacity(records.len());
        // The raw certname of the record before, and its node.
        let mut previous: Option<(&str, usize)> = None;
        for record in records {
            let [certname, name, _, _] = record.fields;
            let place = if drop_source && name.is_some_and(|name| is_str(name, source_fact)) {
                dropped += 1;
                Place::Dropped
            } else {
                match (certname, previous) {
                    (Some(raw), Some((last, node))) if same_text(raw.get(), last) => {
                        Place::FactNode(node)
                    }
                    (Some(raw), _) => match raw_str(raw) {
                        Some(certname) => {
                            let node = nodes.seen(certname, backend.0, owning);
                            previous = Some((raw.get(), node));
                            Place::FactNode(node)
                        }
                        None => Place::Loose,
                    },
                    (None, _) => Place::Loose,
                }
            };
            backend_places.push(place);
        }
        places.push(backend_places);
    }
    log_dropped(dropped, source_fact);

    let values = ProvenanceValues::new(source_fact, &config.backends);
    let order = plan.order.as_ref();
    // Each kept node's last record, where its provenance record follows.
    for (answer, ((this, _), backend_places)) in parsed.iter().zip(&places).enumerate() {
        let backend = this.backend;
        for (index, place) in backend_places.iter().enumerate() {
            if let Place::FactNode(node) = *place {
                let node = &mut nodes.list[node];
                if node.owner == Some(backend.0) {
                    node.last = Some((answer, index));
                }
            }
        }
    }

    // Pass 2: keep each node's records from its owner only, with the provenance record after
    // the node's last one.
    // Room for every upstream record read and a synthetic record a node.
    let upstream_rows = parsed
        .iter()
        .map(|(_, records)| records.len())
        .sum::<usize>();
    let mut rows = Collected::new(
        order,
        plan.window,
        upstream_rows + nodes.list.len(),
        answers.iter().map(|answer| answer.body.len()).sum(),
    );
    let mut pages = Vec::with_capacity(parsed.len());
    for (answer, ((this, records), backend_places)) in parsed.iter().zip(&places).enumerate() {
        let backend = this.backend;
        let mut page = Page::new(backend.0, this.limit);
        page.returned = records.len();
        if let (Some(order), Some(record)) = (order, records.last()) {
            page.last_key = Some(crate::sort::sort_key(order, |field| {
                let index = PICKED.iter().position(|picked| *picked == field)?;
                record.fields[index]
            }));
        }
        for (index, (record, place)) in records.iter().zip(backend_places).enumerate() {
            let mut provenance_due = None;
            match *place {
                Place::Dropped => continue,
                Place::Loose => {}
                Place::FactNode(node_index) => {
                    let node = &mut nodes.list[node_index];
                    if node.owner != Some(backend.0) {
                        continue;
                    }
                    let environment = *node.environment.get_or_insert(record.fields[2]);
                    if node.last == Some((answer, index)) {
                        provenance_due = Some((node_index, environment));
                    }
                }
            }
            page.kept += 1;
            rows.push(Row::new(
                backend.0,
                Raw::Borrowed(record.text),
                order,
                |field| {
                    let index = PICKED.iter().position(|picked| *picked == field)?;
                    record.fields[index]
                },
            ));
            if let (true, Some((node_index, environment))) = (inject, provenance_due) {
                let certname = &nodes.list[node_index].certname;
                let row = provenance_row(
                    (certname, record.fields[0]),
                    &values,
                    backend.0,
                    environment,
                    order,
                );
                if let Some(row) = row {
                    rows.push(row);
                }
            }
        }
        pages.push(page);
    }
    Merged {
        body: rows.finish(order, plan.window, &pages),
        contributed: parsed.len(),
        unusable,
    }
}

/// The provenance row of one node: its synthetic record naming the backend, with its sort key
/// when the request orders ([`provenance_key`]).
fn provenance_row(
    (certname, raw_certname): (&str, Option<&RawValue>),
    values: &ProvenanceValues<'_>,
    backend: usize,
    environment: Option<&RawValue>,
    order: Option<&OrderBy>,
) -> Option<Row<'static>> {
    let (name, value) = values.texts(backend)?;
    let raw = provenance_record(certname, name, value, environment)?;
    let key =
        order.map(|order| provenance_key(order, values, (raw_certname, backend), environment));
    Some(Row {
        backend,
        raw: Raw::Owned(raw),
        key,
    })
}

/// The sort key of a node's synthetic record, read from the values it is written from
/// (`raw_certname` is the node's own field as a backend wrote it), not from its text again.
fn provenance_key(
    order: &OrderBy,
    values: &ProvenanceValues<'_>,
    (raw_certname, backend): (Option<&RawValue>, usize),
    environment: Option<&RawValue>,
) -> SortKey {
    let (name, value) = values.json(backend);
    crate::sort::sort_key(order, |field| match field {
        "certname" => raw_certname,
        "name" => name,
        "value" => value,
        "environment" => environment,
        _ => None,
    })
}

/// Notes upstream records dropped for being named like the provenance fact.
fn log_dropped(dropped: usize, source_fact: &str) {
    if dropped > 0 {
        tracing::info!("dropped {dropped} upstream fact records named {source_fact} (the synthetic provenance fact)");
    }
}

/// The fields a provenance-only merge reads from each row: the node, its environment, and the
/// name (a record named like the provenance fact is no node's facts).
const NODE_PICKED: [&str; 3] = ["certname", "environment", "name"];

/// The synthetic record due for one node, held as the fields it is written from (borrowed from
/// its owner's answer): its certname and environment as that backend wrote them, and the
/// backend.
struct Pick<'a> {
    certname: &'a RawValue,
    environment: Option<&'a RawValue>,
    backend: usize,
}

impl<'a> Pick<'a> {
    /// The synthetic record's field named `field` (the lookup of [`crate::sort::sort_key`]).
    fn field<'v>(&self, values: &'v ProvenanceValues<'_>) -> impl Fn(&str) -> Option<&'v RawValue>
    where
        'a: 'v,
    {
        let (name, value) = values.json(self.backend);
        let (certname, environment) = (self.certname, self.environment);
        move |field: &str| match field {
            "certname" => Some(certname),
            "name" => name,
            "value" => value,
            "environment" => environment,
            _ => None,
        }
    }

    /// About how many bytes its synthetic record takes ([`provenance_record_bytes`]); `None`
    /// when it is not written.
    fn record_bytes(&self, values: &ProvenanceValues<'_>) -> Option<usize> {
        let certname = raw_str(self.certname)?;
        let environment = self.environment.map_or("null", RawValue::get);
        let bytes = provenance_record_bytes(&certname, values.texts(self.backend)?, environment);
        Some(bytes)
    }

    /// Writes its synthetic record at the end of `out`; `None` (and nothing or part of it
    /// written) when it cannot be.
    fn write(&self, out: &mut Vec<u8>, values: &ProvenanceValues<'_>) -> Option<()> {
        let certname = raw_str(self.certname)?;
        let texts = values.texts(self.backend)?;
        write_provenance_record(out, &certname, texts, self.environment)
    }
}

/// Answering only provenance records (the fact's own path; each backend asked a row a node):
/// one synthetic record a node, named for the backend that owns its facts (the membership
/// map's, or when it has none among those asked, the first backend in configured order that
/// returned the node), from that backend's first row of it, kept when `only` names that
/// backend (or is `None`). In merged order (configured backend order, then each backend's),
/// sorted by the request's order when it has one (stable: ties keep merged order).
///
/// It holds, beside the answers, the rows' fields, one [`Pick`] a node and the set of nodes
/// decided: an order by name merges it after the first byte, while every other record streams
/// (docs/decisions.md, D26), so its working set is most of the request's peak.
fn provenance_merge(
    plan: &RecordPlan,
    answers: &[BackendPage<'_>],
    owning: Option<Owning<'_>>,
    only: Option<&[String]>,
) -> Merged {
    // Never paged (the fact's own path answers a paged question with `[]`): no window to cut.
    debug_assert!(!plan.window.is_paged());
    let (parsed, unusable) = match parse_answers(answers, |body| parse_picked(body, NODE_PICKED)) {
        Ok(parsed) => parsed,
        Err(unusable) => return Merged::nothing(unusable),
    };
    let config = plan.config();
    let source_fact = config.source_fact.as_str();
    let values = ProvenanceValues::new(source_fact, &config.backends);
    let rows: usize = parsed.iter().map(|(_, rows)| rows.len()).sum();
    // Whose a node is follows from the map alone (one backend owns it, or none asked does):
    // the first backend to claim a node is its owner, or when none of those asked owns it, the
    // first in configured order that returned it.
    let mut claimed: HashSet<Cow<'_, str>> = HashSet::with_capacity(rows);
    let mut picks = Vec::with_capacity(rows);
    let mut dropped = 0usize;
    for (answer, rows) in &parsed {
        let backend = answer.backend;
        let named = values.texts(backend.0).map(|(_, name)| name);
        let kept = named.is_some_and(|name| only.is_none_or(|only| only.iter().any(|v| v == name)));
        for row in rows {
            let [certname, environment, name] = row.fields;
            if name.is_some_and(|name| is_str(name, source_fact)) {
                dropped += 1;
                continue;
            }
            let Some((raw, node)) = certname.and_then(|raw| Some((raw, raw_str(raw)?))) else {
                continue;
            };
            let holding = owning.map_or(Holding::Unknown, |o| o.holding(backend, &node));
            if holding == Holding::Other || !claimed.insert(node) {
                continue;
            }
            if kept {
                picks.push(Pick {
                    certname: raw,
                    environment,
                    backend: backend.0,
                });
            }
        }
    }
    log_dropped(dropped, source_fact);
    let contributed = parsed.len();
    // What the picks were read from goes before the answer is written.
    drop((parsed, claimed));
    if let Some(order) = plan.order.as_ref() {
        picks
            .sort_by(|a, b| crate::sort::compare_fields(order, a.field(&values), b.field(&values)));
    }
    Merged {
        body: Ok(provenance_body(&picks, &values)),
        contributed,
        unusable,
    }
}

/// The answer of only provenance records: each pick's synthetic record, in the picks' order,
/// written straight into the body; and how many.
fn provenance_body(picks: &[Pick<'_>], values: &ProvenanceValues<'_>) -> (Vec<u8>, usize) {
    let bytes: usize = picks
        .iter()
        .filter_map(|pick| pick.record_bytes(values))
        .map(|bytes| bytes + 1)
        .sum();
    let mut body = Vec::with_capacity(bytes + 2);
    body.push(b'[');
    let mut count = 0;
    for pick in picks {
        let before = body.len();
        if count > 0 {
            body.push(b',');
        }
        if pick.write(&mut body, values).is_none() {
            body.truncate(before);
            continue;
        }
        count += 1;
    }
    body.push(b']');
    (body, count)
}

/// The provenance fact's name and each backend's (configured order), as the configuration has
/// them and as JSON: one merge writes a synthetic record per node from them, and reads its sort
/// key from them.
struct ProvenanceValues<'c> {
    source_fact: &'c str,
    backends: &'c [crate::config::BackendConfig],
    name_json: Option<Box<RawValue>>,
    backends_json: Vec<Option<Box<RawValue>>>,
}

impl<'c> ProvenanceValues<'c> {
    fn new(source_fact: &'c str, backends: &'c [crate::config::BackendConfig]) -> Self {
        let json = |text: &str| RawValue::from_string(serde_json::to_string(text).ok()?).ok();
        ProvenanceValues {
            source_fact,
            backends,
            name_json: json(source_fact),
            backends_json: backends.iter().map(|backend| json(&backend.name)).collect(),
        }
    }

    /// The provenance fact's name and backend `backend`'s, as text.
    fn texts(&self, backend: usize) -> Option<(&'c str, &'c str)> {
        let value = self.backends.get(backend)?;
        Some((self.source_fact, value.name.as_str()))
    }

    /// The provenance fact's name and backend `backend`'s, as JSON.
    fn json(&self, backend: usize) -> (Option<&RawValue>, Option<&RawValue>) {
        let value = self.backends_json.get(backend).and_then(Option::as_deref);
        (self.name_json.as_deref(), value)
    }
}

/// The provenance drilldown's filter on a shared `/facts/<source_fact>` record set: the records
/// whose `value` is one of `values` (backend names), and how many there are.
pub(crate) fn filter_source_records(body: &[u8], values: &[String]) -> (bytes::Bytes, usize) {
    let Ok(records) = parse_array(body) else {
        return (bytes::Bytes::from_static(b"[]"), 0);
    };
    let kept: Vec<&str> = records
        .iter()
        .filter(|raw| {
            Fields::of(raw.get())
                .and_then(|f| f.str("value"))
                .is_some_and(|value| values.iter().any(|v| *v == value))
        })
        .map(|raw| raw.get())
        .collect();
    let count = kept.len();
    (bytes::Bytes::from(write_array(kept, body.len())), count)
}
