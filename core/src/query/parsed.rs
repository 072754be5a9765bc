//! One request's `query` parameter as read: what it holds and, for an AST, its analysis, kept
//! for the request's whole life so that no plan, correction or failover reads the text again.

use std::sync::OnceLock;

use serde_json::Value;

use super::{analyze, Analysis, QueryText};

/// A request's `query` parameter, read once: its [`QueryText`] and, for an AST, its
/// [`Analysis`], made the first time a plan asks for it.
///
/// A client's comes from [`crate::parsed::ParsedRequest::parsed_query`], which reads the text at
/// most once; a request pdbmux derives carries the AST it was written from
/// ([`ParsedQuery::built`]). Plans hold it in an `Arc` and ask it, never the parameters.
#[derive(Debug)]
pub(crate) struct ParsedQuery {
    text: QueryText,
    analysis: OnceLock<Option<Analysis>>,
}

impl ParsedQuery {
    /// The query of a classified `query` parameter ([`crate::query::Params::query_text`]).
    pub(crate) fn new(text: QueryText) -> ParsedQuery {
        ParsedQuery {
            text,
            analysis: OnceLock::new(),
        }
    }

    /// The query of a request pdbmux derives, whose `query` parameter it wrote as
    /// `ast.to_string()`: classified as that text would be, without parsing it again (an array
    /// is an AST; any other JSON value does not start with `[`, so it reads as PQL). The AST is
    /// the one written, so the two agree but for a float serde_json would read back one unit in
    /// the last place apart, which only pdbmux's own analysis could see.
    pub(crate) fn built(ast: Value) -> ParsedQuery {
        let text = match ast {
            Value::Array(_) => QueryText::Ast(ast),
            other => QueryText::Pql(other.to_string()),
        };
        ParsedQuery::new(text)
    }

    /// What the parameter holds.
    pub(crate) fn text(&self) -> &QueryText {
        &self.text
    }

    /// The AST, when the query is one.
    pub(crate) fn ast(&self) -> Option<&Value> {
        self.text.as_ast()
    }

    /// The AST's analysis ([`analyze`], made on the first call and kept); `None` when the query
    /// is not an AST.
    pub(crate) fn analysis(&self) -> Option<&Analysis> {
        self.analysis
            .get_or_init(|| self.text.as_ast().map(analyze))
            .as_ref()
    }
}

/// Two queries are equal when their texts are: the analysis follows from the text.
impl PartialEq for ParsedQuery {
    fn eq(&self, other: &ParsedQuery) -> bool {
        self.text == other.text
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_built_query_reads_as_its_text_would() {
        for ast in [
            json!(["=", "certname", "a"]),
            json!([
                "and",
                ["=", "x", 0.1],
                ["in", "v", ["array", ["a\"b", "é"]]]
            ]),
            json!([]),
            json!("nodes"),
            json!(3),
            json!({"a": [1]}),
            json!(null),
        ] {
            let text = ast.to_string();
            assert_eq!(
                ParsedQuery::built(ast.clone()),
                ParsedQuery::new(QueryText::classify(Some(&text))),
                "{text}"
            );
        }
    }

    #[test]
    fn the_analysis_is_of_the_ast_alone() {
        let ast = json!(["extract", [["function", "count"]]]);
        let query = ParsedQuery::built(ast.clone());
        assert_eq!(query.analysis(), Some(&analyze(&ast)));
        assert_eq!(ParsedQuery::new(QueryText::Absent).analysis(), None);
        assert_eq!(
            ParsedQuery::new(QueryText::Pql("x".into())).analysis(),
            None
        );
    }
}
