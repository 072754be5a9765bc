//! `/pdb/meta/v1/server-time` (first reachable in configured order) and `/pdb/meta/v1/version`
//! (the lowest version; unparseable bodies skipped).

mod common;

use common::{finish, harness, version, URL_A, URL_B, URL_C};
use http::StatusCode;
use pdbmux_conformance::{ms, FakeBackend, Reply};

const SERVER_TIME: &str = "/pdb/meta/v1/server-time";

fn server_time(stamp: &str) -> Reply {
    Reply::ok(format!("{{\"server_time\":\"{stamp}\"}}"))
}

#[test]
fn server_time_first_in_order_answers_before_slower_later_backends() {
    let mut h = harness(vec![
        FakeBackend::queue(
            "pdb-a",
            URL_A,
            [server_time("2024-05-01T10:00:00.000Z").after(ms(10))],
        ),
        FakeBackend::queue(
            "pdb-b",
            URL_B,
            [server_time("2024-05-01T10:00:01.000Z").after(ms(500))],
        ),
        FakeBackend::queue("pdb-c", URL_C, [Reply::never()]),
    ]);
    let c = h.get(SERVER_TIME);
    let transcript = finish(&mut h);
    let response = h.response(c).expect("one response");
    assert_eq!(response.at, ms(10));
    assert_eq!(
        response.body_str(),
        r#"{"server_time":"2024-05-01T10:00:00.000Z"}"#
    );
    insta::assert_snapshot!(transcript);
}

#[test]
fn server_time_waits_for_the_first_in_order() {
    // pdb-b is faster, but pdb-a comes first in configured order and does answer.
    let mut h = harness(vec![
        FakeBackend::queue(
            "pdb-a",
            URL_A,
            [server_time("2024-05-01T10:00:00.000Z").after(ms(50))],
        ),
        FakeBackend::queue(
            "pdb-b",
            URL_B,
            [server_time("2024-05-01T10:00:09.000Z").after(ms(5))],
        ),
        FakeBackend::queue(
            "pdb-c",
            URL_C,
            [server_time("2024-05-01T10:00:09.000Z").after(ms(900))],
        ),
    ]);
    let c = h.get(SERVER_TIME);
    let transcript = finish(&mut h);
    let response = h.response(c).expect("one response");
    assert_eq!(response.at, ms(50));
    assert_eq!(
        response.body_str(),
        r#"{"server_time":"2024-05-01T10:00:00.000Z"}"#
    );
    insta::assert_snapshot!(transcript);
}

#[test]
fn server_time_skips_an_unreachable_first_backend() {
    let mut h = harness(vec![
        FakeBackend::queue("pdb-a", URL_A, [Reply::refused().after(ms(1))]),
        FakeBackend::queue(
            "pdb-b",
            URL_B,
            [server_time("2024-05-01T10:00:09.000Z").after(ms(5))],
        ),
    ]);
    let c = h.get(SERVER_TIME);
    finish(&mut h);
    let response = h.response(c).expect("one response");
    assert_eq!(response.status, StatusCode::OK);
    assert_eq!(
        response.body_str(),
        r#"{"server_time":"2024-05-01T10:00:09.000Z"}"#
    );
}

#[test]
fn version_lowest_is_numeric() {
    let mut h = harness(vec![
        FakeBackend::queue("pdb-a", URL_A, [version("7.12.1").after(ms(3))]),
        FakeBackend::queue("pdb-b", URL_B, [version("7.9.0").after(ms(4))]),
    ]);
    let c = h.get("/pdb/meta/v1/version");
    let transcript = finish(&mut h);
    let response = h.response(c).expect("one response");
    assert_eq!(response.body_str(), r#"{"version":"7.9.0"}"#);
    assert_eq!(response.header("x-backends"), Some("2/2"));
    insta::assert_snapshot!(transcript);
}

#[test]
fn version_unparseable_body_skipped() {
    let mut h = harness(vec![
        FakeBackend::queue(
            "pdb-a",
            URL_A,
            [Reply::answer(
                StatusCode::OK,
                Some("text/html"),
                "<html>maintenance</html>",
            )
            .after(ms(2))],
        ),
        FakeBackend::queue("pdb-b", URL_B, [version("8.4.0").after(ms(4))]),
    ]);
    let c = h.get("/pdb/meta/v1/version");
    let transcript = finish(&mut h);
    let response = h.response(c).expect("one response");
    assert_eq!(response.status, StatusCode::OK);
    assert_eq!(response.body_str(), r#"{"version":"8.4.0"}"#);
    assert_eq!(response.header("x-backends"), Some("1/2"));
    insta::assert_snapshot!(transcript);
}

#[test]
fn version_only_unparseable_bodies_is_502() {
    let mut h = harness(vec![
        FakeBackend::queue("pdb-a", URL_A, [Reply::ok("{\"version\":7}")]),
        FakeBackend::queue("pdb-b", URL_B, [Reply::ok("not json")]),
    ]);
    let c = h.get("/pdb/meta/v1/version");
    finish(&mut h);
    assert_eq!(
        h.response(c).expect("one response").status,
        StatusCode::BAD_GATEWAY
    );
}
