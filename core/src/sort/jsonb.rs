//! PostgreSQL's `jsonb` ordering, for the jsonb columns PuppetDB orders by (facts `value`,
//! resources `parameters`, factsets `facts`, inventory `facts`/`trusted`).
//!
//! PostgreSQL documents the order in "jsonb Indexing" (section 8.14.4 of the manual):
//! `Object > Array > Boolean > Number > String > Null`; an object with n pairs sorts after one
//! with n - 1 pairs, and objects with equal pair counts compare key-1, value-1, key-2, ... with
//! keys in their *storage* order (shorter keys first, then bytes); arrays likewise compare their
//! length first, then element by element; "except that (for historical reasons) an empty top
//! level array sorts less than null". This module follows the implementation behind that text,
//! `compareJsonbContainers` in `src/backend/utils/adt/jsonb_util.c`: a top-level scalar is stored
//! as a one-element "raw scalar" array, which sorts after an empty array, before any other array,
//! and before any object. Strings (keys included) compare byte-wise, which is the C collation;
//! under another database collation PostgreSQL can order strings differently. Numbers compare
//! numerically (PostgreSQL uses `numeric`; here i64/u64/f64, so only digits beyond f64 precision
//! can differ).

use std::cmp::Ordering;
use std::fmt;

use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};

use super::Num;

/// A parsed JSON value held the way `jsonb` stores it: object keys in storage order, unique.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Jsonb {
    /// JSON `null` (a jsonb null, not SQL NULL).
    Null,
    /// A string.
    Str(Box<str>),
    /// A number.
    Num(Num),
    /// A boolean.
    Bool(bool),
    /// An array.
    Arr(Box<[Jsonb]>),
    /// An object: keys sorted by (byte length, bytes), duplicates resolved to the last value.
    Obj(Box<[(Box<str>, Jsonb)]>),
}

impl Jsonb {
    /// PostgreSQL's `JsonbValue` type order for nested values: `jbvNull < jbvString < jbvNumeric <
    /// jbvBool < jbvArray < jbvObject`.
    fn type_rank(&self) -> u8 {
        match self {
            Jsonb::Null => 0,
            Jsonb::Str(_) => 1,
            Jsonb::Num(_) => 2,
            Jsonb::Bool(_) => 3,
            Jsonb::Arr(_) => 0x10,
            Jsonb::Obj(_) => 0x11,
        }
    }

    /// Builds an object the way jsonb stores it: sorted by key length then bytes; of equal keys
    /// the last one wins (`uniqueifyJsonbObject`).
    fn object(mut pairs: Vec<(Box<str>, Jsonb)>) -> Jsonb {
        // Stable: equal keys stay in input order, so keeping the last of each run keeps the last.
        pairs.sort_by(|a, b| storage_key_order(&a.0, &b.0));
        let mut out: Vec<(Box<str>, Jsonb)> = Vec::with_capacity(pairs.len());
        for pair in pairs {
            match out.last_mut() {
                Some(last) if last.0 == pair.0 => *last = pair,
                _ => out.push(pair),
            }
        }
        Jsonb::Obj(out.into_boxed_slice())
    }
}

/// jsonb's key storage order (`lengthCompareJsonbStringValue`): shorter first, then bytes.
fn storage_key_order(a: &str, b: &str) -> Ordering {
    a.len()
        .cmp(&b.len())
        .then_with(|| a.as_bytes().cmp(b.as_bytes()))
}

/// Compares two column values as PostgreSQL's `jsonb` `<`/`>` do (`compareJsonbContainers`).
pub(super) fn cmp_top(a: &Jsonb, b: &Jsonb) -> Ordering {
    match (a, b) {
        (Jsonb::Obj(_), Jsonb::Obj(_)) => cmp_nested(a, b),
        (Jsonb::Obj(_), _) => Ordering::Greater,
        (_, Jsonb::Obj(_)) => Ordering::Less,
        (Jsonb::Arr(x), Jsonb::Arr(y)) => cmp_nested_arrays(x, y),
        // A scalar is a one-element raw-scalar array: `rawScalar` says "less", but a differing
        // element count overrides it, so a scalar sorts after `[]` and before any other array.
        (Jsonb::Arr(y), _) => {
            if y.is_empty() {
                Ordering::Less
            } else {
                Ordering::Greater
            }
        }
        (_, Jsonb::Arr(x)) => {
            if x.is_empty() {
                Ordering::Greater
            } else {
                Ordering::Less
            }
        }
        _ => cmp_nested(a, b),
    }
}

