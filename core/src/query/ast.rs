//! Reading a PuppetDB AST: the provenance gates, the response-shaping extract, `latest_report?`
//! and in-query paging.
//!
//! Terms used below. A *subquery* is the value of an `in`, a `["subquery", ...]`, a
//! `["select_<entity>", ...]`, or a `from` that is not the top-level form: it narrows which
//! records match, never what the response looks like. The *outer* query is everything reachable
//! from the top through `and`, `or`, `not`, the top-level `from` and an outer `extract`'s filter.

use serde_json::Value;

/// The field whose use makes a report or event query node-scoped (D4).
const LATEST_REPORT: &str = "latest_report?";

/// The row functions: one value per record, so they group like plain columns.
pub(crate) const ROW_FUNCTIONS: [&str; 2] = ["to_string", "jsonb_typeof"];

/// Forms whose second element is not a field name.
const STRUCTURAL: [&str; 12] = [
    "and", "or", "not", "extract", "from", "subquery", "group_by", "function", "array", "limit",
    "offset", "order_by",
];

/// In-query paging clauses, valid in a top-level `from`.
const PAGING: [&str; 3] = ["limit", "offset", "order_by"];

/// One `["function", name, args...]` column (or group_by entry).
#[derive(Debug, Clone, PartialEq)]
pub struct FunctionColumn {
    /// The function name (`count`, `avg`, ...); a non-string name is kept as its JSON text.
    pub name: String,
    /// The arguments after the name, as written (`[]` for `count()`).
    pub args: Vec<Value>,
}

impl FunctionColumn {
    /// Whether this is a row function (`to_string`, `jsonb_typeof`), which groups like a plain
    /// column instead of aggregating.
    pub fn is_row_function(&self) -> bool {
        ROW_FUNCTIONS.contains(&self.name.as_str())
    }
}

/// One entry of a `["group_by", ...]` clause.
#[derive(Debug, Clone, PartialEq)]
pub enum GroupByItem {
    /// A plain field.
    Field(String),
    /// A function form, e.g. `["function","to_string","receive_time","FMDay"]`.
    Function(FunctionColumn),
}

/// What pdbmux needs to know about one AST query, from [`analyze`].
///
/// Use it to decide injection (the provenance gates), whether a query takes the combining branch
/// ([`Analysis::has_function_column`]), whether ownership must be pushed into a report or event
/// query ([`Analysis::uses_latest_report`]), and whether in-query paging is present.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Analysis {
    /// An `extract` outside every subquery: at the top, or under `and`/`or`/`not`/`from`. Such a
    /// query projects (or aggregates) the response, so no provenance record is injected.
    pub extract_outside_subquery: bool,
    /// The outer extract's plain fields, in order (repeats kept).
    pub plain_columns: Vec<String>,
    /// The outer extract's `["function", ...]` columns, in order.
    pub function_columns: Vec<FunctionColumn>,
    /// The outer extract's `group_by` entries, in order.
    pub group_by: Vec<GroupByItem>,
    /// An operator on the field `name` in the outer query (the /facts "constrains name" gate).
    pub outer_name_constraint: bool,
    /// `latest_report?` is filtered on anywhere, subqueries included (node-scoped, D4).
    pub uses_latest_report: bool,
    /// A top-level `from` carries `limit`, `offset` or `order_by` clauses.
    pub in_query_paging: bool,
    /// The certnames the outer query is pinned to: `["=","certname",c]` or
    /// `["in","certname",["array",[...]]]` as the query or one of the conjuncts of its outer
    /// `and` (several pins intersect). Sorted and deduped; `None` when the query is not pinned.
    pub pinned_certnames: Option<Vec<String>>,
    /// The query names `node_state` anywhere (`names_node_state`): PuppetDB then drops the
    /// `node_state = active` it otherwise adds for history, and the query sees every node state.
    pub names_node_state: bool,
}

impl Analysis {
    /// Whether the outer extract has any function column: the query takes the combining branch.
    pub fn has_function_column(&self) -> bool {
        !self.function_columns.is_empty()
    }

