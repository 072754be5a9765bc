//! Paging parameters and the merged-set sort order.
//!
//! Every backend sorts and pages only its own slice, so pdbmux re-does `order_by`, `limit` and
//! `offset` over the union (docs/merging.md "Paging"). This module
//! parses those parameters exactly as PuppetDB 7.12.1 does — a malformed one gets PuppetDB's own
//! 400 text — and orders records the way PostgreSQL orders PuppetDB's columns (D11): NULL last
//! ascending and first descending, a missing field like NULL, strings byte-wise (the C collation;
//! a database with another collation, such as en_US.UTF-8, can order strings differently),
//! numbers numerically, timestamps as instants, booleans false before true, jsonb columns in
//! jsonb order; a record missing an ordered field sorts like NULL (docs/decisions.md D11).
//!
//! Sources for the wording and the column lists: PuppetDB 7.12.1 `src/puppetlabs/puppetdb/query/
//! paging.clj` (`parse-order-by`, `validate-limit`, `validate-offset`, `validate-order-by!`),
//! `query_eng.clj` `orderable-columns` (the first column check, which lists the entity's
//! queryable projections in the iteration order of its projection map), `query/event_counts.clj`
//! (`event-counts-columns`) and `http/query.clj` (`coerce-to-boolean`). The messages below and
//! the column lists, which the entity table holds (`core/src/entity/orderable.rs`), were
//! confirmed by running those functions from the Debian `puppetdb` 7.12.1 jar and against a
//! running 7.12.1 over HTTP (all 400s, including the precedence in [`parse_paging`]). The orders
//! were checked against PostgreSQL 15 with the C collation (text, numeric, boolean, timestamptz,
//! text[] and jsonb columns, ascending and descending, with NULLs).
//!
//! Use: take the request's [`OrderColumns`] from its entity
//! ([`crate::entity::Entity::order_columns`]), parse the request with [`parse_paging`] (or the
//! single-parameter functions), build one
//! [`SortKey`] per merged record with [`sort_key`], then sort with [`sort_stable`] (or a stable sort
//! using [`compare`]); ties keep the merged set's order.

mod clj;
mod jsonb;

use std::cmp::Ordering;

use serde_json::value::RawValue;
use smallvec::SmallVec;

use self::clj::Cv;
use self::jsonb::Jsonb;
use crate::entity::{ColumnKind, OrderColumns};
use crate::instant::parse_instant;
use crate::records::unescaped_str;

/// Which way one `order_by` field sorts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Direction {
    /// `"asc"` (the default): smallest first, NULLs last.
    Ascending,
    /// `"desc"`: largest first, NULLs first.
    Descending,
}

impl Direction {
    /// `ascending` (two values' ascending order) in this direction.
    fn applied(self, ascending: Ordering) -> Ordering {
        match self {
            Direction::Ascending => ascending,
            Direction::Descending => ascending.reverse(),
        }
    }
}

/// One field of an `order_by`, with how its values compare.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct OrderField {
    /// The column name as the records carry it.
    pub field: String,
    /// Ascending or descending.
    pub direction: Direction,
    /// How values compare; [`OrderColumns::kind`] gives it for an entity's columns.
    pub kind: ColumnKind,
}

/// A parsed `order_by`: fields in priority order. Empty means "keep the merged order".
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct OrderBy {
    /// The fields, most significant first.
    pub fields: Vec<OrderField>,
}

impl OrderBy {
    /// Whether there is nothing to sort by.
    pub fn is_empty(&self) -> bool {
        self.fields.is_empty()
    }
}

