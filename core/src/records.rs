//! Records kept as raw JSON: parse only the fields a merge needs, write winners out byte for byte.

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;

/// The deepest nesting read in a backend's body, serde_json's own default limit: deeper is that
/// backend failing (docs/decisions.md D7). Raw values are skipped without that limit, and
/// Python's `json` (Puppetboard, pypuppetdb) fails on what it would let through.
pub const MAX_DEPTH: usize = 128;

/// Refuses JSON text nested deeper than `limit` levels. It runs over every record a merge reads,
/// so it must cost little beside the parse (bench/README.md, figure 1): text with at most
/// `limit` opening brackets (any record but a deeply structured one) cannot nest deeper, and
/// counting them is one vectorised search (memchr); only other text has its brackets followed,
/// strings skipped.
fn check_depth(text: &[u8], limit: usize) -> Result<(), serde_json::Error> {
    if text.len() <= limit || memchr::memchr2_iter(b'[', b'{', text).nth(limit).is_none() {
        return Ok(());
    }
    let mut depth = 0usize;
    let mut at = 0;
    while let Some(&byte) = text.get(at) {
        at += 1;
        match byte {
            b'"' => match string_end(text, at) {
                Some(end) => at = end,
                // Unterminated: the parse refuses it.
                None => return Ok(()),
            },
            b'[' | b'{' => {
                depth += 1;
                if depth > limit {
                    return Err(de::Error::custom(format!(
                        "nested deeper than {MAX_DEPTH} levels"
                    )));
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    Ok(())
}

/// Refuses an element of a body's top-level array nested deeper than the body may be: the array
/// is one level of [`MAX_DEPTH`].
fn check_element_depth(element: &str) -> Result<(), serde_json::Error> {
    check_depth(element.as_bytes(), MAX_DEPTH - 1)
}

/// Where the string whose contents start at `at` ends (just past its closing quote), escapes
/// skipped; `None` when it does not end.
fn string_end(body: &[u8], mut at: usize) -> Option<usize> {
    loop {
        let found = at + memchr::memchr2(b'"', b'\\', body.get(at..)?)?;
        if body[found] == b'"' {
            return Some(found + 1);
        }
        // A backslash escapes the byte after it (a `\uXXXX` escape's digits hold no quote).
        at = found + 2;
    }
}

/// Checks that a body is one JSON value nested at most [`MAX_DEPTH`] levels: what a verbatim
/// answer must be before it is served (docs/reliability.md).
pub fn check_json(body: &[u8]) -> Result<(), serde_json::Error> {
    check_depth(body, MAX_DEPTH)?;
    serde_json::from_slice::<&RawValue>(body).map(drop)
}

/// Parses a body that must be a JSON array into its raw elements (the whole body is validated,
/// so a truncated answer is refused, docs/decisions.md D7).
pub fn parse_array(body: &[u8]) -> Result<Vec<&RawValue>, serde_json::Error> {
    let elements: Vec<&RawValue> = serde_json::from_slice(body)?;
    for element in &elements {
        check_element_depth(element.get())?;
    }
    Ok(elements)
}

/// [`parse_array`] for an answer of records: every element must be an object, else the answer
/// is malformed (a backend's `[1]` is a backend failing, never a record).
pub fn parse_records(body: &[u8]) -> Result<Vec<&RawValue>, serde_json::Error> {
    let records = parse_array(body)?;
    match records.iter().position(|raw| !raw.get().starts_with('{')) {
        Some(index) => Err(de::Error::custom(format!(
            "element {index} of the answer is not a record (an object)"
        ))),
        None => Ok(records),
    }
}

/// The top-level fields of one raw record, values left raw.
#[derive(Debug, Default)]
pub struct Fields<'a>(Vec<(Cow<'a, str>, &'a RawValue)>);

impl<'a> Fields<'a> {
    /// Reads a record's top-level keys; `None` when the record is not an object.
    pub fn of(record: &'a str) -> Option<Fields<'a>> {
        serde_json::from_str(record).ok()
    }

    /// The fields in document order (a repeated key as often as it appears), for code that
    /// rebuilds or walks a record rather than looking fields up.
    pub fn entries(&self) -> &[(Cow<'a, str>, &'a RawValue)] {
        &self.0
    }

    /// The fields in document order, keys kept as read (borrowed unless they had escapes).
    pub fn into_entries(self) -> Vec<(Cow<'a, str>, &'a RawValue)> {
        self.0
    }

    /// The raw value of `name`, if present.
    pub fn raw(&self, name: &str) -> Option<&'a RawValue> {
        self.0
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| *value)
    }

    /// The string value of `name`; `None` when absent, null or not a string.
    pub fn str(&self, name: &str) -> Option<Cow<'a, str>> {
        self.raw(name).and_then(raw_str)
    }
}

/// Whether two short texts (keys, certnames) are equal, compared in a few word loads instead of
/// a call to `memcmp`: a merge compares several per record, and the call cost more than the
/// comparison (bench/README.md, figure 1). Longer texts compare as usual.
pub fn same_text(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let len = a.len();
    if len != b.len() {
        return false;
    }
    // Two loads of `N` bytes from each end cover a text of `N` to `2N` bytes.
    fn ends<const N: usize>(a: &[u8], b: &[u8]) -> bool {
        let word = |text: &[u8], at: usize| -> [u8; N] {
            let mut word = [0; N];
            word.copy_from_slice(&text[at..at + N]);
            word
        };
        let last = a.len() - N;
        word(a, 0) == word(b, 0) && word(a, last) == word(b, last)
    }
    match len {
        0 => true,
        1..=3 => a.iter().zip(b).all(|(x, y)| x == y),
        4..=7 => ends::<4>(a, b),
        8..=15 => ends::<8>(a, b),
        16..=32 => ends::<16>(a, b),
        _ => a == b,
    }
}

/// A raw JSON string's value; `None` for any other JSON.
pub fn raw_str(raw: &RawValue) -> Option<Cow<'_, str>> {
    let text = raw.get();
    if let Some(inner) = unescaped_str(text) {
        return Some(Cow::Borrowed(inner));
    }
    serde_json::from_str::<Text<'_>>(text).ok().map(|t| t.0)
}

/// The value of `json`, the text of one valid JSON value, when it is a string with nothing
/// escaped: then its value is exactly its quoted bytes, and no parse is needed.
pub(crate) fn unescaped_str(json: &str) -> Option<&str> {
    json.strip_prefix('"')?
        .strip_suffix('"')
        .filter(|inner| !inner.contains('\\'))
}

/// Whether a raw JSON value is the string `expected`. Most other strings are told apart by length
/// alone: a JSON string's text is never shorter than its value plus the two quotes, exactly that
/// long without escapes, and longer only with them.
pub fn is_str(raw: &RawValue, expected: &str) -> bool {
    let text = raw.get();
    let plain = expected.len() + 2;
    match text.len().cmp(&plain) {
        std::cmp::Ordering::Less => false,
        std::cmp::Ordering::Equal => {
            let inner = text.get(1..text.len() - 1).unwrap_or_default();
            text.starts_with('"') && same_text(inner, expected) && !inner.contains('\\')
        }
        std::cmp::Ordering::Greater => {
            text.contains('\\') && raw_str(raw).as_deref() == Some(expected)
        }
    }
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

/// One record of a body: its raw text, written out byte for byte if it is kept, and the raw
/// values of the top-level keys a merge asked for (`None` when absent).
#[derive(Debug, Clone, Copy)]
pub struct Picked<'a, const N: usize> {
    /// The record's JSON text, exactly as the backend sent it.
    pub text: &'a str,
    /// The asked-for fields, in the order of the names asked for.
    pub fields: [Option<&'a RawValue>; N],
}

/// Parses a body that must be a JSON array, reading the fields `names` of each record in the same
/// pass that validates it (D7: the whole body is validated). Use it for merges that need a few
/// fields of every record: the common body of objects costs one parse; a body that is not UTF-8
/// takes two, with the same result; an element that is not an object is an error
/// ([`parse_records`]).
pub fn parse_picked<'a, const N: usize>(
    body: &'a [u8],
    names: [&str; N],
) -> Result<Vec<Picked<'a, N>>, serde_json::Error> {
    if let Some(records) = std::str::from_utf8(body)
        .ok()
        .and_then(|text| parse_objects(text, &names))
    {
        return Ok(records);
    }
    Ok(parse_records(body)?
        .into_iter()
        .map(|raw| {
            let fields = Fields::of(raw.get()).unwrap_or_default();
            Picked {
                text: raw.get(),
                fields: names.map(|name| fields.raw(name)),
            }
        })
        .collect())
}

