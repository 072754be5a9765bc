//! `/event-counts` and `/aggregate-event-counts` on hand-made backend answers.

use super::tests::{encode, run, run_parts, upstream};
use super::*;

fn plan(kind: CombineKind, raw: &str) -> CombinePlan {
    CombinePlan::from_params(kind, &Params::parse(Some(raw)))
        .expect("plannable")
        .expect("combined")
}

fn refusal(kind: CombineKind, raw: &str) -> String {
    CombinePlan::from_params(kind, &Params::parse(Some(raw)))
        .expect_err("refused")
        .to_string()
}

fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

const EC: CombineKind = CombineKind::EventCounts;
const AGG: CombineKind = CombineKind::AggregateEventCounts;

const A: &str = r#"[{"failures":1,"skips":0,"successes":2,"noops":0,"subject_type":"certname","subject":{"title":"web1"}},{"failures":0,"skips":1,"successes":0,"noops":0,"subject_type":"certname","subject":{"title":"db1"}}]"#;
const B: &str = r#"[{"subject_type":"certname","subject":{"title":"web1"},"failures":0,"successes":3,"noops":1,"skips":0},{"subject_type":"certname","subject":{"title":"app1"},"failures":0,"successes":0,"noops":2,"skips":0}]"#;

#[test]
fn event_counts_upstream_drops_what_is_applied_here() {
    let raw = format!(
        "query={}&summarize_by=certname&count_by=certname&counts_filter={}&limit=1&offset=2&order_by=%5B%5D&include_total=true",
        encode(r#"["=","certname","a"]"#),
        encode(r#"[">","failures",0]"#)
    );
    assert_eq!(
        upstream(&plan(EC, &raw)),
        [(
            UpstreamPath::Same,
            pairs(&[
                ("query", r#"["=","certname","a"]"#),
                ("summarize_by", "certname"),
                ("count_by", "certname")
            ])
        )]
    );
}

#[test]
fn event_counts_sum_per_subject() {
    let (body, total) = run(
        &plan(EC, "summarize_by=certname&include_total=true"),
        &[A, B],
    );
    // web1 is in both: summed, in the first backend's key order. db1 and app1 pass byte for byte.
    assert_eq!(
        body,
        r#"[{"failures":1,"skips":0,"successes":5,"noops":1,"subject_type":"certname","subject":{"title":"web1"}},{"failures":0,"skips":1,"successes":0,"noops":0,"subject_type":"certname","subject":{"title":"db1"}},{"subject_type":"certname","subject":{"title":"app1"},"failures":0,"successes":0,"noops":2,"skips":0}]"#
    );
    assert_eq!(total, Some(3));
}

#[test]
fn counts_filter_order_and_window_apply_to_merged_rows() {
    // noops > 0 only after summing for web1 (0 in A, 1 in B).
    let raw = format!(
        "summarize_by=certname&counts_filter={}&include_total=true",
        encode(r#"[">","noops",0]"#)
    );
    let (body, total) = run(&plan(EC, &raw), &[A, B]);
    assert_eq!(
        body,
        r#"[{"failures":1,"skips":0,"successes":5,"noops":1,"subject_type":"certname","subject":{"title":"web1"}},{"subject_type":"certname","subject":{"title":"app1"},"failures":0,"successes":0,"noops":2,"skips":0}]"#
    );
    assert_eq!(total, Some(2));
    // order_by the subject's certname (its title), then the window.
    let raw = format!(
        "summarize_by=certname&order_by={}&limit=2",
        encode(r#"[{"field":"certname"}]"#)
    );
    let (body, _) = run(&plan(EC, &raw), &[A, B]);
    assert_eq!(
        body,
        r#"[{"subject_type":"certname","subject":{"title":"app1"},"failures":0,"successes":0,"noops":2,"skips":0},{"failures":0,"skips":1,"successes":0,"noops":0,"subject_type":"certname","subject":{"title":"db1"}}]"#
    );
    let raw = format!(
        "summarize_by=certname&order_by={}&offset=1",
        encode(r#"[{"field":"successes","order":"desc"},{"field":"certname"}]"#)
    );
    let (body, _) = run(&plan(EC, &raw), &[A, B]);
    assert_eq!(
        body,
        r#"[{"subject_type":"certname","subject":{"title":"app1"},"failures":0,"successes":0,"noops":2,"skips":0},{"failures":0,"skips":1,"successes":0,"noops":0,"subject_type":"certname","subject":{"title":"db1"}}]"#
    );
}

#[test]
fn resource_and_class_subjects() {
    let a = r#"[{"subject_type":"resource","subject":{"type":"File","title":"/etc/a"},"failures":1,"successes":0,"noops":0,"skips":0},{"subject_type":"resource","subject":{"type":"Exec","title":"/etc/a"},"failures":1,"successes":0,"noops":0,"skips":0}]"#;
    let b = r#"[{"subject_type":"resource","subject":{"title":"/etc/a","type":"File"},"failures":2,"successes":1,"noops":0,"skips":null}]"#;
    let raw = format!(
        "summarize_by=resource&order_by={}",
        encode(r#"[{"field":"resource_type"}]"#)
    );
    let (body, _) = run(&plan(EC, &raw), &[a, b]);
    assert_eq!(
        body,
        r#"[{"subject_type":"resource","subject":{"type":"Exec","title":"/etc/a"},"failures":1,"successes":0,"noops":0,"skips":0},{"subject_type":"resource","subject":{"type":"File","title":"/etc/a"},"failures":3,"successes":1,"noops":0,"skips":0}]"#
    );
    let a = r#"[{"subject_type":"containing_class","subject":{"title":null},"failures":1,"successes":0,"noops":0,"skips":0}]"#;
    let b = r#"[{"subject_type":"containing_class","subject":{"title":null},"failures":1,"successes":0,"noops":0,"skips":0},{"subject_type":"containing_class","subject":{"title":"Foo"},"failures":0,"successes":1,"noops":0,"skips":0}]"#;
    let (body, _) = run(&plan(EC, "summarize_by=containing_class"), &[a, b]);
    assert_eq!(
        body,
        r#"[{"subject_type":"containing_class","subject":{"title":null},"failures":2,"successes":0,"noops":0,"skips":0},{"subject_type":"containing_class","subject":{"title":"Foo"},"failures":0,"successes":1,"noops":0,"skips":0}]"#
    );
}

#[test]
fn pe_count_columns_are_summed_too() {
    let a = r#"[{"subject_type":"certname","subject":{"title":"a"},"failures":0,"skips":0,"intentional_successes":1,"corrective_successes":2,"intentional_noops":0,"corrective_noops":0}]"#;
    let (body, _) = run(&plan(EC, "summarize_by=certname"), &[a, a]);
    assert_eq!(
        body,
        r#"[{"subject_type":"certname","subject":{"title":"a"},"failures":0,"skips":0,"intentional_successes":2,"corrective_successes":4,"intentional_noops":0,"corrective_noops":0}]"#
    );
    let (body, _) = run(&plan(AGG, "summarize_by=certname"), &[a, a]);
    assert_eq!(
        body,
        r#"[{"summarize_by":"certname","failures":0,"skips":0,"intentional_successes":1,"corrective_successes":1,"intentional_noops":0,"corrective_noops":0,"total":1}]"#
    );
}

#[test]
fn event_counts_refusals() {
    assert_eq!(
        refusal(EC, "count_by=certname"),
        "Missing required query parameter 'summarize_by'"
    );
    assert_eq!(
        refusal(EC, "summarize_by=node"),
        "Unsupported value for 'summarize_by': 'node'"
    );
    // PuppetDB reads limit before summarize_by.
    assert_eq!(
        refusal(EC, "summarize_by=node&limit=x"),
        "Illegal value 'x' for :limit; expected a positive non-zero integer."
    );
    assert_eq!(
        refusal(EC, &format!("summarize_by=certname&order_by={}", encode(r#"[{"field":"resource_type"}]"#))),
        "Unrecognized column 'resource_type' specified in :order_by; Supported columns are 'failures', 'skips', 'successes', 'noops', 'certname'"
    );
    assert_eq!(
        refusal(
            EC,
            &format!(
                "summarize_by=certname&counts_filter={}",
                encode(r#"["and",[">","failures",0],[">","skips",0]]"#)
            )
        ),
        r#"["and",[">","failures",0],[">","skips",0]] is not well-formed: query operator 'and' is unknown"#
    );
}

#[test]
fn aggregate_asks_event_counts_once_per_value() {
    let raw = format!(
        "query={}&summarize_by=certname,resource,certname&counts_filter={}&count_by=certname&distinct_resources=false",
        encode(r#"["=","latest_report?",true]"#),
        encode(r#"[">","failures",0]"#)
    );
    let plan = plan(AGG, &raw);
    let expected = |value: &str| {
        (
            UpstreamPath::EventCounts,
            pairs(&[
                ("query", r#"["=","latest_report?",true]"#),
                ("summarize_by", value),
                ("count_by", "certname"),
                ("distinct_resources", "false"),
            ]),
        )
    };
    assert_eq!(
        upstream(&plan),
        [expected("certname"), expected("resource")]
    );
    assert_eq!(EVENT_COUNTS_PATH, "/pdb/query/v4/event-counts");
}

#[test]
fn aggregate_counts_each_subject_once() {
    // web1 has events in both backends (a migrating node): one subject, not two.
    let (body, total) = run(&plan(AGG, "summarize_by=certname"), &[A, B]);
    assert_eq!(
        body,
        r#"[{"summarize_by":"certname","failures":1,"skips":1,"successes":1,"noops":2,"total":3}]"#
    );
    assert_eq!(total, None);
    let raw = format!(
        "summarize_by=certname&counts_filter={}",
        encode(r#"["=","failures",0]"#)
    );
    let (body, _) = run(&plan(AGG, &raw), &[A, B]);
    assert_eq!(
        body,
        r#"[{"summarize_by":"certname","failures":0,"skips":1,"successes":0,"noops":1,"total":2}]"#
    );
}

#[test]
fn aggregate_lists_one_object_per_value_in_order() {
    let plan = plan(
        AGG,
        "summarize_by=containing_class,certname,containing_class,",
    );
    let class = r#"[{"subject_type":"containing_class","subject":{"title":"Foo"},"failures":0,"successes":1,"noops":0,"skips":0}]"#;
    let certname = r#"[{"subject_type":"certname","subject":{"title":"a"},"failures":2,"successes":0,"noops":0,"skips":0}]"#;
    let first: [&[u8]; 2] = [class.as_bytes(), certname.as_bytes()];
    let second: [&[u8]; 2] = [b"[]", b"[]"];
    let combined = plan.combine(&[
        Part {
            bodies: &first,
            records: None,
            correction: None,
        },
        Part {
            bodies: &second,
            records: None,
            correction: None,
        },
    ]);
    assert!(combined.unusable.is_empty());
    assert_eq!(
        String::from_utf8(combined.body).expect("utf-8"),
        r#"[{"summarize_by":"containing_class","failures":0,"skips":0,"successes":1,"noops":0,"total":1},{"summarize_by":"certname","failures":1,"skips":0,"successes":0,"noops":0,"total":1},{"summarize_by":"containing_class","failures":0,"skips":0,"successes":1,"noops":0,"total":1}]"#
    );
}

#[test]
fn aggregate_over_nothing_is_zeros() {
    let (body, _) = run(&plan(AGG, "summarize_by=resource"), &["[]", "[]"]);
    assert_eq!(
        body,
        r#"[{"summarize_by":"resource","failures":0,"skips":0,"successes":0,"noops":0,"total":0}]"#
    );
}

#[test]
fn aggregate_leaves_a_backend_with_one_bad_body_out_of_every_summary() {
    let plan = plan(AGG, "summarize_by=certname,containing_class");
    let good: [&[u8]; 2] = [A.as_bytes(), b"[]"];
    let bad: [&[u8]; 2] = [B.as_bytes(), br#"[{"failures":1}]"#];
    let combined = plan.combine(&[
        Part {
            bodies: &good,
            records: None,
            correction: None,
        },
        Part {
            bodies: &bad,
            records: None,
            correction: None,
        },
    ]);
    assert_eq!(combined.unusable, [(1, Unusable::NoSubject { index: 0 })]);
    assert_eq!(
        String::from_utf8(combined.body).expect("utf-8"),
        r#"[{"summarize_by":"certname","failures":1,"skips":1,"successes":1,"noops":0,"total":2},{"summarize_by":"containing_class","failures":0,"skips":0,"successes":0,"noops":0,"total":0}]"#
    );
    let short = plan.combine(&[Part {
        bodies: &good[..1],
        records: None,
        correction: None,
    }]);
    assert_eq!(short.unusable, [(0, Unusable::IncompleteParts)]);
}

#[test]
fn aggregate_refusals() {
    assert_eq!(
        refusal(AGG, "query=%5B%5D"),
        "Missing required query parameter 'summarize_by'"
    );
    assert_eq!(
        refusal(AGG, "summarize_by=certname&limit=10"),
        "Unsupported query parameter 'limit'"
    );
    assert_eq!(
        refusal(AGG, "summarize_by=certname&include_total=true"),
        "Unsupported query parameter 'include_total'"
    );
    assert_eq!(
        refusal(AGG, "summarize_by="),
        "Unsupported value for 'summarize_by': ''"
    );
    assert_eq!(
        refusal(AGG, "summarize_by=certname,,resource"),
        "Unsupported value for 'summarize_by': ''"
    );
    assert_eq!(
        refusal(
            AGG,
            &format!(
                "summarize_by=certname&counts_filter={}",
                encode(r#"["<","certname",1]"#)
            )
        ),
        "< operator does not support object 'certname' for event counts"
    );
}

#[test]
fn event_count_rows_must_have_a_subject_and_numbers() {
    let plan = plan(EC, "summarize_by=certname");
    let combined = run_parts(
        &plan,
        &[
            A,
            r#"[{"subject_type":"certname","subject":{"title":"x"},"failures":"1"}]"#,
        ],
        &[],
    );
    assert_eq!(
        combined.unusable,
        [(
            1,
            Unusable::NotANumber {
                index: 0,
                column: "failures".into()
            }
        )]
    );
}
