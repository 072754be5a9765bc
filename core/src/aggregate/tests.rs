//! Combining rules on hand-made backend answers: planning, refusals and extract folds. The
//! event-count endpoints are in `tests_events.rs`.

use serde_json::{json, Value};

use super::*;
use crate::entity::Entity;

pub(super) fn encode(text: &str) -> String {
    form_urlencoded::byte_serialize(text.as_bytes()).collect()
}

/// Params with `query=<ast>` first, then `extra` (already a query string).
pub(super) fn with_query(ast: &Value, extra: &str) -> Params {
    let mut raw = format!("query={}", encode(&ast.to_string()));
    if !extra.is_empty() {
        raw.push('&');
        raw.push_str(extra);
    }
    Params::parse(Some(&raw))
}

fn plan(entity: Entity, ast: Value, extra: &str) -> CombinePlan {
    CombinePlan::from_params(CombineKind::Extract(entity), &with_query(&ast, extra))
        .expect("plannable")
        .expect("combined")
}

fn refusal(entity: Entity, ast: Value, extra: &str) -> String {
    CombinePlan::from_params(CombineKind::Extract(entity), &with_query(&ast, extra))
        .expect_err("refused")
        .to_string()
}

/// The upstream request's decoded params as (key, value) pairs.
pub(super) fn upstream(plan: &CombinePlan) -> Vec<(UpstreamPath, Vec<(String, String)>)> {
    plan.upstream()
        .into_iter()
        .map(|upstream| {
            let params = upstream
                .params
                .iter()
                .map(|p| (p.key().to_owned(), p.value().to_owned()))
                .collect();
            (upstream.path, params)
        })
        .collect()
}

/// Combines one body per backend; returns the body text and the total.
pub(super) fn run(plan: &CombinePlan, bodies: &[&str]) -> (String, Option<u64>) {
    let combined = run_parts(plan, bodies, &[]);
    assert!(combined.unusable.is_empty(), "{:?}", combined.unusable);
    (
        String::from_utf8(combined.body).expect("utf-8"),
        combined.total,
    )
}

pub(super) fn run_parts(plan: &CombinePlan, bodies: &[&str], records: &[u64]) -> Combined {
    let slices: Vec<[&[u8]; 1]> = bodies.iter().map(|b| [b.as_bytes()]).collect();
    let parts: Vec<Part<'_>> = slices
        .iter()
        .enumerate()
        .map(|(i, bodies)| Part {
            bodies,
            records: records.get(i).copied(),
            correction: None,
        })
        .collect();
    plan.combine(&parts)
}

fn value(text: &str) -> Value {
    serde_json::from_str(text).expect("json")
}

const FACTS: Entity = Entity::Facts;
const REPORTS: Entity = Entity::Reports;

// ---- planning ----

#[test]
fn no_function_column_is_not_combined() {
    let kind = CombineKind::Extract(FACTS);
    for raw in [
        None,
        Some("query=%5B%22%3D%22%2C%22name%22%2C%22a%22%5D"),
        Some("query=facts%20%7B%20%7D"),
        Some("query=%5B%22extract%22%2C%5B%22certname%22%5D%5D"),
        Some("query=%5Bbad"),
    ] {
        assert_eq!(
            CombinePlan::from_params(kind, &Params::parse(raw)),
            Ok(None),
            "{raw:?}"
        );
    }
}

#[test]
fn folding_extract_fetches_every_group() {
    let ast = json!([
        "extract",
        [["function", "count"], "status"],
        ["group_by", "status"]
    ]);
    let raw = format!(
        "query={}&limit=5&offset=10&order_by=%5B%7B%22field%22%3A%22status%22%7D%5D&include_total=true&origin=x",
        encode(&ast.to_string())
    );
    let plan = CombinePlan::from_params(CombineKind::Extract(REPORTS), &Params::parse(Some(&raw)))
        .expect("ok")
        .expect("combined");
    let upstream = plan.upstream();
    assert_eq!(upstream.len(), 1);
    assert_eq!(upstream[0].path, UpstreamPath::Same);
    // The query is forwarded byte for byte; only the paging params go.
    assert_eq!(
        upstream[0].params.to_query_string(),
        format!("query={}&origin=x", encode(&ast.to_string()))
    );
}

