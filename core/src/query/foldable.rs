//! Which extract aggregates pdbmux can combine across backends, and the 400 for those it cannot.

use super::ast::{Analysis, FunctionColumn};

/// The extract functions pdbmux has a combiner for (docs/merging.md, "Aggregates").
pub const COMBINABLE_FUNCTIONS: [&str; 7] = [
    "count",
    "sum",
    "avg",
    "min",
    "max",
    "to_string",
    "jsonb_typeof",
];

/// Why an extract with function columns cannot be combined; answered with 400 before any fan-out.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CombineRefusal {
    /// A function outside [`COMBINABLE_FUNCTIONS`]: folding it would be a guess.
    #[error("extract function {name} has no combiner; pdbmux combines count, sum, avg, min, max, to_string and jsonb_typeof")]
    UnknownFunction {
        /// The function name as written.
        name: String,
    },
    /// The same function projected twice: PuppetDB aliases the repeat, which nothing can fold.
    #[error("extract projects the function {name} twice; pdbmux cannot merge the aliased column {alias}")]
    RepeatedFunction {
        /// The repeated function.
        name: String,
        /// The column PuppetDB names the repeat (`<name>_2`).
        alias: String,
    },
    /// `avg` needs the `sum` and `count` response columns for its rewrite.
    #[error("extract projects avg together with {other}; pdbmux needs the {other} column to rewrite avg")]
    AvgWithSumOrCount {
        /// `sum` or `count`, as a function or a plain field.
        other: String,
    },
    /// `avg` takes exactly one column (PuppetDB's own wording, since it refuses the same).
    #[error("wrong number of arguments ({count}) provided for function avg")]
    AvgArity {
        /// The number of arguments given.
        count: usize,
    },
    /// A plain field named like a projected function: PuppetDB puts function columns first, so
    /// the field is the one aliased.
    #[error("extract projects the field {name} beside the function {name}; pdbmux cannot merge the aliased column {alias}")]
    FieldNamedLikeFunction {
        /// The shared name.
        name: String,
        /// The column PuppetDB names the field (`<name>_2`).
        alias: String,
    },
}

/// Checks that the outer extract's function columns can be combined across backends.
///
/// Call it on every query that takes the combining branch
/// ([`Analysis::has_function_column`]); a query without function columns always passes. Checks,
/// in order: unknown functions, a function projected twice, `avg`'s arity, `avg` beside `sum` or
/// `count` (function or field), a plain field named like a projected function. A repeated plain
/// field is fine: its copy holds the same value as the key it duplicates.
pub fn check_combinable(analysis: &Analysis) -> Result<(), CombineRefusal> {
    let functions = &analysis.function_columns;
    if let Some(unknown) = functions
        .iter()
        .find(|f| !COMBINABLE_FUNCTIONS.contains(&f.name.as_str()))
    {
        return Err(CombineRefusal::UnknownFunction {
            name: unknown.name.clone(),
        });
    }
    for (index, function) in functions.iter().enumerate() {
        if functions[..index].iter().any(|f| f.name == function.name) {
            return Err(CombineRefusal::RepeatedFunction {
                name: function.name.clone(),
                alias: format!("{}_2", function.name),
            });
        }
    }
    if let Some(avg) = functions.iter().find(|f| f.name == "avg") {
        check_avg(avg, analysis)?;
    }
    if let Some(field) = analysis
        .plain_columns
        .iter()
        .find(|field| functions.iter().any(|f| &f.name == *field))
    {
        return Err(CombineRefusal::FieldNamedLikeFunction {
            name: field.clone(),
            alias: format!("{field}_2"),
        });
    }
    Ok(())
}

