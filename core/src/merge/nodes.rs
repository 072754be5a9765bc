//! `/nodes`: one record per certname, the owner's (the newest holding by producer time: newer
//! report, then newer facts, then newer catalog, then configured order); each merged record
//! gains a `pdbmux_source` key naming it. A node the membership map does not know (it appeared
//! since the last refresh) is deduped from the records themselves by `report_timestamp`, the
//! one producer time a node record carries, then configured order.

use std::collections::HashMap;

use serde_json::value::RawValue;

use super::rows::{check_filled, sort_rows, Page, Raw, Row};
use super::{parse_answers, BackendPage, Merged, RecordPlan};
use crate::membership::compare_timestamps;
use crate::ownership::{Holding, Owning};
use crate::records::{parse_records, with_key, write_array, Fields};

/// The key naming the winning backend on each merged node record.
pub(crate) const SOURCE_KEY: &str = "pdbmux_source";

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
        .map(|row| match (&row.raw, stamp) {
            (Raw::Borrowed(raw), true) => {
                let name = backends.get(row.backend).map_or("", |b| b.name.as_str());
                with_key(raw, SOURCE_KEY, name)
            }
            (raw, _) => raw.get().to_owned(),
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

/// Whether a node record with this raw report timestamp is fresher than the one kept; a tie
/// keeps the earlier backend's.
fn is_fresher(report: Option<&str>, kept_report: Option<&str>) -> bool {
    compare_timestamps(json_str(report), json_str(kept_report)).is_gt()
}

/// A raw JSON timestamp (`"…"` or `null`) as text; `None` for null or anything else.
fn json_str(raw: Option<&str>) -> Option<&str> {
    raw.and_then(|raw| raw.strip_prefix('"')?.strip_suffix('"'))
}
