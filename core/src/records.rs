//! Records kept as raw JSON: parse only the fields a merge needs, write winners out byte for byte.

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;

/// Parses a body that must be a JSON array into its raw elements (the whole body is validated,
/// so a truncated answer is refused, DECISIONS.md D7).
pub fn parse_array(body: &[u8]) -> Result<Vec<&RawValue>, serde_json::Error> {
    serde_json::from_slice(body)
}

/// The top-level fields of one raw record, values left raw.
#[derive(Debug, Default)]
pub struct Fields<'a>(Vec<(Cow<'a, str>, &'a RawValue)>);

impl<'a> Fields<'a> {
    /// Reads a record's top-level keys; `None` when the record is not an object.
    pub fn of(record: &'a RawValue) -> Option<Fields<'a>> {
        serde_json::from_str(record.get()).ok()
    }

    /// The raw value of `name`, if present.
    pub fn raw(&self, name: &str) -> Option<&'a RawValue> {
        self.0
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| *value)
    }

    /// The record's fields as one string, in their order, leaving out `skip`: an identity for
    /// records that are equal but for that field.
    pub fn identity_without(&self, skip: &str) -> String {
        let mut identity = String::new();
        for (key, value) in &self.0 {
            if key != skip {
                identity.push_str(key);
                identity.push('\u{0}');
                identity.push_str(value.get());
                identity.push('\u{0}');
            }
        }
        identity
    }

    /// The string value of `name`; `None` when absent, null or not a string.
    pub fn str(&self, name: &str) -> Option<Cow<'a, str>> {
        self.raw(name).and_then(raw_str)
    }
}

/// A raw JSON string's value; `None` for any other JSON.
pub fn raw_str(raw: &RawValue) -> Option<Cow<'_, str>> {
    serde_json::from_str::<Text<'_>>(raw.get())
        .ok()
        .map(|t| t.0)
}

/// A JSON string borrowed from the input when it has no escapes (serde's own `Cow<str>` always
/// allocates), owned otherwise.
struct Text<'de>(Cow<'de, str>);

impl<'de> Deserialize<'de> for Text<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct TextVisitor;
        impl<'de> Visitor<'de> for TextVisitor {
            type Value = Text<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON string")
            }
            fn visit_borrowed_str<E: de::Error>(self, value: &'de str) -> Result<Self::Value, E> {
                Ok(Text(Cow::Borrowed(value)))
            }
            fn visit_str<E: de::Error>(self, value: &str) -> Result<Self::Value, E> {
                Ok(Text(Cow::Owned(value.to_owned())))
            }
            fn visit_string<E: de::Error>(self, value: String) -> Result<Self::Value, E> {
                Ok(Text(Cow::Owned(value)))
            }
        }
        deserializer.deserialize_str(TextVisitor)
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Fields<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct FieldsVisitor;
        impl<'de> Visitor<'de> for FieldsVisitor {
            type Value = Fields<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<M: MapAccess<'de>>(self, mut map: M) -> Result<Self::Value, M::Error> {
                let mut fields = Vec::with_capacity(map.size_hint().unwrap_or(8));
                while let Some(Text(key)) = map.next_key::<Text<'de>>()? {
                    let value: &'de RawValue = map.next_value()?;
                    fields.push((key, value));
                }
                Ok(Fields(fields))
            }
        }
        deserializer
            .deserialize_map(FieldsVisitor)
            .map_err(de::Error::custom)
    }
}

/// Writes `records` as one JSON array, each record byte for byte.
pub fn write_array<'r>(records: impl IntoIterator<Item = &'r str>, capacity: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(capacity + 2);
    out.push(b'[');
    for (index, record) in records.into_iter().enumerate() {
        if index > 0 {
            out.push(b',');
        }
        out.extend_from_slice(record.as_bytes());
    }
    out.push(b']');
    out
}

/// A record object with one more key appended, the original bytes untouched before it.
pub fn with_key(record: &RawValue, key: &str, value: &str) -> String {
    let text = record.get().trim_end();
    let body = text.strip_suffix('}').unwrap_or(text).trim_end();
    let key = serde_json::to_string(key).unwrap_or_default();
    let value = serde_json::to_string(value).unwrap_or_default();
    let separator = if body.ends_with('{') { "" } else { "," };
    format!("{body}{separator}{key}:{value}}}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_are_read_without_touching_values() {
        let body = br#"[{"certname":"web\u00e91","report_timestamp":"2026-11-30T07:04:00.123Z","facts":{"a":[1,2]},"n":null}]"#;
        let records = parse_array(body).expect("valid");
        let fields = Fields::of(records[0]).expect("object");
        assert_eq!(fields.str("certname").as_deref(), Some("web\u{e9}1"));
        assert_eq!(
            fields.raw("facts").map(RawValue::get),
            Some(r#"{"a":[1,2]}"#)
        );
        assert_eq!(fields.str("n"), None);
        assert!(fields.raw("missing").is_none());
        assert!(Fields::of(RawValue::from_string("[1]".into()).as_deref().expect("raw")).is_none());
    }

    #[test]
    fn truncated_bodies_are_refused() {
        assert!(parse_array(br#"[{"certname":"a"},{"cert"#).is_err());
        assert!(parse_array(b"{}").is_err());
    }

    #[test]
    fn appending_a_key_keeps_the_original_bytes() {
        let records =
            parse_array(br#"[{"certname":"a", "t":"2026-11-30T07:04:00.1Z" },{}]"#).expect("valid");
        assert_eq!(
            with_key(records[0], "pdbmux_source", "pdb-a"),
            r#"{"certname":"a", "t":"2026-11-30T07:04:00.1Z","pdbmux_source":"pdb-a"}"#
        );
        assert_eq!(with_key(records[1], "k", "v\""), r#"{"k":"v\""}"#);
        assert_eq!(write_array(["1", "{}"], 4), b"[1,{}]");
    }
}
