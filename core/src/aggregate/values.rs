//! One aggregate column's values folded across backends: additive totals (`count`, `sum`),
//! extremes (`min`, `max`), canonical key text, and the JSON text of a folded number.

use std::cmp::Ordering;

use serde_json::value::RawValue;
use serde_json::{Number, Value};

use crate::entity::ColumnKind;
use crate::sort::{self, Direction, OrderBy, OrderField, SortKey};

/// A running total of a `count` or `sum` column: integers stay integers (exactly, up to 2^127)
/// until a float appears, then the whole total is an `f64`. Null and absent values are never
/// added, so a total nothing contributed to stays [`Total::Nothing`] and is written as `null`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(super) enum Total {
    #[default]
    Nothing,
    Int(i128),
    Float(f64),
}

impl Total {
    /// Adds one backend's value.
    pub(super) fn add(self, value: &Number) -> Total {
        let int = value
            .as_i64()
            .map(i128::from)
            .or_else(|| value.as_u64().map(i128::from));
        match (self, int) {
            (Total::Nothing, Some(b)) => Total::Int(b),
            (Total::Int(a), Some(b)) => match a.checked_add(b) {
                Some(sum) => Total::Int(sum),
                None => Total::Float(a as f64 + b as f64),
            },
            (total, _) => Total::Float(total.as_f64().unwrap_or(0.0) + number_f64(value)),
        }
    }

    /// Adds one backend's value `weight` times: a negative weight takes off what a correction
    /// says was counted too often (docs/merging.md, "Corrections").
    pub(super) fn add_times(self, value: &Number, weight: i64) -> Total {
        if weight == 1 {
            return self.add(value);
        }
        let int = value
            .as_i64()
            .map(i128::from)
            .or_else(|| value.as_u64().map(i128::from));
        match (self, int.and_then(|v| v.checked_mul(i128::from(weight)))) {
            (Total::Nothing, Some(b)) => Total::Int(b),
            (Total::Int(a), Some(b)) => match a.checked_add(b) {
                Some(sum) => Total::Int(sum),
                None => Total::Float(a as f64 + b as f64),
            },
            (total, _) => {
                Total::Float(total.as_f64().unwrap_or(0.0) + number_f64(value) * weight as f64)
            }
        }
    }

    /// Whether the total is zero (or nothing was added).
    pub(super) fn is_zero(self) -> bool {
        match self {
            Total::Nothing => true,
            Total::Int(i) => i == 0,
            Total::Float(f) => f == 0.0,
        }
    }

    /// The total as a float (`None` when nothing was added).
    pub(super) fn as_f64(self) -> Option<f64> {
        match self {
            Total::Nothing => None,
            Total::Int(i) => Some(i as f64),
            Total::Float(f) => Some(f),
        }
    }

    /// The JSON text of the total.
    pub(super) fn json(self) -> String {
        match self {
            Total::Nothing => "null".to_owned(),
            Total::Int(i) => i.to_string(),
            Total::Float(f) => float_json(f),
        }
    }
}

/// A number's value as `f64` (exact for the integers and floats serde_json reads).
fn number_f64(value: &Number) -> f64 {
    value.as_f64().unwrap_or(0.0)
}

/// The JSON text of a float; `null` for NaN or an infinity, which JSON cannot carry.
pub(super) fn float_json(f: f64) -> String {
    Number::from_f64(f).map_or_else(|| "null".to_owned(), |n| n.to_string())
}

/// `sum / count` in `f64`, the folded `avg`; `None` (null) when no value was counted.
pub(super) fn average(sum: Total, count: Total) -> Option<f64> {
    let count = count.as_f64().filter(|c| *c > 0.0)?;
    Some(sum.as_f64()? / count)
}

/// The most extreme non-null value of a `min` or `max` column, kept raw so it is written back
/// byte for byte. Values compare as PostgreSQL compares the column ([`sort::compare`], D11):
/// numbers numerically, text byte-wise, timestamps as instants.
#[derive(Debug)]
pub(super) struct Extreme<'a> {
    best: Option<(&'a RawValue, SortKey)>,
}

impl<'a> Extreme<'a> {
    pub(super) fn new() -> Extreme<'a> {
        Extreme { best: None }
    }

    /// Offers one backend's value; `want` is `Less` for `min` and `Greater` for `max`. A null
    /// is skipped, never an extreme.
    pub(super) fn offer(&mut self, raw: &'a RawValue, order: &OrderBy, want: Ordering) {
        if is_null(raw) {
            return;
        }
        let key = sort::sort_key(order, |_| Some(raw));
        let better = match &self.best {
            None => true,
            Some((_, best)) => sort::compare(&key, best, order) == want,
        };
        if better {
            self.best = Some((raw, key));
        }
    }

    /// The JSON text of the extreme (`null` when every value was null or absent).
    pub(super) fn json(&self) -> &str {
        self.best.as_ref().map_or("null", |(raw, _)| raw.get())
    }
}

