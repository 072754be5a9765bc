//! Folding the backends' extract rows: rows sharing a key collapse into one, each aggregate
//! column combined by its own rule; a key one row alone reported is passed through byte for byte.

use std::cmp::Ordering;
use std::collections::HashMap;

use serde_json::value::RawValue;
use serde_json::Number;

use super::extract::{Fold, Rule};
use super::object::{into_raw, write_object};
use super::values::{average, canonical, float_json, is_null, Extreme, Total};
use crate::records::Fields;
use crate::status::Unusable;

/// One backend's row, read and checked.
pub(super) struct FoldParsed<'a> {
    raw: &'a RawValue,
    object: Fields<'a>,
    key: String,
}

impl FoldParsed<'_> {
    /// The canonical text of column `name`, if the row has it (a correction row's report).
    pub(super) fn column(&self, name: &str) -> Option<String> {
        self.object.raw(name).map(canonical)
    }

    /// The group this row folds into (its non-aggregate columns, less any ignored one).
    pub(super) fn group(&self) -> &str {
        &self.key
    }
}

/// One aggregate column's running value.
enum Acc<'a> {
    Total(Total),
    Extreme(Extreme<'a>),
}

/// A group: its first row (which decides the key order) and the folded values.
struct Group<'a> {
    first: FoldParsed<'a>,
    rows: usize,
    accs: Vec<Acc<'a>>,
}

/// Reads and checks one backend's rows: each must be an object whose additive columns hold
/// numbers or null. A failure leaves the whole backend out (D7). `ignore` names a column that
/// is not part of the group key (a history correction's report, docs/merging.md).
pub(super) fn parse<'a>(
    fold: &Fold,
    rows: &[&'a RawValue],
    ignore: Option<&str>,
) -> Result<Vec<FoldParsed<'a>>, Unusable> {
    rows.iter()
        .enumerate()
        .map(|(index, raw)| {
            let object = Fields::of(raw.get()).ok_or(Unusable::NotAnObject { index })?;
            for (column, rule) in &fold.aggregates {
                if let (Rule::Add, Some(value)) = (rule, object.raw(column)) {
                    if !is_null(value) && serde_json::from_str::<Number>(value.get()).is_err() {
                        return Err(Unusable::NotANumber {
                            index,
                            column: column.clone(),
                        });
                    }
                }
            }
            let key = group_key(fold, &object, ignore);
            Ok(FoldParsed { raw, object, key })
        })
        .collect()
}

/// The row's non-aggregate columns (plain fields and their `_2` copies, row functions, helper
/// `group_by` columns), by name, as canonical text.
fn group_key(fold: &Fold, object: &Fields<'_>, ignore: Option<&str>) -> String {
    let mut parts: Vec<(&str, String)> = object
        .entries()
        .iter()
        .filter(|(name, _)| !fold.aggregates.iter().any(|(column, _)| column == name))
        .filter(|(name, _)| Some(name.as_ref()) != ignore)
        .map(|(name, value)| (name.as_ref(), canonical(value)))
        .collect();
    parts.sort();
    let mut key = String::new();
    for (name, value) in parts {
        key.push_str(name);
        key.push('\u{0}');
        key.push_str(&value);
        key.push('\u{0}');
    }
    key
}

