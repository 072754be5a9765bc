//! `counts_filter` of the event-count endpoints, evaluated on the merged per-subject counts.
//!
//! PuppetDB compiles it with `event-count-ops` (puppetlabs/puppetdb 7.12.1 and 8.x,
//! `src/puppetlabs/puppetdb/query.clj`): one comparison `[op, field, value]` with `op` one of `=`,
//! `>`, `<`, `>=`, `<=` (any case) over the count columns. There is no `and`, `or` or `not`: such
//! a filter is refused with PuppetDB's own words, since a single PuppetDB refuses it too. An empty
//! array is no filter. Messages follow `compile-event-count-equality` and
//! `compile-event-count-inequality`.

use std::cmp::Ordering;

use serde_json::{Number, Value};

use super::values::Total;

/// The count columns of `/event-counts` rows, in PuppetDB's order (`query/aggregate_event_counts.clj`
/// `get-aggregate-sql`: failures, skips, then successes and noops or PE's corrective split): what
/// a filter may name, and the order of the aggregate's summary columns.
pub(super) const COUNT_FIELDS: [&str; 8] = [
    "failures",
    "skips",
    "successes",
    "noops",
    "intentional_successes",
    "corrective_successes",
    "intentional_noops",
    "corrective_noops",
];

/// Why a `counts_filter` was refused (a 400 before any fan-out).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum CountsFilterError {
    /// Not JSON.
    #[error("counts_filter is not valid json: {0}")]
    NotJson(String),
    /// JSON, but not an array.
    #[error("counts_filter must be a json array, not {0}")]
    NotArray(String),
    /// An operator other than `=`, `>`, `<`, `>=`, `<=` (PuppetDB's wording).
    #[error("{term} is not well-formed: query operator '{op}' is unknown")]
    UnknownOperator {
        /// The whole filter as JSON.
        term: String,
        /// The operator as written.
        op: String,
    },
    /// Not exactly a field and a value after the operator.
    #[error("{op} requires exactly two arguments, but {count} were supplied")]
    Arity {
        /// The operator.
        op: String,
        /// How many arguments followed it.
        count: usize,
    },
    /// `=` on something that is not a count column.
    #[error("{0} is not a queryable object for event counts")]
    EqualityField(String),
    /// An inequality on something that is not a count column.
    #[error("{op} operator does not support object '{field}' for event counts")]
    InequalityField {
        /// The operator.
        op: String,
        /// The field as written.
        field: String,
    },
    /// The value compared with is not a number (the columns are integers).
    #[error("counts_filter value {0} is not a number")]
    NotANumber(String),
}

/// One parsed comparison.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct CountsFilter {
    field: String,
    op: Op,
    value: Number,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Eq,
    Gt,
    Lt,
    Ge,
    Le,
}

impl CountsFilter {
    /// Parses the decoded `counts_filter` parameter; `Ok(None)` for `[]` (no filter).
    pub(crate) fn parse(text: &str) -> Result<Option<CountsFilter>, CountsFilterError> {
        let value: Value = serde_json::from_str(text)
            .map_err(|error| CountsFilterError::NotJson(error.to_string()))?;
        let Value::Array(items) = &value else {
            return Err(CountsFilterError::NotArray(value.to_string()));
        };
        let Some(first) = items.first() else {
            return Ok(None);
        };
        let op_text = match first {
            Value::String(op) => op.to_lowercase(),
            other => other.to_string(),
        };
        let op = match op_text.as_str() {
            "=" => Op::Eq,
            ">" => Op::Gt,
            "<" => Op::Lt,
            ">=" => Op::Ge,
            "<=" => Op::Le,
            _ => {
                return Err(CountsFilterError::UnknownOperator {
                    term: value.to_string(),
                    op: op_text,
                })
            }
        };
        let args = &items[1..];
        let [field, operand] = args else {
            return Err(CountsFilterError::Arity {
                op: op_text,
                count: args.len(),
            });
        };
        let field_text = match field {
            Value::String(field) => field.clone(),
            other => other.to_string(),
        };
        // PuppetDB turns dashes into underscores for `=` only.
        let field = match op {
            Op::Eq => field_text.replace('-', "_"),
            _ => field_text.clone(),
        };
        if !COUNT_FIELDS.contains(&field.as_str()) {
            return Err(match op {
                Op::Eq => CountsFilterError::EqualityField(field_text),
                _ => CountsFilterError::InequalityField {
                    op: op_text,
                    field: field_text,
                },
            });
        }
        let Value::Number(number) = operand else {
            return Err(CountsFilterError::NotANumber(operand.to_string()));
        };
        Ok(Some(CountsFilter {
            field,
            op,
            value: number.clone(),
        }))
    }

