//! Record merges through pdbmux in front of two real PuppetDBs (run through `e2e/run`).
//!
//! Covered (docs/merging.md, "Provenance", "Paging"; docs/decisions.md D3, D4,
//! D11, D12): /nodes (one record per active node, the newer report wins, ties to configured
//! order, `pdbmux_source`, node_state, paging in PostgreSQL's order, include_total); /facts (the
//! owner's facts only under `merge: freshness` and `static`, one synthetic `pdbmux_source` record
//! per node, the gated shapes, upstream records of that name dropped, paging without synthetic
//! records); /facts/<name>[/<value>]; the synthesised /facts/pdbmux_source[/<backend>];
//! `source_fact` and `source_fact_enabled`; /fact-names; /environments; /reports and /events
//! (unions, dedupe, re-paging, summed include_total); paging errors; per-certname routes asking
//! the owner; X-Backends; a dead backend.
//!
//! Every expectation is computed from the backends' own answers (asked directly, then merged by
//! the reference functions below) and cross-checked against the fixture (`fixture.json`), never
//! taken from pdbmux's output.

mod common;

use std::collections::{BTreeMap, BTreeSet};

use common::{
    certname, certname_query, direct, direct_records, direct_total, env, get, json_of, multiset,
    newer_wins, newer_wins_uncomposed, node_of, pdbmux, records, union_total, x_records,
};
use pdbmux_core::membership::Kind;
use pdbmux_e2e::differential::normalise;
use pdbmux_e2e::order::{self, order_by_param, sort_keys, sort_records, window, OrderField};
use pdbmux_e2e::{closed_backend, Backend, Pdbmux, Response};
use serde_json::{json, Value};

const NODES: &str = "/pdb/query/v4/nodes";
const FACTS: &str = "/pdb/query/v4/facts";
const FACT_NAMES: &str = "/pdb/query/v4/fact-names";
const ENVIRONMENTS: &str = "/pdb/query/v4/environments";
const REPORTS: &str = "/pdb/query/v4/reports";
const EVENTS: &str = "/pdb/query/v4/events";
/// The synthetic provenance fact's default name (and the key pdbmux adds to node records).
const SOURCE: &str = "pdbmux_source";

// --- helpers ----------------------------------------------------------------------------------

/// The backend names in configured order.
fn names() -> Vec<&'static str> {
    env().backends.iter().map(|b| b.name.as_str()).collect()
}

fn backend(name: &str) -> &'static Backend {
    env()
        .backends
        .iter()
        .find(|b| b.name == name)
        .unwrap_or_else(|| panic!("no backend named {name}"))
}

fn spawn(label: &str, vars: &[(&str, &str)]) -> Pdbmux {
    let mut builder = env().pdbmux().label(label);
    for (k, v) in vars {
        builder = builder.env(k, v);
    }
    builder
        .spawn()
        .unwrap_or_else(|e| panic!("start pdbmux with {vars:?}: {e}"))
}

/// A merged answer: 200 and every backend contributed (X-Backends 2/2).
fn merged(p: &Pdbmux, path: &str, params: &[(&str, &str)]) -> Response {
    let r = get(p, path, params);
    assert_eq!(r.status, 200, "GET {path} {params:?}: {r:?}");
    assert_eq!(
        r.header("x-backends"),
        Some("2/2"),
        "GET {path} {params:?}: X-Backends in {:?}",
        r.headers
    );
    r
}

fn merged_records(p: &Pdbmux, path: &str, params: &[(&str, &str)]) -> Vec<Value> {
    records(&merged(p, path, params))
}

/// Certnames ending in the fixture's domain.
fn fixture_only<'a>(certnames: impl IntoIterator<Item = &'a str>) -> BTreeSet<&'a str> {
    let suffix = format!(".{}", env().fixture.domain);
    certnames
        .into_iter()
        .filter(|c| c.ends_with(&suffix))
        .collect()
}

fn scenario(certname: &str) -> &'static str {
    env()
        .fixture
        .nodes
        .get(certname)
        .map_or("not a fixture node", |n| n.scenario.as_str())
}

fn is_source(record: &Value, source: &str) -> bool {
    record.get("name").and_then(Value::as_str) == Some(source)
}

// --- reference merges (from the backends' own answers) ----------------------------------------

/// The merged node records: each winner with `pdbmux_source` naming its backend.
fn stamped_nodes(merged: &BTreeMap<String, (usize, Value)>, names: &[&str]) -> Vec<Value> {
    merged
        .values()
        .map(|(i, rec)| {
            let mut rec = rec.clone();
            rec.as_object_mut()
                .expect("a node record is an object")
                .insert(SOURCE.to_owned(), json!(names[*i]));
            rec
        })
        .collect()
}

