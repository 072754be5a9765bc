//! Record merges: `/nodes`, `/facts`, `/facts/<name>[/<value>]`, `/fact-names`, `/environments`,
//! `/reports` and `/events`.
//!
//! A [`RecordPlan`] reads the request once (paging, query shape, provenance gates), builds each
//! backend's upstream request (over-fetching `offset + limit`, pushing node ownership down,
//! DECISIONS.md D4), and merges the answers into one body: deduped, re-sorted in PostgreSQL's
//! order (D11) and re-paged.

mod facts;
mod names;
mod nodes;
mod rows;
mod union;

use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, StatusCode};
use percent_encoding::percent_decode_str;

use crate::config::{Config, MergeStrategy};
use crate::ids::BackendId;
use crate::membership::{Ownership, Scope};
use crate::message::Response;
use crate::outbound;
use crate::query::{analyze, Analysis, Params, QueryText};
use crate::route::{Entity, Route};
use crate::sort::{self, OrderBy, OrderEntity};

pub(crate) use facts::filter_source_records;
pub(crate) use rows::Window;

/// What the provenance fact does for this request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Provenance {
    /// Injection is off: records pass untouched.
    Off,
    /// Drop upstream records named like the source fact; inject nothing (a gated shape).
    DropOnly,
    /// Drop upstream records of that name and inject one synthetic record per node.
    Inject,
    /// `/facts/<source_fact>[/<value>]`: answer only the synthetic records (those naming `value`).
    SyntheticOnly { value: Option<String> },
}

/// One backend's usable answer.
pub(crate) struct Answer<'a> {
    pub(crate) backend: BackendId,
    pub(crate) headers: &'a HeaderMap,
    pub(crate) body: &'a Bytes,
}

/// The result of merging: the response and how many backends contributed, or the backends whose
/// bodies could not be used (counted as failed, D7).
pub(crate) struct Merged {
    pub(crate) response: Option<Response>,
    pub(crate) contributed: usize,
    pub(crate) unusable: Vec<(BackendId, String)>,
}

/// Backends whose answers could not be used, with the reason.
pub(crate) type Unusable = Vec<(BackendId, String)>;

/// A backend's records, parsed as raw JSON and borrowed from its body.
pub(crate) type Parsed<'a> = Vec<(BackendId, Vec<&'a serde_json::value::RawValue>)>;

/// Parses every answer's body as an array of raw records; a body that does not parse makes its
/// backend unusable (D7). `Err` holds every backend's reason when no body parsed at all.
pub(crate) fn parse_answers<'a>(
    answers: &[Answer<'a>],
) -> Result<(Parsed<'a>, Unusable), Unusable> {
    parse_answers_with(answers, crate::records::parse_array)
}

