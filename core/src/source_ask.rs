//! Reading a `/facts` query for the provenance fact, which no backend holds: pdbmux decides every
//! constraint on a fact's name or value for that fact itself (its name is `source_fact`, its
//! value the name of the backend that owns the node's facts), once per backend, and leaves the
//! rest of the query (the environment, the certname, a subquery on the node) to the backends,
//! which are asked the provenance fact's own path under it (docs/merging.md, "Provenance").

use std::collections::HashMap;

use percent_encoding::percent_decode_str;
use regex::{Regex, RegexBuilder};
use serde_json::Value;

use crate::config::Config;
use crate::entity::{ColumnSet, Entity};
use crate::parsed::ParsedRequest;
use crate::query::{self, Params, QueryText, Residual};
use crate::route::Route;
use crate::sort::{self, OrderBy};

/// What a path segment keeps unencoded: the unreserved characters.
pub(crate) const SEGMENT: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~');

/// Provenance records asked as the fact's own path: the nodes the backends find under `request`'s
/// query, each as its facts owner names it.
#[derive(Debug, PartialEq)]
pub(crate) struct SourcePart {
    /// `/facts/<source_fact>[/<backend>]` with the client's parameters and, as its query, what
    /// is left of the client's for the backends to decide.
    pub(crate) request: ParsedRequest,
    /// The backends whose records it keeps, when neither every backend nor the one its path
    /// names: a query whose value constraints admit several backends but not all.
    pub(crate) values: Option<Vec<String>>,
}

/// How a `/facts` query that may admit the provenance fact is answered.
#[derive(Debug, PartialEq)]
pub(crate) enum SourceAsk {
    /// Only provenance records: one part.
    Part(SourcePart),
    /// No record meets the query (a value no backend is named, a name no fact has).
    Nothing,
    /// A pattern on the provenance fact's value that pdbmux cannot read: the 400's message.
    Refused(String),
    /// Several answers joined (`core/src/concat.rs`; an ordered request's merged in its order):
    /// first, when `records`, the other facts' records as the backends answer that request (the
    /// client's, or its query with the provenance fact excluded); then each part's provenance
    /// records (one per residual query: a query such as `["or",["=","value","pdb-a"],
    /// ["=","environment","test"]]` leaves each backend a different one).
    Joined {
        records: Option<ParsedRequest>,
        parts: Vec<SourcePart>,
        /// The request's order, which each answer comes sorted by: the answers are merged in it.
        order: Option<OrderBy>,
    },
}

/// Why the query cannot be evaluated for the provenance fact.
enum Stop {
    /// A clause on a fact's name or value pdbmux does not decide (an `in` of a subquery, an order
    /// on the name, an implicit subquery joined on the fact, a pattern on the name it cannot
    /// read): the request is answered as before this reading, the fact left out.
    Undecided,
    /// A pattern on the value pdbmux cannot read (PostgreSQL syntax Rust's `regex` lacks, or
    /// over [`PATTERN_BYTES`]), with why: a 400 when the query admits no other fact, else
    /// undecided (the backends read it for their own facts).
    Unreadable(String),
}

/// The most memory one pattern of a query may compile to. The patterns a fact's or a backend's
/// name needs take a few KiB; a pattern that needs more is not read by pdbmux (a query of large
/// patterns such as `\w{40}\w{40}z`, each compiled to megabytes, would otherwise cost seconds of
/// CPU).
const PATTERN_BYTES: usize = 256 * 1024;

/// The patterns of one reading, each compiled once whatever the backends it is decided for, or
/// why it cannot be read.
#[derive(Default)]
struct Patterns(HashMap<String, Result<Regex, String>>);

impl Patterns {
    /// `pattern`, compiled (at most once).
    fn get(&mut self, pattern: &str) -> Result<&Regex, &str> {
        self.0
            .entry(pattern.to_owned())
            .or_insert_with(|| {
                RegexBuilder::new(pattern)
                    .size_limit(PATTERN_BYTES)
                    .build()
                    .map_err(|error| error.to_string())
            })
            .as_ref()
            .map_err(String::as_str)
    }
}

