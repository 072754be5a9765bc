//! Rows of a record merge: a raw record (borrowed from an upstream body, or made by pdbmux), the
//! backend it came from, and its sort key, extracted once.

use std::cmp::Ordering;

use serde_json::value::RawValue;

use crate::records::write_array;
use crate::sort::{self, OrderBy, SortKey};

/// A record's raw JSON: borrowed from a backend's body, or built by pdbmux (a synthetic fact, a
/// node with its `pdbmux_source` key).
#[derive(Debug)]
pub(crate) enum Raw<'a> {
    Borrowed(&'a str),
    Owned(Box<RawValue>),
}

impl Raw<'_> {
    pub(crate) fn get(&self) -> &str {
        match self {
            Raw::Borrowed(raw) => raw,
            Raw::Owned(raw) => raw.get(),
        }
    }
}

/// One record in a merge.
#[derive(Debug)]
pub(crate) struct Row<'a> {
    /// Index of the backend (configured order) that supplied it.
    pub(crate) backend: usize,
    pub(crate) raw: Raw<'a>,
    pub(crate) key: Option<SortKey>,
}

impl<'a> Row<'a> {
    /// A row, with its sort key when the request orders (`field` gives a field's raw value).
    pub(crate) fn new<'f>(
        backend: usize,
        raw: Raw<'a>,
        order: Option<&OrderBy>,
        field: impl Fn(&str) -> Option<&'f RawValue>,
    ) -> Row<'a> {
        let key = order.map(|order| sort::sort_key(order, field));
        Row { backend, raw, key }
    }
}

/// A merge's kept rows, in merged order. A request that neither orders nor pages is answered in
/// that order, so its rows are written straight into the body; otherwise they are kept to be
/// sorted and cut.
pub(crate) enum Collected<'a> {
    /// The body so far (an open JSON array) and how many records it holds.
    Written { body: Vec<u8>, count: usize },
    /// Rows to sort and window.
    Rows(Vec<Row<'a>>),
}

impl<'a> Collected<'a> {
    /// An empty collection for `rows` rows of about `bytes` bytes in all.
    pub(crate) fn new(order: Option<&OrderBy>, window: Window, rows: usize, bytes: usize) -> Self {
        if order.is_none() && !window.is_paged() {
            let mut body = Vec::with_capacity(bytes + rows + 2);
            body.push(b'[');
            Collected::Written { body, count: 0 }
        } else {
            Collected::Rows(Vec::with_capacity(rows))
        }
    }

    /// Adds the next row.
    pub(crate) fn push(&mut self, row: Row<'a>) {
        match self {
            Collected::Written { body, count } => {
                if *count > 0 {
                    body.push(b',');
                }
                body.extend_from_slice(row.raw.get().as_bytes());
                *count += 1;
            }
            Collected::Rows(rows) => rows.push(row),
        }
    }

    /// The answer's body and the merged count (before the window).
    pub(crate) fn finish(self, order: Option<&OrderBy>, window: Window) -> (Vec<u8>, usize) {
        match self {
            Collected::Written { mut body, count } => {
                body.push(b']');
                (body, count)
            }
            Collected::Rows(mut rows) => {
                let merged = rows.len();
                sort_rows(&mut rows, order);
                let rows = window.apply(rows);
                let capacity = rows.iter().map(|r| r.raw.get().len() + 1).sum();
                (
                    write_array(rows.iter().map(|r| r.raw.get()), capacity),
                    merged,
                )
            }
        }
    }
}

/// Re-sorts merged rows by the request's order (stable: ties keep the merged order).
pub(crate) fn sort_rows(rows: &mut [Row<'_>], order: Option<&OrderBy>) {
    if let Some(order) = order {
        rows.sort_by(|a, b| match (&a.key, &b.key) {
            (Some(a), Some(b)) => sort::compare(a, b, order),
            _ => Ordering::Equal,
        });
    }
}

/// The request's window over the merged, sorted set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Window {
    pub(crate) offset: u64,
    pub(crate) limit: Option<u64>,
}

impl Window {
    /// Whether the request pages at all.
    pub(crate) fn is_paged(&self) -> bool {
        self.offset > 0 || self.limit.is_some()
    }

    /// How many records each backend is asked for: offset + limit, never an offset.
    pub(crate) fn upstream_limit(&self) -> Option<u64> {
        self.limit.map(|limit| limit.saturating_add(self.offset))
    }

    /// Cuts the window out of `items`.
    pub(crate) fn apply<T>(&self, items: Vec<T>) -> Vec<T> {
        if !self.is_paged() {
            return items;
        }
        let start = usize::try_from(self.offset).unwrap_or(usize::MAX);
        let take = self.limit.map_or(usize::MAX, |limit| {
            usize::try_from(limit).unwrap_or(usize::MAX)
        });
        items.into_iter().skip(start).take(take).collect()
    }
}
