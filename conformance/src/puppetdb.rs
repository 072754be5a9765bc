//! A fake PuppetDB that evaluates what it is asked, for tests whose answers must follow from the
//! upstream request (ownership pushed into the query, an over-fetching `limit`, a POST body).
//!
//! A [`PuppetDb`] holds node, fact and resource records and answers `/pdb/query/v4/nodes`,
//! `/facts`, `/facts/<name>[/<value>]`, `/fact-names`, `/environments` and `/resources` the way
//! PuppetDB 7 does, for the subset of the query language pdbmux itself writes or the tests use:
//! `and`, `or`, `not`, `=`, `<`, `<=`, `>`, `>=`, `in` over an `array`, `null?`, a top-level
//! `["from", entity, query?, paging…]` with in-query `limit`, `offset` and `order_by`, and a
//! top-level `extract` of plain columns, `jsonb_typeof`, `to_string` of a time (the membership
//! refresh's [`TIME_FORMAT`] alone), or aggregates (see [`aggregate`]): the
//! functions `count` (of rows, or of a column's non-null values), `sum`, `avg`, `min` and `max`
//! with an optional filter and `["group_by", field, …]`. It reads the `query`, `order_by`,
//! `limit`, `offset` and `include_total` parameters from a GET's query string or a POST's JSON
//! body (the URL form wins over the in-query form, field by field), filters, sorts in PostgreSQL's
//! order (NULL last ascending and first descending, text byte-wise, timestamps as instants, fact
//! values in jsonb order), pages, and sets `X-Records` when a total is asked for. Anything it does
//! not understand is a 400, as PuppetDB answers a query it cannot parse.
//!
//! The comparison and filter functions are public so a test's reference model orders and filters
//! exactly as the fake does, independently of the core.

use std::cmp::Ordering;
use std::time::Duration;

use http::{Method, StatusCode};
use serde_json::{Map, Value};

use pdbmux_core::membership::{
    CATALOGS_PRODUCED_QUERY, FACTS_PRODUCED_QUERY, TIME_FORMAT, TIME_KEY,
};

