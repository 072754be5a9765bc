//! The route-policy table: everything the core decides about a request from its route and its
//! query, decided in one place, once per request, before the estate is touched.
//!
//! Call [`plan`] on every client request (outside whatever lock guards the [`crate::Estate`]):
//! it reads the target once ([`ParsedRequest`]: the route by the allowlist, the parameters),
//! parses the query once ([`ParsedRequest::parsed_query`], which every plan below takes its
//! query from, and keeps), and
//! picks the way the request is answered ([`crate::fanout::Plan`]), whether it needs the
//! membership map, and the key it is cached under. Hand the result to
//! [`crate::Estate::admit`].

use std::sync::Arc;
use std::time::Duration;

use http::{HeaderValue, StatusCode};

use crate::aggregate::AggregatePlan;
use crate::asked_of_all::AskedOfAll;
use crate::cache::{self, Cacheable};
use crate::concat::Concat;
use crate::config::{CacheClass, Config};
use crate::fanout::Plan;
use crate::jolokia::JolokiaPlan;
use crate::merge::RecordPlan;
use crate::message::{ClientRequest, Response};
use crate::meta::{FirstInOrder, LowestVersion};
use crate::parent::ParentChecked;
use crate::parsed::ParsedRequest;
use crate::query::{Params, QueryText};
use crate::root::{self, Pql, RootQuery};
use crate::route::{Route, RouteClass};
use crate::sequence::{Holder, Sequence};
use crate::source_ask::{self, SourceAsk, SourcePart};

/// A request read and planned once: what [`crate::Estate::admit`] takes.
#[derive(Debug)]
pub struct Planned {
    pub(crate) config: Arc<Config>,
    pub(crate) class: RouteClass,
    /// The request as read: planned again from it after a reload.
    pub(crate) request: Arc<ParsedRequest>,
    pub(crate) cache: Option<Cacheable>,
    pub(crate) work: Work,
    /// Backends not to ask: those that let this request wait out the whole timeout for the
    /// first membership map, so that its wait and its query share one timeout (asking again
    /// would only wait again); they count as failed for this request.
    pub(crate) waited_out: Vec<crate::ids::BackendId>,
    /// How many membership refreshes it waited for while the map placed no backend.
    pub(crate) map_waits: u8,
}

/// What answers a planned request.
#[derive(Debug)]
pub(crate) enum Work {
    /// Answered from the request and the configuration alone: a refusal, a 400, an answer
    /// known without asking (the provenance path of an unknown backend).
    Local(Response),
    /// `/healthz`, which the estate answers itself.
    Healthz,
    /// Backends are asked: drive this plan in an [`crate::Exchange`].
    Fanout(Box<dyn Plan>),
    /// PQL on the root endpoint: translated by a backend, then planned as its entity's route
    /// ([`plan_translated`]).
    Translate(Pql),
}

impl Planned {
    /// `request`'s plan of `class`: answered by `work`, cached under `cache` when given.
    fn answered(
        (request, class): (&Arc<ParsedRequest>, RouteClass),
        config: &Arc<Config>,
        cache: Option<Cacheable>,
        work: Work,
    ) -> Planned {
        Planned {
            config: Arc::clone(config),
            class,
            request: Arc::clone(request),
            cache,
            work,
            waited_out: Vec::new(),
            map_waits: 0,
        }
    }

    /// The route class it was planned as (`query`, `root`, `per-certname`, …, or `refused`): a
    /// bounded label for metrics and logs.
    pub fn class(&self) -> RouteClass {
        self.class
    }

    /// The target of the request it plans.
    pub fn target(&self) -> &str {
        self.request.target()
    }

    /// Its request planned again with `config` (a reload happened since it was planned).
    pub(crate) fn again(&self, config: &Arc<Config>) -> Planned {
        plan_parsed(&self.request, config)
    }

    /// Whether its answer goes through the cache (where `X-Cache` says hit, miss or stale).
    pub fn is_cacheable(&self) -> bool {
        self.cache.is_some()
    }