/// The one-pass parse of an array of objects; `None` when the body is anything else.
///
/// serde_json does not say where an element starts or ends, so the record's text is recovered
/// from positions it does give: each value is borrowed from `body`, a record ends at the `}`
/// after its last value (after its `{` when it has none), and the next one starts at the `{`
/// after that, past whitespace and the comma.
fn parse_objects<'a, const N: usize>(
    body: &'a str,
    names: &[&str; N],
) -> Option<Vec<Picked<'a, N>>> {
    let mut deserializer = serde_json::Deserializer::from_str(body);
    let records = ObjectsSeed { body, names }
        .deserialize(&mut deserializer)
        .ok()?;
    deserializer.end().ok()?;
    Some(records)
}

/// Reads the object at the start of `text` (after whitespace), one element of an array arriving
/// in pieces, filling `fields` with its fields `names` (same length; the first of a repeated name
/// is kept): its text and the index just past its `}`. `Ok(None)` when `text` ends inside it
/// (more is to come); an error when it is not a JSON object (or nests too deep, as in
/// [`parse_picked`]). `text` is already UTF-8, so the object is parsed as `str` (its strings are
/// not checked again, as in [`parse_picked`]).
pub fn read_object<'a>(
    text: &'a str,
    names: &[&str],
    fields: &mut [Option<&'a RawValue>],
) -> Result<Option<(&'a str, usize)>, serde_json::Error> {
    let lost = || de::Error::custom("record position not recovered");
    let bytes = text.as_bytes();
    let start = bytes
        .iter()
        .position(|&byte| !is_json_space(byte))
        .unwrap_or(bytes.len());
    let mut deserializer = serde_json::Deserializer::from_str(&text[start..]);
    let last = match (ObjectSeed { names, fields }).deserialize(&mut deserializer) {
        Ok(last) => last,
        Err(error) if error.is_eof() => return Ok(None),
        // A number cut by the end of `text` (`1.`, `2e`, `-`) is "invalid", not an end of
        // input, to serde_json: more is to come while the object's `}` has not arrived.
        Err(_) if bytes.get(start) == Some(&b'{') && object_end(&bytes[start..]).is_none() => {
            return Ok(None)
        }
        Err(error) => return Err(error),
    };
    let close = object_close(bytes, start, last).ok_or_else(lost)?;
    let record = text.get(start..=close).ok_or_else(lost)?;
    Ok(Some((record, close + 1)))
}

