//! Record merges (docs/merging.md, "Provenance", "Paging"; docs/decisions.md D3, D4, D7, D11,
//! D12, D14, D15): /nodes, /facts with the provenance fact and its gates, /facts/pdbmux_source,
//! every other node-owned entity, /fact-names, /environments, /reports, /events, and the status
//! policy on merged routes.
//!
//! Each snapshot is the harness transcript followed by every upstream request with its query
//! decoded, so the ownership clause pushed into each backend's query can be read.

mod common;

use common::{exchange_sends, finish, harness, member_backend, members, URL_A, URL_B, URL_C};
use http::{Method, StatusCode};
use pdbmux_conformance::{
    decoded_upstream, form_target, ms, FakeBackend, Harness, PuppetDb, Reply,
};
use pdbmux_core::membership::MEMBERSHIP_QUERY;
use serde_json::{json, Value};

const T09: Option<&str> = Some("2024-05-01T09:00:00.000Z");
const T10: Option<&str> = Some("2024-05-01T10:00:00.000Z");
const T11: Option<&str> = Some("2024-05-01T11:00:00.000Z");

/// The longest decoded upstream line kept in a snapshot.
const MAX_DECODED: usize = 400;

/// A fake PuppetDB backend answering after `latency` milliseconds.
fn pdb(name: &str, url: &str, db: PuppetDb, latency: u64) -> FakeBackend {
    FakeBackend::puppetdb(name, url, db, ms(latency))
}

/// Drives to quiescence; the transcript and the decoded upstream requests.
fn run(h: &mut Harness) -> String {
    let transcript = finish(h);
    format!(
        "{transcript}--- upstream, decoded\n{}",
        decoded_upstream(h, MAX_DECODED)
    )
}

/// A response body as JSON.
fn body_json(h: &Harness, client: pdbmux_conformance::ClientId) -> Value {
    let response = h.response(client).expect("one response");
    serde_json::from_slice(&response.body)
        .unwrap_or_else(|e| panic!("{e}: {}", response.body_str()))
}

/// The upstream requests an exchange sent (not the estate's membership fetches).
/// `/nodes` records as the fake writes them, with pdbmux's source key.
fn node(certname: &str, timestamp: Option<&str>, source: &str) -> Value {
    json!({"certname": certname, "deactivated": null, "report_timestamp": timestamp, "pdbmux_source": source})
}

fn fact(certname: &str, name: &str, value: &str, environment: &str) -> Value {
    json!({"certname": certname, "name": name, "value": value, "environment": environment})
}

fn source(certname: &str, backend: &str, environment: &str) -> Value {
    fact(certname, "pdbmux_source", backend, environment)
}

// ---------------------------------------------------------------------------------------------
// /nodes

/// pdb-a's and pdb-b's view of four shared nodes and one own node each.
fn shared_nodes() -> (PuppetDb, PuppetDb) {
    let a = PuppetDb::new()
        .node("newer-in-b", T10)
        .node("tie", T10)
        .node("null-in-a", None)
        .node("both-null", None)
        .node("only-a", T09);
    let b = PuppetDb::new()
        .node("newer-in-b", T11)
        .node("tie", T10)
        .node("null-in-a", T09)
        .node("both-null", None)
        .node("only-b", None);
    (a, b)
}

fn shared_nodes_expected() -> Value {
    json!([
        node("both-null", None, "pdb-a"),
        node("newer-in-b", T11, "pdb-b"),
        node("null-in-a", T09, "pdb-b"),
        node("only-a", T09, "pdb-a"),
        node("only-b", None, "pdb-b"),
        node("tie", T10, "pdb-a"),
    ])
}