    /// Whether answering needs the membership map.
    pub(crate) fn needs_ownership(&self) -> bool {
        matches!(&self.work, Work::Fanout(plan) if plan.needs_ownership())
    }
}

/// The answer to `/livez` or `/readyz` (README, "Probes and shutdown"): both are answered from
/// the process alone, so a backend outage never takes a replica out of its Service nor restarts
/// it; `/healthz` is where the backends' state is.
fn probe_answer(route: &Route, config: &Config) -> Response {
    let body = match route {
        Route::Readyz => serde_json::json!({
            "status": "ready",
            "backends": config.backends.len(),
        }),
        _ => serde_json::json!({"status": "live"}),
    };
    Response::json(StatusCode::OK, body.to_string())
}

/// Plans one client request with `config`: the table every route's policy is read from.
pub fn plan(request: &ClientRequest, config: &Arc<Config>) -> Planned {
    plan_parsed(&Arc::new(ParsedRequest::parse(request)), config)
}

/// Plans a request already read: a client's ([`plan`]), one derived from it, or one planned
/// again after a reload.
fn plan_parsed(request: &Arc<ParsedRequest>, config: &Arc<Config>) -> Planned {
    let class = request.route().map_or(RouteClass::Refused, Route::class);
    let planned = |cache, work| Planned::answered((request, class), config, cache, work);
    let route = match request.route() {
        Ok(route) => route,
        Err(refusal) => {
            let mut response = Response::text(refusal.status(), format!("pdbmux: {refusal}"));
            if refusal.status() == StatusCode::METHOD_NOT_ALLOWED {
                response
                    .headers
                    .insert(http::header::ALLOW, HeaderValue::from_static("GET"));
            }
            return planned(None, Work::Local(response));
        }
    };
    let target = request.target().to_owned();
    let merged = matches!(
        route,
        Route::Query(_)
            | Route::FactsByName { .. }
            | Route::ResourcesByType
            | Route::Root
            | Route::Within { .. }
    );
    // The request's parameters, read once: everything planned below takes these.
    let params = request.params();
    if let Some(key) = merged.then(|| repeated_param(params)).flatten() {
        let message = format!("pdbmux: query parameter {key} given more than once");
        return planned(
            None,
            Work::Local(Response::text(StatusCode::BAD_REQUEST, message)),
        );
    }
    let work = match &route {
        Route::Healthz => return planned(None, Work::Healthz),
        Route::Livez | Route::Readyz => {
            return planned(None, Work::Local(probe_answer(route, config)))
        }
        Route::PerCertname { certname, kind } => {
            Work::Fanout(Box::new(Sequence::owner_first(target, certname, *kind)))
        }
        Route::PassThrough => Work::Fanout(Box::new(Sequence::first_success(target))),
        Route::Root => match root::read(request) {
            RootQuery::Mapped(mapped) => return plan_mapped(mapped, request, config),
            RootQuery::Pql(pql) => Work::Translate(pql),
            RootQuery::PassThrough => Work::Fanout(Box::new(Sequence::first_success(target))),
        },
        Route::ReportHash { .. } => Work::Fanout(Box::new(AskedOfAll::new(target, Holder))),
        Route::MetaVersion => Work::Fanout(Box::new(AskedOfAll::new(target, LowestVersion))),
        Route::ServerTime => Work::Fanout(Box::new(AskedOfAll::new(target, FirstInOrder))),
        Route::Metrics(metrics) => {
            let plan = JolokiaPlan::plan(*metrics, target, config.merge);
            // A population figure is a count over the estate: cached as the counts are
            // (docs/caching.md); the backends' own JVM figures are live and stay uncached.
            let ttl = config.cache_ttl(CacheClass::Aggregates);
            // Not with a parameter given twice: the key would not tell which one counts.
            let cache = (plan.reads_population() && repeated_param(params).is_none())
                .then(|| client_cache((request, route), ttl, config))
                .flatten();
            return planned(cache, Work::Fanout(Box::new(plan)));
        }
        Route::Query(_) | Route::FactsByName { .. } | Route::ResourcesByType => {
            return plan_query(request, route, config);
        }
        Route::Within {
            field,
            value,
            entity_path,
        } => return plan_within(request, (field, value), entity_path, config),
    };
    planned(None, work)
}

