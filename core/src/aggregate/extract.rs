//! Planning a combined extract (`/reports`, `/events`, `/nodes`, `/resources`, `/facts`,
//! `/facts/<name>[/<value>]` with a `["function", ...]` column): how each response column folds,
//! the query each backend gets, and the order and window cut after the fold.
//!
//! Two shapes:
//! - a **fold** — an aggregate function (`count`, `sum`, `avg`, `min`, `max`) or a `group_by`:
//!   one row per group, so rows sharing a key collapse. Every group is fetched (no limit or
//!   offset upstream; in-query paging is stripped too) and the window is cut here. `avg` is
//!   rewritten into `sum` + `count`, and a `group_by` entry the extract does not project is
//!   projected upstream as a helper column (its value tells two groups apart) and dropped again;
//! - **rows** — nothing but the row functions `to_string`/`jsonb_typeof` and plain fields, no
//!   `group_by`: one row per record, kept as they came, under the upstream limit that bounds
//!   them (`offset + limit`, no offset, like the record merges).

use serde_json::Value;

use super::values::value_order;
use super::PlanError;
use crate::entity::{ColumnKind, ColumnSet, Entity, OrderColumns};
use crate::merge::Window;
use crate::query::{check_combinable, rewrite_avg, Analysis, FunctionColumn, GroupByItem, Params};
use crate::sort::{self, Direction, OrderBy, OrderField};

/// How one upstream aggregate column folds.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Rule {
    /// `count` and `sum`: added.
    Add,
    /// `min`: the smallest non-null value, compared under this one-field order.
    Min(OrderBy),
    /// `max`: the largest, likewise.
    Max(OrderBy),
}

/// The fold of an aggregating extract.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Fold {
    /// The upstream aggregate columns (after the avg rewrite) and their rules.
    pub(super) aggregates: Vec<(String, Rule)>,
    /// `avg` was rewritten: the answer carries `avg` = sum / count instead of those two.
    pub(super) avg: bool,
    /// Helper columns projected upstream for unprojected `group_by` entries (and a row count a
    /// correction needs); dropped on output.
    pub(super) helpers: Vec<String>,
    /// A zero-argument `count()` is among the aggregates: each group's row count.
    pub(super) counts_rows: bool,
}

impl Fold {
    /// Whether a row needs rebuilding even when one backend alone reported its key.
    pub(super) fn rewrites_rows(&self) -> bool {
        self.avg || !self.helpers.is_empty()
    }
}

/// A planned extract combine.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct ExtractPlan {
    /// `None`: rows pass through (row functions only).
    pub(super) fold: Option<Fold>,
    /// The rewritten upstream query, when it differs from the client's.
    pub(super) upstream_query: Option<String>,
    /// The query each backend is sent (the client's, or the rewritten one).
    pub(super) upstream: Value,
    /// The order applied to the combined rows.
    pub(super) order: OrderBy,
    /// The window cut from the combined rows.
    pub(super) window: Window,
    /// Rows only: the `limit` each backend gets (`offset + limit`), or none.
    pub(super) upstream_limit: Option<u64>,
}

/// Paging written inside a top-level `from` (`["limit",n]`, `["offset",n]`, `["order_by",..]`).
#[derive(Debug, Default)]
struct InQuery {
    limit: Option<u64>,
    offset: Option<u64>,
    order: Option<Vec<(String, Direction)>>,
}

