//! A combined aggregate as a plan: which requests each backend gets (one per planned upstream
//! part, with node ownership pushed down where the aggregate counts nodes), and the response
//! built from their answers.

use std::sync::Arc;

use http::{HeaderValue, StatusCode};

use super::{CombineKind, CombinePlan, Part, Upstream, UpstreamPath, EVENT_COUNTS_PATH};
use crate::config::Config;
use crate::entity::Entity;
use crate::fanout::{Calls, Context, Outbound, Plan, Step, Verdict};
use crate::ids::BackendId;
use crate::message::Response;
use crate::outbound;
use crate::ownership::{narrow, NodeScope, Owning};
use crate::query::{Analysis, Params, QueryText};
use crate::status::Unusable;

/// A planned combine fan-out.
#[derive(Debug)]
pub(crate) struct AggregatePlan {
    plan: CombinePlan,
    upstreams: Vec<Upstream>,
    path: String,
    /// For a combine over node-owned records (or history with `latest_report?`): whose records
    /// count.
    node_scope: Option<NodeScope>,
    pinned: Option<Vec<String>>,
    pushable: bool,
    asked: Vec<BackendId>,
    excused: usize,
}

/// One backend's bodies, one per part, and the `X-Records` of its first.
struct Bodies<'a> {
    bodies: Vec<&'a [u8]>,
    records: Option<u64>,
}

/// Which combine a route takes for its query, if any: an extract with a function column on the
/// entities whose extracts fold, and the event-count endpoints always.
pub(crate) fn combine_kind(entity: Entity, params: &Params) -> Option<CombineKind> {
    match entity {
        Entity::EventCounts => Some(CombineKind::EventCounts),
        Entity::AggregateEventCounts => Some(CombineKind::AggregateEventCounts),
        _ if entity.folds_extracts() => {
            let include_facts_expiration = params
                .get("include_facts_expiration")
                .is_some_and(|v| v.eq_ignore_ascii_case("true"));
            entity
                .order_entity(include_facts_expiration)
                .map(CombineKind::Extract)
        }
        _ => None,
    }
}

impl AggregatePlan {
    /// Plans the combine for a request on a route of `entity`: `None` when the route does not
    /// combine this query, `Some(Err(response))` for a refusal (400), else the plan.
    pub(crate) fn plan(
        entity: Entity,
        path: &str,
        params: &Params,
        query: &QueryText,
        analysis: Option<&Analysis>,
        config: &Arc<Config>,
    ) -> Option<Result<AggregatePlan, Response>> {
        let kind = combine_kind(entity, params)?;
        let plan = match CombinePlan::plan(kind, params, query.as_ast().zip(analysis)) {
            Ok(Some(plan)) => plan,
            Ok(None) => return None,
            Err(error) => {
                return Some(Err(Response::text(
                    StatusCode::BAD_REQUEST,
                    error.to_string(),
                )))
            }
        };
        let latest_report = analysis.is_some_and(|a| a.uses_latest_report);
        let node_owned = entity.is_node_owned() || (entity.is_history() && latest_report);
        let node_scope =
            node_owned.then(|| NodeScope::of(entity, config.merge, params.get("query")));
        let upstreams = plan.upstream();
        Some(Ok(AggregatePlan {
            plan,
            upstreams,
            path: path.to_owned(),
            node_scope,
            pinned: analysis.and_then(|a| a.pinned_certnames.clone()),
            pushable: matches!(query, QueryText::Absent | QueryText::Ast(_)),
            asked: Vec::new(),
            excused: 0,
        }))
    }

    fn owning<'a>(&'a self, context: &'a Context) -> Option<Owning<'a>> {
        Some(Owning {
            ownership: context.ownership.as_deref()?,
            scope: self.node_scope?,
            asked: &self.asked,
        })
    }
}

impl Plan for AggregatePlan {
    fn needs_ownership(&self) -> bool {
        self.node_scope.is_some() || self.pinned.is_some()
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
        self.asked
            .iter()
            .flat_map(|&backend| (0..self.upstreams.len()).map(move |part| (backend, part)))
            .collect()
    }

    fn request(&self, backend: BackendId, part: usize, context: &Context) -> Outbound {
        let Some(upstream) = self.upstreams.get(part) else {
            return Outbound::get(self.path.clone());
        };
        let path = match upstream.path {
            UpstreamPath::Same => self.path.as_str(),
            UpstreamPath::EventCounts => EVENT_COUNTS_PATH,
        };
        let mut params = upstream.params.clone();
        let mut rewritten = false;
        if let (Some(owning), true) = (self.owning(context), self.pushable) {
            let excluded = owning.excluded(backend, self.pinned.as_deref());
            let query = params.query_text();
            if !excluded.is_empty() {
                if let Some(owned) = crate::query::exclude_certnames(query.as_ast(), &excluded) {
                    params.set("query", &owned.to_string());
                    rewritten = true;
                }
            }
        }
        outbound::request(path, &params, rewritten)
    }

    fn progress(&mut self, calls: &Calls, _context: &Context) -> Step {
        if !calls.all_done() {
            return Step::Wait;
        }
        let parts = self.upstreams.len();
        // Each backend whose every part succeeded: its bodies and its first part's X-Records.
        let mut backends: Vec<(BackendId, Bodies<'_>)> = Vec::new();
        let mut incomplete = Vec::new();
        for &backend in &self.asked {
            let bodies: Option<Vec<&[u8]>> = (0..parts)
                .map(|part| calls.success(backend, part).map(|(_, body)| &body[..]))
                .collect();
            match bodies {
                Some(bodies) => {
                    let records = calls.success(backend, 0).and_then(|(headers, _)| {
                        headers
                            .get(crate::exchange::X_RECORDS)
                            .and_then(|v| v.to_str().ok()?.trim().parse().ok())
                    });
                    backends.push((backend, Bodies { bodies, records }));
                }
                None if calls.success(backend, 0).is_some() => incomplete.push(backend),
                None => {}
            }
        }
        let parts_view: Vec<Part<'_>> = backends
            .iter()
            .map(|(_, answer)| Part {
                bodies: &answer.bodies,
                records: answer.records,
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
                .insert(crate::exchange::X_RECORDS, HeaderValue::from(total));
        }
        Step::Done(Verdict::Merged {
            response,
            contributed: contributed + self.excused,
            unusable,
        })
    }
}
