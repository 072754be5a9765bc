//! `/metrics/...`: merging PuppetDB's Jolokia answers (metrics v2) and legacy MBean bodies (v1).
//!
//! Every backend is asked the same Jolokia question; the answers merge into one as the spec's
//! "Metadata and metrics" section says. A v2 body is an envelope
//! `{"request":…,"value":…,"timestamp":…,"status":…}`: the envelope comes from the first usable
//! backend, its `timestamp` is the newest among the usable envelopes, and only `value` is merged.
//! A v1 body is the value itself, merged the same way.
//!
//! Values merge recursively: objects over the union of their keys, numbers by the name of the
//! attribute they sit under ([`merge_v2`] lists the rules), everything else from the first
//! backend.
//!
//! Key order: this workspace builds `serde_json` without `preserve_order`, so a
//! `serde_json::Map` would write keys sorted. The merge therefore keeps objects as ordered lists
//! and leaves as raw JSON text: objects are written in the first backend's key order, keys only a
//! later backend has are appended in the order they first appear, and any value taken from one
//! backend (a string, an array, a number no other backend reported) is written byte for byte.
//! Whitespace between tokens is not kept.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt;

use percent_encoding::percent_decode_str;
use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::ser::{SerializeMap, Serializer};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::{Number, Value};

/// The outcome of merging the metrics bodies of the backends that answered HTTP 2xx.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JolokiaMerge {
    /// Serve `body` (JSON) with status 200; `contributed` backends' answers went into it.
    Merged {
        /// The merged JSON body.
        body: Vec<u8>,
        /// How many bodies were usable and merged.
        contributed: usize,
    },
    /// No backend had a usable answer and at least one reported a Jolokia error in band: replay
    /// `bodies[first_error_body_index]` verbatim (HTTP 200, as Jolokia sent it) so the client sees
    /// the real reason.
    AllInBandErrors {
        /// Index into the `bodies` given to [`merge_v2`] of the first in-band error envelope.
        first_error_body_index: usize,
    },
    /// No body was usable and none was an in-band error (every body unparseable, or none given):
    /// the caller answers as for backends that answered nothing (502).
    NothingUsable,
}

/// Merges Jolokia v2 envelopes (`/metrics/v2/read/…`, `/metrics/v2/list[/…]`); use it for the
/// bodies of the backends that answered HTTP 2xx, in configured order.
///
/// - An envelope with an `error` key or a `status` outside 200–299 is an in-band error (Jolokia
///   reports a bad MBean as `{"error_type":…,"error":…,"status":404}` inside HTTP 200) and is
///   skipped. A body that is not JSON, not an object, or has no integer `status` is skipped too,
///   as if that backend had failed.
/// - When no envelope is usable, the first in-band error is replayed
///   ([`JolokiaMerge::AllInBandErrors`]); with none either, [`JolokiaMerge::NothingUsable`].
/// - Otherwise the first usable envelope is kept (`request`, `status`, any other key, key order),
///   `timestamp` is set to the largest numeric timestamp among the usable envelopes, and `value`
///   is merged across the usable envelopes that have one:
///   - objects merge over the union of their keys (a key only one backend has survives);
///   - numbers combine by the name of the key they sit under (case-insensitive): `Min` takes the
///     minimum; `Max`, `Uptime` and `StartTime` the maximum; `Mean`, `Median`, `StdDev` and any
///     name ending in `Percentile` the unweighted arithmetic mean; any other name the sum. A bare
///     number as the whole value is named by the request's `path` (its last segment) or else its
///     `attribute`; with neither it is summed;
///   - the result is an integer when every input was one and the result is integral and fits
///     an `i64` or `u64`, else an `f64`; a result that is not finite keeps the first backend's
///     number;
///   - strings, booleans, arrays, nulls and values of mixed kinds keep the first backend's value.
///
/// A `/list` answer's MBean tree `{domain: {props: {...}}}` and a wildcard read's
/// `{<mbean>: {attr: v}}` merge by the same rules.
pub fn merge_v2(bodies: &[&[u8]]) -> JolokiaMerge {
    let mut usable = Vec::new();
    let mut first_error = None;
    for (index, body) in bodies.iter().enumerate() {
        match read_envelope(body) {
            Ok(envelope) => usable.push(envelope),
            Err(EnvelopeError::InBand(status)) => {
                tracing::debug!(index, %status, "jolokia in-band error skipped");
                first_error.get_or_insert(index);
            }
            Err(reason) => tracing::debug!(index, %reason, "jolokia body skipped"),
        }
    }
    if usable.is_empty() {
        return match first_error {
            Some(first_error_body_index) => JolokiaMerge::AllInBandErrors {
                first_error_body_index,
            },
            None => JolokiaMerge::NothingUsable,
        };
    }
    let contributed = usable.len();
    let name = usable.first().and_then(bare_value_name);
    let values: Vec<&Node<'_>> = usable
        .iter()
        .filter_map(|envelope| field(envelope, "value"))
        .collect();
    let value = (!values.is_empty()).then(|| merge_nodes(name.as_deref(), &values));
    let timestamp = newest_timestamp(&usable);
    let Some(mut envelope) = usable.into_iter().next() else {
        return JolokiaMerge::NothingUsable;
    };
    if let Some(value) = value {
        put(&mut envelope, "value", value);
    }
    if let Some(timestamp) = timestamp {
        put(&mut envelope, "timestamp", timestamp);
    }
    write(&Node::Object(envelope), contributed)
}

/// Merges legacy `/metrics/v1/mbeans[/<mbean>]` bodies (no envelope, no in-band status); use it
/// for the bodies of the backends that answered HTTP 2xx, in configured order.
///
/// The bodies merge as a v2 `value` does ([`merge_v2`]), a bare top-level number being summed.
/// An unparseable body is skipped; with none usable, [`JolokiaMerge::NothingUsable`]. The result
/// is never [`JolokiaMerge::AllInBandErrors`].
pub fn merge_v1(bodies: &[&[u8]]) -> JolokiaMerge {
    let mut nodes = Vec::new();
    for (index, body) in bodies.iter().enumerate() {
        match serde_json::from_slice::<&RawValue>(body).and_then(parse) {
            Ok(node) => nodes.push(node),
            Err(reason) => tracing::debug!(index, %reason, "metrics v1 body skipped"),
        }
    }
    if nodes.is_empty() {
        return JolokiaMerge::NothingUsable;
    }
    let refs: Vec<&Node<'_>> = nodes.iter().collect();
    write(&merge_nodes(None, &refs), nodes.len())
}