/// Folds the backends' parsed rows (configured order) into the combined rows, in the order
/// their keys were first seen. Each set of rows comes with its weight: 1 for an answer, a
/// negative count for a correction's rows (what was counted too often), which only the additive
/// columns take and which never start a group. With `drop_uncounted`, a group whose `count`
/// folds to zero is dropped: it existed only on the nodes a correction took away.
pub(super) fn fold_rows(
    fold: &Fold,
    backends: Vec<(i64, Vec<FoldParsed<'_>>)>,
    drop_uncounted: bool,
) -> Vec<Box<RawValue>> {
    let mut groups: Vec<Group<'_>> = Vec::new();
    let mut index: HashMap<String, usize> = HashMap::new();
    let weighted = backends
        .into_iter()
        .flat_map(|(weight, rows)| rows.into_iter().map(move |row| (weight, row)));
    for (weight, row) in weighted {
        if weight < 0 {
            if let Some(&at) = index.get(&row.key) {
                let group = &mut groups[at];
                for ((column, rule), acc) in fold.aggregates.iter().zip(group.accs.iter_mut()) {
                    let (Rule::Add, Acc::Total(total), Some(value)) =
                        (rule, acc, row.object.raw(column))
                    else {
                        continue;
                    };
                    if let Ok(number) = serde_json::from_str::<Number>(value.get()) {
                        *total = total.add_times(&number, weight);
                    }
                }
                group.rows += 1;
            }
            continue;
        }
        let (at, later) = match index.get(&row.key) {
            Some(&at) => (at, Some(row)),
            None => {
                index.insert(row.key.clone(), groups.len());
                let accs = fold
                    .aggregates
                    .iter()
                    .map(|(_, rule)| match rule {
                        Rule::Add => Acc::Total(Total::Nothing),
                        Rule::Min(_) | Rule::Max(_) => Acc::Extreme(Extreme::new()),
                    })
                    .collect();
                groups.push(Group {
                    first: row,
                    rows: 0,
                    accs,
                });
                (groups.len() - 1, None)
            }
        };
        let Group { first, rows, accs } = &mut groups[at];
        let object = later.as_ref().map_or(&first.object, |row| &row.object);
        for ((column, rule), acc) in fold.aggregates.iter().zip(accs.iter_mut()) {
            let Some(value) = object.raw(column) else {
                continue;
            };
            match (rule, acc) {
                (Rule::Add, Acc::Total(total)) => {
                    if let Ok(number) = serde_json::from_str::<Number>(value.get()) {
                        *total = total.add(&number);
                    }
                }
                (Rule::Min(order), Acc::Extreme(extreme)) => {
                    extreme.offer(value, order, Ordering::Less);
                }
                (Rule::Max(order), Acc::Extreme(extreme)) => {
                    extreme.offer(value, order, Ordering::Greater);
                }
                _ => {}
            }
        }
        *rows += 1;
    }
    let counted = |group: &Group<'_>| {
        let count = fold
            .aggregates
            .iter()
            .position(|(name, _)| name == "count")
            .and_then(|at| group.accs.get(at));
        !matches!(count, Some(Acc::Total(total)) if total.is_zero())
    };
    groups
        .iter()
        .filter(|group| !drop_uncounted || counted(group))
        .map(|group| write_group(fold, group))
        .collect()
}

/// The combined row of one group: the first row byte for byte when it is the only one (and
/// needs no rewrite), else rebuilt in the first row's key order. Helper columns stay until
/// [`drop_helpers`], so an order on an unprojected `group_by` field still sees them.
fn write_group(fold: &Fold, group: &Group<'_>) -> Box<RawValue> {
    if group.rows == 1 && !fold.rewrites_rows() {
        return group.first.raw.to_owned();
    }
    let value_of = |column: &str| -> Option<&Acc<'_>> {
        fold.aggregates
            .iter()
            .position(|(name, _)| name == column)
            .and_then(|at| group.accs.get(at))
    };
    let total_of = |column: &str| match value_of(column) {
        Some(Acc::Total(total)) => *total,
        _ => Total::Nothing,
    };
    let avg = || {
        average(total_of("sum"), total_of("count")).map_or_else(|| "null".to_owned(), float_json)
    };
    let mut entries: Vec<(&str, String)> = Vec::new();
    let mut avg_written = false;
    for (name, raw) in group.first.object.entries() {
        let name = name.as_ref();
        if fold.avg && matches!(name, "sum" | "count") {
            if !avg_written {
                entries.push(("avg", avg()));
                avg_written = true;
            }
            continue;
        }
        let text = match value_of(name) {
            Some(Acc::Total(total)) => total.json(),
            Some(Acc::Extreme(extreme)) => extreme.json().to_owned(),
            None => raw.get().to_owned(),
        };
        entries.push((name, text));
    }
    if fold.avg && !avg_written {
        entries.push(("avg", avg()));
    }
    into_raw(write_object(entries))
}

/// Drops the helper columns from the combined rows (after they were ordered and windowed).
pub(super) fn drop_helpers(fold: &Fold, rows: Vec<Box<RawValue>>) -> Vec<Box<RawValue>> {
    if fold.helpers.is_empty() {
        return rows;
    }
    rows.into_iter()
        .map(|row| {
            let object = Fields::of(row.get()).unwrap_or_default();
            let entries = object
                .entries()
                .iter()
                .filter(|(name, _)| !fold.helpers.iter().any(|helper| helper == name))
                .map(|(name, raw)| (name.as_ref(), raw.get().to_owned()));
            into_raw(write_object(entries))
        })
        .collect()
}
