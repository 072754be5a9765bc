//! The validated configuration the core runs on.
//!
//! Loading (defaults, file, environment, flags) happens in `pdbmux-cli`; this module only holds the
//! result, as plain data, so the core and both runtimes agree on one shape.

use std::path::PathBuf;
use std::time::Duration;

/// The cap on every cache TTL (`facts_ttl`, `history_ttl`, `aggregate_ttl`): a larger configured
/// value is clamped down to this.
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
        /// `redis://` or `rediss://` URL, database included (its password is redacted wherever
        /// the URL is shown).
        url: String,
        /// For `rediss://`: the CA, client certificate and key (the global `tls_*` files).
        tls: TlsFiles,
        /// The key every replica signs and checks entries with (docs/reliability.md, "The
        /// shared store is untrusted"): an entry it does not authenticate is a miss.
        secret: Secret,
        /// The store's password from `cache_redis_password_file`, used instead of one in the
        /// URL; `None`: the URL's, if any.
        password: Option<Secret>,
    },
}

/// Bytes that must never be printed: the shared store's signing key, its password. `Debug`
/// shows only the length; compare with [`Secret::expose`] where the value is needed.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(std::sync::Arc<[u8]>);

impl Secret {
    /// A secret holding `bytes`.
    pub fn new(bytes: impl Into<Vec<u8>>) -> Secret {
        Secret(bytes.into().into())
    }

    /// The secret's bytes, for the one place that uses them (signing, authenticating).
    pub fn expose(&self) -> &[u8] {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Secret({} bytes)", self.0.len())
    }
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
    /// Cache TTL of merged record sets after clamping (`/nodes`, `/facts` and every node-owned
    /// entity, `/fact-names`, …; docs/caching.md); zero leaves them uncached.
    pub facts_ttl: Duration,
    /// Cache TTL of merged history (`/reports`, `/events` records); zero leaves it uncached.
    pub history_ttl: Duration,
    /// Cache TTL of combined answers (extract functions, `/event-counts`,
    /// `/aggregate-event-counts`); zero leaves them uncached.
    pub aggregate_ttl: Duration,
    /// The share of its TTL (in percent) after which a hit also starts one refresh of its
    /// entry in the background; 0 turns refresh-ahead off.
    pub cache_refresh_ahead_percent: u8,
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
    /// The most bytes of backend answers one request may hold in memory while they are merged;
    /// more refuses the request with a 503 ([`crate::budget`]).
    pub merge_request_bytes: u64,
    /// The most bytes of backend answers every merge in flight together may hold in memory; a
    /// request that would go over it is refused with a 503 ([`crate::budget`]).
    pub merge_memory_bytes: u64,
    /// A merge that can stream reads its backends' answers whole while they hold at most this
    /// many bytes together, and streams past it (docs/merging.md, "Streamed merges"; default
    /// [`crate::STREAM_ABOVE_BYTES`]). 0 streams every answer that can stream.
    pub stream_above_bytes: u64,
    /// How long a client may take to send a request head, and how long an idle kept-alive
    /// connection stays open (nginx's `client_header_timeout`; docs/reliability.md). A new
    /// connection takes the value current when it is accepted.
    pub client_header_timeout: Duration,
    /// How long a client may take no bytes of an answer before its connection is cut (nginx's
    /// `send_timeout`): the timeout bounds each wait for the socket to take bytes, not the
    /// whole answer.
    pub client_send_timeout: Duration,
    /// The p99 latency of client answers pdbmux is run to keep: exported as
    /// `pdbmux_latency_objective_seconds` for the `PdbmuxLatencyHigh` alert to compare with
    /// (docs/operating.md, "On call"); it changes no answer.
    pub latency_objective: Duration,
    /// Where merged answers are cached besides memory.
    pub cache_backend: CacheBackend,
    /// Prefixed to every key pdbmux writes in a shared store.
    pub cache_key_prefix: String,
    /// How long past `facts_ttl` a shared entry is kept for the stale fallback.
    pub cache_stale_ttl: Duration,
    /// Bodies larger than this are not stored in a shared store.
    pub cache_max_entry_bytes: u64,
}

/// What a reload must renew when a key's value changes ([`Config::renewed_by`], read by the
/// estate's `reconfigure`; docs/operating.md, "Reload").
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Renews {
    /// The answers: the merged-answer cache starts empty, PQL translations are asked again, no
    /// request joins a fan-out of the old configuration.
    Answers,
    /// The shared cache tier: its client, key prefix, stale window, entry limit and lock timing.
    SharedTier,
    /// The health prober's settings.
    Probes,
    /// Nothing kept depends on it: it is read where it is used (per request, per connection).
    Nothing,
    /// It takes a restart; a reload leaves it as it was.
    Restart,
}

