//! Combined aggregates (docs/merging.md "Aggregates"; docs/decisions.md D4, D5; issue 4): extract
//! queries with a function column, `/event-counts` and `/aggregate-event-counts`, folded across
//! backends rather than deduped.
//!
//! The rule snapshots script each backend's partial answer and show the transcript, then every
//! upstream request with its query decoded (the avg rewrite, the paging that is not forwarded, the
//! ownership clause). The property drives fake PuppetDBs that evaluate the aggregate they are
//! asked over their own resources, and checks the folded answer against one fake holding the
//! whole estate.

mod common;

use common::{finish, harness, member_backend, members, URL_A, URL_B};
use http::StatusCode;
use pdbmux_conformance::{
    decoded_upstream, form_target, ms, read_asking, Asked, ClientId, FakeBackend, Harness, Machine,
    PuppetDb, Reply,
};
use pdbmux_core::config::MergeStrategy;
use proptest::prelude::*;
use serde_json::{json, Value};

const T09: Option<&str> = Some("2024-05-01T09:00:00.000Z");
const T10: Option<&str> = Some("2024-05-01T10:00:00.000Z");
const T11: Option<&str> = Some("2024-05-01T11:00:00.000Z");

/// The longest decoded upstream line kept in a snapshot.
const MAX_DECODED: usize = 600;

/// Drives to quiescence; the transcript and the decoded upstream requests.
fn run(h: &mut Harness) -> String {
    let transcript = finish(h);
    format!(
        "{transcript}--- upstream, decoded\n{}",
        decoded_upstream(h, MAX_DECODED)
    )
}

/// `GET path?query=<ast>&<extra…>`.
fn ask(h: &mut Harness, path: &str, ast: &Value, extra: &[(&str, &str)]) -> ClientId {
    let query = ast.to_string();
    let mut params = vec![("query", query.as_str())];
    params.extend_from_slice(extra);
    h.get(&form_target(path, &params))
}

fn body(h: &Harness, client: ClientId) -> String {
    h.response(client).expect("one response").body_str()
}

fn status(h: &Harness, client: ClientId) -> StatusCode {
    h.response(client).expect("one response").status
}

/// A backend of a node-scoped route: an empty membership map, then these answers in order.
fn scoped(name: &str, url: &str, replies: Vec<Reply>) -> FakeBackend {
    member_backend(name, url, members(&[]), replies)
}

