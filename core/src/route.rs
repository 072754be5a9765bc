//! The path allowlist (docs/decisions.md D6) and the classification of every served route.
//!
//! Call [`classify`] on every client request before anything else: it either names the route and
//! how it is answered, or gives the refusal pdbmux answers locally. Nothing outside the allowlist
//! ever reaches a backend.

use http::{Method, StatusCode};
use std::borrow::Cow;

use crate::entity::{Entity, Parent};
use crate::membership::Kind;
use crate::message::ClientRequest;

/// The longest request target accepted (D6); longer gets 414.
pub const MAX_TARGET_BYTES: usize = 8 * 1024;
/// The largest request header block accepted (D6); larger gets 431.
pub const MAX_HEADER_BYTES: usize = 16 * 1024;
/// The most request header fields accepted (D6); more gets 431.
pub const MAX_HEADER_COUNT: usize = 100;

/// Which Jolokia metrics route.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum MetricsRoute {
    /// `/metrics/v2/read/<mbean>...`.
    Read,
    /// `/metrics/v2/list`.
    List,
    /// `/metrics/v1/mbeans[/<mbean>]`.
    V1Mbeans,
}

/// Which per-report sub-collection of `/reports/<hash>/...`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum ReportPart {
    /// `/reports/<hash>/events`.
    Events,
    /// `/reports/<hash>/logs`.
    Logs,
    /// `/reports/<hash>/metrics`.
    Metrics,
}

/// How a served route is answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// `/pdb/query/v4/<entity>`: answered for the whole estate (docs/merging.md, entity by
    /// entity).
    Query(Entity),
    /// `/facts/<name>` or `/facts/<name>/<value>`; segments are kept raw, as received.
    FactsByName {
        /// The raw `<name>` segment.
        name: String,
        /// The raw `<value>` segment, if present (may contain `%2F`).
        value: Option<String>,
    },
    /// `/resources/<type>` or `/resources/<type>/<title>`: resources with the path's constraints,
    /// merged like `/resources`.
    ResourcesByType,
    /// `/nodes/<certname>...`, `/factsets/<certname>...`, `/catalogs/<certname>...`: asked of
    /// the owner first, then the others.
    PerCertname {
        /// The raw certname segment.
        certname: String,
        /// The kind of the node's data the answer derives from: its owner is asked first.
        kind: Kind,
    },
    /// `/reports/<hash>/{events,logs,metrics}`: served by whichever backend holds the report.
    ReportHash {
        /// The raw hash segment.
        hash: String,
        /// Which part.
        part: ReportPart,
    },
    /// `/pdb/query/v4` itself: PQL and `from` queries, answered as their entity's route
    /// (docs/merging.md, "PQL and the root endpoint").
    Root,
    /// `/environments/<env>/<entity>[/…]` and `/producers/<p>/<entity>[/…]` for the entities
    /// whose row lists that parent (`parents`: `/environments/<env>/facts`,
    /// `/producers/<p>/catalogs`, …): the entity's own route with the
    /// parent's constraint added to its query, as PuppetDB adds it (docs/merging.md, "The route
    /// table"). Answered as that route: merged, paged, totalled and cached the same way.
    Within {
        /// The field the parent constrains: `environment` or `producer`.
        field: &'static str,
        /// The parent's raw (still percent-encoded) segment.
        value: String,
        /// The entity's path below `/pdb/query/v4/`, e.g. `facts/os`.
        entity_path: String,
    },
    /// Every other `/pdb/query/v4` path: first success in configured order.
    PassThrough,
    /// `/pdb/meta/v1/version`: the lowest version any backend runs.
    MetaVersion,
    /// `/pdb/meta/v1/server-time`: the first reachable backend's clock.
    ServerTime,
    /// A Jolokia metrics route.
    Metrics(MetricsRoute),
    /// `/healthz`, answered by pdbmux itself.
    Healthz,
    /// `/livez`: the process serves; answered at once, asking no backend.
    Livez,
    /// `/readyz`: the configuration is loaded and requests are answered (backends down or not:
    /// stale entries, PuppetDB's own errors and partial answers are answers); asks no backend.
    Readyz,
}

