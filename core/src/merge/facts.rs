//! `/facts` and `/facts/<name>[/<value>]`: node-level granularity. Each node's facts come from one
//! backend, its owner; the synthetic provenance fact names it.
//!
//! The owner is the membership map's (freshness or static) when this request asks it: its
//! records are kept and every other backend's copy dropped, even when the owner returned none
//! (its facts do not match the query). A node the map does not know, or whose owner is not
//! asked, is taken from the first backend in configured order that returned it. Upstream
//! records named like the provenance fact are dropped on every shape while it is enabled.

use std::borrow::Cow;
use std::collections::HashMap;

use serde_json::value::RawValue;
use smallvec::SmallVec;

use super::rows::{compare_keys, Collected, Page, Raw, Row};
use super::{parse_answers, BackendPage, Merged, Parsed, Provenance, RecordPlan};
use crate::ids::BackendId;
use crate::ownership::{Holding, Owning};
use crate::records::{
    is_str, parse_array, parse_picked, provenance_record, provenance_record_bytes, raw_str,
    same_text, write_array, write_provenance_record, Fields, Picked,
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

/// A node seen in the answers: the backends that returned it (in answer order), the one whose
/// records are kept, that backend's last record of it (answer index, record index), and the
/// environment of its first kept record.
struct FactNode<'a> {
    certname: Cow<'a, str>,
    holders: SmallVec<[(usize, Holding); 2]>,
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
    /// The node named `certname`, noting that `backend` returned it and whose copy that is.
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
                holders: SmallVec::new(),
                owner: None,
                last: None,
                environment: None,
            });
        }
        let node_ref = &mut self.list[node];
        if !node_ref.holders.iter().any(|(b, _)| *b == backend) {
            let holding = owning.map_or(Holding::Unknown, |o| {
                o.holding(BackendId(backend), &node_ref.certname)
            });
            node_ref.holders.push((backend, holding));
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
    let (parsed, unusable) = match parse_answers(answers, |body| parse_picked(body, PICKED)) {
        Ok(parsed) => parsed,
        Err(unusable) => return Merged::nothing(unusable),
    };
    let config = plan.config();
    let source_fact = config.source_fact.as_str();
    let drop_source = plan.provenance != Provenance::Off;

    let (upstream, synthetic) = match &plan.provenance {
        Provenance::Off | Provenance::DropOnly => (true, None),
        Provenance::Inject => (true, Some(None)),
        Provenance::SyntheticOnly { values } => (false, Some(values.as_deref())),
    };

    // Pass 1: place each record; note which backends returned each node.
    let mut nodes = FactNodes::default();
    if !upstream {
        // Answering only provenance records, the backends are asked for a row a node: room for
        // the largest answer's nodes (else the list and the index grow by copying them all).
        let most = parsed.iter().map(|(_, records)| records.len()).max();
        nodes.list.reserve(most.unwrap_or_default());
        nodes.index.reserve(most.unwrap_or_default());
    }
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
    if dropped > 0 {
        tracing::info!("dropped {dropped} upstream fact records named {source_fact} (the synthetic provenance fact)");
    }

    // Each node's kept copy: its owner's; none when an asked owner did not return it; else the
    // first backend's that did. And the owner's last record of it.
    for node in &mut nodes.list {
        node.owner = match node.holders.iter().find(|(_, h)| *h == Holding::Own) {
            Some((owner, _)) => Some(*owner),
            None if node.holders.iter().any(|(_, h)| *h == Holding::Other) => None,
            None => node.holders.first().map(|(b, _)| *b),
        };
    }
    let values = ProvenanceValues::new(source_fact, &config.backends);
    let order = plan.order.as_ref();
    if let (false, Some(only)) = (upstream, synthetic) {
        // Never paged (the fact's own path answers a paged question with `[]`): no window to cut.
        debug_assert!(!plan.window.is_paged());
        let contributed = parsed.len();
        let picks = provenance_picks(&mut nodes, (&parsed, &places), (&values, only), order);
        // What the picks were read from goes before the answer is written.
        drop((parsed, places));
        nodes.index = HashMap::new();
        return Merged {
            body: Ok(provenance_body(picks, &nodes, &values, order)),
            contributed,
            unusable,
        };
    }
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
            if let (Some(_), Some((node_index, environment))) = (synthetic, provenance_due) {
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

/// Answering only provenance records (the fact's own path), the synthetic record due for one
/// node: the node (an index into [`FactNodes::list`]), its owner, and the record's sort key.
struct Pick {
    node: usize,
    backend: usize,
    key: Option<SortKey>,
}

/// Answering only provenance records: one pick a node, from its owner's first row, for a
/// backend in `only` when given, in merged order (configured backend order, then each
/// backend's). Notes each picked node's environment.
fn provenance_picks<'a>(
    nodes: &mut FactNodes<'a>,
    (parsed, places): (&Parsed<'a, Vec<Picked<'a, 4>>>, &[Vec<Place>]),
    (values, only): (&ProvenanceValues<'_>, Option<&[String]>),
    order: Option<&OrderBy>,
) -> Vec<Pick> {
    let mut picks = Vec::with_capacity(nodes.list.len());
    for ((this, records), backend_places) in parsed.iter().zip(places) {
        let backend = this.backend.0;
        let named = values.texts(backend).map(|(_, name)| name);
        if !named.is_some_and(|name| only.is_none_or(|only| only.iter().any(|v| v == name))) {
            continue;
        }
        for (record, place) in records.iter().zip(backend_places) {
            let Place::FactNode(node_index) = *place else {
                continue;
            };
            let node = &mut nodes.list[node_index];
            if node.owner != Some(backend) || node.environment.is_some() {
                continue;
            }
            let environment = *node.environment.insert(record.fields[2]);
            picks.push(Pick {
                node: node_index,
                backend,
                key: order.map(|order| {
                    provenance_key(order, values, (record.fields[0], backend), environment)
                }),
            });
        }
    }
    picks
}

/// The answer of only provenance records: each pick's synthetic record, sorted by `order` when
/// given (stable: ties keep the merged order), written straight into the body; and how many.
fn provenance_body(
    mut picks: Vec<Pick>,
    nodes: &FactNodes<'_>,
    values: &ProvenanceValues<'_>,
    order: Option<&OrderBy>,
) -> (Vec<u8>, usize) {
    if let Some(order) = order {
        picks.sort_by(|a, b| compare_keys(a.key.as_ref(), b.key.as_ref(), order));
    }
    let written = |pick: &Pick| {
        let node = &nodes.list[pick.node];
        let texts = values.texts(pick.backend)?;
        Some((&*node.certname, texts, node.environment.flatten()))
    };
    let bytes: usize = picks
        .iter()
        .filter_map(written)
        .map(|(certname, texts, environment)| {
            let environment = environment.map_or("null", RawValue::get);
            provenance_record_bytes(certname, texts, environment) + 1
        })
        .sum();
    let mut body = Vec::with_capacity(bytes + 2);
    body.push(b'[');
    let mut count = 0;
    for (certname, texts, environment) in picks.iter().filter_map(written) {
        let before = body.len();
        if count > 0 {
            body.push(b',');
        }
        if write_provenance_record(&mut body, certname, texts, environment).is_none() {
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