/// Reads `request` for the provenance fact: `None` when it is not a question about it, or one
/// pdbmux answers without this reading (no query but in an order [`ordered_apart`] reads, a
/// projection, the path under a query the
/// backends decide whole, a clause it cannot decide, a windowed request whose answer would
/// join other facts' records or several parts).
///
/// Read on `/facts` when the query constrains the fact's name (without such a constraint every
/// node's provenance record comes with its facts, docs/merging.md "Provenance", but for an
/// order that is not by certname first: [`ordered_apart`]), and on the fact's own path
/// `/facts/<source_fact>[/<backend>]`, whose query is read as beside
/// `["=","name",<source_fact>]` (and the backend's name as its value).
pub(crate) fn read(request: &ParsedRequest, route: &Route, config: &Config) -> Option<SourceAsk> {
    let entity = route.entity()?;
    if !entity.carries_provenance() || !config.source_fact_enabled {
        return None;
    }
    let source = config.source_fact.as_str();
    let decode = |segment: &str| percent_decode_str(segment).decode_utf8_lossy().into_owned();
    // On the path, the backend it names, if any.
    let on_path: Option<Option<String>> = match route {
        Route::Query(_) => None,
        Route::FactsByName { name, value } if decode(name) == source => {
            Some(value.as_deref().map(decode))
        }
        _ => return None,
    };
    if on_path.is_none() {
        if let Some(apart) = ordered_apart(request, entity, config) {
            return Some(apart);
        }
    }
    let (query, analysis) = (
        request.parsed_query().ast()?,
        request.parsed_query().analysis()?,
    );
    if analysis.extract_outside_subquery || (on_path.is_none() && !analysis.outer_name_constraint) {
        return None;
    }
    let backends: Vec<&str> = config.backends.iter().map(|b| b.name.as_str()).collect();
    // The backends whose records may answer it.
    let asked: Vec<&str> = match &on_path {
        Some(Some(named)) => backends.iter().copied().filter(|b| b == named).collect(),
        _ => backends.clone(),
    };
    // Whether the query admits facts other than the provenance fact, which the backends hold.
    let records = on_path.is_none()
        && query::evaluate(query, &mut |atom| {
            Ok::<_, std::convert::Infallible>(names_only(atom, source).then_some(false))
        }) != Ok(Residual::Always(false));
    // What is left of the query for each backend's records, those sharing one left together.
    let mut groups: Vec<(Residual, Vec<&str>)> = Vec::new();
    let mut patterns = Patterns::default();
    for backend in asked.iter().copied() {
        let residual = query::evaluate(query, &mut |atom| {
            source_atom(atom, (source, backend), &mut patterns)
        });
        match residual {
            Err(Stop::Undecided) => return None,
            // Refused only where it decides the answer: a query about other facts too is the
            // backends' to read as before.
            Err(Stop::Unreadable(_)) if records => return None,
            Err(Stop::Unreadable(message)) => return Some(SourceAsk::Refused(message)),
            Ok(Residual::Always(false)) => {}
            Ok(residual) => match groups.iter_mut().find(|(left, _)| *left == residual) {
                Some((_, kept)) => kept.push(backend),
                None => groups.push((residual, vec![backend])),
            },
        }
    }
    // The path under a query the backends decide whole: the path's own merge answers it.
    if on_path.is_some() {
        if let [(Residual::Left(left), kept)] = groups.as_slice() {
            if left == query && kept.len() == asked.len() {
                return None;
            }
        }
    }
    let params = request.params();
    let part = |(residual, kept): (Residual, Vec<&str>)| {
        let left = match residual {
            Residual::Left(left) => Some(left),
            Residual::Always(_) => None,
        };
        let (value, values) = match (&on_path, kept.as_slice()) {
            (Some(Some(named)), _) => (Some(named.clone()), None),
            (_, [one]) => (Some((*one).to_owned()), None),
            (_, all) if all.len() == backends.len() => (None, None),
            (_, some) => (None, Some(some.iter().map(|b| (*b).to_owned()).collect())),
        };
        let mut path = source_path(entity, config);
        if let Some(value) = value {
            path.push('/');
            path.extend(percent_encoding::utf8_percent_encode(&value, SEGMENT));
        }
        SourcePart {
            request: with_query(path, params, left),
            values,
        }
    };
    match (records, groups.len()) {
        (false, 0) => Some(SourceAsk::Nothing),
        (true, 0) => None,
        (false, 1) => groups.pop().map(|group| SourceAsk::Part(part(group))),
        // A window would hold for each part alone (an order holds for the parts merged).
        _ if params.cuts_window() => None,
        _ => Some(SourceAsk::Joined {
            records: records.then(|| request.clone()),
            parts: groups.into_iter().map(part).collect(),
            order: request_order(request, entity),
        }),
    }
}

