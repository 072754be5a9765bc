//! Routes that ask backends one at a time or pick one answer: pass-through (first success, D10),
//! per-certname (owner first) and report-hash (the holder's answer).

mod common;

use common::{
    exchange_sends, finish, harness, member_backend, members, node_404, URL_A, URL_B, URL_C,
};
use http::StatusCode;
use pdbmux_conformance::{ms, FakeBackend, Reply};
use pdbmux_core::membership::MEMBERSHIP_QUERIES;

const PASS_THROUGH: &str = "/pdb/query/v4/environments/production";

#[test]
fn pass_through_first_404_then_second_200_streamed() {
    let mut h = harness(vec![
        FakeBackend::queue(
            "pdb-a",
            URL_A,
            [Reply::text(StatusCode::NOT_FOUND, "not found").after(ms(2))],
        ),
        FakeBackend::queue(
            "pdb-b",
            URL_B,
            [Reply::ok(r#"[{"certname":"web1"}]"#)
                .header("X-Records", "1")
                .header("Connection", "keep-alive")
                .after(ms(3))],
        ),
    ]);
    let c = h.get(PASS_THROUGH);
    let transcript = finish(&mut h);
    let response = h.response(c).expect("one response");
    assert_eq!(response.status, StatusCode::OK);
    assert_eq!(response.body_str(), r#"[{"certname":"web1"}]"#);
    assert!(response.streamed_from.is_some());
    assert_eq!(response.header("x-records"), Some("1"));
    assert_eq!(response.header("connection"), None);
    assert!(h
        .sends()
        .iter()
        .all(|s| s.request.path_and_query == PASS_THROUGH));
    insta::assert_snapshot!(transcript);
}

#[test]
fn pass_through_first_empty_success_wins() {
    let mut h = harness(vec![
        FakeBackend::queue("pdb-a", URL_A, [Reply::ok("[]").after(ms(2))]),
        FakeBackend::queue("pdb-b", URL_B, [Reply::ok(r#"[{"certname":"web1"}]"#)]),
    ]);
    let c = h.get("/pdb/query/v4/environments/production");
    let transcript = finish(&mut h);
    let response = h.response(c).expect("one response");
    assert_eq!(response.body_str(), "[]");
    assert_eq!(h.sends().len(), 1, "the second backend is never asked");
    insta::assert_snapshot!(transcript);
}

#[test]
fn pass_through_all_reject_first_error_replayed() {
    let mut h = harness(vec![
        FakeBackend::queue(
            "pdb-a",
            URL_A,
            [Reply::text(
                StatusCode::BAD_REQUEST,
                "bad query on pdb-a.example.com:8080",
            )
            .after(ms(2))],
        ),
        FakeBackend::queue(
            "pdb-b",
            URL_B,
            [Reply::json(StatusCode::INTERNAL_SERVER_ERROR, r#"{"error":"b"}"#).after(ms(2))],
        ),
    ]);
    let c = h.get(PASS_THROUGH);
    let transcript = finish(&mut h);
    let response = h.response(c).expect("one response");
    assert_eq!(response.status, StatusCode::BAD_REQUEST);
    assert_eq!(response.body_str(), "bad query on pdb-a");
    insta::assert_snapshot!(transcript);
}

#[test]
fn pass_through_a_short_answer_that_is_not_json_fails_over() {
    // Declared short, so read whole and checked (docs/reliability.md): pdb-a's is cut off JSON.
    let mut h = harness(vec![
        FakeBackend::queue(
            "pdb-a",
            URL_A,
            [Reply::ok("[{\"certname\":")
                .header("content-length", "14")
                .after(ms(1))],
        ),
        FakeBackend::queue(
            "pdb-b",
            URL_B,
            [Reply::ok("[]").header("content-length", "2").after(ms(1))],
        ),
    ]);
    let c = h.get(PASS_THROUGH);
    let transcript = finish(&mut h);
    let response = h.response(c).expect("one response");
    assert_eq!(response.status, StatusCode::OK);
    assert_eq!(response.body_str(), "[]");
    insta::assert_snapshot!(transcript);
}

#[test]
fn pass_through_a_long_answer_is_streamed_unread() {
    // Declared over HELD_ABOVE_BYTES: held for the runtime to stream (and check on its way).
    let long = format!("[{}]", "1,".repeat(200_000) + "1");
    let length = long.len().to_string();
    let mut h = harness(vec![FakeBackend::queue(
        "pdb-a",
        URL_A,
        [Reply::ok(long.clone())
            .header("content-length", &length)
            .after(ms(1))],
    )]);
    let c = h.get(PASS_THROUGH);
    finish(&mut h);
    let response = h.response(c).expect("one response");
    assert_eq!(response.status, StatusCode::OK);
    assert_eq!(response.body_str(), long);
}

#[test]
fn pass_through_none_answered_502() {
    let mut h = harness(vec![
        FakeBackend::queue("pdb-a", URL_A, [Reply::refused().after(ms(1))]),
        FakeBackend::queue("pdb-b", URL_B, [Reply::never()]),
    ]);
    let c = h.get(PASS_THROUGH);
    let transcript = finish(&mut h);
    let response = h.response(c).expect("one response");
    assert_eq!(response.status, StatusCode::BAD_GATEWAY);
    assert_eq!(response.at, ms(1) + h.config().timeout);
    insta::assert_snapshot!(transcript);
}

const T10: Option<&str> = Some("2024-05-01T10:00:00.000Z");
const T11: Option<&str> = Some("2024-05-01T11:00:00.000Z");

#[test]
fn per_certname_owner_404_fallback_served() {
    // pdb-b holds web1's newer report, so it owns web1 and is asked first.
    let mut h = harness(vec![
        member_backend(
            "pdb-a",
            URL_A,
            members(&[("web1", T10)]),
            vec![Reply::ok(r#"{"certname":"web1","deactivated":null}"#).after(ms(3))],
        ),
        member_backend(
            "pdb-b",
            URL_B,
            members(&[("web1", T11)]),
            vec![node_404("web1").after(ms(2))],
        ),
    ]);
    let c = h.get("/pdb/query/v4/nodes/web1");
    let transcript = finish(&mut h);
    let response = h.response(c).expect("one response");
    assert_eq!(response.status, StatusCode::OK);
    assert!(response.body_str().contains("web1"));
    assert_eq!(
        exchange_sends(&h)[0].backend_name,
        "pdb-b",
        "the owner is asked first"
    );
    insta::assert_snapshot!(transcript);
}

#[test]
fn per_certname_owner_500_served() {
    let mut h = harness(vec![
        member_backend(
            "pdb-a",
            URL_A,
            members(&[]),
            vec![Reply::ok(r#"{"certname":"web1"}"#)],
        ),
        member_backend(
            "pdb-b",
            URL_B,
            members(&[("web1", T10)]),
            vec![
                Reply::json(StatusCode::INTERNAL_SERVER_ERROR, r#"{"error":"boom"}"#).after(ms(2)),
            ],
        ),
    ]);
    let c = h.get("/pdb/query/v4/factsets/web1");
    let transcript = finish(&mut h);
    let response = h.response(c).expect("one response");
    assert_eq!(response.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(response.body_str(), r#"{"error":"boom"}"#);
    let asked: Vec<&str> = exchange_sends(&h)
        .iter()
        .map(|s| s.backend_name.as_str())
        .collect();
    assert_eq!(
        asked,
        ["pdb-b"],
        "the owner's answer stands; no fallback is asked"
    );
    insta::assert_snapshot!(transcript);
}

#[test]
fn per_certname_all_404_first_replayed() {
    // Nobody holds web9: configured order, and the first 404 (openvoxdb's own body) is replayed.
    let mut h = harness(vec![
        member_backend(
            "pdb-a",
            URL_A,
            members(&[("web1", T10)]),
            vec![node_404("web9").after(ms(2))],
        ),
        member_backend(
            "pdb-b",
            URL_B,
            members(&[]),
            vec![Reply::json(StatusCode::NOT_FOUND, r#"{"error":"b's own 404"}"#).after(ms(2))],
        ),
    ]);
    let c = h.get("/pdb/query/v4/nodes/web9/facts");
    let transcript = finish(&mut h);
    let response = h.response(c).expect("one response");
    assert_eq!(response.status, StatusCode::NOT_FOUND);
    assert_eq!(
        response.body_str(),
        r#"{"error":"No information is known about node web9"}"#
    );
    insta::assert_snapshot!(transcript);
}

#[test]
fn per_certname_unreachable_owner_first_answering_fallback_stands_in() {
    let mut h = harness(vec![
        member_backend(
            "pdb-a",
            URL_A,
            members(&[]),
            vec![node_404("web1").after(ms(2))],
        ),
        member_backend(
            "pdb-b",
            URL_B,
            members(&[("web1", T10)]),
            vec![Reply::refused().after(ms(1))],
        ),
    ]);
    let c = h.get("/pdb/query/v4/catalogs/web1");
    finish(&mut h);
    let response = h.response(c).expect("one response");
    assert_eq!(response.status, StatusCode::NOT_FOUND);
    let asked: Vec<&str> = exchange_sends(&h)
        .iter()
        .map(|s| s.backend_name.as_str())
        .collect();
    assert_eq!(asked, ["pdb-b", "pdb-a"]);
}

#[test]
fn per_certname_membership_is_fetched_once_and_shared() {
    // c0 starts the membership refresh, c1 joins it while it runs, c2 (within freshness_ttl)
    // uses the snapshot without a new fetch.
    let mut h = harness(vec![
        member_backend(
            "pdb-a",
            URL_A,
            members(&[("web1", T11), ("web2", None)]),
            vec![
                Reply::ok(r#"{"certname":"web1"}"#),
                Reply::ok(r#"{"certname":"web1","again":true}"#),
            ],
        ),
        member_backend(
            "pdb-b",
            URL_B,
            members(&[("web1", T10), ("web2", T10)]),
            vec![Reply::ok(r#"{"certname":"web2","from":"pdb-b"}"#)],
        ),
    ]);
    let c0 = h.get("/pdb/query/v4/nodes/web1");
    h.run_until(ms(1), common::STEPS).expect("runs");
    let c1 = h.get("/pdb/query/v4/nodes/web2");
    h.run_until(ms(100), common::STEPS).expect("runs");
    let c2 = h.get("/pdb/query/v4/nodes/web1");
    let transcript = finish(&mut h);
    let membership_sends = h
        .sends()
        .iter()
        .filter(|s| s.request.path_and_query == pdbmux_core::membership::MEMBERSHIP_QUERY)
        .count();
    assert_eq!(membership_sends, 2, "one refresh, one request per backend");
    assert_eq!(
        h.response(c0).expect("one").body_str(),
        r#"{"certname":"web1"}"#
    );
    // web2: pdb-b has a report, pdb-a's is null (older than any), so pdb-b owns it.
    assert_eq!(
        h.response(c1).expect("one").body_str(),
        r#"{"certname":"web2","from":"pdb-b"}"#
    );
    let again = h.response(c2).expect("one");
    assert_eq!(
        (again.at, again.body_str().as_str()),
        (ms(100), r#"{"certname":"web1","again":true}"#)
    );
    insta::assert_snapshot!(transcript);
}

#[test]
fn report_hash_holder_200_served() {
    let mut h = harness(vec![
        FakeBackend::queue(
            "pdb-a",
            URL_A,
            [Reply::json(StatusCode::NOT_FOUND, "[]").after(ms(2))],
        ),
        FakeBackend::queue(
            "pdb-b",
            URL_B,
            [Reply::ok(r#"[{"message":"applied"}]"#).after(ms(7))],
        ),
        FakeBackend::queue(
            "pdb-c",
            URL_C,
            [Reply::json(StatusCode::NOT_FOUND, "[]").after(ms(3))],
        ),
    ]);
    let c = h.get("/pdb/query/v4/reports/0123abcd/logs");
    let transcript = finish(&mut h);
    let response = h.response(c).expect("one response");
    assert_eq!(response.status, StatusCode::OK);
    assert_eq!(response.body_str(), r#"[{"message":"applied"}]"#);
    insta::assert_snapshot!(transcript);
}

#[test]
fn report_hash_all_404_is_404() {
    let mut h = harness(vec![
        FakeBackend::queue(
            "pdb-a",
            URL_A,
            [Reply::json(StatusCode::NOT_FOUND, r#"{"error":"no report"}"#).after(ms(2))],
        ),
        FakeBackend::queue(
            "pdb-b",
            URL_B,
            [Reply::json(StatusCode::NOT_FOUND, r#"{"error":"none here"}"#).after(ms(1))],
        ),
    ]);
    let c = h.get("/pdb/query/v4/reports/0123abcd/events");
    let transcript = finish(&mut h);
    let response = h.response(c).expect("one response");
    assert_eq!(response.status, StatusCode::NOT_FOUND);
    assert_eq!(response.body_str(), r#"{"error":"no report"}"#);
    insta::assert_snapshot!(transcript);
}

#[test]
fn an_answer_already_on_its_way_when_its_request_is_cancelled_is_dropped_unread() {
    // The runtime race: both backends answer at the same instant, so pdb-b's answer is in
    // hand when pdb-a's, taken first, makes the core cancel pdb-b's request.
    let server_time = |at: &str| Reply::ok(format!(r#"{{"server_time":"{at}"}}"#)).after(ms(10));
    let mut h = harness(vec![
        FakeBackend::queue("pdb-a", URL_A, [server_time("2024-05-01T10:00:00.000Z")]),
        FakeBackend::queue("pdb-b", URL_B, [server_time("2024-05-01T10:00:01.000Z")]),
    ]);
    h.set_late_answers(true);
    let c = h.get("/pdb/meta/v1/server-time");
    let transcript = finish(&mut h);
    let response = h.response(c).expect("one response");
    assert_eq!(
        response.body_str(),
        r#"{"server_time":"2024-05-01T10:00:00.000Z"}"#
    );
    assert_eq!(response.at, ms(10));
    assert!(
        transcript.contains("+10ms c0 cancel u1 (its answer was already on the way)"),
        "{transcript}"
    );
    insta::assert_snapshot!(transcript);
}

#[test]
fn report_hash_404_beside_an_unanswered_backend_is_502() {
    let mut h = harness(vec![
        FakeBackend::queue("pdb-a", URL_A, [Reply::refused().after(ms(1))]),
        FakeBackend::queue(
            "pdb-b",
            URL_B,
            [Reply::json(StatusCode::NOT_FOUND, "[]").after(ms(2))],
        ),
    ]);
    let c = h.get("/pdb/query/v4/reports/0123abcd/metrics");
    finish(&mut h);
    assert_eq!(
        h.response(c).expect("one response").status,
        StatusCode::BAD_GATEWAY
    );
}

#[test]
fn a_client_that_leaves_while_waiting_for_membership_is_not_resumed() {
    let mut h = harness(vec![
        member_backend("pdb-a", URL_A, members(&[]), vec![Reply::ok("{}")]),
        member_backend("pdb-b", URL_B, members(&[]), vec![]),
    ]);
    let gone = h.get("/pdb/query/v4/nodes/web1");
    let stays = h.get("/pdb/query/v4/nodes/web1");
    h.disconnect(gone).expect("known client");
    finish(&mut h);
    assert!(h.responses(gone).expect("known").is_empty());
    assert_eq!(h.response(stays).expect("one").status, StatusCode::OK);
}

#[test]
fn a_panic_reading_one_clients_answer_ends_that_client_only() {
    let mut h = harness(vec![FakeBackend::queue(
        "pdb-a",
        URL_A,
        [
            Reply::panic().after(ms(5)),
            Reply::ok(r#"["a"]"#).after(ms(5)),
        ],
    )]);
    let first = h.get(PASS_THROUGH);
    let second = h.get(PASS_THROUGH);
    let transcript = finish(&mut h);
    // The first client's task is gone, as its connection would be; the second is answered.
    assert!(h.panicked(first));
    assert!(h.responses(first).expect("known").is_empty());
    assert_eq!(h.response(second).expect("answered").body_str(), r#"["a"]"#);
    assert!(transcript.contains("+5ms c0 panicked"), "{transcript}");
    insta::assert_snapshot!(transcript);
}

/// One timeout per request: a backend that lets the first request wait out the whole timeout for
/// the membership map is not waited for again by that request's query; the others' answer is
/// served, partial, one timeout after the request came (not two).
#[test]
fn the_first_requests_wait_for_membership_counts_against_its_timeout() {
    let mut h = harness(vec![
        member_backend(
            "pdb-a",
            URL_A,
            members(&[("web1", T10)]),
            vec![Reply::ok(r#"[{"certname":"web1"}]"#).after(ms(2))],
        ),
        FakeBackend::always("pdb-b", URL_B, Reply::never()),
    ]);
    let c = h.get("/pdb/query/v4/nodes");
    finish(&mut h);
    let response = h.response(c).expect("one response");
    assert_eq!(response.status, StatusCode::OK, "{}", h.transcript());
    assert_eq!(response.header("x-backends"), Some("1/2"));
    let timeout = h.config().timeout;
    assert!(
        response.at < timeout + ms(100),
        "answered after {:?}, one timeout is {timeout:?}\n{}",
        response.at,
        h.transcript()
    );
    let asked_b = h
        .sends()
        .iter()
        .filter(|s| s.backend_name == "pdb-b")
        .count();
    assert_eq!(
        asked_b,
        MEMBERSHIP_QUERIES.len(),
        "pdb-b is asked for the membership map only"
    );
}
