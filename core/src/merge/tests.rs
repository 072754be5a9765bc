//! Merge rules on hand-made backend answers.

use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method};

use super::{RecordPlan, RECORDS};
use crate::config::{Config, MergeStrategy};
use crate::corrections::Corrections;
use crate::fanout::{Call, CallState, Calls, Context, Plan, Step, Verdict};
use crate::ids::BackendId;
use crate::membership::{BackendNodes, Member, Ownership};
use crate::query::{Params, ParsedQuery};
use crate::route::{classify, Route};
use crate::status::Outcome;
use crate::ClientRequest;

pub(super) fn config() -> Arc<Config> {
    Arc::new(Config::on_loopback(&[("pdb-a", 1), ("pdb-b", 2)]))
}

pub(super) fn ownership(a: &[(&str, &str)], b: &[(&str, &str)]) -> Arc<Ownership> {
    let nodes = |rows: &[(&str, &str)]| -> Option<BackendNodes> {
        Some(
            rows.iter()
                .map(|(c, t)| ((*c).into(), Member::ran_at(t)))
                .collect(),
        )
    };
    Arc::new(Ownership::build(&[nodes(a), nodes(b)], 1))
}

pub(super) fn plan(
    config: &Arc<Config>,
    target: &str,
    ownership: Option<Arc<Ownership>>,
) -> Result<TestPlan, String> {
    let roster = (0..config.backends.len()).map(BackendId).collect();
    plan_over(config, target, ownership, roster)
}

/// [`plan`], asking only the backends of `roster` (the others out of service).
pub(super) fn plan_over(
    config: &Arc<Config>,
    target: &str,
    ownership: Option<Arc<Ownership>>,
    roster: Vec<BackendId>,
) -> Result<TestPlan, String> {
    let request = ClientRequest::get(target);
    let route: Route = classify(&request).map_err(|e| e.to_string())?;
    let entity = route.entity().ok_or("not a query route")?;
    let params = Params::parse(request.query());
    let query = Arc::new(ParsedQuery::new(params.query_text()));
    let mut plan = RecordPlan::plan(&route, entity, request.path(), params, query, config)
        .map_err(|response| {
            format!(
                "{} {}",
                response.status.as_u16(),
                String::from_utf8_lossy(response.full_body().map_or(&[][..], |b| &b[..]))
            )
        })?;
    let context = Context {
        config: Arc::clone(config),
        roster,
        corrections: Arc::new(Corrections::new(
            ownership.as_ref().map_or(0, |o| o.generation()),
        )),
        ownership,
        uncounted: Vec::new(),
        may_stream: false,
    };
    let first = plan.start(&context);
    Ok(TestPlan {
        plan,
        context,
        first,
    })
}

/// A started plan, its context and its first calls.
pub(super) struct TestPlan {
    plan: RecordPlan,
    context: Context,
    first: Vec<(BackendId, usize)>,
}

impl TestPlan {
    /// The streamed merge the plan starts when its answer may stream (`None`: it merges
    /// buffered whatever the size).
    pub(super) fn streamed(&mut self) -> Option<crate::streamed::RecordStream> {
        self.context.may_stream = true;
        self.plan.start(&self.context);
        Some(self.plan.stream_start(&self.context)?.merge)
    }

    /// The request of a first-round call.
    fn upstream(&self, backend: usize) -> crate::fanout::Outbound {
        self.plan
            .request(BackendId(backend), RECORDS, &self.context)
    }
}

/// `backend`'s records call, answered 200 with `headers` and `body`.
fn answered(backend: BackendId, headers: HeaderMap, body: &str) -> Call {
    Call {
        backend,
        part: RECORDS,
        purpose: crate::message::Purpose::Query,
        state: CallState::Done(Outcome::Success {
            status: http::StatusCode::OK,
            headers,
            body: Bytes::copy_from_slice(body.as_bytes()),
        }),
    }
}

/// A merged body and its X-Records.
type Answered = (String, Option<String>);

