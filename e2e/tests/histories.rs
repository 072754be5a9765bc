//! The history suite (docs/decisions.md, D23): pdbmux over two to four real PuppetDBs that were
//! sent a seeded fleet history (`e2e/histories/generate.py`: nodes moving through the backends,
//! commands delivered concurrently and out of order, reports sent twice, commands that missed a
//! backend, deactivations) answers every route of the route table as the union PuppetDB, which
//! was sent every command, does: whole, filtered, pinned to nodes, through subqueries, paged with
//! totals, projected, aggregated, as PQL, and the population metrics. Compared as
//! `pdbmux_e2e::differential` compares (less receipt times and `pdbmux_source`).
//!
//! Run by `e2e/run` (the history phase) with `E2E_HISTORY` naming the history file it just
//! sent; without it the suite has nothing to compare and says so. With `E2E_HISTORY_LATE`
//! naming the runs `generate.py --late` held back (while that file exists: the first binary
//! tested sends them), pdbmux builds its membership map first, the late runs are sent, and the
//! questions wait until pdbmux's refreshed map has caught up with them: what is checked is a
//! map kept over a changing estate, producer times learned again only where a copy changed. A difference prints the seed,
//! the question and a minimal diff; `E2E_HISTORY_SEED=<seed> e2e/run --histories-only`
//! replays it.

use std::path::PathBuf;

use pdbmux_e2e::differential::{mismatches, Compare, Question};
use pdbmux_e2e::{Backend, Pdbmux, PdbmuxBuilder};
use serde::Deserialize;
use serde_json::{json, Value};

/// The history file `generate.py --out` writes (the parts the suite reads).
#[derive(Debug, Deserialize)]
struct History {
    seed: u64,
    backends: Vec<Backend>,
    union: String,
    nodes: Vec<HistoryNode>,
    /// The split nodes of every history the backends hold (this one and those sent before it,
    /// read from the same directory): filled in by [`history`].
    #[serde(skip)]
    split_in_estate: Vec<String>,
}

#[derive(Debug, Deserialize)]
struct HistoryNode {
    certname: String,
    held_by: Vec<String>,
    facts_only: bool,
    /// Its newest facts, catalog and report are not all in one backend.
    split: bool,
}

const V4: &str = "/pdb/query/v4";
/// The Puppet Server every command of a history names (e2e/histories/generate.py's `PRODUCER`).
const PRODUCER: &str = "puppet.hist.test";

fn q(value: Value) -> String {
    value.to_string()
}

fn with_query(path: &str, query: Value) -> Question {
    Question::new(path, &[("query", q(query))])
}

/// The history of this run, or `None` (with a note) outside the history phase.
fn history() -> Option<History> {
    let Some(path) = std::env::var_os("E2E_HISTORY") else {
        eprintln!("no E2E_HISTORY: the history suite runs in e2e/run's history phase");
        return None;
    };
    let path = PathBuf::from(path);
    let read = |path: &std::path::Path| -> History {
        let text =
            std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    };
    let mut history = read(&path);
    // The backends (and the union) also hold every history sent before this one in the run.
    let dir = path.parent().expect("the history file is in a directory");
    for entry in std::fs::read_dir(dir).expect("the history directory") {
        let other = entry.expect("a directory entry").path();
        if other.extension().is_some_and(|e| e == "json") {
            let nodes = read(&other).nodes;
            history
                .split_in_estate
                .extend(nodes.into_iter().filter(|n| n.split).map(|n| n.certname));
        }
    }
    history.split_in_estate.sort();
    history.split_in_estate.dedup();
    Some(history)
}

/// Whether pdbmux runs with its cache at the defaults (`E2E_HISTORY_CACHE=1`), else off.
fn cache_on() -> bool {
    std::env::var("E2E_HISTORY_CACHE").as_deref() == Ok("1")
}

/// Whether every answer that can stream does (`E2E_HISTORY_STREAM=1`: `stream_above_bytes` 0),
/// so that the streamed merges, which only answers past 8 MiB take by default, are held to the
/// union on every question too.
fn stream_all() -> bool {
    std::env::var("E2E_HISTORY_STREAM").as_deref() == Ok("1")
}

