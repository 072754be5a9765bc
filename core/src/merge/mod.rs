//! Record merges: every entity whose answer is a set of records (docs/merging.md, the entity
//! table): `/nodes`, the node-owned entities (`/facts` with its provenance, `/fact-contents`,
//! `/factsets`, `/catalogs`, `/edges`, `/resources`, `/inventory`, `/package-inventory`), the
//! unions (`/reports`, `/events`, `/environments`, `/producers`, `/fact-paths`, `/packages`)
//! and `/fact-names`.
//!
//! A [`RecordPlan`] reads the request once (paging, query shape, provenance gates), asks each
//! backend for `offset + limit` records and never an offset, and merges the answers into one
//! body: each node's records from its owner, each distinct record once, re-sorted in
//! PostgreSQL's order and re-paged. How ownership is made exact without making the backends
//! slower is in docs/merging.md ("What it costs"): an unpaged answer drops other owners' copies
//! here; a paged one over-fetches, drops, and asks a backend again with ownership pushed into
//! its query only when its page came up short; a query pinned to certnames goes to their owners
//! only; totals are corrected with counts learned once per membership snapshot.

mod collect;
mod facts;
mod names;
mod nodes;
mod owned;
mod rows;
mod union;

use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, StatusCode};
use percent_encoding::percent_decode_str;
use serde_json::Value;

use crate::config::Config;
use crate::corrections::Learned;
use crate::entity::{ColumnSet, Entity, Identity, MergeRule};
use crate::fanout::{Calls, Context, CorrectionCall, Outbound, Plan, Step, StreamStart, Verdict};
use crate::ids::BackendId;
use crate::membership::Scope;
use crate::message::{BodyMode, Response, ResponseBody};
use crate::outbound;
use crate::ownership::{narrow, NodeScope, Owning};
use crate::query::{self, Params, ParsedQuery, QueryText};
use crate::route::Route;
use crate::sort::{self, OrderBy};
use crate::status::Unusable;
use crate::streamed::{
    JoinedLater, MergeBroken, NodeRecords, RecordStream, StreamRule, StreamedProvenance,
};

pub(crate) use facts::filter_source_records;
pub(crate) use rows::{Unfilled, Window};

/// The first round's records.
const RECORDS: usize = 0;
/// A correction of the total (docs/merging.md, "Corrections").
const CORRECTION: usize = 1;
/// A page asked again with ownership pushed down, after the first came up short.
const PUSHED: usize = 2;

/// What the provenance fact does for this request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Provenance {
    /// Injection is off: records pass untouched.
    Off,
    /// Drop upstream records named like the source fact; inject nothing (a gated shape).
    DropOnly,
    /// Drop upstream records of that name and inject one synthetic record per node.
    Inject,
    /// `/facts/<source_fact>[/<value>]`, or a `/facts` query naming the provenance fact by name
    /// and value: answer only the synthetic records (those naming one of `values`, every
    /// backend's when `None`).
    SyntheticOnly { values: Option<Vec<String>> },
}

/// How a node-owned merge makes each node's records its owner's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Technique {
    /// Every answer is whole (unpaged): other owners' copies are dropped here.
    Drop,
    /// Paged: each backend over-fetches, other owners' copies are dropped here, and a backend
    /// whose page came up short is asked again with ownership pushed down.
    OverFetch,
    /// The records do not name their node (a projection without `certname`): ownership is
    /// pushed into every backend's query.
    Pushdown,
}

/// One backend's usable answer.
pub(crate) struct BackendPage<'a> {
    pub(crate) backend: BackendId,
    pub(crate) headers: &'a HeaderMap,
    pub(crate) body: &'a Bytes,
    /// The limit this answer was asked for (`None`: unlimited).
    pub(crate) limit: Option<u64>,
}

/// A merge's result: the body and the merged count (before the window), or the backends whose
/// pages came up short; and the backends whose bodies could not be used (counted as failed, D7).
pub(crate) struct Merged {
    pub(crate) body: Result<(Vec<u8>, usize), Unfilled>,
    pub(crate) contributed: usize,
    pub(crate) unusable: Unusables,
}

/// Backends whose answers could not be used, with the reason.
pub(crate) type Unusables = Vec<(BackendId, Unusable)>;

impl Merged {
    /// No backend's answer was usable: the exchange answers with the status policy.
    pub(crate) fn nothing(unusable: Unusables) -> Merged {
        Merged {
            body: Ok((Vec::new(), 0)),
            contributed: 0,
            unusable,
        }
    }
}

/// One backend this merge asks.
#[derive(Debug, Clone, Copy)]
struct BackendAsked {
    backend: BackendId,
    limit: Option<u64>,
    push: bool,
}

/// A backend's records, parsed as raw JSON and borrowed from its body.
pub(crate) type Parsed<'a, T> = Vec<(&'a BackendPage<'a>, T)>;

