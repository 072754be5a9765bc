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
//!
//! Ordered by certname first, the merge is k-way (`super`'s ordered merge) and a record waits in
//! its place instead: a split node's record until the backends it takes fields from have
//! returned the node or ended, an unplaced node's copies until every backend has. No decision
//! trusts the backends to sort certnames alike (a database collating with `en_US` puts `web-2`
//! after `web1`): where they do not, a node's copies meet later and what sorts after it waits
//! longer, counted in the budget, but no node is served twice or without its owners' fields.

use std::borrow::Cow;
use std::cmp::Ordering;
use std::collections::HashMap;
use std::sync::Arc;

use serde_json::value::RawValue;

use super::Writer;
use crate::config::BackendConfig;
use crate::ids::BackendId;
use crate::membership::Ownership;
use crate::node_record::{compare_reports, composed_sources, source_entry, COMPOSED};
use crate::ownership::{Holding, NodeScope, Owning};
use crate::records::{raw_str, with_entry, with_values};

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
    /// Each configured backend's `pdbmux_source` entry, as it is appended to its records.
    stamps: Vec<String>,
    /// Where each of [`NODE_FIELDS`] is among the fields each record is read for
    /// ([`NodeRecords::read_fields_at`]; `certname` is the first).
    fields_at: [usize; NODE_FIELDS.len()],
    /// Split nodes whose record is not written yet.
    composing: HashMap<String, Composing>,
    /// Nodes the map does not place: the copy kept so far (unordered).
    unplaced: HashMap<String, Unplaced>,
    /// Nodes the map does not place: which answers returned them, and the newest (ordered).
    copies: HashMap<String, Copies>,
    /// The bytes held in `composing`, `unplaced` and `copies`: records, certnames, fields taken.
    held: usize,
}

/// What an ordered merge queues for a node record read ([`NodeRecords::read_ordered`]).
pub(super) enum Queue<'s> {
    /// Nothing: another backend's copy (its fields taken where the node is split).
    Dropped,
    /// The record as read with this entry (`pdbmux_source`'s) appended, decided.
    Stamped(Cow<'s, str>),
    /// The record as read, of this node: [`NodeRecords::decide`] says what is written once the
    /// copies it waits for are read.
    Pending(String),
}

/// An unplaced node's copies in an ordered merge.
#[derive(Debug)]
struct Copies {
    /// The answers (by input) that returned it.
    returned: Vec<bool>,
    /// The newest copy's input and `report_timestamp` (JSON text).
    newest: (usize, Option<String>),
    /// The copies queued and not yet decided.
    queued: usize,
}

