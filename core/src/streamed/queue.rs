//! An ordered merge's records read from one backend and not yet written: their texts kept end
//! to end in one buffer, so that queuing a record costs a copy and no allocation of its own (an
//! ordered merge queues every record it keeps; an allocation each cost it about 6% of its CPU,
//! bench/README.md, figure 8).

use std::collections::VecDeque;

use crate::entity::Digest;
use crate::sort::SortKey;

/// Below this many bytes of texts no longer queued, the buffer is not compacted (a compaction
/// copies what is still queued).
const COMPACT_ABOVE_BYTES: usize = 64 * 1024;

/// What an ordered merge knows of a record it queued, beside its text.
#[derive(Debug)]
pub(super) struct Queued {
    pub(super) key: SortKey,
    /// Its node, when the map does not place it (decided once every earlier input ended), and
    /// for `/nodes` when its record waits for other answers (`nodes::Queue::Pending`).
    pub(super) unplaced: Option<String>,
    /// A node's synthetic provenance record: it follows the node's records that sort with it,
    /// so it waits until its input has read a record sorting after it, or ended.
    pub(super) synthetic: bool,
    /// A history record's identity digest: it is written only if no copy was.
    pub(super) digest: Option<Digest>,
    /// Where its text is in the queue's buffer: set by [`RecordQueue::insert`] (give it
    /// `Span::default()`).
    pub(super) span: Span,
}

/// Where a queued record's text is in its queue's buffer.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Span {
    start: usize,
    end: usize,
}

/// Use [`RecordQueue::insert`] to queue a record in its place, [`RecordQueue::front`] and
/// [`RecordQueue::text`] to look at the first, [`RecordQueue::pop_front`] to take it.
#[derive(Debug, Default)]
pub(super) struct RecordQueue {
    records: VecDeque<Queued>,
    texts: String,
    /// The bytes of the texts of `records`.
    queued: usize,
}

impl RecordQueue {
    /// Queues `record`, whose text is `text` (its parts, end to end), at position `at` (0 is
    /// next to be written).
    pub(super) fn insert(&mut self, at: usize, text: &[&str], mut record: Queued) {
        if self.records.is_empty() {
            self.texts.clear();
        } else if self.texts.len() - self.queued > self.queued.max(COMPACT_ABOVE_BYTES) {
            self.compact();
        }
        let start = self.texts.len();
        for part in text {
            self.texts.push_str(part);
        }
        self.queued += self.texts.len() - start;
        record.span = Span {
            start,
            end: self.texts.len(),
        };
        self.records.insert(at.min(self.records.len()), record);
    }

    /// Queues `record`, whose text is `text` (its parts, end to end), last.
    pub(super) fn push_back(&mut self, text: &[&str], record: Queued) {
        self.insert(self.records.len(), text, record);
    }

    /// The record to be written next.
    pub(super) fn front(&self) -> Option<&Queued> {
        self.records.front()
    }

    /// The record at `index` (0 is the next to be written).
    pub(super) fn get(&self, index: usize) -> Option<&Queued> {
        self.records.get(index)
    }

    /// The records in the order they will be written.
    pub(super) fn iter(&self) -> impl Iterator<Item = &Queued> {
        self.records.iter()
    }

    /// How many records are queued.
    pub(super) fn len(&self) -> usize {
        self.records.len()
    }

    /// Whether no record is queued.
    pub(super) fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// The text of `record`, one of this queue's, also just after it was taken: the buffer
    /// changes only when a record is queued.
    pub(super) fn text(&self, record: &Queued) -> &str {
        let Span { start, end } = record.span;
        self.texts.get(start..end).unwrap_or_default()
    }

    /// Takes the record to be written next; read its text with [`RecordQueue::text`] before
    /// queuing another.
    pub(super) fn pop_front(&mut self) -> Option<Queued> {
        let record = self.records.pop_front()?;
        self.queued -= record.span.end - record.span.start;
        Some(record)
    }

    /// The bytes of the records queued.
    pub(super) fn queued_bytes(&self) -> usize {
        self.queued
    }

    /// The bytes the queue holds: its buffer, the texts of records no longer queued among them
    /// (no more than those still queued, or [`COMPACT_ABOVE_BYTES`]), and what it knows of each
    /// record queued (its sort key inline: a key's text past its inline room is not counted);
    /// none once it is empty (its buffer is then reused from its start).
    pub(super) fn held_bytes(&self) -> usize {
        match self.records.is_empty() {
            true => 0,
            false => self.texts.len() + self.records.len() * std::mem::size_of::<Queued>(),
        }
    }

    /// Moves the texts still queued to the start of a new buffer.
    fn compact(&mut self) {
        let mut texts = String::with_capacity(self.queued.max(COMPACT_ABOVE_BYTES));
        for record in self.records.iter_mut() {
            let Span { start, end } = record.span;
            let begin = texts.len();
            texts.push_str(self.texts.get(start..end).unwrap_or_default());
            record.span = Span {
                start: begin,
                end: texts.len(),
            };
        }
        self.texts = texts;
    }
}

#[cfg(test)]
mod tests {
    use super::{Queued, RecordQueue, Span, COMPACT_ABOVE_BYTES};
    use crate::sort::{sort_key, OrderBy};

    #[test]
    fn texts_survive_compaction_and_what_was_written_is_let_go() {
        let order = OrderBy { fields: Vec::new() };
        let known = || Queued {
            key: sort_key(&order, |_| None),
            unplaced: None,
            synthetic: false,
            digest: None,
            span: Span::default(),
        };
        let mut queue = RecordQueue::default();
        let record = |n: usize| format!("{{\"n\":{n},\"pad\":\"{}\"}}", "x".repeat(1000));
        let mut next = 0;
        // Two queued at any time, each written once another is queued: the buffer is compacted
        // as the texts written pile up, and every text read is the one queued.
        for n in 0..1000 {
            queue.push_back(&[&record(n)], known());
            if n > 0 {
                let taken = queue.pop_front().expect("queued");
                assert_eq!(queue.text(&taken), record(next));
                next += 1;
            }
            let known_of = queue.records.len() * std::mem::size_of::<Queued>();
            assert!(
                queue.held_bytes()
                    <= 2 * queue.queued_bytes() + COMPACT_ABOVE_BYTES + 1100 + known_of
            );
        }
        // In its place: first.
        queue.insert(0, &["{\"first\"", ":true}"], known());
        let first = queue.pop_front().expect("queued");
        assert_eq!(queue.text(&first), "{\"first\":true}");
        let last = queue.pop_front().expect("queued");
        assert_eq!(queue.text(&last), record(999));
        assert!(queue.is_empty());
        assert_eq!((queue.queued_bytes(), queue.held_bytes()), (0, 0));
    }
}
