//! The root query endpoint `/pdb/query/v4` (docs/merging.md, "PQL and the root endpoint"): a
//! `["from", <entity>, …]` AST is answered as the entity's own route answers the same query, and
//! PQL is first translated by a backend (`ast_only=true`) into that AST.
//!
//! The mapping: `["from", "nodes", <query>, ["order_by", …], ["limit", n], ["offset", n]]` becomes
//! `/pdb/query/v4/nodes?query=<query>&order_by=…&limit=n&offset=n` plus every other parameter of
//! the request; a paging parameter in the query string wins over the same clause in the AST, one
//! by one, as PuppetDB 7.12.1 combines them (`…["limit",2]]&limit=3` is limit 3; `&offset=1`
//! beside `["limit",2]` is both). The root endpoint sees active nodes only on every entity
//! (PuppetDB 7.12.1 adds `["=","node_state","active"]` there to `reports`, `events` and
//! `catalogs` too, which their own routes do not filter): the mapped query says so when it does
//! not name `node_state` itself. The entity names PQL uses (`fact_contents`) are the path segments with `-` for
//! `_`. An entity pdbmux does not merge, a client's own `ast_only=true` and anything that is not a
//! `from` query stay first-success pass-throughs.

use std::sync::Arc;

use serde_json::Value;

use crate::entity::Entity;
use crate::parsed::ParsedRequest;
use crate::query::{Params, QueryText};

/// What a request on the root endpoint is.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum RootQuery {
    /// A `from` AST on a merged entity: the entity route's request it is answered as.
    Mapped(ParsedRequest),
    /// PQL: translated by a backend first.
    Pql(Pql),
    /// Anything else: answered by the first backend that answers.
    PassThrough,
}

/// A PQL request waiting for its translation: the text, and the request's other parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Pql {
    pub(crate) text: String,
    pub(crate) params: Params,
}

impl Pql {
    /// The translation request: the root endpoint with `ast_only=true`.
    pub(crate) fn translation_target(&self) -> String {
        let mut params = Params::default();
        params.set("query", &self.text);
        params.set("ast_only", "true");
        format!("{ROOT}?{}", params.to_query_string())
    }
}

/// A PQL request whose translation is under way: the PQL, and the target the client sent (what
/// is asked of the backends as it is when the translation maps onto no merged entity). Hand it
/// back with the translation's response to [`crate::Estate::handle_translated`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Translating {
    pub(crate) pql: Pql,
    /// The client's request, the root query.
    pub(crate) request: Arc<ParsedRequest>,
}

/// The root query endpoint's path.
pub(crate) const ROOT: &str = "/pdb/query/v4";

/// Reads a root-endpoint request: its parameters and its query.
pub(crate) fn read(request: &ParsedRequest) -> RootQuery {
    let params = request.params();
    if params
        .get("ast_only")
        .is_some_and(|v| v.eq_ignore_ascii_case("true"))
    {
        return RootQuery::PassThrough;
    }
    match request.parsed_query().text() {
        QueryText::Pql(text) => RootQuery::Pql(Pql {
            text: text.clone(),
            params: params.clone(),
        }),
        QueryText::Ast(ast) => match mapped_request(ast, params) {
            Some(mapped) => RootQuery::Mapped(mapped),
            None => RootQuery::PassThrough,
        },
        QueryText::Absent | QueryText::Malformed(_) => RootQuery::PassThrough,
    }
}

/// The entity route's request for a `from` AST with the request's other parameters (carrying
/// the query it was given, so that query is not parsed again); `None` when it is not a `from`
/// query pdbmux can map (not `from`, an entity it does not merge, a clause it does not know,
/// two queries).
pub(crate) fn mapped_request(ast: &Value, params: &Params) -> Option<ParsedRequest> {
    let items = ast.as_array()?;
    let ["from", entity] = [items.first()?.as_str()?, items.get(1)?.as_str()?] else {
        return None;
    };
    let entity = Entity::from_segment(&entity.replace('_', "-"))?;
    if !entity.row().pql_mapped {
        return None;
    }
    let is_clause = |item: &Value| {
        let name = item.get(0).and_then(Value::as_str);
        matches!(name, Some("limit" | "offset" | "order_by"))
    };
    let (clauses, queries): (Vec<&Value>, Vec<&Value>) =
        items[2..].iter().partition(|i| is_clause(i));
    if queries.len() > 1 {
        return None;
    }
    let mut query = queries.first().map(|q| (*q).clone());
    let sees_every_state = entity.row().pql_sees_every_state;
    let names_state = query.as_ref().is_some_and(crate::query::names_node_state);
    if sees_every_state && !names_state {
        let active = serde_json::json!(["=", "node_state", "active"]);
        query = Some(crate::query::add_clause(query.as_ref(), active));
    }
    // The query first, then the request's own parameters, then the clauses they leave.
    let mut mapped = Params::default();
    if let Some(query) = &query {
        mapped.set("query", &query.to_string());
    }
    for param in params.iter().filter(|p| p.key() != "query") {
        mapped.set(param.key(), param.value());
    }
    for clause in clauses {
        let name = clause.get(0)?.as_str()?;
        if clause.as_array()?.len() != 2 {
            return None;
        }
        let value = match name {
            "order_by" => order_by(clause.get(1)?)?.to_string(),
            _ => clause.get(1)?.as_u64()?.to_string(),
        };
        if !params.contains(name) {
            mapped.set(name, &value);
        }
    }
    let query_string = mapped.to_query_string();
    let target = match query_string.is_empty() {
        true => entity.path(),
        false => format!("{}?{query_string}", entity.path()),
    };
    Some(ParsedRequest::derived(target, query))
}