/// The first parameter a request gives more than once: which one a merge should read is not
/// defined (PuppetDB answers some with a 500), so such requests are refused.
fn repeated_param(params: &Params) -> Option<String> {
    let mut seen = std::collections::BTreeSet::new();
    let repeated = params
        .iter()
        .map(|param| param.key())
        .find(|key| !seen.insert(*key))
        .map(str::to_owned);
    repeated
}

/// Plans `derived`, a request pdbmux derived from the client's (a root query's entity route, a
/// sub-route's, the provenance fact's path), as the client's own plan: it keeps `client` as its
/// request, so a reload plans it again from what the client asked, not from the derivation.
fn plan_derived(
    derived: ParsedRequest,
    client: &Arc<ParsedRequest>,
    config: &Arc<Config>,
) -> Planned {
    Planned {
        request: Arc::clone(client),
        ..plan_parsed(&Arc::new(derived), config)
    }
}

/// Plans a root-endpoint query mapped onto `mapped`, its entity's route: as that route's own
/// request, whatever the length of the mapped target (the client's was within the limit),
/// labelled `root`.
fn plan_mapped(
    mapped: ParsedRequest,
    original: &Arc<ParsedRequest>,
    config: &Arc<Config>,
) -> Planned {
    Planned {
        class: Route::Root.class(),
        ..plan_derived(mapped, original, config)
    }
}

/// Plans a sub-route (`/environments/<env>/facts`, `/producers/<p>/reports`, …) as its entity's
/// route with `["=", field, value]` added to the query the way PuppetDB adds it
/// (`add_clause`), and the request's other parameters as they are. A query that is not an AST
/// (PQL, malformed JSON) is passed through: PuppetDB answers it with its own 400.
fn plan_within(
    request: &Arc<ParsedRequest>,
    (field, raw_value): (&str, &str),
    entity_path: &str,
    config: &Arc<Config>,
) -> Planned {
    let value = percent_encoding::percent_decode_str(raw_value).decode_utf8_lossy();
    let clause = serde_json::json!(["=", field, value]);
    let params = request.params();
    let query = match request.parsed_query().text() {
        QueryText::Absent => clause,
        QueryText::Ast(ast) => crate::query::add_clause(Some(ast), clause),
        QueryText::Pql(_) | QueryText::Malformed(_) => {
            let target = request.target().to_owned();
            let work = Work::Fanout(Box::new(Sequence::first_success(target)));
            return Planned::answered((request, RouteClass::PassThrough), config, None, work);
        }
    };
    let mut mapped = Params::default();
    mapped.set("query", &query.to_string());
    for param in params.iter().filter(|p| p.key() != "query") {
        mapped.set(param.key(), param.value());
    }
    let target = format!("{}/{entity_path}?{}", root::ROOT, mapped.to_query_string());
    // The route table admitted only an entity's record routes below a parent.
    let derived = ParsedRequest::derived(target, Some(query));
    // Planned again from the client's own request (after a reload), so the parent check comes
    // with it.
    let planned = plan_derived(derived, request, config);
    // The field names its parent: `environment` is found at `/environments/<env>`.
    let parent_path = format!("{}/{field}s/{raw_value}", root::ROOT);
    Planned {
        // Stored apart from the entity route's own answer to the same query: that one is `[]`
        // where this one is a 404.
        cache: planned.cache.map(|cacheable| Cacheable {
            key: format!("{parent_path} {}", cacheable.key),
            flight_key: format!("{parent_path} {}", cacheable.flight_key),
            ..cacheable
        }),
        work: match planned.work {
            Work::Fanout(merge) => Work::Fanout(Box::new(ParentChecked::new(merge, parent_path))),
            other => other,
        },
        ..planned
    }
}

