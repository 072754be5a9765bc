//! Tests for the parent module.
use super::*;
use crate::entity::{ColumnSet, Entity, SummarizeBy};
use proptest::prelude::*;
use serde_json::{json, Value};

/// The columns of `entity` for a request whose parameters add none.
fn base(entity: Entity) -> OrderColumns {
    entity.order_columns(ColumnSet::Base)
}

/// `/event-counts`' columns under `summarize_by`.
fn event_counts(summarize_by: SummarizeBy) -> OrderColumns {
    Entity::EventCounts.order_columns(ColumnSet::SummarizedBy(summarize_by))
}

fn err(raw: &str, columns: OrderColumns) -> String {
    match parse_order_by(raw, columns) {
        Ok(o) => panic!("{raw:?} parsed: {o:?}"),
        Err(e) => e.to_string(),
    }
}

fn fields(raw: &str, columns: OrderColumns) -> Vec<(String, Direction)> {
    parse_order_by(raw, columns)
        .expect("valid order_by")
        .fields
        .into_iter()
        .map(|f| (f.field, f.direction))
        .collect()
}

#[test]
fn order_by_errors_match_puppetdb() {
    // Each expected text is what PuppetDB 7.12.1 answered for the same input.
    let facts = base(Entity::Facts);
    assert_eq!(
        err("[x", facts),
        "Illegal value '[x' for :order_by; expected a JSON array of maps."
    );
    assert_eq!(
        err(r#"[{"field":"a",}]"#, facts),
        r#"Illegal value '[{"field":"a",}]' for :order_by; expected a JSON array of maps."#
    );
    assert_eq!(
        err(r#"{"field":"a"}"#, facts),
        r#"Illegal value '{:field "a"}' for :order_by; expected an array of maps."#
    );
    assert_eq!(
        err("[1,2]", facts),
        "Illegal value '[1 2]' for :order_by; expected an array of maps."
    );
    assert_eq!(
        err(r#"[{"field":"a"},3]"#, facts),
        r#"Illegal value '[{:field "a"} 3]' for :order_by; expected an array of maps."#
    );
    assert_eq!(
        err(r#""abc""#, facts),
        "Illegal value 'abc' for :order_by; expected an array of maps."
    );
    assert_eq!(
        err(r#"[{"order":"asc"}]"#, facts),
        r#"Illegal value '{:order "asc"}' in :order_by; missing required key field."#
    );
    assert_eq!(
        err(r#"[{"field":"name"},{"order":"desc"}]"#, facts),
        r#"Illegal value '{:order "desc"}' in :order_by; missing required key field."#
    );
    assert_eq!(
        err("[{}]", facts),
        "Illegal value '{}' in :order_by; missing required key field."
    );
    assert_eq!(
        err(r#"[{"field":"certname","order":"up"}]"#, facts),
        r#"Illegal value '{:field "certname", :order "up"}' in :order_by; 'order' must be either 'asc' or 'desc'"#
    );
    assert_eq!(
        err(r#"[{"field":"a","order":5}]"#, facts),
        r#"Illegal value '{:field "a", :order 5}' in :order_by; 'order' must be either 'asc' or 'desc'"#
    );
    assert_eq!(
        err(r#"[{"field":"a","order":"DESC "}]"#, facts),
        r#"Illegal value '{:field "a", :order "DESC "}' in :order_by; 'order' must be either 'asc' or 'desc'"#
    );
    assert_eq!(
        err(r#"[{"field":"a","x":1,"y":2}]"#, facts),
        r#"Illegal value '{:field "a", :x 1, :y 2}' in :order_by; unknown key 'x'."#
    );
    assert_eq!(
        err(r#"[{"b":1,"a":2,"field":"x","order":"y"}]"#, facts),
        r#"Illegal value '{:b 1, :a 2, :field "x", :order "y"}' in :order_by; unknown key 'b'."#
    );
    assert_eq!(
        err(
            r#"[{"a":1,"b":2,"c":3,"d":4,"e":5,"f":6,"g":7,"h":8,"field":"x"}]"#,
            facts
        ),
        r#"Illegal value '{:field "x", :e 5, :g 7, :c 3, :h 8, :b 2, :d 4, :f 6, :a 1}' in :order_by; unknown key 'e'."#
    );
    assert_eq!(
        err("5", facts),
        "Don't know how to create ISeq from: java.lang.Integer"
    );
    assert_eq!(
        err("true", facts),
        "Don't know how to create ISeq from: java.lang.Boolean"
    );
    assert_eq!(
        err("1.5", facts),
        "Don't know how to create ISeq from: java.lang.Double"
    );
    assert_eq!(
        err(r#"[{"field":"zzz"}]"#, facts),
        "Unrecognized column 'zzz' specified in :order_by; Supported columns are \
         'certname', 'environment', 'name', 'value'"
    );
    assert_eq!(
        err(
            r#"[{"field":"name"},{"field":"value","order":"desc"},{"field":"nope"}]"#,
            facts
        ),
        "Unrecognized column 'nope' specified in :order_by; Supported columns are \
         'certname', 'environment', 'name', 'value'"
    );
    assert_eq!(
        err(r#"[{"field":"certname"}]"#, base(Entity::FactNames)),
        "Unrecognized column 'certname' specified in :order_by; Supported columns are 'name'"
    );
    assert_eq!(
        err(r#"[{"field":"facts/certname"}]"#, facts),
        "Unrecognized column 'certname' specified in :order_by; Supported columns are \
         'certname', 'environment', 'name', 'value'"
    );
    assert!(err(r#"[{"field":5}]"#, facts).starts_with("Unrecognized column '5' specified"));
}

#[test]
fn nodes_column_lists() {
    assert_eq!(
        err(r#"[{"field":"zzz"}]"#, base(Entity::Nodes)),
        "Unrecognized column 'zzz' specified in :order_by; Supported columns are \
         'latest_report_corrective_change', 'deactivated', 'expired', 'report_environment', \
         'certname', 'facts_timestamp', 'facts_environment', 'cached_catalog_status', \
         'latest_report_status', 'latest_report_hash', 'catalog_timestamp', \
         'latest_report_noop_pending', 'report_timestamp', 'latest_report_noop', \
         'catalog_environment', 'latest_report_job_id'"
    );
    assert!(parse_order_by(r#"[{"field":"expires_facts"}]"#, base(Entity::Nodes)).is_err());
    let with = Entity::Nodes.order_columns(ColumnSet::FactsExpiration);
    assert_eq!(
        fields(
            r#"[{"field":"expires_facts_updated","order":"DESC"}]"#,
            with
        ),
        vec![("expires_facts_updated".to_owned(), Direction::Descending)]
    );
    assert_eq!(
        err(r#"[{"field":"x"}]"#, event_counts(SummarizeBy::Resource)),
        "Unrecognized column 'x' specified in :order_by; Supported columns are \
         'failures', 'skips', 'successes', 'noops', 'resource_type', 'resource_title'"
    );
    assert!(parse_order_by(
        r#"[{"field":"certname"}]"#,
        event_counts(SummarizeBy::Resource)
    )
    .is_err());
}

#[test]
fn order_by_accepts() {
    let facts = base(Entity::Facts);
    assert_eq!(
        fields(
            r#"[{"field":"certname","order":"desc"},{"field":"name"}]"#,
            facts
        ),
        vec![
            ("certname".to_owned(), Direction::Descending),
            ("name".to_owned(), Direction::Ascending)
        ]
    );
    assert_eq!(
        fields(
            r#"[{"field":"name","order":"Asc"},{"order":null,"field":"value"}]"#,
            facts
        ),
        vec![
            ("name".to_owned(), Direction::Ascending),
            ("value".to_owned(), Direction::Ascending)
        ]
    );
    // PuppetDB reads one value and ignores the rest, and treats these as "no order".
    assert_eq!(fields(r#"[{"field":"name"}] junk"#, facts).len(), 1);
    for none in ["", "  ", "null", "false", "[]", " [ ] ", "{}", r#""""#] {
        assert!(fields(none, facts).is_empty(), "{none:?}");
    }
    let parsed = parse_order_by(r#"[{"field":"value"}]"#, facts).expect("valid");
    assert_eq!(parsed.fields[0].kind, ColumnKind::Jsonb);
}

#[test]
fn limit_and_offset() {
    for (raw, want) in [
        ("1", Some(1)),
        ("+5", Some(5)),
        ("007", Some(7)),
        ("2147483647", Some(2_147_483_647)),
    ] {
        assert_eq!(parse_limit(raw).ok(), want, "{raw:?}");
    }
    for raw in [
        "0",
        "-0",
        "-1",
        "1.5",
        " 3",
        "3 ",
        "abc",
        "",
        "+",
        "2147483648",
        "99999999999999999999",
        "1e3",
        "٣",
    ] {
        assert_eq!(
            parse_limit(raw).map_err(|e| e.to_string()),
            Err(format!(
                "Illegal value '{raw}' for :limit; expected a positive non-zero integer."
            )),
            "{raw:?}"
        );
    }
    for (raw, want) in [
        ("0", Some(0)),
        ("-0", Some(0)),
        ("+3", Some(3)),
        ("2147483647", Some(2_147_483_647)),
    ] {
        assert_eq!(parse_offset(raw).ok(), want, "{raw:?}");
    }
    for raw in [
        "-1",
        "1.5",
        " 3",
        "abc",
        "",
        "2147483648",
        "99999999999999999999",
    ] {
        assert_eq!(
            parse_offset(raw).map_err(|e| e.to_string()),
            Err(format!(
                "Illegal value '{raw}' for :offset; expected a non-negative integer."
            )),
            "{raw:?}"
        );
    }
}

#[test]
fn include_total_is_java_parse_boolean() {
    assert!(parse_include_total("true"));
    assert!(parse_include_total("TRUE"));
    assert!(parse_include_total("tRuE"));
    for raw in ["false", "yes", "1", "", " true"] {
        assert!(!parse_include_total(raw), "{raw:?}");
    }
}

#[test]
fn paging_reports_errors_in_puppetdb_order() {
    let facts = base(Entity::Facts);
    let e = |o, l, off| parse_paging(o, l, off, facts).map_err(|e| e.to_string());
    // A structural order_by error comes first, then limit, then offset, then the column.
    assert!(e(Some("[x"), Some("0"), None).is_err_and(|m| m.contains(":order_by")));
    assert!(e(Some(r#"[{"field":"zzz"}]"#), Some("0"), None).is_err_and(|m| m.contains(":limit")));
    assert!(e(Some(r#"[{"field":"zzz"}]"#), None, Some("-1")).is_err_and(|m| m.contains(":offset")));
    assert!(e(Some(r#"[{"field":"zzz"}]"#), Some("5"), Some("1"))
        .is_err_and(|m| m.contains("Unrecognized")));
    let ok =
        parse_paging(Some(r#"[{"field":"name"}]"#), Some("5"), Some("10"), facts).expect("valid");
    assert_eq!(
        (ok.limit, ok.offset, ok.order_by.fields.len()),
        (Some(5), Some(10), 1)
    );
    assert_eq!(parse_paging(None, None, None, facts), Ok(Paging::default()));
}

// ---- sorting ----

fn raw(v: &Value) -> Box<RawValue> {
    RawValue::from_string(v.to_string()).expect("serializable")
}

fn order(columns: OrderColumns, spec: &[(&str, Direction)]) -> OrderBy {
    OrderBy {
        fields: spec
            .iter()
            .map(|(f, d)| OrderField {
                field: (*f).to_owned(),
                direction: *d,
                kind: columns.kind(f),
            })
            .collect(),
    }
}

/// Sorts JSON records and returns the values of `show`.
fn sorted(records: &[Value], order: &OrderBy, show: &str) -> Vec<Value> {
    let raws: Vec<std::collections::BTreeMap<String, Box<RawValue>>> = records
        .iter()
        .map(|r| {
            r.as_object()
                .expect("object record")
                .iter()
                .map(|(k, v)| (k.clone(), raw(v)))
                .collect()
        })
        .collect();
    let idx: Vec<usize> = (0..records.len()).collect();
    sort_stable(idx, order, |&i| {
        sort_key(order, |f| raws[i].get(f).map(|b| &**b))
    })
    .into_iter()
    .map(|i| {
        records[i]
            .get(show)
            .cloned()
            .unwrap_or(Value::String("<missing>".into()))
    })
    .collect()
}

use Direction::{Ascending as Asc, Descending as Desc};

#[test]
fn nulls_last_ascending_first_descending() {
    let recs = vec![
        json!({"certname": "b", "report_timestamp": null}),
        json!({"certname": "a", "report_timestamp": "2026-01-01T00:00:00.000Z"}),
        json!({"certname": "c"}),
        json!({"certname": "d", "report_timestamp": "2025-01-01T00:00:00.000Z"}),
    ];
    let asc = order(base(Entity::Nodes), &[("report_timestamp", Asc)]);
    assert_eq!(sorted(&recs, &asc, "certname"), vec!["d", "a", "b", "c"]);
    let desc = order(base(Entity::Nodes), &[("report_timestamp", Desc)]);
    assert_eq!(sorted(&recs, &desc, "certname"), vec!["b", "c", "a", "d"]);
}

#[test]
fn timestamps_are_instants() {
    assert_eq!(
        parse_instant("2026-11-30T07:04:00.123Z"),
        parse_instant("2026-11-30T08:04:00.123+01:00")
    );
    assert_eq!(
        parse_instant("2026-11-30T07:04:00Z"),
        parse_instant("2026-11-30T08:04:00.000000000+01:00")
    );
    assert_eq!(parse_instant("1970-01-01T00:00:00Z"), Some((0, 0)));
    assert_eq!(
        parse_instant("1969-12-31T23:59:59.5Z"),
        Some((-1, 500_000_000))
    );
    assert_eq!(
        parse_instant("2024-02-29T00:00:00.123456789123Z").map(|t| t.1),
        Some(123_456_789)
    );
    for bad in [
        "2026-02-30T00:00:00Z",
        "2026-11-30T07:04:00",
        "2026-11-30T24:00:00Z",
        "2026-11-30T07:04:00.Z",
        "2026-11-30T07:04:00Zx",
        "2026-11-30T07:04:00+1",
        "yesterday",
    ] {
        assert_eq!(parse_instant(bad), None, "{bad}");
    }
    let recs = vec![
        json!({"n": "later", "start_time": "2026-11-30T08:04:00.124+01:00"}),
        json!({"n": "same1", "start_time": "2026-11-30T07:04:00.123Z"}),
        json!({"n": "earlier", "start_time": "2026-11-30T09:00:00.000+03:00"}),
        json!({"n": "same2", "start_time": "2026-11-30T08:04:00.123+01:00"}),
        json!({"n": "garbage", "start_time": "0000-not-a-time"}),
    ];
    let o = order(base(Entity::Reports), &[("start_time", Asc)]);
    assert_eq!(
        sorted(&recs, &o, "n"),
        vec!["earlier", "same1", "same2", "later", "garbage"]
    );
}

#[test]
fn numbers_strings_booleans() {
    let ec = event_counts(SummarizeBy::Certname);
    let recs = vec![
        json!({"failures": 10}),
        json!({"failures": 9}),
        json!({"failures": 9.5}),
        json!({"failures": -1}),
    ];
    assert_eq!(
        sorted(&recs, &order(ec, &[("failures", Asc)]), "failures"),
        vec![json!(-1), json!(9), json!(9.5), json!(10)]
    );
    let recs = vec![
        json!({"certname": "a"}),
        json!({"certname": "B"}),
        json!({"certname": "é"}),
        json!({"certname": "ab"}),
    ];
    assert_eq!(
        sorted(
            &recs,
            &order(base(Entity::Nodes), &[("certname", Asc)]),
            "certname"
        ),
        vec!["B", "a", "ab", "é"]
    );
    let recs = vec![
        json!({"latest_report_noop": true}),
        json!({"latest_report_noop": null}),
        json!({"latest_report_noop": false}),
    ];
    assert_eq!(
        sorted(
            &recs,
            &order(base(Entity::Nodes), &[("latest_report_noop", Asc)]),
            "latest_report_noop"
        ),
        vec![json!(false), json!(true), json!(null)]
    );
}

#[test]
fn exact_number_comparison() {
    let n = |v: Value| match serde_json::from_value::<Jsonb>(v) {
        Ok(Jsonb::Num(n)) => n,
        other => panic!("{other:?}"),
    };
    assert_eq!(
        n(json!(9_007_199_254_740_993_i64)).compare(&n(json!(9_007_199_254_740_992.0))),
        Ordering::Greater
    );
    assert_eq!(
        n(json!(u64::MAX)).compare(&n(json!(i64::MAX))),
        Ordering::Greater
    );
    assert_eq!(
        n(json!(u64::MAX)).compare(&n(json!(1.0e30))),
        Ordering::Less
    );
    assert_eq!(n(json!(-3)).compare(&n(json!(-2.5))), Ordering::Less);
    assert_eq!(n(json!(-2)).compare(&n(json!(-2.5))), Ordering::Greater);
    assert_eq!(n(json!(2)).compare(&n(json!(2.0))), Ordering::Equal);
    assert_eq!(
        n(json!(i64::MIN)).compare(&n(json!(-1.0e19))),
        Ordering::Greater
    );
}

#[test]
fn facts_value_in_jsonb_order() {
    let recs: Vec<Value> = [
        json!({"a": 1}),
        json!([1]),
        json!([]),
        json!(true),
        json!(3),
        json!("s"),
        json!(null),
        json!(false),
        json!(2.5),
    ]
    .into_iter()
    .map(|v| json!({"certname": "n", "name": "f", "value": v}))
    .collect();
    let o = order(base(Entity::Facts), &[("value", Asc)]);
    assert_eq!(
        sorted(&recs, &o, "value"),
        vec![
            json!([]),
            json!(null),
            json!("s"),
            json!(2.5),
            json!(3),
            json!(false),
            json!(true),
            json!([1]),
            json!({"a": 1})
        ]
    );
}

#[test]
fn arrays_and_json_text() {
    let recs = vec![
        json!({"n": 1, "containment_path": ["Stage[main]", "Foo"]}),
        json!({"n": 2, "containment_path": ["Stage[main]"]}),
        json!({"n": 3, "containment_path": []}),
        json!({"n": 4, "containment_path": ["Stage[main]", "Bar", "X"]}),
        json!({"n": 5, "containment_path": null}),
    ];
    let o = order(base(Entity::Events), &[("containment_path", Asc)]);
    assert_eq!(
        sorted(&recs, &o, "n"),
        vec![json!(3), json!(2), json!(4), json!(1), json!(5)]
    );
    // new_value is stored as JSON text: `"b"` (with quotes) < `1` is false: '"' (0x22) < '1'.
    let recs = vec![
        json!({"new_value": 10}),
        json!({"new_value": "b"}),
        json!({"new_value": null}),
        json!({"new_value": 9}),
        json!({"new_value": ["a"]}),
    ];
    let o = order(base(Entity::Events), &[("new_value", Asc)]);
    assert_eq!(
        sorted(&recs, &o, "new_value"),
        vec![json!("b"), json!(10), json!(9), json!(["a"]), json!(null)]
    );
    assert_eq!(
        minify_json(" { \"a b\" : [ 1 , \"x\\\" y\" ] } "),
        r#"{"a b":[1,"x\" y"]}"#
    );
}

#[test]
fn multi_field_mixed_directions() {
    let recs = vec![
        json!({"certname": "a", "end_time": "2026-01-02T00:00:00Z", "id": 1}),
        json!({"certname": "b", "end_time": "2026-01-01T00:00:00Z", "id": 2}),
        json!({"certname": "a", "end_time": "2026-01-03T00:00:00Z", "id": 3}),
        json!({"certname": "b", "end_time": "2026-01-01T00:00:00Z", "id": 4}),
        json!({"certname": "a", "id": 5}),
    ];
    let o = order(
        base(Entity::Reports),
        &[("certname", Asc), ("end_time", Desc)],
    );
    assert_eq!(
        sorted(&recs, &o, "id"),
        vec![json!(5), json!(3), json!(1), json!(2), json!(4)]
    );
    // No order: input order.
    assert_eq!(
        sorted(&recs, &OrderBy::default(), "id"),
        (1..=5).map(|i| json!(i)).collect::<Vec<_>>()
    );
}

#[test]
fn text_keys_longer_than_held_inline_and_keys_of_more_than_two_fields_compare_whole() {
    // Certnames that differ only past their 24th byte, then past a shared 40-byte prefix; and
    // a third field that alone breaks the tie of the first two.
    let long = "a-very-long-certname.datacentre-one.example.com";
    let recs = vec![
        json!({"certname": format!("{long}.z"), "name": "os", "environment": "a", "id": 1}),
        json!({"certname": "node-000000000000000000009", "name": "os", "environment": "a", "id": 2}),
        json!({"certname": format!("{long}.b"), "name": "os", "environment": "b", "id": 3}),
        json!({"certname": "node-000000000000000000001", "name": "os", "environment": "a", "id": 4}),
        json!({"certname": format!("{long}.b"), "name": "os", "environment": "a", "id": 5}),
    ];
    let o = order(
        base(Entity::Facts),
        &[("certname", Asc), ("name", Asc), ("environment", Desc)],
    );
    assert_eq!(
        sorted(&recs, &o, "id"),
        vec![json!(3), json!(5), json!(1), json!(4), json!(2)]
    );
}

// ---- property: the key-based sort equals a naive comparator on serde_json::Value ----

/// The ordering written directly against `Value`s, the obvious way.
fn naive_cmp(a: &Value, b: &Value, spec: &[(&str, Direction)]) -> Ordering {
    for (field, dir) in spec {
        let (x, y) = (
            a.get(*field).unwrap_or(&Value::Null),
            b.get(*field).unwrap_or(&Value::Null),
        );
        let ord = match (x.is_null(), y.is_null()) {
            (true, true) => Ordering::Equal,
            (true, false) => Ordering::Greater,
            (false, true) => Ordering::Less,
            (false, false) => match *field {
                "certname" => x
                    .as_str()
                    .unwrap_or("")
                    .as_bytes()
                    .cmp(y.as_str().unwrap_or("").as_bytes()),
                "failures" => x
                    .as_f64()
                    .unwrap_or(0.0)
                    .partial_cmp(&y.as_f64().unwrap_or(0.0))
                    .unwrap_or(Ordering::Equal),
                "noop" => x.as_bool().cmp(&y.as_bool()),
                // Timestamps: compare the instant the generator recorded.
                _ => a["t_ms"].as_i64().cmp(&b["t_ms"].as_i64()),
            },
        };
        let ord = if *dir == Desc { ord.reverse() } else { ord };
        if ord != Ordering::Equal {
            return ord;
        }
    }
    Ordering::Equal
}

fn arb_record() -> impl Strategy<Value = Value> {
    (
        prop::option::of("[aAbB_é]{0,3}"),
        prop::option::of(prop_oneof![
            (-20i64..20).prop_map(|n| json!(n)),
            (-40i64..40).prop_map(|n| json!(n as f64 / 4.0))
        ]),
        prop::option::of(any::<bool>()),
        prop::option::of((0i64..4_000_000_000_000, -14i64..15, 0usize..4)),
    )
        .prop_map(|(certname, failures, noop, t)| {
            let mut r = serde_json::Map::new();
            if let Some(c) = certname {
                r.insert("certname".into(), json!(c));
            }
            if let Some(f) = failures {
                r.insert("failures".into(), f);
            }
            if let Some(b) = noop {
                r.insert("noop".into(), json!(b));
            }
            match t {
                Some((ms, off_h, style)) => {
                    r.insert("t_ms".into(), json!(ms));
                    r.insert(
                        "end_time".into(),
                        json!(render_instant(ms, off_h * 3600, style)),
                    );
                }
                None => {
                    r.insert("end_time".into(), Value::Null);
                }
            }
            Value::Object(r)
        })
}

/// Renders epoch milliseconds at a UTC offset in one of a few precisions.
fn render_instant(ms: i64, offset: i64, style: usize) -> String {
    let local = ms.div_euclid(1000) + offset;
    let (days, sod) = (local.div_euclid(86_400), local.rem_euclid(86_400));
    // civil_from_days (Howard Hinnant).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    let frac = ms.rem_euclid(1000);
    let base = format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}",
        sod / 3600,
        sod % 3600 / 60,
        sod % 60
    );
    let frac = match style {
        0 => format!(".{frac:03}"),
        1 => format!(".{frac:03}000"),
        2 if frac % 100 == 0 => format!(".{}", frac / 100),
        _ => format!(".{frac:03}"),
    };
    let zone = if offset == 0 && style != 3 {
        "Z".to_owned()
    } else {
        format!(
            "{}{:02}:00",
            if offset < 0 { '-' } else { '+' },
            offset.abs() / 3600
        )
    };
    format!("{base}{frac}{zone}")
}

proptest! {
    #[test]
    fn key_sort_matches_naive_sort(
        records in prop::collection::vec(arb_record(), 0..25),
        spec in prop::collection::vec((0usize..4, any::<bool>()), 1..4),
    ) {
        let names = ["certname", "failures", "noop", "end_time"];
        let spec: Vec<(&str, Direction)> = spec.iter().map(|&(i, d)| (names[i], if d { Desc } else { Asc })).collect();
        let mut o = order(base(Entity::Reports), &spec);
        // `failures` is not a reports column: give it its kind by hand.
        for f in &mut o.fields {
            if f.field == "failures" {
                f.kind = ColumnKind::Number;
            }
        }
        let got = sorted(&records, &o, "t_ms");
        let mut want = records.clone();
        want.sort_by(|a, b| naive_cmp(a, b, &spec));
        let want: Vec<Value> = want.iter().map(|r| r.get("t_ms").cloned().unwrap_or(Value::String("<missing>".into()))).collect();
        // Compare whole records to be sure ties kept their order too.
        let got_full: Vec<String> = {
            let idx: Vec<usize> = (0..records.len()).collect();
            let raws: Vec<std::collections::BTreeMap<String, Box<RawValue>>> = records.iter().map(|r| r.as_object().map(|m| m.iter().map(|(k, v)| (k.clone(), raw(v))).collect()).unwrap_or_default()).collect();
            sort_stable(idx, &o, |&i| sort_key(&o, |f| raws[i].get(f).map(|b| &**b))).into_iter().map(|i| records[i].to_string()).collect()
        };
        let mut want_full = records.clone();
        want_full.sort_by(|a, b| naive_cmp(a, b, &spec));
        let want_full: Vec<String> = want_full.iter().map(Value::to_string).collect();
        prop_assert_eq!(got, want);
        prop_assert_eq!(got_full, want_full);
    }

    #[test]
    fn records_compared_by_their_fields_compare_as_their_keys(
        (a, b) in (arb_record(), arb_record()),
        escaped in (prop::option::of("[a\"\\\\é_]{0,3}"), prop::option::of("[a\"\\\\é_]{0,3}")),
        spec in prop::collection::vec((0usize..5, any::<bool>()), 1..4),
    ) {
        // `value` is a jsonb column; `certname` sometimes holds escaped strings.
        let names = ["certname", "failures", "noop", "end_time", "value"];
        let spec: Vec<(&str, Direction)> = spec.iter().map(|&(i, d)| (names[i], if d { Desc } else { Asc })).collect();
        let mut o = order(base(Entity::Reports), &spec);
        for f in &mut o.fields {
            f.kind = match f.field.as_str() {
                "failures" => ColumnKind::Number,
                "value" => ColumnKind::Jsonb,
                _ => f.kind,
            };
        }
        let with = |mut record: Value, certname: Option<String>| {
            if let (Some(certname), Some(map)) = (certname, record.as_object_mut()) {
                map.insert("certname".into(), json!(certname));
                map.insert("value".into(), json!({ "c": certname }));
            }
            record
        };
        let (a, b) = (with(a, escaped.0), with(b, escaped.1));
        let fields = |r: &Value| -> std::collections::BTreeMap<String, Box<RawValue>> {
            r.as_object().map(|m| m.iter().map(|(k, v)| (k.clone(), raw(v))).collect()).unwrap_or_default()
        };
        let (fa, fb) = (fields(&a), fields(&b));
        let (la, lb) = (|field: &str| fa.get(field).map(|raw| &**raw), |field: &str| fb.get(field).map(|raw| &**raw));
        let by_keys = compare(&sort_key(&o, la), &sort_key(&o, lb), &o);
        prop_assert_eq!(compare_fields(&o, la, lb), by_keys, "{} against {}", a, b);
    }

    #[test]
    fn instants_round_trip_across_offsets(ms in 0i64..4_000_000_000_000, off in -14i64..15, style in 0usize..4) {
        let s = render_instant(ms, off * 3600, style);
        let parsed = parse_instant(&s);
        prop_assert_eq!(parsed, Some((ms.div_euclid(1000), (ms.rem_euclid(1000) * 1_000_000) as u32)), "{}", s);
    }

    #[test]
    fn a_string_key_read_without_serde_is_the_key_serde_reads(
        text in prop_oneof![".{0,12}", "[a-z0-9.\\-]{0,12}", Just("2026-11-30T08:00:00.000Z".to_owned())],
        kind in prop::sample::select(vec![
            ColumnKind::Text, ColumnKind::Number, ColumnKind::Boolean, ColumnKind::Timestamp,
            ColumnKind::TextArray, ColumnKind::Jsonb, ColumnKind::PathArray,
            ColumnKind::EncodedPath, ColumnKind::Other,
        ]),
    ) {
        let raw = Value::String(text).to_string();
        let parsed: Jsonb = serde_json::from_str(&raw).expect("a JSON string");
        let by_serde = match (kind, parsed) {
            (ColumnKind::Jsonb, v) => KeyPart::Jsonb(v),
            (kind, v) => KeyPart::from_json(v, kind),
        };
        prop_assert_eq!(key_part(&raw, kind), by_serde, "{} as {:?}", raw, kind);
    }

    #[test]
    fn parsers_never_panic(s in ".{0,40}") {
        let _ = parse_order_by(&s, base(Entity::Facts));
        let _ = parse_limit(&s);
        let _ = parse_offset(&s);
        let _ = parse_instant(&s);
    }
}
