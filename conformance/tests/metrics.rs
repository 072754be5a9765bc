//! The Jolokia metrics routes (docs/merging.md "Metrics"; docs/decisions.md D9; issue 4) through the
//! exchange: every backend's envelope merged (values recursively, numbers by attribute name),
//! in-band errors skipped or replayed, `/metrics/v2/list` as the union of the MBean trees, the
//! legacy v1 bodies merged without an envelope, and the population MBeans counted for the estate
//! once (num-nodes from the membership map, num-resources from an owned `/resources` count).

mod common;

use common::{finish, harness, run_to, URL_A, URL_B};
use http::StatusCode;
use pdbmux_conformance::{
    decoded_upstream, excluded_certnames, ms, read_asking, Asked, ClientId, FakeBackend, Harness,
    Machine, PuppetDb, Reply,
};
use serde_json::{json, Value};
use std::time::Duration;

const T10: Option<&str> = Some("2024-05-01T10:00:00.000Z");
const T11: Option<&str> = Some("2024-05-01T11:00:00.000Z");

const PROCESSING_TIME: &str = "puppetlabs.puppetdb.mq:name=global.processing-time";

/// A Jolokia read envelope as PuppetDB answers it (HTTP 200, `status` 200 in band).
fn envelope(request: Value, value: Value, timestamp: u64) -> String {
    json!({"request": request, "value": value, "timestamp": timestamp, "status": 200}).to_string()
}

fn read(mbean: &str) -> Value {
    json!({"mbean": mbean, "type": "read"})
}

/// Jolokia's in-band error for an unknown MBean, inside an HTTP 200.
fn in_band_error(mbean: &str, timestamp: u64) -> String {
    json!({
        "request": read(mbean),
        "error_type": "javax.management.InstanceNotFoundException",
        "error": format!("javax.management.InstanceNotFoundException : {mbean}"),
        "status": 404,
        "timestamp": timestamp,
    })
    .to_string()
}

fn body_json(h: &Harness, client: ClientId) -> Value {
    let response = h.response(client).expect("one response");
    serde_json::from_slice(&response.body)
        .unwrap_or_else(|e| panic!("{e}: {}", response.body_str()))
}

/// The transcript, then these clients' whole response bodies (the transcript cuts long ones).
fn with_bodies(transcript: String, h: &Harness, clients: &[ClientId]) -> String {
    let mut out = transcript;
    for client in clients {
        let response = h.response(*client).expect("one response");
        out.push_str(&format!("--- {client} body\n{}\n", response.body_str()));
    }
    out
}

/// Drives to quiescence; the transcript and the decoded upstream requests.
fn run(h: &mut Harness) -> String {
    let transcript = finish(h);
    format!(
        "{transcript}--- upstream, decoded\n{}",
        decoded_upstream(h, 600)
    )
}

