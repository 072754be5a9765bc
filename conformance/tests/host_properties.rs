//! Properties of the estate host itself (pdbmux-driver's `EstateHost` on the simulated
//! runtime) under generated backends, clients and leavers, with the cache on so requests
//! share flights and wait for the estate:
//!
//! (a) every client that stays gets exactly one response, no upstream request or task is
//!     left behind, and no task panics but where a script made it;
//! (b) a 500 only ever comes from a flight whose reading panicked;
//! (c) single flight: two flights for one path never run at once.

use std::collections::BTreeMap;
use std::time::Duration;

use http::StatusCode;
use pdbmux_conformance::{ms, FakeBackend, Harness, Reply};
use proptest::prelude::*;
use proptest::sample::select;

const TIMEOUT_MS: u64 = 1_000;
const STEPS: usize = 10_000;

/// Cached paths (each its own key) and one that is not cached.
const TARGETS: [&str; 4] = [
    "/pdb/query/v4/fact-names",
    "/pdb/query/v4/facts/os",
    "/pdb/query/v4/environments",
    "/pdb/query/v4/environments/production",
];

fn harness(backends: Vec<FakeBackend>) -> Harness {
    Harness::with_config(backends, |config| {
        config.timeout = ms(TIMEOUT_MS);
        config.freshness_ttl = ms(700);
        config.facts_ttl = Duration::from_secs(2);
    })
    .expect("valid test backends")
}

fn reply() -> impl Strategy<Value = Reply> {
    let answer = select(vec![
        r#"[]"#,
        r#"["kernel","os"]"#,
        r#"[{"certname":"web1","name":"os","value":"linux","environment":"production"}]"#,
        r#"[{"certname":"web1","report_timestamp":"2024-05-01T10:00:00.000Z"}]"#,
    ])
    .prop_map(Reply::ok);
    let outcome = prop_oneof![
        6 => answer,
        1 => Just(Reply::text(StatusCode::INTERNAL_SERVER_ERROR, "boom")),
        1 => Just(Reply::refused()),
        1 => Just(Reply::never()),
        1 => Just(Reply::panic()),
    ];
    (outcome, 0..=2 * TIMEOUT_MS).prop_map(|(reply, latency)| reply.after(ms(latency)))
}

/// What happens at one instant: a client arrives (asking a target) or one leaves.
#[derive(Debug, Clone)]
enum Event {
    Arrive(&'static str),
    Leave(usize),
}

/// Each flight's live span in transcript lines (start, end) by the path it asked for.
fn flight_spans(lines: &[String]) -> BTreeMap<String, Vec<(usize, usize)>> {
    let word = |line: &str, n: usize| line.split(' ').nth(n).map(str::to_owned);
    let mut started: BTreeMap<String, usize> = BTreeMap::new();
    let mut path_of: BTreeMap<String, String> = BTreeMap::new();
    let mut spans: BTreeMap<String, Vec<(usize, usize)>> = BTreeMap::new();
    for (index, line) in lines.iter().enumerate() {
        let (Some(machine), Some(what)) = (word(line, 1), word(line, 2)) else {
            continue;
        };
        if !machine.starts_with('f') {
            continue;
        }
        match what.as_str() {
            "starts" => {
                started.insert(machine, index);
            }
            "send" => {
                if let Some(target) = word(line, 7) {
                    let path = target.split('?').next().unwrap_or_default().to_owned();
                    path_of.entry(machine).or_insert(path);
                }
            }
            "done" | "cancelled" => {
                if let (Some(start), Some(path)) = (started.remove(&machine), path_of.get(&machine))
                {
                    spans.entry(path.clone()).or_default().push((start, index));
                }
            }
            _ => {}
        }
    }
    spans
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn flights_waiters_and_leavers(
        scripts in prop::collection::vec(prop::collection::vec(reply(), 1..4), 1..=3),
        arrivals in prop::collection::vec((select(TARGETS.to_vec()), 0..3 * TIMEOUT_MS), 1..8),
        leavers in prop::collection::vec((0usize..8, 0..4 * TIMEOUT_MS), 0..4),
        late_answers in any::<bool>(),
    ) {
        let fail = |h: &Harness, e: &dyn std::fmt::Display| TestCaseError::fail(format!("{e}\n{}", h.transcript()));
        let backends = scripts
            .into_iter()
            .enumerate()
            .map(|(i, replies)| {
                FakeBackend::cycle(&format!("pdb-{i}"), &format!("http://pdb{i}.example.com:8080"), replies)
            })
            .collect();
        let mut h = harness(backends);
        h.set_late_answers(late_answers);
        let mut events: Vec<(u64, Event)> = arrivals.iter().map(|(t, at)| (*at, Event::Arrive(t))).collect();
        events.extend(leavers.iter().map(|(who, at)| (*at, Event::Leave(*who))));
        // Stable: at one instant, arrivals in generated order before leavers.
        events.sort_by_key(|(at, _)| *at);
        let mut clients = Vec::new();
        let mut gone = Vec::new();
        for (at, event) in events {
            h.run_until(ms(at), STEPS).map_err(|e| fail(&h, &e))?;
            match event {
                Event::Arrive(target) => clients.push(h.get(target)),
                Event::Leave(who) => {
                    let Some(&id) = clients.get(who) else { continue };
                    if h.responses(id).map(<[_]>::is_empty).unwrap_or(false) && !gone.contains(&id) {
                        h.disconnect(id).map_err(|e| fail(&h, &e))?;
                        gone.push(id);
                    }
                }
            }
        }
        h.drive_bounded(STEPS).map_err(|e| fail(&h, &e))?;
        // (a)
        h.check_quiescent().map_err(|e| fail(&h, &e))?;
        for &id in &gone {
            prop_assert!(h.responses(id).map(<[_]>::is_empty).unwrap_or(false), "{id} answered after leaving\n{}", h.transcript());
        }
        // (b)
        let transcript = h.transcript();
        let flight_panicked = h
            .transcript_lines()
            .iter()
            .any(|line| line.split(' ').nth(1).is_some_and(|m| m.starts_with('f')) && line.ends_with("(the task reading it panics)"));
        for &id in &clients {
            if let Ok(response) = h.response(id) {
                if response.status == StatusCode::INTERNAL_SERVER_ERROR && response.body_str().trim_end() == "pdbmux: internal error" {
                    prop_assert!(flight_panicked, "{id} got a 500 without a panicking flight\n{transcript}");
                }
            }
        }
        // (c)
        for (path, mut spans) in flight_spans(h.transcript_lines()) {
            spans.sort_unstable();
            for pair in spans.windows(2) {
                prop_assert!(pair[0].1 < pair[1].0, "two flights for {path} at once\n{transcript}");
            }
        }
    }
}