/// The index of the `}` closing the object that starts at `start` in `body`, found from its last
/// value `last` (borrowed from `body`; `None`: the object has none): serde_json gives no
/// positions, so this is how a record's text is recovered. `None` when `body` does not hold it.
fn object_close(body: &[u8], start: usize, last: Option<&RawValue>) -> Option<usize> {
    let after_last = match last {
        Some(value) => {
            (value.get().as_ptr() as usize)
                .checked_sub(body.as_ptr() as usize)
                .filter(|offset| *offset > start && *offset < body.len())?
                + value.get().len()
        }
        None => start + 1,
    };
    let close = after_last
        + body
            .get(after_last..)?
            .iter()
            .position(|&byte| !is_json_space(byte))?;
    (body.get(start) == Some(&b'{') && body[close] == b'}').then_some(close)
}

/// The index just past the `}` that closes the object `bytes` starts with (at its `{`), if
/// `bytes` holds it (strings and their escapes skipped).
fn object_end(bytes: &[u8]) -> Option<usize> {
    let mut depth = 0usize;
    let mut at = 0;
    while at < bytes.len() {
        match bytes[at] {
            b'"' => {
                // To the closing quote: past each escape's next byte.
                at += 1;
                while at < bytes.len() && bytes[at] != b'"' {
                    at += if bytes[at] == b'\\' { 2 } else { 1 };
                }
            }
            b'{' | b'[' => depth += 1,
            b'}' | b']' => {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    return Some(at + 1);
                }
            }
            _ => {}
        }
        at += 1;
    }
    None
}

/// Whitespace as JSON defines it.
fn is_json_space(byte: u8) -> bool {
    matches!(byte, b' ' | b'\t' | b'\n' | b'\r')
}

/// The index of the first byte of `body` at or after `from` that is not whitespace (or, with
/// `comma`, a comma): the next structural character of a validated body.
fn skip_space(body: &str, from: usize, comma: bool) -> Option<usize> {
    body.as_bytes()
        .get(from..)?
        .iter()
        .position(|&byte| !(is_json_space(byte) || (comma && byte == b',')))
        .map(|offset| from + offset)
}

/// Reads the outer array for [`parse_objects`].
struct ObjectsSeed<'p, 'a, const N: usize> {
    body: &'a str,
    names: &'p [&'p str; N],
}

impl<'de, const N: usize> DeserializeSeed<'de> for ObjectsSeed<'_, 'de, N> {
    type Value = Vec<Picked<'de, N>>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_seq(self)
    }
}

impl<'de, const N: usize> Visitor<'de> for ObjectsSeed<'_, 'de, N> {
    type Value = Vec<Picked<'de, N>>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON array of objects")
    }

    fn visit_seq<S: de::SeqAccess<'de>>(self, mut seq: S) -> Result<Self::Value, S::Error> {
        let lost = || de::Error::custom("record position not recovered");
        let mut records = Vec::with_capacity(seq.size_hint().unwrap_or(0));
        // Just past the `[`: the body starts with it, after whitespace.
        let mut cursor = skip_space(self.body, 0, false).ok_or_else(lost)? + 1;
        loop {
            let mut fields = [None; N];
            let seed = ObjectSeed {
                names: self.names,
                fields: &mut fields,
            };
            let Some(last) = seq.next_element_seed(seed)? else {
                break;
            };
            let start = skip_space(self.body, cursor, true).ok_or_else(lost)?;
            let close = object_close(self.body.as_bytes(), start, last).ok_or_else(lost)?;
            let text = self.body.get(start..=close).ok_or_else(lost)?;
            records.push(Picked { text, fields });
            cursor = close + 1;
        }
        Ok(records)
    }
}