fn check_avg(avg: &FunctionColumn, analysis: &Analysis) -> Result<(), CombineRefusal> {
    if avg.args.len() != 1 {
        return Err(CombineRefusal::AvgArity {
            count: avg.args.len(),
        });
    }
    let function_names = analysis.function_columns.iter().map(|f| f.name.as_str());
    let field_names = analysis.plain_columns.iter().map(String::as_str);
    if let Some(other) = function_names
        .chain(field_names)
        .find(|name| matches!(*name, "sum" | "count"))
    {
        return Err(CombineRefusal::AvgWithSumOrCount {
            other: other.to_owned(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::query::analyze;
    use serde_json::{json, Value};

    fn check(ast: Value) -> Result<(), CombineRefusal> {
        check_combinable(&analyze(&ast))
    }

    fn message(ast: Value) -> String {
        check(ast).expect_err("refused").to_string()
    }

    #[test]
    fn combinable_shapes_pass() {
        for ast in [
            json!([
                "extract",
                [["function", "count"]],
                ["=", "environment", "production"]
            ]),
            json!([
                "extract",
                [["function", "count"], "status"],
                ["group_by", "status"]
            ]),
            json!([
                "extract",
                [["function", "avg", "value"], "environment"],
                ["group_by", "environment"]
            ]),
            json!([
                "extract",
                [
                    ["function", "min", "value"],
                    ["function", "max", "value"],
                    ["function", "sum", "value"],
                    ["function", "count"],
                    ["function", "to_string", "receive_time", "FMDay"],
                    ["function", "jsonb_typeof", "value"]
                ]
            ]),
            json!([
                "extract",
                ["certname", "certname", ["function", "count"]],
                ["group_by", "certname"]
            ]),
            json!(["extract", ["certname", "count"]]),
            json!(["=", "certname", "a"]),
        ] {
            assert_eq!(check(ast.clone()), Ok(()), "{ast}");
        }
    }

    #[test]
    fn repeated_function_names_the_alias() {
        assert_eq!(
            message(json!(["extract", [["function", "count"], ["function", "count", "certname"]]])),
            "extract projects the function count twice; pdbmux cannot merge the aliased column count_2"
        );
        assert_eq!(
            check(json!([
                "extract",
                [
                    ["function", "to_string", "a", "x"],
                    "b",
                    ["function", "to_string", "c", "y"]
                ]
            ])),
            Err(CombineRefusal::RepeatedFunction {
                name: "to_string".into(),
                alias: "to_string_2".into()
            })
        );
    }

    #[test]
    fn field_named_like_a_function() {
        assert_eq!(
            message(json!(["extract", ["count", ["function", "count"]]])),
            "extract projects the field count beside the function count; pdbmux cannot merge the aliased column count_2"
        );
        assert_eq!(
            check(json!(["extract", [["function", "max", "x"], "max"]])),
            Err(CombineRefusal::FieldNamedLikeFunction {
                name: "max".into(),
                alias: "max_2".into()
            })
        );
    }

    #[test]
    fn avg_beside_sum_or_count() {
        assert_eq!(
            message(json!([
                "extract",
                [["function", "avg", "value"], ["function", "sum", "value"]]
            ])),
            "extract projects avg together with sum; pdbmux needs the sum column to rewrite avg"
        );
        assert_eq!(
            check(json!([
                "extract",
                [["function", "count"], ["function", "avg", "value"]]
            ])),
            Err(CombineRefusal::AvgWithSumOrCount {
                other: "count".into()
            })
        );
        assert_eq!(
            check(json!(["extract", ["sum", ["function", "avg", "value"]]])),
            Err(CombineRefusal::AvgWithSumOrCount {
                other: "sum".into()
            })
        );
    }

    #[test]
    fn avg_arity() {
        assert_eq!(
            message(json!(["extract", [["function", "avg"]]])),
            "wrong number of arguments (0) provided for function avg"
        );
        assert_eq!(
            check(json!(["extract", [["function", "avg", "a", "b"]]])),
            Err(CombineRefusal::AvgArity { count: 2 })
        );
    }

    #[test]
    fn unknown_function() {
        assert_eq!(
            message(json!(["extract", [["function", "median", "value"]]])),
            "extract function median has no combiner; pdbmux combines count, sum, avg, min, max, to_string and jsonb_typeof"
        );
    }

    #[test]
    fn checks_run_in_order() {
        // Unknown before repeated, repeated before the avg clash.
        assert_eq!(
            check(json!([
                "extract",
                [
                    ["function", "count"],
                    ["function", "count"],
                    ["function", "stddev", "x"]
                ]
            ])),
            Err(CombineRefusal::UnknownFunction {
                name: "stddev".into()
            })
        );
        assert_eq!(
            check(json!([
                "extract",
                [
                    ["function", "avg", "x"],
                    ["function", "count"],
                    ["function", "count"]
                ]
            ])),
            Err(CombineRefusal::RepeatedFunction {
                name: "count".into(),
                alias: "count_2".into()
            })
        );
    }
}
