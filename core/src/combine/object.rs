//! A raw JSON object read in key order, values left raw: what a combined row is rebuilt from.
//!
//! [`crate::records::Fields`] answers lookups only; a folded row is written back in the first
//! backend's key order, so the combiners need the keys in order.

use std::borrow::Cow;
use std::fmt;

use serde::de::{Deserializer, MapAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;

/// The top-level entries of one JSON object, in order.
#[derive(Debug, Default)]
pub(super) struct Object<'a>(pub(super) Vec<(Cow<'a, str>, &'a RawValue)>);

impl<'a> Object<'a> {
    /// Reads a record; `None` when it is not an object.
    pub(super) fn of(raw: &'a RawValue) -> Option<Object<'a>> {
        serde_json::from_str(raw.get()).ok()
    }

    /// The raw value of `name`, if present.
    pub(super) fn get(&self, name: &str) -> Option<&'a RawValue> {
        self.0
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| *value)
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Object<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ObjectVisitor;
        impl<'de> Visitor<'de> for ObjectVisitor {
            type Value = Object<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<M: MapAccess<'de>>(self, mut map: M) -> Result<Self::Value, M::Error> {
                let mut entries = Vec::with_capacity(map.size_hint().unwrap_or(8));
                while let Some(key) = map.next_key::<Cow<'de, str>>()? {
                    let value: &'de RawValue = map.next_value()?;
                    entries.push((key, value));
                }
                Ok(Object(entries))
            }
        }
        deserializer.deserialize_map(ObjectVisitor)
    }
}

/// Writes a JSON object from `(key, raw JSON text)` pairs.
pub(super) fn write_object<'k>(entries: impl IntoIterator<Item = (&'k str, String)>) -> String {
    let mut out = String::from("{");
    for (index, (key, value)) in entries.into_iter().enumerate() {
        if index > 0 {
            out.push(',');
        }
        out.push_str(&serde_json::Value::from(key).to_string());
        out.push(':');
        out.push_str(&value);
    }
    out.push('}');
    out
}

/// A written row as a raw value (the text is always one JSON object).
pub(super) fn into_raw(text: String) -> Box<RawValue> {
    // A failure cannot happen for text this module wrote; `null` is the harmless fallback.
    RawValue::from_string(text).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_key_order_and_raw_values() {
        let raw = RawValue::from_string(r#"{"b":1, "a":{"x": [1]},"c\u0041":null}"#.to_owned())
            .expect("json");
        let object = Object::of(&raw).expect("object");
        let keys: Vec<&str> = object.0.iter().map(|(k, _)| k.as_ref()).collect();
        assert_eq!(keys, ["b", "a", "cA"]);
        assert_eq!(object.get("a").map(RawValue::get), Some(r#"{"x": [1]}"#));
        assert!(Object::of(&RawValue::from_string("[1]".to_owned()).expect("json")).is_none());
        assert_eq!(
            write_object([("a\"", "1".to_owned()), ("b", "null".to_owned())]),
            r#"{"a\"":1,"b":null}"#
        );
    }
}