    /// Whether the outer extract aggregates: a function column other than the row functions
    /// `to_string` and `jsonb_typeof`. Without one, every backend's rows are kept as they came.
    pub fn is_aggregate(&self) -> bool {
        self.function_columns.iter().any(|f| !f.is_row_function())
    }

    /// The response columns that form a combined row's grouping key: the plain fields (each once)
    /// and the row-function columns, in projection order. Use it to key rows when folding.
    pub fn key_columns(&self) -> Vec<&str> {
        let mut keys: Vec<&str> = Vec::new();
        let row_functions = self
            .function_columns
            .iter()
            .filter(|f| f.is_row_function())
            .map(|f| f.name.as_str());
        for key in self
            .plain_columns
            .iter()
            .map(String::as_str)
            .chain(row_functions)
        {
            if !keys.contains(&key) {
                keys.push(key);
            }
        }
        keys
    }
}

/// Analyses an AST query (the [`QueryText::Ast`](super::QueryText::Ast) value). Call it once per
/// request; it never fails, and a shape it does not understand reads as "nothing found".
pub fn analyze(ast: &Value) -> Analysis {
    let mut analysis = Analysis {
        outer_name_constraint: outer_name_constraint(ast),
        uses_latest_report: mentions_latest_report(ast),
        in_query_paging: in_query_paging(ast),
        pinned_certnames: pinned_certnames(ast),
        names_node_state: names_node_state(ast),
        ..Analysis::default()
    };
    if let Some(extract) = outer_extract(ast) {
        analysis.extract_outside_subquery = true;
        read_extract(extract, &mut analysis);
    }
    analysis
}

/// The operator and elements of a form like `["op", ...]`.
pub(crate) fn form(node: &Value) -> Option<(&str, &[Value])> {
    let items = node.as_array()?;
    let op = items.first()?.as_str()?;
    Some((op, items))
}

fn is_form(node: &Value, op: &str) -> bool {
    form(node).is_some_and(|(found, _)| found == op)
}

fn is_paging(node: &Value) -> bool {
    form(node).is_some_and(|(op, _)| PAGING.contains(&op))
}

/// A `["function", name, args...]` form.
pub(crate) fn function_form(node: &Value) -> Option<FunctionColumn> {
    let (op, items) = form(node)?;
    if op != "function" {
        return None;
    }
    let name = match items.get(1) {
        Some(Value::String(name)) => name.clone(),
        Some(other) => other.to_string(),
        None => String::new(),
    };
    Some(FunctionColumn {
        name,
        args: items.iter().skip(2).cloned().collect(),
    })
}

/// The JSON pointer of the first extract outside every subquery, pre-order.
pub(crate) fn outer_extract_pointer(ast: &Value) -> Option<String> {
    let mut path = Vec::new();
    if !find_outer_extract(ast, &mut path) {
        return None;
    }
    Some(path.iter().map(|index| format!("/{index}")).collect())
}

fn outer_extract(ast: &Value) -> Option<&Value> {
    ast.pointer(&outer_extract_pointer(ast)?)
}

fn find_outer_extract(node: &Value, path: &mut Vec<usize>) -> bool {
    let Some((op, items)) = form(node) else {
        return false;
    };
    let first_child = match op {
        "extract" => return true,
        "and" | "or" | "not" => 1,
        "from" => 2,
        _ => return false,
    };
    for (index, child) in items.iter().enumerate().skip(first_child) {
        path.push(index);
        if find_outer_extract(child, path) {
            return true;
        }
        path.pop();
    }
    false
}

/// The filter of `["extract", cols, filter?, group_by?]`, if it has one.
fn extract_filter(items: &[Value]) -> Option<&Value> {
    items
        .get(2)
        .filter(|filter| !filter.is_null() && !is_form(filter, "group_by"))
}

