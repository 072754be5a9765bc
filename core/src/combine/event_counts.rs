//! `/event-counts` rows summed per subject, and `/aggregate-event-counts` computed from them
//! (DECISIONS.md D5).
//!
//! An event-counts row is `{"subject_type":…,"subject":{…},"failures":n,"successes":n,…}`; the
//! key is `subject_type` + `subject`, and every other column is a count (PE's
//! `intentional_`/`corrective_` columns included), summed. PuppetDB 7.12.1 writes the counts
//! first (`failures`, `skips`, `successes`, `noops`, then `subject_type`, `subject`:
//! `query/event_counts.clj` `munge-subject` assoc's onto the SQL row); a merged row keeps the
//! first backend's order whatever it is.

use std::borrow::Cow;
use std::collections::HashMap;

use serde_json::value::RawValue;
use serde_json::Number;

use super::counts_filter::CountsFilter;
use super::object::{into_raw, write_object, Object};
use super::values::{canonical, is_null, Total};
use super::CombineError;
use crate::merge::Window;
use crate::sort::{self, OrderBy};

/// The columns that name the subject; every other column is a count.
const SUBJECT_COLUMNS: [&str; 2] = ["subject_type", "subject"];

/// The summary columns in PuppetDB's order (`query/aggregate_event_counts.clj`
/// `get-aggregate-sql`: failures, skips, then successes and noops or PE's split), before `total`.
const SUMMARY_ORDER: [&str; 8] = [
    "failures",
    "skips",
    "successes",
    "noops",
    "intentional_successes",
    "corrective_successes",
    "intentional_noops",
    "corrective_noops",
];

/// One backend's event-counts row, read and checked.
pub(super) struct CountRow<'a> {
    raw: &'a RawValue,
    object: Object<'a>,
    key: String,
}

/// Reads and checks one backend's rows: objects with a subject, counts numbers or null.
pub(super) fn parse<'a>(rows: &[&'a RawValue]) -> Result<Vec<CountRow<'a>>, CombineError> {
    rows.iter()
        .enumerate()
        .map(|(index, raw)| {
            let object = Object::of(raw).ok_or(CombineError::NotAnObject { index })?;
            let (Some(subject_type), Some(subject)) =
                (object.get("subject_type"), object.get("subject"))
            else {
                return Err(CombineError::NoSubject { index });
            };
            for (column, value) in &object.0 {
                if !SUBJECT_COLUMNS.contains(&column.as_ref())
                    && !is_null(value)
                    && serde_json::from_str::<Number>(value.get()).is_err()
                {
                    return Err(CombineError::NotANumber {
                        index,
                        column: column.clone().into_owned(),
                    });
                }
            }
            let key = format!("{}\u{0}{}", canonical(subject_type), canonical(subject));
            Ok(CountRow { raw, object, key })
        })
        .collect()
}

/// One subject's merged counts.
pub(super) struct Subject<'a> {
    first: CountRow<'a>,
    rows: usize,
    counts: Vec<(Cow<'a, str>, Total)>,
}

impl Subject<'_> {
    /// The merged count of `column` ([`Total::Nothing`] when no row had a number there).
    fn total(&self, column: &str) -> Total {
        self.counts
            .iter()
            .find(|(name, _)| name == column)
            .map_or(Total::Nothing, |(_, total)| *total)
    }

    /// The merged row: the first row byte for byte when only one backend reported the subject,
    /// else rebuilt in its key order with the summed counts.
    fn write(&self) -> Box<RawValue> {
        if self.rows == 1 {
            return self.first.raw.to_owned();
        }
        let mut entries: Vec<(&str, String)> = self
            .first
            .object
            .0
            .iter()
            .map(|(name, raw)| {
                let text = match SUBJECT_COLUMNS.contains(&name.as_ref()) {
                    true => raw.get().to_owned(),
                    false => self.total(name).json(),
                };
                (name.as_ref(), text)
            })
            .collect();
        for (name, total) in &self.counts {
            if self.first.object.get(name).is_none() {
                entries.push((name.as_ref(), total.json()));
            }
        }
        into_raw(write_object(entries))
    }
}

