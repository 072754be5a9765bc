//! Merged windows against a reference merge of the whole estate.
//!
//! Random estates are spread over 2–4 fake PuppetDBs (overlapping certnames, equal and null
//! report timestamps, facts of several JSON types, upstream records named like the provenance
//! fact). Each fake evaluates the upstream request it receives like a real PuppetDB: the ownership
//! clause `["not",["in","certname",["array",[…]]]]` pdbmux pushes into the query (from the query
//! string or a POST body), `order_by`, `limit`, `X-Records` for `include_total`, and the
//! membership extract. For random `order_by`, `limit` and `offset`:
//!
//! - `/nodes`: the merged window equals the window of a simple reference merge of the whole
//!   estate (one record per certname, the newer report_timestamp winning, ties and nulls to
//!   configured order, stamped with `pdbmux_source`, sorted PostgreSQL-style and stably);
//! - `/facts` under `freshness` and `static`: the window equals the reference's (each node's
//!   facts from its owner only, upstream `pdbmux_source` records dropped, one synthetic
//!   `pdbmux_source` record per node when unpaged);
//! - each backend was asked for its records once, for at least `offset + limit` (an unpaged
//!   request for all of them) and no offset; asked again only when its page came up short, then
//!   for `offset + limit` with exactly the shared nodes it does not own excluded; a correction
//!   of the total only when it holds nodes another backend owns; and no URL longer than
//!   PuppetDB's Jetty accepts;
//! - `/resources` (one of the node-owned entities, which share one merge): the window equals the
//!   owners' resources, sorted and windowed, with an exact total;
//! - `/reports` (history, random reports stored in several backends): the window equals the
//!   distinct reports' window, and the total counts a report stored twice once;
//! - the answer does not depend on the order the backends answered in (latencies permuted).
//!
//! Owners follow freshness per kind of data, by producer time (docs/decisions.md, D14): a node's
//! record from the newer report_timestamp, then the newer facts, then the newer catalog; its
//! facts from the newer factset `producer_timestamp`; its resources from the newer catalog
//! `producer_timestamp`; ties and nulls to configured order. The receive time
//! (`facts_timestamp`) is random and never decides.

use http::Method;
use pdbmux_conformance::{
    excluded_certnames, fact_record, form_encode, matches, ms, node_record, read_asking,
    resource_record, sort_records, window, Asked, Dir, FakeBackend, Harness, Machine, PuppetDb,
    SentRequest,
};
use pdbmux_core::config::MergeStrategy;
use pdbmux_core::membership::Kind;
use proptest::prelude::*;
use serde_json::{json, Value};

const TIMEOUT_MS: u64 = 1_000;
const STEPS: usize = 10_000;
const CASES: u32 = 128;
const SOURCE_FACT: &str = "pdbmux_source";
/// PuppetDB's Jetty refuses request headers over 8 KiB.
const MAX_URL: usize = 8 * 1024;

const CERTNAMES: [&str; 8] = [
    "alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel",
];
/// Few distinct timestamps, so ties are common; all in PuppetDB's one output format.
const STAMPS: [Option<&str>; 4] = [
    None,
    Some("2024-05-01T09:00:00.000Z"),
    Some("2024-05-01T10:00:00.000Z"),
    Some("2024-05-01T10:00:00.001Z"),
];
const ENVIRONMENTS: [&str; 2] = ["production", "staging"];
/// The resources a catalog can hold (type, title, line).
const RESOURCES: [(&str, &str, Option<i64>); 4] = [
    ("File", "/etc/motd", Some(3)),
    ("Service", "sshd", Some(7)),
    ("Package", "openssh-server", None),
    ("File", "/etc/issue", Some(3)),
];
/// A node's reports: end times (a report id is its index) and statuses. The same id on the same
/// node in two backends is one report stored twice.
const REPORT_TIMES: [&str; 4] = [
    "2024-05-01T08:00:00.000Z",
    "2024-05-01T09:00:00.000Z",
    "2024-05-01T09:00:00.000Z",
    "2024-05-01T10:00:00.000Z",
];
const REPORT_STATUSES: [&str; 3] = ["changed", "unchanged", "failed"];
const FACT_NAMES: [&str; 3] = ["os", "kernel", "uptime"];

/// Fact values of several jsonb kinds (strings, numbers, booleans).
fn fact_value(index: usize) -> Value {
    match index {
        0 => json!("Debian"),
        1 => json!("alpine"),
        2 => json!("Linux"),
        3 => json!("10"),
        4 => json!(2),
        5 => json!(10),
        6 => json!(true),
        _ => json!(false),
    }
}

