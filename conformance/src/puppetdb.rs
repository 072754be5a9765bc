//! A fake PuppetDB that evaluates what it is asked, for tests whose answers must follow from the
//! upstream request (ownership pushed into the query, an over-fetching `limit`, a POST body).
//!
//! A [`PuppetDb`] holds node and fact records and answers `/pdb/query/v4/nodes`, `/facts`,
//! `/facts/<name>[/<value>]`, `/fact-names` and `/environments` the way PuppetDB 7 does, for the
//! subset of the query language pdbmux itself writes or the tests use: `and`, `or`, `not`, `=`,
//! `in` over an `array`, `null?`, and a top-level `extract` of plain columns. It reads the `query`,
//! `order_by`, `limit`, `offset` and `include_total` parameters from a GET's query string or a
//! POST's JSON body, filters, sorts in PostgreSQL's order (NULL last ascending and first
//! descending, text byte-wise, timestamps as instants, fact values in jsonb order), pages, and sets
//! `X-Records` when a total is asked for. Anything it does not understand is a 400, as PuppetDB
//! answers a query it cannot parse.
//!
//! The comparison and filter functions are public so a test's reference model orders and filters
//! exactly as the fake does, independently of the core.

use std::cmp::Ordering;
use std::time::Duration;

use http::{Method, StatusCode};
use serde_json::{Map, Value};

use crate::script::{Asked, FakeBackend, Reply};

/// The entity path prefix the fake answers under.
const QUERY_V4: &str = "/pdb/query/v4/";

/// Which way an `order_by` field sorts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dir {
    /// `"asc"`: smallest first, NULL last.
    Asc,
    /// `"desc"`: largest first, NULL first.
    Desc,
}

impl Dir {
    /// The spelling in an `order_by` parameter.
    pub fn as_str(self) -> &'static str {
        match self {
            Dir::Asc => "asc",
            Dir::Desc => "desc",
        }
    }
}

/// The paging and query parameters of one request, read from a query string or a POST body.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Asking {
    /// The entity path (`/pdb/query/v4/...`), without the query string.
    pub path: String,
    /// The `query` AST, if any.
    pub query: Option<Value>,
    /// The `order_by` fields, most significant first.
    pub order_by: Vec<(String, Dir)>,
    /// `limit`.
    pub limit: Option<u64>,
    /// `offset`.
    pub offset: Option<u64>,
    /// `include_total`.
    pub include_total: bool,
    /// Every parameter name the request carried, in order (to check what was forwarded).
    pub params: Vec<String>,
}

/// A fake PuppetDB holding these records (in storage order, the order it answers an unordered
/// query in).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PuppetDb {
    /// Node records (`/nodes`), each an object with at least `certname`.
    pub nodes: Vec<Value>,
    /// Fact records (`/facts`): `certname`, `name`, `value`, `environment`.
    pub facts: Vec<Value>,
}

impl PuppetDb {
    /// An empty PuppetDB.
    pub fn new() -> PuppetDb {
        PuppetDb::default()
    }

    /// Adds an active node with this report timestamp (`None`: no report yet).
    #[must_use]
    pub fn node(mut self, certname: &str, report_timestamp: Option<&str>) -> PuppetDb {
        self.nodes.push(node_record(certname, report_timestamp));
        self
    }

    /// Adds a fact record.
    #[must_use]
    pub fn fact(
        mut self,
        certname: &str,
        name: &str,
        value: impl Into<Value>,
        environment: &str,
    ) -> PuppetDb {
        self.facts
            .push(fact_record(certname, name, value.into(), environment));
        self
    }

    /// The answer to a request: 200 with the records (and `X-Records` when asked), 400 for a
    /// request the fake cannot read, 404 for a path it does not serve.
    pub fn answer(&self, asked: &Asked<'_>) -> Reply {
        let asking = match read_asking(asked) {
            Ok(asking) => asking,
            Err(message) => return Reply::text(StatusCode::BAD_REQUEST, message),
        };
        match self.evaluate(&asking) {
            Ok(Some((records, total))) => {
                let body = Value::Array(records).to_string();
                let reply = Reply::ok(body);
                if asking.include_total {
                    reply.header("X-Records", &total.to_string())
                } else {
                    reply
                }
            }
            Ok(None) => Reply::json(
                StatusCode::NOT_FOUND,
                format!("{{\"error\":\"No such path {}\"}}", asking.path),
            ),
            Err(message) => Reply::text(StatusCode::BAD_REQUEST, message),
        }
    }

