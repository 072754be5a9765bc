//! `/nodes`: one record per certname, the owner's (the newest holding by producer time: newer
//! report, then newer facts, then newer catalog, then configured order); each merged record
//! gains a `pdbmux_source` key naming it. A node the membership map does not know (it appeared
//! since the last refresh) is deduped from the records themselves by `report_timestamp`, the
//! one producer time a node record carries, then configured order.

use std::collections::HashMap;

use serde_json::value::RawValue;

use super::rows::{check_filled, sort_rows, Page, Raw, Row};
use super::{parse_answers, BackendPage, Merged, RecordPlan};
use crate::ids::BackendId;
use crate::node_record::{compare_reports, composed_sources, stamped, COMPOSED};
use crate::ownership::{Holding, Owning};
use crate::records::{parse_records, with_values, write_array, Fields};
use crate::sort::{sort_key, OrderBy};

/// A kept node record: its row, its report timestamp (raw JSON) for deduping a node the map
/// does not know, and the page it came from.
struct Kept<'a> {
    row: Row<'a>,
    freshness: Option<&'a str>,
    page: usize,
}

pub(crate) fn merge(
    plan: &RecordPlan,
    answers: &[BackendPage<'_>],
    owning: Option<Owning<'_>>,
) -> Merged {
    let (parsed, unusable) = match parse_answers(answers, parse_records) {
        Ok(parsed) => parsed,
        Err(unusable) => return Merged::nothing(unusable),
    };
    let order = plan.order.as_ref();
    // Composed from the rows an unpaged answer holds; a page holds a window of each backend's
    // rows, in which the other kinds' owners' rows may not be (docs/merging.md, "Known limits").
    let composed = owning
        .filter(|_| !plan.window.is_paged())
        .map(|owning| composed_fields(owning, &parsed));
    let mut pages: Vec<Page> = Vec::with_capacity(parsed.len());
    let mut kept: Vec<Option<Kept<'_>>> = Vec::new();
    let mut by_certname: HashMap<std::borrow::Cow<'_, str>, usize> = HashMap::new();
    for (answer, records) in &parsed {
        let backend = answer.backend;
        let page_index = pages.len();
        let mut page = Page::new(backend.0, answer.limit);
        for record in records {
            let fields = Fields::of(record.get());
            let certname = fields.as_ref().and_then(|f| f.str("certname"));
            let stamp = |name: &str| fields.as_ref().and_then(|f| f.raw(name)).map(RawValue::get);
            let freshness = stamp("report_timestamp");
            let row = Row::new(backend.0, Raw::Borrowed(record.get()), order, |name| {
                fields.as_ref().and_then(|f| f.raw(name))
            });
            page.returned += 1;
            page.last_key = row.key.clone();
            let holding = match (&certname, owning) {
                (Some(certname), Some(owning)) => owning.holding(backend, certname),
                _ => Holding::Unknown,
            };
            if holding == Holding::Other {
                continue;
            }
            // A node whose facts or catalog are newest elsewhere: those fields are that
            // backend's, as one PuppetDB composes the row (docs/merging.md, "Who owns a node").
            let patch = certname
                .as_deref()
                .and_then(|c| composed.as_ref()?.get(c))
                .filter(|_| holding == Holding::Own);
            let row = match patch.and_then(|patch| composed_row(backend.0, record, patch, order)) {
                Some(composed) => composed,
                None => row,
            };
            let Some(certname) = certname else {
                kept.push(Some(Kept {
                    row,
                    freshness,
                    page: page_index,
                }));
                page.kept += 1;
                continue;
            };
            match by_certname.get(&certname) {
                Some(&index) => {
                    let fresher = holding == Holding::Own
                        || kept[index]
                            .as_ref()
                            .is_some_and(|earlier| is_fresher(freshness, earlier.freshness));
                    if fresher {
                        if let Some(earlier) = kept[index].take() {
                            pages[earlier.page].kept -= 1;
                        }
                        by_certname.insert(certname, kept.len());
                        kept.push(Some(Kept {
                            row,
                            freshness,
                            page: page_index,
                        }));
                        page.kept += 1;
                    }
                }
                None => {
                    by_certname.insert(certname, kept.len());
                    kept.push(Some(Kept {
                        row,
                        freshness,
                        page: page_index,
                    }));
                    page.kept += 1;
                }
            }
        }
        pages.push(page);
    }
    let mut rows: Vec<Row<'_>> = kept.into_iter().flatten().map(|k| k.row).collect();
    sort_rows(&mut rows, order);
    if let Err(unfilled) = check_filled(&rows, order, plan.window, &pages) {
        return Merged {
            body: Err(unfilled),
            contributed: parsed.len(),
            unusable,
        };
    }
    let merged = rows.len();
    let rows = plan.window.apply(rows);
    let stamp = !plan.is_projection();
    let backends = &plan.config().backends;
    let records: Vec<String> = rows
        .iter()
        .map(|row| match stamp {
            true => stamped(row.raw.get(), backends, BackendId(row.backend)),
            false => row.raw.get().to_owned(),
        })
        .collect();
    let capacity = records.iter().map(String::len).sum::<usize>() + records.len();
    let body = write_array(records.iter().map(String::as_str), capacity);
    Merged {
        body: Ok((body, merged)),
        contributed: parsed.len(),
        unusable,
    }
}

/// Per certname whose facts or catalog are newest in another backend than its node record
/// (a split node): those fields' values in that backend's record, when the answers hold it.
fn composed_fields<'r>(
    owning: Owning<'_>,
    parsed: &[(&BackendPage<'_>, Vec<&'r RawValue>)],
) -> HashMap<String, Vec<(&'static str, &'r RawValue)>> {
    let mut out: HashMap<String, Vec<(&'static str, &'r RawValue)>> = HashMap::new();
    for (answer, records) in parsed {
        for record in records {
            let Some(fields) = Fields::of(record.get()) else {
                continue;
            };
            let Some(certname) = fields.str("certname") else {
                continue;
            };
            let (_, sources) = composed_sources(&owning, &certname);
            for ((_, names), source) in COMPOSED.iter().zip(sources) {
                if source != Some(answer.backend) {
                    continue;
                }
                for name in names {
                    if let Some(value) = fields.raw(name) {
                        out.entry(certname.to_string())
                            .or_default()
                            .push((name, value));
                    }
                }
            }
        }
    }
    out
}

/// `record` with `patch`'s values, as a row sorted by its new values; `None` if it cannot be
/// rebuilt (not an object).
fn composed_row<'a>(
    backend: usize,
    record: &RawValue,
    patch: &[(&str, &RawValue)],
    order: Option<&OrderBy>,
) -> Option<Row<'a>> {
    let raw = with_values(record.get(), patch)?;
    let key = {
        let fields = Fields::of(&raw)?;
        order.map(|order| sort_key(order, |name| fields.raw(name)))
    };
    Some(Row {
        backend,
        raw: Raw::Owned(raw),
        key,
    })
}

/// Whether a node record with this raw report timestamp is fresher than the one kept; a tie
/// keeps the earlier backend's.
fn is_fresher(report: Option<&str>, kept_report: Option<&str>) -> bool {
    compare_reports(report, kept_report).is_gt()
}