/// Parses every answer's body with `parse`; a body that does not parse makes its backend
/// unusable (D7). `Err` holds every backend's reason when no body parsed at all.
pub(crate) fn parse_answers<'a, T>(
    answers: &'a [BackendPage<'a>],
    parse: impl Fn(&'a [u8]) -> Result<T, serde_json::Error>,
) -> Result<(Parsed<'a, T>, Unusables), Unusables> {
    let mut unusable = Vec::new();
    let mut parsed = Vec::new();
    for answer in answers {
        match parse(answer.body) {
            Ok(records) => parsed.push((answer, records)),
            Err(error) => unusable.push((answer.backend, Unusable::Unparseable(error.to_string()))),
        }
    }
    if parsed.is_empty() {
        return Err(unusable);
    }
    Ok((parsed, unusable))
}

/// A planned record merge.
#[derive(Debug, Clone)]
pub(crate) struct RecordPlan {
    /// Which entity's records: the route's (`/facts/<name>` merges as facts).
    pub(crate) entity: Entity,
    config: Arc<Config>,
    upstream_path: String,
    params: Params,
    /// The request's query and its analysis, read once when the request was planned.
    query: Arc<ParsedQuery>,
    pub(crate) order: Option<OrderBy>,
    pub(crate) window: Window,
    pub(crate) include_total: bool,
    pub(crate) provenance: Provenance,
    /// For a node-owned merge (and history with `latest_report?`): whose records are kept, and
    /// how that is made exact.
    owned: Option<(NodeScope, Technique)>,
    /// A paged history total, corrected for reports stored in several backends (D16).
    history_total: bool,
    /// History filtered by `node_state`: each backend's filter is widened to the nodes that
    /// moved away from it (active elsewhere), which the estate counts active.
    history_node_state: bool,
    /// The fields a history projection is asked for beyond the client's, so that copies of one
    /// report (or event) can be told apart and served once; dropped from the answer.
    history_helpers: Vec<&'static str>,
    /// For a union entity derived from a node-owned one (`/packages`), asked with a query that
    /// shape allows: whose nodes count when a backend holding other owners' nodes is asked the
    /// distinct projection of the nodes it owns ([`Entity::distinct_of`]).
    distinct_owned: Option<NodeScope>,
    /// The backends asked, the limit each was asked for, and whether ownership was pushed into
    /// its first request; set by [`Plan::start`].
    asked: Vec<BackendAsked>,
    /// Backends in the roster that hold none of the certnames the query is pinned to.
    excused: usize,
    /// The corrections the total needs; set by [`Plan::start`].
    corrections: Vec<CorrectionCall>,
    /// Whether its records are streamed past `stream_above_bytes`; set by
    /// [`Plan::start`] ([`RecordPlan::can_stream`]).
    streamed: bool,
}

/// A 400 in PuppetDB's words.
fn bad_request(message: impl Into<String>) -> Response {
    Response::refusal(message)
}