#[test]
fn read_merges_values_by_attribute_name() {
    // A wildcard read: one object per MBean, merged over the union of MBeans and attributes.
    // Count and rates add; Min, Max, Mean, StdDev and percentiles follow their own rules; a
    // string keeps the first backend's value; the envelope is pdb-a's with the newest timestamp.
    let wildcard = "puppetlabs.puppetdb.mq:name=*";
    let a = envelope(
        read(wildcard),
        json!({
            PROCESSING_TIME: {"Count": 10, "Min": 1.5, "Max": 9, "Mean": 4.0, "StdDev": 1,
                "75thPercentile": 6, "FiveMinuteRate": 0.5, "RateUnit": "events/second",
                "OnlyA": 1},
            "puppetlabs.puppetdb.mq:name=global.seen": {"Count": 7},
        }),
        1_700_000_000,
    );
    let b = envelope(
        read(wildcard),
        json!({
            PROCESSING_TIME: {"Count": 5, "Min": 0.5, "Max": 12, "Mean": 2.0, "StdDev": 3,
                "75thPercentile": 8, "FiveMinuteRate": 0.25, "RateUnit": "calls/minute",
                "OnlyB": "x"},
            "puppetlabs.puppetdb.mq:name=global.discarded": {"Count": 2},
        }),
        1_700_000_005,
    );
    let runtime_a = envelope(
        read("java.lang:type=Runtime"),
        json!({"Uptime": 1_000, "StartTime": 1_699_999_000_000_u64, "VmName": "OpenJDK 64-Bit"}),
        1_700_000_000,
    );
    let runtime_b = envelope(
        read("java.lang:type=Runtime"),
        json!({"Uptime": 5_000, "StartTime": 1_699_999_500_000_u64, "VmName": "Other VM"}),
        1_700_000_001,
    );
    let mut h = harness(vec![
        FakeBackend::queue(
            "pdb-a",
            URL_A,
            [Reply::ok(a).after(ms(2)), Reply::ok(runtime_a).after(ms(2))],
        ),
        FakeBackend::queue(
            "pdb-b",
            URL_B,
            [Reply::ok(b).after(ms(3)), Reply::ok(runtime_b).after(ms(3))],
        ),
    ]);
    let mq = h.get("/metrics/v2/read/puppetlabs.puppetdb.mq%3Aname%3D*");
    let runtime = h.get("/metrics/v2/read/java.lang:type=Runtime");
    let transcript = run(&mut h);
    let body = body_json(&h, mq);
    assert_eq!(body["request"], read(wildcard));
    assert_eq!(body["timestamp"], 1_700_000_005);
    assert_eq!(body["status"], 200);
    assert_eq!(
        body["value"][PROCESSING_TIME],
        json!({"Count": 15, "Min": 0.5, "Max": 12, "Mean": 3.0, "StdDev": 2,
            "75thPercentile": 7, "FiveMinuteRate": 0.75, "RateUnit": "events/second",
            "OnlyA": 1, "OnlyB": "x"})
    );
    assert_eq!(
        body["value"]["puppetlabs.puppetdb.mq:name=global.seen"],
        json!({"Count": 7})
    );
    assert_eq!(
        body["value"]["puppetlabs.puppetdb.mq:name=global.discarded"],
        json!({"Count": 2})
    );
    assert_eq!(
        body_json(&h, runtime)["value"],
        json!({"Uptime": 5_000, "StartTime": 1_699_999_500_000_u64, "VmName": "OpenJDK 64-Bit"})
    );
    // The raw, percent-encoded path went upstream as the client sent it.
    assert!(h
        .sends()
        .iter()
        .any(|s| s.request.path_and_query == "/metrics/v2/read/puppetlabs.puppetdb.mq%3Aname%3D*"));
    assert_eq!(
        h.response(mq).expect("one").header("x-backends"),
        Some("2/2")
    );
    insta::assert_snapshot!(with_bodies(transcript, &h, &[mq, runtime]));
}

#[test]
fn an_in_band_error_is_skipped() {
    let mbean = "puppetlabs.puppetdb.storage:name=replace-facts-time";
    let mut h = harness(vec![
        FakeBackend::queue(
            "pdb-a",
            URL_A,
            [Reply::ok(in_band_error(mbean, 1_700_000_009)).after(ms(1))],
        ),
        FakeBackend::queue(
            "pdb-b",
            URL_B,
            [Reply::ok(envelope(
                read(mbean),
                json!({"Count": 3, "Mean": 2.5}),
                1_700_000_000,
            ))
            .after(ms(2))],
        ),
    ]);
    let c = h.get(&format!("/metrics/v2/read/{mbean}"));
    let transcript = run(&mut h);
    let response = h.response(c).expect("one response");
    assert_eq!(response.status, StatusCode::OK);
    assert_eq!(response.header("x-backends"), Some("1/2"));
    let body = body_json(&h, c);
    assert_eq!(body["value"], json!({"Count": 3, "Mean": 2.5}));
    assert_eq!(body["status"], 200);
    insta::assert_snapshot!(transcript);
}

