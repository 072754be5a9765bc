//! A merge of records fed its backends' answers in pieces (docs/merging.md, "Streamed merges"):
//! each answer is read record by record as its bytes arrive, each record kept or dropped as soon
//! as it is read (its node's owner in the membership snapshot; for history, whether a copy of it
//! was written already), and the kept records are written out at once, so that neither a whole
//! answer nor the whole merged body is ever held.
//!
//! Sans-IO: bytes in ([`RecordStream::push`], [`RecordStream::end`]), bytes out
//! ([`RecordStream::take`]). The records kept are the buffered merge's (`merge/owned.rs`): a node's
//! records from its owner; a node the map does not place from the first backend in configured
//! order that returned it, so such a record waits until every backend before its own has ended.
//! `/nodes` (unordered) is the buffered `merge/nodes.rs`'s record per node ([`nodes`]).
//!
//! History (`/reports`, `/events`) is every backend's records, each stored copy once
//! ([`StreamRule::History`]; `merge/union.rs` buffered): the first copy written is kept, and a
//! digest of its identity (16 bytes a record, not the record) drops the copies after it. An
//! unordered answer writes the first copy read, which can be another backend's than the buffered
//! merge's (copies differ only in each backend's own receive time); an ordered one tells copies
//! as they are written, so copies tying on the order are the buffered merge's choice.
//!
//! An ordered answer (`order_by`, no `limit`) is merged k-way: each backend's answer comes
//! sorted, so a kept record is written once every other backend still answering has read a
//! record that sorts after it (ties to configured order, as the buffered merge's stable sort).
//! What waits is each backend's records read ahead of the slowest backend's. A `/facts` node's
//! synthetic provenance record (an order by certname first) is queued in its place among its
//! node's records, after those it ties with, as the buffered merge puts it.

use std::borrow::Cow;
use std::cmp::Ordering;
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;

use bytes::Bytes;

use crate::entity::{Digest, Identity};
use crate::ids::{BackendId, UpstreamId};
use crate::membership::Ownership;
use crate::ownership::{Holding, NodeScope, Owning};
use crate::records::{
    is_str, provenance_record, raw_str, read_object, with_entry, without_entries, Fields,
};
use crate::sort::{self, OrderBy, SortKey};
use serde_json::value::RawValue;
use smallvec::SmallVec;

mod joined;
mod nodes;
mod queue;

pub(crate) use joined::JoinedLater;
use joined::JoinedRecords;

pub(crate) use nodes::NodeRecords;
use nodes::{Queue, NODE_FIELDS};
use queue::{Queued, RecordQueue, Span};

/// Why a streamed answer cannot be merged: a backend's body is not a JSON array of objects, or
/// an answer joined with it could not be merged when the stream reached it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MergeBroken {
    /// A backend's body broke.
    #[error("the answer of backend {backend} is not a JSON array of objects: {reason}")]
    Body {
        /// The backend (its index in the configuration).
        backend: usize,
        /// What was wrong.
        reason: String,
    },
    /// A joined answer merged only when the stream reached it
    /// (`RecordStream::then_merge_later`) could not be: why.
    #[error("the joined answer could not be merged: {0}")]
    Joined(String),
}

/// The fields every record is read for: whose node it is, and for `/facts` its name (the
/// provenance fact's are dropped) and environment (its synthetic record copies it). An ordered
/// merge reads its `order_by` fields after these in the same pass.
const PICKED: [&str; 3] = ["certname", "name", "environment"];

/// What a streamed `/facts` merge does with the provenance fact (docs/merging.md,
/// "Provenance"): the backends' records of that name are dropped, and with `inject` one
/// synthetic record per node names the backend its facts came from.
#[derive(Debug, Clone)]
pub(crate) struct StreamedProvenance {
    /// The provenance fact's name.
    pub(crate) source_fact: String,
    /// Each input's backend name, when a synthetic record is written for each node kept.
    pub(crate) inject: Option<Vec<String>>,
}

/// A record's [`PICKED`] fields, from the fields it was read for.
fn picked<'a>(fields: &[Option<&'a RawValue>]) -> [Option<&'a RawValue>; 3] {
    [0, 1, 2].map(|index| fields.get(index).copied().flatten())
}

/// The sort key of a record read for the fields `names`.
fn sort_key(order: &OrderBy, names: &[&str], fields: &[Option<&RawValue>]) -> SortKey {
    sort::sort_key(order, |name| {
        let index = names.iter().position(|picked| *picked == name)?;
        fields.get(index).copied().flatten()
    })
}

/// Where a reader is in its array.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ArrayState {
    /// Before the `[`.
    Open,
    /// After the `[`: an element or the `]`.
    First,
    /// After an element: a `,` or the `]`.
    Next,
    /// After a `,`: an element.
    Element,
    /// After the `]`: only whitespace.
    Closed,
}

/// Reads one JSON array of objects from its pieces: each whole element is handed on as soon as
/// its last byte arrives; only an element cut by a piece's end is kept until the next.
#[derive(Debug)]
struct ArrayReader {
    /// The text read and not handed on yet: whole characters, checked as UTF-8 once, as they
    /// arrive, so records are parsed as `str` (a record checked again by its parse costs a
    /// fifth more of the merge).
    pending: String,
    /// The first bytes of a character a piece's end cut, until the next piece completes it.
    cut: Vec<u8>,
    state: ArrayState,
}

impl ArrayReader {
    fn new() -> ArrayReader {
        ArrayReader {
            pending: String::new(),
            cut: Vec::new(),
            state: ArrayState::Open,
        }
    }

    /// Appends `piece` to the pending text; an error when it is not UTF-8.
    fn append(&mut self, piece: &[u8]) -> Result<(), String> {
        let joined;
        let bytes = match self.cut.is_empty() {
            true => piece,
            false => {
                self.cut.extend_from_slice(piece);
                joined = std::mem::take(&mut self.cut);
                &joined[..]
            }
        };
        let not_utf8 = |at: usize| format!("the body is not UTF-8 (at byte {at} of a piece)");
        match std::str::from_utf8(bytes) {
            Ok(text) => self.pending.push_str(text),
            Err(error) if error.error_len().is_some() => return Err(not_utf8(error.valid_up_to())),
            // The piece ends inside a character: the rest of it comes with the next.
            Err(error) => {
                let (whole, cut) = bytes.split_at(error.valid_up_to());
                let whole = std::str::from_utf8(whole).map_err(|e| not_utf8(e.valid_up_to()))?;
                self.pending.push_str(whole);
                self.cut = cut.to_vec();
            }
        }
        Ok(())
    }

