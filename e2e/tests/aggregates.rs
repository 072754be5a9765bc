//! Combined answers through pdbmux in front of two real PuppetDBs (run through `e2e/run`).
//!
//! Covered (docs/merging.md "Aggregates", "Metadata and metrics"; docs/decisions.md D4, D5,
//! D9): extract functions count, sum, min, max, avg and the row function to_string on /nodes,
//! /facts, /facts/<name>[/<value>], /resources, /reports (Puppetboard's daily chart) and /events,
//! folded to what one PuppetDB holding the whole estate answers; a node both backends hold
//! counted once; limit/offset cut after the fold, include_total the merged group count, order_by
//! on a function column answered like PuppetDB; the refusals (400, no request reaches a
//! backend); /event-counts summed per subject with counts_filter, order_by and the window applied
//! after the merge; /aggregate-event-counts computed from the merged subjects (D5); the Jolokia
//! merge (population MBeans counting the estate once, a timer's attributes by name, in-band
//! errors, the list union, the v1 404).
//!
//! The reference ("a single PuppetDB holding the whole estate") is computed here from the
//! backends' own raw records, asked directly, with ownership applied: a node belongs to the
//! backend holding its newer report_timestamp (a tie to the first backend); its facts and
//! resources count from that backend only. Ownership is cross-checked against the fixture.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use common::{
    certname, direct, direct_records, env, get, json_of, newer_wins, pdbmux, records,
    union_records, x_records,
};
use pdbmux_e2e::order::{compare_values, instant, window};
use pdbmux_e2e::{epoch_seconds, marker, timestamp_micros, AccessLog, Backend, Pdbmux, Response};
use serde_json::{json, Map, Value};

const NODES: &str = "/pdb/query/v4/nodes";
const FACTS: &str = "/pdb/query/v4/facts";
const RESOURCES: &str = "/pdb/query/v4/resources";
const REPORTS: &str = "/pdb/query/v4/reports";
const EVENTS: &str = "/pdb/query/v4/events";
const EVENT_COUNTS: &str = "/pdb/query/v4/event-counts";
const AGGREGATE_EVENT_COUNTS: &str = "/pdb/query/v4/aggregate-event-counts";

/// Numeric facts every fixture node carries (integers and floats).
const NUMERIC_FACTS: [&str; 5] = [
    "uptime_seconds",
    "memorysize_mb",
    "e2e_ratio",
    "e2e_weight",
    "processorcount",
];

// --- helpers ----------------------------------------------------------------------------------

fn backends() -> &'static [Backend] {
    &env().backends
}

fn names() -> Vec<&'static str> {
    backends().iter().map(|b| b.name.as_str()).collect()
}

fn scenario(c: &str) -> &'static str {
    env()
        .fixture
        .nodes
        .get(c)
        .map_or("not a fixture node", |n| n.scenario.as_str())
}

fn is_fixture(c: &str) -> bool {
    c.ends_with(&format!(".{}", env().fixture.domain))
}