impl RecordPlan {
    /// Plans a record merge for a route of `entity`, or answers it directly (a 400, or an answer
    /// known from the configuration alone).
    pub(crate) fn plan(
        route: &Route,
        entity: Entity,
        path: &str,
        params: Params,
        query: Arc<ParsedQuery>,
        config: &Arc<Config>,
    ) -> Result<RecordPlan, Box<Response>> {
        let analysis = query.analysis();
        let source_fact = config.source_fact.as_str();
        let (upstream_path, facts_path_name) = match route {
            Route::FactsByName { name, value } => {
                let decoded = percent_decode_str(name).decode_utf8_lossy().into_owned();
                if decoded == source_fact {
                    // The synthetic fact's own path is answered from the /facts merge.
                    let value = value
                        .as_ref()
                        .map(|v| percent_decode_str(v).decode_utf8_lossy().into_owned());
                    (entity.path(), Some(value))
                } else {
                    (path.to_owned(), None)
                }
            }
            _ => (path.to_owned(), None),
        };
        let columns = entity.order_columns(ColumnSet::facts_expiration(
            params.get("include_facts_expiration"),
        ));
        let paging = sort::parse_paging(
            params.get("order_by"),
            params.get("limit"),
            params.get("offset"),
            columns,
        )
        .map_err(|error| Box::new(bad_request(error.to_string())))?;
        let order = (!paging.order_by.is_empty()).then_some(paging.order_by);
        let include_total = params
            .get("include_total")
            .is_some_and(sort::parse_include_total);
        let window = Window {
            offset: paging.offset.unwrap_or(0),
            limit: paging.limit,
        };

        let provenance = if !entity.carries_provenance() || !config.source_fact_enabled {
            match facts_path_name {
                // The synthetic path answers [] while injection is off.
                Some(_) => return Err(Box::new(Response::json(StatusCode::OK, "[]"))),
                None => Provenance::Off,
            }
        } else {
            let gated = match query.text() {
                QueryText::Pql(_) | QueryText::Malformed(_) => true,
                QueryText::Absent => false,
                QueryText::Ast(_) => {
                    analysis.is_some_and(|a| a.extract_outside_subquery || a.outer_name_constraint)
                }
            } || window.is_paged();
            match facts_path_name {
                Some(value) => {
                    let known = value
                        .as_ref()
                        .is_none_or(|value| config.backends.iter().any(|b| &b.name == value));
                    if gated || !known {
                        return Err(Box::new(Response::json(StatusCode::OK, "[]")));
                    }
                    Provenance::SyntheticOnly {
                        values: value.map(|value| vec![value]),
                    }
                }
                None if route != &Route::Query(entity) => Provenance::DropOnly,
                None if gated => Provenance::DropOnly,
                None => Provenance::Inject,
            }
        };

        let latest_report = analysis.is_some_and(|a| a.uses_latest_report);
        let names_node_state = analysis.is_some_and(|a| a.names_node_state);
        let node_owned = entity.is_node_owned() || (entity.is_history() && latest_report);
        let names_node = match analysis {
            Some(a) if !a.plain_columns.is_empty() || a.has_function_column() => {
                a.plain_columns.iter().any(|c| c == "certname")
            }
            _ => true,
        };
        let pushable = match query.text() {
            QueryText::Absent => true,
            QueryText::Ast(_) => !analysis.is_some_and(|a| a.in_query_paging),
            QueryText::Pql(_) | QueryText::Malformed(_) => false,
        };
        let technique = match (names_node, window.is_paged(), pushable) {
            (true, false, _) | (true, true, false) => Some(Technique::Drop),
            (true, true, true) => Some(Technique::OverFetch),
            (false, _, true) => Some(Technique::Pushdown),
            (false, _, false) => None,
        };
        let owned = match (node_owned, technique) {
            (true, Some(technique)) => Some((
                NodeScope::of(entity, config.merge, names_node_state),
                technique,
            )),
            _ => None,
        };
        let history_total =
            entity.is_history() && include_total && window.is_paged() && pushable && !node_owned;
        let history_node_state = entity.is_history() && !node_owned && pushable && names_node_state;
        // Whether or not `latest_report?` makes the history node-owned: one backend's own rows
        // are not merged by their projected content either (D22).
        let history_helpers = match (analysis, pushable) {
            (Some(a), true) if !a.plain_columns.is_empty() && !a.has_function_column() => {
                // The fields that tell one stored report (or event) from another, so that the
                // copies several backends store are served once (docs/merging.md, "History
                // counted once").
                entity
                    .history()
                    .map_or(&[][..], |history| history.identity)
                    .iter()
                    .copied()
                    .filter(|field| !a.plain_columns.iter().any(|c| c == field))
                    .collect()
            }
            _ => Vec::new(),
        };

        let distinct_owned = entity
            .distinct_of()
            .filter(|(_, columns)| pushable && query::is_filter_on(query.ast(), columns))
            .map(|_| NodeScope {
                strategy: config.merge,
                kind: entity.kind(),
                scope: Scope::Any,
            });

        Ok(RecordPlan {
            entity,
            config: Arc::clone(config),
            upstream_path,
            params,
            query,
            order,
            window,
            include_total,
            provenance,
            owned,
            history_total,
            history_helpers,
            history_node_state,
            distinct_owned,
            asked: Vec::new(),
            excused: 0,
            corrections: Vec::new(),
            streamed: false,
        })
    }

    /// What a streamed merge of `asked` does with the provenance fact (`/facts`).
    fn streamed_provenance(&self, asked: &[BackendId]) -> Option<StreamedProvenance> {
        let inject = match self.provenance {
            Provenance::Off | Provenance::SyntheticOnly { .. } => return None,
            Provenance::DropOnly => None,
            Provenance::Inject => Some(
                asked
                    .iter()
                    .map(|backend| {
                        crate::status::backend_name(&self.config.backends, *backend).to_owned()
                    })
                    .collect(),
            ),
        };
        Some(StreamedProvenance {
            source_fact: self.config.source_fact.clone(),
            inject,
        })
    }

    /// Whether this merge can stream in `context` (docs/merging.md, "Streamed merges"): unpaged,
    /// without a total, for a request whose answer no other client shares, the records of a
    /// node-owned entity that name their node, each kept or dropped by the membership snapshot
    /// alone (the provenance fact's synthetic records written with each node's; an ordered
    /// answer merged k-way, `/facts` with its synthetic records only when ordered by certname
    /// first), `/nodes`' whole records unordered or ordered by certname first, or history
    /// records (whole, or projected without functions), each copy once.
    fn can_stream(&self, context: &Context) -> bool {
        context.may_stream
            && !self.window.is_paged()
            && !self.include_total
            && self.stream_rule(context).is_some()
            && self.stream_order().is_none_or(|order| {
                // A node's synthetic provenance record sorts inside its node's records only
                // when the order keeps each node's records together.
                !matches!(self.provenance, Provenance::Inject)
                    || order.fields.first().is_some_and(|f| f.field == "certname")
            })
    }