/// Replaces the `value` of a usable v2 envelope, keeping every other key and the key order; use
/// it to apply DECISIONS.md D9 to a merged population MBean answer.
///
/// The caller picks the shape: `{"Value": n}` for a read that named no attribute (what
/// Puppetboard reads as `value.Value`), a bare `n` for a read of the `Value` attribute. `value`
/// itself is written with sorted keys. A missing `value` key is appended. `None` when `body` is
/// not a usable envelope (unparseable, or an in-band error, whose reason must reach the client).
pub fn set_population_value(body: &[u8], value: Value) -> Option<Vec<u8>> {
    let mut envelope = read_envelope(body).ok()?;
    put(&mut envelope, "value", Node::Owned(value));
    serde_json::to_vec(&Node::Object(envelope)).ok()
}

/// The MBean name of a `/metrics/v2/read/<mbean>[/<attr>[/<path>]]` request, from its raw path
/// (a query string is ignored); use it to recognise a read of a given MBean, such as the
/// population MBeans of DECISIONS.md D9.
///
/// The path is percent-decoded, then split on `/` with Jolokia's escapes undone (`!/` is a `/`
/// inside a name, `!!` a `!`, `!"` a `"`). Puppetboard's
/// `/metrics/v2/read/puppetlabs.puppetdb.population%3Aname%3Dnum-nodes` gives
/// `puppetlabs.puppetdb.population:name=num-nodes`. `None` for any other route, an empty name or
/// a path that does not decode to UTF-8. A wildcard name is returned as written.
pub fn mbean_of(path: &str) -> Option<String> {
    read_segments(path)?
        .into_iter()
        .next()
        .filter(|name| !name.is_empty())
}

/// The attribute segment of a `/metrics/v2/read/<mbean>/<attr>[/<path>]` request, decoded as in
/// [`mbean_of`]; use it to tell a read of one attribute (`…/Value`, whose value is a bare number)
/// from a read of the whole MBean (whose value is an object). Several comma-separated attributes
/// come back as written. `None` when the request names no attribute.
pub fn attribute_of(path: &str) -> Option<String> {
    read_segments(path)?
        .into_iter()
        .nth(1)
        .filter(|attribute| !attribute.is_empty())
}

const READ_PREFIX: &str = "/metrics/v2/read/";

fn read_segments(path: &str) -> Option<Vec<String>> {
    let path = path.split_once('?').map_or(path, |(path, _)| path);
    let rest = path.strip_prefix(READ_PREFIX)?;
    let decoded = percent_decode_str(rest).decode_utf8().ok()?;
    Some(split_jolokia_path(&decoded))
}

/// Splits a Jolokia path on unescaped `/`, undoing `!x` → `x` (a trailing lone `!` stays).
fn split_jolokia_path(path: &str) -> Vec<String> {
    let mut segments = Vec::new();
    let mut current = String::new();
    let mut chars = path.chars();
    while let Some(c) = chars.next() {
        match c {
            '!' => current.push(chars.next().unwrap_or('!')),
            '/' => segments.push(std::mem::take(&mut current)),
            c => current.push(c),
        }
    }
    segments.push(current);
    segments
}

/// Why a metrics body is not a usable envelope.
#[derive(Debug, thiserror::Error)]
enum EnvelopeError {
    #[error("unparseable body: {0}")]
    Unparseable(#[from] serde_json::Error),
    #[error("not a json object")]
    NotAnObject,
    #[error("no integer status")]
    NoStatus,
    #[error("in-band error status {0}")]
    InBand(String),
}

type Entries<'a> = Vec<(Cow<'a, str>, Node<'a>)>;

/// A usable envelope's entries, in body order.
fn read_envelope(body: &[u8]) -> Result<Entries<'_>, EnvelopeError> {
    let raw: &RawValue = serde_json::from_slice(body)?;
    let Node::Object(entries) = parse(raw)? else {
        return Err(EnvelopeError::NotAnObject);
    };
    let status = field(&entries, "status")
        .and_then(number_of)
        .ok_or(EnvelopeError::NoStatus)?;
    let ok = status.as_u64().is_some_and(|s| (200..300).contains(&s));
    if !ok || field(&entries, "error").is_some() {
        return Err(EnvelopeError::InBand(status.to_string()));
    }
    Ok(entries)
}

/// The name a bare-number `value` combines by: the last segment of the request's `path`, else its
/// `attribute` when that is one string.
fn bare_value_name(envelope: &Entries<'_>) -> Option<String> {
    let Some(Node::Object(request)) = field(envelope, "request") else {
        return None;
    };
    let from_path = field(request, "path")
        .and_then(string_of)
        .and_then(|path| split_jolokia_path(&path).pop())
        .filter(|name| !name.is_empty());
    from_path.or_else(|| field(request, "attribute").and_then(string_of))
}

/// The largest numeric `timestamp` among the envelopes, as written by its backend.
fn newest_timestamp<'a>(envelopes: &[Entries<'a>]) -> Option<Node<'a>> {
    let mut newest: Option<(&Node<'a>, Number)> = None;
    for node in envelopes.iter().filter_map(|e| field(e, "timestamp")) {
        let Some(number) = number_of(node) else {
            continue;
        };
        let newer = match &newest {
            None => true,
            Some((_, best)) => match (as_int(&number), as_int(best)) {
                (Some(a), Some(b)) => a > b,
                _ => as_float(&number) > as_float(best),
            },
        };
        if newer {
            newest = Some((node, number));
        }
    }
    newest.map(|(node, _)| node.clone())
}