/// Plans the provenance records of one part ([`SourcePart`]) as the client's own plan: its path,
/// or, narrowed to several backends, [`plan_source_values`].
fn plan_source_part(
    (request, route): (&Arc<ParsedRequest>, &Route),
    part: SourcePart,
    config: &Arc<Config>,
) -> Planned {
    match part.values {
        None => plan_derived(part.request, request, config),
        // Planned again from the client's request, so its values come with it.
        Some(values) => Planned {
            request: Arc::clone(request),
            ..plan_source_values((request, route), part.request, values, config)
        },
    }
}

/// Plans a `/facts` query answered by several record sets joined ([`SourceAsk::Joined`]): the
/// other facts' records, when the query admits them, then each part's provenance records; the
/// plans answer it together (`core/src/concat.rs`; ordered, merged in the request's order),
/// cached under the client's request as a `/facts` answer is.
fn plan_joined(
    (request, route): (&Arc<ParsedRequest>, &Route),
    (records, parts, order): (
        Option<ParsedRequest>,
        Vec<SourcePart>,
        Option<crate::sort::OrderBy>,
    ),
    config: &Arc<Config>,
) -> Planned {
    let answered = |work, cache| Planned::answered((request, route.class()), config, cache, work);
    let mut works = Vec::with_capacity(parts.len() + 1);
    if let Some(records) = records {
        // The other facts as the backends answer them, planned as records: not read for the
        // provenance fact again.
        works.push(plan_records(&Arc::new(records), route, config).work);
    }
    // Each part's own merge, uncached: a cached plan of a value's path fetches the whole record
    // set and leaves the value to the cache, which a joined answer does not pass through.
    works.extend(
        parts
            .into_iter()
            .map(|part| source_part_work(&part.request, part.values, config)),
    );
    let mut joined: Option<Box<dyn Plan>> = None;
    for work in works {
        let Work::Fanout(plan) = work else {
            // A part answered without asking (its parameters refused): the request's answer.
            return answered(work, None);
        };
        joined = Some(match joined {
            Some(first) => Box::new(Concat::new(first, plan, order.clone())),
            None => plan,
        });
    }
    // A join has at least one part (`source_ask::read`).
    let Some(plan) = joined else {
        return answered(Work::Local(Response::json(StatusCode::OK, "[]")), None);
    };
    let ttl = route.entity().map_or(Duration::ZERO, |entity| {
        config.cache_ttl(entity.cache_class())
    });
    answered(
        Work::Fanout(plan),
        client_cache((request, route), ttl, config),
    )
}

/// Plans a `/facts` query for the provenance records of several backends: with the cache, it
/// joins the fan-out of the whole `/facts/<source_fact>` record set and is filtered from it
/// (stored under its own key); without, the whole path's merge keeps only those records.
fn plan_source_values(
    (request, route): (&ParsedRequest, &Route),
    whole: ParsedRequest,
    values: Vec<String>,
    config: &Arc<Config>,
) -> Planned {
    let whole_request = Arc::new(whole);
    let mut planned = plan_parsed(&whole_request, config);
    match planned.cache.take() {
        Some(shared) => {
            planned.cache = cache::cache_key(
                route,
                (request.path(), request.query(), request.params()),
                &config.source_fact,
                shared.ttl,
            )
            .map(|own| Cacheable {
                key: own.key,
                ttl: own.ttl,
                flight_key: shared.flight_key,
                fan_out_target: Some(whole_request.target().to_owned()),
                value_filter: Some(values),
            });
        }
        None => {
            if let Work::Fanout(_) = planned.work {
                planned.work = source_part_work(&whole_request, Some(values), config);
            }
        }
    }
    planned
}