/// Compares values below the top level: type rank first, then within the type.
fn cmp_nested(a: &Jsonb, b: &Jsonb) -> Ordering {
    match (a, b) {
        (Jsonb::Null, Jsonb::Null) => Ordering::Equal,
        (Jsonb::Str(x), Jsonb::Str(y)) => x.as_bytes().cmp(y.as_bytes()),
        (Jsonb::Num(x), Jsonb::Num(y)) => x.compare(y),
        (Jsonb::Bool(x), Jsonb::Bool(y)) => x.cmp(y),
        (Jsonb::Arr(x), Jsonb::Arr(y)) => cmp_nested_arrays(x, y),
        (Jsonb::Obj(x), Jsonb::Obj(y)) => x.len().cmp(&y.len()).then_with(|| {
            for ((ka, va), (kb, vb)) in x.iter().zip(y.iter()) {
                let ord = ka
                    .as_bytes()
                    .cmp(kb.as_bytes())
                    .then_with(|| cmp_nested(va, vb));
                if ord != Ordering::Equal {
                    return ord;
                }
            }
            Ordering::Equal
        }),
        _ => a.type_rank().cmp(&b.type_rank()),
    }
}

fn cmp_nested_arrays(x: &[Jsonb], y: &[Jsonb]) -> Ordering {
    x.len().cmp(&y.len()).then_with(|| {
        for (ea, eb) in x.iter().zip(y.iter()) {
            let ord = cmp_nested(ea, eb);
            if ord != Ordering::Equal {
                return ord;
            }
        }
        Ordering::Equal
    })
}

impl<'de> Deserialize<'de> for Jsonb {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(JsonbVisitor)
    }
}

struct JsonbVisitor;

impl<'de> Visitor<'de> for JsonbVisitor {
    type Value = Jsonb;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_unit<E>(self) -> Result<Jsonb, E> {
        Ok(Jsonb::Null)
    }