/// A `/facts` question whose every node's provenance record comes with its facts (its query, if
/// any, has no clause on a fact's name or value and projects nothing), ordered by a field other
/// than certname first, not windowed: asked as two answers merged in its order, the other facts
/// (its query with the provenance fact excluded) and the provenance records (the fact's own path
/// under its query). Written beside each node's own records, as an order by certname first
/// allows, a node's synthetic record could sort before records already written, so the merge
/// would have to hold the whole answer (docs/merging.md, "Streamed merges"). `None` for any
/// other question.
fn ordered_apart(request: &ParsedRequest, entity: Entity, config: &Config) -> Option<SourceAsk> {
    let params = request.params();
    let order = request_order(request, entity)?;
    if params.cuts_window() || order.fields.first()?.field == "certname" {
        return None;
    }
    let source = config.source_fact.as_str();
    let query = match request.parsed_query().text() {
        QueryText::Absent => None,
        QueryText::Ast(query) => Some(query),
        QueryText::Pql(_) | QueryText::Malformed(_) => return None,
    };
    if let Some(query) = query {
        let analysis = request.parsed_query().analysis()?;
        if analysis.extract_outside_subquery
            || analysis.outer_name_constraint
            || analysis.in_query_paging
        {
            return None;
        }
        // No clause the provenance fact would be read for (its value): the backends decide
        // every clause, for the provenance records as for the others.
        let backend = config.backends.first()?.name.as_str();
        let mut patterns = Patterns::default();
        let left_whole = query::evaluate(query, &mut |atom| match source_atom(
            atom,
            (source, backend),
            &mut patterns,
        ) {
            Ok(None) => Ok(None),
            _ => Err(()),
        });
        if left_whole.is_err() {
            return None;
        }
    }
    let others = query::without_fact(query, source);
    Some(SourceAsk::Joined {
        records: Some(with_query(request.path().to_owned(), params, Some(others))),
        parts: vec![SourcePart {
            request: with_query(source_path(entity, config), params, query.cloned()),
            values: None,
        }],
        order: Some(order),
    })
}

/// The order `request` asks for, when it names a field and reads (a malformed one is the record
/// merge's 400).
fn request_order(request: &ParsedRequest, entity: Entity) -> Option<OrderBy> {
    let params = request.params();
    let columns = entity.order_columns(ColumnSet::facts_expiration(
        params.get("include_facts_expiration"),
    ));
    sort::parse_paging(params.get("order_by"), None, None, columns)
        .ok()
        .map(|paging| paging.order_by)
        .filter(|order| !order.is_empty())
}

/// The truth of `atom` for the provenance record whose value is `backend`: decided for a clause
/// on the fact's name or value, `None` for one the backends decide (on the node's certname or
/// environment, a subquery on another entity).
fn source_atom(
    atom: &Value,
    (source, backend): (&str, &str),
    patterns: &mut Patterns,
) -> Result<Option<bool>, Stop> {
    let Some(items) = atom.as_array() else {
        return Err(Stop::Undecided);
    };
    let op = items.first().and_then(Value::as_str);
    match (op, items.get(1)) {
        (Some("=" | "~" | "<" | ">" | "<=" | ">=" | "null?" | "in"), Some(_)) => {}
        // An implicit subquery of an entity joined on the node alone.
        (Some("subquery"), Some(Value::String(entity)))
            if !matches!(entity.as_str(), "facts" | "fact_contents") =>
        {
            return Ok(None)
        }
        _ => return Err(Stop::Undecided),
    }
    let (Some(op), [_, field, operand]) = (op, items.as_slice()) else {
        return Err(Stop::Undecided);
    };
    let fact_field = |field: &Value| matches!(field.as_str(), Some("name" | "value"));
    let (subject, on_value) = match field {
        Value::String(field) if field == "name" => (source, false),
        Value::String(field) if field == "value" => (backend, true),
        Value::String(_) => return Ok(None),
        Value::Array(fields) if op == "in" && !fields.iter().any(fact_field) => return Ok(None),
        _ => return Err(Stop::Undecided),
    };
    match (op, operand) {
        ("=", Value::String(text)) => Ok(Some(text == subject)),
        // The value is a string: it equals no number or boolean, and orders against no number.
        ("=", Value::Number(_) | Value::Bool(_)) if on_value => Ok(Some(false)),
        ("<" | ">" | "<=" | ">=", Value::Number(_)) if on_value => Ok(Some(false)),
        ("null?", Value::Bool(null)) => Ok(Some(!null)),
        ("~", Value::String(pattern)) => match patterns.get(pattern) {
            Ok(regex) => Ok(Some(regex.is_match(subject))),
            Err(error) if on_value => Err(Stop::Unreadable(format!(
                "pdbmux: the regular expression {pattern:?} on {source} cannot be read: {error}"
            ))),
            // A pattern on the name is the backends' to read for their own facts.
            Err(_) => Err(Stop::Undecided),
        },
        ("in", list) => match list.as_array().map(Vec::as_slice) {
            Some([array, Value::Array(listed)]) if array == "array" => Ok(Some(
                listed.iter().any(|item| item.as_str() == Some(subject)),
            )),
            _ => Err(Stop::Undecided),
        },
        _ => Err(Stop::Undecided),
    }
}