    /// What a streamed merge of this plan keeps, when it can decide each record as it reads
    /// it: a node-owned entity's records dropped by ownership (its query not pushed down),
    /// `/nodes`' whole records unordered or ordered by certname first, or history's records
    /// (whole, or projected without functions, the fields added to tell copies apart dropped)
    /// by identity, with `latest_report?` by ownership too.
    fn stream_rule(&self, context: &Context) -> Option<StreamRule> {
        let ownership = context.ownership.as_ref();
        let dropped = |(scope, technique)| match technique {
            Technique::Drop => Some((Arc::clone(ownership?), scope)),
            Technique::OverFetch | Technique::Pushdown => None,
        };
        match self.entity.merge_rule() {
            MergeRule::Owned if !matches!(self.provenance, Provenance::SyntheticOnly { .. }) => {
                let (ownership, scope) = dropped(self.owned?)?;
                Some(StreamRule::Owned(ownership, scope))
            }
            // Ordered, by certname first: a node's copies sort together, so its record waits
            // for them briefly (in another order they could be anywhere in the answers, and a
            // composed field in the order could move the record).
            MergeRule::Node
                if !self.is_projection()
                    && self.stream_order().is_none_or(|order| {
                        order.fields.first().is_some_and(|f| f.field == "certname")
                    }) =>
            {
                let (ownership, scope) = dropped(self.owned?)?;
                let backends = &self.config.backends;
                Some(StreamRule::Node(NodeRecords::new(
                    ownership, scope, backends,
                )))
            }
            MergeRule::Union(identity @ (Identity::Hash | Identity::Verbatim))
                if self.entity.is_history()
                    && !self
                        .query
                        .analysis()
                        .is_some_and(|a| a.has_function_column()) =>
            {
                let owned = match self.owned {
                    Some(owned) => Some(dropped(owned)?),
                    None => None,
                };
                let helpers = self.history_helpers.clone();
                Some(StreamRule::History {
                    identity,
                    owned,
                    helpers,
                })
            }
            _ => None,
        }
    }

    /// The order a streamed merge keeps: the request's `order_by`, when it names a field.
    fn stream_order(&self) -> Option<&OrderBy> {
        self.order.as_ref().filter(|order| !order.fields.is_empty())
    }

    /// Narrows the provenance fact's own path (`/facts/<source_fact>`, every backend's records)
    /// to the records naming one of `values`: a `/facts` query constraining the provenance
    /// fact's value to several backends (`in`, `~`).
    pub(crate) fn keep_sources(&mut self, values: Vec<String>) {
        if let Provenance::SyntheticOnly { values: kept } = &mut self.provenance {
            *kept = Some(values);
        }
    }

    /// The fields asked for beyond the client's projection, dropped from the answer.
    pub(crate) fn history_helpers(&self) -> &[&'static str] {
        &self.history_helpers
    }

    /// Whether the outer query projects columns (an extract): rows keep their shape untouched.
    pub(crate) fn is_projection(&self) -> bool {
        self.query
            .analysis()
            .is_some_and(|a| !a.plain_columns.is_empty() || a.has_function_column())
    }

    fn pinned(&self) -> Option<&[String]> {
        self.query
            .analysis()
            .and_then(|a| a.pinned_certnames.as_deref())
    }

    /// Ownership as this request sees it, when it merges node-owned records.
    fn owning<'a>(&self, context: &'a Context, asked: &'a [BackendId]) -> Option<Owning<'a>> {
        let (scope, _) = self.owned?;
        Some(Owning {
            ownership: context.ownership.as_deref()?,
            scope,
            asked,
        })
    }

    fn asked_ids(&self) -> Vec<BackendId> {
        self.asked.iter().map(|a| a.backend).collect()
    }

    /// Whether each backend sends its whole answer and the window is cut here alone:
    /// `/fact-names`, and a paged total of the small unions (`/fact-paths`, `/packages`,
    /// `/producers`, `/environments`), which only the whole deduped set can count.
    fn pages_here(&self) -> bool {
        match self.entity.merge_rule() {
            MergeRule::Names => true,
            MergeRule::Union(_) => !self.entity.is_history() && self.include_total,
            _ => false,
        }
    }

