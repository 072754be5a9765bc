//! Rows of a record merge: a raw record (borrowed from an upstream body, or made by pdbmux), the
//! backend it came from, and its sort key, extracted once; and the window cut from the merged,
//! sorted rows, with the check that decides whether the first answers could fill it
//! (docs/merging.md, "Paging").

use std::cmp::Ordering;

use serde_json::value::RawValue;

use crate::records::write_array;
use crate::sort::{self, OrderBy, SortKey};

/// A record's raw JSON: borrowed from a backend's body, or built by pdbmux (a synthetic fact, a
/// node with its `pdbmux_source` key).
#[derive(Debug)]
pub(crate) enum Raw<'a> {
    Borrowed(&'a str),
    /// A record pdbmux wrote (a composed, synthetic or projected one): valid JSON as built.
    Owned(String),
}

impl Raw<'_> {
    pub(crate) fn get(&self) -> &str {
        match self {
            Raw::Borrowed(raw) => raw,
            Raw::Owned(raw) => raw,
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

/// One backend's answer to a paged request as the merge saw it: how many records it returned
/// (the page is full when that is the limit it was asked for), how many of them the merge kept,
/// and where its page ended.
#[derive(Debug, Clone)]
pub(crate) struct Page {
    pub(crate) backend: usize,
    /// The limit this backend was asked for; `None` when it was not limited.
    pub(crate) limit: Option<u64>,
    pub(crate) returned: usize,
    pub(crate) kept: usize,
    /// The sort key of the last record it returned (kept or not).
    pub(crate) last_key: Option<SortKey>,
}

impl Page {
    /// A page with nothing read yet.
    pub(crate) fn new(backend: usize, limit: Option<u64>) -> Page {
        Page {
            backend,
            limit,
            returned: 0,
            kept: 0,
            last_key: None,
        }
    }

    /// Whether the backend may hold more records than it returned.
    fn is_full(&self) -> bool {
        self.limit
            .is_some_and(|limit| self.returned as u64 >= limit)
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

/// The window of a paged merge cannot be cut from these answers: the backends named lost
/// records of their page to other owners, so records past their page may belong in the window.
/// Ask them again with ownership pushed into the query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Unfilled(pub(crate) Vec<usize>);

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

    /// The answer's body and the merged count (before the window); or, for a paged merge whose
    /// `pages` could not fill the window, the backends to ask again.
    pub(crate) fn finish(
        self,
        order: Option<&OrderBy>,
        window: Window,
        pages: &[Page],
    ) -> Result<(Vec<u8>, usize), Unfilled> {
        match self {
            Collected::Written { mut body, count } => {
                body.push(b']');
                Ok((body, count))
            }
            Collected::Rows(mut rows) => {
                sort_rows(&mut rows, order);
                check_filled(&rows, order, window, pages)?;
                let merged = rows.len();
                let rows = window.apply(rows);
                let capacity = rows.iter().map(|r| r.raw.get().len() + 1).sum();
                Ok((
                    write_array(rows.iter().map(|r| r.raw.get()), capacity),
                    merged,
                ))
            }
        }
    }
}

/// Re-sorts merged rows by the request's order (stable: ties keep the merged order, which is
/// configured backend order, then each backend's own order).
pub(crate) fn sort_rows(rows: &mut [Row<'_>], order: Option<&OrderBy>) {
    if let Some(order) = order {
        rows.sort_by(|a, b| compare_rows(a, b, order));
    }
}

fn compare_rows(a: &Row<'_>, b: &Row<'_>, order: &OrderBy) -> Ordering {
    compare_keys(a.key.as_ref(), b.key.as_ref(), order)
}

/// How two merged records' sort keys compare under `order`; a record without one ties.
pub(crate) fn compare_keys(a: Option<&SortKey>, b: Option<&SortKey>, order: &OrderBy) -> Ordering {
    match (a, b) {
        (Some(x), Some(y)) => sort::compare(x, y, order),
        _ => Ordering::Equal,
    }
}

/// Whether the sorted `rows` hold the whole window. A backend whose page was full and which kept
/// fewer records than the window reaches (`offset + limit`) may hold further records of its
/// own that sort inside the window; every row up to the end of its page (in merged order: by
/// key, then backend) is known. The window is filled when that known prefix, for the earliest
/// such page, reaches the window's end. A full page whose kept records reach the window's end
/// cannot hide one (its own kept rows already fill the window before anything it did not send).
pub(crate) fn check_filled(
    rows: &[Row<'_>],
    order: Option<&OrderBy>,
    window: Window,
    pages: &[Page],
) -> Result<(), Unfilled> {
    let Some(reach) = window.upstream_limit() else {
        return Ok(());
    };
    let risky: Vec<&Page> = pages
        .iter()
        .filter(|page| page.is_full() && (page.kept as u64) < reach)
        .collect();
    if risky.is_empty() {
        return Ok(());
    }
    // The earliest end of a risky page, in merged order.
    let before_end = |row: &Row<'_>, page: &Page| -> bool {
        let by_key = match (order, &row.key, &page.last_key) {
            (Some(order), Some(key), Some(last)) => sort::compare(key, last, order),
            _ => Ordering::Equal,
        };
        by_key.then(row.backend.cmp(&page.backend)) != Ordering::Greater
    };
    let known = rows
        .iter()
        .take_while(|row| risky.iter().all(|page| before_end(row, page)))
        .count();
    if known as u64 >= reach {
        Ok(())
    } else {
        Err(Unfilled(risky.iter().map(|page| page.backend).collect()))
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::entity::ColumnKind;
    use crate::sort::{Direction, OrderField};

    fn order() -> OrderBy {
        OrderBy {
            fields: vec![OrderField {
                field: "n".into(),
                direction: Direction::Ascending,
                kind: ColumnKind::Number,
            }],
        }
    }

    fn key(n: u64) -> SortKey {
        let value = RawValue::from_string(n.to_string()).expect("json");
        sort::sort_key(&order(), |_| Some(&*value))
    }

    fn row(backend: usize, n: u64) -> Row<'static> {
        Row {
            backend,
            raw: Raw::Owned(format!("{{\"n\":{n}}}")),
            key: Some(key(n)),
        }
    }

    fn page(backend: usize, limit: u64, returned: usize, kept: usize, last: u64) -> Page {
        Page {
            backend,
            limit: Some(limit),
            returned,
            kept,
            last_key: Some(key(last)),
        }
    }

    #[test]
    fn a_page_that_lost_records_fills_the_window_only_up_to_its_end() {
        let window = Window {
            offset: 0,
            limit: Some(3),
        };
        // Backend 0 returned 1, 2, 3, 4 (asked for 4), kept 1 and 4: it may hold 5, 6, ...
        // Backend 1 returned 2 and 3 (everything it has).
        let rows = || vec![row(0, 1), row(1, 2), row(1, 3), row(0, 4)];
        let pages = [page(0, 4, 4, 2, 4), page(1, 4, 2, 2, 3)];
        let collected = Collected::Rows(rows());
        assert!(collected.finish(Some(&order()), window, &pages).is_ok());
        // The same, but backend 0's page ended at 2: 3 and 4 are not known to come next.
        let pages = [page(0, 2, 2, 1, 2), page(1, 4, 2, 2, 3)];
        let collected = Collected::Rows(vec![row(0, 1), row(1, 2), row(1, 3)]);
        assert_eq!(
            collected.finish(Some(&order()), window, &pages).err(),
            Some(Unfilled(vec![0]))
        );
        // A page that kept enough records cannot hide one; a page that ended after the window
        // did not either.
        let pages = [page(0, 3, 3, 3, 9), page(1, 5, 5, 2, 9)];
        let collected = Collected::Rows(vec![row(0, 1), row(1, 2), row(0, 3), row(0, 9)]);
        assert!(collected.finish(Some(&order()), window, &pages).is_ok());
        // Unordered: rows come backend by backend; backend 0's full page kept one row only.
        let pages = [page(0, 2, 2, 1, 0), page(1, 3, 1, 1, 0)];
        let collected = Collected::Rows(vec![row(0, 1), row(1, 2)]);
        assert_eq!(
            collected.finish(None, window, &pages).err(),
            Some(Unfilled(vec![0]))
        );
    }
}