/// Defines, from one list of `key => [what it renews]`, every place that walks the keys: the
/// struct is destructured without `..`, so a field added to [`Config`] does not compile until
/// it is listed (and classed) here. Each field is named as its configuration key; the list's
/// order is the order `config show` and `config init` print the keys in.
macro_rules! config_keys {
    ($($key:ident => [$($renews:ident),+]),* $(,)?) => {
        /// A key of [`Config`], each variant named as the key is written in a config file: what
        /// the loader (`pdbmux-cli`) names the core's keys by, so that its tables and checks
        /// follow this one list.
        #[allow(non_camel_case_types)]
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum ConfigKey {
            $(
                #[doc = concat!("`", stringify!($key), "`: [`Config::", stringify!($key), "`].")]
                $key,
            )*
        }

        impl ConfigKey {
            /// Every key, in [`Config::KEYS`] order; for building the loader's tables.
            pub const ALL: &'static [ConfigKey] = &[$(ConfigKey::$key),*];

            /// The key as written in a config file.
            pub const fn name(self) -> &'static str {
                match self {
                    $(ConfigKey::$key => stringify!($key),)*
                }
            }
        }

        impl Config {
            /// Every key of this configuration, with what a reload that changes it renews.
            pub const KEYS: &'static [(&'static str, &'static [Renews])] =
                &[$((stringify!($key), &[$(Renews::$renews),+])),*];

            /// The keys whose values differ in `new` and what each renews, in [`Config::KEYS`]
            /// order.
            pub fn differences(&self, new: &Config) -> Vec<(&'static str, &'static [Renews])> {
                let Config { $($key),* } = self;
                let keys: &[(&'static str, &'static [Renews], bool)] =
                    &[$((stringify!($key), &[$(Renews::$renews),+], *$key != new.$key)),*];
                keys.iter()
                    .filter(|(_, _, differs)| *differs)
                    .map(|(key, renews, _)| (*key, *renews))
                    .collect()
            }

            /// Sets every key that takes a restart ([`Renews::Restart`]) back to its value in
            /// `running` and names those that differed, in [`Config::KEYS`] order: what a
            /// reload calls on the configuration it read, so that it applies the rest only.
            pub fn keep_restart_keys(&mut self, running: &Config) -> Vec<&'static str> {
                let mut kept = Vec::new();
                let Config { $($key),* } = self;
                $(
                    if [$(Renews::$renews),+].contains(&Renews::Restart) && *$key != running.$key {
                        $key.clone_from(&running.$key);
                        kept.push(stringify!($key));
                    }
                )*
                kept
            }
        }
    };
}

config_keys!(
    listen => [Restart],
    metrics_listen => [Restart],
    backends => [Answers, Probes],
    merge => [Answers],
    // The shared tier's lock lives as long as a fan-out may take.
    timeout => [SharedTier],
    freshness_ttl => [Nothing],
    facts_ttl => [Answers],
    history_ttl => [Answers],
    aggregate_ttl => [Answers],
    cache_refresh_ahead_percent => [Nothing],
    facts_cache_bytes => [Answers],
    cache_backend => [SharedTier],
    cache_key_prefix => [SharedTier],
    cache_stale_ttl => [SharedTier],
    cache_max_entry_bytes => [SharedTier],
    source_fact => [Answers],
    source_fact_enabled => [Answers],
    health_probe_enabled => [Probes],
    health_probe_path => [Probes],
    health_probe_interval => [Probes],
    health_probe_timeout => [Probes],
    health_probe_failures => [Probes],
    health_probe_successes => [Probes],
    max_body_bytes => [Answers],
    merge_request_bytes => [Nothing],
    merge_memory_bytes => [Nothing],
    stream_above_bytes => [Nothing],
    client_header_timeout => [Nothing],
    client_send_timeout => [Nothing],
    latency_objective => [Nothing],
);

/// Which TTL a cached answer lives for (docs/caching.md, "What is cached").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheClass {
    /// A merged record set of an entity that is not history (`facts_ttl`).
    Records,
    /// Merged `/reports` or `/events` records (`history_ttl`).
    History,
    /// A combined answer: extract functions, event counts (`aggregate_ttl`).
    Aggregates,
}

impl Config {
    /// How long an answer of `class` is cached (zero: not cached).
    pub fn cache_ttl(&self, class: CacheClass) -> Duration {
        match class {
            CacheClass::Records => self.facts_ttl,
            CacheClass::History => self.history_ttl,
            CacheClass::Aggregates => self.aggregate_ttl,
        }
    }