use crate::script::{Asked, FakeBackend, Reply, ReplyOutcome};

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
    /// Resource records (`/resources`): `certname`, `type`, `title`, `line`, `exported`,
    /// `environment`.
    pub resources: Vec<Value>,
    /// Report records (`/reports`): `hash`, `certname`, `end_time`, `status`.
    pub reports: Vec<Value>,
    /// Records of any other entity, by its path segment (`catalogs`, `factsets`, `edges`, …).
    pub entities: std::collections::BTreeMap<String, Vec<Value>>,
    /// What the root endpoint answers `query=<PQL>&ast_only=true` with, by PQL text; other PQL
    /// gets PuppetDB's 400.
    pub translations: std::collections::BTreeMap<String, Value>,
    /// When a node's factset (`"factsets"`) or catalog (`"catalogs"`) was produced (`None`: it
    /// has none), by (segment, certname), where it differs from its report time (see
    /// [`produced_at_report_time`]).
    pub produced: std::collections::BTreeMap<(String, String), Option<String>>,
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

    /// Adds a resource (`line`: `None` for a resource with no line, SQL NULL).
    #[must_use]
    pub fn resource(
        mut self,
        certname: &str,
        resource_type: &str,
        title: &str,
        line: Option<i64>,
    ) -> PuppetDb {
        self.resources
            .push(resource_record(certname, resource_type, title, line));
        self
    }

    /// Adds a report (its `hash` is what makes two copies one report).
    #[must_use]
    pub fn report(mut self, hash: &str, certname: &str, end_time: &str, status: &str) -> PuppetDb {
        self.reports.push(serde_json::json!({
            "hash": hash,
            "certname": certname,
            "end_time": end_time,
            "status": status,
        }));
        self
    }

    /// Adds a record of `entity` (its path segment under `/pdb/query/v4/`).
    #[must_use]
    pub fn record(mut self, entity: &str, record: Value) -> PuppetDb {
        self.entities
            .entry(entity.to_owned())
            .or_default()
            .push(record);
        self
    }

    /// Says the node's factset (`segment` `"factsets"`) or catalog (`"catalogs"`) was produced
    /// at `at` (`None`: it has none) rather than in the run of its latest report.
    #[must_use]
    pub fn produced(mut self, segment: &str, certname: &str, at: Option<&str>) -> PuppetDb {
        self.produced.insert(
            (segment.to_owned(), certname.to_owned()),
            at.map(str::to_owned),
        );
        self
    }

    /// Teaches the root endpoint the AST `pql` translates to.
    #[must_use]
    pub fn translation(mut self, pql: &str, ast: Value) -> PuppetDb {
        self.translations.insert(pql.to_owned(), ast);
        self
    }

    /// The root endpoint's answer to `query=<PQL>&ast_only=true`, as PuppetDB 7.12.1 gives it:
    /// the AST, or a 400 naming the PQL it cannot parse. `None` for any other request.
    fn translate(&self, asked: &Asked<'_>) -> Option<Reply> {
        let (path, raw) = asked.path_and_query.split_once('?')?;
        if path != QUERY_V4.trim_end_matches('/') {
            return None;
        }
        let mut pql = None;
        let mut ast_only = false;
        for piece in raw.split('&') {
            let (key, value) = piece.split_once('=').unwrap_or((piece, ""));
            match decode_component(key).as_str() {
                "query" => pql = Some(decode_component(value)),
                "ast_only" => ast_only = decode_component(value) == "true",
                _ => {}
            }
        }
        let pql = pql.filter(|_| ast_only)?;
        Some(match self.translations.get(&pql) {
            Some(ast) => Reply::ok(ast.to_string()),
            None => Reply::text(
                StatusCode::BAD_REQUEST,
                format!("PQL parse error at line 1, column 1:\n\n{pql}\n^\n\nExpected one of:\n\n<entity>"),
            ),
        })
    }

    /// The answer to a request: 200 with the records (and `X-Records` when asked), 400 for a
    /// request the fake cannot read, 404 for a path it does not serve; on the root endpoint, a
    /// PQL translation ([`PuppetDb::translation`]).
    pub fn answer(&self, asked: &Asked<'_>) -> Reply {
        if let Some(reply) = self.translate(asked) {
            return reply;
        }
        if let Some(segment) = produced_query_entity(asked.path_and_query) {
            return Reply::ok(self.produced_rows(segment).to_string());
        }
        let asking = match read_asking(asked) {
            Ok(asking) => asking,
            Err(message) => return Reply::text(StatusCode::BAD_REQUEST, message),
        };
        if let Some(reply) = self.parent(&asking.path) {
            return reply;
        }
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

    /// Evaluates a request: the page of records (or aggregate rows) and the total before paging;
    /// `None` for a path the fake does not serve.
    pub fn evaluate(&self, asking: &Asking) -> Result<Option<(Vec<Value>, usize)>, String> {
        let Some(entity) = asking.path.strip_prefix(QUERY_V4) else {
            return Ok(None);
        };
        let segments: Vec<String> = entity.split('/').map(decode_component).collect();
        let (source, fixed): (Vec<Value>, Option<Value>) = match segments.as_slice() {
            // Records added with `record` answer their entity, whichever it is.
            [entity] if self.entities.contains_key(entity) => (self.entities[entity].clone(), None),
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
            [resources] if resources == "resources" => (self.resources.clone(), None),
            [reports] if reports == "reports" => (self.reports.clone(), None),
            _ => return Ok(None),
        };
        let query = read_query(asking.query.as_ref())?;
        let order_by = if asking.order_by.is_empty() {
            query.order_by.clone()
        } else {
            asking.order_by.clone()
        };
        let (offset, limit) = (asking.offset.or(query.offset), asking.limit.or(query.limit));
        let mut records = Vec::new();
        for record in source {
            let kept = match &fixed {
                Some(fixed) => matches(fixed, &record)?,
                None => true,
            } && match query.filter {
                Some(filter) => matches(filter, &record)?,
                None => true,
            };
            if kept {
                records.push(record);
            }
        }
        let aggregating =
            query.group_by.is_some() || query.columns.iter().flatten().any(Column::is_aggregate);
        let (records, total) = if aggregating {
            let columns = query.columns.as_deref().unwrap_or_default();
            let group_by = query.group_by.as_deref().unwrap_or_default();
            let mut rows = aggregate(&records, columns, group_by)?;
            sort_records(&mut rows, &order_by);
            let total = rows.len();
            (window(rows, offset, limit), total)
        } else {
            sort_records(&mut records, &order_by);
            let total = records.len();
            let records = window(records, offset, limit);
            let records = match &query.columns {
                Some(columns) => records
                    .iter()
                    .map(|record| project(record, columns))
                    .collect::<Result<_, _>>()?,
                None => records,
            };
            (records, total)
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
    /// The membership refresh's producer times of `segment` (`factsets` or `catalogs`): each
    /// node's report time unless [`PuppetDb::produced`] said otherwise.
    fn produced_rows(&self, segment: &str) -> Value {
        let mut rows = produced_at_report_time(&self.nodes);
        let Value::Array(list) = &mut rows else {
            return rows;
        };
        for ((kind, certname), at) in &self.produced {
            if kind != segment {
                continue;
            }
            list.retain(|row| row["certname"] != certname.as_str());
            if let Some(at) = at {
                list.push(serde_json::json!({
                    "certname": certname,
                    (TIME_KEY): written_by_postgresql(at),
                }));
            }
        }
        rows
    }

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

    /// `/environments/<env>`: the environment's record when a fact names it, else PuppetDB's
    /// 404; `None` for any other path.
    fn parent(&self, path: &str) -> Option<Reply> {
        let raw = path.strip_prefix("/pdb/query/v4/environments/")?;
        if raw.contains('/') {
            return None;
        }
        let name = decode_component(raw);
        let known = self.environments().into_iter().find(|e| e["name"] == name);
        Some(match known {
            Some(record) => Reply::ok(record.to_string()),
            None => Reply::json(
                StatusCode::NOT_FOUND,
                serde_json::json!({
                    "error": format!("No information is known about environment {name}")
                })
                .to_string(),
            ),
        })
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

/// Which entity a producer-time query of the membership refresh asks (`factsets` or
/// `catalogs`: [`FACTS_PRODUCED_QUERY`] or [`CATALOGS_PRODUCED_QUERY`]), if it is one.
pub fn produced_query_entity(path_and_query: &str) -> Option<&'static str> {
    [
        ("factsets", FACTS_PRODUCED_QUERY),
        ("catalogs", CATALOGS_PRODUCED_QUERY),
    ]
    .into_iter()
    .find(|(_, every)| path_and_query == *every)
    .map(|(entity, _)| entity)
}

/// The answer to a producer-time query of the membership refresh (`/factsets` or `/catalogs`,
/// each node's `producer_timestamp` as [`TIME_FORMAT`] writes it) from a backend whose nodes
/// each produced their facts and catalog in the run of their latest report: one row per node
/// record (objects with `certname` and `report_timestamp`, or the membership query's rows,
/// whose time is under [`TIME_KEY`]), produced at its report time; none for a node without a
/// report. A test that needs the kinds apart answers these queries itself.
pub fn produced_at_report_time(nodes: &[Value]) -> Value {
    let rows = nodes
        .iter()
        .filter_map(|node| {
            let certname = node.get("certname")?;
            let at = [TIME_KEY, "report_timestamp"]
                .iter()
                .find_map(|key| node.get(*key)?.as_str())?;
            Some(serde_json::json!({ "certname": certname, (TIME_KEY): written_by_postgresql(at) }))
        })
        .collect();
    Value::Array(rows)
}

/// The answer to the membership refresh's `/nodes` query (`MEMBERSHIP_QUERY`) of a backend
/// holding these node records (objects with PuppetDB's fields): each node's certname, report
/// time as [`TIME_FORMAT`] writes it, and whether it is deactivated or expired.
pub fn membership_rows(nodes: &[Value]) -> Value {
    let field = |node: &Value, key: &str| node.get(key).cloned().unwrap_or(Value::Null);
    let rows = nodes
        .iter()
        .map(|node| {
            let report = node.get("report_timestamp").and_then(Value::as_str);
            serde_json::json!({
                "certname": field(node, "certname"),
                (TIME_KEY): report.map(written_by_postgresql),
                "deactivated": field(node, "deactivated"),
                "expired": field(node, "expired"),
            })
        })
        .collect();
    Value::Array(rows)
}

/// A timestamp as PuppetDB answers it in a `to_string` column with [`TIME_FORMAT`]: PostgreSQL's
/// `to_char` in a UTC session, so `2024-05-01T10:00:00.000Z` is
/// `2024-05-01T10:00:00.000000+00`. Text that is not an RFC 3339 time is given back as it is
/// (PostgreSQL holds none, but a test may script one).
pub fn written_by_postgresql(timestamp: &str) -> String {
    use time::format_description::well_known::Rfc3339;
    let written = time::macros::format_description!(
        "[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:6]+00"
    );
    time::OffsetDateTime::parse(timestamp, &Rfc3339)
        .ok()
        .and_then(|at| at.to_offset(time::UtcOffset::UTC).format(&written).ok())
        .unwrap_or_else(|| timestamp.to_owned())
}

/// The producer-time reply of a scripted backend whose membership reply is `membership`, under
/// the model of [`produced_at_report_time`]: an answer that is not a JSON array (or not an
/// answer at all) is given back as it is, so a failing membership fails every part of it.
pub fn produced_in_runs(membership: &Reply) -> Reply {
    if let ReplyOutcome::Answer(answer) = &membership.outcome {
        if let Ok(Value::Array(nodes)) = serde_json::from_slice::<Value>(&answer.body) {
            return Reply {
                outcome: ReplyOutcome::Answer(crate::script::ScriptedAnswer {
                    body: produced_at_report_time(&nodes).to_string().into(),
                    ..answer.clone()
                }),
                ..membership.clone()
            };
        }
    }
    membership.clone()
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

/// A resource record (the fields the tests use).
pub fn resource_record(
    certname: &str,
    resource_type: &str,
    title: &str,
    line: Option<i64>,
) -> Value {
    serde_json::json!({
        "certname": certname,
        "type": resource_type,
        "title": title,
        "line": line,
        "exported": false,
        "environment": "production",
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

/// One column of a top-level `extract`.
#[derive(Debug, Clone, PartialEq)]
pub enum Column {
    /// A plain field.
    Field(String),
    /// `["function", name, args…]`.
    Function {
        /// The function name (`count`, `sum`, `avg`, `min`, `max`, `jsonb_typeof`).
        name: String,
        /// Its arguments.
        args: Vec<Value>,
    },
}

impl Column {
    /// Whether this is an aggregate function (one row per group rather than per record).
    pub fn is_aggregate(&self) -> bool {
        matches!(self, Column::Function { name, .. }
            if matches!(name.as_str(), "count" | "sum" | "avg" | "min" | "max"))
    }

    fn read(column: &Value) -> Result<Column, String> {
        match column {
            Value::String(field) => Ok(Column::Field(field.clone())),
            Value::Array(items) if items.first() == Some(&Value::from("function")) => {
                let name = items
                    .get(1)
                    .and_then(Value::as_str)
                    .ok_or_else(|| format!("function without a name: {column}"))?;
                Ok(Column::Function {
                    name: name.to_owned(),
                    args: items[2..].to_vec(),
                })
            }
            other => Err(format!("extract column {other} is not served by the fake")),
        }
    }
}

/// A query read: its filter, the extract's columns and `group_by`, and in-query paging.
#[derive(Debug, Default)]
struct Query<'a> {
    filter: Option<&'a Value>,
    columns: Option<Vec<Column>>,
    group_by: Option<Vec<String>>,
    order_by: Vec<(String, Dir)>,
    limit: Option<u64>,
    offset: Option<u64>,
}

/// Reads a query: a top-level `from` (its entity is the path's) with its query and paging
/// clauses, then a top-level `["extract", columns, filter?, group_by?]`; any other query is all
/// filter.
fn read_query(query: Option<&Value>) -> Result<Query<'_>, String> {
    let mut read = Query::default();
    let Some(mut query) = query else {
        return Ok(read);
    };
    if let Some(("from", items)) = form(query) {
        let mut inner = None;
        for item in items.iter().skip(1) {
            match form(item) {
                Some(("limit", [n])) => read.limit = Some(integer_value("limit", n)?),
                Some(("offset", [n])) => read.offset = Some(integer_value("offset", n)?),
                Some(("order_by", [Value::Array(fields)])) => {
                    read.order_by = in_query_order(fields)?
                }
                Some(("limit" | "offset" | "order_by", _)) => {
                    return Err(format!("bad paging clause {item}"))
                }
                _ if inner.is_none() => inner = Some(item),
                _ => return Err(format!("from with two queries: {query}")),
            }
        }
        match inner {
            Some(inner) => query = inner,
            None => return Ok(read),
        }
    }
    let Some(("extract", items)) = form(query) else {
        read.filter = Some(query);
        return Ok(read);
    };
    read.columns = Some(match items.first() {
        Some(Value::String(column)) => vec![Column::Field(column.clone())],
        Some(Value::Array(columns)) if columns.first() == Some(&Value::from("function")) => {
            vec![Column::read(&Value::Array(columns.clone()))?]
        }
        Some(Value::Array(columns)) => {
            columns.iter().map(Column::read).collect::<Result<_, _>>()?
        }
        _ => return Err("extract without columns".to_owned()),
    });
    for item in &items[1..] {
        match form(item) {
            Some(("group_by", fields)) => {
                let fields = fields
                    .iter()
                    .map(|f| {
                        f.as_str()
                            .map(str::to_owned)
                            .ok_or_else(|| format!("group_by {f} is not served by the fake"))
                    })
                    .collect::<Result<_, _>>()?;
                read.group_by = Some(fields);
            }
            _ if item.is_null() => {}
            _ if read.filter.is_none() && read.group_by.is_none() => read.filter = Some(item),
            _ => return Err(format!("extract clause {item} is not served by the fake")),
        }
    }
    Ok(read)
}

/// An in-query `order_by`: `field`, `[field]` or `[field, "asc"|"desc"]` each.
fn in_query_order(fields: &[Value]) -> Result<Vec<(String, Dir)>, String> {
    fields
        .iter()
        .map(|entry| {
            let (field, dir) = match entry {
                Value::String(field) => (field.as_str(), None),
                Value::Array(pair) => (
                    pair.first()
                        .and_then(Value::as_str)
                        .ok_or_else(|| format!("bad order_by entry {entry}"))?,
                    pair.get(1).and_then(Value::as_str),
                ),
                _ => return Err(format!("bad order_by entry {entry}")),
            };
            let dir = match dir {
                None => Dir::Asc,
                Some(d) if d.eq_ignore_ascii_case("asc") => Dir::Asc,
                Some(d) if d.eq_ignore_ascii_case("desc") => Dir::Desc,
                Some(d) => return Err(format!("bad order {d}")),
            };
            Ok((field.to_owned(), dir))
        })
        .collect()
}

/// Evaluates an aggregating extract over the filtered records as PostgreSQL does: one row per
/// distinct `group_by` value (first-seen order; none when no record matched), or one row over
/// every record when there is no `group_by` (even when none matched). Plain columns must be
/// grouped. `count` counts rows, or with a column that column's non-null values; `sum` adds the
/// non-null numbers (an integer while every value is one); `avg` is their sum over their count
/// as a float; `min` and `max` take the extreme non-null value in the column's own order
/// ([`compare_column`]); over no value each of these is null. A function projected twice is
/// named `<name>_2` the second time, as PuppetDB aliases it.
pub fn aggregate(
    records: &[Value],
    columns: &[Column],
    group_by: &[String],
) -> Result<Vec<Value>, String> {
    for column in columns {
        match column {
            Column::Field(field) if !group_by.contains(field) => {
                return Err(format!(
                    "column \"{field}\" must appear in the GROUP BY clause or be used in an aggregate function"
                ))
            }
            Column::Function { name, .. } if !column.is_aggregate() => {
                return Err(format!("function {name} in an aggregate is not served by the fake"))
            }
            _ => {}
        }
    }
    let mut groups: Vec<(String, Vec<&Value>)> = Vec::new();
    if group_by.is_empty() {
        groups.push((String::new(), records.iter().collect()));
    } else {
        for record in records {
            let key: Vec<Value> = group_by
                .iter()
                .map(|field| record.get(field).cloned().unwrap_or(Value::Null))
                .collect();
            let key = Value::Array(key).to_string();
            match groups.iter_mut().find(|(k, _)| *k == key) {
                Some((_, rows)) => rows.push(record),
                None => groups.push((key, vec![record])),
            }
        }
    }
    groups
        .iter()
        .map(|(_, rows)| {
            let mut out = Map::new();
            let mut functions = Vec::new();
            for column in columns {
                match column {
                    Column::Field(field) => {
                        let value = rows
                            .first()
                            .and_then(|r| r.get(field))
                            .cloned()
                            .unwrap_or(Value::Null);
                        out.insert(field.clone(), value);
                    }
                    Column::Function { name, args } => functions.push((name, args)),
                }
            }
            for (name, args) in functions {
                let value = aggregate_value(name, args, rows)?;
                let mut alias = name.clone();
                let mut n = 2;
                while out.contains_key(&alias) {
                    alias = format!("{name}_{n}");
                    n += 1;
                }
                out.insert(alias, value);
            }
            Ok(Value::Object(out))
        })
        .collect()
}

fn aggregate_value(name: &str, args: &[Value], rows: &[&Value]) -> Result<Value, String> {
    let field = match args {
        [] if name == "count" => None,
        [Value::String(field)] => Some(field.as_str()),
        _ => {
            return Err(format!(
                "function {name} with arguments {args:?} is not served"
            ))
        }
    };
    let values: Vec<&Value> = match field {
        None => return Ok(Value::from(rows.len())),
        Some(field) => rows
            .iter()
            .filter_map(|row| row.get(field))
            .filter(|v| !v.is_null())
            .collect(),
    };
    let numbers = || -> Result<Vec<&serde_json::Number>, String> {
        values
            .iter()
            .map(|v| match v {
                Value::Number(n) => Ok(n),
                other => Err(format!("function {name} over the non-number {other}")),
            })
            .collect()
    };
    let sum = |numbers: &[&serde_json::Number]| -> Value {
        if numbers.is_empty() {
            return Value::Null;
        }
        let ints: Option<i64> = numbers
            .iter()
            .try_fold(0i64, |acc, n| acc.checked_add(n.as_i64()?));
        match ints {
            Some(total) => Value::from(total),
            None => Value::from(numbers.iter().filter_map(|n| n.as_f64()).sum::<f64>()),
        }
    };
    let field = field.unwrap_or_default();
    Ok(match name {
        "count" => Value::from(values.len()),
        "sum" => sum(&numbers()?),
        "avg" => {
            let numbers = numbers()?;
            match sum(&numbers).as_f64() {
                Some(total) if !numbers.is_empty() => Value::from(total / numbers.len() as f64),
                _ => Value::Null,
            }
        }
        "min" | "max" => {
            let wanted = if name == "min" {
                Ordering::Less
            } else {
                Ordering::Greater
            };
            let mut best: Option<&Value> = None;
            for value in values {
                if best.is_none_or(|b| compare_column(field, Some(value), Some(b)) == wanted) {
                    best = Some(value);
                }
            }
            best.cloned().unwrap_or(Value::Null)
        }
        other => return Err(format!("function {other} is not served by the fake")),
    })
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
        ("=", [Value::String(field), Value::String(state)]) if field == "node_state" => {
            let inactive = ["deactivated", "expired"]
                .iter()
                .any(|f| record.get(*f).is_some_and(|v| !v.is_null()));
            match state.as_str() {
                "any" => Ok(true),
                "active" => Ok(!inactive),
                "inactive" => Ok(inactive),
                other => Err(format!("node_state {other} is not served by the fake")),
            }
        }
        ("=", [Value::String(field), value]) => Ok(record.get(field) == Some(value)),
        ("in", [Value::String(field), list]) => match form(list) {
            Some(("array", [Value::Array(values)])) => {
                Ok(record.get(field).is_some_and(|v| values.contains(v)))
            }
            _ => Err(format!("in over {list} is not served by the fake")),
        },
        // PostgreSQL's `~` on a string column: Rust's `regex` agrees for the patterns tests use.
        ("~", [Value::String(field), Value::String(pattern)]) => {
            let regex = regex::Regex::new(pattern).map_err(|e| format!("{pattern}: {e}"))?;
            Ok(record
                .get(field)
                .and_then(Value::as_str)
                .is_some_and(|value| regex.is_match(value)))
        }
        ("null?", [Value::String(field), Value::Bool(null)]) => {
            Ok(record.get(field).is_none_or(Value::is_null) == *null)
        }
        ("<" | "<=" | ">" | ">=", [Value::String(field), value]) => {
            let Some(found) = record.get(field).filter(|v| !v.is_null()) else {
                return Ok(false);
            };
            let ordering = compare_column(field, Some(found), Some(value));
            Ok(match op {
                "<" => ordering == Ordering::Less,
                "<=" => ordering != Ordering::Greater,
                ">" => ordering == Ordering::Greater,
                _ => ordering != Ordering::Less,
            })
        }
        _ => Err(format!("operator {op} is not served by the fake: {filter}")),
    }
}

/// The certnames a query excludes with pdbmux's ownership clause
/// `["not",["in","certname",["array",[…]]]]`, wherever it sits under `and`, an `extract` or a
/// `from`.
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
            Some(("and" | "extract" | "from", items)) => {
                items.iter().for_each(|item| walk(item, out))
            }
            _ => {}
        }
    }
    let mut out = Vec::new();
    if let Some(query) = query {
        walk(query, &mut out);
    }
    out
}

/// One record projected onto plain columns, `jsonb_typeof` and `to_string` of a time with
/// [`TIME_FORMAT`].
fn project(record: &Value, columns: &[Column]) -> Result<Value, String> {
    let mut out = Map::new();
    for column in columns {
        match column {
            Column::Field(field) => {
                out.insert(
                    field.clone(),
                    record.get(field).cloned().unwrap_or(Value::Null),
                );
            }
            Column::Function { name, args } if name == "jsonb_typeof" => {
                let [Value::String(field)] = args.as_slice() else {
                    return Err(format!("jsonb_typeof with arguments {args:?}"));
                };
                let kind = match record.get(field) {
                    None => Value::Null,
                    Some(Value::Null) => Value::from("null"),
                    Some(Value::Bool(_)) => Value::from("boolean"),
                    Some(Value::Number(_)) => Value::from("number"),
                    Some(Value::String(_)) => Value::from("string"),
                    Some(Value::Array(_)) => Value::from("array"),
                    Some(Value::Object(_)) => Value::from("object"),
                };
                out.insert(name.clone(), kind);
            }
            Column::Function { name, args } if name == "to_string" => {
                let [Value::String(field), Value::String(format)] = args.as_slice() else {
                    return Err(format!("to_string with arguments {args:?}"));
                };
                if format != TIME_FORMAT {
                    return Err(format!(
                        "to_string format {format} is not served by the fake"
                    ));
                }
                let written = match record.get(field) {
                    Some(Value::String(at)) => Value::from(written_by_postgresql(at)),
                    _ => Value::Null,
                };
                out.insert(name.clone(), written);
            }
            Column::Function { name, .. } => {
                return Err(format!("function {name} is not served by the fake"))
            }
        }
    }
    Ok(Value::Object(out))
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

    fn evaluate_query(db: &PuppetDb, path: &str, query: Value) -> Result<Vec<Value>, String> {
        let asking = Asking {
            path: path.to_owned(),
            query: Some(query),
            ..Asking::default()
        };
        Ok(db
            .evaluate(&asking)?
            .map(|(rows, _)| rows)
            .unwrap_or_default())
    }

    #[test]
    fn the_fake_folds_aggregates_like_postgres() {
        use serde_json::json;
        let db = PuppetDb::new()
            .resource("a", "File", "x", Some(3))
            .resource("a", "File", "Zeta", None)
            .resource("b", "File", "alpha", Some(10))
            .resource("b", "Exec", "y", None);
        let rows = evaluate_query(
            &db,
            "/pdb/query/v4/resources",
            json!([
                "extract",
                [
                    ["function", "count"],
                    ["function", "count", "line"],
                    ["function", "sum", "line"],
                    ["function", "avg", "line"],
                    ["function", "min", "title"],
                    ["function", "max", "line"],
                    "type"
                ],
                ["group_by", "type"]
            ]),
        );
        assert_eq!(
            rows,
            Ok(vec![
                json!({"count": 3, "count_2": 2, "sum": 13, "avg": 6.5, "min": "Zeta", "max": 10, "type": "File"}),
                json!({"count": 1, "count_2": 0, "sum": null, "avg": null, "min": "y", "max": null, "type": "Exec"}),
            ])
        );
        // No group_by: one row even over nothing; a filter and the ownership clause apply.
        let rows = evaluate_query(
            &db,
            "/pdb/query/v4/resources",
            json!([
                "extract",
                [["function", "count"], ["function", "max", "title"]],
                [
                    "and",
                    ["=", "type", "Service"],
                    ["not", ["in", "certname", ["array", ["a"]]]]
                ]
            ]),
        );
        assert_eq!(rows, Ok(vec![json!({"count": 0, "max": null})]));
        // A plain column must be grouped.
        assert!(evaluate_query(
            &db,
            "/pdb/query/v4/resources",
            json!(["extract", [["function", "count"], "type"]])
        )
        .is_err());
        // A top-level from with in-query paging; the URL form wins field by field.
        let query = json!([
            "from",
            "resources",
            [
                "extract",
                [["function", "count"], "type"],
                [">=", "line", 3],
                ["group_by", "type"]
            ],
            ["order_by", [["count", "desc"], "type"]],
            ["limit", 1]
        ]);
        assert_eq!(
            evaluate_query(&db, "/pdb/query/v4/resources", query.clone()),
            Ok(vec![json!({"count": 2, "type": "File"})])
        );
        let asking = Asking {
            path: "/pdb/query/v4/resources".to_owned(),
            query: Some(query),
            limit: Some(5),
            ..Asking::default()
        };
        assert_eq!(
            db.evaluate(&asking),
            Ok(Some((vec![json!({"count": 2, "type": "File"})], 1)))
        );
        assert_eq!(
            excluded_certnames(Some(&json!([
                "from",
                "nodes",
                [
                    "extract",
                    [["function", "count"]],
                    ["not", ["in", "certname", ["array", ["x"]]]]
                ]
            ]))),
            ["x"]
        );
    }

    #[test]
    fn components_decode_like_forms() {
        assert_eq!(decode_component("a+b%20c%5B"), "a b c[");
        assert_eq!(decode_component("100%"), "100%");
        assert_eq!(decode_component("%zz"), "%zz");
    }
}
