//! Following a request (docs/operating.md): its id is echoed and goes out on every upstream call
//! it makes, a shared fan-out's calls carry the id of the request that started it, and each call
//! continues the client's trace with a span id of its own.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::{finish, harness, URL_A, URL_B};
use pdbmux_conformance::{ms, FakeBackend, Harness, Machine, Reply, SentRequest};
use pdbmux_core::ClientRequest;

const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const NAMES: &str = "/pdb/query/v4/fact-names";

fn names(body: &str) -> Reply {
    Reply::ok(body.to_owned()).after(ms(5))
}

fn header<'a>(sent: &'a SentRequest, name: &str) -> Option<&'a str> {
    sent.request
        .correlation
        .iter()
        .find(|(n, _)| n.as_str() == name)
        .and_then(|(_, v)| v.to_str().ok())
}

/// The span id of a `traceparent` sent upstream, after checking it is in `trace`.
fn span_in(sent: &SentRequest, trace: &str) -> String {
    let traceparent = header(sent, "traceparent").expect("a traceparent on every call");
    let parts: Vec<&str> = traceparent.split('-').collect();
    assert_eq!(parts.len(), 4, "{traceparent}");
    assert_eq!(
        (parts[0], parts[1], parts[3]),
        ("00", trace, "01"),
        "{traceparent}"
    );
    parts[2].to_owned()
}

#[test]
fn a_request_id_is_echoed_and_sent_on_each_call_with_a_span_of_its_own() {
    let mut h = harness(vec![
        FakeBackend::queue("pdb-a", URL_A, [names(r#"["a"]"#)]),
        FakeBackend::queue("pdb-b", URL_B, [names(r#"["b"]"#)]),
    ]);
    let parent = format!("00-{TRACE}-00f067aa0ba902b7-01");
    let c = h.submit_with(
        ClientRequest::get(NAMES),
        &[("X-Request-Id", "puppetboard-42"), ("traceparent", &parent)],
    );
    finish(&mut h);
    let answer = h.response(c).expect("answered");
    assert_eq!(answer.header("x-request-id"), Some("puppetboard-42"));
    let calls: Vec<&SentRequest> = h
        .sends()
        .iter()
        .filter(|s| s.machine == Machine::Exchange(c))
        .collect();
    assert_eq!(calls.len(), 2, "one call per backend");
    let mut spans = BTreeSet::new();
    for call in &calls {
        assert_eq!(header(call, "x-request-id"), Some("puppetboard-42"));
        spans.insert(span_in(call, TRACE));
    }
    assert_eq!(spans.len(), 2, "each call a span of its own: {spans:?}");
    assert!(
        !spans.contains("00f067aa0ba902b7"),
        "children, not the parent"
    );
    // The estate's own calls (membership, probes) belong to no client request.
    for own in h.sends().iter().filter(|s| s.machine == Machine::Estate) {
        assert!(own.request.correlation.is_empty(), "{:?}", own.request);
    }
}

#[test]
fn a_shared_fan_out_carries_the_id_of_the_request_that_started_it() {
    let mut h = Harness::with_config(
        vec![
            FakeBackend::queue("pdb-a", URL_A, [names(r#"["a"]"#)]),
            FakeBackend::queue("pdb-b", URL_B, [names(r#"["b"]"#)]),
        ],
        |config| config.facts_ttl = Duration::from_secs(30),
    )
    .expect("valid test backends");
    let first = h.submit_with(ClientRequest::get(NAMES), &[("x-request-id", "first")]);
    let second = h.submit_with(ClientRequest::get(NAMES), &[("x-request-id", "second")]);
    finish(&mut h);
    for (client, id) in [(first, "first"), (second, "second")] {
        let answer = h.response(client).expect("answered");
        assert_eq!(answer.header("x-request-id"), Some(id), "each its own id");
    }
    let flight: Vec<&SentRequest> = h
        .sends()
        .iter()
        .filter(|s| matches!(s.machine, Machine::Flight(_)))
        .collect();
    assert_eq!(flight.len(), 2, "one shared fan-out");
    for call in flight {
        assert_eq!(header(call, "x-request-id"), Some("first"));
        assert!(header(call, "traceparent").is_some());
    }
}