fn pdbmux(history: &History) -> Pdbmux {
    let bin = std::env::var_os("E2E_BIN").expect("E2E_BIN names the binary");
    let state = std::env::var_os("E2E_STATE").map(PathBuf::from);
    let mut builder = PdbmuxBuilder::new(&PathBuf::from(bin), state.as_deref())
        .label(&format!(
            "history-{}-over-{}",
            history.seed,
            history.backends.len()
        ))
        // The map follows the late runs within a second (the default is 30 s).
        .env("PDBMUX_FRESHNESS_TTL", "1s");
    // Every question reads the backends: the cache would answer a later question from an
    // earlier answer, which is the cache's suite's business (a TTL of 0 turns each class off).
    // E2E_HISTORY_CACHE=1 keeps the defaults: the answers must be the same.
    if !cache_on() {
        for key in [
            "PDBMUX_FACTS_TTL",
            "PDBMUX_HISTORY_TTL",
            "PDBMUX_AGGREGATE_TTL",
        ] {
            builder = builder.env(key, "0");
        }
    }
    if stream_all() {
        builder = builder.env("PDBMUX_STREAM_ABOVE_BYTES", "0");
    }
    for backend in &history.backends {
        builder = builder.backend(&backend.name, &backend.url);
    }
    builder.spawn().expect("pdbmux starts")
}

/// Every node-owned entity with its environment field (`None`: it has none) and whether it
/// takes `node_state`.
const NODE_OWNED: [(&str, Option<&str>); 11] = [
    ("nodes", Some("facts_environment")),
    ("facts", Some("environment")),
    ("fact-contents", Some("environment")),
    ("factsets", Some("environment")),
    ("catalogs", Some("environment")),
    ("catalog-inputs", None),
    ("catalog-input-contents", None),
    ("edges", None),
    ("resources", Some("environment")),
    ("inventory", Some("environment")),
    ("package-inventory", Some("environment")),
];

/// `question` with the split nodes left out (known limits, docs/merging.md: a filter on `/nodes`
/// or a subquery across kinds of data is evaluated by each backend on its own copy; a page of
/// `/nodes` is not composed): into an extract's filter, as a conjunct, as the query, or for PQL
/// as a conjunct of its filter.
fn without_split(mut question: Question, split: &[&str]) -> Question {
    if split.is_empty() {
        return question;
    }
    let clause = json!(["not", ["in", "certname", ["array", split]]]);
    let Some(at) = question.params.iter().position(|(k, _)| k == "query") else {
        question
            .params
            .insert(0, ("query".to_owned(), clause.to_string()));
        return question;
    };
    let text = &question.params[at].1;
    let rewritten = match serde_json::from_str::<Value>(text) {
        Ok(query) if query.get(0) == Some(&json!("extract")) => {
            let mut items = query.as_array().cloned().unwrap_or_default();
            match items.get(2) {
                Some(filter) if filter.get(0) != Some(&json!("group_by")) => {
                    items[2] = json!(["and", filter, clause]);
                }
                _ => items.insert(2.min(items.len()), clause),
            }
            Value::Array(items).to_string()
        }
        Ok(query) => json!(["and", query, clause]).to_string(),
        Err(_) => {
            // PQL: `entity[...] { filter }`.
            let names: Vec<String> = split.iter().map(|c| format!("{c:?}")).collect();
            let not_split = format!("!(certname in [{}])", names.join(", "));
            match text.rfind('}') {
                Some(end) if text[..end].trim_end().ends_with('{') => {
                    format!("{} {not_split} }}", &text[..end])
                }
                Some(end) => format!("{} and {not_split} }}", &text[..end]),
                None => text.clone(),
            }
        }
    };
    question.params[at].1 = rewritten;
    question
}

