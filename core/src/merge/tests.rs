//! Merge rules on hand-made backend answers.

use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method};

use super::{Answer, Planned, RecordPlan};
use crate::config::{BackendConfig, BackendUrl, Config, MergeStrategy, TlsFiles};
use crate::ids::BackendId;
use crate::membership::{BackendNodes, Member, Ownership};
use crate::route::{classify, Route};
use crate::ClientRequest;

fn config() -> Arc<Config> {
    let backend = |name: &str, port| BackendConfig {
        name: name.into(),
        url: BackendUrl {
            scheme: "http".into(),
            host: "127.0.0.1".into(),
            port: Some(port),
        },
        tls: TlsFiles::default(),
    };
    Arc::new(Config::with_backends(vec![
        backend("pdb-a", 1),
        backend("pdb-b", 2),
    ]))
}

fn ownership(a: &[(&str, &str)], b: &[(&str, &str)]) -> Arc<Ownership> {
    let nodes = |rows: &[(&str, &str)]| -> Option<BackendNodes> {
        Some(
            rows.iter()
                .map(|(c, t)| ((*c).to_owned(), Member::active(Some(t))))
                .collect(),
        )
    };
    Arc::new(Ownership::build(&[nodes(a), nodes(b)]))
}

fn plan(
    config: &Arc<Config>,
    target: &str,
    ownership: Option<Arc<Ownership>>,
) -> Result<RecordPlan, String> {
    let request = ClientRequest::get(target);
    let route: Route = classify(&request).map_err(|e| e.to_string())?;
    match RecordPlan::plan(&route, request.path(), request.query(), config) {
        Planned::FanOut(mut plan) => {
            plan.attach(ownership);
            Ok(*plan)
        }
        Planned::Respond(response) => Err(format!(
            "{} {}",
            response.status.as_u16(),
            String::from_utf8_lossy(response.full_body().map_or(&[][..], |b| &b[..]))
        )),
    }
}

/// Merges bodies (with optional X-Records) and returns (body, X-Records, X-contributed).
fn merge(plan: &RecordPlan, bodies: &[(&str, Option<u64>)]) -> (String, Option<String>) {
    let owned: Vec<(HeaderMap, Bytes)> = bodies
        .iter()
        .map(|(body, total)| {
            let mut headers = HeaderMap::new();
            if let Some(total) = total {
                headers.insert("x-records", HeaderValue::from(*total));
            }
            (headers, Bytes::copy_from_slice(body.as_bytes()))
        })
        .collect();
    let answers: Vec<Answer<'_>> = owned
        .iter()
        .enumerate()
        .map(|(i, (headers, body))| Answer {
            backend: BackendId(i),
            headers,
            body,
        })
        .collect();
    let merged = plan.merge(&answers);
    let response = merged.response.expect("a response");
    let body = String::from_utf8(response.full_body().expect("full").to_vec()).expect("utf-8");
    let total = response
        .headers
        .get("x-records")
        .map(|v| v.to_str().unwrap_or("?").to_owned());
    (body, total)
}

#[test]
fn nodes_dedupe_newer_wins_ties_to_configured_order_and_stamp_the_source() {
    let config = config();
    let plan = plan(&config, "/pdb/query/v4/nodes", None).expect("plan");
    let a = r#"[{"certname":"both","report_timestamp":"2026-11-30T08:00:00.000Z"},{"certname":"tie","report_timestamp":"2026-11-30T08:00:00.000Z"},{"certname":"only-a","report_timestamp":null}]"#;
    let b = r#"[{"certname":"both","report_timestamp":"2026-11-30T09:00:00.000Z"},{"certname":"tie","report_timestamp":"2026-11-30T09:00:00.000+01:00"}]"#;
    let (body, _) = merge(&plan, &[(a, None), (b, None)]);
    assert_eq!(
        body,
        concat!(
            r#"[{"certname":"tie","report_timestamp":"2026-11-30T08:00:00.000Z","pdbmux_source":"pdb-a"},"#,
            r#"{"certname":"only-a","report_timestamp":null,"pdbmux_source":"pdb-a"},"#,
            r#"{"certname":"both","report_timestamp":"2026-11-30T09:00:00.000Z","pdbmux_source":"pdb-b"}]"#
        )
    );
}

