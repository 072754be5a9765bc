//! The page-collecting loop of the record merges that judge each record on its own (the
//! node-owned merge, `owned.rs`, and the unions, `union.rs`): every record of every answer, in
//! configured order then each backend's own, and one [`Page`] per backend for the window check
//! (docs/merging.md, "Paging").

use super::rows::{Collected, Page, Row};
use super::{parse_answers, BackendPage, Merged, RecordPlan};
use crate::ids::BackendId;
use crate::sort::{OrderBy, SortKey};

/// What a merge does with one record of a backend's page.
pub(crate) enum RecordFate<'a> {
    /// Another owner's copy: dropped, and not one its page kept.
    Dropped,
    /// Kept by its page but not served: a copy of a record already served.
    Deduped,
    /// Kept and served as this row.
    Served(Row<'a>),
}

/// Parses every answer with `parse` and merges their records: `fate` says what becomes of each
/// (given the backend that sent it), `last_key` gives the sort key of a backend's last record
/// (kept or not: where its page ended). Use it for a record merge that keeps, dedupes or drops
/// each record by itself; the body is the window of the served rows, sorted, or the backends to
/// ask again when their pages could not fill it.
pub(crate) fn collect_pages<'a, R>(
    plan: &RecordPlan,
    order: Option<&OrderBy>,
    answers: &'a [BackendPage<'a>],
    parse: impl Fn(&'a [u8]) -> Result<Vec<R>, serde_json::Error>,
    last_key: impl Fn(&R) -> Option<SortKey>,
    mut fate: impl FnMut(BackendId, &R) -> RecordFate<'a>,
) -> Merged {
    let (parsed, unusable) = match parse_answers(answers, parse) {
        Ok(parsed) => parsed,
        Err(unusable) => return Merged::nothing(unusable),
    };
    let mut rows = Collected::new(
        order,
        plan.window,
        parsed.iter().map(|(_, records)| records.len()).sum(),
        answers.iter().map(|answer| answer.body.len()).sum(),
    );
    let mut pages = Vec::with_capacity(parsed.len());
    for (answer, records) in &parsed {
        let mut page = Page::new(answer.backend.0, answer.limit);
        page.returned = records.len();
        page.last_key = records.last().and_then(&last_key);
        for record in records {
            match fate(answer.backend, record) {
                RecordFate::Dropped => {}
                RecordFate::Deduped => page.kept += 1,
                RecordFate::Served(row) => {
                    page.kept += 1;
                    rows.push(row);
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