/// Plans the combine of an AST query with a function column on `entity`.
pub(super) fn plan(
    entity: Entity,
    params: &Params,
    ast: &Value,
    analysis: &Analysis,
) -> Result<ExtractPlan, PlanError> {
    if entity.takes_distinct_resources()
        && params
            .get("distinct_resources")
            .is_some_and(sort::parse_include_total)
    {
        return Err(PlanError::DistinctResources);
    }
    check_combinable(analysis)?;
    let columns = entity.order_columns(ColumnSet::facts_expiration(
        params.get("include_facts_expiration"),
    ));
    let url = sort::parse_paging(
        params.get("order_by"),
        params.get("limit"),
        params.get("offset"),
        columns,
    )?;
    let mut upstream = ast.clone();
    let in_query = if analysis.in_query_paging {
        strip_in_query_paging(&mut upstream)?
    } else {
        InQuery::default()
    };
    // The URL form wins over the in-query form, field by field, as PuppetDB's compile-query
    // assoc's the URL paging over the plan (inferred from engine.clj, not documented).
    let order = if url.order_by.is_empty() {
        let fields = in_query.order.unwrap_or_default();
        OrderBy {
            fields: fields
                .into_iter()
                .map(|(field, direction)| OrderField {
                    kind: order_kind(columns, analysis, &field),
                    field,
                    direction,
                })
                .collect(),
        }
    } else {
        url.order_by
    };
    let window = Window {
        offset: url.offset.or(in_query.offset).unwrap_or(0),
        limit: url.limit.or(in_query.limit),
    };

    let folds = analysis.is_aggregate() || !analysis.group_by.is_empty();
    if !folds {
        // Rows only. With in-query paging the order may be one the URL cannot carry, so every
        // row is fetched; otherwise each backend's first offset + limit rows are all we need.
        let upstream_limit = if analysis.in_query_paging {
            None
        } else {
            window.upstream_limit()
        };
        return Ok(ExtractPlan {
            fold: None,
            upstream_query: analysis.in_query_paging.then(|| upstream.to_string()),
            upstream,
            order,
            window,
            upstream_limit,
        });
    }

    let helpers = add_helper_columns(&mut upstream, analysis)?;
    let mut avg = false;
    let mut aggregates = Vec::new();
    for function in analysis.function_columns.iter() {
        let rule = match function.name.as_str() {
            "avg" => {
                avg = true;
                aggregates.push(("sum".to_owned(), Rule::Add));
                aggregates.push(("count".to_owned(), Rule::Add));
                continue;
            }
            "count" | "sum" => Rule::Add,
            "min" => Rule::Min(value_order(argument_kind(columns, function))),
            "max" => Rule::Max(value_order(argument_kind(columns, function))),
            // Row functions key the group; check_combinable refused everything else.
            _ => continue,
        };
        aggregates.push((function.name.clone(), rule));
    }
    let changed = analysis.in_query_paging || !helpers.is_empty();
    let (upstream_query, upstream) = match rewrite_avg(&upstream) {
        Some(rewritten) => (Some(rewritten.to_string()), rewritten),
        None => (changed.then(|| upstream.to_string()), upstream),
    };
    let counts_rows = analysis
        .function_columns
        .iter()
        .any(|f| f.name == "count" && f.args.is_empty());
    Ok(ExtractPlan {
        fold: Some(Fold {
            aggregates,
            avg,
            helpers,
            counts_rows,
        }),
        upstream_query,
        upstream,
        order,
        window,
        upstream_limit: None,
    })
}

impl ExtractPlan {
    /// Whether the backends' counts over the nodes they hold for others can simply be
    /// subtracted (docs/merging.md, "Corrections"): a fold of `count` and `sum` only, whose
    /// groups can be told to vanish by a row count (`count()` projected, or a helper added by
    /// [`ExtractPlan::count_rows`]). `min`, `max`, `avg` and `count(column)` are not.
    pub(super) fn subtracts(&self) -> bool {
        let Some(fold) = &self.fold else {
            return false;
        };
        let additive = fold.aggregates.iter().all(|(_, rule)| *rule == Rule::Add) && !fold.avg;
        let counts = fold.counts_rows || !fold.aggregates.iter().any(|(name, _)| name == "count");
        additive && counts
    }

    /// Projects `count()` upstream as a helper column when the client did not, so a group the
    /// correction takes away entirely is told by its count reaching zero.
    pub(super) fn count_rows(&mut self) {
        let Some(fold) = &mut self.fold else {
            return;
        };
        if fold.counts_rows {
            return;
        }
        if let Some(extract) = outer_extract_mut(&mut self.upstream) {
            match extract.get_mut(1) {
                Some(Value::Array(projected)) => {
                    projected.push(serde_json::json!(["function", "count"]));
                }
                Some(single @ Value::String(_)) => {
                    let field = single.take();
                    *single = serde_json::json!([field, ["function", "count"]]);
                }
                _ => return,
            }
        }
        fold.aggregates.push(("count".to_owned(), Rule::Add));
        fold.helpers.push("count".to_owned());
        fold.counts_rows = true;
        self.upstream_query = Some(self.upstream.to_string());
    }