    /// The parameters every request of this merge starts from: no offset, `limit`, and the
    /// provenance rewrite of a paged `/facts` window.
    fn base_params(&self, limit: Option<u64>) -> (Params, Option<Value>, bool) {
        let mut params = self.params.clone();
        if self.pages_here() {
            for key in ["limit", "offset", "include_total"] {
                params.remove(key);
            }
        } else {
            params.remove("offset");
            match limit {
                Some(limit) => params.set("limit", &limit.to_string()),
                None => {
                    params.remove("limit");
                }
            }
        }
        let mut query = self.query.ast().cloned();
        let mut rewritten = false;
        if let Some(with) = query
            .as_ref()
            .filter(|_| !self.history_helpers.is_empty())
            .and_then(|q| query::with_extract_columns(q, &self.history_helpers))
        {
            query = Some(with);
            rewritten = true;
        }
        // A paged /facts window must not lose records to the provenance drop after the backend
        // cut it: ask the backends not to return records of that name at all.
        if self.entity.carries_provenance()
            && self.provenance != Provenance::Off
            && self.window.is_paged()
            && self.pushable()
        {
            query = Some(query::without_fact(
                query.as_ref(),
                &self.config.source_fact,
            ));
            rewritten = true;
        }
        // The provenance fact's own path writes one record per node: ask each backend its nodes
        // (certname and environment), not every fact of them, each with a fact other than one
        // named like the provenance fact (such a record is dropped, so it alone is no node's
        // facts). The order is applied here, to the synthetic records (a backend could not
        // order rows by a field the extract leaves out).
        if matches!(self.provenance, Provenance::SyntheticOnly { .. }) && self.pushable() {
            let facts = query::without_fact(query.as_ref(), &self.config.source_fact);
            query = Some(query::fact_nodes(Some(&facts)));
            params.remove("order_by");
            rewritten = true;
        }
        (params, query, rewritten)
    }

    fn pushable(&self) -> bool {
        match self.query.text() {
            QueryText::Absent => true,
            QueryText::Ast(_) => !self.query.analysis().is_some_and(|a| a.in_query_paging),
            QueryText::Pql(_) | QueryText::Malformed(_) => false,
        }
    }

    /// The request of one backend's records; `push` adds the nodes it must not answer for.
    fn records_request(
        &self,
        backend: BackendId,
        limit: Option<u64>,
        push: bool,
        context: &Context,
    ) -> Outbound {
        if let Some(distinct) = self.distinct_request(backend, limit, context) {
            return distinct;
        }
        let (mut params, mut query, mut rewritten) = self.base_params(limit);
        if let Some(widened) = self.widened(backend, query.as_ref(), context) {
            query = Some(widened);
            rewritten = true;
        }
        if push {
            let asked = self.asked_ids();
            if let Some(owning) = self.owning(context, &asked) {
                let excluded = owning.excluded(backend, self.pinned());
                if let Some(owned) = query::exclude_certnames(query.as_ref(), &excluded) {
                    if !excluded.is_empty() {
                        query = Some(owned);
                        rewritten = true;
                    }
                }
            }
        }
        if rewritten {
            if let Some(query) = &query {
                params.set("query", &query.to_string());
            }
        }
        let mut outbound = outbound::request(&self.upstream_path, &params, rewritten);
        if self.streamed {
            outbound.body_mode = BodyMode::StreamSuccess;
        }
        outbound
    }

    /// The request of a derived union entity's records of `backend` as the distinct projection
    /// of the nodes it owns, when it holds nodes that other asked backends own; `None` asks the
    /// union entity itself (docs/merging.md, "`/packages`").
    fn distinct_request(
        &self,
        backend: BackendId,
        limit: Option<u64>,
        context: &Context,
    ) -> Option<Outbound> {
        let scope = self.distinct_owned?;
        let (source, columns) = self.entity.distinct_of()?;
        let asked = self.asked_ids();
        let owning = Owning {
            ownership: context.ownership.as_deref()?,
            scope,
            asked: &asked,
        };
        let excluded = owning.excluded(backend, None);
        if excluded.is_empty() {
            return None;
        }
        let (mut params, query, _) = self.base_params(limit);
        let distinct = query::distinct_among_owned(query.as_ref(), columns, &excluded)?;
        params.set("query", &distinct.to_string());
        Some(outbound::request(&source.path(), &params, true))
    }

    /// The correction one backend is asked for, with its cache key, if the total needs one:
    /// the count of its records of nodes other backends own (node-owned totals), or the hashes
    /// of its reports of nodes other backends hold too (history totals, D16).
    fn correction(&self, backend: BackendId, context: &Context) -> Option<(Outbound, String)> {
        let asked = self.asked_ids();
        let ownership = context.ownership.as_deref()?;
        if let (Some(owning), true) = (self.owning(context, &asked), self.corrects_owned_total()) {
            let excluded = owning.excluded(backend, self.pinned());
            if excluded.is_empty() {
                return None;
            }
            let query = query::count_among(self.query.ast(), &excluded)?;
            return Some(outbound::query_only(&self.upstream_path, &query));
        }
        if self.history_total {
            let mut shared = ownership.shared_with_others(backend, crate::membership::Scope::Any);
            if let Some(pinned) = self.pinned() {
                shared.retain(|c| pinned.binary_search_by(|p| p.as_str().cmp(c)).is_ok());
            }
            if shared.is_empty() {
                return None;
            }
            let clause = query::only_certnames_clause(&shared);
            let own = self.history_filter();
            let own = self.widened(backend, own.as_ref(), context).or(own);
            let filter = query::add_clause(own.as_ref(), clause);
            let history = self.entity.history()?;
            let column = history.report_column;
            let query = match history.per_report {
                true => serde_json::json!([
                    "extract",
                    [["function", "count"], column],
                    filter,
                    ["group_by", column]
                ]),
                false => serde_json::json!(["extract", [column], filter]),
            };
            return Some(outbound::query_only(&self.upstream_path, &query));
        }
        None
    }