    fn visit_bool<E>(self, v: bool) -> Result<Jsonb, E> {
        Ok(Jsonb::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Jsonb, E> {
        Ok(Jsonb::Num(Num::I(v)))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Jsonb, E> {
        Ok(Jsonb::Num(Num::from_u64(v)))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Jsonb, E> {
        Ok(Jsonb::Num(Num::F(v)))
    }

    fn visit_str<E>(self, v: &str) -> Result<Jsonb, E> {
        Ok(Jsonb::Str(v.into()))
    }

    fn visit_string<E>(self, v: String) -> Result<Jsonb, E> {
        Ok(Jsonb::Str(v.into_boxed_str()))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Jsonb, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element::<Jsonb>()? {
            items.push(item);
        }
        Ok(Jsonb::Arr(items.into_boxed_slice()))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Jsonb, A::Error> {
        let mut pairs = Vec::new();
        while let Some((k, v)) = map.next_entry::<String, Jsonb>()? {
            pairs.push((k.into_boxed_str(), v));
        }
        Ok(Jsonb::object(pairs))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn j(raw: &str) -> Jsonb {
        serde_json::from_str(raw).expect("test JSON")
    }

    fn lt(a: &str, b: &str) {
        assert_eq!(cmp_top(&j(a), &j(b)), Ordering::Less, "{a} < {b}");
        assert_eq!(cmp_top(&j(b), &j(a)), Ordering::Greater, "{b} > {a}");
    }

    #[test]
    fn documented_type_order() {
        // Object > Array > Boolean > Number > String > Null, and [] below null.
        let ascending = [
            "[]",
            "null",
            r#""""#,
            r#""a""#,
            "-1",
            "0",
            "2.5",
            "10",
            "false",
            "true",
            "[null]",
            "[1]",
            "[1,2]",
            "{}",
            r#"{"a":1}"#,
        ];
        for pair in ascending.windows(2) {
            lt(pair[0], pair[1]);
        }
    }

    #[test]
    fn postgres_15_order_sample() {
        // A sample, in order, of 3014 random values PostgreSQL 15 sorted with `ORDER BY v`
        // (jsonb); this comparator reproduced the whole sorted list.
        let ascending = [
            "[]",
            "null",
            r#""""#,
            r#""10""#,
            r#""A""#,
            r#""Z""#,
            r#""_""#,
            r#""a b""#,
            r#""ab""#,
            r#""z""#,
            "-1",
            "1",
            "3",
            "1e+20",
            "false",
            "true",
            "[10]",
            r#"[{"": "b", "é": {"a": "z"}}]"#,
            "[-0.5, 0]",
            r#"[{"a": ["A"]}, []]"#,
            r#"[-0.5, 3, [null, "B", null]]"#,
            r#"[{}, false, ["10", true]]"#,
            "{}",
            r#"{"a": "ab"}"#,
            r#"{"c": "a"}"#,
            r#"{"B": null, "bb": "b"}"#,
            r#"{"aa": [["_", "A"]], "bb": "z"}"#,
            r#"{"bb": [], "aa": "", "c": "0"}"#,
        ];
        for pair in ascending.windows(2) {
            lt(pair[0], pair[1]);
        }
    }

    #[test]
    fn documented_examples() {
        // The manual's example: {"aa": 1, "c": 1} > {"b": 1, "d": 1}.
        lt(r#"{"b":1,"d":1}"#, r#"{"aa":1,"c":1}"#);
        // More pairs sort later regardless of content.
        lt(r#"{"z":{"z":1}}"#, r#"{"a":1,"b":1}"#);
        // Longer arrays sort later regardless of content.
        lt(r#"["z","z"]"#, "[1,2,3]");
        lt("[[9]]", "[1,2]");
    }

    #[test]
    fn within_a_type() {
        lt("9", "10");
        lt("1", "1.5");
        lt(r#""B""#, r#""a""#);
        lt(r#""a""#, r#""ab""#);
        lt(r#"{"a":1}"#, r#"{"b":0}"#);
        lt(r#"{"a":1}"#, r#"{"a":2}"#);
        // Keys of two objects compare byte-wise (storage order only decides which keys meet).
        lt(r#"{"aa":"x"}"#, r#"{"b":"x"}"#);
        // Nested: scalars sort below containers, whatever the scalar.
        lt(r#"[true]"#, r#"[[]]"#);
        lt(r#"[[1,2]]"#, r#"[{}]"#);
        lt(r#"[null]"#, r#"[""]"#);
        // Nested, even an empty array sorts above every scalar.
        lt(r#"{"a":1}"#, r#"{"a":[]}"#);
        // A top-level scalar is below any non-empty array, even [null].
        lt("true", "[null]");
        assert_eq!(cmp_top(&j("1"), &j("1.0")), Ordering::Equal);
        assert_eq!(cmp_top(&j("-0.0"), &j("0")), Ordering::Equal);
        // Duplicate keys: the last value wins, as jsonb keeps it.
        assert_eq!(
            cmp_top(&j(r#"{"a":1,"a":2}"#), &j(r#"{"a":2}"#)),
            Ordering::Equal
        );
        // Storage order, not input order.
        assert_eq!(
            cmp_top(&j(r#"{"bb":1,"a":2}"#), &j(r#"{"a":2,"bb":1}"#)),
            Ordering::Equal
        );
    }

    // ---- an independent model: PostgreSQL's token-stream comparison, literally ----

    #[derive(Debug, Clone, PartialEq)]
    enum Tok {
        BeginArray { raw_scalar: bool, n: usize },
        BeginObject { n: usize },
        Key(String),
        Value(serde_json::Value),
        Elem(serde_json::Value),
        EndArray,
        EndObject,
    }

    fn jbv_type(v: &serde_json::Value) -> u8 {
        match v {
            serde_json::Value::Null => 0,
            serde_json::Value::String(_) => 1,
            serde_json::Value::Number(_) => 2,
            serde_json::Value::Bool(_) => 3,
            serde_json::Value::Array(_) => 0x10,
            serde_json::Value::Object(_) => 0x11,
        }
    }

    fn tokens(v: &serde_json::Value, top: bool, out: &mut Vec<Tok>) {
        use serde_json::Value as V;
        match v {
            V::Array(items) => {
                out.push(Tok::BeginArray {
                    raw_scalar: false,
                    n: items.len(),
                });
                for item in items {
                    if item.is_array() || item.is_object() {
                        tokens(item, false, out);
                    } else {
                        out.push(Tok::Elem(item.clone()));
                    }
                }
                out.push(Tok::EndArray);
            }
            V::Object(map) => {
                out.push(Tok::BeginObject { n: map.len() });
                let mut keys: Vec<&String> = map.keys().collect();
                keys.sort_by(|a, b| a.len().cmp(&b.len()).then(a.cmp(b)));
                for k in keys {
                    out.push(Tok::Key(k.clone()));
                    let val = &map[k];
                    if val.is_array() || val.is_object() {
                        tokens(val, false, out);
                    } else {
                        out.push(Tok::Value(val.clone()));
                    }
                }
                out.push(Tok::EndObject);
            }
            scalar => {
                assert!(top);
                out.push(Tok::BeginArray {
                    raw_scalar: true,
                    n: 1,
                });
                out.push(Tok::Elem(scalar.clone()));
                out.push(Tok::EndArray);
            }
        }
    }

    fn tok_type(t: &Tok) -> u8 {
        match t {
            Tok::BeginArray { .. } => 0x10,
            Tok::BeginObject { .. } => 0x11,
            Tok::Key(_) => 1,
            Tok::Value(v) | Tok::Elem(v) => jbv_type(v),
            Tok::EndArray | Tok::EndObject => 0xff,
        }
    }

    fn kind(t: &Tok) -> u8 {
        match t {
            Tok::BeginArray { .. } => 0,
            Tok::BeginObject { .. } => 1,
            Tok::Key(_) => 2,
            Tok::Value(_) => 3,
            Tok::Elem(_) => 4,
            Tok::EndArray => 5,
            Tok::EndObject => 6,
        }
    }

    fn scalar_cmp(a: &serde_json::Value, b: &serde_json::Value) -> Ordering {
        use serde_json::Value as V;
        match (a, b) {
            (V::String(x), V::String(y)) => x.as_bytes().cmp(y.as_bytes()),
            (V::Number(x), V::Number(y)) => {
                let (x, y) = (x.as_f64().unwrap_or(0.0), y.as_f64().unwrap_or(0.0));
                x.partial_cmp(&y).unwrap_or(Ordering::Equal)
            }
            (V::Bool(x), V::Bool(y)) => x.cmp(y),
            _ => Ordering::Equal,
        }
    }

    /// `compareJsonbContainers`, transcribed.
    fn pg_compare(a: &serde_json::Value, b: &serde_json::Value) -> Ordering {
        let (mut ta, mut tb) = (Vec::new(), Vec::new());
        tokens(a, true, &mut ta);
        tokens(b, true, &mut tb);
        for (x, y) in ta.iter().zip(tb.iter()) {
            let res = if kind(x) == kind(y) {
                match (x, y) {
                    (Tok::EndArray, _) | (Tok::EndObject, _) => Ordering::Equal,
                    (
                        Tok::BeginArray {
                            raw_scalar: ra,
                            n: na,
                        },
                        Tok::BeginArray {
                            raw_scalar: rb,
                            n: nb,
                        },
                    ) => {
                        let mut r = Ordering::Equal;
                        if ra != rb {
                            r = if *ra {
                                Ordering::Less
                            } else {
                                Ordering::Greater
                            };
                        }
                        if na != nb {
                            r = na.cmp(nb);
                        }
                        r
                    }
                    (Tok::BeginObject { n: na }, Tok::BeginObject { n: nb }) => na.cmp(nb),
                    (Tok::Key(p), Tok::Key(q)) => p.as_bytes().cmp(q.as_bytes()),
                    (Tok::Value(p), Tok::Value(q)) | (Tok::Elem(p), Tok::Elem(q)) => {
                        if jbv_type(p) == jbv_type(q) {
                            scalar_cmp(p, q)
                        } else {
                            jbv_type(p).cmp(&jbv_type(q))
                        }
                    }
                    _ => unreachable!(),
                }
            } else {
                tok_type(x).cmp(&tok_type(y))
            };
            if res != Ordering::Equal {
                return res;
            }
        }
        Ordering::Equal
    }

    fn arb_json() -> impl Strategy<Value = serde_json::Value> {
        let leaf = prop_oneof![
            Just(serde_json::Value::Null),
            any::<bool>().prop_map(serde_json::Value::Bool),
            (-3i64..4).prop_map(|n| serde_json::json!(n)),
            prop_oneof![Just(0.5f64), Just(-1.5), Just(2.0)].prop_map(|f| serde_json::json!(f)),
            "[aAbB]{0,2}".prop_map(serde_json::Value::String),
        ];
        leaf.prop_recursive(3, 16, 3, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..3).prop_map(serde_json::Value::Array),
                prop::collection::btree_map("[ab]{1,2}", inner, 0..3)
                    .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        #[test]
        fn matches_postgres_token_comparison(a in arb_json(), b in arb_json()) {
            let (ja, jb) = (j(&a.to_string()), j(&b.to_string()));
            prop_assert_eq!(cmp_top(&ja, &jb), pg_compare(&a, &b));
        }

        #[test]
        fn is_a_total_order(a in arb_json(), b in arb_json(), c in arb_json()) {
            let (ja, jb, jc) = (j(&a.to_string()), j(&b.to_string()), j(&c.to_string()));
            prop_assert_eq!(cmp_top(&ja, &jb), cmp_top(&jb, &ja).reverse());
            if cmp_top(&ja, &jb) != Ordering::Greater && cmp_top(&jb, &jc) != Ordering::Greater {
                prop_assert_ne!(cmp_top(&ja, &jc), Ordering::Greater);
            }
        }
    }
}