    /// Evaluates a request: the page of records and the total before paging; `None` for a path
    /// the fake does not serve.
    pub fn evaluate(&self, asking: &Asking) -> Result<Option<(Vec<Value>, usize)>, String> {
        let Some(entity) = asking.path.strip_prefix(QUERY_V4) else {
            return Ok(None);
        };
        let segments: Vec<String> = entity.split('/').map(decode_component).collect();
        let (source, fixed): (Vec<Value>, Option<Value>) = match segments.as_slice() {
            [nodes] if nodes == "nodes" => (self.nodes.clone(), None),
            [facts] if facts == "facts" => (self.facts.clone(), None),
            [facts, name] if facts == "facts" => (
                self.facts.clone(),
                Some(serde_json::json!(["=", "name", name])),
            ),
            [facts, name, value] if facts == "facts" => (
                self.facts.clone(),
                Some(serde_json::json!([
                    "and",
                    ["=", "name", name],
                    ["=", "value", value]
                ])),
            ),
            [names] if names == "fact-names" => (self.fact_names(), None),
            [environments] if environments == "environments" => (self.environments(), None),
            _ => return Ok(None),
        };
        let (filter, columns) = split_extract(asking.query.as_ref())?;
        let mut records = Vec::new();
        for record in source {
            let kept = match &fixed {
                Some(fixed) => matches(fixed, &record)?,
                None => true,
            } && match filter {
                Some(filter) => matches(filter, &record)?,
                None => true,
            };
            if kept {
                records.push(record);
            }
        }
        sort_records(&mut records, &asking.order_by);
        let total = records.len();
        let records = window(records, asking.offset, asking.limit);
        let records = match columns {
            Some(columns) => records
                .iter()
                .map(|record| project(record, &columns))
                .collect(),
            None => records,
        };
        let records = if segments.first().map(String::as_str) == Some("fact-names") {
            records
                .into_iter()
                .filter_map(|record| record.get("name").cloned())
                .collect()
        } else {
            records
        };
        Ok(Some((records, total)))
    }

    /// The distinct fact names, as `{"name": …}` records sorted by name.
    fn fact_names(&self) -> Vec<Value> {
        let mut names: Vec<&str> = self
            .facts
            .iter()
            .filter_map(|f| f.get("name").and_then(Value::as_str))
            .collect();
        names.sort_unstable();
        names.dedup();
        names
            .into_iter()
            .map(|name| serde_json::json!({ "name": name }))
            .collect()
    }

    /// The distinct environments of the facts, as `{"name": …}` records sorted by name.
    fn environments(&self) -> Vec<Value> {
        let mut names: Vec<&str> = self
            .facts
            .iter()
            .filter_map(|f| f.get("environment").and_then(Value::as_str))
            .collect();
        names.sort_unstable();
        names.dedup();
        names
            .into_iter()
            .map(|name| serde_json::json!({ "name": name }))
            .collect()
    }
}

impl FakeBackend {
    /// A backend that answers every request from this fake PuppetDB, after `latency`.
    pub fn puppetdb(name: &str, url: &str, db: PuppetDb, latency: Duration) -> FakeBackend {
        FakeBackend::by_request(name, url, move |asked| db.answer(asked).after(latency))
    }
}

/// A node record as PuppetDB 7 writes one (the fields the tests use).
pub fn node_record(certname: &str, report_timestamp: Option<&str>) -> Value {
    serde_json::json!({
        "certname": certname,
        "deactivated": null,
        "report_timestamp": report_timestamp,
    })
}

/// A fact record.
pub fn fact_record(certname: &str, name: &str, value: Value, environment: &str) -> Value {
    serde_json::json!({
        "certname": certname,
        "name": name,
        "value": value,
        "environment": environment,
    })
}