    /// The column the filter reads.
    pub(crate) fn field(&self) -> &str {
        &self.field
    }

    /// Whether a merged row whose `field()` total is `total` passes. A null or absent count
    /// never passes (SQL: a comparison with NULL is not true).
    pub(crate) fn accepts(&self, total: Total) -> bool {
        let Some(ordering) = compare(total, &self.value) else {
            return false;
        };
        match self.op {
            Op::Eq => ordering == Ordering::Equal,
            Op::Gt => ordering == Ordering::Greater,
            Op::Lt => ordering == Ordering::Less,
            Op::Ge => ordering != Ordering::Less,
            Op::Le => ordering != Ordering::Greater,
        }
    }
}

/// `total` against `value`: exactly for integers, in `f64` otherwise.
fn compare(total: Total, value: &Number) -> Option<Ordering> {
    let int = value
        .as_i64()
        .map(i128::from)
        .or_else(|| value.as_u64().map(i128::from));
    match (total, int) {
        (Total::Nothing, _) => None,
        (Total::Int(a), Some(b)) => Some(a.cmp(&b)),
        (total, _) => total.as_f64()?.partial_cmp(&value.as_f64()?),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Option<CountsFilter>, String> {
        CountsFilter::parse(text).map_err(|e| e.to_string())
    }

    fn accepts(text: &str, total: Total) -> bool {
        parse(text).expect("valid").expect("filter").accepts(total)
    }

    #[test]
    fn comparisons() {
        assert!(accepts(r#"[">","failures",0]"#, Total::Int(1)));
        assert!(!accepts(r#"[">","failures",0]"#, Total::Int(0)));
        assert!(accepts(r#"["=","skips",2]"#, Total::Int(2)));
        assert!(accepts(r#"["=","intentional-noops",2]"#, Total::Int(2)));
        assert!(accepts(r#"[">=","noops",2]"#, Total::Int(2)));
        assert!(accepts(r#"["<=","noops",2]"#, Total::Int(2)));
        assert!(!accepts(r#"["<","noops",2]"#, Total::Int(2)));
        assert!(accepts(r#"["<","noops",2.5]"#, Total::Int(2)));
        assert!(!accepts(r#"[">","failures",0]"#, Total::Nothing));
        assert!(accepts(r#"[">","failures",0]"#, Total::Float(0.5)));
        assert_eq!(
            parse(r#"[">","failures",0]"#)
                .expect("valid")
                .expect("filter")
                .field(),
            "failures"
        );
    }

    #[test]
    fn empty_is_no_filter() {
        assert_eq!(parse("[]"), Ok(None));
    }

    #[test]
    fn refusals_name_the_problem() {
        assert_eq!(
            parse(r#"["and",[">","failures",0]]"#),
            Err(
                r#"["and",[">","failures",0]] is not well-formed: query operator 'and' is unknown"#
                    .into()
            )
        );
        assert_eq!(
            parse(r#"["~","failures","0"]"#),
            Err(r#"["~","failures","0"] is not well-formed: query operator '~' is unknown"#.into())
        );
        assert_eq!(
            parse(r#"["=","failures"]"#),
            Err("= requires exactly two arguments, but 1 were supplied".into())
        );
        assert_eq!(
            parse(r#"[">","failures",1,2]"#),
            Err("> requires exactly two arguments, but 3 were supplied".into())
        );
        assert_eq!(
            parse(r#"["=","certname","a"]"#),
            Err("certname is not a queryable object for event counts".into())
        );
        assert_eq!(
            parse(r#"["<","certname",1]"#),
            Err("< operator does not support object 'certname' for event counts".into())
        );
        assert_eq!(
            parse(r#"[">","failures","0"]"#),
            Err("counts_filter value \"0\" is not a number".into())
        );
        assert_eq!(
            parse(r#"{"a":1}"#),
            Err("counts_filter must be a json array, not {\"a\":1}".into())
        );
        assert!(parse("[")
            .expect_err("bad")
            .starts_with("counts_filter is not valid json"));
    }
}