/// The questions on every route of the table, for this history's nodes.
fn questions(history: &History) -> Vec<Question> {
    let moved: Vec<&str> = history
        .nodes
        .iter()
        .filter(|n| n.held_by.len() > 1)
        .map(|n| n.certname.as_str())
        .collect();
    let all: Vec<&str> = history.nodes.iter().map(|n| n.certname.as_str()).collect();
    let split: Vec<&str> = history.split_in_estate.iter().map(String::as_str).collect();
    let mut out = Vec::new();
    for (entity, environment) in NODE_OWNED {
        let path = format!("{V4}/{entity}");
        out.push(Question::new(&path, &[]));
        out.push(with_query(&path, json!(["=", "node_state", "any"])));
        out.push(with_query(&path, json!(["in", "certname", ["array", all]])));
        for certname in &moved {
            out.push(with_query(&path, json!(["=", "certname", certname])));
        }
        if let Some(field) = environment {
            for env in ["production", "staging"] {
                let question = with_query(&path, json!(["=", field, env]));
                out.push(match entity {
                    "nodes" => without_split(question, &split),
                    _ => question,
                });
            }
        }
    }
    out.extend(nodes_questions(&moved, &split));
    out.extend(facts_questions(&split));
    out.extend(resources_questions());
    out.extend(history_questions(&all));
    out.extend(union_questions());
    out.extend(pql_questions(&split));
    out.extend(sub_route_questions(&moved, &split));
    out
}

fn nodes_questions(moved: &[&str], split: &[&str]) -> Vec<Question> {
    let nodes = format!("{V4}/nodes");
    let mut out = vec![
        // Whole and ordered by certname: composed exactly, merged k-way when it streams.
        Question::new(
            &nodes,
            &[(
                "order_by",
                q(json!([{"field": "certname", "order": "desc"}])),
            )],
        ),
        with_query(
            &nodes,
            json!(["extract", ["certname", "latest_report_hash"]]),
        ),
        with_query(
            &nodes,
            json!([
                "extract",
                [["function", "count"]],
                ["=", "node_state", "any"]
            ]),
        ),
    ];
    // Filters: each backend evaluates them on its own record of a split node.
    let filtered = [
        with_query(&nodes, json!(["=", "catalog_environment", "production"])),
        with_query(&nodes, json!(["=", "report_environment", "staging"])),
        with_query(&nodes, json!(["=", "latest_report_status", "failed"])),
        with_query(
            &nodes,
            json!([
                "extract",
                [["function", "count"], "facts_environment"],
                ["group_by", "facts_environment"]
            ]),
        ),
        with_query(
            &nodes,
            json!([
                "in",
                "certname",
                [
                    "extract",
                    "certname",
                    [
                        "select_facts",
                        [
                            "and",
                            ["=", "name", "hist_env"],
                            ["=", "value", "production"]
                        ]
                    ]
                ]
            ]),
        ),
        with_query(
            &nodes,
            json!([
                "in",
                "certname",
                [
                    "extract",
                    "certname",
                    ["select_resources", ["=", "type", "Service"]]
                ]
            ]),
        ),
    ];
    out.extend(filtered.into_iter().map(|q| without_split(q, split)));
    // Paged: a page holds a window of each backend's records, not every kind's owner's.
    for offset in [0, 5, 10] {
        let page = Question::new(
            &nodes,
            &[
                ("order_by", q(json!([{"field": "certname"}]))),
                ("limit", "5".to_owned()),
                ("offset", offset.to_string()),
                ("include_total", "true".to_owned()),
            ],
        );
        out.push(without_split(page, split));
    }
    if let Some(certname) = moved.first() {
        out.push(with_query(
            &nodes,
            json!([
                "and",
                ["=", "certname", certname],
                ["=", "node_state", "any"]
            ]),
        ));
    }
    out
}