/// Why a paging parameter was refused. `Display` is PuppetDB 7.12.1's 400 text, so pdbmux's
/// refusal reads like a backend's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PagingError {
    /// `order_by` is not JSON (`raw` is the parameter as sent).
    #[error("Illegal value '{raw}' for :order_by; expected a JSON array of maps.")]
    OrderByNotJson {
        /// The parameter as sent.
        raw: String,
    },
    /// `order_by` is a number or `true`: PuppetDB's `empty?` throws this (a 400 there too).
    #[error("Don't know how to create ISeq from: {class}")]
    OrderByNotSequence {
        /// The Java class PuppetDB names, such as `java.lang.Integer`.
        class: &'static str,
    },
    /// `order_by` is a string, a map, or an array holding something other than maps.
    #[error("Illegal value '{shown}' for :order_by; expected an array of maps.")]
    OrderByNotArrayOfMaps {
        /// The value as Clojure prints it.
        shown: String,
    },
    /// An `order_by` map has a key other than `field` and `order`.
    #[error("Illegal value '{shown}' in :order_by; unknown key '{key}'.")]
    OrderByUnknownKey {
        /// The map as Clojure prints it.
        shown: String,
        /// The first extra key.
        key: String,
    },
    /// An `order_by` map has no `field` (PuppetDB's message format drops the quotes here).
    #[error("Illegal value '{shown}' in :order_by; missing required key field.")]
    OrderByMissingField {
        /// The map as Clojure prints it.
        shown: String,
    },
    /// An `order` that is not `asc` or `desc` (in any case).
    #[error("Illegal value '{shown}' in :order_by; 'order' must be either 'asc' or 'desc'")]
    OrderByBadOrder {
        /// The map as Clojure prints it.
        shown: String,
    },
    /// A field the entity cannot be ordered by.
    #[error(
        "Unrecognized column '{field}' specified in :order_by; Supported columns are '{}'",
        .supported.join("', '")
    )]
    UnrecognizedColumn {
        /// The field as PuppetDB names it (the part after a `/`, if any).
        field: String,
        /// The columns the request may order by, from [`OrderColumns::supported`].
        supported: Vec<&'static str>,
    },
    /// `limit` is not an integer from 1 to 2147483647.
    #[error("Illegal value '{raw}' for :limit; expected a positive non-zero integer.")]
    Limit {
        /// The parameter as sent.
        raw: String,
    },
    /// `offset` is not an integer from 0 to 2147483647.
    #[error("Illegal value '{raw}' for :offset; expected a non-negative integer.")]
    Offset {
        /// The parameter as sent.
        raw: String,
    },
}

/// One `order_by` entry after the structural checks, before the column check.
enum RawField {
    Name(String),
    /// A non-string `field` (PuppetDB fails an assertion with a 500 here; pdbmux answers 400).
    NotAString(String),
}

/// PuppetDB's `parse-order-by-json` + `parse-order-by`: the structural checks, in its order.
fn parse_order_by_structure(raw: &str) -> Result<Vec<(RawField, Direction)>, PagingError> {
    let value = match clj::read(raw) {
        Err(()) => {
            return Err(PagingError::OrderByNotJson {
                raw: raw.to_owned(),
            })
        }
        Ok(None) => return Ok(Vec::new()),
        Ok(Some(v)) => v,
    };
    let not_array = |v: &Cv| PagingError::OrderByNotArrayOfMaps {
        shown: clj::str_form(v),
    };
    // `(when order-by ...)`, then `(empty? order-by)` / `sequential?` / `(every? map?)`.
    let maps: Vec<&clj::CMap> = match &value {
        Cv::Nil | Cv::Bool(false) => return Ok(Vec::new()),
        Cv::Str(s) if s.is_empty() => return Ok(Vec::new()),
        Cv::Map(m) if m.is_empty() => return Ok(Vec::new()),
        Cv::Str(_) | Cv::Map(_) => return Err(not_array(&value)),
        Cv::Vec(items) => {
            let maps: Vec<&clj::CMap> = items
                .iter()
                .filter_map(|item| match item {
                    Cv::Map(m) => Some(m),
                    _ => None,
                })
                .collect();
            if maps.len() != items.len() {
                return Err(not_array(&value));
            }
            maps
        }
        other => {
            return Err(PagingError::OrderByNotSequence {
                class: clj::not_seqable_class(other).unwrap_or("java.lang.Object"),
            })
        }
    };
    for m in &maps {
        let extra = m
            .ordered()
            .into_iter()
            .find(|(k, _)| k != "field" && k != "order");
        if let Some((k, _)) = extra {
            return Err(PagingError::OrderByUnknownKey {
                shown: clj::pr_str(&Cv::Map((*m).clone())),
                key: clj::keyword_name(k).to_owned(),
            });
        }
    }
    if let Some(m) = maps.iter().find(|m| m.get("field").is_none()) {
        return Err(PagingError::OrderByMissingField {
            shown: clj::pr_str(&Cv::Map((*m).clone())),
        });
    }
    let mut out = Vec::with_capacity(maps.len());
    for m in &maps {
        let direction = match m.get("order") {
            None | Some(Cv::Nil) => Direction::Ascending,
            Some(Cv::Str(s)) if s.eq_ignore_ascii_case("asc") => Direction::Ascending,
            Some(Cv::Str(s)) if s.eq_ignore_ascii_case("desc") => Direction::Descending,
            Some(_) => {
                return Err(PagingError::OrderByBadOrder {
                    shown: clj::pr_str(&Cv::Map((*m).clone())),
                })
            }
        };
        let field = match m.get("field") {
            Some(Cv::Str(s)) => RawField::Name(s.clone()),
            Some(other) => RawField::NotAString(clj::pr_str(other)),
            None => RawField::NotAString("nil".to_owned()),
        };
        out.push((field, direction));
    }
    Ok(out)
}