#[test]
fn nodes_are_resorted_and_repaged_with_an_upstream_over_fetch() {
    let config = config();
    let target = "/pdb/query/v4/nodes?order_by=%5B%7B%22field%22%3A%22certname%22%2C%22order%22%3A%22desc%22%7D%5D&limit=2&offset=1&include_total=true";
    let plan = plan(&config, target, None).expect("plan");
    let (method, upstream, body) =
        plan.upstream_request(BackendId(0), &[BackendId(0), BackendId(1)]);
    assert_eq!((method, body), (Method::GET, None));
    assert!(upstream.contains("limit=3"), "{upstream}");
    assert!(!upstream.contains("offset"), "{upstream}");
    let a = r#"[{"certname":"e"},{"certname":"c"},{"certname":"a"}]"#;
    let b = r#"[{"certname":"d"},{"certname":"b"}]"#;
    let (body, total) = merge(&plan, &[(a, Some(3)), (b, Some(2))]);
    assert_eq!(
        body,
        r#"[{"certname":"d","pdbmux_source":"pdb-b"},{"certname":"c","pdbmux_source":"pdb-a"}]"#
    );
    assert_eq!(total.as_deref(), Some("5"));
}

#[test]
fn a_projection_keeps_its_row_shape() {
    let config = config();
    let target = "/pdb/query/v4/nodes?query=%5B%22extract%22%2C%5B%22certname%22%5D%5D";
    let plan = plan(&config, target, None).expect("plan");
    let (body, _) = merge(
        &plan,
        &[
            (r#"[{"certname":"a"}]"#, None),
            (r#"[{"certname":"a"},{"certname":"b"}]"#, None),
        ],
    );
    assert_eq!(body, r#"[{"certname":"a"},{"certname":"b"}]"#);
}

#[test]
fn ownership_is_pushed_into_each_backends_query() {
    let config = config();
    let own = ownership(
        &[
            ("moved", "2026-11-30T08:00:00.000Z"),
            ("a-only", "2026-11-30T08:00:00.000Z"),
        ],
        &[("moved", "2026-11-30T09:00:00.000Z")],
    );
    let plan = plan(
        &config,
        "/pdb/query/v4/facts?query=%5B%22%3D%22%2C%22certname%22%2C%22x%22%5D",
        Some(own),
    )
    .expect("plan");
    let (_, to_a, _) = plan.upstream_request(BackendId(0), &[BackendId(0), BackendId(1)]);
    let (_, to_b, _) = plan.upstream_request(BackendId(1), &[BackendId(0), BackendId(1)]);
    let decoded = |t: &str| {
        form_urlencoded::parse(t.split_once('?').map_or("", |(_, q)| q).as_bytes())
            .find(|(k, _)| k == "query")
            .map(|(_, v)| v.into_owned())
    };
    assert_eq!(
        decoded(&to_a).as_deref(),
        Some(r#"["and",["=","certname","x"],["not",["in","certname",["array",["moved"]]]]]"#)
    );
    assert_eq!(
        decoded(&to_b).as_deref(),
        Some(r#"["=","certname","x"]"#),
        "b owns everything it holds"
    );
}

#[test]
fn a_long_rewritten_query_goes_upstream_as_post() {
    let config = config();
    let many: Vec<(String, String)> = (0..400)
        .map(|i| {
            (
                format!("node-{i:04}.example.com"),
                "2026-11-30T08:00:00.000Z".to_owned(),
            )
        })
        .collect();
    let newer: Vec<(String, String)> = (0..400)
        .map(|i| {
            (
                format!("node-{i:04}.example.com"),
                "2026-11-30T09:00:00.000Z".to_owned(),
            )
        })
        .collect();
    let a: Vec<(&str, &str)> = many.iter().map(|(c, t)| (c.as_str(), t.as_str())).collect();
    let b: Vec<(&str, &str)> = newer
        .iter()
        .map(|(c, t)| (c.as_str(), t.as_str()))
        .collect();
    let plan = plan(
        &config,
        "/pdb/query/v4/nodes?limit=5",
        Some(ownership(&a, &b)),
    )
    .expect("plan");
    let (method, path, body) = plan.upstream_request(BackendId(0), &[BackendId(0), BackendId(1)]);
    assert_eq!(method, Method::POST);
    assert_eq!(path, "/pdb/query/v4/nodes");
    let body: serde_json::Value = serde_json::from_slice(&body.expect("a body")).expect("json");
    assert_eq!(body["limit"], 5);
    assert_eq!(body["query"][0], "not");
    assert_eq!(body["query"][1][2][1].as_array().map(Vec::len), Some(400));
    let (method, _, _) = plan.upstream_request(BackendId(1), &[BackendId(0), BackendId(1)]);
    assert_eq!(method, Method::GET, "b owns all of them");
}

#[test]
fn facts_come_from_the_owner_with_one_provenance_record_per_node() {
    let config = config();
    let own = ownership(
        &[("moved", "2026-11-30T08:00:00.000Z")],
        &[("moved", "2026-11-30T09:00:00.000Z")],
    );
    let plan = plan(&config, "/pdb/query/v4/facts", Some(own)).expect("plan");
    let a = r#"[{"certname":"moved","name":"kernel","value":"Linux","environment":"production"},{"certname":"a1","name":"kernel","value":"Linux","environment":"dev"},{"certname":"a1","name":"pdbmux_source","value":"fake","environment":"dev"}]"#;
    let b = r#"[{"certname":"moved","name":"kernel","value":"Linux","environment":"staging"},{"certname":"moved","name":"os","value":{"family":"Debian"},"environment":"staging"}]"#;
    let (body, _) = merge(&plan, &[(a, None), (b, None)]);
    assert_eq!(
        body,
        concat!(
            r#"[{"certname":"a1","name":"kernel","value":"Linux","environment":"dev"},"#,
            r#"{"certname":"a1","name":"pdbmux_source","value":"pdb-a","environment":"dev"},"#,
            r#"{"certname":"moved","name":"kernel","value":"Linux","environment":"staging"},"#,
            r#"{"certname":"moved","name":"os","value":{"family":"Debian"},"environment":"staging"},"#,
            r#"{"certname":"moved","name":"pdbmux_source","value":"pdb-b","environment":"staging"}]"#
        )
    );
}

#[test]
fn a_node_whose_owner_returned_nothing_still_appears() {
    let config = config();
    let own = ownership(
        &[("n", "2026-11-30T08:00:00.000Z")],
        &[("n", "2026-11-30T09:00:00.000Z")],
    );
    let plan = plan(&config, "/pdb/query/v4/facts", Some(own)).expect("plan");
    let (body, _) = merge(
        &plan,
        &[
            (
                r#"[{"certname":"n","name":"k","value":1,"environment":null}]"#,
                None,
            ),
            ("[]", None),
        ],
    );
    assert_eq!(
        body,
        r#"[{"certname":"n","name":"k","value":1,"environment":null},{"certname":"n","name":"pdbmux_source","value":"pdb-a","environment":null}]"#
    );
}

#[test]
fn provenance_gates() {
    let config = config();
    let facts = r#"[{"certname":"n","name":"k","value":1,"environment":"e"},{"certname":"n","name":"pdbmux_source","value":"x","environment":"e"}]"#;
    for target in [
        "/pdb/query/v4/facts?query=%5B%22%3D%22%2C%22name%22%2C%22k%22%5D",
        "/pdb/query/v4/facts?query=%5B%22extract%22%2C%5B%22certname%22%2C%22name%22%5D%5D",
        "/pdb/query/v4/facts?query=facts%7B%7D",
        "/pdb/query/v4/facts?limit=10",
        "/pdb/query/v4/facts/k",
    ] {
        let plan = plan(&config, target, None).expect("plan");
        let (body, _) = merge(&plan, &[(facts, None), ("[]", None)]);
        assert_eq!(
            body, r#"[{"certname":"n","name":"k","value":1,"environment":"e"}]"#,
            "{target}"
        );
    }
    let mut off = (*config).clone();
    off.source_fact_enabled = false;
    let off = Arc::new(off);
    let plan = plan(&off, "/pdb/query/v4/facts", None).expect("plan");
    let (body, _) = merge(&plan, &[(facts, None), ("[]", None)]);
    assert_eq!(body, facts, "injection off: records untouched");
}

#[test]
fn the_source_fact_path_is_synthesised() {
    let config = config();
    let facts_a = r#"[{"certname":"n1","name":"k","value":1,"environment":"e"}]"#;
    let facts_b = r#"[{"certname":"n2","name":"k","value":1,"environment":"f"}]"#;
    let all = plan(&config, "/pdb/query/v4/facts/pdbmux_source", None).expect("plan");
    assert!(all
        .upstream_request(BackendId(0), &[BackendId(0), BackendId(1)])
        .1
        .starts_with("/pdb/query/v4/facts"));
    let (body, _) = merge(&all, &[(facts_a, None), (facts_b, None)]);
    assert_eq!(
        body,
        r#"[{"certname":"n1","name":"pdbmux_source","value":"pdb-a","environment":"e"},{"certname":"n2","name":"pdbmux_source","value":"pdb-b","environment":"f"}]"#
    );
    let one = plan(&config, "/pdb/query/v4/facts/pdbmux_source/pdb-b", None).expect("plan");
    let (body, _) = merge(&one, &[(facts_a, None), (facts_b, None)]);
    assert_eq!(
        body,
        r#"[{"certname":"n2","name":"pdbmux_source","value":"pdb-b","environment":"f"}]"#
    );
    assert_eq!(
        plan(&config, "/pdb/query/v4/facts/pdbmux_source/nowhere", None)
            .err()
            .as_deref(),
        Some("200 []")
    );
    assert_eq!(
        plan(&config, "/pdb/query/v4/facts/pdbmux_source?limit=1", None)
            .err()
            .as_deref(),
        Some("200 []")
    );
}

#[test]
fn fact_names_union_sorted_and_paged_here() {
    let config = config();
    let plan = plan(
        &config,
        "/pdb/query/v4/fact-names?limit=3&offset=1&include_total=true",
        None,
    )
    .expect("plan");
    let (_, upstream, _) = plan.upstream_request(BackendId(0), &[BackendId(0), BackendId(1)]);
    assert_eq!(upstream, "/pdb/query/v4/fact-names");
    let (body, total) = merge(
        &plan,
        &[(r#"["b","kernel","a"]"#, None), (r#"["os","b"]"#, None)],
    );
    assert_eq!(body, r#"["b","kernel","os"]"#);
    assert_eq!(total.as_deref(), Some("5"));
    let bad = "/pdb/query/v4/fact-names?order_by=%5B%7B%22field%22%3A%22x%22%7D%5D";
    assert!(super::tests::plan(&config, bad, None)
        .err()
        .is_some_and(|e| e.starts_with("400 ")));
}

#[test]
fn reports_dedupe_by_hash_and_events_by_record() {
    let config = config();
    let reports = plan(&config, "/pdb/query/v4/reports", None).expect("plan");
    let (body, _) = merge(
        &reports,
        &[
            (r#"[{"hash":"h1","x":1},{"hash":"h2"}]"#, None),
            (r#"[{"hash":"h1","x":2},{"hash":"h3"}]"#, None),
        ],
    );
    assert_eq!(body, r#"[{"hash":"h1","x":1},{"hash":"h2"},{"hash":"h3"}]"#);
    let events = plan(&config, "/pdb/query/v4/events", None).expect("plan");
    let (body, _) = merge(
        &events,
        &[
            (r#"[{"a":1},{"a":2}]"#, None),
            (r#"[{"a":1},{"a":3}]"#, None),
        ],
    );
    assert_eq!(body, r#"[{"a":1},{"a":2},{"a":3}]"#);
    let (body, _) = merge(
        &events,
        &[
            (
                r#"[{"a":1,"report_receive_time":"2026-11-30T10:00:00.001Z"}]"#,
                None,
            ),
            (
                r#"[{"a":1,"report_receive_time":"2026-11-30T10:00:00.002Z"},{"a":1,"b":2}]"#,
                None,
            ),
        ],
    );
    assert_eq!(
        body, r#"[{"a":1,"report_receive_time":"2026-11-30T10:00:00.001Z"},{"a":1,"b":2}]"#,
        "each backend stamps its own receive time on the same event"
    );
    let environments = plan(&config, "/pdb/query/v4/environments", None).expect("plan");
    let (body, _) = merge(
        &environments,
        &[
            (r#"[{"name":"production"},{"name":"dev"}]"#, None),
            (r#"[{"name":"staging"},{"name":"production"}]"#, None),
        ],
    );
    assert_eq!(
        body,
        r#"[{"name":"dev"},{"name":"production"},{"name":"staging"}]"#
    );
}

#[test]
fn bad_paging_is_a_400_before_any_fan_out() {
    let config = config();
    for target in [
        "/pdb/query/v4/nodes?limit=0",
        "/pdb/query/v4/reports?offset=-1",
        "/pdb/query/v4/events?order_by=nope",
    ] {
        let error = plan(&config, target, None).err().unwrap_or_default();
        assert!(error.starts_with("400 "), "{target}: {error}");
    }
}

#[test]
fn static_merge_uses_the_first_holder() {
    let mut config = (*config()).clone();
    config.merge = MergeStrategy::Static;
    let config = Arc::new(config);
    let own = ownership(
        &[("n", "2026-11-30T08:00:00.000Z")],
        &[("n", "2026-11-30T09:00:00.000Z")],
    );
    let plan = plan(&config, "/pdb/query/v4/facts", Some(own)).expect("plan");
    let (body, _) = merge(
        &plan,
        &[
            (
                r#"[{"certname":"n","name":"k","value":"a","environment":"e"}]"#,
                None,
            ),
            (
                r#"[{"certname":"n","name":"k","value":"b","environment":"e"}]"#,
                None,
            ),
        ],
    );
    assert!(
        body.contains(r#""value":"a""#) && !body.contains(r#""value":"b""#),
        "{body}"
    );
}
