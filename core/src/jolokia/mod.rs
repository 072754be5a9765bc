//! `/metrics/...`: merging PuppetDB's Jolokia answers (metrics v2) and legacy MBean bodies (v1).
//!
//! Every backend is asked the same Jolokia question; the answers merge into one (docs/merging.md,
//! "Metrics"). A v2 body is an envelope
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

use percent_encoding::percent_decode_str;
use serde::ser::{SerializeMap, Serializer};
use serde::Serialize;
use serde_json::value::RawValue;
use serde_json::{Number, Value};

use crate::records::Fields;

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
    let values: Vec<&JsonNode<'_>> = usable
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
    write(&JsonNode::Object(envelope), contributed)
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
    let refs: Vec<&JsonNode<'_>> = nodes.iter().collect();
    write(&merge_nodes(None, &refs), nodes.len())
}

/// Replaces the `value` of a usable v2 envelope, keeping every other key and the key order; use
/// it to apply docs/decisions.md D9 to a merged population MBean answer.
///
/// The caller picks the shape: `{"Value": n}` for a read that named no attribute (what
/// Puppetboard reads as `value.Value`), a bare `n` for a read of the `Value` attribute. `value`
/// itself is written with sorted keys. A missing `value` key is appended. `None` when `body` is
/// not a usable envelope (unparseable, or an in-band error, whose reason must reach the client).
pub fn set_population_value(body: &[u8], value: Value) -> Option<Vec<u8>> {
    let mut envelope = read_envelope(body).ok()?;
    put(&mut envelope, "value", JsonNode::Owned(value));
    serde_json::to_vec(&JsonNode::Object(envelope)).ok()
}

/// The MBean name of a `/metrics/v2/read/<mbean>[/<attr>[/<path>]]` request, from its raw path
/// (a query string is ignored); use it to recognise a read of a given MBean, such as the
/// population MBeans of docs/decisions.md D9.
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

type Entries<'a> = Vec<(Cow<'a, str>, JsonNode<'a>)>;

/// A usable envelope's entries, in body order.
fn read_envelope(body: &[u8]) -> Result<Entries<'_>, EnvelopeError> {
    let raw: &RawValue = serde_json::from_slice(body)?;
    let JsonNode::Object(entries) = parse(raw)? else {
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
    let Some(JsonNode::Object(request)) = field(envelope, "request") else {
        return None;
    };
    let from_path = field(request, "path")
        .and_then(string_of)
        .and_then(|path| split_jolokia_path(&path).pop())
        .filter(|name| !name.is_empty());
    from_path.or_else(|| field(request, "attribute").and_then(string_of))
}

/// The largest numeric `timestamp` among the envelopes, as written by its backend.
fn newest_timestamp<'a>(envelopes: &[Entries<'a>]) -> Option<JsonNode<'a>> {
    let mut newest: Option<(&JsonNode<'a>, Number)> = None;
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

fn write(node: &JsonNode<'_>, contributed: usize) -> JolokiaMerge {
    match serde_json::to_vec(node) {
        Ok(body) => JolokiaMerge::Merged { body, contributed },
        Err(_) => JolokiaMerge::NothingUsable,
    }
}

/// One JSON value: objects as ordered entries, everything else as raw text or a computed number.
#[derive(Debug, Clone)]
enum JsonNode<'a> {
    Object(Entries<'a>),
    Raw(&'a RawValue),
    Number(Number),
    Owned(Value),
}

impl Serialize for JsonNode<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            JsonNode::Object(entries) => {
                let mut map = serializer.serialize_map(Some(entries.len()))?;
                for (key, value) in entries {
                    map.serialize_entry(key.as_ref(), value)?;
                }
                map.end()
            }
            JsonNode::Raw(raw) => raw.serialize(serializer),
            JsonNode::Number(number) => number.serialize(serializer),
            JsonNode::Owned(value) => value.serialize(serializer),
        }
    }
}

/// Reads `raw` into a tree whose objects are ordered entries (a repeated key keeps its first
/// position and its last value, as `serde_json` does) and whose other values stay raw.
fn parse(raw: &RawValue) -> Result<JsonNode<'_>, serde_json::Error> {
    if !raw.get().trim_start().starts_with('{') {
        return Ok(JsonNode::Raw(raw));
    }
    let raw_entries = serde_json::from_str::<Fields<'_>>(raw.get())?.into_entries();
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
    Ok(JsonNode::Object(entries))
}

fn field<'n, 'a>(entries: &'n Entries<'a>, name: &str) -> Option<&'n JsonNode<'a>> {
    entries
        .iter()
        .find(|(key, _)| key == name)
        .map(|(_, value)| value)
}

/// Sets `name` to `value` in place, or appends it.
fn put<'a>(entries: &mut Entries<'a>, name: &'static str, value: JsonNode<'a>) {
    match entries.iter_mut().find(|(key, _)| key == name) {
        Some(slot) => slot.1 = value,
        None => entries.push((Cow::Borrowed(name), value)),
    }
}