fn not_a_string_check(
    fields: &[(RawField, Direction)],
    columns: OrderColumns,
) -> Result<(), PagingError> {
    match fields.iter().find_map(|(f, _)| match f {
        RawField::NotAString(shown) => Some(shown),
        RawField::Name(_) => None,
    }) {
        Some(shown) => Err(PagingError::UnrecognizedColumn {
            field: shown.clone(),
            supported: columns.supported().collect(),
        }),
        None => Ok(()),
    }
}

/// PuppetDB's `validate-order-by!`: every field must be one of the request's columns.
fn resolve_columns(
    fields: Vec<(RawField, Direction)>,
    columns: OrderColumns,
) -> Result<OrderBy, PagingError> {
    not_a_string_check(&fields, columns)?;
    let mut out = Vec::with_capacity(fields.len());
    for (field, direction) in fields {
        let RawField::Name(name) = field else {
            continue; // ruled out above
        };
        // `(keyword "a/b")` has a namespace, so it never equals a column keyword.
        let column = match clj::keyword_has_ns(&name) {
            true => None,
            false => columns.find(&name),
        };
        let Some(column) = column else {
            return Err(PagingError::UnrecognizedColumn {
                field: clj::keyword_name(&name).to_owned(),
                supported: columns.supported().collect(),
            });
        };
        out.push(OrderField {
            kind: column.kind,
            field: name,
            direction,
        });
    }
    Ok(OrderBy { fields: out })
}

/// Parses the URL `order_by` parameter (already form-decoded) against `columns`, with PuppetDB's
/// checks and 400 texts. An empty, whitespace-only, `null`, `false`, `""`, `{}` or `[]` value means
/// no ordering, and text after a complete JSON value is ignored, as in PuppetDB. When `limit` or
/// `offset` may also be bad, use [`parse_paging`], which reports errors in PuppetDB's order.
#[cfg(test)]
pub(crate) fn parse_order_by(raw: &str, columns: OrderColumns) -> Result<OrderBy, PagingError> {
    resolve_columns(parse_order_by_structure(raw)?, columns)
}

/// Java's `Integer.parseInt`: optional sign, ASCII digits, 32-bit range. (Java also takes
/// non-ASCII decimal digits such as `٣`; pdbmux refuses those.)
fn java_parse_int(raw: &str) -> Option<i32> {
    raw.parse::<i32>().ok()
}