/// Asserts a /nodes answer holds each expected certname once, with the winner's record and a
/// `pdbmux_source` naming the winner.
fn assert_nodes(what: &str, got: &[Value], expected: &BTreeMap<String, (usize, Value)>) {
    let names = names();
    let mut served: BTreeMap<&str, &Value> = BTreeMap::new();
    for rec in got {
        assert!(
            served.insert(certname(rec), rec).is_none(),
            "{what}: {} served twice",
            certname(rec)
        );
    }
    assert_eq!(
        served.keys().copied().collect::<BTreeSet<_>>(),
        expected.keys().map(String::as_str).collect::<BTreeSet<_>>(),
        "{what}: the certnames served"
    );
    for (c, (i, want)) in expected {
        let mut rec = served[c.as_str()].clone();
        let source = rec.as_object_mut().and_then(|o| o.remove(SOURCE));
        assert_eq!(
            source,
            Some(json!(names[*i])),
            "{what}: {c} ({}): {SOURCE} must name the backend with the newer report",
            scenario(c)
        );
        assert_eq!(
            &rec,
            want,
            "{what}: {c} ({}): the record must be {}'s",
            scenario(c),
            names[*i]
        );
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Strategy {
    Freshness,
    Static,
}

/// certname -> owning backend index, from the backends' active nodes (D4), cross-checked with
/// the fixture.
fn owners(strategy: Strategy) -> BTreeMap<String, usize> {
    let answers = direct_records(NODES, &[]);
    let owners: BTreeMap<String, usize> = match strategy {
        Strategy::Freshness => newer_wins(&answers)
            .into_iter()
            .map(|(c, (i, _))| (c, i))
            .collect(),
        Strategy::Static => {
            let mut m = BTreeMap::new();
            for (i, recs) in answers.iter().enumerate() {
                for rec in recs {
                    m.entry(certname(rec).to_owned()).or_insert(i);
                }
            }
            m
        }
    };
    let fixture = &env().fixture;
    let names = names();
    assert_eq!(
        fixture_only(owners.keys().map(String::as_str)),
        fixture.active_anywhere(),
        "the backends' active fixture nodes"
    );
    for (c, i) in &owners {
        let want = match strategy {
            Strategy::Freshness => fixture.freshness_winner(c),
            Strategy::Static => fixture.static_owner(c),
        };
        if let Some(want) = want {
            assert_eq!(
                names[*i], want,
                "{c}: the {strategy:?} owner per the fixture"
            );
        }
    }
    owners
}

/// The /facts rule: each record only from its node's owner (a node missing from `owners` from
/// whichever backend returned it); records named `source` dropped (None: injection off); with
/// `inject`, one `{certname, name: source, value: owner, environment}` record per node.
fn merge_facts(
    answers: &[Vec<Value>],
    names: &[&str],
    owners: &BTreeMap<String, usize>,
    source: Option<&str>,
    inject: bool,
) -> Vec<Value> {
    let mut out = Vec::new();
    let mut nodes: BTreeMap<String, (usize, Value)> = BTreeMap::new();
    for (i, recs) in answers.iter().enumerate() {
        for rec in recs {
            let c = certname(rec);
            if owners.get(c).is_some_and(|&o| o != i) {
                continue;
            }
            if source.is_some_and(|s| is_source(rec, s)) {
                continue;
            }
            nodes
                .entry(c.to_owned())
                .or_insert_with(|| (i, rec.get("environment").cloned().unwrap_or(Value::Null)));
            out.push(rec.clone());
        }
    }
    if let (Some(source), true) = (source, inject) {
        for (c, (i, environment)) in nodes {
            out.push(json!({
                "certname": c, "name": source, "value": names[i], "environment": environment,
            }));
        }
    }
    out
}

/// Union deduped by a key, the first backend's copy kept.
fn union_by(answers: &[Vec<Value>], key: impl Fn(&Value) -> String) -> Vec<Value> {
    let mut seen = BTreeSet::new();
    answers
        .iter()
        .flatten()
        .filter(|r| seen.insert(key(r)))
        .cloned()
        .collect()
}

fn hash_of(r: &Value) -> String {
    r["hash"]
        .as_str()
        .unwrap_or_else(|| panic!("no hash in {r}"))
        .to_owned()
}

/// The sorted, deduped union of the backends' fact names.
fn fact_names_union(answers: &[Vec<Value>]) -> BTreeSet<String> {
    answers
        .iter()
        .flatten()
        .map(|n| {
            n.as_str()
                .unwrap_or_else(|| panic!("a fact name that is not a string: {n}"))
                .to_owned()
        })
        .collect()
}

// --- paging -----------------------------------------------------------------------------------

/// Asserts `got` is the `offset`/`limit` window of `sorted`: the same sort keys in the same order
/// and, where the order is total, the same records (compared through `same`); where ties leave
/// several valid windows, every record served is an expected one.
fn assert_window(
    what: &str,
    got: &[Value],
    sorted: &[Value],
    order: &[OrderField],
    (offset, limit): (usize, Option<usize>),
    same: &dyn Fn(&Value) -> Value,
) {
    let want = window(sorted, offset, limit);
    assert_eq!(
        sort_keys(got, order),
        sort_keys(&want, order),
        "{what}: the window's sort keys ({} records served, {} expected)",
        got.len(),
        want.len()
    );
    let got: Vec<Value> = got.iter().map(same).collect();
    if order::order_is_total(sorted, order) {
        let want: Vec<Value> = want.iter().map(same).collect();
        assert_eq!(got, want, "{what}: the window's records");
    } else {
        let all: BTreeSet<String> = sorted.iter().map(|r| same(r).to_string()).collect();
        for rec in &got {
            assert!(
                all.contains(&rec.to_string()),
                "{what}: {rec} is no expected record"
            );
        }
    }
}

/// Every window of every order through pdbmux against the expected full list.
fn check_paging(
    p: &Pdbmux,
    path: &str,
    query: Option<&str>,
    expected: &[Value],
    orders: &[Vec<OrderField>],
    windows: &[(usize, Option<usize>)],
    same: &dyn Fn(&Value) -> Value,
) {
    for order in orders {
        let mut sorted = expected.to_vec();
        sort_records(&mut sorted, order);
        let order_by = order_by_param(order);
        for &(offset, limit) in windows {
            let offset_text = offset.to_string();
            let limit_text = limit.map(|l| l.to_string());
            let mut params = vec![
                ("order_by", order_by.as_str()),
                ("offset", offset_text.as_str()),
            ];
            if let Some(l) = &limit_text {
                params.push(("limit", l));
            }
            if let Some(q) = query {
                params.push(("query", q));
            }
            let got = merged_records(p, path, &params);
            assert_window(
                &format!("{path} {params:?}"),
                &got,
                &sorted,
                order,
                (offset, limit),
                same,
            );
        }
    }
}

fn whole(r: &Value) -> Value {
    r.clone()
}

/// Windows around the start, the middle and the end of a list of `n`.
fn windows_for(n: usize) -> Vec<(usize, Option<usize>)> {
    vec![
        (0, Some(3)),
        (2, Some(4)),
        (n / 2, Some(5)),
        (n.saturating_sub(3), Some(5)),
        (n.saturating_sub(1), Some(1)),
        (4, None),
        (0, Some(n + 5)),
        (n + 2, Some(3)),
    ]
}

// --- /nodes -----------------------------------------------------------------------------------

#[test]
fn nodes_serve_every_active_node_once_and_the_newer_report_wins() {
    let env = env();
    let names = names();
    let expected = newer_wins(&direct_records(NODES, &[]));
    // The reference agrees with the fixture: the active nodes, and each one's winner.
    assert_eq!(
        fixture_only(expected.keys().map(String::as_str)),
        env.fixture.active_anywhere(),
        "the backends' active fixture nodes"
    );
    for (c, (i, _)) in &expected {
        if let Some(w) = env.fixture.freshness_winner(c) {
            assert_eq!(
                names[*i],
                w,
                "{c} ({}): the winner per the fixture",
                scenario(c)
            );
        }
    }

    let p = pdbmux("merge-nodes");
    let got = merged_records(&p, NODES, &[]);
    // Every node both backends hold, by scenario, first (the readable failures).
    for c in env.fixture.held_by_exactly(&names) {
        let winner = env.fixture.freshness_winner(c).expect("active somewhere");
        let served: Vec<&Value> = got.iter().filter(|r| certname(r) == c).collect();
        assert_eq!(served.len(), 1, "{c} ({}): {served:?}", scenario(c));
        assert_eq!(served[0][SOURCE], winner, "{c} ({}): {SOURCE}", scenario(c));
        let state = env.fixture.state(c, winner).expect("the winner's state");
        assert_eq!(
            served[0]["report_timestamp"].as_str(),
            state.report_timestamp.as_deref(),
            "{c} ({}): the winner's report_timestamp",
            scenario(c)
        );
    }
    assert_nodes("/nodes", &got, &expected);
}

#[test]
fn nodes_deactivated_ones_only_with_a_node_state_query() {
    let env = env();
    let p = pdbmux("merge-nodes-state");
    let default: BTreeSet<String> = merged_records(&p, NODES, &[])
        .iter()
        .map(|r| certname(r).to_owned())
        .collect();
    let inactive_everywhere: Vec<&str> = env
        .fixture
        .nodes
        .keys()
        .map(String::as_str)
        .filter(|c| env.fixture.freshness_winner(c).is_none())
        .collect();
    assert!(
        !inactive_everywhere.is_empty(),
        "the fixture has deactivated nodes"
    );
    for c in &inactive_everywhere {
        assert!(
            !default.contains(*c),
            "{c} is deactivated in every backend but served by default"
        );
    }

    // Every node has one state in the estate: the one its newest report's backend holds it in
    // (D4's ownership over every node state). A node deactivated in one backend and active in
    // another with a newer report is active, so a node_state query sees it in one state only.
    let any_q = json!(["=", "node_state", "any"]).to_string();
    let owned = newer_wins(&direct_records(NODES, &[("query", any_q.as_str())]));
    let inactive = |rec: &Value| !rec["deactivated"].is_null() || !rec["expired"].is_null();
    for state in ["any", "inactive"] {
        let q = json!(["=", "node_state", state]).to_string();
        let params = [("query", q.as_str())];
        let expected: BTreeMap<String, (usize, Value)> = owned
            .iter()
            .filter(|(_, (_, rec))| state == "any" || inactive(rec))
            .map(|(c, winner)| (c.clone(), winner.clone()))
            .collect();
        if state == "any" {
            let want: BTreeSet<&str> = env.fixture.nodes.keys().map(String::as_str).collect();
            assert_eq!(
                fixture_only(expected.keys().map(String::as_str)),
                want,
                "node_state any: the backends' fixture nodes"
            );
        }
        let got = merged_records(&p, NODES, &params);
        for c in &inactive_everywhere {
            assert!(
                got.iter().any(|r| certname(r) == *c),
                "node_state {state}: {c} missing"
            );
        }
        assert_nodes(&format!("/nodes node_state {state}"), &got, &expected);
    }
}

#[test]
fn nodes_paging_windows_follow_postgresql_order() {
    let names = names();
    let expected = stamped_nodes(&newer_wins_uncomposed(&direct_records(NODES, &[])), &names);
    assert!(
        expected.iter().any(|r| r["report_timestamp"].is_null()),
        "a node without a report (null report_timestamp) to place"
    );
    let n = expected.len();
    let p = pdbmux("merge-nodes-paging");
    let orders = vec![
        vec![OrderField::asc("report_timestamp")],
        vec![OrderField::desc("report_timestamp")],
        vec![OrderField::desc("certname")],
        vec![
            OrderField::asc("latest_report_status"),
            OrderField::desc("certname"),
        ],
        vec![
            OrderField::desc("latest_report_status"),
            OrderField::asc("report_timestamp"),
        ],
        vec![
            OrderField::desc("facts_environment"),
            OrderField::asc("certname"),
        ],
        vec![OrderField::asc("latest_report_status")],
    ];
    check_paging(&p, NODES, None, &expected, &orders, &windows_for(n), &whole);

    // Paging a filtered query.
    let q = json!(["~", "certname", "^both-"]).to_string();
    let expected_q = stamped_nodes(
        &newer_wins_uncomposed(&direct_records(NODES, &[("query", &q)])),
        &names,
    );
    check_paging(
        &p,
        NODES,
        Some(&q),
        &expected_q,
        &[
            vec![OrderField::desc("report_timestamp")],
            vec![OrderField::asc("certname")],
        ],
        &windows_for(expected_q.len()),
        &whole,
    );

    // include_total: the merged node count (owned records are disjoint: exact).
    let order_by = order_by_param(&[OrderField::asc("certname")]);
    let r = merged(
        &p,
        NODES,
        &[
            ("include_total", "true"),
            ("limit", "2"),
            ("order_by", &order_by),
        ],
    );
    assert_eq!(
        x_records(&r),
        Some(n as u64),
        "X-Records in {:?}",
        r.headers
    );
    assert_eq!(records(&r).len(), 2);
}

// --- /facts -----------------------------------------------------------------------------------

#[test]
fn facts_come_from_the_owner_with_one_source_record_per_node() {
    let env = env();
    let names = names();
    let owners = owners(Strategy::Freshness);
    let p = pdbmux("merge-facts");

    // Each node both backends hold: exactly the owner's facts, and one record naming the owner.
    for c in env.fixture.held_by_exactly(&names) {
        let owner = env.fixture.freshness_winner(c).expect("active somewhere");
        let q = certname_query(c);
        let owners_facts = records(&direct(backend(owner), FACTS, &[("query", &q)]));
        assert!(!owners_facts.is_empty(), "{owner} holds no facts of {c}");
        let got = merged_records(&p, FACTS, &[("query", &q)]);
        let (synthetic, real): (Vec<Value>, Vec<Value>) =
            got.into_iter().partition(|r| is_source(r, SOURCE));
        assert_eq!(
            multiset(&real),
            multiset(&owners_facts),
            "{c} ({}): the facts must be {owner}'s",
            scenario(c)
        );
        let loaded_into = env
            .fixture
            .facts_payload(owner, c)
            .map(|f| f["values"]["e2e_loaded_into"].clone());
        assert_eq!(
            real.iter()
                .find(|r| is_source(r, "e2e_loaded_into"))
                .map(|r| r["value"].clone()),
            loaded_into,
            "{c} ({}): e2e_loaded_into",
            scenario(c)
        );
        let environment = &env.fixture.state(c, owner).expect("state").environment;
        assert_eq!(
            synthetic,
            vec![
                json!({"certname": c, "name": SOURCE, "value": owner, "environment": environment})
            ],
            "{c} ({}): the {SOURCE} record",
            scenario(c)
        );
    }

    // The whole estate.
    let expected = merge_facts(
        &direct_records(FACTS, &[]),
        &names,
        &owners,
        Some(SOURCE),
        true,
    );
    let got = merged_records(&p, FACTS, &[]);
    let mut sources: BTreeMap<&str, Vec<&Value>> = BTreeMap::new();
    for r in got.iter().filter(|r| is_source(r, SOURCE)) {
        sources.entry(certname(r)).or_default().push(&r["value"]);
    }
    for c in env.fixture.active_anywhere() {
        let winner = env.fixture.freshness_winner(c).expect("active");
        assert_eq!(
            sources.get(c).cloned().unwrap_or_default(),
            vec![&json!(winner)],
            "{c} ({}): exactly one {SOURCE} record naming its owner",
            scenario(c)
        );
    }
    // An upstream record named like the synthetic fact is dropped, never served.
    let forged = env.fixture.fact_values(SOURCE);
    assert!(
        !forged.is_empty(),
        "the fixture has no upstream {SOURCE} fact (extra_facts in e2e/fixture/load.py)"
    );
    for (b, c, value) in &forged {
        let q = json!(["and", ["=", "certname", c], ["=", "name", SOURCE]]).to_string();
        let held = records(&direct(backend(b), FACTS, &[("query", &q)]));
        assert_eq!(held.len(), 1, "{b} holds {c}'s upstream {SOURCE}: {held:?}");
        assert!(
            !got.iter()
                .any(|r| certname(r) == *c && is_source(r, SOURCE) && r["value"] == **value),
            "{c}'s upstream {SOURCE}={value} was served"
        );
    }
    assert_eq!(multiset(&got), multiset(&expected), "/facts");
}

/// The shapes that leave the provenance fact out: a name constraint that does not admit it,
/// projections, paged requests. (A name constraint that admits it, and the upstream record of
/// that name the backends then send, is `facts_named_beside_the_provenance_fact_come_with_its_records`.)
#[test]
fn facts_gated_shapes_get_no_source_record() {
    let names = names();
    let owners = owners(Strategy::Freshness);
    let forged = forged_source_node();
    let p = pdbmux("merge-facts-gates");
    let cases = [
        ("a name constraint", json!(["=", "name", "e2e_loaded_into"])),
        (
            "a name constraint under and that does not admit the source fact",
            json!([
                "and",
                ["=", "certname", forged],
                ["not", ["~", "name", "source"]]
            ]),
        ),
        (
            "an extract",
            json!([
                "extract",
                ["certname", "name", "value"],
                ["~", "certname", "^both-"]
            ]),
        ),
        (
            "an extract of the node holding an upstream source fact",
            json!([
                "extract",
                ["certname", "name", "value", "environment"],
                ["=", "certname", forged]
            ]),
        ),
    ];
    for (what, q) in cases {
        let q = q.to_string();
        let params = [("query", q.as_str())];
        let expected = merge_facts(
            &direct_records(FACTS, &params),
            &names,
            &owners,
            Some(SOURCE),
            false,
        );
        assert!(!expected.is_empty(), "{what}: the backends answer nothing");
        let got = merged_records(&p, FACTS, &params);
        let sources: Vec<&Value> = got.iter().filter(|r| is_source(r, SOURCE)).collect();
        assert!(
            sources.is_empty(),
            "{what} ({q}): {SOURCE} records {sources:?}"
        );
        assert_eq!(multiset(&got), multiset(&expected), "{what} ({q})");
    }

    // A paged request (D12): exactly the owned records, nothing synthetic, even when the page
    // holds everything.
    let expected = merge_facts(
        &direct_records(FACTS, &[]),
        &names,
        &owners,
        Some(SOURCE),
        false,
    );
    let limit = (expected.len() + 100).to_string();
    let got = merged_records(&p, FACTS, &[("limit", &limit)]);
    let sources: Vec<&Value> = got.iter().filter(|r| is_source(r, SOURCE)).collect();
    assert!(
        sources.is_empty(),
        "limit={limit}: {SOURCE} records {sources:?}"
    );
    assert_eq!(multiset(&got), multiset(&expected), "limit={limit}");
}

/// The provenance fact named beside other facts (Puppetboard's inventory with the fact in its
/// `INVENTORY_FACTS`, `in` over names, a pattern on the name, `not` on another name): the other
/// facts' records, each node's from its owner, and one provenance record per node the query's
/// other clauses admit, naming its facts' owner; the fixture's upstream record of that name
/// never served. And a constraint on its value below an `or`: each backend's records by what
/// the query leaves it.
#[test]
fn facts_named_beside_the_provenance_fact_come_with_its_records() {
    let names = names();
    let owners = owners(Strategy::Freshness);
    let forged = forged_source_node();
    let p = pdbmux("merge-facts-beside");
    let cases = [
        (
            "Puppetboard's inventory",
            json!(["or", ["=", "name", "kernel"], ["=", "name", SOURCE]]),
            json!(["=", "name", "kernel"]),
            None,
        ),
        (
            "in over names, under and",
            json!([
                "and",
                ["=", "certname", forged],
                ["in", "name", ["array", ["kernel", SOURCE]]]
            ]),
            json!(["and", ["=", "certname", forged], ["=", "name", "kernel"]]),
            Some(json!(["=", "certname", forged])),
        ),
        (
            "a name regex matching the source fact",
            json!(["~", "name", "^(kernel|pdbmux_source)$"]),
            json!(["=", "name", "kernel"]),
            None,
        ),
        (
            "not on the name",
            json!([
                "and",
                ["=", "certname", forged],
                ["not", ["=", "name", "kernel"]]
            ]),
            json!([
                "and",
                ["=", "certname", forged],
                ["not", ["=", "name", "kernel"]]
            ]),
            Some(json!(["=", "certname", forged])),
        ),
    ];
    for (what, q, others, rest) in cases {
        let q = q.to_string();
        let others = others.to_string();
        let rest = rest.map(|rest| rest.to_string());
        let mut expected = merge_facts(
            &direct_records(FACTS, &[("query", &others)]),
            &names,
            &owners,
            Some(SOURCE),
            false,
        );
        let rest_params: Vec<(&str, &str)> = rest.iter().map(|r| ("query", r.as_str())).collect();
        let every = merge_facts(
            &direct_records(FACTS, &rest_params),
            &names,
            &owners,
            Some(SOURCE),
            true,
        );
        let sources: Vec<Value> = every.into_iter().filter(|r| is_source(r, SOURCE)).collect();
        assert!(!sources.is_empty(), "{what}: no node to name");
        expected.extend(sources);
        let got = merged_records(&p, FACTS, &[("query", &q)]);
        assert_eq!(multiset(&got), multiset(&expected), "{what} ({q})");
    }
    // A value below an `or`: one backend's records, and the other's of one node it owns.
    let every = merge_facts(
        &direct_records(FACTS, &[]),
        &names,
        &owners,
        Some(SOURCE),
        true,
    );
    let sources: Vec<Value> = every.into_iter().filter(|r| is_source(r, SOURCE)).collect();
    let forged_owner = sources
        .iter()
        .find(|r| r["certname"] == forged)
        .map(|r| r["value"].clone())
        .expect("the forged node's provenance record");
    let other = env()
        .fixture
        .backend_names()
        .into_iter()
        .find(|name| forged_owner != *name)
        .expect("two backends");
    let q = json!([
        "and",
        ["=", "name", SOURCE],
        ["or", ["=", "value", other], ["=", "certname", forged]]
    ])
    .to_string();
    let expected: Vec<Value> = sources
        .into_iter()
        .filter(|r| r["value"] == other || r["certname"] == forged)
        .collect();
    let got = merged_records(&p, FACTS, &[("query", &q)]);
    assert_eq!(
        multiset(&got),
        multiset(&expected),
        "a value below an or ({q})"
    );
}

/// The certname holding the fixture's upstream `pdbmux_source` fact.
fn forged_source_node() -> &'static str {
    env()
        .fixture
        .fact_values(SOURCE)
        .first()
        .map(|(_, c, _)| *c)
        .expect("the fixture's upstream pdbmux_source fact (extra_facts in e2e/fixture/load.py)")
}

#[test]
fn facts_paging_windows_hold_owned_records_only() {
    let names = names();
    let owners = owners(Strategy::Freshness);
    let p = pdbmux("merge-facts-paging");
    // Every node but the one holding an upstream pdbmux_source record (that case is
    // facts_paging_windows_around_a_dropped_upstream_record).
    let q = json!(["not", ["=", "certname", forged_source_node()]]).to_string();
    let expected = merge_facts(
        &direct_records(FACTS, &[("query", &q)]),
        &names,
        &owners,
        Some(SOURCE),
        false,
    );
    let orders = vec![
        vec![OrderField::asc("certname"), OrderField::asc("name")],
        vec![OrderField::desc("name"), OrderField::desc("certname")],
        vec![
            OrderField::asc("environment"),
            OrderField::desc("certname"),
            OrderField::asc("name"),
        ],
    ];
    check_paging(
        &p,
        FACTS,
        Some(&q),
        &expected,
        &orders,
        &windows_for(expected.len()),
        &whole,
    );

    // jsonb order on value: strings < numbers < booleans, numbers numerically.
    let q = json!([
        "in",
        "name",
        [
            "array",
            [
                "kernel",
                "hostname",
                "processorcount",
                "memorysize_mb",
                "e2e_ratio",
                "e2e_weight",
                "is_virtual"
            ]
        ]
    ])
    .to_string();
    let expected_q = merge_facts(
        &direct_records(FACTS, &[("query", &q)]),
        &names,
        &owners,
        Some(SOURCE),
        false,
    );
    check_paging(
        &p,
        FACTS,
        Some(&q),
        &expected_q,
        &[
            vec![
                OrderField::asc("value"),
                OrderField::asc("certname"),
                OrderField::asc("name"),
            ],
            vec![
                OrderField::desc("value"),
                OrderField::asc("certname"),
                OrderField::asc("name"),
            ],
        ],
        &windows_for(expected_q.len()),
        &whole,
    );
}

#[test]
fn facts_paging_windows_around_a_dropped_upstream_record() {
    let names = names();
    let owners = owners(Strategy::Freshness);
    let answers = direct_records(FACTS, &[]);
    let expected = merge_facts(&answers, &names, &owners, Some(SOURCE), false);
    let p = pdbmux("merge-facts-paging-dropped");
    // Where the dropped upstream record sits in the owned records: a window over or after it is
    // cut from the records served, so it must neither come up short nor skip one.
    let by_node = vec![OrderField::asc("certname"), OrderField::asc("name")];
    let mut with_forged = merge_facts(&answers, &names, &owners, None, false);
    sort_records(&mut with_forged, &by_node);
    let forged = forged_source_node();
    let at = with_forged
        .iter()
        .position(|r| certname(r) == forged && is_source(r, SOURCE))
        .expect("the upstream record among the owned records");
    let mut windows = vec![
        (at.saturating_sub(2), Some(5)),
        (at, Some(1)),
        (at + 1, Some(3)),
        (0, Some(at + 1)),
    ];
    windows.extend(windows_for(expected.len()));
    check_paging(&p, FACTS, None, &expected, &[by_node], &windows, &whole);
}

#[test]
fn facts_include_total_counts_the_records_served() {
    let names = names();
    let owners = owners(Strategy::Freshness);
    let expected = merge_facts(
        &direct_records(FACTS, &[]),
        &names,
        &owners,
        Some(SOURCE),
        false,
    );
    let p = pdbmux("merge-facts-total");
    let order_by = order_by_param(&[OrderField::asc("certname"), OrderField::asc("name")]);
    let r = merged(
        &p,
        FACTS,
        &[
            ("include_total", "true"),
            ("limit", "3"),
            ("order_by", &order_by),
        ],
    );
    assert_eq!(records(&r).len(), 3);
    assert_eq!(
        x_records(&r),
        Some(expected.len() as u64),
        "X-Records: the owned records, without the dropped upstream {SOURCE} record ({:?})",
        r.headers
    );
}

#[test]
fn facts_merge_static_takes_the_first_backend_holding_the_node() {
    let env = env();
    let names = names();
    let owners = owners(Strategy::Static);
    let c = node_of("both-second-newer");
    assert_eq!(env.fixture.freshness_winner(c), Some(names[1]));
    assert_eq!(env.fixture.static_owner(c), Some(names[0]));
    let p = spawn("merge-facts-static", &[("PDBMUX_MERGE", "static")]);

    let q = certname_query(c);
    let got = merged_records(&p, FACTS, &[("query", &q)]);
    let (synthetic, real): (Vec<Value>, Vec<Value>) =
        got.into_iter().partition(|r| is_source(r, SOURCE));
    assert_eq!(
        multiset(&real),
        multiset(&records(&direct(env.first(), FACTS, &[("query", &q)]))),
        "{c}: under merge: static its facts are {}'s",
        names[0]
    );
    assert_eq!(
        synthetic.iter().map(|r| &r["value"]).collect::<Vec<_>>(),
        vec![&json!(names[0])],
        "{c}: {SOURCE} under merge: static"
    );

    let expected = merge_facts(
        &direct_records(FACTS, &[]),
        &names,
        &owners,
        Some(SOURCE),
        true,
    );
    assert_eq!(
        multiset(&merged_records(&p, FACTS, &[])),
        multiset(&expected),
        "/facts under merge: static"
    );
    let path = format!("{FACTS}/e2e_loaded_into");
    let expected = merge_facts(
        &direct_records(&path, &[]),
        &names,
        &owners,
        Some(SOURCE),
        false,
    );
    assert_eq!(
        multiset(&merged_records(&p, &path, &[])),
        multiset(&expected),
        "{path} under merge: static"
    );

    // /nodes names the newer report's backend whatever the merge strategy.
    let nodes = merged_records(&p, NODES, &[("query", &q)]);
    assert_eq!(nodes.len(), 1, "{nodes:?}");
    assert_eq!(nodes[0][SOURCE], names[1], "/nodes under merge: static");

    // The per-certname routes ask the /facts owner: the static one.
    for path in [
        format!("{NODES}/{c}"),
        format!("/pdb/query/v4/factsets/{c}"),
        format!("/pdb/query/v4/catalogs/{c}"),
    ] {
        let want = direct(env.first(), &path, &[]);
        assert_eq!(want.status, 200, "{want:?}");
        let r = get(&p, &path, &[]);
        assert_eq!(r.status, 200, "{path}: {r:?}");
        // Compared as sets where a catalog lists its resources and edges in storage order.
        assert_eq!(
            normalise(&path, &json_of(&r)),
            normalise(&path, &json_of(&want)),
            "{path} under merge: static: {}'s answer",
            names[0]
        );
    }
}

#[test]
fn fact_name_and_value_routes_take_the_owners_records() {
    let env = env();
    let names = names();
    let owners = owners(Strategy::Freshness);
    let p = pdbmux("merge-fact-routes");
    let scope = json!(["~", "certname", "^both-"]).to_string();
    let cases: Vec<(String, Vec<(&str, &str)>)> = vec![
        (format!("{FACTS}/e2e_loaded_into"), vec![]),
        (format!("{FACTS}/e2e_loaded_into/{}", names[0]), vec![]),
        (format!("{FACTS}/e2e_loaded_into/{}", names[1]), vec![]),
        (format!("{FACTS}/kernel/Linux"), vec![]),
        (
            format!("{FACTS}/e2e_scenario"),
            vec![("query", scope.as_str())],
        ),
    ];
    for (path, params) in &cases {
        let expected = merge_facts(
            &direct_records(path, params),
            &names,
            &owners,
            Some(SOURCE),
            false,
        );
        assert!(!expected.is_empty(), "{path}: the backends answer nothing");
        let got = merged_records(&p, path, params);
        assert_eq!(multiset(&got), multiset(&expected), "{path} {params:?}");
    }

    // Cross-check with the fixture: each active node's value as loaded into its owner.
    let got = merged_records(&p, &format!("{FACTS}/e2e_loaded_into"), &[]);
    let served: BTreeMap<&str, &Value> = got.iter().map(|r| (certname(r), &r["value"])).collect();
    assert_eq!(served.len(), got.len(), "a certname served twice: {got:?}");
    for c in env.fixture.active_anywhere() {
        let owner = env.fixture.freshness_winner(c).expect("active");
        let loaded = env
            .fixture
            .facts_payload(owner, c)
            .map(|f| &f["values"]["e2e_loaded_into"]);
        assert_eq!(served.get(c).copied(), loaded, "{c} ({})", scenario(c));
    }
}

#[test]
fn source_fact_path_lists_each_nodes_owner() {
    let env = env();
    let names = names();
    let owners = owners(Strategy::Freshness);
    let expected: Vec<Value> = merge_facts(
        &direct_records(FACTS, &[]),
        &names,
        &owners,
        Some(SOURCE),
        true,
    )
    .into_iter()
    .filter(|r| is_source(r, SOURCE))
    .collect();
    let p = pdbmux("merge-source-path");
    let path = format!("{FACTS}/{SOURCE}");
    let got = merged_records(&p, &path, &[]);
    let by_fixture: BTreeMap<&str, &str> = env
        .fixture
        .active_anywhere()
        .into_iter()
        .map(|c| (c, env.fixture.freshness_winner(c).expect("active")))
        .collect();
    let served: BTreeMap<&str, &str> = got
        .iter()
        .filter(|r| fixture_only([certname(r)]).len() == 1)
        .map(|r| (certname(r), r["value"].as_str().unwrap_or("(not a string)")))
        .collect();
    assert_eq!(served, by_fixture, "{path}: each active node's owner");
    assert_eq!(multiset(&got), multiset(&expected), "{path}");

    for name in &names {
        let want: Vec<Value> = expected
            .iter()
            .filter(|r| r["value"] == *name)
            .cloned()
            .collect();
        assert!(!want.is_empty(), "{name} owns no node");
        let got = merged_records(&p, &format!("{path}/{name}"), &[]);
        assert_eq!(multiset(&got), multiset(&want), "{path}/{name}");
    }
    let r = get(&p, &format!("{path}/unknown"), &[]);
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(json_of(&r), json!([]), "{path}/unknown");

    // The request's own query narrows the records.
    let c = node_of("both-second-newer");
    let got = merged_records(&p, &path, &[("query", &certname_query(c))]);
    let environment = &env.fixture.state(c, names[1]).expect("state").environment;
    assert_eq!(
        got,
        vec![json!({"certname": c, "name": SOURCE, "value": names[1], "environment": environment})],
        "{path} for {c}"
    );
}

#[test]
fn source_fact_disabled_leaves_the_backends_records_untouched() {
    let env = env();
    let names = names();
    let owners = owners(Strategy::Freshness);
    let p = spawn(
        "merge-source-disabled",
        &[("PDBMUX_SOURCE_FACT_ENABLED", "false")],
    );
    let expected = merge_facts(&direct_records(FACTS, &[]), &names, &owners, None, false);
    let got = merged_records(&p, FACTS, &[]);
    // The upstream records of that name come through; nothing is added.
    let served: BTreeSet<(String, String)> = got
        .iter()
        .filter(|r| is_source(r, SOURCE))
        .map(|r| (certname(r).to_owned(), r["value"].to_string()))
        .collect();
    let upstream: BTreeSet<(String, String)> = env
        .fixture
        .fact_values(SOURCE)
        .into_iter()
        .map(|(_, c, v)| (c.to_owned(), v.to_string()))
        .collect();
    assert_eq!(served, upstream, "{SOURCE} records with injection off");
    assert_eq!(
        multiset(&got),
        multiset(&expected),
        "/facts with injection off"
    );

    // /fact-names: the backends' union, nothing added.
    let union: Vec<Value> = fact_names_union(&direct_records(FACT_NAMES, &[]))
        .into_iter()
        .map(Value::String)
        .collect();
    assert_eq!(
        merged_records(&p, FACT_NAMES, &[]),
        union,
        "/fact-names with injection off"
    );
    // The synthesised path answers [] in every form.
    for path in [
        format!("{FACTS}/{SOURCE}"),
        format!("{FACTS}/{SOURCE}/{}", names[0]),
    ] {
        let r = get(&p, &path, &[]);
        assert_eq!(r.status, 200, "{path}: {r:?}");
        assert_eq!(json_of(&r), json!([]), "{path} with injection off");
    }

    // A renamed, disabled source fact is not listed either.
    let renamed = "e2e_provenance";
    let p = spawn(
        "merge-source-renamed-disabled",
        &[
            ("PDBMUX_SOURCE_FACT", renamed),
            ("PDBMUX_SOURCE_FACT_ENABLED", "false"),
        ],
    );
    assert_eq!(
        merged_records(&p, FACT_NAMES, &[]),
        union,
        "/fact-names with {renamed} off"
    );
    let got = merged_records(&p, FACTS, &[]);
    assert_eq!(
        multiset(&got),
        multiset(&expected),
        "/facts with {renamed} off"
    );
}

#[test]
fn source_fact_renamed() {
    let names = names();
    let owners = owners(Strategy::Freshness);
    let renamed = "e2e_provenance";
    let p = spawn("merge-source-renamed", &[("PDBMUX_SOURCE_FACT", renamed)]);
    // The renamed fact is injected; upstream records named pdbmux_source are ordinary facts now.
    let expected = merge_facts(
        &direct_records(FACTS, &[]),
        &names,
        &owners,
        Some(renamed),
        true,
    );
    let got = merged_records(&p, FACTS, &[]);
    assert!(
        got.iter().any(|r| is_source(r, SOURCE)),
        "the upstream {SOURCE} record is no longer special"
    );
    assert_eq!(multiset(&got), multiset(&expected), "/facts with {renamed}");

    let mut names_expected = fact_names_union(&direct_records(FACT_NAMES, &[]));
    names_expected.insert(renamed.to_owned());
    let listed: Vec<Value> = names_expected.into_iter().map(Value::String).collect();
    assert_eq!(
        merged_records(&p, FACT_NAMES, &[]),
        listed,
        "/fact-names with {renamed}"
    );
    let path = format!("{FACTS}/{renamed}");
    let want: Vec<Value> = expected
        .iter()
        .filter(|r| is_source(r, renamed))
        .cloned()
        .collect();
    assert_eq!(
        multiset(&merged_records(&p, &path, &[])),
        multiset(&want),
        "{path}"
    );
}

// --- /fact-names, /environments ---------------------------------------------------------------

#[test]
fn fact_names_are_the_sorted_union_paged_across_backends() {
    let env = env();
    let answers = direct_records(FACT_NAMES, &[]);
    let union = fact_names_union(&answers);
    for (b, own) in env.backends.iter().zip(&answers) {
        assert!(
            own.len() < union.len(),
            "{} alone lists every name: the union is not exercised",
            b.name
        );
    }
    let mut expected = union;
    expected.insert(SOURCE.to_owned());
    let asc: Vec<Value> = expected.iter().cloned().map(Value::String).collect();
    let desc: Vec<Value> = asc.iter().rev().cloned().collect();
    let n = asc.len();
    let p = pdbmux("merge-fact-names");

    let got = merged_records(&p, FACT_NAMES, &[]);
    assert_eq!(
        got.iter().filter(|v| **v == SOURCE).count(),
        1,
        "{SOURCE} exactly once (a backend holds it too)"
    );
    assert_eq!(got, asc, "/fact-names");
    for (order, list) in [("asc", &asc), ("desc", &desc)] {
        let order_by = json!([{"field": "name", "order": order}]).to_string();
        for (offset, limit) in windows_for(n) {
            let offset_text = offset.to_string();
            let limit_text = limit.map(|l| l.to_string());
            let mut params = vec![
                ("order_by", order_by.as_str()),
                ("offset", offset_text.as_str()),
            ];
            if let Some(l) = &limit_text {
                params.push(("limit", l));
            }
            assert_eq!(
                merged_records(&p, FACT_NAMES, &params),
                window(list, offset, limit),
                "/fact-names {params:?}"
            );
        }
    }
    let r = merged(
        &p,
        FACT_NAMES,
        &[("include_total", "true"), ("limit", "2"), ("offset", "1")],
    );
    assert_eq!(records(&r), window(&asc, 1, Some(2)));
    assert_eq!(
        x_records(&r),
        Some(n as u64),
        "X-Records in {:?}",
        r.headers
    );

    // order_by on anything but name: PuppetDB's own 400.
    let params = [("order_by", r#"[{"field":"certname"}]"#)];
    let want = direct(env.first(), FACT_NAMES, &params);
    assert_eq!(want.status, 400, "{want:?}");
    let r = get(&p, FACT_NAMES, &params);
    assert_eq!(r.status, 400, "{r:?}");
    assert_eq!(r.body.trim(), want.body.trim(), "the 400's text");
}

#[test]
fn environments_are_the_sorted_union() {
    let env = env();
    let answers = direct_records(ENVIRONMENTS, &[]);
    let listed = |recs: &[Value]| -> BTreeSet<String> {
        recs.iter()
            .filter_map(|r| r["name"].as_str().map(str::to_owned))
            .collect()
    };
    let (first, second) = (env.first(), env.second());
    let only_second: Vec<&str> = env
        .fixture
        .environments_in(&second.name)
        .difference(&env.fixture.environments_in(&first.name))
        .copied()
        .collect();
    assert!(
        !only_second.is_empty(),
        "the fixture has an environment only the second backend has"
    );
    for e in &only_second {
        assert!(
            !listed(&answers[0]).contains(*e),
            "{} lists {e} itself",
            first.name
        );
    }
    let mut expected = union_by(&answers, |r| r["name"].to_string());
    sort_records(&mut expected, &[OrderField::asc("name")]);

    let p = pdbmux("merge-environments");
    let got = merged_records(&p, ENVIRONMENTS, &[]);
    for e in env
        .fixture
        .environments_in(&first.name)
        .union(&env.fixture.environments_in(&second.name))
    {
        assert!(listed(&got).contains(*e), "{e} missing from {got:?}");
    }
    assert_eq!(got, expected, "/environments");
}

// --- /reports, /events ------------------------------------------------------------------------

#[test]
fn reports_are_the_union_deduped_by_hash() {
    let env = env();
    let answers = direct_records(REPORTS, &[]);
    let expected = union_by(&answers, hash_of);
    let expected_hashes: BTreeSet<String> = expected.iter().map(hash_of).collect();
    let fixture_hashes: BTreeSet<String> =
        env.fixture.reports.iter().map(|r| r.hash.clone()).collect();
    let suffix = format!(".{}", env.fixture.domain);
    assert_eq!(
        expected
            .iter()
            .filter(|r| certname(r).ends_with(&suffix))
            .map(hash_of)
            .collect::<BTreeSet<_>>(),
        fixture_hashes,
        "the backends' fixture reports"
    );
    let shared = env.fixture.shared_report_hashes();
    assert!(
        !shared.is_empty(),
        "the fixture stores a report in both backends"
    );

    let p = pdbmux("merge-reports");
    let got = merged_records(&p, REPORTS, &[]);
    let mut count: BTreeMap<String, usize> = BTreeMap::new();
    for r in &got {
        *count.entry(hash_of(r)).or_default() += 1;
    }
    for h in &shared {
        assert_eq!(
            count.get(*h).copied(),
            Some(1),
            "report {h}, stored in both backends, must be served once"
        );
    }
    let twice: Vec<&String> = count
        .iter()
        .filter(|(_, n)| **n > 1)
        .map(|(h, _)| h)
        .collect();
    assert!(twice.is_empty(), "reports served more than once: {twice:?}");
    assert_eq!(
        count.keys().cloned().collect::<BTreeSet<_>>(),
        expected_hashes,
        "the report hashes served"
    );
    // Each record is a backend's own copy of that report.
    for r in &got {
        assert!(
            answers.iter().flatten().any(|o| o == r),
            "{} is no backend's record",
            hash_of(r)
        );
    }

    // A node whose reports are in both backends.
    let c = node_of("both-same-report");
    let q = certname_query(c);
    let want: BTreeSet<String> = union_by(&direct_records(REPORTS, &[("query", &q)]), hash_of)
        .iter()
        .map(hash_of)
        .collect();
    let got: Vec<String> = merged_records(&p, REPORTS, &[("query", &q)])
        .iter()
        .map(hash_of)
        .collect();
    assert_eq!(got.len(), want.len(), "{c}: {got:?}");
    assert_eq!(got.into_iter().collect::<BTreeSet<_>>(), want, "{c}");
}

#[test]
fn reports_paging_windows_cross_backends() {
    let answers = direct_records(REPORTS, &[]);
    let expected = union_by(&answers, hash_of);
    let n = expected.len();
    let p = pdbmux("merge-reports-paging");
    // Which backend's copy of a shared report is served is not specified: compare hashes.
    let hash = |r: &Value| json!(hash_of(r));
    let orders = vec![
        vec![OrderField::desc("end_time")],
        vec![OrderField::desc("end_time"), OrderField::asc("hash")],
        vec![
            OrderField::asc("certname"),
            OrderField::desc("start_time"),
            OrderField::asc("hash"),
        ],
        vec![OrderField::asc("status"), OrderField::desc("end_time")],
    ];
    check_paging(
        &p,
        REPORTS,
        None,
        &expected,
        &orders,
        &windows_for(n),
        &hash,
    );

    // include_total counts a report stored in both backends once (D16): the distinct reports,
    // which is what the union PuppetDB counts.
    let order_by = order_by_param(&[OrderField::desc("end_time")]);
    let r = merged(
        &p,
        REPORTS,
        &[
            ("include_total", "true"),
            ("limit", "3"),
            ("order_by", &order_by),
        ],
    );
    assert_eq!(records(&r).len(), 3);
    assert!(
        direct_total(REPORTS, &[]) > n as u64,
        "the fixture stores a report in both backends"
    );
    assert_eq!(
        x_records(&r),
        Some(n as u64),
        "X-Records in {:?}",
        r.headers
    );
    if let Some(union) = union_total(REPORTS, &[]) {
        assert_eq!(union, n as u64, "the union's own count");
    }
}

/// Event columns without the per-backend receive time.
fn event_columns() -> Value {
    json!([
        "certname",
        "report",
        "status",
        "timestamp",
        "run_end_time",
        "resource_type",
        "resource_title",
        "property",
        "message"
    ])
}

#[test]
fn events_stored_in_both_backends_are_served_once() {
    let env = env();
    let c = node_of("both-same-report");
    let q = json!(["extract", event_columns(), ["=", "certname", c]]).to_string();
    let answers = direct_records(EVENTS, &[("query", &q)]);
    assert!(!answers[0].is_empty(), "{c} has events");
    assert_eq!(
        multiset(&answers[0]),
        multiset(&answers[1]),
        "both backends hold the same events for {c}"
    );
    let p = pdbmux("merge-events");
    let got = merged_records(&p, EVENTS, &[("query", &q)]);
    assert_eq!(
        multiset(&got),
        multiset(&answers[0]),
        "each of {c}'s events once"
    );
    let statuses: Vec<String> = {
        let mut s: Vec<String> = got
            .iter()
            .filter_map(|e| e["status"].as_str().map(str::to_owned))
            .collect();
        s.sort();
        s
    };
    assert_eq!(
        statuses,
        env.fixture
            .state(c, &env.first().name)
            .expect("state")
            .event_statuses,
        "{c}: the event statuses as loaded"
    );
}

/// An event without `report_receive_time`, the one field two backends storing the same report
/// fill in differently (each records its own receive time).
fn event_identity(event: &Value) -> String {
    let mut e = event.clone();
    if let Some(o) = e.as_object_mut() {
        o.remove("report_receive_time");
    }
    e.to_string()
}

#[test]
fn events_whole_records_of_a_report_stored_in_both_backends_are_served_once() {
    let env = env();
    let c = node_of("both-same-report");
    let q = certname_query(c);
    let answers = direct_records(EVENTS, &[("query", &q)]);
    let want: BTreeSet<String> = answers[0].iter().map(event_identity).collect();
    assert!(!want.is_empty(), "{c} has events");
    assert_eq!(
        answers[1]
            .iter()
            .map(event_identity)
            .collect::<BTreeSet<_>>(),
        want,
        "both backends hold the same events for {c} (but for report_receive_time)"
    );
    let p = pdbmux("merge-events-whole");
    let got = merged_records(&p, EVENTS, &[("query", &q)]);
    for e in &got {
        assert!(
            answers.iter().flatten().any(|o| o == e),
            "{e} is no backend's record"
        );
    }
    let statuses = env
        .fixture
        .state(c, &env.first().name)
        .expect("state")
        .event_statuses
        .len();
    assert_eq!(
        got.len(),
        statuses,
        "{c}: each event of its report (stored in both backends, served once by /reports) once; \
         served {} records: {got:#?}",
        got.len()
    );
    assert_eq!(
        got.iter().map(event_identity).collect::<BTreeSet<_>>(),
        want,
        "{c}'s events"
    );

    // The whole estate, and a window over it.
    let full = union_by(&direct_records(EVENTS, &[]), event_identity);
    let got = merged_records(&p, EVENTS, &[]);
    assert_eq!(
        got.iter().map(event_identity).collect::<BTreeSet<_>>(),
        full.iter().map(event_identity).collect::<BTreeSet<_>>(),
        "/events: the events"
    );
    assert_eq!(got.len(), full.len(), "/events: one record per event");
    check_paging(
        &p,
        EVENTS,
        None,
        &full,
        &[vec![OrderField::desc("timestamp")]],
        &windows_for(full.len()),
        &whole,
    );
}

#[test]
fn events_paging_windows_cross_backends() {
    let q = json!(["extract", event_columns()]).to_string();
    let params = [("query", q.as_str())];
    let expected = union_by(&direct_records(EVENTS, &params), Value::to_string);
    let n = expected.len();
    let p = pdbmux("merge-events-paging");
    let orders = vec![
        vec![
            OrderField::desc("timestamp"),
            OrderField::asc("certname"),
            OrderField::asc("report"),
            OrderField::asc("resource_title"),
        ],
        vec![OrderField::desc("run_end_time")],
        vec![
            OrderField::asc("status"),
            OrderField::desc("timestamp"),
            OrderField::asc("certname"),
            OrderField::asc("resource_title"),
        ],
    ];
    check_paging(
        &p,
        EVENTS,
        Some(&q),
        &expected,
        &orders,
        &windows_for(n),
        &whole,
    );

    let order_by = order_by_param(&[OrderField::desc("timestamp")]);
    let r = merged(
        &p,
        EVENTS,
        &[
            ("query", &q),
            ("include_total", "true"),
            ("limit", "2"),
            ("order_by", &order_by),
        ],
    );
    assert_eq!(records(&r).len(), 2);
    // An event of a report stored in both backends counts once (D16).
    assert!(direct_total(EVENTS, &params) > n as u64);
    assert_eq!(
        x_records(&r),
        Some(n as u64),
        "X-Records in {:?}",
        r.headers
    );
    if let Some(union) = union_total(EVENTS, &params) {
        assert_eq!(union, n as u64, "the union's own count");
    }
}

// --- paging errors ----------------------------------------------------------------------------

#[test]
fn paging_errors_are_puppetdbs_400() {
    let env = env();
    let p = pdbmux("merge-paging-errors");
    let bad = [
        ("limit", "0"),
        ("limit", "-3"),
        ("limit", "abc"),
        ("offset", "-1"),
        ("offset", "x"),
        ("order_by", "not json"),
        ("order_by", r#"{"field":"certname"}"#),
        ("order_by", r#"[{"field":"nope"}]"#),
        ("order_by", r#"[{"order":"desc"}]"#),
        ("order_by", r#"[{"field":"certname","order":"sideways"}]"#),
    ];
    let kernel = format!("{FACTS}/kernel");
    let mut failures = Vec::new();
    for path in [
        NODES,
        FACTS,
        kernel.as_str(),
        FACT_NAMES,
        ENVIRONMENTS,
        REPORTS,
        EVENTS,
    ] {
        for (k, v) in bad {
            let params = [(k, v)];
            let want = direct(env.first(), path, &params);
            assert_eq!(
                want.status,
                400,
                "{} {path} {k}={v}: {want:?}",
                env.first().name
            );
            let r = get(&p, path, &params);
            if r.status != 400 || r.body.trim() != want.body.trim() {
                failures.push(format!(
                    "{path} {k}={v}: pdbmux {} {:?}, PuppetDB 400 {:?}",
                    r.status,
                    r.body.trim(),
                    want.body.trim()
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

// --- per-certname routes ----------------------------------------------------------------------

#[test]
fn per_certname_routes_answer_the_owner() {
    let env = env();
    let names = names();
    let p = pdbmux("merge-per-certname");
    for c in env.fixture.held_by_exactly(&names) {
        // Each route from the owner of the kind of data it shows (D14).
        for (path, kind) in [
            (format!("{NODES}/{c}"), Kind::Node),
            (format!("{NODES}/{c}/facts"), Kind::Facts),
            (format!("/pdb/query/v4/factsets/{c}"), Kind::Facts),
            (format!("/pdb/query/v4/catalogs/{c}"), Kind::Catalog),
        ] {
            let owner = env.fixture.kind_owner(c, kind).expect("active somewhere");
            let want = direct(backend(owner), &path, &[]);
            assert_eq!(want.status, 200, "{owner} {path}: {want:?}");
            let r = get(&p, &path, &[]);
            assert_eq!(r.status, 200, "{path}: {r:?}");
            // A catalog's resources and edges come in the backend's storage order, which two
            // reads of one PuppetDB need not share: compared as sets.
            assert_eq!(
                normalise(&path, &json_of(&r)),
                normalise(&path, &json_of(&want)),
                "{path} ({}): the owner {owner}'s answer",
                scenario(c)
            );
        }
    }
}

// --- a backend down ---------------------------------------------------------------------------

#[test]
fn a_dead_backend_leaves_the_survivors_records() {
    let env = env();
    for alive in &env.backends {
        let dead = closed_backend().expect("a closed port");
        let configured: Vec<(&str, &str)> = if alive.name == env.first().name {
            vec![
                (alive.name.as_str(), alive.url.as_str()),
                ("dead", dead.url()),
            ]
        } else {
            vec![
                ("dead", dead.url()),
                (alive.name.as_str(), alive.url.as_str()),
            ]
        };
        let names: Vec<&str> = configured.iter().map(|(n, _)| *n).collect();
        let p = env
            .pdbmux_with(&configured)
            .label(&format!("merge-dead-but-{}", alive.name))
            .spawn()
            .unwrap_or_else(|e| panic!("start pdbmux: {e}"));
        let survivor = |path: &str| -> Vec<Value> {
            let r = direct(alive, path, &[]);
            records(&r)
        };
        let through = |path: &str| -> Vec<Value> {
            let r = get(&p, path, &[]);
            assert_eq!(r.status, 200, "{path} with only {} up: {r:?}", alive.name);
            assert_eq!(
                r.header("x-backends"),
                Some("1/2"),
                "{path} with only {} up: X-Backends in {:?}",
                alive.name,
                r.headers
            );
            records(&r)
        };
        let at = names.iter().position(|n| *n == alive.name).expect("alive");
        let mut answers = vec![Vec::new(), Vec::new()];

        answers[at] = survivor(NODES);
        let expected = stamped_nodes(&newer_wins(&answers), &names);
        assert_eq!(
            multiset(&through(NODES)),
            multiset(&expected),
            "/nodes with only {} up",
            alive.name
        );

        answers[at] = survivor(FACTS);
        let expected = merge_facts(&answers, &names, &BTreeMap::new(), Some(SOURCE), true);
        assert_eq!(
            multiset(&through(FACTS)),
            multiset(&expected),
            "/facts with only {} up",
            alive.name
        );

        let reports = survivor(REPORTS);
        assert_eq!(
            multiset(&through(REPORTS)),
            multiset(&reports),
            "/reports with only {} up",
            alive.name
        );
    }
}