/// Reads one object for [`ObjectsSeed`] and [`read_object`]: fills the asked-for fields and gives
/// the last value.
struct ObjectSeed<'p, 'f, 'de> {
    names: &'p [&'p str],
    /// Filled with the fields `names`, in their order.
    fields: &'f mut [Option<&'de RawValue>],
}

impl<'de> DeserializeSeed<'de> for ObjectSeed<'_, '_, 'de> {
    /// The object's last value (`None`: it has none).
    type Value = Option<&'de RawValue>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for ObjectSeed<'_, '_, 'de> {
    type Value = Option<&'de RawValue>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<M: MapAccess<'de>>(self, mut map: M) -> Result<Self::Value, M::Error> {
        self.fields.fill(None);
        let mut last = None;
        while let Some(Text(key)) = map.next_key::<Text<'de>>()? {
            let value: &'de RawValue = map.next_value()?;
            // Only a structured value nests: the array and the record are two levels.
            if value.get().starts_with(['[', '{']) {
                check_depth(value.get().as_bytes(), MAX_DEPTH - 2).map_err(de::Error::custom)?;
            }
            if let Some(index) = self.names.iter().position(|name| same_text(name, &key)) {
                if let Some(field) = self.fields.get_mut(index) {
                    field.get_or_insert(value);
                }
            }
            last = Some(value);
        }
        Ok(last)
    }
}

/// The synthetic provenance fact record of one node (docs/merging.md, "Provenance"): all four
/// keys, `value` the backend's name, the environment copied from the node's own facts.
pub fn provenance_record(
    certname: &str,
    name: &str,
    value: &str,
    environment: Option<&RawValue>,
) -> Option<String> {
    let mut text = Vec::new();
    write_provenance_record(&mut text, certname, (name, value), environment)?;
    String::from_utf8(text).ok()
}

/// Writes [`provenance_record`]'s text at the end of `out`, each string escaped as JSON: a merge
/// writes one per node, straight into its answer.
pub(crate) fn write_provenance_record(
    out: &mut Vec<u8>,
    certname: &str,
    (name, value): (&str, &str),
    environment: Option<&RawValue>,
) -> Option<()> {
    let environment = environment.map_or("null", RawValue::get);
    out.reserve(provenance_record_bytes(
        certname,
        (name, value),
        environment,
    ));
    out.extend_from_slice(b"{\"certname\":");
    serde_json::to_writer(&mut *out, certname).ok()?;
    out.extend_from_slice(b",\"name\":");
    serde_json::to_writer(&mut *out, name).ok()?;
    out.extend_from_slice(b",\"value\":");
    serde_json::to_writer(&mut *out, value).ok()?;
    out.extend_from_slice(b",\"environment\":");
    out.extend_from_slice(environment.as_bytes());
    out.push(b'}');
    Some(())
}

/// About how many bytes [`write_provenance_record`] writes (exactly, when no string has a
/// character to escape).
pub(crate) fn provenance_record_bytes(
    certname: &str,
    (name, value): (&str, &str),
    environment: &str,
) -> usize {
    certname.len() + name.len() + value.len() + environment.len() + PROVENANCE_FRAME_BYTES
}

/// The bytes of a provenance record besides its four values: the keys, the strings' quotes and
/// the punctuation.
const PROVENANCE_FRAME_BYTES: usize = 51;

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

/// A record object without the entries whose values are `values`, every other byte untouched:
/// no second parse, since each entry is found from its value's position. Each value must be
/// one of `record`'s top-level values, borrowed from it by the parse that read it (as
/// [`read_object`] and [`Fields`] give them; a key repeated in the object is one entry per
/// value passed, where PuppetDB never repeats one). Use it to drop fields asked for only to
/// tell records apart. `None` when a value is not part of `record`.
pub fn without_entries<'r>(record: &'r str, values: &[&RawValue]) -> Option<Cow<'r, str>> {
    if values.is_empty() {
        return Some(Cow::Borrowed(record));
    }
    let bytes = record.as_bytes();
    let mut entries: Vec<EntrySpan> = values
        .iter()
        .map(|value| EntrySpan::of(bytes, value))
        .collect::<Option<_>>()?;
    entries.sort_unstable_by_key(|entry| entry.key);
    entries.dedup_by_key(|entry| entry.key);
    // Each entry leaves with the comma after it; the last of the object, which has none, with
    // the comma before the run of cut entries it ends (none when every entry is cut).
    let mut cuts: Vec<(usize, usize)> = Vec::with_capacity(entries.len());
    for (index, entry) in entries.iter().enumerate() {
        let cut: (usize, usize) = match entry.comma_after {
            Some(comma) => (entry.key, comma + 1),
            None => {
                let mut first = index;
                while first > 0
                    && entries[first - 1].comma_after.is_some()
                    && entries[first - 1].comma_after == entries[first].comma_before
                {
                    first -= 1;
                }
                let start = entries[first].comma_before.unwrap_or(entries[first].key);
                (start, entry.end)
            }
        };
        cuts.push(cut);
    }
    cuts.sort_unstable();
    let mut out = String::with_capacity(record.len());
    let mut at = 0;
    for (start, end) in cuts {
        // A cut inside one already made (the last entry's reaches back over its run).
        if start > at {
            out.push_str(record.get(at..start)?);
        }
        at = at.max(end);
    }
    out.push_str(record.get(at..)?);
    Some(Cow::Owned(out))
}

