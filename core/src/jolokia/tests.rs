//! Tests for the parent module.
use super::*;
use serde_json::json;

fn merged_text(bodies: &[&str]) -> String {
    let bodies: Vec<&[u8]> = bodies.iter().map(|b| b.as_bytes()).collect();
    match merge_v2(&bodies) {
        JolokiaMerge::Merged { body, .. } => String::from_utf8(body).expect("utf-8"),
        other => panic!("expected a merge, got {other:?}"),
    }
}

fn merged(bodies: &[&str]) -> Value {
    serde_json::from_str(&merged_text(bodies)).expect("json")
}

fn contributed(bodies: &[&str]) -> usize {
    let bodies: Vec<&[u8]> = bodies.iter().map(|b| b.as_bytes()).collect();
    match merge_v2(&bodies) {
        JolokiaMerge::Merged { contributed, .. } => contributed,
        other => panic!("expected a merge, got {other:?}"),
    }
}

fn envelope(value: &str) -> String {
    format!(
        r#"{{"request":{{"mbean":"puppetlabs.puppetdb.mq:name=global.processing-time","type":"read"}},"value":{value},"timestamp":1732950000,"status":200}}"#
    )
}

/// The merged `value` of one envelope per given value.
fn value_of(values: &[&str]) -> Value {
    let bodies: Vec<String> = values.iter().map(|v| envelope(v)).collect();
    let bodies: Vec<&str> = bodies.iter().map(String::as_str).collect();
    merged(&bodies)["value"].clone()
}