/// An AST `order_by` clause's fields (`"certname"` or `["certname", "desc"]`) as the URL
/// parameter writes them (`[{"field": "certname", "order": "desc"}]`).
fn order_by(fields: &Value) -> Option<Value> {
    let fields = fields.as_array()?;
    let mut out = Vec::with_capacity(fields.len());
    for field in fields {
        let (name, order) = match field {
            Value::String(name) => (name.as_str(), "asc"),
            Value::Array(pair) => match pair.as_slice() {
                [Value::String(name)] => (name.as_str(), "asc"),
                [Value::String(name), Value::String(order)] => (name.as_str(), order.as_str()),
                _ => return None,
            },
            _ => return None,
        };
        out.push(serde_json::json!({ "field": name, "order": order }));
    }
    Some(Value::Array(out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::ClientRequest;
    use serde_json::json;

    fn mapped(ast: Value, extra: &str) -> Option<String> {
        let encoded: String = form_urlencoded::byte_serialize(ast.to_string().as_bytes()).collect();
        let raw = format!("query={encoded}{extra}");
        mapped_request(&ast, &Params::parse(Some(&raw))).map(|t| {
            percent_encoding::percent_decode_str(t.target())
                .decode_utf8_lossy()
                .into_owned()
        })
    }

    #[test]
    fn a_from_query_maps_onto_its_entity_route() {
        assert_eq!(
            mapped(
                json!([
                    "from",
                    "nodes",
                    [
                        "extract",
                        ["certname"],
                        ["=", "facts_environment", "staging"]
                    ],
                    ["limit", 3]
                ]),
                ""
            )
            .as_deref(),
            Some(
                r#"/pdb/query/v4/nodes?query=["extract",["certname"],["=","facts_environment","staging"]]&limit=3"#
            )
        );
        assert_eq!(
            mapped(
                json!([
                    "from",
                    "fact_contents",
                    ["order_by", [["certname", "desc"], "path"]],
                    ["offset", 2]
                ]),
                "&include_total=true"
            )
            .as_deref(),
            Some(
                r#"/pdb/query/v4/fact-contents?include_total=true&order_by=[{"field":"certname","order":"desc"},{"field":"path","order":"asc"}]&offset=2"#
            )
        );
        assert_eq!(
            mapped(json!(["from", "reports"]), "").as_deref(),
            Some(r#"/pdb/query/v4/reports?query=["=","node_state","active"]"#),
            "the root endpoint sees active nodes on reports too"
        );
        assert_eq!(
            mapped(
                json!([
                    "from",
                    "catalogs",
                    ["extract", ["certname"], ["=", "node_state", "any"]]
                ]),
                ""
            )
            .as_deref(),
            Some(
                r#"/pdb/query/v4/catalogs?query=["extract",["certname"],["=","node_state","any"]]"#
            )
        );
    }

    #[test]
    fn what_is_not_a_mappable_from_query_passes_through() {
        assert_eq!(mapped(json!(["=", "certname", "a"]), ""), None);
        assert_eq!(mapped(json!(["from", "event_counts"]), ""), None);
        assert_eq!(
            mapped(json!(["from", "nodes", ["limit", 2]]), "&limit=3").as_deref(),
            Some("/pdb/query/v4/nodes?limit=3"),
            "the parameter wins over the clause"
        );
        assert_eq!(
            mapped(json!(["from", "nodes", ["limit", 2]]), "&offset=1").as_deref(),
            Some("/pdb/query/v4/nodes?offset=1&limit=2")
        );
        assert_eq!(mapped(json!(["from", "nodes", ["limit", "x"]]), ""), None);
        assert_eq!(
            mapped(json!(["from", "nodes", ["=", "a", 1], ["=", "b", 2]]), ""),
            None
        );
        let read_target = |target: &str| read(&ParsedRequest::parse(&ClientRequest::get(target)));
        assert_eq!(
            read_target("/pdb/query/v4?query=nodes%20%7B%7D&ast_only=true"),
            RootQuery::PassThrough
        );
        let RootQuery::Pql(pql) = read_target("/pdb/query/v4?query=nodes%20%7B%7D") else {
            panic!("PQL");
        };
        assert_eq!(
            pql.translation_target(),
            "/pdb/query/v4?query=nodes+%7B%7D&ast_only=true"
        );
    }
}