    /// Reads `piece`, handing each whole record (its text and its fields `names`, in their order)
    /// to `record`.
    fn push(
        &mut self,
        piece: &[u8],
        names: &[&str],
        mut record: impl FnMut(&str, &[Option<&RawValue>]),
    ) -> Result<(), String> {
        self.append(piece)?;
        let mut fields = vec![None; names.len()];
        let mut at = 0;
        loop {
            let Some(offset) = self.pending.as_bytes()[at..]
                .iter()
                .position(|byte| !matches!(byte, b' ' | b'\t' | b'\n' | b'\r'))
            else {
                at = self.pending.len();
                break;
            };
            at += offset;
            let byte = self.pending.as_bytes()[at];
            self.state = match (self.state, byte) {
                (ArrayState::Open, b'[') => ArrayState::First,
                (ArrayState::First | ArrayState::Next, b']') => ArrayState::Closed,
                (ArrayState::Next, b',') => ArrayState::Element,
                (ArrayState::First | ArrayState::Element, _) => {
                    match read_object(&self.pending[at..], names, &mut fields) {
                        Ok(Some((text, end))) => {
                            record(text, &fields);
                            at += end;
                            self.state = ArrayState::Next;
                            continue;
                        }
                        Ok(None) => break,
                        Err(error) => return Err(error.to_string()),
                    }
                }
                (state, byte) => {
                    return Err(format!(
                        "unexpected {:?} {}",
                        char::from(byte),
                        match state {
                            ArrayState::Open => "where the array should open",
                            ArrayState::Closed => "after the array",
                            _ => "between records",
                        }
                    ))
                }
            };
            at += 1;
        }
        self.pending.drain(..at);
        Ok(())
    }

    /// Whether the array was whole: its `]` read, nothing but whitespace after it.
    fn is_closed(&self) -> bool {
        self.state == ArrayState::Closed && self.pending.is_empty() && self.cut.is_empty()
    }
}

/// Whether the first `bytes` of `body` read as the start of a JSON array of records (a body no
/// longer than that: as a whole array of records): what a streamed answer's body is checked for
/// before the first byte leaves, the rest being read after it.
pub(crate) fn begins_as_records(body: &[u8], bytes: usize) -> bool {
    let mut reader = ArrayReader::new();
    let read = reader.push(&body[..body.len().min(bytes)], &[], |_, _| {});
    read.is_ok() && (body.len() > bytes || reader.is_closed())
}

/// What a streamed merge keeps: use [`StreamRule::Owned`] for node-owned entities,
/// [`StreamRule::Node`] for `/nodes`, [`StreamRule::History`] for reports and events.
#[derive(Debug)]
pub(crate) enum StreamRule {
    /// A node's records from its owner in `ownership`, as `scope` places it (`merge/owned.rs`).
    Owned(Arc<Ownership>, NodeScope),
    /// `/nodes`' whole records, unordered: each node's from its owner, composed and stamped
    /// ([`nodes`]).
    Node(NodeRecords),
    /// Every backend's records, each copy `identity` tells apart once; with `owned`
    /// (`latest_report?`), the copies of a node another backend owns dropped. A projection's
    /// `helpers` (fields asked for only to tell copies apart) leave each record as it is written.
    History {
        identity: Identity,
        owned: Option<(Arc<Ownership>, NodeScope)>,
        helpers: Vec<&'static str>,
    },
}

/// The bytes one digest the set holds room for takes: its own, a control byte, and its share of
/// the buckets a hash table keeps free (at most 7 in 8 are used).
const SEEN_SLOT_BYTES: usize = (std::mem::size_of::<Digest>() + 1) * 8 / 7 + 1;

/// Whether a node's records from one backend are kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Keep {
    Yes,
    No,
    /// The map does not place the node and a backend before this one has not ended: decided
    /// when it has.
    Later,
}

/// One backend's answer as it is read; after the backends', the records of an answer an
/// ordered answer is joined with, read a piece at a time as they are written
/// ([`RecordStream::then_merge`]) or merged later ([`RecordStream::then_merge_later`]).
#[derive(Debug)]
struct Input {
    reader: ArrayReader,
    ended: bool,
    /// The node of the last record read and whether its records are kept: records come grouped
    /// by node, so the map is asked once per node.
    last: Option<(String, Keep)>,
    /// An ordered merge's records read and not yet written (kept, or to be decided), in order.
    queue: RecordQueue,
    /// A joined answer merged later ([`RecordStream::then_merge_later`]): until then it has no
    /// records and has not ended.
    later: Option<JoinedLater>,
    /// A joined answer's records not read yet ([`RecordStream::then_merge`]): read as its queue
    /// empties; it has ended once they are all read.
    joined: Option<JoinedRecords>,
}

impl Input {
    /// Reads a joined answer's next pieces, once its queued records are all written, until a
    /// record is queued or it ends (and is let go); an error when it is not an array of
    /// records.
    fn read_joined(&mut self, order: &OrderBy) -> Result<(), String> {
        let Some(joined) = self.joined.as_mut() else {
            return Ok(());
        };
        while self.queue.is_empty() {
            if !joined.read_on(&mut self.reader, &mut self.queue, order)? {
                self.joined = None;
                self.ended = true;
                break;
            }
        }
        Ok(())
    }
}

/// How many bytes of records an ordered merge queues from one backend before it waits for the
/// others ([`RecordStream::wants`]): some 1,900 fact records of 140 bytes. Each queued record
/// also holds its sort key (about a hundred bytes), so what one backend's queue holds is about
/// twice this; at 1 MiB, eight ordered answers at once held some 80 MB of queues (bench/README.md,
/// figure 8) with no gain in CPU or time.
const ORDERED_AHEAD_BYTES: usize = 256 * 1024;

/// How many bytes an ordered merge writes before they are taken ([`RecordStream::take`] writes
/// on): what sorts next can be every record of an answer joined in order (the provenance
/// records, one a node: megabytes at once), which would otherwise be written, and held, whole.
const WRITTEN_AT_ONCE_BYTES: usize = 256 * 1024;

/// What an ordered merge does with the record that sorts first.
enum HeadFate {
    Write,
    Drop,
    /// Writes this text in its place (a `/nodes` record composed and stamped).
    WriteAs(String),
}

