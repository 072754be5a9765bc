//! A combined aggregate as a fan-out: which requests each backend gets (one per planned upstream
//! part, with node ownership pushed down), and the response built from their answers.

use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderValue, Method, StatusCode};

use super::{CombineKind, CombinePlan, Part, Upstream, UpstreamPath, EVENT_COUNTS_PATH};
use crate::config::{Config, MergeStrategy};
use crate::ids::BackendId;
use crate::membership::{Ownership, Scope};
use crate::message::Response;
use crate::outbound::{self, Pushdown};
use crate::query::{Params, QueryText};
use crate::route::{CountEndpoint, Entity, Route};
use crate::sort::OrderEntity;

/// A planned combine fan-out.
#[derive(Debug)]
pub(crate) struct CombineFanOut {
    plan: CombinePlan,
    upstreams: Vec<Upstream>,
    path: String,
    /// For a node-scoped combine, the owners' strategy and the query's scope of nodes.
    node_scope: Option<(MergeStrategy, Scope)>,
    pushdown: Option<Pushdown>,
}

/// One backend's answers, one body per planned part, in order.
pub(crate) struct BackendParts<'a> {
    pub(crate) backend: BackendId,
    pub(crate) bodies: Vec<&'a [u8]>,
    pub(crate) records: Option<u64>,
}

/// What combining produced.
pub(crate) struct CombineResult {
    pub(crate) response: Option<Response>,
    pub(crate) contributed: usize,
    pub(crate) unusable: Vec<(BackendId, String)>,
}

/// Which combine a route takes for its query, if any: an extract with a function column on the
/// record routes and `/resources`, and the event-count endpoints always. `Err` is the 400.
pub(crate) fn combine_kind(route: &Route, params: &Params) -> Option<CombineKind> {
    let entity = match route {
        Route::Merged(Entity::Nodes) => OrderEntity::Nodes {
            include_facts_expiration: params
                .get("include_facts_expiration")
                .is_some_and(|v| v.eq_ignore_ascii_case("true")),
        },
        Route::Merged(Entity::Facts) | Route::FactsByName { .. } => OrderEntity::Facts,
        Route::Merged(Entity::Reports) => OrderEntity::Reports,
        Route::Merged(Entity::Events) => OrderEntity::Events,
        Route::Resources => OrderEntity::Resources,
        Route::Combined(CountEndpoint::EventCounts) => return Some(CombineKind::EventCounts),
        Route::Combined(CountEndpoint::AggregateEventCounts) => {
            return Some(CombineKind::AggregateEventCounts)
        }
        _ => return None,
    };
    Some(CombineKind::Extract(entity))
}

impl CombineFanOut {
    /// Plans the combine for a request: `None` when the route does not combine this query,
    /// `Some(Err(response))` for a refusal (400), else the fan-out.
    pub(crate) fn plan(
        route: &Route,
        path: &str,
        raw_query: Option<&str>,
        config: &Arc<Config>,
    ) -> Option<Result<CombineFanOut, Response>> {
        let params = Params::parse(raw_query);
        let kind = combine_kind(route, &params)?;
        let plan = match CombinePlan::plan(kind, &params) {
            Ok(Some(plan)) => plan,
            Ok(None) => return None,
            Err(error) => {
                return Some(Err(Response::text(
                    StatusCode::BAD_REQUEST,
                    error.to_string(),
                )))
            }
        };
        let latest_report = || {
            params
                .query_text()
                .as_ast()
                .is_some_and(|ast| crate::query::analyze(ast).uses_latest_report)
        };
        let strategy = match route {
            Route::Merged(Entity::Nodes) => Some(MergeStrategy::Freshness),
            Route::Merged(Entity::Facts) | Route::FactsByName { .. } | Route::Resources => {
                Some(config.merge)
            }
            _ if latest_report() => Some(MergeStrategy::Freshness),
            _ => None,
        };
        let history = !matches!(
            route,
            Route::Merged(Entity::Nodes | Entity::Facts)
                | Route::FactsByName { .. }
                | Route::Resources
        );
        let scope = outbound::scope_of(raw_query, history);
        let node_scope = strategy.map(|strategy| (strategy, scope));
        let upstreams = plan.upstream();
        Some(Ok(CombineFanOut {
            plan,
            upstreams,
            path: path.to_owned(),
            node_scope,
            pushdown: None,
        }))
    }

    /// Adds the membership snapshot a node-scoped combine pushes down.
    pub(crate) fn attach(&mut self, ownership: Option<Arc<Ownership>>) {
        if let (Some((strategy, scope)), Some(ownership)) = (self.node_scope, ownership) {
            self.pushdown = Some((ownership, strategy, scope));
        }
    }

    /// How many upstream requests each backend gets.
    pub(crate) fn parts(&self) -> usize {
        self.upstreams.len()
    }

    /// The request for one backend's part.
    pub(crate) fn upstream_request(
        &self,
        backend: BackendId,
        part: usize,
        asked: &[BackendId],
    ) -> (Method, String, Option<Bytes>) {
        let Some(upstream) = self.upstreams.get(part) else {
            return (Method::GET, self.path.clone(), None);
        };
        let path = match upstream.path {
            UpstreamPath::Same => self.path.as_str(),
            UpstreamPath::EventCounts => EVENT_COUNTS_PATH,
        };
        let mut params = upstream.params.clone();
        let mut rewritten = false;
        if let Some(pushdown) = &self.pushdown {
            let query = params.query_text();
            let pushable = matches!(query, QueryText::Absent | QueryText::Ast(_));
            if pushable {
                if let Some(owned) = outbound::owned_query(query.as_ast(), pushdown, backend, asked)
                {
                    params.set("query", &owned.to_string());
                    rewritten = true;
                }
            }
        }
        outbound::request(path, &params, rewritten)
    }

    /// Folds the backends' answers; a backend whose answer cannot be read is reported unusable.
    pub(crate) fn combine(&self, answers: &[BackendParts<'_>]) -> CombineResult {
        let parts: Vec<Part<'_>> = answers
            .iter()
            .map(|answer| Part {
                bodies: &answer.bodies,
                records: answer.records,
            })
            .collect();
        let combined = self.plan.combine(&parts);
        let unusable: Vec<(BackendId, String)> = combined
            .unusable
            .iter()
            .filter_map(|(index, error)| Some((answers.get(*index)?.backend, error.to_string())))
            .collect();
        let contributed = answers.len().saturating_sub(unusable.len());
        if contributed == 0 {
            return CombineResult {
                response: None,
                contributed,
                unusable,
            };
        }
        let mut response = Response::json(StatusCode::OK, combined.body);
        if let Some(total) = combined.total {
            response
                .headers
                .insert(crate::exchange::X_RECORDS, HeaderValue::from(total));
        }
        CombineResult {
            response: Some(response),
            contributed,
            unusable,
        }
    }
}