/// How a request is answered, one class per way of answering: the bounded label set of logs,
/// transcripts and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum RouteClass {
    /// A merged entity query (`/nodes`, `/facts/<name>`, `/resources/<type>`, …).
    Query,
    /// A node's own answer, from its owner (`/catalogs/<certname>`, …).
    PerCertname,
    /// A report found by its hash.
    ReportHash,
    /// The root query endpoint (PQL or an AST with `from`).
    Root,
    /// An answer passed through from the first backend that has one.
    PassThrough,
    /// `/pdb/meta/v1/*`.
    Meta,
    /// Jolokia metrics.
    Metrics,
    /// `/healthz`, `/livez`, `/readyz`.
    Healthz,
    /// Refused before any route was found (a bad target, method or size).
    Refused,
}

impl RouteClass {
    /// Every class, in the order of [`RouteClass::index`].
    pub const ALL: [RouteClass; 9] = [
        RouteClass::Query,
        RouteClass::PerCertname,
        RouteClass::ReportHash,
        RouteClass::Root,
        RouteClass::PassThrough,
        RouteClass::Meta,
        RouteClass::Metrics,
        RouteClass::Healthz,
        RouteClass::Refused,
    ];

    /// Its label: `query`, `per-certname`, `report-hash`, `root`, `pass-through`, `meta`,
    /// `metrics`, `healthz` or `refused`.
    pub fn as_str(self) -> &'static str {
        match self {
            RouteClass::Query => "query",
            RouteClass::PerCertname => "per-certname",
            RouteClass::ReportHash => "report-hash",
            RouteClass::Root => "root",
            RouteClass::PassThrough => "pass-through",
            RouteClass::Meta => "meta",
            RouteClass::Metrics => "metrics",
            RouteClass::Healthz => "healthz",
            RouteClass::Refused => "refused",
        }
    }

    /// Its place in [`RouteClass::ALL`], for counters kept in arrays.
    pub fn index(self) -> usize {
        self as usize
    }
}

impl std::fmt::Display for RouteClass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Route {
    /// How this route is answered ([`RouteClass`]).
    pub fn class(&self) -> RouteClass {
        match self {
            Route::Query(_)
            | Route::FactsByName { .. }
            | Route::ResourcesByType
            | Route::Within { .. } => RouteClass::Query,
            Route::PerCertname { .. } => RouteClass::PerCertname,
            Route::ReportHash { .. } => RouteClass::ReportHash,
            Route::Root => RouteClass::Root,
            Route::PassThrough => RouteClass::PassThrough,
            Route::MetaVersion | Route::ServerTime => RouteClass::Meta,
            Route::Metrics(_) => RouteClass::Metrics,
            Route::Healthz | Route::Livez | Route::Readyz => RouteClass::Healthz,
        }
    }

    /// The entity whose records answer this route, if it is merged: `/facts/<name>` is facts.
    pub fn entity(&self) -> Option<Entity> {
        match self {
            Route::Query(entity) => Some(*entity),
            Route::FactsByName { .. } => Some(Entity::Facts),
            Route::ResourcesByType => Some(Entity::Resources),
            _ => None,
        }
    }
}

