//! Helpers shared by the e2e test targets (`mod common;` in each). They panic with a message:
//! in a test, the panic is the failure report.

#![allow(dead_code)] // each test target uses its own subset

use pdbmux_core::membership::Kind;
use pdbmux_e2e::{Backend, E2eEnv, Pdbmux, Response};
use serde_json::{json, Value};

/// The harness's environment (E2E_*), read once.
pub fn env() -> &'static E2eEnv {
    E2eEnv::shared()
        .unwrap_or_else(|e| panic!("e2e environment (run the suite through e2e/run): {e}"))
}

/// A pdbmux in front of every backend with the harness defaults; `label` names its log file.
pub fn pdbmux(label: &str) -> Pdbmux {
    env()
        .pdbmux()
        .label(label)
        .spawn()
        .unwrap_or_else(|e| panic!("start pdbmux in front of both backends: {e}"))
}

/// GET through pdbmux with form-encoded `params`.
pub fn get(p: &Pdbmux, path: &str, params: &[(&str, &str)]) -> Response {
    p.get_query(path, params)
        .unwrap_or_else(|e| panic!("GET {path} {params:?} through pdbmux: {e}"))
}

/// GET from a backend directly with form-encoded `params`.
pub fn direct(b: &Backend, path: &str, params: &[(&str, &str)]) -> Response {
    b.get_query(path, params)
        .unwrap_or_else(|e| panic!("GET {path} {params:?} from {} directly: {e}", b.name))
}

/// A response body as JSON.
pub fn json_of(r: &Response) -> Value {
    r.json().unwrap_or_else(|e| panic!("{e}"))
}

/// `["=","certname",<certname>]` as query text.
pub fn certname_query(certname: &str) -> String {
    json!(["=", "certname", certname]).to_string()
}

/// The first certname of a scenario.
pub fn node_of(scenario: &str) -> &'static str {
    env()
        .fixture
        .scenario(scenario)
        .first()
        .copied()
        .unwrap_or_else(|| panic!("the fixture has no {scenario} node"))
}

/// A 200 answer's body as an array of records.
pub fn records(r: &Response) -> Vec<Value> {
    assert_eq!(r.status, 200, "{r:?}");
    match json_of(r) {
        Value::Array(items) => items,
        other => panic!("not a JSON array: {other}"),
    }
}

/// A record's `certname` (panics when it has none).
pub fn certname(record: &Value) -> &str {
    record["certname"]
        .as_str()
        .unwrap_or_else(|| panic!("no certname in {record}"))
}

#[allow(unused_imports)] // each test binary uses its own share of these
pub use pdbmux_e2e::differential::{multiset, x_records};

/// Every backend's own answer to `path` with `params`, in configured order (each must be 200).
pub fn direct_records(path: &str, params: &[(&str, &str)]) -> Vec<Vec<Value>> {
    env()
        .backends
        .iter()
        .map(|b| {
            let r = direct(b, path, params);
            assert_eq!(r.status, 200, "{} answers {path} {params:?}: {r:?}", b.name);
            records(&r)
        })
        .collect()
}

/// Every backend's X-Records for `path` with `params` and include_total=true, summed.
pub fn direct_total(path: &str, params: &[(&str, &str)]) -> u64 {
    let mut params = params.to_vec();
    params.push(("include_total", "true"));
    env()
        .backends
        .iter()
        .map(|b| {
            let r = direct(b, path, &params);
            assert_eq!(r.status, 200, "{} answers {path} {params:?}: {r:?}", b.name);
            x_records(&r).unwrap_or_else(|| panic!("{} sent no X-Records: {r:?}", b.name))
        })
        .sum()
}

/// The union PuppetDB's X-Records for `path` with `params` and include_total=true: what one
/// PuppetDB holding the whole estate counts. `None` when the harness started no union.
pub fn union_total(path: &str, params: &[(&str, &str)]) -> Option<u64> {
    let union = env().union.as_ref()?;
    let mut params = params.to_vec();
    params.push(("include_total", "true"));
    let r = direct(union, path, &params);
    assert_eq!(r.status, 200, "the union answers {path} {params:?}: {r:?}");
    Some(x_records(&r).unwrap_or_else(|| panic!("the union sent no X-Records: {r:?}")))
}

/// The union PuppetDB's records for `path` with `params`: what one PuppetDB holding the whole
/// estate answers. The differential tests need it; `e2e/run` always starts it.
pub fn union_records(path: &str, params: &[(&str, &str)]) -> Vec<Value> {
    let union = env()
        .union
        .as_ref()
        .expect("E2E_UNION: the union PuppetDB (e2e/run starts it)");
    let r = direct(union, path, params);
    assert_eq!(r.status, 200, "the union answers {path} {params:?}: {r:?}");
    records(&r)
}

/// A pdbmux in front of every backend with extra PDBMUX_* variables.
pub fn pdbmux_env(label: &str, vars: &[(&str, &str)]) -> Pdbmux {
    pdbmux_at(
        label,
        &env()
            .backends
            .iter()
            .map(|b| (b.name.as_str(), b.url.as_str()))
            .collect::<Vec<_>>(),
        vars,
    )
}

