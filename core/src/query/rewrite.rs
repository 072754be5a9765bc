//! The rewrites pdbmux makes to an AST before fanning it out: ownership push-down (D4), the
//! `avg` → `sum` + `count` rewrite of combined aggregates, and a distinct projection asked of a
//! node-owned entity in place of a union one (`/packages` as `/package-inventory`).

use serde_json::{json, Value};

use super::ast::{form, function_form, outer_extract_pointer};

/// The clause D4 adds to a backend's query: `["not",["in","certname",["array",[...]]]]` over the
/// shared certnames another backend owns.
///
/// Use [`exclude_certnames`] to add it; this is exposed for logs and tests.
pub fn ownership_clause(certnames: &[&str]) -> Value {
    json!(["not", ["in", "certname", ["array", certnames]]])
}

/// Adds [`ownership_clause`] as a conjunct of `query`, for the backend that must not answer for
/// `certnames` (docs/decisions.md D4).
///
/// - no certnames: the query unchanged (`None` stays `None`);
/// - no query: the clause alone;
/// - a filter `F`: `["and", F, clause]`;
/// - an outer extract: the clause joins its filter (`["extract", cols, ["and", F, clause]]`), or
///   becomes the filter, placed before a `group_by`;
/// - a top-level `from`: the same, applied to its query.
///
/// A top-level `from` with in-query paging, and a bare `["extract"]`, are returned untouched:
/// check [`Analysis::in_query_paging`](super::Analysis::in_query_paging) first, since such a
/// query cannot be answered with ownership pushed down.
pub fn exclude_certnames(query: Option<&Value>, certnames: &[&str]) -> Option<Value> {
    if certnames.is_empty() {
        return query.cloned();
    }
    let clause = ownership_clause(certnames);
    Some(match query {
        None => clause,
        Some(query) => add_criteria(query, clause),
    })
}

/// `["in","certname",["array",[...]]]`: the clause a correction adds to ask about these
/// certnames only (docs/merging.md, "Corrections").
pub fn only_certnames_clause(certnames: &[&str]) -> Value {
    json!(["in", "certname", ["array", certnames]])
}

/// The count of what `query` matches among `certnames`:
/// `["extract",[["function","count"]], <query's filter and the in-clause>]`. The filter is the
/// query itself, or the filter of its outer extract. `None` for a query whose rows are not its
/// records (an outer extract with `group_by`, a `from`): such a total cannot be corrected by
/// counting records.
pub fn count_among(query: Option<&Value>, certnames: &[&str]) -> Option<Value> {
    let clause = only_certnames_clause(certnames);
    let filter = match query {
        None => clause,
        Some(query) => match form(query) {
            Some(("extract", items)) => {
                if items
                    .iter()
                    .skip(2)
                    .any(|i| form(i).is_some_and(|(op, _)| op == "group_by"))
                {
                    return None;
                }
                match items.get(2) {
                    None | Some(Value::Null) => clause,
                    Some(filter) => json!(["and", filter, clause]),
                }
            }
            Some(("from", _)) => return None,
            _ => json!(["and", query, clause]),
        },
    };
    Some(json!(["extract", [["function", "count"]], filter]))
}

/// `query`'s outer `extract` with `extra` columns appended to what it projects (those it lacks),
/// for fields a merge needs and the client did not ask for. `None` when the query is not an
/// extract with a column list.
pub fn with_extract_columns(query: &Value, extra: &[&str]) -> Option<Value> {
    let (op, items) = form(query)?;
    if op != "extract" {
        return None;
    }
    let mut items = items.to_vec();
    let mut columns = match items.get(1)? {
        Value::Array(columns) => columns.clone(),
        Value::String(column) => vec![Value::String(column.clone())],
        _ => return None,
    };
    for field in extra {
        if !columns.iter().any(|c| c.as_str() == Some(field)) {
            columns.push(Value::String((*field).to_owned()));
        }
    }
    items[1] = Value::Array(columns);
    Some(Value::Array(items))
}