    /// Whether reports stored in several backends change the answer: any additive column
    /// (`min` and `max` see each copy alike).
    pub(super) fn counts_history(&self) -> bool {
        self.fold
            .as_ref()
            .is_some_and(|fold| fold.aggregates.iter().any(|(_, rule)| *rule == Rule::Add))
    }

    /// The correction query for `certnames`: the upstream query restricted to them, and for a
    /// history correction also projected and grouped by the report (`column`).
    pub(super) fn correction_query(
        &self,
        certnames: &[&str],
        column: Option<&str>,
    ) -> Option<Value> {
        let mut query = self.upstream.clone();
        if let Some(column) = column {
            let extract = outer_extract_mut(&mut query)?;
            match extract.get_mut(1) {
                Some(Value::Array(projected)) => projected.push(Value::from(column)),
                _ => return None,
            }
            let group_by = extract
                .iter_mut()
                .skip(2)
                .find(|item| item.get(0).and_then(Value::as_str) == Some("group_by"));
            match group_by {
                Some(Value::Array(items)) => items.push(Value::from(column)),
                _ => extract.push(serde_json::json!(["group_by", column])),
            }
        }
        Some(crate::query::add_clause(
            Some(&query),
            crate::query::only_certnames_clause(certnames),
        ))
    }
}

/// How the values of `field` (a response column) compare: a function alias by what the
/// function returns, anything else by the entity's column type.
fn order_kind(columns: OrderColumns, analysis: &Analysis, field: &str) -> ColumnKind {
    match analysis.function_columns.iter().find(|f| f.name == field) {
        Some(function) => match function.name.as_str() {
            "count" | "sum" | "avg" => ColumnKind::Number,
            "min" | "max" => value_order(argument_kind(columns, function))
                .fields
                .first()
                .map_or(ColumnKind::Other, |f| f.kind),
            _ => ColumnKind::Text,
        },
        None => columns.kind(field),
    }
}

/// The column type of a function's first argument (`max(producer_timestamp)` is a timestamp).
fn argument_kind(columns: OrderColumns, function: &FunctionColumn) -> ColumnKind {
    match function.args.first() {
        Some(Value::String(field)) => columns.kind(field),
        _ => ColumnKind::Other,
    }
}

/// Removes the paging clauses of a top-level `from` and returns what they asked for.
fn strip_in_query_paging(ast: &mut Value) -> Result<InQuery, PlanError> {
    let Some(items) = ast.as_array_mut() else {
        return Ok(InQuery::default());
    };
    if items.first().and_then(Value::as_str) != Some("from") {
        return Ok(InQuery::default());
    }
    let mut paging = InQuery::default();
    let mut seen: Vec<String> = Vec::new();
    let mut kept = Vec::with_capacity(items.len());
    for (index, item) in items.drain(..).enumerate() {
        let op = item
            .as_array()
            .and_then(|clause| clause.first())
            .and_then(Value::as_str)
            .filter(|op| index >= 2 && matches!(*op, "limit" | "offset" | "order_by"))
            .map(str::to_owned);
        let Some(op) = op else {
            kept.push(item);
            continue;
        };
        if seen.contains(&op) {
            return Err(PlanError::InQueryPaging(format!(
                "Multiple '{op}' clauses are not permitted"
            )));
        }
        let argument = item.get(1).filter(|arg| !arg.is_null()).ok_or_else(|| {
            PlanError::InQueryPaging(format!("Received '{op}' clause without an argument"))
        })?;
        match op.as_str() {
            "limit" => paging.limit = Some(in_query_count(&op, argument)?),
            "offset" => paging.offset = Some(in_query_count(&op, argument)?),
            _ => paging.order = Some(in_query_order(argument)?),
        }
        seen.push(op);
    }
    *items = kept;
    Ok(paging)
}

fn in_query_count(op: &str, argument: &Value) -> Result<u64, PlanError> {
    argument.as_u64().ok_or_else(|| {
        PlanError::InQueryPaging(format!(
            "in-query {op} must be a non-negative integer, not {argument}"
        ))
    })
}

