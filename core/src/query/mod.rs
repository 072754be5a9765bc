//! Reading and rewriting PuppetDB queries: the query-string parameters, the `query` AST, and the
//! few rewrites pdbmux makes before fanning a request out.
//!
//! The flow for one request is:
//!
//! 1. [`Params::parse`] the raw query string exactly as received. Untouched parameters are
//!    forwarded byte for byte ([`Params::to_query_string`]), so the `query` param reaches every
//!    backend verbatim unless pdbmux rewrites it.
//! 2. [`QueryText::classify`] the decoded `query` value: JSON AST, PQL (opaque, never analysed) or
//!    malformed JSON (forwarded untouched so the backends answer the 400). A request does it once
//!    (`ParsedRequest::parsed_query`) and keeps the result, a `ParsedQuery`, for its whole life:
//!    every plan reads the query from there, never from the parameters again.
//! 3. [`analyze`] an AST once (`ParsedQuery::analysis`): the provenance gates (extract outside a
//!    subquery, outer name constraint), the response-shaping extract's columns, `latest_report?`
//!    and in-query paging.
//! 4. For an extract with a function column, [`check_combinable`] refuses what cannot be merged,
//!    and [`rewrite_avg`] turns `avg` into `sum` + `count` upstream.
//! 5. [`exclude_certnames`] pushes node ownership into the upstream query (docs/decisions.md D4); a
//!    rewritten query too long for a URL goes upstream as a POST body from
//!    [`Params::to_json_body`].
//!
//! Everything here is pure: no I/O, no clock, and no panics on client input.

mod ast;
mod foldable;
#[cfg(test)]
mod gate_vectors;
mod params;
mod parsed;
mod partial;
mod rewrite;

pub use ast::{analyze, Analysis, FunctionColumn, GroupByItem};
pub(crate) use ast::{names_node_state, outer_filter};
pub use foldable::{check_combinable, CombineRefusal, COMBINABLE_FUNCTIONS};
pub use params::{JsonBodyError, Param, Params, WINDOW_PARAMS};
pub(crate) use parsed::ParsedQuery;
pub(crate) use partial::{evaluate, Residual};
pub use rewrite::{
    add_clause, count_among, distinct_among_owned, exclude_certnames, fact_nodes, is_filter_on,
    only_certnames_clause, ownership_clause, rewrite_avg, widen_node_state, with_extract_columns,
    without_fact,
};

use serde_json::Value;

/// What the `query` parameter holds, decided the way PuppetDB decides it.
///
/// Use it to pick a path before anything looks inside a query: only [`QueryText::Ast`] is ever
/// analysed or rewritten; every other kind is forwarded exactly as received.
#[derive(Debug, Clone, PartialEq)]
pub enum QueryText {
    /// No `query` parameter, or one that is empty or only whitespace (PuppetDB's entity endpoints
    /// read that as no query at all).
    Absent,
    /// Anything that does not start with `[` after optional whitespace: PQL, opaque to pdbmux.
    Pql(String),
    /// A JSON AST (the value started with `[` and parsed).
    Ast(Value),
    /// The value started with `[` but is not one JSON value; forwarded untouched so the backends
    /// answer with their own 400.
    Malformed(String),
}

impl QueryText {
    /// Classifies a decoded `query` value (for example [`Params::get`]`("query")`).
    ///
    /// Mirrors PuppetDB's `parse-json-or-pql-to-ast`: optional whitespace (Java's `\s`) then `[`
    /// is JSON, anything else is PQL.
    pub fn classify(decoded: Option<&str>) -> QueryText {
        let Some(text) = decoded else {
            return QueryText::Absent;
        };
        if text.trim_start_matches(is_java_space).is_empty() {
            return QueryText::Absent;
        }
        if !reads_as_ast(text) {
            return QueryText::Pql(text.to_owned());
        }
        match serde_json::from_str::<Value>(text) {
            Ok(ast) => QueryText::Ast(ast),
            Err(_) => QueryText::Malformed(text.to_owned()),
        }
    }

    /// The AST, when the query is one.
    pub fn as_ast(&self) -> Option<&Value> {
        match self {
            QueryText::Ast(ast) => Some(ast),
            _ => None,
        }
    }
}

/// Whether PuppetDB takes `text` for an AST (JSON, valid or not) rather than PQL: its first
/// character after whitespace is `[`. The one place that tells them apart: [`QueryText::classify`]
/// and a POST body's `query` ask it.
pub(crate) fn reads_as_ast(text: &str) -> bool {
    text.trim_start_matches(is_java_space).starts_with('[')
}

/// Java regex `\s`: the whitespace PuppetDB skips before looking for `[`.
fn is_java_space(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\n' | '\u{0B}' | '\u{0C}' | '\r')
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn classify_absent_when_missing_or_blank() {
        assert_eq!(QueryText::classify(None), QueryText::Absent);
        assert_eq!(QueryText::classify(Some("")), QueryText::Absent);
        assert_eq!(QueryText::classify(Some(" \t\n")), QueryText::Absent);
    }

    #[test]
    fn classify_ast_after_whitespace() {
        assert_eq!(
            QueryText::classify(Some("  [\"=\", \"certname\", \"a\"]")),
            QueryText::Ast(json!(["=", "certname", "a"]))
        );
    }

    #[test]
    fn classify_pql_is_opaque() {
        let pql = "nodes[certname] { }";
        assert_eq!(
            QueryText::classify(Some(pql)),
            QueryText::Pql(pql.to_owned())
        );
        let pql = "facts { certname = \"web1\" }";
        assert_eq!(
            QueryText::classify(Some(pql)),
            QueryText::Pql(pql.to_owned())
        );
    }

    #[test]
    fn classify_malformed_json_is_kept_verbatim() {
        for text in [
            "[\"=\",\"certname\"",
            "[1] [2]",
            "[\"=\",\"a\",\"b\"] x",
            "[nul]",
        ] {
            assert_eq!(
                QueryText::classify(Some(text)),
                QueryText::Malformed(text.to_owned())
            );
        }
    }

    #[test]
    fn classify_vertical_tab_before_bracket_is_json_but_malformed() {
        // Java's \s skips \x0B, so PuppetDB tries JSON, and Jackson refuses the character.
        let text = "\u{0B}[1]";
        assert_eq!(
            QueryText::classify(Some(text)),
            QueryText::Malformed(text.to_owned())
        );
    }

    #[test]
    fn as_ast_only_for_ast() {
        assert_eq!(QueryText::Ast(json!([1])).as_ast(), Some(&json!([1])));
        assert_eq!(QueryText::Pql("x".into()).as_ast(), None);
        assert_eq!(QueryText::Absent.as_ast(), None);
    }
}
