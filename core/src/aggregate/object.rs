//! Writing combined rows: a folded row is rebuilt in the first backend's key order (read with
//! [`crate::records::Fields::entries`]) with the folded values in place.

use serde_json::value::RawValue;

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
    fn writes_keys_escaped_and_values_as_given() {
        assert_eq!(
            write_object([("a\"", "1".to_owned()), ("b", "null".to_owned())]),
            r#"{"a\"":1,"b":null}"#
        );
    }
}
