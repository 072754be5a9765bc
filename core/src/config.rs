//! The validated configuration the core runs on.
//!
//! Loading (defaults, file, environment, flags) happens in `pdbmux-cli`; this module only holds the
//! result, as plain data, so the core and both runtimes agree on one shape.

use std::path::PathBuf;
use std::time::Duration;

/// The cap on `facts_ttl`: a larger configured value is clamped down to this.
pub const FACTS_TTL_CAP: Duration = Duration::from_secs(30);

/// How `/facts` picks the backend that owns a node present in more than one backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MergeStrategy {
    /// The backend holding the newer `report_timestamp` owns the node (ties to configured order).
    #[default]
    Freshness,
    /// The first backend in configured order that holds the node owns it.
    Static,
}

impl MergeStrategy {
    /// The spelling used in config files, env vars and `config show`.
    pub fn as_str(self) -> &'static str {
        match self {
            MergeStrategy::Freshness => "freshness",
            MergeStrategy::Static => "static",
        }
    }
}

/// Where merged answers are cached besides this process's memory (docs/caching.md).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum CacheBackend {
    /// In this process only.
    #[default]
    Memory,
    /// Also in a Redis-protocol store (Redis, Valkey) every replica shares.
    Redis {
        /// `redis://` or `rediss://` URL, password and database included.
        url: String,
        /// For `rediss://`: the CA, client certificate and key (the global `tls_*` files).
        tls: TlsFiles,
    },
}

/// Where to find certificates and keys for https backends (docs/decisions.md D8).
///
/// Paths only: the runtimes read the files. Keys are never logged.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TlsFiles {
    /// Extra CA bundle (PEM) trusted in addition to the system roots.
    pub ca_file: Option<PathBuf>,
    /// Client certificate chain (PEM) presented to the backend.
    pub cert_file: Option<PathBuf>,
    /// Private key (PEM) for `cert_file`.
    pub key_file: Option<PathBuf>,
}

/// A backend's base URL, split into the parts the core needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendUrl {
    /// `http` or `https`, lower case.
    pub scheme: String,
    /// Host name or IP literal as configured; IPv6 literals without brackets.
    pub host: String,
    /// The explicit port, if the URL has one.
    pub port: Option<u16>,
}

impl BackendUrl {
    /// The port connections go to: the explicit one, else the scheme's default.
    pub fn effective_port(&self) -> u16 {
        self.port
            .unwrap_or(if self.scheme == "https" { 443 } else { 80 })
    }

    /// The host as it appears in a URL authority (IPv6 literals bracketed).
    pub fn host_for_authority(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]", self.host)
        } else {
            self.host.clone()
        }
    }

    /// `scheme://host[:port]`, the base every upstream path is appended to.
    pub fn base(&self) -> String {
        match self.port {
            Some(port) => format!("{}://{}:{}", self.scheme, self.host_for_authority(), port),
            None => format!("{}://{}", self.scheme, self.host_for_authority()),
        }
    }
}

/// One configured PuppetDB.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendConfig {
    /// The label clients see (in provenance, X-Backends, /healthz and scrubbed error bodies).
    pub name: String,
    /// The base URL; pdbmux appends `/pdb/query/v4/...` per request.
    pub url: BackendUrl,
    /// TLS files for this backend (already merged with the global ones).
    pub tls: TlsFiles,
}

/// The whole validated configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Listen address, e.g. `0.0.0.0:8080`.
    pub listen: String,
    /// Where pdbmux's own Prometheus metrics are served (docs/decisions.md D19), never on
    /// `listen`; `None`: not served.
    pub metrics_listen: Option<String>,
    /// Backends in configured order (a tie-break only, never a ranking). Never empty.
    pub backends: Vec<BackendConfig>,
    /// The `/facts` merge strategy.
    pub merge: MergeStrategy,
    /// Per-upstream request timeout.
    pub timeout: Duration,
    /// How long the membership (freshness) map is reused.
    pub freshness_ttl: Duration,
    /// Merged-response cache TTL after clamping; zero disables the cache.
    pub facts_ttl: Duration,
    /// Byte budget of the merged-response cache.
    pub facts_cache_bytes: u64,
    /// Name of the synthetic provenance fact.
    pub source_fact: String,
    /// Whether the provenance fact is injected (and upstream records of its name dropped).
    pub source_fact_enabled: bool,
    /// Whether backends are probed in the background.
    pub health_probe_enabled: bool,
    /// The path probed on each backend.
    pub health_probe_path: String,
    /// Time between probes of one backend.
    pub health_probe_interval: Duration,
    /// Per-probe timeout.
    pub health_probe_timeout: Duration,
    /// Consecutive unsuccessful probes before a backend leaves the pool (at least 1).
    pub health_probe_failures: u32,
    /// Consecutive successful probes before a backend rejoins the pool (at least 1).
    pub health_probe_successes: u32,
    /// The most bytes read from one upstream body; more counts as that backend failing.
    pub max_body_bytes: u64,
    /// How long a client may take to send a request head, and how long an idle kept-alive
    /// connection stays open (nginx's `client_header_timeout`; docs/reliability.md). A new
    /// connection takes the value current when it is accepted.
    pub client_header_timeout: Duration,
    /// How long a client may take no bytes of an answer before its connection is cut (nginx's
    /// `send_timeout`): the timeout bounds each wait for the socket to take bytes, not the
    /// whole answer.
    pub client_send_timeout: Duration,
    /// Where merged answers are cached besides memory.
    pub cache_backend: CacheBackend,
    /// Prefixed to every key pdbmux writes in a shared store.
    pub cache_key_prefix: String,
    /// How long past `facts_ttl` a shared entry is kept for the stale fallback.
    pub cache_stale_ttl: Duration,
    /// Bodies larger than this are not stored in a shared store.
    pub cache_max_entry_bytes: u64,
}

