//! The differential suite: pdbmux over the two backends answers exactly what the third
//! PuppetDB, which was sent every command (`E2E_UNION`), answers to the same question.
//!
//! Every v4 entity pdbmux merges, asked plainly, with filters, pinned to each hard-case node
//! (held by both with either side newer, a report timestamp tie, the same report in both with
//! the fresher facts on the second, a node that moved, deactivated nodes), over every node state,
//! projected with and without `certname`, aggregated, and paged across the overlap with
//! `include_total`. Compared: the status, the records (as multisets, or in order when the
//! request orders by a unique key), and `X-Records`; less each server's own receipt times
//! (`timestamp` of factsets and inventory, `facts_timestamp`, `catalog_timestamp`,
//! `receive_time`, `report_receive_time`) and pdbmux's documented additions (`pdbmux_source`).
//! Every mismatch of a test is listed before it fails.
//!
//! One node is left out of every comparison: `both-tie`, whose two backends hold different
//! reports with the same end time. A single PuppetDB's answer for it depends on the order the
//! commands arrived in (the first of the two reports stays its latest, the last facts win), so
//! no merge can be checked against it; its rule (the fresher facts' backend owns it whole) is
//! checked in `merges.rs`. Every question on an entity with certnames gets
//! `["not",["=","certname",<it>]]` added, for pdbmux and the union alike.

mod common;

use common::{env, pdbmux};
use pdbmux_e2e::differential::{mismatches, Compare, Question};
use pdbmux_e2e::Backend;
use serde_json::{json, Value};

fn union() -> Option<&'static Backend> {
    let union = env().union.as_ref();
    if union.is_none() {
        eprintln!("no E2E_UNION: the differential suite is skipped");
    }
    union
}

/// The node whose single-PuppetDB answer depends on arrival order (see the module doc).
fn order_dependent() -> &'static str {
    common::node_of("both-report-timestamp-tie")
}

/// Entities whose records (or queries) have no certname, so they keep their question as is.
fn has_certname(path: &str) -> bool {
    ![
        "/fact-names",
        "/fact-paths",
        "/environments",
        "/producers",
        "/packages",
    ]
    .iter()
    .any(|p| path.ends_with(p))
}

/// `query` with the order-dependent node left out: into an outer extract's filter, or as a
/// conjunct.
fn without_order_dependent(query: Option<&str>) -> String {
    let clause = json!(["not", ["=", "certname", order_dependent()]]);
    let Some(query) = query.and_then(|q| serde_json::from_str::<Value>(q).ok()) else {
        return clause.to_string();
    };
    let with = match query.get(0).and_then(Value::as_str) {
        Some("extract") => {
            let mut items = query.as_array().cloned().unwrap_or_default();
            match items.get(2) {
                Some(filter) if filter.get(0) != Some(&json!("group_by")) => {
                    items[2] = json!(["and", filter, clause]);
                }
                _ => items.insert(2.min(items.len()), clause),
            }
            Value::Array(items)
        }
        _ => json!(["and", query, clause]),
    };
    with.to_string()
}

/// A question on `path`; on an entity with certnames, the order-dependent node left out.
fn question(path: &str, params: &[(&str, String)]) -> Question {
    let mut question = Question::new(path, params);
    if has_certname(path) && !path.contains("/facts/") {
        let query = question.params.iter().position(|(k, _)| k == "query");
        let text = without_order_dependent(query.map(|at| question.params[at].1.as_str()));
        match query {
            Some(at) => question.params[at].1 = text,
            None => question.params.insert(0, ("query".to_owned(), text)),
        }
    }
    question
}

fn check(label: &str, questions: &[Question]) {
    let Some(union) = union() else {
        return;
    };
    let p = pdbmux(label);
    let problems = mismatches(&p, union, questions).expect("pdbmux and the union answer");
    assert!(
        problems.is_empty(),
        "{} of {} questions differ from the union's answers:\n  {}",
        problems.len(),
        questions.len(),
        problems.join("\n  ")
    );
}