fn write(node: &Node<'_>, contributed: usize) -> JolokiaMerge {
    match serde_json::to_vec(node) {
        Ok(body) => JolokiaMerge::Merged { body, contributed },
        Err(_) => JolokiaMerge::NothingUsable,
    }
}

/// One JSON value: objects as ordered entries, everything else as raw text or a computed number.
#[derive(Debug, Clone)]
enum Node<'a> {
    Object(Entries<'a>),
    Raw(&'a RawValue),
    Number(Number),
    Owned(Value),
}

impl Serialize for Node<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Node::Object(entries) => {
                let mut map = serializer.serialize_map(Some(entries.len()))?;
                for (key, value) in entries {
                    map.serialize_entry(key.as_ref(), value)?;
                }
                map.end()
            }
            Node::Raw(raw) => raw.serialize(serializer),
            Node::Number(number) => number.serialize(serializer),
            Node::Owned(value) => value.serialize(serializer),
        }
    }
}

/// Reads `raw` into a tree whose objects are ordered entries (a repeated key keeps its first
/// position and its last value, as `serde_json` does) and whose other values stay raw.
fn parse(raw: &RawValue) -> Result<Node<'_>, serde_json::Error> {
    if !raw.get().trim_start().starts_with('{') {
        return Ok(Node::Raw(raw));
    }
    let RawEntries(raw_entries) = serde_json::from_str(raw.get())?;
    let mut entries: Entries<'_> = Vec::with_capacity(raw_entries.len());
    let mut index: HashMap<Cow<'_, str>, usize> = HashMap::with_capacity(raw_entries.len());
    for (key, value) in raw_entries {
        let node = parse(value)?;
        match index.get(&key).and_then(|&at| entries.get_mut(at)) {
            Some(slot) => slot.1 = node,
            None => {
                index.insert(key.clone(), entries.len());
                entries.push((key, node));
            }
        }
    }
    Ok(Node::Object(entries))
}

/// An object's entries with raw values, in document order.
struct RawEntries<'a>(Vec<(Cow<'a, str>, &'a RawValue)>);

impl<'de: 'a, 'a> Deserialize<'de> for RawEntries<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct EntriesVisitor;
        impl<'de> Visitor<'de> for EntriesVisitor {
            type Value = RawEntries<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<M: MapAccess<'de>>(self, mut map: M) -> Result<Self::Value, M::Error> {
                let mut entries = Vec::with_capacity(map.size_hint().unwrap_or(8));
                while let Some(key) = map.next_key::<Cow<'de, str>>()? {
                    let value: &'de RawValue = map.next_value()?;
                    entries.push((key, value));
                }
                Ok(RawEntries(entries))
            }
        }
        deserializer
            .deserialize_map(EntriesVisitor)
            .map_err(de::Error::custom)
    }
}

fn field<'n, 'a>(entries: &'n Entries<'a>, name: &str) -> Option<&'n Node<'a>> {
    entries
        .iter()
        .find(|(key, _)| key == name)
        .map(|(_, value)| value)
}

/// Sets `name` to `value` in place, or appends it.
fn put<'a>(entries: &mut Entries<'a>, name: &'static str, value: Node<'a>) {
    match entries.iter_mut().find(|(key, _)| key == name) {
        Some(slot) => slot.1 = value,
        None => entries.push((Cow::Borrowed(name), value)),
    }
}

fn string_of(node: &Node<'_>) -> Option<String> {
    match node {
        Node::Raw(raw) => serde_json::from_str::<String>(raw.get()).ok(),
        Node::Owned(Value::String(s)) => Some(s.clone()),
        _ => None,
    }
}

fn number_of(node: &Node<'_>) -> Option<Number> {
    match node {
        Node::Raw(raw) if kind(node) == Kind::Number => serde_json::from_str(raw.get()).ok(),
        Node::Number(number) => Some(number.clone()),
        Node::Owned(Value::Number(number)) => Some(number.clone()),
        _ => None,
    }
}

/// The JSON kind of a node, for the "mixed kinds keep the first value" rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Object,
    Number,
    Array,
    String,
    Bool,
    Null,
}

fn kind(node: &Node<'_>) -> Kind {
    match node {
        Node::Object(_) => Kind::Object,
        Node::Number(_) => Kind::Number,
        Node::Raw(raw) => match raw.get().trim_start().as_bytes().first() {
            Some(b'{') => Kind::Object,
            Some(b'[') => Kind::Array,
            Some(b'"') => Kind::String,
            Some(b't' | b'f') => Kind::Bool,
            Some(b'n') | None => Kind::Null,
            Some(_) => Kind::Number,
        },
        Node::Owned(value) => match value {
            Value::Object(_) => Kind::Object,
            Value::Number(_) => Kind::Number,
            Value::Array(_) => Kind::Array,
            Value::String(_) => Kind::String,
            Value::Bool(_) => Kind::Bool,
            Value::Null => Kind::Null,
        },
    }
}

/// Merges one value per backend that has it (configured order); `name` is the key it sits under.
fn merge_nodes<'a>(name: Option<&str>, nodes: &[&Node<'a>]) -> Node<'a> {
    let Some(&first) = nodes.first() else {
        return Node::Owned(Value::Null);
    };
    if nodes.len() == 1 {
        return first.clone();
    }
    let first_kind = kind(first);
    if nodes.iter().any(|node| kind(node) != first_kind) {
        return first.clone();
    }
    match first_kind {
        Kind::Object => merge_objects(nodes).unwrap_or_else(|| first.clone()),
        Kind::Number => nodes
            .iter()
            .map(|node| number_of(node))
            .collect::<Option<Vec<Number>>>()
            .and_then(|numbers| combine(Rule::of(name), &numbers))
            .map_or_else(|| first.clone(), Node::Number),
        Kind::Array | Kind::String | Kind::Bool | Kind::Null => first.clone(),
    }
}

