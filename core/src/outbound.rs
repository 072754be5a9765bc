//! Building the upstream request a fan-out sends one backend: node ownership pushed into the
//! query (DECISIONS.md D4), and a POST with a JSON body when the rewritten query is too long for a
//! URL. Shared by record merges and combined aggregates.

use std::sync::Arc;

use bytes::Bytes;
use http::Method;
use serde_json::Value;

use crate::config::MergeStrategy;
use crate::ids::BackendId;
use crate::membership::{Ownership, Scope};
use crate::query::{exclude_certnames, Params};

/// Upstream targets longer than this go as POST with a JSON body (PuppetDB's Jetty refuses request
/// headers over 8 KiB; the rest of the header block needs room too).
pub(crate) const MAX_UPSTREAM_TARGET: usize = 6 * 1024;

/// The ownership snapshot, the strategy that picks owners and the scope of nodes the query sees,
/// for a node-scoped fan-out.
pub(crate) type Pushdown = (Arc<Ownership>, MergeStrategy, Scope);

/// The scope of nodes a query sees: every node state when it names `node_state` or when the
/// entity has no implicit active filter (`history`: reports, events, event counts), else active
/// nodes only.
pub(crate) fn scope_of(raw_query: Option<&str>, history: bool) -> Scope {
    if history || raw_query.is_some_and(|q| q.contains("node_state")) {
        Scope::Any
    } else {
        Scope::Active
    }
}

/// `query` with the certnames `backend` must not answer for excluded (owners among `asked`
/// only); `None` when nothing changes.
pub(crate) fn owned_query(
    query: Option<&Value>,
    pushdown: &Pushdown,
    backend: BackendId,
    asked: &[BackendId],
) -> Option<Value> {
    let (ownership, strategy, scope) = pushdown;
    let excluded = ownership.excluded(backend, *strategy, *scope, asked);
    if excluded.is_empty() {
        return None;
    }
    exclude_certnames(query, &excluded)
}

/// The method, target and body for `path` with `params`. `rewritten` says pdbmux changed the
/// query: only then can the target grow past a URL's limit and go as POST instead.
pub(crate) fn request(
    path: &str,
    params: &Params,
    rewritten: bool,
) -> (Method, String, Option<Bytes>) {
    let query_string = params.to_query_string();
    let target = if query_string.is_empty() {
        path.to_owned()
    } else {
        format!("{path}?{query_string}")
    };
    if rewritten && target.len() > MAX_UPSTREAM_TARGET {
        if let Ok(body) = params.to_json_body() {
            return (Method::POST, path.to_owned(), Some(Bytes::from(body)));
        }
    }
    (Method::GET, target, None)
}
