//! Properties of the core under generated requests and generated backend behaviour:
//!
//! (a) nothing outside the allowlist (by an oracle written here, independent of the core's
//!     classifier) reaches a backend, and no upstream path carries a `..` segment;
//! (b) every request gets exactly one response, within a bound, whatever the backends do;
//! (c) a fan-out's answer does not depend on the order the backends answered in, and equals a
//!     small reference model of the status policy.

use http::{Method, StatusCode};
use pdbmux_conformance::{ms, FakeBackend, Harness, Machine, Reply, ReplyOutcome};
use pdbmux_core::membership::MEMBERSHIP_QUERIES;
use pdbmux_core::{ClientRequest, REACHABILITY_PATH};
use proptest::prelude::*;
use proptest::sample::select;

/// A short per-upstream timeout keeps the generated latencies small; time is simulated anyway.
const TIMEOUT_MS: u64 = 1_000;
/// Short enough that the membership map is refreshed again within one generated run.
const FRESHNESS_TTL_MS: u64 = 700;
const STEPS: usize = 10_000;

fn harness(backends: Vec<FakeBackend>) -> Harness {
    Harness::with_config(backends, |config| {
        config.timeout = ms(TIMEOUT_MS);
        config.freshness_ttl = ms(FRESHNESS_TTL_MS);
    })
    .expect("valid test backends")
}

fn name(index: usize) -> String {
    format!("pdb-{index}")
}

fn url(index: usize) -> String {
    format!("http://pdb{index}.example.com:8080")
}

// ---------------------------------------------------------------------------------------------
// (a) the allowlist

/// The allowlist as docs/decisions.md D6 and the README's route table state it, by path prefix.
fn inside_allowlist(path: &str) -> bool {
    const EXACT: [&str; 6] = [
        "/healthz",
        "/pdb/meta/v1/version",
        "/pdb/meta/v1/server-time",
        "/metrics/v2/list",
        "/metrics/v1/mbeans",
        "/pdb/query/v4",
    ];
    const UNDER: [&str; 3] = ["/pdb/query/v4/", "/metrics/v2/read/", "/metrics/v1/mbeans/"];
    EXACT.contains(&path) || UNDER.iter().any(|prefix| path.starts_with(prefix))
}

/// Path shapes D6 refuses with 400: empty, `.` and `..` segments, backslashes, `%2e`, `%5c`, and
/// `%2f` anywhere but the value segment of `/pdb/query/v4/facts/<name>/<value>`.
fn malformed(path: &str) -> bool {
    let Some(rest) = path.strip_prefix('/') else {
        return true;
    };
    let segments: Vec<&str> = rest.split('/').collect();
    let fact_value = segments.len() == 6 && segments[..4] == ["pdb", "query", "v4", "facts"];
    segments.iter().enumerate().any(|(index, segment)| {
        let lower = segment.to_ascii_lowercase();
        (segment.is_empty() && !rest.is_empty())
            || *segment == "."
            || *segment == ".."
            || segment.contains('\\')
            || lower.contains("%2e")
            || lower.contains("%5c")
            || (lower.contains("%2f") && !(fact_value && index == 5))
    })
}

fn path_segment() -> impl Strategy<Value = String> {
    let tricky = select(vec![
        "..", ".", "%2e", "%2E%2e", ".%2e", "%2f", "a%2fb", "%2F", "%5c", "a%5Cb", "\\", "", "..;",
        "%252e",
    ])
    .prop_map(str::to_owned);
    let benign = select(vec![
        "admin",
        "cmd",
        "status",
        "nodes",
        "facts",
        "version",
        "server-time",
        "archive",
        "web1",
        "v4",
        "v1",
        "pdb",
        "query",
        "meta",
        "metrics",
        "summary-stats",
        "services",
        "list",
        "read",
        "mbeans",
        "java.lang:type=Memory",
        "events",
        "logs",
        "abc123",
        "healthz",
    ])
    .prop_map(str::to_owned);
    prop_oneof![2 => tricky, 3 => benign, 1 => "[a-z0-9.%;-]{0,6}"]
}