/// Where one entry of an object is, found from its value's position: its key's opening quote,
/// the end of its value, and the commas that separate it from its neighbours.
struct EntrySpan {
    key: usize,
    end: usize,
    comma_before: Option<usize>,
    comma_after: Option<usize>,
}

impl EntrySpan {
    /// The entry of `value`, borrowed from the object `record`; `None` when it is not one of its
    /// top-level values.
    fn of(record: &[u8], value: &RawValue) -> Option<EntrySpan> {
        let start = (value.get().as_ptr() as usize).checked_sub(record.as_ptr() as usize)?;
        let end = start + value.get().len();
        if end > record.len() {
            return None;
        }
        let before = |at: usize| record[..at].iter().rposition(|b| !is_json_space(*b));
        let colon = before(start).filter(|at| record[*at] == b':')?;
        let quote = before(colon).filter(|at| record[*at] == b'"')?;
        // The key's opening quote: the first quote before its closing one that no backslash
        // escapes (an escaped quote follows an odd run of backslashes).
        let key = (0..quote).rev().find(|at| {
            record[*at] == b'"'
                && record[..*at]
                    .iter()
                    .rev()
                    .take_while(|b| **b == b'\\')
                    .count()
                    % 2
                    == 0
        })?;
        let opener = before(key)?;
        let closer = end + record[end..].iter().position(|b| !is_json_space(*b))?;
        let comma_before = match record[opener] {
            b',' => Some(opener),
            b'{' => None,
            _ => return None,
        };
        let comma_after = match record[closer] {
            b',' => Some(closer),
            b'}' => None,
            _ => return None,
        };
        Some(EntrySpan {
            key,
            end,
            comma_before,
            comma_after,
        })
    }
}

/// A record object with the values of the keys in `replace` replaced (raw JSON), every other
/// entry's bytes untouched; `None` for something that is not an object.
pub fn with_values(record: &str, replace: &[(&str, &RawValue)]) -> Option<String> {
    rebuilt(record, |name| {
        Some(
            replace
                .iter()
                .find(|(key, _)| *key == name)
                .map(|(_, value)| value.get()),
        )
    })
}

/// A record object rebuilt entry by entry: `entry(name)` is `None` to leave the entry out,
/// `Some(None)` to keep its bytes, `Some(Some(raw))` to give it that value.
fn rebuilt<'v>(record: &str, entry: impl Fn(&str) -> Option<Option<&'v str>>) -> Option<String> {
    let fields = Fields::of(record)?;
    let mut out = String::from("{");
    for (name, value) in fields.entries() {
        let Some(replacement) = entry(name.as_ref()) else {
            continue;
        };
        if out.len() > 1 {
            out.push(',');
        }
        out.push_str(&serde_json::to_string(name.as_ref()).ok()?);
        out.push(':');
        out.push_str(replacement.unwrap_or(value.get()));
    }
    out.push('}');
    Some(out)
}

/// A record object with one more key appended, the original bytes untouched before it.
pub fn with_key(record: &str, key: &str, value: &str) -> String {
    with_entry(record, &entry_text(key, value)).concat()
}

/// The text of one object entry, `"key":"value"`, for [`with_entry`].
pub fn entry_text(key: &str, value: &str) -> String {
    let key = serde_json::to_string(key).unwrap_or_default();
    let value = serde_json::to_string(value).unwrap_or_default();
    format!("{key}:{value}")
}

