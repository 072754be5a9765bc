//! Combined answers: extract aggregates, `/event-counts` and `/aggregate-event-counts`.
//!
//! An aggregate row is a count, not a record, so each backend returns a partial answer that is
//! folded rather than deduped (spec "Merge semantics" → Aggregates; DECISIONS.md D4, D5, D11).
//! Use it in three steps, all pure:
//!
//! 1. [`CombinePlan::plan`] reads the request before any fan-out; an `Err` is a 400 whose text
//!    is the error's `Display`; `Ok(None)` (an extract with no function column) means the
//!    request is not combined.
//! 2. [`CombinePlan::upstream`] gives the requests every backend gets, before ownership is
//!    pushed down (D4).
//! 3. [`CombinePlan::combine`] folds the backends' answers (configured order) into the body.

mod counts_filter;
mod event_counts;
mod extract;
mod fanout;
mod fold;
mod object;
mod values;

#[cfg(test)]
mod prop_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_events;

use serde_json::value::RawValue;

use self::counts_filter::CountsFilter;
use self::extract::ExtractPlan;
use crate::merge::Window;
use crate::query::{CombineRefusal, Params};
use crate::records::{parse_array, write_array};
use crate::sort::{self, OrderBy, OrderEntity, PagingError};
use crate::status::Unusable;

pub(crate) use self::counts_filter::CountsFilterError;
pub(crate) use self::fanout::AggregatePlan;

/// The path `/aggregate-event-counts` is answered from (D5).
pub(crate) const EVENT_COUNTS_PATH: &str = "/pdb/query/v4/event-counts";

/// Which combined answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CombineKind {
    /// An extract with a function column on `/reports`, `/events`, `/nodes`, `/resources`,
    /// `/facts` or `/facts/<name>[/<value>]`; the entity decides the `order_by` columns.
    Extract(OrderEntity),
    /// `/event-counts`.
    EventCounts,
    /// `/aggregate-event-counts`.
    AggregateEventCounts,
}

/// Why a request cannot be combined: a 400 before any fan-out, its `Display` the body.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum PlanError {
    /// An extract shape no fold can answer (repeated function, avg beside sum/count, ...).
    #[error(transparent)]
    Refusal(#[from] CombineRefusal),
    /// A malformed `order_by`, `limit` or `offset` (PuppetDB's own text).
    #[error(transparent)]
    Paging(#[from] PagingError),
    /// A `counts_filter` PuppetDB would refuse.
    #[error(transparent)]
    CountsFilter(#[from] CountsFilterError),
    /// `distinct_resources=true` on an `/events` extract with a function column.
    #[error("distinct_resources cannot be combined with extract functions; puppetdb answers distinct_resources queries from its legacy query compiler, which supports neither function nor group_by")]
    DistinctResources,
    /// A required parameter is missing (PuppetDB's text).
    #[error("Missing required query parameter '{0}'")]
    MissingParam(&'static str),
    /// A parameter the endpoint does not take (PuppetDB's text).
    #[error("Unsupported query parameter '{0}'")]
    UnsupportedParam(String),
    /// A `summarize_by` value other than `certname`, `resource`, `containing_class`.
    #[error("Unsupported value for 'summarize_by': '{0}'")]
    SummarizeBy(String),
    /// Malformed in-query paging (`["limit",..]`, `["offset",..]`, `["order_by",..]`).
    #[error("{0}")]
    InQueryPaging(String),
    /// A `group_by` row function the extract does not project, whose column name a projected
    /// column already takes: the helper column pdbmux needs would be aliased.
    #[error("group_by function {name} is not projected and its column clashes with a projected {name}; pdbmux cannot tell its groups apart")]
    GroupByClash {
        /// The function name.
        name: String,
    },
}

/// Where an upstream request goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum UpstreamPath {
    /// The client's own path.
    Same,
    /// [`EVENT_COUNTS_PATH`] (`/aggregate-event-counts`, D5).
    EventCounts,
}

/// One request every backend gets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Upstream {
    /// Where it goes.
    pub(crate) path: UpstreamPath,
    /// Its parameters; push ownership into `query` (D4) before sending.
    pub(crate) params: Params,
}

/// One backend's answer to the planned requests.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Part<'a> {
    /// One 200 body per [`CombinePlan::upstream`] request, in that order.
    pub(crate) bodies: &'a [&'a [u8]],
    /// The `X-Records` of its answer, if any: read only for a paged row-function extract.
    pub(crate) records: Option<u64>,
}

