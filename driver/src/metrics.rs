//! pdbmux's own metrics (docs/operating.md): what the shared driver sees of every request and
//! upstream call, recorded as it happens, and what the estate counts, read at scrape time. The
//! exposition is the `prometheus-client` crate's: OpenMetrics text when the scraper asks for it,
//! the Prometheus text format otherwise. Both binaries serve [`Metrics::answer`] on their own
//! listener (`metrics_listen`), never on the PuppetDB-facing one.

use std::fmt;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use http::{HeaderMap, HeaderValue, StatusCode};
use pdbmux_core::budget::BudgetScope;
use pdbmux_core::cache::shared::EntryRefusal;
use pdbmux_core::config::Config;
use pdbmux_core::stats::{CallOutcome, EstateStats, BACKEND_STATES, TRANSITIONS};
use pdbmux_core::{Coverage, ExchangeReport, Purpose, Response, RouteClass};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::info::Info;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};

/// The status label of a request whose client left before it was answered (nginx's 499).
const CLIENT_GONE: u16 = 499;

/// The only path the metrics listener serves.
const METRICS_PATH: &str = "/metrics";

use crate::budget::MergeMemory;
use crate::request_counts::{RequestCounts, CACHE_RESULTS, DURATION_BUCKETS};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteLabels {
    route: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct UpstreamLabels {
    backend: String,
    purpose: &'static str,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BackendLabels {
    backend: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReloadLabels {
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BudgetLabels {
    scope: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StreamedLabels {
    outcome: &'static str,
}

/// How streamed merges end, as [`crate::MergedBody`] counts them: `complete`, `cut_off` (a
/// failure after the first byte: the client's body does not parse), `client_left`.
#[derive(Clone, Debug)]
pub(crate) struct StreamedMerges(Family<StreamedLabels, Counter>);

impl StreamedMerges {
    /// The outcomes, in the order the metric lists them.
    const OUTCOMES: [&'static str; 3] = ["complete", "cut_off", "client_left"];

    /// One streamed merge ended so.
    pub(crate) fn observe(&self, outcome: &'static str) {
        self.0.get_or_create(&StreamedLabels { outcome }).inc();
    }
}

/// The shared store's operations as `pdbmux_cache_store_requests_total` names them, each
/// present from the start.
pub(crate) const STORE_OPS: [&str; 4] = ["get", "put", "lock", "unlock"];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StoreLabels {
    op: &'static str,
    outcome: &'static str,
}

type HistogramFamily<S> = Family<S, Histogram, fn() -> Histogram>;

fn duration_histogram() -> Histogram {
    Histogram::new(DURATION_BUCKETS)
}

/// Which binary and version is running, for `pdbmux_build_info`.
#[derive(Debug, Clone, Copy)]
pub struct Build {
    /// The binary's name (`pdbmux`, `pdbmux-smol`).
    pub binary: &'static str,
    /// Its version.
    pub version: &'static str,
}

/// The registry and the metrics the driver records into. Build one with [`Metrics::new`] when
/// `metrics_listen` is set and hand it to [`crate::EstateHost::new`]; the host adds the estate's
/// own numbers, and the runtimes count connections and bytes sent.
pub struct Metrics {
    registry: Registry,
    /// Requests, their durations, cache results and bytes sent: every request adds to these.
    counts: Arc<RequestCounts>,
    partial: Family<RouteLabels, Counter>,
    unanswered: Family<RouteLabels, Counter>,
    upstream: Family<UpstreamLabels, Counter>,
    upstream_duration: HistogramFamily<BackendLabels>,
    connections: Gauge,
    reloads: Family<ReloadLabels, Counter>,
    /// 1 while the configuration in force is the last one read (at start, or by the last
    /// reload); 0 from a refused reload until one is applied.
    last_reload_ok: Gauge,
    /// When the configuration in force was read (start, or the last applied reload), Unix time.
    last_reload_at: Gauge<f64, AtomicU64>,
    /// `latency_objective` of the configuration in force, for the latency alert to compare with.
    latency_objective: Gauge<f64, AtomicU64>,
    store: Family<StoreLabels, Counter>,
    budget_refusals: Family<BudgetLabels, Counter>,
    streamed: StreamedMerges,
}

impl fmt::Debug for Metrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Metrics {
    /// A registry with every metric the driver records, `pdbmux_build_info` and (on Linux) the
    /// standard `process_*` metrics.
    pub fn new(build: Build) -> Metrics {
        let mut registry = Registry::default();
        let counts = Arc::new(RequestCounts::default());
        registry.register_collector(Box::new(Arc::clone(&counts)));
        let partial = Family::default();
        registry.register(
            "pdbmux_partial_answers",
            "Responses whose merged answer lacks a configured backend's records, by route class",
            partial.clone(),
        );
        let unanswered = Family::default();
        registry.register(
            "pdbmux_unanswered",
            "Responses to merged requests no backend answered (a 5xx every backend gave, a 502, or the stale cache entry), by route class",
            unanswered.clone(),
        );
        let upstream = Family::default();
        registry.register(
            "pdbmux_upstream_requests",
            "Requests sent to backends, by backend, purpose (query, correction, translation, probe, membership, healthz) and how they ended",
            upstream.clone(),
        );
        let upstream_duration: HistogramFamily<BackendLabels> =
            Family::new_with_constructor(duration_histogram);
        registry.register_with_unit(
            "pdbmux_upstream_request_duration",
            "Time from sending a request to a backend to its answer (or failure), by backend",
            Unit::Seconds,
            upstream_duration.clone(),
        );
        let connections = Gauge::default();
        registry.register(
            "pdbmux_client_connections",
            "Client connections open now",
            connections.clone(),
        );
        let reloads = Family::default();
        registry.register(
            "pdbmux_config_reloads",
            "Configuration reloads on SIGHUP, by result (ok, failed)",
            reloads.clone(),
        );
        for result in ["ok", "failed"] {
            drop(reloads.get_or_create(&ReloadLabels { result }));
        }
        // Named as Prometheus names its own (`prometheus_config_last_reload_successful`): an
        // alert on the gauge stays firing while the refused file stays, unlike one on the counter.
        let last_reload_ok = Gauge::default();
        last_reload_ok.set(1);
        registry.register(
            "pdbmux_config_last_reload_successful",
            "1 when the configuration in force is the last one read (at start or by a reload), 0 after a refused reload",
            last_reload_ok.clone(),
        );
        let last_reload_at = Gauge::<f64, AtomicU64>::default();
        last_reload_at.set(unix_now());
        registry.register_with_unit(
            "pdbmux_config_last_reload_success_timestamp",
            "When the configuration in force was read: the start, or the last applied reload",
            Unit::Seconds,
            last_reload_at.clone(),
        );
        let latency_objective = Gauge::<f64, AtomicU64>::default();
        registry.register_with_unit(
            "pdbmux_latency_objective",
            "The p99 answer time pdbmux is run to keep (latency_objective); PdbmuxLatencyHigh fires above it",
            Unit::Seconds,
            latency_objective.clone(),
        );
        // Every route class from the start: a healthy system shows zeros, not empty panels.
        for class in RouteClass::ALL {
            let route = RouteLabels {
                route: class.as_str(),
            };
            drop(partial.get_or_create(&route));
            drop(unanswered.get_or_create(&route));
        }
        let store = Family::default();
        registry.register(
            "pdbmux_cache_store_requests",
            "Requests to the shared cache store, by op (get, put, lock, unlock) and outcome (ok, failed)",
            store.clone(),
        );
        for op in STORE_OPS {
            for outcome in ["ok", "failed"] {
                drop(store.get_or_create(&StoreLabels { op, outcome }));
            }
        }
        let budget_refusals = Family::default();
        registry.register(
            "pdbmux_merge_budget_refusals",
            "Requests refused with a 503 for the memory budget of buffered merges, by scope (request: merge_request_bytes, process: merge_memory_bytes)",
            budget_refusals.clone(),
        );
        for scope in [BudgetScope::Request, BudgetScope::Process] {
            drop(budget_refusals.get_or_create(&BudgetLabels {
                scope: scope.as_str(),
            }));
        }
        let streamed = Family::default();
        registry.register(
            "pdbmux_streamed_merges",
            "Merged answers streamed to the client, by how they ended (complete; cut_off: a backend failed after the first byte, the body does not parse; client_left)",
            streamed.clone(),
        );
        for outcome in StreamedMerges::OUTCOMES {
            drop(streamed.get_or_create(&StreamedLabels { outcome }));
        }
        registry.register(
            "pdbmux_build",
            "The running binary and its version",
            Info::new([("binary", build.binary), ("version", build.version)]),
        );
        #[cfg(target_os = "linux")]
        registry.register_collector(Box::new(crate::process::ProcessCollector));
        Metrics {
            registry,
            counts,
            partial,
            unanswered,
            upstream,
            upstream_duration,
            connections,
            reloads,
            last_reload_ok,
            last_reload_at,
            latency_objective,
            store,
            budget_refusals,
            streamed: StreamedMerges(streamed),
        }
    }

    /// Where streamed merges count how they ended.
    pub(crate) fn streamed_merges(&self) -> StreamedMerges {
        self.streamed.clone()
    }

    /// Adds the bytes `memory` holds for merges in flight, read at every scrape.
    pub(crate) fn with_merge_memory(mut self, memory: Arc<MergeMemory>) -> Metrics {
        self.registry
            .register_collector(Box::new(MergeMemoryCollector(memory)));
        self
    }

    /// A request refused for the memory budget of buffered merges.
    pub(crate) fn observe_budget_refusal(&self, scope: BudgetScope) {
        self.budget_refusals
            .get_or_create(&BudgetLabels {
                scope: scope.as_str(),
            })
            .inc();
    }

    /// Adds the estate's numbers, read from `source` at every scrape (`None`: nothing to add).
    pub(crate) fn with_estate(
        mut self,
        source: impl Fn() -> Option<EstateStats> + Send + Sync + 'static,
    ) -> Metrics {
        self.registry.register_collector(Box::new(EstateCollector {
            source: Box::new(source),
        }));
        self
    }

    /// One client request answered: its route class, response and time to the response head;
    /// a `cacheable` one also counts what `X-Cache` says answered it.
    pub(crate) fn observe_request(
        &self,
        (class, cacheable): (RouteClass, bool),
        response: &Response,
        took: Duration,
    ) {
        let cache = cacheable.then(|| cache_result(&response.headers)).flatten();
        self.counts
            .observe(class, response.status.as_u16(), took, cache);
        let route = RouteLabels {
            route: class.as_str(),
        };
        let counter = match Coverage::of(response) {
            Coverage::Partial => Some(&self.partial),
            Coverage::Unanswered => Some(&self.unanswered),
            Coverage::Whole => None,
        };
        if let Some(family) = counter {
            family.get_or_create(&route).inc();
        }
    }

    /// A client went away before its answer: counted as status 499 (nginx's "client closed
    /// request"), after `took`.
    pub(crate) fn observe_client_gone(&self, class: RouteClass, took: Duration) {
        self.counts.observe(class, CLIENT_GONE, took, None);
    }

    /// A finished exchange's calls, each with how it ended. (Its answer's coverage is counted
    /// per response, in [`Metrics::observe_request`]: a shared fan-out answers many.)
    pub(crate) fn observe_exchange(&self, report: &ExchangeReport, config: &Config) {
        for (backend, purpose, outcome) in report.calls() {
            self.observe_upstream(config, *backend, *purpose, *outcome);
        }
    }

    /// One upstream call for `purpose` ended with `outcome`.
    pub(crate) fn observe_upstream(
        &self,
        config: &Config,
        backend: pdbmux_core::BackendId,
        purpose: Purpose,
        outcome: CallOutcome,
    ) {
        self.upstream
            .get_or_create(&UpstreamLabels {
                backend: crate::host::backend_name(config, backend),
                purpose: purpose.as_str(),
                outcome: outcome.as_str(),
            })
            .inc();
    }

    /// Takes in the configuration in force: its latency objective, and every per-backend series
    /// of its backends at zero (each purpose and outcome of `pdbmux_upstream_requests_total`,
    /// the call-duration histogram), so a healthy system shows zeros rather than empty panels
    /// and a `rate()` has a series before the first failure. Call it at start and after a
    /// reload.
    pub(crate) fn know_config(&self, config: &Config) {
        self.latency_objective
            .set(config.latency_objective.as_secs_f64());
        for backend in &config.backends {
            for purpose in Purpose::ALL {
                for outcome in CallOutcome::ALL {
                    drop(self.upstream.get_or_create(&UpstreamLabels {
                        backend: backend.name.clone(),
                        purpose: purpose.as_str(),
                        outcome: outcome.as_str(),
                    }));
                }
            }
            drop(self.upstream_duration.get_or_create(&BackendLabels {
                backend: backend.name.clone(),
            }));
        }
    }

    /// One upstream call took `took`, from send to answer.
    pub(crate) fn observe_upstream_duration(
        &self,
        config: &Config,
        backend: pdbmux_core::BackendId,
        took: Duration,
    ) {
        self.upstream_duration
            .get_or_create(&BackendLabels {
                backend: crate::host::backend_name(config, backend),
            })
            .observe(took.as_secs_f64());
    }

    /// One request to the shared cache store ended, answered (`true`) or failed.
    pub(crate) fn observe_store(&self, op: &'static str, answered: bool) {
        let outcome = if answered { "ok" } else { "failed" };
        self.store.get_or_create(&StoreLabels { op, outcome }).inc();
    }

    /// A configuration reload was applied (`true`) or refused.
    pub fn observe_reload(&self, applied: bool) {
        let result = if applied { "ok" } else { "failed" };
        self.reloads.get_or_create(&ReloadLabels { result }).inc();
        self.last_reload_ok.set(i64::from(applied));
        if applied {
            self.last_reload_at.set(unix_now());
        }
    }

    /// A handle that adds to the bytes sent to clients, for a connection's writer to keep.
    pub fn sent_bytes(&self) -> SentBytes {
        SentBytes(Arc::clone(&self.counts))
    }

    /// A client connection opened; it counts as open until the guard is dropped.
    pub fn connection_opened(&self) -> ConnectionGuard {
        self.connections.inc();
        ConnectionGuard {
            connections: self.connections.clone(),
        }
    }

    /// The answer of the metrics listener to one request: the scrape for `GET /metrics` (or
    /// `HEAD`), OpenMetrics text when `accept` names it, 404 for any other path, 405 for another
    /// method.
    pub fn answer(&self, method: &http::Method, path: &str, accept: Option<&str>) -> Response {
        if path != METRICS_PATH {
            return Response::text(
                StatusCode::NOT_FOUND,
                "pdbmux: this listener serves /metrics only",
            );
        }
        if method != http::Method::GET && method != http::Method::HEAD {
            return Response::text(StatusCode::METHOD_NOT_ALLOWED, "pdbmux: /metrics takes GET");
        }
        let openmetrics =
            accept.is_some_and(|accept| accept.contains("application/openmetrics-text"));
        let mut body = String::new();
        let (encoded, content_type) = if openmetrics {
            (
                prometheus_client::encoding::text::encode(&mut body, &self.registry),
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )
        } else {
            (
                prometheus_client::encoding::prometheus_text::encode(&mut body, &self.registry),
                prometheus_client::encoding::prometheus_text::CONTENT_TYPE,
            )
        };
        if let Err(error) = encoded {
            tracing::error!("encoding the metrics failed: {error}");
            return Response::text(
                StatusCode::INTERNAL_SERVER_ERROR,
                "pdbmux: encoding the metrics failed",
            );
        }
        let mut headers = HeaderMap::new();
        headers.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static(content_type),
        );
        Response {
            status: StatusCode::OK,
            headers,
            body: pdbmux_core::ResponseBody::Full(body.into()),
        }
    }
}

/// Adds to `pdbmux_client_sent_bytes_total`; from [`Metrics::sent_bytes`].
#[derive(Debug, Clone)]
pub struct SentBytes(Arc<RequestCounts>);

impl SentBytes {
    /// `bytes` more were written to a client.
    pub fn add(&self, bytes: u64) {
        self.0.sent(bytes);
    }
}

/// An open client connection, counted in `pdbmux_client_connections` while it lives.
#[derive(Debug)]
pub struct ConnectionGuard {
    connections: Gauge,
}

impl Drop for ConnectionGuard {
    fn drop(&mut self) {
        self.connections.dec();
    }
}

/// Now as Unix time in seconds (0 for a clock before 1970).
fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0.0, |since| since.as_secs_f64())
}

/// The cache's verdict on a response (an index into [`CACHE_RESULTS`]), from the `X-Cache`
/// header the core sets on the cached path.
fn cache_result(headers: &HeaderMap) -> Option<usize> {
    let value = headers.get(pdbmux_core::cache::X_CACHE)?.as_bytes();
    CACHE_RESULTS
        .iter()
        .position(|result| result.as_bytes() == value)
}

/// The estate's numbers, encoded at each scrape.
/// The bytes of backend answers merges in flight hold, at each scrape.
#[derive(Debug)]
struct MergeMemoryCollector(Arc<MergeMemory>);

impl Collector for MergeMemoryCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        encode_one(
            &mut encoder,
            (
                "pdbmux_merge_memory",
                "Bytes of backend answers held in memory by merges in flight (merge_memory_bytes bounds it)",
                Some(&Unit::Bytes),
            ),
            ConstGauge::new(i64::try_from(self.0.used()).unwrap_or(i64::MAX)),
        )
    }
}