fn facts_questions(split: &[&str]) -> Vec<Question> {
    let facts = format!("{V4}/facts");
    let mut out = vec![
        with_query(&facts, json!(["=", "name", "hist_backend"])),
        with_query(
            &facts,
            json!(["and", ["=", "name", "hist_env"], ["=", "value", "staging"]]),
        ),
        with_query(
            &facts,
            json!(["extract", ["certname", "value"], ["=", "name", "hist_run"]]),
        ),
        with_query(
            &facts,
            json!(["extract", ["environment"], ["=", "name", "kernel"]]),
        ),
        with_query(
            &facts,
            json!([
                "extract",
                [["function", "count"], "name"],
                ["~", "name", "^hist"],
                ["group_by", "name"]
            ]),
        ),
        with_query(
            &facts,
            json!([
                "extract",
                [["function", "avg", "value"]],
                ["=", "name", "uptime_seconds"]
            ]),
        ),
        // Facts selected by their node's resources: across kinds of data.
        without_split(
            with_query(
                &facts,
                json!([
                    "and",
                    ["=", "name", "kernelrelease"],
                    [
                        "in",
                        "certname",
                        [
                            "extract",
                            "certname",
                            ["select_resources", ["=", "title", "nginx"]]
                        ]
                    ]
                ]),
            ),
            split,
        ),
        with_query(
            &format!("{V4}/fact-contents"),
            json!(["=", "path", ["os", "release", "minor"]]),
        ),
        with_query(
            &format!("{V4}/inventory"),
            json!(["=", "facts.hist_env", "production"]),
        ),
    ];
    // Ordered by another field than certname first: the other facts and the provenance
    // records are asked apart and merged in the order (a name constraint admitting the
    // provenance fact too).
    out.push(Question::new(
        &facts,
        &[
            ("query", q(json!(["=", "environment", "production"]))),
            (
                "order_by",
                q(json!([{"field": "name"}, {"field": "certname"}])),
            ),
        ],
    ));
    out.push(Question::new(
        &facts,
        &[
            (
                "query",
                q(json!([
                    "or",
                    ["=", "name", "hist_env"],
                    ["=", "name", "pdbmux_source"]
                ])),
            ),
            (
                "order_by",
                q(json!([{"field": "value", "order": "desc"}, {"field": "certname"}])),
            ),
        ],
    ));
    for offset in [0, 20] {
        out.push(Question::new(
            &facts,
            &[
                ("query", q(json!(["~", "name", "^hist"]))),
                (
                    "order_by",
                    q(json!([{"field": "certname"}, {"field": "name"}])),
                ),
                ("limit", "20".to_owned()),
                ("offset", offset.to_string()),
                ("include_total", "true".to_owned()),
            ],
        ));
    }
    out
}

fn resources_questions() -> Vec<Question> {
    let resources = format!("{V4}/resources");
    vec![
        with_query(&resources, json!(["=", "type", "File"])),
        with_query(&resources, json!(["=", "exported", true])),
        with_query(
            &resources,
            json!([
                "extract",
                [["function", "count"], "type"],
                ["group_by", "type"]
            ]),
        ),
        with_query(
            &resources,
            json!(["extract", ["title"], ["=", "type", "File"]]),
        ),
        Question::new(
            &resources,
            &[
                ("query", q(json!(["=", "type", "File"]))),
                (
                    "order_by",
                    q(json!([{"field": "certname"}, {"field": "title"}])),
                ),
                ("limit", "6".to_owned()),
                ("offset", "3".to_owned()),
                ("include_total", "true".to_owned()),
            ],
        ),
        Question::new(&format!("{resources}/File"), &[]),
        Question::new(&format!("{resources}/Service/nginx"), &[]),
    ]
}

fn history_questions(all: &[&str]) -> Vec<Question> {
    let (reports, events) = (format!("{V4}/reports"), format!("{V4}/events"));
    let latest = json!(["=", "latest_report?", true]);
    vec![
        Question::new(&reports, &[]),
        with_query(&reports, latest.clone()),
        with_query(&reports, json!(["in", "certname", ["array", all]])),
        with_query(&reports, json!(["extract", ["certname", "status"]])),
        with_query(&reports, json!(["extract", ["certname"], latest.clone()])),
        with_query(
            &reports,
            json!([
                "extract",
                [["function", "count"], "status"],
                latest.clone(),
                ["group_by", "status"]
            ]),
        ),
        Question::new(
            &reports,
            &[
                (
                    "order_by",
                    q(
                        json!([{"field": "producer_timestamp", "order": "desc"}, {"field": "certname"}]),
                    ),
                ),
                ("limit", "7".to_owned()),
                ("offset", "2".to_owned()),
                ("include_total", "true".to_owned()),
            ],
        ),
        Question::new(&events, &[]),
        with_query(&events, latest.clone()),
        with_query(&events, json!(["extract", ["certname"], latest.clone()])),
        with_query(
            &events,
            json!(["extract", ["certname", "status"], latest.clone()]),
        ),
        with_query(
            &events,
            json!([
                "extract",
                [["function", "count"], "status"],
                latest.clone(),
                ["group_by", "status"]
            ]),
        ),
        Question::new(
            &format!("{V4}/event-counts"),
            &[
                ("query", q(latest.clone())),
                ("summarize_by", "certname".to_owned()),
            ],
        ),
        Question::new(
            &format!("{V4}/aggregate-event-counts"),
            &[
                ("query", q(latest)),
                ("summarize_by", "containing_class".to_owned()),
            ],
        ),
    ]
}