/// The decisions and the output, apart from the readers that feed them.
#[derive(Debug)]
struct Decisions {
    rule: StreamRule,
    asked: Vec<BackendId>,
    /// History: what tells a record's copies apart, and where its field is among the fields
    /// each record is read for; the digests of the identities written.
    identity: Option<(Identity, usize)>,
    /// A history projection's helper fields (`StreamRule::History`'s `helpers`): where each is
    /// among the fields each record is read for.
    helpers_at: Vec<usize>,
    seen: HashSet<Digest>,
    /// Nodes the map does not place: the first input in configured order that returned each, of
    /// those read so far. It keeps the node once every input before it has ended.
    claimed: HashMap<String, usize>,
    /// Each input's place in the membership map after the last node it asked for
    /// ([`crate::membership::Ownership::owners_near`]): its nodes come ascending.
    near: Vec<usize>,
    /// Records of unplaced nodes waiting for an earlier input to end.
    waiting: Vec<Waiting>,
    provenance: Option<StreamedProvenance>,
    /// The nodes whose synthetic provenance record was written.
    injected: HashSet<String>,
    /// An ordered merge's `order_by`.
    order: Option<OrderBy>,
    out: Writer,
}

/// The merged answer's bytes as they are written: the array's `[`, its records separated by
/// commas; the `]` once every input ended.
#[derive(Debug, Default)]
pub(super) struct Writer {
    bytes: Vec<u8>,
    /// The records (or runs of records) written.
    written: usize,
}

impl Writer {
    /// Writes `record` as the next.
    pub(super) fn write(&mut self, record: &str) {
        self.write_raw(record.as_bytes());
    }

    /// Writes the record whose text is `parts` end to end as the next (a record with an entry
    /// appended, [`crate::records::with_entry`]).
    pub(super) fn write_parts(&mut self, parts: &[&str]) {
        self.bytes.push(if self.written == 0 { b'[' } else { b',' });
        for part in parts {
            self.bytes.extend_from_slice(part.as_bytes());
        }
        self.written += 1;
    }

    /// Writes `records`, one record or several separated by commas, as the next.
    fn write_raw(&mut self, records: &[u8]) {
        self.bytes.push(if self.written == 0 { b'[' } else { b',' });
        self.bytes.extend_from_slice(records);
        self.written += 1;
    }

    /// Closes the array.
    fn close(&mut self) {
        if self.written == 0 {
            self.bytes.push(b'[');
        }
        self.bytes.push(b']');
    }
}

/// A record of an unplaced node, until every input before its own has ended.
#[derive(Debug)]
struct Waiting {
    input: usize,
    certname: String,
    /// Its `environment`, as JSON text.
    environment: Option<String>,
    /// Its text as it is served.
    text: String,
}

impl Decisions {
    fn write(&mut self, record: &str) {
        self.out.write(record);
    }

    /// Writes a kept record of `certname` from `input` (`served`: as it is served), and the
    /// node's synthetic provenance record after its first.
    fn write_kept(
        &mut self,
        input: usize,
        (certname, environment): (&str, Option<&str>),
        (served, node_changed): (&str, bool),
    ) {
        self.write(served);
        // Records come grouped by node: only a record whose node differs from the one before
        // can be its node's first.
        if !node_changed {
            return;
        }
        let Some(names) = self.provenance.as_ref().and_then(|p| p.inject.as_ref()) else {
            return;
        };
        if self.injected.contains(certname) {
            return;
        }
        let environment =
            environment.and_then(|e| serde_json::value::RawValue::from_string(e.to_owned()).ok());
        let synthetic = self.provenance.as_ref().and_then(|p| {
            let name = names.get(input)?;
            provenance_record(certname, &p.source_fact, name, environment.as_deref())
        });
        if let Some(record) = synthetic {
            self.write(&record);
            self.injected.insert(certname.to_owned());
        }
    }

    /// An ordered merge's record read from `input`, with its fields `names` (read in the same
    /// pass as its text): dropped when another backend owns its node, else queued with its sort
    /// key (a node the map does not place, to be decided), and with a node's first its
    /// synthetic provenance record where `/facts` has one.
    fn queue_ordered(
        &mut self,
        input: usize,
        (queue, last): (&mut RecordQueue, &mut Option<(String, Keep)>),
        (text, names, fields): (&str, &[&str], &[Option<&RawValue>]),
    ) {
        let [certname, _, environment] = picked(fields);
        let certname = certname.and_then(raw_str);
        let (keep, node_changed) = match (&certname, last.as_ref()) {
            (None, _) => (Keep::Yes, false),
            (Some(certname), Some((node, keep))) if node == certname => (*keep, false),
            (Some(certname), _) => {
                // A node the map does not place is decided when its record is written.
                let keep = self.keep(input, certname, false);
                *last = Some((certname.to_string(), keep));
                (keep, true)
            }
        };
        if keep == Keep::No {
            return;
        }
        // A copy of a history record is told when it is written, in the merged order: the
        // first in that order is kept, where ties go to configured order as in the buffered
        // merge.
        let digest = self.digest(text, fields);
        let Some(order) = &self.order else {
            return;
        };
        let text = self.served(text, fields);
        let unplaced = (keep == Keep::Later)
            .then(|| certname.as_deref().map(str::to_owned))
            .flatten();
        // Before the synthetic records queued last that sort after it or with it.
        let key = sort_key(order, names, fields);
        let mut at = queue.len();
        while let Some(before) = at.checked_sub(1).and_then(|i| queue.get(i)) {
            if !before.synthetic || sort::compare(&before.key, &key, order) == Ordering::Less {
                break;
            }
            at -= 1;
        }
        let synthetic = node_changed
            .then(|| {
                let provenance = self.provenance.as_ref()?;
                let name = provenance.inject.as_ref()?.get(input)?;
                provenance_record(
                    certname.as_deref()?,
                    &provenance.source_fact,
                    name,
                    environment,
                )
            })
            .flatten();
        let record = Queued {
            key,
            unplaced: unplaced.clone(),
            synthetic: false,
            digest,
            span: Span::default(),
        };
        queue.insert(at, &[&text], record);
        if let Some(record) = synthetic {
            // After every queued record sorting before it or with it (one per node: read again).
            let fields = Fields::of(&record);
            let key = sort::sort_key(order, |name| fields.as_ref().and_then(|f| f.raw(name)));
            let mut at = queue.len();
            while let Some(before) = at.checked_sub(1).and_then(|i| queue.get(i)) {
                if sort::compare(&before.key, &key, order) != Ordering::Greater {
                    break;
                }
                at -= 1;
            }
            let queued = Queued {
                key,
                unplaced,
                synthetic: true,
                digest: None,
                span: Span::default(),
            };
            queue.insert(at, &[&record], queued);
        }
    }