#[test]
fn avg_is_rewritten_upstream() {
    let plan = plan(
        FACTS,
        json!([
            "extract",
            [["function", "avg", "value"], "environment"],
            ["=", "name", "uptime"],
            ["group_by", "environment"]
        ]),
        "",
    );
    let (_, params) = &upstream(&plan)[0];
    assert_eq!(
        value(&params[0].1),
        json!([
            "extract",
            [
                ["function", "sum", "value"],
                ["function", "count", "value"],
                "environment"
            ],
            ["=", "name", "uptime"],
            ["group_by", "environment"]
        ])
    );
}

#[test]
fn row_functions_only_keep_the_upstream_limit() {
    let ast = json!([
        "extract",
        [
            ["function", "to_string", "receive_time", "FMDay"],
            "certname"
        ]
    ]);
    let plan = plan(REPORTS, ast.clone(), "limit=5&offset=10&include_total=true");
    assert_eq!(
        upstream(&plan)[0].1,
        [
            ("query".to_owned(), ast.to_string()),
            ("limit".to_owned(), "15".to_owned()),
            ("include_total".to_owned(), "true".to_owned()),
        ]
    );
}

#[test]
fn unprojected_group_by_is_projected_upstream_and_dropped() {
    let plan = plan(
        REPORTS,
        json!([
            "extract",
            [["function", "count"]],
            [
                "group_by",
                "status",
                ["function", "to_string", "receive_time", "FMDay"]
            ]
        ]),
        "",
    );
    assert_eq!(
        value(&upstream(&plan)[0].1[0].1),
        json!([
            "extract",
            [
                ["function", "count"],
                "status",
                ["function", "to_string", "receive_time", "FMDay"]
            ],
            [
                "group_by",
                "status",
                ["function", "to_string", "receive_time", "FMDay"]
            ]
        ])
    );
    let (body, _) = run(
        &plan,
        &[
            r#"[{"count":2,"status":"failed","to_string":"Monday"},{"count":1,"status":"changed","to_string":"Monday"}]"#,
            r#"[{"count":3,"status":"failed","to_string":"Monday"},{"count":4,"status":"failed","to_string":"Sunday"}]"#,
        ],
    );
    assert_eq!(body, r#"[{"count":5},{"count":1},{"count":4}]"#);
    // An order on the unprojected group_by field sees the helper column before it goes.
    let plan = super::tests::plan(
        REPORTS,
        json!(["extract", [["function", "count"]], ["group_by", "status"]]),
        "order_by=%5B%7B%22field%22%3A%22status%22%7D%5D&limit=2",
    );
    let (body, total) = run(
        &plan,
        &[
            r#"[{"count":2,"status":"failed"},{"count":1,"status":"changed"}]"#,
            r#"[{"count":3,"status":"unchanged"},{"count":4,"status":"failed"}]"#,
        ],
    );
    assert_eq!(body, r#"[{"count":1},{"count":6}]"#);
    assert_eq!(total, None);
}

#[test]
fn in_query_paging_is_stripped_and_applied_after_the_fold() {
    let plan = plan(
        FACTS,
        json!([
            "from",
            "facts",
            [
                "extract",
                [["function", "avg", "value"], "environment"],
                ["group_by", "environment"]
            ],
            ["order_by", [["avg", "desc"]]],
            ["limit", 1]
        ]),
        "",
    );
    assert_eq!(
        value(&upstream(&plan)[0].1[0].1),
        json!([
            "from",
            "facts",
            [
                "extract",
                [
                    ["function", "sum", "value"],
                    ["function", "count", "value"],
                    "environment"
                ],
                ["group_by", "environment"]
            ]
        ])
    );
    let (body, _) = run(
        &plan,
        &[
            r#"[{"sum":10,"count":2,"environment":"a"},{"sum":9,"count":1,"environment":"b"}]"#,
            r#"[{"sum":10,"count":8,"environment":"a"},{"sum":3,"count":1,"environment":"c"}]"#,
        ],
    );
    assert_eq!(body, r#"[{"avg":9.0,"environment":"b"}]"#);
}

#[test]
fn refusals_before_fan_out() {
    assert_eq!(
        refusal(
            FACTS,
            json!([
                "extract",
                [["function", "count"], ["function", "count", "certname"]]
            ]),
            ""
        ),
        "extract projects the function count twice; pdbmux cannot merge the aliased column count_2"
    );
    assert_eq!(
        refusal(FACTS, json!(["extract", [["function", "max", "value"], "max"]]), ""),
        "extract projects the field max beside the function max; pdbmux cannot merge the aliased column max_2"
    );
    assert_eq!(
        refusal(
            FACTS,
            json!([
                "extract",
                [["function", "avg", "value"], ["function", "sum", "value"]]
            ]),
            ""
        ),
        "extract projects avg together with sum; pdbmux needs the sum column to rewrite avg"
    );
    assert_eq!(
        refusal(
            FACTS,
            json!([
                "extract",
                [["function", "count"], ["function", "avg", "value"]]
            ]),
            ""
        ),
        "extract projects avg together with count; pdbmux needs the count column to rewrite avg"
    );
    assert_eq!(
        refusal(FACTS, json!(["extract", [["function", "median", "value"]]]), ""),
        "extract function median has no combiner; pdbmux combines count, sum, avg, min, max, to_string and jsonb_typeof"
    );
    assert_eq!(
        refusal(Entity::Events, json!(["extract", [["function", "count"]]]), "distinct_resources=TRUE"),
        "distinct_resources cannot be combined with extract functions; puppetdb answers distinct_resources queries from its legacy query compiler, which supports neither function nor group_by"
    );
    assert_eq!(
        refusal(
            FACTS,
            json!(["extract", [["function", "count"]]]),
            "limit=0"
        ),
        "Illegal value '0' for :limit; expected a positive non-zero integer."
    );
    assert_eq!(
        refusal(FACTS, json!(["extract", [["function", "count"]]]), "order_by=%5B%7B%22field%22%3A%22count%22%7D%5D"),
        "Unrecognized column 'count' specified in :order_by; Supported columns are 'certname', 'environment', 'name', 'value'"
    );
    assert_eq!(
        refusal(FACTS, json!(["extract", [["function", "count"], ["function", "to_string", "value", "x"]], ["group_by", ["function", "to_string", "name", "y"]]]), ""),
        "group_by function to_string is not projected and its column clashes with a projected to_string; pdbmux cannot tell its groups apart"
    );
    assert_eq!(
        refusal(
            FACTS,
            json!([
                "from",
                "facts",
                ["extract", [["function", "count"]]],
                ["limit", 1],
                ["limit", 2]
            ]),
            ""
        ),
        "Multiple 'limit' clauses are not permitted"
    );
    assert_eq!(
        refusal(
            FACTS,
            json!([
                "from",
                "facts",
                ["extract", [["function", "count"]]],
                ["order_by", [["count", "up"]]]
            ]),
            ""
        ),
        r#"in-query order_by entry ["count","up"] is not a field or [field, "asc"|"desc"]"#
    );
}

#[test]
fn distinct_resources_elsewhere_is_not_refused() {
    // Without a function column the request is not combined, so it fans out untouched.
    assert_eq!(
        CombinePlan::from_params(
            CombineKind::Extract(Entity::Events),
            &with_query(&json!(["extract", ["certname"]]), "distinct_resources=true")
        ),
        Ok(None)
    );
    // false is not true.
    plan(
        Entity::Events,
        json!(["extract", [["function", "count"]]]),
        "distinct_resources=false",
    );
}

// ---- folds ----

#[test]
fn count_and_sum_add_and_integers_stay_integers() {
    let plan = plan(
        FACTS,
        json!([
            "extract",
            [["function", "count"], ["function", "sum", "value"], "name"],
            ["group_by", "name"]
        ]),
        "",
    );
    let (body, _) = run(
        &plan,
        &[
            r#"[{"count":2,"sum":10,"name":"a"},{"count":1,"sum":1.5,"name":"b"}]"#,
            r#"[{"count":3,"sum":5,"name":"a"},{"count":1,"sum":2,"name":"b"}]"#,
        ],
    );
    assert_eq!(
        body,
        r#"[{"count":5,"sum":15,"name":"a"},{"count":2,"sum":3.5,"name":"b"}]"#
    );
}

#[test]
fn min_and_max_take_the_extremes_by_column_type() {
    let plan = plan(
        REPORTS,
        json!([
            "extract",
            [
                ["function", "min", "certname"],
                ["function", "max", "producer_timestamp"]
            ]
        ]),
        "",
    );
    let (body, _) = run(
        &plan,
        &[
            r#"[{"min":"web","max":"2026-01-01T10:00:00.000Z"}]"#,
            r#"[{"min":"Web","max":"2026-01-01T09:30:00.000-01:00"}]"#,
            r#"[{"min":"web2","max":"2026-01-01T10:15:00.000Z"}]"#,
        ],
    );
    // Text byte-wise (the C collation, D11): "Web" < "web". Timestamps as instants: 09:30-01:00
    // is 10:30Z, later than 10:15Z although it sorts first as text.
    assert_eq!(
        body,
        r#"[{"min":"Web","max":"2026-01-01T09:30:00.000-01:00"}]"#
    );
}

#[test]
fn min_and_max_numeric_and_null_skipped() {
    let plan = plan(
        FACTS,
        json!([
            "extract",
            [
                ["function", "min", "value"],
                ["function", "max", "value"],
                ["function", "sum", "value"],
                "name"
            ],
            ["group_by", "name"]
        ]),
        "",
    );
    let (body, _) = run(
        &plan,
        &[
            r#"[{"min":null,"max":null,"sum":null,"name":"a"},{"min":10,"max":100,"sum":110,"name":"b"}]"#,
            r#"[{"min":3,"max":9.5,"sum":12.5,"name":"a"},{"min":9,"max":20,"name":"b"}]"#,
            r#"[{"min":4,"max":5,"sum":null,"name":"a"},{"min":null,"max":null,"sum":null,"name":"b"}]"#,
        ],
    );
    assert_eq!(
        body,
        r#"[{"min":3,"max":9.5,"sum":12.5,"name":"a"},{"min":9,"max":100,"sum":110,"name":"b"}]"#
    );
}

#[test]
fn all_null_stays_null() {
    let plan = plan(
        FACTS,
        json!([
            "extract",
            [["function", "sum", "value"], ["function", "max", "value"]]
        ]),
        "",
    );
    let (body, _) = run(
        &plan,
        &[
            r#"[{"sum":null,"max":null}]"#,
            r#"[{"sum":null,"max":null}]"#,
        ],
    );
    assert_eq!(body, r#"[{"sum":null,"max":null}]"#);
}

#[test]
fn avg_is_the_weighted_average_under_the_avg_key() {
    let plan = plan(
        FACTS,
        json!([
            "extract",
            [
                "environment",
                ["function", "avg", "value"],
                ["function", "max", "value"]
            ],
            ["group_by", "environment"]
        ]),
        "",
    );
    let (body, _) = run(
        &plan,
        &[
            r#"[{"sum":30,"count":3,"max":20,"environment":"a"},{"sum":null,"count":0,"max":null,"environment":"b"}]"#,
            r#"[{"sum":10,"count":1,"max":10,"environment":"a"},{"sum":null,"count":0,"max":null,"environment":"b"},{"sum":7,"count":2,"max":4,"environment":"c"}]"#,
        ],
    );
    // Not the average of averages (10 and 10 → 10): 40 / 4. A key one backend reported is
    // rewritten too (sum / count → avg); zero counted rows stay null.
    assert_eq!(
        body,
        r#"[{"avg":10.0,"max":20,"environment":"a"},{"avg":null,"max":null,"environment":"b"},{"avg":3.5,"max":4,"environment":"c"}]"#
    );
}

#[test]
fn a_key_one_backend_reported_passes_byte_for_byte() {
    let plan = plan(
        REPORTS,
        json!([
            "extract",
            [["function", "count"], "status"],
            ["group_by", "status"]
        ]),
        "",
    );
    let (body, _) = run(
        &plan,
        &[
            r#"[ {"count" : 2, "status":"fail\u0065d"} ]"#,
            r#"[{"count":1,"status":"changed"}, {"status":"failed","count":3}]"#,
        ],
    );
    // "fail\u0065d" and "failed" are one key; a merged row keeps the first backend's key order.
    assert_eq!(
        body,
        r#"[{"count":5,"status":"fail\u0065d"},{"count":1,"status":"changed"}]"#
    );
    let (body, _) = run(&plan, &[r#"[ {"count" : 2, "status":"x\u0041"} ]"#, "[]"]);
    assert_eq!(body, r#"[{"count" : 2, "status":"x\u0041"}]"#);
}

#[test]
fn order_window_and_total_after_the_fold() {
    let ast = json!([
        "extract",
        [["function", "count"], "status"],
        ["group_by", "status"]
    ]);
    let bodies = [
        r#"[{"count":1,"status":"b"},{"count":5,"status":"c"}]"#,
        r#"[{"count":2,"status":"a"},{"count":1,"status":"c"},{"count":1,"status":"b"}]"#,
    ];
    // First-seen order without order_by.
    let (body, total) = run(&plan(REPORTS, ast.clone(), ""), &bodies);
    assert_eq!(
        body,
        r#"[{"count":2,"status":"b"},{"count":6,"status":"c"},{"count":2,"status":"a"}]"#
    );
    assert_eq!(total, None);
    let (body, total) = run(
        &plan(
            REPORTS,
            ast.clone(),
            "order_by=%5B%7B%22field%22%3A%22status%22%2C%22order%22%3A%22desc%22%7D%5D&limit=1&offset=1&include_total=true",
        ),
        &bodies,
    );
    assert_eq!(body, r#"[{"count":2,"status":"b"}]"#);
    assert_eq!(total, Some(3));
    // An in-query order on the function alias; ties keep first-seen order.
    let (body, _) = run(
        &plan(
            REPORTS,
            json!([
                "from",
                "reports",
                ast,
                ["order_by", ["count"]],
                ["offset", 1]
            ]),
            "",
        ),
        &bodies,
    );
    assert_eq!(
        body,
        r#"[{"count":2,"status":"a"},{"count":6,"status":"c"}]"#
    );
}

#[test]
fn a_repeated_plain_field_is_part_of_the_key() {
    let plan = plan(
        FACTS,
        json!([
            "extract",
            ["name", "name", ["function", "count"]],
            ["group_by", "name"]
        ]),
        "",
    );
    let (body, _) = run(
        &plan,
        &[
            r#"[{"count":1,"name":"a","name_2":"a"}]"#,
            r#"[{"count":2,"name":"a","name_2":"a"},{"count":1,"name":"b","name_2":"b"}]"#,
        ],
    );
    assert_eq!(
        body,
        r#"[{"count":3,"name":"a","name_2":"a"},{"count":1,"name":"b","name_2":"b"}]"#
    );
}

#[test]
fn row_functions_group_like_plain_columns() {
    let plan = plan(
        REPORTS,
        json!([
            "extract",
            [
                ["function", "count"],
                ["function", "to_string", "receive_time", "FMDay"]
            ],
            [
                "group_by",
                ["function", "to_string", "receive_time", "FMDay"]
            ]
        ]),
        "",
    );
    // The projected group_by function needs no helper: the query goes as it came.
    assert_eq!(
        plan.upstream()[0].params.get("query"),
        with_query(
            &json!([
                "extract",
                [
                    ["function", "count"],
                    ["function", "to_string", "receive_time", "FMDay"]
                ],
                [
                    "group_by",
                    ["function", "to_string", "receive_time", "FMDay"]
                ]
            ]),
            ""
        )
        .get("query")
    );
    let (body, _) = run(
        &plan,
        &[
            r#"[{"count":1,"to_string":"Monday"},{"count":2,"to_string":"Sunday"}]"#,
            r#"[{"count":4,"to_string":"Sunday"}]"#,
        ],
    );
    assert_eq!(
        body,
        r#"[{"count":1,"to_string":"Monday"},{"count":6,"to_string":"Sunday"}]"#
    );
}

#[test]
fn rows_only_keep_every_backend_row() {
    let ast = json!(["extract", [["function", "jsonb_typeof", "value"], "name"]]);
    let bodies = [
        r#"[{"jsonb_typeof":"string","name":"a"}]"#,
        r#"[{"jsonb_typeof":"string","name":"a"},{"jsonb_typeof":"number","name":"b"}]"#,
    ];
    let (body, total) = run(&plan(FACTS, ast.clone(), "include_total=true"), &bodies);
    assert_eq!(
        body,
        r#"[{"jsonb_typeof":"string","name":"a"},{"jsonb_typeof":"string","name":"a"},{"jsonb_typeof":"number","name":"b"}]"#
    );
    assert_eq!(total, Some(3));
    // Paged: each backend sent its first offset + limit rows; the total is theirs.
    let plan = plan(
        FACTS,
        ast,
        "limit=1&offset=1&include_total=true&order_by=%5B%7B%22field%22%3A%22name%22%2C%22order%22%3A%22desc%22%7D%5D",
    );
    let combined = run_parts(&plan, &bodies, &[1, 7]);
    assert_eq!(
        String::from_utf8(combined.body).expect("utf-8"),
        r#"[{"jsonb_typeof":"string","name":"a"}]"#
    );
    assert_eq!(combined.total, Some(8));
}

#[test]
fn rows_only_with_group_by_collapse_like_groups() {
    let plan = plan(
        FACTS,
        json!([
            "extract",
            [["function", "jsonb_typeof", "value"]],
            ["group_by", ["function", "jsonb_typeof", "value"]]
        ]),
        "limit=10",
    );
    assert_eq!(plan.upstream()[0].params.get("limit"), None);
    let (body, _) = run(
        &plan,
        &[
            r#"[{"jsonb_typeof":"string"}]"#,
            r#"[{"jsonb_typeof":"number"},{"jsonb_typeof":"string"}]"#,
        ],
    );
    assert_eq!(
        body,
        r#"[{"jsonb_typeof":"string"},{"jsonb_typeof":"number"}]"#
    );
}

#[test]
fn unusable_backends_are_left_out_and_named() {
    let plan = plan(
        REPORTS,
        json!([
            "extract",
            [["function", "count"], "status"],
            ["group_by", "status"]
        ]),
        "",
    );
    let combined = run_parts(
        &plan,
        &[
            r#"[{"count":1,"status":"a"}]"#,
            r#"[{"count":1,"status":"a"},{"cou"#,
            r#"[{"count":"1","status":"a"}]"#,
            r#"[1]"#,
            r#"[{"count":2,"status":"a"}]"#,
        ],
        &[],
    );
    assert_eq!(
        String::from_utf8(combined.body).expect("utf-8"),
        r#"[{"count":3,"status":"a"}]"#
    );
    let unusable: Vec<(usize, String)> = combined
        .unusable
        .iter()
        .map(|(i, e)| (*i, e.to_string()))
        .collect();
    assert_eq!(unusable.len(), 3);
    assert_eq!(unusable[0].0, 1);
    assert!(
        unusable[0].1.starts_with("unparseable body: "),
        "{}",
        unusable[0].1
    );
    assert_eq!(
        unusable[1],
        (2, "row 0 column count is not a number".to_owned())
    );
    assert_eq!(unusable[2], (3, "row 0 is not an object".to_owned()));
    let missing = plan.combine(&[Part {
        bodies: &[],
        records: None,
        correction: None,
    }]);
    assert_eq!(missing.unusable, [(0, Unusable::IncompleteParts)]);
    assert_eq!(missing.body, b"[]");
}