/// `query` with its `node_state` criteria (outside subqueries) corrected for nodes a backend
/// holds deactivated while the estate holds them active (`revived`): `active` also takes them,
/// `inactive` no longer does. `None` when the query names no `node_state` there, or `revived`
/// is empty (nothing to correct).
pub fn widen_node_state(query: &Value, revived: &[&str]) -> Option<Value> {
    if revived.is_empty() {
        return None;
    }
    let mut changed = false;
    let widened = widen(query, revived, &mut changed);
    changed.then_some(widened)
}

fn widen(node: &Value, revived: &[&str], changed: &mut bool) -> Value {
    let Some((op, items)) = form(node) else {
        return node.clone();
    };
    match (op, items) {
        ("and" | "or" | "not", _) => {
            let mut out = vec![items[0].clone()];
            out.extend(items[1..].iter().map(|item| widen(item, revived, changed)));
            Value::Array(out)
        }
        ("extract", _) => {
            let mut out = items.to_vec();
            if let Some(filter) = out
                .get(2)
                .filter(|f| form(f).is_some_and(|(op, _)| op != "group_by"))
            {
                out[2] = widen(filter, revived, changed);
            }
            Value::Array(out)
        }
        ("=", [_, Value::String(field), Value::String(state)]) if field == "node_state" => {
            let revived_clause = only_certnames_clause(revived);
            match state.as_str() {
                "active" => {
                    *changed = true;
                    json!(["or", node, revived_clause])
                }
                "inactive" => {
                    *changed = true;
                    json!(["and", node, ["not", revived_clause]])
                }
                _ => node.clone(),
            }
        }
        _ => node.clone(),
    }
}

/// Adds `clause` as a conjunct of `query` (the clause alone when there is no query), the way
/// [`exclude_certnames`] does. Use it for any other criterion pdbmux pushes upstream.
pub fn add_clause(query: Option<&Value>, clause: Value) -> Value {
    match query {
        None => clause,
        Some(query) => add_criteria(query, clause),
    }
}

/// `query` with `["not",["=","name",<name>]]` added ([`add_clause`]): the facts of every name but
/// `name`. Use it to keep the backends' records named like the provenance fact out of an answer
/// pdbmux writes that fact into (docs/merging.md, "Provenance").
pub fn without_fact(query: Option<&Value>, name: &str) -> Value {
    add_clause(query, json!(["not", ["=", "name", name]]))
}

/// PuppetDB's own `add-criteria` (`http/query.clj`), minus its paging passthrough.
fn add_criteria(query: &Value, clause: Value) -> Value {
    let Some((op, items)) = form(query) else {
        return json!(["and", query, clause]);
    };
    match op {
        "extract" => {
            let mut items = items.to_vec();
            match items.get(2) {
                _ if items.len() < 2 => {}
                None => items.push(clause),
                Some(Value::Null) => items[2] = clause,
                Some(next) if form(next).is_some_and(|(op, _)| op == "group_by") => {
                    items.insert(2, clause);
                }
                Some(filter) => items[2] = json!(["and", filter, clause]),
            }
            Value::Array(items)
        }
        "from" => {
            let paged = items.iter().skip(2).any(|item| {
                form(item).is_some_and(|(op, _)| matches!(op, "limit" | "offset" | "order_by"))
            });
            let mut items = items.to_vec();
            match items.get(2) {
                _ if paged || items.len() < 2 => {}
                None => items.push(clause),
                Some(subquery) => items[2] = add_criteria(subquery, clause),
            }
            Value::Array(items)
        }
        _ => json!(["and", query, clause]),
    }
}