/// The combined answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Combined {
    /// The response body (a JSON array).
    pub(crate) body: Vec<u8>,
    /// `X-Records` to send: `Some` only when the request asked for a total.
    pub(crate) total: Option<u64>,
    /// Backends (index into the parts) whose answers were left out, and why.
    pub(crate) unusable: Vec<(usize, Unusable)>,
}

/// A planned combine: built from the request before any fan-out.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct CombinePlan {
    params: Params,
    mode: Mode,
    include_total: bool,
}

#[derive(Debug, Clone, PartialEq)]
enum Mode {
    Extract(ExtractPlan),
    EventCounts {
        filter: Option<CountsFilter>,
        order: OrderBy,
        window: Window,
    },
    Aggregate {
        filter: Option<CountsFilter>,
        /// The summarize_by values as listed (one summary object each).
        listed: Vec<&'static str>,
        /// The distinct values, one upstream request each.
        requests: Vec<&'static str>,
    },
}

impl CombinePlan {
    /// Plans the combine of a request on a combined route. `Ok(None)`: an extract route whose
    /// query has no function column (not an AST, or no `["function", ...]` column), which takes
    /// the record path instead.
    pub(crate) fn plan(
        kind: CombineKind,
        params: &Params,
        query: Option<(&serde_json::Value, &crate::query::Analysis)>,
    ) -> Result<Option<CombinePlan>, PlanError> {
        let include_total = params
            .get("include_total")
            .is_some_and(sort::parse_include_total);
        let mode = match kind {
            CombineKind::Extract(entity) => {
                let Some((ast, analysis)) = query else {
                    return Ok(None);
                };
                if !analysis.has_function_column() {
                    return Ok(None);
                }
                Mode::Extract(extract::plan(entity, params, ast, analysis)?)
            }
            CombineKind::EventCounts => event_counts::plan_event_counts(params)?,
            CombineKind::AggregateEventCounts => event_counts::plan_aggregate(params)?,
        };
        Ok(Some(CombinePlan {
            params: params.clone(),
            mode,
            include_total,
        }))
    }

    /// [`CombinePlan::plan`] with the query read from `params`, as a request's planning reads it.
    #[cfg(test)]
    pub(crate) fn from_params(
        kind: CombineKind,
        params: &Params,
    ) -> Result<Option<CombinePlan>, PlanError> {
        let query = params.query_text();
        let analysis = query.as_ast().map(crate::query::analyze);
        CombinePlan::plan(kind, params, query.as_ast().zip(analysis.as_ref()))
    }

    /// The requests each backend gets, in the order [`Part::bodies`] answers them: one, except
    /// for `/aggregate-event-counts`, which asks `/event-counts` once per distinct
    /// `summarize_by` value (PuppetDB's `/event-counts` takes a single value).
    pub(crate) fn upstream(&self) -> Vec<Upstream> {
        let mut params = self.params.clone();
        match &self.mode {
            Mode::Extract(plan) => {
                if let Some(query) = &plan.upstream_query {
                    params.set("query", query);
                }
                if plan.fold.is_some() {
                    for key in ["limit", "offset", "order_by", "include_total"] {
                        params.remove(key);
                    }
                } else {
                    params.remove("offset");
                    match plan.upstream_limit {
                        Some(limit) => params.set("limit", &limit.to_string()),
                        None => {
                            params.remove("limit");
                        }
                    }
                }
                vec![Upstream {
                    path: UpstreamPath::Same,
                    params,
                }]
            }
            Mode::EventCounts { .. } => {
                for key in event_counts::EVENT_COUNTS_LOCAL {
                    params.remove(key);
                }
                vec![Upstream {
                    path: UpstreamPath::Same,
                    params,
                }]
            }
            Mode::Aggregate { requests, .. } => {
                params.remove("counts_filter");
                requests
                    .iter()
                    .map(|value| {
                        let mut params = params.clone();
                        params.set("summarize_by", value);
                        Upstream {
                            path: UpstreamPath::EventCounts,
                            params,
                        }
                    })
                    .collect()
            }
        }
    }