/// Why a request is answered locally without reaching any backend.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The request target is over [`MAX_TARGET_BYTES`].
    #[error("request URL over {MAX_TARGET_BYTES} bytes")]
    UriTooLong,
    /// The header block is over [`MAX_HEADER_BYTES`] or [`MAX_HEADER_COUNT`] fields.
    #[error("request headers over {MAX_HEADER_BYTES} bytes or {MAX_HEADER_COUNT} fields")]
    HeadersTooLarge,
    /// pdbmux serves GET only.
    #[error("method {0} not allowed; pdbmux serves GET only")]
    MethodNotAllowed(String),
    /// The path is malformed or tries to escape its route.
    #[error("bad request path: {0}")]
    BadPath(&'static str),
    /// The path is not on the allowlist.
    #[error("not found: pdbmux does not serve this path")]
    NotFound,
    /// The query string's percent-encoding is malformed or decodes to what no backend could
    /// read the same way.
    #[error("bad query string: {0}")]
    BadQuery(&'static str),
}

impl Refusal {
    /// The status this refusal is answered with.
    pub fn status(&self) -> StatusCode {
        match self {
            Refusal::UriTooLong => StatusCode::URI_TOO_LONG,
            Refusal::HeadersTooLarge => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            Refusal::MethodNotAllowed(_) => StatusCode::METHOD_NOT_ALLOWED,
            Refusal::BadPath(_) | Refusal::BadQuery(_) => StatusCode::BAD_REQUEST,
            Refusal::NotFound => StatusCode::NOT_FOUND,
        }
    }
}

/// Classifies a client request: the route that answers it, or the local refusal.
///
/// Checks run in this order: URL length (414), header size (431), method (405), path shape (400),
/// allowlist (404).
pub fn classify(request: &ClientRequest) -> Result<Route, Refusal> {
    if request.target.len() > MAX_TARGET_BYTES {
        return Err(Refusal::UriTooLong);
    }
    if request.header_bytes > MAX_HEADER_BYTES || request.header_count > MAX_HEADER_COUNT {
        return Err(Refusal::HeadersTooLarge);
    }
    if request.method != Method::GET {
        return Err(Refusal::MethodNotAllowed(request.method.to_string()));
    }
    let path = request.path();
    let segments = split_path(path)?;
    let route = allowlisted(&segments).ok_or(Refusal::NotFound)?;
    check_segments(&segments, &route)?;
    if let Some(query) = request.query() {
        check_query(query)?;
    }
    Ok(route)
}

/// Refuses a query string whose percent-encoding is malformed (`%zz`, a bare `%`) or decodes to
/// a NUL or to bytes that are not UTF-8: pdbmux would read such a parameter one way and a
/// backend another. Other control characters stay (a PQL query may span lines).
fn check_query(query: &str) -> Result<(), Refusal> {
    let decoded = strictly_decoded(query).map_err(Refusal::BadQuery)?;
    if decoded.contains('\0') {
        return Err(Refusal::BadQuery("encoded NUL"));
    }
    Ok(())
}

/// `text` with its percent-escapes decoded, or why it cannot be: an escape that is not `%` and
/// two hex digits, or bytes that are not UTF-8 once decoded. Borrowed when there is no escape.
fn strictly_decoded(text: &str) -> Result<Cow<'_, str>, &'static str> {
    if !text.contains('%') {
        return Ok(Cow::Borrowed(text));
    }
    let bytes = text.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        if bytes[index] != b'%' {
            decoded.push(bytes[index]);
            index += 1;
            continue;
        }
        let Some(byte) = percent_escape(bytes, index) else {
            return Err("malformed percent-encoding");
        };
        decoded.push(byte);
        index += 3;
    }
    String::from_utf8(decoded)
        .map(Cow::Owned)
        .map_err(|_| "does not decode to UTF-8")
}

/// Splits an absolute path into its raw segments, refusing empty and dot segments.
fn split_path(path: &str) -> Result<Vec<&str>, Refusal> {
    let rest = path
        .strip_prefix('/')
        .ok_or(Refusal::BadPath("the path must start with /"))?;
    if rest.is_empty() {
        return Ok(Vec::new());
    }
    let segments: Vec<&str> = rest.split('/').collect();
    for segment in &segments {
        // Servlet containers read `..;x` as `..` (a path parameter), so judge the part before `;`.
        match segment.split(';').next().unwrap_or(segment) {
            "" => return Err(Refusal::BadPath("empty path segment")),
            "." | ".." => return Err(Refusal::BadPath("dot segment")),
            _ => {}
        }
        if segment.contains('\\') {
            return Err(Refusal::BadPath("backslash in path"));
        }
        if contains_escape(segment, "2e") {
            return Err(Refusal::BadPath("encoded dot in path"));
        }
        if contains_escape(segment, "5c") {
            return Err(Refusal::BadPath("encoded backslash in path"));
        }
        check_encoding(segment)?;
    }
    Ok(segments)
}

/// Refuses an encoded slash in any segment except the value segment of `/facts/<name>/<value>`.
fn check_segments(segments: &[&str], route: &Route) -> Result<(), Refusal> {
    let value_index = match route {
        Route::FactsByName { value: Some(_), .. } => Some(5),
        _ => None,
    };
    for (index, segment) in segments.iter().enumerate() {
        if Some(index) != value_index && contains_escape(segment, "2f") {
            return Err(Refusal::BadPath("encoded slash in path"));
        }
    }
    Ok(())
}

