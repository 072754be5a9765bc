//! The fan-out status policy (README "When backends fail"), on
//! `/pdb/meta/v1/version`, a fan-out every backend answers the same question on.

mod common;

use std::time::Duration;

use common::{finish, harness, version, URL_A, URL_B};
use http::StatusCode;
use pdbmux_conformance::{ms, FakeBackend, Reply};

const VERSION: &str = "/pdb/meta/v1/version";

#[test]
fn all_succeed() {
    let mut h = harness(vec![
        FakeBackend::queue("pdb-a", URL_A, [version("7.12.1").after(ms(5))]),
        FakeBackend::queue("pdb-b", URL_B, [version("7.12.1").after(ms(12))]),
    ]);
    let c = h.get(VERSION);
    let transcript = finish(&mut h);
    let response = h.response(c).expect("one response");
    assert_eq!(response.status, StatusCode::OK);
    assert_eq!(response.header("x-backends"), Some("2/2"));
    assert_eq!(response.at, ms(12));
    insta::assert_snapshot!(transcript);
}

#[test]
fn one_fails_connect_refused_survivor_served() {
    let mut h = harness(vec![
        FakeBackend::queue("pdb-a", URL_A, [Reply::refused().after(ms(1))]),
        FakeBackend::queue("pdb-b", URL_B, [version("7.12.1").after(ms(5))]),
    ]);
    let c = h.get(VERSION);
    let transcript = finish(&mut h);
    let response = h.response(c).expect("one response");
    assert_eq!(response.status, StatusCode::OK);
    assert_eq!(response.header("x-backends"), Some("1/2"));
    assert_eq!(response.body_str(), r#"{"version":"7.12.1"}"#);
    insta::assert_snapshot!(transcript);
}

#[test]
fn one_times_out_at_the_core_deadline() {
    // pdb-a would answer at 2 x timeout; the core gives up at `timeout` and cancels it.
    let mut h = harness(vec![
        FakeBackend::queue(
            "pdb-a",
            URL_A,
            [version("7.9.0").after(Duration::from_secs(20))],
        ),
        FakeBackend::queue("pdb-b", URL_B, [version("7.12.1").after(ms(5))]),
    ]);
    let c = h.get(VERSION);
    let transcript = finish(&mut h);
    let response = h.response(c).expect("one response");
    assert_eq!(response.at, h.config().timeout);
    assert_eq!(response.status, StatusCode::OK);
    assert_eq!(response.header("x-backends"), Some("1/2"));
    assert_eq!(response.body_str(), r#"{"version":"7.12.1"}"#);
    assert!(transcript.contains("+10000ms c0 cancel u0"), "{transcript}");
    insta::assert_snapshot!(transcript);
}

#[test]
fn all_fail_is_502() {
    let mut h = harness(vec![
        FakeBackend::queue("pdb-a", URL_A, [Reply::refused().after(ms(1))]),
        FakeBackend::queue("pdb-b", URL_B, [Reply::never()]),
    ]);
    let c = h.get(VERSION);
    let transcript = finish(&mut h);
    let response = h.response(c).expect("one response");
    assert_eq!(response.status, StatusCode::BAD_GATEWAY);
    assert_eq!(response.at, h.config().timeout);
    insta::assert_snapshot!(transcript);
}

/// A unanimous 400 whose body mentions the first backend's address in the given form.
fn unanimous_400(url_a: &str, body_a: &str) -> (String, String) {
    let mut h = harness(vec![
        FakeBackend::queue(
            "pdb-a",
            url_a,
            [Reply::text(StatusCode::BAD_REQUEST, body_a.to_owned()).after(ms(3))],
        ),
        FakeBackend::queue(
            "pdb-b",
            URL_B,
            [Reply::text(
                StatusCode::BAD_REQUEST,
                "bad query at pdb-b.example.com:8080",
            )
            .after(ms(4))],
        ),
    ]);
    let c = h.get(VERSION);
    let transcript = finish(&mut h);
    let response = h.response(c).expect("one response");
    assert_eq!(response.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        response.header("content-type"),
        Some("text/plain;charset=utf-8")
    );
    (transcript, response.body_str())
}

#[test]
fn unanimous_400_replayed_url_without_port_scrubbed() {
    let (transcript, body) = unanimous_400(
        "http://pdb1.example.com",
        "Invalid query at http://pdb1.example.com/pdb/query/v4 (pdb1.example.com:80)",
    );
    assert_eq!(body, "Invalid query at pdb-a/pdb/query/v4 (pdb-a)");
    insta::assert_snapshot!(transcript);
}

#[test]
fn unanimous_400_replayed_ipv6_scrubbed() {
    let (transcript, body) = unanimous_400(
        "http://[::1]:8080",
        "Invalid query at http://[::1]:8080/pdb/query/v4, reached via [::1]:8080",
    );
    assert_eq!(
        body,
        "Invalid query at pdb-a/pdb/query/v4, reached via pdb-a"
    );
    insta::assert_snapshot!(transcript);
}

#[test]
fn unanimous_400_replayed_upper_case_host_scrubbed() {
    let (transcript, body) = unanimous_400(
        "https://PDB1.Example.COM:8081",
        "Invalid query at HTTPS://PDB1.EXAMPLE.COM:8081/pdb and pdb1.example.com:8081",
    );
    assert_eq!(body, "Invalid query at pdb-a/pdb and pdb-a");
    insta::assert_snapshot!(transcript);
}

#[test]
fn unanimous_500_replayed() {
    let body = r#"{"error":"database unavailable at pdb-a.example.com:8080"}"#;
    let mut h = harness(vec![
        FakeBackend::queue(
            "pdb-a",
            URL_A,
            [Reply::json(StatusCode::INTERNAL_SERVER_ERROR, body).after(ms(2))],
        ),
        FakeBackend::queue(
            "pdb-b",
            URL_B,
            [Reply::json(StatusCode::INTERNAL_SERVER_ERROR, r#"{"error":"b"}"#).after(ms(1))],
        ),
    ]);
    let c = h.get(VERSION);
    let transcript = finish(&mut h);
    let response = h.response(c).expect("one response");
    assert_eq!(response.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(
        response.header("content-type"),
        Some("application/json;charset=utf-8")
    );
    assert_eq!(
        response.body_str(),
        r#"{"error":"database unavailable at pdb-a"}"#
    );
    insta::assert_snapshot!(transcript);
}

#[test]
fn split_statuses_400_500_are_502() {
    let mut h = harness(vec![
        FakeBackend::queue(
            "pdb-a",
            URL_A,
            [Reply::text(StatusCode::BAD_REQUEST, "bad").after(ms(2))],
        ),
        FakeBackend::queue(
            "pdb-b",
            URL_B,
            [Reply::text(StatusCode::INTERNAL_SERVER_ERROR, "oops").after(ms(3))],
        ),
    ]);
    let c = h.get(VERSION);
    let transcript = finish(&mut h);
    let response = h.response(c).expect("one response");
    assert_eq!(response.status, StatusCode::BAD_GATEWAY);
    insta::assert_snapshot!(transcript);
}

#[test]
fn a_rejection_beside_a_failure_is_502() {
    // Not unanimous: one backend answered nothing at all, so the 400 is not the estate's answer.
    let mut h = harness(vec![
        FakeBackend::queue(
            "pdb-a",
            URL_A,
            [Reply::text(StatusCode::BAD_REQUEST, "bad").after(ms(2))],
        ),
        FakeBackend::queue("pdb-b", URL_B, [Reply::reset().after(ms(3))]),
    ]);
    let c = h.get(VERSION);
    finish(&mut h);
    assert_eq!(
        h.response(c).expect("one response").status,
        StatusCode::BAD_GATEWAY
    );
}