    /// Whether the record `text` (read for `fields`) is the first copy of its history record to
    /// be written: its identity's digest is kept to tell later copies. Always for node-owned
    /// records.
    fn first_copy(&mut self, text: &str, fields: &[Option<&RawValue>]) -> bool {
        match self.digest(text, fields) {
            Some(digest) => self.seen.insert(digest),
            None => true,
        }
    }

    /// The digest of a history record's identity; `None` for node-owned records and for a
    /// record without one (never a copy).
    fn digest(&self, text: &str, fields: &[Option<&RawValue>]) -> Option<Digest> {
        let (identity, at) = self.identity?;
        identity.digest(text, fields.get(at).copied().flatten())
    }

    /// `text` (read for `fields`) as it is served: without the fields a history projection was
    /// asked for only to tell copies apart, cut at the positions its parse found them
    /// (`merge/union.rs` drops them the same way).
    fn served<'t>(&self, text: &'t str, fields: &[Option<&RawValue>]) -> Cow<'t, str> {
        if self.helpers_at.is_empty() {
            return Cow::Borrowed(text);
        }
        let values: SmallVec<[&RawValue; 4]> = self
            .helpers_at
            .iter()
            .filter_map(|at| fields.get(*at).copied().flatten())
            .collect();
        without_entries(text, &values).unwrap_or(Cow::Borrowed(text))
    }

    /// Whether a record named `name` is the provenance fact's, which the backends do not hold.
    fn is_provenance(&self, name: Option<&serde_json::value::RawValue>) -> bool {
        match (&self.provenance, name) {
            (Some(provenance), Some(name)) => is_str(name, &provenance.source_fact),
            _ => false,
        }
    }

    /// Whether `input`'s records of `certname` are kept; `before_ended`: every input before it
    /// has ended.
    fn keep(&mut self, input: usize, certname: &str, before_ended: bool) -> Keep {
        let (ownership, scope, history) = match &self.rule {
            StreamRule::Owned(ownership, scope) => (ownership, *scope, false),
            StreamRule::History {
                owned: Some((ownership, scope)),
                ..
            } => (ownership, *scope, true),
            StreamRule::History { owned: None, .. } => return Keep::Yes,
            // Node records are decided by `NodeRecords` alone.
            StreamRule::Node(_) => return Keep::Yes,
        };
        let owning = Owning {
            ownership,
            scope,
            asked: &self.asked,
        };
        let backend = self.asked[input];
        let holding = match self.near.get_mut(input) {
            Some(near) => owning.holding_near(backend, certname, near),
            None => owning.holding(backend, certname),
        };
        match holding {
            Holding::Own => Keep::Yes,
            Holding::Other => Keep::No,
            // History keeps every backend's copy of a node the map does not place (each copy
            // once, by identity), as the buffered union does.
            Holding::Unknown if history => Keep::Yes,
            Holding::Unknown => {
                let first = self.claimed.entry(certname.to_owned()).or_insert(input);
                *first = (*first).min(input);
                match (before_ended, *first == input) {
                    (false, _) => Keep::Later,
                    (true, true) => Keep::Yes,
                    (true, false) => Keep::No,
                }
            }
        }
    }
}

/// A merge of the answers of `asked` backends, fed as they arrive (see the module doc). Use it
/// for an unpaged answer of records that name their node, or of history records; ordered,
/// it merges k-way.
#[derive(Debug)]
pub(crate) struct RecordStream {
    inputs: Vec<Input>,
    /// The fields each record is read for: [`PICKED`], then an ordered merge's `order_by`
    /// fields, then those history or `/nodes` decide by that are not among them already.
    picked: Vec<String>,
    decisions: Decisions,
    /// Records written after the merged ones ([`RecordStream::then_write`]).
    then: Vec<Bytes>,
    finished: bool,
    /// Why a joined answer merged later could not be ([`RecordStream::take`] says so).
    broken: Option<MergeBroken>,
}

impl RecordStream {
    /// A merge of the answers of `asked` (configured order) keeping what `rule` keeps;
    /// `provenance` for `/facts`; `order` for an answer each backend sorts (with synthetic
    /// provenance records only when it orders by certname first, so that each node's records
    /// come together).
    pub(crate) fn new(
        mut rule: StreamRule,
        asked: Vec<BackendId>,
        (provenance, order): (Option<StreamedProvenance>, Option<OrderBy>),
    ) -> RecordStream {
        let mut picked: Vec<String> = PICKED
            .iter()
            .map(|name| name.to_string())
            .chain(
                order
                    .iter()
                    .flat_map(|order| order.fields.iter())
                    .map(|f| f.field.clone()),
            )
            .collect();
        // A field is read once: one the order reads already is found there.
        let mut read_at = |field: &str| {
            picked
                .iter()
                .position(|name| name == field)
                .unwrap_or_else(|| {
                    picked.push(field.to_owned());
                    picked.len() - 1
                })
        };
        let (identity, helpers_at) = match &rule {
            StreamRule::History {
                identity, helpers, ..
            } => (
                Some((*identity, read_at(identity.field()))),
                helpers.iter().map(|helper| read_at(helper)).collect(),
            ),
            StreamRule::Owned(..) | StreamRule::Node(_) => (None, Vec::new()),
        };
        if let StreamRule::Node(nodes) = &mut rule {
            nodes.read_fields_at(NODE_FIELDS.map(&mut read_at));
        }
        let inputs = asked.len();
        RecordStream {
            inputs: asked
                .iter()
                .map(|_| Input {
                    reader: ArrayReader::new(),
                    ended: false,
                    last: None,
                    queue: RecordQueue::default(),
                    later: None,
                    joined: None,
                })
                .collect(),
            picked,
            decisions: Decisions {
                rule,
                asked,
                identity,
                helpers_at,
                seen: HashSet::new(),
                claimed: HashMap::new(),
                near: vec![0; inputs],
                waiting: Vec::new(),
                provenance,
                injected: HashSet::new(),
                order,
                out: Writer::default(),
            },
            then: Vec::new(),
            finished: false,
            broken: None,
        }
    }

