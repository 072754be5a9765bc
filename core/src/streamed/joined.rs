//! The records of an answer an ordered stream is joined with (`core/src/concat.rs`): merged
//! already ([`super::RecordStream::then_merge`]), or merged once the stream's first records
//! have left ([`JoinedLater`]); either read a piece at a time as the stream writes them
//! ([`JoinedRecords`]).

use std::cmp::Ordering;
use std::fmt;

use bytes::Bytes;

use super::queue::{Queued, RecordQueue, Span};
use super::{sort_key, ArrayReader, MergeBroken};
use crate::sort::{self, OrderBy, SortKey};

/// How much of a joined answer [`JoinedRecords::read_on`] reads at once.
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
    /// alone, [`SortKey::leading`]), merged by `merge` once the stream's first records were
    /// taken, or when it reaches them.
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

/// The records of an answer joined in order, read a piece at a time as the merge writes them:
/// the answer is held (pdbmux wrote it, one record a node), and its records are queued with their
/// sort keys a piece at a time rather than all at once (a queued record holds its key beside its
/// text).
#[derive(Debug)]
pub(super) struct JoinedRecords {
    body: Bytes,
    /// How much of `body` has been read.
    read: usize,
}

impl JoinedRecords {
    /// `body`, a JSON array sorted by the merge's order, none of it read yet.
    pub(super) fn new(body: Bytes) -> JoinedRecords {
        JoinedRecords { body, read: 0 }
    }

    /// Reads its next piece with `reader` into `queue`, each record with its sort key under
    /// `order`: `Ok(false)` once the whole body was read (its reader closed), an error when it
    /// is not an array of records.
    pub(super) fn read_on(
        &mut self,
        reader: &mut ArrayReader,
        queue: &mut RecordQueue,
        order: &OrderBy,
    ) -> Result<bool, String> {
        let Some(piece) = self.body.get(self.read..) else {
            return Ok(false);
        };
        if piece.is_empty() {
            return match reader.is_closed() {
                true => Ok(false),
                false => Err("the body ended inside the array".to_owned()),
            };
        }
        let piece = &piece[..piece.len().min(JOINED_PIECE_BYTES)];
        let names: Vec<&str> = order.fields.iter().map(|f| f.field.as_str()).collect();
        reader.push(piece, &names, |text, fields| {
            let queued = Queued {
                key: sort_key(order, &names, fields),
                unplaced: None,
                synthetic: false,
                digest: None,
                span: Span::default(),
            };
            queue.push_back(&[text], queued);
        })?;
        self.read += piece.len();
        Ok(true)
    }

    /// The bytes it holds: the whole answer, until it is read whole and let go.
    pub(super) fn held_bytes(&self) -> usize {
        self.body.len()
    }
}