#[test]
fn every_in_band_error_replays_the_first_envelope() {
    let mbean = "puppetlabs.puppetdb.storage:name=no-such-metric";
    let first = in_band_error(mbean, 1_700_000_000);
    let mut h = harness(vec![
        FakeBackend::queue("pdb-a", URL_A, [Reply::ok(first.clone()).after(ms(2))]),
        FakeBackend::queue(
            "pdb-b",
            URL_B,
            [Reply::ok(in_band_error(mbean, 1_700_000_050)).after(ms(1))],
        ),
    ]);
    let c = h.get(&format!("/metrics/v2/read/{mbean}"));
    let transcript = run(&mut h);
    let response = h.response(c).expect("one response");
    assert_eq!(response.status, StatusCode::OK);
    assert_eq!(response.body_str(), first, "pdb-a's envelope, verbatim");
    insta::assert_snapshot!(transcript);
}

#[test]
fn list_is_the_union_of_the_mbean_trees() {
    let attr = |desc: &str| json!({"rw": false, "type": "java.lang.Object", "desc": desc});
    let a = json!({
        "request": {"type": "list"},
        "value": {
            "java.lang": {"type=Memory": {"desc": "Memory", "attr": {"HeapMemoryUsage": attr("heap")}}},
            "puppetlabs.puppetdb.population": {"name=num-nodes": {"desc": "a", "attr": {"Value": attr("nodes")}}},
        },
        "timestamp": 1_700_000_000,
        "status": 200,
    });
    let b = json!({
        "request": {"type": "list"},
        "value": {
            "java.lang": {
                "type=Memory": {"desc": "Memory (b)", "attr": {"NonHeapMemoryUsage": attr("non-heap")}},
                "type=Runtime": {"desc": "Runtime", "attr": {"Uptime": attr("uptime")}},
            },
            "puppetlabs.puppetdb.mq": {"name=global.seen": {"desc": "b", "attr": {"Count": attr("count")}}},
        },
        "timestamp": 1_700_000_001,
        "status": 200,
    });
    let mut h = harness(vec![
        FakeBackend::queue("pdb-a", URL_A, [Reply::ok(a.to_string()).after(ms(2))]),
        FakeBackend::queue("pdb-b", URL_B, [Reply::ok(b.to_string()).after(ms(1))]),
    ]);
    let c = h.get("/metrics/v2/list");
    let transcript = run(&mut h);
    let body = body_json(&h, c);
    assert_eq!(
        body["value"],
        json!({
            "java.lang": {
                "type=Memory": {"desc": "Memory", "attr": {
                    "HeapMemoryUsage": attr("heap"), "NonHeapMemoryUsage": attr("non-heap")}},
                "type=Runtime": {"desc": "Runtime", "attr": {"Uptime": attr("uptime")}},
            },
            "puppetlabs.puppetdb.population": {"name=num-nodes": {"desc": "a", "attr": {"Value": attr("nodes")}}},
            "puppetlabs.puppetdb.mq": {"name=global.seen": {"desc": "b", "attr": {"Count": attr("count")}}},
        })
    );
    assert_eq!(body["timestamp"], 1_700_000_001);
    insta::assert_snapshot!(with_bodies(transcript, &h, &[c]));
}

#[test]
fn v1_bodies_are_merged_without_an_envelope() {
    // Names match case-insensitively; strings, arrays and mixed kinds keep pdb-a's value.
    let mut h = harness(vec![
        FakeBackend::queue(
            "pdb-a",
            URL_A,
            [
                Reply::ok(
                    r#"{"Count":10,"Mean":4.0,"Max":9,"min":3,"99thpercentile":10,"DurationUnit":"milliseconds","Mixed":"n/a","Tags":["a"]}"#,
                ),
                Reply::ok(
                    r#"{"java.lang:type=Memory":"/metrics/v1/mbeans/java.lang%3Atype%3DMemory"}"#,
                ),
            ],
        ),
        FakeBackend::queue(
            "pdb-b",
            URL_B,
            [
                Reply::ok(
                    r#"{"Count":5,"Mean":2.0,"Max":12,"min":1,"99thpercentile":20,"DurationUnit":"seconds","Mixed":3,"Tags":["b"]}"#,
                ),
                Reply::ok(
                    r#"{"java.lang:type=Runtime":"/metrics/v1/mbeans/java.lang%3Atype%3DRuntime"}"#,
                ),
            ],
        ),
    ]);
    let mbean = h.get(&format!("/metrics/v1/mbeans/{PROCESSING_TIME}"));
    let list = h.get("/metrics/v1/mbeans");
    let transcript = run(&mut h);
    assert_eq!(
        body_json(&h, mbean),
        json!({"Count": 15, "Mean": 3.0, "Max": 12, "min": 1, "99thpercentile": 15,
            "DurationUnit": "milliseconds", "Mixed": "n/a", "Tags": ["a"]})
    );
    assert_eq!(
        body_json(&h, list),
        json!({
            "java.lang:type=Memory": "/metrics/v1/mbeans/java.lang%3Atype%3DMemory",
            "java.lang:type=Runtime": "/metrics/v1/mbeans/java.lang%3Atype%3DRuntime",
        })
    );
    insta::assert_snapshot!(transcript);
}