fn union_questions() -> Vec<Question> {
    [
        "fact-names",
        "fact-paths",
        "environments",
        "producers",
        "packages",
    ]
    .iter()
    .map(|entity| Question::new(&format!("{V4}/{entity}"), &[]))
    .chain([with_query(
        &format!("{V4}/packages"),
        json!(["=", "package_name", "nginx"]),
    )])
    .collect()
}

fn pql_questions(split: &[&str]) -> Vec<Question> {
    [
        (
            "nodes",
            "nodes[certname] { facts_environment = \"production\" }",
        ),
        ("facts", "facts[certname, value] { name = \"hist_env\" }"),
        (
            "resources",
            "resources[certname, title] { type = \"File\" }",
        ),
        (
            "reports",
            "reports[certname, status] { latest_report? = true }",
        ),
        ("events", "events[certname] { latest_report? = true }"),
        ("nodes", "nodes[count()] { }"),
    ]
    .into_iter()
    .map(|(entity, pql)| {
        let question = Question::root(entity, pql.to_owned(), &[], Compare::Set);
        match pql.contains("facts_environment") {
            true => without_split(question, split),
            false => question,
        }
    })
    .collect()
}

fn sub_route_questions(moved: &[&str], split: &[&str]) -> Vec<Question> {
    let mut out: Vec<Question> = ["facts", "resources", "reports", "events"]
        .iter()
        .flat_map(|entity| {
            ["production", "staging"]
                .map(|env| Question::new(&format!("{V4}/environments/{env}/{entity}"), &[]))
        })
        .collect();
    out.push(Question::new(&format!("{V4}/environments/production"), &[]));
    // Below a parent no backend knows: PuppetDB's 404, whatever the query.
    out.push(Question::new(
        &format!("{V4}/environments/nowhere/facts"),
        &[],
    ));
    out.push(with_query(
        &format!("{V4}/environments/nowhere/reports"),
        json!(["extract", [["function", "count"]]]),
    ));
    out.push(Question::new(
        &format!("{V4}/producers/nowhere/catalogs"),
        &[],
    ));
    for entity in ["catalogs", "factsets", "reports"] {
        out.push(Question::new(
            &format!("{V4}/producers/{PRODUCER}/{entity}"),
            &[],
        ));
    }
    for certname in moved {
        // One node's record is its node owner's answer, not composed (docs/merging.md).
        if !split.contains(certname) {
            out.push(Question::new(&format!("{V4}/nodes/{certname}"), &[]));
        }
        for path in [
            format!("{V4}/nodes/{certname}/facts"),
            format!("{V4}/nodes/{certname}/resources"),
            format!("{V4}/factsets/{certname}"),
            format!("{V4}/factsets/{certname}/facts"),
            format!("{V4}/catalogs/{certname}"),
            format!("{V4}/catalogs/{certname}/resources"),
            format!("{V4}/package-inventory/{certname}"),
        ] {
            out.push(Question::new(&path, &[]));
        }
    }
    out
}

/// The population metrics against what the union counts: num-nodes its active nodes,
/// num-inactive-nodes the others, num-resources every catalog's resources (PuppetDB's own metric
/// reads a row estimate, so the exact count is asked of it).
fn population_mismatches(p: &Pdbmux, union: &Backend) -> Vec<String> {
    let count = |path: &str, state: &str| {
        let query = json!([
            "extract",
            [["function", "count"]],
            ["=", "node_state", state]
        ]);
        let r = union
            .get_query(path, &[("query", &query.to_string())])
            .expect("the union answers");
        r.json().expect("JSON")[0]["count"].clone()
    };
    let mut out = Vec::new();
    for (name, want) in [
        ("num-nodes", count(&format!("{V4}/nodes"), "active")),
        (
            "num-inactive-nodes",
            count(&format!("{V4}/nodes"), "inactive"),
        ),
        ("num-resources", count(&format!("{V4}/resources"), "any")),
    ] {
        let path = format!("/metrics/v2/read/puppetlabs.puppetdb.population:name={name}");
        let got = p.get(&path).expect("pdbmux answers");
        let got = got.json().expect("JSON")["value"]["Value"].clone();
        if got != want {
            out.push(format!("{path}: {got}, the union counts {want}"));
        }
    }
    out
}