impl Config {
    /// The keys whose values differ in `new`, for a reload's log line (listeners excluded: they
    /// never change without a restart).
    pub fn changed_keys(&self, new: &Config) -> Vec<&'static str> {
        let old = self;
        let mut changed = Vec::new();
        let mut check = |key, differs: bool| {
            if differs {
                changed.push(key);
            }
        };
        check("backends", old.backends != new.backends);
        check("merge", old.merge != new.merge);
        check("timeout", old.timeout != new.timeout);
        check("freshness_ttl", old.freshness_ttl != new.freshness_ttl);
        check("facts_ttl", old.facts_ttl != new.facts_ttl);
        check(
            "facts_cache_bytes",
            old.facts_cache_bytes != new.facts_cache_bytes,
        );
        check("source_fact", old.source_fact != new.source_fact);
        check(
            "source_fact_enabled",
            old.source_fact_enabled != new.source_fact_enabled,
        );
        check(
            "health_probe_enabled",
            old.health_probe_enabled != new.health_probe_enabled,
        );
        check(
            "health_probe_path",
            old.health_probe_path != new.health_probe_path,
        );
        check(
            "health_probe_interval",
            old.health_probe_interval != new.health_probe_interval,
        );
        check(
            "health_probe_timeout",
            old.health_probe_timeout != new.health_probe_timeout,
        );
        check(
            "health_probe_failures",
            old.health_probe_failures != new.health_probe_failures,
        );
        check(
            "health_probe_successes",
            old.health_probe_successes != new.health_probe_successes,
        );
        check("max_body_bytes", old.max_body_bytes != new.max_body_bytes);
        check("cache_backend", old.cache_backend != new.cache_backend);
        check(
            "cache_key_prefix",
            old.cache_key_prefix != new.cache_key_prefix,
        );
        check(
            "cache_stale_ttl",
            old.cache_stale_ttl != new.cache_stale_ttl,
        );
        check(
            "cache_max_entry_bytes",
            old.cache_max_entry_bytes != new.cache_max_entry_bytes,
        );
        check(
            "client_header_timeout",
            old.client_header_timeout != new.client_header_timeout,
        );
        check(
            "client_send_timeout",
            old.client_send_timeout != new.client_send_timeout,
        );
        changed
    }

    /// A configuration with every default and the given backends; for tests and examples.
    pub fn with_backends(backends: Vec<BackendConfig>) -> Config {
        Config {
            listen: "0.0.0.0:8080".to_owned(),
            metrics_listen: Some("0.0.0.0:9180".to_owned()),
            backends,
            merge: MergeStrategy::Freshness,
            timeout: Duration::from_secs(10),
            freshness_ttl: Duration::from_secs(30),
            facts_ttl: Duration::from_secs(30),
            facts_cache_bytes: 64 * 1024 * 1024,
            source_fact: "pdbmux_source".to_owned(),
            source_fact_enabled: true,
            health_probe_enabled: true,
            health_probe_path: "/status/v1/services".to_owned(),
            health_probe_interval: Duration::from_secs(10),
            health_probe_timeout: Duration::from_secs(5),
            health_probe_failures: 3,
            health_probe_successes: 2,
            max_body_bytes: 512 * 1024 * 1024,
            client_header_timeout: Duration::from_secs(30),
            client_send_timeout: Duration::from_secs(60),
            cache_backend: CacheBackend::Memory,
            cache_key_prefix: "pdbmux:".to_owned(),
            cache_stale_ttl: Duration::from_secs(300),
            cache_max_entry_bytes: 8 * 1024 * 1024,
        }
    }
}