/// The union of the objects' keys, first-seen order, each key's values merged by its name.
fn merge_objects<'a>(nodes: &[&Node<'a>]) -> Option<Node<'a>> {
    let mut slots: Vec<(&Cow<'a, str>, Vec<&Node<'a>>)> = Vec::new();
    let mut index: HashMap<&str, usize> = HashMap::new();
    for node in nodes {
        let Node::Object(entries) = node else {
            return None;
        };
        for (key, value) in entries {
            match index.get(key.as_ref()).and_then(|&at| slots.get_mut(at)) {
                Some(slot) => slot.1.push(value),
                None => {
                    index.insert(key.as_ref(), slots.len());
                    slots.push((key, vec![value]));
                }
            }
        }
    }
    Some(Node::Object(
        slots
            .into_iter()
            .map(|(key, values)| (key.clone(), merge_nodes(Some(key), &values)))
            .collect(),
    ))
}

/// How the numbers under one attribute name combine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rule {
    Sum,
    Min,
    Max,
    Mean,
}

impl Rule {
    fn of(name: Option<&str>) -> Rule {
        let Some(name) = name else {
            return Rule::Sum;
        };
        let name = name.to_ascii_lowercase();
        match name.as_str() {
            "min" => Rule::Min,
            "max" | "uptime" | "starttime" => Rule::Max,
            "mean" | "median" | "stddev" => Rule::Mean,
            _ if name.ends_with("percentile") => Rule::Mean,
            _ => Rule::Sum,
        }
    }
}

fn as_int(number: &Number) -> Option<i128> {
    number
        .as_i64()
        .map(i128::from)
        .or_else(|| number.as_u64().map(i128::from))
}

fn as_float(number: &Number) -> f64 {
    number.as_f64().unwrap_or(f64::NAN)
}

fn int_number(value: i128) -> Option<Number> {
    i64::try_from(value)
        .map(Number::from)
        .or_else(|_| u64::try_from(value).map(Number::from))
        .ok()
}