    /// The next piece of the answer of `asked[input]`.
    pub(crate) fn push(&mut self, input: usize, piece: &[u8]) -> Result<(), MergeBroken> {
        let before_ended = self.inputs[..input].iter().all(|i| i.ended);
        // `/nodes` decides which answers a split node waits for by which have ended.
        let ended: Vec<bool> = match self.decisions.rule {
            StreamRule::Node(_) => self.inputs.iter().map(|i| i.ended).collect(),
            _ => Vec::new(),
        };
        let Some(state) = self.inputs.get_mut(input).filter(|i| !i.ended) else {
            return Ok(());
        };
        let decisions = &mut self.decisions;
        let names: Vec<&str> = self.picked.iter().map(String::as_str).collect();
        let Input {
            reader,
            last,
            queue,
            ..
        } = state;
        let pushed = reader.push(piece, &names, |text, fields| {
            if let StreamRule::Node(nodes) = &mut decisions.rule {
                let from = (input, &decisions.asked[..], &ended[..]);
                let Some(order) = &decisions.order else {
                    nodes.read(from, text, fields, &mut decisions.out);
                    return;
                };
                let key = sort_key(order, &names, fields);
                let record = |unplaced| Queued {
                    key,
                    unplaced,
                    synthetic: false,
                    digest: None,
                    span: Span::default(),
                };
                match nodes.read_ordered(from, fields) {
                    Queue::Dropped => {}
                    Queue::Stamped(entry) => {
                        queue.push_back(&with_entry(text, &entry), record(None))
                    }
                    Queue::Pending(certname) => queue.push_back(&[text], record(Some(certname))),
                }
                return;
            }
            let [certname, name, environment] = picked(fields);
            if decisions.is_provenance(name) {
                return;
            }
            if decisions.order.is_some() {
                decisions.queue_ordered(input, (queue, last), (text, &names, fields));
                return;
            }
            let Some(certname) = certname.and_then(raw_str) else {
                // No node to own it: kept as it is (history: its first copy).
                if decisions.first_copy(text, fields) {
                    let served = decisions.served(text, fields);
                    decisions.write(&served);
                }
                return;
            };
            let (keep, node_changed) = match last.as_ref() {
                Some((node, keep)) if *node == certname => (*keep, false),
                _ => {
                    let keep = decisions.keep(input, &certname, before_ended);
                    *last = Some((certname.clone().into_owned(), keep));
                    (keep, true)
                }
            };
            let environment = environment.map(serde_json::value::RawValue::get);
            match keep {
                Keep::Yes if !decisions.first_copy(text, fields) => {}
                Keep::Yes => {
                    let node = (certname.as_ref(), environment);
                    let served = decisions.served(text, fields);
                    decisions.write_kept(input, node, (&served, node_changed));
                }
                Keep::No => {}
                Keep::Later => decisions.waiting.push(Waiting {
                    input,
                    certname: certname.into_owned(),
                    environment: environment.map(str::to_owned),
                    text: decisions.served(text, fields).into_owned(),
                }),
            }
        });
        pushed.map_err(|reason| MergeBroken::Body {
            backend: self.decisions.asked[input].0,
            reason,
        })?;
        self.write_ordered();
        Ok(())
    }

    /// The answer of `asked[input]` ended; an error when it ended inside its array.
    pub(crate) fn end(&mut self, input: usize) -> Result<(), MergeBroken> {
        let Some(state) = self.inputs.get_mut(input).filter(|i| !i.ended) else {
            return Ok(());
        };
        if !state.reader.is_closed() {
            return Err(MergeBroken::Body {
                backend: self.decisions.asked[input].0,
                reason: "the body ended inside the array".to_owned(),
            });
        }
        state.ended = true;
        self.node_ended(input);
        self.finish_if_ended();
        Ok(())
    }

    /// Writes `records` (JSON objects separated by commas, as inside an array, or nothing) after
    /// the merged records, once every answer ended: the records of the answers a streamed
    /// answer is joined with (`core/src/concat.rs`).
    pub(crate) fn then_write(&mut self, records: Bytes) {
        if !records.is_empty() {
            self.then.push(records);
        }
    }

    /// Merges `records` (a JSON array sorted by this ordered merge's `order_by`) into the answer,
    /// each in its place, after the merged records it ties with: the records of the answers an
    /// ordered streamed answer is joined with (`core/src/concat.rs`). They are one more input,
    /// held whole and read a piece at a time as they are written. `None` when their first piece
    /// is not an array of records, or the merge is not ordered (or merges `/nodes`).
    pub(crate) fn then_merge(&mut self, records: Bytes) -> Option<()> {
        let input = self.joined_input(records).ok()?;
        self.inputs.push(input);
        Some(())
    }

    /// The input of a joined answer, its first piece read (an error when that is not an array
    /// of records).
    fn joined_input(&self, records: Bytes) -> Result<Input, String> {
        let order = self
            .joinable_order()
            .ok_or("the merge is not ordered, or merges /nodes")?;
        let mut input = Input {
            reader: ArrayReader::new(),
            ended: false,
            last: None,
            queue: RecordQueue::default(),
            later: None,
            joined: Some(JoinedRecords::new(records)),
        };
        input.read_joined(order)?;
        Ok(input)
    }

    /// [`RecordStream::then_merge`] for an answer merged only once this merge's first records
    /// were taken, or it reaches the records it holds: every record of it sorts with `later`'s
    /// prefix, so the records that sort before that prefix can be written first, while it is
    /// not merged (docs/merging.md, "Streamed merges"). `None` when the merge is not ordered (or
    /// merges `/nodes`).
    pub(crate) fn then_merge_later(&mut self, later: JoinedLater) -> Option<()> {
        self.joinable_order()?;
        self.inputs.push(Input {
            reader: ArrayReader::new(),
            ended: false,
            last: None,
            queue: RecordQueue::default(),
            later: Some(later),
            joined: None,
        });
        Some(())
    }

    /// The order an answer joined with this merge is merged in: `None` when it is not ordered,
    /// or merges `/nodes`, which decides by which backends' answers have ended, one input each.
    fn joinable_order(&self) -> Option<&OrderBy> {
        if matches!(self.decisions.rule, StreamRule::Node(_)) {
            return None;
        }
        self.decisions.order.as_ref()
    }