    /// Folds the backends' answers (configured order) into the response body. A backend whose
    /// answer cannot be read is left out and reported in [`Combined::unusable`]; when every
    /// backend is, the body is what no rows combine to, and the caller should answer as for a
    /// round no backend answered.
    pub(crate) fn combine(&self, parts: &[Part<'_>]) -> Combined {
        let expected = match &self.mode {
            Mode::Aggregate { requests, .. } => requests.len(),
            _ => 1,
        };
        let mut unusable = Vec::new();
        let mut usable: Vec<(usize, Vec<Vec<&RawValue>>)> = Vec::new();
        for (index, part) in parts.iter().enumerate() {
            if part.bodies.len() != expected {
                unusable.push((index, Unusable::IncompleteParts));
                continue;
            }
            let parsed: Result<Vec<_>, _> =
                part.bodies.iter().map(|body| parse_array(body)).collect();
            match parsed {
                Ok(bodies) => usable.push((index, bodies)),
                Err(error) => unusable.push((index, Unusable::Unparseable(error.to_string()))),
            }
        }
        let (body, total) = match &self.mode {
            Mode::Extract(plan) => combine_extract(plan, parts, usable, &mut unusable),
            Mode::EventCounts {
                filter,
                order,
                window,
            } => {
                let rows = event_counts::read_counts(usable, &mut unusable)
                    .into_iter()
                    .flatten();
                let subjects = event_counts::merge(rows.collect(), filter.as_ref());
                let (rows, count) = event_counts::event_counts(&subjects, order, *window);
                (write_rows(&rows), count as u64)
            }
            Mode::Aggregate {
                filter,
                listed,
                requests,
            } => {
                // Request by request, each backend's rows: a backend with one bad body is left
                // out of every summary, so they all count the same backends.
                let mut by_request: Vec<Vec<_>> = requests.iter().map(|_| Vec::new()).collect();
                for backend in event_counts::read_counts(usable, &mut unusable) {
                    for (rows, request) in backend.into_iter().zip(by_request.iter_mut()) {
                        request.push(rows);
                    }
                }
                let summaries: Vec<(&str, String)> = requests
                    .iter()
                    .zip(by_request)
                    .map(|(value, rows)| {
                        let subjects = event_counts::merge(rows, filter.as_ref());
                        (*value, event_counts::summary(value, &subjects))
                    })
                    .collect();
                let objects: Vec<&str> = listed
                    .iter()
                    .filter_map(|value| summaries.iter().find(|(v, _)| v == value))
                    .map(|(_, object)| object.as_str())
                    .collect();
                let capacity = objects.iter().map(|o| o.len() + 1).sum();
                (write_array(objects, capacity), listed.len() as u64)
            }
        };
        unusable.sort_by_key(|(index, _)| *index);
        Combined {
            body,
            total: self.include_total.then_some(total),
            unusable,
        }
    }
}

fn combine_extract(
    plan: &ExtractPlan,
    parts: &[Part<'_>],
    usable: Vec<(usize, Vec<Vec<&RawValue>>)>,
    unusable: &mut Vec<(usize, Unusable)>,
) -> (Vec<u8>, u64) {
    let rows: Vec<Box<RawValue>> = match &plan.fold {
        Some(fold_plan) => {
            let mut backends = Vec::new();
            for (index, bodies) in &usable {
                let rows = bodies.first().map_or(&[][..], Vec::as_slice);
                match fold::parse(fold_plan, rows) {
                    Ok(parsed) => backends.push(parsed),
                    Err(error) => unusable.push((*index, error)),
                }
            }
            fold::fold_rows(fold_plan, backends)
        }
        None => usable
            .iter()
            .flat_map(|(_, bodies)| bodies.first().into_iter().flatten())
            .map(|raw| (*raw).to_owned())
            .collect(),
    };
    let count = rows.len() as u64;
    let total = match (&plan.fold, plan.upstream_limit) {
        // Rows cut upstream: the backends' own totals (ownership keeps them disjoint, D4).
        (None, Some(_)) => usable
            .iter()
            .filter_map(|(index, _)| parts.get(*index).and_then(|part| part.records))
            .sum(),
        _ => count,
    };
    let rows = sort::sort_stable(rows, &plan.order, |row| {
        let object = crate::records::Fields::of(row.get()).unwrap_or_default();
        sort::sort_key(&plan.order, |field| object.raw(field))
    });
    let rows = plan.window.apply(rows);
    let rows = match &plan.fold {
        Some(fold_plan) => fold::drop_helpers(fold_plan, rows),
        None => rows,
    };
    (write_rows(&rows), total)
}

fn write_rows(rows: &[Box<RawValue>]) -> Vec<u8> {
    let capacity = rows.iter().map(|row| row.get().len() + 1).sum();
    write_array(rows.iter().map(|row| row.get()), capacity)
}