/// The merge of the provenance fact's own path (`part`, a path pdbmux derived), uncached,
/// keeping only the records of `values` when given: a part of an answer narrowed to several
/// backends, or one of several parts joined.
fn source_part_work(
    part: &ParsedRequest,
    values: Option<Vec<String>>,
    config: &Arc<Config>,
) -> Work {
    let planned = part.route().ok().and_then(|route| {
        let entity = route.entity()?;
        let params = part.params().clone();
        let query = Arc::clone(part.parsed_query());
        Some(RecordPlan::plan(
            route,
            entity,
            part.path(),
            params,
            query,
            config,
        ))
    });
    match planned {
        Some(Ok(mut plan)) => {
            if let Some(values) = values {
                plan.keep_sources(values);
            }
            Work::Fanout(Box::new(plan))
        }
        Some(Err(response)) => Work::Local(*response),
        // Not a record route (a derived path always is): planned as it is.
        None => plan_parsed(&Arc::new(part.clone()), config).work,
    }
}

/// Plans PQL once a backend translated it (`translation`, the body of its `ast_only=true`
/// answer): a `from` query on a merged entity is planned as that route's; anything else is
/// asked of the backends as the client sent it (`original`). `None` when the body is not a JSON
/// AST at all.
pub(crate) fn plan_translated(
    translation: &[u8],
    pql: &Pql,
    original: &Arc<ParsedRequest>,
    config: &Arc<Config>,
) -> Option<Planned> {
    let ast: serde_json::Value = serde_json::from_slice(translation).ok()?;
    Some(match root::mapped_request(&ast, &pql.params) {
        Some(mapped) => plan_mapped(mapped, original, config),
        None => {
            let target = original.target().to_owned();
            let work = Work::Fanout(Box::new(Sequence::first_success(target)));
            Planned::answered((original, Route::Root.class()), config, None, work)
        }
    })
}

/// The plan of a query on a merged entity: an aggregate when it combines, else a record merge;
/// cached for its class's TTL (record sets, history, combined answers: docs/caching.md).
fn plan_query(request: &Arc<ParsedRequest>, route: &Route, config: &Arc<Config>) -> Planned {
    let uncached = |work| Planned::answered((request, route.class()), config, None, work);
    match source_ask::read(request, route, config) {
        Some(SourceAsk::Part(part)) => return plan_source_part((request, route), part, config),
        Some(SourceAsk::Nothing) => {
            return uncached(Work::Local(Response::json(StatusCode::OK, "[]")))
        }
        Some(SourceAsk::Refused(message)) => {
            return uncached(Work::Local(Response::refusal(message)))
        }
        Some(SourceAsk::Joined {
            records,
            parts,
            order,
        }) => return plan_joined((request, route), (records, parts, order), config),
        None => {}
    }
    plan_records(request, route, config)
}

/// Plans a query of an entity's records (or an aggregate of them) as the backends hold them:
/// [`plan_query`] once the provenance fact's own shapes are read.
fn plan_records(request: &Arc<ParsedRequest>, route: &Route, config: &Arc<Config>) -> Planned {
    let params = request.params().clone();
    let uncached = |work| Planned::answered((request, route.class()), config, None, work);
    let Some(entity) = route.entity() else {
        let target = request.target().to_owned();
        return uncached(Work::Fanout(Box::new(Sequence::first_success(target))));
    };
    let query = request.parsed_query();
    let path = request.path();
    let aggregate = AggregatePlan::plan(entity, path, &params, query, config);
    let combines = aggregate.is_some();
    let class = match combines {
        true => CacheClass::Aggregates,
        false => entity.cache_class(),
    };
    let ttl = config.cache_ttl(class);
    let cacheable = client_cache((request, route), ttl, config);
    let work = match aggregate {
        Some(Ok(aggregate)) => Work::Fanout(Box::new(aggregate)),
        Some(Err(refusal)) => Work::Local(refusal),
        None => {
            let shared = params.clone();
            let plan = RecordPlan::plan(route, entity, path, params, Arc::clone(query), config);
            // The provenance drilldown fetches the shared record set, without its value (which
            // is applied to the shared answer, docs/merging.md "Provenance").
            let drilldown = cacheable
                .as_ref()
                .and_then(|c| c.fan_out_target.as_deref())
                .map(|target| ParsedRequest::derived(target.to_owned(), None));
            match (plan, drilldown.as_ref().map(|d| (d.route(), d.path()))) {
                (Err(response), _) => Work::Local(*response),
                (Ok(_), Some((Ok(route), path))) => {
                    let query = Arc::clone(query);
                    match RecordPlan::plan(route, entity, path, shared, query, config) {
                        Ok(plan) => Work::Fanout(Box::new(plan)),
                        Err(response) => Work::Local(*response),
                    }
                }
                (Ok(plan), _) => Work::Fanout(Box::new(plan)),
            }
        }
    };
    Planned::answered((request, route.class()), config, cacheable, work)
}