    /// Merges the joined answer of `index` ([`RecordStream::then_merge_later`]) now: its
    /// records are queued, and it has ended. One that cannot be merged breaks the answer.
    fn merge_later(&mut self, index: usize) {
        let Some(later) = self.inputs[index].later.take() else {
            return;
        };
        let joined = later.merge().and_then(|records| {
            self.joined_input(records)
                .map_err(|why| MergeBroken::Joined(format!("its merged records: {why}")))
        });
        match joined {
            Ok(input) => self.inputs[index] = input,
            Err(broken) => {
                self.inputs[index].ended = true;
                self.broken = Some(broken);
            }
        }
    }

    /// `/nodes`: writes the records that waited for `input`'s answer to end (ordered: they are
    /// decided as they sort first).
    fn node_ended(&mut self, input: usize) {
        let all_ended = self.inputs.iter().all(|i| i.ended);
        let decisions = &mut self.decisions;
        match (&mut decisions.rule, &decisions.order) {
            (StreamRule::Node(nodes), Some(_)) => nodes.ended_ordered(input),
            (StreamRule::Node(nodes), None) => {
                nodes.ended((input, &decisions.asked), all_ended, &mut decisions.out)
            }
            _ => {}
        }
    }

    /// Decides what waited for the inputs that ended, and closes the array once all have.
    fn finish_if_ended(&mut self) {
        self.decide_waiting();
        self.write_ordered();
        if !self.finished && self.inputs.iter().all(|i| i.ended && i.queue.is_empty()) {
            for records in std::mem::take(&mut self.then) {
                self.decisions.out.write_raw(&records);
            }
            self.decisions.out.close();
            self.finished = true;
        }
    }

    /// `asked[input]` failed before its answer's head: it adds no records (the nodes it owns
    /// are left out, as in a buffered merge's partial answer).
    pub(crate) fn skip(&mut self, input: usize) {
        if let Some(state) = self.inputs.get_mut(input).filter(|i| !i.ended) {
            state.ended = true;
            self.node_ended(input);
            self.finish_if_ended();
        }
    }

    /// Whether `input`'s next piece is wanted now. An ordered merge holds what one backend read
    /// ahead of another: past [`ORDERED_AHEAD_BYTES`] it waits for a backend that has nothing
    /// queued it can write (its reader pushes back on the backend), so that it holds about that
    /// much per backend, not the faster backend's whole answer. A backend whose queue holds only
    /// a node's synthetic provenance record has nothing it can write: that record waits for the
    /// backend's next record.
    pub(crate) fn wants(&self, input: usize) -> bool {
        let Some(this) = self.inputs.get(input) else {
            return false;
        };
        self.decisions.order.is_none()
            || this.queue.queued_bytes() < ORDERED_AHEAD_BYTES
            || !self.inputs.iter().enumerate().any(|(other, i)| {
                other != input
                    && !i.ended
                    && i.later.is_none()
                    && i.joined.is_none()
                    && i.queue.iter().all(|queued| queued.synthetic)
            })
    }

    /// The bytes of the merged answer written since the last call. An ordered merge writes at
    /// most about [`WRITTEN_AT_ONCE_BYTES`] between calls: when nothing was written since the
    /// last, this writes on first, so call it until it gives nothing before reading more. (An
    /// unordered merge writes all it can as it reads, and closes when its last answer ends.)
    /// An error once a joined answer merged later could not be
    /// ([`RecordStream::then_merge_later`]): the answer cannot be completed.
    pub(crate) fn take(&mut self) -> Result<Vec<u8>, MergeBroken> {
        let ordered = self.decisions.order.is_some();
        if ordered && self.decisions.out.bytes.is_empty() && !self.finished {
            self.finish_if_ended();
        }
        match self.broken.clone() {
            Some(broken) => Err(broken),
            // Nothing written: the buffer keeps its room.
            None if self.decisions.out.bytes.is_empty() => Ok(Vec::new()),
            // The next piece's records are about as many bytes: room for them now spares the
            // buffer growing (and copying itself) a dozen times over each piece.
            None => {
                let room = self.decisions.out.bytes.len();
                let out = &mut self.decisions.out.bytes;
                Ok(std::mem::replace(out, Vec::with_capacity(room)))
            }
        }
    }

    /// Whether every answer ended and the merged answer is whole.
    pub(crate) fn is_finished(&self) -> bool {
        self.finished
    }

    /// The bytes that grow with the answer: the set of history digests, `/nodes`' records
    /// held, and an ordered merge's queues (about [`ORDERED_AHEAD_BYTES`] a backend, but a node
    /// the map does not place holds what sorts after it until the backends before its own end;
    /// and an answer joined in order, held whole until it is read whole).
    pub(crate) fn held_bytes(&self) -> usize {
        let nodes = match &self.decisions.rule {
            StreamRule::Node(nodes) => nodes.held_bytes(),
            _ => 0,
        };
        let queued: usize = self
            .inputs
            .iter()
            .map(|input| {
                let joined = input.joined.as_ref().map_or(0, JoinedRecords::held_bytes);
                input.queue.held_bytes() + joined
            })
            .sum();
        self.decisions.seen.capacity() * SEEN_SLOT_BYTES + nodes + queued
    }

    /// Writes an ordered merge's queued records while the first in order is known and decided,
    /// until about [`WRITTEN_AT_ONCE_BYTES`] wait to be taken.
    fn write_ordered(&mut self) {
        while self.decisions.out.bytes.len() < WRITTEN_AT_ONCE_BYTES && self.broken.is_none() {
            if let Some(later) = self.later_due() {
                self.merge_later(later);
                continue;
            }
            let Some(index) = self.next_ordered() else {
                return;
            };
            let Some(verdict) = self.verdict(index) else {
                return;
            };
            let input = &mut self.inputs[index];
            let Some(record) = input.queue.pop_front() else {
                return;
            };
            let text = match verdict {
                HeadFate::Drop => None,
                HeadFate::Write => Some(input.queue.text(&record)),
                HeadFate::WriteAs(ref text) => Some(text.as_str()),
            };
            // A history record is written when no copy of it was.
            if let Some(text) =
                text.filter(|_| record.digest.is_none_or(|d| self.decisions.seen.insert(d)))
            {
                self.decisions.out.write(text);
            }
            // A joined answer's next records are read once the last read are written.
            let order = self.decisions.order.as_ref();
            if let Some(Err(why)) = order.map(|order| input.read_joined(order)) {
                input.ended = true;
                self.broken = Some(MergeBroken::Joined(format!("its merged records: {why}")));
                return;
            }
            if input.ended && input.queue.is_empty() {
                // Nothing more comes: what its queue grew to goes (a joined answer's, megabytes).
                input.queue = RecordQueue::default();
            }
        }
    }

