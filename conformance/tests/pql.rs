//! The root query endpoint (docs/merging.md, "PQL and the root endpoint"; docs/decisions.md
//! D17): PQL is translated by the first backend that answers `ast_only=true`, kept, and the
//! `["from", …]` AST is answered as its entity's own route answers it; a `from` AST sent by the
//! client takes the same path without the translation. Refusals are PuppetDB's own.

mod common;

use common::{finish, harness, URL_A, URL_B};
use http::StatusCode;
use pdbmux_conformance::{
    decoded_upstream, form_target, ms, FakeBackend, Harness, PuppetDb, Reply,
};
use serde_json::{json, Value};

const T09: Option<&str> = Some("2024-05-01T09:00:00.000Z");
const T10: Option<&str> = Some("2024-05-01T10:00:00.000Z");
const T11: Option<&str> = Some("2024-05-01T11:00:00.000Z");

const ROOT: &str = "/pdb/query/v4";

/// Two PuppetDBs sharing `shared` (newer in pdb-b), each with a node of its own, a `kernel` fact
/// per node, and both knowing `translations`.
fn estate(translations: &[(&str, Value)]) -> (PuppetDb, PuppetDb) {
    let mut a = PuppetDb::new()
        .node("only-a", T09)
        .node("shared", T10)
        .fact("only-a", "kernel", "Linux", "production")
        .fact("shared", "kernel", "Linux", "production");
    let mut b = PuppetDb::new()
        .node("shared", T11)
        .node("only-b", T10)
        .fact("shared", "kernel", "Linux", "production")
        .fact("only-b", "kernel", "Linux", "production");
    for (pql, ast) in translations {
        a = a.translation(pql, ast.clone());
        b = b.translation(pql, ast.clone());
    }
    (a, b)
}

fn backends(translations: &[(&str, Value)]) -> Vec<FakeBackend> {
    let (a, b) = estate(translations);
    vec![
        FakeBackend::puppetdb("pdb-a", URL_A, a, ms(2)),
        FakeBackend::puppetdb("pdb-b", URL_B, b, ms(3)),
    ]
}

fn pql(h: &mut Harness, text: &str) -> pdbmux_conformance::ClientId {
    h.get(&form_target(ROOT, &[("query", text)]))
}

fn body_json(h: &Harness, client: pdbmux_conformance::ClientId) -> Value {
    let response = h.response(client).expect("one response");
    serde_json::from_slice(&response.body)
        .unwrap_or_else(|e| panic!("{e}: {}", response.body_str()))
}

/// The root-endpoint requests the backends were sent (the translations).
fn translations_asked(h: &Harness) -> usize {
    h.sends()
        .iter()
        .filter(|s| s.request.path_and_query.starts_with(&format!("{ROOT}?")))
        .count()
}

fn node(certname: &str) -> Value {
    json!({ "certname": certname })
}

#[test]
fn pql_is_translated_by_the_first_backend_then_merged_like_its_entity_route() {
    let text = "nodes[certname] { order by certname desc limit 2 offset 1 }";
    let ast = json!([
        "from",
        "nodes",
        ["extract", ["certname"]],
        ["order_by", [["certname", "desc"]]],
        ["limit", 2],
        ["offset", 1]
    ]);
    let mut h = harness(backends(&[(text, ast)]));
    let c = pql(&mut h, text);
    let transcript = finish(&mut h);
    // The estate: only-a, only-b, shared (each once): certname desc is shared, only-b, only-a.
    assert_eq!(body_json(&h, c), json!([node("only-b"), node("only-a")]));
    assert_eq!(translations_asked(&h), 1, "one translation, from pdb-a");
    insta::assert_snapshot!(format!(
        "{transcript}--- upstream, decoded\n{}",
        decoded_upstream(&h, 400)
    ));
    // Asked again, the kept translation answers: no root request this time.
    let again = pql(&mut h, text);
    finish(&mut h);
    assert_eq!(
        body_json(&h, again),
        json!([node("only-b"), node("only-a")])
    );
    assert_eq!(translations_asked(&h), 1, "the translation was kept");
}