/// The hard-case nodes: one per scenario that makes ownership matter.
fn hard_cases() -> Vec<&'static str> {
    [
        "both-first-newer",
        "both-second-newer",
        "both-same-report",
        "both-same-report-fresher-facts-second",
        "both-first-facts-only",
        "moved-first-deactivated-second-active",
        "first-only-deactivated",
        "second-only",
    ]
    .into_iter()
    .map(common::node_of)
    .collect()
}

fn q(value: Value) -> String {
    value.to_string()
}

/// The questions every node-owned entity is asked: all of it, every node state, pinned to each
/// hard case (alone and with the others), filtered by environment.
fn node_owned_questions(path: &str, environment_field: &str) -> Vec<Question> {
    let mut questions = vec![
        question(path, &[]),
        question(path, &[("query", q(json!(["=", "node_state", "any"])))]),
        question(
            path,
            &[("query", q(json!(["=", environment_field, "production"])))],
        ),
        question(
            path,
            &[("query", q(json!(["=", environment_field, "staging"])))],
        ),
    ];
    let cases = hard_cases();
    for certname in &cases {
        questions.push(question(
            path,
            &[("query", q(json!(["=", "certname", certname])))],
        ));
        questions.push(question(
            path,
            &[(
                "query",
                q(json!([
                    "and",
                    ["=", "certname", certname],
                    ["=", "node_state", "any"]
                ])),
            )],
        ));
    }
    questions.push(question(
        path,
        &[("query", q(json!(["in", "certname", ["array", cases]])))],
    ));
    questions
}

/// Paged questions over a key unique to each record: every window of `limit` records across
/// the whole set, with include_total, plus the first page of each `order`.
fn paged_questions(
    path: &str,
    orders: &[Value],
    query: Option<Value>,
    limit: usize,
) -> Vec<Question> {
    let Some(union) = union() else {
        return Vec::new();
    };
    let mut base: Vec<(&str, String)> = Vec::new();
    if let Some(query) = &query {
        base.push(("query", query.to_string()));
    }
    let mut total_params = base.clone();
    total_params.push(("include_total", "true".to_owned()));
    let total = common::x_records(&common::direct(
        union,
        path,
        &total_params
            .iter()
            .map(|(k, v)| (*k, v.as_str()))
            .collect::<Vec<_>>(),
    ))
    .unwrap_or(0) as usize;
    let mut questions = Vec::new();
    for (index, order) in orders.iter().enumerate() {
        let offsets: Vec<usize> = if index == 0 {
            (0..=total).step_by(limit.max(1)).collect()
        } else {
            vec![0]
        };
        for offset in offsets {
            let mut params = base.clone();
            params.push(("order_by", order.to_string()));
            params.push(("limit", limit.to_string()));
            params.push(("offset", offset.to_string()));
            params.push(("include_total", "true".to_owned()));
            questions.push(question(path, &params));
        }
    }
    questions
}

fn asc(fields: &[&str]) -> Value {
    Value::Array(fields.iter().map(|f| json!({ "field": f })).collect())
}

#[test]
fn nodes_equal_the_union() {
    let mut questions = node_owned_questions("/pdb/query/v4/nodes", "catalog_environment");
    questions.push(question(
        "/pdb/query/v4/nodes",
        &[(
            "query",
            q(json!([
                "extract",
                ["certname", "latest_report_hash", "report_environment"]
            ])),
        )],
    ));
    questions.extend(paged_questions(
        "/pdb/query/v4/nodes",
        &[
            asc(&["certname"]),
            json!([{"field": "report_timestamp", "order": "desc"}, {"field": "certname"}]),
        ],
        None,
        3,
    ));
    questions.extend(paged_questions(
        "/pdb/query/v4/nodes",
        &[asc(&["certname"])],
        Some(json!(["=", "node_state", "any"])),
        4,
    ));
    check("union-nodes", &questions);
}

