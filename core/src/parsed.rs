//! A request target parsed once: its route (or why it is refused) and its parameters. Planning
//! starts from a [`ParsedRequest`] ([`crate::policy`]), a planned request keeps it for its whole
//! life, and a request planned again (after a reload, or a translated PQL query) is planned from
//! it: [`ParsedRequest::parse`] is the one place a target is read.

use crate::message::ClientRequest;
use crate::query::Params;
use crate::route::{classify, Refusal, Route};

/// A request as pdbmux read it: its raw target, its route and its parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedRequest {
    target: String,
    route: Result<Route, Refusal>,
    params: Params,
}

impl ParsedRequest {
    /// Reads a client's request: the route by the allowlist and its head limits
    /// ([`classify`]), and its parameters.
    pub fn parse(request: &ClientRequest) -> ParsedRequest {
        ParsedRequest {
            target: request.target.clone(),
            route: classify(request),
            params: Params::parse(request.query()),
        }
    }

    /// A request pdbmux derives from a client's, a GET of `target` (a root query mapped onto
    /// its entity's route, a sub-route's entity route, the provenance fact's own path): read
    /// like a client's, but only its path is held to the head limits; the client's request,
    /// whatever its derived target's length, passed them.
    pub(crate) fn derived(target: String) -> ParsedRequest {
        let request = ClientRequest::get(target);
        ParsedRequest {
            route: classify(&ClientRequest::get(request.path())),
            params: Params::parse(request.query()),
            target: request.target,
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_derived_request_is_held_to_the_limits_by_its_path_alone() {
        let long = format!("/pdb/query/v4/nodes?query={}", "x".repeat(20_000));
        let client = ParsedRequest::parse(&ClientRequest::get(long.clone()));
        assert_eq!(client.route(), Err(&Refusal::UriTooLong));
        let derived = ParsedRequest::derived(long.clone());
        assert!(matches!(derived.route(), Ok(Route::Query(_))));
        assert_eq!(derived.target(), long);
        assert_eq!(derived.params().get("query").map(str::len), Some(20_000));
    }
}
