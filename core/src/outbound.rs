//! Writing the upstream request a fan-out sends one backend: the path and parameters as a GET,
//! or a POST with a JSON body when pdbmux rewrote the query and it grew too long for a URL
//! (docs/merging.md, "What it costs"). Shared by every plan that rewrites.

use bytes::Bytes;
use http::Method;
use serde_json::Value;

use crate::fanout::Outbound;
use crate::query::Params;

/// Upstream targets longer than this go as POST with a JSON body (PuppetDB's Jetty refuses request
/// headers over 8 KiB; the rest of the header block needs room too).
pub(crate) const MAX_UPSTREAM_TARGET: usize = 6 * 1024;

/// The request for `path` with `params`. `rewritten` says pdbmux changed the query: only then can
/// the target grow past a URL's limit and go as POST instead.
pub(crate) fn request(path: &str, params: &Params, rewritten: bool) -> Outbound {
    let query_string = params.to_query_string();
    let target = if query_string.is_empty() {
        path.to_owned()
    } else {
        format!("{path}?{query_string}")
    };
    if rewritten && target.len() > MAX_UPSTREAM_TARGET {
        if let Ok(body) = params.to_json_body() {
            return Outbound {
                method: Method::POST,
                path_and_query: path.to_owned(),
                body: Some(Bytes::from(body)),
                ..Outbound::get(String::new())
            };
        }
    }
    Outbound::get(target)
}

/// A request of `path` with `query` as its only parameter, and the key a correction learned
/// from it is kept under (docs/merging.md, "Corrections").
pub(crate) fn query_only(path: &str, query: &Value) -> (Outbound, String) {
    let text = query.to_string();
    let mut params = Params::default();
    params.set("query", &text);
    (request(path, &params, true), format!("{path}?query={text}"))
}