#[test]
fn facts_equal_the_union() {
    let mut questions = node_owned_questions("/pdb/query/v4/facts", "environment");
    questions.extend([
        question(
            "/pdb/query/v4/facts",
            &[("query", q(json!(["=", "name", "kernel"])))],
        ),
        question("/pdb/query/v4/facts/e2e_loaded_into", &[]),
        question("/pdb/query/v4/facts/e2e_loaded_into/pdb-a", &[]),
        question(
            "/pdb/query/v4/facts/e2e_weight",
            &[("query", q(json!(["=", "node_state", "any"])))],
        ),
        // A projection without certname: ownership is pushed down.
        question(
            "/pdb/query/v4/facts",
            &[(
                "query",
                q(json!([
                    "extract",
                    ["name", "value"],
                    ["=", "name", "e2e_loaded_into"]
                ])),
            )],
        ),
    ]);
    let small = json!([
        "in",
        "name",
        ["array", ["kernel", "e2e_loaded_into", "e2e_weight"]]
    ]);
    questions.extend(paged_questions(
        "/pdb/query/v4/facts",
        &[
            asc(&["certname", "name"]),
            json!([{"field": "name"}, {"field": "certname", "order": "desc"}]),
        ],
        Some(small),
        5,
    ));
    check("union-facts", &questions);
}

#[test]
fn node_owned_entities_equal_the_union() {
    let mut questions = Vec::new();
    for (path, environment) in [
        ("/pdb/query/v4/factsets", "environment"),
        ("/pdb/query/v4/catalogs", "environment"),
        ("/pdb/query/v4/inventory", "environment"),
        ("/pdb/query/v4/resources", "environment"),
        ("/pdb/query/v4/edges", "certname"),
        ("/pdb/query/v4/fact-contents", "environment"),
        ("/pdb/query/v4/package-inventory", "certname"),
    ] {
        questions.extend(node_owned_questions(path, environment));
    }
    questions.extend([
        question(
            "/pdb/query/v4/resources",
            &[("query", q(json!(["=", "type", "File"])))],
        ),
        question("/pdb/query/v4/resources/Service", &[]),
        question(
            "/pdb/query/v4/resources",
            &[("query", q(json!(["=", "exported", true])))],
        ),
        question(
            "/pdb/query/v4/fact-contents",
            &[("query", q(json!(["=", "path", ["os", "release", "full"]])))],
        ),
        question(
            "/pdb/query/v4/inventory",
            &[("query", q(json!(["=", "facts.e2e_loaded_into", "pdb-b"])))],
        ),
        question(
            "/pdb/query/v4/resources",
            &[(
                "query",
                q(json!([
                    "extract",
                    ["type", "title"],
                    ["=", "type", "Sshkey"]
                ])),
            )],
        ),
    ]);
    questions.extend(paged_questions(
        "/pdb/query/v4/catalogs",
        &[asc(&["certname"])],
        None,
        4,
    ));
    questions.extend(paged_questions(
        "/pdb/query/v4/factsets",
        &[asc(&["certname"])],
        None,
        4,
    ));
    questions.extend(paged_questions(
        "/pdb/query/v4/inventory",
        &[asc(&["certname"])],
        None,
        5,
    ));
    questions.extend(paged_questions(
        "/pdb/query/v4/resources",
        &[asc(&["certname", "resource"])],
        Some(json!(["=", "type", "File"])),
        7,
    ));
    questions.extend(paged_questions(
        "/pdb/query/v4/edges",
        &[asc(&[
            "certname",
            "source_type",
            "source_title",
            "target_type",
            "target_title",
            "relationship",
        ])],
        None,
        9,
    ));
    questions.extend(paged_questions(
        "/pdb/query/v4/package-inventory",
        &[asc(&["certname", "package_name", "version", "provider"])],
        None,
        5,
    ));
    check("union-node-owned", &questions);
}

#[test]
fn unions_equal_the_union() {
    let mut questions = Vec::new();
    for path in [
        "/pdb/query/v4/fact-names",
        "/pdb/query/v4/fact-paths",
        "/pdb/query/v4/environments",
        "/pdb/query/v4/producers",
        "/pdb/query/v4/packages",
    ] {
        questions.push(question(path, &[]));
    }
    questions.extend(paged_questions(
        "/pdb/query/v4/fact-paths",
        &[asc(&["path"])],
        None,
        10,
    ));
    questions.extend(paged_questions(
        "/pdb/query/v4/packages",
        &[asc(&["package_name", "version", "provider"])],
        None,
        1,
    ));
    check("union-unions", &questions);
}

