//! PostgreSQL's sort order for PuppetDB records (docs/decisions.md D11), written independently of
//! pdbmux so the tests can compute the window a merged, re-paged answer must hold.
//!
//! The rules, as PostgreSQL applies them to the columns PuppetDB orders by:
//! - SQL NULL (a JSON `null` or a missing field) sorts after every value ascending and before
//!   every value descending (PostgreSQL's default: `NULLS LAST` for `ASC`, `NULLS FIRST` for
//!   `DESC`);
//! - strings byte-wise (the C collation of the e2e databases), except timestamps
//!   (`YYYY-MM-DDTHH:MM:SS[.fff]Z`), which compare as instants;
//! - numbers numerically, booleans `false` before `true`;
//! - values of different JSON types (a jsonb column such as a fact's `value`) in jsonb's order:
//!   string < number < boolean < array < object. Arrays and objects of the same type compare by
//!   length first, then element-wise (arrays) or by their canonical text (objects; an
//!   approximation of jsonb's key-by-key order, good enough for the fixture's values).

use std::cmp::Ordering;

use serde_json::Value;

use crate::epoch_seconds;

/// One `order_by` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OrderField {
    /// The field name.
    pub field: String,
    /// `"order": "desc"`.
    pub descending: bool,
}

impl OrderField {
    /// Ascending on `field`.
    pub fn asc(field: &str) -> Self {
        Self {
            field: field.to_owned(),
            descending: false,
        }
    }

    /// Descending on `field`.
    pub fn desc(field: &str) -> Self {
        Self {
            field: field.to_owned(),
            descending: true,
        }
    }
}

/// The `order_by` parameter text for a list of fields.
pub fn order_by_param(fields: &[OrderField]) -> String {
    let entries: Vec<Value> = fields
        .iter()
        .map(|f| {
            serde_json::json!({
                "field": f.field,
                "order": if f.descending { "desc" } else { "asc" },
            })
        })
        .collect();
    Value::Array(entries).to_string()
}

/// A PuppetDB timestamp as (seconds since the epoch, nanoseconds); None for anything else.
pub fn instant(ts: &str) -> Option<(i64, u32)> {
    if ts.len() < 20 || !ts.ends_with('Z') {
        return None;
    }
    let secs = epoch_seconds(&format!("{}Z", ts.get(..19)?))?;
    let rest = &ts[19..ts.len() - 1];
    let nanos = if rest.is_empty() {
        0
    } else {
        let digits = rest.strip_prefix('.')?;
        if digits.is_empty() || digits.len() > 9 || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let padded = format!("{digits:0<9}");
        padded.parse().ok()?
    };
    Some((secs, nanos))
}

fn jsonb_rank(v: &Value) -> u8 {
    match v {
        Value::Null => 0,
        Value::String(_) => 1,
        Value::Number(_) => 2,
        Value::Bool(_) => 3,
        Value::Array(_) => 4,
        Value::Object(_) => 5,
    }
}

/// Two non-null values, ascending.
fn compare_present(a: &Value, b: &Value) -> Ordering {
    match (a, b) {
        (Value::String(x), Value::String(y)) => match (instant(x), instant(y)) {
            (Some(p), Some(q)) => p.cmp(&q),
            _ => x.as_bytes().cmp(y.as_bytes()),
        },
        (Value::Number(x), Value::Number(y)) => match (x.as_i64(), y.as_i64()) {
            (Some(p), Some(q)) => p.cmp(&q),
            _ => x
                .as_f64()
                .unwrap_or(f64::NAN)
                .partial_cmp(&y.as_f64().unwrap_or(f64::NAN))
                .unwrap_or(Ordering::Equal),
        },
        (Value::Bool(x), Value::Bool(y)) => x.cmp(y),
        (Value::Array(x), Value::Array(y)) => x.len().cmp(&y.len()).then_with(|| {
            x.iter()
                .zip(y)
                .map(|(p, q)| compare_values(Some(p), Some(q)))
                .find(|o| o.is_ne())
                .unwrap_or(Ordering::Equal)
        }),
        (Value::Object(x), Value::Object(y)) => x
            .len()
            .cmp(&y.len())
            .then_with(|| a.to_string().cmp(&b.to_string())),
        _ => jsonb_rank(a).cmp(&jsonb_rank(b)),
    }
}