/// A combined answer: 200 and both backends contributed.
fn combined(p: &Pdbmux, path: &str, params: &[(&str, &str)]) -> Response {
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

fn combined_rows(p: &Pdbmux, path: &str, query: &Value) -> Vec<Value> {
    records(&combined(p, path, &[("query", &query.to_string())]))
}

// --- ownership (D4) ---------------------------------------------------------------------------

/// The /nodes winners among active nodes (the freshness owners), cross-checked with the fixture.
fn active_winners() -> BTreeMap<String, (usize, Value)> {
    let winners = newer_wins(&direct_records(NODES, &[]));
    let fixture = &env().fixture;
    let served: BTreeSet<&str> = winners
        .keys()
        .map(String::as_str)
        .filter(|c| is_fixture(c))
        .collect();
    assert_eq!(
        served,
        fixture.active_anywhere(),
        "the backends' active fixture nodes"
    );
    let names = names();
    for (c, (i, _)) in &winners {
        if let Some(w) = fixture.freshness_winner(c) {
            assert_eq!(
                names[*i],
                w,
                "{c} ({}): the owner per the fixture",
                scenario(c)
            );
        }
    }
    winners
}

/// certname -> owning backend index (freshness, active nodes).
fn owners() -> BTreeMap<String, usize> {
    active_winners()
        .into_iter()
        .map(|(c, (i, _))| (c, i))
        .collect()
}

/// certname -> the backend holding its newest report in any node state (where its latest report
/// lives in a single PuppetDB holding everything), cross-checked with the fixture.
fn latest_report_owners() -> BTreeMap<String, usize> {
    let any = json!(["=", "node_state", "any"]).to_string();
    let winners = newer_wins(&direct_records(NODES, &[("query", &any)]));
    let fixture = &env().fixture;
    let names = names();
    for c in fixture.nodes.keys() {
        let best = fixture.freshness_winner_any_state(c);
        let (i, _) = winners
            .get(c)
            .unwrap_or_else(|| panic!("{c} is in no backend (node_state any)"));
        assert_eq!(
            Some(names[*i]),
            best,
            "{c} ({}): the backend with its newest report per the fixture",
            scenario(c)
        );
    }
    winners.into_iter().map(|(c, (i, _))| (c, i)).collect()
}

/// Each backend's records kept only for the nodes it owns (a node no owner is known for is kept
/// from every backend that returned it), concatenated.
fn owned(answers: &[Vec<Value>], owners: &BTreeMap<String, usize>) -> Vec<Value> {
    answers
        .iter()
        .enumerate()
        .flat_map(|(i, recs)| {
            recs.iter()
                .filter(move |r| owners.get(certname(r)).is_none_or(|&o| o == i))
                .cloned()
        })
        .collect()
}

// --- the reference fold -----------------------------------------------------------------------

/// One extract function column; PuppetDB names the response column after the function.
#[derive(Debug, Clone, Copy)]
enum F {
    Count,
    CountOf(&'static str),
    Sum(&'static str),
    Min(&'static str),
    Max(&'static str),
    Avg(&'static str),
}

impl F {
    fn column(self) -> &'static str {
        match self {
            F::Count | F::CountOf(_) => "count",
            F::Sum(_) => "sum",
            F::Min(_) => "min",
            F::Max(_) => "max",
            F::Avg(_) => "avg",
        }
    }

    fn ast(self) -> Value {
        match self {
            F::Count => json!(["function", "count"]),
            F::CountOf(f) => json!(["function", "count", f]),
            F::Sum(f) => json!(["function", "sum", f]),
            F::Min(f) => json!(["function", "min", f]),
            F::Max(f) => json!(["function", "max", f]),
            F::Avg(f) => json!(["function", "avg", f]),
        }
    }
}

/// `["extract", [<functions>, <keys>], <filter>?, ["group_by", <keys>]?]`.
fn extract(funcs: &[F], keys: &[&str], filter: Option<Value>) -> Value {
    let mut columns: Vec<Value> = funcs.iter().map(|f| f.ast()).collect();
    columns.extend(keys.iter().map(|k| json!(k)));
    let mut q = vec![json!("extract"), Value::Array(columns)];
    q.extend(filter);
    if !keys.is_empty() {
        let mut group = vec![json!("group_by")];
        group.extend(keys.iter().map(|k| json!(k)));
        q.push(Value::Array(group));
    }
    Value::Array(q)
}

fn number(v: &Value) -> Option<f64> {
    match v {
        Value::Number(n) => n.as_f64(),
        _ => None,
    }
}

fn from_f64(x: f64) -> Value {
    if x.fract() == 0.0 && x.abs() < 9e15 {
        // Whole numbers as integers, as PuppetDB prints integer sums.
        json!(x as i64)
    } else {
        json!(x)
    }
}

/// What one PuppetDB answers for `funcs` grouped by `keys` over `records`: one row per distinct
/// key, count counting records (count of a field its non-null values), sum/avg over numbers,
/// min/max in PostgreSQL's order (timestamps as instants, text byte-wise); null over no values.
fn fold(records: &[Value], keys: &[&str], funcs: &[F]) -> Vec<Value> {
    let mut groups: BTreeMap<String, (Map<String, Value>, Vec<&Value>)> = BTreeMap::new();
    for rec in records {
        let key: Map<String, Value> = keys
            .iter()
            .map(|k| ((*k).to_owned(), rec.get(*k).cloned().unwrap_or(Value::Null)))
            .collect();
        let text = Value::Object(key.clone()).to_string();
        groups.entry(text).or_insert((key, Vec::new())).1.push(rec);
    }
    groups
        .into_values()
        .map(|(mut row, recs)| {
            for f in funcs {
                let values = |field: &str| -> Vec<&Value> {
                    recs.iter()
                        .filter_map(|r| r.get(field))
                        .filter(|v| !v.is_null())
                        .collect()
                };
                let value = match *f {
                    F::Count => json!(recs.len()),
                    F::CountOf(field) => json!(values(field).len()),
                    F::Sum(field) => {
                        let xs: Vec<f64> = values(field).into_iter().filter_map(number).collect();
                        if xs.is_empty() {
                            Value::Null
                        } else {
                            from_f64(xs.iter().sum())
                        }
                    }
                    F::Avg(field) => {
                        let xs: Vec<f64> = values(field).into_iter().filter_map(number).collect();
                        if xs.is_empty() {
                            Value::Null
                        } else {
                            json!(xs.iter().sum::<f64>() / xs.len() as f64)
                        }
                    }
                    F::Min(field) => values(field)
                        .into_iter()
                        .min_by(|a, b| compare_values(Some(a), Some(b)))
                        .cloned()
                        .unwrap_or(Value::Null),
                    F::Max(field) => values(field)
                        .into_iter()
                        .max_by(|a, b| compare_values(Some(a), Some(b)))
                        .cloned()
                        .unwrap_or(Value::Null),
                };
                row.insert(f.column().to_owned(), value);
            }
            Value::Object(row)
        })
        .collect()
}

/// Two cells equal: numbers within 1e-9 relative (exactly for whole numbers), timestamps as
/// instants, everything else as JSON.
fn same_cell(got: &Value, want: &Value) -> bool {
    match (got, want) {
        (Value::Number(_), Value::Number(_)) => {
            let (g, w) = (
                number(got).unwrap_or(f64::NAN),
                number(want).unwrap_or(f64::NAN),
            );
            if w.fract() == 0.0 && g.fract() == 0.0 {
                g == w
            } else {
                (g - w).abs() <= 1e-9 * w.abs().max(g.abs()).max(1e-300)
            }
        }
        (Value::String(g), Value::String(w)) => match (instant(g), instant(w)) {
            (Some(a), Some(b)) => a == b,
            _ => g == w,
        },
        _ => got == want,
    }
}

fn key_text(row: &Value, keys: &[&str]) -> String {
    let key: Map<String, Value> = keys
        .iter()
        .map(|k| ((*k).to_owned(), row.get(*k).cloned().unwrap_or(Value::Null)))
        .collect();
    Value::Object(key).to_string()
}

/// Compares two sets of aggregate rows: the same groups (by `keys`) with the same columns and
/// values (see [`same_cell`]). None when they agree, else every mismatch.
fn rows_mismatch(what: &str, got: &[Value], want: &[Value], keys: &[&str]) -> Option<String> {
    let index = |rows: &[Value]| -> Result<BTreeMap<String, Value>, String> {
        let mut m = BTreeMap::new();
        for r in rows {
            if m.insert(key_text(r, keys), r.clone()).is_some() {
                return Err(format!("the group {} twice", key_text(r, keys)));
            }
        }
        Ok(m)
    };
    let context = format!("\n  pdbmux:    {got:?}\n  reference: {want:?}");
    let g = match index(got) {
        Ok(g) => g,
        Err(e) => return Some(format!("{what}: pdbmux serves {e}{context}")),
    };
    let w = match index(want) {
        Ok(w) => w,
        Err(e) => return Some(format!("{what}: the reference holds {e}{context}")),
    };
    if g.keys().ne(w.keys()) {
        return Some(format!("{what}: the groups differ{context}"));
    }
    let mut problems = Vec::new();
    for (k, want_row) in &w {
        let got_row = &g[k];
        let (Some(go), Some(wo)) = (got_row.as_object(), want_row.as_object()) else {
            problems.push(format!("{k}: {got_row} vs {want_row}"));
            continue;
        };
        if go.keys().ne(wo.keys()) {
            problems.push(format!("{k}: columns {got_row} vs {want_row}"));
            continue;
        }
        for (col, wv) in wo {
            if !same_cell(&go[col], wv) {
                problems.push(format!("{k}: {col} = {} (expected {wv})", go[col]));
            }
        }
    }
    (!problems.is_empty()).then(|| format!("{what}:\n  {}{context}", problems.join("\n  ")))
}

/// Asserts [`rows_mismatch`] finds nothing.
fn assert_rows(what: &str, got: &[Value], want: &[Value], keys: &[&str]) {
    if let Some(problem) = rows_mismatch(what, got, want, keys) {
        panic!("{problem}");
    }
}

/// Asks pdbmux `extract(funcs, keys, filter)` on `path` and compares with the fold of `records`.
fn check_fold(
    p: &Pdbmux,
    path: &str,
    records: &[Value],
    funcs: &[F],
    keys: &[&str],
    filter: Option<Value>,
) -> Vec<Value> {
    let q = extract(funcs, keys, filter);
    let got = combined_rows(p, path, &q);
    let want = fold(records, keys, funcs);
    assert_rows(&format!("{path} {q}"), &got, &want, keys);
    got
}

// --- /nodes -----------------------------------------------------------------------------------

#[test]
fn nodes_aggregates_fold_to_the_estate_answer() {
    let env = env();
    let winners = active_winners();
    let merged: Vec<Value> = winners.values().map(|(_, r)| r.clone()).collect();
    let p = pdbmux("agg-nodes");

    // Puppetboard's overview count: every active node once.
    let got = check_fold(&p, NODES, &merged, &[F::Count], &[], None);
    let fixture_nodes = merged.iter().filter(|r| is_fixture(certname(r))).count();
    assert_eq!(fixture_nodes, env.fixture.active_anywhere().len());
    eprintln!("/nodes count: {got:?} (fixture: {fixture_nodes} active nodes)");

    check_fold(
        &p,
        NODES,
        &merged,
        &[
            F::Count,
            F::Min("report_timestamp"),
            F::Max("report_timestamp"),
        ],
        &["latest_report_status"],
        None,
    );
    // min/max on text, count of a column (its non-null values), two keys.
    check_fold(
        &p,
        NODES,
        &merged,
        &[
            F::CountOf("report_timestamp"),
            F::Min("certname"),
            F::Max("certname"),
        ],
        &["report_environment", "catalog_environment"],
        None,
    );
    // A filtered count.
    check_fold(
        &p,
        NODES,
        &merged
            .iter()
            .filter(|r| r["latest_report_status"] == "failed")
            .cloned()
            .collect::<Vec<_>>(),
        &[F::Count],
        &[],
        Some(json!(["=", "latest_report_status", "failed"])),
    );
}

#[test]
fn nodes_row_function_groups_like_a_column() {
    // to_string is a row function: it groups like a plain column. The reference takes each
    // backend's own to_string of every record, then applies ownership.
    let to_string = json!(["function", "to_string", "report_timestamp", "YYYY-MM-DD"]);
    let per_record = json!(["extract", ["certname", to_string]]).to_string();
    let answers = direct_records(NODES, &[("query", &per_record)]);
    let merged = owned(&answers, &owners());
    let want = fold(&merged, &["to_string"], &[F::Count]);
    let q = json!([
        "extract",
        [["function", "count"], to_string],
        ["group_by", to_string]
    ]);
    let p = pdbmux("agg-nodes-to-string");
    let got = combined_rows(&p, NODES, &q);
    assert_rows(&format!("/nodes {q}"), &got, &want, &["to_string"]);
}

// --- /facts, /facts/<name>[/<value>] ----------------------------------------------------------

/// Each backend's /facts records for `filter`, each node's from its owner only.
fn owned_facts(filter: &Value, owners: &BTreeMap<String, usize>) -> Vec<Value> {
    owned(
        &direct_records(FACTS, &[("query", &filter.to_string())]),
        owners,
    )
}

#[test]
fn facts_numeric_aggregates_fold_to_the_estate_answer() {
    let env = env();
    let owners = owners();
    let names_filter = json!(["in", "name", ["array", NUMERIC_FACTS]]);
    let facts = owned_facts(&names_filter, &owners);

    // Cross-check the reference with the fixture: each active node's uptime from its owner.
    let mut from_fixture: Vec<i64> = env
        .fixture
        .fact_values("uptime_seconds")
        .into_iter()
        .filter(|(b, c, _)| env.fixture.freshness_winner(c) == Some(*b))
        .filter_map(|(_, _, v)| v.as_i64())
        .collect();
    let mut from_backends: Vec<i64> = facts
        .iter()
        .filter(|f| f["name"] == "uptime_seconds" && is_fixture(certname(f)))
        .filter_map(|f| f["value"].as_i64())
        .collect();
    from_fixture.sort_unstable();
    from_backends.sort_unstable();
    assert_eq!(
        from_backends, from_fixture,
        "uptime_seconds of the owned facts"
    );

    let p = pdbmux("agg-facts");
    let got = check_fold(
        &p,
        FACTS,
        &facts,
        &[F::Count, F::Sum("value"), F::Min("value"), F::Max("value")],
        &["name"],
        Some(names_filter.clone()),
    );
    eprintln!("/facts count,sum,min,max by name: {got:?}");
    let got = check_fold(
        &p,
        FACTS,
        &facts,
        &[F::Avg("value")],
        &["name"],
        Some(names_filter.clone()),
    );
    eprintln!("/facts avg by name: {got:?}");
    // No group: one row over the whole estate; by environment.
    let memory: Vec<Value> = facts
        .iter()
        .filter(|f| f["name"] == "memorysize_mb")
        .cloned()
        .collect();
    check_fold(
        &p,
        FACTS,
        &memory,
        &[F::Avg("value")],
        &[],
        Some(json!(["=", "name", "memorysize_mb"])),
    );
    check_fold(
        &p,
        FACTS,
        &memory,
        &[F::Count, F::Sum("value"), F::Max("value")],
        &["environment"],
        Some(json!(["=", "name", "memorysize_mb"])),
    );
    // min/max on a text column.
    check_fold(
        &p,
        FACTS,
        &memory,
        &[F::Min("certname"), F::Max("certname")],
        &[],
        Some(json!(["=", "name", "memorysize_mb"])),
    );
    // avg over no rows stays null, as upstream.
    let nothing = json!(["=", "name", marker("no-such-fact")]);
    let q = extract(&[F::Avg("value")], &[], Some(nothing));
    let want = json_of(&direct(env.first(), FACTS, &[("query", &q.to_string())]));
    assert_eq!(
        want,
        json!([{ "avg": null }]),
        "PuppetDB's avg over no rows"
    );
    assert_eq!(
        combined_rows(&p, FACTS, &q),
        want.as_array().cloned().unwrap_or_default(),
        "{q}"
    );
}

#[test]
fn fact_path_aggregates_fold_like_facts() {
    let owners = owners();
    let p = pdbmux("agg-fact-path");

    let uptime = owned_facts(&json!(["=", "name", "uptime_seconds"]), &owners);
    let path = format!("{FACTS}/uptime_seconds");
    check_fold(
        &p,
        &path,
        &uptime,
        &[F::Count, F::Sum("value"), F::Min("value"), F::Max("value")],
        &[],
        None,
    );
    check_fold(
        &p,
        &path,
        &uptime,
        &[F::Avg("value")],
        &["environment"],
        None,
    );

    let linux = owned_facts(
        &json!(["and", ["=", "name", "kernel"], ["=", "value", "Linux"]]),
        &owners,
    );
    assert_eq!(
        linux.iter().filter(|f| is_fixture(certname(f))).count(),
        env().fixture.active_anywhere().len(),
        "every active fixture node runs Linux"
    );
    check_fold(
        &p,
        &format!("{FACTS}/kernel/Linux"),
        &linux,
        &[F::Count],
        &["environment"],
        None,
    );
}

// --- /resources -------------------------------------------------------------------------------

fn owned_resources(owners: &BTreeMap<String, usize>) -> Vec<Value> {
    let q = json!(["extract", ["certname", "type", "title", "exported"]]).to_string();
    owned(&direct_records(RESOURCES, &[("query", &q)]), owners)
}

#[test]
fn resources_counts_fold_to_the_owned_resources() {
    let env = env();
    let owners = owners();
    let resources = owned_resources(&owners);
    // Cross-check: each active fixture node's catalog from its owner, as loaded.
    let from_fixture: usize = env
        .fixture
        .active_anywhere()
        .iter()
        .filter_map(|c| {
            let owner = env.fixture.freshness_winner(c)?;
            env.fixture.state(c, owner).map(|s| s.catalog_resources)
        })
        .sum();
    assert_eq!(
        resources.iter().filter(|r| is_fixture(certname(r))).count(),
        from_fixture,
        "owned catalog resources per the fixture"
    );

    let p = pdbmux("agg-resources");
    let got = check_fold(&p, RESOURCES, &resources, &[F::Count], &[], None);
    eprintln!("/resources count: {got:?}");
    let got = check_fold(&p, RESOURCES, &resources, &[F::Count], &["type"], None);
    eprintln!("/resources count by type: {got:?}");
    check_fold(
        &p,
        RESOURCES,
        &resources,
        &[F::Count, F::Min("title"), F::Max("certname")],
        &["type", "exported"],
        None,
    );
    check_fold(
        &p,
        RESOURCES,
        &resources
            .iter()
            .filter(|r| r["exported"] == true)
            .cloned()
            .collect::<Vec<_>>(),
        &[F::Count],
        &["type"],
        Some(json!(["=", "exported", true])),
    );
}

#[test]
fn a_node_both_backends_hold_is_counted_once() {
    let env = env();
    let names = names();
    let shared = env.fixture.active_in_all();
    assert!(
        !shared.is_empty(),
        "the fixture has nodes both backends hold"
    );
    let p = pdbmux("agg-shared-node");
    for c in shared {
        let owner = env.fixture.freshness_winner(c).expect("active");
        let state = env.fixture.state(c, owner).expect("state");
        let by_c = json!(["=", "certname", c]);
        let q = extract(&[F::Count], &[], Some(by_c.clone()));
        assert_eq!(
            combined_rows(&p, NODES, &q),
            vec![json!({"count": 1})],
            "{c} ({}): /nodes {q}",
            scenario(c)
        );
        let q = extract(
            &[F::Count],
            &["name"],
            Some(json!(["and", by_c, ["=", "name", "kernel"]])),
        );
        assert_eq!(
            combined_rows(&p, FACTS, &q),
            vec![json!({"count": 1, "name": "kernel"})],
            "{c} ({}): /facts {q}",
            scenario(c)
        );
        let q = extract(&[F::Count], &[], Some(json!(["=", "certname", c])));
        assert_eq!(
            combined_rows(&p, RESOURCES, &q),
            vec![json!({ "count": state.catalog_resources })],
            "{c} ({}): /resources {q}: the owner {owner}'s catalog (of {names:?})",
            scenario(c)
        );
    }
}

// --- /reports, /events (history: a report stored in several backends counts once) ----------

/// The rows of every backend with each report counted once (docs/merging.md, "History counted
/// once"): a row whose `identity` an earlier backend's row had is a copy of the same report.
fn once_per_report(answers: &[Vec<Value>], identity: impl Fn(&Value) -> String) -> Vec<Value> {
    let mut seen = BTreeSet::new();
    answers
        .iter()
        .flatten()
        .filter(|row| seen.insert(identity(row)))
        .cloned()
        .collect()
}

/// A report row's identity: its hash.
fn report_hash(row: &Value) -> String {
    row["hash"].to_string()
}

/// An event row's identity: the whole row (its report, resource, property and status).
fn event_identity(row: &Value) -> String {
    row.to_string()
}

/// Each backend's reports (hash, certname, status, producer_timestamp, environment).
fn report_rows(filter: Option<Value>) -> Vec<Vec<Value>> {
    let mut q = vec![
        json!("extract"),
        json!([
            "hash",
            "certname",
            "status",
            "producer_timestamp",
            "environment"
        ]),
    ];
    q.extend(filter);
    direct_records(REPORTS, &[("query", &Value::Array(q).to_string())])
}

fn in_range(ts: &Value, start: &str, end: &str) -> bool {
    let t = ts.as_str().and_then(instant);
    let (s, e) = (instant(start), instant(end));
    t.is_some() && t >= s && t < e
}

/// Puppetboard's daily chart: count by status over producer_timestamp ranges. Reports are history,
/// not node-scoped: every backend's reports count, a report stored in both once (see the
/// shared-report test below for that one).
#[test]
fn reports_daily_chart_counts_by_status() {
    let env = env();
    let answers = report_rows(None);
    let stored = answers.concat();
    let fixture_reports = stored.iter().filter(|r| is_fixture(certname(r))).count();
    assert_eq!(
        fixture_reports,
        env.fixture.reports.len(),
        "the backends' reports"
    );
    let all: Vec<Value> = once_per_report(&answers, report_hash);
    assert!(all.len() < stored.len(), "some report is stored in both");
    let loaded = epoch_seconds(&env.fixture.loaded_at).expect("loaded_at");
    let at = |minutes: i64| timestamp_micros(loaded - minutes * 60);
    // Quarter-hour buckets over the fixture's hour (report times fall on bucket edges too), and
    // Puppetboard's whole-day bucket.
    let mut ranges: Vec<(String, String)> = [(60, 45), (45, 30), (30, 15), (15, -1)]
        .iter()
        .map(|&(from, to)| (at(from), at(to)))
        .collect();
    ranges.push((at(24 * 60), at(-24 * 60)));
    let p = pdbmux("agg-reports-chart");
    for (start, end) in &ranges {
        for environment in [None, Some("production"), Some("staging")] {
            let mut filter = vec![
                json!("and"),
                json!([">=", "producer_timestamp", start]),
                json!(["<", "producer_timestamp", end]),
            ];
            if let Some(e) = environment {
                filter.push(json!(["=", "environment", e]));
            }
            let rows: Vec<Value> = all
                .iter()
                .filter(|r| in_range(&r["producer_timestamp"], start, end))
                .filter(|r| environment.is_none_or(|e| r["environment"] == e))
                .cloned()
                .collect();
            check_fold(
                &p,
                REPORTS,
                &rows,
                &[F::Count],
                &["status"],
                Some(Value::Array(filter)),
            );
        }
    }
    // The chart of one node whose reports are in both backends (the older ones in the first).
    let c = env
        .fixture
        .scenario("moved-first-deactivated-second-active")[0];
    let (start, end) = &ranges[ranges.len() - 1];
    let rows: Vec<Value> = all.iter().filter(|r| certname(r) == c).cloned().collect();
    assert_eq!(rows.len(), 3, "{c}: reports in both backends");
    check_fold(
        &p,
        REPORTS,
        &rows,
        &[F::Count],
        &["status"],
        Some(json!([
            "and",
            [">=", "producer_timestamp", start],
            ["<", "producer_timestamp", end],
            ["=", "certname", c]
        ])),
    );
    check_fold(
        &p,
        REPORTS,
        &all,
        &[F::Count, F::Min("producer_timestamp"), F::Max("certname")],
        &["status", "environment"],
        None,
    );
}

fn event_rows(filter: Option<Value>) -> Vec<Vec<Value>> {
    let mut q = vec![
        json!("extract"),
        json!([
            "certname",
            "report",
            "status",
            "resource_type",
            "resource_title",
            "property",
            "timestamp",
            "environment"
        ]),
    ];
    q.extend(filter);
    direct_records(EVENTS, &[("query", &Value::Array(q).to_string())])
}

/// /events count by status: every backend's events count (a union, not node-scoped), the events
/// of a report stored in both once.
#[test]
fn events_counts_by_status() {
    let env = env();
    let answers = event_rows(None);
    let stored: usize = env
        .fixture
        .nodes
        .values()
        .flat_map(|n| n.backends.values())
        .map(|s| s.event_statuses.len())
        .sum();
    assert_eq!(
        answers
            .concat()
            .iter()
            .filter(|e| is_fixture(certname(e)))
            .count(),
        stored,
        "the backends' events"
    );
    let all = once_per_report(&answers, event_identity);
    assert!(
        all.len() < answers.concat().len(),
        "some report is stored in both"
    );
    let p = pdbmux("agg-events");
    let got = check_fold(&p, EVENTS, &all, &[F::Count], &["status"], None);
    eprintln!("/events count by status: {got:?}");
    check_fold(
        &p,
        EVENTS,
        &all,
        &[F::Count, F::Max("timestamp")],
        &["resource_type", "status"],
        None,
    );
    check_fold(
        &p,
        EVENTS,
        &all.iter()
            .filter(|e| e["environment"] == "staging")
            .cloned()
            .collect::<Vec<_>>(),
        &[F::Count],
        &["status"],
        Some(json!(["=", "environment", "staging"])),
    );
}

/// A report a node sent to both backends is stored in each; the /reports record union (deduped
/// by hash) serves it once, and a history aggregate counts it once too (docs/merging.md,
/// "History counted once"): each backend's count less what the other stores as well.
#[test]
fn a_report_stored_in_both_backends_is_counted_once_by_a_history_aggregate() {
    let env = env();
    let c = env.fixture.scenario("both-same-report")[0];
    let by_c = json!(["=", "certname", c]);
    let p = pdbmux("agg-shared-report");
    let per_backend = report_rows(Some(by_c.clone()));
    let union: BTreeSet<String> = records(&combined(&p, REPORTS, &[("query", &by_c.to_string())]))
        .iter()
        .map(|r| r["hash"].as_str().unwrap_or_default().to_owned())
        .collect();
    let distinct: BTreeSet<String> = per_backend
        .concat()
        .iter()
        .map(|r| r["hash"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert_eq!(union, distinct, "{c}: /reports serves each hash once");
    let rows: Vec<Value> = once_per_report(&per_backend, report_hash);
    assert!(
        rows.len() < per_backend.concat().len(),
        "{c}: a report in both"
    );
    let q = extract(&[F::Count], &["status"], Some(by_c));
    let got = combined_rows(&p, REPORTS, &q);
    let want = fold(&rows, &["status"], &[F::Count]);
    assert_rows(
        &format!("/reports {q}: {c}'s reports, each once"),
        &got,
        &want,
        &["status"],
    );
}

// --- node-scoped queries on history: latest_report? and node_state (D4) ----------------------

/// D4: `latest_report?` queries are node-scoped, so each node's latest report counts once, from
/// the backend holding its newest report, whatever its node state there (moved-a-to-b is
/// deactivated in the first backend and active in the second). `node_state any` counts every
/// certname once, as the /nodes record merge of the same query serves it.
#[test]
fn latest_report_aggregates_count_each_node_once() {
    let owners = latest_report_owners();
    let latest = json!(["=", "latest_report?", true]);
    let p = pdbmux("agg-latest-report");
    let mut failures = Vec::new();
    let mut check = |path: &str, rows: Vec<Value>, funcs: &[F], keys: &[&str]| {
        let q = extract(funcs, keys, Some(latest.clone()));
        let got = combined_rows(&p, path, &q);
        let want = fold(&rows, keys, funcs);
        failures.extend(rows_mismatch(&format!("{path} {q}"), &got, &want, keys));
    };
    let reports = owned(&report_rows(Some(latest.clone())), &owners);
    let per_node: BTreeSet<&str> = reports.iter().map(certname).collect();
    assert_eq!(per_node.len(), reports.len(), "one latest report per node");
    check(REPORTS, reports.clone(), &[F::Count], &["status"]);
    check(
        EVENTS,
        owned(&event_rows(Some(latest.clone())), &owners),
        &[F::Count],
        &["status"],
    );
    // node_state any: every node once, active or not.
    let any = json!(["=", "node_state", "any"]);
    let q = extract(&[F::Count], &[], Some(any));
    let want = json!([{ "count": owners.len() }]);
    let got = Value::Array(combined_rows(&p, NODES, &q));
    if got != want {
        failures.push(format!(
            "/nodes {q}: {got} (expected {want}: {} distinct certnames, active or not)",
            owners.len()
        ));
    }
    assert!(
        failures.is_empty(),
        "{} of 3 checks failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

// --- paging on folded extracts ----------------------------------------------------------------

#[test]
fn folded_windows_are_cut_after_the_fold() {
    let env = env();
    let resources = owned_resources(&owners());
    let by_type = fold(&resources, &["type"], &[F::Count]);
    let n = by_type.len();
    assert!(n >= 4, "several resource types: {by_type:?}");
    let logs = AccessLog::mark_all(env).expect("mark the access logs");
    let tag = marker("agg-paging");
    // A filter naming the marker, so the upstream requests can be found in the access logs.
    let filter = json!(["not", ["=", "certname", tag]]);
    let q = extract(&[F::Count], &["type"], Some(filter)).to_string();
    let p = pdbmux("agg-paging");
    for descending in [false, true] {
        let mut sorted = by_type.clone();
        sorted.sort_by(|a, b| compare_values(a.get("type"), b.get("type")));
        if descending {
            sorted.reverse();
        }
        let order_by =
            json!([{ "field": "type", "order": if descending { "desc" } else { "asc" } }])
                .to_string();
        for (offset, limit) in [(0, 2), (1, 2), (n - 2, 5), (n, 3)] {
            let (o, l) = (offset.to_string(), limit.to_string());
            let params = [
                ("query", q.as_str()),
                ("order_by", order_by.as_str()),
                ("offset", o.as_str()),
                ("limit", l.as_str()),
                ("include_total", "true"),
            ];
            let r = combined(&p, RESOURCES, &params);
            let want = window(&sorted, offset, Some(limit));
            let got = records(&r);
            assert_eq!(
                got.iter().map(|g| g["type"].clone()).collect::<Vec<_>>(),
                want.iter().map(|w| w["type"].clone()).collect::<Vec<_>>(),
                "{params:?}: the window's groups"
            );
            assert_rows(&format!("{params:?}"), &got, &want, &["type"]);
            // The merged group count, not the backends' summed X-Records (shared types count once).
            assert_eq!(x_records(&r), Some(n as u64), "{params:?}: X-Records");
        }
    }
    // order_by on a function's column: PuppetDB refuses it; pdbmux answers as PuppetDB does.
    for f in [F::Count, F::Avg("value")] {
        let q = extract(
            &[f],
            &["name"],
            Some(json!(["=", "name", "uptime_seconds"])),
        );
        let order_by = json!([{ "field": f.column(), "order": "desc" }]).to_string();
        let params = [("query", q.to_string()), ("order_by", order_by)];
        let params: Vec<(&str, &str)> = params.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let want = direct(env.first(), FACTS, &params);
        let got = get(&p, FACTS, &params);
        eprintln!(
            "order_by on {}: PuppetDB {} {:?}; pdbmux {} {:?}",
            f.column(),
            want.status,
            want.body.trim(),
            got.status,
            got.body.trim()
        );
        assert_eq!(got.status, want.status, "{params:?}: {got:?}");
        if want.status == 200 {
            assert_rows(
                &format!("{params:?}"),
                &records(&got),
                &records(&want),
                &["name"],
            );
        }
    }
    // limit and offset never went upstream with the folded extract.
    if logs.is_empty() {
        eprintln!("no E2E_ACCESS_LOGS: upstream paging not checked");
        return;
    }
    for log in &logs {
        assert!(
            log.wait_for(&tag, Duration::from_secs(5))
                .expect("read the access log"),
            "no folded request reached {log}"
        );
        let forwarded: Vec<String> = log
            .new_lines()
            .expect("read the access log")
            .into_iter()
            .filter(|l| l.contains(&tag))
            .filter(|l| l.contains("limit=") || l.contains("offset="))
            .collect();
        assert!(
            forwarded.is_empty(),
            "limit/offset forwarded to {log}: {forwarded:#?}"
        );
    }
}

// --- refusals ---------------------------------------------------------------------------------

/// A request pdbmux refuses: what it shows, the path, the query, extra parameters, a word the
/// refusal must name.
type Refusal<'a> = (&'a str, &'a str, Value, Vec<(&'a str, &'a str)>, &'a str);

#[test]
fn refusals_are_400_and_never_reach_a_backend() {
    let env = env();
    let logs = AccessLog::mark_all(env).expect("mark the access logs");
    let tag = marker("agg-refusal");
    let by_tag = json!(["not", ["=", "certname", tag]]);
    let p = pdbmux("agg-refusals");
    let loaded = epoch_seconds(&env.fixture.loaded_at).expect("loaded_at");
    let (start, end) = (
        timestamp_micros(loaded - 3600 * 2),
        timestamp_micros(loaded + 3600),
    );
    let cases: Vec<Refusal<'_>> = vec![
        (
            "the same function twice",
            FACTS,
            json!([
                "extract",
                [["function", "count"], ["function", "count"], "name"],
                by_tag,
                ["group_by", "name"]
            ]),
            vec![],
            "count",
        ),
        (
            "min twice",
            NODES,
            json!([
                "extract",
                [
                    ["function", "min", "certname"],
                    ["function", "min", "report_timestamp"]
                ],
                by_tag
            ]),
            vec![],
            "min",
        ),
        (
            "avg with sum",
            FACTS,
            json!([
                "extract",
                [
                    ["function", "avg", "value"],
                    ["function", "sum", "value"],
                    "name"
                ],
                by_tag,
                ["group_by", "name"]
            ]),
            vec![],
            "sum",
        ),
        (
            "avg with count",
            FACTS,
            json!([
                "extract",
                [["function", "avg", "value"], ["function", "count"], "name"],
                by_tag,
                ["group_by", "name"]
            ]),
            vec![],
            "count",
        ),
        (
            "a function with no combiner",
            FACTS,
            json!([
                "extract",
                [["function", "stddev", "value"], "name"],
                by_tag,
                ["group_by", "name"]
            ]),
            vec![],
            "stddev",
        ),
        (
            "distinct_resources with a function",
            EVENTS,
            json!([
                "extract",
                [["function", "count"], "status"],
                by_tag,
                ["group_by", "status"]
            ]),
            vec![
                ("distinct_resources", "true"),
                ("distinct_start_time", start.as_str()),
                ("distinct_end_time", end.as_str()),
            ],
            "distinct_resources",
        ),
    ];
    for (what, path, q, extra, names) in &cases {
        let q = q.to_string();
        let mut params = vec![("query", q.as_str())];
        params.extend(extra.iter().copied());
        let r = get(&p, path, &params);
        assert_eq!(r.status, 400, "{what}: {path} {params:?}: {r:?}");
        assert!(
            r.body.contains(names),
            "{what}: the refusal names {names:?}: {:?}",
            r.body
        );
        eprintln!("{what}: 400 {:?}", r.body.trim());
    }
    if logs.is_empty() {
        eprintln!("no E2E_ACCESS_LOGS: backend access logs not checked");
        return;
    }
    // Control: distinct_resources without a function column is forwarded untouched.
    let control = json!(["extract", ["certname", "status"], by_tag]).to_string();
    let r = get(
        &p,
        EVENTS,
        &[
            ("query", &control),
            ("distinct_resources", "true"),
            ("distinct_start_time", &start),
            ("distinct_end_time", &end),
        ],
    );
    eprintln!(
        "control (distinct_resources, no function): {} {:?}",
        r.status,
        r.body.chars().take(200).collect::<String>()
    );
    for log in &logs {
        assert!(
            log.wait_for("distinct_resources=true", Duration::from_secs(10))
                .expect("read the access log"),
            "the forwarded control request never appeared in {log}"
        );
        let lines: Vec<String> = log
            .new_lines()
            .expect("read the access log")
            .into_iter()
            .filter(|l| l.contains(&tag))
            .collect();
        assert_eq!(
            lines.len(),
            1,
            "only the control request reached {log}: {lines:#?}"
        );
        assert!(lines[0].contains("distinct_resources=true"), "{lines:?}");
    }
}

// --- /event-counts, /aggregate-event-counts ---------------------------------------------------

const COUNT_FIELDS: [&str; 4] = ["successes", "failures", "noops", "skips"];

fn subject_key(row: &Value) -> String {
    json!([row["subject_type"], row["subject"]]).to_string()
}

/// Sums event-count rows per subject (the first row's other fields kept).
fn sum_subjects(answers: &[Vec<Value>]) -> Vec<Value> {
    let mut out: BTreeMap<String, Value> = BTreeMap::new();
    for row in answers.iter().flatten() {
        match out.get_mut(&subject_key(row)) {
            None => {
                out.insert(subject_key(row), row.clone());
            }
            Some(held) => {
                for f in COUNT_FIELDS {
                    let sum = held[f].as_i64().unwrap_or(0) + row[f].as_i64().unwrap_or(0);
                    held[f] = json!(sum);
                }
            }
        }
    }
    out.into_values().collect()
}

/// `counts_filter` `[op, field, n]` (and `and`/`or`/`not` of them) on one merged row.
fn counts_match(filter: &Value, row: &Value) -> bool {
    let parts = filter.as_array().expect("a counts_filter array");
    let op = parts[0].as_str().expect("an operator");
    match op {
        "and" => parts[1..].iter().all(|f| counts_match(f, row)),
        "or" => parts[1..].iter().any(|f| counts_match(f, row)),
        "not" => !counts_match(&parts[1], row),
        _ => {
            let field = parts[1].as_str().expect("a field");
            let (x, n) = (
                row[field].as_i64().expect("a count"),
                parts[2].as_i64().expect("n"),
            );
            match op {
                "=" => x == n,
                ">" => x > n,
                ">=" => x >= n,
                "<" => x < n,
                "<=" => x <= n,
                other => panic!("counts_filter operator {other}"),
            }
        }
    }
}

/// /aggregate-event-counts from merged per-subject rows (D5): per summarize_by value the number
/// of subjects with at least one event of each status, and the number of subjects.
fn summarize(summarize_by: &str, rows: &[Value]) -> Value {
    let with = |f: &str| {
        rows.iter()
            .filter(|r| r[f].as_i64().unwrap_or(0) > 0)
            .count()
    };
    json!({
        "summarize_by": summarize_by,
        "successes": with("successes"),
        "failures": with("failures"),
        "noops": with("noops"),
        "skips": with("skips"),
        "total": rows.len(),
    })
}

/// Each backend's event-count rows for `query` and `params`; with `restrict`, the backend's
/// query is ANDed with what `restrict` gives for its index (None: that backend is not asked).
fn direct_event_counts(
    query: &Value,
    params: &[(&str, &str)],
    restrict: Option<&dyn Fn(usize) -> Option<Value>>,
) -> Vec<Vec<Value>> {
    backends()
        .iter()
        .enumerate()
        .map(|(i, b)| {
            let q = match restrict {
                None => query.clone(),
                Some(f) => match f(i) {
                    None => return Vec::new(),
                    Some(extra) => json!(["and", query, extra]),
                },
            };
            let q = q.to_string();
            let mut all = vec![("query", q.as_str())];
            all.extend(params.iter().copied());
            let r = direct(b, EVENT_COUNTS, &all);
            assert_eq!(r.status, 200, "{} {EVENT_COUNTS} {all:?}: {r:?}", b.name);
            records(&r)
        })
        .collect()
}

fn assert_subjects(what: &str, got: &[Value], want: &[Value]) {
    let index = |rows: &[Value]| -> BTreeMap<String, Value> {
        rows.iter().map(|r| (subject_key(r), r.clone())).collect()
    };
    assert_eq!(
        got.len(),
        index(got).len(),
        "{what}: a subject served twice: {got:?}"
    );
    assert_eq!(index(got), index(want), "{what}");
}

/// The event-count order fields, read from a row (certname/resource/class live in `subject`).
fn event_count_field<'a>(row: &'a Value, field: &str) -> Option<&'a Value> {
    match field {
        "certname" | "resource_title" | "containing_class" => row["subject"].get("title"),
        "resource_type" => row["subject"].get("type"),
        _ => row.get(field),
    }
}

#[test]
fn event_counts_are_summed_per_subject() {
    let env = env();
    let query = json!([
        "~",
        "certname",
        format!("\\.{}$", env.fixture.domain.replace('.', "\\."))
    ]);
    let q = query.to_string();
    let p = pdbmux("agg-event-counts");
    for summarize_by in ["certname", "resource", "containing_class"] {
        for count_by in [None, Some("certname")] {
            let mut params = vec![("summarize_by", summarize_by)];
            params.extend(count_by.map(|c| ("count_by", c)));
            let mut all = vec![("query", q.as_str())];
            all.extend(params.iter().copied());
            let want = union_records(EVENT_COUNTS, &all);
            let got = records(&combined(&p, EVENT_COUNTS, &all));
            assert_subjects(&format!("{EVENT_COUNTS} {all:?}"), &got, &want);
        }
    }

    // counts_filter applies to the merged counts: a subject whose count passes only once both
    // backends' counts are merged is kept. The threshold is the largest count one backend alone
    // has for a subject whose merged count is larger (a node with reports in both).
    let params = [("summarize_by", "certname")];
    let merged = union_records(EVENT_COUNTS, &[("query", q.as_str()), params[0]]);
    let own = direct_event_counts(&query, &params, None);
    let alone = |row: &Value| -> i64 {
        own.iter()
            .flatten()
            .filter(|o| subject_key(o) == subject_key(row))
            .filter_map(|o| o["successes"].as_i64())
            .max()
            .unwrap_or(0)
    };
    let threshold = merged
        .iter()
        .find(|r| r["successes"].as_i64().unwrap_or(0) > alone(r))
        .map(alone)
        .expect("a subject with successes in both backends");
    let filter = json!([">", "successes", threshold]);
    let want: Vec<Value> = merged
        .iter()
        .filter(|r| counts_match(&filter, r))
        .cloned()
        .collect();
    assert!(
        want.iter().any(|r| alone(r) <= threshold),
        "a subject passes {filter} only after the merge"
    );
    let f = filter.to_string();
    let all = [
        ("query", q.as_str()),
        ("summarize_by", "certname"),
        ("counts_filter", f.as_str()),
    ];
    let got = records(&combined(&p, EVENT_COUNTS, &all));
    assert_subjects(&format!("{EVENT_COUNTS} {all:?}"), &got, &want);

    // order_by and the window on the merged rows.
    let order = [("successes", true), ("certname", false)];
    let order_by = json!([
        {"field": "successes", "order": "desc"},
        {"field": "certname", "order": "asc"}
    ])
    .to_string();
    let mut sorted = merged.clone();
    sorted.sort_by(|a, b| {
        order
            .iter()
            .map(|(f, desc)| {
                let o = compare_values(event_count_field(a, f), event_count_field(b, f));
                if *desc {
                    o.reverse()
                } else {
                    o
                }
            })
            .find(|o| o.is_ne())
            .unwrap_or(std::cmp::Ordering::Equal)
    });
    for (offset, limit) in [(0, 3), (1, 4), (sorted.len() - 2, 5)] {
        let (o, l) = (offset.to_string(), limit.to_string());
        let all = [
            ("query", q.as_str()),
            ("summarize_by", "certname"),
            ("order_by", order_by.as_str()),
            ("offset", o.as_str()),
            ("limit", l.as_str()),
        ];
        let got = records(&combined(&p, EVENT_COUNTS, &all));
        assert_eq!(got, window(&sorted, offset, Some(limit)), "{all:?}");
    }
}

#[test]
fn aggregate_event_counts_are_computed_from_the_merged_subjects() {
    let env = env();
    let query = json!([
        "~",
        "certname",
        format!("\\.{}$", env.fixture.domain.replace('.', "\\."))
    ]);
    let q = query.to_string();
    // The definition, checked on each backend alone: its own aggregate-event-counts equals the
    // summary of its own event-counts.
    for b in backends() {
        let rows = records(&direct(
            b,
            EVENT_COUNTS,
            &[("query", &q), ("summarize_by", "resource")],
        ));
        let own = json_of(&direct(
            b,
            AGGREGATE_EVENT_COUNTS,
            &[("query", &q), ("summarize_by", "resource")],
        ));
        assert_eq!(own, json!([summarize("resource", &rows)]), "{}", b.name);
    }
    let p = pdbmux("agg-aggregate-event-counts");
    for (summarize_by, counts_filter) in [
        ("certname", None),
        ("certname,resource", None),
        ("containing_class", None),
        ("certname", Some(json!([">", "successes", 2]))),
        ("resource", Some(json!(["<", "noops", 1]))),
        (
            "certname,containing_class",
            Some(json!([">=", "failures", 1])),
        ),
    ] {
        let cf = counts_filter.as_ref().map(Value::to_string);
        let mut all = vec![("query", q.as_str()), ("summarize_by", summarize_by)];
        all.extend(cf.as_deref().map(|f| ("counts_filter", f)));
        let want = union_records(AGGREGATE_EVENT_COUNTS, &all);
        let got = json_of(&combined(&p, AGGREGATE_EVENT_COUNTS, &all));
        assert_eq!(got, Value::Array(want), "{AGGREGATE_EVENT_COUNTS} {all:?}");
    }
    // A counts_filter PuppetDB refuses (it has no boolean operators) is refused alike.
    let bad = json!(["and", [">", "failures", 0], ["=", "noops", 0]]).to_string();
    let all = [
        ("query", q.as_str()),
        ("summarize_by", "resource"),
        ("counts_filter", bad.as_str()),
    ];
    for path in [EVENT_COUNTS, AGGREGATE_EVENT_COUNTS] {
        let want = direct(env.first(), path, &all);
        let got = get(&p, path, &all);
        assert_eq!(
            (got.status, want.status),
            (400, 400),
            "{path} {all:?}: pdbmux {got:?}, PuppetDB {want:?}"
        );
    }
}

#[test]
fn latest_report_event_counts_take_each_node_from_its_owner() {
    let env = env();
    let owners = latest_report_owners();
    let names = names();
    let query = json!(["=", "latest_report?", true]);
    let q = query.to_string();
    let owned_by = |i: usize| -> Option<Value> {
        let mine: Vec<&str> = owners
            .iter()
            .filter(|(_, o)| **o == i)
            .map(|(c, _)| c.as_str())
            .collect();
        (!mine.is_empty()).then(|| json!(["in", "certname", ["array", mine]]))
    };
    // Cross-check the reference with the fixture: per node the latest run of its owner.
    let by_node = sum_subjects(&direct_event_counts(
        &query,
        &[("summarize_by", "certname")],
        Some(&owned_by),
    ));
    for row in &by_node {
        let c = row["subject"]["title"].as_str().expect("a certname");
        if !is_fixture(c) {
            continue;
        }
        let owner = names[owners[c]];
        let state = env.fixture.state(c, owner).expect("state");
        let mut statuses: Vec<String> = Vec::new();
        for (f, status) in [
            ("successes", "success"),
            ("failures", "failure"),
            ("noops", "noop"),
            ("skips", "skipped"),
        ] {
            for _ in 0..row[f].as_i64().unwrap_or(0) {
                statuses.push(status.to_owned());
            }
        }
        statuses.sort();
        let kind = state.latest_report_kind.as_deref().unwrap_or("none");
        let mut want: Vec<String> = match kind {
            "changed" => vec!["success", "success"],
            "failed" => vec!["success", "failure", "skipped"],
            "noop" => vec!["noop"],
            _ => vec![],
        }
        .into_iter()
        .map(str::to_owned)
        .collect();
        want.sort();
        assert_eq!(statuses, want, "{c}: its latest run ({kind}) in {owner}");
    }

    let p = pdbmux("agg-latest-event-counts");
    let mut failures = Vec::new();
    for summarize_by in ["certname", "resource", "containing_class"] {
        let params = [("summarize_by", summarize_by)];
        let want = sum_subjects(&direct_event_counts(&query, &params, Some(&owned_by)));
        let all = [("query", q.as_str()), ("summarize_by", summarize_by)];
        let got = records(&combined(&p, EVENT_COUNTS, &all));
        let index = |rows: &[Value]| -> BTreeMap<String, Value> {
            rows.iter().map(|r| (subject_key(r), r.clone())).collect()
        };
        let (g, w) = (index(&got), index(&want));
        for k in g.keys().chain(w.keys()).collect::<BTreeSet<_>>() {
            if g.get(k) != w.get(k) {
                failures.push(format!(
                    "{EVENT_COUNTS} {all:?}: {k}: pdbmux {:?}, expected {:?}",
                    g.get(k).map(|r| COUNT_FIELDS.map(|f| r[f].clone())),
                    w.get(k).map(|r| COUNT_FIELDS.map(|f| r[f].clone()))
                ));
            }
        }
        let summary = json!([summarize(summarize_by, &want)]);
        let got = json_of(&combined(&p, AGGREGATE_EVENT_COUNTS, &all));
        if got != summary {
            failures.push(format!(
                "{AGGREGATE_EVENT_COUNTS} {all:?}: {got}, expected {summary}"
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "latest_report? counts (each node's latest report from the backend holding its newest \
         report, {names:?}):\n{}",
        failures.join("\n")
    );
}

// --- metrics ----------------------------------------------------------------------------------

const POPULATION: &str = "puppetlabs.puppetdb.population";

fn mbean_value(r: &Response) -> Value {
    assert_eq!(r.status, 200, "{r:?}");
    let body = json_of(r);
    assert_eq!(body["status"], 200, "{body}");
    body["value"].clone()
}

#[test]
fn population_metrics_count_the_estate_once() {
    let owners = owners();
    let nodes = owners.len();
    let p = pdbmux("agg-population");
    let population = |r: &Response| mbean_value(r)["Value"].clone();
    // What one PuppetDB holding the whole estate counts: num-resources every catalog's
    // resources, inactive nodes' included (its own metric reads PostgreSQL's row estimate, so
    // the exact count is asked of it), avg-resources-per-node that over every certname, as a
    // Clojure ratio.
    let union = env().union.as_ref().map(|union| {
        let count = |path: &str| {
            let q = json!([
                "extract",
                [["function", "count"]],
                ["=", "node_state", "any"]
            ]);
            json_of(&direct(union, path, &[("query", &q.to_string())]))[0]["count"]
                .as_u64()
                .unwrap_or_else(|| panic!("the union's count of {path}"))
        };
        (count(RESOURCES), count(NODES))
    });
    // Puppetboard sends the MBean name percent-encoded; either form is the same MBean.
    for encoded in [false, true] {
        let path = |name: &str| {
            let mbean = format!("{POPULATION}:name={name}");
            let mbean = if encoded {
                mbean.replace(':', "%3A").replace('=', "%3D")
            } else {
                mbean
            };
            format!("/metrics/v2/read/{mbean}")
        };
        let got_nodes = population(&get(&p, &path("num-nodes"), &[]));
        assert_eq!(
            got_nodes,
            json!(nodes),
            "num-nodes (encoded {encoded}): the distinct active certnames"
        );
        let got_resources = population(&get(&p, &path("num-resources"), &[]));
        let got_avg = population(&get(&p, &path("avg-resources-per-node"), &[]));
        match union {
            Some((resources, certnames)) => {
                assert_eq!(
                    got_resources,
                    json!(resources),
                    "num-resources: the union's count"
                );
                let gcd = (1..=certnames)
                    .rev()
                    .find(|d| resources % d == 0 && certnames % d == 0);
                let d = gcd.unwrap_or(1);
                let want = if certnames / d == 1 {
                    json!(resources / d)
                } else {
                    json!(format!("{}/{}", resources / d, certnames / d))
                };
                assert_eq!(
                    got_avg, want,
                    "avg-resources-per-node: {resources}/{certnames}"
                );
            }
            None => eprintln!("no E2E_UNION: num-resources {got_resources} not compared"),
        }
    }
}

/// A Dropwizard timer's attributes: the distribution ones combine by their own rule, the counter
/// adds, decaying rates add (bounded by the backends' rates read before and after).
#[test]
fn metrics_read_merges_attributes_by_name() {
    let mbean = "/metrics/v2/read/puppetlabs.puppetdb.mq:name=global.processing-time";
    let read = |b: &Backend| mbean_value(&direct(b, mbean, &[]));
    let p = pdbmux("agg-metrics-read");
    let mut attempt = 0;
    loop {
        attempt += 1;
        let before: Vec<Value> = backends().iter().map(read).collect();
        let r = get(&p, mbean, &[]);
        let after: Vec<Value> = backends().iter().map(read).collect();
        let merged = mbean_value(&r);
        let count = |v: &Value| v["Count"].as_i64().unwrap_or(-1);
        if before.iter().map(count).ne(after.iter().map(count)) && attempt < 5 {
            continue; // a command was processed meanwhile: read again
        }
        let (a, b) = (&after[0], &after[1]);
        let f = |v: &Value, k: &str| v[k].as_f64().unwrap_or(f64::NAN);
        let close = |x: f64, y: f64| (x - y).abs() <= 1e-9 * x.abs().max(y.abs()).max(1e-300);
        let mut problems = Vec::new();
        let obj = merged.as_object().expect("an object");
        let keys: BTreeSet<&String> = a
            .as_object()
            .into_iter()
            .chain(b.as_object())
            .flat_map(|o| o.keys())
            .collect();
        assert_eq!(
            obj.keys().collect::<BTreeSet<_>>(),
            keys,
            "the union of the attributes"
        );
        for (k, v) in obj {
            let (x, y) = (f(a, k), f(b, k));
            let ok = match k.as_str() {
                "Count" => v.as_i64() == Some(count(a) + count(b)),
                "Min" => close(f(&merged, k), x.min(y)),
                "Max" => close(f(&merged, k), x.max(y)),
                "Mean" | "StdDev" => close(f(&merged, k), (x + y) / 2.0),
                k if k.ends_with("Percentile") => close(f(&merged, k), (x + y) / 2.0),
                k if k.ends_with("Rate") => {
                    let sums = [f(&before[0], k) + f(&before[1], k), f(a, k) + f(b, k)];
                    let m = f(&merged, k);
                    let (lo, hi) = (sums[0].min(sums[1]), sums[0].max(sums[1]));
                    m >= lo * (1.0 - 1e-9) && m <= hi * (1.0 + 1e-9)
                }
                _ => v == &a[k], // strings: the first backend's
            };
            if !ok {
                problems.push(format!("{k}: {v} (backends {} and {})", a[k], b[k]));
            }
        }
        assert!(problems.is_empty(), "{mbean}:\n{}", problems.join("\n"));
        let body = json_of(&r);
        assert_eq!(
            body["request"]["mbean"],
            "puppetlabs.puppetdb.mq:name=global.processing-time"
        );
        assert_eq!(r.header("x-backends"), Some("2/2"), "{:?}", r.headers);
        break;
    }

    // An MBean no backend has: every backend's in-band error, so the first envelope is replayed.
    let missing = format!(
        "/metrics/v2/read/puppetlabs.puppetdb.mq:name={}",
        marker("nope")
    );
    let want = json_of(&direct(env().first(), &missing, &[]));
    assert_eq!(want["status"], 404, "{want}");
    let r = get(&p, &missing, &[]);
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(json_of(&r), want);
}

#[test]
fn metrics_list_is_the_union_and_v1_is_replayed() {
    let trees: Vec<Value> = backends()
        .iter()
        .map(|b| mbean_value(&direct(b, "/metrics/v2/list", &[])))
        .collect();
    let mut want: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for t in &trees {
        for (domain, beans) in t.as_object().expect("a tree") {
            let entry = want.entry(domain.clone()).or_default();
            entry.extend(beans.as_object().expect("beans").keys().cloned());
        }
    }
    let p = pdbmux("agg-metrics-list");
    let got = mbean_value(&get(&p, "/metrics/v2/list", &[]));
    let got: BTreeMap<String, BTreeSet<String>> = got
        .as_object()
        .expect("a tree")
        .iter()
        .map(|(d, beans)| {
            (
                d.clone(),
                beans.as_object().expect("beans").keys().cloned().collect(),
            )
        })
        .collect();
    assert_eq!(got, want, "/metrics/v2/list: the union of the MBean trees");

    // PuppetDB 7.12.1 has no /metrics/v1: every backend's 404 is replayed.
    let accept = [("Accept", "application/json")];
    let want =
        pdbmux_e2e::get_with_headers(&format!("{}/metrics/v1/mbeans", env().first().url), &accept)
            .expect("GET /metrics/v1/mbeans directly");
    assert_eq!(want.status, 404, "{want:?}");
    let r = pdbmux_e2e::get_with_headers(&p.url("/metrics/v1/mbeans"), &accept)
        .expect("GET /metrics/v1/mbeans through pdbmux");
    assert_eq!(r.status, 404, "{r:?}");
    assert_eq!(r.body, want.body);
    // PuppetDB's JSON error, labelled as pdbmux labels every JSON body it checked.
    assert!(
        want.content_type().starts_with("application/json"),
        "{want:?}"
    );
    assert_eq!(r.content_type(), "application/json;charset=utf-8");
}
