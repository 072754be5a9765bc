//! `/nodes` streamed (docs/merging.md, "Streamed merges"): the buffered merge's records
//! (`merge/nodes.rs`), each written as soon as it is decided. A node's record comes from its
//! owner and is written when read, with `pdbmux_source` naming the backend; what has to wait is
//! small and counted in the request's memory budget:
//!
//! - a *split* node (its facts or its catalog newest in another backend than its record): the
//!   owner's record waits for those backends' records (or their answers' end), whose fields it
//!   takes, as one PuppetDB composes the row;
//! - a node the map does not place (it appeared since the last refresh, or its owner is not
//!   asked): every backend's copy may be the one kept (the newest `report_timestamp`, then
//!   configured order), so the best so far waits until every answer has ended.
//!
//! Each backend's answer holds a certname once, as PuppetDB's nodes table does.

use std::cmp::Ordering;
use std::collections::HashMap;
use std::sync::Arc;

use serde_json::value::RawValue;

use super::Writer;
use crate::config::Config;
use crate::ids::BackendId;
use crate::membership::Ownership;
use crate::node_record::{compare_reports, composed_sources, stamped, COMPOSED};
use crate::ownership::{Holding, NodeScope, Owning};
use crate::records::{raw_str, with_values};

/// The fields a node record is read for, beyond its certname: its report's time (to keep the
/// newest copy of a node the map does not place), then [`COMPOSED`]'s fields, in their order.
pub(super) const NODE_FIELDS: [&str; 5] = [
    "report_timestamp",
    COMPOSED[0].1[0],
    COMPOSED[0].1[1],
    COMPOSED[1].1[0],
    COMPOSED[1].1[1],
];

/// A streamed `/nodes` merge's decisions: use it through [`super::StreamRule::Node`].
#[derive(Debug)]
pub(crate) struct NodeRecords {
    ownership: Arc<Ownership>,
    scope: NodeScope,
    /// The configuration, whose backends' names `pdbmux_source` gives.
    config: Arc<Config>,
    /// Split nodes whose record is not written yet.
    composing: HashMap<String, Composing>,
    /// Nodes the map does not place: the copy kept so far.
    unplaced: HashMap<String, Unplaced>,
    /// The bytes held in `composing` and `unplaced`: records, certnames, fields taken.
    held: usize,
}

