//! Paging parameters and the merged-set sort order.
//!
//! Every backend sorts and pages only its own slice, so pdbmux re-does `order_by`, `limit` and
//! `offset` over the union (spec "Paging and ordering on the merged endpoints"). This module
//! parses those parameters exactly as PuppetDB 7.12.1 does — a malformed one gets PuppetDB's own
//! 400 text — and orders records the way PostgreSQL orders PuppetDB's columns (D11): NULL last
//! ascending and first descending, a missing field like NULL, strings byte-wise (the C collation;
//! a database with another collation, such as en_US.UTF-8, can order strings differently),
//! numbers numerically, timestamps as instants, booleans false before true, jsonb columns in
//! jsonb order. D11 overrides the spec's "a record missing an ordered field sorts first".
//!
//! Sources for the wording and the column lists: PuppetDB 7.12.1 `src/puppetlabs/puppetdb/query/
//! paging.clj` (`parse-order-by`, `validate-limit`, `validate-offset`, `validate-order-by!`),
//! `query_eng.clj` `orderable-columns` (the first column check, which lists the entity's
//! queryable projections in the iteration order of its projection map), `query/event_counts.clj`
//! (`event-counts-columns`) and `http/query.clj` (`coerce-to-boolean`). The messages and lists
//! below were confirmed by running those functions from the Debian `puppetdb` 7.12.1 jar and
//! against a running 7.12.1 over HTTP (all 400s, including the precedence in [`parse_paging`]).
//! The orders were checked against PostgreSQL 15 with the C collation (text, numeric, boolean,
//! timestamptz, text[] and jsonb columns, ascending and descending, with NULLs).
//!
//! Use: parse the request with [`parse_paging`] (or the single-parameter functions), build one
//! [`SortKey`] per merged record with [`sort_key`], then sort with [`sort_stable`] (or a stable sort
//! using [`compare`]); ties keep the merged set's order.

mod clj;
mod jsonb;

use std::cmp::Ordering;

use serde_json::value::RawValue;

use self::clj::Cv;
use self::jsonb::Jsonb;

/// Which way one `order_by` field sorts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Direction {
    /// `"asc"` (the default): smallest first, NULLs last.
    Ascending,
    /// `"desc"`: largest first, NULLs first.
    Descending,
}

/// How a column's values compare, from the SQL type PuppetDB selects for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ColumnKind {
    /// A text column: strings byte-wise.
    Text,
    /// An integer column (`line`, `report_format`, event counts): numerically.
    Number,
    /// A boolean column: false before true.
    Boolean,
    /// A `timestamptz` column: the ISO 8601 string is parsed and compared as an instant.
    Timestamp,
    /// A `text[]` column (`containment_path`, `tags`): element-wise, then shorter first.
    TextArray,
    /// A `jsonb` column (facts `value`, `parameters`, `facts`, `trusted`): jsonb order; a JSON
    /// `null` is a jsonb value here, not SQL NULL.
    Jsonb,
    /// A text column holding serialized JSON (events `new_value`/`old_value`): the compact JSON
    /// text byte-wise, as PostgreSQL sorts the stored text (`null` is the text `null`).
    JsonText,
    /// Not a known column (a function alias such as `count`, a query-only field): keyed by the
    /// value's JSON type.
    Other,
}

/// One field of an `order_by`, with how its values compare.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct OrderField {
    /// The column name as the records carry it.
    pub field: String,
    /// Ascending or descending.
    pub direction: Direction,
    /// How values compare; [`column_kind`] gives it for an entity's columns.
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

/// `summarize_by` of `/event-counts`, which decides the columns it can be ordered by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SummarizeBy {
    /// `certname`.
    Certname,
    /// `resource` (rows carry `resource_type` and `resource_title`).
    Resource,
    /// `containing_class`.
    ContainingClass,
}

impl SummarizeBy {
    /// Reads the `summarize_by` parameter; `None` for anything PuppetDB rejects.
    pub fn from_param(raw: &str) -> Option<SummarizeBy> {
        match raw {
            "certname" => Some(SummarizeBy::Certname),
            "resource" => Some(SummarizeBy::Resource),
            "containing_class" => Some(SummarizeBy::ContainingClass),
            _ => None,
        }
    }
}

/// The entities whose merged records pdbmux re-sorts, as far as ordering is concerned. Use it to
/// pick the allowed `order_by` columns and their comparison kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OrderEntity {
    /// `/nodes`; the flag is the request's `include_facts_expiration=true`, which adds
    /// `expires_facts` and `expires_facts_updated`.
    Nodes {
        /// Whether the request set `include_facts_expiration=true`.
        include_facts_expiration: bool,
    },
    /// `/facts`, `/facts/<name>`, `/facts/<name>/<value>`.
    Facts,
    /// `/fact-names` (`name` only).
    FactNames,
    /// `/environments` (`name` only).
    Environments,
    /// `/reports`.
    Reports,
    /// `/events` (without `distinct_resources`, which PuppetDB checks against another list).
    Events,
    /// `/event-counts`: the four counts plus the `summarize_by` columns. Rows carry those in
    /// `subject` (`title`, or `type`/`title`), so the record lookup must map them.
    EventCounts(SummarizeBy),
    /// `/resources`.
    Resources,
    /// `/catalogs`.
    Catalogs,
    /// `/factsets` (the `facts` column is the stored jsonb map, not the expanded `{href,data}`).
    Factsets,
    /// `/inventory`.
    Inventory,
}