fn string_of(node: &JsonNode<'_>) -> Option<String> {
    match node {
        JsonNode::Raw(raw) => serde_json::from_str::<String>(raw.get()).ok(),
        JsonNode::Owned(Value::String(s)) => Some(s.clone()),
        _ => None,
    }
}

fn number_of(node: &JsonNode<'_>) -> Option<Number> {
    match node {
        JsonNode::Raw(raw) if kind(node) == JsonKind::Number => {
            serde_json::from_str(raw.get()).ok()
        }
        JsonNode::Number(number) => Some(number.clone()),
        JsonNode::Owned(Value::Number(number)) => Some(number.clone()),
        _ => None,
    }
}

/// The JSON kind of a node, for the "mixed kinds keep the first value" rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum JsonKind {
    Object,
    Number,
    Array,
    String,
    Bool,
    Null,
}

fn kind(node: &JsonNode<'_>) -> JsonKind {
    match node {
        JsonNode::Object(_) => JsonKind::Object,
        JsonNode::Number(_) => JsonKind::Number,
        JsonNode::Raw(raw) => match raw.get().trim_start().as_bytes().first() {
            Some(b'{') => JsonKind::Object,
            Some(b'[') => JsonKind::Array,
            Some(b'"') => JsonKind::String,
            Some(b't' | b'f') => JsonKind::Bool,
            Some(b'n') | None => JsonKind::Null,
            Some(_) => JsonKind::Number,
        },
        JsonNode::Owned(value) => match value {
            Value::Object(_) => JsonKind::Object,
            Value::Number(_) => JsonKind::Number,
            Value::Array(_) => JsonKind::Array,
            Value::String(_) => JsonKind::String,
            Value::Bool(_) => JsonKind::Bool,
            Value::Null => JsonKind::Null,
        },
    }
}

/// Merges one value per backend that has it (configured order); `name` is the key it sits under.
fn merge_nodes<'a>(name: Option<&str>, nodes: &[&JsonNode<'a>]) -> JsonNode<'a> {
    let Some(&first) = nodes.first() else {
        return JsonNode::Owned(Value::Null);
    };
    if nodes.len() == 1 {
        return first.clone();
    }
    let first_kind = kind(first);
    if nodes.iter().any(|node| kind(node) != first_kind) {
        return first.clone();
    }
    match first_kind {
        JsonKind::Object => merge_objects(nodes).unwrap_or_else(|| first.clone()),
        JsonKind::Number => nodes
            .iter()
            .map(|node| number_of(node))
            .collect::<Option<Vec<Number>>>()
            .and_then(|numbers| combine(NumberRule::of(name), &numbers))
            .map_or_else(|| first.clone(), JsonNode::Number),
        JsonKind::Array | JsonKind::String | JsonKind::Bool | JsonKind::Null => first.clone(),
    }
}

/// The union of the objects' keys, first-seen order, each key's values merged by its name.
fn merge_objects<'a>(nodes: &[&JsonNode<'a>]) -> Option<JsonNode<'a>> {
    let mut slots: Vec<(&Cow<'a, str>, Vec<&JsonNode<'a>>)> = Vec::new();
    let mut index: HashMap<&str, usize> = HashMap::new();
    for node in nodes {
        let JsonNode::Object(entries) = node else {
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
    Some(JsonNode::Object(
        slots
            .into_iter()
            .map(|(key, values)| (key.clone(), merge_nodes(Some(key), &values)))
            .collect(),
    ))
}

/// How the numbers under one attribute name combine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum NumberRule {
    Sum,
    Min,
    Max,
    Mean,
}

impl NumberRule {
    fn of(name: Option<&str>) -> NumberRule {
        let Some(name) = name else {
            return NumberRule::Sum;
        };
        let name = name.to_ascii_lowercase();
        match name.as_str() {
            "min" => NumberRule::Min,
            "max" | "uptime" | "starttime" => NumberRule::Max,
            "mean" | "median" | "stddev" => NumberRule::Mean,
            _ if name.ends_with("percentile") => NumberRule::Mean,
            _ => NumberRule::Sum,
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
fn combine(rule: NumberRule, numbers: &[Number]) -> Option<Number> {
    let ints: Option<Vec<i128>> = numbers.iter().map(as_int).collect();
    if let Some(ints) = ints {
        let integral = match rule {
            NumberRule::Min => ints.iter().copied().min(),
            NumberRule::Max => ints.iter().copied().max(),
            NumberRule::Sum => ints.iter().try_fold(0i128, |sum, &i| sum.checked_add(i)),
            NumberRule::Mean => {
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
        NumberRule::Min => floats.iter().copied().fold(f64::INFINITY, f64::min),
        NumberRule::Max => floats.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        NumberRule::Sum => floats.iter().sum(),
        // A count of backends is far below 2^53, so the cast is exact.
        NumberRule::Mean => floats.iter().sum::<f64>() / floats.len() as f64,
    };
    Number::from_f64(result)
}

mod population;

pub(crate) use population::JolokiaPlan;

#[cfg(test)]
mod tests;