/// A split node's record until every backend it takes fields from has answered.
#[derive(Debug, Default)]
struct Composing {
    /// The owner's record, once read.
    record: Option<(usize, String)>,
    /// The fields taken from the other kinds' owners' records, as JSON text.
    patch: Vec<(&'static str, Box<RawValue>)>,
    /// The inputs (the owner's among them) whose record or end is awaited.
    awaited: Vec<usize>,
}

/// The kept copy of a node the map does not place.
#[derive(Debug)]
struct Unplaced {
    input: usize,
    /// Its `report_timestamp`, as JSON text.
    report: Option<String>,
    text: String,
}

/// One node record's fields, as read.
pub(super) struct NodeFields<'a> {
    pub(super) certname: Option<&'a RawValue>,
    pub(super) report: Option<&'a RawValue>,
    /// [`COMPOSED`]'s fields, in its order.
    pub(super) composed: [[Option<&'a RawValue>; 2]; 2],
}

impl<'a> NodeFields<'a> {
    /// The fields of a record read for [`super::PICKED`] (`certname` first), then
    /// [`NODE_FIELDS`] last.
    pub(super) fn of(fields: &[Option<&'a RawValue>]) -> Self {
        let first = fields.len().saturating_sub(NODE_FIELDS.len());
        let at = |index: usize| fields.get(first + index).copied().flatten();
        NodeFields {
            certname: fields.first().copied().flatten(),
            report: at(0),
            composed: [[at(1), at(2)], [at(3), at(4)]],
        }
    }
}

impl NodeRecords {
    /// The decisions for a streamed `/nodes` over `ownership` as `scope` places nodes.
    pub(crate) fn new(ownership: Arc<Ownership>, scope: NodeScope, config: Arc<Config>) -> Self {
        NodeRecords {
            ownership,
            scope,
            config,
            composing: HashMap::new(),
            unplaced: HashMap::new(),
            held: 0,
        }
    }

    /// The record `text` of `asked[input]`: written to `out` at once, held, or dropped;
    /// `ended[i]`: the answer of `asked[i]` has ended.
    pub(super) fn read(
        &mut self,
        (input, asked, ended): (usize, &[BackendId], &[bool]),
        text: &str,
        fields: NodeFields<'_>,
        out: &mut Writer,
    ) {
        let Some(certname) = fields.certname.and_then(raw_str) else {
            // No node to own it: kept as it is, as the buffered merge keeps it.
            out.write(&self.stamped(asked[input], text));
            return;
        };
        let owning = Owning {
            ownership: &self.ownership,
            scope: self.scope,
            asked,
        };
        match owning.holding(asked[input], &certname) {
            Holding::Unknown => self.keep_newest(input, &certname, text, fields.report),
            holding => {
                let (owner, sources) = composed_sources(&owning, &certname);
                if sources.iter().all(Option::is_none) {
                    if holding == Holding::Own {
                        out.write(&self.stamped(asked[input], text));
                    }
                    return;
                }
                // Another owner's copy that gives the node no field is not needed.
                if holding == Holding::Other && !sources.contains(&Some(asked[input])) {
                    return;
                }
                let certname = certname.into_owned();
                if !self.composing.contains_key(&certname) {
                    self.held += certname.len();
                }
                let composing = self.composing.entry(certname.clone()).or_insert_with(|| {
                    let mut awaited: Vec<usize> = std::iter::once(owner)
                        .chain(sources)
                        .flatten()
                        .filter_map(|backend| asked.iter().position(|b| *b == backend))
                        .filter(|awaited| !ended.get(*awaited).copied().unwrap_or(true))
                        .collect();
                    awaited.dedup();
                    Composing {
                        awaited,
                        ..Composing::default()
                    }
                });
                if holding == Holding::Own {
                    self.held += text.len();
                    if let Some((_, replaced)) = composing.record.replace((input, text.to_owned()))
                    {
                        self.held -= replaced.len();
                    }
                }
                for (((_, names), source), values) in
                    COMPOSED.iter().zip(sources).zip(fields.composed)
                {
                    if source != Some(asked[input]) {
                        continue;
                    }
                    for (name, value) in names.iter().zip(values) {
                        if let Some(value) = value {
                            self.held += value.get().len();
                            composing.patch.push((name, value.to_owned()));
                        }
                    }
                }
                composing.awaited.retain(|awaited| *awaited != input);
                self.write_if_composed(&certname, asked, out);
            }
        }
    }

    /// `asked[input]`'s answer ended (or failed before its head): the split nodes waiting for
    /// its record are composed without it; once `all_ended`, the nodes the map does not place
    /// are written.
    pub(super) fn ended(
        &mut self,
        (input, asked): (usize, &[BackendId]),
        all_ended: bool,
        out: &mut Writer,
    ) {
        let composed: Vec<String> = self
            .composing
            .iter_mut()
            .filter_map(|(certname, composing)| {
                composing.awaited.retain(|awaited| *awaited != input);
                composing.awaited.is_empty().then(|| certname.clone())
            })
            .collect();
        for certname in composed {
            self.write_if_composed(&certname, asked, out);
        }
        if all_ended {
            let mut unplaced: Vec<(String, Unplaced)> =
                std::mem::take(&mut self.unplaced).into_iter().collect();
            // In configured order, as the buffered merge lists them.
            unplaced.sort_by_key(|(_, kept)| kept.input);
            for (certname, kept) in unplaced {
                self.held -= certname.len() + kept.text.len();
                out.write(&self.stamped(asked[kept.input], &kept.text));
            }
        }
    }

    /// The bytes held: split nodes' records, certnames and fields taken, and unplaced nodes'
    /// records.
    pub(super) fn held_bytes(&self) -> usize {
        self.held
    }

    /// Writes split node `certname` once it awaits no backend any more: the owner's record
    /// with the other kinds' fields (nothing when the owner's answer held no record of it).
    fn write_if_composed(&mut self, certname: &str, asked: &[BackendId], out: &mut Writer) {
        if !self
            .composing
            .get(certname)
            .is_some_and(|composing| composing.awaited.is_empty())
        {
            return;
        }
        let Some(Composing { record, patch, .. }) = self.composing.remove(certname) else {
            return;
        };
        let record_bytes = record.as_ref().map_or(0, |(_, text)| text.len());
        let patch_bytes: usize = patch.iter().map(|(_, value)| value.get().len()).sum();
        self.held -= certname.len() + record_bytes + patch_bytes;
        let Some((input, text)) = record else {
            return;
        };
        let composed = match patch.is_empty() {
            true => text,
            false => {
                let patch: Vec<(&str, &RawValue)> = patch
                    .iter()
                    .map(|(name, value)| (*name, &**value))
                    .collect();
                with_values(&text, &patch).unwrap_or(text)
            }
        };
        out.write(&self.stamped(asked[input], &composed));
    }

    /// Keeps `input`'s copy of `certname`, a node the map does not place, if it is the newest
    /// so far: the newer `report_timestamp`, then the earlier backend in configured order.
    fn keep_newest(&mut self, input: usize, certname: &str, text: &str, report: Option<&RawValue>) {
        let report = report.map(RawValue::get);
        if let Some(kept) = self.unplaced.get(certname) {
            let newer = match compare_reports(report, kept.report.as_deref()) {
                Ordering::Greater => true,
                Ordering::Equal => input < kept.input,
                Ordering::Less => false,
            };
            if !newer {
                return;
            }
            self.held -= certname.len() + kept.text.len();
        }
        self.held += certname.len() + text.len();
        self.unplaced.insert(
            certname.to_owned(),
            Unplaced {
                input,
                report: report.map(str::to_owned),
                text: text.to_owned(),
            },
        );
    }

    /// `text` with `pdbmux_source` naming `backend`.
    fn stamped(&self, backend: BackendId, text: &str) -> String {
        stamped(text, &self.config.backends, backend)
    }
}