#[test]
fn history_equals_the_union() {
    let reports = "/pdb/query/v4/reports";
    let events = "/pdb/query/v4/events";
    let mut questions = vec![
        question(reports, &[]),
        question(events, &[]),
        question(
            reports,
            &[("query", q(json!(["=", "latest_report?", true])))],
        ),
        question(
            events,
            &[("query", q(json!(["=", "latest_report?", true])))],
        ),
        question(reports, &[("query", q(json!(["=", "status", "failed"])))]),
        // By node state: a node that moved is active in the estate, its old backend's reports
        // included; a node deactivated everywhere is inactive.
        question(
            reports,
            &[("query", q(json!(["=", "node_state", "active"])))],
        ),
        question(
            reports,
            &[("query", q(json!(["=", "node_state", "inactive"])))],
        ),
        question(
            events,
            &[("query", q(json!(["=", "node_state", "active"])))],
        ),
        question(
            reports,
            &[(
                "query",
                q(json!([
                    "extract",
                    [["function", "count"], "status"],
                    ["=", "node_state", "active"],
                    ["group_by", "status"]
                ])),
            )],
        ),
        question(
            "/pdb/query/v4/event-counts",
            &[
                ("query", q(json!(["=", "node_state", "active"]))),
                ("summarize_by", "certname".to_owned()),
            ],
        ),
        // Projections that leave out what tells copies apart are still served once each.
        question(
            reports,
            &[("query", q(json!(["extract", ["certname", "status"]])))],
        ),
        question(
            events,
            &[(
                "query",
                q(json!(["extract", ["certname", "status", "resource_title"]])),
            )],
        ),
    ];
    for certname in hard_cases() {
        for path in [reports, events] {
            questions.push(question(
                path,
                &[("query", q(json!(["=", "certname", certname])))],
            ));
        }
    }
    questions.extend(paged_questions(
        reports,
        &[
            asc(&["hash"]),
            json!([{"field": "end_time", "order": "desc"}, {"field": "hash"}]),
        ],
        None,
        4,
    ));
    questions.extend(paged_questions(
        reports,
        &[asc(&["hash"])],
        Some(json!(["=", "environment", "production"])),
        6,
    ));
    questions.extend(paged_questions(
        events,
        &[asc(&[
            "certname",
            "report",
            "resource_type",
            "resource_title",
            "property",
        ])],
        None,
        5,
    ));
    check("union-history", &questions);
}