fn read_extract(extract: &Value, analysis: &mut Analysis) {
    let Some((_, items)) = form(extract) else {
        return;
    };
    match items.get(1) {
        Some(Value::String(field)) => analysis.plain_columns.push(field.clone()),
        Some(Value::Array(columns)) => {
            for column in columns {
                if let Value::String(field) = column {
                    analysis.plain_columns.push(field.clone());
                } else if let Some(function) = function_form(column) {
                    analysis.function_columns.push(function);
                }
            }
        }
        _ => {}
    }
    let group_by = items
        .iter()
        .skip(2)
        .take(2)
        .find_map(|clause| match form(clause) {
            Some(("group_by", entries)) => Some(entries),
            _ => None,
        });
    for entry in group_by.unwrap_or_default().iter().skip(1) {
        match entry {
            Value::String(field) => analysis.group_by.push(GroupByItem::Field(field.clone())),
            other => {
                if let Some(function) = function_form(other) {
                    analysis.group_by.push(GroupByItem::Function(function));
                }
            }
        }
    }
}

/// The outer query constrains `name`: the top-level `from` and an outer extract are looked
/// through to their filter.
fn outer_name_constraint(ast: &Value) -> bool {
    match form(ast) {
        Some(("from", items)) => items
            .get(2)
            .is_some_and(|query| !is_paging(query) && outer_name_constraint(query)),
        _ => constrains_name(ast),
    }
}

/// An operator on `name` here or under `and`/`or`/`not`, never inside a subquery.
fn constrains_name(node: &Value) -> bool {
    let Some((op, items)) = form(node) else {
        return false;
    };
    match op {
        "and" | "or" | "not" => items.iter().skip(1).any(constrains_name),
        // Reached only outside subqueries, so this extract shapes the response.
        "extract" => extract_filter(items).is_some_and(constrains_name),
        // The field of an `in` belongs to the outer query; its value is a subquery or array.
        "in" => names_field(items.get(1), "name"),
        _ if STRUCTURAL.contains(&op) || op.starts_with("select_") => false,
        _ => items.get(1).and_then(Value::as_str) == Some("name"),
    }
}

/// Whether an `in` field (a name or an array of names) includes `wanted`.
fn names_field(field: Option<&Value>, wanted: &str) -> bool {
    match field {
        Some(Value::String(name)) => name == wanted,
        Some(Value::Array(names)) => names.iter().any(|name| name.as_str() == Some(wanted)),
        _ => false,
    }
}

/// A predicate on `latest_report?` anywhere in the tree, subqueries included.
fn mentions_latest_report(node: &Value) -> bool {
    let Value::Array(items) = node else {
        return false;
    };
    if let Some((op, _)) = form(node) {
        let found = match op {
            "in" => names_field(items.get(1), LATEST_REPORT),
            _ if STRUCTURAL.contains(&op) || op.starts_with("select_") => false,
            _ => items.get(1).and_then(Value::as_str) == Some(LATEST_REPORT),
        };
        if found {
            return true;
        }
    }
    items.iter().any(mentions_latest_report)
}

/// Whether `node` holds the string `node_state` anywhere, subqueries and values included. A
/// value spelled so is vanishingly rare, and reading it as the field only widens the query's
/// scope to every node state, which is what naming the field does.
pub(crate) fn names_node_state(node: &Value) -> bool {
    match node {
        Value::String(text) => text == "node_state",
        Value::Array(items) => items.iter().any(names_node_state),
        Value::Object(fields) => fields.values().any(names_node_state),
        _ => false,
    }
}

/// The filter the outer query applies: the query itself, or what a top-level `from` and an
/// outer extract filter by; `None` when there is none (a bare extract, paging alone).
pub(crate) fn outer_filter(ast: &Value) -> Option<&Value> {
    match form(ast) {
        Some(("from", items)) => items
            .get(2)
            .filter(|q| !is_paging(q))
            .and_then(outer_filter),
        Some(("extract", items)) => extract_filter(items),
        _ => Some(ast),
    }
}

