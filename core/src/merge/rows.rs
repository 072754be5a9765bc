//! Rows of a record merge: a raw record (borrowed from an upstream body, or made by pdbmux), the
//! backend it came from, and its sort key, extracted once.

use std::cmp::Ordering;

use serde_json::value::RawValue;

use crate::records::Fields;
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
    /// A row, with its sort key when the request orders.
    pub(crate) fn new(
        backend: usize,
        raw: Raw<'a>,
        fields: Option<&Fields<'_>>,
        order: Option<&OrderBy>,
    ) -> Row<'a> {
        let key = order.map(|order| match fields {
            Some(fields) => sort::sort_key(order, |name| fields.raw(name)),
            None => sort::sort_key(order, |_| None),
        });
        Row { backend, raw, key }
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
        let start = usize::try_from(self.offset).unwrap_or(usize::MAX);
        let take = self.limit.map_or(usize::MAX, |limit| {
            usize::try_from(limit).unwrap_or(usize::MAX)
        });
        items.into_iter().skip(start).take(take).collect()
    }
}