/// A pdbmux in front of the given `(name, url)` backends with extra PDBMUX_* variables.
pub fn pdbmux_at(label: &str, backends: &[(&str, &str)], vars: &[(&str, &str)]) -> Pdbmux {
    let mut builder = env().pdbmux_with(backends).label(label);
    for (k, v) in vars {
        builder = builder.env(k, v);
    }
    builder
        .spawn()
        .unwrap_or_else(|e| panic!("start pdbmux in front of {backends:?} with {vars:?}: {e}"))
}

/// GET /healthz: its status and body.
pub fn healthz(p: &Pdbmux) -> (u16, Value) {
    let r = get(p, "/healthz", &[]);
    (r.status, json_of(&r))
}

/// One backend's object in a /healthz body, by name.
pub fn healthz_backend<'a>(body: &'a Value, name: &str) -> &'a Value {
    body["backends"]
        .as_array()
        .and_then(|bs| bs.iter().find(|b| b["name"] == name))
        .unwrap_or_else(|| panic!("no backend {name} in /healthz {body}"))
}

/// The /nodes rule, computed from the backends' own answers (configured order) and what the
/// fixture says each backend was sent: per certname the record whose holding has the strictly
/// newer report_timestamp (none is older than any), then the facts produced later, then the
/// catalog produced later (producer times from the fixture: a node record carries none), a full
/// tie going to the earlier backend, its facts and catalog fields from those kinds' owners'
/// records. certname -> (backend index, record).
pub fn newer_wins(answers: &[Vec<Value>]) -> std::collections::BTreeMap<String, (usize, Value)> {
    let mut out = newer_wins_uncomposed(answers);
    compose(&mut out, answers);
    out
}

/// [`newer_wins`] without the composition: what a page of `/nodes` serves (a page holds a
/// window of each backend's records, docs/merging.md "Known limits").
pub fn newer_wins_uncomposed(
    answers: &[Vec<Value>],
) -> std::collections::BTreeMap<String, (usize, Value)> {
    let e2e = env();
    let freshness = |backend: usize, record: &Value| {
        let instant = |ts: Option<&str>| ts.and_then(pdbmux_e2e::order::instant);
        let held = e2e
            .fixture
            .nodes
            .get(certname(record))
            .and_then(|node| node.backends.get(&e2e.backends[backend].name));
        [
            instant(record["report_timestamp"].as_str()),
            instant(held.map(|h| h.facts_producer_timestamp.as_str())),
            instant(held.and_then(|h| h.catalog_producer_timestamp.as_deref())),
        ]
    };
    let mut out: std::collections::BTreeMap<String, (usize, Value)> = Default::default();
    for (i, recs) in answers.iter().enumerate() {
        for rec in recs {
            match out.get(certname(rec)) {
                Some((held_at, held)) if freshness(i, rec) <= freshness(*held_at, held) => {}
                _ => {
                    out.insert(certname(rec).to_owned(), (i, rec.clone()));
                }
            }
        }
    }
    out
}

/// The records composed: each one's facts and catalog fields are those kinds' owners' (D14),
/// from their records in `answers`.
fn compose(out: &mut std::collections::BTreeMap<String, (usize, Value)>, answers: &[Vec<Value>]) {
    let e2e = env();
    for (c, (_, record)) in out.iter_mut() {
        for (kind, fields) in [
            (Kind::Facts, ["facts_timestamp", "facts_environment"]),
            (Kind::Catalog, ["catalog_timestamp", "catalog_environment"]),
        ] {
            let Some(owner) = e2e.fixture.kind_owner(c, kind) else {
                continue;
            };
            let Some(at) = e2e.backends.iter().position(|b| b.name == owner) else {
                continue;
            };
            let Some(theirs) = answers[at].iter().find(|r| certname(r) == c) else {
                continue;
            };
            for field in fields {
                if let Some(value) = theirs.get(field) {
                    record[field] = value.clone();
                }
            }
        }
    }
}

/// Bytes of memory pdbmux holds read-only, private and anonymous (no file, inode 0): its sealed
/// cache bodies, and nothing else in pdbmux maps memory so. Summed, since the kernel may split
/// one body's mapping (huge pages) or merge neighbouring ones into one line.
pub fn sealed_bytes(p: &Pdbmux) -> usize {
    p.memory_maps()
        .expect("pdbmux's memory maps")
        .iter()
        .filter_map(|line| {
            // start-end perms offset dev inode [path]
            let fields: Vec<&str> = line.split_whitespace().collect();
            if fields.len() != 5 || fields[1] != "r--p" || fields[4] != "0" {
                return None;
            }
            let (start, end) = fields[0].split_once('-')?;
            let start = usize::from_str_radix(start, 16).ok()?;
            usize::from_str_radix(end, 16).ok()?.checked_sub(start)
        })
        .sum()
}
