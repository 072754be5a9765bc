//! A request target parsed once: its route (or why it is refused), its parameters and its
//! `query`. Planning starts from a [`ParsedRequest`] ([`crate::policy`]), a planned request keeps
//! it for its whole life, and a request planned again (after a reload, or a translated PQL query)
//! is planned from it: [`ParsedRequest::parse`] is the one place a target is read, and
//! [`ParsedRequest::parsed_query`] the one place its `query` is.

use std::sync::{Arc, OnceLock};

use serde_json::Value;

use crate::message::ClientRequest;
use crate::query::{Params, ParsedQuery};
use crate::route::{classify, Refusal, Route};

/// A request as pdbmux read it: its raw target, its route and its parameters, and its `query`
/// once a plan read it.
#[derive(Debug, Clone)]
pub struct ParsedRequest {
    target: String,
    route: Result<Route, Refusal>,
    params: Params,
    /// Its `query` parameter, read on first use ([`ParsedRequest::parsed_query`]): a route that
    /// never looks inside the query never parses it.
    query: OnceLock<Arc<ParsedQuery>>,
}

/// Two reads of one target are equal whether or not a plan read their `query` yet.
impl PartialEq for ParsedRequest {
    fn eq(&self, other: &ParsedRequest) -> bool {
        (&self.target, &self.route, &self.params) == (&other.target, &other.route, &other.params)
    }
}

impl Eq for ParsedRequest {}

impl ParsedRequest {
    /// Reads a client's request: the route by the allowlist and its head limits
    /// ([`classify`]), and its parameters.
    pub fn parse(request: &ClientRequest) -> ParsedRequest {
        ParsedRequest {
            target: request.target.clone(),
            route: classify(request),
            params: Params::parse(request.query()),
            query: OnceLock::new(),
        }
    }

    /// A request pdbmux derives from a client's, a GET of `target` (a root query mapped onto
    /// its entity's route, a sub-route's entity route, the provenance fact's own path): read
    /// like a client's, but only its path is held to the head limits; the client's request,
    /// whatever its derived target's length, passed them.
    ///
    /// `built` is the AST pdbmux wrote into its `query` parameter (as `built.to_string()`),
    /// built from one it already holds (the client's parsed query, or a PQL translation):
    /// carried, so that text is never parsed. `None` when pdbmux wrote no query; any `query` the
    /// target has is then read on first use.
    pub(crate) fn derived(target: String, built: Option<Value>) -> ParsedRequest {
        let request = ClientRequest::get(target);
        ParsedRequest {
            route: classify(&ClientRequest::get(request.path())),
            params: Params::parse(request.query()),
            target: request.target,
            query: built
                .map(|ast| OnceLock::from(Arc::new(ParsedQuery::built(ast))))
                .unwrap_or_default(),
        }
    }

    /// The target exactly as received (or derived).
    pub fn target(&self) -> &str {
        &self.target
    }

    /// The raw path (before `?`).
    pub(crate) fn path(&self) -> &str {
        self.target
            .split_once('?')
            .map_or(&self.target, |(path, _)| path)
    }

    /// The raw query string (after `?`), if any.
    pub(crate) fn query(&self) -> Option<&str> {
        self.target.split_once('?').map(|(_, query)| query)
    }

    /// The route that answers it, or why it is refused.
    pub(crate) fn route(&self) -> Result<&Route, &Refusal> {
        self.route.as_ref()
    }

    /// Its parameters.
    pub(crate) fn params(&self) -> &Params {
        &self.params
    }

    /// Its `query` parameter, classified and parsed on the first call and kept for the
    /// request's life: the one place a request's query text is parsed. Plans take it from here
    /// (an `Arc` they keep), never from [`ParsedRequest::params`].
    pub(crate) fn parsed_query(&self) -> &Arc<ParsedQuery> {
        self.query
            .get_or_init(|| Arc::new(ParsedQuery::new(self.params.query_text())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_derived_request_is_held_to_the_limits_by_its_path_alone() {
        let long = format!("/pdb/query/v4/nodes?query={}", "x".repeat(20_000));
        let client = ParsedRequest::parse(&ClientRequest::get(long.clone()));
        assert_eq!(client.route(), Err(&Refusal::UriTooLong));
        let derived = ParsedRequest::derived(long.clone(), None);
        assert!(matches!(derived.route(), Ok(Route::Query(_))));
        assert_eq!(derived.target(), long);
        assert_eq!(derived.params().get("query").map(str::len), Some(20_000));
    }

    #[test]
    fn the_query_is_read_on_first_use_and_kept() {
        let client = ParsedRequest::parse(&ClientRequest::get(
            "/pdb/query/v4/nodes?query=%5B%22%3D%22%2C%22certname%22%2C%22a%22%5D",
        ));
        assert!(client.query.get().is_none(), "not read before a plan asks");
        let first = Arc::clone(client.parsed_query());
        assert_eq!(
            first.ast(),
            Some(&serde_json::json!(["=", "certname", "a"]))
        );
        assert!(
            Arc::ptr_eq(&first, client.parsed_query()),
            "kept, never read again"
        );
        let copy = client.clone();
        assert!(Arc::ptr_eq(&first, copy.parsed_query()), "a copy keeps it");
    }

    #[test]
    fn a_derived_request_carries_the_query_it_was_written_from() {
        let ast = serde_json::json!(["and", ["=", "certname", "a"], ["=", "x", 1.5]]);
        let mut params = Params::default();
        params.set("query", &ast.to_string());
        let target = format!("/pdb/query/v4/facts?{}", params.to_query_string());
        let derived = ParsedRequest::derived(target, Some(ast.clone()));
        assert!(derived.query.get().is_some(), "carried, its text not read");
        assert_eq!(derived.parsed_query().ast(), Some(&ast));
        assert_eq!(
            **derived.parsed_query(),
            ParsedQuery::new(derived.params().query_text()),
            "what reading its text would give"
        );
        let unwritten = ParsedRequest::derived("/pdb/query/v4/facts/x?query=%5B%5D".into(), None);
        assert!(unwritten.query.get().is_none());
    }
}
