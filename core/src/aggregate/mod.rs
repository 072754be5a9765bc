//! Combined answers: extract aggregates, `/event-counts` and `/aggregate-event-counts`.
//!
//! An aggregate row is a count, not a record, so each backend returns a partial answer that is
//! folded rather than deduped (docs/merging.md "Aggregates"; docs/decisions.md D4, D5, D11).
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

use std::sync::Arc;

use serde_json::value::RawValue;

use self::counts_filter::CountsFilter;
use self::extract::ExtractPlan;
use crate::entity::{Entity, SummarizeBy};
use crate::merge::Window;
use crate::query::{CombineRefusal, Params, ParsedQuery};
use crate::records::{parse_array, write_array};
use crate::sort::{self, OrderBy, PagingError};
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
    Extract(Entity),
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

impl PlanError {
    /// The 400 answering it: PuppetDB's own text exactly where PuppetDB would refuse the same
    /// request, pdbmux's message (with its newline) where only the merge cannot answer it.
    pub(crate) fn response(&self) -> crate::message::Response {
        match self {
            PlanError::Refusal(_)
            | PlanError::DistinctResources
            | PlanError::GroupByClash { .. } => {
                crate::message::Response::text(http::StatusCode::BAD_REQUEST, self.to_string())
            }
            _ => crate::message::Response::refusal(self.to_string()),
        }
    }
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
    /// Its answer to the correction request ([`CombinePlan::correction_params`]), when the
    /// combine corrects and the backend holds nodes the correction is about.
    pub(crate) correction: Option<&'a [u8]>,
}

/// How a combine makes what backends count more than once count once (docs/merging.md,
/// "Corrections"). Each backend is asked the same question over a few certnames, and the
/// answers are subtracted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Correction {
    /// Node-owned counts: each backend's count over the nodes it holds but another owns.
    Owned,
    /// History: every report stored in several backends, once per extra copy. `column` names
    /// the report on the entity (`hash` on `/reports`, `report` on `/events`).
    History {
        /// The report's column.
        column: &'static str,
        /// The entity whose records are counted (`/events` for the event counts): the
        /// correction of a count asks it.
        records: crate::entity::Entity,
    },
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
    /// The request's query, read once when it was planned.
    query: Arc<ParsedQuery>,
    mode: Mode,
    include_total: bool,
    correction: Option<Correction>,
}

#[derive(Debug, Clone, PartialEq)]
enum Mode {
    Extract(ExtractPlan),
    EventCounts {
        summarize_by: SummarizeBy,
        count_by_certname: bool,
        filter: Option<CountsFilter>,
        order: OrderBy,
        window: Window,
    },
    Aggregate {
        count_by_certname: bool,
        filter: Option<CountsFilter>,
        /// The summarize_by values as listed (one summary object each).
        listed: Vec<SummarizeBy>,
        /// The distinct values, one upstream request each.
        requests: Vec<SummarizeBy>,
    },
}

impl CombinePlan {
    /// Plans the combine of a request on a combined route. `Ok(None)`: an extract route whose
    /// query has no function column (not an AST, or no `["function", ...]` column), which takes
    /// the record path instead.
    pub(crate) fn plan(
        kind: CombineKind,
        params: &Params,
        query: &Arc<ParsedQuery>,
    ) -> Result<Option<CombinePlan>, PlanError> {
        let include_total = params
            .get("include_total")
            .is_some_and(sort::parse_include_total);
        let mode = match kind {
            CombineKind::Extract(entity) => {
                let Some((ast, analysis)) = query.ast().zip(query.analysis()) else {
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
            query: Arc::clone(query),
            mode,
            include_total,
            correction: None,
        }))
    }