/// A one-field ascending order comparing values of `kind`, for [`Extreme::offer`].
pub(super) fn value_order(kind: ColumnKind) -> OrderBy {
    // jsonb and array columns are never min/max results PuppetDB can produce (facts `value` is
    // cast to numeric), so they compare by JSON type like any other value.
    let kind = match kind {
        ColumnKind::Jsonb | ColumnKind::JsonText | ColumnKind::TextArray => ColumnKind::Other,
        kind => kind,
    };
    OrderBy {
        fields: vec![OrderField {
            field: String::new(),
            direction: Direction::Ascending,
            kind,
        }],
    }
}

/// Whether a raw value is JSON `null`.
pub(super) fn is_null(raw: &RawValue) -> bool {
    raw.get().trim() == "null"
}

/// A JSON value's canonical text (object keys sorted, no whitespace), so equal values from two
/// backends key the same group whatever their formatting.
pub(super) fn canonical(raw: &RawValue) -> String {
    let mut out = String::new();
    match serde_json::from_str::<Value>(raw.get()) {
        Ok(value) => write_canonical(&value, &mut out),
        Err(_) => out.push_str(raw.get()),
    }
    out
}

/// [`canonical`] of a value pdbmux built itself.
pub(super) fn canonical_value(value: &Value) -> String {
    let mut out = String::new();
    write_canonical(value, &mut out);
    out
}

fn write_canonical(value: &Value, out: &mut String) {
    match value {
        Value::Array(items) => {
            out.push('[');
            for (index, item) in items.iter().enumerate() {
                if index > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        Value::Object(map) => {
            let mut entries: Vec<_> = map.iter().collect();
            entries.sort_by(|a, b| a.0.cmp(b.0));
            out.push('{');
            for (index, (key, item)) in entries.into_iter().enumerate() {
                if index > 0 {
                    out.push(',');
                }
                out.push_str(&Value::from(key.as_str()).to_string());
                out.push(':');
                write_canonical(item, out);
            }
            out.push('}');
        }
        scalar => out.push_str(&scalar.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(text: &str) -> Box<RawValue> {
        RawValue::from_string(text.to_owned()).expect("json")
    }

    fn num(text: &str) -> Number {
        serde_json::from_str(text).expect("number")
    }

    #[test]
    fn totals_stay_integers_until_a_float() {
        let total = Total::Nothing.add(&num("2")).add(&num("3"));
        assert_eq!(total.json(), "5");
        assert_eq!(total.add(&num("0.5")).json(), "5.5");
        assert_eq!(Total::Nothing.json(), "null");
        let big = Total::Nothing
            .add(&num("18446744073709551615"))
            .add(&num("18446744073709551615"));
        assert_eq!(big.json(), "36893488147419103230");
        assert_eq!(Total::Nothing.add(&num("1.0")).json(), "1.0");
    }

    #[test]
    fn averages() {
        let sum = Total::Int(7);
        assert_eq!(average(sum, Total::Int(2)), Some(3.5));
        assert_eq!(average(sum, Total::Int(0)), None);
        assert_eq!(average(Total::Nothing, Total::Int(0)), None);
        assert_eq!(float_json(3.5), "3.5");
        assert_eq!(float_json(4.0), "4.0");
        assert_eq!(float_json(f64::NAN), "null");
    }

    #[test]
    fn extremes_skip_nulls_and_compare_by_kind() {
        let values = [raw("null"), raw("\"b\""), raw("\"B\""), raw("\"a\"")];
        let order = value_order(ColumnKind::Text);
        let mut min = Extreme::new();
        let mut max = Extreme::new();
        for value in &values {
            min.offer(value, &order, Ordering::Less);
            max.offer(value, &order, Ordering::Greater);
        }
        // Byte-wise: "B" < "a" < "b".
        assert_eq!(min.json(), "\"B\"");
        assert_eq!(max.json(), "\"b\"");
        assert_eq!(Extreme::new().json(), "null");

        let stamps = [
            raw("\"2026-01-01T10:00:00.000Z\""),
            raw("\"2026-01-01T09:30:00.000-01:00\""),
        ];
        let order = value_order(ColumnKind::Timestamp);
        let mut max = Extreme::new();
        for value in &stamps {
            max.offer(value, &order, Ordering::Greater);
        }
        assert_eq!(max.json(), "\"2026-01-01T09:30:00.000-01:00\"");

        let numbers = [raw("10"), raw("9.5"), raw("100")];
        let order = value_order(ColumnKind::Other);
        let mut min = Extreme::new();
        for value in &numbers {
            min.offer(value, &order, Ordering::Less);
        }
        assert_eq!(min.json(), "9.5");
    }

    #[test]
    fn canonical_sorts_keys_and_drops_whitespace() {
        assert_eq!(
            canonical(&raw(r#"{ "b": [1, 2], "a": "x" }"#)),
            r#"{"a":"x","b":[1,2]}"#
        );
        assert_eq!(canonical(&raw("null")), "null");
    }
}
