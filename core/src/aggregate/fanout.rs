//! A combined aggregate as a plan: which requests each backend gets (one per planned upstream
//! part), how a node two backends hold, or a report two backends store, is counted once, and the
//! response built from their answers.
//!
//! Counting once (docs/merging.md, "What it costs" and "Corrections"): an aggregate that
//! subtracts (`count`, `sum`, history's `avg`) is asked of every backend as the client asked it,
//! and each backend is also asked the same aggregate over the few certnames it counts too often
//! (nodes it holds for another owner; nodes whose history another backend holds too), learned
//! once per membership snapshot and subtracted. One that does not (`min`, `max` over node-owned
//! records, a row-function extract) gets ownership pushed into its query.

use std::sync::Arc;

use http::{HeaderValue, StatusCode};

use super::{
    CombineKind, CombinePlan, Correction, Part, Upstream, UpstreamPath, EVENT_COUNTS_PATH,
};
use crate::config::Config;
use crate::corrections::Learned;
use crate::entity::{Combine, Entity};
use crate::fanout::{Calls, Context, CorrectionCall, Outbound, Plan, Step, Verdict};
use crate::ids::BackendId;
use crate::membership::Scope;
use crate::message::Response;
use crate::outbound;
use crate::ownership::{narrow, NodeScope, Owning};
use crate::query::{Params, ParsedQuery, QueryText};
use crate::status::Unusable;

/// A planned combine fan-out.
#[derive(Debug, Clone)]
pub(crate) struct AggregatePlan {
    plan: CombinePlan,
    upstreams: Vec<Upstream>,
    path: String,
    /// For a combine over node-owned records (or history with `latest_report?`): whose records
    /// count.
    node_scope: Option<NodeScope>,
    /// How nodes or reports counted twice are counted once, when the fold subtracts.
    correction: Option<Correction>,
    pinned: Option<Vec<String>>,
    pushable: bool,
    /// History filtered by `node_state`: each backend's filter widened to the nodes that moved
    /// away from it (docs/merging.md, "History counted once").
    history_node_state: bool,
    asked: Vec<BackendId>,
    excused: usize,
    /// The correction each backend is asked for, or was known already; set by [`Plan::start`].
    corrections: Vec<CorrectionCall>,
}

/// One backend's bodies, one per part, and the `X-Records` of its first.
struct Bodies<'a> {
    bodies: Vec<&'a [u8]>,
    records: Option<u64>,
    correction: Option<&'a [u8]>,
}

/// Which combine a route takes for its query, if any: an extract with a function column on the
/// entities whose extracts fold, and the event-count endpoints always.
pub(crate) fn combine_kind(entity: Entity) -> Option<CombineKind> {
    match entity.combine() {
        Combine::EventCounts => Some(CombineKind::EventCounts),
        Combine::AggregateEventCounts => Some(CombineKind::AggregateEventCounts),
        Combine::Extracts => Some(CombineKind::Extract(entity)),
        Combine::Never => None,
    }
}

impl AggregatePlan {
    /// Plans the combine for a request on a route of `entity`: `None` when the route does not
    /// combine this query, `Some(Err(response))` for a refusal (400), else the plan.
    pub(crate) fn plan(
        entity: Entity,
        path: &str,
        params: &Params,
        query: &Arc<ParsedQuery>,
        config: &Arc<Config>,
    ) -> Option<Result<AggregatePlan, Response>> {
        let kind = combine_kind(entity)?;
        let mut plan = match CombinePlan::plan(kind, params, query) {
            Ok(Some(plan)) => plan,
            Ok(None) => return None,
            Err(error) => return Some(Err(error.response())),
        };
        let analysis = query.analysis();
        let latest_report = analysis.is_some_and(|a| a.uses_latest_report);
        let names_node_state = analysis.is_some_and(|a| a.names_node_state);
        let node_owned = entity.is_node_owned() || (entity.is_history() && latest_report);
        let pushable = matches!(query.text(), QueryText::Absent | QueryText::Ast(_));
        let node_scope = node_owned.then(|| NodeScope::of(entity, config.merge, names_node_state));
        let correction = match (node_owned, entity.history(), pushable) {
            (_, _, false) => None,
            (true, _, true) => plan.correct(Correction::Owned),
            (false, Some(history), true) => plan.correct(Correction::History {
                column: history.report_column,
                records: history.records,
            }),
            (false, None, true) => None,
        };
        let upstreams = plan.upstream();
        let history_node_state = entity.is_history() && !node_owned && pushable && names_node_state;
        Some(Ok(AggregatePlan {
            plan,
            upstreams,
            path: path.to_owned(),
            node_scope,
            correction,
            pinned: analysis.and_then(|a| a.pinned_certnames.clone()),
            pushable,
            history_node_state,
            asked: Vec::new(),
            excused: 0,
            corrections: Vec::new(),
        }))
    }