fn backend_name(index: usize) -> String {
    format!("pdb-{index}")
}

fn backend_url(index: usize) -> String {
    format!("http://pdb{index}.example.com:8080")
}

/// One node as one backend holds it.
#[derive(Debug, Clone)]
struct Holding {
    certname: String,
    stamp: Option<&'static str>,
    environment: &'static str,
    /// When its facts arrived (a receive time: no evidence of newness).
    facts_stamp: Option<&'static str>,
    /// When its factset was produced (`None`: none).
    facts_produced: Option<&'static str>,
    /// When its catalog was produced (`None`: none).
    catalog_produced: Option<&'static str>,
    facts: Vec<(&'static str, Value)>,
    /// An upstream fact named like the provenance fact (always dropped while it is enabled).
    impostor: bool,
    /// Its catalog's resources (indices into [`RESOURCES`]).
    resources: Vec<usize>,
    /// Its reports (indices into [`REPORT_TIMES`]).
    reports: Vec<usize>,
}

impl Holding {
    fn resource_records(&self) -> impl Iterator<Item = Value> + '_ {
        self.resources.iter().map(|&r| {
            let (kind, title, line) = RESOURCES[r];
            resource_record(&self.certname, kind, title, line)
        })
    }

    fn report_records(&self) -> impl Iterator<Item = Value> + '_ {
        self.reports.iter().map(|&r| {
            json!({
                "hash": format!("{}-{r}", self.certname),
                "certname": self.certname,
                "end_time": REPORT_TIMES[r],
                "status": REPORT_STATUSES[r % REPORT_STATUSES.len()],
            })
        })
    }
}

/// Each backend's holdings, in storage order (configured order of backends).
#[derive(Debug, Clone)]
struct Estate {
    backends: Vec<Vec<Holding>>,
}

impl Estate {
    fn database(&self, backend: usize) -> PuppetDb {
        let mut db = PuppetDb::new();
        for holding in &self.backends[backend] {
            let mut node = node_record(&holding.certname, holding.stamp);
            node["facts_timestamp"] = json!(holding.facts_stamp);
            db.nodes.push(node);
            db = db
                .produced("factsets", &holding.certname, holding.facts_produced)
                .produced("catalogs", &holding.certname, holding.catalog_produced);
            db.resources.extend(holding.resource_records());
            db.reports.extend(holding.report_records());
            for (name, value) in &holding.facts {
                db.facts.push(fact_record(
                    &holding.certname,
                    name,
                    value.clone(),
                    holding.environment,
                ));
            }
            if holding.impostor {
                db.facts.push(fact_record(
                    &holding.certname,
                    SOURCE_FACT,
                    json!("impostor"),
                    holding.environment,
                ));
            }
        }
        db
    }

    fn without_impostors(mut self) -> Estate {
        for holding in self.backends.iter_mut().flatten() {
            holding.impostor = false;
        }
        self
    }

    /// The owner of every certname's `kind` of data: by the producer times of that kind (null
    /// older than any; a node record by report, then facts, then catalog), ties to configured
    /// order; or the first holder in configured order.
    fn owners(
        &self,
        strategy: MergeStrategy,
        kind: Kind,
    ) -> std::collections::BTreeMap<String, usize> {
        type Freshness<'a> = [Option<&'a str>; 3];
        let mut owners: std::collections::BTreeMap<String, (usize, Freshness<'_>)> =
            std::collections::BTreeMap::new();
        for (backend, holdings) in self.backends.iter().enumerate() {
            for holding in holdings {
                let freshness = match kind {
                    Kind::Node => [
                        holding.stamp,
                        holding.facts_produced,
                        holding.catalog_produced,
                    ],
                    Kind::Facts => [holding.facts_produced, None, None],
                    Kind::Catalog => [holding.catalog_produced, None, None],
                };
                match owners.get_mut(&holding.certname) {
                    None => {
                        owners.insert(holding.certname.clone(), (backend, freshness));
                    }
                    Some(current) => {
                        // Timestamps share one format, so text order is instant order.
                        let newer = strategy == MergeStrategy::Freshness && freshness > current.1;
                        if newer {
                            *current = (backend, freshness);
                        }
                    }
                }
            }
        }
        owners.into_iter().map(|(c, (b, _))| (c, b)).collect()
    }