struct EstateCollector {
    source: Box<dyn Fn() -> Option<EstateStats> + Send + Sync>,
}

impl fmt::Debug for EstateCollector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EstateCollector").finish_non_exhaustive()
    }
}

/// Writes one metric of `kind` with a value per label set.
fn encode_each<S: EncodeLabelSet, M: EncodeMetric>(
    encoder: &mut DescriptorEncoder,
    (name, help, unit): (&str, &str, Option<&Unit>),
    kind: MetricType,
    series: impl IntoIterator<Item = (S, M)>,
) -> fmt::Result {
    let mut metric = encoder.encode_descriptor(name, help, unit, kind)?;
    for (labels, value) in series {
        value.encode(metric.encode_family(&labels)?)?;
    }
    Ok(())
}

/// Writes one metric without labels.
fn encode_one<M: EncodeMetric>(
    encoder: &mut DescriptorEncoder,
    (name, help, unit): (&str, &str, Option<&Unit>),
    value: M,
) -> fmt::Result {
    let kind = value.metric_type();
    value.encode(encoder.encode_descriptor(name, help, unit, kind)?)
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabels {
    backend: String,
    state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TransitionLabels {
    backend: String,
    transition: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RefusalLabels {
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NamedBackend {
    backend: String,
}

impl Collector for EstateCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        let Some(stats) = (self.source)() else {
            return Ok(());
        };
        let seconds = Unit::Seconds;
        let backends = &stats.backends;
        encode_each(
            &mut encoder,
            (
                "pdbmux_backend_state",
                "1 for each backend's prober state, 0 for the others",
                None,
            ),
            MetricType::Gauge,
            backends.iter().flat_map(|backend| {
                BACKEND_STATES.iter().map(move |state| {
                    let labels = StateLabels {
                        backend: backend.name.clone(),
                        state,
                    };
                    (labels, ConstGauge::new(i64::from(backend.state == *state)))
                })
            }),
        )?;
        encode_each(
            &mut encoder,
            (
                "pdbmux_backend_transitions",
                "Prober transitions since start, by backend and kind",
                None,
            ),
            MetricType::Counter,
            backends.iter().flat_map(|backend| {
                TRANSITIONS
                    .iter()
                    .zip(backend.transitions)
                    .map(move |(transition, count)| {
                        let labels = TransitionLabels {
                            backend: backend.name.clone(),
                            transition,
                        };
                        (labels, ConstCounter::new(count))
                    })
            }),
        )?;
        encode_each(
            &mut encoder,
            (
                "pdbmux_backend_owned_nodes",
                "Active nodes each backend owns under the configured merge",
                None,
            ),
            MetricType::Gauge,
            backends.iter().map(|backend| {
                let labels = NamedBackend {
                    backend: backend.name.clone(),
                };
                (labels, ConstGauge::new(backend.owned_nodes as i64))
            }),
        )?;
        encode_each(
            &mut encoder,
            (
                "pdbmux_membership_refresh_failures",
                "Membership refreshes that did not renew a backend's part of the map (its answer unusable, or it was out of service)",
                None,
            ),
            MetricType::Counter,
            backends.iter().map(|backend| {
                let labels = NamedBackend {
                    backend: backend.name.clone(),
                };
                (labels, ConstCounter::new(backend.membership_failures))
            }),
        )?;
        encode_each(
            &mut encoder,
            (
                "pdbmux_backend_membership_age",
                "How long since each backend's part of the membership map was last renewed",
                Some(&seconds),
            ),
            MetricType::Gauge,
            backends.iter().map(|backend| {
                let labels = NamedBackend {
                    backend: backend.name.clone(),
                };
                (
                    labels,
                    ConstGauge::new(backend.membership_age.as_secs_f64()),
                )
            }),
        )?;
        let membership = stats.membership;
        encode_one(
            &mut encoder,
            (
                "pdbmux_membership_nodes",
                "Distinct active certnames in the estate",
                None,
            ),
            ConstGauge::new(membership.nodes as i64),
        )?;
        encode_one(
            &mut encoder,
            (
                "pdbmux_membership_shared_nodes",
                "Active certnames more than one backend holds",
                None,
            ),
            ConstGauge::new(membership.shared_nodes as i64),
        )?;
        encode_one(
            &mut encoder,
            (
                "pdbmux_membership_split_nodes",
                "Active certnames whose facts, catalog or latest report are newest in different backends",
                None,
            ),
            ConstGauge::new(membership.split_nodes as i64),
        )?;
        encode_one(
            &mut encoder,
            (
                "pdbmux_membership_refreshes",
                "Membership refreshes completed since start",
                None,
            ),
            ConstCounter::new(membership.refreshes),
        )?;
        if let Some(took) = membership.last_refresh_duration {
            encode_one(
                &mut encoder,
                (
                    "pdbmux_membership_last_refresh_duration",
                    "How long the last membership refresh took",
                    Some(&seconds),
                ),
                ConstGauge::new(took.as_secs_f64()),
            )?;
        }
        if let Some(age) = membership.age {
            encode_one(
                &mut encoder,
                (
                    "pdbmux_membership_age",
                    "How old the membership map is",
                    Some(&seconds),
                ),
                ConstGauge::new(age.as_secs_f64()),
            )?;
        }
        if let Some(cache) = stats.cache {
            encode_one(
                &mut encoder,
                (
                    "pdbmux_cache_entries",
                    "Entries the cache holds, fresh or expired",
                    None,
                ),
                ConstGauge::new(cache.store.entries as i64),
            )?;
            encode_one(
                &mut encoder,
                (
                    "pdbmux_cache_stale_entries",
                    "Entries past the TTL, kept to answer when every backend fails",
                    None,
                ),
                ConstGauge::new(cache.store.stale_entries as i64),
            )?;
            encode_one(
                &mut encoder,
                (
                    "pdbmux_cache_body",
                    "Bytes of the bodies the cache holds",
                    Some(&Unit::Bytes),
                ),
                ConstGauge::new(cache.store.bytes as i64),
            )?;
            encode_one(
                &mut encoder,
                (
                    "pdbmux_cache_evictions",
                    "Entries evicted to stay within facts_cache_bytes",
                    None,
                ),
                ConstCounter::new(cache.evictions),
            )?;
            if let Some(refused) = cache.shared_refused {
                encode_each(
                    &mut encoder,
                    (
                        "pdbmux_cache_store_refused_entries",
                        "Entries read from the shared cache store and refused as misses, by reason (forged, oversized, future, expired, not_json, malformed)",
                        None,
                    ),
                    MetricType::Counter,
                    EntryRefusal::ALL.iter().zip(refused).map(|(reason, count)| {
                        let labels = RefusalLabels {
                            reason: reason.as_str(),
                        };
                        (labels, ConstCounter::new(count))
                    }),
                )?;
            }
            if let Some(up) = cache.shared_reachable {
                encode_one(
                    &mut encoder,
                    (
                        "pdbmux_cache_store_up",
                        "1 while the shared cache store answers, 0 while this replica answers without it",
                        None,
                    ),
                    ConstGauge::new(i64::from(up)),
                )?;
            }
            encode_one(
                &mut encoder,
                (
                    "pdbmux_cache_flight_joins",
                    "Requests that joined a fan-out already in flight for their key",
                    None,
                ),
                ConstCounter::new(cache.flight_joins),
            )?;
            encode_one(
                &mut encoder,
                (
                    "pdbmux_cache_refreshes_ahead",
                    "Background refreshes of cache entries that hits started past their share of the TTL (cache_refresh_ahead_percent)",
                    None,
                ),
                ConstCounter::new(cache.refreshes_ahead),
            )?;
        }
        Ok(())
    }
}