/// [`parse_answers`] with another parse of each body (one that also reads fields, say).
pub(crate) fn parse_answers_with<'a, T>(
    answers: &[Answer<'a>],
    parse: impl Fn(&'a [u8]) -> Result<T, serde_json::Error>,
) -> Result<(Vec<(BackendId, T)>, Unusable), Unusable> {
    let mut unusable = Vec::new();
    let mut parsed = Vec::new();
    for answer in answers {
        match parse(answer.body) {
            Ok(records) => parsed.push((answer.backend, records)),
            Err(error) => unusable.push((answer.backend, format!("unparseable body: {error}"))),
        }
    }
    if parsed.is_empty() {
        return Err(unusable);
    }
    Ok((parsed, unusable))
}

impl Merged {
    /// No backend's answer was usable: the exchange answers with the status policy.
    pub(crate) fn nothing(unusable: Unusable) -> Merged {
        Merged {
            response: None,
            contributed: 0,
            unusable,
        }
    }
}

/// A planned record merge.
#[derive(Debug)]
pub(crate) struct RecordPlan {
    /// Which merge: the entity of the route (`/facts/<name>` merges as facts).
    pub(crate) kind: Entity,
    config: Arc<Config>,
    upstream_path: String,
    params: Params,
    query: QueryText,
    analysis: Option<Analysis>,
    pub(crate) order: Option<OrderBy>,
    pub(crate) window: Window,
    pub(crate) include_total: bool,
    pub(crate) provenance: Provenance,
    /// For a node-scoped merge, the strategy that picks owners and the scope of nodes the query
    /// sees; [`RecordPlan::attach`] adds the snapshot.
    node_scope: Option<(MergeStrategy, Scope)>,
    /// The ownership snapshot and the strategy that picks owners, for node-scoped merges.
    pushdown: Option<outbound::Pushdown>,
}

/// What planning decided.
pub(crate) enum Planned {
    /// Fan out and merge.
    FanOut(Box<RecordPlan>),
    /// Answer without asking any backend (a refusal, or an answer known from config alone).
    Respond(Response),
}

/// A 400 in PuppetDB's style (plain text).
fn bad_request(message: impl Into<String>) -> Response {
    Response::text(StatusCode::BAD_REQUEST, message)
}

impl RecordPlan {
    /// Plans a record merge for a merged route, or answers it directly.
    pub(crate) fn plan(
        route: &Route,
        path: &str,
        raw_query: Option<&str>,
        config: &Arc<Config>,
    ) -> Planned {
        let params = Params::parse(raw_query);
        let query = params.query_text();
        let analysis = query.as_ast().map(analyze);
        let source_fact = config.source_fact.as_str();
        let (kind, upstream_path, facts_path_name) = match route {
            Route::Merged(entity) => (*entity, path.to_owned(), None),
            Route::FactsByName { name, value } => {
                let decoded = percent_decode_str(name).decode_utf8_lossy().into_owned();
                if decoded == source_fact {
                    // The synthetic fact's own path is answered from the /facts merge.
                    let value = value
                        .as_ref()
                        .map(|v| percent_decode_str(v).decode_utf8_lossy().into_owned());
                    (Entity::Facts, "/pdb/query/v4/facts".to_owned(), Some(value))
                } else {
                    (Entity::Facts, path.to_owned(), None)
                }
            }
            _ => {
                return Planned::Respond(Response::text(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "pdbmux: not a record route",
                ))
            }
        };

        let order_entity = match kind {
            Entity::Nodes => OrderEntity::Nodes {
                include_facts_expiration: params
                    .get("include_facts_expiration")
                    .is_some_and(|v| v.eq_ignore_ascii_case("true")),
            },
            Entity::Facts => OrderEntity::Facts,
            Entity::FactNames => OrderEntity::FactNames,
            Entity::Environments => OrderEntity::Environments,
            Entity::Reports => OrderEntity::Reports,
            Entity::Events => OrderEntity::Events,
        };
        let paging = match sort::parse_paging(
            params.get("order_by"),
            params.get("limit"),
            params.get("offset"),
            order_entity,
        ) {
            Ok(paging) => paging,
            Err(error) => return Planned::Respond(bad_request(error.to_string())),
        };
        let order = (!paging.order_by.is_empty()).then_some(paging.order_by);
        let include_total = params
            .get("include_total")
            .is_some_and(sort::parse_include_total);
        let (limit, offset) = (paging.limit, paging.offset.unwrap_or(0));
        let window = Window { offset, limit };

        let provenance = if kind != Entity::Facts || !config.source_fact_enabled {
            match facts_path_name {
                // The synthetic path answers [] while injection is off.
                Some(_) => return Planned::Respond(Response::json(StatusCode::OK, "[]")),
                None => Provenance::Off,
            }
        } else {
            let gated = match &query {
                QueryText::Pql(_) | QueryText::Malformed(_) => true,
                QueryText::Absent => false,
                QueryText::Ast(_) => analysis
                    .as_ref()
                    .is_some_and(|a| a.extract_outside_subquery || a.outer_name_constraint),
            } || window.is_paged();
            match facts_path_name {
                Some(value) => {
                    if gated {
                        return Planned::Respond(Response::json(StatusCode::OK, "[]"));
                    }
                    if let Some(value) = &value {
                        if !config.backends.iter().any(|b| &b.name == value) {
                            return Planned::Respond(Response::json(StatusCode::OK, "[]"));
                        }
                    }
                    Provenance::SyntheticOnly { value }
                }
                None if route != &Route::Merged(Entity::Facts) => Provenance::DropOnly,
                None if gated => Provenance::DropOnly,
                None => Provenance::Inject,
            }
        };

        let node_scoped = matches!(kind, Entity::Nodes | Entity::Facts)
            || (matches!(kind, Entity::Reports | Entity::Events)
                && analysis.as_ref().is_some_and(|a| a.uses_latest_report));
        let strategy = match kind {
            Entity::Facts => config.merge,
            _ => MergeStrategy::Freshness,
        };
        let history = matches!(kind, Entity::Reports | Entity::Events);
        let scope = outbound::scope_of(raw_query, history);
        let node_scope = node_scoped.then_some((strategy, scope));

        Planned::FanOut(Box::new(RecordPlan {
            kind,
            config: Arc::clone(config),
            upstream_path,
            params,
            query,
            analysis,
            order,
            window,
            include_total,
            provenance,
            node_scope,
            pushdown: None,
        }))
    }

    /// Adds the membership snapshot a node-scoped merge pushes down (planning happens before the
    /// estate knows whether it must wait for one).
    pub(crate) fn attach(&mut self, ownership: Option<Arc<Ownership>>) {
        if let (Some((strategy, scope)), Some(ownership)) = (self.node_scope, ownership) {
            self.pushdown = Some((ownership, strategy, scope));
        }
    }

    /// Whether the outer query projects columns (an extract): rows keep their shape untouched.
    pub(crate) fn is_projection(&self) -> bool {
        self.analysis
            .as_ref()
            .is_some_and(|a| !a.plain_columns.is_empty() || a.has_function_column())
    }

    /// The owner of `certname` for this merge, if the membership map knows it.
    pub(crate) fn owner(&self, certname: &str) -> Option<BackendId> {
        let (ownership, strategy, scope) = self.pushdown.as_ref()?;
        ownership
            .owners(certname, *scope)
            .map(|owners| owners.under(*strategy))
    }

    /// The upstream request for one backend: method, path and query, and a POST body when the
    /// rewritten query is too long for a URL.
    pub(crate) fn upstream_request(
        &self,
        backend: BackendId,
        asked: &[BackendId],
    ) -> (Method, String, Option<Bytes>) {
        let mut params = self.params.clone();
        match self.kind {
            Entity::FactNames => {
                // The merged list is paged here; each backend sends its whole list.
                params.remove("limit");
                params.remove("offset");
                params.remove("include_total");
            }
            _ => {
                params.remove("offset");
                match self.window.upstream_limit() {
                    Some(limit) => params.set("limit", &limit.to_string()),
                    None => {
                        params.remove("limit");
                    }
                }
            }
        }
        let mut rewritten = false;
        let pushable = match &self.query {
            QueryText::Absent => true,
            QueryText::Ast(_) => !self.analysis.as_ref().is_some_and(|a| a.in_query_paging),
            QueryText::Pql(_) | QueryText::Malformed(_) => false,
        };
        let mut query = self.query.as_ast().cloned();
        // A paged /facts window must not lose records to the provenance drop after the backend
        // cut it: ask the backends not to return records of that name at all.
        if self.kind == Entity::Facts
            && self.provenance != Provenance::Off
            && self.window.is_paged()
            && pushable
        {
            let clause = serde_json::json!(["not", ["=", "name", self.config.source_fact]]);
            query = Some(crate::query::add_clause(query.as_ref(), clause));
            rewritten = true;
        }
        if let (Some(pushdown), true) = (&self.pushdown, pushable) {
            if let Some(owned) = outbound::owned_query(query.as_ref(), pushdown, backend, asked) {
                query = Some(owned);
                rewritten = true;
            }
        }
        if rewritten {
            if let Some(query) = &query {
                params.set("query", &query.to_string());
            }
        }
        outbound::request(&self.upstream_path, &params, rewritten)
    }

    /// Merges the backends' answers (configured order) into one response.
    pub(crate) fn merge(&self, answers: &[Answer<'_>]) -> Merged {
        match self.kind {
            Entity::Nodes => nodes::merge(self, answers),
            Entity::Facts => facts::merge(self, answers),
            Entity::FactNames => names::merge(self, answers),
            Entity::Environments => union::merge(self, answers, union::Identity::Name),
            Entity::Reports => union::merge(self, answers, union::Identity::Hash),
            Entity::Events => union::merge(self, answers, union::Identity::Verbatim),
        }
    }

    /// The configuration.
    pub(crate) fn config(&self) -> &Config {
        &self.config
    }

    /// The JSON response for a merged body, with X-Records when a total was asked for.
    pub(crate) fn respond(&self, body: Vec<u8>, total: Option<u64>) -> Response {
        let mut response = Response::json(StatusCode::OK, body);
        if let (true, Some(total)) = (self.include_total, total) {
            if let Ok(value) = HeaderValue::from_str(&total.to_string()) {
                response.headers.insert(crate::exchange::X_RECORDS, value);
            }
        }
        response
    }

    /// The total to report: the merged count when the request is not paged (exact), else the sum
    /// of the backends' X-Records (an upper bound where records can repeat across backends).
    pub(crate) fn total(&self, merged: usize, answers: &[Answer<'_>]) -> Option<u64> {
        if !self.include_total {
            return None;
        }
        if !self.window.is_paged() {
            return Some(merged as u64);
        }
        Some(
            answers
                .iter()
                .filter_map(|a| a.headers.get(crate::exchange::X_RECORDS))
                .filter_map(|v| v.to_str().ok()?.trim().parse::<u64>().ok())
                .sum(),
        )
    }
}

#[cfg(test)]
mod tests;
