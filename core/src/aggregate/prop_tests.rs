//! Folding per-backend partial aggregates equals the aggregate over the union of the rows, and
//! does not depend on the backends' order (up to row order).

use proptest::prelude::*;
use serde_json::{json, Map, Value};

use super::tests::with_query;
use super::*;

/// One record of a small /facts-like table: two grouping columns and two aggregated ones.
#[derive(Debug, Clone)]
struct Rec {
    environment: &'static str,
    name: i64,
    /// Integers, or floats off the integers (k + 0.5), so a min or max never ties across types
    /// and every sum is exact in f64.
    value: Option<Value>,
    certname: Option<&'static str>,
    backend: usize,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Func {
    Count,
    Sum,
    Avg,
    Min(&'static str),
    Max(&'static str),
}

#[derive(Debug, Clone)]
struct Query {
    group: Vec<&'static str>,
    /// Whether the group columns are projected (else pdbmux projects them as helpers).
    projected: bool,
    funcs: Vec<Func>,
}

fn rec(backends: usize) -> impl Strategy<Value = Rec> {
    let value = prop_oneof![
        Just(None),
        (-20i64..20).prop_map(|i| Some(json!(i))),
        (-20i64..20).prop_map(|i| Some(json!(i as f64 + 0.5))),
    ];
    let certname = prop_oneof![
        Just(None),
        prop::sample::select(vec!["a", "B", "b", "ab", "Ab"]).prop_map(Some),
    ];
    (
        prop::sample::select(vec!["production", "test", "Dev"]),
        0i64..3,
        value,
        certname,
        0..backends,
    )
        .prop_map(|(environment, name, value, certname, backend)| Rec {
            environment,
            name,
            value,
            certname,
            backend,
        })
}

fn query() -> impl Strategy<Value = Query> {
    let group = prop_oneof![
        Just(vec![]),
        Just(vec!["environment"]),
        Just(vec!["name"]),
        Just(vec!["environment", "name"]),
        Just(vec!["name", "environment"]),
    ];
    let arg = || prop::sample::select(vec!["value", "certname"]);
    let extremes = (
        prop::option::of(arg().prop_map(Func::Min)),
        prop::option::of(arg().prop_map(Func::Max)),
    );
    let funcs = (any::<bool>(), any::<bool>(), any::<bool>(), extremes).prop_map(
        |(avg, count, sum, (min, max))| {
            let mut funcs = Vec::new();
            if avg {
                funcs.push(Func::Avg);
            } else {
                if count {
                    funcs.push(Func::Count);
                }
                if sum || (!count && min.is_none() && max.is_none()) {
                    funcs.push(Func::Sum);
                }
            }
            funcs.extend(min);
            funcs.extend(max);
            funcs
        },
    );
    (group, any::<bool>(), funcs).prop_map(|(group, projected, funcs)| Query {
        group,
        projected,
        funcs,
    })
}

fn ast(query: &Query) -> Value {
    let mut columns: Vec<Value> = query
        .funcs
        .iter()
        .map(|func| match func {
            Func::Count => json!(["function", "count"]),
            Func::Sum => json!(["function", "sum", "value"]),
            Func::Avg => json!(["function", "avg", "value"]),
            Func::Min(arg) => json!(["function", "min", arg]),
            Func::Max(arg) => json!(["function", "max", arg]),
        })
        .collect();
    if query.projected {
        columns.extend(query.group.iter().map(|g| json!(g)));
    }
    let mut ast = vec![json!("extract"), Value::Array(columns)];
    if !query.group.is_empty() {
        let mut group_by = vec![json!("group_by")];
        group_by.extend(query.group.iter().map(|g| json!(g)));
        ast.push(Value::Array(group_by));
    }
    Value::Array(ast)
}

fn column(rec: &Rec, name: &str) -> Value {
    match name {
        "environment" => json!(rec.environment),
        "name" => json!(rec.name),
        "value" => rec.value.clone().unwrap_or(Value::Null),
        _ => rec.certname.map_or(Value::Null, |c| json!(c)),
    }
}

/// Sum of the non-null values: an integer unless a float is among them; null over none.
fn sum(values: &[Value]) -> Value {
    if values.is_empty() {
        return Value::Null;
    }
    if values.iter().all(Value::is_i64) {
        json!(values.iter().filter_map(Value::as_i64).sum::<i64>())
    } else {
        json!(values.iter().filter_map(Value::as_f64).sum::<f64>())
    }
}

fn extreme(values: &[Value], max: bool) -> Value {
    let better = |a: &Value, b: &Value| match (a, b) {
        (Value::String(a), Value::String(b)) => (a.as_bytes() > b.as_bytes()) == max && a != b,
        _ => {
            let (a, b) = (a.as_f64().unwrap_or(0.0), b.as_f64().unwrap_or(0.0));
            (a > b) == max && a != b
        }
    };
    let mut best: Option<&Value> = None;
    for value in values {
        if best.is_none_or(|b| better(value, b)) {
            best = Some(value);
        }
    }
    best.cloned().unwrap_or(Value::Null)
}

/// What one PuppetDB answers over `recs`: one row per group (one row when nothing groups);
/// `upstream` rows carry every group column and avg as sum + count, as pdbmux asks for them.
fn answer(query: &Query, recs: &[&Rec], upstream: bool) -> Vec<Value> {
    let mut groups: Vec<(Vec<Value>, Vec<&Rec>)> = Vec::new();
    if query.group.is_empty() {
        groups.push((Vec::new(), recs.to_vec()));
    } else {
        for rec in recs {
            let key: Vec<Value> = query.group.iter().map(|g| column(rec, g)).collect();
            match groups.iter_mut().find(|(k, _)| *k == key) {
                Some((_, members)) => members.push(rec),
                None => groups.push((key, vec![rec])),
            }
        }
    }
    groups
        .into_iter()
        .map(|(key, members)| {
            let mut row = Map::new();
            let values = |name: &str| -> Vec<Value> {
                members
                    .iter()
                    .map(|rec| column(rec, name))
                    .filter(|v| !v.is_null())
                    .collect()
            };
            for func in &query.funcs {
                match func {
                    Func::Count => {
                        row.insert("count".into(), json!(members.len()));
                    }
                    Func::Sum => {
                        row.insert("sum".into(), sum(&values("value")));
                    }
                    Func::Avg => {
                        let values = values("value");
                        let total = sum(&values);
                        if upstream {
                            row.insert("sum".into(), total);
                            row.insert("count".into(), json!(values.len()));
                        } else {
                            let avg = total.as_f64().map(|s| s / values.len() as f64);
                            row.insert("avg".into(), avg.map_or(Value::Null, |a| json!(a)));
                        }
                    }
                    Func::Min(arg) => {
                        row.insert("min".into(), extreme(&values(arg), false));
                    }
                    Func::Max(arg) => {
                        row.insert("max".into(), extreme(&values(arg), true));
                    }
                }
            }
            if upstream || query.projected {
                for (name, value) in query.group.iter().zip(key) {
                    row.insert((*name).into(), value);
                }
            }
            Value::Object(row)
        })
        .collect()
}

/// Rows in a fixed order, read back from their text the way the folded body is read: serde_json's
/// default float parser is not always correctly rounded, so both sides take the same trip.
fn sorted(rows: Vec<Value>) -> Vec<Value> {
    let mut rows: Vec<Value> =
        serde_json::from_str(&Value::Array(rows).to_string()).unwrap_or_default();
    rows.sort_by_key(Value::to_string);
    rows
}

fn fold(plan: &CombinePlan, bodies: &[String]) -> Vec<Value> {
    let slices: Vec<[&[u8]; 1]> = bodies.iter().map(|b| [b.as_bytes()]).collect();
    let parts: Vec<Part<'_>> = slices
        .iter()
        .map(|bodies| Part {
            bodies,
            records: None,
            correction: None,
        })
        .collect();
    let combined = plan.combine(&parts);
    assert!(combined.unusable.is_empty(), "{:?}", combined.unusable);
    serde_json::from_slice(&combined.body).expect("json array")
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn folding_partials_equals_the_aggregate_of_the_union(
        backends in 1usize..=4,
        query in query(),
        recs in prop::collection::vec(rec(4), 0..24),
        rotate in 0usize..4,
    ) {
        let recs: Vec<Rec> = recs
            .into_iter()
            .map(|rec| Rec { backend: rec.backend % backends, ..rec })
            .collect();
        let plan = CombinePlan::from_params(
            CombineKind::Extract(crate::entity::Entity::Facts),
            &with_query(&ast(&query), ""),
        )
        .expect("plannable")
        .expect("combined");
        let bodies: Vec<String> = (0..backends)
            .map(|backend| {
                let mine: Vec<&Rec> = recs.iter().filter(|r| r.backend == backend).collect();
                Value::Array(answer(&query, &mine, true)).to_string()
            })
            .collect();
        let all: Vec<&Rec> = recs.iter().collect();
        let expected = sorted(answer(&query, &all, false));
        let folded = fold(&plan, &bodies);
        prop_assert_eq!(sorted(folded.clone()), expected);

        // Any backend order folds to the same rows.
        let mut turned = bodies.clone();
        turned.rotate_left(rotate % backends);
        turned.reverse();
        prop_assert_eq!(sorted(fold(&plan, &turned)), sorted(folded));
    }
}