/// Parses the `limit` parameter: an integer from 1 to 2147483647, with an optional `+`
/// (PuppetDB reads it with Java's `Integer.parseInt`). Use it on the URL value.
pub fn parse_limit(raw: &str) -> Result<u64, PagingError> {
    match java_parse_int(raw) {
        Some(n) if n > 0 => Ok(u64::from(n.unsigned_abs())),
        _ => Err(PagingError::Limit {
            raw: raw.to_owned(),
        }),
    }
}

/// Parses the `offset` parameter: an integer from 0 to 2147483647 (`-0` and `+3` included, as
/// Java's `Integer.parseInt` reads them). Use it on the URL value.
pub fn parse_offset(raw: &str) -> Result<u64, PagingError> {
    match java_parse_int(raw) {
        Some(n) if n >= 0 => Ok(u64::from(n.unsigned_abs())),
        _ => Err(PagingError::Offset {
            raw: raw.to_owned(),
        }),
    }
}

/// Reads `include_total` as PuppetDB does (`Boolean/parseBoolean`): `true` in any case is true,
/// anything else is false. PuppetDB never refuses this parameter, so neither does this.
pub fn parse_include_total(raw: &str) -> bool {
    raw.eq_ignore_ascii_case("true")
}

/// The validated paging parameters of one request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Paging {
    /// The requested order (empty: none).
    pub order_by: OrderBy,
    /// `limit`, if given.
    pub limit: Option<u64>,
    /// `offset`, if given.
    pub offset: Option<u64>,
}

/// Parses `order_by`, `limit` and `offset` together, reporting the first error PuppetDB would:
/// `order_by`'s structure, then `limit`, then `offset`, then an unknown `order_by` column (which
/// PuppetDB only checks when it plans the query). Use it for the 400 decision on a merged request.
pub fn parse_paging(
    order_by: Option<&str>,
    limit: Option<&str>,
    offset: Option<&str>,
    columns: OrderColumns,
) -> Result<Paging, PagingError> {
    let fields = order_by.map(parse_order_by_structure).transpose()?;
    if let Some(fields) = &fields {
        not_a_string_check(fields, columns)?;
    }
    let limit = limit.map(parse_limit).transpose()?;
    let offset = offset.map(parse_offset).transpose()?;
    let order_by = match fields {
        Some(fields) => resolve_columns(fields, columns)?,
        None => OrderBy::default(),
    };
    Ok(Paging {
        order_by,
        limit,
        offset,
    })
}

// ---- sort keys ----

/// A JSON number, compared exactly across integers and floats.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Num {
    I(i64),
    /// Only above `i64::MAX`.
    U(u64),
    F(f64),
}

/// 2^63 and 2^64 as floats (both exact).
const TWO_63: f64 = 9_223_372_036_854_775_808.0;
const TWO_64: f64 = 18_446_744_073_709_551_616.0;

impl Num {
    fn from_u64(v: u64) -> Num {
        match i64::try_from(v) {
            Ok(i) => Num::I(i),
            Err(_) => Num::U(v),
        }
    }

    fn compare(&self, other: &Num) -> Ordering {
        match (*self, *other) {
            (Num::I(a), Num::I(b)) => a.cmp(&b),
            (Num::U(a), Num::U(b)) => a.cmp(&b),
            (Num::I(_), Num::U(_)) => Ordering::Less,
            (Num::U(_), Num::I(_)) => Ordering::Greater,
            (Num::F(a), Num::F(b)) => a.partial_cmp(&b).unwrap_or(Ordering::Equal),
            (Num::I(a), Num::F(f)) => cmp_i64_f64(a, f),
            (Num::F(f), Num::I(a)) => cmp_i64_f64(a, f).reverse(),
            (Num::U(a), Num::F(f)) => cmp_u64_f64(a, f),
            (Num::F(f), Num::U(a)) => cmp_u64_f64(a, f).reverse(),
        }
    }
}

/// The fractional part decides between an integer and a float whose integer parts tie.
fn cmp_fraction(f: f64, truncated: f64) -> Ordering {
    if f > truncated {
        Ordering::Less
    } else if f < truncated {
        Ordering::Greater
    } else {
        Ordering::Equal
    }
}