/// A record object with the entry `entry` (its text, [`entry_text`]) appended, as the parts to
/// write end to end: the record up to its closing `}`, the separator (none in an empty object),
/// the entry and a `}`. Write them to append an entry without building the record anew
/// ([`with_key`] joins them into a `String`).
pub fn with_entry<'r>(record: &'r str, entry: &'r str) -> [&'r str; 4] {
    let text = record.trim_end();
    let body = text.strip_suffix('}').unwrap_or(text).trim_end();
    let separator = if body.ends_with('{') { "" } else { "," };
    [body, separator, entry, "}"]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_provenance_record_is_written_as_json_and_sized_exactly_when_nothing_is_escaped() {
        let environment = RawValue::from_string("\"production\"".to_owned()).expect("json");
        let record = provenance_record(
            "web1.example.com",
            "pdbmux_source",
            "pdb-a",
            Some(&environment),
        )
        .expect("written");
        assert_eq!(
            record,
            r#"{"certname":"web1.example.com","name":"pdbmux_source","value":"pdb-a","environment":"production"}"#
        );
        let size = provenance_record_bytes(
            "web1.example.com",
            ("pdbmux_source", "pdb-a"),
            environment.get(),
        );
        assert_eq!(size, record.len());
        let odd = provenance_record("a\"b\\c\u{e9}\n", "f", "b", None).expect("written");
        let parsed: serde_json::Value = serde_json::from_str(&odd).expect("valid JSON");
        assert_eq!(
            parsed,
            serde_json::json!({"certname": "a\"b\\c\u{e9}\n", "name": "f", "value": "b", "environment": null})
        );
    }

    #[test]
    fn an_object_cut_anywhere_is_incomplete_and_whole_it_is_read() {
        let record =
            r#" {"certname":"web\"1","value":-1.5e-3,"n":[true,null,{"x":"}"}],"t":false,"é":2}"#;
        let bytes = record.as_bytes();
        let mut fields = [None];
        // The reader hands on whole characters only (a piece's cut one waits for the next).
        for cut in (0..bytes.len()).filter(|cut| record.is_char_boundary(*cut)) {
            assert!(
                matches!(
                    read_object(&record[..cut], &["certname"], &mut fields),
                    Ok(None)
                ),
                "cut at {cut}: {:?}",
                &record[..cut]
            );
        }
        let mut fields = [None; 4];
        let (text, end) = read_object(record, &["certname", "t", "n", "absent"], &mut fields)
            .expect("an object")
            .expect("whole");
        assert_eq!(end, bytes.len());
        assert_eq!(text, record.trim_start());
        assert_eq!(
            fields.map(|field| field.map(RawValue::get)),
            [
                Some(r#""web\"1""#),
                Some("false"),
                Some(r#"[true,null,{"x":"}"}]"#),
                None
            ]
        );
        let followed = format!("{record} , {{}}");
        let (_, end) = read_object(&followed, &["certname"], &mut [None])
            .expect("an object")
            .expect("whole");
        assert_eq!(end, bytes.len(), "the object alone, not what follows");
        assert!(
            read_object(r#"{"a":1.x}"#, &["a"], &mut [None]).is_err(),
            "broken, not cut"
        );
        assert!(
            read_object("[1]", &["a"], &mut [None]).is_err(),
            "not an object"
        );
    }

    #[test]
    fn fields_are_read_without_touching_values() {
        let body = br#"[{"certname":"web\u00e91","report_timestamp":"2026-11-30T07:04:00.123Z","facts":{"a":[1,2]},"n":null}]"#;
        let records = parse_array(body).expect("valid");
        let fields = Fields::of(records[0].get()).expect("object");
        assert_eq!(fields.str("certname").as_deref(), Some("web\u{e9}1"));
        assert_eq!(
            fields.raw("facts").map(RawValue::get),
            Some(r#"{"a":[1,2]}"#)
        );
        assert_eq!(fields.str("n"), None);
        assert!(fields.raw("missing").is_none());
        assert!(Fields::of("[1]").is_none());
    }

    #[test]
    fn entries_keep_key_order_and_raw_values() {
        let fields = Fields::of(r#"{"b":1, "a":{"x": [1]},"c\u0041":null}"#).expect("object");
        let entries: Vec<(&str, &str)> = fields
            .entries()
            .iter()
            .map(|(k, v)| (k.as_ref(), v.get()))
            .collect();
        assert_eq!(
            entries,
            [("b", "1"), ("a", r#"{"x": [1]}"#), ("cA", "null")]
        );
        let owned = fields.into_entries();
        assert!(
            matches!(owned[0].0, Cow::Borrowed("b")),
            "plain keys are borrowed"
        );
        assert!(
            matches!(owned[2].0, Cow::Owned(_)),
            "escaped keys are decoded"
        );
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
            with_key(records[0].get(), "pdbmux_source", "pdb-a"),
            r#"{"certname":"a", "t":"2026-11-30T07:04:00.1Z","pdbmux_source":"pdb-a"}"#
        );
        assert_eq!(with_key(records[1].get(), "k", "v\""), r#"{"k":"v\""}"#);
        assert_eq!(write_array(["1", "{}"], 4), b"[1,{}]");
    }

    #[test]
    fn strings_without_escapes_are_borrowed_and_escaped_ones_decoded() {
        let raw = |text: &str| RawValue::from_string(text.to_owned()).expect("json");
        assert!(matches!(
            raw_str(&raw(r#""web1""#)),
            Some(Cow::Borrowed("web1"))
        ));
        assert_eq!(
            raw_str(&raw(r#""a\"b\u00e9""#)).as_deref(),
            Some("a\"b\u{e9}")
        );
        assert_eq!(raw_str(&raw(r#""""#)).as_deref(), Some(""));
        assert_eq!(raw_str(&raw("null")), None);
        assert_eq!(raw_str(&raw("12")), None);
        assert!(is_str(&raw(r#""pdbmux_source""#), "pdbmux_source"));
        assert!(is_str(&raw(r#""pdbmux\u005fsource""#), "pdbmux_source"));
        assert!(!is_str(&raw(r#""pdbmux""#), "pdbmux_source"));
        assert!(!is_str(&raw(r#""a\nb""#), "a\\nb"));
        assert!(!is_str(&raw("null"), "null"));
    }

    #[test]
    fn one_pass_parse_recovers_each_record_byte_for_byte() {
        let body = " [ {\"certname\" : \"a\" , \"name\":\"x\"} ,\n{ } ,{\"k\\u0065y\":1,\"certname\":\"b\\u00e9\"}\t]\n";
        let records = parse_objects(body, &["certname", "name"]).expect("one pass");
        let texts: Vec<&str> = records.iter().map(|r| r.text).collect();
        assert_eq!(
            texts,
            [
                "{\"certname\" : \"a\" , \"name\":\"x\"}",
                "{ }",
                "{\"k\\u0065y\":1,\"certname\":\"b\\u00e9\"}"
            ]
        );
        assert_eq!(records[0].fields[1].map(RawValue::get), Some("\"x\""));
        assert!(records[1].fields.iter().all(Option::is_none));
        assert_eq!(
            records[2].fields[0].map(RawValue::get),
            Some("\"b\\u00e9\"")
        );
    }

    #[test]
    fn an_answer_with_an_element_that_is_not_a_record_is_refused() {
        for body in [
            &br#"[1,{"certname":"a"}]"#[..],
            br#"[{"certname":"a"},"s"]"#,
            br#"[null]"#,
            br#"[[{}]]"#,
        ] {
            assert!(parse_picked(body, ["certname"]).is_err(), "{body:?}");
            assert!(parse_records(body).is_err(), "{body:?}");
        }
        let records = parse_records(br#" [ {"certname":"a"} , {} ] "#).expect("records");
        assert_eq!(records.len(), 2);
        assert!(parse_picked(br#"[{"certname":"a"},{"cert"#, ["certname"]).is_err());
        assert!(parse_picked(br#"[{"a":1}] x"#, ["a"]).is_err());
        assert!(parse_picked(b"{}", ["a"]).is_err());
        assert!(parse_picked(b"[\xff]", ["a"]).is_err());
    }

    #[test]
    fn short_texts_compare_like_strings_at_every_length_and_position() {
        for len in 0..=40 {
            let text: String = (0..len)
                .map(|i| char::from(b'a' + (i % 26) as u8))
                .collect();
            assert!(same_text(&text, &text.clone()), "{len}");
            assert!(!same_text(&text, &format!("{text}x")), "{len}: longer");
            for at in 0..len {
                let mut other = text.clone().into_bytes();
                other[at] = b'Z';
                let other = String::from_utf8(other).unwrap_or_default();
                assert!(!same_text(&text, &other), "{len}: differs at {at}");
            }
        }
    }

    #[test]
    fn a_body_nested_deeper_than_the_limit_is_refused() {
        let nested =
            |depth: usize| format!("[{{\"v\":{}{}}}]", "[".repeat(depth), "]".repeat(depth));
        assert!(parse_array(nested(MAX_DEPTH - 2).as_bytes()).is_ok());
        assert!(parse_array(nested(MAX_DEPTH).as_bytes()).is_err());
        assert!(parse_picked(nested(100_000).as_bytes(), ["v"]).is_err());
        // Many brackets, shallow: the exact count follows them.
        let wide = format!("[{{\"v\":[{}]}}]", vec!["[{}]"; 500].join(","));
        assert!(parse_records(wide.as_bytes()).is_ok());
        assert!(parse_picked(wide.as_bytes(), ["v"]).is_ok());
        assert!(check_json(wide.as_bytes()).is_ok());
        // Brackets inside strings do not count.
        let quoted = format!("[{{\"v\":\"{}\"}}]", "[".repeat(1000));
        assert!(parse_records(quoted.as_bytes()).is_ok());
        let escaped = format!("[{{\"v\":\"\\\"{}\"}}]", "[".repeat(1000));
        assert!(parse_records(escaped.as_bytes()).is_ok(), "{escaped}");
    }

    /// A JSON value of bounded depth, as text with arbitrary whitespace around its tokens.
    fn json_text() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        let space = prop::sample::select(vec!["", " ", "\n", "\t ", "\r\n"]);
        let key = prop::sample::select(vec![
            "certname",
            "name",
            "value",
            "environment",
            "k\\u0065y",
            "na\\\"me",
            "",
        ]);
        let leaf = prop_oneof![
            Just("null".to_owned()),
            Just("true".to_owned()),
            any::<i64>().prop_map(|n| n.to_string()),
            Just("-1.5e3".to_owned()),
            "[a-z\\]\\}{,:é]{0,6}".prop_map(|s| serde_json::to_string(&s).unwrap_or_default()),
            Just("\"x\\\"}\\\\\"".to_owned()),
        ];
        leaf.prop_recursive(3, 24, 4, move |inner| {
            prop_oneof![
                prop::collection::vec((space.clone(), inner.clone()), 0..4).prop_map(|items| {
                    let items: Vec<String> = items
                        .into_iter()
                        .map(|(s, v)| format!("{s}{v}{s}"))
                        .collect();
                    format!("[{}]", items.join(","))
                }),
                prop::collection::vec((space.clone(), key.clone(), inner), 0..5).prop_map(
                    |entries| {
                        let entries: Vec<String> = entries
                            .into_iter()
                            .map(|(s, k, v)| format!("{s}\"{k}\"{s}:{s}{v}{s}"))
                            .collect();
                        format!("{{{}}}", entries.join(","))
                    }
                ),
            ]
        })
    }

    proptest::proptest! {
        /// An object less any of its entries, cut at their values' positions, is the object
        /// without those keys (whitespace anywhere, escaped keys, nested values).
        #[test]
        fn entries_cut_by_position_leave_the_object_without_them(
            keys in proptest::strategy::Strategy::prop_shuffle(proptest::sample::subsequence(
                vec!["hash", "re\\\"port", "k\\u0065y", "x\\\\", "", "certname"], 0..=6
            )),
            values in proptest::collection::vec(json_text(), 6),
            spaces in proptest::collection::vec(
                proptest::sample::select(vec!["", " ", "\n\t"]), 6
            ),
            cut in proptest::collection::vec(proptest::bool::ANY, 6),
            outer in proptest::sample::select(vec!["", " "]),
        ) {
            let entries: Vec<String> = keys
                .iter()
                .zip(&values)
                .zip(&spaces)
                .map(|((key, value), s)| format!("{s}\"{key}\"{s}:{s}{value}{s}"))
                .collect();
            let record = format!("{{{outer}{}{outer}}}", entries.join(","));
            let fields = Fields::of(&record).expect("an object");
            let cut_values: Vec<&RawValue> = fields
                .entries()
                .iter()
                .zip(&cut)
                .filter(|(_, cut)| **cut)
                .map(|((_, value), _)| *value)
                .collect();
            let mut expected: serde_json::Map<String, serde_json::Value> =
                serde_json::from_str(&record).expect("valid");
            for ((key, _), cut) in fields.entries().iter().zip(&cut) {
                if *cut {
                    expected.remove(key.as_ref());
                }
            }
            let served = without_entries(&record, &cut_values).expect("its own values");
            let served_value: serde_json::Map<String, serde_json::Value> =
                serde_json::from_str(&served).expect("still an object");
            proptest::prop_assert_eq!(served_value, expected, "{} from {}", served, record);
            if cut_values.is_empty() {
                proptest::prop_assert!(matches!(served, Cow::Borrowed(text) if text == record));
            }
        }

        /// The one-pass parse agrees with parsing the array and then each record: same records,
        /// same text, same fields, on any body (arrays of anything, whitespace anywhere).
        #[test]
        fn one_pass_parse_agrees_with_two_passes(
            elements in proptest::collection::vec(json_text(), 0..6),
            space in proptest::sample::select(vec!["", " ", "\n "]),
        ) {
            let separator = format!("{space},{space}");
            let anything = format!("{space}[{space}{}{space}]{space}", elements.join(&separator));
            // Every element an object (the one-pass path), the generated values inside.
            let objects: Vec<String> = elements
                .iter()
                .enumerate()
                .map(|(i, e)| match i % 3 {
                    0 => format!("{{{space}\"certname\"{space}:{e},\"value\":{e}{space}}}"),
                    1 => format!("{{{space}}}"),
                    _ => format!("{{\"k\\u0065y\":{e},{space}\"name\":{space}{e}}}"),
                })
                .collect();
            let objects = format!("[{}]", objects.join(&separator));
            proptest::prop_assert!(
                parse_objects(&objects, &["certname", "name", "key"]).is_some(),
                "an array of objects takes the one-pass path"
            );
            for body in [anything, objects] {
            let names = ["certname", "name", "key"];
            let raws = parse_array(body.as_bytes()).expect("valid JSON");
            if raws.iter().any(|raw| !raw.get().starts_with('{')) {
                proptest::prop_assert!(parse_picked(body.as_bytes(), names).is_err());
                continue;
            }
            let picked = parse_picked(body.as_bytes(), names).expect("valid JSON");
            proptest::prop_assert_eq!(picked.len(), raws.len());
            for (picked, raw) in picked.iter().zip(&raws) {
                proptest::prop_assert_eq!(picked.text, raw.get());
                let fields = Fields::of(raw.get());
                for (index, name) in names.iter().enumerate() {
                    let expected = fields.as_ref().and_then(|f| f.raw(name)).map(RawValue::get);
                    proptest::prop_assert_eq!(picked.fields[index].map(RawValue::get), expected);
                }
            }
            }
        }
    }
}
