//! The fault soak (docs/reliability.md): both binaries, in front of both real PuppetDBs through
//! fault proxies that cut off, stall and garble answers at random, while several clients ask a
//! fixed set of questions for a bounded time and pdb-b is killed (SIGKILL) and started again.
//! Every response is counted; the run fails on any 200 whose body is not JSON, any 200 from every
//! backend that is not the merged answer, any partial 200 holding a record no backend has, and
//! any status but 200, 502 and 503.
//!
//! It kills a PuppetDB, so `e2e/run` runs it alone, after the other tests, with the `soak`
//! feature and `E2E_SOAK_BINS` (the binaries, comma-separated).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use pdbmux_e2e::{E2eEnv, FaultCounts, Pdbmux, Proxy, ProxyMode};
use serde_json::Value;

/// Clients per binary.
const CLIENTS: usize = 3;
/// The soak runs at least this long, and until pdb-b is back for [`AFTER_RESTART`].
const MIN_SOAK: Duration = Duration::from_secs(40);
const AFTER_RESTART: Duration = Duration::from_secs(10);
/// The longest pdb-b may take to start again.
const RESTART_LIMIT: Duration = Duration::from_secs(240);

/// The questions: merged entities, history, a per-certname answer (verbatim), a pass-through.
fn questions(env: &E2eEnv) -> Vec<String> {
    // A node in both backends owned by each: its per-certname answers come through each proxy.
    let node = |scenario: &str| {
        env.fixture
            .nodes
            .iter()
            .find(|(_, node)| node.scenario == scenario)
            .map(|(certname, _)| certname.clone())
            .unwrap_or_else(|| panic!("the fixture has a {scenario} node"))
    };
    let (first, second) = (node("both-first-newer"), node("both-second-newer"));
    let eq = |field: &str, value: &str| {
        pdbmux_e2e::url_with_query("", &[("query", &format!(r#"["=","{field}","{value}"]"#))])
    };
    vec![
        "/pdb/query/v4/nodes".to_owned(),
        "/pdb/query/v4/facts".to_owned(),
        "/pdb/query/v4/fact-names".to_owned(),
        "/pdb/query/v4/environments".to_owned(),
        format!("/pdb/query/v4/reports{}", eq("certname", &first)),
        format!("/pdb/query/v4/resources{}", eq("type", "Class")),
        format!("/pdb/query/v4/catalogs/{first}"),
        format!("/pdb/query/v4/factsets/{first}"),
        format!("/pdb/query/v4/catalogs/{second}"),
        format!("/pdb/query/v4/factsets/{second}"),
    ]
}

/// What a question may be answered with: the whole estate's answer, and each backend's alone.
#[derive(Debug)]
struct Expected {
    full: Value,
    /// Every element of the full answer and of each backend's alone, serialized.
    known: BTreeSet<String>,
    /// The whole answers a verbatim route may give (the owner's, or the other backend's), in
    /// [`canonical`] form.
    verbatim: Vec<Value>,
}

/// `value` with every array sorted (by each element's canonical text), at any depth: PuppetDB
/// promises no order for a catalog's resources and edges or a factset's facts, and PostgreSQL
/// returns them in another order once a restart or a vacuum moved the rows, so one backend's
/// verbatim answer is compared as the set it is.
fn canonical(value: &Value) -> Value {
    match value {
        Value::Array(items) => {
            let mut items: Vec<Value> = items.iter().map(canonical).collect();
            items.sort_by_cached_key(Value::to_string);
            Value::Array(items)
        }
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(key, value)| (key.clone(), canonical(value)))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// The elements of an answer (itself when it is not an array), serialized, sorted.
fn elements(value: &Value) -> Vec<String> {
    let mut out: Vec<String> = match value {
        Value::Array(items) => items.iter().map(Value::to_string).collect(),
        other => vec![other.to_string()],
    };
    out.sort();
    out
}

#[derive(Debug, Default)]
struct Tally {
    full: usize,
    partial: usize,
    verbatim: usize,
    bad_gateway: usize,
    unavailable: usize,
    /// Transfers the client saw fail (a streamed body cut off: the client sees no 200).
    aborted: usize,
    /// Everything that fails the run.
    wrong: Vec<String>,
}

impl Tally {
    fn total(&self) -> usize {
        self.full
            + self.partial
            + self.verbatim
            + self.bad_gateway
            + self.unavailable
            + self.aborted
            + self.wrong.len()
    }
}

fn judge(
    tally: &mut Tally,
    label: &str,
    question: &str,
    expected: &Expected,
    response: Result<pdbmux_e2e::Response, pdbmux_e2e::Error>,
) {
    let response = match response {
        Ok(response) => response,
        // Only a streamed answer (a per-certname one) can be cut off once it has begun; a merged
        // one is written whole or not at all, so failing to get it is pdbmux failing.
        Err(error) if !is_verbatim(question) => {
            return tally
                .wrong
                .push(format!("{label} {question}: no answer: {error}"));
        }
        Err(_) => {
            tally.aborted += 1;
            return;
        }
    };
    match response.status {
        200 => {}
        502 => return tally.bad_gateway += 1,
        503 => return tally.unavailable += 1,
        status => {
            return tally.wrong.push(format!(
                "{label} {question}: status {status}: {}",
                response.body.chars().take(300).collect::<String>()
            ));
        }
    }
    let Ok(body) = serde_json::from_str::<Value>(&response.body) else {
        return tally.wrong.push(format!(
            "{label} {question}: a 200 that is not JSON: {}",
            response.body.chars().take(300).collect::<String>()
        ));
    };
    match response.header("x-backends") {
        Some("2/2") => {
            if elements(&body) == elements(&expected.full) {
                tally.full += 1;
            } else {
                tally.wrong.push(format!(
                    "{label} {question}: a 2/2 answer that is not the merged answer: {}",
                    difference(&expected.full, &body)
                ));
            }
        }
        Some(_) => {
            let foreign: Vec<String> = elements(&body)
                .into_iter()
                .filter(|e| !expected.known.contains(e))
                .collect();
            if foreign.is_empty() {
                tally.partial += 1;
            } else {
                tally.wrong.push(format!(
                    "{label} {question}: a partial answer with {} records no backend has, the first: {}",
                    foreign.len(),
                    foreign[0].chars().take(300).collect::<String>()
                ));
            }
        }
        None => {
            if expected.verbatim.contains(&canonical(&body)) {
                tally.verbatim += 1;
            } else {
                tally.wrong.push(format!(
                    "{label} {question}: a verbatim answer no backend gave: {}",
                    difference(&expected.full, &body)
                ));
            }
        }
    }
}

/// What `got` has that `want` lacks and the reverse, element by element, each shown shortened:
/// a failure names the records that differ, not two whole answers.
fn difference(want: &Value, got: &Value) -> String {
    let (want, got) = (elements(want), elements(got));
    let shown = |items: Vec<&String>| -> String {
        let n = items.len();
        let first: Vec<String> = items
            .into_iter()
            .take(2)
            .map(|e| e.chars().take(160).collect())
            .collect();
        format!("{n} {first:?}")
    };
    format!(
        "missing {}; extra {}",
        shown(want.iter().filter(|e| !got.contains(e)).collect()),
        shown(got.iter().filter(|e| !want.contains(e)).collect())
    )
}

/// Whether pdbmux serves `question` from one backend as it is (and so may stream it).
fn is_verbatim(question: &str) -> bool {
    question.contains("/catalogs/") || question.contains("/factsets/")
}

/// pdb-b's process: its pid is the second line of `$E2E_STATE/pids` (e2e/run).
fn pids_file(state: &Path) -> PathBuf {
    state.join("pids")
}

fn kill_pdb_b(state: &Path) -> u32 {
    let pids = std::fs::read_to_string(pids_file(state)).expect("e2e/run's pids file");
    let pid: u32 = pids
        .lines()
        .nth(1)
        .and_then(|l| l.trim().parse().ok())
        .expect("pdb-b's pid");
    let status = Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .expect("kill");
    assert!(status.success(), "kill -KILL {pid}");
    pid
}

/// Starts pdb-b again with e2e/run's own start command, and puts its new pid in the pids file
/// (so e2e/run stops it at the end).
// Never waited for here: the PuppetDB outlives this test, and e2e/run stops it by its pid.
#[allow(clippy::zombie_processes)]
fn start_pdb_b(state: &Path, old: u32) {
    let script = state.join("pdb-b").join("start.sh");
    let child = Command::new("sh")
        .arg(&script)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start pdb-b again");
    let pids = std::fs::read_to_string(pids_file(state)).expect("pids file");
    let (new, old) = (child.id().to_string(), old.to_string());
    assert_eq!(
        pids.lines().filter(|l| l.trim() == old).count(),
        1,
        "pdb-b's pid {old} is in the pids file once"
    );
    let pids: Vec<&str> = pids
        .lines()
        .map(|l| if l.trim() == old { new.as_str() } else { l })
        .collect();
    // Written whole, then renamed over the old file: e2e/run never reads half of it.
    let fresh = state.join("pids.new");
    std::fs::write(&fresh, pids.join("\n") + "\n").expect("write the pids file");
    std::fs::rename(&fresh, pids_file(state)).expect("replace the pids file");
}

fn running(url: &str) -> bool {
    pdbmux_e2e::get(&format!("{url}/status/v1/services/puppetdb-status"))
        .is_ok_and(|r| r.status == 200 && r.body.contains("\"running\""))
}

#[test]
fn answers_stay_whole_under_faults_and_a_backend_restart() {
    let env = E2eEnv::shared().expect("e2e environment");
    let state = env.state_dir.clone().expect("E2E_STATE (e2e/run sets it)");
    let bins: Vec<PathBuf> = std::env::var("E2E_SOAK_BINS")
        .map(|v| {
            v.split(',')
                .filter(|s| !s.is_empty())
                .map(PathBuf::from)
                .collect()
        })
        .unwrap_or_else(|_| vec![env.bin.clone()]);
    let (a, b) = (env.first(), env.second());
    let proxies = [
        Proxy::start(&a.url).expect("proxy a"),
        Proxy::start(&b.url).expect("proxy b"),
    ];
    let start = |bin: &Path, label: &str| -> Pdbmux {
        env.pdbmux_with(&[(&a.name, &proxies[0].url()), (&b.name, &proxies[1].url())])
            .binary(bin)
            .label(label)
            .env("PDBMUX_TIMEOUT", "2s")
            .env("PDBMUX_FACTS_TTL", "0")
            .env("PDBMUX_FRESHNESS_TTL", "2s")
            .env("PDBMUX_HEALTH_PROBE_ENABLED", "true")
            .env("PDBMUX_HEALTH_PROBE_INTERVAL", "1s")
            .env("PDBMUX_HEALTH_PROBE_FAILURES", "2")
            .env("PDBMUX_HEALTH_PROBE_SUCCESSES", "1")
            // Info: the harness reads the listen line; debug would log every request.
            .env("PDBMUX_LOG_LEVEL", "info")
            .spawn()
            .expect("start pdbmux")
    };
    let mut muxes: Vec<(String, Pdbmux)> = bins
        .iter()
        .map(|bin| {
            let label = bin
                .file_name()
                .map_or("pdbmux".into(), |n| n.to_string_lossy().into_owned());
            (label.clone(), start(bin, &format!("soak-{label}")))
        })
        .collect();

    // The answers, before any fault: through the first binary, with both backends and with each
    // one alone (the other's proxy closed).
    let questions = questions(env);
    let ask = |mux: &Pdbmux, q: &str| -> Value {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let response = mux.get(q).expect("a baseline answer");
            // Whole: every backend configured contributed (`n/n`), or a verbatim answer.
            let whole = response
                .header("x-backends")
                .is_none_or(|x| x.split_once('/').is_some_and(|(n, m)| n == m));
            if response.status == 200 && whole {
                return response.json().expect("JSON");
            }
            assert!(
                Instant::now() < deadline,
                "no whole baseline answer to {q}: {}",
                response.status
            );
            thread::sleep(Duration::from_millis(200));
        }
    };
    let full: Vec<Value> = questions.iter().map(|q| ask(&muxes[0].1, q)).collect();
    let alone = |closed: usize| -> Vec<Value> {
        proxies[closed].set_mode(ProxyMode::Closed);
        let other = &proxies[1 - closed];
        let name = if closed == 0 { &b.name } else { &a.name };
        let solo = env
            .pdbmux_with(&[(name, &other.url())])
            .label("soak-baseline")
            .spawn()
            .expect("baseline pdbmux");
        let answers = questions.iter().map(|q| ask(&solo, q)).collect();
        proxies[closed].set_mode(ProxyMode::Forward);
        answers
    };
    let (a_alone, b_alone) = (alone(1), alone(0));
    let expected: Arc<Vec<Expected>> = Arc::new(
        (0..questions.len())
            .map(|i| Expected {
                known: [&full[i], &a_alone[i], &b_alone[i]]
                    .into_iter()
                    .flat_map(elements)
                    .collect(),
                verbatim: vec![
                    canonical(&full[i]),
                    canonical(&a_alone[i]),
                    canonical(&b_alone[i]),
                ],
                full: full[i].clone(),
            })
            .collect(),
    );

    // The soak.
    for proxy in &proxies {
        proxy.set_mode(ProxyMode::Faulty);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let tallies: Arc<Mutex<Vec<(String, Tally)>>> = Arc::new(Mutex::new(Vec::new()));
    let started = Instant::now();
    let mut clients = Vec::new();
    for (label, mux) in &muxes {
        for client in 0..CLIENTS {
            let (stop, tallies, expected, questions) = (
                Arc::clone(&stop),
                Arc::clone(&tallies),
                Arc::clone(&expected),
                questions.clone(),
            );
            let (label, addr) = (label.clone(), mux.addr());
            clients.push(thread::spawn(move || {
                let mut tally = Tally::default();
                let mut i = client;
                while !stop.load(Ordering::SeqCst) {
                    let q = &questions[i % questions.len()];
                    let response = pdbmux_e2e::get(&format!("http://{addr}{q}"));
                    let wrong_before = tally.wrong.len();
                    judge(
                        &mut tally,
                        &label,
                        q,
                        &expected[i % questions.len()],
                        response,
                    );
                    // When, in the soak (pdb-b's kill and restart times are printed at the end).
                    if let Some(wrong) = tally.wrong.get_mut(wrong_before) {
                        wrong.insert_str(0, &format!("at {:.1?}: ", started.elapsed()));
                    }
                    i += 1;
                }
                tallies.lock().expect("tallies").push((label, tally));
            }));
        }
    }
    thread::sleep(Duration::from_secs(5));
    let old = kill_pdb_b(&state);
    let killed_at = started.elapsed();
    thread::sleep(Duration::from_secs(3));
    start_pdb_b(&state, old);
    let back = loop {
        if running(&b.url) {
            break started.elapsed();
        }
        assert!(
            started.elapsed() < RESTART_LIMIT,
            "pdb-b did not start again within {RESTART_LIMIT:?}"
        );
        thread::sleep(Duration::from_secs(1));
    };
    while started.elapsed() < MIN_SOAK.max(back + AFTER_RESTART) {
        thread::sleep(Duration::from_millis(200));
    }
    stop.store(true, Ordering::SeqCst);
    for client in clients {
        client.join().expect("a client thread");
    }
    let soaked = started.elapsed();
    for proxy in &proxies {
        proxy.set_mode(ProxyMode::Forward);
    }

    let tallies = tallies.lock().expect("tallies");
    let faults: Vec<FaultCounts> = proxies.iter().map(Proxy::faults).collect();
    println!(
        "fault soak: {soaked:.0?}; pdb-b killed at {killed_at:.0?}, running again at {back:.0?}; \
         connections per fault (none, truncate, stall, garble): a {:?}, b {:?}",
        faults[0], faults[1]
    );
    // Every failed expectation, collected and reported last (after the pdbmux processes are
    // stopped, so that no log dump buries the reason).
    let mut failures = Vec::new();
    for label in muxes.iter().map(|(label, _)| label) {
        let mine: Vec<&Tally> = tallies
            .iter()
            .filter(|(l, _)| l == label)
            .map(|(_, t)| t)
            .collect();
        let sum = |f: fn(&Tally) -> usize| mine.iter().map(|t| f(t)).sum::<usize>();
        let bad: Vec<&String> = mine.iter().flat_map(|t| &t.wrong).collect();
        println!(
            "{label}: {} responses: {} whole (2/2), {} partial, {} verbatim, {} 502, {} 503, {} transfers cut off; {} malformed or wrong",
            sum(Tally::total), sum(|t| t.full), sum(|t| t.partial), sum(|t| t.verbatim),
            sum(|t| t.bad_gateway), sum(|t| t.unavailable), sum(|t| t.aborted), bad.len()
        );
        if sum(|t| t.full) == 0 {
            failures.push(format!("{label}: no whole answer at all"));
        }
        if sum(|t| t.partial) + sum(|t| t.bad_gateway) == 0 {
            failures.push(format!("{label}: no fault ever showed"));
        }
        failures.extend(bad.into_iter().take(5).cloned());
    }
    for (i, counts) in faults.iter().enumerate() {
        if !counts.iter().all(|n| *n > 0) {
            failures.push(format!(
                "proxy {i} did not inflict every kind of fault: {counts:?}"
            ));
        }
    }
    for (label, mux) in &mut muxes {
        if !mux.is_running() {
            failures.push(format!("{label} is no longer running after the soak"));
        }
    }
    let logs: Vec<String> = muxes
        .iter()
        .map(|(label, mux)| format!("{label}: {}", mux.log_path().display()))
        .collect();
    drop(muxes);
    assert!(
        failures.is_empty(),
        "the fault soak failed ({} logs kept):\n{}",
        logs.join(", "),
        failures.join("\n")
    );
}