fn cmp_i64_f64(a: i64, f: f64) -> Ordering {
    if f.is_nan() {
        return Ordering::Equal;
    }
    if f >= TWO_63 {
        return Ordering::Less;
    }
    if f < -TWO_63 {
        return Ordering::Greater;
    }
    let t = f.trunc();
    // In range, so the cast is exact.
    a.cmp(&(t as i64)).then_with(|| cmp_fraction(f, t))
}

fn cmp_u64_f64(a: u64, f: f64) -> Ordering {
    if f.is_nan() {
        return Ordering::Equal;
    }
    if f >= TWO_64 {
        return Ordering::Less;
    }
    if f < 0.0 {
        return Ordering::Greater;
    }
    let t = f.trunc();
    a.cmp(&(t as u64)).then_with(|| cmp_fraction(f, t))
}

/// One field's extracted value. The variant order is the fixed order for mixed types in one
/// column (which PuppetDB's typed columns never produce): booleans, numbers, instants, text,
/// text arrays, jsonb; SQL NULL above everything, hence last ascending and first descending.
#[derive(Debug, Clone, PartialEq)]
enum KeyPart {
    Bool(bool),
    Number(Num),
    /// Seconds since the Unix epoch and nanoseconds.
    Instant(i64, u32),
    /// UTF-8 bytes, compared byte-wise (= code point order).
    Text(KeyText),
    /// A PostgreSQL array: element-wise, then shorter first; NULL elements sort last.
    List(Box<[KeyPart]>),
    Jsonb(Jsonb),
    Null,
}

impl KeyPart {
    fn rank(&self) -> u8 {
        match self {
            KeyPart::Bool(_) => 0,
            KeyPart::Number(_) => 1,
            KeyPart::Instant(..) => 2,
            KeyPart::Text(_) => 3,
            KeyPart::List(_) => 4,
            KeyPart::Jsonb(_) => 5,
            KeyPart::Null => 6,
        }
    }

    /// Ascending order of two values of one column.
    fn compare(&self, other: &KeyPart) -> Ordering {
        match (self, other) {
            (KeyPart::Bool(a), KeyPart::Bool(b)) => a.cmp(b),
            (KeyPart::Number(a), KeyPart::Number(b)) => a.compare(b),
            (KeyPart::Instant(sa, na), KeyPart::Instant(sb, nb)) => (sa, na).cmp(&(sb, nb)),
            (KeyPart::Text(a), KeyPart::Text(b)) => a.cmp(b),
            (KeyPart::List(a), KeyPart::List(b)) => {
                for (x, y) in a.iter().zip(b.iter()) {
                    let ord = x.compare(y);
                    if ord != Ordering::Equal {
                        return ord;
                    }
                }
                a.len().cmp(&b.len())
            }
            (KeyPart::Jsonb(a), KeyPart::Jsonb(b)) => jsonb::cmp_top(a, b),
            _ => self.rank().cmp(&other.rank()),
        }
    }

    /// A value by its JSON type (text, number and boolean columns, and unknown ones).
    fn from_json(v: Jsonb, kind: ColumnKind) -> KeyPart {
        match v {
            Jsonb::Null => KeyPart::Null,
            Jsonb::Bool(b) => KeyPart::Bool(b),
            Jsonb::Num(n) => KeyPart::Number(n),
            Jsonb::Str(s) => match (kind == ColumnKind::Timestamp)
                .then(|| parse_instant(&s))
                .flatten()
            {
                Some((secs, nanos)) => KeyPart::Instant(secs, nanos),
                None => KeyPart::Text(KeyText::from_vec(String::from(s).into_bytes())),
            },
            Jsonb::Arr(items) if kind == ColumnKind::TextArray => KeyPart::List(
                items
                    .into_vec()
                    .into_iter()
                    .map(|item| match item {
                        item @ (Jsonb::Arr(_) | Jsonb::Obj(_)) => KeyPart::Jsonb(item),
                        scalar => KeyPart::from_json(scalar, ColumnKind::Text),
                    })
                    .collect(),
            ),
            container => KeyPart::Jsonb(container),
        }
    }
}