/// Reads a request's path and parameters: the query string of a GET, or the JSON body of a POST.
pub fn read_asking(asked: &Asked<'_>) -> Result<Asking, String> {
    let (path, raw_query) = match asked.path_and_query.split_once('?') {
        Some((path, query)) => (path, Some(query)),
        None => (asked.path_and_query, None),
    };
    let mut asking = Asking {
        path: path.to_owned(),
        ..Asking::default()
    };
    if *asked.method == Method::POST {
        let body = asked.body.ok_or("a POST without a body")?;
        let object: Map<String, Value> = serde_json::from_slice(body)
            .map_err(|e| format!("the POST body is not a JSON object: {e}"))?;
        for (key, value) in object {
            asking.params.push(key.clone());
            match key.as_str() {
                "query" => asking.query = query_value(value)?,
                "order_by" => asking.order_by = order_by_value(&value)?,
                "limit" => asking.limit = Some(integer_value("limit", &value)?),
                "offset" => asking.offset = Some(integer_value("offset", &value)?),
                "include_total" => asking.include_total = value == Value::Bool(true),
                _ => {}
            }
        }
        if raw_query.is_some() {
            return Err("a POST with a query string".to_owned());
        }
        return Ok(asking);
    }
    if *asked.method != Method::GET {
        return Err(format!("method {} not served", asked.method));
    }
    for piece in raw_query.unwrap_or_default().split('&') {
        if piece.is_empty() {
            continue;
        }
        let (key, value) = piece.split_once('=').unwrap_or((piece, ""));
        let (key, value) = (decode_component(key), decode_component(value));
        asking.params.push(key.clone());
        match key.as_str() {
            "query" => asking.query = query_value(Value::String(value))?,
            "order_by" => {
                let parsed: Value = serde_json::from_str(&value)
                    .map_err(|e| format!("order_by is not JSON: {e}"))?;
                asking.order_by = order_by_value(&parsed)?;
            }
            "limit" => asking.limit = Some(integer_value("limit", &Value::String(value))?),
            "offset" => asking.offset = Some(integer_value("offset", &Value::String(value))?),
            "include_total" => asking.include_total = value.eq_ignore_ascii_case("true"),
            _ => {}
        }
    }
    Ok(asking)
}