/// Sends the runs `generate.py --late` held back if they are still to be sent; whether it did.
fn send_late() -> bool {
    let Some(late) = std::env::var_os("E2E_HISTORY_LATE").map(PathBuf::from) else {
        return false;
    };
    if !late.exists() {
        return false;
    }
    let generate = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("histories/generate.py");
    let sent = std::process::Command::new("python3")
        .arg(&generate)
        .arg("--send-late")
        .arg(&late)
        .status()
        .expect("run generate.py --send-late");
    assert!(sent.success(), "generate.py --send-late {}", late.display());
    true
}

/// Sends the runs `generate.py --late` held back, if they are still to be sent, after `p` built
/// its membership map over the history without them; then waits (at most a minute) until `p`
/// answers where each node's facts, catalog and latest report are as the union does, in every
/// node state, asking again as its map is refreshed. Says what it did.
fn send_late_runs(p: &Pdbmux, union: &Backend) {
    let first = p
        .get("/pdb/query/v4/nodes")
        .expect("pdbmux answers before the late runs");
    assert_eq!(first.status, 200, "{}", first.body);
    if !send_late() {
        return;
    }
    // Every node state: a late run can end in a deactivation, and a deactivated node's newest
    // facts must be in the map too before the questions (history seed 19 over 4 backends: the
    // check passed on active nodes while the map still had a deactivated node's older facts).
    let any = json!(["=", "node_state", "any"]);
    let newest = [
        with_query(
            &format!("{V4}/factsets"),
            json!(["extract", ["certname", "producer_timestamp"], any]),
        ),
        with_query(
            &format!("{V4}/catalogs"),
            json!(["extract", ["certname", "producer_timestamp"]]),
        ),
        with_query(
            &format!("{V4}/nodes"),
            json!([
                "extract",
                [
                    "certname",
                    "report_timestamp",
                    "latest_report_hash",
                    "facts_environment",
                    "deactivated"
                ],
                any
            ]),
        ),
    ];
    let started = std::time::Instant::now();
    loop {
        let differ = mismatches(p, union, &newest).expect("pdbmux and the union answer");
        if differ.is_empty() {
            eprintln!(
                "late runs sent; pdbmux's map caught up in {:.1?}",
                started.elapsed()
            );
            return;
        }
        if started.elapsed() > std::time::Duration::from_secs(60) {
            // The questions will show what differs.
            eprintln!("late runs sent; pdbmux's map still differs after a minute: {differ:?}");
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(250));
    }
}

#[test]
fn every_route_equals_the_union_over_the_history() {
    let Some(history) = history() else {
        return;
    };
    let union = Backend {
        name: "union".to_owned(),
        url: history.union.clone(),
    };
    // With the cache on, an answer may be as old as its TTL: the late runs go first, so that
    // nothing changes while this pdbmux runs.
    if cache_on() {
        send_late();
    }
    let p = pdbmux(&history);
    if !cache_on() {
        send_late_runs(&p, &union);
    }
    let questions = questions(&history);
    let mut problems = mismatches(&p, &union, &questions).expect("pdbmux and the union answer");
    problems.extend(population_mismatches(&p, &union));
    let facts_only = history.nodes.iter().filter(|n| n.facts_only).count();
    eprintln!(
        "seed {} over {} backends: {} questions and 3 metrics, {} nodes \
         ({facts_only} without reports), {} differ",
        history.seed,
        history.backends.len(),
        questions.len(),
        history.nodes.len(),
        problems.len()
    );
    assert!(
        problems.is_empty(),
        "seed {} over {} backends: {} of {} questions differ from the union's answers \
         (replay: E2E_HISTORY_SEED={} e2e/run --histories-only):\n  {}",
        history.seed,
        history.backends.len(),
        problems.len(),
        questions.len() + 3,
        history.seed,
        problems.join("\n  ")
    );
}