    /// Corrects the answer with `correction` when this combine can (a count that subtracts;
    /// for history, any additive column), preparing the upstream query for it; the correction
    /// in effect. `None`: the combine cannot be corrected, and node ownership must be pushed
    /// into the query instead.
    pub(crate) fn correct(&mut self, correction: Correction) -> Option<Correction> {
        let fits = match (&mut self.mode, correction) {
            (Mode::Extract(plan), Correction::Owned) if plan.subtracts() => {
                plan.count_rows();
                true
            }
            (Mode::Extract(plan), Correction::History { .. }) => plan.counts_history(),
            (Mode::EventCounts { .. }, Correction::Owned) => true,
            // Only the plain event counts: the distinct-resources form is another query.
            (Mode::EventCounts { .. } | Mode::Aggregate { .. }, Correction::History { .. }) => {
                !self.params.contains("distinct_resources")
            }
            _ => false,
        };
        self.correction = fits.then_some(correction);
        self.correction
    }

    /// The query every part is asked with ([`CombinePlan::upstream`]): an extract's as
    /// rewritten, else the request's own; `None` when the request has no AST query.
    pub(crate) fn upstream_ast(&self) -> Option<&serde_json::Value> {
        match &self.mode {
            Mode::Extract(plan) => Some(&plan.upstream),
            Mode::EventCounts { .. } | Mode::Aggregate { .. } => self.query.ast(),
        }
    }

    /// The correction request of a backend over `certnames` (the nodes it holds for others, or
    /// those whose history another backend holds too): part 0's parameters with its query
    /// restricted to them, on part 0's path; for history event counts, an `/events` extract
    /// ([`event_counts::history_correction`]). `None` for the path means part 0's. The query
    /// set in the parameters comes too, built from the planned AST, for a caller that rewrites it.
    pub(crate) fn correction_params(
        &self,
        certnames: &[&str],
    ) -> Option<(Option<&'static str>, Params, serde_json::Value)> {
        let correction = self.correction?;
        let mut params = self.upstream().into_iter().next()?.params;
        let (path, query) = match (&self.mode, correction) {
            (Mode::Extract(plan), Correction::Owned) => {
                (None, plan.correction_query(certnames, None)?)
            }
            (Mode::Extract(plan), Correction::History { column, .. }) => {
                (None, plan.correction_query(certnames, Some(column))?)
            }
            (Mode::EventCounts { .. }, Correction::Owned) => (
                None,
                crate::query::add_clause(
                    self.query.ast(),
                    crate::query::only_certnames_clause(certnames),
                ),
            ),
            (
                Mode::EventCounts { .. } | Mode::Aggregate { .. },
                Correction::History { records, .. },
            ) => {
                let query = event_counts::history_correction(self.query.ast(), certnames);
                params = Params::default();
                (Some(records.path_static()), query)
            }
            _ => return None,
        };
        params.set("query", &query.to_string());
        Some((path, params, query))
    }