// The lists are in the order PuppetDB 7.12.1 names them in "Supported columns are ...".
const NODES: &[&str] = &[
    "latest_report_corrective_change",
    "deactivated",
    "expired",
    "report_environment",
    "certname",
    "facts_timestamp",
    "facts_environment",
    "cached_catalog_status",
    "latest_report_status",
    "latest_report_hash",
    "catalog_timestamp",
    "latest_report_noop_pending",
    "report_timestamp",
    "latest_report_noop",
    "catalog_environment",
    "latest_report_job_id",
];
const NODES_WITH_EXPIRATION: &[&str] = &[
    "latest_report_corrective_change",
    "deactivated",
    "expired",
    "report_environment",
    "certname",
    "expires_facts",
    "facts_timestamp",
    "facts_environment",
    "cached_catalog_status",
    "latest_report_status",
    "latest_report_hash",
    "catalog_timestamp",
    "latest_report_noop_pending",
    "report_timestamp",
    "latest_report_noop",
    "expires_facts_updated",
    "catalog_environment",
    "latest_report_job_id",
];
const FACTS: &[&str] = &["certname", "environment", "name", "value"];
const NAME_ONLY: &[&str] = &["name"];
const REPORTS: &[&str] = &[
    "receive_time",
    "corrective_change",
    "code_id",
    "noop",
    "certname",
    "puppet_version",
    "hash",
    "cached_catalog_status",
    "transaction_uuid",
    "configuration_version",
    "status",
    "job_id",
    "producer",
    "catalog_uuid",
    "noop_pending",
    "end_time",
    "type",
    "environment",
    "latest_report?",
    "start_time",
    "producer_timestamp",
    "report_format",
];
const EVENTS: &[&str] = &[
    "message",
    "old_value",
    "report_receive_time",
    "corrective_change",
    "containment_path",
    "certname",
    "timestamp",
    "run_end_time",
    "name",
    "configuration_version",
    "new_value",
    "resource_title",
    "status",
    "property",
    "resource_type",
    "line",
    "environment",
    "containing_class",
    "run_start_time",
    "latest_report?",
    "file",
    "report",
];
const EVENT_COUNTS_CERTNAME: &[&str] = &["failures", "skips", "successes", "noops", "certname"];
const EVENT_COUNTS_RESOURCE: &[&str] = &[
    "failures",
    "skips",
    "successes",
    "noops",
    "resource_type",
    "resource_title",
];
const EVENT_COUNTS_CLASS: &[&str] = &[
    "failures",
    "skips",
    "successes",
    "noops",
    "containing_class",
];
const RESOURCES: &[&str] = &[
    "resource",
    "certname",
    "tags",
    "tag",
    "exported",
    "line",
    "title",
    "type",
    "environment",
    "file",
    "parameters",
];
const CATALOGS: &[&str] = &[
    "code_id",
    "certname",
    "hash",
    "transaction_uuid",
    "job_id",
    "producer",
    "catalog_uuid",
    "environment",
    "version",
    "producer_timestamp",
];
const FACTSETS: &[&str] = &[
    "timestamp",
    "facts",
    "certname",
    "hash",
    "producer_timestamp",
    "producer",
    "environment",
];
const INVENTORY: &[&str] = &["certname", "timestamp", "environment", "facts", "trusted"];

/// The columns an entity accepts in the URL `order_by`, in the order PuppetDB lists them in its
/// "Supported columns" error. Use it to validate or to document; [`parse_order_by`] already checks.
pub fn orderable_fields(entity: OrderEntity) -> &'static [&'static str] {
    match entity {
        OrderEntity::Nodes {
            include_facts_expiration: false,
        } => NODES,
        OrderEntity::Nodes {
            include_facts_expiration: true,
        } => NODES_WITH_EXPIRATION,
        OrderEntity::Facts => FACTS,
        OrderEntity::FactNames | OrderEntity::Environments => NAME_ONLY,
        OrderEntity::Reports => REPORTS,
        OrderEntity::Events => EVENTS,
        OrderEntity::EventCounts(SummarizeBy::Certname) => EVENT_COUNTS_CERTNAME,
        OrderEntity::EventCounts(SummarizeBy::Resource) => EVENT_COUNTS_RESOURCE,
        OrderEntity::EventCounts(SummarizeBy::ContainingClass) => EVENT_COUNTS_CLASS,
        OrderEntity::Resources => RESOURCES,
        OrderEntity::Catalogs => CATALOGS,
        OrderEntity::Factsets => FACTSETS,
        OrderEntity::Inventory => INVENTORY,
    }
}