    /// The largest streamed answer the cache keeps (a quarter of `facts_cache_bytes`): a copy
    /// is kept beside a streamed merge only up to this, so that one large answer neither pushes
    /// out most of what the cache holds nor holds that much memory beside its merge
    /// (docs/caching.md).
    pub fn streamed_cache_entry_bytes(&self) -> u64 {
        self.facts_cache_bytes / 4
    }

    /// Whether any answer is cached (a cache is kept at all).
    pub fn caches_anything(&self) -> bool {
        [
            CacheClass::Records,
            CacheClass::History,
            CacheClass::Aggregates,
        ]
        .into_iter()
        .any(|class| !self.cache_ttl(class).is_zero())
    }

    /// When a hit on an entry of `ttl`, stored at `stored_at`, should also refresh it in the
    /// background: past [`Config::cache_refresh_ahead_percent`] of its TTL (never, when 0).
    pub fn refreshes_ahead(&self, age: Duration, ttl: Duration) -> bool {
        self.cache_refresh_ahead_percent > 0
            && age * 100 >= ttl * u32::from(self.cache_refresh_ahead_percent)
    }

    /// The keys whose values differ in `new` that a reload applies, for its log line (those
    /// that take a restart, the listeners, are left out).
    pub fn changed_keys(&self, new: &Config) -> Vec<&'static str> {
        self.differences(new)
            .into_iter()
            .filter(|(_, renews)| !renews.contains(&Renews::Restart))
            .map(|(key, _)| key)
            .collect()
    }

    /// Whether a reload to `new` must renew `what` (some key that renews it changed).
    pub fn renewed_by(&self, new: &Config, what: Renews) -> bool {
        self.differences(new)
            .iter()
            .any(|(_, renews)| renews.contains(&what))
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
            history_ttl: Duration::from_secs(15),
            aggregate_ttl: Duration::from_secs(15),
            cache_refresh_ahead_percent: 80,
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
            merge_request_bytes: 512 * 1024 * 1024,
            merge_memory_bytes: 1024 * 1024 * 1024,
            stream_above_bytes: crate::STREAM_ABOVE_BYTES,
            client_header_timeout: Duration::from_secs(30),
            client_send_timeout: Duration::from_secs(60),
            latency_objective: Duration::from_secs(2),
            cache_backend: CacheBackend::Memory,
            cache_key_prefix: "pdbmux:".to_owned(),
            cache_stale_ttl: Duration::from_secs(300),
            cache_max_entry_bytes: 8 * 1024 * 1024,
        }
    }

    /// A configuration with every default and these backends, named and on these ports of the
    /// loopback address over HTTP; for the core's tests.
    #[cfg(test)]
    pub(crate) fn on_loopback(backends: &[(&str, u16)]) -> Config {
        let backends = backends
            .iter()
            .map(|(name, port)| BackendConfig {
                name: (*name).into(),
                url: BackendUrl {
                    scheme: "http".into(),
                    host: "127.0.0.1".into(),
                    port: Some(*port),
                },
                tls: TlsFiles::default(),
            })
            .collect();
        Config::with_backends(backends)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_reload_names_the_keys_that_changed_but_never_the_listeners() {
        let old = Config::with_backends(Vec::new());
        assert!(old.changed_keys(&old.clone()).is_empty());
        let new = Config {
            listen: "127.0.0.1:1".to_owned(),
            metrics_listen: None,
            timeout: Duration::from_secs(3),
            client_send_timeout: Duration::from_secs(5),
            ..old.clone()
        };
        assert_eq!(old.changed_keys(&new), ["timeout", "client_send_timeout"]);
    }

    #[test]
    fn a_reload_keeps_the_running_value_of_every_key_that_takes_a_restart() {
        let running = Config::with_backends(Vec::new());
        let mut read = Config {
            listen: "127.0.0.1:1".to_owned(),
            metrics_listen: None,
            timeout: Duration::from_secs(3),
            ..running.clone()
        };
        assert_eq!(
            read.keep_restart_keys(&running),
            ["listen", "metrics_listen"]
        );
        assert_eq!(read.listen, running.listen);
        assert_eq!(read.metrics_listen, running.metrics_listen);
        assert_eq!(read.timeout, Duration::from_secs(3), "applied, not kept");
        assert!(read.keep_restart_keys(&running).is_empty());
    }

    #[test]
    fn the_key_enum_names_the_keys_of_the_list_in_its_order() {
        let named: Vec<&str> = ConfigKey::ALL.iter().map(|key| key.name()).collect();
        let listed: Vec<&str> = Config::KEYS.iter().map(|(key, _)| *key).collect();
        assert_eq!(named, listed);
        assert_eq!(
            ConfigKey::health_probe_interval.name(),
            "health_probe_interval"
        );
    }
}