/// The key `request` of `route` is cached under for `ttl`; `None` when `ttl` is zero (not cached).
fn client_cache(
    (request, route): (&ParsedRequest, &Route),
    ttl: Duration,
    config: &Config,
) -> Option<Cacheable> {
    let parts = (request.path(), request.query(), request.params());
    (!ttl.is_zero())
        .then(|| cache::cache_key(route, parts, &config.source_fact, ttl))
        .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::entity::Entity;
    use crate::source_ask::SEGMENT;

    fn config() -> Arc<Config> {
        Arc::new(Config::on_loopback(&[("pdb-a", 1), ("pdb-b", 2)]))
    }

    #[test]
    fn the_table_decides_ownership_and_caching_once() {
        let config = config();
        let cases: &[(&str, bool, bool)] = &[
            // target, needs the membership map, cached (every merged answer: docs/caching.md)
            ("/pdb/query/v4/nodes", true, true),
            ("/pdb/query/v4/facts", true, true),
            ("/pdb/query/v4/fact-names", false, true),
            ("/pdb/query/v4/environments", false, true),
            ("/pdb/query/v4/reports", false, true),
            ("/pdb/query/v4/catalogs", true, true),
            ("/pdb/query/v4/resources", true, true),
            ("/pdb/query/v4/resources/File", true, true),
            ("/pdb/query/v4/factsets", true, true),
            ("/pdb/query/v4/packages", true, true),
            // A shape the owned-packages rewrite leaves alone goes to /packages at once.
            (
                "/pdb/query/v4/packages?query=%5B%22extract%22%2C%5B%22package_name%22%5D%5D",
                false,
                true,
            ),
            ("/pdb/query/v4/package-inventory", true, true),
            (
                "/pdb/query/v4/reports?query=%5B%22%3D%22%2C%22latest_report%3F%22%2Ctrue%5D",
                true,
                true,
            ),
            (
                "/pdb/query/v4/reports?query=%5B%22%3D%22%2C%22certname%22%2C%22a%22%5D",
                true,
                true,
            ),
            (
                "/pdb/query/v4/nodes?query=%5B%22extract%22%2C%5B%5B%22function%22%2C%22count%22%5D%5D%5D",
                true,
                true,
            ),
            ("/pdb/query/v4/catalog-inputs", true, true),
            ("/pdb/query/v4/environments/production", false, false),
            ("/pdb/query/v4/nodes/web1", true, false),
            ("/pdb/meta/v1/version", false, false),
            // A population figure counts the estate; a backend's own figures are live.
            ("/metrics/v2/read/puppetlabs.puppetdb.population:name=num-nodes", true, true),
            (
                "/metrics/v2/read/puppetlabs.puppetdb.mq:name=global.processing-time",
                false,
                false,
            ),
            ("/metrics/v2/list", false, false),
        ];
        for (target, ownership, cached) in cases {
            let planned = plan(&ClientRequest::get(*target), &config);
            assert_eq!(planned.needs_ownership(), *ownership, "{target}");
            assert_eq!(planned.cache.is_some(), *cached, "{target}");
        }
        // Each class for its own TTL; a class whose TTL is 0 is not cached.
        let ttl = |target: &str, config: &Arc<Config>| {
            plan(&ClientRequest::get(target), config)
                .cache
                .map(|c| c.ttl.as_secs())
        };
        let count = "/pdb/query/v4/nodes?query=%5B%22extract%22%2C%5B%5B%22function%22%2C%22count%22%5D%5D%5D";
        let classes = Arc::new(Config {
            facts_ttl: std::time::Duration::from_secs(30),
            history_ttl: std::time::Duration::from_secs(10),
            aggregate_ttl: std::time::Duration::ZERO,
            ..(*config).clone()
        });
        assert_eq!(ttl("/pdb/query/v4/nodes", &classes), Some(30));
        assert_eq!(ttl("/pdb/query/v4/events", &classes), Some(10));
        assert_eq!(ttl(count, &classes), None);
        assert_eq!(
            ttl("/pdb/query/v4/event-counts?summarize_by=certname", &classes),
            None
        );
        let population = "/metrics/v2/read/puppetlabs.puppetdb.population:name=num-resources";
        assert_eq!(
            ttl(population, &config),
            Some(15),
            "aggregate_ttl's default"
        );
        assert_eq!(ttl(population, &classes), None);
        assert_eq!(
            ttl(&format!("{population}?a=1&a=2"), &config),
            None,
            "a parameter given twice is not keyed"
        );
        assert!(matches!(
            plan(&ClientRequest::get("/healthz"), &config).work,
            Work::Healthz
        ));
        assert!(matches!(
            plan(&ClientRequest::get("/pdb/admin/v1/archive"), &config).work,
            Work::Local(_)
        ));
    }

    #[test]
    fn a_parameter_given_twice_is_refused_on_merged_routes() {
        let config = config();
        for target in [
            "/pdb/query/v4/nodes?limit=1&limit=2",
            "/pdb/query/v4?query=nodes%20%7B%7D&query=facts%20%7B%7D",
        ] {
            let Work::Local(response) = plan(&ClientRequest::get(target), &config).work else {
                panic!("{target}: refused locally");
            };
            assert_eq!(response.status, StatusCode::BAD_REQUEST, "{target}");
        }
        assert!(matches!(
            plan(
                &ClientRequest::get("/pdb/query/v4/environments/production?limit=1&limit=2"),
                &config
            )
            .work,
            Work::Fanout(_)
        ));
    }

    proptest::proptest! {
        /// Planning a `/facts` query or the provenance fact's own path ends, whatever names and
        /// values the query constrains and how, and an answer of several parts is each part
        /// planned once and joined: a plan that read its own derived request again nested until
        /// the request grew too long (answered `[]`), and once planned that again until the
        /// stack overflowed.
        #[test]
        fn any_facts_query_plans_once(
            query in crate::source_ask::tests::facts_clause(),
            on_path in proptest::bool::ANY,
            extra in proptest::sample::select(vec!["", "&limit=3", "&order_by=%5B%7B%22field%22%3A%22certname%22%7D%5D"]),
        ) {
            let config = config();
            let path = if on_path { "/pdb/query/v4/facts/pdbmux_source" } else { "/pdb/query/v4/facts" };
            let target = format!(
                "{path}?query={}{extra}",
                percent_encoding::utf8_percent_encode(&query.to_string(), SEGMENT)
            );
            let planned = plan(&ClientRequest::get(target.clone()), &config);
            let request = ParsedRequest::parse(&ClientRequest::get(target.clone()));
            let route = request.route().expect("a route").clone();
            if let Some(SourceAsk::Joined { records, parts, .. }) = source_ask::read(&request, &route, &config) {
                let Work::Fanout(work) = &planned.work else {
                    return Err(proptest::test_runner::TestCaseError::fail(format!(
                        "{target}: several requests, not asked"
                    )));
                };
                // Each part asked once: one join fewer than the requests, none nested deeper.
                let joined = format!("{work:?}").matches("Concat").count();
                proptest::prop_assert_eq!(joined, parts.len() + usize::from(records.is_some()) - 1, "{}", target);
            }
        }
    }

    #[test]
    fn every_entity_is_merged_on_its_own_path() {
        let config = config();
        for entity in crate::entity::ALL {
            let target = match entity {
                Entity::EventCounts | Entity::AggregateEventCounts => {
                    format!("{}?summarize_by=certname", entity.path())
                }
                _ => entity.path(),
            };
            let planned = plan(&ClientRequest::get(target), &config);
            assert!(matches!(planned.work, Work::Fanout(_)), "{entity:?}");
        }
    }

    /// A request planned again after a reload is planned from the client's own request: a root
    /// query stays `root`, a `/facts` query for some backends' provenance records keeps its
    /// values, a sub-route its parent.
    #[test]
    fn planned_again_a_request_is_the_clients_own_plan_whatever_it_was_derived_to() {
        let source = |values: &str| {
            let query = format!(
                r#"["and",["=","name","pdbmux_source"],["in","value",["array",{values}]]]"#
            );
            format!(
                "/pdb/query/v4/facts?query={}",
                form_urlencoded::byte_serialize(query.as_bytes()).collect::<String>()
            )
        };
        let targets = [
            format!(
                "/pdb/query/v4?query={}",
                form_urlencoded::byte_serialize(br#"["from","nodes",["=","certname","a"]]"#)
                    .collect::<String>()
            ),
            source(r#""pdb-a""#),
            source(r#""pdb-a","pdb-c""#),
            source(r#""pdb-a","pdb-x","pdb-b""#),
            "/pdb/query/v4/facts/pdbmux_source/pdb-b".to_owned(),
            "/pdb/query/v4/environments/production/facts".to_owned(),
        ];
        for cached in [true, false] {
            // Three backends, so that two of them are some but not all.
            let mut config = (*config()).clone();
            let mut third = config.backends[1].clone();
            third.name = "pdb-c".into();
            third.url.port = Some(3);
            config.backends.push(third);
            if !cached {
                config.facts_ttl = std::time::Duration::ZERO;
            }
            let config = Arc::new(config);
            // A reload to the same values: the plans must read the same.
            let reloaded = Arc::new((*config).clone());
            for target in &targets {
                let planned = plan(&ClientRequest::get(target.as_str()), &config);
                let again = planned.again(&reloaded);
                assert_eq!(planned.target(), target, "the client's own target");
                assert_eq!(again.target(), target);
                assert_eq!(again.class(), planned.class(), "{target}");
                assert_eq!(
                    format!("{:?} {:?}", again.cache, again.work),
                    format!("{:?} {:?}", planned.cache, planned.work),
                    "{target} (cached: {cached})"
                );
            }
        }
    }

    /// PQL planned from its translation stays the client's request: planned again (after a
    /// reload) it is translated again (from the kept translation, unless the reload changed
    /// answers and dropped them), not planned as the entity route it was mapped to.
    #[test]
    fn translated_pql_planned_again_is_the_pql_request() {
        let config = config();
        let target = "/pdb/query/v4?query=nodes%20%7B%20certname%20%3D%20%22a%22%20%7D";
        let planned = plan(&ClientRequest::get(target), &config);
        let Work::Translate(pql) = planned.work else {
            panic!("PQL is translated first");
        };
        let translation = br#"["from","nodes",["=","certname","a"]]"#;
        let translated = plan_translated(translation, &pql, &planned.request, &config)
            .expect("an AST translation");
        assert!(matches!(translated.work, Work::Fanout(_)));
        assert_eq!(translated.class(), RouteClass::Root);
        assert_eq!(translated.target(), target);
        let again = translated.again(&Arc::new((*config).clone()));
        assert!(matches!(again.work, Work::Translate(_)), "{:?}", again.work);
        assert_eq!(again.class(), RouteClass::Root);
    }
}