    fn owning<'a>(&'a self, context: &'a Context) -> Option<Owning<'a>> {
        Some(Owning {
            ownership: context.ownership.as_deref()?,
            scope: self.node_scope?,
            asked: &self.asked,
        })
    }

    /// The certnames `backend` counts too often: the nodes it holds for other owners, or those
    /// whose history another backend holds too (only those among the query's pinned ones).
    fn counted_twice<'a>(&'a self, backend: BackendId, context: &'a Context) -> Vec<&'a str> {
        match self.correction {
            Some(Correction::Owned) => self
                .owning(context)
                .map_or_else(Vec::new, |o| o.excluded(backend, self.pinned.as_deref())),
            Some(Correction::History { .. }) => {
                let Some(ownership) = context.ownership.as_deref() else {
                    return Vec::new();
                };
                let mut shared = ownership.shared_with_others(backend, Scope::Any);
                if let Some(pinned) = &self.pinned {
                    shared.retain(|c| pinned.binary_search_by(|p| p.as_str().cmp(c)).is_ok());
                }
                shared
            }
            None => Vec::new(),
        }
    }

    /// `query` with its `node_state` filter widened for `backend`, when this is history
    /// filtered by state and the backend holds nodes that moved away; `None` when unchanged.
    fn widened(
        &self,
        backend: BackendId,
        query: Option<&serde_json::Value>,
        context: &Context,
    ) -> Option<serde_json::Value> {
        if !self.history_node_state {
            return None;
        }
        let revived = context.ownership.as_deref()?.revived(backend);
        crate::query::widen_node_state(query?, &revived)
    }

    /// The part number of the correction request (after the planned parts).
    fn correction_part(&self) -> usize {
        self.upstreams.len()
    }
}

impl Plan for AggregatePlan {
    fn again(&self) -> Box<dyn Plan> {
        Box::new(self.clone())
    }

    fn needs_ownership(&self) -> bool {
        self.node_scope.is_some()
            || self.correction.is_some()
            || self.pinned.is_some()
            || self.history_node_state
    }

    fn counts_rounds(&self) -> bool {
        true
    }

    fn start(&mut self, context: &Context) -> Vec<(BackendId, usize)> {
        self.asked = context.roster.clone();
        if let (Some(pinned), Some(ownership)) = (&self.pinned, context.ownership.as_deref()) {
            let narrowed = narrow(&context.roster, ownership, self.node_scope, pinned);
            if !narrowed.is_empty() {
                self.asked = narrowed;
            }
        }
        self.excused = context.roster.len() - self.asked.len();
        let generation = context.ownership.as_ref().map(|o| o.generation());
        let mut corrections = Vec::new();
        for &backend in &self.asked {
            let certnames = self.counted_twice(backend, context);
            if certnames.is_empty() {
                continue;
            }
            let Some((path, mut params, query)) = self.plan.correction_params(&certnames) else {
                continue;
            };
            if let Some(widened) = self.widened(backend, Some(&query), context) {
                params.set("query", &widened.to_string());
            }
            let path = path.unwrap_or(&self.path);
            let outbound = outbound::request(path, &params, true);
            let key = format!("{path}?{}", params.to_query_string());
            let known = generation
                .and_then(|generation| context.corrections.get(generation, backend, &key))
                .cloned();
            corrections.push(CorrectionCall {
                backend,
                outbound,
                key,
                known,
            });
        }
        self.corrections = corrections;
        let mut calls: Vec<(BackendId, usize)> = self
            .asked
            .iter()
            .flat_map(|&backend| (0..self.upstreams.len()).map(move |part| (backend, part)))
            .collect();
        let correction_part = self.correction_part();
        calls.extend(
            self.corrections
                .iter()
                .filter(|c| c.known.is_none())
                .map(|c| (c.backend, correction_part)),
        );
        calls
    }