// ---------------------------------------------------------------------------------------------
// D9: the population MBeans count the estate once

/// A fake PuppetDB that also answers these Jolokia paths (exactly as sent) with these bodies.
fn estate_backend(
    name: &str,
    url: &str,
    db: PuppetDb,
    metrics: Vec<(&'static str, String)>,
    latency: u64,
) -> FakeBackend {
    FakeBackend::by_request(name, url, move |asked| {
        let reply = if asked.path_and_query.starts_with("/metrics/") {
            match metrics
                .iter()
                .find(|(path, _)| *path == asked.path_and_query)
            {
                Some((_, body)) => Reply::ok(body.clone()),
                None => Reply::text(StatusCode::NOT_FOUND, "no such metrics path"),
            }
        } else {
            db.answer(asked)
        };
        reply.after(ms(latency))
    })
}

const NUM_NODES: &str = "/metrics/v2/read/puppetlabs.puppetdb.population%3Aname%3Dnum-nodes";
const NUM_RESOURCES: &str =
    "/metrics/v2/read/puppetlabs.puppetdb.population%3Aname%3Dnum-resources";
const RESOURCES_PER_NODE: &str =
    "/metrics/v2/read/puppetlabs.puppetdb.population:name=avg-resources-per-node/Value";

fn population(name: &str) -> Value {
    read(&format!("puppetlabs.puppetdb.population:name={name}"))
}

/// pdb-a holds web1 and a stale copy of "shared"; pdb-b the fresh "shared", web2 and web3. Five
/// node records, four nodes. Resources: web1 3, shared 5 (in both), web2 2: ten in the estate.
fn estate() -> (PuppetDb, PuppetDb) {
    let mut a = PuppetDb::new().node("web1", T10).node("shared", T10);
    let mut b = PuppetDb::new()
        .node("shared", T11)
        .node("web2", T10)
        .node("web3", None);
    for title in ["a", "b", "c"] {
        a = a.resource("web1", "File", title, Some(1));
    }
    for title in ["a", "b", "c", "d", "e"] {
        a = a.resource("shared", "File", title, Some(1));
        b = b.resource("shared", "File", title, Some(1));
    }
    for title in ["a", "b"] {
        b = b.resource("web2", "File", title, None);
    }
    (a, b)
}

#[test]
fn num_nodes_is_the_number_of_distinct_certnames_in_the_membership_map() {
    let (a, b) = estate();
    let mut h = harness(vec![
        estate_backend(
            "pdb-a",
            URL_A,
            a,
            vec![(
                NUM_NODES,
                envelope(population("num-nodes"), json!({"Value": 2}), 1_700_000_000),
            )],
            2,
        ),
        estate_backend(
            "pdb-b",
            URL_B,
            b,
            vec![(
                NUM_NODES,
                envelope(population("num-nodes"), json!({"Value": 3}), 1_700_000_001),
            )],
            3,
        ),
    ]);
    let c = h.get(NUM_NODES);
    let transcript = run(&mut h);
    let body = body_json(&h, c);
    assert_eq!(body["value"], json!({"Value": 4}), "not 2 + 3");
    assert_eq!(body["request"], population("num-nodes"));
    assert_eq!(body["timestamp"], 1_700_000_001);
    insta::assert_snapshot!(transcript);
}

#[test]
fn num_resources_is_the_owned_resource_count() {
    let (a, b) = estate();
    let per_node = population("avg-resources-per-node");
    let mut per_node_request = per_node.clone();
    per_node_request["attribute"] = json!("Value");
    let mut h = harness(vec![
        estate_backend(
            "pdb-a",
            URL_A,
            a,
            vec![
                (
                    NUM_RESOURCES,
                    envelope(
                        population("num-resources"),
                        json!({"Value": 8}),
                        1_700_000_000,
                    ),
                ),
                (
                    RESOURCES_PER_NODE,
                    envelope(per_node_request.clone(), json!(4.0), 1_700_000_000),
                ),
            ],
            2,
        ),
        estate_backend(
            "pdb-b",
            URL_B,
            b,
            vec![
                (
                    NUM_RESOURCES,
                    envelope(
                        population("num-resources"),
                        json!({"Value": 7}),
                        1_700_000_001,
                    ),
                ),
                (
                    RESOURCES_PER_NODE,
                    envelope(per_node_request, json!(2.333), 1_700_000_001),
                ),
            ],
            3,
        ),
    ]);
    let resources = h.get(NUM_RESOURCES);
    let per_node = h.get(RESOURCES_PER_NODE);
    let transcript = run(&mut h);
    assert_eq!(
        body_json(&h, resources)["value"],
        json!({"Value": 10}),
        "not 8 + 7"
    );
    assert_eq!(
        body_json(&h, per_node)["value"],
        json!("5/2"),
        "10 / 4 certnames, as PuppetDB writes the Clojure ratio"
    );
    // The upstream resource counts: pdb-a does not count the node pdb-b owns.
    let counts: Vec<(String, Vec<String>)> = h
        .sends()
        .iter()
        .filter(|s| s.machine != Machine::Estate)
        .filter(|s| {
            s.request
                .path_and_query
                .starts_with("/pdb/query/v4/resources")
        })
        .map(|s| {
            let asking = read_asking(&Asked::of(&s.request)).expect("readable");
            assert_eq!(
                asking.query.as_ref().and_then(|q| q.get(1)),
                Some(&json!([["function", "count"]]))
            );
            (
                s.backend_name.clone(),
                excluded_certnames(asking.query.as_ref()),
            )
        })
        .collect();
    let expected = |name: &str, excluded: &[&str]| {
        (
            name.to_owned(),
            excluded.iter().map(|c| (*c).to_owned()).collect::<Vec<_>>(),
        )
    };
    assert_eq!(
        counts,
        vec![
            expected("pdb-a", &["shared"]),
            expected("pdb-b", &[]),
            expected("pdb-a", &["shared"]),
            expected("pdb-b", &[]),
        ]
    );
    insta::assert_snapshot!(transcript);
}

const JVM_READ: &str = "/metrics/v2/read/puppetlabs.puppetdb.mq:name=global.processing-time";

#[test]
fn population_figures_are_cached_as_counts_are_and_a_backends_own_figures_are_not() {
    // Puppetboard's overview of all environments reads num-nodes and num-resources on every
    // visit; num-resources asks each backend a resource count. It is the estate's count, cached
    // for aggregate_ttl like the counts of /nodes; a backend's JVM figures are live and are
    // asked every time (docs/caching.md).
    let (a, b) = estate();
    let jvm = |count: u64, timestamp: u64| {
        envelope(read(PROCESSING_TIME), json!({"Count": count}), timestamp)
    };
    let resources = |value: u64, timestamp: u64| {
        envelope(
            population("num-resources"),
            json!({"Value": value}),
            timestamp,
        )
    };
    let backends = vec![
        estate_backend(
            "pdb-a",
            URL_A,
            a,
            vec![
                (NUM_RESOURCES, resources(8, 1_700_000_000)),
                (JVM_READ, jvm(10, 1_700_000_000)),
            ],
            2,
        ),
        estate_backend(
            "pdb-b",
            URL_B,
            b,
            vec![
                (NUM_RESOURCES, resources(7, 1_700_000_001)),
                (JVM_READ, jvm(5, 1_700_000_001)),
            ],
            3,
        ),
    ];
    let mut h = Harness::with_config(backends, |config| {
        config.aggregate_ttl = Duration::from_secs(15);
    })
    .expect("valid test backends");
    let first = (h.get(NUM_RESOURCES), h.get(JVM_READ));
    run_to(&mut h, Duration::from_secs(5));
    let second = (h.get(NUM_RESOURCES), h.get(JVM_READ));
    run_to(&mut h, Duration::from_secs(16));
    let third = h.get(NUM_RESOURCES);
    let transcript = run(&mut h);

    let header = |client, name| {
        h.response(client)
            .expect("answered")
            .header(name)
            .map(str::to_owned)
    };
    assert_eq!(header(first.0, "x-cache").as_deref(), Some("miss"));
    assert_eq!(header(second.0, "x-cache").as_deref(), Some("hit"));
    assert_eq!(header(second.0, "x-backends").as_deref(), Some("2/2"));
    assert_eq!(body_json(&h, second.0), body_json(&h, first.0));
    assert_eq!(body_json(&h, second.0)["value"], json!({"Value": 10}));
    assert_eq!(
        h.response(second.0).expect("answered").at,
        Duration::from_secs(5),
        "a hit asks no backend"
    );
    assert_eq!(
        header(third, "x-cache").as_deref(),
        Some("miss"),
        "past aggregate_ttl the backends are asked again"
    );
    let sent = |prefix: &str| {
        h.sends()
            .iter()
            .filter(|s| s.machine != Machine::Estate)
            .filter(|s| s.request.path_and_query.starts_with(prefix))
            .count()
    };
    assert_eq!(
        sent(NUM_RESOURCES),
        4,
        "two fan-outs of two: the first and the third"
    );
    assert_eq!(
        sent("/pdb/query/v4/resources"),
        4,
        "one count per fan-out and backend"
    );
    for jvm in [first.1, second.1] {
        assert_eq!(
            header(jvm, "x-cache"),
            None,
            "a backend's own figure is not cached"
        );
        assert_eq!(body_json(&h, jvm)["value"], json!({"Count": 15}));
    }
    assert_eq!(sent(JVM_READ), 4, "asked of both backends each time");
    insta::assert_snapshot!(transcript);
}

#[test]
fn a_backend_whose_resource_count_fails_is_left_out_and_the_answer_is_not_cached() {
    // pdb-b's envelope answers but its resource count does not: its resources would be missing
    // from a total that said 2/2 (and was cached as whole).
    let (a, b) = estate();
    let resources = |value: u64| {
        envelope(
            population("num-resources"),
            json!({"Value": value}),
            1_700_000_000,
        )
    };
    let b_metrics = [(NUM_RESOURCES, resources(7))];
    let backends = vec![
        estate_backend("pdb-a", URL_A, a, vec![(NUM_RESOURCES, resources(8))], 2),
        FakeBackend::by_request("pdb-b", URL_B, move |asked| {
            if asked.path_and_query.starts_with("/pdb/query/v4/resources") {
                return Reply::text(StatusCode::SERVICE_UNAVAILABLE, "overloaded").after(ms(3));
            }
            match b_metrics.iter().find(|(p, _)| *p == asked.path_and_query) {
                Some((_, body)) => Reply::ok(body.clone()).after(ms(3)),
                None => b.answer(asked).after(ms(3)),
            }
        }),
    ];
    let mut h = Harness::with_config(backends, |config| {
        config.aggregate_ttl = Duration::from_secs(15);
    })
    .expect("valid test backends");
    let first = h.get(NUM_RESOURCES);
    run_to(&mut h, Duration::from_secs(5));
    let second = h.get(NUM_RESOURCES);
    let transcript = run(&mut h);
    let response = h.response(first).expect("answered");
    assert_eq!(response.header("x-backends"), Some("1/2"), "{transcript}");
    assert_eq!(
        body_json(&h, first)["value"],
        json!({"Value": 3}),
        "pdb-a's own count: web1's 3 (shared is pdb-b's)"
    );
    assert_eq!(
        h.response(second).expect("answered").header("x-cache"),
        Some("miss"),
        "a partial answer is not stored"
    );
}