/// Combines at least one number by `rule`; `None` when the result is not a finite number.
fn combine(rule: Rule, numbers: &[Number]) -> Option<Number> {
    let ints: Option<Vec<i128>> = numbers.iter().map(as_int).collect();
    if let Some(ints) = ints {
        let integral = match rule {
            Rule::Min => ints.iter().copied().min(),
            Rule::Max => ints.iter().copied().max(),
            Rule::Sum => ints.iter().try_fold(0i128, |sum, &i| sum.checked_add(i)),
            Rule::Mean => {
                let count = i128::try_from(ints.len()).ok()?;
                ints.iter()
                    .try_fold(0i128, |sum, &i| sum.checked_add(i))
                    .filter(|sum| count > 0 && sum % count == 0)
                    .map(|sum| sum / count)
            }
        };
        if let Some(number) = integral.and_then(int_number) {
            return Some(number);
        }
    }
    let floats: Vec<f64> = numbers.iter().map(as_float).collect();
    let result = match rule {
        Rule::Min => floats.iter().copied().fold(f64::INFINITY, f64::min),
        Rule::Max => floats.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        Rule::Sum => floats.iter().sum(),
        // A count of backends is far below 2^53, so the cast is exact.
        Rule::Mean => floats.iter().sum::<f64>() / floats.len() as f64,
    };
    Number::from_f64(result)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn merged_text(bodies: &[&str]) -> String {
        let bodies: Vec<&[u8]> = bodies.iter().map(|b| b.as_bytes()).collect();
        match merge_v2(&bodies) {
            JolokiaMerge::Merged { body, .. } => String::from_utf8(body).expect("utf-8"),
            other => panic!("expected a merge, got {other:?}"),
        }
    }

    fn merged(bodies: &[&str]) -> Value {
        serde_json::from_str(&merged_text(bodies)).expect("json")
    }

    fn contributed(bodies: &[&str]) -> usize {
        let bodies: Vec<&[u8]> = bodies.iter().map(|b| b.as_bytes()).collect();
        match merge_v2(&bodies) {
            JolokiaMerge::Merged { contributed, .. } => contributed,
            other => panic!("expected a merge, got {other:?}"),
        }
    }

    fn envelope(value: &str) -> String {
        format!(
            r#"{{"request":{{"mbean":"puppetlabs.puppetdb.mq:name=global.processing-time","type":"read"}},"value":{value},"timestamp":1732950000,"status":200}}"#
        )
    }

    /// The merged `value` of one envelope per given value.
    fn value_of(values: &[&str]) -> Value {
        let bodies: Vec<String> = values.iter().map(|v| envelope(v)).collect();
        let bodies: Vec<&str> = bodies.iter().map(String::as_str).collect();
        merged(&bodies)["value"].clone()
    }

    fn value_text(values: &[&str]) -> String {
        let bodies: Vec<String> = values.iter().map(|v| envelope(v)).collect();
        let bodies: Vec<&str> = bodies.iter().map(String::as_str).collect();
        let text = merged_text(&bodies);
        let start = text.find(r#""value":"#).expect("value key") + r#""value":"#.len();
        let end = text.find(r#","timestamp""#).expect("timestamp key");
        text[start..end].to_owned()
    }

    #[test]
    fn nested_objects_merge_recursively() {
        let value = value_of(&[
            r#"{"a":{"b":{"Count":1,"Max":4},"c":2}}"#,
            r#"{"a":{"b":{"Count":10,"Max":3},"c":5}}"#,
        ]);
        assert_eq!(value, json!({"a": {"b": {"Count": 11, "Max": 4}, "c": 7}}));
    }

    #[test]
    fn a_key_only_one_backend_has_survives_verbatim() {
        let text = value_text(&[
            r#"{"Count":1,"OnlyFirst":1.50}"#,
            r#"{"Count":2,"OnlySecond":{"x":"y"},"Later":2.0e0}"#,
        ]);
        assert_eq!(
            text,
            r#"{"Count":3,"OnlyFirst":1.50,"OnlySecond":{"x":"y"},"Later":2.0e0}"#
        );
    }

    #[test]
    fn keys_keep_the_first_backends_order() {
        let text = value_text(&[
            r#"{"zeta":1,"alpha":2,"Mean":3}"#,
            r#"{"beta":1,"alpha":2,"zeta":3,"Mean":5}"#,
        ]);
        assert_eq!(text, r#"{"zeta":4,"alpha":4,"Mean":4,"beta":1}"#);
    }

    #[test]
    fn numbers_sum_by_default() {
        let value = value_of(&[
            r#"{"Count":3,"OneMinuteRate":0.5,"num-nodes":2}"#,
            r#"{"Count":4,"OneMinuteRate":0.25,"num-nodes":5}"#,
            r#"{"Count":5,"OneMinuteRate":0.25,"num-nodes":0}"#,
        ]);
        assert_eq!(
            value,
            json!({"Count": 12, "OneMinuteRate": 1.0, "num-nodes": 7})
        );
    }

    #[test]
    fn min_takes_the_minimum() {
        assert_eq!(
            value_of(&[r#"{"Min":3}"#, r#"{"Min":1}"#, r#"{"Min":2}"#]),
            json!({"Min": 1})
        );
        assert_eq!(
            value_of(&[r#"{"Min":3.5}"#, r#"{"Min":1.25}"#]),
            json!({"Min": 1.25})
        );
    }

    #[test]
    fn max_uptime_and_start_time_take_the_maximum() {
        assert_eq!(
            value_of(&[
                r#"{"Max":3,"Uptime":100,"StartTime":1732940000000}"#,
                r#"{"Max":9,"Uptime":50,"StartTime":1732949999999}"#,
            ]),
            json!({"Max": 9, "Uptime": 100, "StartTime": 1_732_949_999_999_u64})
        );
    }

    #[test]
    fn distribution_figures_take_the_unweighted_mean() {
        let value = value_of(&[
            r#"{"Mean":2,"Median":1.5,"StdDev":1,"99thPercentile":10,"75thPercentile":4,"50thPercentile":1}"#,
            r#"{"Mean":4,"Median":2.5,"StdDev":2,"99thPercentile":20,"75thPercentile":6,"50thPercentile":2}"#,
        ]);
        assert_eq!(
            value,
            json!({
                "Mean": 3,
                "Median": 2.0,
                "StdDev": 1.5,
                "99thPercentile": 15,
                "75thPercentile": 5,
                "50thPercentile": 1.5
            })
        );
        assert_eq!(
            value_of(&[r#"{"Mean":1}"#, r#"{"Mean":2}"#, r#"{"Mean":6}"#]),
            json!({"Mean": 3})
        );
    }

    #[test]
    fn rule_names_match_case_insensitively() {
        let value = value_of(&[
            r#"{"MIN":3,"max":3,"uptime":3,"STARTTIME":3,"mean":3,"MEDIAN":3,"stddev":3,"99THPERCENTILE":3,"count":3}"#,
            r#"{"MIN":1,"max":1,"uptime":1,"STARTTIME":1,"mean":1,"MEDIAN":1,"stddev":1,"99THPERCENTILE":1,"count":1}"#,
        ]);
        assert_eq!(
            value,
            json!({
                "MIN": 1, "max": 3, "uptime": 3, "STARTTIME": 3, "mean": 2, "MEDIAN": 2,
                "stddev": 2, "99THPERCENTILE": 2, "count": 4
            })
        );
        assert_eq!(Rule::of(Some("maximum")), Rule::Sum);
        assert_eq!(Rule::of(Some("Percentiles")), Rule::Sum);
        assert_eq!(Rule::of(Some("95thpercentile")), Rule::Mean);
        assert_eq!(Rule::of(None), Rule::Sum);
    }

    #[test]
    fn integers_stay_integers_and_floats_stay_floats() {
        assert_eq!(value_text(&["{\"n\":1}", "{\"n\":2}"]), r#"{"n":3}"#);
        assert_eq!(value_text(&["{\"n\":-1}", "{\"n\":-2}"]), r#"{"n":-3}"#);
        // An integral float result is still a float: not every input was an integer.
        assert_eq!(value_text(&["{\"n\":1.5}", "{\"n\":2.5}"]), r#"{"n":4.0}"#);
        assert_eq!(value_text(&["{\"n\":1}", "{\"n\":2.5}"]), r#"{"n":3.5}"#);
        assert_eq!(
            value_text(&["{\"Max\":1}", "{\"Max\":0.5}"]),
            r#"{"Max":1.0}"#
        );
        // A mean of integers that is not integral becomes a float.
        assert_eq!(
            value_text(&["{\"Mean\":1}", "{\"Mean\":2}"]),
            r#"{"Mean":1.5}"#
        );
        // Past i64, an integer sum is still an integer while it fits u64.
        assert_eq!(
            value_text(&["{\"n\":9223372036854775807}", "{\"n\":1}"]),
            r#"{"n":9223372036854775808}"#
        );
        // Past u64, it becomes a float.
        let value = value_of(&["{\"n\":18446744073709551615}", "{\"n\":1}"]);
        assert!(value["n"].is_f64(), "{value}");
        // A result that is not finite keeps the first backend's number.
        assert_eq!(
            value_text(&["{\"n\":1e308}", "{\"n\":1e308}"]),
            r#"{"n":1e308}"#
        );
    }

    #[test]
    fn other_kinds_keep_the_first_backends_value() {
        let text = value_text(&[
            r#"{"RateUnit":"events/second","Enabled":false,"Names":["a","b"],"Nothing":null,"Mixed":1,"Shape":{"a":1},"NullThenNumber":null}"#,
            r#"{"RateUnit":"events/minute","Enabled":true,"Names":["c"],"Nothing":null,"Mixed":"1","Shape":7,"NullThenNumber":3}"#,
        ]);
        assert_eq!(
            text,
            r#"{"RateUnit":"events/second","Enabled":false,"Names":["a","b"],"Nothing":null,"Mixed":1,"Shape":{"a":1},"NullThenNumber":null}"#
        );
    }

    #[test]
    fn the_newest_timestamp_wins() {
        let body = |ts: &str| {
            format!(
                r#"{{"request":{{"mbean":"m:name=x","type":"read"}},"value":{{"Value":1}},"timestamp":{ts},"status":200}}"#
            )
        };
        let (a, b, c) = (body("1732950100"), body("1732950300"), body("1732950200"));
        assert_eq!(merged(&[&a, &b, &c])["timestamp"], json!(1_732_950_300_u64));
        let text = merged_text(&[&a, &b]);
        assert!(
            text.contains(r#""timestamp":1732950300,"status":200}"#),
            "{text}"
        );
    }

    #[test]
    fn the_envelope_comes_from_the_first_usable_backend() {
        let first = r#"{"request":{"mbean":"m:name=x","type":"read"},"value":{"Value":1},"timestamp":10,"status":200,"history":[1]}"#;
        let second = r#"{"status":200,"request":{"mbean":"other","type":"read"},"value":{"Value":2},"timestamp":20,"extra":true}"#;
        assert_eq!(
            merged_text(&[first, second]),
            r#"{"request":{"mbean":"m:name=x","type":"read"},"value":{"Value":3},"timestamp":20,"status":200,"history":[1]}"#
        );
    }

    #[test]
    fn one_in_band_error_is_skipped() {
        let error = r#"{"request":{"mbean":"m:name=x","type":"read"},"error_type":"javax.management.InstanceNotFoundException","error":"javax.management.InstanceNotFoundException : m:name=x","status":404}"#;
        let ok1 = r#"{"request":{"mbean":"m:name=x","type":"read"},"value":{"Value":2},"timestamp":5,"status":200}"#;
        let ok2 = r#"{"request":{"mbean":"m:name=x","type":"read"},"value":{"Value":3},"timestamp":4,"status":200}"#;
        assert_eq!(
            merged_text(&[error, ok1, ok2]),
            r#"{"request":{"mbean":"m:name=x","type":"read"},"value":{"Value":5},"timestamp":5,"status":200}"#
        );
        assert_eq!(contributed(&[error, ok1, ok2]), 2);
        // An error key under a 200 status is an error too.
        let odd = r#"{"value":{"Value":100},"error":"boom","status":200}"#;
        assert_eq!(contributed(&[odd, ok1]), 1);
    }

    #[test]
    fn all_in_band_errors_replay_the_first() {
        let e1: &[u8] =
            br#"{"error_type":"java.lang.IllegalArgumentException","error":"bad","status":400}"#;
        let e2: &[u8] = br#"{"error_type":"javax.management.InstanceNotFoundException","error":"gone","status":404}"#;
        assert_eq!(
            merge_v2(&[e1, e2]),
            JolokiaMerge::AllInBandErrors {
                first_error_body_index: 0
            }
        );
        assert_eq!(
            merge_v2(&[b"<html>", e2, e1]),
            JolokiaMerge::AllInBandErrors {
                first_error_body_index: 1
            }
        );
    }

    #[test]
    fn unparseable_bodies_are_skipped() {
        let ok = r#"{"request":{"type":"read"},"value":{"Value":2},"timestamp":5,"status":200}"#;
        assert_eq!(contributed(&["not json", ok, "[1,2]", "{\"value\":1}"]), 1);
        assert_eq!(merged(&["{\"value\":", ok])["value"], json!({"Value": 2}));
        assert_eq!(merge_v2(&[b"nope", b"[]"]), JolokiaMerge::NothingUsable);
        assert_eq!(merge_v2(&[]), JolokiaMerge::NothingUsable);
        assert_eq!(merge_v1(&[b"{", b""]), JolokiaMerge::NothingUsable);
    }

    #[test]
    fn list_trees_are_united() {
        let first = r#"{"request":{"type":"list"},"value":{"puppetlabs.puppetdb.population":{"name=num-nodes":{"attr":{"Value":{"rw":false,"type":"java.lang.Object","desc":"Attribute exposed for management"}},"desc":"Information on the management interface of the MBean","class":"com.codahale.metrics.jmx.JmxReporter$JmxGauge"}},"java.lang":{"type=Runtime":{"attr":{"Uptime":{"rw":false,"type":"long","desc":"Uptime"}}}}},"timestamp":1732950000,"status":200}"#;
        let second = r#"{"request":{"type":"list"},"value":{"puppetlabs.puppetdb.population":{"name=num-resources":{"attr":{"Value":{"rw":false,"type":"java.lang.Object","desc":"Attribute exposed for management"}},"desc":"Information on the management interface of the MBean","class":"com.codahale.metrics.jmx.JmxReporter$JmxGauge"},"name=num-nodes":{"attr":{"Value":{"rw":true,"type":"java.lang.Object","desc":"changed"}},"desc":"other","class":"x"}},"puppetlabs.puppetdb.storage":{"name=gc-time":{"attr":{"Count":{"rw":false,"type":"long","desc":"Attribute exposed for management"}}}}},"timestamp":1732950001,"status":200}"#;
        let value = merged(&[first, second]);
        let population = &value["value"]["puppetlabs.puppetdb.population"];
        assert_eq!(
            population["name=num-nodes"]["attr"]["Value"],
            json!({"rw": false, "type": "java.lang.Object", "desc": "Attribute exposed for management"})
        );
        assert_eq!(
            population["name=num-nodes"]["class"],
            json!("com.codahale.metrics.jmx.JmxReporter$JmxGauge")
        );
        assert!(population["name=num-resources"].is_object());
        assert!(value["value"]["java.lang"]["type=Runtime"].is_object());
        assert!(value["value"]["puppetlabs.puppetdb.storage"]["name=gc-time"].is_object());
        assert_eq!(value["timestamp"], json!(1_732_950_001_u64));
        let text = merged_text(&[first, second]);
        let domains: Vec<usize> = [
            "\"puppetlabs.puppetdb.population\"",
            "\"java.lang\"",
            "\"puppetlabs.puppetdb.storage\"",
        ]
        .iter()
        .map(|d| text.find(d).expect("domain"))
        .collect();
        assert!(domains.windows(2).all(|w| w[0] < w[1]), "{text}");
    }

    #[test]
    fn a_wildcard_read_merges_per_mbean() {
        let first = r#"{"request":{"mbean":"puppetlabs.puppetdb.population:*","type":"read"},"value":{"puppetlabs.puppetdb.population:name=num-nodes":{"Value":5},"puppetlabs.puppetdb.population:name=avg-resources-per-node":{"Value":20.5}},"timestamp":1732950000,"status":200}"#;
        let second = r#"{"request":{"mbean":"puppetlabs.puppetdb.population:*","type":"read"},"value":{"puppetlabs.puppetdb.population:name=num-nodes":{"Value":7},"puppetlabs.puppetdb.population:name=num-resources":{"Value":140}},"timestamp":1732950002,"status":200}"#;
        assert_eq!(
            merged(&[first, second])["value"],
            json!({
                "puppetlabs.puppetdb.population:name=num-nodes": {"Value": 12},
                "puppetlabs.puppetdb.population:name=avg-resources-per-node": {"Value": 20.5},
                "puppetlabs.puppetdb.population:name=num-resources": {"Value": 140}
            })
        );
    }

    #[test]
    fn a_bare_number_combines_by_the_requested_attribute() {
        let read = |attribute: &str, path: Option<&str>, value: &str| {
            let path = path.map_or(String::new(), |p| format!(r#","path":"{p}""#));
            format!(
                r#"{{"request":{{"mbean":"m:name=x","attribute":"{attribute}"{path},"type":"read"}},"value":{value},"timestamp":1,"status":200}}"#
            )
        };
        let two = |attribute: &str, path: Option<&str>| {
            merged(&[&read(attribute, path, "3"), &read(attribute, path, "5")])["value"].clone()
        };
        assert_eq!(two("Value", None), json!(8));
        assert_eq!(two("Max", None), json!(5));
        assert_eq!(two("min", None), json!(3));
        assert_eq!(two("99thPercentile", None), json!(4));
        assert_eq!(two("HeapMemoryUsage", Some("max")), json!(5));
        assert_eq!(two("HeapMemoryUsage", Some("used")), json!(8));
        let bare = |value: &str| format!(r#"{{"value":{value},"status":200}}"#);
        assert_eq!(merged(&[&bare("3"), &bare("5")])["value"], json!(8));
    }

    #[test]
    fn v1_bodies_merge_without_an_envelope() {
        let first: &[u8] =
            br#"{"Count":10,"Mean":2.0,"Min":1,"Max":4,"RateUnit":"events/second","OnlyHere":1}"#;
        let second: &[u8] = br#"{"Count":5,"Mean":4.0,"Min":0,"Max":9,"RateUnit":"events/second"}"#;
        let JolokiaMerge::Merged { body, contributed } = merge_v1(&[first, b"junk", second]) else {
            panic!("expected a merge");
        };
        assert_eq!(contributed, 2);
        assert_eq!(
            String::from_utf8(body).expect("utf-8"),
            r#"{"Count":15,"Mean":3.0,"Min":0,"Max":9,"RateUnit":"events/second","OnlyHere":1}"#
        );
        // The mbean list: names to URIs, a union.
        let list1: &[u8] = br#"{"puppetlabs.puppetdb.population:name=num-nodes":"/metrics/v1/mbeans/puppetlabs.puppetdb.population%3Aname%3Dnum-nodes"}"#;
        let list2: &[u8] =
            br#"{"java.lang:type=Memory":"/metrics/v1/mbeans/java.lang%3Atype%3DMemory"}"#;
        let JolokiaMerge::Merged { body, .. } = merge_v1(&[list1, list2]) else {
            panic!("expected a merge");
        };
        let value: Value = serde_json::from_slice(&body).expect("json");
        assert_eq!(value.as_object().map(|o| o.len()), Some(2));
        // A v1 body that is a bare number is summed.
        let JolokiaMerge::Merged { body, .. } = merge_v1(&[b"2", b" 3 "]) else {
            panic!("expected a merge");
        };
        assert_eq!(body, b"5");
        // Whitespace between tokens is dropped; a lone body is otherwise written as it came.
        let JolokiaMerge::Merged { body, .. } =
            merge_v1(&[b" {\n  \"Count\" : 1.50 ,\n  \"Rate\": [1, 2]\n} \n"])
        else {
            panic!("expected a merge");
        };
        assert_eq!(body, br#"{"Count":1.50,"Rate":[1, 2]}"#);
    }

    #[test]
    fn real_puppetdb_7_12_1_envelopes() {
        let nodes_a = r#"{"request":{"mbean":"puppetlabs.puppetdb.population:name=num-nodes","type":"read"},"value":{"Value":5},"timestamp":1732950000,"status":200}"#;
        let nodes_b = r#"{"request":{"mbean":"puppetlabs.puppetdb.population:name=num-nodes","type":"read"},"value":{"Value":7},"timestamp":1732950003,"status":200}"#;
        assert_eq!(
            merged_text(&[nodes_a, nodes_b]),
            r#"{"request":{"mbean":"puppetlabs.puppetdb.population:name=num-nodes","type":"read"},"value":{"Value":12},"timestamp":1732950003,"status":200}"#
        );
        let timer_a = r#"{"request":{"mbean":"puppetlabs.puppetdb.http:name=/pdb/query/v4/nodes.service-time","type":"read"},"value":{"Mean":12.5,"StdDev":3.25,"75thPercentile":14.0,"98thPercentile":20.0,"RateUnit":"events/second","95thPercentile":18.0,"99thPercentile":22.0,"Max":30.0,"Count":40,"FiveMinuteRate":0.2,"50thPercentile":11.0,"MeanRate":0.1,"Min":2.0,"OneMinuteRate":0.3,"DurationUnit":"milliseconds","999thPercentile":29.0,"FifteenMinuteRate":0.1},"timestamp":1732950000,"status":200}"#;
        let timer_b = r#"{"request":{"mbean":"puppetlabs.puppetdb.http:name=/pdb/query/v4/nodes.service-time","type":"read"},"value":{"Mean":7.5,"StdDev":1.75,"75thPercentile":8.0,"98thPercentile":10.0,"RateUnit":"events/second","95thPercentile":9.0,"99thPercentile":12.0,"Max":25.0,"Count":10,"FiveMinuteRate":0.05,"50thPercentile":7.0,"MeanRate":0.05,"Min":1.0,"OneMinuteRate":0.1,"DurationUnit":"milliseconds","999thPercentile":24.0,"FifteenMinuteRate":0.05},"timestamp":1732950001,"status":200}"#;
        let value = merged(&[timer_a, timer_b])["value"].clone();
        let close = |key: &str, expected: f64| {
            let got = value[key].as_f64().expect("number");
            assert!((got - expected).abs() < 1e-9, "{key}: {got} != {expected}");
        };
        close("Mean", 10.0);
        close("StdDev", 2.5);
        close("75thPercentile", 11.0);
        close("99thPercentile", 17.0);
        close("999thPercentile", 26.5);
        close("Max", 30.0);
        close("Min", 1.0);
        close("OneMinuteRate", 0.4);
        close("MeanRate", 0.15);
        assert_eq!(value["Count"], json!(50));
        assert_eq!(value["RateUnit"], json!("events/second"));
        assert_eq!(value["DurationUnit"], json!("milliseconds"));
        let not_found = r#"{"request":{"mbean":"puppetlabs.puppetdb.population:name=nope","type":"read"},"stacktrace":"javax.management.InstanceNotFoundException: puppetlabs.puppetdb.population:name=nope\n","error_type":"javax.management.InstanceNotFoundException","error":"javax.management.InstanceNotFoundException : puppetlabs.puppetdb.population:name=nope","status":404}"#;
        assert_eq!(
            merge_v2(&[not_found.as_bytes(), nodes_b.as_bytes()]),
            JolokiaMerge::Merged {
                body: nodes_b.as_bytes().to_vec(),
                contributed: 1
            }
        );
    }

    #[test]
    fn keys_with_escapes_are_written_back_as_json() {
        let a = r#"{"value":{"a\"b":1,"caf\u00e9":2},"status":200}"#;
        let b = r#"{"value":{"a\"b":2},"status":200}"#;
        let text = merged_text(&[a, b]);
        assert_eq!(text, r#"{"value":{"a\"b":3,"café":2},"status":200}"#);
        // A repeated key keeps its first position and its last value.
        let dup = r#"{"value":{"x":1,"y":2,"x":5},"status":200}"#;
        assert_eq!(
            merged_text(&[dup, b]),
            r#"{"value":{"x":5,"y":2,"a\"b":2},"status":200}"#
        );
    }

    #[test]
    fn set_population_value_replaces_only_the_value() {
        let body = br#"{"request":{"mbean":"puppetlabs.puppetdb.population:name=num-nodes","type":"read"},"value":{"Value":12},"timestamp":1732950003,"status":200}"#;
        let out = set_population_value(body, json!({"Value": 9})).expect("usable");
        assert_eq!(
            String::from_utf8(out).expect("utf-8"),
            r#"{"request":{"mbean":"puppetlabs.puppetdb.population:name=num-nodes","type":"read"},"value":{"Value":9},"timestamp":1732950003,"status":200}"#
        );
        let bare = br#"{"request":{"mbean":"m","attribute":"Value","type":"read"},"status":200}"#;
        assert_eq!(
            set_population_value(bare, json!(4)).as_deref(),
            Some(&br#"{"request":{"mbean":"m","attribute":"Value","type":"read"},"status":200,"value":4}"#[..])
        );
        let error = br#"{"error_type":"x","error":"y","status":404}"#;
        assert_eq!(set_population_value(error, json!({"Value": 1})), None);
        assert_eq!(set_population_value(b"nope", json!({"Value": 1})), None);
    }

    #[test]
    fn mbean_of_decodes_puppetboard_paths() {
        assert_eq!(
            mbean_of("/metrics/v2/read/puppetlabs.puppetdb.population%3Aname%3Dnum-nodes")
                .as_deref(),
            Some("puppetlabs.puppetdb.population:name=num-nodes")
        );
        assert_eq!(
            mbean_of("/metrics/v2/read/puppetlabs.puppetdb.population%3Aname%3Dnum-resources")
                .as_deref(),
            Some("puppetlabs.puppetdb.population:name=num-resources")
        );
        // pypuppetdb !-escapes, then quote()s with `/` safe: `!` arrives as %21.
        assert_eq!(
            mbean_of("/metrics/v2/read/puppetlabs.puppetdb.http%3Aname%3D%21/pdb%21/query%21/v4%21/nodes.service-time")
                .as_deref(),
            Some("puppetlabs.puppetdb.http:name=/pdb/query/v4/nodes.service-time")
        );
        assert_eq!(
            mbean_of("/metrics/v2/read/a%3Aname%3Dx%21%21y%21%22z%21%2Fw/Value").as_deref(),
            Some("a:name=x!y\"z/w")
        );
        assert_eq!(
            mbean_of("/metrics/v2/read/puppetlabs.puppetdb.population:name=num-nodes/Value?ignoreErrors=true")
                .as_deref(),
            Some("puppetlabs.puppetdb.population:name=num-nodes")
        );
        assert_eq!(
            mbean_of("/metrics/v2/read/puppetlabs.puppetdb.population%3A%2A").as_deref(),
            Some("puppetlabs.puppetdb.population:*")
        );
        assert_eq!(mbean_of("/metrics/v2/read/"), None);
        assert_eq!(mbean_of("/metrics/v2/read"), None);
        assert_eq!(mbean_of("/metrics/v2/list"), None);
        assert_eq!(mbean_of("/metrics/v2/read/%FF"), None);
        assert_eq!(mbean_of("/pdb/query/v4/nodes"), None);
    }

    #[test]
    fn attribute_of_reads_the_second_segment() {
        assert_eq!(
            attribute_of(
                "/metrics/v2/read/puppetlabs.puppetdb.population%3Aname%3Dnum-nodes/Value"
            )
            .as_deref(),
            Some("Value")
        );
        assert_eq!(
            attribute_of("/metrics/v2/read/java.lang%3Atype%3DMemory/HeapMemoryUsage/used")
                .as_deref(),
            Some("HeapMemoryUsage")
        );
        assert_eq!(
            attribute_of("/metrics/v2/read/puppetlabs.puppetdb.population%3Aname%3Dnum-nodes"),
            None
        );
        assert_eq!(attribute_of("/metrics/v2/read/m/"), None);
    }
}