/// The upstream targets an exchange sent (not the estate's membership fetches), decoded.
fn exchange_queries(h: &Harness) -> Vec<String> {
    h.sends()
        .iter()
        .filter(|s| s.machine != Machine::Estate)
        .map(|s| {
            let asking = read_asking(&Asked::of(&s.request)).expect("readable");
            format!(
                "{} {:?} {}",
                asking.path,
                asking.params,
                asking.query.map(|q| q.to_string()).unwrap_or_default()
            )
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Extract folds

#[test]
fn count_and_sum_add() {
    let mut h = harness(vec![
        scoped(
            "pdb-a",
            URL_A,
            vec![Reply::ok(
                r#"[{"count":3,"sum":30,"type":"File"},{"count":1,"sum":7,"type":"Exec"}]"#,
            )],
        ),
        scoped(
            "pdb-b",
            URL_B,
            vec![Reply::ok(
                r#"[{"count":2,"sum":12,"type":"File"},{"count":5,"sum":40,"type":"Package"}]"#,
            )],
        ),
    ]);
    let c = ask(
        &mut h,
        "/pdb/query/v4/resources",
        &json!([
            "extract",
            [["function", "count"], ["function", "sum", "line"], "type"],
            ["group_by", "type"]
        ]),
        &[],
    );
    let transcript = run(&mut h);
    assert_eq!(
        body(&h, c),
        r#"[{"count":5,"sum":42,"type":"File"},{"count":1,"sum":7,"type":"Exec"},{"count":5,"sum":40,"type":"Package"}]"#
    );
    assert_eq!(
        h.response(c).expect("one").header("x-backends"),
        Some("2/2")
    );
    insta::assert_snapshot!(transcript);
}

#[test]
fn min_and_max_take_the_extremes_on_text_and_timestamps_too() {
    // Timestamps compare as instants, text byte-wise (C collation: "web9" > "web10", "Zeta" <
    // "alpha").
    let mut h = harness(vec![
        FakeBackend::queue(
            "pdb-a",
            URL_A,
            [Reply::ok(
                r#"[{"min":"2024-05-01T10:00:00.000Z","max":"web9","environment":"production"},{"min":"2024-05-01T08:00:00.000Z","max":"Zeta","environment":"staging"}]"#,
            )],
        ),
        FakeBackend::queue(
            "pdb-b",
            URL_B,
            [Reply::ok(
                r#"[{"min":"2024-05-01T09:30:00.000Z","max":"web10","environment":"production"},{"min":"2024-05-01T12:00:00.000Z","max":"alpha","environment":"staging"}]"#,
            )],
        ),
    ]);
    let c = ask(
        &mut h,
        "/pdb/query/v4/reports",
        &json!([
            "extract",
            [
                ["function", "min", "receive_time"],
                ["function", "max", "certname"],
                "environment"
            ],
            ["group_by", "environment"]
        ]),
        &[],
    );
    let transcript = run(&mut h);
    assert_eq!(
        body(&h, c),
        r#"[{"min":"2024-05-01T09:30:00.000Z","max":"web9","environment":"production"},{"min":"2024-05-01T08:00:00.000Z","max":"alpha","environment":"staging"}]"#
    );
    insta::assert_snapshot!(transcript);
}

#[test]
fn avg_is_rewritten_upstream_to_sum_and_count_and_divided() {
    // The weighted average (10 + 20) / (4 + 1) = 6, not the average of averages (2.5 + 20) / 2.
    let mut h = harness(vec![
        scoped(
            "pdb-a",
            URL_A,
            vec![Reply::ok(
                r#"[{"sum":10,"count":4,"environment":"production"},{"sum":9,"count":3,"environment":"staging"}]"#,
            )],
        ),
        scoped(
            "pdb-b",
            URL_B,
            vec![Reply::ok(
                r#"[{"sum":20,"count":1,"environment":"production"},{"sum":null,"count":0,"environment":"dev"}]"#,
            )],
        ),
    ]);
    let c = ask(
        &mut h,
        "/pdb/query/v4/facts",
        &json!([
            "extract",
            [["function", "avg", "value"], "environment"],
            ["=", "name", "uptime_days"],
            ["group_by", "environment"]
        ]),
        &[],
    );
    let transcript = run(&mut h);
    assert_eq!(
        body(&h, c),
        r#"[{"avg":6.0,"environment":"production"},{"avg":3.0,"environment":"staging"},{"avg":null,"environment":"dev"}]"#
    );
    for query in exchange_queries(&h) {
        assert!(
            query.contains(
                r#"[["function","sum","value"],["function","count","value"],"environment"]"#
            ),
            "{query}"
        );
    }
    insta::assert_snapshot!(transcript);
}

#[test]
fn avg_order_by_and_limit_are_applied_after_the_fold() {
    // In-query paging is stripped upstream; descending puts the null average first (D11).
    let mut h = harness(vec![
        scoped(
            "pdb-a",
            URL_A,
            vec![Reply::ok(
                r#"[{"sum":10,"count":4,"environment":"production"},{"sum":9,"count":3,"environment":"staging"}]"#,
            )],
        ),
        scoped(
            "pdb-b",
            URL_B,
            vec![Reply::ok(
                r#"[{"sum":20,"count":1,"environment":"production"},{"sum":null,"count":0,"environment":"dev"}]"#,
            )],
        ),
    ]);
    let c = ask(
        &mut h,
        "/pdb/query/v4/facts",
        &json!([
            "from",
            "facts",
            [
                "extract",
                [["function", "avg", "value"], "environment"],
                ["=", "name", "uptime_days"],
                ["group_by", "environment"]
            ],
            ["order_by", [["avg", "desc"]]],
            ["limit", 2]
        ]),
        &[],
    );
    let transcript = run(&mut h);
    assert_eq!(
        body(&h, c),
        r#"[{"avg":null,"environment":"dev"},{"avg":6.0,"environment":"production"}]"#
    );
    for query in exchange_queries(&h) {
        assert!(
            !query.contains("order_by") && !query.contains("limit"),
            "{query}"
        );
    }
    insta::assert_snapshot!(transcript);
}

#[test]
fn null_and_absent_aggregates_are_skipped() {
    // Never zeroed, never an extreme: the backends that reported a value still count.
    let mut h = harness(vec![
        scoped(
            "pdb-a",
            URL_A,
            vec![Reply::ok(
                r#"[{"sum":null,"min":null,"max":null,"type":"File"},{"sum":4,"min":"b","max":4,"type":"Exec"},{"sum":null,"min":null,"max":null,"type":"Service"}]"#,
            )],
        ),
        scoped(
            "pdb-b",
            URL_B,
            vec![Reply::ok(
                r#"[{"sum":5,"min":"a","max":9,"type":"File"},{"sum":null,"type":"Exec"},{"sum":null,"min":null,"max":null,"type":"Service"}]"#,
            )],
        ),
    ]);
    let c = ask(
        &mut h,
        "/pdb/query/v4/resources",
        &json!([
            "extract",
            [
                ["function", "sum", "line"],
                ["function", "min", "title"],
                ["function", "max", "line"],
                "type"
            ],
            ["group_by", "type"]
        ]),
        &[],
    );
    let transcript = run(&mut h);
    assert_eq!(
        body(&h, c),
        r#"[{"sum":5,"min":"a","max":9,"type":"File"},{"sum":4,"min":"b","max":4,"type":"Exec"},{"sum":null,"min":null,"max":null,"type":"Service"}]"#
    );
    insta::assert_snapshot!(transcript);
}

#[test]
fn a_key_only_one_backend_reported_is_passed_through_byte_for_byte() {
    // pdb-a's failure row keeps its key order, spacing and `1.0`; the shared key is rebuilt.
    let mut h = harness(vec![
        scoped(
            "pdb-a",
            URL_A,
            vec![Reply::ok(
                r#"[{"count": 3, "status": "success"},{"status":  "failure", "count":1.0}]"#,
            )],
        ),
        scoped(
            "pdb-b",
            URL_B,
            vec![Reply::ok(
                r#"[{"count":2,"status":"success"},{ "count" : 4 , "status" : "noop" }]"#,
            )],
        ),
    ]);
    let c = ask(
        &mut h,
        "/pdb/query/v4/events",
        &json!([
            "extract",
            [["function", "count"], "status"],
            ["group_by", "status"]
        ]),
        &[],
    );
    let transcript = run(&mut h);
    assert_eq!(
        body(&h, c),
        r#"[{"count":5,"status":"success"},{"status":  "failure", "count":1.0},{ "count" : 4 , "status" : "noop" }]"#
    );
    insta::assert_snapshot!(transcript);
}

/// `/events` count by status: pdb-a and pdb-b each hold two of three statuses, and say they have
/// two groups (`X-Records: 2`).
fn status_counts() -> Vec<FakeBackend> {
    vec![
        scoped(
            "pdb-a",
            URL_A,
            vec![
                Reply::ok(r#"[{"count":1,"status":"success"},{"count":4,"status":"noop"}]"#)
                    .header("X-Records", "2"),
            ],
        ),
        scoped(
            "pdb-b",
            URL_B,
            vec![
                Reply::ok(r#"[{"count":2,"status":"failure"},{"count":1,"status":"noop"}]"#)
                    .header("X-Records", "2"),
            ],
        ),
    ]
}

fn count_by_status() -> Value {
    json!([
        "extract",
        [["function", "count"], "status"],
        ["group_by", "status"]
    ])
}

#[test]
fn limit_and_offset_are_cut_after_the_fold() {
    // Sorted by status: failure 2, noop 5, success 1; the second group is noop, folded from both.
    let mut h = harness(status_counts());
    let c = ask(
        &mut h,
        "/pdb/query/v4/events",
        &count_by_status(),
        &[
            ("order_by", r#"[{"field":"status"}]"#),
            ("limit", "1"),
            ("offset", "1"),
        ],
    );
    let transcript = run(&mut h);
    assert_eq!(body(&h, c), r#"[{"count":5,"status":"noop"}]"#);
    for query in exchange_queries(&h) {
        assert!(query.contains(r#"["query"]"#), "only the query: {query}");
    }
    insta::assert_snapshot!(transcript);
}

#[test]
fn include_total_is_the_merged_group_count() {
    // Three groups, not the backends' 2 + 2.
    let mut h = harness(status_counts());
    let c = ask(
        &mut h,
        "/pdb/query/v4/events",
        &count_by_status(),
        &[("include_total", "true"), ("limit", "1")],
    );
    let transcript = run(&mut h);
    let response = h.response(c).expect("one response");
    assert_eq!(response.header("x-records"), Some("3"));
    assert_eq!(body(&h, c), r#"[{"count":1,"status":"success"}]"#);
    insta::assert_snapshot!(transcript);
}

#[test]
fn an_extract_of_row_functions_only_keeps_the_rows_and_the_limit() {
    // One row per record: nothing folds, each backend gets offset + limit (no offset), and the
    // window is cut from the re-sorted rows; the total is the backends' own totals.
    let mut h = harness(vec![
        scoped(
            "pdb-a",
            URL_A,
            vec![Reply::ok(
                r#"[{"certname":"a1","jsonb_typeof":"string"},{"certname":"c1","jsonb_typeof":"string"},{"certname":"e1","jsonb_typeof":"string"}]"#,
            )
            .header("X-Records", "5")],
        ),
        scoped(
            "pdb-b",
            URL_B,
            vec![Reply::ok(
                r#"[{"certname":"b1","jsonb_typeof":"object"},{"certname":"d1","jsonb_typeof":"string"}]"#,
            )
            .header("X-Records", "2")],
        ),
    ]);
    let c = ask(
        &mut h,
        "/pdb/query/v4/facts",
        &json!([
            "extract",
            ["certname", ["function", "jsonb_typeof", "value"]],
            ["=", "name", "os"]
        ]),
        &[
            ("order_by", r#"[{"field":"certname"}]"#),
            ("limit", "2"),
            ("offset", "1"),
            ("include_total", "true"),
        ],
    );
    let transcript = run(&mut h);
    assert_eq!(
        body(&h, c),
        r#"[{"certname":"b1","jsonb_typeof":"object"},{"certname":"c1","jsonb_typeof":"string"}]"#
    );
    assert_eq!(h.response(c).expect("one").header("x-records"), Some("7"));
    for query in exchange_queries(&h) {
        assert!(
            query.contains(r#"["query", "order_by", "limit", "include_total"]"#),
            "{query}"
        );
    }
    for sent in h.sends().iter().filter(|s| s.machine != Machine::Estate) {
        assert!(
            sent.request.path_and_query.contains("limit=3"),
            "{:?}",
            sent.request
        );
    }
    insta::assert_snapshot!(transcript);
}

#[test]
fn a_failing_backend_leaves_the_others_folded_and_a_unanimous_400_is_replayed() {
    let refusal = || Reply::text(StatusCode::BAD_REQUEST, "Unrecognized column 'nope'");
    let mut h = harness(vec![
        scoped(
            "pdb-a",
            URL_A,
            vec![
                Reply::text(StatusCode::INTERNAL_SERVER_ERROR, "broken"),
                refusal(),
            ],
        ),
        scoped(
            "pdb-b",
            URL_B,
            vec![Reply::ok(r#"[{"count":2,"status":"failure"}]"#), refusal()],
        ),
    ]);
    let partial = ask(&mut h, "/pdb/query/v4/events", &count_by_status(), &[]);
    finish(&mut h);
    let refused = ask(&mut h, "/pdb/query/v4/events", &count_by_status(), &[]);
    finish(&mut h);
    let response = h.response(partial).expect("one response");
    assert_eq!(response.status, StatusCode::OK);
    assert_eq!(response.header("x-backends"), Some("1/2"));
    assert_eq!(body(&h, partial), r#"[{"count":2,"status":"failure"}]"#);
    let response = h.response(refused).expect("one response");
    assert_eq!(response.status, StatusCode::BAD_REQUEST);
    assert_eq!(response.body_str(), "Unrecognized column 'nope'");
}

// ---------------------------------------------------------------------------------------------
// Event counts

fn certname_counts(title: &str, failures: u32, successes: u32, noops: u32) -> String {
    format!(
        r#"{{"failures":{failures},"skips":0,"successes":{successes},"noops":{noops},"subject_type":"certname","subject":{{"title":"{title}"}}}}"#
    )
}

fn rows(rows: &[String]) -> Reply {
    Reply::ok(format!("[{}]", rows.join(",")))
}

#[test]
fn event_counts_are_summed_per_subject_then_filtered_ordered_and_windowed() {
    // web1 has 1 + 1 failures: only the merged row passes failures >= 2. web3 stays out. The
    // order is applied to the merged rows (web2 3, then web1 and web5 with 2, first seen first).
    // History event counts learn from the estate which nodes two backends both hold: none here,
    // so nothing is corrected.
    let mut h = harness(vec![
        scoped(
            "pdb-a",
            URL_A,
            vec![rows(&[
                certname_counts("web1", 1, 2, 0),
                certname_counts("web2", 3, 0, 0),
                certname_counts("web3", 1, 0, 0),
            ])],
        ),
        scoped(
            "pdb-b",
            URL_B,
            vec![rows(&[
                certname_counts("web1", 1, 0, 1),
                certname_counts("web4", 0, 5, 0),
                certname_counts("web5", 2, 0, 0),
            ])],
        ),
    ]);
    let c = ask(
        &mut h,
        "/pdb/query/v4/event-counts",
        &json!(["=", "report_environment", "production"]),
        &[
            ("summarize_by", "certname"),
            ("count_by", "resource"),
            ("counts_filter", r#"[">=","failures",2]"#),
            ("order_by", r#"[{"field":"failures","order":"desc"}]"#),
            ("limit", "2"),
            ("include_total", "true"),
        ],
    );
    let transcript = run(&mut h);
    assert_eq!(
        body(&h, c),
        format!(
            "[{},{}]",
            certname_counts("web2", 3, 0, 0),
            certname_counts("web1", 2, 2, 1)
        )
    );
    assert_eq!(h.response(c).expect("one").header("x-records"), Some("3"));
    for query in exchange_queries(&h) {
        assert!(
            query.contains(r#"["query", "summarize_by", "count_by"]"#),
            "{query}"
        );
    }
    insta::assert_snapshot!(transcript);
}

fn resource_counts(resource_type: &str, title: &str, failures: u32, successes: u32) -> String {
    format!(
        r#"{{"failures":{failures},"skips":0,"successes":{successes},"noops":0,"subject_type":"resource","subject":{{"type":"{resource_type}","title":"{title}"}}}}"#
    )
}

#[test]
fn aggregate_event_counts_come_from_the_merged_subjects() {
    // D5: /event-counts once per summarize_by value from every backend, summed per subject,
    // counts_filter applied to the merged subjects, each summary computed here. Summing the
    // backends' own summaries would count web2 (failing in both) and File[/etc/motd] twice.
    let mut h = harness(vec![
        scoped(
            "pdb-a",
            URL_A,
            vec![
                rows(&[
                    certname_counts("web1", 1, 0, 0),
                    certname_counts("web2", 1, 1, 0),
                    certname_counts("web4", 0, 0, 2),
                ]),
                rows(&[resource_counts("File", "/etc/motd", 1, 0)]),
            ],
        ),
        scoped(
            "pdb-b",
            URL_B,
            vec![
                rows(&[
                    certname_counts("web2", 2, 0, 0),
                    certname_counts("web3", 0, 1, 0),
                    certname_counts("web4", 0, 1, 0),
                ]),
                rows(&[
                    resource_counts("File", "/etc/motd", 0, 1),
                    resource_counts("Service", "sshd", 0, 1),
                ]),
            ],
        ),
    ]);
    let c = ask(
        &mut h,
        "/pdb/query/v4/aggregate-event-counts",
        &json!(["=", "report_environment", "production"]),
        &[
            ("summarize_by", "certname,resource"),
            ("counts_filter", r#"[">","failures",0]"#),
        ],
    );
    let transcript = run(&mut h);
    assert_eq!(
        body(&h, c),
        r#"[{"summarize_by":"certname","failures":2,"skips":0,"successes":1,"noops":0,"total":2},{"summarize_by":"resource","failures":1,"skips":0,"successes":1,"noops":0,"total":1}]"#
    );
    let queries = exchange_queries(&h);
    assert_eq!(queries.len(), 4);
    for query in queries {
        assert!(
            query.starts_with("/pdb/query/v4/event-counts ")
                && query.contains(r#"["query", "summarize_by"]"#),
            "{query}"
        );
    }
    insta::assert_snapshot!(transcript);
}

// ---------------------------------------------------------------------------------------------
// Refusals

/// A refused request: path, query, further parameters, and what the 400 says.
type RefusalCase = (
    &'static str,
    Value,
    Vec<(&'static str, &'static str)>,
    &'static str,
);

#[test]
fn refusals_are_400_before_any_fan_out() {
    let mut h = harness(vec![
        FakeBackend::always("pdb-a", URL_A, Reply::ok("[]")),
        FakeBackend::always("pdb-b", URL_B, Reply::ok("[]")),
    ]);
    let cases: Vec<RefusalCase> = vec![
        (
            "/pdb/query/v4/events",
            json!([
                "extract",
                [["function", "count"], ["function", "count"], "status"],
                ["group_by", "status"]
            ]),
            vec![],
            "extract projects the function count twice; pdbmux cannot merge the aliased column count_2",
        ),
        (
            "/pdb/query/v4/reports",
            json!([
                "extract",
                [
                    ["function", "avg", "report_format"],
                    ["function", "sum", "report_format"]
                ]
            ]),
            vec![],
            "extract projects avg together with sum; pdbmux needs the sum column to rewrite avg",
        ),
        (
            "/pdb/query/v4/events",
            json!(["extract", [["function", "median", "line"]]]),
            vec![],
            "extract function median has no combiner; pdbmux combines count, sum, avg, min, max, to_string and jsonb_typeof",
        ),
        (
            "/pdb/query/v4/events",
            count_by_status(),
            vec![("distinct_resources", "true")],
            "distinct_resources cannot be combined with extract functions",
        ),
        (
            "/pdb/query/v4/reports",
            json!(["extract", [["function", "count"], "count"]]),
            vec![],
            "extract projects the field count beside the function count",
        ),
    ];
    let clients: Vec<ClientId> = cases
        .iter()
        .map(|(path, ast, extra, _)| ask(&mut h, path, ast, extra))
        .collect();
    let transcript = finish(&mut h);
    assert!(h.sends().is_empty(), "no backend is asked:\n{transcript}");
    for (client, (path, _, _, text)) in clients.into_iter().zip(&cases) {
        assert_eq!(status(&h, client), StatusCode::BAD_REQUEST, "{path}");
        assert!(
            body(&h, client).contains(text),
            "{path}: {}",
            body(&h, client)
        );
    }
    insta::assert_snapshot!(transcript);
}

#[test]
fn a_refusal_on_a_node_scoped_route_asks_no_backend() {
    // /nodes aggregates need the membership map, but a query that cannot be combined is refused
    // before it is fetched.
    let mut h = harness(vec![
        FakeBackend::puppetdb("pdb-a", URL_A, PuppetDb::new().node("web1", T10), ms(2)),
        FakeBackend::puppetdb("pdb-b", URL_B, PuppetDb::new().node("web2", T10), ms(2)),
    ]);
    let c = ask(
        &mut h,
        "/pdb/query/v4/nodes",
        &json!([
            "extract",
            [["function", "avg", "certname"], ["function", "count"]]
        ]),
        &[],
    );
    finish(&mut h);
    assert_eq!(status(&h, c), StatusCode::BAD_REQUEST);
    assert_eq!(h.response(c).expect("one").at, std::time::Duration::ZERO);
    assert!(h.sends().is_empty(), "{}", h.transcript());
}

#[test]
fn distinct_resources_without_a_function_column_fans_out_untouched() {
    let mut h = harness(vec![
        FakeBackend::always("pdb-a", URL_A, Reply::ok("[]")),
        FakeBackend::always("pdb-b", URL_B, Reply::ok("[]")),
    ]);
    let c = ask(
        &mut h,
        "/pdb/query/v4/events",
        &json!(["extract", ["status", "certname"]]),
        &[("distinct_resources", "true")],
    );
    finish(&mut h);
    assert_eq!(status(&h, c), StatusCode::OK);
    let sent: Vec<&str> = h
        .sends()
        .iter()
        .map(|s| s.request.path_and_query.as_str())
        .collect();
    assert_eq!(sent.len(), 2);
    for target in sent {
        assert!(target.contains("distinct_resources=true"), "{target}");
    }
}

// ---------------------------------------------------------------------------------------------
// Ownership (D4)

#[test]
fn a_nodes_count_subtracts_what_a_backend_counts_for_another_owner() {
    // "shared" is held by both; pdb-b has its newer report, so pdb-a counts it for pdb-b. The
    // estate has four nodes, not the five the backends hold between them: both backends are
    // asked the client's count, and pdb-a also its count over the one node it holds for pdb-b,
    // which is subtracted (docs/merging.md, "Corrections"). No ownership list goes into the
    // count itself.
    let a = PuppetDb::new().node("web1", T10).node("shared", T10);
    let b = PuppetDb::new()
        .node("shared", T11)
        .node("web2", T09)
        .node("web3", None);
    let mut h = harness(vec![
        FakeBackend::puppetdb("pdb-a", URL_A, a, ms(2)),
        FakeBackend::puppetdb("pdb-b", URL_B, b, ms(3)),
    ]);
    let c = ask(
        &mut h,
        "/pdb/query/v4/nodes",
        &json!(["extract", [["function", "count"]]]),
        &[],
    );
    let transcript = run(&mut h);
    assert_eq!(body(&h, c), r#"[{"count":4}]"#);
    let asked: Vec<(String, Value)> = h
        .sends()
        .iter()
        .filter(|s| s.machine != Machine::Estate)
        .map(|s| {
            let asking = read_asking(&Asked::of(&s.request)).expect("readable");
            (s.backend_name.clone(), asking.query.unwrap_or_default())
        })
        .collect();
    assert_eq!(
        asked,
        [
            (
                "pdb-a".to_owned(),
                json!(["extract", [["function", "count"]]])
            ),
            (
                "pdb-b".to_owned(),
                json!(["extract", [["function", "count"]]])
            ),
            (
                "pdb-a".to_owned(),
                json!([
                    "extract",
                    [["function", "count"]],
                    ["in", "certname", ["array", ["shared"]]]
                ])
            ),
        ]
    );
    // The correction is kept for the membership snapshot: asked again, no correction request.
    let again = ask(
        &mut h,
        "/pdb/query/v4/nodes",
        &json!(["extract", [["function", "count"]]]),
        &[],
    );
    finish(&mut h);
    assert_eq!(body(&h, again), r#"[{"count":4}]"#);
    let exchange_sends = h
        .sends()
        .iter()
        .filter(|s| s.machine != Machine::Estate)
        .count();
    assert_eq!(exchange_sends, 5, "two more counts, no correction");
    insta::assert_snapshot!(transcript);
}

#[test]
fn event_counts_count_a_report_stored_in_two_backends_once() {
    // web1's report is stored in both backends: each counts its 2 failures and 1 success. Both
    // hold web1's history, so each is also asked, over web1, which of its events are in which
    // report (an `/events` extract, docs/merging.md "History counted once"): the report both
    // answer is counted once. web4 is pdb-b's alone and is passed through byte for byte.
    let web1 = [("web1", Some("2024-05-01T10:00:00.000Z"))];
    let per_report = Reply::ok(
        r#"[{"count":2,"report":"h1","status":"failure","certname":"web1","resource_type":"File","resource_title":"/etc/motd","containing_class":"Motd"},{"count":1,"report":"h1","status":"success","certname":"web1","resource_type":"Service","resource_title":"sshd","containing_class":null}]"#,
    );
    let per_report_again = per_report.clone();
    let mut h = harness(vec![
        member_backend(
            "pdb-a",
            URL_A,
            members(&web1),
            vec![
                rows(&[certname_counts("web1", 2, 1, 0)]),
                per_report.clone(),
            ],
        ),
        member_backend(
            "pdb-b",
            URL_B,
            members(&web1),
            vec![
                rows(&[
                    certname_counts("web1", 2, 1, 0),
                    certname_counts("web4", 0, 5, 0),
                ]),
                per_report,
            ],
        ),
    ]);
    let c = ask(
        &mut h,
        "/pdb/query/v4/event-counts",
        &json!(["=", "report_environment", "production"]),
        &[("summarize_by", "certname"), ("count_by", "resource")],
    );
    finish(&mut h);
    assert_eq!(
        body(&h, c),
        format!(
            "[{},{}]",
            certname_counts("web1", 2, 1, 0),
            certname_counts("web4", 0, 5, 0)
        )
    );
    let corrections: Vec<String> = exchange_queries(&h)
        .into_iter()
        .filter(|q| q.starts_with("/pdb/query/v4/events "))
        .collect();
    let expected = json!([
        "extract",
        [
            ["function", "count"],
            "report",
            "status",
            "certname",
            "resource_type",
            "resource_title",
            "containing_class"
        ],
        [
            "and",
            ["=", "report_environment", "production"],
            ["in", "certname", ["array", ["web1"]]]
        ],
        [
            "group_by",
            "report",
            "status",
            "certname",
            "resource_type",
            "resource_title",
            "containing_class"
        ]
    ]);
    assert_eq!(
        corrections,
        [
            format!("/pdb/query/v4/events [\"query\"] {expected}"),
            format!("/pdb/query/v4/events [\"query\"] {expected}"),
        ]
    );
    // /aggregate-event-counts takes the same correction (one per backend, whatever the
    // summarize_by values): web1's File failure and Service success count once, in one node.
    let mut h = harness(vec![
        member_backend(
            "pdb-a",
            URL_A,
            members(&web1),
            vec![
                rows(&[certname_counts("web1", 2, 1, 0)]),
                rows(&[resource_counts("File", "/etc/motd", 2, 0)]),
                per_report_again.clone(),
            ],
        ),
        member_backend(
            "pdb-b",
            URL_B,
            members(&web1),
            vec![
                rows(&[certname_counts("web1", 2, 1, 0)]),
                rows(&[resource_counts("File", "/etc/motd", 2, 0)]),
                per_report_again,
            ],
        ),
    ]);
    let c = ask(
        &mut h,
        "/pdb/query/v4/aggregate-event-counts",
        &json!(["=", "report_environment", "production"]),
        &[
            ("summarize_by", "certname,resource"),
            ("counts_filter", r#"[">","failures",2]"#),
        ],
    );
    finish(&mut h);
    // Summed, web1 has 4 failures and File[/etc/motd] 4: both pass failures > 2; counted once,
    // neither does.
    assert_eq!(
        body(&h, c),
        r#"[{"summarize_by":"certname","failures":0,"skips":0,"successes":0,"noops":0,"total":0},{"summarize_by":"resource","failures":0,"skips":0,"successes":0,"noops":0,"total":0}]"#
    );
}

// ---------------------------------------------------------------------------------------------
// Property: folding the backends' partial answers equals one PuppetDB's answer over the estate.

const TYPES: [&str; 3] = ["File", "Exec", "Service"];
const TITLES: [&str; 4] = ["/etc/motd", "Zeta", "alpha", "sshd"];
const CERTNAMES: [&str; 5] = ["alpha", "bravo", "charlie", "delta", "echo"];
const STAMPS: [Option<&str>; 3] = [None, T10, T11];

/// One node as one backend holds it: its report timestamp and its resources.
#[derive(Debug, Clone)]
struct Held {
    certname: &'static str,
    stamp: Option<&'static str>,
    resources: Vec<(&'static str, &'static str, Option<i64>)>,
}

/// The query shapes the property draws from; `order` names the total order over its groups.
fn shapes() -> Vec<(Value, Vec<&'static str>)> {
    vec![
        (
            json!([
                "extract",
                [["function", "count"], "type"],
                ["group_by", "type"]
            ]),
            vec!["type"],
        ),
        (
            json!([
                "extract",
                [
                    ["function", "count"],
                    ["function", "sum", "line"],
                    ["function", "min", "title"],
                    ["function", "max", "line"],
                    "type"
                ],
                ["group_by", "type"]
            ]),
            vec!["type"],
        ),
        (
            json!([
                "extract",
                [["function", "avg", "line"], "type"],
                ["group_by", "type"]
            ]),
            vec!["type"],
        ),
        (
            json!([
                "extract",
                [
                    ["function", "count", "line"],
                    ["function", "max", "title"],
                    "type",
                    "title"
                ],
                ["not", ["=", "type", "Exec"]],
                ["group_by", "type", "title"]
            ]),
            vec!["type", "title"],
        ),
        (
            json!([
                "extract",
                [
                    ["function", "count"],
                    ["function", "sum", "line"],
                    ["function", "min", "line"],
                    ["function", "max", "title"]
                ]
            ]),
            Vec::new(),
        ),
        (
            json!([
                "extract",
                [["function", "avg", "line"], ["function", "min", "title"]],
                ["=", "type", "File"]
            ]),
            Vec::new(),
        ),
        (
            json!([
                "extract",
                [["function", "min", "line"], "title"],
                [">=", "line", 10],
                ["group_by", "title"]
            ]),
            vec!["title"],
        ),
    ]
}

#[derive(Debug, Clone)]
struct Case {
    estate: Vec<Vec<Held>>,
    shape: usize,
    descending: bool,
    limit: Option<u64>,
    offset: Option<u64>,
    include_total: bool,
    latencies: Vec<u64>,
    /// `merge: static` (the first holder owns a node on /resources) instead of freshness.
    static_merge: bool,
}

fn held() -> impl Strategy<Value = Held> {
    let resource = (
        proptest::sample::select(TYPES.to_vec()),
        proptest::sample::select(TITLES.to_vec()),
        proptest::option::of(0i64..40),
    );
    (
        proptest::sample::select(CERTNAMES.to_vec()),
        proptest::sample::select(STAMPS.to_vec()),
        proptest::collection::vec(resource, 0..5),
    )
        .prop_map(|(certname, stamp, resources)| Held {
            certname,
            stamp,
            resources,
        })
}

/// One backend's nodes: one record per certname.
fn backend_nodes() -> impl Strategy<Value = Vec<Held>> {
    proptest::collection::vec(held(), 0..4).prop_map(|mut nodes| {
        let mut seen = Vec::new();
        nodes.retain(|n| {
            let fresh = !seen.contains(&n.certname);
            seen.push(n.certname);
            fresh
        });
        nodes
    })
}

fn case() -> impl Strategy<Value = Case> {
    (2usize..5).prop_flat_map(|backends| {
        (
            proptest::collection::vec(backend_nodes(), backends),
            0..shapes().len(),
            any::<bool>(),
            proptest::option::of(1u64..4),
            proptest::option::of(0u64..3),
            any::<bool>(),
            (proptest::collection::vec(1u64..6, backends), any::<bool>()),
        )
            .prop_map(
                |(
                    estate,
                    shape,
                    descending,
                    limit,
                    offset,
                    include_total,
                    (latencies, static_merge),
                )| Case {
                    estate,
                    shape,
                    descending,
                    limit,
                    offset,
                    include_total,
                    latencies,
                    static_merge,
                },
            )
    })
}

/// A backend's fake PuppetDB.
fn backend_db(nodes: &[Held]) -> PuppetDb {
    let mut db = PuppetDb::new();
    for node in nodes {
        db = db.node(node.certname, node.stamp);
        for (resource_type, title, line) in &node.resources {
            db = db.resource(node.certname, resource_type, title, *line);
        }
    }
    db
}

/// One PuppetDB holding the whole estate: each node as its owner holds it (under freshness the
/// newer report timestamp, a null one older than any, ties to configured order; under static the
/// first backend in configured order).
fn estate_db(estate: &[Vec<Held>], static_merge: bool) -> PuppetDb {
    let mut owners: Vec<&Held> = Vec::new();
    for nodes in estate {
        for node in nodes {
            match owners.iter_mut().find(|o| o.certname == node.certname) {
                Some(owner) => {
                    let newer = match (node.stamp, owner.stamp) {
                        _ if static_merge => false,
                        (Some(a), Some(b)) => a > b,
                        (Some(_), None) => true,
                        _ => false,
                    };
                    if newer {
                        *owner = node;
                    }
                }
                None => owners.push(node),
            }
        }
    }
    let owned: Vec<Held> = owners.into_iter().cloned().collect();
    backend_db(&owned)
}

fn sorted(rows: &[Value]) -> Vec<String> {
    let mut rows: Vec<String> = rows.iter().map(Value::to_string).collect();
    rows.sort();
    rows
}

fn check_case(case: &Case) -> Result<(), TestCaseError> {
    let (ast, order) = shapes().swap_remove(case.shape);
    let backends: Vec<FakeBackend> = case
        .estate
        .iter()
        .enumerate()
        .map(|(index, nodes)| {
            FakeBackend::puppetdb(
                &format!("pdb-{index}"),
                &format!("http://pdb{index}.example.com:8080"),
                backend_db(nodes),
                ms(case.latencies[index]),
            )
        })
        .collect();
    let strategy = if case.static_merge {
        MergeStrategy::Static
    } else {
        MergeStrategy::Freshness
    };
    let mut h = Harness::with_config(backends, |config| config.merge = strategy)
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    let direction = if case.descending { "desc" } else { "asc" };
    let order_by = Value::Array(
        order
            .iter()
            .map(|field| json!({"field": field, "order": direction}))
            .collect(),
    )
    .to_string();
    // A window only over a total order (the group key), so it is well defined.
    let ordered = !order.is_empty();
    let (limit, offset) = (
        case.limit.filter(|_| ordered).map(|l| l.to_string()),
        case.offset.filter(|_| ordered).map(|o| o.to_string()),
    );
    let query = ast.to_string();
    let mut params: Vec<(&str, &str)> = vec![("query", &query)];
    if ordered {
        params.push(("order_by", &order_by));
    }
    if let Some(limit) = &limit {
        params.push(("limit", limit));
    }
    if let Some(offset) = &offset {
        params.push(("offset", offset));
    }
    if case.include_total {
        params.push(("include_total", "true"));
    }
    let target = form_target("/pdb/query/v4/resources", &params);
    let c = h.get(&target);
    h.drive_bounded(10_000)
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    h.check_quiescent()
        .map_err(|e| TestCaseError::fail(e.to_string()))?;

    // The reference: the same request, asked of one PuppetDB holding the estate.
    let reference = estate_db(&case.estate, case.static_merge).answer(&Asked::get(&target));
    let pdbmux_conformance::ReplyOutcome::Answer(expected) = reference.outcome else {
        return Err(TestCaseError::fail("the reference did not answer"));
    };
    prop_assert_eq!(expected.status, StatusCode::OK);
    let expected_rows: Vec<Value> =
        serde_json::from_slice(&expected.body).map_err(|e| TestCaseError::fail(e.to_string()))?;

    let response = h
        .response(c)
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    prop_assert_eq!(response.status, StatusCode::OK, "{}", h.transcript());
    let rows: Vec<Value> = serde_json::from_slice(&response.body)
        .map_err(|e| TestCaseError::fail(format!("{e}: {}", response.body_str())))?;
    if ordered {
        prop_assert_eq!(&rows, &expected_rows, "{}", h.transcript());
    } else {
        prop_assert_eq!(sorted(&rows), sorted(&expected_rows), "{}", h.transcript());
    }
    let expected_total = expected
        .headers
        .iter()
        .find(|(name, _)| name == "X-Records")
        .map(|(_, value)| value.as_str());
    prop_assert_eq!(response.header("x-records"), expected_total);

    // Every group was fetched: no paging went upstream.
    for sent in h.sends().iter().filter(|s| s.machine != Machine::Estate) {
        let asking = read_asking(&Asked::of(&sent.request))
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(&asking.params, &vec!["query".to_owned()]);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 160, ..ProptestConfig::default() })]

    #[test]
    fn folding_the_backends_partial_answers_equals_the_aggregate_over_the_estate(case in case()) {
        check_case(&case)?;
    }
}

#[test]
fn the_fold_property_on_a_hand_written_estate() {
    // "bravo" migrated from pdb-0 to pdb-1 and is held by both; pdb-2 holds nothing.
    let node = |certname, stamp, resources: &[(&'static str, &'static str, Option<i64>)]| Held {
        certname,
        stamp,
        resources: resources.to_vec(),
    };
    let estate = vec![
        vec![
            node(
                "alpha",
                T10,
                &[("File", "/etc/motd", Some(3)), ("Exec", "Zeta", None)],
            ),
            node(
                "bravo",
                T10,
                &[("File", "alpha", Some(30)), ("File", "sshd", Some(31))],
            ),
        ],
        vec![
            node("bravo", T11, &[("File", "alpha", Some(12))]),
            node(
                "charlie",
                None,
                &[("Service", "sshd", Some(20)), ("File", "Zeta", Some(1))],
            ),
        ],
        Vec::new(),
    ];
    for shape in 0..shapes().len() {
        for (limit, offset) in [(None, None), (Some(1), Some(1)), (Some(2), None)] {
            check_case(&Case {
                estate: estate.clone(),
                shape,
                descending: shape % 2 == 0,
                limit,
                offset,
                include_total: true,
                latencies: vec![3, 1, 2],
                static_merge: shape % 3 == 1,
            })
            .unwrap_or_else(|e| panic!("shape {shape} {limit:?} {offset:?}: {e}"));
        }
    }
}