#[test]
fn aggregates_equal_the_union() {
    let count = |filter: Value, group: &[&str]| {
        let mut columns = vec![json!(["function", "count"])];
        columns.extend(group.iter().map(|g| json!(g)));
        let mut extract = vec![json!("extract"), Value::Array(columns)];
        if !filter.is_null() {
            extract.push(filter);
        }
        if !group.is_empty() {
            let mut by = vec![json!("group_by")];
            by.extend(group.iter().map(|g| json!(g)));
            extract.push(Value::Array(by));
        }
        q(Value::Array(extract))
    };
    let mut questions = Vec::new();
    for (path, environment) in [
        ("/pdb/query/v4/nodes", "catalog_environment"),
        ("/pdb/query/v4/facts", "environment"),
        ("/pdb/query/v4/resources", "environment"),
        ("/pdb/query/v4/factsets", "environment"),
        ("/pdb/query/v4/catalogs", "environment"),
        ("/pdb/query/v4/inventory", "environment"),
        ("/pdb/query/v4/reports", "environment"),
        ("/pdb/query/v4/events", "environment"),
    ] {
        questions.push(question(path, &[("query", count(Value::Null, &[]))]));
        questions.push(question(
            path,
            &[("query", count(json!(["=", environment, "production"]), &[]))],
        ));
        questions.push(question(
            path,
            &[("query", count(Value::Null, &[environment]))],
        ));
    }
    questions.extend([
        question(
            "/pdb/query/v4/reports",
            &[("query", count(Value::Null, &["status"]))],
        ),
        question(
            "/pdb/query/v4/events",
            &[("query", count(Value::Null, &["status"]))],
        ),
        question(
            "/pdb/query/v4/reports",
            &[(
                "query",
                count(json!(["=", "latest_report?", true]), &["status"]),
            )],
        ),
        question(
            "/pdb/query/v4/facts",
            &[("query", count(json!(["=", "name", "kernel"]), &["value"]))],
        ),
        question(
            "/pdb/query/v4/nodes",
            &[("query", count(json!(["=", "node_state", "any"]), &[]))],
        ),
        question(
            "/pdb/query/v4/resources",
            &[("query", count(json!(["=", "node_state", "any"]), &["type"]))],
        ),
    ]);
    for summarize_by in ["certname", "resource", "containing_class"] {
        for (path, query) in [
            (
                "/pdb/query/v4/event-counts",
                json!(["=", "latest_report?", true]),
            ),
            (
                "/pdb/query/v4/aggregate-event-counts",
                json!(["=", "latest_report?", true]),
            ),
            (
                "/pdb/query/v4/event-counts",
                json!(["=", "status", "success"]),
            ),
            (
                "/pdb/query/v4/aggregate-event-counts",
                json!(["=", "status", "success"]),
            ),
        ] {
            questions.push(question(
                path,
                &[
                    ("query", q(query)),
                    ("summarize_by", summarize_by.to_owned()),
                ],
            ));
        }
    }
    // History event counts over every report (a report stored in both counted once), by
    // either count_by and with a counts_filter on the merged counts.
    for summarize_by in ["certname", "resource", "containing_class"] {
        for count_by in ["resource", "certname"] {
            for path in [
                "/pdb/query/v4/event-counts",
                "/pdb/query/v4/aggregate-event-counts",
            ] {
                questions.push(question(
                    path,
                    &[
                        ("summarize_by", summarize_by.to_owned()),
                        ("count_by", count_by.to_owned()),
                    ],
                ));
            }
        }
        questions.push(question(
            "/pdb/query/v4/event-counts",
            &[
                ("query", q(json!(["=", "environment", "production"]))),
                ("summarize_by", summarize_by.to_owned()),
                ("counts_filter", q(json!([">", "successes", 2]))),
            ],
        ));
    }
    questions.push(question(
        "/pdb/query/v4/aggregate-event-counts",
        &[
            (
                "summarize_by",
                "certname,resource,containing_class".to_owned(),
            ),
            ("counts_filter", q(json!([">=", "failures", 1]))),
        ],
    ));
    check("union-aggregates", &questions);
}