/// Merges bodies (with optional X-Records) given as the first round's answers; returns (body,
/// X-Records), or the calls the plan asks for next; the bodies are the roster's backends', in
/// its order.
fn progress(
    planned: &mut TestPlan,
    bodies: &[(&str, Option<u64>)],
) -> Result<Answered, Vec<(BackendId, usize)>> {
    let calls = Calls(
        bodies
            .iter()
            .enumerate()
            .map(|(i, (body, total))| {
                let mut headers = HeaderMap::new();
                if let Some(total) = total {
                    headers.insert("x-records", HeaderValue::from(*total));
                }
                answered(planned.context.roster[i], headers, body)
            })
            .collect(),
    );
    match planned.plan.progress(&calls, &planned.context) {
        Step::Done(Verdict::Merged { response, .. }) => {
            let body =
                String::from_utf8(response.full_body().expect("full").to_vec()).expect("utf-8");
            let total = response
                .headers
                .get("x-records")
                .map(|v| v.to_str().unwrap_or("?").to_owned());
            Ok((body, total))
        }
        Step::Call(more) => Err(more),
        other => panic!("not merged: {other:?}"),
    }
}

pub(super) fn merge(
    planned: &mut TestPlan,
    bodies: &[(&str, Option<u64>)],
) -> (String, Option<String>) {
    progress(planned, bodies).unwrap_or_else(|more| panic!("asks again: {more:?}"))
}

