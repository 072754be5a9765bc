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

use super::counts_filter::{CountsFilter, COUNT_FIELDS};
use super::object::{into_raw, write_object};
use super::values::{canonical, is_null, Total};
use super::{Mode, PlanError};
use crate::merge::Window;
use crate::query::Params;
use crate::records::Fields;
use crate::sort::{self, OrderBy, OrderEntity, PagingError, SummarizeBy};
use crate::status::Unusable;

/// The columns that name the subject; every other column is a count.
const SUBJECT_COLUMNS: [&str; 2] = ["subject_type", "subject"];

/// The parameters `/aggregate-event-counts` accepts (PuppetDB 7.12.1 `http/handlers.clj`
/// `agg-event-counts-routes`: global params plus these; 8.x adds `timeout`). Anything else,
/// paging included, is refused as PuppetDB refuses it: the backends see `/event-counts`, which
/// would accept it.
const AGGREGATE_PARAMS: [&str; 13] = [
    "query",
    "summarize_by",
    "counts_filter",
    "count_by",
    "distinct_resources",
    "distinct_start_time",
    "distinct_end_time",
    "optimize_drop_unused_joins",
    "include_facts_expiration",
    "include_package_inventory",
    "explain",
    "origin",
    "timeout",
];

/// The parameters pdbmux applies itself to merged event counts, never forwarded.
pub(super) const EVENT_COUNTS_LOCAL: [&str; 5] = [
    "counts_filter",
    "limit",
    "offset",
    "order_by",
    "include_total",
];

/// One backend's event-counts row, read and checked.
pub(super) struct CountRow<'a> {
    raw: &'a RawValue,
    object: Fields<'a>,
    key: String,
}

/// Reads and checks one backend's rows: objects with a subject, counts numbers or null.
pub(super) fn parse<'a>(rows: &[&'a RawValue]) -> Result<Vec<CountRow<'a>>, Unusable> {
    rows.iter()
        .enumerate()
        .map(|(index, raw)| {
            let object = Fields::of(raw.get()).ok_or(Unusable::NotAnObject { index })?;
            let (Some(subject_type), Some(subject)) =
                (object.raw("subject_type"), object.raw("subject"))
            else {
                return Err(Unusable::NoSubject { index });
            };
            for (column, value) in object.entries() {
                if !SUBJECT_COLUMNS.contains(&column.as_ref())
                    && !is_null(value)
                    && serde_json::from_str::<Number>(value.get()).is_err()
                {
                    return Err(Unusable::NotANumber {
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
            .entries()
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
            if self.first.object.raw(name).is_none() {
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
            .entries()
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
        let object = Fields::of(row.get()).unwrap_or_default();
        let subject = object.raw("subject").and_then(|s| Fields::of(s.get()));
        sort::sort_key(order, |field| match field {
            "certname" | "containing_class" | "resource_title" => subject.as_ref()?.raw("title"),
            "resource_type" => subject.as_ref()?.raw("type"),
            other => object.raw(other),
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
        columns.extend_from_slice(&COUNT_FIELDS[..4]);
    }
    let rank = |name: &str| {
        COUNT_FIELDS
            .iter()
            .position(|known| *known == name)
            .unwrap_or(COUNT_FIELDS.len())
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

/// Plans `/event-counts`: summarize_by, paging and counts_filter read as PuppetDB reads them.
pub(super) fn plan_event_counts(params: &Params) -> Result<Mode, PlanError> {
    let raw = params
        .get("summarize_by")
        .ok_or(PlanError::MissingParam("summarize_by"))?;
    let summarize_by = match SummarizeBy::from_param(raw) {
        Some(summarize_by) => summarize_by,
        None => {
            // PuppetDB parses order_by, limit and offset before it reads summarize_by.
            sort::parse_paging(
                params.get("order_by"),
                params.get("limit"),
                params.get("offset"),
                OrderEntity::EventCounts(SummarizeBy::Certname),
            )
            .or_else(|error| match error {
                PagingError::UnrecognizedColumn { .. } => Ok(Default::default()),
                error => Err(error),
            })?;
            return Err(PlanError::SummarizeBy(raw.to_owned()));
        }
    };
    let paging = sort::parse_paging(
        params.get("order_by"),
        params.get("limit"),
        params.get("offset"),
        OrderEntity::EventCounts(summarize_by),
    )?;
    let filter = counts_filter(params)?;
    Ok(Mode::EventCounts {
        filter,
        order: paging.order_by,
        window: Window {
            offset: paging.offset.unwrap_or(0),
            limit: paging.limit,
        },
    })
}

/// Plans `/aggregate-event-counts`: PuppetDB's parameter check, then one `/event-counts`
/// request per distinct summarize_by value.
pub(super) fn plan_aggregate(params: &Params) -> Result<Mode, PlanError> {
    let raw = params
        .get("summarize_by")
        .ok_or(PlanError::MissingParam("summarize_by"))?;
    if let Some(param) = params
        .iter()
        .find(|param| !AGGREGATE_PARAMS.contains(&param.key()))
    {
        return Err(PlanError::UnsupportedParam(param.key().to_owned()));
    }
    // Clojure's str/split drops trailing empty strings: "certname," is one value.
    let mut values: Vec<&str> = raw.split(',').collect();
    while values.last() == Some(&"") {
        values.pop();
    }
    let mut listed = Vec::with_capacity(values.len());
    for value in values {
        listed.push(match value {
            "certname" => "certname",
            "resource" => "resource",
            "containing_class" => "containing_class",
            other => return Err(PlanError::SummarizeBy(other.to_owned())),
        });
    }
    if listed.is_empty() {
        // "" is one empty value to PuppetDB (Java's split), and "," none at all.
        return Err(PlanError::SummarizeBy(raw.to_owned()));
    }
    let mut requests: Vec<&'static str> = Vec::new();
    for value in &listed {
        if !requests.contains(value) {
            requests.push(value);
        }
    }
    Ok(Mode::Aggregate {
        filter: counts_filter(params)?,
        listed,
        requests,
    })
}

fn counts_filter(params: &Params) -> Result<Option<CountsFilter>, PlanError> {
    Ok(match params.get("counts_filter") {
        Some(text) => CountsFilter::parse(text)?,
        None => None,
    })
}

/// Reads every body of each usable backend as event-counts rows (backend, then request); a
/// backend with a body that does not read is moved to `unusable`.
pub(super) fn read_counts<'a>(
    usable: Vec<(usize, Vec<Vec<&'a RawValue>>)>,
    unusable: &mut Vec<(usize, Unusable)>,
) -> Vec<Vec<Vec<CountRow<'a>>>> {
    let mut backends = Vec::new();
    for (index, bodies) in usable {
        let parsed: Result<Vec<_>, _> = bodies.iter().map(|rows| parse(rows)).collect();
        match parsed {
            Ok(parsed) => backends.push(parsed),
            Err(error) => unusable.push((index, error)),
        }
    }
    backends
}