/// The typed sort key of one record under one [`OrderBy`]: extract it once per record with
/// [`sort_key`], then compare keys with [`compare`] as often as the sort needs.
#[derive(Debug, Clone, PartialEq)]
pub struct SortKey(SmallVec<[KeyPart; 2]>);

impl SortKey {
    /// This key's first `fields` parts alone: it compares with whole keys on those fields only
    /// ([`compare`] stops at the shorter key), the prefix every record of a set sorts with when
    /// those fields hold the same values in each.
    pub(crate) fn leading(mut self, fields: usize) -> SortKey {
        self.0.truncate(fields);
        self
    }
}

/// A text key part's bytes, held inline up to 24 bytes (most certnames, fact names and resource
/// types; longer ones spill to the heap): an ordered merge builds a key per record, and a key
/// that allocates nothing costs it no allocator round trip.
type KeyText = SmallVec<[u8; 24]>;

/// Builds a record's sort key. `lookup` gives the record's raw JSON for a field name (`None`
/// when the record has no such field, which sorts like NULL); only those values are parsed.
/// A value that is not valid JSON also counts as NULL. Timestamps that do not parse compare as
/// text, after every parsed instant and before NULL.
pub fn sort_key<'r, F>(order: &OrderBy, lookup: F) -> SortKey
where
    F: Fn(&str) -> Option<&'r RawValue>,
{
    SortKey(
        order
            .fields
            .iter()
            .map(|f| match lookup(&f.field) {
                None => KeyPart::Null,
                Some(raw) => key_part(raw.get(), f.kind),
            })
            .collect(),
    )
}

/// The text of `raw`, one valid JSON value in a column of `kind`, when its key part is exactly
/// that text's bytes: a string with nothing escaped, in a column compared as text (not jsonb,
/// not JSON text, not a timestamp, which may read as an instant).
fn plain_text_key(raw: &str, kind: ColumnKind) -> Option<&str> {
    // The kind first: a timestamp's text is then scanned once, by its own branch of `key_part`.
    let as_text = !matches!(
        kind,
        ColumnKind::Jsonb | ColumnKind::JsonText | ColumnKind::Timestamp
    );
    as_text.then(|| unescaped_str(raw)).flatten()
}

/// The key part of `raw`, the text of one valid JSON value, in a column of `kind`.
fn key_part(raw: &str, kind: ColumnKind) -> KeyPart {
    // Most keys are strings with nothing escaped (certnames, names, times): their text is the
    // string, so an ordered merge does not parse them a second time per record.
    if let Some(text) = plain_text_key(raw, kind) {
        return KeyPart::Text(KeyText::from_slice(text.as_bytes()));
    }
    if kind == ColumnKind::JsonText {
        return KeyPart::Text(KeyText::from_vec(minify_json(raw).into_bytes()));
    }
    if let Some(text) = (kind == ColumnKind::Timestamp)
        .then(|| unescaped_str(raw))
        .flatten()
    {
        return match parse_instant(text) {
            Some((secs, nanos)) => KeyPart::Instant(secs, nanos),
            None => KeyPart::Text(KeyText::from_slice(text.as_bytes())),
        };
    }
    match serde_json::from_str::<Jsonb>(raw) {
        Err(_) => KeyPart::Null,
        Ok(v) if kind == ColumnKind::Jsonb => KeyPart::Jsonb(v),
        Ok(Jsonb::Arr(items)) if kind == ColumnKind::PathArray => KeyPart::List(
            items
                .into_vec()
                .into_iter()
                .map(|item| match path_element(&item) {
                    Some(text) => KeyPart::Text(KeyText::from_vec(text.into_bytes())),
                    None => KeyPart::Null,
                })
                .collect(),
        ),
        Ok(Jsonb::Arr(items)) if kind == ColumnKind::EncodedPath => {
            let elements: Option<Vec<String>> = items.iter().map(path_element).collect();
            match elements {
                Some(elements) => {
                    KeyPart::Text(KeyText::from_vec(elements.join("#~").into_bytes()))
                }
                None => KeyPart::Null,
            }
        }
        Ok(v) => KeyPart::from_json(v, kind),
    }
}