/// The byte the escape at `bytes[at]` (a `%`) encodes: exactly two hex digits follow it, or the
/// encoding is malformed (`from_str_radix` alone would take `%+A`).
fn percent_escape(bytes: &[u8], at: usize) -> Option<u8> {
    let hex = bytes.get(at + 1..at + 3)?;
    if !hex.iter().all(u8::is_ascii_hexdigit) {
        return None;
    }
    u8::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok()
}

/// Refuses a segment whose percent-encoding is malformed (`%zz`, a bare `%`), decodes to a
/// control character or to bytes that are not UTF-8, or hides an escape under another
/// (`%252e`): PuppetDB would read each of these its own way.
fn check_encoding(segment: &str) -> Result<(), Refusal> {
    let text = strictly_decoded(segment).map_err(Refusal::BadPath)?;
    if text.chars().any(|c| c.is_ascii_control()) {
        return Err(Refusal::BadPath("encoded control character in path"));
    }
    if ["2e", "2f", "5c", "25"]
        .iter()
        .any(|hex| contains_escape(&text, hex))
    {
        return Err(Refusal::BadPath("double percent-encoding in path"));
    }
    Ok(())
}

/// Whether `segment` contains `%` followed by `hex` (case-insensitive).
fn contains_escape(segment: &str, hex: &str) -> bool {
    segment
        .as_bytes()
        .windows(3)
        .any(|w| w[0] == b'%' && w[1..].eq_ignore_ascii_case(hex.as_bytes()))
}

/// The entity route below a parent (`/environments/<env>`, `/producers/<p>`): `below` (the
/// entity and what follows it) must be one of the entity's own record routes, else `None`.
fn within(parent: Parent, value: &str, below: &[&str]) -> Option<Route> {
    match query_route(below)? {
        Route::Query(_) | Route::FactsByName { .. } | Route::ResourcesByType => {}
        _ => return None,
    }
    Some(Route::Within {
        field: parent.field(),
        value: value.to_owned(),
        entity_path: below.join("/"),
    })
}

/// The route for an allowlisted path, or `None`.
fn allowlisted(segments: &[&str]) -> Option<Route> {
    match segments {
        ["healthz"] => Some(Route::Healthz),
        ["livez"] => Some(Route::Livez),
        ["readyz"] => Some(Route::Readyz),
        ["pdb", "meta", "v1", "version"] => Some(Route::MetaVersion),
        ["pdb", "meta", "v1", "server-time"] => Some(Route::ServerTime),
        ["metrics", "v2", "list"] => Some(Route::Metrics(MetricsRoute::List)),
        ["metrics", "v2", "read", _, ..] => Some(Route::Metrics(MetricsRoute::Read)),
        ["metrics", "v1", "mbeans"] | ["metrics", "v1", "mbeans", _] => {
            Some(Route::Metrics(MetricsRoute::V1Mbeans))
        }
        ["pdb", "query", "v4", rest @ ..] => query_route(rest),
        _ => None,
    }
}

/// Which kind of a node's data answers `/<entity>/<certname>/<below>` (docs/decisions.md, D14):
/// the kind of the entity named last, in the entity table: a factset and facts from the newest
/// facts, a catalog and its resources and edges from the newest catalog, the node record from
/// the newest report.
fn per_certname_kind(entity: &str, below: &[&str]) -> Kind {
    below
        .first()
        .and_then(|segment| Entity::from_segment(segment))
        .or_else(|| Entity::from_segment(entity))
        .map_or(Kind::Node, Entity::kind)
}

/// The parent of `/<parent>/<value>/<below>` when it is a sub-route of the entity `below` names.
fn sub_route_parent(parent: &str, below: &[&str]) -> Option<Parent> {
    let parent = Parent::from_segment(parent)?;
    let entity = Entity::from_segment(below.first()?)?;
    entity.is_below(parent).then_some(parent)
}