    /// The shared certnames `backend` holds but another backend owns, sorted.
    fn excluded(&self, backend: usize, strategy: MergeStrategy, kind: Kind) -> Vec<String> {
        let owners = self.owners(strategy, kind);
        let mut out: Vec<String> = self.backends[backend]
            .iter()
            .filter(|h| owners.get(&h.certname) != Some(&backend))
            .map(|h| h.certname.clone())
            .collect();
        out.sort();
        out
    }
}

fn certname(index: usize, long: bool) -> String {
    if long {
        // Long enough that a few excluded names push the upstream URL past pdbmux's limit.
        format!("{}-{}", CERTNAMES[index], "x".repeat(2_000))
    } else {
        CERTNAMES[index].to_owned()
    }
}

fn holdings(long: bool) -> impl Strategy<Value = Vec<Holding>> {
    let holding = (
        0..CERTNAMES.len(),
        0..STAMPS.len(),
        0..ENVIRONMENTS.len(),
        prop::collection::vec((0..FACT_NAMES.len(), 0usize..8), 0..4),
        prop::bool::weighted(0.2),
        (
            (0..STAMPS.len(), 0..STAMPS.len(), 0..STAMPS.len()),
            prop::collection::btree_set(0..RESOURCES.len(), 0..=3),
            prop::collection::btree_set(0..REPORT_TIMES.len(), 0..=3),
        ),
    );
    prop::collection::vec(holding, 0..=7).prop_map(move |rows| {
        let mut seen = Vec::new();
        let mut out = Vec::new();
        for (name, stamp, environment, facts, impostor, (stamps, resources, reports)) in rows {
            let (facts_stamp, facts_produced, catalog_produced) = stamps;
            if seen.contains(&name) {
                continue;
            }
            seen.push(name);
            let mut fact_names = Vec::new();
            let facts = facts
                .into_iter()
                .filter(|(fact, _)| {
                    let fresh = !fact_names.contains(fact);
                    fact_names.push(*fact);
                    fresh
                })
                .map(|(fact, value)| (FACT_NAMES[fact], fact_value(value)))
                .collect();
            out.push(Holding {
                certname: certname(name, long),
                stamp: STAMPS[stamp],
                environment: ENVIRONMENTS[environment],
                facts_stamp: STAMPS[facts_stamp],
                facts_produced: STAMPS[facts_produced],
                catalog_produced: STAMPS[catalog_produced],
                facts,
                impostor,
                resources: resources.into_iter().collect(),
                reports: reports.into_iter().collect(),
            });
        }
        out
    })
}

fn estate() -> impl Strategy<Value = Estate> {
    (2usize..=4, prop::bool::weighted(0.15)).prop_flat_map(|(backends, long)| {
        prop::collection::vec(holdings(long), backends).prop_map(|backends| Estate { backends })
    })
}