#[test]
fn nodes_dedupe_newer_wins_ties_to_configured_order_and_stamp_the_source() {
    let config = config();
    let mut plan = plan(&config, "/pdb/query/v4/nodes", None).expect("plan");
    let a = r#"[{"certname":"both","report_timestamp":"2026-11-30T08:00:00.000Z"},{"certname":"tie","report_timestamp":"2026-11-30T08:00:00.000Z"},{"certname":"only-a","report_timestamp":null}]"#;
    let b = r#"[{"certname":"both","report_timestamp":"2026-11-30T09:00:00.000Z"},{"certname":"tie","report_timestamp":"2026-11-30T09:00:00.000+01:00"}]"#;
    let (body, _) = merge(&mut plan, &[(a, None), (b, None)]);
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
    let mut plan = plan(&config, target, None).expect("plan");
    let upstream = plan.upstream(0);
    assert_eq!((upstream.method, upstream.body), (Method::GET, None));
    let upstream = upstream.path_and_query;
    assert!(upstream.contains("limit=3"), "{upstream}");
    assert!(!upstream.contains("offset"), "{upstream}");
    let a = r#"[{"certname":"e"},{"certname":"c"},{"certname":"a"}]"#;
    let b = r#"[{"certname":"d"},{"certname":"b"}]"#;
    let (body, total) = merge(&mut plan, &[(a, Some(3)), (b, Some(2))]);
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
    let mut plan = plan(&config, target, None).expect("plan");
    let (body, _) = merge(
        &mut plan,
        &[
            (r#"[{"certname":"a"}]"#, None),
            (r#"[{"certname":"a"},{"certname":"b"}]"#, None),
        ],
    );
    assert_eq!(body, r#"[{"certname":"a"},{"certname":"b"}]"#);
}

fn decoded_query(target: &str) -> Option<String> {
    form_urlencoded::parse(target.split_once('?').map_or("", |(_, q)| q).as_bytes())
        .find(|(k, _)| k == "query")
        .map(|(_, v)| v.into_owned())
}

#[test]
fn an_unpaged_answer_drops_other_owners_copies_here() {
    let config = config();
    let own = ownership(
        &[
            ("moved", "2026-11-30T08:00:00.000Z"),
            ("a-only", "2026-11-30T08:00:00.000Z"),
        ],
        &[("moved", "2026-11-30T09:00:00.000Z")],
    );
    let target = "/pdb/query/v4/facts?query=%5B%22%3D%22%2C%22name%22%2C%22kernel%22%5D";
    let mut plan = plan(&config, target, Some(own)).expect("plan");
    for backend in [0, 1] {
        assert_eq!(
            decoded_query(&plan.upstream(backend).path_and_query).as_deref(),
            Some(r#"["=","name","kernel"]"#),
            "no clause upstream"
        );
    }
    let a = r#"[{"certname":"moved","name":"kernel","value":"old","environment":"e"},{"certname":"a-only","name":"kernel","value":"a","environment":"e"}]"#;
    let (body, _) = merge(&mut plan, &[(a, None), ("[]", None)]);
    assert_eq!(
        body, r#"[{"certname":"a-only","name":"kernel","value":"a","environment":"e"}]"#,
        "moved's owner (b) was asked and has no such fact: a's stale copy is not the answer"
    );
}

#[test]
fn a_paged_answer_over_fetches_and_asks_a_short_page_again_with_ownership_pushed_down() {
    let config = config();
    // a holds n1..n4, b owns n1 and n2 (newer there).
    let own = ownership(
        &[
            ("n1", "2026-11-30T08:00:00.000Z"),
            ("n2", "2026-11-30T08:00:00.000Z"),
            ("n3", "2026-11-30T08:00:00.000Z"),
            ("n4", "2026-11-30T08:00:00.000Z"),
            ("n5", "2026-11-30T08:00:00.000Z"),
            ("n6", "2026-11-30T08:00:00.000Z"),
            ("n7", "2026-11-30T08:00:00.000Z"),
            ("n8", "2026-11-30T08:00:00.000Z"),
        ],
        &[
            ("n1", "2026-11-30T09:00:00.000Z"),
            ("n2", "2026-11-30T09:00:00.000Z"),
        ],
    );
    let order = "order_by=%5B%7B%22field%22%3A%22certname%22%7D%5D";
    let target = format!("/pdb/query/v4/nodes?{order}&limit=2");
    let mut plan = plan(&config, &target, Some(own)).expect("plan");
    // a owns 6 of its 8: asked for 2 + 2 * 2 * 5 / (6 * 4) + 4 = 6; b owns all it holds: 2.
    assert!(plan.upstream(0).path_and_query.contains("limit=6"));
    assert!(plan.upstream(1).path_and_query.contains("limit=2"));
    assert_eq!(decoded_query(&plan.upstream(0).path_and_query), None);
    let node = |c: &str| format!(r#"{{"certname":"{c}"}}"#);
    let a_page = format!(
        "[{},{},{},{},{},{}]",
        node("n1"),
        node("n2"),
        node("n3"),
        node("n4"),
        node("n5"),
        node("n6")
    );
    let b_page = format!("[{},{}]", node("n1"), node("n2"));
    let (body, _) = merge(&mut plan, &[(&a_page, None), (&b_page, None)]);
    assert_eq!(
        body,
        r#"[{"certname":"n1","pdbmux_source":"pdb-b"},{"certname":"n2","pdbmux_source":"pdb-b"}]"#
    );
    // Facts are many records per node: a's page of ten is all of n1's, which b owns. Its
    // records after the page may belong in the window, so it is asked again, pushed down.
    let own = ownership(
        &[
            ("n1", "2026-11-30T08:00:00.000Z"),
            ("n2", "2026-11-30T08:00:00.000Z"),
        ],
        &[("n1", "2026-11-30T09:00:00.000Z")],
    );
    let target = format!("/pdb/query/v4/facts?{order}&limit=3");
    let mut plan = self::plan(&config, &target, Some(own)).expect("plan");
    // a owns one of its two nodes: 3 + 3 * 1 * 5 / (1 * 4) + 4.
    assert!(plan.upstream(0).path_and_query.contains("limit=10"));
    let fact = |c: &str, i: usize| {
        format!(r#"{{"certname":"{c}","name":"f{i:02}","value":{i},"environment":"e"}}"#)
    };
    let a_page: Vec<String> = (0..10).map(|i| fact("n1", i)).collect();
    let a_page = format!("[{}]", a_page.join(","));
    let b_page = format!("[{},{}]", fact("n1", 0), fact("n1", 1));
    let asked = progress(&mut plan, &[(&a_page, None), (&b_page, None)]).expect_err("short");
    assert_eq!(asked, [(BackendId(0), super::PUSHED)]);
    let again = plan
        .plan
        .request(BackendId(0), super::PUSHED, &plan.context);
    assert!(
        again.path_and_query.contains("limit=3"),
        "{}",
        again.path_and_query
    );
    let query = decoded_query(&again.path_and_query).unwrap_or_default();
    assert!(
        query.contains(r#"["not",["in","certname",["array",["n1"]]]]"#),
        "{query}"
    );
}

#[test]
fn a_pinned_query_goes_to_the_owner_only() {
    let config = config();
    let own = ownership(
        &[("moved", "2026-11-30T08:00:00.000Z")],
        &[("moved", "2026-11-30T09:00:00.000Z")],
    );
    let target = "/pdb/query/v4/facts?query=%5B%22%3D%22%2C%22certname%22%2C%22moved%22%5D";
    let plan = plan(&config, target, Some(own)).expect("plan");
    assert_eq!(plan.first, [(BackendId(1), RECORDS)]);
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
    // a owns none of the nodes it holds: ownership is pushed down at once, not over-fetched.
    let plan = plan(
        &config,
        "/pdb/query/v4/nodes?limit=5",
        Some(ownership(&a, &b)),
    )
    .expect("plan");
    let upstream = plan.upstream(0);
    assert_eq!(upstream.method, Method::POST);
    assert_eq!(upstream.path_and_query, "/pdb/query/v4/nodes");
    let body: serde_json::Value =
        serde_json::from_slice(&upstream.body.expect("a body")).expect("json");
    assert_eq!(body["limit"], 5);
    assert_eq!(body["query"][0], "not");
    assert_eq!(body["query"][1][2][1].as_array().map(Vec::len), Some(400));
    assert_eq!(plan.upstream(1).method, Method::GET, "b owns all of them");
}

#[test]
fn facts_come_from_the_owner_with_one_provenance_record_per_node() {
    let config = config();
    let own = ownership(
        &[("moved", "2026-11-30T08:00:00.000Z")],
        &[("moved", "2026-11-30T09:00:00.000Z")],
    );
    let mut plan = plan(&config, "/pdb/query/v4/facts", Some(own)).expect("plan");
    let a = r#"[{"certname":"moved","name":"kernel","value":"Linux","environment":"production"},{"certname":"a1","name":"kernel","value":"Linux","environment":"dev"},{"certname":"a1","name":"pdbmux_source","value":"fake","environment":"dev"}]"#;
    let b = r#"[{"certname":"moved","name":"kernel","value":"Linux","environment":"staging"},{"certname":"moved","name":"os","value":{"family":"Debian"},"environment":"staging"}]"#;
    let (body, _) = merge(&mut plan, &[(a, None), (b, None)]);
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
fn a_node_whose_owner_is_not_asked_comes_from_the_first_holder() {
    let config = config();
    let own = ownership(
        &[("n", "2026-11-30T08:00:00.000Z")],
        &[("n", "2026-11-30T09:00:00.000Z")],
    );
    let mut plan = plan(&config, "/pdb/query/v4/facts", Some(own)).expect("plan");
    // The prober took b out: only a is asked, and a's copy is the answer.
    plan.context.roster = vec![BackendId(0)];
    plan.first = plan.plan.start(&plan.context);
    let (body, _) = merge(
        &mut plan,
        &[(
            r#"[{"certname":"n","name":"k","value":1,"environment":null}]"#,
            None,
        )],
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
        let mut plan = plan(&config, target, None).expect("plan");
        let (body, _) = merge(&mut plan, &[(facts, None), ("[]", None)]);
        assert_eq!(
            body, r#"[{"certname":"n","name":"k","value":1,"environment":"e"}]"#,
            "{target}"
        );
    }
    let mut off = (*config).clone();
    off.source_fact_enabled = false;
    let off = Arc::new(off);
    let mut plan = plan(&off, "/pdb/query/v4/facts", None).expect("plan");
    let (body, _) = merge(&mut plan, &[(facts, None), ("[]", None)]);
    assert_eq!(body, facts, "injection off: records untouched");
}

#[test]
fn the_source_fact_path_is_synthesised() {
    let config = config();
    // What a plan asks the first backend, decoded.
    let asked = |plan: &TestPlan| {
        let target = plan.upstream(0).path_and_query;
        percent_encoding::percent_decode_str(&target)
            .decode_utf8_lossy()
            .into_owned()
    };
    let mut all = plan(
        &config,
        "/pdb/query/v4/facts/pdbmux_source?order_by=[{\"field\":\"certname\",\"order\":\"desc\"}]",
        None,
    )
    .expect("plan");
    // Each backend is asked its nodes, one row each, not every fact of them (a node whose only
    // fact is named like the provenance fact has none: that record is dropped); the order is
    // applied here.
    assert_eq!(
        asked(&all),
        r#"/pdb/query/v4/facts?query=["extract",["certname","environment"],["not",["=","name","pdbmux_source"]],["group_by","certname","environment"]]"#
    );
    let nodes_a = r#"[{"certname":"n1","environment":"e"}]"#;
    let nodes_b = r#"[{"certname":"n2","environment":"f"}]"#;
    let (body, _) = merge(&mut all, &[(nodes_a, None), (nodes_b, None)]);
    assert_eq!(
        body,
        r#"[{"certname":"n2","name":"pdbmux_source","value":"pdb-b","environment":"f"},{"certname":"n1","name":"pdbmux_source","value":"pdb-a","environment":"e"}]"#
    );
    let mut filtered = plan(
        &config,
        "/pdb/query/v4/facts/pdbmux_source?query=[\"=\",\"environment\",\"e\"]",
        None,
    )
    .expect("plan");
    assert_eq!(
        asked(&filtered),
        r#"/pdb/query/v4/facts?query=["extract",["certname","environment"],["and",["=","environment","e"],["not",["=","name","pdbmux_source"]]],["group_by","certname","environment"]]"#
    );
    let (body, _) = merge(&mut filtered, &[(nodes_a, None), ("[]", None)]);
    assert_eq!(
        body,
        r#"[{"certname":"n1","name":"pdbmux_source","value":"pdb-a","environment":"e"}]"#
    );
    let mut one = plan(&config, "/pdb/query/v4/facts/pdbmux_source/pdb-b", None).expect("plan");
    let (body, _) = merge(&mut one, &[(nodes_a, None), (nodes_b, None)]);
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
fn the_source_fact_path_names_each_node_once_for_the_backend_owning_its_facts() {
    let config = config();
    // b holds the newer facts of `moved` and of `gone`; the map does not know `new`.
    let own = ownership(
        &[
            ("gone", "2026-11-30T08:00:00.000Z"),
            ("moved", "2026-11-30T08:00:00.000Z"),
        ],
        &[
            ("gone", "2026-11-30T09:00:00.000Z"),
            ("moved", "2026-11-30T09:00:00.000Z"),
        ],
    );
    // `new` twice in a (its first row is the one written), a row with no node, and one named
    // like the provenance fact (no node's facts: dropped); b no longer returns `gone` (its facts
    // no longer match), so a's copy of it is not written either.
    let a = r#"[{"certname":"new","environment":"e1"},{"certname":"moved","environment":"e1"},{"certname":"gone","environment":"e1"},{"certname":"new","environment":"e3"},{"environment":"e1"},{"certname":"x","environment":"e1","name":"pdbmux_source"}]"#;
    let b = r#"[{"certname":"new","environment":"e2"},{"certname":"moved","environment":"e2"}]"#;
    let path = "/pdb/query/v4/facts/pdbmux_source?order_by=[{\"field\":\"certname\"}]";
    let mut all = plan(&config, path, Some(Arc::clone(&own))).expect("plan");
    let (body, _) = merge(&mut all, &[(a, None), (b, None)]);
    assert_eq!(
        body,
        concat!(
            r#"[{"certname":"moved","name":"pdbmux_source","value":"pdb-b","environment":"e2"},"#,
            r#"{"certname":"new","name":"pdbmux_source","value":"pdb-a","environment":"e1"}]"#
        )
    );
    // Pinned to b: `new` is a's (the first to return it), so only `moved` is b's.
    let pinned = "/pdb/query/v4/facts/pdbmux_source/pdb-b";
    let mut one = plan(&config, pinned, Some(own)).expect("plan");
    let (body, _) = merge(&mut one, &[(a, None), (b, None)]);
    assert_eq!(
        body,
        r#"[{"certname":"moved","name":"pdbmux_source","value":"pdb-b","environment":"e2"}]"#
    );
}

#[test]
fn a_provenance_part_is_merged_later_once_every_answer_begins_as_records() {
    let config = config();
    let columns = crate::entity::Entity::Facts.order_columns(crate::entity::ColumnSet::Base);
    let order = crate::sort::parse_order_by(r#"[{"field":"name"}]"#, columns).expect("order");
    let nodes = r#"[{"certname":"n1","environment":"e"}]"#;
    let path = "/pdb/query/v4/facts/pdbmux_source";
    // The answers come in; `None`: not yet.
    let later = |answers: &[Option<&str>], part: &mut TestPlan| {
        let calls = answers.iter().enumerate();
        let calls =
            calls.filter_map(|(i, b)| Some(answered(BackendId(i), HeaderMap::new(), (*b)?)));
        let calls = Calls(calls.collect());
        part.plan
            .merge_later(&calls, &part.context, &order)
            .is_some()
    };
    // Not until every answer came; then merged later.
    let mut good = plan(&config, path, None).expect("plan");
    assert!(!later(&[Some(nodes), None], &mut good));
    assert!(later(&[Some(nodes), Some("[]")], &mut good));
    // pdb-a's answer is not an array of records: once pdb-b's came too, the part is merged at
    // once (the buffered merge leaves pdb-a out before the first byte).
    let mut broken = plan(&config, path, None).expect("plan");
    assert!(!later(&[Some(r#"{"not":"records"}"#), None], &mut broken));
    assert!(!later(
        &[Some(r#"{"not":"records"}"#), Some(nodes)],
        &mut broken
    ));
    // Nor when it is pdb-b's, the last to come.
    let mut last = plan(&config, path, None).expect("plan");
    assert!(!later(&[Some(nodes), None], &mut last));
    assert!(!later(&[Some(nodes), Some("[1]")], &mut last));
}

#[test]
fn fact_names_union_sorted_and_paged_here() {
    let config = config();
    let mut plan = plan(
        &config,
        "/pdb/query/v4/fact-names?limit=3&offset=1&include_total=true",
        None,
    )
    .expect("plan");
    assert_eq!(plan.upstream(0).path_and_query, "/pdb/query/v4/fact-names");
    let (body, total) = merge(
        &mut plan,
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
    let mut reports = plan(&config, "/pdb/query/v4/reports", None).expect("plan");
    let (body, _) = merge(
        &mut reports,
        &[
            (r#"[{"hash":"h1","x":1},{"hash":"h2"}]"#, None),
            (r#"[{"hash":"h1","x":2},{"hash":"h3"}]"#, None),
        ],
    );
    assert_eq!(body, r#"[{"hash":"h1","x":1},{"hash":"h2"},{"hash":"h3"}]"#);
    let mut events = plan(&config, "/pdb/query/v4/events", None).expect("plan");
    let (body, _) = merge(
        &mut events,
        &[
            (r#"[{"a":1},{"a":2}]"#, None),
            (r#"[{"a":1},{"a":3}]"#, None),
        ],
    );
    assert_eq!(body, r#"[{"a":1},{"a":2},{"a":3}]"#);
    let (body, _) = merge(
        &mut events,
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
    let mut environments = plan(&config, "/pdb/query/v4/environments", None).expect("plan");
    let (body, _) = merge(
        &mut environments,
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
    let mut plan = plan(&config, "/pdb/query/v4/facts", Some(own)).expect("plan");
    let (body, _) = merge(
        &mut plan,
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

#[test]
fn a_dropped_record_leaves_its_full_page_short_and_a_deduped_one_does_not() {
    use super::collect::{collect_pages, RecordFate};
    use super::rows::{Raw, Row, Unfilled};
    use super::BackendPage;

    let config = config();
    let planned = plan(&config, "/pdb/query/v4/events?limit=2", None).expect("plan");
    let headers = HeaderMap::new();
    let (a, b) = (
        Bytes::from_static(br#"[{"a":1},{"a":2}]"#),
        Bytes::from_static(br#"[{"a":3},{"a":4}]"#),
    );
    let page = |backend, body| BackendPage {
        backend: BackendId(backend),
        headers: &headers,
        body,
        limit: Some(2),
    };
    let answers = [page(0, &a), page(1, &b)];
    // Backend 0's full page is judged away whole; backend 1's is served.
    let merged = |deduped: bool| {
        collect_pages(
            &planned.plan,
            None,
            &answers,
            crate::records::parse_records,
            |_| None,
            |backend, record| match (backend.0, deduped) {
                (0, true) => RecordFate::Deduped,
                (0, false) => RecordFate::Dropped,
                _ => RecordFate::Served(Row {
                    backend: backend.0,
                    raw: Raw::Borrowed(record.get()),
                    key: None,
                }),
            },
        )
    };
    // Copies of records served elsewhere: backend 0 kept a full page, so it hides none.
    let served = merged(true);
    assert_eq!(served.contributed, 2);
    assert_eq!(served.body, Ok((br#"[{"a":3},{"a":4}]"#.to_vec(), 2)));
    // Other owners' copies: records past backend 0's page may belong in the window.
    assert_eq!(merged(false).body, Err(Unfilled(vec![0])));
}