#[test]
fn pql_and_the_same_ast_share_one_cache_entry() {
    let mut h = Harness::with_config(backends(&[("nodes {}", json!(["from", "nodes"]))]), |c| {
        c.facts_ttl = std::time::Duration::from_secs(30)
    })
    .expect("valid backends");
    let by_pql = pql(&mut h, "nodes {}");
    finish(&mut h);
    let by_from = h.get(&form_target(ROOT, &[("query", r#"["from","nodes"]"#)]));
    let by_route = h.get("/pdb/query/v4/nodes");
    finish(&mut h);
    assert_eq!(
        h.response(by_pql).expect("one").header("x-cache"),
        Some("miss")
    );
    for client in [by_from, by_route] {
        assert_eq!(
            h.response(client).expect("one").header("x-cache"),
            Some("hit")
        );
        assert_eq!(body_json(&h, client), body_json(&h, by_pql));
    }
    assert_eq!(
        body_json(&h, by_pql).as_array().map(Vec::len),
        Some(3),
        "each node once"
    );
}

#[test]
fn a_pql_count_is_folded_with_each_node_counted_once() {
    let text = r#"facts[count()] { name = "kernel" }"#;
    let ast = json!([
        "from",
        "facts",
        ["extract", [["function", "count"]], ["=", "name", "kernel"]]
    ]);
    let mut h = harness(backends(&[(text, ast)]));
    let c = pql(&mut h, text);
    finish(&mut h);
    // Four kernel facts are stored, one of them a copy of shared's: three nodes, three facts.
    assert_eq!(body_json(&h, c), json!([{ "count": 3 }]));
}

#[test]
fn pql_facts_carry_the_provenance_of_facts() {
    let mut h = harness(backends(&[("facts {}", json!(["from", "facts"]))]));
    let c = pql(&mut h, "facts {}");
    finish(&mut h);
    let sources: Vec<(String, String)> = body_json(&h, c)
        .as_array()
        .expect("records")
        .iter()
        .filter(|r| r["name"] == "pdbmux_source")
        .map(|r| (r["certname"].to_string(), r["value"].to_string()))
        .collect();
    assert_eq!(
        sources,
        [
            (r#""only-a""#.to_owned(), r#""pdb-a""#.to_owned()),
            (r#""shared""#.to_owned(), r#""pdb-b""#.to_owned()),
            (r#""only-b""#.to_owned(), r#""pdb-b""#.to_owned()),
        ]
    );
}

#[test]
fn a_from_ast_with_each_clause_is_answered_as_its_route() {
    let from = json!([
        "from",
        "nodes",
        ["not", ["=", "certname", "only-a"]],
        ["order_by", ["certname"]],
        ["limit", 1],
        ["offset", 1]
    ]);
    let mut h = harness(backends(&[]));
    let c = h.get(&form_target(
        ROOT,
        &[("query", &from.to_string()), ("include_total", "true")],
    ));
    let transcript = finish(&mut h);
    let records = body_json(&h, c);
    assert_eq!(records.as_array().map(Vec::len), Some(1));
    assert_eq!(
        records[0]["certname"], "shared",
        "only-b, shared: the second"
    );
    assert_eq!(h.response(c).expect("one").header("x-records"), Some("2"));
    assert_eq!(translations_asked(&h), 0, "an AST needs no translation");
    insta::assert_snapshot!(format!(
        "{transcript}--- upstream, decoded\n{}",
        decoded_upstream(&h, 400)
    ));
}

#[test]
fn a_pql_syntax_error_is_puppetdbs_own_400() {
    let mut h = harness(backends(&[]));
    let c = pql(&mut h, "nodes[certname { }");
    finish(&mut h);
    let response = h.response(c).expect("one response");
    assert_eq!(response.status, StatusCode::BAD_REQUEST);
    assert!(
        response.body_str().starts_with("PQL parse error at line 1"),
        "{}",
        response.body_str()
    );
    assert_eq!(
        h.sends()
            .iter()
            .filter(|s| !s.request.path_and_query.contains("ast_only"))
            .count(),
        0,
        "nothing but the translation was asked"
    );
}

#[test]
fn a_translation_no_backend_answers_is_502() {
    let silent = |name, url| FakeBackend::always(name, url, Reply::ok("[]").after(ms(60_000)));
    let mut h = harness(vec![silent("pdb-a", URL_A), silent("pdb-b", URL_B)]);
    let c = pql(&mut h, "nodes {}");
    finish(&mut h);
    assert_eq!(h.response(c).expect("one").status, StatusCode::BAD_GATEWAY);
}

#[test]
fn pql_pdbmux_cannot_map_is_passed_through() {
    // Two queries in one `from`: no entity route asks that (PuppetDB refuses it itself).
    let text = "nodes { certname = 'a' } { certname = 'b' }";
    let target = form_target(ROOT, &[("query", text)]);
    let (a, b) = estate(&[(
        text,
        json!([
            "from",
            "nodes",
            ["=", "certname", "a"],
            ["=", "certname", "b"]
        ]),
    )]);
    let first = FakeBackend::puppetdb("pdb-a", URL_A, a, ms(2))
        .on(&target, Reply::ok(r#"[{"certname":"only-a"}]"#));
    let mut h = harness(vec![first, FakeBackend::puppetdb("pdb-b", URL_B, b, ms(3))]);
    let c = h.get(&target);
    finish(&mut h);
    assert_eq!(body_json(&h, c), json!([{ "certname": "only-a" }]));
}

#[test]
fn a_clients_own_ast_only_is_answered_with_the_translation() {
    let mut h = harness(backends(&[("nodes {}", json!(["from", "nodes"]))]));
    let c = h.get(&form_target(
        ROOT,
        &[("query", "nodes {}"), ("ast_only", "true")],
    ));
    finish(&mut h);
    assert_eq!(body_json(&h, c), json!(["from", "nodes"]));
    assert_eq!(
        h.sends()
            .iter()
            .filter(|s| s.request.path_and_query.contains("/nodes"))
            .count(),
        0,
        "not fanned out"
    );
}