/// Whether `atom` admits no fact but the provenance fact `source`: `["=","name",<source>]`, or an
/// `in` of an array naming it and nothing else.
fn names_only(atom: &Value, source: &str) -> bool {
    match atom.as_array().map(Vec::as_slice) {
        Some([op, field, Value::String(name)]) => op == "=" && field == "name" && name == source,
        Some([op, field, list]) if op == "in" && field == "name" => {
            match list.as_array().map(Vec::as_slice) {
                // An empty list names no fact: the backends answer it, as one PuppetDB would.
                Some([array, Value::Array(names)]) => {
                    array == "array"
                        && !names.is_empty()
                        && names.iter().all(|name| name.as_str() == Some(source))
                }
                _ => false,
            }
        }
        _ => false,
    }
}

/// The provenance fact's own path, `/facts/<source_fact>`.
fn source_path(entity: Entity, config: &Config) -> String {
    format!(
        "{}/{}",
        entity.path_static(),
        percent_encoding::utf8_percent_encode(&config.source_fact, SEGMENT)
    )
}

/// A request of `path` with `params` but their `query`, and `query` in its place.
fn with_query(path: String, params: &Params, query: Option<Value>) -> ParsedRequest {
    let mut kept = Params::default();
    for param in params.iter().filter(|p| p.key() != "query") {
        kept.set(param.key(), param.value());
    }
    if let Some(query) = &query {
        kept.set("query", &query.to_string());
    }
    let kept = kept.to_query_string();
    let target = match kept.is_empty() {
        true => path,
        false => format!("{path}?{kept}"),
    };
    ParsedRequest::derived(target, query)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::message::ClientRequest;
    use serde_json::json;

    fn config() -> Config {
        Config::on_loopback(&[("pdb-a", 1), ("pdb-b", 2), ("pdb-c", 3)])
    }

    fn target(path: &str, query: &Value, extra: &str) -> String {
        format!(
            "/pdb/query/v4/{path}?query={}{extra}",
            percent_encoding::utf8_percent_encode(&query.to_string(), SEGMENT)
        )
    }

    fn ask(path: &str, query: Value, extra: &str) -> Option<SourceAsk> {
        let request = ParsedRequest::parse(&ClientRequest::get(target(path, &query, extra)));
        let route = request.route().expect("a route").clone();
        read(&request, &route, &config())
    }

    /// A part as (its path below `/facts`, its query, the backends it keeps).
    type Asked = (String, Option<Value>, Option<Vec<String>>);

    fn part(part: &SourcePart) -> Asked {
        let path = part.request.path();
        let below = path.split_once("/facts/").map_or(path, |(_, below)| below);
        (
            below.to_owned(),
            part.request.parsed_query().ast().cloned(),
            part.values.clone(),
        )
    }

    fn joined(ask: Option<SourceAsk>) -> (bool, Vec<Asked>) {
        match ask {
            Some(SourceAsk::Joined { records, parts, .. }) => {
                (records.is_some(), parts.iter().map(part).collect())
            }
            Some(SourceAsk::Part(one)) => (false, vec![part(&one)]),
            other => panic!("records and parts, not {other:?}"),
        }
    }

    #[test]
    fn beside_other_facts_it_is_their_records_and_its_own_path() {
        let env = json!(["=", "environment", "production"]);
        // Puppetboard's inventory with the provenance fact among its facts.
        let inventory = json!([
            "and",
            ["or", ["=", "name", "os"], ["=", "name", "pdbmux_source"]],
            env
        ]);
        assert_eq!(
            joined(ask("facts", inventory.clone(), "")),
            (
                true,
                vec![("pdbmux_source".into(), Some(env.clone()), None)]
            )
        );
        // A window would hold for each part alone: a paged request is not several; an ordered
        // one is, its parts merged in its order.
        assert_eq!(ask("facts", inventory.clone(), "&limit=5"), None);
        assert_eq!(ask("facts", inventory.clone(), "&include_total=true"), None);
        assert_eq!(
            joined(ask("facts", inventory, &format!("&order_by={BY_NAME}"))),
            (
                true,
                vec![("pdbmux_source".into(), Some(env.clone()), None)]
            )
        );
        for admits_it in [
            json!(["~", "name", "^(pdbmux|kern)"]),
            json!(["not", ["=", "name", "kernel"]]),
            json!([
                "and",
                ["in", "name", ["array", ["pdbmux_source", "os"]]],
                ["~", "name", "o"]
            ]),
            json!(["not", ["in", "name", ["array", ["os", "kernel"]]]]),
        ] {
            assert_eq!(
                joined(ask("facts", admits_it.clone(), "")),
                (true, vec![("pdbmux_source".into(), None, None)]),
                "{admits_it}"
            );
        }
        // Not the provenance fact: the backends' records alone.
        for not_it in [
            json!(["=", "name", "kernel"]),
            json!(["not", ["~", "name", "source"]]),
            // An empty list names no fact: the backends answer it, as one PuppetDB would.
            json!(["in", "name", ["array", []]]),
        ] {
            assert_eq!(ask("facts", not_it.clone(), ""), None, "{not_it}");
        }
        // No fact is named both: nothing, at once.
        let both = json!(["and", ["=", "name", "pdbmux_source"], ["=", "name", "os"]]);
        assert_eq!(ask("facts", both, ""), Some(SourceAsk::Nothing));
    }

    /// `order_by=[{"field":"name"}]`, form-encoded.
    const BY_NAME: &str = "%5B%7B%22field%22%3A%22name%22%7D%5D";

    /// The request the other facts' records are asked with, as (its path, its query).
    fn records_asked(ask: Option<SourceAsk>) -> Option<(String, Option<Value>)> {
        match ask {
            Some(SourceAsk::Joined {
                records: Some(records),
                ..
            }) => Some((
                records.path().to_owned(),
                records.parsed_query().ast().cloned(),
            )),
            _ => None,
        }
    }

    #[test]
    fn every_nodes_records_ordered_by_another_field_than_certname_are_two_answers_merged() {
        let target = |query: Option<&Value>, extra: &str| {
            let query = query.map_or(String::new(), |query| {
                let text = query.to_string();
                format!(
                    "query={}",
                    percent_encoding::utf8_percent_encode(&text, SEGMENT)
                )
            });
            format!("/pdb/query/v4/facts?{query}{extra}")
        };
        let read_target = |target: String| {
            let request = ParsedRequest::parse(&ClientRequest::get(target));
            let route = request.route().expect("a route").clone();
            read(&request, &route, &config())
        };
        let excluded = json!(["not", ["=", "name", "pdbmux_source"]]);
        // No query: every fact but the provenance fact, then every node's provenance record.
        let whole = read_target(target(None, &format!("&order_by={BY_NAME}")));
        assert_eq!(
            records_asked(whole),
            Some(("/pdb/query/v4/facts".into(), Some(excluded.clone())))
        );
        let whole = read_target(target(None, &format!("&order_by={BY_NAME}")));
        assert_eq!(
            joined(whole),
            (true, vec![("pdbmux_source".into(), None, None)])
        );
        // A query the backends decide whole: both answers asked it.
        let env = json!(["=", "environment", "production"]);
        let subquery = json!([
            "in",
            "certname",
            [
                "extract",
                "certname",
                ["select_nodes", ["=", "report_environment", "production"]]
            ]
        ]);
        for query in [env, subquery] {
            let read = || read_target(target(Some(&query), &format!("&order_by={BY_NAME}")));
            assert_eq!(
                records_asked(read()).and_then(|(_, query)| query),
                Some(json!(["and", query, excluded])),
                "{query}"
            );
            assert_eq!(
                joined(read()),
                (
                    true,
                    vec![("pdbmux_source".into(), Some(query.clone()), None)]
                )
            );
        }
        // Not read so: ordered by certname first (each node's records together: the synthetic
        // record streams beside them), unordered, windowed, projected, or a clause on the value.
        let by_certname =
            "%5B%7B%22field%22%3A%22certname%22%7D%2C%7B%22field%22%3A%22name%22%7D%5D";
        for extra in [
            format!("&order_by={by_certname}"),
            String::new(),
            format!("&order_by={BY_NAME}&limit=10"),
            format!("&order_by={BY_NAME}&offset=10"),
            format!("&order_by={BY_NAME}&include_total=true"),
            "&order_by=%5B%5D".to_owned(),
            "&order_by=not-json".to_owned(),
        ] {
            assert_eq!(read_target(target(None, &extra)), None, "{extra}");
        }
        for query in [
            json!(["=", "value", "pdb-a"]),
            json!(["extract", ["certname"], ["=", "environment", "production"]]),
            json!(["or", ["=", "environment", "test"], [">", "value", 3]]),
        ] {
            let read = read_target(target(Some(&query), &format!("&order_by={BY_NAME}")));
            assert_eq!(read, None, "{query}");
        }
        // PQL is the backends' to read whole.
        assert_eq!(
            read_target(format!(
                "/pdb/query/v4/facts?query=facts%20%7B%7D&order_by={BY_NAME}"
            )),
            None
        );
    }

    #[test]
    fn value_constraints_anywhere_are_decided_per_backend() {
        let source = json!(["=", "name", "pdbmux_source"]);
        let test_env = json!(["=", "environment", "test"]);
        // A value below an `or`: pdb-a's records all, the others' in `test`.
        let either = json!(["and", source, ["or", ["=", "value", "pdb-a"], test_env]]);
        assert_eq!(
            joined(ask("facts", either, "")),
            (
                false,
                vec![
                    ("pdbmux_source/pdb-a".into(), None, None),
                    (
                        "pdbmux_source".into(),
                        Some(test_env.clone()),
                        Some(vec!["pdb-b".into(), "pdb-c".into()])
                    ),
                ]
            )
        );
        // A value below a `not`, with the fact named by a pattern.
        let not_b = json!([
            "and",
            ["~", "name", "source$"],
            ["not", ["=", "value", "pdb-b"]]
        ]);
        assert_eq!(
            joined(ask("facts", not_b, "")),
            (
                true,
                vec![(
                    "pdbmux_source".into(),
                    None,
                    Some(vec!["pdb-a".into(), "pdb-c".into()])
                )]
            )
        );
        // No backend is named so: nothing, at once; a pattern pdbmux cannot read: a 400.
        let none = json!(["and", source, ["in", "value", ["array", ["x", 1]]]]);
        assert_eq!(ask("facts", none, ""), Some(SourceAsk::Nothing));
        let number = json!(["and", source, [">", "value", 3]]);
        assert_eq!(ask("facts", number, ""), Some(SourceAsk::Nothing));
        let unreadable = json!(["and", source, ["~", "value", "("]]);
        assert!(matches!(
            ask("facts", unreadable, ""),
            Some(SourceAsk::Refused(message)) if message.contains("cannot be read")
        ));
        // Beside other facts, a value pattern pdbmux cannot read (PostgreSQL's look-ahead, its
        // word boundaries) is the backends' for their facts, in whatever order the clauses come.
        for theirs in [
            json!(["and", ["~", "value", "^(?!Ubuntu)"], ["=", "name", "os"]]),
            json!(["and", ["=", "name", "os"], ["~", "value", "^(?!Ubuntu)"]]),
            json!([
                "and",
                ["~", "name", "^(pdbmux|kern)"],
                ["~", "value", "\\m5"]
            ]),
        ] {
            assert_eq!(ask("facts", theirs.clone(), ""), None, "{theirs}");
        }
        // A pattern too large to compile cheaply is not read, and each is compiled once.
        let mut large = vec![json!("or")];
        large.extend((0..50).map(|n| json!(["~", "name", format!("\\w{{40}}\\w{{40}}{n}")])));
        assert_eq!(ask("facts", Value::Array(large), ""), None);
        let mut patterns = Patterns::default();
        for backend in ["pdb-a", "pdb-b"] {
            let atom = json!(["~", "value", "^pdb-"]);
            assert!(matches!(
                source_atom(&atom, ("pdbmux_source", backend), &mut patterns),
                Ok(Some(true))
            ));
        }
        assert_eq!(patterns.0.len(), 1);
        // A pattern on the name pdbmux cannot read is the backends' (their own facts), and a
        // clause it does not decide leaves the query as it was.
        assert_eq!(ask("facts", json!(["~", "name", "("]), ""), None);
        let subquery = json!([
            "and",
            source,
            [
                "in",
                "value",
                ["extract", "value", ["select_facts", ["=", "name", "x"]]]
            ]
        ]);
        assert_eq!(ask("facts", subquery, ""), None);
        // A malformed `not` is the backends' to refuse, the name clause inside it undecided.
        let malformed = json!(["and", source, ["not", ["=", "name", "x"], 1]]);
        assert_eq!(ask("facts", malformed, ""), None);
    }

    #[test]
    fn on_its_own_path_the_query_is_read_beside_its_name() {
        let source = json!(["=", "name", "pdbmux_source"]);
        assert_eq!(
            joined(ask("facts/pdbmux_source", source.clone(), "")),
            (false, vec![("pdbmux_source".into(), None, None)])
        );
        assert_eq!(
            ask("facts/pdbmux_source", json!(["=", "name", "kernel"]), ""),
            Some(SourceAsk::Nothing)
        );
        // Puppetboard's value page: the path and a value.
        let value_page = json!(["and", ["=", "environment", "test"], ["=", "value", "pdb-b"]]);
        assert_eq!(
            joined(ask("facts/pdbmux_source", value_page, "&limit=10")),
            (
                false,
                vec![(
                    "pdbmux_source/pdb-b".into(),
                    Some(json!(["=", "environment", "test"])),
                    None
                )]
            )
        );
        assert_eq!(
            joined(ask(
                "facts/pdbmux_source/pdb-a",
                json!(["~", "value", "-a$"]),
                ""
            )),
            (false, vec![("pdbmux_source/pdb-a".into(), None, None)])
        );
        assert_eq!(
            ask(
                "facts/pdbmux_source/pdb-a",
                json!(["=", "value", "pdb-b"]),
                ""
            ),
            Some(SourceAsk::Nothing)
        );
        // A query the backends decide whole is the path's own.
        assert_eq!(
            ask(
                "facts/pdbmux_source",
                json!(["=", "environment", "test"]),
                ""
            ),
            None
        );
        assert_eq!(
            ask(
                "facts/pdbmux_source/pdb-a",
                json!(["=", "certname", "n"]),
                ""
            ),
            None
        );
    }

    /// A clause of a `/facts` query as Puppetboard, pypuppetdb or an operator writes one: on
    /// the name (the provenance fact's among others), the value, the environment, combined.
    pub(crate) fn facts_clause() -> impl proptest::strategy::Strategy<Value = serde_json::Value> {
        use proptest::prelude::*;
        let name = prop_oneof![Just("pdbmux_source"), Just("os"), Just("kernel")];
        let leaf = prop_oneof![
            name.clone().prop_map(|n| json!(["=", "name", n])),
            proptest::collection::vec(name, 0..4).prop_map(|names| json!([
                "in",
                "name",
                ["array", names]
            ])),
            prop_oneof![
                Just("^pdbmux"),
                Just("o"),
                Just("^(pdbmux|kern)"),
                Just("(")
            ]
            .prop_map(|p| json!(["~", "name", p])),
            prop_oneof![Just("pdb-a"), Just("x")].prop_map(|v| json!(["=", "value", v])),
            Just(json!(["~", "value", "^pdb"])),
            Just(json!(["=", "environment", "production"])),
            Just(json!(["~", "certname", "^a"])),
            Just(json!(["in", "value", ["array", ["pdb-b", "x"]]])),
            Just(json!(["null?", "value", false])),
        ];
        let combined = leaf.clone().prop_recursive(3, 12, 3, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 1..4).prop_map(|c| {
                    let mut or = vec![json!("or")];
                    or.extend(c);
                    serde_json::Value::Array(or)
                }),
                proptest::collection::vec(inner.clone(), 1..4).prop_map(|c| {
                    let mut and = vec![json!("and")];
                    and.extend(c);
                    serde_json::Value::Array(and)
                }),
                inner.prop_map(|c| json!(["not", c])),
            ]
        });
        // A lone clause as often as a combination: Puppetboard's queries are mostly one or two.
        prop_oneof![leaf, combined]
    }

    /// Whether one PuppetDB would admit `record` under `query`: the operators [`facts_clause`]
    /// writes, evaluated on a record's fields.
    fn admits(query: &Value, record: &serde_json::Map<String, Value>) -> Option<bool> {
        let items = query.as_array()?;
        let field = |at: usize| record.get(items.get(at)?.as_str()?)?.as_str();
        Some(match items.first()?.as_str()? {
            "and" => items[1..]
                .iter()
                .map(|q| admits(q, record))
                .collect::<Option<Vec<_>>>()?
                .into_iter()
                .all(|t| t),
            "or" => items[1..]
                .iter()
                .map(|q| admits(q, record))
                .collect::<Option<Vec<_>>>()?
                .into_iter()
                .any(|t| t),
            "not" => !admits(items.get(1)?, record)?,
            "=" => field(1)? == items.get(2)?.as_str()?,
            "~" => regex::Regex::new(items.get(2)?.as_str()?)
                .ok()?
                .is_match(field(1)?),
            "null?" => items.get(2)? == &Value::Bool(field(1).is_none()),
            "in" => items
                .get(2)?
                .get(1)?
                .as_array()?
                .iter()
                .any(|v| v.as_str() == field(1)),
            _ => return None,
        })
    }

    proptest::proptest! {
        /// What pdbmux asks for the provenance fact is exactly what the query admits of it: a
        /// node's provenance record (its value a backend's name) is in a part that keeps that
        /// backend and whose query admits the node, if and only if the whole query admits the
        /// record; and the backends are asked other facts' records unless the query admits none.
        #[test]
        fn the_parts_admit_exactly_the_provenance_records_the_query_admits(
            query in facts_clause(),
            on_path in proptest::bool::ANY,
        ) {
            let config = config();
            let path = if on_path { "facts/pdbmux_source" } else { "facts" };
            let read = ask(path, query.clone(), "");
            let (records, parts) = match read {
                Some(SourceAsk::Joined { records, parts, .. }) => (records.is_some(), parts),
                Some(SourceAsk::Part(one)) => (false, vec![one]),
                Some(SourceAsk::Nothing) => (false, Vec::new()),
                // Read as before: a pattern neither can read, or not a question about the fact.
                Some(SourceAsk::Refused(_)) | None => return Ok(()),
            };
            let record = |name: &str, value: &str, environment: &str, certname: &str| {
                json!({"name": name, "value": value, "environment": environment, "certname": certname})
                    .as_object()
                    .cloned()
                    .expect("an object")
            };
            let whole = |record: &serde_json::Map<String, Value>| match on_path {
                true => admits(&json!(["and", ["=", "name", "pdbmux_source"], query]), record),
                false => admits(&query, record),
            };
            for backend in config.backends.iter().map(|b| b.name.as_str()) {
                for (environment, certname) in [("production", "a1"), ("test", "b1")] {
                    let provenance = record("pdbmux_source", backend, environment, certname);
                    let Some(expected) = whole(&provenance) else { return Ok(()) };
                    let asked = parts.iter().any(|p| {
                        let (below, left, values) = part(p);
                        let keeps = match below.split_once('/') {
                            Some((_, named)) => named == backend,
                            None => values.is_none_or(|v| v.iter().any(|v| v == backend)),
                        };
                        keeps && left.is_none_or(|left| admits(&left, &provenance) == Some(true))
                    });
                    proptest::prop_assert_eq!(asked, expected, "{} {} {}", query, backend, environment);
                }
            }
            if !records && !on_path {
                for name in ["os", "kernel"] {
                    for value in ["pdb-a", "x"] {
                        let other = record(name, value, "production", "a1");
                        proptest::prop_assert_ne!(whole(&other), Some(true), "{} admits {}", query, name);
                    }
                }
            }
        }
    }
}