/// How an entity's column compares (from the SQL type behind it). Use it to build an
/// [`OrderField`] for an order that did not come through [`parse_order_by`], such as an in-query
/// `["order_by", ...]`; a name that is not a column (a function alias) gets [`ColumnKind::Other`].
pub fn column_kind(entity: OrderEntity, field: &str) -> ColumnKind {
    use ColumnKind::{Boolean, JsonText, Jsonb, Number, Other, Text, TextArray, Timestamp};
    let timestamp = match entity {
        OrderEntity::Nodes { .. } => &[
            "deactivated",
            "expired",
            "catalog_timestamp",
            "facts_timestamp",
            "report_timestamp",
            "expires_facts_updated",
        ][..],
        OrderEntity::Reports => &[
            "start_time",
            "end_time",
            "producer_timestamp",
            "receive_time",
        ],
        OrderEntity::Events => &[
            "timestamp",
            "run_start_time",
            "run_end_time",
            "report_receive_time",
        ],
        OrderEntity::Catalogs => &["producer_timestamp"],
        OrderEntity::Factsets => &["timestamp", "producer_timestamp"],
        OrderEntity::Inventory => &["timestamp"],
        _ => &[],
    };
    if timestamp.contains(&field) {
        return Timestamp;
    }
    match (entity, field) {
        (
            OrderEntity::Nodes { .. },
            "latest_report_noop"
            | "latest_report_noop_pending"
            | "latest_report_corrective_change"
            | "expires_facts",
        ) => Boolean,
        (OrderEntity::Facts, "value") => Jsonb,
        (
            OrderEntity::Reports,
            "noop" | "noop_pending" | "corrective_change" | "latest_report?",
        ) => Boolean,
        (OrderEntity::Reports, "report_format") => Number,
        (OrderEntity::Events, "corrective_change" | "latest_report?") => Boolean,
        (OrderEntity::Events, "line") => Number,
        (OrderEntity::Events, "containment_path") => TextArray,
        (OrderEntity::Events, "new_value" | "old_value") => JsonText,
        (OrderEntity::EventCounts(_), "failures" | "skips" | "successes" | "noops") => Number,
        (OrderEntity::Resources, "exported") => Boolean,
        (OrderEntity::Resources, "line") => Number,
        (OrderEntity::Resources, "tags") => TextArray,
        (OrderEntity::Resources, "parameters") => Jsonb,
        (OrderEntity::Resources, "tag") => Other,
        (OrderEntity::Factsets, "facts") | (OrderEntity::Inventory, "facts" | "trusted") => Jsonb,
        _ if orderable_fields(entity).contains(&field) => Text,
        _ => Other,
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
        /// The entity's columns, from [`orderable_fields`].
        supported: &'static [&'static str],
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
    entity: OrderEntity,
) -> Result<(), PagingError> {
    match fields.iter().find_map(|(f, _)| match f {
        RawField::NotAString(shown) => Some(shown),
        RawField::Name(_) => None,
    }) {
        Some(shown) => Err(PagingError::UnrecognizedColumn {
            field: shown.clone(),
            supported: orderable_fields(entity),
        }),
        None => Ok(()),
    }
}

/// PuppetDB's `validate-order-by!`: every field must be one of the entity's columns.
fn resolve_columns(
    fields: Vec<(RawField, Direction)>,
    entity: OrderEntity,
) -> Result<OrderBy, PagingError> {
    not_a_string_check(&fields, entity)?;
    let supported = orderable_fields(entity);
    let mut out = Vec::with_capacity(fields.len());
    for (field, direction) in fields {
        let RawField::Name(name) = field else {
            continue; // ruled out above
        };
        // `(keyword "a/b")` has a namespace, so it never equals a column keyword.
        if clj::keyword_has_ns(&name) || !supported.contains(&name.as_str()) {
            return Err(PagingError::UnrecognizedColumn {
                field: clj::keyword_name(&name).to_owned(),
                supported,
            });
        }
        out.push(OrderField {
            kind: column_kind(entity, &name),
            field: name,
            direction,
        });
    }
    Ok(OrderBy { fields: out })
}