#[test]
fn pql_and_from_queries_equal_the_union() {
    let tie = order_dependent();
    let pql = |entity: &str, text: String| Question::root(entity, text, &[], Compare::Set);
    let ordered = |entity: &str, text: String| Question::root(entity, text, &[], Compare::Sequence);
    let other = hard_cases();
    let questions = vec![
        pql(
            "nodes",
            format!(
                r#"nodes[certname] {{ facts_environment = "staging" and certname != "{tie}" }}"#
            ),
        ),
        ordered(
            "nodes",
            format!(
                r#"nodes[certname, report_timestamp] {{ certname != "{tie}" order by certname desc limit 6 offset 2 }}"#
            ),
        ),
        pql(
            "nodes",
            format!(
                r#"nodes[certname] {{ certname in ["{}", "{}"] }}"#,
                other[0], other[4]
            ),
        ),
        pql(
            "nodes",
            format!(
                r#"nodes[certname] {{ facts {{ name = "e2e_loaded_into" and value = "all" }} and certname != "{tie}" }}"#
            ),
        ),
        pql(
            "facts",
            format!(r#"facts[count()] {{ name = "kernel" and certname != "{tie}" }}"#),
        ),
        pql(
            "facts",
            format!(
                r#"facts[value, count()] {{ name = "e2e_loaded_into" and certname != "{tie}" group by value }}"#
            ),
        ),
        pql(
            "facts",
            format!(r#"facts {{ name = "ipaddress" and certname != "{tie}" }}"#),
        ),
        pql(
            "fact-contents",
            format!(
                r#"fact_contents[certname, value] {{ name = "kernel" and certname != "{tie}" }}"#
            ),
        ),
        pql(
            "reports",
            format!(r#"reports[hash, certname] {{ certname ~ "pdbmux" and certname != "{tie}" }}"#),
        ),
        pql(
            "reports",
            format!(r#"reports[status, count()] {{ certname != "{tie}" group by status }}"#),
        ),
        pql(
            "events",
            format!(r#"events[certname, status, resource_title] {{ certname != "{tie}" }}"#),
        ),
        pql(
            "resources",
            format!(
                r#"resources[certname, type, title] {{ type = "Service" and certname != "{tie}" }}"#
            ),
        ),
        pql(
            "resources",
            format!(r#"resources[count()] {{ exported = true and certname != "{tie}" }}"#),
        ),
        pql(
            "inventory",
            format!(r#"inventory[certname] {{ facts.kernel = "Linux" and certname != "{tie}" }}"#),
        ),
        pql(
            "factsets",
            format!(r#"factsets[certname, environment] {{ certname != "{tie}" }}"#),
        ),
        pql(
            "catalogs",
            format!(r#"catalogs[certname, version] {{ certname != "{tie}" }}"#),
        ),
        pql("fact-names", "fact_names {}".to_owned()),
        pql("environments", "environments {}".to_owned()),
        Question::root(
            "nodes",
            q(json!([
                "from",
                "nodes",
                ["extract", ["certname"], ["not", ["=", "certname", tie]]],
                ["order_by", [["certname", "desc"]]],
                ["limit", 3]
            ])),
            &[("offset", "1"), ("include_total", "true")],
            Compare::Sequence,
        ),
        Question::root(
            "nodes",
            format!(r#"nodes[certname] {{ certname != "{tie}" order by certname limit 2 }}"#),
            &[("limit", "4"), ("include_total", "true")],
            Compare::Sequence,
        ),
    ];
    let mut questions = questions;
    // Refused as the union refuses: a PQL syntax error, an unknown field, an unknown entity.
    for text in [
        "nodes[certname { }",
        r#"nodes[certname] { no_such_field = "x" }"#,
        "no_such_entity { }",
    ] {
        questions.push(pql("nodes", text.to_owned()));
    }
    check("union-pql", &questions);
}

#[test]
fn refusals_equal_the_union() {
    let mut questions = Vec::new();
    for path in [
        "/pdb/query/v4/nodes",
        "/pdb/query/v4/catalogs",
        "/pdb/query/v4/edges",
        "/pdb/query/v4/packages",
    ] {
        questions.push(question(path, &[("limit", "0".to_owned())]));
        questions.push(question(path, &[("offset", "-1".to_owned())]));
        questions.push(question(
            path,
            &[("order_by", q(json!([{"field": "nope"}])))],
        ));
        questions.push(question(path, &[("order_by", "[".to_owned())]));
    }
    check("union-refusals", &questions);
}

/// The sub-routes below an environment or a producer are their entity with that constraint
/// (D21): what one PuppetDB holding the estate answers on the same sub-route.
#[test]
fn sub_routes_equal_the_union() {
    let producer = "puppet.pdbmux.test";
    let mut questions = Vec::new();
    for environment in ["production", "staging"] {
        let below = |entity: &str| format!("/pdb/query/v4/environments/{environment}/{entity}");
        for entity in ["facts", "resources", "reports", "events"] {
            questions.push(question(&below(entity), &[]));
        }
        questions.push(question(&below("facts/e2e_loaded_into"), &[]));
        questions.push(question(&below("resources/Service"), &[]));
        questions.push(question(
            &below("facts"),
            &[(
                "query",
                q(json!([
                    "extract",
                    ["certname", "value"],
                    ["=", "name", "e2e_weight"]
                ])),
            )],
        ));
    }
    for entity in ["catalogs", "factsets", "reports"] {
        let path = format!("/pdb/query/v4/producers/{producer}/{entity}");
        questions.push(question(&path, &[]));
    }
    check("sub-routes", &questions);
}
