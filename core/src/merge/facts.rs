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

use super::rows::{Collected, Page, Raw, Row};
use super::{parse_answers, BackendPage, Merged, Provenance, RecordPlan};
use crate::ids::BackendId;
use crate::ownership::{Holding, Owning};
use crate::records::{
    is_str, parse_array, parse_picked, provenance_record, raw_str, same_text, write_array, Fields,
};
use crate::sort::OrderBy;

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
    holders: Vec<(usize, Holding)>,
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
                holders: Vec::with_capacity(2),
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

    // Pass 1: place each record; note which backends returned each node.
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
    // the node's last one (or, answering only provenance records, in place of its first).
    let order = plan.order.as_ref();
    let (upstream, synthetic) = match &plan.provenance {
        Provenance::Off | Provenance::DropOnly => (true, None),
        Provenance::Inject => (true, Some(None)),
        Provenance::SyntheticOnly { values } => (false, Some(values.as_deref())),
    };
    // Room for every upstream record read and a synthetic record a node; answering only
    // provenance records, for those alone (a node's rows from each backend are not kept).
    let upstream_rows = match upstream {
        true => parsed
            .iter()
            .map(|(_, records)| records.len())
            .sum::<usize>(),
        false => 0,
    };
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
                    let first = node.environment.is_none();
                    let environment = *node.environment.get_or_insert(record.fields[2]);
                    let due = if upstream {
                        node.last == Some((answer, index))
                    } else {
                        first
                    };
                    if due {
                        provenance_due = Some((node_index, environment));
                    }
                }
            }
            if upstream {
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
            }
            if let (Some(only), Some((node_index, environment))) = (synthetic, provenance_due) {
                let certname = &nodes.list[node_index].certname;
                let name = config.backends.get(backend.0).map(|b| b.name.as_str());
                if let Some(name) =
                    name.filter(|name| only.is_none_or(|only| only.iter().any(|v| v == name)))
                {
                    let row = provenance_row(
                        certname,
                        source_fact,
                        (backend.0, name),
                        environment,
                        order,
                    );
                    if let Some(row) = row {
                        rows.push(row);
                    }
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
/// when the request orders.
fn provenance_row(
    certname: &str,
    source_fact: &str,
    (backend, name): (usize, &str),
    environment: Option<&RawValue>,
    order: Option<&OrderBy>,
) -> Option<Row<'static>> {
    let raw = provenance_record(certname, source_fact, name, environment)?;
    let key = order.map(|order| {
        let fields = Fields::of(raw.get());
        crate::sort::sort_key(order, |field| fields.as_ref()?.raw(field))
    });
    Some(Row {
        backend,
        raw: Raw::Owned(Box::<str>::from(raw).into_string()),
        key,
    })
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