/// Form-decodes one query-string component: `+` is a space, `%xx` a byte (lossy UTF-8).
pub fn decode_component(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        match bytes[index] {
            b'+' => out.push(b' '),
            b'%' if index + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[index + 1..index + 3]).ok();
                match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    Some(byte) => {
                        out.push(byte);
                        index += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            byte => out.push(byte),
        }
        index += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn query_value(value: Value) -> Result<Option<Value>, String> {
    match value {
        Value::String(text) if text.trim().is_empty() => Ok(None),
        Value::String(text) if text.trim_start().starts_with('[') => serde_json::from_str(&text)
            .map(Some)
            .map_err(|e| format!("query is not JSON: {e}")),
        Value::String(text) => Err(format!("PQL is not served by the fake: {text}")),
        Value::Array(_) => Ok(Some(value)),
        other => Err(format!("query is neither an AST nor text: {other}")),
    }
}

fn order_by_value(value: &Value) -> Result<Vec<(String, Dir)>, String> {
    let fields = value.as_array().ok_or("order_by is not an array")?;
    fields
        .iter()
        .map(|field| {
            let name = field
                .get("field")
                .and_then(Value::as_str)
                .ok_or("order_by field without a name")?;
            let dir = match field.get("order").and_then(Value::as_str) {
                None => Dir::Asc,
                Some(order) if order.eq_ignore_ascii_case("asc") => Dir::Asc,
                Some(order) if order.eq_ignore_ascii_case("desc") => Dir::Desc,
                Some(order) => return Err(format!("bad order {order}")),
            };
            Ok((name.to_owned(), dir))
        })
        .collect()
}

fn integer_value(name: &str, value: &Value) -> Result<u64, String> {
    let parsed = match value {
        Value::Number(n) => n.as_u64(),
        Value::String(s) => s.parse().ok(),
        _ => None,
    };
    parsed.ok_or_else(|| format!("Illegal value '{value}' for :{name}"))
}

/// A top-level `["extract", columns, filter?]` split into its filter and its plain columns; any
/// other query is all filter.
fn split_extract(query: Option<&Value>) -> Result<(Option<&Value>, Option<Vec<String>>), String> {
    let Some(query) = query else {
        return Ok((None, None));
    };
    let Some(("extract", items)) = form(query) else {
        return Ok((Some(query), None));
    };
    let columns = match items.first() {
        Some(Value::String(column)) => vec![column.clone()],
        Some(Value::Array(columns)) => columns
            .iter()
            .map(|c| {
                c.as_str()
                    .map(str::to_owned)
                    .ok_or_else(|| format!("extract column {c} is not served by the fake"))
            })
            .collect::<Result<_, _>>()?,
        _ => return Err("extract without columns".to_owned()),
    };
    match items.get(1) {
        None => Ok((None, Some(columns))),
        Some(filter) if items.len() == 2 => Ok((Some(filter), Some(columns))),
        Some(_) => Err("extract with group_by is not served by the fake".to_owned()),
    }
}

fn form(node: &Value) -> Option<(&str, &[Value])> {
    let items = node.as_array()?;
    let (op, rest) = items.split_first()?;
    Some((op.as_str()?, rest))
}

/// Whether a record matches a filter: `and`, `or`, `not`, `=`, `in` over an `array`, `null?`.
pub fn matches(filter: &Value, record: &Value) -> Result<bool, String> {
    let (op, args) = form(filter).ok_or_else(|| format!("not a query: {filter}"))?;
    match (op, args) {
        ("and", clauses) => {
            for clause in clauses {
                if !matches(clause, record)? {
                    return Ok(false);
                }
            }
            Ok(true)
        }
        ("or", clauses) => {
            for clause in clauses {
                if matches(clause, record)? {
                    return Ok(true);
                }
            }
            Ok(false)
        }
        ("not", [clause]) => Ok(!matches(clause, record)?),
        ("=", [Value::String(field), value]) => Ok(record.get(field) == Some(value)),
        ("in", [Value::String(field), list]) => match form(list) {
            Some(("array", [Value::Array(values)])) => {
                Ok(record.get(field).is_some_and(|v| values.contains(v)))
            }
            _ => Err(format!("in over {list} is not served by the fake")),
        },
        ("null?", [Value::String(field), Value::Bool(null)]) => {
            Ok(record.get(field).is_none_or(Value::is_null) == *null)
        }
        _ => Err(format!("operator {op} is not served by the fake: {filter}")),
    }
}

/// The certnames a query excludes with pdbmux's ownership clause
/// `["not",["in","certname",["array",[…]]]]`, wherever it sits under `and` or an `extract`.
pub fn excluded_certnames(query: Option<&Value>) -> Vec<String> {
    fn walk(node: &Value, out: &mut Vec<String>) {
        match form(node) {
            Some(("not", [inner])) => {
                if let Some(("in", [Value::String(field), list])) = form(inner) {
                    if field == "certname" {
                        if let Some(("array", [Value::Array(values)])) = form(list) {
                            out.extend(values.iter().filter_map(Value::as_str).map(str::to_owned));
                        }
                    }
                }
            }
            Some(("and" | "extract", items)) => items.iter().for_each(|item| walk(item, out)),
            _ => {}
        }
    }
    let mut out = Vec::new();
    if let Some(query) = query {
        walk(query, &mut out);
    }
    out
}

fn project(record: &Value, columns: &[String]) -> Value {
    let mut out = Map::new();
    for column in columns {
        out.insert(
            column.clone(),
            record.get(column).cloned().unwrap_or(Value::Null),
        );
    }
    Value::Object(out)
}

/// `offset` then `limit` over a sorted list.
pub fn window<T>(items: Vec<T>, offset: Option<u64>, limit: Option<u64>) -> Vec<T> {
    let skip = usize::try_from(offset.unwrap_or(0)).unwrap_or(usize::MAX);
    let take = limit.map_or(usize::MAX, |l| usize::try_from(l).unwrap_or(usize::MAX));
    items.into_iter().skip(skip).take(take).collect()
}

/// Sorts records by `order_by`, stably (ties keep their order), in PostgreSQL's order.
pub fn sort_records(records: &mut [Value], order_by: &[(String, Dir)]) {
    records.sort_by(|a, b| compare_records(a, b, order_by));
}

/// Compares two records by `order_by` in PostgreSQL's order.
pub fn compare_records(a: &Value, b: &Value, order_by: &[(String, Dir)]) -> Ordering {
    for (field, dir) in order_by {
        let ordering = compare_column(field, a.get(field), b.get(field));
        let ordering = match dir {
            Dir::Asc => ordering,
            Dir::Desc => ordering.reverse(),
        };
        if ordering != Ordering::Equal {
            return ordering;
        }
    }
    Ordering::Equal
}

/// Columns PuppetDB stores as `timestamptz`.
const TIMESTAMP_COLUMNS: [&str; 9] = [
    "report_timestamp",
    "facts_timestamp",
    "catalog_timestamp",
    "expires_facts_updated",
    "receive_time",
    "start_time",
    "end_time",
    "producer_timestamp",
    "timestamp",
];

/// Columns PuppetDB stores as `jsonb`.
const JSONB_COLUMNS: [&str; 4] = ["value", "parameters", "facts", "trusted"];

/// Compares one column's values ascending, SQL NULL (missing, or JSON null outside jsonb) greater
/// than everything, so it sorts last ascending and first descending.
pub fn compare_column(field: &str, a: Option<&Value>, b: Option<&Value>) -> Ordering {
    let jsonb = JSONB_COLUMNS.contains(&field);
    let sql_null = |v: Option<&Value>| match v {
        None => true,
        Some(Value::Null) => !jsonb,
        Some(_) => false,
    };
    match (sql_null(a), sql_null(b)) {
        (true, true) => return Ordering::Equal,
        (true, false) => return Ordering::Greater,
        (false, true) => return Ordering::Less,
        (false, false) => {}
    }
    let (Some(a), Some(b)) = (a, b) else {
        return Ordering::Equal;
    };
    if jsonb {
        return compare_jsonb(a, b);
    }
    if TIMESTAMP_COLUMNS.contains(&field) {
        if let (Some(x), Some(y)) = (
            a.as_str().and_then(parse_instant),
            b.as_str().and_then(parse_instant),
        ) {
            return x.cmp(&y);
        }
    }
    compare_scalar(a, b)
}

/// Scalars of one SQL type: text byte-wise (C collation), numbers numerically, false < true.
fn compare_scalar(a: &Value, b: &Value) -> Ordering {
    match (a, b) {
        (Value::String(a), Value::String(b)) => a.as_bytes().cmp(b.as_bytes()),
        (Value::Number(a), Value::Number(b)) => {
            let (a, b) = (a.as_f64().unwrap_or(0.0), b.as_f64().unwrap_or(0.0));
            a.partial_cmp(&b).unwrap_or(Ordering::Equal)
        }
        (Value::Bool(a), Value::Bool(b)) => a.cmp(b),
        _ => a.to_string().cmp(&b.to_string()),
    }
}

/// jsonb's btree order for scalars: null < string < number < boolean < array < object; within a
/// kind strings byte-wise (C collation), numbers numerically, false < true. Arrays and objects
/// are not generated by the tests and compare by their text.
pub fn compare_jsonb(a: &Value, b: &Value) -> Ordering {
    let rank = |v: &Value| match v {
        Value::Null => 0,
        Value::String(_) => 1,
        Value::Number(_) => 2,
        Value::Bool(_) => 3,
        Value::Array(_) => 4,
        Value::Object(_) => 5,
    };
    rank(a).cmp(&rank(b)).then_with(|| compare_scalar(a, b))
}

/// An RFC 3339 timestamp (`YYYY-MM-DDTHH:MM:SS[.fff…](Z|±HH:MM)`) as (seconds since the epoch,
/// nanoseconds).
pub fn parse_instant(text: &str) -> Option<(i64, u32)> {
    let bytes = text.as_bytes();
    if bytes.len() < 20 || bytes[4] != b'-' || bytes[7] != b'-' || bytes[13] != b':' {
        return None;
    }
    if !matches!(bytes[10], b'T' | b't' | b' ') || bytes[16] != b':' {
        return None;
    }
    let number = |range: std::ops::Range<usize>| -> Option<i64> {
        let part = text.get(range)?;
        part.bytes()
            .all(|b| b.is_ascii_digit())
            .then(|| part.parse().ok())?
    };
    let (year, month, day) = (number(0..4)?, number(5..7)?, number(8..10)?);
    let (hour, minute, second) = (number(11..13)?, number(14..16)?, number(17..19)?);
    let mut rest = &text[19..];
    let mut nanos = 0u32;
    if let Some(fraction) = rest.strip_prefix('.') {
        let digits = fraction.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return None;
        }
        let mut padded: String = fraction[..digits].chars().take(9).collect();
        while padded.len() < 9 {
            padded.push('0');
        }
        nanos = padded.parse().ok()?;
        rest = &fraction[digits..];
    }
    let offset = match rest {
        "Z" | "z" => 0,
        _ => {
            let sign = match rest.as_bytes().first()? {
                b'+' => 1,
                b'-' => -1,
                _ => return None,
            };
            if rest.len() != 6 || rest.as_bytes()[3] != b':' {
                return None;
            }
            let hours: i64 = rest.get(1..3)?.parse().ok()?;
            let minutes: i64 = rest.get(4..6)?.parse().ok()?;
            sign * (hours * 3600 + minutes * 60)
        }
    };
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some((
        days * 86_400 + hour * 3600 + minute * 60 + second - offset,
        nanos,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instants_compare_across_offsets() {
        let z = parse_instant("2024-05-01T10:00:00.000Z");
        assert_eq!(z, parse_instant("2024-05-01T12:00:00+02:00"));
        assert_eq!(parse_instant("1970-01-01T00:00:01Z"), Some((1, 0)));
        assert!(parse_instant("2024-05-01T10:00:00.5Z") > z);
        assert_eq!(parse_instant("yesterday"), None);
    }

    #[test]
    fn nulls_sort_last_ascending_and_first_descending() {
        let mut records = vec![
            serde_json::json!({"certname": "b", "report_timestamp": null}),
            serde_json::json!({"certname": "a", "report_timestamp": "2024-05-01T10:00:00.000Z"}),
            serde_json::json!({"certname": "c", "report_timestamp": "2024-05-01T09:00:00.000Z"}),
        ];
        let names = |records: &[Value]| -> Vec<String> {
            records
                .iter()
                .map(|r| r["certname"].as_str().unwrap_or_default().to_owned())
                .collect()
        };
        sort_records(&mut records, &[("report_timestamp".to_owned(), Dir::Asc)]);
        assert_eq!(names(&records), ["c", "a", "b"]);
        sort_records(&mut records, &[("report_timestamp".to_owned(), Dir::Desc)]);
        assert_eq!(names(&records), ["b", "a", "c"]);
    }

    #[test]
    fn the_fake_evaluates_the_ownership_clause_limit_and_total() {
        let db = PuppetDb::new()
            .node("a", Some("2024-05-01T10:00:00.000Z"))
            .node("b", None)
            .node("c", Some("2024-05-01T09:00:00.000Z"));
        let target = "/pdb/query/v4/nodes?query=%5B%22not%22%2C%5B%22in%22%2C%22certname%22%2C%5B%22array%22%2C%5B%22a%22%5D%5D%5D%5D&order_by=%5B%7B%22field%22%3A%22certname%22%2C%22order%22%3A%22desc%22%7D%5D&limit=1&include_total=true";
        let reply = db.answer(&Asked::get(target));
        let crate::ReplyOutcome::Answer(answer) = reply.outcome else {
            panic!("an answer");
        };
        assert_eq!(answer.status, StatusCode::OK);
        assert_eq!(
            String::from_utf8_lossy(&answer.body),
            r#"[{"certname":"c","deactivated":null,"report_timestamp":"2024-05-01T09:00:00.000Z"}]"#
        );
        assert_eq!(answer.headers, [("X-Records".to_owned(), "2".to_owned())]);
        let post = br#"{"query":["extract",["certname"],["not",["in","certname",["array",["b","c"]]]]],"limit":5}"#;
        let asked = Asked {
            method: &Method::POST,
            path_and_query: "/pdb/query/v4/nodes",
            body: Some(post),
        };
        let asking = read_asking(&asked).expect("readable");
        assert_eq!(excluded_certnames(asking.query.as_ref()), ["b", "c"]);
        let evaluated = db.evaluate(&asking).expect("served");
        assert_eq!(
            evaluated,
            Some((vec![serde_json::json!({"certname": "a"})], 1))
        );
    }

    #[test]
    fn components_decode_like_forms() {
        assert_eq!(decode_component("a+b%20c%5B"), "a b c[");
        assert_eq!(decode_component("100%"), "100%");
        assert_eq!(decode_component("%zz"), "%zz");
    }
}