/// The distinct `columns` of a node-owned entity's records over every node state, less the nodes
/// `excluded` names: `["extract", columns, ["and", F, node_state any, clause], ["group_by",
/// columns…]]`. It asks a backend for a union entity's records (`/packages`) only as the nodes
/// it owns hold them (docs/merging.md, "`/packages`").
///
/// `None` unless `query` is absent or a filter over `columns` alone (`and`, `or`, `not` over
/// `=`, `<`, `<=`, `>`, `>=`, `~` and `null?` on them): any other shape, or a field the union
/// entity does not have, is sent to the union entity as it is, so that it is refused or
/// answered as PuppetDB would.
pub fn distinct_among_owned(
    query: Option<&Value>,
    columns: &[&str],
    excluded: &[&str],
) -> Option<Value> {
    if !is_filter_on(query, columns) {
        return None;
    }
    let every_state = json!(["=", "node_state", "any"]);
    let filter = match query {
        None => every_state,
        Some(query) => json!(["and", query, every_state]),
    };
    let filter = exclude_certnames(Some(&filter), excluded)?;
    let mut group_by = vec![json!("group_by")];
    group_by.extend(columns.iter().map(|c| json!(c)));
    Some(json!(["extract", columns, filter, group_by]))
}

/// The nodes a `/facts` query matches, one row per node: `["extract", ["certname",
/// "environment"], query, ["group_by", "certname", "environment"]]`. It asks a backend for what
/// the provenance fact's own path needs of it (each node and its facts' environment), rather
/// than every fact of every node (docs/merging.md, "Provenance").
pub fn fact_nodes(query: Option<&Value>) -> Value {
    let columns = json!(["certname", "environment"]);
    let group_by = json!(["group_by", "certname", "environment"]);
    match query {
        None => json!(["extract", columns, group_by]),
        Some(query) => json!(["extract", columns, query, group_by]),
    }
}

/// Whether `query` is absent or a filter on `columns` alone, the shape
/// [`distinct_among_owned`] rewrites: check it when planning, so that a query it leaves alone
/// does not wait for the membership map.
pub fn is_filter_on(query: Option<&Value>, columns: &[&str]) -> bool {
    query.is_none_or(|q| filters_only(q, columns))
}

/// Whether `node` is a boolean combination of comparisons on `columns` only.
fn filters_only(node: &Value, columns: &[&str]) -> bool {
    let Some((op, form)) = form(node) else {
        return false;
    };
    let args = &form[1..];
    match op {
        "and" | "or" => !args.is_empty() && args.iter().all(|a| filters_only(a, columns)),
        "not" => args.len() == 1 && filters_only(&args[0], columns),
        "=" | "<" | "<=" | ">" | ">=" | "~" | "null?" => {
            args.len() == 2
                && args[0]
                    .as_str()
                    .is_some_and(|field| columns.contains(&field))
        }
        _ => false,
    }
}