/// Parses the URL `order_by` parameter (already form-decoded) for `entity`, with PuppetDB's
/// checks and 400 texts. An empty, whitespace-only, `null`, `false`, `""`, `{}` or `[]` value means
/// no ordering, and text after a complete JSON value is ignored, as in PuppetDB. When `limit` or
/// `offset` may also be bad, use [`parse_paging`], which reports errors in PuppetDB's order.
pub fn parse_order_by(raw: &str, entity: OrderEntity) -> Result<OrderBy, PagingError> {
    resolve_columns(parse_order_by_structure(raw)?, entity)
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
    entity: OrderEntity,
) -> Result<Paging, PagingError> {
    let fields = order_by.map(parse_order_by_structure).transpose()?;
    if let Some(fields) = &fields {
        not_a_string_check(fields, entity)?;
    }
    let limit = limit.map(parse_limit).transpose()?;
    let offset = offset.map(parse_offset).transpose()?;
    let order_by = match fields {
        Some(fields) => resolve_columns(fields, entity)?,
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
    Text(Box<[u8]>),
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
                None => KeyPart::Text(s.into_boxed_bytes()),
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
pub struct SortKey(Vec<KeyPart>);

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

fn key_part(raw: &str, kind: ColumnKind) -> KeyPart {
    if kind == ColumnKind::JsonText {
        return KeyPart::Text(minify_json(raw).into_bytes().into_boxed_slice());
    }
    match serde_json::from_str::<Jsonb>(raw) {
        Err(_) => KeyPart::Null,
        Ok(v) if kind == ColumnKind::Jsonb => KeyPart::Jsonb(v),
        Ok(v) => KeyPart::from_json(v, kind),
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
        let ord = x.compare(y);
        let ord = match field.direction {
            Direction::Ascending => ord,
            Direction::Descending => ord.reverse(),
        };
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

// ---- timestamps ----

/// An RFC 3339 timestamp (any offset, any fractional precision) as (Unix seconds, nanoseconds).
pub(crate) fn parse_instant(s: &str) -> Option<(i64, u32)> {
    let instant =
        time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339).ok()?;
    Some((instant.unix_timestamp(), instant.nanosecond()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::{json, Value};

    const NODES_E: OrderEntity = OrderEntity::Nodes {
        include_facts_expiration: false,
    };

    fn err(raw: &str, entity: OrderEntity) -> String {
        match parse_order_by(raw, entity) {
            Ok(o) => panic!("{raw:?} parsed: {o:?}"),
            Err(e) => e.to_string(),
        }
    }

    fn fields(raw: &str, entity: OrderEntity) -> Vec<(String, Direction)> {
        parse_order_by(raw, entity)
            .expect("valid order_by")
            .fields
            .into_iter()
            .map(|f| (f.field, f.direction))
            .collect()
    }

    #[test]
    fn order_by_errors_match_puppetdb() {
        // Each expected text is what PuppetDB 7.12.1 answered for the same input.
        let facts = OrderEntity::Facts;
        assert_eq!(
            err("[x", facts),
            "Illegal value '[x' for :order_by; expected a JSON array of maps."
        );
        assert_eq!(
            err(r#"[{"field":"a",}]"#, facts),
            r#"Illegal value '[{"field":"a",}]' for :order_by; expected a JSON array of maps."#
        );
        assert_eq!(
            err(r#"{"field":"a"}"#, facts),
            r#"Illegal value '{:field "a"}' for :order_by; expected an array of maps."#
        );
        assert_eq!(
            err("[1,2]", facts),
            "Illegal value '[1 2]' for :order_by; expected an array of maps."
        );
        assert_eq!(
            err(r#"[{"field":"a"},3]"#, facts),
            r#"Illegal value '[{:field "a"} 3]' for :order_by; expected an array of maps."#
        );
        assert_eq!(
            err(r#""abc""#, facts),
            "Illegal value 'abc' for :order_by; expected an array of maps."
        );
        assert_eq!(
            err(r#"[{"order":"asc"}]"#, facts),
            r#"Illegal value '{:order "asc"}' in :order_by; missing required key field."#
        );
        assert_eq!(
            err(r#"[{"field":"name"},{"order":"desc"}]"#, facts),
            r#"Illegal value '{:order "desc"}' in :order_by; missing required key field."#
        );
        assert_eq!(
            err("[{}]", facts),
            "Illegal value '{}' in :order_by; missing required key field."
        );
        assert_eq!(
            err(r#"[{"field":"certname","order":"up"}]"#, facts),
            r#"Illegal value '{:field "certname", :order "up"}' in :order_by; 'order' must be either 'asc' or 'desc'"#
        );
        assert_eq!(
            err(r#"[{"field":"a","order":5}]"#, facts),
            r#"Illegal value '{:field "a", :order 5}' in :order_by; 'order' must be either 'asc' or 'desc'"#
        );
        assert_eq!(
            err(r#"[{"field":"a","order":"DESC "}]"#, facts),
            r#"Illegal value '{:field "a", :order "DESC "}' in :order_by; 'order' must be either 'asc' or 'desc'"#
        );
        assert_eq!(
            err(r#"[{"field":"a","x":1,"y":2}]"#, facts),
            r#"Illegal value '{:field "a", :x 1, :y 2}' in :order_by; unknown key 'x'."#
        );
        assert_eq!(
            err(r#"[{"b":1,"a":2,"field":"x","order":"y"}]"#, facts),
            r#"Illegal value '{:b 1, :a 2, :field "x", :order "y"}' in :order_by; unknown key 'b'."#
        );
        assert_eq!(
            err(
                r#"[{"a":1,"b":2,"c":3,"d":4,"e":5,"f":6,"g":7,"h":8,"field":"x"}]"#,
                facts
            ),
            r#"Illegal value '{:field "x", :e 5, :g 7, :c 3, :h 8, :b 2, :d 4, :f 6, :a 1}' in :order_by; unknown key 'e'."#
        );
        assert_eq!(
            err("5", facts),
            "Don't know how to create ISeq from: java.lang.Integer"
        );
        assert_eq!(
            err("true", facts),
            "Don't know how to create ISeq from: java.lang.Boolean"
        );
        assert_eq!(
            err("1.5", facts),
            "Don't know how to create ISeq from: java.lang.Double"
        );
        assert_eq!(
            err(r#"[{"field":"zzz"}]"#, facts),
            "Unrecognized column 'zzz' specified in :order_by; Supported columns are \
             'certname', 'environment', 'name', 'value'"
        );
        assert_eq!(
            err(
                r#"[{"field":"name"},{"field":"value","order":"desc"},{"field":"nope"}]"#,
                facts
            ),
            "Unrecognized column 'nope' specified in :order_by; Supported columns are \
             'certname', 'environment', 'name', 'value'"
        );
        assert_eq!(
            err(r#"[{"field":"certname"}]"#, OrderEntity::FactNames),
            "Unrecognized column 'certname' specified in :order_by; Supported columns are 'name'"
        );
        assert_eq!(
            err(r#"[{"field":"facts/certname"}]"#, facts),
            "Unrecognized column 'certname' specified in :order_by; Supported columns are \
             'certname', 'environment', 'name', 'value'"
        );
        assert!(err(r#"[{"field":5}]"#, facts).starts_with("Unrecognized column '5' specified"));
    }

    #[test]
    fn nodes_column_lists() {
        assert_eq!(
            err(r#"[{"field":"zzz"}]"#, NODES_E),
            "Unrecognized column 'zzz' specified in :order_by; Supported columns are \
             'latest_report_corrective_change', 'deactivated', 'expired', 'report_environment', \
             'certname', 'facts_timestamp', 'facts_environment', 'cached_catalog_status', \
             'latest_report_status', 'latest_report_hash', 'catalog_timestamp', \
             'latest_report_noop_pending', 'report_timestamp', 'latest_report_noop', \
             'catalog_environment', 'latest_report_job_id'"
        );
        assert!(parse_order_by(r#"[{"field":"expires_facts"}]"#, NODES_E).is_err());
        let with = OrderEntity::Nodes {
            include_facts_expiration: true,
        };
        assert_eq!(
            fields(
                r#"[{"field":"expires_facts_updated","order":"DESC"}]"#,
                with
            ),
            vec![("expires_facts_updated".to_owned(), Direction::Descending)]
        );
        assert_eq!(
            err(
                r#"[{"field":"x"}]"#,
                OrderEntity::EventCounts(SummarizeBy::Resource)
            ),
            "Unrecognized column 'x' specified in :order_by; Supported columns are \
             'failures', 'skips', 'successes', 'noops', 'resource_type', 'resource_title'"
        );
        assert!(parse_order_by(
            r#"[{"field":"certname"}]"#,
            OrderEntity::EventCounts(SummarizeBy::Resource)
        )
        .is_err());
    }

    #[test]
    fn order_by_accepts() {
        let facts = OrderEntity::Facts;
        assert_eq!(
            fields(
                r#"[{"field":"certname","order":"desc"},{"field":"name"}]"#,
                facts
            ),
            vec![
                ("certname".to_owned(), Direction::Descending),
                ("name".to_owned(), Direction::Ascending)
            ]
        );
        assert_eq!(
            fields(
                r#"[{"field":"name","order":"Asc"},{"order":null,"field":"value"}]"#,
                facts
            ),
            vec![
                ("name".to_owned(), Direction::Ascending),
                ("value".to_owned(), Direction::Ascending)
            ]
        );
        // PuppetDB reads one value and ignores the rest, and treats these as "no order".
        assert_eq!(fields(r#"[{"field":"name"}] junk"#, facts).len(), 1);
        for none in ["", "  ", "null", "false", "[]", " [ ] ", "{}", r#""""#] {
            assert!(fields(none, facts).is_empty(), "{none:?}");
        }
        let parsed = parse_order_by(r#"[{"field":"value"}]"#, facts).expect("valid");
        assert_eq!(parsed.fields[0].kind, ColumnKind::Jsonb);
    }

    #[test]
    fn limit_and_offset() {
        for (raw, want) in [
            ("1", Some(1)),
            ("+5", Some(5)),
            ("007", Some(7)),
            ("2147483647", Some(2_147_483_647)),
        ] {
            assert_eq!(parse_limit(raw).ok(), want, "{raw:?}");
        }
        for raw in [
            "0",
            "-0",
            "-1",
            "1.5",
            " 3",
            "3 ",
            "abc",
            "",
            "+",
            "2147483648",
            "99999999999999999999",
            "1e3",
            "٣",
        ] {
            assert_eq!(
                parse_limit(raw).map_err(|e| e.to_string()),
                Err(format!(
                    "Illegal value '{raw}' for :limit; expected a positive non-zero integer."
                )),
                "{raw:?}"
            );
        }
        for (raw, want) in [
            ("0", Some(0)),
            ("-0", Some(0)),
            ("+3", Some(3)),
            ("2147483647", Some(2_147_483_647)),
        ] {
            assert_eq!(parse_offset(raw).ok(), want, "{raw:?}");
        }
        for raw in [
            "-1",
            "1.5",
            " 3",
            "abc",
            "",
            "2147483648",
            "99999999999999999999",
        ] {
            assert_eq!(
                parse_offset(raw).map_err(|e| e.to_string()),
                Err(format!(
                    "Illegal value '{raw}' for :offset; expected a non-negative integer."
                )),
                "{raw:?}"
            );
        }
    }

    #[test]
    fn include_total_is_java_parse_boolean() {
        assert!(parse_include_total("true"));
        assert!(parse_include_total("TRUE"));
        assert!(parse_include_total("tRuE"));
        for raw in ["false", "yes", "1", "", " true"] {
            assert!(!parse_include_total(raw), "{raw:?}");
        }
    }

    #[test]
    fn paging_reports_errors_in_puppetdb_order() {
        let facts = OrderEntity::Facts;
        let e = |o, l, off| parse_paging(o, l, off, facts).map_err(|e| e.to_string());
        // A structural order_by error comes first, then limit, then offset, then the column.
        assert!(e(Some("[x"), Some("0"), None).is_err_and(|m| m.contains(":order_by")));
        assert!(
            e(Some(r#"[{"field":"zzz"}]"#), Some("0"), None).is_err_and(|m| m.contains(":limit"))
        );
        assert!(
            e(Some(r#"[{"field":"zzz"}]"#), None, Some("-1")).is_err_and(|m| m.contains(":offset"))
        );
        assert!(e(Some(r#"[{"field":"zzz"}]"#), Some("5"), Some("1"))
            .is_err_and(|m| m.contains("Unrecognized")));
        let ok = parse_paging(Some(r#"[{"field":"name"}]"#), Some("5"), Some("10"), facts)
            .expect("valid");
        assert_eq!(
            (ok.limit, ok.offset, ok.order_by.fields.len()),
            (Some(5), Some(10), 1)
        );
        assert_eq!(parse_paging(None, None, None, facts), Ok(Paging::default()));
    }

    // ---- sorting ----

    fn raw(v: &Value) -> Box<RawValue> {
        RawValue::from_string(v.to_string()).expect("serializable")
    }

    fn order(entity: OrderEntity, spec: &[(&str, Direction)]) -> OrderBy {
        OrderBy {
            fields: spec
                .iter()
                .map(|(f, d)| OrderField {
                    field: (*f).to_owned(),
                    direction: *d,
                    kind: column_kind(entity, f),
                })
                .collect(),
        }
    }

    /// Sorts JSON records and returns the values of `show`.
    fn sorted(records: &[Value], order: &OrderBy, show: &str) -> Vec<Value> {
        let raws: Vec<std::collections::BTreeMap<String, Box<RawValue>>> = records
            .iter()
            .map(|r| {
                r.as_object()
                    .expect("object record")
                    .iter()
                    .map(|(k, v)| (k.clone(), raw(v)))
                    .collect()
            })
            .collect();
        let idx: Vec<usize> = (0..records.len()).collect();
        sort_stable(idx, order, |&i| {
            sort_key(order, |f| raws[i].get(f).map(|b| &**b))
        })
        .into_iter()
        .map(|i| {
            records[i]
                .get(show)
                .cloned()
                .unwrap_or(Value::String("<missing>".into()))
        })
        .collect()
    }

    use Direction::{Ascending as Asc, Descending as Desc};

    #[test]
    fn nulls_last_ascending_first_descending() {
        let recs = vec![
            json!({"certname": "b", "report_timestamp": null}),
            json!({"certname": "a", "report_timestamp": "2026-01-01T00:00:00.000Z"}),
            json!({"certname": "c"}),
            json!({"certname": "d", "report_timestamp": "2025-01-01T00:00:00.000Z"}),
        ];
        let asc = order(NODES_E, &[("report_timestamp", Asc)]);
        assert_eq!(sorted(&recs, &asc, "certname"), vec!["d", "a", "b", "c"]);
        let desc = order(NODES_E, &[("report_timestamp", Desc)]);
        assert_eq!(sorted(&recs, &desc, "certname"), vec!["b", "c", "a", "d"]);
    }

    #[test]
    fn timestamps_are_instants() {
        assert_eq!(
            parse_instant("2026-11-30T07:04:00.123Z"),
            parse_instant("2026-11-30T08:04:00.123+01:00")
        );
        assert_eq!(
            parse_instant("2026-11-30T07:04:00Z"),
            parse_instant("2026-11-30T08:04:00.000000000+01:00")
        );
        assert_eq!(parse_instant("1970-01-01T00:00:00Z"), Some((0, 0)));
        assert_eq!(
            parse_instant("1969-12-31T23:59:59.5Z"),
            Some((-1, 500_000_000))
        );
        assert_eq!(
            parse_instant("2024-02-29T00:00:00.123456789123Z").map(|t| t.1),
            Some(123_456_789)
        );
        for bad in [
            "2026-02-30T00:00:00Z",
            "2026-11-30T07:04:00",
            "2026-11-30T24:00:00Z",
            "2026-11-30T07:04:00.Z",
            "2026-11-30T07:04:00Zx",
            "2026-11-30T07:04:00+1",
            "yesterday",
        ] {
            assert_eq!(parse_instant(bad), None, "{bad}");
        }
        let recs = vec![
            json!({"n": "later", "start_time": "2026-11-30T08:04:00.124+01:00"}),
            json!({"n": "same1", "start_time": "2026-11-30T07:04:00.123Z"}),
            json!({"n": "earlier", "start_time": "2026-11-30T09:00:00.000+03:00"}),
            json!({"n": "same2", "start_time": "2026-11-30T08:04:00.123+01:00"}),
            json!({"n": "garbage", "start_time": "0000-not-a-time"}),
        ];
        let o = order(OrderEntity::Reports, &[("start_time", Asc)]);
        assert_eq!(
            sorted(&recs, &o, "n"),
            vec!["earlier", "same1", "same2", "later", "garbage"]
        );
    }

    #[test]
    fn numbers_strings_booleans() {
        let ec = OrderEntity::EventCounts(SummarizeBy::Certname);
        let recs = vec![
            json!({"failures": 10}),
            json!({"failures": 9}),
            json!({"failures": 9.5}),
            json!({"failures": -1}),
        ];
        assert_eq!(
            sorted(&recs, &order(ec, &[("failures", Asc)]), "failures"),
            vec![json!(-1), json!(9), json!(9.5), json!(10)]
        );
        let recs = vec![
            json!({"certname": "a"}),
            json!({"certname": "B"}),
            json!({"certname": "é"}),
            json!({"certname": "ab"}),
        ];
        assert_eq!(
            sorted(&recs, &order(NODES_E, &[("certname", Asc)]), "certname"),
            vec!["B", "a", "ab", "é"]
        );
        let recs = vec![
            json!({"latest_report_noop": true}),
            json!({"latest_report_noop": null}),
            json!({"latest_report_noop": false}),
        ];
        assert_eq!(
            sorted(
                &recs,
                &order(NODES_E, &[("latest_report_noop", Asc)]),
                "latest_report_noop"
            ),
            vec![json!(false), json!(true), json!(null)]
        );
    }

    #[test]
    fn exact_number_comparison() {
        let n = |v: Value| match serde_json::from_value::<Jsonb>(v) {
            Ok(Jsonb::Num(n)) => n,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            n(json!(9_007_199_254_740_993_i64)).compare(&n(json!(9_007_199_254_740_992.0))),
            Ordering::Greater
        );
        assert_eq!(
            n(json!(u64::MAX)).compare(&n(json!(i64::MAX))),
            Ordering::Greater
        );
        assert_eq!(
            n(json!(u64::MAX)).compare(&n(json!(1.0e30))),
            Ordering::Less
        );
        assert_eq!(n(json!(-3)).compare(&n(json!(-2.5))), Ordering::Less);
        assert_eq!(n(json!(-2)).compare(&n(json!(-2.5))), Ordering::Greater);
        assert_eq!(n(json!(2)).compare(&n(json!(2.0))), Ordering::Equal);
        assert_eq!(
            n(json!(i64::MIN)).compare(&n(json!(-1.0e19))),
            Ordering::Greater
        );
    }

    #[test]
    fn facts_value_in_jsonb_order() {
        let recs: Vec<Value> = [
            json!({"a": 1}),
            json!([1]),
            json!([]),
            json!(true),
            json!(3),
            json!("s"),
            json!(null),
            json!(false),
            json!(2.5),
        ]
        .into_iter()
        .map(|v| json!({"certname": "n", "name": "f", "value": v}))
        .collect();
        let o = order(OrderEntity::Facts, &[("value", Asc)]);
        assert_eq!(
            sorted(&recs, &o, "value"),
            vec![
                json!([]),
                json!(null),
                json!("s"),
                json!(2.5),
                json!(3),
                json!(false),
                json!(true),
                json!([1]),
                json!({"a": 1})
            ]
        );
    }

    #[test]
    fn arrays_and_json_text() {
        let recs = vec![
            json!({"n": 1, "containment_path": ["Stage[main]", "Foo"]}),
            json!({"n": 2, "containment_path": ["Stage[main]"]}),
            json!({"n": 3, "containment_path": []}),
            json!({"n": 4, "containment_path": ["Stage[main]", "Bar", "X"]}),
            json!({"n": 5, "containment_path": null}),
        ];
        let o = order(OrderEntity::Events, &[("containment_path", Asc)]);
        assert_eq!(
            sorted(&recs, &o, "n"),
            vec![json!(3), json!(2), json!(4), json!(1), json!(5)]
        );
        // new_value is stored as JSON text: `"b"` (with quotes) < `1` is false: '"' (0x22) < '1'.
        let recs = vec![
            json!({"new_value": 10}),
            json!({"new_value": "b"}),
            json!({"new_value": null}),
            json!({"new_value": 9}),
            json!({"new_value": ["a"]}),
        ];
        let o = order(OrderEntity::Events, &[("new_value", Asc)]);
        assert_eq!(
            sorted(&recs, &o, "new_value"),
            vec![json!("b"), json!(10), json!(9), json!(["a"]), json!(null)]
        );
        assert_eq!(
            minify_json(" { \"a b\" : [ 1 , \"x\\\" y\" ] } "),
            r#"{"a b":[1,"x\" y"]}"#
        );
    }

    #[test]
    fn multi_field_mixed_directions() {
        let recs = vec![
            json!({"certname": "a", "end_time": "2026-01-02T00:00:00Z", "id": 1}),
            json!({"certname": "b", "end_time": "2026-01-01T00:00:00Z", "id": 2}),
            json!({"certname": "a", "end_time": "2026-01-03T00:00:00Z", "id": 3}),
            json!({"certname": "b", "end_time": "2026-01-01T00:00:00Z", "id": 4}),
            json!({"certname": "a", "id": 5}),
        ];
        let o = order(
            OrderEntity::Reports,
            &[("certname", Asc), ("end_time", Desc)],
        );
        assert_eq!(
            sorted(&recs, &o, "id"),
            vec![json!(5), json!(3), json!(1), json!(2), json!(4)]
        );
        // No order: input order.
        assert_eq!(
            sorted(&recs, &OrderBy::default(), "id"),
            (1..=5).map(|i| json!(i)).collect::<Vec<_>>()
        );
    }

    // ---- property: the key-based sort equals a naive comparator on serde_json::Value ----

    /// The ordering written directly against `Value`s, the obvious way.
    fn naive_cmp(a: &Value, b: &Value, spec: &[(&str, Direction)]) -> Ordering {
        for (field, dir) in spec {
            let (x, y) = (
                a.get(*field).unwrap_or(&Value::Null),
                b.get(*field).unwrap_or(&Value::Null),
            );
            let ord = match (x.is_null(), y.is_null()) {
                (true, true) => Ordering::Equal,
                (true, false) => Ordering::Greater,
                (false, true) => Ordering::Less,
                (false, false) => match *field {
                    "certname" => x
                        .as_str()
                        .unwrap_or("")
                        .as_bytes()
                        .cmp(y.as_str().unwrap_or("").as_bytes()),
                    "failures" => x
                        .as_f64()
                        .unwrap_or(0.0)
                        .partial_cmp(&y.as_f64().unwrap_or(0.0))
                        .unwrap_or(Ordering::Equal),
                    "noop" => x.as_bool().cmp(&y.as_bool()),
                    // Timestamps: compare the instant the generator recorded.
                    _ => a["t_ms"].as_i64().cmp(&b["t_ms"].as_i64()),
                },
            };
            let ord = if *dir == Desc { ord.reverse() } else { ord };
            if ord != Ordering::Equal {
                return ord;
            }
        }
        Ordering::Equal
    }

    fn arb_record() -> impl Strategy<Value = Value> {
        (
            prop::option::of("[aAbB_é]{0,3}"),
            prop::option::of(prop_oneof![
                (-20i64..20).prop_map(|n| json!(n)),
                (-40i64..40).prop_map(|n| json!(n as f64 / 4.0))
            ]),
            prop::option::of(any::<bool>()),
            prop::option::of((0i64..4_000_000_000_000, -14i64..15, 0usize..4)),
        )
            .prop_map(|(certname, failures, noop, t)| {
                let mut r = serde_json::Map::new();
                if let Some(c) = certname {
                    r.insert("certname".into(), json!(c));
                }
                if let Some(f) = failures {
                    r.insert("failures".into(), f);
                }
                if let Some(b) = noop {
                    r.insert("noop".into(), json!(b));
                }
                match t {
                    Some((ms, off_h, style)) => {
                        r.insert("t_ms".into(), json!(ms));
                        r.insert(
                            "end_time".into(),
                            json!(render_instant(ms, off_h * 3600, style)),
                        );
                    }
                    None => {
                        r.insert("end_time".into(), Value::Null);
                    }
                }
                Value::Object(r)
            })
    }

    /// Renders epoch milliseconds at a UTC offset in one of a few precisions.
    fn render_instant(ms: i64, offset: i64, style: usize) -> String {
        let local = ms.div_euclid(1000) + offset;
        let (days, sod) = (local.div_euclid(86_400), local.rem_euclid(86_400));
        // civil_from_days (Howard Hinnant).
        let z = days + 719_468;
        let era = z.div_euclid(146_097);
        let doe = z - era * 146_097;
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let d = doy - (153 * mp + 2) / 5 + 1;
        let m = if mp < 10 { mp + 3 } else { mp - 9 };
        let y = yoe + era * 400 + i64::from(m <= 2);
        let frac = ms.rem_euclid(1000);
        let base = format!(
            "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}",
            sod / 3600,
            sod % 3600 / 60,
            sod % 60
        );
        let frac = match style {
            0 => format!(".{frac:03}"),
            1 => format!(".{frac:03}000"),
            2 if frac % 100 == 0 => format!(".{}", frac / 100),
            _ => format!(".{frac:03}"),
        };
        let zone = if offset == 0 && style != 3 {
            "Z".to_owned()
        } else {
            format!(
                "{}{:02}:00",
                if offset < 0 { '-' } else { '+' },
                offset.abs() / 3600
            )
        };
        format!("{base}{frac}{zone}")
    }

    proptest! {
        #[test]
        fn key_sort_matches_naive_sort(
            records in prop::collection::vec(arb_record(), 0..25),
            spec in prop::collection::vec((0usize..4, any::<bool>()), 1..4),
        ) {
            let names = ["certname", "failures", "noop", "end_time"];
            let spec: Vec<(&str, Direction)> = spec.iter().map(|&(i, d)| (names[i], if d { Desc } else { Asc })).collect();
            let entity = OrderEntity::Reports;
            let mut o = order(entity, &spec);
            // `failures` is not a reports column: give it its kind by hand.
            for f in &mut o.fields {
                if f.field == "failures" {
                    f.kind = ColumnKind::Number;
                }
            }
            let got = sorted(&records, &o, "t_ms");
            let mut want = records.clone();
            want.sort_by(|a, b| naive_cmp(a, b, &spec));
            let want: Vec<Value> = want.iter().map(|r| r.get("t_ms").cloned().unwrap_or(Value::String("<missing>".into()))).collect();
            // Compare whole records to be sure ties kept their order too.
            let got_full: Vec<String> = {
                let idx: Vec<usize> = (0..records.len()).collect();
                let raws: Vec<std::collections::BTreeMap<String, Box<RawValue>>> = records.iter().map(|r| r.as_object().map(|m| m.iter().map(|(k, v)| (k.clone(), raw(v))).collect()).unwrap_or_default()).collect();
                sort_stable(idx, &o, |&i| sort_key(&o, |f| raws[i].get(f).map(|b| &**b))).into_iter().map(|i| records[i].to_string()).collect()
            };
            let mut want_full = records.clone();
            want_full.sort_by(|a, b| naive_cmp(a, b, &spec));
            let want_full: Vec<String> = want_full.iter().map(Value::to_string).collect();
            prop_assert_eq!(got, want);
            prop_assert_eq!(got_full, want_full);
        }

        #[test]
        fn instants_round_trip_across_offsets(ms in 0i64..4_000_000_000_000, off in -14i64..15, style in 0usize..4) {
            let s = render_instant(ms, off * 3600, style);
            let parsed = parse_instant(&s);
            prop_assert_eq!(parsed, Some((ms.div_euclid(1000), (ms.rem_euclid(1000) * 1_000_000) as u32)), "{}", s);
        }

        #[test]
        fn parsers_never_panic(s in ".{0,40}") {
            let _ = parse_order_by(&s, OrderEntity::Facts);
            let _ = parse_limit(&s);
            let _ = parse_offset(&s);
            let _ = parse_instant(&s);
        }
    }
}