/// Two field values, ascending, NULL (None or JSON null) last.
pub fn compare_values(a: Option<&Value>, b: Option<&Value>) -> Ordering {
    let a = a.filter(|v| !v.is_null());
    let b = b.filter(|v| !v.is_null());
    match (a, b) {
        (None, None) => Ordering::Equal,
        (None, Some(_)) => Ordering::Greater,
        (Some(_), None) => Ordering::Less,
        (Some(x), Some(y)) => compare_present(x, y),
    }
}

/// Two records by an order_by list (a descending field reverses its whole comparison, so its
/// NULLs come first).
pub fn compare_records(a: &Value, b: &Value, order: &[OrderField]) -> Ordering {
    for f in order {
        let o = compare_values(a.get(&f.field), b.get(&f.field));
        let o = if f.descending { o.reverse() } else { o };
        if o.is_ne() {
            return o;
        }
    }
    Ordering::Equal
}

/// Sorts records by an order_by list (stable).
pub fn sort_records(records: &mut [Value], order: &[OrderField]) {
    records.sort_by(|a, b| compare_records(a, b, order));
}

/// Whether no two records share every ordered field's value (the order is total on them).
pub fn order_is_total(sorted: &[Value], order: &[OrderField]) -> bool {
    sorted
        .windows(2)
        .all(|w| compare_records(&w[0], &w[1], order).is_ne())
}

/// Each record's values of the ordered fields (missing as null): what a window's order is
/// checked on when ties make the records themselves ambiguous.
pub fn sort_keys(records: &[Value], order: &[OrderField]) -> Vec<Vec<Value>> {
    records
        .iter()
        .map(|r| {
            order
                .iter()
                .map(|f| r.get(&f.field).cloned().unwrap_or(Value::Null))
                .collect()
        })
        .collect()
}

/// The `offset`/`limit` window of a list.
pub fn window<T: Clone>(items: &[T], offset: usize, limit: Option<usize>) -> Vec<T> {
    items
        .iter()
        .skip(offset)
        .take(limit.unwrap_or(usize::MAX))
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn timestamps_compare_as_instants() {
        assert_eq!(
            instant("2024-03-01T12:30:15.123Z"),
            Some((1_709_296_215, 123_000_000))
        );
        assert_eq!(instant("2024-03-01T12:30:15Z"), Some((1_709_296_215, 0)));
        assert_eq!(instant("web1.example.com"), None);
        assert_eq!(
            compare_values(
                Some(&json!("2024-03-01T12:30:15.5Z")),
                Some(&json!("2024-03-01T12:30:15.123Z"))
            ),
            Ordering::Greater
        );
    }

    #[test]
    fn null_is_last_ascending_and_first_descending() {
        let mut v = vec![
            json!({"t": null, "c": "a"}),
            json!({"t": "2024-03-01T12:30:15.000Z", "c": "b"}),
            json!({"c": "c"}),
            json!({"t": "2024-03-01T11:30:15.000Z", "c": "d"}),
        ];
        sort_records(&mut v, &[OrderField::asc("t"), OrderField::asc("c")]);
        let cs: Vec<&str> = v.iter().filter_map(|r| r["c"].as_str()).collect();
        assert_eq!(cs, ["d", "b", "a", "c"]);
        sort_records(&mut v, &[OrderField::desc("t"), OrderField::asc("c")]);
        let cs: Vec<&str> = v.iter().filter_map(|r| r["c"].as_str()).collect();
        assert_eq!(cs, ["a", "c", "b", "d"]);
    }

    #[test]
    fn strings_bytewise_numbers_numerically_jsonb_by_type() {
        let lt = |a: Value, b: Value| compare_values(Some(&a), Some(&b)) == Ordering::Less;
        assert!(lt(json!("Z"), json!("a")));
        assert!(lt(json!("a-b"), json!("a.b")));
        assert!(lt(json!(9), json!(10)));
        assert!(lt(json!(2.5), json!(10)));
        assert!(lt(json!(false), json!(true)));
        assert!(lt(json!("zzz"), json!(1)));
        assert!(lt(json!(1), json!(false)));
        assert!(lt(json!(true), json!([])));
        assert!(lt(json!(["x", "y"]), json!({})));
    }

    #[test]
    fn windows_and_params() {
        assert_eq!(window(&[1, 2, 3, 4], 1, Some(2)), vec![2, 3]);
        assert_eq!(window(&[1, 2, 3, 4], 3, None), vec![4]);
        assert_eq!(window(&[1, 2], 5, Some(2)), Vec::<i32>::new());
        assert_eq!(
            order_by_param(&[OrderField::desc("end_time"), OrderField::asc("hash")]),
            r#"[{"field":"end_time","order":"desc"},{"field":"hash","order":"asc"}]"#
        );
    }
}