/// A split node's record until every backend it takes fields from has answered.
#[derive(Debug, Default)]
struct Composing {
    /// The owner's record, once read (unordered).
    record: Option<(usize, String)>,
    /// Whether the owner's record was read and queued in its place (ordered).
    queued: bool,
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
struct NodeFields<'a> {
    certname: Option<&'a RawValue>,
    report: Option<&'a RawValue>,
    /// [`COMPOSED`]'s fields, in its order.
    composed: [[Option<&'a RawValue>; 2]; 2],
}

impl<'a> NodeFields<'a> {
    /// The fields of a record read for `certname` first and the others, [`NODE_FIELDS`] at
    /// `fields_at`.
    fn of(fields: &[Option<&'a RawValue>], fields_at: &[usize; NODE_FIELDS.len()]) -> Self {
        let at = |index: usize| fields.get(fields_at[index]).copied().flatten();
        NodeFields {
            certname: fields.first().copied().flatten(),
            report: at(0),
            composed: [[at(1), at(2)], [at(3), at(4)]],
        }
    }
}

impl NodeRecords {
    /// The decisions for a streamed `/nodes` over `ownership` as `scope` places nodes, each
    /// record stamped with its backend's name among `backends`.
    pub(crate) fn new(
        ownership: Arc<Ownership>,
        scope: NodeScope,
        backends: &[BackendConfig],
    ) -> Self {
        let stamps = (0..backends.len())
            .map(|backend| source_entry(backends, BackendId(backend)))
            .collect();
        NodeRecords {
            ownership,
            scope,
            stamps,
            fields_at: [0; NODE_FIELDS.len()],
            composing: HashMap::new(),
            unplaced: HashMap::new(),
            copies: HashMap::new(),
            held: 0,
        }
    }

    /// Where the merge reads each of [`NODE_FIELDS`] among each record's fields (after
    /// `certname`, which is first): set once, before the first record.
    pub(super) fn read_fields_at(&mut self, at: [usize; NODE_FIELDS.len()]) {
        self.fields_at = at;
    }

    /// What an ordered merge queues for a record of `asked[input]` read for `fields` (see
    /// [`Queue`]); `ended[i]`: the answer of `asked[i]` has ended.
    pub(super) fn read_ordered(
        &mut self,
        (input, asked, ended): (usize, &[BackendId], &[bool]),
        fields: &[Option<&RawValue>],
    ) -> Queue<'_> {
        let fields = NodeFields::of(fields, &self.fields_at);
        let Some(certname) = fields.certname.and_then(raw_str) else {
            return Queue::Stamped(self.stamp(asked[input]));
        };
        let owning = Owning {
            ownership: &self.ownership,
            scope: self.scope,
            asked,
        };
        match owning.holding(asked[input], &certname) {
            Holding::Unknown => {
                let report = fields.report.map(|report| report.get().to_owned());
                let report_bytes = report.as_ref().map_or(0, String::len);
                match self.copies.get_mut(certname.as_ref()) {
                    Some(copies) => {
                        if let Some(returned) = copies.returned.get_mut(input) {
                            *returned = true;
                        }
                        copies.queued += 1;
                        let (kept, kept_report) = &copies.newest;
                        if is_newer((input, report.as_deref()), (*kept, kept_report.as_deref())) {
                            let was = kept_report.as_ref().map_or(0, String::len);
                            self.held = self.held + report_bytes - was;
                            copies.newest = (input, report);
                        }
                    }
                    None => {
                        self.held += certname.len() + asked.len() + report_bytes;
                        let copies = Copies {
                            returned: (0..asked.len()).map(|i| i == input).collect(),
                            newest: (input, report),
                            queued: 1,
                        };
                        self.copies.insert(certname.to_string(), copies);
                    }
                }
                Queue::Pending(certname.into_owned())
            }
            holding => {
                let (owner, sources) = composed_sources(&owning, &certname);
                if sources.iter().all(Option::is_none) {
                    return match holding {
                        Holding::Own => Queue::Stamped(self.stamp(asked[input])),
                        _ => Queue::Dropped,
                    };
                }
                if holding == Holding::Other && !sources.contains(&Some(asked[input])) {
                    return Queue::Dropped;
                }
                let certname = certname.into_owned();
                let from = (input, asked, ended);
                let composing = self.take_fields(&certname, from, (owner, sources), &fields);
                composing.queued |= holding == Holding::Own;
                self.forget_orphan(&certname);
                match holding {
                    Holding::Own => Queue::Pending(certname),
                    _ => Queue::Dropped,
                }
            }
        }
    }

    /// What an ordered merge writes of `asked[input]`'s queued record `text` of `certname`
    /// ([`Queue::Pending`]) once it sorts first: `None` while copies it waits for may still
    /// come; then the record composed and stamped, or nothing (another copy is kept).
    pub(super) fn decide(
        &mut self,
        certname: &str,
        (input, asked, ended): (usize, &[BackendId], &[bool]),
        text: &str,
    ) -> Option<Option<String>> {
        if let Some(composing) = self.composing.get(certname) {
            if !composing.awaited.is_empty() {
                return None;
            }
            let patch = self.composing.remove(certname).map(|c| c.patch);
            let patch = patch.unwrap_or_default();
            let patch_bytes: usize = patch.iter().map(|(_, value)| value.get().len()).sum();
            self.held -= certname.len() + patch_bytes;
            return Some(Some(self.composed(asked[input], text.to_owned(), &patch)));
        }
        let Some(copies) = self.copies.get_mut(certname) else {
            return Some(Some(self.stamped(asked[input], text)));
        };
        let all_read =
            (copies.returned.iter().zip(ended)).all(|(returned, ended)| *returned || *ended);
        if !all_read {
            return None;
        }
        let kept = copies.newest.0 == input;
        copies.queued -= 1;
        // Every copy was read and this is the last decided: no answer can return the node again.
        if copies.queued == 0 {
            if let Some(copies) = self.copies.remove(certname) {
                let report = copies.newest.1.as_ref().map_or(0, String::len);
                self.held -= certname.len() + copies.returned.len() + report;
            }
        }
        Some(kept.then(|| self.stamped(asked[input], text)))
    }

    /// An ordered merge's answer of `asked[input]` ended (or failed before its head): the split
    /// nodes waiting for its record are composed without it when they sort first, and those
    /// whose owner's answer ended without the node are let go (nothing is written for them).
    pub(super) fn ended_ordered(&mut self, input: usize) {
        let mut orphans = Vec::new();
        for (certname, composing) in self.composing.iter_mut() {
            composing.awaited.retain(|awaited| *awaited != input);
            if composing.awaited.is_empty() && !composing.queued {
                orphans.push(certname.clone());
            }
        }
        for certname in orphans {
            self.forget_orphan(&certname);
        }
    }

    /// Lets go of split node `certname` in an ordered merge when it awaits no answer and its
    /// owner's record was not read: the owner's answer ended without it, so nothing is written,
    /// as the buffered merge writes nothing.
    fn forget_orphan(&mut self, certname: &str) {
        let orphan = self
            .composing
            .get(certname)
            .is_some_and(|composing| composing.awaited.is_empty() && !composing.queued);
        if let Some(composing) = orphan.then(|| self.composing.remove(certname)).flatten() {
            let patch_bytes: usize = composing.patch.iter().map(|(_, v)| v.get().len()).sum();
            self.held -= certname.len() + patch_bytes;
        }
    }

    /// Takes the fields `asked[input]`'s record of split node `certname` gives it (its
    /// `owner`'s and `sources`', [`composed_sources`]), and stops awaiting that answer.
    fn take_fields(
        &mut self,
        certname: &str,
        (input, asked, ended): (usize, &[BackendId], &[bool]),
        (owner, sources): (Option<BackendId>, [Option<BackendId>; 2]),
        fields: &NodeFields<'_>,
    ) -> &mut Composing {
        if !self.composing.contains_key(certname) {
            self.held += certname.len();
        }
        let composing = self
            .composing
            .entry(certname.to_owned())
            .or_insert_with(|| {
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
        for (((_, names), source), values) in COMPOSED.iter().zip(sources).zip(fields.composed) {
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
        composing
    }

    /// The record `text` of `asked[input]`: written to `out` at once, held, or dropped;
    /// `ended[i]`: the answer of `asked[i]` has ended.
    pub(super) fn read(
        &mut self,
        (input, asked, ended): (usize, &[BackendId], &[bool]),
        text: &str,
        fields: &[Option<&RawValue>],
        out: &mut Writer,
    ) {
        let fields = NodeFields::of(fields, &self.fields_at);
        let Some(certname) = fields.certname.and_then(raw_str) else {
            // No node to own it: kept as it is, as the buffered merge keeps it.
            self.write_stamped(out, asked[input], text);
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
                        self.write_stamped(out, asked[input], text);
                    }
                    return;
                }
                // Another owner's copy that gives the node no field is not needed.
                if holding == Holding::Other && !sources.contains(&Some(asked[input])) {
                    return;
                }
                let certname = certname.into_owned();
                let from = (input, asked, ended);
                let composing = self.take_fields(&certname, from, (owner, sources), &fields);
                let replaced = match holding {
                    Holding::Own => composing.record.replace((input, text.to_owned())),
                    _ => None,
                };
                if holding == Holding::Own {
                    self.held += text.len();
                }
                if let Some((_, replaced)) = replaced {
                    self.held -= replaced.len();
                }
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
                self.write_stamped(out, asked[kept.input], &kept.text);
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
        out.write(&self.composed(asked[input], text, &patch));
    }

    /// A split node's record `text` from `backend` with the fields `patch` taken from other
    /// backends' records, stamped.
    fn composed(
        &self,
        backend: BackendId,
        text: String,
        patch: &[(&'static str, Box<RawValue>)],
    ) -> String {
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
        self.stamped(backend, &composed)
    }

    /// Keeps `input`'s copy of `certname`, a node the map does not place, if it is the newest
    /// so far: the newer `report_timestamp`, then the earlier backend in configured order.
    fn keep_newest(&mut self, input: usize, certname: &str, text: &str, report: Option<&RawValue>) {
        let report = report.map(RawValue::get);
        if let Some(kept) = self.unplaced.get(certname) {
            if !is_newer((input, report), (kept.input, kept.report.as_deref())) {
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

    /// The `pdbmux_source` entry naming `backend` (built once per backend).
    fn stamp(&self, backend: BackendId) -> Cow<'_, str> {
        match self.stamps.get(backend.0) {
            Some(entry) => Cow::Borrowed(entry),
            None => Cow::Owned(source_entry(&[], backend)),
        }
    }

    /// `text` with `pdbmux_source` naming `backend`.
    fn stamped(&self, backend: BackendId, text: &str) -> String {
        with_entry(text, &self.stamp(backend)).concat()
    }

    /// Writes `text` to `out` with `pdbmux_source` naming `backend`, appended as it is written
    /// (no record built anew: `/nodes` writes one per node).
    fn write_stamped(&self, out: &mut Writer, backend: BackendId, text: &str) {
        out.write_parts(&with_entry(text, &self.stamp(backend)));
    }
}

/// Whether `input`'s copy of a node the map does not place, with this `report_timestamp` (JSON
/// text), is newer than the copy kept from `kept`: the newer report, then the earlier backend in
/// configured order.
fn is_newer(
    (input, report): (usize, Option<&str>),
    (kept, kept_report): (usize, Option<&str>),
) -> bool {
    match compare_reports(report, kept_report) {
        Ordering::Greater => true,
        Ordering::Equal => input < kept,
        Ordering::Less => false,
    }
}