/// A request's paging parameters.
#[derive(Debug, Clone)]
struct Paging {
    order_by: Vec<(&'static str, Dir)>,
    limit: Option<u64>,
    offset: Option<u64>,
    include_total: bool,
}

impl Paging {
    fn is_paged(&self) -> bool {
        self.limit.is_some() || self.offset.is_some_and(|o| o > 0)
    }
}

fn dir() -> impl Strategy<Value = Dir> {
    prop_oneof![Just(Dir::Asc), Just(Dir::Desc)]
}

fn paging(
    order_by: impl Strategy<Value = Vec<(&'static str, Dir)>>,
) -> impl Strategy<Value = Paging> {
    (
        order_by,
        prop::option::of(1u64..=6),
        prop::option::of(0u64..=6),
        any::<bool>(),
    )
        .prop_map(|(order_by, limit, offset, include_total)| Paging {
            order_by,
            limit,
            offset,
            include_total,
        })
}

/// Node orderings: none, or certname / report_timestamp (ties kept stable), or both.
fn node_order() -> impl Strategy<Value = Vec<(&'static str, Dir)>> {
    prop_oneof![
        Just(Vec::new()),
        dir().prop_map(|d| vec![("certname", d)]),
        dir().prop_map(|d| vec![("report_timestamp", d)]),
        (dir(), dir()).prop_map(|(a, b)| vec![("report_timestamp", a), ("certname", b)]),
    ]
}

/// Fact orderings: none, or a primary field completed by certname and name into a total order
/// (a synthetic record's place among equal keys is pdbmux's own choice, not a PuppetDB one).
fn fact_order() -> impl Strategy<Value = Vec<(&'static str, Dir)>> {
    let ordered = (
        prop::sample::select(vec!["certname", "name", "value", "environment"]),
        dir(),
        dir(),
        dir(),
    )
        .prop_map(|(primary, d1, d2, d3)| {
            let mut fields = vec![(primary, d1)];
            for (field, dir) in [("certname", d2), ("name", d3)] {
                if field != primary {
                    fields.push((field, dir));
                }
            }
            fields
        });
    prop_oneof![1 => Just(Vec::new()), 3 => ordered]
}

/// A primary field completed by `unique` fields into a total order.
fn completed_order(
    primaries: Vec<&'static str>,
    unique: &'static [&'static str],
) -> impl Strategy<Value = Vec<(&'static str, Dir)>> {
    let ordered = (
        prop::sample::select(primaries),
        dir(),
        prop::collection::vec(dir(), unique.len()),
    )
        .prop_map(move |(primary, d, dirs)| {
            let mut fields = vec![(primary, d)];
            for (field, dir) in unique.iter().zip(dirs) {
                if *field != primary {
                    fields.push((field, dir));
                }
            }
            fields
        });
    prop_oneof![1 => Just(Vec::new()), 3 => ordered]
}

fn target(path: &str, query: Option<&Value>, paging: &Paging) -> String {
    let mut params = Vec::new();
    if let Some(query) = query {
        params.push(format!("query={}", form_encode(&query.to_string())));
    }
    if !paging.order_by.is_empty() {
        let fields: Vec<Value> = paging
            .order_by
            .iter()
            .map(|(field, dir)| json!({"field": field, "order": dir.as_str()}))
            .collect();
        params.push(format!(
            "order_by={}",
            form_encode(&Value::Array(fields).to_string())
        ));
    }
    if let Some(limit) = paging.limit {
        params.push(format!("limit={limit}"));
    }
    if let Some(offset) = paging.offset {
        params.push(format!("offset={offset}"));
    }
    if paging.include_total {
        params.push("include_total=true".to_owned());
    }
    if params.is_empty() {
        path.to_owned()
    } else {
        format!("{path}?{}", params.join("&"))
    }
}

fn owned_order(paging: &Paging) -> Vec<(String, Dir)> {
    paging
        .order_by
        .iter()
        .map(|(field, dir)| ((*field).to_owned(), *dir))
        .collect()
}

/// What a client got, for comparison between runs.
#[derive(Debug, Clone, PartialEq)]
struct Observed {
    status: u16,
    body: Value,
    x_records: Option<String>,
    x_backends: Option<String>,
}

fn fail(h: &Harness, what: impl std::fmt::Display) -> TestCaseError {
    TestCaseError::fail(format!("{what}\n{}", h.transcript()))
}

/// Runs one request against the estate with these per-backend latencies.
fn run(
    estate: &Estate,
    latencies: &[u64],
    strategy: MergeStrategy,
    target: &str,
) -> Result<(Observed, Vec<SentRequest>, String), TestCaseError> {
    let backends = (0..estate.backends.len())
        .map(|index| {
            FakeBackend::puppetdb(
                &backend_name(index),
                &backend_url(index),
                estate.database(index),
                ms(latencies[index]),
            )
        })
        .collect();
    let mut h = Harness::with_config(backends, |config| {
        config.timeout = ms(TIMEOUT_MS);
        config.merge = strategy;
    })
    .map_err(|e| TestCaseError::fail(e.to_string()))?;
    let client = h.get(target);
    h.drive_bounded(STEPS).map_err(|e| fail(&h, e))?;
    h.check_quiescent().map_err(|e| fail(&h, e))?;
    let response = h.response(client).map_err(|e| fail(&h, e))?;
    let body = serde_json::from_slice(&response.body)
        .map_err(|e| fail(&h, format!("{e}: {}", response.body_str())))?;
    let observed = Observed {
        status: response.status.as_u16(),
        body,
        x_records: response.header("x-records").map(str::to_owned),
        x_backends: response.header("x-backends").map(str::to_owned),
    };
    Ok((observed, h.sends().to_vec(), h.transcript()))
}

/// Checks every exchange's upstream request: no offset; the records asked for once each (at
/// least `offset + limit`), then at most once more, pushed down (exactly the shared nodes the
/// backend does not own excluded, `offset + limit`); corrections (an extract count over
/// certnames it does not own) only beside a paged total; and a URL short enough for PuppetDB.
fn check_upstream(
    sends: &[SentRequest],
    estate: &Estate,
    (strategy, kind): (MergeStrategy, Kind),
    paging: &Paging,
    query: Option<&Value>,
    transcript: &str,
) -> Result<(), TestCaseError> {
    let mut records = vec![0usize; estate.backends.len()];
    let mut pushed = vec![0usize; estate.backends.len()];
    let mut provenance = vec![0usize; estate.backends.len()];
    let reach = paging.limit.map(|l| l + paging.offset.unwrap_or(0));
    for sent in sends.iter().filter(|s| s.machine != Machine::Estate) {
        let request = &sent.request;
        let backend = request.backend.0;
        let asking = read_asking(&Asked::of(request))
            .map_err(|e| TestCaseError::fail(format!("{e}\n{transcript}")))?;
        prop_assert!(
            !asking.params.iter().any(|p| p == "offset"),
            "offset forwarded: {}\n{transcript}",
            request.path_and_query
        );
        // The provenance records of an unwindowed `/facts` question ordered by another field
        // than certname first, asked apart: each node the backend finds under the query.
        let is_provenance_ask = asking.query.as_ref().is_some_and(|q| {
            q.get(0) == Some(&json!("extract"))
                && q.get(1) == Some(&json!(["certname", "environment"]))
        });
        if is_provenance_ask {
            let apart = kind == Kind::Facts
                && paging.limit.is_none()
                && paging.offset.is_none()
                && !paging.include_total
                && paging
                    .order_by
                    .first()
                    .is_some_and(|(field, _)| *field != "certname");
            prop_assert!(apart, "provenance records asked apart: {}", transcript);
            provenance[backend] += 1;
            continue;
        }
        let mut excluded = excluded_certnames(asking.query.as_ref());
        excluded.sort();
        let is_correction = asking
            .query
            .as_ref()
            .is_some_and(|q| q.get(0) == Some(&json!("extract")));
        if is_correction {
            prop_assert!(
                paging.include_total && paging.is_paged(),
                "a correction: {}",
                transcript
            );
            continue;
        }
        if excluded.is_empty() {
            records[backend] += 1;
            match reach {
                Some(reach) => prop_assert!(
                    asking.limit.is_some_and(|limit| limit >= reach),
                    "limit {:?} under {reach}\n{transcript}",
                    asking.limit
                ),
                None => prop_assert_eq!(asking.limit, None, "{}", transcript),
            }
        } else {
            pushed[backend] += 1;
            prop_assert_eq!(
                &excluded,
                &estate.excluded(backend, strategy, kind),
                "exclusions for {}\n{}",
                sent.backend_name,
                transcript
            );
            prop_assert_eq!(asking.limit, reach, "{}", transcript);
        }
        match request.method {
            Method::GET => prop_assert!(
                request.path_and_query.len() <= MAX_URL,
                "a {}-byte URL upstream",
                request.path_and_query.len()
            ),
            Method::POST => {
                prop_assert!(!request.path_and_query.contains('?'));
                prop_assert!(request.body.is_some());
            }
            _ => prop_assert!(false, "method {}", request.method),
        }
    }
    // A query pinned to certnames goes only to their owners (everyone when one is unknown).
    let owners = estate.owners(strategy, kind);
    let needed: Option<Vec<usize>> = query
        .and_then(|q| pdbmux_core::query::analyze(q).pinned_certnames)
        .filter(|pinned| !pinned.is_empty())
        .and_then(|pinned| pinned.iter().map(|c| owners.get(c).copied()).collect());
    for (backend, (records, pushed)) in records.iter().zip(&pushed).enumerate() {
        let asked = records + pushed;
        let expected = needed
            .as_ref()
            .is_none_or(|needed| needed.contains(&backend));
        prop_assert!(
            (asked >= 1) == expected && asked <= 2 && *pushed <= 1,
            "backend {backend} asked for records {records} times, pushed down {pushed}\n{transcript}"
        );
        prop_assert!(
            provenance[backend] <= 1,
            "backend {backend} asked for provenance records {} times\n{transcript}",
            provenance[backend]
        );
    }
    Ok(())
}

fn nodes_reference(estate: &Estate, paging: &Paging) -> (Vec<Value>, usize) {
    let owners = estate.owners(MergeStrategy::Freshness, Kind::Node);
    // Unpaged, a record's facts fields are its facts owner's (the record is composed).
    let facts_owners = estate.owners(MergeStrategy::Freshness, Kind::Facts);
    let facts_stamp = |certname: &str| {
        let owner = facts_owners.get(certname).copied()?;
        estate.backends[owner]
            .iter()
            .find(|h| h.certname == certname)
            .map(|h| h.facts_stamp)
    };
    let mut records = Vec::new();
    for (backend, holdings) in estate.backends.iter().enumerate() {
        for holding in holdings {
            if owners.get(&holding.certname) == Some(&backend) {
                let mut record = node_record(&holding.certname, holding.stamp);
                let stamp = match paging.is_paged() {
                    false => facts_stamp(&holding.certname).unwrap_or(holding.facts_stamp),
                    true => holding.facts_stamp,
                };
                record["facts_timestamp"] = json!(stamp);
                record["pdbmux_source"] = json!(backend_name(backend));
                records.push(record);
            }
        }
    }
    sort_records(&mut records, &owned_order(paging));
    let total = records.len();
    (window(records, paging.offset, paging.limit), total)
}

/// Every owned fact record (in configured order, then storage order), filtered; then, unpaged,
/// one synthetic record per node right after its last record; sorted and windowed.
fn facts_reference(
    estate: &Estate,
    strategy: MergeStrategy,
    filter: Option<&Value>,
    paging: &Paging,
) -> (Vec<Value>, usize) {
    let owners = estate.owners(strategy, Kind::Facts);
    let mut records: Vec<Value> = Vec::new();
    for (backend, holdings) in estate.backends.iter().enumerate() {
        for holding in holdings {
            if owners.get(&holding.certname) != Some(&backend) {
                continue;
            }
            let mut node_records: Vec<Value> = holding
                .facts
                .iter()
                .map(|(name, value)| {
                    fact_record(&holding.certname, name, value.clone(), holding.environment)
                })
                .filter(|record| filter.is_none_or(|f| matches(f, record).unwrap_or(false)))
                .collect();
            if !node_records.is_empty() && !paging.is_paged() {
                node_records.push(fact_record(
                    &holding.certname,
                    SOURCE_FACT,
                    json!(backend_name(backend)),
                    holding.environment,
                ));
            }
            records.extend(node_records);
        }
    }
    sort_records(&mut records, &owned_order(paging));
    let total = records.len();
    (window(records, paging.offset, paging.limit), total)
}

/// The owners' resources, sorted (storage order for ties and unordered requests) and windowed.
fn resources_reference(estate: &Estate, paging: &Paging) -> (Vec<Value>, usize) {
    let owners = estate.owners(MergeStrategy::Freshness, Kind::Catalog);
    let mut records: Vec<Value> = Vec::new();
    for (backend, holdings) in estate.backends.iter().enumerate() {
        for holding in holdings {
            if owners.get(&holding.certname) == Some(&backend) {
                records.extend(holding.resource_records());
            }
        }
    }
    sort_records(&mut records, &owned_order(paging));
    let total = records.len();
    (window(records, paging.offset, paging.limit), total)
}

/// Every backend's reports, each hash once (the first backend's copy), sorted and windowed.
fn reports_reference(estate: &Estate, paging: &Paging) -> (Vec<Value>, usize) {
    let mut seen = std::collections::BTreeSet::new();
    let mut records: Vec<Value> = Vec::new();
    for holding in estate.backends.iter().flatten() {
        for report in holding.report_records() {
            if seen.insert(report["hash"].to_string()) {
                records.push(report);
            }
        }
    }
    sort_records(&mut records, &owned_order(paging));
    let total = records.len();
    (window(records, paging.offset, paging.limit), total)
}

/// No exchange sent an offset upstream: windows are cut after the merge.
fn no_offset_upstream(sends: &[SentRequest]) -> Result<(), TestCaseError> {
    for send in sends.iter().filter(|s| s.machine != Machine::Estate) {
        let asking = read_asking(&Asked::of(&send.request)).map_err(TestCaseError::fail)?;
        prop_assert!(
            asking.offset.is_none(),
            "an offset went upstream: {}",
            asking.path
        );
    }
    Ok(())
}

fn latencies(n: usize) -> impl Strategy<Value = (Vec<u64>, Vec<u64>)> {
    prop::collection::vec(0..40u64, n).prop_flat_map(|latencies| {
        let shuffled = Just(latencies.clone()).prop_shuffle();
        (Just(latencies), shuffled)
    })
}

fn nodes_case() -> impl Strategy<Value = (Estate, Paging, (Vec<u64>, Vec<u64>))> {
    estate().prop_flat_map(|estate| {
        let n = estate.backends.len();
        (Just(estate), paging(node_order()), latencies(n))
    })
}

/// An optional client filter: the merge must compose the ownership clause with it.
#[derive(Debug, Clone)]
enum Filter {
    None,
    Environment,
    Certnames(Vec<usize>),
}

impl Filter {
    fn query(&self, long: bool) -> Option<Value> {
        match self {
            Filter::None => None,
            Filter::Environment => Some(json!(["=", "environment", "production"])),
            Filter::Certnames(names) => {
                let names: Vec<String> = names.iter().map(|i| certname(*i, long)).collect();
                Some(json!(["in", "certname", ["array", names]]))
            }
        }
    }
}

fn filter() -> impl Strategy<Value = Filter> {
    prop_oneof![
        3 => Just(Filter::None),
        1 => Just(Filter::Environment),
        1 => prop::collection::vec(0..CERTNAMES.len(), 1..4).prop_map(Filter::Certnames),
    ]
}

type FactsCase = (Estate, Paging, bool, Filter, (Vec<u64>, Vec<u64>));

fn facts_case() -> impl Strategy<Value = FactsCase> {
    estate().prop_flat_map(|estate| {
        let n = estate.backends.len();
        (
            Just(estate),
            paging(fact_order()),
            any::<bool>(),
            filter(),
            latencies(n),
        )
    })
}

type RecordsCase = (Estate, Paging, (Vec<u64>, Vec<u64>));

fn resources_case() -> impl Strategy<Value = RecordsCase> {
    estate().prop_flat_map(|estate| {
        let n = estate.backends.len();
        let order = completed_order(
            vec!["certname", "type", "title", "line"],
            &["certname", "type", "title"],
        );
        (Just(estate), paging(order), latencies(n))
    })
}

fn reports_case() -> impl Strategy<Value = RecordsCase> {
    estate().prop_flat_map(|estate| {
        let n = estate.backends.len();
        let order = completed_order(vec!["end_time", "certname", "status"], &["hash"]);
        (Just(estate), paging(order), latencies(n))
    })
}

/// Runs `target` with both latency orders, checks the answers agree and no offset went
/// upstream, and compares with the reference window and total.
fn check_records(
    estate: &Estate,
    latencies: &(Vec<u64>, Vec<u64>),
    target: &str,
    paging: &Paging,
    (expected, total): (Vec<Value>, usize),
) -> Result<(), TestCaseError> {
    let (first, sends, transcript) = run(estate, &latencies.0, MergeStrategy::Freshness, target)?;
    let (second, _, _) = run(estate, &latencies.1, MergeStrategy::Freshness, target)?;
    prop_assert_eq!(&first, &second, "latencies {:?}\n{}", latencies, transcript);
    no_offset_upstream(&sends)?;
    prop_assert_eq!(first.status, 200, "{}", transcript);
    prop_assert_eq!(&first.body, &Value::Array(expected), "{}", transcript);
    let expected_total = paging.include_total.then(|| total.to_string());
    prop_assert_eq!(&first.x_records, &expected_total, "{}", transcript);
    Ok(())
}

fn long_names(estate: &Estate) -> bool {
    estate
        .backends
        .iter()
        .flatten()
        .any(|h| h.certname.len() > 100)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: CASES, ..ProptestConfig::default() })]

    #[test]
    fn nodes_window_equals_the_reference_merge((estate, paging, (latencies, shuffled)) in nodes_case()) {
        let target = target("/pdb/query/v4/nodes", None, &paging);
        let (first, sends, transcript) = run(&estate, &latencies, MergeStrategy::Freshness, &target)?;
        let (second, _, second_transcript) = run(&estate, &shuffled, MergeStrategy::Freshness, &target)?;
        prop_assert_eq!(&first, &second, "latencies {:?} vs {:?}\n{}\n{}", latencies, shuffled, transcript, second_transcript);
        check_upstream(&sends, &estate, (MergeStrategy::Freshness, Kind::Node), &paging, None, &transcript)?;
        let (expected, total) = nodes_reference(&estate, &paging);
        prop_assert_eq!(first.status, 200);
        prop_assert_eq!(&first.body, &Value::Array(expected), "{}", transcript);
        let expected_total = paging.include_total.then(|| total.to_string());
        prop_assert_eq!(&first.x_records, &expected_total, "{}", transcript);
        let expected_backends = format!("{n}/{n}", n = estate.backends.len());
        prop_assert_eq!(first.x_backends.as_deref(), Some(expected_backends.as_str()));
    }

    #[test]
    fn facts_window_equals_the_reference_merge(
        (estate, paging, static_merge, filter, (latencies, shuffled)) in facts_case()
    ) {
        // An upstream record named like the provenance fact is dropped after the backend paged,
        // so it would shorten a page; keep the paged cases free of them.
        let estate = if paging.is_paged() { estate.without_impostors() } else { estate };
        let strategy = if static_merge { MergeStrategy::Static } else { MergeStrategy::Freshness };
        let query = filter.query(long_names(&estate));
        let target = target("/pdb/query/v4/facts", query.as_ref(), &paging);
        let (first, sends, transcript) = run(&estate, &latencies, strategy, &target)?;
        let (second, _, second_transcript) = run(&estate, &shuffled, strategy, &target)?;
        prop_assert_eq!(&first, &second, "latencies {:?} vs {:?}\n{}\n{}", latencies, shuffled, transcript, second_transcript);
        check_upstream(&sends, &estate, (strategy, Kind::Facts), &paging, query.as_ref(), &transcript)?;
        let (expected, total) = facts_reference(&estate, strategy, query.as_ref(), &paging);
        prop_assert_eq!(first.status, 200);
        prop_assert_eq!(&first.body, &Value::Array(expected), "{}", transcript);
        let expected_total = paging.include_total.then(|| total.to_string());
        prop_assert_eq!(&first.x_records, &expected_total, "{}", transcript);
    }

    #[test]
    fn resources_window_equals_the_owners_resources((estate, paging, latencies) in resources_case()) {
        let target = target("/pdb/query/v4/resources", None, &paging);
        let reference = resources_reference(&estate, &paging);
        check_records(&estate, &latencies, &target, &paging, reference)?;
    }

    #[test]
    fn reports_window_and_total_count_a_report_stored_twice_once(
        (estate, paging, latencies) in reports_case()
    ) {
        let target = target("/pdb/query/v4/reports", None, &paging);
        let reference = reports_reference(&estate, &paging);
        check_records(&estate, &latencies, &target, &paging, reference)?;
    }
}

