//! The records of an answer an ordered stream is joined with (`core/src/concat.rs`): merged
//! already and read whole ([`super::RecordStream::then_merge`]), or merged only when the stream
//! reaches the records it holds ([`JoinedLater`]).

use std::cmp::Ordering;
use std::fmt;

use bytes::Bytes;

use super::queue::{Queued, RecordQueue, Span};
use super::{sort_key, ArrayReader, MergeBroken};
use crate::sort::{self, OrderBy, SortKey};

/// How much of a joined answer [`read_sorted`] reads at once.
const JOINED_PIECE_BYTES: usize = 64 * 1024;

/// Merges a joined answer: its records, a JSON array sorted by the stream's order, or why it
/// could not be merged.
type MergeJoined = Box<dyn FnOnce() -> Result<Bytes, MergeBroken> + Send + Sync>;

/// An answer an ordered stream is joined with whose merge waits until the stream's first records
/// were taken, or the stream reaches its records: every record of it sorts with one key prefix
/// (its leading `order_by` fields hold the same values in each: the provenance records'
/// `name`), so the stream's records that sort before that prefix can be written while it is not
/// merged (docs/merging.md, "Streamed merges").
pub(crate) struct JoinedLater {
    prefix: SortKey,
    merge: MergeJoined,
}

impl JoinedLater {
    /// An answer whose records all sort with `prefix` (a key of the order's leading fields
    /// alone, [`SortKey::leading`]), merged by `merge` when the stream reaches them.
    pub(crate) fn new(
        prefix: SortKey,
        merge: impl FnOnce() -> Result<Bytes, MergeBroken> + Send + Sync + 'static,
    ) -> JoinedLater {
        JoinedLater {
            prefix,
            merge: Box::new(merge),
        }
    }

    /// Whether every record of this answer sorts after `key` (a whole record's key under
    /// `order`): what ties with the prefix may sort either side, and waits for the merge.
    pub(super) fn sorts_after(&self, key: &SortKey, order: &OrderBy) -> bool {
        sort::compare(key, &self.prefix, order) == Ordering::Less
    }

    /// Merges it now.
    pub(super) fn merge(self) -> Result<Bytes, MergeBroken> {
        (self.merge)()
    }
}

impl fmt::Debug for JoinedLater {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JoinedLater")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

/// The records of `records` (a JSON array sorted by `order`) queued with their sort keys, read
/// as a backend's answer is (each record once, for its order's fields); `None` when it is not
/// an array of records.
pub(super) fn read_sorted(records: &[u8], order: &OrderBy) -> Option<RecordQueue> {
    let names: Vec<&str> = order.fields.iter().map(|f| f.field.as_str()).collect();
    let mut reader = ArrayReader::new();
    let mut queue = RecordQueue::default();
    // In pieces, so that the reader holds a piece, not a copy of the whole answer; and the queue
    // sized once, by the first piece's records, rather than by doubling (which holds the old and
    // the new room at once, megabytes at 100,000 nodes).
    for (index, piece) in records.chunks(JOINED_PIECE_BYTES).enumerate() {
        let read = reader.push(piece, &names, |text, fields| {
            let queued = Queued {
                key: sort_key(order, &names, fields),
                unplaced: None,
                synthetic: false,
                digest: None,
                span: Span::default(),
            };
            queue.push_back(&[text], queued);
        });
        read.ok()?;
        // The records of a joined answer (a provenance part's) are alike in size; were the first
        // piece's much smaller than the rest, the room reserved and not used is given back
        // below, never written.
        if index == 0 && !queue.is_empty() {
            let each = queue.queued_bytes() / queue.len() + 1;
            let estimate = records.len() / each;
            queue.reserve_exact(estimate + estimate / 8, records.len());
        }
    }
    if !reader.is_closed() {
        return None;
    }
    // Held until written, and nothing more is queued: no room to grow into.
    queue.shrink_to_fit();
    Some(queue)
}
