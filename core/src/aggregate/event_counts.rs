//! `/event-counts` rows summed per subject, and `/aggregate-event-counts` computed from them
//! (docs/decisions.md D5).
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
use super::values::{canonical, canonical_value, is_null, Total};
use super::{Mode, PlanError};
use crate::entity::{ColumnSet, Entity, SummarizeBy};
use crate::merge::Window;
use crate::query::Params;
use crate::records::Fields;
use crate::sort::{self, OrderBy, PagingError};
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

/// Sums the backends' rows (configured order) per subject, in first-seen order, each set of rows
/// `weight` times (a correction's rows are subtracted, and never start a subject). Run
/// [`filtered`] on the result before answering.
pub(super) fn merge<'a>(backends: Vec<(i64, Vec<CountRow<'a>>)>) -> Vec<Subject<'a>> {
    let mut subjects: Vec<Subject<'a>> = Vec::new();
    let mut index: HashMap<String, usize> = HashMap::new();
    let weighted = backends
        .into_iter()
        .flat_map(|(weight, rows)| rows.into_iter().map(move |row| (weight, row)));
    for (weight, row) in weighted {
        let counted: Vec<(Cow<'a, str>, &'a RawValue)> = row
            .object
            .entries()
            .iter()
            .filter(|(name, _)| !SUBJECT_COLUMNS.contains(&name.as_ref()))
            .map(|(name, value)| (name.clone(), *value))
            .collect();
        let at = match index.get(&row.key) {
            Some(&at) => at,
            None if weight < 0 => continue,
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
                subject.counts[slot].1 = subject.counts[slot].1.add_times(&number, weight);
            }
        }
    }
    subjects
}

/// The merged subjects that pass `filter`. With `corrected`, a subject whose counts all fold to
/// zero is dropped too: its events were on nodes or report copies a correction took away.
pub(super) fn filtered<'a>(
    mut subjects: Vec<Subject<'a>>,
    filter: Option<&CountsFilter>,
    corrected: bool,
) -> Vec<Subject<'a>> {
    if corrected {
        subjects.retain(|subject| subject.counts.iter().any(|(_, total)| !total.is_zero()));
    }
    if let Some(filter) = filter {
        subjects.retain(|subject| filter.accepts(subject.total(filter.field())));
    }
    subjects
}

/// The `/events` fields that name the subject of each `summarize_by`.
const SUBJECT_FIELDS: [&str; 4] = [
    "certname",
    "resource_type",
    "resource_title",
    "containing_class",
];

/// The `/events` query that tells what a backend counts that another backend counts too
/// (docs/merging.md, "History counted once"), over `certnames`: the events of each report per
/// status and every subject field, so that one answer serves every `summarize_by` and both
/// `count_by`s.
pub(super) fn history_correction(
    query: Option<&serde_json::Value>,
    certnames: &[&str],
) -> serde_json::Value {
    let mut keys = vec!["report", "status"];
    keys.extend(SUBJECT_FIELDS);
    let mut columns = vec![serde_json::json!(["function", "count"])];
    columns.extend(keys.iter().map(|k| serde_json::json!(k)));
    let mut group_by = vec![serde_json::json!("group_by")];
    group_by.extend(keys.iter().map(|k| serde_json::json!(k)));
    let filter = crate::query::add_clause(query, crate::query::only_certnames_clause(certnames));
    serde_json::json!(["extract", columns, filter, group_by])
}

/// One correction row's subject under `summarize_by`, keyed as [`parse`] keys a row.
fn subject_key(object: &Fields<'_>, summarize_by: SummarizeBy) -> String {
    let value = |name: &str| {
        object
            .raw(name)
            .and_then(|raw| serde_json::from_str(raw.get()).ok())
            .unwrap_or(serde_json::Value::Null)
    };
    let subject = match summarize_by {
        SummarizeBy::Certname => serde_json::json!({ "title": value("certname") }),
        SummarizeBy::Resource => {
            serde_json::json!({ "type": value("resource_type"), "title": value("resource_title") })
        }
        SummarizeBy::ContainingClass => serde_json::json!({ "title": value("containing_class") }),
    };
    format!(
        "{}\u{0}{}",
        canonical_value(&serde_json::json!(summarize_by.as_str())),
        canonical_value(&subject)
    )
}

/// The count column an event status is counted in.
fn status_column(status: &str) -> Option<&'static str> {
    Some(match status {
        "success" => "successes",
        "failure" => "failures",
        "noop" => "noops",
        "skipped" => "skips",
        _ => return None,
    })
}

/// One row of a backend's history correction: a report's events of one status on one subject.
pub(super) struct HistoryRow<'a> {
    object: Fields<'a>,
    column: &'static str,
    count: i64,
}