fn pinned_certnames(ast: &Value) -> Option<Vec<String>> {
    let mut pins: Option<Vec<String>> = None;
    let filter = outer_filter(ast)?;
    let conjuncts: Vec<&Value> = match form(filter) {
        Some(("and", items)) => items.iter().skip(1).collect(),
        _ => vec![filter],
    };
    for conjunct in conjuncts {
        let Some(mut found) = certname_pin(conjunct) else {
            continue;
        };
        found.sort_unstable();
        found.dedup();
        pins = Some(match pins {
            None => found,
            Some(previous) => previous.into_iter().filter(|c| found.contains(c)).collect(),
        });
    }
    pins
}

/// The certnames one conjunct pins: `["=","certname","c"]` or an `in` over an `array`.
fn certname_pin(node: &Value) -> Option<Vec<String>> {
    let (op, items) = form(node)?;
    if items.get(1).and_then(Value::as_str) != Some("certname") || items.len() != 3 {
        return None;
    }
    match op {
        "=" => Some(vec![items[2].as_str()?.to_owned()]),
        "in" => match form(&items[2])? {
            ("array", array) if array.len() == 2 => array[1]
                .as_array()?
                .iter()
                .map(|c| c.as_str().map(str::to_owned))
                .collect(),
            _ => None,
        },
        _ => None,
    }
}