/// Sums the backends' rows (configured order) per subject, in first-seen order, and keeps the
/// subjects that pass `filter`.
pub(super) fn merge<'a>(
    backends: Vec<Vec<CountRow<'a>>>,
    filter: Option<&CountsFilter>,
) -> Vec<Subject<'a>> {
    let mut subjects: Vec<Subject<'a>> = Vec::new();
    let mut index: HashMap<String, usize> = HashMap::new();
    for row in backends.into_iter().flatten() {
        let counted: Vec<(Cow<'a, str>, &'a RawValue)> = row
            .object
            .0
            .iter()
            .filter(|(name, _)| !SUBJECT_COLUMNS.contains(&name.as_ref()))
            .map(|(name, value)| (name.clone(), *value))
            .collect();
        let at = match index.get(&row.key) {
            Some(&at) => at,
            None => {
                index.insert(row.key.clone(), subjects.len());
                subjects.push(Subject {
                    first: row,
                    rows: 0,
                    counts: Vec::new(),
                });
                subjects.len() - 1
            }
        };
        let subject = &mut subjects[at];
        subject.rows += 1;
        for (name, value) in counted {
            let slot = match subject.counts.iter().position(|(known, _)| *known == name) {
                Some(slot) => slot,
                None => {
                    subject.counts.push((name, Total::Nothing));
                    subject.counts.len() - 1
                }
            };
            if let Ok(number) = serde_json::from_str::<Number>(value.get()) {
                subject.counts[slot].1 = subject.counts[slot].1.add(&number);
            }
        }
    }
    if let Some(filter) = filter {
        subjects.retain(|subject| filter.accepts(subject.total(filter.field())));
    }
    subjects
}

/// The `/event-counts` answer: the merged rows ordered and windowed, and how many there were
/// before the window (X-Records).
pub(super) fn event_counts(
    subjects: &[Subject<'_>],
    order: &OrderBy,
    window: Window,
) -> (Vec<Box<RawValue>>, usize) {
    let rows: Vec<Box<RawValue>> = subjects.iter().map(Subject::write).collect();
    let count = rows.len();
    let rows = sort::sort_stable(rows, order, |row| {
        let object = Object::of(row).unwrap_or_default();
        let subject = object.get("subject").and_then(Object::of);
        sort::sort_key(order, |field| match field {
            "certname" | "containing_class" | "resource_title" => subject.as_ref()?.get("title"),
            "resource_type" => subject.as_ref()?.get("type"),
            other => object.get(other),
        })
    });
    (window.apply(rows), count)
}

/// One `/aggregate-event-counts` summary object: per count column, the number of subjects with
/// at least one such event, and `total`, the number of subjects. Key order as PuppetDB's SQL
/// selects them (`summarize_by`, the counts, `total`); with no subject at all, the four basic
/// counts are 0, as PuppetDB turns the SQL NULLs into 0 (`munge-result-rows`).
pub(super) fn summary(summarize_by: &str, subjects: &[Subject<'_>]) -> String {
    let mut columns: Vec<&str> = Vec::new();
    for subject in subjects {
        for (name, _) in &subject.counts {
            if !columns.contains(&name.as_ref()) {
                columns.push(name);
            }
        }
    }
    if columns.is_empty() {
        columns.extend_from_slice(&SUMMARY_ORDER[..4]);
    }
    let rank = |name: &str| {
        SUMMARY_ORDER
            .iter()
            .position(|known| *known == name)
            .unwrap_or(SUMMARY_ORDER.len())
    };
    // Stable: columns PuppetDB does not name keep their first-seen order, after the known ones.
    columns.sort_by_key(|name| rank(name));
    let mut entries = vec![(
        "summarize_by",
        serde_json::Value::from(summarize_by).to_string(),
    )];
    for column in columns {
        let with_events = subjects
            .iter()
            .filter(|subject| match subject.total(column) {
                Total::Int(n) => n > 0,
                Total::Float(f) => f > 0.0,
                Total::Nothing => false,
            })
            .count();
        entries.push((column, with_events.to_string()));
    }
    entries.push(("total", subjects.len().to_string()));
    write_object(entries)
}
