//! The node-owned entities other than `/nodes` and `/facts`: `/fact-contents`, `/factsets`,
//! `/catalogs`, `/edges`, `/resources`, `/inventory`, `/package-inventory`. Every record names
//! its node; a node's records come from its owner alone, the other backends' copies are dropped
//! (a node the map does not know, or whose owner is not asked: the first backend's that returned
//! it). Records are written byte for byte.

use std::borrow::Cow;
use std::collections::HashMap;

use super::rows::{Collected, Page, Raw, Row};
use super::{parse_answers, BackendPage, Merged, RecordPlan};
use crate::ownership::{Holding, Owning};
use crate::records::{parse_picked, raw_str, Fields};

pub(crate) fn merge(
    plan: &RecordPlan,
    answers: &[BackendPage<'_>],
    owning: Option<Owning<'_>>,
) -> Merged {
    let (parsed, unusable) = match parse_answers(answers, |body| parse_picked(body, ["certname"])) {
        Ok(parsed) => parsed,
        Err(unusable) => return Merged::nothing(unusable),
    };
    let order = plan.order.as_ref();
    // A node the map does not place: the first backend (configured order) that returned it.
    let mut first_holder: HashMap<Cow<'_, str>, usize> = HashMap::new();
    let mut rows = Collected::new(
        order,
        plan.window,
        parsed.iter().map(|(_, records)| records.len()).sum(),
        answers.iter().map(|answer| answer.body.len()).sum(),
    );
    let mut pages = Vec::with_capacity(parsed.len());
    for (answer, records) in &parsed {
        let backend = answer.backend;
        let mut page = Page::new(backend.0, answer.limit);
        page.returned = records.len();
        let key_of = |text: &str| {
            order.map(|order| {
                let fields = Fields::of(text);
                crate::sort::sort_key(order, |name| fields.as_ref()?.raw(name))
            })
        };
        page.last_key = records.last().and_then(|record| key_of(record.text));
        // The certname of the record before and whether its records were kept: records come
        // grouped by node, so the ownership lookup runs once per node.
        let mut previous: Option<(&str, bool)> = None;
        for record in records {
            let [certname] = record.fields;
            let keep = match (certname, previous) {
                (Some(raw), Some((last, keep))) if raw.get() == last => keep,
                (Some(raw), _) => {
                    let keep = match raw_str(raw) {
                        Some(certname) => {
                            let holding =
                                owning.map_or(Holding::Unknown, |o| o.holding(backend, &certname));
                            match holding {
                                Holding::Own => true,
                                Holding::Other => false,
                                Holding::Unknown => {
                                    *first_holder.entry(certname).or_insert(backend.0) == backend.0
                                }
                            }
                        }
                        None => true,
                    };
                    previous = Some((raw.get(), keep));
                    keep
                }
                (None, _) => true,
            };
            if !keep {
                continue;
            }
            page.kept += 1;
            let key = key_of(record.text);
            rows.push(Row {
                backend: backend.0,
                raw: Raw::Borrowed(record.text),
                key,
            });
        }
        pages.push(page);
    }
    Merged {
        body: rows.finish(order, plan.window, &pages),
        contributed: parsed.len(),
        unusable,
    }
}