fn in_query_paging(ast: &Value) -> bool {
    match form(ast) {
        Some(("from", items)) => items.iter().skip(2).any(is_paging),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn node_state_is_named_as_a_field_anywhere_but_not_inside_other_strings() {
        let named = [
            json!(["=", "node_state", "any"]),
            json!([
                "and",
                ["=", "status", "failed"],
                ["=", "node_state", "inactive"]
            ]),
            json!([
                "in",
                "certname",
                [
                    "extract",
                    ["certname"],
                    ["from", "nodes", ["=", "node_state", "any"]]
                ]
            ]),
            json!(["extract", ["certname", "node_state"]]),
        ];
        for ast in named {
            assert!(analyze(&ast).names_node_state, "{ast}");
        }
        let unnamed = [
            json!(["=", "certname", "node_state_x"]),
            json!(["~", "certname", "node_state.*"]),
            json!(["=", "status", "failed"]),
        ];
        for ast in unnamed {
            assert!(!analyze(&ast).names_node_state, "{ast}");
        }
    }

    #[test]
    fn daily_chart_columns() {
        let ast = json!([
            "extract",
            [["function", "count"], "status"],
            [
                "and",
                [">=", "producer_timestamp", "2026-11-23T00:00:00.000000Z"]
            ],
            ["group_by", "status"]
        ]);
        assert_eq!(
            analyze(&ast),
            Analysis {
                extract_outside_subquery: true,
                plain_columns: vec!["status".into()],
                function_columns: vec![FunctionColumn {
                    name: "count".into(),
                    args: vec![]
                }],
                group_by: vec![GroupByItem::Field("status".into())],
                ..Analysis::default()
            }
        );
    }

    #[test]
    fn columns_of_the_outer_extract_only() {
        let ast = json!([
            "extract",
            [
                ["function", "avg", "value"],
                "environment",
                ["function", "to_string", "producer_timestamp", "YYYY"],
                "environment"
            ],
            [
                "in",
                "certname",
                [
                    "extract",
                    [["function", "count"]],
                    ["select_nodes", ["=", "certname", "a"]]
                ]
            ],
            [
                "group_by",
                "environment",
                ["function", "to_string", "producer_timestamp", "YYYY"]
            ]
        ]);
        let analysis = analyze(&ast);
        assert_eq!(analysis.plain_columns, ["environment", "environment"]);
        assert_eq!(
            analysis.function_columns,
            [
                FunctionColumn {
                    name: "avg".into(),
                    args: vec![json!("value")]
                },
                FunctionColumn {
                    name: "to_string".into(),
                    args: vec![json!("producer_timestamp"), json!("YYYY")]
                },
            ]
        );
        assert_eq!(
            analysis.group_by,
            [
                GroupByItem::Field("environment".into()),
                GroupByItem::Function(FunctionColumn {
                    name: "to_string".into(),
                    args: vec![json!("producer_timestamp"), json!("YYYY")]
                }),
            ]
        );
        assert!(analysis.has_function_column());
        assert!(analysis.is_aggregate());
        assert_eq!(analysis.key_columns(), ["environment", "to_string"]);
    }

    #[test]
    fn single_string_column() {
        let analysis = analyze(&json!(["extract", "certname", ["=", "certname", "a"]]));
        assert_eq!(analysis.plain_columns, ["certname"]);
        assert!(analysis.function_columns.is_empty());
        assert!(!analysis.has_function_column());
    }

    #[test]
    fn unwrapped_function_is_two_plain_columns_as_in_puppetdb() {
        // PuppetDB's vector-maybe reads ["function","count"] as the column list itself.
        let analysis = analyze(&json!(["extract", ["function", "count"]]));
        assert_eq!(analysis.plain_columns, ["function", "count"]);
        assert!(!analysis.has_function_column());
    }

    #[test]
    fn row_functions_are_not_aggregates() {
        let analysis = analyze(&json!([
            "extract",
            [["function", "jsonb_typeof", "value"], "name"]
        ]));
        assert!(analysis.has_function_column());
        assert!(!analysis.is_aggregate());
        assert_eq!(analysis.key_columns(), ["name", "jsonb_typeof"]);
    }

    #[test]
    fn malformed_function_names_are_kept() {
        let analysis = analyze(&json!(["extract", [["function"], ["function", 3, "x"]]]));
        assert_eq!(
            analysis.function_columns,
            [
                FunctionColumn {
                    name: String::new(),
                    args: vec![]
                },
                FunctionColumn {
                    name: "3".into(),
                    args: vec![json!("x")]
                },
            ]
        );
    }

    #[test]
    fn certname_pins_of_the_outer_query() {
        let pins = |ast: Value| analyze(&ast).pinned_certnames;
        assert_eq!(pins(json!(["=", "certname", "a"])), Some(vec!["a".into()]));
        assert_eq!(
            pins(json!([
                "and",
                ["=", "certname", "b"],
                ["=", "environment", "x"]
            ])),
            Some(vec!["b".into()])
        );
        assert_eq!(
            pins(json!(["in", "certname", ["array", ["c", "a", "c"]]])),
            Some(vec!["a".into(), "c".into()])
        );
        assert_eq!(
            pins(json!([
                "and",
                ["in", "certname", ["array", ["a", "b"]]],
                ["=", "certname", "b"]
            ])),
            Some(vec!["b".into()])
        );
        assert_eq!(
            pins(json!(["extract", ["name"], ["=", "certname", "a"]])),
            Some(vec!["a".into()])
        );
        assert_eq!(
            pins(json!([
                "from",
                "facts",
                ["=", "certname", "a"],
                ["limit", 1]
            ])),
            Some(vec!["a".into()])
        );
        for unpinned in [
            json!(["or", ["=", "certname", "a"], ["=", "certname", "b"]]),
            json!(["not", ["=", "certname", "a"]]),
            json!(["~", "certname", "a"]),
            json!(["in", "certname", ["extract", "certname", ["select_nodes"]]]),
            json!(["=", "certname", 1]),
            json!(["=", "name", "certname"]),
        ] {
            assert_eq!(pins(unpinned.clone()), None, "{unpinned}");
        }
    }

    #[test]
    fn outer_extract_pointer_paths() {
        assert_eq!(
            outer_extract_pointer(&json!(["extract", "a"])).as_deref(),
            Some("")
        );
        assert_eq!(
            outer_extract_pointer(&json!(["from", "nodes", ["extract", "a"]])).as_deref(),
            Some("/2")
        );
        assert_eq!(
            outer_extract_pointer(&json!(["and", ["=", "a", 1], ["not", ["extract", "a"]]]))
                .as_deref(),
            Some("/2/1")
        );
        assert_eq!(
            outer_extract_pointer(&json!(["in", "a", ["extract", "a"]])),
            None
        );
    }
}