/// Rewrites every `["function","avg",col]` column of the outer extract into
/// `["function","sum",col]` and `["function","count",col]`, in place, so the backends' partial
/// answers can be folded into the true average (sum of sums / sum of counts). `group_by` is left
/// alone.
///
/// Returns `None` when the outer extract projects no `avg` (send the query as it is). Call
/// [`check_combinable`](super::check_combinable) first: it refuses the shapes this rewrite would
/// make ambiguous (`avg` beside `sum` or `count`, `avg` twice, `avg` without exactly one argument).
pub fn rewrite_avg(ast: &Value) -> Option<Value> {
    let pointer = outer_extract_pointer(ast)?;
    let mut rewritten = ast.clone();
    let columns = rewritten
        .pointer_mut(&pointer)?
        .as_array_mut()?
        .get_mut(1)?
        .as_array_mut()?;
    let mut found = false;
    let mut out = Vec::with_capacity(columns.len() + 1);
    for column in columns.drain(..) {
        match function_form(&column) {
            Some(function) if function.name == "avg" => {
                found = true;
                for name in ["sum", "count"] {
                    let mut call = vec![json!("function"), json!(name)];
                    call.extend(function.args.iter().cloned());
                    out.push(Value::Array(call));
                }
            }
            _ => out.push(column),
        }
    }
    *columns = out;
    found.then_some(rewritten)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exclude(query: Value) -> Value {
        exclude_certnames(Some(&query), &["a", "b"]).expect("query")
    }

    fn clause() -> Value {
        json!(["not", ["in", "certname", ["array", ["a", "b"]]]])
    }

    #[test]
    fn node_state_is_widened_for_nodes_that_moved_away() {
        let revived = ["moved"];
        let q = json!([
            "extract",
            ["hash"],
            [
                "and",
                ["=", "node_state", "active"],
                ["=", "status", "failed"]
            ]
        ]);
        assert_eq!(
            widen_node_state(&q, &revived),
            Some(json!([
                "extract",
                ["hash"],
                [
                    "and",
                    [
                        "or",
                        ["=", "node_state", "active"],
                        ["in", "certname", ["array", ["moved"]]]
                    ],
                    ["=", "status", "failed"]
                ]
            ]))
        );
        assert_eq!(
            widen_node_state(&json!(["=", "node_state", "inactive"]), &revived),
            Some(json!([
                "and",
                ["=", "node_state", "inactive"],
                ["not", ["in", "certname", ["array", ["moved"]]]]
            ]))
        );
        assert_eq!(
            widen_node_state(&json!(["=", "node_state", "any"]), &revived),
            None
        );
        assert_eq!(
            widen_node_state(&json!(["=", "node_state", "active"]), &[]),
            None
        );
        // A subquery's node_state is the nodes entity's own: left alone.
        let sub = json!([
            "in",
            "certname",
            [
                "extract",
                "certname",
                ["select_nodes", ["=", "node_state", "active"]]
            ]
        ]);
        assert_eq!(widen_node_state(&sub, &revived), None);
    }

    #[test]
    fn clause_shape() {
        assert_eq!(
            ownership_clause(&["x"]),
            json!(["not", ["in", "certname", ["array", ["x"]]]])
        );
    }

    #[test]
    fn no_certnames_leaves_the_query_alone() {
        assert_eq!(exclude_certnames(None, &[]), None);
        let query = json!(["=", "certname", "a"]);
        assert_eq!(exclude_certnames(Some(&query), &[]), Some(query));
    }

    #[test]
    fn no_query_becomes_the_clause() {
        assert_eq!(exclude_certnames(None, &["a", "b"]), Some(clause()));
    }

    #[test]
    fn a_filter_is_conjoined() {
        assert_eq!(
            exclude(json!(["and", ["=", "catalog_environment", "production"]])),
            json!([
                "and",
                ["and", ["=", "catalog_environment", "production"]],
                clause()
            ])
        );
        assert_eq!(
            exclude(json!([
                "in",
                "certname",
                ["from", "resources", ["extract", "certname"]]
            ])),
            json!([
                "and",
                [
                    "in",
                    "certname",
                    ["from", "resources", ["extract", "certname"]]
                ],
                clause()
            ])
        );
    }

    #[test]
    fn extract_without_filter_gains_one() {
        assert_eq!(
            exclude(json!(["extract", [["function", "count"]]])),
            json!(["extract", [["function", "count"]], clause()])
        );
        assert_eq!(
            exclude(json!(["extract", "certname", null])),
            json!(["extract", "certname", clause()])
        );
    }

    #[test]
    fn extract_filter_is_conjoined() {
        assert_eq!(
            exclude(json!([
                "extract",
                [["function", "count"]],
                ["=", "environment", "production"]
            ])),
            json!([
                "extract",
                [["function", "count"]],
                ["and", ["=", "environment", "production"], clause()]
            ])
        );
    }

    #[test]
    fn extract_group_by_stays_last() {
        assert_eq!(
            exclude(json!([
                "extract",
                [["function", "count"], "status"],
                ["=", "certname", "c"],
                ["group_by", "status"]
            ])),
            json!([
                "extract",
                [["function", "count"], "status"],
                ["and", ["=", "certname", "c"], clause()],
                ["group_by", "status"]
            ])
        );
        assert_eq!(
            exclude(json!([
                "extract",
                [["function", "count"], "status"],
                ["group_by", "status"]
            ])),
            json!([
                "extract",
                [["function", "count"], "status"],
                clause(),
                ["group_by", "status"]
            ])
        );
    }

    #[test]
    fn top_level_from_is_looked_through() {
        assert_eq!(
            exclude(json!(["from", "nodes"])),
            json!(["from", "nodes", clause()])
        );
        assert_eq!(
            exclude(json!([
                "from",
                "nodes",
                ["extract", "certname", ["=", "a", 1]]
            ])),
            json!([
                "from",
                "nodes",
                ["extract", "certname", ["and", ["=", "a", 1], clause()]]
            ])
        );
    }

    #[test]
    fn in_query_paging_and_bare_extract_are_untouched() {
        for query in [
            json!(["from", "nodes", ["=", "certname", "a"], ["limit", 1]]),
            json!(["from", "nodes", ["order_by", ["certname"]]]),
            json!(["extract"]),
        ] {
            assert_eq!(exclude(query.clone()), query);
        }
    }

    const PACKAGE: [&str; 3] = ["package_name", "version", "provider"];

    #[test]
    fn distinct_packages_of_the_owned_nodes() {
        let group_by = json!(["group_by", "package_name", "version", "provider"]);
        let every_state = json!(["=", "node_state", "any"]);
        assert_eq!(
            distinct_among_owned(None, &PACKAGE, &["a", "b"]),
            Some(json!([
                "extract",
                PACKAGE,
                ["and", every_state, clause()],
                group_by
            ]))
        );
        let filter = json!([
            "and",
            ["=", "package_name", "nginx"],
            ["~", "version", "^1"]
        ]);
        assert_eq!(
            distinct_among_owned(Some(&filter), &PACKAGE, &["a", "b"]),
            Some(json!([
                "extract",
                PACKAGE,
                ["and", ["and", filter, every_state], clause()],
                group_by
            ]))
        );
        assert_eq!(
            distinct_among_owned(None, &PACKAGE, &[]),
            Some(json!(["extract", PACKAGE, every_state, group_by]))
        );
    }

    #[test]
    fn distinct_packages_leave_other_shapes_to_the_union_entity() {
        for query in [
            json!(["=", "certname", "a"]),
            json!(["extract", ["package_name"], ["=", "provider", "apt"]]),
            json!(["not", ["=", "environment", "production"]]),
            json!(["in", "package_name", ["array", ["nginx"]]]),
            json!(["and"]),
            json!("package_name"),
        ] {
            assert_eq!(
                distinct_among_owned(Some(&query), &PACKAGE, &["a"]),
                None,
                "{query}"
            );
        }
    }

    #[test]
    fn avg_becomes_sum_and_count_in_place() {
        let ast = json!([
            "extract",
            [
                "environment",
                ["function", "avg", "value"],
                ["function", "max", "value"]
            ],
            ["=", "name", "uptime_seconds"],
            ["group_by", "environment"]
        ]);
        assert_eq!(
            rewrite_avg(&ast),
            Some(json!([
                "extract",
                [
                    "environment",
                    ["function", "sum", "value"],
                    ["function", "count", "value"],
                    ["function", "max", "value"]
                ],
                ["=", "name", "uptime_seconds"],
                ["group_by", "environment"]
            ]))
        );
    }

    #[test]
    fn avg_inside_top_level_from() {
        let ast = json!(["from", "facts", ["extract", [["function", "avg", "value"]]]]);
        assert_eq!(
            rewrite_avg(&ast),
            Some(json!([
                "from",
                "facts",
                [
                    "extract",
                    [["function", "sum", "value"], ["function", "count", "value"]]
                ]
            ]))
        );
    }

    #[test]
    fn no_avg_no_rewrite() {
        for ast in [
            json!(["extract", [["function", "count"]], ["=", "a", 1]]),
            json!(["extract", "avg"]),
            json!(["=", "certname", "a"]),
            json!([
                "in",
                "certname",
                [
                    "extract",
                    [["function", "avg", "value"]],
                    ["select_facts", ["=", "a", 1]]
                ]
            ]),
            json!([
                "extract",
                [["function", "count"]],
                ["group_by", ["function", "avg", "value"]]
            ]),
        ] {
            assert_eq!(rewrite_avg(&ast), None, "{ast}");
        }
    }
}