/// One element of a fact path as PuppetDB stores it: a key, or an array index as its digits.
fn path_element(element: &Jsonb) -> Option<String> {
    match element {
        Jsonb::Str(s) => Some(s.to_string()),
        Jsonb::Num(Num::I(i)) => Some(i.to_string()),
        Jsonb::Num(Num::U(u)) => Some(u.to_string()),
        _ => None,
    }
}

/// Drops the whitespace between JSON tokens: the text PuppetDB stored before it re-emitted it.
fn minify_json(raw: &str) -> String {
    let mut out = String::with_capacity(raw.len());
    let (mut in_string, mut escaped) = (false, false);
    for c in raw.chars() {
        if in_string {
            out.push(c);
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                in_string = false;
            }
        } else if !matches!(c, ' ' | '\t' | '\n' | '\r') {
            out.push(c);
            in_string = c == '"';
        }
    }
    out
}

/// Compares two records' keys under `order` (the one both keys were built with), field by
/// field, each in its direction. Equal keys give `Equal`, so a stable sort keeps merged order.
pub fn compare(a: &SortKey, b: &SortKey, order: &OrderBy) -> Ordering {
    for ((x, y), field) in a.0.iter().zip(b.0.iter()).zip(order.fields.iter()) {
        let ord = field.direction.applied(x.compare(y));
        if ord != Ordering::Equal {
            return ord;
        }
    }
    Ordering::Equal
}

/// Compares two records under `order` from their fields (`a` and `b` give a record's raw JSON
/// for a field name, as [`sort_key`]'s lookup), exactly as [`compare`] compares their keys, but
/// without building either: use it to sort many records held by the fields they are written
/// from (a merge's provenance records, one per node), whose keys would outweigh them. A string
/// with nothing escaped in a column compared as text is compared as it stands; anything else
/// is keyed for the comparison.
pub fn compare_fields<'x, 'y>(
    order: &OrderBy,
    a: impl Fn(&str) -> Option<&'x RawValue>,
    b: impl Fn(&str) -> Option<&'y RawValue>,
) -> Ordering {
    fn plain_text(raw: Option<&RawValue>, kind: ColumnKind) -> Option<&str> {
        raw.and_then(|raw| plain_text_key(raw.get(), kind))
    }
    let part = |raw: Option<&RawValue>, kind: ColumnKind| match raw {
        None => KeyPart::Null,
        Some(raw) => key_part(raw.get(), kind),
    };
    for field in &order.fields {
        let (x, y) = (a(&field.field), b(&field.field));
        let ascending = match (plain_text(x, field.kind), plain_text(y, field.kind)) {
            (Some(x), Some(y)) => x.as_bytes().cmp(y.as_bytes()),
            _ => part(x, field.kind).compare(&part(y, field.kind)),
        };
        let ord = field.direction.applied(ascending);
        if ord != Ordering::Equal {
            return ord;
        }
    }
    Ordering::Equal
}

/// Sorts `items` by `order`, computing each item's key once with `key`; a stable sort, so ties
/// keep their input order. Use it to re-sort a merged record set before cutting the window.
pub fn sort_stable<T>(
    items: Vec<T>,
    order: &OrderBy,
    mut key: impl FnMut(&T) -> SortKey,
) -> Vec<T> {
    if order.is_empty() {
        return items;
    }
    let mut keyed: Vec<(SortKey, T)> = items.into_iter().map(|t| (key(&t), t)).collect();
    keyed.sort_by(|a, b| compare(&a.0, &b.0, order));
    keyed.into_iter().map(|(_, t)| t).collect()
}

#[cfg(test)]
mod tests;