fn request_path() -> impl Strategy<Value = String> {
    let prefix = select(vec![
        "/pdb/query/v4",
        "/pdb/query/v4/nodes",
        "/pdb/query/v4/facts",
        "/pdb/query/v4/reports",
        "/pdb/meta/v1/version",
        "/pdb/meta/v1/server-time",
        "/metrics/v2/read",
        "/metrics/v2/list",
        "/metrics/v1/mbeans",
        "/healthz",
        "/pdb/admin/v1",
        "/pdb/cmd/v1",
        "/status/v1",
        "/pdb/query",
        "/pdb/meta/v1",
        "/metrics/v2",
        "/pdb",
        "/pdb/query/v3",
        "",
        "pdb/query/v4",
    ]);
    (prefix, prop::collection::vec(path_segment(), 0..3)).prop_map(|(prefix, segments)| {
        let mut path = prefix.to_owned();
        for segment in segments {
            path.push('/');
            path.push_str(&segment);
        }
        if path.is_empty() {
            path.push('/');
        }
        path
    })
}

fn client_request() -> impl Strategy<Value = ClientRequest> {
    let query = select(vec![
        "",
        "?query=..%2f..",
        "?query=%5B%5D",
        "?x=/../pdb/admin/v1/archive",
    ]);
    let method = prop_oneof![
        6 => Just(Method::GET),
        1 => select(vec![Method::POST, Method::HEAD, Method::PUT, Method::DELETE, Method::OPTIONS, Method::PATCH]),
    ];
    let header_count = select(vec![0usize, 0, 0, 3, 100, 101]);
    (request_path(), query, method, header_count).prop_map(|(path, query, method, header_count)| {
        ClientRequest {
            method,
            target: format!("{path}{query}"),
            header_count,
            header_bytes: header_count * 20,
        }
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn outside_the_allowlist_nothing_reaches_a_backend(request in client_request()) {
        let mut h = harness(vec![
            FakeBackend::always(&name(0), &url(0), Reply::ok("[]").after(ms(1))),
            FakeBackend::always(&name(1), &url(1), Reply::ok("[]").after(ms(2))),
        ]);
        let path = request.path().to_owned();
        let may_send = request.method == Method::GET
            && request.header_count <= 100
            && inside_allowlist(&path)
            && !malformed(&path);
        let target = request.target.clone();
        let client = h.submit(request);
        h.drive_bounded(STEPS).map_err(|e| TestCaseError::fail(format!("{e}\n{}", h.transcript())))?;
        h.check_quiescent().map_err(|e| TestCaseError::fail(format!("{e}\n{}", h.transcript())))?;
        if !may_send {
            prop_assert!(h.sends().is_empty(), "{target} reached a backend:\n{}", h.transcript());
        }
        for sent in h.sends() {
            let upstream_path = sent.request.path_and_query.split('?').next().unwrap_or_default();
            prop_assert!(
                !upstream_path.split('/').any(|segment| segment == ".." || segment == "."),
                "dot segment upstream: {}", sent.request.path_and_query
            );
            match sent.machine {
                // The root endpoint's PQL is translated first (`ast_only=true`), then asked as
                // its entity's route: still under /pdb/query/v4, never with a dot segment.
                Machine::Exchange(_) | Machine::Flight(_) if path == "/pdb/query/v4" => prop_assert!(
                    sent.request.path_and_query == target
                        || sent.request.path_and_query.starts_with("/pdb/query/v4?")
                        || sent.request.path_and_query.starts_with("/pdb/query/v4/"),
                    "root request sent {}", sent.request.path_and_query
                ),
                Machine::Exchange(_) | Machine::Flight(_) => prop_assert_eq!(&sent.request.path_and_query, &target),
                Machine::Estate => prop_assert!(
                    sent.request.path_and_query == REACHABILITY_PATH
                        || MEMBERSHIP_QUERIES.contains(&sent.request.path_and_query.as_str()),
                    "estate sent {}", sent.request.path_and_query
                ),
            }
        }
        prop_assert_eq!(h.responses(client).map(<[_]>::len).unwrap_or(0), 1);
    }
}

// ---------------------------------------------------------------------------------------------
// (b) exactly one response

const VERSION_BODIES: [&str; 7] = [
    r#"{"version":"7.9.0"}"#,
    r#"{"version":"7.12.1"}"#,
    r#"{"version":"7.12.10"}"#,
    r#"{"version":"8.0.0"}"#,
    r#"{"version":7}"#,
    "<html>",
    "[]",
];

/// A reply without latency: an answer with a generated status and body, a failure, or silence.
fn outcome() -> impl Strategy<Value = Reply> {
    let answer = (
        select(vec![200u16, 400, 404, 500, 502]),
        select(VERSION_BODIES.to_vec()),
    )
        .prop_map(|(status, body)| {
            let status = StatusCode::from_u16(status).expect("generated from valid codes");
            if status.is_success() {
                Reply::ok(body)
            } else {
                // Error bodies differ per status only, so a unanimous status has one body.
                Reply::text(status, format!("error {}", status.as_u16()))
            }
        });
    prop_oneof![
        6 => answer,
        1 => Just(Reply::refused()),
        1 => Just(Reply::reset()),
        1 => Just(Reply::too_large(1024)),
        1 => Just(Reply::never()),
    ]
}

fn timed_reply() -> impl Strategy<Value = Reply> {
    (outcome(), 0..=2 * TIMEOUT_MS).prop_map(|(reply, latency)| reply.after(ms(latency)))
}

const TARGETS: [&str; 11] = [
    "/pdb/meta/v1/version",
    "/pdb/meta/v1/server-time",
    "/pdb/query/v4/environments/production",
    "/pdb/query/v4?query=nodes%20%7B%7D",
    "/pdb/query/v4/nodes/web1",
    "/pdb/query/v4/catalogs/web1",
    "/pdb/query/v4/reports/abc123/events",
    "/healthz",
    "/pdb/query/v4/nodes",
    "/pdb/admin/v1/archive",
    "/pdb/query/v4/../x",
];

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn every_request_gets_exactly_one_response(
        scripts in prop::collection::vec(prop::collection::vec(timed_reply(), 1..4), 1..=4),
        clients in prop::collection::vec((select(TARGETS.to_vec()), 0..TIMEOUT_MS), 1..6),
        late_answers in any::<bool>(),
        leaver in prop::option::of((0usize..6, 0..2 * TIMEOUT_MS)),
    ) {
        let backends = scripts.len();
        let mut h = harness(
            scripts
                .into_iter()
                .enumerate()
                .map(|(index, replies)| FakeBackend::cycle(&name(index), &url(index), replies))
                .collect(),
        );
        h.set_late_answers(late_answers);
        let mut clients = clients;
        clients.sort_by_key(|(_, offset)| *offset);
        let mut ids = Vec::new();
        for (target, offset) in clients {
            h.run_until(ms(offset), STEPS).map_err(|e| TestCaseError::fail(format!("{e}\n{}", h.transcript())))?;
            ids.push(h.get(target));
        }
        // Optionally one client goes away before its answer (a waiter or an exchange).
        let mut gone = None;
        if let Some((index, at)) = leaver {
            h.run_until(ms(at), STEPS).map_err(|e| TestCaseError::fail(format!("{e}\n{}", h.transcript())))?;
            let id = ids[index % ids.len()];
            if h.responses(id).map(<[_]>::is_empty).unwrap_or(false) {
                h.disconnect(id).map_err(|e| TestCaseError::fail(e.to_string()))?;
                gone = Some(id);
            }
        }
        h.drive_bounded(STEPS).map_err(|e| TestCaseError::fail(format!("{e}\n{}", h.transcript())))?;
        h.check_quiescent().map_err(|e| TestCaseError::fail(format!("{e}\n{}", h.transcript())))?;
        // Liveness bound: a request may wait for two membership refreshes while the map places
        // no backend (each bounded by the timeout), then asks each backend at most once, each
        // ask bounded by the timeout. PQL is first translated (each backend at most once, in
        // turn), then asked as its route (the membership waits, the fan-out, one more ask of a
        // backend whose page came up short).
        let bound_of = |target: &str| {
            let asks = if target.starts_with("/pdb/query/v4?") { 2 * backends + 4 } else { backends + 2 };
            ms(TIMEOUT_MS) * u32::try_from(asks).unwrap_or(u32::MAX)
        };
        for id in ids {
            let bound = bound_of(&h.request(id).map(|r| r.target.clone()).unwrap_or_default());
            if gone == Some(id) {
                prop_assert!(h.responses(id).map(<[_]>::is_empty).unwrap_or(false), "{id} answered after leaving");
                continue;
            }
            let response = h.response(id).map_err(|e| TestCaseError::fail(format!("{e}\n{}", h.transcript())))?;
            let submitted = h.submitted_at(id).unwrap_or_default();
            prop_assert!(
                response.at - submitted <= bound,
                "{id} answered after {:?}:\n{}", response.at - submitted, h.transcript()
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// (c) order independence and a reference model of the status policy

/// What a fan-out answered, for comparison.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Answered {
    status: u16,
    body: String,
    content_type: Option<String>,
    x_backends: Option<String>,
}

fn fan_out(target: &str, outcomes: &[Reply], latencies: &[u64]) -> Result<Answered, TestCaseError> {
    let backends = outcomes
        .iter()
        .zip(latencies)
        .enumerate()
        .map(|(index, (reply, latency))| {
            FakeBackend::queue(
                &name(index),
                &url(index),
                [reply.clone().after(ms(*latency))],
            )
        })
        .collect();
    let mut h = harness(backends);
    let client = h.get(target);
    h.drive_bounded(STEPS)
        .map_err(|e| TestCaseError::fail(format!("{e}\n{}", h.transcript())))?;
    h.check_quiescent()
        .map_err(|e| TestCaseError::fail(format!("{e}\n{}", h.transcript())))?;
    let response = h
        .response(client)
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    Ok(Answered {
        status: response.status.as_u16(),
        body: response.body_str(),
        content_type: response.header("content-type").map(str::to_owned),
        x_backends: response.header("x-backends").map(str::to_owned),
    })
}

/// The rank of a version body in `VERSION_BODIES`' order of versions; `None` when unparseable.
fn version_of(body: &[u8]) -> Option<(usize, &'static str)> {
    const VERSIONS: [&str; 4] = ["7.9.0", "7.12.1", "7.12.10", "8.0.0"];
    VERSIONS
        .iter()
        .position(|v| body == format!("{{\"version\":\"{v}\"}}").as_bytes())
        .map(|rank| (rank, VERSIONS[rank]))
}

/// The status policy (README, "When backends fail") for a fan-out without a usable success: a status every backend
/// answered with is replayed from the first; anything else is 502.
fn failure_model(outcomes: &[Reply]) -> Answered {
    let n = outcomes.len();
    let statuses: Vec<Option<(u16, String)>> = outcomes
        .iter()
        .map(|reply| match &reply.outcome {
            ReplyOutcome::Answer(answer) if answer.status.as_u16() >= 400 => Some((
                answer.status.as_u16(),
                String::from_utf8_lossy(&answer.body).into_owned(),
            )),
            _ => None,
        })
        .collect();
    match statuses.first() {
        Some(Some((status, body)))
            if statuses
                .iter()
                .all(|s| s.as_ref().is_some_and(|(x, _)| x == status)) =>
        {
            Answered {
                status: *status,
                body: body.clone(),
                content_type: Some("text/plain;charset=utf-8".to_owned()),
                x_backends: Some(format!("0/{n}")),
            }
        }
        _ => Answered {
            status: 502,
            body: String::new(),
            content_type: Some("text/plain;charset=utf-8".to_owned()),
            x_backends: Some(format!("0/{n}")),
        },
    }
}

fn success_body(reply: &Reply) -> Option<&[u8]> {
    match &reply.outcome {
        ReplyOutcome::Answer(answer) if answer.status.is_success() => Some(&answer.body),
        _ => None,
    }
}

/// `/pdb/meta/v1/version`: the lowest parseable version, X-Backends counting parseable answers.
fn version_model(outcomes: &[Reply]) -> Answered {
    let versions: Vec<(usize, &str)> = outcomes
        .iter()
        .filter_map(success_body)
        .filter_map(version_of)
        .collect();
    match versions.iter().min() {
        Some((_, lowest)) => Answered {
            status: 200,
            body: format!("{{\"version\":\"{lowest}\"}}"),
            content_type: Some("application/json;charset=utf-8".to_owned()),
            x_backends: Some(format!("{}/{}", versions.len(), outcomes.len())),
        },
        None => failure_model(outcomes),
    }
}

/// `/pdb/meta/v1/server-time`: the first success in configured order whose body is JSON,
/// verbatim (a 2xx that is not JSON is that backend failing).
fn server_time_model(outcomes: &[Reply]) -> Answered {
    let json = |body: &&[u8]| serde_json::from_slice::<serde_json::Value>(body).is_ok();
    match outcomes.iter().filter_map(success_body).find(json) {
        Some(body) => Answered {
            status: 200,
            body: String::from_utf8_lossy(body).into_owned(),
            content_type: Some("application/json;charset=utf-8".to_owned()),
            x_backends: Some(format!("1/{}", outcomes.len())),
        },
        None => failure_model(outcomes),
    }
}

/// Outcomes with latencies under the timeout, and the same latencies shuffled.
fn permuted_round() -> impl Strategy<Value = (Vec<Reply>, Vec<u64>, Vec<u64>)> {
    (1usize..=4).prop_flat_map(|n| {
        (
            prop::collection::vec(outcome(), n),
            prop::collection::vec(0..TIMEOUT_MS, n),
        )
            .prop_flat_map(|(outcomes, latencies)| {
                let shuffled = Just(latencies.clone()).prop_shuffle();
                (Just(outcomes), Just(latencies), shuffled)
            })
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn fan_out_answer_does_not_depend_on_answer_order(
        (outcomes, latencies, shuffled) in permuted_round(),
        server_time in any::<bool>(),
    ) {
        let (target, model) = if server_time {
            ("/pdb/meta/v1/server-time", server_time_model(&outcomes))
        } else {
            ("/pdb/meta/v1/version", version_model(&outcomes))
        };
        let first = fan_out(target, &outcomes, &latencies)?;
        let second = fan_out(target, &outcomes, &shuffled)?;
        prop_assert_eq!(&first, &second, "latencies {:?} vs {:?}", latencies, shuffled);
        if model.status == 502 {
            // The 502 body is pdbmux's own explanation; compare everything else.
            prop_assert_eq!(first.status, 502);
            prop_assert_eq!(&first.content_type, &model.content_type);
            prop_assert_eq!(&first.x_backends, &model.x_backends);
        } else {
            prop_assert_eq!(&first, &model);
        }
    }
}

#[test]
fn the_models_agree_with_a_hand_picked_case() {
    let outcomes = vec![
        Reply::ok(r#"{"version":"7.12.10"}"#),
        Reply::ok("<html>"),
        Reply::ok(r#"{"version":"7.12.1"}"#),
    ];
    let model = version_model(&outcomes);
    assert_eq!(model.body, r#"{"version":"7.12.1"}"#);
    assert_eq!(model.x_backends.as_deref(), Some("2/3"));
    assert_eq!(
        server_time_model(&outcomes).body,
        r#"{"version":"7.12.10"}"#
    );
    let server_time = fan_out("/pdb/meta/v1/server-time", &outcomes[1..], &[1, 2]).expect("runs");
    assert_eq!(
        server_time.body, r#"{"version":"7.12.1"}"#,
        "<html> is not JSON"
    );
    let answered = fan_out("/pdb/meta/v1/version", &outcomes, &[3, 2, 1]).expect("runs");
    assert_eq!(answered, model);
}