    /// [`CombinePlan::plan`] with the query read from `params`, as a request's planning reads it.
    #[cfg(test)]
    pub(crate) fn from_params(
        kind: CombineKind,
        params: &Params,
    ) -> Result<Option<CombinePlan>, PlanError> {
        let query = Arc::new(ParsedQuery::new(params.query_text()));
        CombinePlan::plan(kind, params, &query)
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
                    for key in crate::query::WINDOW_PARAMS {
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
                        params.set("summarize_by", value.as_str());
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
        let corrections = self.read_corrections(parts, &usable, &mut unusable);
        let usable: Vec<_> = usable
            .into_iter()
            .filter(|(index, _)| !unusable.iter().any(|(bad, _)| bad == index))
            .collect();
        let (body, total) = match &self.mode {
            Mode::Extract(plan) => combine_extract(
                plan,
                parts,
                usable,
                &corrections,
                self.correction,
                &mut unusable,
            ),
            Mode::EventCounts {
                summarize_by,
                count_by_certname,
                filter,
                order,
                window,
            } => {
                let counted = Counted {
                    requests: &[*summarize_by],
                    count_by_certname: *count_by_certname,
                    filter: filter.as_ref(),
                };
                let merged = self.count(&counted, usable, &corrections, &mut unusable);
                let subjects = merged.first().map_or(&[][..], |(_, s)| s.as_slice());
                let (rows, count) = event_counts::event_counts(subjects, order, *window);
                (write_rows(&rows), count as u64)
            }
            Mode::Aggregate {
                count_by_certname,
                filter,
                listed,
                requests,
            } => {
                let counted = Counted {
                    requests,
                    count_by_certname: *count_by_certname,
                    filter: filter.as_ref(),
                };
                let merged = self.count(&counted, usable, &corrections, &mut unusable);
                let objects: Vec<String> = listed
                    .iter()
                    .filter_map(|value| merged.iter().find(|(v, _)| v == value))
                    .map(|(value, subjects)| event_counts::summary(*value, subjects))
                    .collect();
                let capacity = objects.iter().map(|o| o.len() + 1).sum();
                let body = write_array(objects.iter().map(String::as_str), capacity);
                (body, listed.len() as u64)
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

impl CombinePlan {
    /// Each usable part's correction rows (index into the parts); a part whose correction does
    /// not parse is unusable, as one without the correction it needs.
    fn read_corrections<'a>(
        &self,
        parts: &[Part<'a>],
        usable: &[(usize, Vec<Vec<&'a RawValue>>)],
        unusable: &mut Vec<(usize, Unusable)>,
    ) -> Vec<(usize, Vec<&'a RawValue>)> {
        if self.correction.is_none() {
            return Vec::new();
        }
        let mut out = Vec::new();
        for (index, _) in usable {
            let Some(body) = parts.get(*index).and_then(|part| part.correction) else {
                continue;
            };
            match parse_array(body) {
                Ok(rows) => out.push((*index, rows)),
                Err(error) => unusable.push((*index, Unusable::Unparseable(error.to_string()))),
            }
        }
        out
    }
}

/// What an event-count mode counts: one `/event-counts` request per `summarize_by` value.
struct Counted<'p> {
    requests: &'p [SummarizeBy],
    count_by_certname: bool,
    filter: Option<&'p CountsFilter>,
}

impl CombinePlan {
    /// The event-count modes' subjects: per request, the backends' rows summed and corrected,
    /// then filtered. A backend whose answer or correction does not read is left out whole.
    fn count<'a>(
        &self,
        counted: &Counted<'_>,
        usable: Vec<(usize, Vec<Vec<&'a RawValue>>)>,
        corrections: &[(usize, Vec<&'a RawValue>)],
        unusable: &mut Vec<(usize, Unusable)>,
    ) -> Vec<(SummarizeBy, Vec<event_counts::Subject<'a>>)> {
        let mut owned = Vec::new();
        let mut history = Vec::new();
        for (index, rows) in corrections {
            let read = match self.correction {
                Some(Correction::Owned) => {
                    event_counts::parse(rows).map(|r| owned.push((*index, r)))
                }
                Some(Correction::History { .. }) => {
                    event_counts::read_history(rows).map(|r| history.push((*index, r)))
                }
                None => Ok(()),
            };
            if let Err(error) = read {
                unusable.push((*index, error));
            }
        }
        let left_out = |unusable: &[(usize, Unusable)], index: usize| {
            unusable.iter().any(|(bad, _)| *bad == index)
        };
        let usable: Vec<_> = usable
            .into_iter()
            .filter(|(index, _)| !left_out(unusable, *index))
            .collect();
        let answers = event_counts::read_counts(usable, unusable);
        owned.retain(|(index, _)| !left_out(unusable, *index));
        history.retain(|(index, _)| !left_out(unusable, *index));
        let corrected = !owned.is_empty() || !history.is_empty();
        let history: Vec<_> = history.into_iter().map(|(_, rows)| rows).collect();
        // Request by request, each backend's rows: a backend with one bad body is left out of
        // every summary, so they all count the same backends.
        let mut by_request: Vec<Vec<(i64, Vec<_>)>> =
            counted.requests.iter().map(|_| Vec::new()).collect();
        for (_, bodies) in answers {
            for (rows, request) in bodies.into_iter().zip(by_request.iter_mut()) {
                request.push((1, rows));
            }
        }
        // An owned correction is one `/event-counts` request: only `/event-counts` takes one.
        if let Some(first) = by_request.first_mut() {
            first.extend(owned.into_iter().map(|(_, rows)| (-1, rows)));
        }
        counted
            .requests
            .iter()
            .zip(by_request)
            .map(|(&summarize_by, rows)| {
                let mut subjects = event_counts::merge(rows);
                let twice =
                    event_counts::counted_twice(&history, summarize_by, counted.count_by_certname);
                event_counts::subtract(&mut subjects, &twice);
                let subjects = event_counts::filtered(subjects, counted.filter, corrected);
                (summarize_by, subjects)
            })
            .collect()
    }
}

/// The fold's weighted rows: every usable answer once, then what the corrections subtract.
fn corrected_rows<'a>(
    fold_plan: &extract::Fold,
    usable: &[(usize, Vec<Vec<&'a RawValue>>)],
    corrections: &[(usize, Vec<&'a RawValue>)],
    correction: Option<Correction>,
    unusable: &mut Vec<(usize, Unusable)>,
) -> Vec<(i64, Vec<fold::FoldParsed<'a>>)> {
    let mut weighted = Vec::new();
    for (index, bodies) in usable {
        let rows = bodies.first().map_or(&[][..], Vec::as_slice);
        match fold::parse(fold_plan, rows, None) {
            Ok(parsed) => weighted.push((1, parsed)),
            Err(error) => unusable.push((*index, error)),
        }
    }
    let corrections: Vec<&(usize, Vec<&'a RawValue>)> = corrections
        .iter()
        .filter(|(index, _)| !unusable.iter().any(|(bad, _)| bad == index))
        .collect();
    match correction {
        None => {}
        Some(Correction::Owned) => {
            for (index, rows) in corrections {
                match fold::parse(fold_plan, rows, None) {
                    Ok(parsed) => weighted.push((-1, parsed)),
                    Err(error) => unusable.push((*index, error)),
                }
            }
        }
        Some(Correction::History { column, .. }) => {
            // A report's row for one group from every backend that stores the report: each copy
            // past the first is counted too often.
            let mut copies: std::collections::BTreeMap<
                (String, String),
                Vec<fold::FoldParsed<'a>>,
            > = std::collections::BTreeMap::new();
            for (index, rows) in corrections {
                match fold::parse(fold_plan, rows, Some(column)) {
                    Ok(parsed) => {
                        for row in parsed {
                            let report = row.column(column).unwrap_or_default();
                            let group = row.group().to_owned();
                            copies.entry((report, group)).or_default().push(row);
                        }
                    }
                    Err(error) => unusable.push((*index, error)),
                }
            }
            for mut rows in copies.into_values() {
                let extra = rows.len() as i64 - 1;
                if extra > 0 {
                    rows.truncate(1);
                    weighted.push((-extra, rows));
                }
            }
        }
    }
    weighted
}

fn combine_extract(
    plan: &ExtractPlan,
    parts: &[Part<'_>],
    usable: Vec<(usize, Vec<Vec<&RawValue>>)>,
    corrections: &[(usize, Vec<&RawValue>)],
    correction: Option<Correction>,
    unusable: &mut Vec<(usize, Unusable)>,
) -> (Vec<u8>, u64) {
    let rows: Vec<Box<RawValue>> = match &plan.fold {
        Some(fold_plan) => {
            let weighted = corrected_rows(fold_plan, &usable, corrections, correction, unusable);
            fold::fold_rows(fold_plan, weighted, correction == Some(Correction::Owned))
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