    /// What becomes of `input`'s first queued record, which sorts first: `None` while a node
    /// the map does not place (or, for `/nodes`, a split node) waits for other answers.
    fn verdict(&mut self, index: usize) -> Option<HeadFate> {
        let head = self.inputs[index].queue.front()?;
        let Some(certname) = &head.unplaced else {
            return Some(HeadFate::Write);
        };
        if let StreamRule::Node(nodes) = &mut self.decisions.rule {
            let ended: Vec<bool> = self.inputs.iter().map(|i| i.ended).collect();
            let from = (index, &self.decisions.asked[..], &ended[..]);
            let text = self.inputs[index].queue.text(head);
            return Some(match nodes.decide(certname, from, text)? {
                Some(text) => HeadFate::WriteAs(text),
                None => HeadFate::Drop,
            });
        }
        // Decided once no earlier input can still return the node.
        if !self.inputs[..index].iter().all(|i| i.ended) {
            return None;
        }
        Some(match self.decisions.claimed.get(certname) == Some(&index) {
            true => HeadFate::Write,
            false => HeadFate::Drop,
        })
    }

    /// The input whose queued record sorts first, when it is known: every input still answering
    /// has one queued (ties to the earlier input). A joined answer merged later
    /// ([`RecordStream::then_merge_later`]) is not among them: it is merged first when due
    /// ([`RecordStream::later_due`]).
    fn next_ordered(&self) -> Option<usize> {
        let (index, head) = self.least_head()??;
        let input = &self.inputs[index];
        if head.synthetic && !input.ended && input.queue.iter().skip(1).all(|q| q.synthetic) {
            // A record of its node still to be read may sort with it, and goes first.
            return None;
        }
        Some(index)
    }

    /// The queued record that sorts first, and its input, of the inputs that are not joined
    /// answers merged later: `None` while an input still answering has none queued (what it
    /// reads next may sort first), `Some(None)` when every one has ended and is written.
    fn least_head(&self) -> Option<Option<(usize, &Queued)>> {
        let order = self.decisions.order.as_ref()?;
        let mut least: Option<(usize, &Queued)> = None;
        for (index, input) in self.inputs.iter().enumerate() {
            if input.later.is_some() {
                continue;
            }
            let Some(head) = input.queue.front() else {
                if input.ended {
                    continue;
                }
                return None;
            };
            let before = least.is_none_or(|(_, best)| {
                sort::compare(&head.key, &best.key, order) == Ordering::Less
            });
            if before {
                least = Some((index, head));
            }
        }
        Some(least)
    }

    /// The joined answer merged later that is due now: the first records written have been
    /// taken (the first byte has left: what the merge needs is let go of as soon as it can be,
    /// rather than held while half the answer streams), or nothing left to write sorts before
    /// the records it holds (they sort after whatever ties with their prefix only once merged).
    fn later_due(&self) -> Option<usize> {
        let order = self.decisions.order.as_ref()?;
        let first = self.inputs.iter().position(|input| input.later.is_some())?;
        let out = &self.decisions.out;
        if out.written > 0 && out.bytes.is_empty() {
            return Some(first);
        }
        let least = self.least_head()?;
        self.inputs.iter().position(|input| {
            input.later.as_ref().is_some_and(|later| {
                !least.is_some_and(|(_, head)| later.sorts_after(&head.key, order))
            })
        })
    }

    /// Decides the waiting records of each input every input before which has ended, in
    /// configured order: the first input to return an unplaced node keeps it.
    fn decide_waiting(&mut self) {
        let waiting = std::mem::take(&mut self.decisions.waiting);
        let (mut ready, still): (Vec<Waiting>, Vec<Waiting>) = waiting
            .into_iter()
            .partition(|entry| self.inputs[..entry.input].iter().all(|i| i.ended));
        // A stable sort: each input's records stay in the order they came.
        ready.sort_by_key(|entry| entry.input);
        for entry in ready {
            if self.decisions.keep(entry.input, &entry.certname, true) == Keep::Yes {
                let node = (entry.certname.as_str(), entry.environment.as_deref());
                self.decisions
                    .write_kept(entry.input, node, (&entry.text, true));
            }
        }
        self.decisions.waiting = still;
    }
}

/// A streamed merge as the exchange hands it to the driver ([`crate::Exchange::take_stream`]):
/// the merge, the pieces read before it streamed and not merged yet, and the held upstream
/// bodies still to read into it.
///
/// Send what [`MergeStream::take`] gives; while it gives nothing, merge a piece read before
/// ([`MergeStream::merge_read_ahead`]) while it gives one, else read the bodies in
/// [`MergeStream::bodies`] at once, each while [`MergeStream::wants`] it, handing each piece to
/// [`MergeStream::push`] and each body's end to [`MergeStream::end`]; and again, until
/// [`MergeStream::is_finished`]. An error, or a body that
/// fails or passes the deadline, means the answer cannot be completed: end the client's body so
/// that it does not parse (docs/merging.md, "Streamed merges").
#[derive(Debug)]
pub struct MergeStream {
    merge: RecordStream,
    bodies: Vec<(usize, UpstreamId)>,
    /// Pieces read before the merge streamed, each with its input, in the order they came.
    read_ahead: VecDeque<(usize, Bytes)>,
}

impl MergeStream {
    pub(crate) fn new(
        merge: RecordStream,
        bodies: Vec<(usize, UpstreamId)>,
        read_ahead: Vec<(usize, Bytes)>,
    ) -> MergeStream {
        MergeStream {
            merge,
            bodies,
            read_ahead: read_ahead.into(),
        }
    }

    /// Merges the next piece read before the merge streamed that the merge wants now: `None`
    /// when there is none (then read the bodies it wants; call again after each).
    pub fn merge_read_ahead(&mut self) -> Option<Result<(), MergeBroken>> {
        // Each backend's pieces in their order, and only a backend the merge wants: an ordered
        // merge given one backend's megabytes before the other's would queue them all (each
        // record copied with its sort key) where reading sockets it holds about
        // ORDERED_AHEAD_BYTES per backend. Some backend is always wanted, so this never stalls.
        let next = self
            .read_ahead
            .iter()
            .position(|(input, _)| self.merge.wants(*input))?;
        let (input, piece) = self.read_ahead.remove(next)?;
        Some(self.merge.push(input, &piece))
    }