fn value_text(values: &[&str]) -> String {
    let bodies: Vec<String> = values.iter().map(|v| envelope(v)).collect();
    let bodies: Vec<&str> = bodies.iter().map(String::as_str).collect();
    let text = merged_text(&bodies);
    let start = text.find(r#""value":"#).expect("value key") + r#""value":"#.len();
    let end = text.find(r#","timestamp""#).expect("timestamp key");
    text[start..end].to_owned()
}

#[test]
fn nested_objects_merge_recursively() {
    let value = value_of(&[
        r#"{"a":{"b":{"Count":1,"Max":4},"c":2}}"#,
        r#"{"a":{"b":{"Count":10,"Max":3},"c":5}}"#,
    ]);
    assert_eq!(value, json!({"a": {"b": {"Count": 11, "Max": 4}, "c": 7}}));
}

#[test]
fn a_key_only_one_backend_has_survives_verbatim() {
    let text = value_text(&[
        r#"{"Count":1,"OnlyFirst":1.50}"#,
        r#"{"Count":2,"OnlySecond":{"x":"y"},"Later":2.0e0}"#,
    ]);
    assert_eq!(
        text,
        r#"{"Count":3,"OnlyFirst":1.50,"OnlySecond":{"x":"y"},"Later":2.0e0}"#
    );
}

#[test]
fn keys_keep_the_first_backends_order() {
    let text = value_text(&[
        r#"{"zeta":1,"alpha":2,"Mean":3}"#,
        r#"{"beta":1,"alpha":2,"zeta":3,"Mean":5}"#,
    ]);
    assert_eq!(text, r#"{"zeta":4,"alpha":4,"Mean":4,"beta":1}"#);
}

#[test]
fn numbers_sum_by_default() {
    let value = value_of(&[
        r#"{"Count":3,"OneMinuteRate":0.5,"num-nodes":2}"#,
        r#"{"Count":4,"OneMinuteRate":0.25,"num-nodes":5}"#,
        r#"{"Count":5,"OneMinuteRate":0.25,"num-nodes":0}"#,
    ]);
    assert_eq!(
        value,
        json!({"Count": 12, "OneMinuteRate": 1.0, "num-nodes": 7})
    );
}

#[test]
fn min_takes_the_minimum() {
    assert_eq!(
        value_of(&[r#"{"Min":3}"#, r#"{"Min":1}"#, r#"{"Min":2}"#]),
        json!({"Min": 1})
    );
    assert_eq!(
        value_of(&[r#"{"Min":3.5}"#, r#"{"Min":1.25}"#]),
        json!({"Min": 1.25})
    );
}

#[test]
fn max_uptime_and_start_time_take_the_maximum() {
    assert_eq!(
        value_of(&[
            r#"{"Max":3,"Uptime":100,"StartTime":1732940000000}"#,
            r#"{"Max":9,"Uptime":50,"StartTime":1732949999999}"#,
        ]),
        json!({"Max": 9, "Uptime": 100, "StartTime": 1_732_949_999_999_u64})
    );
}

#[test]
fn distribution_figures_take_the_unweighted_mean() {
    let value = value_of(&[
        r#"{"Mean":2,"Median":1.5,"StdDev":1,"99thPercentile":10,"75thPercentile":4,"50thPercentile":1}"#,
        r#"{"Mean":4,"Median":2.5,"StdDev":2,"99thPercentile":20,"75thPercentile":6,"50thPercentile":2}"#,
    ]);
    assert_eq!(
        value,
        json!({
            "Mean": 3,
            "Median": 2.0,
            "StdDev": 1.5,
            "99thPercentile": 15,
            "75thPercentile": 5,
            "50thPercentile": 1.5
        })
    );
    assert_eq!(
        value_of(&[r#"{"Mean":1}"#, r#"{"Mean":2}"#, r#"{"Mean":6}"#]),
        json!({"Mean": 3})
    );
}

#[test]
fn rule_names_match_case_insensitively() {
    let value = value_of(&[
        r#"{"MIN":3,"max":3,"uptime":3,"STARTTIME":3,"mean":3,"MEDIAN":3,"stddev":3,"99THPERCENTILE":3,"count":3}"#,
        r#"{"MIN":1,"max":1,"uptime":1,"STARTTIME":1,"mean":1,"MEDIAN":1,"stddev":1,"99THPERCENTILE":1,"count":1}"#,
    ]);
    assert_eq!(
        value,
        json!({
            "MIN": 1, "max": 3, "uptime": 3, "STARTTIME": 3, "mean": 2, "MEDIAN": 2,
            "stddev": 2, "99THPERCENTILE": 2, "count": 4
        })
    );
    assert_eq!(NumberRule::of(Some("maximum")), NumberRule::Sum);
    assert_eq!(NumberRule::of(Some("Percentiles")), NumberRule::Sum);
    assert_eq!(NumberRule::of(Some("95thpercentile")), NumberRule::Mean);
    assert_eq!(NumberRule::of(None), NumberRule::Sum);
}

#[test]
fn integers_stay_integers_and_floats_stay_floats() {
    assert_eq!(value_text(&["{\"n\":1}", "{\"n\":2}"]), r#"{"n":3}"#);
    assert_eq!(value_text(&["{\"n\":-1}", "{\"n\":-2}"]), r#"{"n":-3}"#);
    // An integral float result is still a float: not every input was an integer.
    assert_eq!(value_text(&["{\"n\":1.5}", "{\"n\":2.5}"]), r#"{"n":4.0}"#);
    assert_eq!(value_text(&["{\"n\":1}", "{\"n\":2.5}"]), r#"{"n":3.5}"#);
    assert_eq!(
        value_text(&["{\"Max\":1}", "{\"Max\":0.5}"]),
        r#"{"Max":1.0}"#
    );
    // A mean of integers that is not integral becomes a float.
    assert_eq!(
        value_text(&["{\"Mean\":1}", "{\"Mean\":2}"]),
        r#"{"Mean":1.5}"#
    );
    // Past i64, an integer sum is still an integer while it fits u64.
    assert_eq!(
        value_text(&["{\"n\":9223372036854775807}", "{\"n\":1}"]),
        r#"{"n":9223372036854775808}"#
    );
    // Past u64, it becomes a float.
    let value = value_of(&["{\"n\":18446744073709551615}", "{\"n\":1}"]);
    assert!(value["n"].is_f64(), "{value}");
    // A result that is not finite keeps the first backend's number.
    assert_eq!(
        value_text(&["{\"n\":1e308}", "{\"n\":1e308}"]),
        r#"{"n":1e308}"#
    );
}

#[test]
fn other_kinds_keep_the_first_backends_value() {
    let text = value_text(&[
        r#"{"RateUnit":"events/second","Enabled":false,"Names":["a","b"],"Nothing":null,"Mixed":1,"Shape":{"a":1},"NullThenNumber":null}"#,
        r#"{"RateUnit":"events/minute","Enabled":true,"Names":["c"],"Nothing":null,"Mixed":"1","Shape":7,"NullThenNumber":3}"#,
    ]);
    assert_eq!(
        text,
        r#"{"RateUnit":"events/second","Enabled":false,"Names":["a","b"],"Nothing":null,"Mixed":1,"Shape":{"a":1},"NullThenNumber":null}"#
    );
}

#[test]
fn the_newest_timestamp_wins() {
    let body = |ts: &str| {
        format!(
            r#"{{"request":{{"mbean":"m:name=x","type":"read"}},"value":{{"Value":1}},"timestamp":{ts},"status":200}}"#
        )
    };
    let (a, b, c) = (body("1732950100"), body("1732950300"), body("1732950200"));
    assert_eq!(merged(&[&a, &b, &c])["timestamp"], json!(1_732_950_300_u64));
    let text = merged_text(&[&a, &b]);
    assert!(
        text.contains(r#""timestamp":1732950300,"status":200}"#),
        "{text}"
    );
}

#[test]
fn the_envelope_comes_from_the_first_usable_backend() {
    let first = r#"{"request":{"mbean":"m:name=x","type":"read"},"value":{"Value":1},"timestamp":10,"status":200,"history":[1]}"#;
    let second = r#"{"status":200,"request":{"mbean":"other","type":"read"},"value":{"Value":2},"timestamp":20,"extra":true}"#;
    assert_eq!(
        merged_text(&[first, second]),
        r#"{"request":{"mbean":"m:name=x","type":"read"},"value":{"Value":3},"timestamp":20,"status":200,"history":[1]}"#
    );
}

#[test]
fn one_in_band_error_is_skipped() {
    let error = r#"{"request":{"mbean":"m:name=x","type":"read"},"error_type":"javax.management.InstanceNotFoundException","error":"javax.management.InstanceNotFoundException : m:name=x","status":404}"#;
    let ok1 = r#"{"request":{"mbean":"m:name=x","type":"read"},"value":{"Value":2},"timestamp":5,"status":200}"#;
    let ok2 = r#"{"request":{"mbean":"m:name=x","type":"read"},"value":{"Value":3},"timestamp":4,"status":200}"#;
    assert_eq!(
        merged_text(&[error, ok1, ok2]),
        r#"{"request":{"mbean":"m:name=x","type":"read"},"value":{"Value":5},"timestamp":5,"status":200}"#
    );
    assert_eq!(contributed(&[error, ok1, ok2]), 2);
    // An error key under a 200 status is an error too.
    let odd = r#"{"value":{"Value":100},"error":"boom","status":200}"#;
    assert_eq!(contributed(&[odd, ok1]), 1);
}

#[test]
fn all_in_band_errors_replay_the_first() {
    let e1: &[u8] =
        br#"{"error_type":"java.lang.IllegalArgumentException","error":"bad","status":400}"#;
    let e2: &[u8] = br#"{"error_type":"javax.management.InstanceNotFoundException","error":"gone","status":404}"#;
    assert_eq!(
        merge_v2(&[e1, e2]),
        JolokiaMerge::AllInBandErrors {
            first_error_body_index: 0
        }
    );
    assert_eq!(
        merge_v2(&[b"<html>", e2, e1]),
        JolokiaMerge::AllInBandErrors {
            first_error_body_index: 1
        }
    );
}

#[test]
fn unparseable_bodies_are_skipped() {
    let ok = r#"{"request":{"type":"read"},"value":{"Value":2},"timestamp":5,"status":200}"#;
    assert_eq!(contributed(&["not json", ok, "[1,2]", "{\"value\":1}"]), 1);
    assert_eq!(merged(&["{\"value\":", ok])["value"], json!({"Value": 2}));
    assert_eq!(merge_v2(&[b"nope", b"[]"]), JolokiaMerge::NothingUsable);
    assert_eq!(merge_v2(&[]), JolokiaMerge::NothingUsable);
    assert_eq!(merge_v1(&[b"{", b""]), JolokiaMerge::NothingUsable);
}

#[test]
fn list_trees_are_united() {
    let first = r#"{"request":{"type":"list"},"value":{"puppetlabs.puppetdb.population":{"name=num-nodes":{"attr":{"Value":{"rw":false,"type":"java.lang.Object","desc":"Attribute exposed for management"}},"desc":"Information on the management interface of the MBean","class":"com.codahale.metrics.jmx.JmxReporter$JmxGauge"}},"java.lang":{"type=Runtime":{"attr":{"Uptime":{"rw":false,"type":"long","desc":"Uptime"}}}}},"timestamp":1732950000,"status":200}"#;
    let second = r#"{"request":{"type":"list"},"value":{"puppetlabs.puppetdb.population":{"name=num-resources":{"attr":{"Value":{"rw":false,"type":"java.lang.Object","desc":"Attribute exposed for management"}},"desc":"Information on the management interface of the MBean","class":"com.codahale.metrics.jmx.JmxReporter$JmxGauge"},"name=num-nodes":{"attr":{"Value":{"rw":true,"type":"java.lang.Object","desc":"changed"}},"desc":"other","class":"x"}},"puppetlabs.puppetdb.storage":{"name=gc-time":{"attr":{"Count":{"rw":false,"type":"long","desc":"Attribute exposed for management"}}}}},"timestamp":1732950001,"status":200}"#;
    let value = merged(&[first, second]);
    let population = &value["value"]["puppetlabs.puppetdb.population"];
    assert_eq!(
        population["name=num-nodes"]["attr"]["Value"],
        json!({"rw": false, "type": "java.lang.Object", "desc": "Attribute exposed for management"})
    );
    assert_eq!(
        population["name=num-nodes"]["class"],
        json!("com.codahale.metrics.jmx.JmxReporter$JmxGauge")
    );
    assert!(population["name=num-resources"].is_object());
    assert!(value["value"]["java.lang"]["type=Runtime"].is_object());
    assert!(value["value"]["puppetlabs.puppetdb.storage"]["name=gc-time"].is_object());
    assert_eq!(value["timestamp"], json!(1_732_950_001_u64));
    let text = merged_text(&[first, second]);
    let domains: Vec<usize> = [
        "\"puppetlabs.puppetdb.population\"",
        "\"java.lang\"",
        "\"puppetlabs.puppetdb.storage\"",
    ]
    .iter()
    .map(|d| text.find(d).expect("domain"))
    .collect();
    assert!(domains.windows(2).all(|w| w[0] < w[1]), "{text}");
}

#[test]
fn a_wildcard_read_merges_per_mbean() {
    let first = r#"{"request":{"mbean":"puppetlabs.puppetdb.population:*","type":"read"},"value":{"puppetlabs.puppetdb.population:name=num-nodes":{"Value":5},"puppetlabs.puppetdb.population:name=avg-resources-per-node":{"Value":20.5}},"timestamp":1732950000,"status":200}"#;
    let second = r#"{"request":{"mbean":"puppetlabs.puppetdb.population:*","type":"read"},"value":{"puppetlabs.puppetdb.population:name=num-nodes":{"Value":7},"puppetlabs.puppetdb.population:name=num-resources":{"Value":140}},"timestamp":1732950002,"status":200}"#;
    assert_eq!(
        merged(&[first, second])["value"],
        json!({
            "puppetlabs.puppetdb.population:name=num-nodes": {"Value": 12},
            "puppetlabs.puppetdb.population:name=avg-resources-per-node": {"Value": 20.5},
            "puppetlabs.puppetdb.population:name=num-resources": {"Value": 140}
        })
    );
}

#[test]
fn a_bare_number_combines_by_the_requested_attribute() {
    let read = |attribute: &str, path: Option<&str>, value: &str| {
        let path = path.map_or(String::new(), |p| format!(r#","path":"{p}""#));
        format!(
            r#"{{"request":{{"mbean":"m:name=x","attribute":"{attribute}"{path},"type":"read"}},"value":{value},"timestamp":1,"status":200}}"#
        )
    };
    let two = |attribute: &str, path: Option<&str>| {
        merged(&[&read(attribute, path, "3"), &read(attribute, path, "5")])["value"].clone()
    };
    assert_eq!(two("Value", None), json!(8));
    assert_eq!(two("Max", None), json!(5));
    assert_eq!(two("min", None), json!(3));
    assert_eq!(two("99thPercentile", None), json!(4));
    assert_eq!(two("HeapMemoryUsage", Some("max")), json!(5));
    assert_eq!(two("HeapMemoryUsage", Some("used")), json!(8));
    let bare = |value: &str| format!(r#"{{"value":{value},"status":200}}"#);
    assert_eq!(merged(&[&bare("3"), &bare("5")])["value"], json!(8));
}

#[test]
fn v1_bodies_merge_without_an_envelope() {
    let first: &[u8] =
        br#"{"Count":10,"Mean":2.0,"Min":1,"Max":4,"RateUnit":"events/second","OnlyHere":1}"#;
    let second: &[u8] = br#"{"Count":5,"Mean":4.0,"Min":0,"Max":9,"RateUnit":"events/second"}"#;
    let JolokiaMerge::Merged { body, contributed } = merge_v1(&[first, b"junk", second]) else {
        panic!("expected a merge");
    };
    assert_eq!(contributed, 2);
    assert_eq!(
        String::from_utf8(body).expect("utf-8"),
        r#"{"Count":15,"Mean":3.0,"Min":0,"Max":9,"RateUnit":"events/second","OnlyHere":1}"#
    );
    // The mbean list: names to URIs, a union.
    let list1: &[u8] = br#"{"puppetlabs.puppetdb.population:name=num-nodes":"/metrics/v1/mbeans/puppetlabs.puppetdb.population%3Aname%3Dnum-nodes"}"#;
    let list2: &[u8] =
        br#"{"java.lang:type=Memory":"/metrics/v1/mbeans/java.lang%3Atype%3DMemory"}"#;
    let JolokiaMerge::Merged { body, .. } = merge_v1(&[list1, list2]) else {
        panic!("expected a merge");
    };
    let value: Value = serde_json::from_slice(&body).expect("json");
    assert_eq!(value.as_object().map(|o| o.len()), Some(2));
    // A v1 body that is a bare number is summed.
    let JolokiaMerge::Merged { body, .. } = merge_v1(&[b"2", b" 3 "]) else {
        panic!("expected a merge");
    };
    assert_eq!(body, b"5");
    // Whitespace between tokens is dropped; a lone body is otherwise written as it came.
    let JolokiaMerge::Merged { body, .. } =
        merge_v1(&[b" {\n  \"Count\" : 1.50 ,\n  \"Rate\": [1, 2]\n} \n"])
    else {
        panic!("expected a merge");
    };
    assert_eq!(body, br#"{"Count":1.50,"Rate":[1, 2]}"#);
}

#[test]
fn real_puppetdb_7_12_1_envelopes() {
    let nodes_a = r#"{"request":{"mbean":"puppetlabs.puppetdb.population:name=num-nodes","type":"read"},"value":{"Value":5},"timestamp":1732950000,"status":200}"#;
    let nodes_b = r#"{"request":{"mbean":"puppetlabs.puppetdb.population:name=num-nodes","type":"read"},"value":{"Value":7},"timestamp":1732950003,"status":200}"#;
    assert_eq!(
        merged_text(&[nodes_a, nodes_b]),
        r#"{"request":{"mbean":"puppetlabs.puppetdb.population:name=num-nodes","type":"read"},"value":{"Value":12},"timestamp":1732950003,"status":200}"#
    );
    let timer_a = r#"{"request":{"mbean":"puppetlabs.puppetdb.http:name=/pdb/query/v4/nodes.service-time","type":"read"},"value":{"Mean":12.5,"StdDev":3.25,"75thPercentile":14.0,"98thPercentile":20.0,"RateUnit":"events/second","95thPercentile":18.0,"99thPercentile":22.0,"Max":30.0,"Count":40,"FiveMinuteRate":0.2,"50thPercentile":11.0,"MeanRate":0.1,"Min":2.0,"OneMinuteRate":0.3,"DurationUnit":"milliseconds","999thPercentile":29.0,"FifteenMinuteRate":0.1},"timestamp":1732950000,"status":200}"#;
    let timer_b = r#"{"request":{"mbean":"puppetlabs.puppetdb.http:name=/pdb/query/v4/nodes.service-time","type":"read"},"value":{"Mean":7.5,"StdDev":1.75,"75thPercentile":8.0,"98thPercentile":10.0,"RateUnit":"events/second","95thPercentile":9.0,"99thPercentile":12.0,"Max":25.0,"Count":10,"FiveMinuteRate":0.05,"50thPercentile":7.0,"MeanRate":0.05,"Min":1.0,"OneMinuteRate":0.1,"DurationUnit":"milliseconds","999thPercentile":24.0,"FifteenMinuteRate":0.05},"timestamp":1732950001,"status":200}"#;
    let value = merged(&[timer_a, timer_b])["value"].clone();
    let close = |key: &str, expected: f64| {
        let got = value[key].as_f64().expect("number");
        assert!((got - expected).abs() < 1e-9, "{key}: {got} != {expected}");
    };
    close("Mean", 10.0);
    close("StdDev", 2.5);
    close("75thPercentile", 11.0);
    close("99thPercentile", 17.0);
    close("999thPercentile", 26.5);
    close("Max", 30.0);
    close("Min", 1.0);
    close("OneMinuteRate", 0.4);
    close("MeanRate", 0.15);
    assert_eq!(value["Count"], json!(50));
    assert_eq!(value["RateUnit"], json!("events/second"));
    assert_eq!(value["DurationUnit"], json!("milliseconds"));
    let not_found = r#"{"request":{"mbean":"puppetlabs.puppetdb.population:name=nope","type":"read"},"stacktrace":"javax.management.InstanceNotFoundException: puppetlabs.puppetdb.population:name=nope\n","error_type":"javax.management.InstanceNotFoundException","error":"javax.management.InstanceNotFoundException : puppetlabs.puppetdb.population:name=nope","status":404}"#;
    assert_eq!(
        merge_v2(&[not_found.as_bytes(), nodes_b.as_bytes()]),
        JolokiaMerge::Merged {
            body: nodes_b.as_bytes().to_vec(),
            contributed: 1
        }
    );
}

#[test]
fn keys_with_escapes_are_written_back_as_json() {
    let a = r#"{"value":{"a\"b":1,"caf\u00e9":2},"status":200}"#;
    let b = r#"{"value":{"a\"b":2},"status":200}"#;
    let text = merged_text(&[a, b]);
    assert_eq!(text, r#"{"value":{"a\"b":3,"café":2},"status":200}"#);
    // A repeated key keeps its first position and its last value.
    let dup = r#"{"value":{"x":1,"y":2,"x":5},"status":200}"#;
    assert_eq!(
        merged_text(&[dup, b]),
        r#"{"value":{"x":5,"y":2,"a\"b":2},"status":200}"#
    );
}

#[test]
fn set_population_value_replaces_only_the_value() {
    let body = br#"{"request":{"mbean":"puppetlabs.puppetdb.population:name=num-nodes","type":"read"},"value":{"Value":12},"timestamp":1732950003,"status":200}"#;
    let out = set_population_value(body, json!({"Value": 9})).expect("usable");
    assert_eq!(
        String::from_utf8(out).expect("utf-8"),
        r#"{"request":{"mbean":"puppetlabs.puppetdb.population:name=num-nodes","type":"read"},"value":{"Value":9},"timestamp":1732950003,"status":200}"#
    );
    let bare = br#"{"request":{"mbean":"m","attribute":"Value","type":"read"},"status":200}"#;
    assert_eq!(
        set_population_value(bare, json!(4)).as_deref(),
        Some(&br#"{"request":{"mbean":"m","attribute":"Value","type":"read"},"status":200,"value":4}"#[..])
    );
    let error = br#"{"error_type":"x","error":"y","status":404}"#;
    assert_eq!(set_population_value(error, json!({"Value": 1})), None);
    assert_eq!(set_population_value(b"nope", json!({"Value": 1})), None);
}

#[test]
fn mbean_of_decodes_puppetboard_paths() {
    assert_eq!(
        mbean_of("/metrics/v2/read/puppetlabs.puppetdb.population%3Aname%3Dnum-nodes").as_deref(),
        Some("puppetlabs.puppetdb.population:name=num-nodes")
    );
    assert_eq!(
        mbean_of("/metrics/v2/read/puppetlabs.puppetdb.population%3Aname%3Dnum-resources")
            .as_deref(),
        Some("puppetlabs.puppetdb.population:name=num-resources")
    );
    // pypuppetdb !-escapes, then quote()s with `/` safe: `!` arrives as %21.
    assert_eq!(
        mbean_of("/metrics/v2/read/puppetlabs.puppetdb.http%3Aname%3D%21/pdb%21/query%21/v4%21/nodes.service-time")
            .as_deref(),
        Some("puppetlabs.puppetdb.http:name=/pdb/query/v4/nodes.service-time")
    );
    assert_eq!(
        mbean_of("/metrics/v2/read/a%3Aname%3Dx%21%21y%21%22z%21%2Fw/Value").as_deref(),
        Some("a:name=x!y\"z/w")
    );
    assert_eq!(
        mbean_of("/metrics/v2/read/puppetlabs.puppetdb.population:name=num-nodes/Value?ignoreErrors=true")
            .as_deref(),
        Some("puppetlabs.puppetdb.population:name=num-nodes")
    );
    assert_eq!(
        mbean_of("/metrics/v2/read/puppetlabs.puppetdb.population%3A%2A").as_deref(),
        Some("puppetlabs.puppetdb.population:*")
    );
    assert_eq!(mbean_of("/metrics/v2/read/"), None);
    assert_eq!(mbean_of("/metrics/v2/read"), None);
    assert_eq!(mbean_of("/metrics/v2/list"), None);
    assert_eq!(mbean_of("/metrics/v2/read/%FF"), None);
    assert_eq!(mbean_of("/pdb/query/v4/nodes"), None);
}

#[test]
fn attribute_of_reads_the_second_segment() {
    assert_eq!(
        attribute_of("/metrics/v2/read/puppetlabs.puppetdb.population%3Aname%3Dnum-nodes/Value")
            .as_deref(),
        Some("Value")
    );
    assert_eq!(
        attribute_of("/metrics/v2/read/java.lang%3Atype%3DMemory/HeapMemoryUsage/used").as_deref(),
        Some("HeapMemoryUsage")
    );
    assert_eq!(
        attribute_of("/metrics/v2/read/puppetlabs.puppetdb.population%3Aname%3Dnum-nodes"),
        None
    );
    assert_eq!(attribute_of("/metrics/v2/read/m/"), None);
}