/// The route for a path under `/pdb/query/v4`: the merged entities and their sub-routes, the
/// endpoints of PuppetDB 7.12.1 one backend answers (an environment's or producer's name, one
/// node's package inventory), `None` for anything else (PuppetDB would
/// redirect it to its dashboard).
fn query_route(rest: &[&str]) -> Option<Route> {
    if let [parent, value, below @ ..] = rest {
        if let Some(parent) = sub_route_parent(parent, below) {
            return within(parent, value, below);
        }
    }
    Some(match rest {
        [] => Route::Root,
        [segment] if Entity::from_segment(segment).is_some() => {
            Entity::from_segment(segment).map_or(Route::PassThrough, Route::Query)
        }
        // One node's packages: from the node's facts owner.
        ["package-inventory", certname] => Route::PerCertname {
            certname: (*certname).to_owned(),
            kind: Kind::Facts,
        },
        // Whether an environment or producer is known: any backend that knows it answers.
        ["environments" | "producers", _] => Route::PassThrough,
        ["facts", name] => Route::FactsByName {
            name: (*name).to_owned(),
            value: None,
        },
        ["facts", name, value] => Route::FactsByName {
            name: (*name).to_owned(),
            value: Some((*value).to_owned()),
        },
        ["resources", _] | ["resources", _, _] => Route::ResourcesByType,
        [entity @ ("nodes" | "factsets" | "catalogs"), certname, below @ ..] => {
            Route::PerCertname {
                certname: (*certname).to_owned(),
                kind: per_certname_kind(entity, below),
            }
        }
        ["reports", hash, part] => match *part {
            "events" => Route::ReportHash {
                hash: (*hash).to_owned(),
                part: ReportPart::Events,
            },
            "logs" => Route::ReportHash {
                hash: (*hash).to_owned(),
                part: ReportPart::Logs,
            },
            "metrics" => Route::ReportHash {
                hash: (*hash).to_owned(),
                part: ReportPart::Metrics,
            },
            _ => return None,
        },
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(target: &str) -> Result<Route, Refusal> {
        classify(&ClientRequest::get(target))
    }

    #[test]
    fn every_table_row_is_classified() {
        let cases: &[(&str, &str)] = &[
            ("/pdb/query/v4/nodes", "query"),
            ("/pdb/query/v4/facts?query=%5B%5D", "query"),
            ("/pdb/query/v4/facts/osfamily", "query"),
            ("/pdb/query/v4/facts/osfamily/Debian", "query"),
            ("/pdb/query/v4/fact-names", "query"),
            ("/pdb/query/v4/environments", "query"),
            ("/pdb/query/v4/reports", "query"),
            ("/pdb/query/v4/events", "query"),
            ("/pdb/query/v4/resources", "query"),
            ("/pdb/query/v4/event-counts", "query"),
            ("/pdb/query/v4/aggregate-event-counts", "query"),
            ("/pdb/query/v4/factsets", "query"),
            ("/pdb/query/v4/catalogs", "query"),
            ("/pdb/query/v4/edges", "query"),
            ("/pdb/query/v4/fact-contents", "query"),
            ("/pdb/query/v4/fact-paths", "query"),
            ("/pdb/query/v4/inventory", "query"),
            ("/pdb/query/v4/packages", "query"),
            ("/pdb/query/v4/package-inventory", "query"),
            ("/pdb/query/v4/producers", "query"),
            ("/pdb/query/v4/catalog-inputs", "query"),
            ("/pdb/query/v4/catalog-input-contents", "query"),
            ("/pdb/query/v4/nodes/web1.example.com", "per-certname"),
            ("/pdb/query/v4/nodes/web1/facts/kernel", "per-certname"),
            ("/pdb/query/v4/factsets/web1", "per-certname"),
            ("/pdb/query/v4/catalogs/web1/edges", "per-certname"),
            ("/pdb/query/v4/reports/abc123/events", "report-hash"),
            ("/pdb/query/v4/reports/abc123/logs", "report-hash"),
            ("/pdb/query/v4/reports/abc123/metrics", "report-hash"),
            ("/pdb/query/v4", "root"),
            ("/pdb/query/v4?query=nodes%20%7B%7D", "root"),
            ("/pdb/query/v4/resources/File/foo", "query"),
            ("/pdb/query/v4/resources/File", "query"),
            ("/pdb/query/v4/environments/production", "pass-through"),
            ("/pdb/query/v4/environments/production/facts", "query"),
            ("/pdb/query/v4/environments/production/facts/os", "query"),
            (
                "/pdb/query/v4/environments/production/resources/File",
                "query",
            ),
            ("/pdb/query/v4/environments/production/reports", "query"),
            ("/pdb/query/v4/environments/production/events", "query"),
            ("/pdb/query/v4/producers/puppet.example.com", "pass-through"),
            (
                "/pdb/query/v4/producers/puppet.example.com/catalogs",
                "query",
            ),
            (
                "/pdb/query/v4/producers/puppet.example.com/factsets",
                "query",
            ),
            (
                "/pdb/query/v4/producers/puppet.example.com/reports",
                "query",
            ),
            ("/pdb/query/v4/package-inventory/web1", "per-certname"),
            ("/pdb/query/v4/facts/path/a%2Fb", "query"),
            ("/pdb/meta/v1/version", "meta"),
            ("/pdb/meta/v1/server-time", "meta"),
            (
                "/metrics/v2/read/puppetlabs.puppetdb.population:name=num-nodes",
                "metrics",
            ),
            (
                "/metrics/v2/read/java.lang:type=Memory/HeapMemoryUsage/used",
                "metrics",
            ),
            ("/metrics/v2/list", "metrics"),
            ("/metrics/v1/mbeans", "metrics"),
            ("/metrics/v1/mbeans/java.lang:type=Memory", "metrics"),
            ("/healthz", "healthz"),
            ("/livez", "healthz"),
            ("/readyz", "healthz"),
        ];
        for (target, class) in cases {
            let route = route(target).unwrap_or_else(|e| panic!("{target}: {e}"));
            assert_eq!(route.class().as_str(), *class, "{target}");
            assert_eq!(RouteClass::ALL[route.class().index()], route.class());
        }
    }

    #[test]
    fn every_route_class_has_its_place_and_a_label_of_its_own() {
        let mut labels = std::collections::BTreeSet::new();
        for (index, class) in RouteClass::ALL.iter().enumerate() {
            assert_eq!(class.index(), index, "{class}");
            assert!(labels.insert(class.as_str()), "{class} labelled twice");
        }
        assert_eq!(RouteClass::Refused.as_str(), "refused");
    }

    #[test]
    fn outside_the_allowlist_is_not_found() {
        for target in [
            "/",
            "/pdb/admin/v1/archive",
            "/pdb/admin/v1/summary-stats",
            "/pdb/cmd/v1",
            "/status/v1/services",
            "/status/v1/simple",
            "/pdb/meta/v1/version/latest",
            "/pdb/query/v3/nodes",
            "/pdb/query",
            "/metrics/v2/version",
            "/metrics/v2/search/x",
            "/metrics/v2/read",
            "/metrics/v1/mbeans/a/b",
            "/healthz/x",
            // Not a PuppetDB endpoint (PuppetDB redirects these to its dashboard).
            "/pdb/query/v4/nosuch",
            "/pdb/query/v4/.nodes",
            "/pdb/query/v4/nodes;jsessionid=1",
            "/pdb/query/v4/resources/File/a/b",
            "/pdb/query/v4/reports/abc123",
            "/pdb/query/v4/reports/abc123/nosuch",
            // Catalog inputs are served only as whole entities (PuppetDB redirects this too).
            "/pdb/query/v4/catalog-inputs/web1",
            // Below an environment or producer: only what PuppetDB 7.12.1 serves there.
            "/pdb/query/v4/environments/production/nodes",
            "/pdb/query/v4/environments/production/nosuch",
            "/pdb/query/v4/producers/puppet.example.com/facts",
            "/pdb/query/v4/package-inventory/web1/extra",
        ] {
            assert_eq!(route(target), Err(Refusal::NotFound), "{target}");
        }
    }

    #[test]
    fn a_node_s_data_is_answered_by_the_owner_of_its_kind() {
        for (target, kind) in [
            ("/pdb/query/v4/nodes/web1", Kind::Node),
            ("/pdb/query/v4/nodes/web1/facts", Kind::Facts),
            ("/pdb/query/v4/nodes/web1/facts/os", Kind::Facts),
            ("/pdb/query/v4/nodes/web1/resources", Kind::Catalog),
            ("/pdb/query/v4/nodes/web1/resources/File", Kind::Catalog),
            ("/pdb/query/v4/factsets/web1", Kind::Facts),
            ("/pdb/query/v4/factsets/web1/facts", Kind::Facts),
            ("/pdb/query/v4/catalogs/web1", Kind::Catalog),
            ("/pdb/query/v4/catalogs/web1/edges", Kind::Catalog),
            ("/pdb/query/v4/catalogs/web1/resources", Kind::Catalog),
            ("/pdb/query/v4/package-inventory/web1", Kind::Facts),
        ] {
            match route(target) {
                Ok(Route::PerCertname {
                    certname,
                    kind: got,
                }) => {
                    assert_eq!((certname.as_str(), got), ("web1", kind), "{target}");
                }
                other => panic!("{target}: {other:?}"),
            }
        }
    }

    #[test]
    fn path_tricks_are_bad_requests() {
        for target in [
            "/pdb/query/v4/../../pdb/admin/v1/archive",
            "/pdb/query/v4/./nodes",
            "/pdb/query/v4/..;/..;/pdb/admin/v1/archive",
            "/pdb/query/v4/nodes/.;x",
            "/pdb/query/v4/;/nodes",
            "/pdb/query/v4/%2e%2e/%2E%2E/pdb/admin/v1/archive",
            "/pdb/query/v4/nodes/%2e",
            "/pdb/query/v4/nodes/a%2fb",
            "/pdb/query/v4/nodes/a%2Fb/facts",
            "/pdb/query/v4/nodes/a%5cb",
            "/pdb/query/v4/nodes/a\\b",
            "/pdb/query/v4//nodes",
            "/pdb/query/v4/nodes/",
            "/pdb/query/v4/facts/a%2fb/c",
            "pdb/query/v4/nodes",
            // Malformed or hidden percent-encodings.
            "/pdb/query/v4/nodes/a%zz",
            "/pdb/query/v4/nodes/a%",
            "/pdb/query/v4/nodes/a%4",
            "/pdb/query/v4/nodes/a%00",
            "/pdb/query/v4/nodes/a%ff",
            "/pdb/query/v4/nodes/%252e%252e",
            "/pdb/query/v4/facts/a/b%252Fc",
        ] {
            assert!(
                matches!(route(target), Err(Refusal::BadPath(_))),
                "{target}: {:?}",
                route(target)
            );
        }
    }

    #[test]
    fn malformed_query_string_encodings_are_refused() {
        for query in [
            "query=%zz",
            "query=%",
            "query=%4",
            "query=%+A",
            "limit=1&x=%00",
            "query=%ff%fe",
        ] {
            let target = format!("/pdb/query/v4/nodes?{query}");
            assert!(
                matches!(route(&target), Err(Refusal::BadQuery(_))),
                "{target}: {:?}",
                route(&target)
            );
        }
        // Multi-line PQL, UTF-8 certnames and plain text pass.
        for query in [
            "query=nodes%20%7B%0A%20%20certname%20%3D%20%22a%22%0A%7D",
            "query=%5B%22%3D%22%2C%22certname%22%2C%22caf%C3%A9%22%5D",
            "limit=10&offset=20",
        ] {
            let target = format!("/pdb/query/v4/nodes?{query}");
            assert_eq!(route(&target), Ok(Route::Query(Entity::Nodes)), "{target}");
        }
    }

    #[test]
    fn encoded_slash_is_allowed_in_a_fact_value_only() {
        assert_eq!(
            route("/pdb/query/v4/facts/path/%2Fusr%2Fbin"),
            Ok(Route::FactsByName {
                name: "path".into(),
                value: Some("%2Fusr%2Fbin".into())
            })
        );
    }

    #[test]
    fn limits_and_methods() {
        let long = format!("/pdb/query/v4/nodes?query={}", "x".repeat(MAX_TARGET_BYTES));
        assert_eq!(route(&long), Err(Refusal::UriTooLong));
        let mut request = ClientRequest::get("/pdb/query/v4/nodes");
        request.header_count = 101;
        assert_eq!(classify(&request), Err(Refusal::HeadersTooLarge));
        request.header_count = 100;
        request.header_bytes = MAX_HEADER_BYTES + 1;
        assert_eq!(classify(&request), Err(Refusal::HeadersTooLarge));
        request.header_bytes = MAX_HEADER_BYTES;
        assert!(classify(&request).is_ok());
        for method in [Method::POST, Method::HEAD, Method::PUT, Method::DELETE] {
            let mut request = ClientRequest::get("/pdb/query/v4/nodes");
            request.method = method.clone();
            assert_eq!(
                classify(&request),
                Err(Refusal::MethodNotAllowed(method.to_string()))
            );
        }
    }
}
