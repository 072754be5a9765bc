//! Local refusals (docs/decisions.md D6): answered by pdbmux, never sent to a backend.

mod common;

use common::{finish, harness, URL_A, URL_B};
use http::{Method, StatusCode};
use pdbmux_conformance::{FakeBackend, Harness, Reply};
use pdbmux_core::ClientRequest;

fn backends() -> Vec<FakeBackend> {
    vec![
        FakeBackend::always("pdb-a", URL_A, Reply::ok("[]")),
        FakeBackend::always("pdb-b", URL_B, Reply::ok("[]")),
    ]
}

fn status_of(h: &Harness, client: pdbmux_conformance::ClientId) -> StatusCode {
    h.response(client).expect("one response").status
}

#[test]
fn refusals() {
    let mut h = harness(backends());
    let post = h.submit(ClientRequest {
        method: Method::POST,
        ..ClientRequest::get("/pdb/query/v4/nodes")
    });
    let archive = h.get("/pdb/admin/v1/archive");
    let dots = h.get("/pdb/query/v4/../../pdb/admin/v1/archive");
    let long = h.get(&format!(
        "/pdb/query/v4/nodes?query={}",
        "x".repeat(8 * 1024)
    ));
    let headers = h.submit(ClientRequest {
        header_count: 101,
        ..ClientRequest::get("/pdb/query/v4/nodes")
    });
    let transcript = finish(&mut h);
    assert!(
        h.sends().is_empty(),
        "no refusal reaches a backend:\n{transcript}"
    );
    assert_eq!(status_of(&h, post), StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(h.response(post).expect("one").header("allow"), Some("GET"));
    assert_eq!(status_of(&h, archive), StatusCode::NOT_FOUND);
    assert_eq!(status_of(&h, dots), StatusCode::BAD_REQUEST);
    assert_eq!(status_of(&h, long), StatusCode::URI_TOO_LONG);
    assert_eq!(
        status_of(&h, headers),
        StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE
    );
    for client in [post, archive, dots, long, headers] {
        assert_eq!(
            h.response(client).expect("one").at,
            std::time::Duration::ZERO
        );
    }
    insta::assert_snapshot!(transcript);
}

#[test]
fn more_refusals_and_their_boundaries() {
    let mut h = harness(backends());
    let refused: Vec<(&str, StatusCode)> = vec![
        ("/pdb/cmd/v1", StatusCode::NOT_FOUND),
        ("/status/v1/services", StatusCode::NOT_FOUND),
        ("/pdb/admin/v1/summary-stats", StatusCode::NOT_FOUND),
        ("/", StatusCode::NOT_FOUND),
        (
            "/pdb/query/v4/%2e%2e/%2E%2E/pdb/admin/v1/archive",
            StatusCode::BAD_REQUEST,
        ),
        ("/pdb/query/v4/./nodes", StatusCode::BAD_REQUEST),
        ("/pdb/query/v4/nodes/a%2fb", StatusCode::BAD_REQUEST),
        ("/pdb/query/v4/nodes/a%5Cb", StatusCode::BAD_REQUEST),
        ("/pdb/query/v4//nodes", StatusCode::BAD_REQUEST),
    ];
    let clients: Vec<_> = refused.iter().map(|(target, _)| h.get(target)).collect();
    let too_big_headers = h.submit(ClientRequest {
        header_bytes: 16 * 1024 + 1,
        ..ClientRequest::get("/pdb/query/v4/environments/production")
    });
    let head = h.submit(ClientRequest {
        method: Method::HEAD,
        ..ClientRequest::get("/healthz")
    });
    finish(&mut h);
    assert!(h.sends().is_empty(), "{}", h.transcript());
    for (client, (target, status)) in clients.into_iter().zip(refused) {
        assert_eq!(status_of(&h, client), status, "{target}");
    }
    assert_eq!(
        status_of(&h, too_big_headers),
        StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE
    );
    assert_eq!(status_of(&h, head), StatusCode::METHOD_NOT_ALLOWED);

    // Exactly at the limits: served.
    let mut h = harness(backends());
    let prefix = "/pdb/query/v4/environments/production?q=";
    let target = format!("{prefix}{}", "x".repeat(8 * 1024 - prefix.len()));
    assert_eq!(target.len(), 8 * 1024);
    let at_url_limit = h.get(&target);
    let at_header_limit = h.submit(ClientRequest {
        header_count: 100,
        header_bytes: 16 * 1024,
        ..ClientRequest::get("/pdb/query/v4/environments/production")
    });
    finish(&mut h);
    assert_eq!(status_of(&h, at_url_limit), StatusCode::OK);
    assert_eq!(status_of(&h, at_header_limit), StatusCode::OK);
}

#[test]
fn dot_segments_with_path_parameters_are_refused() {
    let mut h = harness(backends());
    let c = h.get("/pdb/query/v4/..;/..;/pdb/admin/v1/archive");
    finish(&mut h);
    assert!(
        h.sends().is_empty(),
        "forwarded upstream:\n{}",
        h.transcript()
    );
    assert_eq!(status_of(&h, c), StatusCode::BAD_REQUEST);
}