/// Reads and checks one backend's history correction rows (see [`history_correction`]); rows of
/// a status PuppetDB does not count are skipped.
pub(super) fn read_history<'a>(rows: &[&'a RawValue]) -> Result<Vec<HistoryRow<'a>>, Unusable> {
    let mut read = Vec::with_capacity(rows.len());
    for (index, raw) in rows.iter().enumerate() {
        let object = Fields::of(raw.get()).ok_or(Unusable::NotAnObject { index })?;
        let status = object
            .raw("status")
            .and_then(|raw| serde_json::from_str::<String>(raw.get()).ok());
        let Some(column) = status.as_deref().and_then(status_column) else {
            continue;
        };
        let count = object
            .raw("count")
            .and_then(|count| count.get().parse::<i64>().ok())
            .ok_or_else(|| Unusable::NotANumber {
                index,
                column: "count".to_owned(),
            })?;
        read.push(HistoryRow {
            object,
            column,
            count,
        });
    }
    Ok(read)
}

/// What the backends' history corrections say is counted too often, as (subject key, count
/// column, amount). `count_by=resource` counts events: a report whose events several backends
/// returned is counted once per extra copy. `count_by=certname` counts nodes: a node with such
/// events in several backends is counted once per extra backend.
pub(super) fn counted_twice(
    backends: &[Vec<HistoryRow<'_>>],
    summarize_by: SummarizeBy,
    count_by_certname: bool,
) -> Vec<(String, &'static str, i64)> {
    use std::collections::BTreeMap;
    let copy_field = if count_by_certname {
        "certname"
    } else {
        "report"
    };
    // (subject, column, copy) → (backends that count it, what one of them counts).
    let mut copies: BTreeMap<(String, &'static str, String), (i64, i64)> = BTreeMap::new();
    for rows in backends {
        let mut mine: BTreeMap<(String, &'static str, String), i64> = BTreeMap::new();
        for row in rows {
            let copy = row
                .object
                .raw(copy_field)
                .map(canonical)
                .unwrap_or_default();
            let held = mine
                .entry((subject_key(&row.object, summarize_by), row.column, copy))
                .or_insert(0);
            *held = if count_by_certname {
                1
            } else {
                *held + row.count
            };
        }
        for (key, count) in mine {
            copies.entry(key).or_insert((0, count)).0 += 1;
        }
    }
    copies
        .into_iter()
        .filter(|(_, (backends, _))| *backends > 1)
        .map(|((subject, column, _), (backends, count))| (subject, column, (backends - 1) * count))
        .collect()
}

/// Takes what `counted_twice` says off the merged subjects.
pub(super) fn subtract(subjects: &mut [Subject<'_>], twice: &[(String, &'static str, i64)]) {
    for (key, column, amount) in twice {
        let Some(subject) = subjects.iter_mut().find(|s| &s.first.key == key) else {
            continue;
        };
        if let Some((_, total)) = subject.counts.iter_mut().find(|(name, _)| name == column) {
            *total = total.add_times(&serde_json::Number::from(*amount), -1);
        }
        subject.rows += 1;
    }
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
pub(super) fn summary(summarize_by: SummarizeBy, subjects: &[Subject<'_>]) -> String {
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
        serde_json::Value::from(summarize_by.as_str()).to_string(),
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
                Entity::EventCounts.order_columns(ColumnSet::SummarizedBy(SummarizeBy::Certname)),
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
        Entity::EventCounts.order_columns(ColumnSet::SummarizedBy(summarize_by)),
    )?;
    let filter = counts_filter(params)?;
    Ok(Mode::EventCounts {
        summarize_by,
        count_by_certname: params.get("count_by") == Some("certname"),
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
        let summarize_by = SummarizeBy::from_param(value)
            .ok_or_else(|| PlanError::SummarizeBy(value.to_owned()))?;
        listed.push(summarize_by);
    }
    if listed.is_empty() {
        // "" is one empty value to PuppetDB (Java's split), and "," none at all.
        return Err(PlanError::SummarizeBy(raw.to_owned()));
    }
    let mut requests: Vec<SummarizeBy> = Vec::new();
    for value in &listed {
        if !requests.contains(value) {
            requests.push(*value);
        }
    }
    Ok(Mode::Aggregate {
        count_by_certname: params.get("count_by") == Some("certname"),
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
) -> Vec<(usize, Vec<Vec<CountRow<'a>>>)> {
    let mut backends = Vec::new();
    for (index, bodies) in usable {
        let parsed: Result<Vec<_>, _> = bodies.iter().map(|rows| parse(rows)).collect();
        match parsed {
            Ok(parsed) => backends.push((index, parsed)),
            Err(error) => unusable.push((index, error)),
        }
    }
    backends
}