    /// `query` with its `node_state` filter widened for `backend` (the nodes it holds
    /// deactivated that another backend holds active), when this is history filtered by state.
    fn widened(
        &self,
        backend: BackendId,
        query: Option<&Value>,
        context: &Context,
    ) -> Option<Value> {
        if !self.history_node_state {
            return None;
        }
        let revived = context.ownership.as_deref()?.revived(backend);
        query::widen_node_state(query?, &revived)
    }

    /// Whether a node-owned total is corrected by counting: a paged, over-fetched total.
    fn corrects_owned_total(&self) -> bool {
        self.include_total && matches!(self.owned, Some((_, Technique::OverFetch)))
    }

    /// The filter of a history query (its outer extract's, or the query).
    fn history_filter(&self) -> Option<Value> {
        query::outer_filter(self.query.ast()?).cloned()
    }

    /// The body `backend`'s correction was answered with: known to the estate already, or
    /// answered in this exchange; `Some(Err(()))` when it was asked and failed, `None` when the
    /// backend needs none.
    fn correction_body<'a>(
        &'a self,
        calls: &'a Calls,
        backend: BackendId,
    ) -> Option<Result<&'a Bytes, ()>> {
        let correction = self.corrections.iter().find(|c| c.backend == backend)?;
        if let Some(known) = &correction.known {
            return Some(Ok(known));
        }
        Some(
            calls
                .success(backend, CORRECTION)
                .map(|(_, body)| body)
                .ok_or(()),
        )
    }

    /// Merges the backends' answers (configured order).
    fn merge(&self, answers: &[BackendPage<'_>], owning: Option<Owning<'_>>) -> Merged {
        match self.entity.merge_rule() {
            MergeRule::Node => nodes::merge(self, answers, owning),
            MergeRule::Owned if self.entity.carries_provenance() => {
                facts::merge(self, answers, owning)
            }
            MergeRule::Owned => owned::merge(self, answers, owning),
            MergeRule::Union(identity) => union::merge(self, answers, identity, owning),
            MergeRule::Names => names::merge(self, answers),
            MergeRule::Counts => Merged {
                body: Ok((b"[]".to_vec(), 0)),
                contributed: 0,
                unusable: Vec::new(),
            },
        }
    }

    /// The configuration.
    pub(crate) fn config(&self) -> &Config {
        &self.config
    }

    /// The total to report, for a paged request: each backend's `X-Records`, less what its
    /// correction says it holds for others (node-owned) or what is stored twice (history).
    fn paged_total(&self, answers: &[&BackendPage<'_>], calls: &Calls) -> Result<u64, BackendId> {
        let mut total: u64 = 0;
        let mut twice: std::collections::BTreeMap<String, (usize, u64)> = Default::default();
        for answer in answers {
            let records = answer
                .headers
                .get(crate::message::X_RECORDS)
                .and_then(|v| v.to_str().ok()?.trim().parse::<u64>().ok())
                .unwrap_or(0);
            total = total.saturating_add(records);
            let pushed = calls.get(answer.backend, PUSHED).is_some()
                || self
                    .asked
                    .iter()
                    .any(|a| a.backend == answer.backend && a.push);
            if pushed && self.owned.is_some() {
                continue;
            }
            let Some(body) = self.correction_body(calls, answer.backend) else {
                continue;
            };
            let body = body.map_err(|()| answer.backend)?;
            let rows: Vec<serde_json::Map<String, Value>> =
                serde_json::from_slice(body).map_err(|_| answer.backend)?;
            if let (true, Some(history)) = (self.history_total, self.entity.history()) {
                for row in rows {
                    let key = row.get(history.report_column).and_then(Value::as_str);
                    let count = match history.per_report {
                        true => row.get("count").and_then(Value::as_u64).unwrap_or(0),
                        false => 1,
                    };
                    if let Some(key) = key {
                        let entry = twice.entry(key.to_owned()).or_insert((0, count));
                        entry.0 += 1;
                    }
                }
            } else {
                let count = rows
                    .first()
                    .and_then(|row| row.get("count"))
                    .and_then(Value::as_u64)
                    .unwrap_or(0);
                total = total.saturating_sub(count);
            }
        }
        for (copies, count) in twice.into_values() {
            total = total.saturating_sub((copies as u64).saturating_sub(1).saturating_mul(count));
        }
        Ok(total)
    }
}

impl Plan for RecordPlan {
    fn again(&self) -> Box<dyn Plan> {
        Box::new(self.clone())
    }

    fn needs_ownership(&self) -> bool {
        self.owned.is_some()
            || self.distinct_owned.is_some()
            || self.history_total
            || self.history_node_state
            || self.pinned().is_some()
    }

    fn counts_rounds(&self) -> bool {
        true
    }

    fn streams(&self) -> bool {
        self.streamed
    }

    fn stream_start(&mut self, context: &Context) -> Option<StreamStart> {
        if !self.streamed {
            return None;
        }
        let rule = self.stream_rule(context)?;
        let asked = self.asked_ids();
        Some(StreamStart {
            inputs: asked.iter().map(|backend| (*backend, RECORDS)).collect(),
            merge: RecordStream::new(
                rule,
                asked.clone(),
                (
                    self.streamed_provenance(&asked),
                    self.stream_order().cloned(),
                ),
            ),
            excused: self.excused,
            at_most: None,
            unusable: Vec::new(),
        })
    }

    fn start(&mut self, context: &Context) -> Vec<(BackendId, usize)> {
        self.streamed = self.can_stream(context);
        let mut asked = context.roster.clone();
        if let (Some(pinned), Some(ownership)) = (self.pinned(), context.ownership.as_deref()) {
            let scope = self.owned.map(|(scope, _)| scope);
            let narrowed = narrow(&context.roster, ownership, scope, pinned);
            if !narrowed.is_empty() {
                asked = narrowed;
            }
        }
        self.excused = context.roster.len() - asked.len();
        let reach = match self.pages_here() {
            true => None,
            false => self.window.upstream_limit(),
        };
        let technique = self.owned.map(|(_, technique)| technique);
        let limits: Vec<BackendAsked> = asked
            .iter()
            .map(|&backend| {
                let (limit, push) = match (reach, technique, self.owning(context, &asked)) {
                    (Some(reach), Some(Technique::OverFetch), Some(owning)) => {
                        match owning.over_fetch(backend, reach, self.pinned()) {
                            Some(limit) => (Some(limit), false),
                            None => (Some(reach), true),
                        }
                    }
                    (reach, technique, _) => (reach, technique == Some(Technique::Pushdown)),
                };
                BackendAsked {
                    backend,
                    limit,
                    push,
                }
            })
            .collect();
        self.asked = limits;
        let mut calls = Vec::new();
        let mut corrections = Vec::new();
        for &BackendAsked { backend, push, .. } in &self.asked.clone() {
            calls.push((backend, RECORDS));
            if push && self.owned.is_some() {
                // Its answer's own total is exact.
                continue;
            }
            let Some((outbound, key)) = self.correction(backend, context) else {
                continue;
            };
            let known = context.ownership.as_deref().and_then(|ownership| {
                context
                    .corrections
                    .get(ownership.generation(), backend, &key)
                    .cloned()
            });
            if known.is_none() {
                calls.push((backend, CORRECTION));
            }
            corrections.push(CorrectionCall {
                backend,
                outbound,
                key,
                known,
            });
        }
        self.corrections = corrections;
        calls
    }

    fn request(&self, backend: BackendId, part: usize, context: &Context) -> Outbound {
        let asked = self.asked.iter().find(|a| a.backend == backend).copied();
        let (limit, push) = asked.map_or((None, false), |a| (a.limit, a.push));
        match part {
            CORRECTION => match self.corrections.iter().find(|c| c.backend == backend) {
                Some(correction) => correction.request(),
                None => self.records_request(backend, limit, false, context),
            },
            PUSHED => self.records_request(backend, self.window.upstream_limit(), true, context),
            _ => self.records_request(backend, limit, push, context),
        }
    }

    fn progress(&mut self, calls: &Calls, context: &Context) -> Step {
        if !calls.all_done() {
            return Step::Wait;
        }
        let asked = self.asked_ids();
        let mut answers = Vec::new();
        let mut unusable: Unusables = Vec::new();
        for &BackendAsked { backend, limit, .. } in &self.asked {
            let (part, limit) = match calls.get(backend, PUSHED) {
                Some(_) => (PUSHED, self.window.upstream_limit()),
                None => (RECORDS, limit),
            };
            let Some((headers, body)) = calls.success(backend, part) else {
                continue;
            };
            if calls.get(backend, CORRECTION).is_some()
                && calls.success(backend, CORRECTION).is_none()
            {
                unusable.push((backend, Unusable::IncompleteParts));
                continue;
            }
            answers.push(BackendPage {
                backend,
                headers,
                body,
                limit,
            });
        }
        let owning = self.owning(context, &asked);
        let merged = self.merge(&answers, owning);
        unusable.extend(merged.unusable);
        let (body, count) = match merged.body {
            Ok(body) => body,
            Err(Unfilled(short)) => {
                let again: Vec<(BackendId, usize)> = short
                    .into_iter()
                    .map(BackendId)
                    .filter(|b| calls.get(*b, PUSHED).is_none())
                    .map(|b| (b, PUSHED))
                    .collect();
                if !again.is_empty() && self.pushable() {
                    return Step::Call(again);
                }
                // Nothing left to ask (not pushable): the page as the answers fill it.
                match self.merge_unchecked(&answers, owning) {
                    Some(body) => body,
                    None => {
                        return Step::Done(Verdict::Unanswered {
                            part: RECORDS,
                            unusable,
                        })
                    }
                }
            }
        };
        if merged.contributed == 0 {
            return Step::Done(Verdict::Unanswered {
                part: RECORDS,
                unusable,
            });
        }
        let usable: Vec<&BackendPage<'_>> = answers
            .iter()
            .filter(|a| !unusable.iter().any(|(b, _)| *b == a.backend))
            .collect();
        let total = if !self.include_total {
            None
        } else if !self.window.is_paged() || self.pages_here() {
            Some(count as u64)
        } else {
            match self.paged_total(&usable, calls) {
                Ok(total) => Some(total),
                Err(backend) => {
                    unusable.push((backend, Unusable::IncompleteParts));
                    None
                }
            }
        };
        let mut response = Response::json(StatusCode::OK, body);
        if let Some(total) = total {
            if let Ok(value) = HeaderValue::from_str(&total.to_string()) {
                response.headers.insert(crate::message::X_RECORDS, value);
            }
        }
        Step::Done(Verdict::Merged {
            response,
            contributed: merged.contributed + self.excused,
            unusable,
        })
    }

    fn learned(&self, calls: &Calls) -> Vec<Learned> {
        CorrectionCall::learned(&self.corrections, calls, CORRECTION)
    }

    /// The provenance records alone (a join's provenance part), unpaged and without a total,
    /// under an order by `name` first: each record's name is the provenance fact's.
    fn merge_later(
        &mut self,
        calls: &Calls,
        context: &Context,
        order: &OrderBy,
    ) -> Option<JoinedLater> {
        let only_provenance = matches!(self.provenance, Provenance::SyntheticOnly { .. });
        let by_name = order.fields.first().is_some_and(|f| f.field == "name");
        if !only_provenance || !by_name || self.window.is_paged() || self.include_total {
            return None;
        }
        // One call a backend asked, each answered, and each beginning as an array of records:
        // what the merge finds unusable there is found now, before the first byte. Each answer is
        // checked as far as a streamed answer's bodies are (its first bytes, well under a
        // millisecond): this merge waits only for a stream, whose answer is past
        // `stream_above_bytes` with every body of the request counted, so an answer broken
        // further on ends the body, after the first byte, so that it does not parse (D26).
        // Should the answer be buffered after all, this merge is not used: the part is merged
        // whole, as any buffered one (`core/src/concat.rs`).
        if self.asked.is_empty() || calls.0.len() != self.asked.len() {
            return None;
        }
        let all_records = self.asked.iter().all(|asked| {
            calls
                .success(asked.backend, RECORDS)
                .is_some_and(|(_, body)| {
                    crate::streamed::begins_as_records(
                        body,
                        crate::exchange::CHECKED_BEFORE_STREAMING,
                    )
                })
        });
        if !all_records {
            return None;
        }
        let name = serde_json::value::RawValue::from_string(
            serde_json::to_string(&self.config.source_fact).ok()?,
        )
        .ok()?;
        let prefix = sort::sort_key(order, |field| (field == "name").then_some(&*name)).leading(1);
        let (mut plan, calls, context) = (self.clone(), Calls(calls.0.clone()), context.clone());
        Some(JoinedLater::new(prefix, move || {
            match plan.progress(&calls, &context) {
                Step::Done(Verdict::Merged {
                    response, unusable, ..
                }) if unusable.is_empty() => match response.body {
                    ResponseBody::Full(body) => Ok(body),
                    _ => Err(MergeBroken::Joined("its merge gave no body".to_owned())),
                },
                Step::Done(
                    Verdict::Merged { unusable, .. } | Verdict::Unanswered { unusable, .. },
                ) => {
                    let why: Vec<String> = unusable
                        .iter()
                        .map(|(backend, why)| format!("backend {}: {why}", backend.0))
                        .collect();
                    Err(MergeBroken::Joined(why.join("; ")))
                }
                _ => Err(MergeBroken::Joined("its merge asked for more".to_owned())),
            }
        }))
    }
}

impl RecordPlan {
    /// The merge without the page check (when a short page cannot be asked again).
    fn merge_unchecked(
        &self,
        answers: &[BackendPage<'_>],
        owning: Option<Owning<'_>>,
    ) -> Option<(Vec<u8>, usize)> {
        let unlimited: Vec<BackendPage<'_>> = answers
            .iter()
            .map(|a| BackendPage {
                backend: a.backend,
                headers: a.headers,
                body: a.body,
                limit: None,
            })
            .collect();
        self.merge(&unlimited, owning).body.ok()
    }
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_provenance;
#[cfg(test)]
mod tests_stream;
#[cfg(test)]
mod tests_stream_history;
#[cfg(test)]
mod tests_stream_nodes;