/// `["order_by", [field | [field] | [field, "asc"|"desc"], ...]]`, read as PuppetDB's
/// `process-order-by` does.
fn in_query_order(argument: &Value) -> Result<Vec<(String, Direction)>, PlanError> {
    let bad = |entry: &Value| {
        PlanError::InQueryPaging(format!(
            "in-query order_by entry {entry} is not a field or [field, \"asc\"|\"desc\"]"
        ))
    };
    let Some(entries) = argument.as_array() else {
        return Err(bad(argument));
    };
    entries
        .iter()
        .map(|entry| match entry {
            Value::String(field) => Ok((field.clone(), Direction::Ascending)),
            Value::Array(pair) => {
                let field = pair
                    .first()
                    .and_then(Value::as_str)
                    .ok_or_else(|| bad(entry))?;
                let direction = match pair.get(1).map(|d| d.as_str().map(str::to_lowercase)) {
                    None => Direction::Ascending,
                    Some(Some(d)) if d == "asc" => Direction::Ascending,
                    Some(Some(d)) if d == "desc" => Direction::Descending,
                    Some(_) => return Err(bad(entry)),
                };
                if pair.len() > 2 {
                    return Err(bad(entry));
                }
                Ok((field.to_owned(), direction))
            }
            other => Err(bad(other)),
        })
        .collect()
}

/// Projects upstream every `group_by` entry the extract does not project, so each row carries
/// the values that tell its group apart. Returns the helper column names (dropped on output).
fn add_helper_columns(ast: &mut Value, analysis: &Analysis) -> Result<Vec<String>, PlanError> {
    let mut helpers: Vec<String> = Vec::new();
    let mut columns: Vec<Value> = Vec::new();
    for item in &analysis.group_by {
        match item {
            GroupByItem::Field(field) => {
                if !analysis.plain_columns.contains(field) && !helpers.contains(field) {
                    helpers.push(field.clone());
                    columns.push(Value::from(field.as_str()));
                }
            }
            GroupByItem::Function(function) if function.is_row_function() => {
                if analysis.function_columns.contains(function) {
                    continue;
                }
                let name = &function.name;
                let taken = analysis.function_columns.iter().any(|f| &f.name == name)
                    || analysis.plain_columns.contains(name)
                    || helpers.contains(name);
                if taken {
                    return Err(PlanError::GroupByClash { name: name.clone() });
                }
                helpers.push(name.clone());
                let mut call = vec![Value::from("function"), Value::from(name.as_str())];
                call.extend(function.args.iter().cloned());
                columns.push(Value::Array(call));
            }
            // An aggregate in group_by is PuppetDB's to refuse.
            GroupByItem::Function(_) => {}
        }
    }
    if columns.is_empty() {
        return Ok(helpers);
    }
    if let Some(extract) = outer_extract_mut(ast) {
        match extract.get_mut(1) {
            Some(Value::Array(projected)) => projected.extend(columns),
            Some(single @ Value::String(_)) => {
                let mut all = vec![single.take()];
                all.extend(columns);
                *single = Value::Array(all);
            }
            _ => {}
        }
    }
    Ok(helpers)
}

/// The first `extract` outside every subquery, as `query::analyze` finds it: at the top or under
/// `and`/`or`/`not` and a top-level `from`.
fn outer_extract_mut(node: &mut Value) -> Option<&mut Vec<Value>> {
    let items = node.as_array_mut()?;
    let first_child = match items.first().and_then(Value::as_str)? {
        "extract" => return Some(items),
        "and" | "or" | "not" => 1,
        "from" => 2,
        _ => return None,
    };
    let found = items
        .iter()
        .enumerate()
        .skip(first_child)
        .find(|(_, child)| has_outer_extract(child))
        .map(|(index, _)| index)?;
    outer_extract_mut(items.get_mut(found)?)
}

fn has_outer_extract(node: &Value) -> bool {
    let Some(items) = node.as_array() else {
        return false;
    };
    match items.first().and_then(Value::as_str) {
        Some("extract") => true,
        Some("and" | "or" | "not") => items.iter().skip(1).any(has_outer_extract),
        Some("from") => items.iter().skip(2).any(has_outer_extract),
        _ => false,
    }
}