#[test]
fn the_reference_owners_follow_freshness_and_configured_order() {
    // One run per holding: its report, facts and catalog produced at `stamp`.
    let holding = |certname: &str, stamp| Holding {
        certname: certname.to_owned(),
        stamp,
        environment: "production",
        facts_stamp: None,
        facts_produced: stamp,
        catalog_produced: stamp,
        facts: vec![("os", json!("Debian"))],
        impostor: false,
        resources: Vec::new(),
        reports: Vec::new(),
    };
    let estate = Estate {
        backends: vec![
            vec![
                holding("tie", STAMPS[2]),
                holding("null-first", None),
                holding("newer-later", STAMPS[1]),
            ],
            vec![
                holding("tie", STAMPS[2]),
                holding("null-first", STAMPS[1]),
                holding("newer-later", STAMPS[3]),
            ],
        ],
    };
    let owners = estate.owners(MergeStrategy::Freshness, Kind::Node);
    assert_eq!(owners["tie"], 0);
    assert_eq!(owners["null-first"], 1);
    assert_eq!(owners["newer-later"], 1);
    assert!(estate
        .owners(MergeStrategy::Static, Kind::Facts)
        .values()
        .all(|b| *b == 0));
    assert_eq!(
        estate.excluded(0, MergeStrategy::Freshness, Kind::Facts),
        ["newer-later", "null-first"]
    );
    assert_eq!(
        estate.excluded(1, MergeStrategy::Freshness, Kind::Catalog),
        ["tie"]
    );
    // The kinds apart: tie's facts produced later in pdb-1 make its facts pdb-1's.
    let mut split = estate.clone();
    split.backends[1][0].facts_produced = STAMPS[3];
    assert_eq!(
        split.owners(MergeStrategy::Freshness, Kind::Facts)["tie"],
        1
    );
    assert_eq!(
        split.owners(MergeStrategy::Freshness, Kind::Catalog)["tie"],
        0
    );
    assert_eq!(split.owners(MergeStrategy::Freshness, Kind::Node)["tie"], 1);
    let paging = Paging {
        order_by: vec![("certname", Dir::Asc)],
        limit: None,
        offset: None,
        include_total: false,
    };
    let (facts, total) = facts_reference(&estate, MergeStrategy::Freshness, None, &paging);
    assert_eq!(total, 6, "three facts and three synthetic records");
    assert_eq!(facts[0]["certname"], json!("newer-later"));
    assert_eq!(facts[1]["value"], json!("pdb-1"));
}