#[test]
fn nodes_dedupe_newer_wins_tie_to_configured_order_null_older() {
    // The membership snapshot predates these nodes (both answer []), so nothing is pushed down
    // and the merge's own dedupe decides: the safety net of D4.
    let record = |certname: &str, timestamp: Option<&str>, from: &str| json!({"certname": certname, "report_timestamp": timestamp, "from": from});
    let a = json!([
        record("newer-in-b", T10, "a"),
        record("tie", T10, "a"),
        record("null-in-a", None, "a"),
        record("both-null", None, "a"),
        record("only-a", T09, "a"),
    ]);
    let b = json!([
        record("newer-in-b", T11, "b"),
        record("tie", T10, "b"),
        record("null-in-a", T09, "b"),
        record("both-null", None, "b"),
        record("only-b", None, "b"),
    ]);
    let mut h = harness(vec![
        member_backend(
            "pdb-a",
            URL_A,
            members(&[]),
            vec![Reply::ok(a.to_string()).after(ms(4))],
        ),
        member_backend(
            "pdb-b",
            URL_B,
            members(&[]),
            vec![Reply::ok(b.to_string()).after(ms(2))],
        ),
    ]);
    let c = h.get(&form_target(
        "/pdb/query/v4/nodes",
        &[("order_by", r#"[{"field":"certname"}]"#)],
    ));
    let transcript = run(&mut h);
    let with = |mut record: Value, source: &str| {
        record["pdbmux_source"] = json!(source);
        record
    };
    assert_eq!(
        body_json(&h, c),
        json!([
            with(record("both-null", None, "a"), "pdb-a"),
            with(record("newer-in-b", T11, "b"), "pdb-b"),
            with(record("null-in-a", T09, "b"), "pdb-b"),
            with(record("only-a", T09, "a"), "pdb-a"),
            with(record("only-b", None, "b"), "pdb-b"),
            with(record("tie", T10, "a"), "pdb-a"),
        ])
    );
    let response = h.response(c).expect("one response");
    assert_eq!(response.header("x-backends"), Some("2/2"));
    insta::assert_snapshot!(transcript);
}

#[test]
fn nodes_unpaged_other_owners_copies_dropped_here_not_pushed_down() {
    // Every answer is whole, so each backend's copies of nodes another backend owns are dropped
    // here (docs/merging.md, "What it costs"): no certname list goes upstream.
    let (a, b) = shared_nodes();
    let mut h = harness(vec![pdb("pdb-a", URL_A, a, 4), pdb("pdb-b", URL_B, b, 2)]);
    let c = h.get(&form_target(
        "/pdb/query/v4/nodes",
        &[("order_by", r#"[{"field":"certname"}]"#)],
    ));
    let transcript = run(&mut h);
    assert_eq!(body_json(&h, c), shared_nodes_expected());
    let sends = exchange_sends(&h);
    let query = |index: usize| {
        let asked =
            pdbmux_conformance::read_asking(&pdbmux_conformance::Asked::of(&sends[index].request))
                .expect("readable");
        pdbmux_conformance::excluded_certnames(asked.query.as_ref())
    };
    assert!(query(0).is_empty() && query(1).is_empty());
    insta::assert_snapshot!(transcript);
}

#[test]
fn nodes_order_by_limit_offset_over_fetch_then_cut_after_the_merge() {
    let a = PuppetDb::new()
        .node("a1", Some("2024-05-01T10:05:00.000Z"))
        .node("a2", Some("2024-05-01T10:03:00.000Z"))
        .node("a3", None)
        .node("shared", T09);
    let b = PuppetDb::new()
        .node("b1", Some("2024-05-01T10:04:00.000Z"))
        .node("b2", Some("2024-05-01T10:01:00.000Z"))
        .node("shared", T10);
    let mut h = harness(vec![pdb("pdb-a", URL_A, a, 1), pdb("pdb-b", URL_B, b, 2)]);
    // Descending: NULL first (D11), then newest first. Whole estate:
    // a3(null), a1 10:05, b1 10:04, a2 10:03, b2 10:01, shared 10:00 (pdb-b's, newer).
    let c = h.get(&form_target(
        "/pdb/query/v4/nodes",
        &[
            (
                "order_by",
                r#"[{"field":"report_timestamp","order":"desc"}]"#,
            ),
            ("limit", "3"),
            ("offset", "2"),
        ],
    ));
    let transcript = run(&mut h);
    assert_eq!(
        body_json(&h, c),
        json!([
            node("b1", Some("2024-05-01T10:04:00.000Z"), "pdb-b"),
            node("a2", Some("2024-05-01T10:03:00.000Z"), "pdb-a"),
            node("b2", Some("2024-05-01T10:01:00.000Z"), "pdb-b"),
        ])
    );
    // Each backend is asked for offset + limit, no offset; pdb-a, which holds a copy of
    // `shared` for pdb-b, for a few more (it owns 3 of its 4: 5 + 5 * 1 * 5 / (3 * 4) + 4).
    let limits: Vec<String> = exchange_sends(&h)
        .iter()
        .map(|sent| {
            let target = &sent.request.path_and_query;
            assert!(!target.contains("offset"), "{target}");
            target.split("limit=").nth(1).unwrap_or("").to_owned()
        })
        .collect();
    assert_eq!(limits, ["11", "5"]);
    insta::assert_snapshot!(transcript);
}

#[test]
fn nodes_include_total_x_records() {
    let (a, b) = shared_nodes();
    let mut h = harness(vec![pdb("pdb-a", URL_A, a, 1), pdb("pdb-b", URL_B, b, 2)]);
    // Unpaged: the merged count. Paged: the sum of the backends' X-Records, exact here because
    // ownership pushed down makes the backends' sets disjoint (D4).
    let unpaged = h.get(&form_target(
        "/pdb/query/v4/nodes",
        &[("include_total", "true")],
    ));
    let paged = h.get(&form_target(
        "/pdb/query/v4/nodes",
        &[
            ("include_total", "true"),
            ("limit", "1"),
            ("order_by", r#"[{"field":"certname","order":"desc"}]"#),
        ],
    ));
    let transcript = run(&mut h);
    let unpaged_response = h.response(unpaged).expect("one response");
    assert_eq!(unpaged_response.header("x-records"), Some("6"));
    let paged_response = h.response(paged).expect("one response");
    assert_eq!(paged_response.header("x-records"), Some("6"));
    assert_eq!(body_json(&h, paged), json!([node("tie", T10, "pdb-a")]));
    insta::assert_snapshot!(transcript);
}

#[test]
fn nodes_long_ownership_exclusion_goes_upstream_as_post() {
    let certname = |i: usize| format!("node-with-a-rather-long-certname-{i:04}.example.com");
    let mut a = PuppetDb::new().node("aaa-1", T09).node("aaa-2", None);
    let mut b = PuppetDb::new();
    for i in 0..200 {
        a = a.node(&certname(i), T09);
        b = b.node(&certname(i), T10);
    }
    let mut h = harness(vec![pdb("pdb-a", URL_A, a, 1), pdb("pdb-b", URL_B, b, 2)]);
    let c = h.get(&form_target(
        "/pdb/query/v4/nodes",
        &[
            ("order_by", r#"[{"field":"certname"}]"#),
            ("limit", "4"),
            ("include_total", "true"),
        ],
    ));
    let transcript = run(&mut h);
    assert_eq!(
        body_json(&h, c),
        json!([
            node("aaa-1", T09, "pdb-a"),
            node("aaa-2", None, "pdb-a"),
            node(&certname(0), T10, "pdb-b"),
            node(&certname(1), T10, "pdb-b"),
        ])
    );
    let response = h.response(c).expect("one response");
    assert_eq!(response.header("x-records"), Some("202"));
    let sends = exchange_sends(&h);
    assert_eq!(sends[0].request.method, Method::POST);
    assert_eq!(sends[0].request.path_and_query, "/pdb/query/v4/nodes");
    let body: Value = serde_json::from_slice(sends[0].request.body.as_deref().unwrap_or(b""))
        .expect("a JSON body");
    assert_eq!(body["limit"], json!(4));
    assert_eq!(body["include_total"], json!(true));
    assert_eq!(body["order_by"], json!([{"field": "certname"}]));
    assert_eq!(body["query"][0], json!("not"));
    assert_eq!(body["query"][1][2][1].as_array().map(Vec::len), Some(200));
    assert_eq!(
        sends[1].request.method,
        Method::GET,
        "pdb-b owns every shared node: nothing to exclude"
    );
    insta::assert_snapshot!(transcript);
}

#[test]
fn nodes_unparseable_200_counts_as_that_backend_failing() {
    let mut h = harness(vec![
        member_backend(
            "pdb-a",
            URL_A,
            members(&[("web1", T10)]),
            vec![Reply::ok(
                r#"[{"certname":"web1","report_timestamp":"2024-05-01T10:00:00.000Z"},{"cert"#,
            )
            .after(ms(2))],
        ),
        member_backend(
            "pdb-b",
            URL_B,
            members(&[("web2", T10)]),
            vec![Reply::ok(
                r#"[{"certname":"web2","report_timestamp":"2024-05-01T10:00:00.000Z"}]"#,
            )
            .after(ms(3))],
        ),
    ]);
    let c = h.get("/pdb/query/v4/nodes");
    let transcript = run(&mut h);
    let response = h.response(c).expect("one response");
    assert_eq!(response.status, StatusCode::OK);
    assert_eq!(response.header("x-backends"), Some("1/2"));
    assert_eq!(
        body_json(&h, c),
        json!([{"certname": "web2", "report_timestamp": T10, "pdbmux_source": "pdb-b"}])
    );
    insta::assert_snapshot!(transcript);
}

#[test]
fn an_answer_with_an_element_that_is_not_a_record_or_nested_too_deep_is_that_backend_failing() {
    // docs/decisions.md D7: `[1]`, `[null]`, or a body nested deeper than serde_json's limit is a
    // malformed answer, never data: served from the other backend, marked partial, and valid
    // JSON (a non-object record once became `…},1,"pdbmux_source":"x"}]`).
    let web2 = r#"[{"certname":"web2","report_timestamp":"2024-05-01T10:00:00.000Z"}]"#;
    let deep = format!(
        "[{{\"certname\":\"web1\",\"x\":{}{}}}]",
        "[".repeat(200),
        "]".repeat(200)
    );
    for bad in [
        r#"[{"certname":"web1","report_timestamp":null},1]"#.to_owned(),
        "[null]".to_owned(),
        deep,
    ] {
        let mut h = harness(vec![
            member_backend(
                "pdb-a",
                URL_A,
                members(&[("web1", T10)]),
                vec![Reply::ok(bad.clone()).after(ms(2))],
            ),
            member_backend(
                "pdb-b",
                URL_B,
                members(&[("web2", T10)]),
                vec![Reply::ok(web2).after(ms(3))],
            ),
        ]);
        let c = h.get("/pdb/query/v4/nodes");
        finish(&mut h);
        let response = h.response(c).expect("one response");
        assert_eq!(response.status, StatusCode::OK, "{bad}");
        assert_eq!(response.header("x-backends"), Some("1/2"), "{bad}");
        assert_eq!(
            body_json(&h, c),
            json!([{"certname": "web2", "report_timestamp": T10, "pdbmux_source": "pdb-b"}]),
            "{bad}"
        );
    }
}

#[test]
fn nodes_both_unparseable_is_502() {
    let mut h = harness(vec![
        member_backend(
            "pdb-a",
            URL_A,
            members(&[("web1", T10)]),
            vec![Reply::ok(r#"[{"certname":"web1""#).after(ms(2))],
        ),
        member_backend(
            "pdb-b",
            URL_B,
            members(&[("web2", T10)]),
            vec![Reply::ok("[{").after(ms(3))],
        ),
    ]);
    let c = h.get("/pdb/query/v4/nodes");
    let transcript = run(&mut h);
    let response = h.response(c).expect("one response");
    assert_eq!(response.status, StatusCode::BAD_GATEWAY);
    assert_eq!(response.header("x-backends"), Some("0/2"));
    insta::assert_snapshot!(transcript);
}

#[test]
fn nodes_unanimous_400_replayed() {
    let message = |host: &str| {
        format!("'name' is not a queryable object for nodes, known queryable objects are [certname report_timestamp] (at {host})")
    };
    let mut h = harness(vec![
        member_backend(
            "pdb-a",
            URL_A,
            members(&[("web1", T10)]),
            vec![
                Reply::text(StatusCode::BAD_REQUEST, message("pdb-a.example.com:8080"))
                    .after(ms(2)),
            ],
        ),
        member_backend(
            "pdb-b",
            URL_B,
            members(&[("web1", T11)]),
            vec![
                Reply::text(StatusCode::BAD_REQUEST, message("pdb-b.example.com:8080"))
                    .after(ms(1)),
            ],
        ),
    ]);
    let c = h.get(&form_target(
        "/pdb/query/v4/nodes",
        &[("query", r#"["=","name","x"]"#)],
    ));
    let transcript = run(&mut h);
    let response = h.response(c).expect("one response");
    assert_eq!(response.status, StatusCode::BAD_REQUEST);
    assert_eq!(response.body_str(), message("pdb-a"));
    assert_eq!(
        response.header("content-type"),
        Some("text/plain;charset=utf-8")
    );
    insta::assert_snapshot!(transcript);
}

// ---------------------------------------------------------------------------------------------
// /facts

/// web1 is shared (newer in pdb-b, first in pdb-a); web2 is only in pdb-a, web3 only in pdb-b.
/// pdb-a also holds an upstream fact named like the provenance fact, which is always dropped.
fn shared_facts() -> (PuppetDb, PuppetDb) {
    let a = PuppetDb::new()
        .node("web1", T10)
        .node("web2", T10)
        .fact("web1", "os", "Debian", "production")
        .fact("web1", "kernel", "Linux", "production")
        .fact("web2", "os", "Debian", "production")
        .fact("web2", "pdbmux_source", "upstream-impostor", "production");
    let b = PuppetDb::new()
        .node("web1", T11)
        .node("web3", None)
        .fact("web1", "os", "Ubuntu", "staging")
        .fact("web1", "kernel", "Linux", "staging")
        .fact("web3", "os", "Alpine", "production");
    (a, b)
}

fn shared_facts_harness(configure: impl FnOnce(&mut pdbmux_core::config::Config)) -> Harness {
    let (a, b) = shared_facts();
    Harness::with_config(
        vec![pdb("pdb-a", URL_A, a, 4), pdb("pdb-b", URL_B, b, 2)],
        configure,
    )
    .expect("valid test backends")
}

#[test]
fn facts_shared_node_owner_only_with_provenance() {
    let mut h = shared_facts_harness(|_| {});
    let c = h.get("/pdb/query/v4/facts");
    let transcript = run(&mut h);
    assert_eq!(
        body_json(&h, c),
        json!([
            fact("web2", "os", "Debian", "production"),
            source("web2", "pdb-a", "production"),
            fact("web1", "os", "Ubuntu", "staging"),
            fact("web1", "kernel", "Linux", "staging"),
            source("web1", "pdb-b", "staging"),
            fact("web3", "os", "Alpine", "production"),
            source("web3", "pdb-b", "production"),
        ])
    );
    assert_eq!(h.sends()[0].machine, pdbmux_conformance::Machine::Estate);
    assert_eq!(h.sends()[0].request.path_and_query, MEMBERSHIP_QUERY);
    // Unpaged: pdb-a's copy of web1 (owned by pdb-b) is dropped here, not pushed down.
    let sends = exchange_sends(&h);
    assert_eq!(sends[0].request.path_and_query, "/pdb/query/v4/facts");
    assert_eq!(sends[1].request.path_and_query, "/pdb/query/v4/facts");
    insta::assert_snapshot!(transcript);
}

#[test]
fn facts_static_merge_takes_the_first_holder() {
    let mut h = shared_facts_harness(|config| {
        config.merge = pdbmux_core::config::MergeStrategy::Static;
    });
    let c = h.get("/pdb/query/v4/facts");
    let transcript = run(&mut h);
    assert_eq!(
        body_json(&h, c),
        json!([
            fact("web1", "os", "Debian", "production"),
            fact("web1", "kernel", "Linux", "production"),
            source("web1", "pdb-a", "production"),
            fact("web2", "os", "Debian", "production"),
            source("web2", "pdb-a", "production"),
            fact("web3", "os", "Alpine", "production"),
            source("web3", "pdb-b", "production"),
        ])
    );
    insta::assert_snapshot!(transcript);
}

#[test]
fn facts_one_backend_timing_out_survivor_served() {
    let (a, _) = shared_facts();
    let members_of_b = members(&[("web1", T11), ("web3", None)]);
    let mut h = harness(vec![
        pdb("pdb-a", URL_A, a, 4),
        member_backend("pdb-b", URL_B, members_of_b, vec![Reply::never()]),
    ]);
    let c = h.get("/pdb/query/v4/facts");
    let transcript = run(&mut h);
    let response = h.response(c).expect("one response");
    assert_eq!(response.status, StatusCode::OK);
    assert_eq!(response.header("x-backends"), Some("1/2"));
    assert_eq!(response.at, ms(4) + h.config().timeout);
    // pdb-a was told web1 is pdb-b's, so only web2 is served.
    assert_eq!(
        body_json(&h, c),
        json!([
            fact("web2", "os", "Debian", "production"),
            source("web2", "pdb-a", "production"),
        ])
    );
    insta::assert_snapshot!(transcript);
}

/// Runs one gated /facts shape against the shared estate: no synthetic record, and the
/// impostor upstream record dropped.
fn gated(target: &str) -> (Harness, Value, String) {
    let mut h = shared_facts_harness(|_| {});
    let c = h.get(target);
    let transcript = run(&mut h);
    let body = body_json(&h, c);
    let names: Vec<&str> = body
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| r.get("name").and_then(Value::as_str))
        .collect();
    assert!(
        !names.contains(&"pdbmux_source"),
        "{target}: {body}\n{transcript}"
    );
    (h, body, transcript)
}

#[test]
fn a_name_constraint_admitting_the_provenance_fact_drops_the_impostor_and_writes_its_own() {
    // A name constraint that admits the impostor: it comes back from pdb-a and is dropped; the
    // constraint admits the provenance fact too, so each node's record is pdbmux's own, from
    // its facts owner (pdb-b's factset of web1 is the newer), asked as the fact's own path.
    let mut h = shared_facts_harness(|_| {});
    let c = h.get(&form_target(
        "/pdb/query/v4/facts",
        &[("query", r#"["not",["=","name","kernel"]]"#)],
    ));
    let transcript = run(&mut h);
    let body = body_json(&h, c);
    assert_eq!(
        body,
        json!([
            fact("web2", "os", "Debian", "production"),
            fact("web1", "os", "Ubuntu", "staging"),
            fact("web3", "os", "Alpine", "production"),
            fact("web2", "pdbmux_source", "pdb-a", "production"),
            fact("web1", "pdbmux_source", "pdb-b", "staging"),
            fact("web3", "pdbmux_source", "pdb-b", "production"),
        ])
    );
    insta::assert_snapshot!(transcript);
}

#[test]
fn an_ordered_question_admitting_the_provenance_fact_merges_its_records_in_their_place() {
    // The name constraint's two answers (the other facts, the provenance records), each sorted
    // by name descending, merged in that order: the provenance records before `os`.
    let mut h = shared_facts_harness(|_| {});
    let c = h.get(&form_target(
        "/pdb/query/v4/facts",
        &[
            ("query", r#"["not",["=","name","kernel"]]"#),
            (
                "order_by",
                r#"[{"field":"name","order":"desc"},{"field":"certname"}]"#,
            ),
        ],
    ));
    let transcript = run(&mut h);
    assert_eq!(
        body_json(&h, c),
        json!([
            source("web1", "pdb-b", "staging"),
            source("web2", "pdb-a", "production"),
            source("web3", "pdb-b", "production"),
            fact("web1", "os", "Ubuntu", "staging"),
            fact("web2", "os", "Debian", "production"),
            fact("web3", "os", "Alpine", "production"),
        ])
    );
    insta::assert_snapshot!(transcript);
}

#[test]
fn every_fact_ordered_by_name_is_asked_apart_from_the_provenance_records_and_merged() {
    // No name constraint, an order not by certname first: the other facts (asked without the
    // provenance fact's name) and each node's provenance record (asked as the fact's own path)
    // merged in the order, each node's record in its place.
    let mut h = shared_facts_harness(|_| {});
    let c = h.get(&form_target(
        "/pdb/query/v4/facts",
        &[("order_by", r#"[{"field":"name"},{"field":"certname"}]"#)],
    ));
    let transcript = run(&mut h);
    assert_eq!(
        body_json(&h, c),
        json!([
            fact("web1", "kernel", "Linux", "staging"),
            fact("web1", "os", "Ubuntu", "staging"),
            fact("web2", "os", "Debian", "production"),
            fact("web3", "os", "Alpine", "production"),
            source("web1", "pdb-b", "staging"),
            source("web2", "pdb-a", "production"),
            source("web3", "pdb-b", "production"),
        ])
    );
    let asked: Vec<String> = exchange_sends(&h)
        .iter()
        .map(|sent| sent.request.path_and_query.clone())
        .collect();
    assert_eq!(
        asked.len(),
        4,
        "each backend asked both questions once: {asked:?}"
    );
    insta::assert_snapshot!(transcript);
}

#[test]
fn facts_gate_extract() {
    let (_, body, transcript) = gated(&form_target(
        "/pdb/query/v4/facts",
        &[(
            "query",
            r#"["extract",["certname","name","value"],["in","certname",["array",["web1","web2"]]]]"#,
        )],
    ));
    assert_eq!(
        body,
        json!([
            {"certname": "web2", "name": "os", "value": "Debian"},
            {"certname": "web1", "name": "os", "value": "Ubuntu"},
            {"certname": "web1", "name": "kernel", "value": "Linux"},
        ])
    );
    insta::assert_snapshot!(transcript);
}

#[test]
fn facts_gate_pql() {
    // PQL is opaque: forwarded untouched to every backend (no ownership pushed down), and the
    // merge keeps only the owner's records of a shared node.
    let pql = r#"facts { certname ~ "web" }"#;
    let a = json!([
        fact("web1", "os", "Debian", "production"),
        fact("web2", "os", "Debian", "production"),
        fact("web2", "pdbmux_source", "upstream-impostor", "production"),
    ]);
    let b = json!([fact("web1", "os", "Ubuntu", "staging")]);
    let mut h = harness(vec![
        member_backend(
            "pdb-a",
            URL_A,
            members(&[("web1", T10), ("web2", T10)]),
            vec![Reply::ok(a.to_string()).after(ms(4))],
        ),
        member_backend(
            "pdb-b",
            URL_B,
            members(&[("web1", T11)]),
            vec![Reply::ok(b.to_string()).after(ms(2))],
        ),
    ]);
    let request = form_target("/pdb/query/v4/facts", &[("query", pql)]);
    let c = h.get(&request);
    let transcript = run(&mut h);
    assert_eq!(
        body_json(&h, c),
        json!([
            fact("web2", "os", "Debian", "production"),
            fact("web1", "os", "Ubuntu", "staging"),
        ])
    );
    for sent in exchange_sends(&h) {
        assert_eq!(sent.request.path_and_query, request);
    }
    insta::assert_snapshot!(transcript);
}

#[test]
fn facts_gate_paged() {
    let (_, body, transcript) = gated(&form_target(
        "/pdb/query/v4/facts",
        &[("order_by", r#"[{"field":"certname"}]"#), ("limit", "3")],
    ));
    assert_eq!(
        body,
        json!([
            fact("web1", "os", "Ubuntu", "staging"),
            fact("web1", "kernel", "Linux", "staging"),
            fact("web2", "os", "Debian", "production"),
        ])
    );
    insta::assert_snapshot!(transcript);
}

#[test]
fn facts_gate_other_fact_path() {
    let (h, body, transcript) = gated("/pdb/query/v4/facts/os");
    assert_eq!(
        body,
        json!([
            fact("web2", "os", "Debian", "production"),
            fact("web1", "os", "Ubuntu", "staging"),
            fact("web3", "os", "Alpine", "production"),
        ])
    );
    let sends = exchange_sends(&h);
    assert_eq!(sends[0].request.path_and_query, "/pdb/query/v4/facts/os");
    insta::assert_snapshot!(transcript);
}

#[test]
fn facts_gate_injection_off_restores_upstream_records() {
    let mut h = shared_facts_harness(|config| config.source_fact_enabled = false);
    let c = h.get("/pdb/query/v4/facts");
    let transcript = run(&mut h);
    assert_eq!(
        body_json(&h, c),
        json!([
            fact("web2", "os", "Debian", "production"),
            fact("web2", "pdbmux_source", "upstream-impostor", "production"),
            fact("web1", "os", "Ubuntu", "staging"),
            fact("web1", "kernel", "Linux", "staging"),
            fact("web3", "os", "Alpine", "production"),
        ])
    );
    insta::assert_snapshot!(transcript);
}

#[test]
fn facts_name_constraint_inside_a_subquery_still_injects() {
    let query = r#"["in","certname",["extract","certname",["select_facts",["=","name","os"]]]]"#;
    let a = json!([fact("web2", "os", "Debian", "production")]);
    let b = json!([fact("web1", "os", "Ubuntu", "staging")]);
    let mut h = harness(vec![
        member_backend(
            "pdb-a",
            URL_A,
            members(&[("web1", T10), ("web2", T10)]),
            vec![Reply::ok(a.to_string()).after(ms(4))],
        ),
        member_backend(
            "pdb-b",
            URL_B,
            members(&[("web1", T11)]),
            vec![Reply::ok(b.to_string()).after(ms(2))],
        ),
    ]);
    let c = h.get(&form_target("/pdb/query/v4/facts", &[("query", query)]));
    let transcript = run(&mut h);
    assert_eq!(
        body_json(&h, c),
        json!([
            fact("web2", "os", "Debian", "production"),
            source("web2", "pdb-a", "production"),
            fact("web1", "os", "Ubuntu", "staging"),
            source("web1", "pdb-b", "staging"),
        ])
    );
    let sends = exchange_sends(&h);
    let asked = pdbmux_conformance::read_asking(&pdbmux_conformance::Asked::of(&sends[0].request))
        .expect("readable");
    assert_eq!(
        asked.query,
        Some(serde_json::from_str::<Value>(query).expect("json")),
        "the query as sent: pdb-a's copy of web1 is dropped here"
    );
    insta::assert_snapshot!(transcript);
}

#[test]
fn facts_source_path_is_synthesised_from_the_facts_merge() {
    let mut h = shared_facts_harness(|_| {});
    let all = h.get("/pdb/query/v4/facts/pdbmux_source");
    let pinned = h.get("/pdb/query/v4/facts/pdbmux_source/pdb-b");
    let transcript = run(&mut h);
    assert_eq!(
        body_json(&h, all),
        json!([
            source("web2", "pdb-a", "production"),
            source("web1", "pdb-b", "staging"),
            source("web3", "pdb-b", "production"),
        ])
    );
    assert_eq!(
        body_json(&h, pinned),
        json!([
            source("web1", "pdb-b", "staging"),
            source("web3", "pdb-b", "production"),
        ])
    );
    for sent in exchange_sends(&h) {
        let path = sent.request.path_and_query.split('?').next().unwrap_or("");
        assert_eq!(path, "/pdb/query/v4/facts", "the /facts merge is asked");
    }
    insta::assert_snapshot!(transcript);
}

#[test]
fn facts_source_path_values_share_one_fetch_when_cached() {
    // With the cache on, the unfiltered path and every value asked meanwhile share one fetch.
    let mut h =
        shared_facts_harness(|config| config.facts_ttl = std::time::Duration::from_secs(30));
    let all = h.get("/pdb/query/v4/facts/pdbmux_source");
    let pinned = h.get("/pdb/query/v4/facts/pdbmux_source/pdb-a");
    let transcript = run(&mut h);
    assert_eq!(
        body_json(&h, all),
        json!([
            source("web2", "pdb-a", "production"),
            source("web1", "pdb-b", "staging"),
            source("web3", "pdb-b", "production"),
        ])
    );
    assert_eq!(
        body_json(&h, pinned),
        json!([source("web2", "pdb-a", "production")])
    );
    assert_eq!(exchange_sends(&h).len(), 2, "one /facts fan-out");
    insta::assert_snapshot!(transcript);
    // Each value is stored under its own key, already filtered: asked again, it is a hit (no
    // JSON work, no fan-out). A value no one asked for while the fetch was under way has no
    // entry yet and fetches once.
    let again = h.get("/pdb/query/v4/facts/pdbmux_source/pdb-a");
    let other = h.get("/pdb/query/v4/facts/pdbmux_source/pdb-b");
    run(&mut h);
    let again = h.response(again).expect("one response");
    assert_eq!(again.header("x-cache"), Some("hit"));
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&again.body_str()).expect("json"),
        json!([source("web2", "pdb-a", "production")])
    );
    assert_eq!(
        body_json(&h, other),
        json!([
            source("web1", "pdb-b", "staging"),
            source("web3", "pdb-b", "production"),
        ])
    );
    assert_eq!(
        h.response(other).expect("one").header("x-cache"),
        Some("miss")
    );
    assert_eq!(exchange_sends(&h).len(), 4, "one more fan-out, for pdb-b");
}

#[test]
fn facts_source_path_unknown_value_is_answered_without_fan_out() {
    let mut h = shared_facts_harness(|_| {});
    let c = h.get("/pdb/query/v4/facts/pdbmux_source/pdb-zzz");
    let transcript = run(&mut h);
    let response = h.response(c).expect("one response");
    assert_eq!(response.status, StatusCode::OK);
    assert_eq!(response.body_str(), "[]");
    assert!(h.sends().is_empty(), "no fan-out at all:\n{transcript}");
    assert_eq!(response.at, ms(0));
    insta::assert_snapshot!(transcript);
}

// ---------------------------------------------------------------------------------------------
// /fact-names, /environments, /reports, /events

#[test]
fn fact_names_union_sorted_paged_here_with_total() {
    let mut h = harness(vec![
        FakeBackend::always(
            "pdb-a",
            URL_A,
            Reply::ok(r#"["ipaddress","kernel","os"]"#).after(ms(2)),
        ),
        FakeBackend::always(
            "pdb-b",
            URL_B,
            Reply::ok(r#"["kernel","zone"]"#).after(ms(1)),
        ),
    ]);
    let whole = h.get("/pdb/query/v4/fact-names");
    let paged = h.get(&form_target(
        "/pdb/query/v4/fact-names",
        &[
            ("order_by", r#"[{"field":"name","order":"desc"}]"#),
            ("limit", "2"),
            ("offset", "1"),
            ("include_total", "true"),
        ],
    ));
    let transcript = run(&mut h);
    assert_eq!(
        body_json(&h, whole),
        json!(["ipaddress", "kernel", "os", "pdbmux_source", "zone"])
    );
    assert_eq!(body_json(&h, paged), json!(["pdbmux_source", "os"]));
    assert_eq!(
        h.response(paged).expect("one response").header("x-records"),
        Some("5")
    );
    for sent in h.sends() {
        let target = &sent.request.path_and_query;
        for param in ["limit", "offset", "include_total"] {
            assert!(!target.contains(param), "{target}");
        }
    }
    insta::assert_snapshot!(transcript);
}

#[test]
fn environments_union_sorted_by_name() {
    let mut h = harness(vec![
        FakeBackend::queue(
            "pdb-a",
            URL_A,
            [Reply::ok(r#"[{"name":"production"},{"name":"dev"}]"#).after(ms(2))],
        ),
        FakeBackend::queue(
            "pdb-b",
            URL_B,
            [Reply::ok(r#"[{"name":"staging"},{"name":"production"}]"#).after(ms(1))],
        ),
        FakeBackend::queue("pdb-c", URL_C, [Reply::ok("[]").after(ms(3))]),
    ]);
    let c = h.get("/pdb/query/v4/environments");
    let transcript = run(&mut h);
    let response = h.response(c).expect("one response");
    assert_eq!(
        response.body_str(),
        r#"[{"name":"dev"},{"name":"production"},{"name":"staging"}]"#
    );
    assert_eq!(response.header("x-backends"), Some("3/3"));
    insta::assert_snapshot!(transcript);
}

#[test]
fn packages_only_a_stale_copy_holds_are_not_listed() {
    // `moved` went from pdb-a to pdb-b and upgraded nginx there; pdb-a's packages still hold the
    // version its stale copy has. pdb-a is asked the packages of the nodes it owns (its package
    // inventory grouped by package, less `moved`); pdb-b, holding no one else's node, its
    // /packages as they are (docs/merging.md, "`/packages`").
    let inventory = |certname: &str, version: &str| json!({"certname": certname, "package_name": "nginx", "version": version, "provider": "apt"});
    let package =
        |version: &str| json!({"package_name": "nginx", "version": version, "provider": "apt"});
    let a = PuppetDb::new()
        .node("moved", T09)
        .node("stays", T09)
        .record("package-inventory", inventory("moved", "1.0"))
        .record("package-inventory", inventory("stays", "1.2"))
        .record("packages", package("1.0"))
        .record("packages", package("1.2"));
    let b = PuppetDb::new()
        .node("moved", T10)
        .record("package-inventory", inventory("moved", "1.1"))
        .record("packages", package("1.1"));
    let mut h = harness(vec![pdb("pdb-a", URL_A, a, 1), pdb("pdb-b", URL_B, b, 2)]);
    let c = h.get(&form_target(
        "/pdb/query/v4/packages",
        &[
            ("query", r#"["=","package_name","nginx"]"#),
            ("order_by", r#"[{"field":"version"}]"#),
        ],
    ));
    let transcript = run(&mut h);
    assert_eq!(body_json(&h, c), json!([package("1.1"), package("1.2")]));
    let sends = exchange_sends(&h);
    let asked: Vec<(String, Value)> = sends
        .iter()
        .map(|sent| {
            let asking =
                pdbmux_conformance::read_asking(&pdbmux_conformance::Asked::of(&sent.request))
                    .expect("readable");
            (asking.path, asking.query.unwrap_or(Value::Null))
        })
        .collect();
    assert_eq!(
        asked,
        [
            (
                "/pdb/query/v4/package-inventory".to_owned(),
                json!([
                    "extract",
                    ["package_name", "version", "provider"],
                    [
                        "and",
                        [
                            "and",
                            ["=", "package_name", "nginx"],
                            ["=", "node_state", "any"]
                        ],
                        ["not", ["in", "certname", ["array", ["moved"]]]]
                    ],
                    ["group_by", "package_name", "version", "provider"]
                ])
            ),
            (
                "/pdb/query/v4/packages".to_owned(),
                json!(["=", "package_name", "nginx"])
            ),
        ]
    );
    insta::assert_snapshot!(transcript);
}

#[test]
fn events_total_counts_the_events_of_a_report_stored_twice_once() {
    // Report r2 (two events) is stored in both backends: the total counts its events once. Each
    // backend's correction is the count of its events per report of nodes another backend
    // holds too, so the copies are subtracted by report, not by event.
    let event = |report: &str, title: &str, at: &str| {
        json!({"report": report, "certname": "web2", "resource_type": "File",
               "resource_title": title, "property": "content", "timestamp": at})
    };
    let a = json!([
        event("r2", "/b", "2024-05-01T11:00:02.000Z"),
        event("r2", "/a", "2024-05-01T11:00:01.000Z"),
    ]);
    let b = json!([
        event("r2", "/b", "2024-05-01T11:00:02.000Z"),
        event("r2", "/a", "2024-05-01T11:00:01.000Z"),
    ]);
    let twice = json!([{"report": "r2", "count": 2}]).to_string();
    let mut h = harness(vec![
        member_backend(
            "pdb-a",
            URL_A,
            members(&[("web2", T11)]),
            vec![
                Reply::ok(a.to_string())
                    .header("X-Records", "3")
                    .after(ms(2)),
                Reply::ok(twice.clone()).after(ms(2)),
            ],
        ),
        member_backend(
            "pdb-b",
            URL_B,
            members(&[("web2", T11)]),
            vec![
                Reply::ok(b.to_string())
                    .header("X-Records", "4")
                    .after(ms(1)),
                Reply::ok(twice).after(ms(1)),
            ],
        ),
    ]);
    let c = h.get(&form_target(
        "/pdb/query/v4/events",
        &[
            ("order_by", r#"[{"field":"timestamp","order":"desc"}]"#),
            ("limit", "2"),
            ("include_total", "true"),
        ],
    ));
    let transcript = run(&mut h);
    let response = h.response(c).expect("one response");
    assert_eq!(
        response.header("x-records"),
        Some("5"),
        "3 + 4, r2's two events once:\n{transcript}"
    );
    let corrections: Vec<String> = exchange_sends(&h)
        .iter()
        .map(|s| s.request.path_and_query.clone())
        .filter(|t| !t.contains("limit="))
        .collect();
    assert_eq!(corrections.len(), 2, "{transcript}");
    for target in &corrections {
        let decoded = pdbmux_conformance::decode_component(target);
        assert!(
            decoded.contains(r#"[["function","count"],"report"]"#)
                && decoded.contains(r#"["group_by","report"]"#),
            "{decoded}"
        );
    }
}

#[test]
fn reports_dedupe_by_hash_resorted_repaged_total_counts_a_report_stored_twice_once() {
    // h2 is stored in both backends: the window holds it once, and the total counts it once
    // (D16): each backend's X-Records, less the copies its correction (the hashes of its
    // reports of nodes another backend holds too) shows are stored twice.
    let report = |hash: &str, certname: &str, end: &str| json!({"hash": hash, "certname": certname, "end_time": end});
    let a = json!([
        report("h2", "web2", "2024-05-01T11:00:00.000Z"),
        report("h1", "web1", "2024-05-01T10:00:00.000Z"),
    ]);
    let b = json!([
        report("h2", "web2", "2024-05-01T11:00:00.000Z"),
        report("h4", "web4", "2024-05-01T10:30:00.000Z"),
        report("h3", "web3", "2024-05-01T09:00:00.000Z"),
    ]);
    let twice = json!([{"hash": "h2"}]).to_string();
    let mut h = harness(vec![
        member_backend(
            "pdb-a",
            URL_A,
            members(&[("web1", T10), ("web2", T11)]),
            vec![
                Reply::ok(a.to_string())
                    .header("X-Records", "2")
                    .after(ms(2)),
                Reply::ok(twice.clone()).after(ms(2)),
            ],
        ),
        member_backend(
            "pdb-b",
            URL_B,
            members(&[("web2", T11), ("web3", T09), ("web4", T10)]),
            vec![
                Reply::ok(b.to_string())
                    .header("X-Records", "5")
                    .after(ms(1)),
                Reply::ok(twice).after(ms(1)),
            ],
        ),
    ]);
    let c = h.get(&form_target(
        "/pdb/query/v4/reports",
        &[
            ("order_by", r#"[{"field":"end_time","order":"desc"}]"#),
            ("limit", "2"),
            ("offset", "1"),
            ("include_total", "true"),
        ],
    ));
    let transcript = run(&mut h);
    assert_eq!(
        body_json(&h, c),
        json!([
            report("h4", "web4", "2024-05-01T10:30:00.000Z"),
            report("h1", "web1", "2024-05-01T10:00:00.000Z"),
        ])
    );
    let response = h.response(c).expect("one response");
    assert_eq!(response.header("x-records"), Some("6"), "2 + 5, h2 once");
    let sends = exchange_sends(&h);
    let records: Vec<&str> = sends
        .iter()
        .map(|s| s.request.path_and_query.as_str())
        .filter(|t| t.contains("limit="))
        .collect();
    assert_eq!(records.len(), 2);
    for target in records {
        assert!(
            target.contains("limit=3") && !target.contains("offset"),
            "{target}"
        );
    }
    insta::assert_snapshot!(transcript);
}

#[test]
fn events_dedupe_by_verbatim_record() {
    let a = r#"[{"certname":"web1","resource_title":"ntp","status":"success"},{"certname":"web1","resource_title":"sshd","status":"success"}]"#;
    let b = r#"[{"certname":"web1","resource_title":"ntp","status":"success"},{"certname":"web1","resource_title":"sshd","status":"failure"}]"#;
    let mut h = harness(vec![
        FakeBackend::queue("pdb-a", URL_A, [Reply::ok(a).after(ms(2))]),
        FakeBackend::queue("pdb-b", URL_B, [Reply::ok(b).after(ms(1))]),
    ]);
    let c = h.get("/pdb/query/v4/events");
    let transcript = run(&mut h);
    assert_eq!(
        h.response(c).expect("one response").body_str(),
        r#"[{"certname":"web1","resource_title":"ntp","status":"success"},{"certname":"web1","resource_title":"sshd","status":"success"},{"certname":"web1","resource_title":"sshd","status":"failure"}]"#
    );
    insta::assert_snapshot!(transcript);
}

#[test]
fn a_latest_report_projection_keeps_the_rows_one_puppetdb_returns() {
    // D22: two events of web1's latest report project to the same row; one PuppetDB returns it
    // twice. pdbmux asks for the fields that tell events apart, dedupes on them, drops them.
    let event = |report: &str, title: &str| {
        json!({"certname": "web1", "report": report, "resource_type": "File",
               "resource_title": title, "property": "content"})
    };
    let b = json!([event("h2", "/etc/motd"), event("h2", "/etc/issue")]).to_string();
    let a = json!([event("h1", "/etc/motd")]).to_string();
    let mut h = harness(vec![
        member_backend(
            "pdb-a",
            URL_A,
            members(&[("web1", T10)]),
            vec![Reply::ok(a).after(ms(1))],
        ),
        member_backend(
            "pdb-b",
            URL_B,
            members(&[("web1", T11)]),
            vec![Reply::ok(b).after(ms(1))],
        ),
    ]);
    let c = h.get(&form_target(
        "/pdb/query/v4/events",
        &[(
            "query",
            r#"["extract",["certname"],["=","latest_report?",true]]"#,
        )],
    ));
    let transcript = run(&mut h);
    assert_eq!(
        body_json(&h, c),
        json!([{"certname": "web1"}, {"certname": "web1"}]),
        "{transcript}"
    );
    for send in exchange_sends(&h) {
        let asked = pdbmux_conformance::decode_component(&send.request.path_and_query);
        assert!(
            asked.contains(r#"["certname","report","resource_type","resource_title","property"]"#),
            "{asked}"
        );
    }
}

#[test]
fn facts_paged_window_is_exact_despite_an_upstream_source_fact() {
    // pdb-a holds an upstream fact named pdbmux_source; it is dropped (docs/merging.md, "Provenance"), but it took one of
    // the `offset + limit` records pdb-a was asked for, so web4's fact never arrives. A single
    // PuppetDB holding the whole estate (minus the dropped record) answers both records.
    let a = PuppetDb::new()
        .node("web2", T10)
        .node("web4", T10)
        .fact("web2", "os", "Debian", "production")
        .fact("web2", "pdbmux_source", "upstream-impostor", "production")
        .fact("web4", "os", "Debian", "production");
    let b = PuppetDb::new();
    let mut h = harness(vec![pdb("pdb-a", URL_A, a, 1), pdb("pdb-b", URL_B, b, 1)]);
    let c = h.get(&form_target(
        "/pdb/query/v4/facts",
        &[
            ("order_by", r#"[{"field":"certname"},{"field":"name"}]"#),
            ("limit", "2"),
        ],
    ));
    let transcript = run(&mut h);
    assert_eq!(
        body_json(&h, c),
        json!([
            fact("web2", "os", "Debian", "production"),
            fact("web4", "os", "Debian", "production"),
        ]),
        "{transcript}"
    );
}

// ---------------------------------------------------------------------------------------------
// The other node-owned entities (D15): one merge, the entity table's row for each

/// The node-owned entities besides /nodes and /facts, by path segment.
const OWNED_ENTITIES: [&str; 9] = [
    "resources",
    "fact-contents",
    "factsets",
    "catalogs",
    "catalog-inputs",
    "catalog-input-contents",
    "edges",
    "inventory",
    "package-inventory",
];

/// pdb-a and pdb-b holding `shared` (newer in pdb-b), `tie` (the same report in both; its facts
/// produced later in pdb-b, its catalog later in pdb-a, D14; pdb-a processed its facts last)
/// and one node of their own, with one `entity` record per node naming the backend it came from.
fn owned_entity_backends(entity: &str) -> (PuppetDb, PuppetDb) {
    let record = |certname: &str, backend: &str| json!({"certname": certname, "backend": backend});
    let mut a = PuppetDb::new()
        .node("only-a", T09)
        .node("shared", T10)
        .node("tie", T10)
        .produced("factsets", "tie", Some("2024-05-01T09:58:00.000Z"))
        .produced("catalogs", "tie", Some("2024-05-01T09:59:30.000Z"));
    let mut b = PuppetDb::new()
        .node("shared", T11)
        .node("tie", T10)
        .node("only-b", T09)
        .produced("factsets", "tie", Some("2024-05-01T09:59:00.000Z"))
        .produced("catalogs", "tie", Some("2024-05-01T09:59:10.000Z"));
    // Receive times are no evidence: pdb-a received tie's older facts last.
    a.nodes[2]["facts_timestamp"] = json!("2024-05-01T10:05:00.000Z");
    b.nodes[1]["facts_timestamp"] = json!("2024-05-01T10:01:00.000Z");
    for certname in ["only-a", "shared", "tie"] {
        a = a.record(entity, record(certname, "pdb-a"));
    }
    for certname in ["shared", "tie", "only-b"] {
        b = b.record(entity, record(certname, "pdb-b"));
    }
    (a, b)
}

#[test]
fn every_node_owned_entity_is_answered_from_each_nodes_owner() {
    for entity in OWNED_ENTITIES {
        let path = format!("/pdb/query/v4/{entity}");
        let (a, b) = owned_entity_backends(entity);
        let mut h = harness(vec![pdb("pdb-a", URL_A, a, 2), pdb("pdb-b", URL_B, b, 3)]);
        // Unpaged: every backend is asked the client's question; the copies of nodes another
        // backend owns are dropped here, and nothing is pushed into the query.
        let whole = h.get(&path);
        // Paged across the overlap, with a total: over-fetched, cut after the merge, exact.
        let paged = h.get(&form_target(
            &path,
            &[
                ("order_by", r#"[{"field":"certname","order":"desc"}]"#),
                ("limit", "2"),
                ("offset", "1"),
                ("include_total", "true"),
            ],
        ));
        let transcript = run(&mut h);
        let owned =
            |certname: &str, backend: &str| json!({"certname": certname, "backend": backend});
        // tie's facts are newest in pdb-b, its catalog in pdb-a: each entity follows its kind.
        let tie_owner = match entity {
            "resources" | "catalogs" | "catalog-inputs" | "catalog-input-contents" | "edges" => {
                "pdb-a"
            }
            _ => "pdb-b",
        };
        let mut got = body_json(&h, whole).as_array().cloned().unwrap_or_default();
        got.sort_by_key(|r| r["certname"].to_string());
        assert_eq!(
            Value::Array(got),
            json!([
                owned("only-a", "pdb-a"),
                owned("only-b", "pdb-b"),
                owned("shared", "pdb-b"),
                owned("tie", tie_owner),
            ]),
            "{entity}: each node from its owner"
        );
        assert_eq!(
            body_json(&h, paged),
            json!([owned("shared", "pdb-b"), owned("only-b", "pdb-b")]),
            "{entity}: the window of tie, shared, only-b, only-a"
        );
        let response = h.response(paged).expect("one response");
        assert_eq!(
            response.header("x-records"),
            Some("4"),
            "{entity}: exact total"
        );
        for send in exchange_sends(&h) {
            let target = &send.request.path_and_query;
            assert!(!target.contains("offset"), "{entity}: {target}");
        }
        insta::assert_snapshot!(format!("owned_entity_{entity}"), transcript);
    }
}

/// `target` with its query value percent-encoded.
fn with_query(path: &str, query: &Value, rest: &str) -> String {
    let encoded: String = form_urlencoded::byte_serialize(query.to_string().as_bytes()).collect();
    format!("{path}?query={encoded}{rest}")
}

/// A sub-route below an environment or a producer is its entity's route with the parent's
/// constraint added as PuppetDB adds it (D21): the same answer, headers and upstream requests
/// as the entity's own route asked with that constraint, paging, totals, extract and provenance
/// included; a query that is PQL is passed through for PuppetDB to refuse.
#[test]
fn a_sub_route_below_an_environment_or_producer_is_its_entity_with_that_constraint() {
    let staging = json!(["=", "environment", "staging"]);
    let os = json!(["=", "name", "os"]);
    let extract = json!(["extract", ["certname", "value"], ["=", "name", "os"]]);
    let cases = [
        (
            "/pdb/query/v4/environments/staging/facts".to_owned(),
            with_query("/pdb/query/v4/facts", &staging, ""),
        ),
        (
            with_query(
                "/pdb/query/v4/environments/staging/facts",
                &os,
                "&limit=1&include_total=true&order_by=%5B%7B%22field%22%3A%22certname%22%7D%5D",
            ),
            with_query(
                "/pdb/query/v4/facts",
                &json!(["and", os, staging]),
                "&limit=1&include_total=true&order_by=%5B%7B%22field%22%3A%22certname%22%7D%5D",
            ),
        ),
        (
            with_query("/pdb/query/v4/environments/production/facts", &extract, ""),
            with_query(
                "/pdb/query/v4/facts",
                &json!([
                    "extract",
                    ["certname", "value"],
                    [
                        "and",
                        ["=", "name", "os"],
                        ["=", "environment", "production"]
                    ]
                ]),
                "",
            ),
        ),
        (
            "/pdb/query/v4/environments/staging/facts/os".to_owned(),
            with_query("/pdb/query/v4/facts/os", &staging, ""),
        ),
    ];
    for (sub_route, entity_route) in cases {
        let mut below = shared_facts_harness(|_| {});
        let c = below.get(&sub_route);
        finish(&mut below);
        let mut direct = shared_facts_harness(|_| {});
        let d = direct.get(&entity_route);
        finish(&mut direct);
        let (got, want) = (
            below.response(c).expect("answered"),
            direct.response(d).expect("answered"),
        );
        assert_eq!(
            got.status,
            StatusCode::OK,
            "{sub_route}: {}",
            got.body_str()
        );
        assert_eq!(got.body_str(), want.body_str(), "{sub_route}");
        assert_eq!(
            got.header("x-records"),
            want.header("x-records"),
            "{sub_route}"
        );
        assert_eq!(got.header("x-backends"), Some("2/2"), "{sub_route}");
        if sub_route.ends_with("/environments/staging/facts") {
            let body = got.body_str();
            assert!(
                body.contains(r#""pdbmux_source""#) && !body.contains("production"),
                "staging's facts only, provenance included: {body}"
            );
        }
        let upstream = |h: &Harness| -> Vec<String> {
            exchange_sends(h)
                .iter()
                .map(|s| s.request.path_and_query.clone())
                .filter(|target| !target.starts_with("/pdb/query/v4/environments/"))
                .collect()
        };
        assert_eq!(upstream(&below), upstream(&direct), "{sub_route}");
        // The parent is asked of every backend at the same time (the 404 check below).
        let parent = format!(
            "/pdb/query/v4/environments/{}",
            sub_route.split('/').nth(5).expect("an environment segment")
        );
        let parents = exchange_sends(&below)
            .iter()
            .filter(|s| s.request.path_and_query == parent)
            .count();
        assert_eq!(parents, 2, "{sub_route}: the parent asked of each backend");
    }
    // PQL below an environment is no query PuppetDB takes there: passed through as it is.
    let mut h = shared_facts_harness(|_| {});
    h.get("/pdb/query/v4/environments/staging/facts?query=facts%20%7B%7D");
    finish(&mut h);
    let sends = exchange_sends(&h);
    assert!(
        sends[0]
            .request
            .path_and_query
            .starts_with("/pdb/query/v4/environments/staging/facts?query="),
        "{:?}",
        sends[0].request.path_and_query
    );
}

/// Below an environment no backend knows, a sub-route is PuppetDB's 404 ("No information is
/// known about environment …"), whatever the query (an empty list, a count of 0 or a page would
/// say the environment exists); one backend knowing it is enough for the merged answer.
#[test]
fn a_sub_route_below_an_environment_no_backend_knows_is_not_found() {
    let count = json!(["extract", [["function", "count"]]]);
    for target in [
        "/pdb/query/v4/environments/nowhere/facts".to_owned(),
        with_query("/pdb/query/v4/environments/nowhere/facts", &count, ""),
        "/pdb/query/v4/environments/nowhere/facts/os?limit=5&include_total=true".to_owned(),
    ] {
        let mut h = shared_facts_harness(|_| {});
        let c = h.get(&target);
        finish(&mut h);
        let got = h.response(c).expect("answered");
        assert_eq!(
            got.status,
            StatusCode::NOT_FOUND,
            "{target}: {}",
            got.body_str()
        );
        assert_eq!(
            serde_json::from_str::<Value>(&got.body_str()).expect("JSON"),
            json!({"error": "No information is known about environment nowhere"}),
            "{target}"
        );
    }
    // `staging` is known to pdb-b alone: the merge answers, from both.
    let mut h = shared_facts_harness(|_| {});
    let c = h.get(&with_query(
        "/pdb/query/v4/environments/staging/facts",
        &count,
        "",
    ));
    finish(&mut h);
    let got = h.response(c).expect("answered");
    assert_eq!(got.status, StatusCode::OK, "{}", got.body_str());
    assert_eq!(got.header("x-backends"), Some("2/2"));
}

/// The provenance fact asked for by name, or by name and value, on `/facts` (what Puppetboard's
/// fact pages send, its value links included) answers as the fact's own path does: the backends
/// hold no such fact, so a plain `/facts` query would answer nothing.
#[test]
fn the_provenance_fact_by_name_and_value_on_facts_answers_as_its_own_path() {
    let by_name = json!(["=", "name", "pdbmux_source"]);
    let cases = [
        (
            with_query("/pdb/query/v4/facts", &by_name, ""),
            "/pdb/query/v4/facts/pdbmux_source",
        ),
        (
            with_query(
                "/pdb/query/v4/facts",
                &json!([
                    "and",
                    ["=", "name", "pdbmux_source"],
                    ["=", "value", "pdb-a"]
                ]),
                "",
            ),
            "/pdb/query/v4/facts/pdbmux_source/pdb-a",
        ),
        (
            with_query(
                "/pdb/query/v4/facts",
                &json!([
                    "and",
                    ["=", "value", "pdb-b"],
                    ["=", "name", "pdbmux_source"]
                ]),
                "",
            ),
            "/pdb/query/v4/facts/pdbmux_source/pdb-b",
        ),
    ];
    for (asked, own_path) in cases {
        let mut h = shared_facts_harness(|_| {});
        let c = h.get(&asked);
        finish(&mut h);
        let mut direct = shared_facts_harness(|_| {});
        let d = direct.get(own_path);
        finish(&mut direct);
        let got = body_json(&h, c);
        assert_eq!(got, body_json(&direct, d), "{asked}");
        let rows = got.as_array().expect("an array");
        assert!(!rows.is_empty(), "{asked}: {got}");
        assert!(
            rows.iter().all(|row| row["name"] == "pdbmux_source"),
            "{asked}: {got}"
        );
    }
    // Another fact by name and value is a plain /facts query.
    let mut h = shared_facts_harness(|_| {});
    let asked = with_query(
        "/pdb/query/v4/facts",
        &json!(["and", ["=", "name", "os"], ["=", "value", "Debian"]]),
        "",
    );
    let c = h.get(&asked);
    finish(&mut h);
    let got = body_json(&h, c);
    assert!(
        got.as_array()
            .is_some_and(|rows| !rows.is_empty() && rows.iter().all(|r| r["name"] == "os")),
        "{got}"
    );
}

/// The estate of [`shared_facts`] plus a third backend, pdb-c, owning web4: for value
/// constraints that name some backends but not all.
fn three_backends_facts_harness(
    configure: impl FnOnce(&mut pdbmux_core::config::Config),
) -> Harness {
    let (a, b) = shared_facts();
    let c = PuppetDb::new()
        .node("web4", T09)
        .fact("web4", "os", "Debian", "staging");
    Harness::with_config(
        vec![
            pdb("pdb-a", URL_A, a, 4),
            pdb("pdb-b", URL_B, b, 2),
            pdb("pdb-c", URL_C, c, 3),
        ],
        configure,
    )
    .expect("valid test backends")
}

fn by_source_value(constraint: Value) -> String {
    with_query(
        "/pdb/query/v4/facts",
        &json!(["and", ["=", "name", "pdbmux_source"], constraint]),
        "",
    )
}

/// The provenance fact's value constrained with `in` or `~` (pypuppetdb and hand-written
/// queries) answers the records of the backends whose names meet it, cached or not; a
/// constraint no name meets answers `[]` without a fan-out; one that meets every name, or one,
/// is the fact's own path; a regular expression pdbmux cannot read is a 400.
#[test]
fn the_provenance_fact_value_under_in_and_regex_keeps_the_backends_it_names() {
    let a_and_c = json!([
        source("web2", "pdb-a", "production"),
        source("web4", "pdb-c", "staging"),
    ]);
    let constraints = [
        json!(["in", "value", ["array", ["pdb-a", "pdb-c", "pdb-zzz"]]]),
        json!(["~", "value", "^pdb-[ac]$"]),
    ];
    for ttl in [0, 30] {
        for constraint in &constraints {
            let mut h = three_backends_facts_harness(|config| {
                config.facts_ttl = std::time::Duration::from_secs(ttl);
            });
            let c = h.get(&by_source_value(constraint.clone()));
            let all = h.get("/pdb/query/v4/facts/pdbmux_source");
            finish(&mut h);
            assert_eq!(body_json(&h, c), a_and_c, "{constraint} (facts_ttl {ttl}s)");
            assert_eq!(
                body_json(&h, all).as_array().map(Vec::len),
                Some(4),
                "the whole path is not narrowed (facts_ttl {ttl}s)"
            );
            if ttl > 0 {
                assert_eq!(exchange_sends(&h).len(), 3, "one /facts fan-out shared");
                let again = h.get(&by_source_value(constraint.clone()));
                finish(&mut h);
                let again = h.response(again).expect("one response");
                assert_eq!(again.header("x-cache"), Some("hit"), "{constraint}");
                assert_eq!(
                    serde_json::from_str::<Value>(&again.body_str()).expect("json"),
                    a_and_c
                );
            }
        }
    }
    // No backend's name: [] at once. Every name, or one: the fact's own path.
    let mut h = three_backends_facts_harness(|_| {});
    let none = h.get(&by_source_value(json!(["~", "value", "^nosuch"])));
    let every = h.get(&by_source_value(json!(["~", "value", "^pdb-"])));
    let one = h.get(&by_source_value(json!([
        "in",
        "value",
        ["array", ["pdb-b"]]
    ])));
    finish(&mut h);
    assert_eq!(h.response(none).expect("one").body_str(), "[]");
    assert_eq!(body_json(&h, every).as_array().map(Vec::len), Some(4));
    assert_eq!(
        body_json(&h, one),
        json!([
            source("web1", "pdb-b", "staging"),
            source("web3", "pdb-b", "production"),
        ])
    );
    let mut h = three_backends_facts_harness(|_| {});
    let bad = h.get(&by_source_value(json!(["~", "value", "(unclosed"])));
    finish(&mut h);
    let bad = h.response(bad).expect("one response");
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    assert!(
        bad.body_str().contains("regular expression"),
        "{}",
        bad.body_str()
    );
    assert!(exchange_sends(&h).is_empty());
}

/// Puppetboard's fact value page asks the fact's own path with the value (and the environment
/// chosen, unless every one) in the query: `/facts/pdbmux_source?query=["and",
/// ["=","environment",env],["=","value",v]]`. The value is pdbmux's to decide, the environment
/// the backends'; the same for a `/facts` query naming the fact among other clauses.
#[test]
fn the_provenance_fact_value_in_a_query_on_its_own_path_keeps_the_backends_it_names() {
    let on_path = |query: Value| with_query("/pdb/query/v4/facts/pdbmux_source", &query, "");
    let cases = [
        (
            on_path(json!([
                "and",
                ["=", "environment", "production"],
                ["=", "value", "pdb-a"]
            ])),
            json!([source("web2", "pdb-a", "production")]),
        ),
        (
            on_path(json!(["and", ["=", "value", "pdb-a"]])),
            json!([source("web2", "pdb-a", "production")]),
        ),
        (
            on_path(json!([
                "and",
                ["=", "environment", "staging"],
                ["in", "value", ["array", ["pdb-b", "pdb-c"]]]
            ])),
            json!([
                source("web1", "pdb-b", "staging"),
                source("web4", "pdb-c", "staging"),
            ]),
        ),
        (
            on_path(json!([
                "and",
                ["=", "environment", "production"],
                ["=", "value", "pdb-c"]
            ])),
            json!([]),
        ),
        (
            with_query(
                "/pdb/query/v4/facts",
                &json!([
                    "and",
                    ["=", "environment", "production"],
                    ["=", "name", "pdbmux_source"],
                    ["=", "value", "pdb-b"]
                ]),
                "",
            ),
            json!([source("web3", "pdb-b", "production")]),
        ),
        (
            with_query(
                "/pdb/query/v4/facts",
                &json!([
                    "and",
                    ["=", "name", "pdbmux_source"],
                    ["=", "environment", "staging"]
                ]),
                "",
            ),
            json!([
                source("web1", "pdb-b", "staging"),
                source("web4", "pdb-c", "staging"),
            ]),
        ),
    ];
    for ttl in [0, 30] {
        for (asked, want) in &cases {
            let mut h = three_backends_facts_harness(|config| {
                config.facts_ttl = std::time::Duration::from_secs(ttl);
            });
            let c = h.get(asked);
            finish(&mut h);
            let mut got = body_json(&h, c);
            if let Some(rows) = got.as_array_mut() {
                rows.sort_by_key(|row| row["certname"].as_str().map(str::to_owned));
            }
            assert_eq!(&got, want, "{asked} (facts_ttl {ttl}s)");
        }
    }
}

/// Any constraint on the provenance fact's name or value, anywhere in the query, is decided by
/// pdbmux for the fact (its value the facts owner's name), per backend, and the rest of the
/// query by the backends: the answer is what one PuppetDB holding the fact would give. A `not`
/// on the name, a value below an `or` (a part per backend: each keeps its own), a value below a
/// `not`, its own path with a name or value clause, and an environment's sub-route.
#[test]
fn the_provenance_fact_under_any_constraint_is_what_one_puppetdb_holding_it_would_answer() {
    let facts = |query: Value| with_query("/pdb/query/v4/facts", &query, "");
    let path =
        |below: &str, query: Value| with_query(&format!("/pdb/query/v4/{below}"), &query, "");
    let cases = [
        (
            facts(json!([
                "and",
                ["not", ["in", "name", ["array", ["kernel", "os"]]]],
                ["=", "environment", "production"]
            ])),
            json!([
                source("web2", "pdb-a", "production"),
                source("web3", "pdb-b", "production"),
            ]),
        ),
        (
            facts(json!([
                "and",
                ["=", "name", "pdbmux_source"],
                [
                    "or",
                    ["=", "value", "pdb-a"],
                    ["=", "environment", "staging"]
                ]
            ])),
            json!([
                source("web2", "pdb-a", "production"),
                source("web1", "pdb-b", "staging"),
            ]),
        ),
        (
            facts(json!([
                "and",
                ["~", "name", "source$"],
                ["not", ["=", "value", "pdb-a"]]
            ])),
            json!([
                source("web1", "pdb-b", "staging"),
                source("web3", "pdb-b", "production"),
            ]),
        ),
        (
            path("facts/pdbmux_source", json!(["=", "name", "pdbmux_source"])),
            json!([
                source("web2", "pdb-a", "production"),
                source("web1", "pdb-b", "staging"),
                source("web3", "pdb-b", "production"),
            ]),
        ),
        (
            path(
                "facts/pdbmux_source/pdb-b",
                json!([
                    "and",
                    ["=", "value", "pdb-b"],
                    ["=", "environment", "production"]
                ]),
            ),
            json!([source("web3", "pdb-b", "production")]),
        ),
        (
            path("facts/pdbmux_source", json!(["=", "name", "kernel"])),
            json!([]),
        ),
        (
            path(
                "environments/staging/facts",
                json!([
                    "or",
                    ["=", "name", "kernel"],
                    ["=", "name", "pdbmux_source"]
                ]),
            ),
            json!([
                fact("web1", "kernel", "Linux", "staging"),
                source("web1", "pdb-b", "staging"),
            ]),
        ),
    ];
    for ttl in [0, 30] {
        for (asked, want) in &cases {
            let mut h = shared_facts_harness(|config| {
                config.facts_ttl = std::time::Duration::from_secs(ttl);
            });
            let c = h.get(asked);
            finish(&mut h);
            assert_eq!(&body_json(&h, c), want, "{asked} (facts_ttl {ttl}s)");
            let response = h.response(c).expect("one response");
            // A name no fact has is answered at once, asking nobody.
            let counted = (want != &json!([])).then_some("2/2");
            assert_eq!(response.header("x-backends"), counted, "{asked}");
        }
    }
}

/// Puppetboard's inventory asks `/facts` for its facts by name, `["or",["=","name",f],…]`
/// (with the environment chosen, unless every one): with the provenance fact among them the
/// answer is the other facts' records, each node's from its owner, then the provenance record
/// of every node the rest of the query admits, as `/facts/pdbmux_source` answers it. The same
/// for `in` over names and a pattern on the name that the provenance fact's matches; a
/// constraint naming only the provenance fact is its own path.
#[test]
fn the_provenance_fact_named_beside_other_facts_is_answered_with_them() {
    let facts = |query: Value| with_query("/pdb/query/v4/facts", &query, "");
    let cases = [
        (
            facts(json!([
                "and",
                ["or", ["=", "name", "os"], ["=", "name", "pdbmux_source"]],
                ["=", "environment", "production"]
            ])),
            json!([
                fact("web2", "os", "Debian", "production"),
                fact("web3", "os", "Alpine", "production"),
                source("web2", "pdb-a", "production"),
                source("web3", "pdb-b", "production"),
            ]),
        ),
        (
            facts(json!([
                "or",
                ["=", "name", "kernel"],
                ["=", "name", "pdbmux_source"],
                ["=", "name", "os"]
            ])),
            json!([
                fact("web2", "os", "Debian", "production"),
                fact("web1", "os", "Ubuntu", "staging"),
                fact("web1", "kernel", "Linux", "staging"),
                fact("web3", "os", "Alpine", "production"),
                source("web2", "pdb-a", "production"),
                source("web1", "pdb-b", "staging"),
                source("web3", "pdb-b", "production"),
            ]),
        ),
        (
            facts(json!([
                "and",
                ["in", "name", ["array", ["pdbmux_source", "kernel"]]],
                ["=", "certname", "web1"]
            ])),
            json!([
                fact("web1", "kernel", "Linux", "staging"),
                source("web1", "pdb-b", "staging"),
            ]),
        ),
        (
            facts(json!([
                "and",
                ["in", "name", ["array", ["pdbmux_source"]]],
                ["=", "environment", "staging"]
            ])),
            json!([source("web1", "pdb-b", "staging")]),
        ),
        (
            facts(json!(["~", "name", "^(pdbmux|kern)"])),
            json!([
                fact("web1", "kernel", "Linux", "staging"),
                source("web2", "pdb-a", "production"),
                source("web1", "pdb-b", "staging"),
                source("web3", "pdb-b", "production"),
            ]),
        ),
        (
            facts(json!([
                "and",
                ["~", "name", "^(pdbmux|kern)"],
                ["=", "environment", "staging"]
            ])),
            json!([
                fact("web1", "kernel", "Linux", "staging"),
                source("web1", "pdb-b", "staging"),
            ]),
        ),
    ];
    for ttl in [0, 30] {
        for (asked, want) in &cases {
            let mut h = shared_facts_harness(|config| {
                config.facts_ttl = std::time::Duration::from_secs(ttl);
            });
            let c = h.get(asked);
            finish(&mut h);
            assert_eq!(&body_json(&h, c), want, "{asked} (facts_ttl {ttl}s)");
            let response = h.response(c).expect("one response");
            assert_eq!(response.header("x-backends"), Some("2/2"), "{asked}");
            // The provenance part asks each backend its nodes, never every fact of them.
            for sent in exchange_sends(&h) {
                let query = sent
                    .request
                    .path_and_query
                    .split_once("query=")
                    .map(|q| q.1);
                let query = pdbmux_conformance::decode_component(query.unwrap_or_default());
                assert!(
                    query.contains("\"name\"") || query.starts_with("[\"extract\""),
                    "{asked}: sent {query}"
                );
            }
        }
    }
}

/// The provenance fact named beside other facts, one backend timing out: both parts answer
/// from the survivor, each node it owns once, and the answer says it is partial.
#[test]
fn the_provenance_fact_beside_other_facts_with_a_backend_timing_out_is_partial() {
    let (a, _) = shared_facts();
    let members_of_b = members(&[("web1", T11), ("web3", None)]);
    // pdb-b answers neither part (its records nor its nodes).
    let mut h = harness(vec![
        pdb("pdb-a", URL_A, a, 4),
        member_backend(
            "pdb-b",
            URL_B,
            members_of_b,
            vec![Reply::never(), Reply::never()],
        ),
    ]);
    let c = h.get(&with_query(
        "/pdb/query/v4/facts",
        &json!(["or", ["=", "name", "os"], ["=", "name", "pdbmux_source"]]),
        "",
    ));
    let transcript = run(&mut h);
    let response = h.response(c).expect("one response");
    assert_eq!(response.status, StatusCode::OK);
    assert_eq!(response.header("x-backends"), Some("1/2"));
    // pdb-a was told web1 is pdb-b's, so only web2 is served, in both parts.
    assert_eq!(
        body_json(&h, c),
        json!([
            fact("web2", "os", "Debian", "production"),
            source("web2", "pdb-a", "production"),
        ])
    );
    insta::assert_snapshot!(transcript);
}