    /// The held bodies still to read, each with the input its pieces go to.
    pub fn bodies(&self) -> &[(usize, UpstreamId)] {
        &self.bodies
    }

    /// Whether to read `input`'s body now: while it is `false`, leave that body unread (the
    /// merge holds enough of it, or pieces of it read before the merge streamed wait for
    /// [`MergeStream::merge_read_ahead`]) and read the others.
    pub fn wants(&self, input: usize) -> bool {
        self.merge.wants(input) && !self.read_ahead.iter().any(|(i, _)| *i == input)
    }

    /// The next piece of `input`'s body.
    pub fn push(&mut self, input: usize, piece: &[u8]) -> Result<(), MergeBroken> {
        self.merge.push(input, piece)
    }

    /// The end of `input`'s body.
    pub fn end(&mut self, input: usize) -> Result<(), MergeBroken> {
        self.merge.end(input)
    }

    /// The bytes of the answer written since the last call, or (when none were) what it can
    /// write now, a bounded piece of an ordered answer at a time; empty when nothing can be
    /// written until more is read. An error when an answer joined with it could not be merged
    /// as the stream reached it: the answer cannot be completed.
    pub fn take(&mut self) -> Result<Bytes, MergeBroken> {
        self.merge.take().map(Bytes::from)
    }

    /// Whether the answer is whole: every body ended and the array closed.
    pub fn is_finished(&self) -> bool {
        self.merge.is_finished()
    }

    /// The bytes the merge holds that grow with the answer rather than with a piece: the
    /// digests that tell a history record's copies (20–40 bytes a record written, as the set
    /// doubles), `/nodes`' records that wait, an ordered merge's queued records. Count them in
    /// the request's memory budget as they grow; past it the answer cannot be completed.
    pub fn held_bytes(&self) -> usize {
        self.merge.held_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::{begins_as_records, ArrayReader, Writer};
    use crate::records::{entry_text, with_entry, with_key};

    #[test]
    fn a_body_begins_as_records_when_its_first_bytes_read_as_them() {
        let records = format!("[{}{{}}]", r#"{"certname":"n1"},"#.repeat(10));
        assert!(begins_as_records(records.as_bytes(), 64));
        assert!(begins_as_records(records.as_bytes(), 1 << 20), "whole");
        assert!(begins_as_records(b" [ ] ", 64), "an empty array, whole");
        // Broken past the bytes read: not found here (the merge finds it).
        let late = format!("{}1]", &records[..records.len() - 1]);
        assert!(begins_as_records(late.as_bytes(), 64));
        assert!(!begins_as_records(late.as_bytes(), 1 << 20));
        // Broken within them, cut short within them, or not an array of records.
        let early = records.replacen(':', " ", 1);
        assert!(!begins_as_records(early.as_bytes(), 64));
        assert!(
            !begins_as_records(br#"[{"certname":"n1"},"#, 64),
            "cut short"
        );
        assert!(!begins_as_records(b"[1,2]", 64));
        assert!(!begins_as_records(br#"{"records":[]}"#, 64));
        // A character cut by the last byte read is no error.
        let accented = r#"[{"certname":"né"}]"#;
        let cut = accented.find('é').expect("é") + 1;
        assert!(begins_as_records(accented.as_bytes(), cut));
    }

    #[test]
    fn an_entry_appended_as_it_is_written_is_the_record_with_the_key() {
        let entry = entry_text("pdbmux_source", "pdb-\"a");
        let records = [r#"{"certname":"a"}"#, "{}", " { \"n\" : [1,{}] } \n", "{ }"];
        let mut appended = Writer::default();
        let mut built = Writer::default();
        for record in records {
            appended.write_parts(&with_entry(record, &entry));
            built.write(&with_key(record, "pdbmux_source", "pdb-\"a"));
        }
        appended.close();
        built.close();
        assert_eq!(
            String::from_utf8(appended.bytes).expect("utf-8"),
            String::from_utf8(built.bytes).expect("utf-8")
        );
    }

    /// Each record's text and certname as `reader` hands them on from `pieces`.
    fn read(reader: &mut ArrayReader, pieces: &[&[u8]]) -> Result<Vec<(String, String)>, String> {
        let mut seen = Vec::new();
        for piece in pieces {
            reader.push(piece, &["certname"], |text, fields| {
                let certname = fields[0].map_or("", |f| f.get());
                seen.push((text.to_owned(), certname.to_owned()));
            })?;
        }
        Ok(seen)
    }

    #[test]
    fn a_character_cut_by_a_piece_waits_for_the_next_and_a_body_not_utf8_is_refused() {
        let body = r#"[{"certname":"wéb1","v":"日本"},{"certname":"x"}]"#;
        let expected = vec![
            (
                r#"{"certname":"wéb1","v":"日本"}"#.to_owned(),
                r#""wéb1""#.to_owned(),
            ),
            (r#"{"certname":"x"}"#.to_owned(), r#""x""#.to_owned()),
        ];
        let bytes = body.as_bytes();
        for cut in 0..=bytes.len() {
            let mut reader = ArrayReader::new();
            let seen = read(&mut reader, &[&bytes[..cut], &bytes[cut..]]).expect("UTF-8");
            assert_eq!(seen, expected, "cut at byte {cut}");
            assert!(reader.is_closed(), "cut at byte {cut}");
        }
        // Byte by byte: a three-byte character arrives in three pieces.
        let mut reader = ArrayReader::new();
        let pieces: Vec<&[u8]> = bytes.chunks(1).collect();
        assert_eq!(read(&mut reader, &pieces).expect("UTF-8"), expected);

        let mut reader = ArrayReader::new();
        let error = read(&mut reader, &[b"[{\"certname\":\"w\xffb\"}]"]).expect_err("not UTF-8");
        assert!(error.contains("not UTF-8"), "{error}");
        // A body that ends inside a character is not whole.
        let mut reader = ArrayReader::new();
        read(&mut reader, &[&"[]é".as_bytes()[..3]]).expect("so far UTF-8");
        assert!(!reader.is_closed());
    }
}