    fn request(&self, backend: BackendId, part: usize, context: &Context) -> Outbound {
        if part == self.correction_part() {
            if let Some(correction) = self.corrections.iter().find(|c| c.backend == backend) {
                return correction.request();
            }
        }
        let Some(upstream) = self.upstreams.get(part) else {
            return Outbound::get(self.path.clone());
        };
        let path = match upstream.path {
            UpstreamPath::Same => self.path.as_str(),
            UpstreamPath::EventCounts => EVENT_COUNTS_PATH,
        };
        let mut params = upstream.params.clone();
        // The planned query, rewritten for this backend only where it must be.
        let planned = self.plan.upstream_ast();
        let mut rewritten = self.widened(backend, planned, context);
        // Without a correction, a node-owned aggregate is made exact by pushing ownership down.
        let push = self.correction.is_none() && self.pushable;
        if let (Some(owning), true) = (self.owning(context), push) {
            let excluded = owning.excluded(backend, self.pinned.as_deref());
            if !excluded.is_empty() {
                let query = rewritten.as_ref().or(planned);
                if let Some(owned) = crate::query::exclude_certnames(query, &excluded) {
                    rewritten = Some(owned);
                }
            }
        }
        if let Some(query) = &rewritten {
            params.set("query", &query.to_string());
        }
        outbound::request(path, &params, rewritten.is_some())
    }

    fn progress(&mut self, calls: &Calls, _context: &Context) -> Step {
        if !calls.all_done() {
            return Step::Wait;
        }
        let parts = self.upstreams.len();
        let correction_part = self.correction_part();
        // Each backend whose every part (and correction) succeeded.
        let mut backends: Vec<(BackendId, Bodies<'_>)> = Vec::new();
        let mut incomplete = Vec::new();
        for &backend in &self.asked {
            let bodies: Option<Vec<&[u8]>> = (0..parts)
                .map(|part| calls.success(backend, part).map(|(_, body)| &body[..]))
                .collect();
            let correction = self.corrections.iter().find(|c| c.backend == backend);
            let correction_body = correction.map(|c| match &c.known {
                Some(known) => Some(&known[..]),
                None => calls
                    .success(backend, correction_part)
                    .map(|(_, body)| &body[..]),
            });
            match (bodies, correction_body) {
                (Some(_), Some(None)) => incomplete.push(backend),
                (Some(bodies), correction) => {
                    let records = calls.success(backend, 0).and_then(|(headers, _)| {
                        headers
                            .get(crate::message::X_RECORDS)
                            .and_then(|v| v.to_str().ok()?.trim().parse().ok())
                    });
                    backends.push((
                        backend,
                        Bodies {
                            bodies,
                            records,
                            correction: correction.flatten(),
                        },
                    ));
                }
                (None, _) if calls.success(backend, 0).is_some() => incomplete.push(backend),
                (None, _) => {}
            }
        }
        let parts_view: Vec<Part<'_>> = backends
            .iter()
            .map(|(_, answer)| Part {
                bodies: &answer.bodies,
                records: answer.records,
                correction: answer.correction,
            })
            .collect();
        let combined = self.plan.combine(&parts_view);
        let mut unusable: Vec<(BackendId, Unusable)> = combined
            .unusable
            .iter()
            .filter_map(|(index, error)| Some((backends.get(*index)?.0, error.clone())))
            .collect();
        unusable.extend(
            incomplete
                .into_iter()
                .map(|b| (b, Unusable::IncompleteParts)),
        );
        let contributed = backends.len().saturating_sub(combined.unusable.len());
        if contributed == 0 {
            return Step::Done(Verdict::Unanswered { part: 0, unusable });
        }
        let mut response = Response::json(StatusCode::OK, combined.body);
        if let Some(total) = combined.total {
            response
                .headers
                .insert(crate::message::X_RECORDS, HeaderValue::from(total));
        }
        Step::Done(Verdict::Merged {
            response,
            contributed: contributed + self.excused,
            unusable,
        })
    }

    fn learned(&self, calls: &Calls) -> Vec<Learned> {
        CorrectionCall::learned(&self.corrections, calls, self.correction_part())
    }
}
