//! Partial evaluation of a query's `and`, `or` and `not`: the clauses pdbmux can decide itself are
//! replaced by their truth, and what is left is the query the backends still have to decide.
//! pdbmux decides a `/facts` query's constraints on the provenance fact's name and value, which
//! no backend holds (docs/merging.md, "Provenance").

use serde_json::Value;

/// A query after [`evaluate`]: decided for every record, or the part left to decide.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Residual {
    /// Every record meets it (`true`) or none does (`false`).
    Always(bool),
    /// The clauses still to decide, in their `and`, `or` and `not` as the query wrote them (an
    /// `and` or `or` left with one clause is that clause).
    Left(Value),
}

/// Evaluates `query` as far as `atom` decides its clauses: `atom` is asked each clause that is
/// not an `and`, `or` or `not` (a comparison, an `in`, a subquery) and answers its truth, `None`
/// to leave it to the backends, or an error that stops the evaluation. An `and` or `or` without
/// clauses, or a `not` without exactly one, is malformed: `atom` is asked it whole (leave it to
/// the backends, which answer it with a 400, or stop).
pub(crate) fn evaluate<E>(
    query: &Value,
    atom: &mut impl FnMut(&Value) -> Result<Option<bool>, E>,
) -> Result<Residual, E> {
    let form = query
        .as_array()
        .and_then(|items| Some((items.first()?.as_str()?, &items[1..])));
    match form {
        Some((op @ ("and" | "or"), clauses)) if !clauses.is_empty() => {
            // An `and` is decided by a false clause, an `or` by a true one.
            let decisive = op == "or";
            let mut left = Vec::new();
            for clause in clauses {
                match evaluate(clause, atom)? {
                    Residual::Always(truth) if truth == decisive => {
                        return Ok(Residual::Always(decisive))
                    }
                    Residual::Always(_) => {}
                    Residual::Left(clause) => left.push(clause),
                }
            }
            Ok(match left.len() {
                0 => Residual::Always(!decisive),
                1 => Residual::Left(left.remove(0)),
                _ => {
                    left.insert(0, Value::from(op));
                    Residual::Left(Value::Array(left))
                }
            })
        }
        Some(("not", [clause])) => Ok(match evaluate(clause, atom)? {
            Residual::Always(truth) => Residual::Always(!truth),
            Residual::Left(clause) => Residual::Left(serde_json::json!(["not", clause])),
        }),
        _ => Ok(match atom(query)? {
            Some(truth) => Residual::Always(truth),
            None => Residual::Left(query.clone()),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::convert::Infallible;

    /// Decides clauses on `name` as the record named `kernel` would, leaves the others.
    fn kernel(query: Value) -> Residual {
        let mut atom = |clause: &Value| -> Result<Option<bool>, Infallible> {
            Ok(match clause.as_array().map(Vec::as_slice) {
                Some([_, field, Value::String(name)]) if field == "name" => Some(name == "kernel"),
                _ => None,
            })
        };
        evaluate(&query, &mut atom).expect("infallible")
    }

    #[test]
    fn decided_clauses_fold_away_and_the_rest_keeps_its_shape() {
        let env = json!(["=", "environment", "production"]);
        let kernel_named = json!(["=", "name", "kernel"]);
        let os_named = json!(["=", "name", "os"]);
        assert_eq!(kernel(kernel_named.clone()), Residual::Always(true));
        assert_eq!(kernel(json!(["not", os_named])), Residual::Always(true));
        assert_eq!(
            kernel(json!(["and", kernel_named, env])),
            Residual::Left(env.clone())
        );
        assert_eq!(
            kernel(json!(["and", ["=", "name", "os"], env])),
            Residual::Always(false)
        );
        assert_eq!(
            kernel(json!([
                "or",
                ["=", "name", "os"],
                env,
                ["=", "certname", "a"]
            ])),
            Residual::Left(json!(["or", env, ["=", "certname", "a"]]))
        );
        assert_eq!(
            kernel(json!(["not", ["or", ["=", "name", "os"], env]])),
            Residual::Left(json!(["not", env]))
        );
        assert_eq!(
            kernel(json!(["or", ["=", "name", "os"], ["=", "name", "x"]])),
            Residual::Always(false)
        );
    }

    #[test]
    fn malformed_connectives_are_asked_whole_and_an_error_stops() {
        for malformed in [json!(["and"]), json!(["not", 1, 2]), json!(["or"])] {
            assert_eq!(kernel(malformed.clone()), Residual::Left(malformed));
        }
        // Whole: the name clause inside is not decided.
        let mut whole = |clause: &Value| -> Result<Option<bool>, &'static str> {
            match clause.get(0).and_then(Value::as_str) {
                Some("not") => Err("malformed"),
                _ => Ok(Some(true)),
            }
        };
        let malformed = json!(["and", ["=", "name", "x"], ["not", ["=", "name", "x"], 1]]);
        assert_eq!(evaluate(&malformed, &mut whole), Err("malformed"));
        let mut refuse = |_: &Value| -> Result<Option<bool>, &'static str> { Err("no") };
        assert_eq!(
            evaluate(&json!(["and", ["=", "name", "x"]]), &mut refuse),
            Err("no")
        );
    }
}
