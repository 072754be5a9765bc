//! The table of configuration keys: file key, env var, flag, default and a one-line comment.
//!
//! Everything that lists keys (the loader's layers, `config show`, `config init`) walks this one
//! table, so a key added here is picked up everywhere.

/// One configuration key.
#[derive(Debug)]
pub(crate) struct Key {
    /// The key as written in the config file.
    pub name: &'static str,
    /// The env var that overrides it.
    pub env: &'static str,
    /// The flag that overrides it, if any.
    pub flag: Option<&'static str>,
    /// The default, spelled as in a config file; `None` when the key has no default.
    pub default: Option<&'static str>,
    /// A one-line description for the `config init` template.
    pub comment: &'static str,
    /// Whether an empty env var sets the key (to empty) rather than counting as unset.
    pub empty_is_a_value: bool,
}

const fn key(
    name: &'static str,
    env: &'static str,
    flag: Option<&'static str>,
    default: Option<&'static str>,
    comment: &'static str,
) -> Key {
    Key {
        name,
        env,
        flag,
        default,
        comment,
        empty_is_a_value: false,
    }
}

/// A key whose empty value means something (turns a feature off), from the env too.
const fn key_empty_allowed(
    name: &'static str,
    env: &'static str,
    default: Option<&'static str>,
    comment: &'static str,
) -> Key {
    Key {
        empty_is_a_value: true,
        ..key(name, env, None, default, comment)
    }
}

/// Every key, in the order `config show` and `config init` print them.
pub(crate) const KEYS: &[Key] = &[
    key(
        "listen",
        "PDBMUX_LISTEN",
        Some("--listen"),
        Some(":8080"),
        "address to listen on; \":8080\" means every interface",
    ),
    key_empty_allowed(
        "metrics_listen",
        "PDBMUX_METRICS_LISTEN",
        Some(":9180"),
        "where pdbmux's own /metrics are served (never on listen); empty turns them off",
    ),
    key(
        "backends",
        "PDBMUX_BACKENDS",
        None,
        None,
        "the PuppetDBs; order is a tie-break only, not a ranking",
    ),
    key(
        "merge",
        "PDBMUX_MERGE",
        Some("--merge"),
        Some("freshness"),
        "freshness | static",
    ),
    key(
        "timeout",
        "PDBMUX_TIMEOUT",
        None,
        Some("10s"),
        "per-upstream request timeout",
    ),
    key(
        "freshness_ttl",
        "PDBMUX_FRESHNESS_TTL",
        None,
        Some("30s"),
        "freshness-map cache TTL (freshness merge only)",
    ),
    key(
        "facts_ttl",
        "PDBMUX_FACTS_TTL",
        None,
        Some("30s"),
        "merged record sets' cache TTL (/nodes, /facts, every entity but history); 0 disables, capped at 30s",
    ),
    key(
        "history_ttl",
        "PDBMUX_HISTORY_TTL",
        None,
        Some("15s"),
        "/reports + /events response cache TTL; 0 disables, capped at 30s",
    ),
    key(
        "aggregate_ttl",
        "PDBMUX_AGGREGATE_TTL",
        None,
        Some("15s"),
        "cache TTL of counts, extract functions and event counts; 0 disables, capped at 30s",
    ),
    key(
        "cache_refresh_ahead_percent",
        "PDBMUX_CACHE_REFRESH_AHEAD_PERCENT",
        None,
        Some("80"),
        "a hit past this share of its TTL (%) also refreshes the entry in the background; 0 turns it off",
    ),
    key(
        "facts_cache_bytes",
        "PDBMUX_FACTS_CACHE_BYTES",
        None,
        Some("67108864"),
        "byte budget for that cache (64 MiB), LRU-evicted",
    ),
    key(
        "cache_backend",
        "PDBMUX_CACHE_BACKEND",
        None,
        Some("memory"),
        "memory | redis: redis also shares entries and fan-outs between replicas",
    ),
    key(
        "cache_redis_url",
        "PDBMUX_CACHE_REDIS_URL",
        None,
        None,
        "for cache_backend redis: redis://[user:password@]host:6379[/db] or rediss://",
    ),
    key(
        "cache_redis_password_file",
        "PDBMUX_CACHE_REDIS_PASSWORD_FILE",
        None,
        None,
        "for cache_backend redis: a file holding the store's password (instead of one in the URL)",
    ),
    key(
        "cache_secret_file",
        "PDBMUX_CACHE_SECRET_FILE",
        None,
        None,
        "for cache_backend redis (required): a file holding the key, at least 16 bytes, every replica signs entries with",
    ),
    key(
        "cache_key_prefix",
        "PDBMUX_CACHE_KEY_PREFIX",
        None,
        Some("pdbmux:"),
        "prefix of every key pdbmux writes in the shared store",
    ),
    key(
        "cache_stale_ttl",
        "PDBMUX_CACHE_STALE_TTL",
        None,
        Some("5m"),
        "how long past facts_ttl a shared entry is kept to answer when every backend fails",
    ),
    key(
        "cache_max_entry_bytes",
        "PDBMUX_CACHE_MAX_ENTRY_BYTES",
        None,
        Some("8388608"),
        "larger answers are not stored in the shared store (8 MiB)",
    ),
    key(
        "source_fact",
        "PDBMUX_SOURCE_FACT",
        None,
        Some("pdbmux_source"),
        "name of the synthetic provenance fact",
    ),
    key(
        "source_fact_enabled",
        "PDBMUX_SOURCE_FACT_ENABLED",
        None,
        Some("true"),
        "false serves backends' records untouched",
    ),
    key(
        "health_probe_enabled",
        "PDBMUX_HEALTH_PROBE_ENABLED",
        Some("--health-probe"),
        Some("true"),
        "false queries every backend on every request",
    ),
    key(
        "health_probe_path",
        "PDBMUX_HEALTH_PROBE_PATH",
        None,
        Some("/status/v1/services"),
        "backend health endpoint",
    ),
    key(
        "health_probe_interval",
        "PDBMUX_HEALTH_PROBE_INTERVAL",
        None,
        Some("10s"),
        "how often each backend is probed",
    ),
    key(
        "health_probe_timeout",
        "PDBMUX_HEALTH_PROBE_TIMEOUT",
        None,
        Some("5s"),
        "per-probe timeout",
    ),
    key(
        "health_probe_failures",
        "PDBMUX_HEALTH_PROBE_FAILURES",
        None,
        Some("3"),
        "consecutive failures before a backend is skipped (at least 1)",
    ),
    key(
        "health_probe_successes",
        "PDBMUX_HEALTH_PROBE_SUCCESSES",
        None,
        Some("2"),
        "consecutive successes before it is used again (at least 1)",
    ),
    key(
        "max_body_bytes",
        "PDBMUX_MAX_BODY_BYTES",
        None,
        Some("536870912"),
        "most bytes read from one upstream body (512 MiB); more fails that backend",
    ),
    key(
        "merge_request_bytes",
        "PDBMUX_MERGE_REQUEST_BYTES",
        None,
        Some("536870912"),
        "most backend answer bytes one merge holds (512 MiB); more answers 503",
    ),
    key(
        "merge_memory_bytes",
        "PDBMUX_MERGE_MEMORY_BYTES",
        None,
        Some("1073741824"),
        "most backend answer bytes all merges in flight hold (1 GiB); more answers 503",
    ),
    key(
        "client_header_timeout",
        "PDBMUX_CLIENT_HEADER_TIMEOUT",
        None,
        Some("30s"),
        "longest a client may take to send a request head; also the keep-alive idle limit",
    ),
    key(
        "client_send_timeout",
        "PDBMUX_CLIENT_SEND_TIMEOUT",
        None,
        Some("60s"),
        "longest a client may take no bytes of an answer before it is cut",
    ),
    key(
        "latency_objective",
        "PDBMUX_LATENCY_OBJECTIVE",
        None,
        Some("2s"),
        "the p99 answer time to keep; PdbmuxLatencyHigh fires above it (pdbmux_latency_objective_seconds)",
    ),
    key(
        "tls_ca_file",
        "PDBMUX_TLS_CA_FILE",
        None,
        None,
        "extra CA bundle (PEM) for https backends, e.g. the Puppet CA",
    ),
    key(
        "tls_cert_file",
        "PDBMUX_TLS_CERT_FILE",
        None,
        None,
        "client certificate (PEM) for https backends",
    ),
    key(
        "tls_key_file",
        "PDBMUX_TLS_KEY_FILE",
        None,
        None,
        "private key (PEM) for tls_cert_file",
    ),
    key(
        "log_format",
        "PDBMUX_LOG_FORMAT",
        Some("--log-format"),
        Some("text"),
        "text | json; logs go to stderr",
    ),
    key(
        "log_level",
        "PDBMUX_LOG_LEVEL",
        None,
        Some("info"),
        "log filter, e.g. debug or pdbmux=debug,info; RUST_LOG applies when unset",
    ),
    key(
        "config_watch_interval",
        "PDBMUX_CONFIG_WATCH_INTERVAL",
        None,
        Some("0"),
        "how often the config file is looked at and read again when it changed (a Kubernetes ConfigMap update); 0: only on SIGHUP",
    ),
];

/// The keys a backend entry in the config file may have.
pub(crate) const BACKEND_KEYS: &[&str] = &[
    "name",
    "url",
    "tls_ca_file",
    "tls_cert_file",
    "tls_key_file",
];

/// The entry for `name`; `None` for a name not in the table.
pub(crate) fn find(name: &str) -> Option<&'static Key> {
    KEYS.iter().find(|k| k.name == name)
}

/// The variable that names the config file; not a key, since it chooses where keys come from.
pub(crate) const CONFIG_VAR: &str = "PDBMUX_CONFIG";

/// The prefix every variable pdbmux reads starts with.
pub(crate) const ENV_PREFIX: &str = "PDBMUX_";

/// How alike two names must be (normalized Damerau–Levenshtein: one edit in seven is 0.86) for
/// one to be offered as the other's spelling.
const NEAR: f64 = 0.75;

/// The name nearest to `word`, when it is near enough to be a misspelling of it or one of the two
/// is the other cut at a `_` (`tls_ca` for `tls_ca_file`); each candidate is the text compared
/// and the name offered.
fn nearest(
    word: &str,
    candidates: impl Iterator<Item = (&'static str, &'static str)>,
) -> Option<&'static str> {
    candidates
        .map(|(compared, offered)| {
            let cut = |long: &str, short: &str| {
                long.strip_prefix(short)
                    .is_some_and(|rest| rest.starts_with('_'))
            };
            let score = if cut(compared, word) || cut(word, compared) {
                NEAR
            } else {
                strsim::normalized_damerau_levenshtein(word, compared)
            };
            (score, offered)
        })
        .filter(|(score, _)| *score >= NEAR)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, offered)| offered)
}

/// The key `name` (not one of [`KEYS`]) is most likely a misspelling of.
pub(crate) fn nearest_key(name: &str) -> Option<&'static str> {
    nearest(name, KEYS.iter().map(|k| (k.name, k.name)))
}

/// The backend entry key `name` (not one of [`BACKEND_KEYS`]) is most likely a misspelling of.
pub(crate) fn nearest_backend_key(name: &str) -> Option<&'static str> {
    nearest(name, BACKEND_KEYS.iter().map(|k| (*k, *k)))
}

/// The variable an unknown `PDBMUX_*` variable is most likely a misspelling of. Names are
/// compared without the shared prefix, which would make every pair look alike.
pub(crate) fn nearest_var(var: &str) -> Option<&'static str> {
    let stem = var.strip_prefix(ENV_PREFIX).unwrap_or(var);
    let known = KEYS
        .iter()
        .map(|k| k.env)
        .chain(std::iter::once(CONFIG_VAR));
    nearest(stem, known.map(|env| (&env[ENV_PREFIX.len()..], env)))
}

/// The variable `make build` sets for cargo, read at build time (`option_env!` in
/// cli/src/args.rs), never at run time; not refused, so that exporting it for a build does not
/// stop the binary it built.
pub(crate) const BUILD_VERSION_VAR: &str = "PDBMUX_BUILD_VERSION";

/// Whether `var` (set to `value`) is a `PDBMUX_*` variable pdbmux does not read and must refuse
/// (a misspelling, most likely): not a key's variable, not [`CONFIG_VAR`] or
/// [`BUILD_VERSION_VAR`], and not a service link.
pub(crate) fn is_unknown_var(var: &str, value: &str) -> bool {
    var.starts_with(ENV_PREFIX)
        && var != CONFIG_VAR
        && var != BUILD_VERSION_VAR
        && !KEYS.iter().any(|k| k.env == var)
        && !is_service_link(var, value)
}

/// Whether `var=value` is one of the variables Kubernetes sets in every pod for each Service of
/// the namespace (a Service named pdbmux, or pdbmux-anything, makes them `PDBMUX_*`; refusing
/// them would stop every pod from starting): by its name's shape and its value's, so that a
/// misspelling such as `PDBMUX_METRICS_PORT=:9180` is still refused.
///
/// | name | value |
/// |---|---|
/// | `<SVC>_SERVICE_HOST` | an IP address |
/// | `<SVC>_SERVICE_PORT`, `<SVC>_SERVICE_PORT_<NAME>` | a port number |
/// | `<SVC>_PORT`, `<SVC>_PORT_<n>_<TCP\|UDP\|SCTP>` | `tcp://`, `udp://` or `sctp://` address |
/// | `<SVC>_PORT_<n>_<P>_PROTO` | `tcp`, `udp` or `sctp` |
/// | `<SVC>_PORT_<n>_<P>_PORT` | a port number |
/// | `<SVC>_PORT_<n>_<P>_ADDR` | an IP address |
fn is_service_link(var: &str, value: &str) -> bool {
    let port = !value.is_empty() && value.len() <= 5 && value.bytes().all(|b| b.is_ascii_digit());
    let ip = value.parse::<std::net::IpAddr>().is_ok();
    let url = ["tcp://", "udp://", "sctp://"]
        .iter()
        .any(|scheme| value.starts_with(scheme));
    if var.ends_with("_SERVICE_HOST") {
        return ip;
    }
    if var.ends_with("_SERVICE_PORT") || var.contains("_SERVICE_PORT_") {
        return port;
    }
    let port_proto = var.match_indices("_PORT_").find_map(|(at, _)| {
        let mut parts = var[at + "_PORT_".len()..].split('_');
        let number = parts
            .next()
            .is_some_and(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
        let protocol = parts
            .next()
            .is_some_and(|p| matches!(p, "TCP" | "UDP" | "SCTP"));
        let suffix = parts.next();
        (number && protocol && parts.next().is_none()).then_some(suffix)
    });
    match port_proto {
        Some(None) => url,
        Some(Some("PROTO")) => matches!(value, "tcp" | "udp" | "sctp"),
        Some(Some("PORT")) => port,
        Some(Some("ADDR")) => ip,
        Some(Some(_)) => false,
        None => var.ends_with("_PORT") && url,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The keys of this table that are not fields of the core's configuration, and why: read by
    /// the loader (the TLS defaults fill each backend's own files; the Redis client's URL, password
    /// and key are opened by the driver) or by the process (logging, the config watch).
    const LOADER_KEYS: &[&str] = &[
        "cache_redis_url",
        "cache_redis_password_file",
        "cache_secret_file",
        "tls_ca_file",
        "tls_cert_file",
        "tls_key_file",
        "log_format",
        "log_level",
        "config_watch_interval",
    ];

    /// One definition of the keys: this table is the core's `Config::KEYS` (each field of the
    /// configuration, classed by what a reload renews) plus the loader's own. A field added to
    /// the core's struct does not compile until it is classed there; added there and not here,
    /// this fails.
    #[test]
    fn the_table_is_the_cores_keys_and_the_loaders() {
        let core: Vec<&str> = pdbmux_core::config::Config::KEYS
            .iter()
            .map(|(key, _)| *key)
            .collect();
        let here: Vec<&str> = KEYS
            .iter()
            .map(|key| key.name)
            .filter(|name| !LOADER_KEYS.contains(name))
            .collect();
        let mut sorted = (core.clone(), here.clone());
        sorted.0.sort_unstable();
        sorted.1.sort_unstable();
        assert_eq!(sorted.0, sorted.1, "the core's keys and this table's");
        for loader in LOADER_KEYS {
            assert!(
                KEYS.iter().any(|key| key.name == *loader),
                "{loader} is in the table"
            );
            assert!(
                !core.contains(loader),
                "{loader} is the loader's, not the core's"
            );
        }
    }

    #[test]
    fn suggests_the_key_a_misspelling_is_near() {
        assert_eq!(nearest_key("timout"), Some("timeout"));
        assert_eq!(nearest_key("facts_tll"), Some("facts_ttl"));
        assert_eq!(nearest_key("backend"), Some("backends"));
        assert_eq!(nearest_key("colour"), None);
        assert_eq!(nearest_backend_key("tls_ca"), Some("tls_ca_file"));
        assert_eq!(nearest_backend_key("uri"), None);
    }

    #[test]
    fn suggests_the_variable_a_misspelling_is_near() {
        assert_eq!(nearest_var("PDBMUX_TIMOUT"), Some("PDBMUX_TIMEOUT"));
        assert_eq!(nearest_var("PDBMUX_BACKEND"), Some("PDBMUX_BACKENDS"));
        assert_eq!(nearest_var("PDBMUX_CONFIG_FILE"), Some("PDBMUX_CONFIG"));
        assert_eq!(nearest_var("PDBMUX_CACHE_ENABLED"), None);
    }

    #[test]
    fn refuses_unknown_variables_but_not_keys_config_or_service_links() {
        for known in [
            "PDBMUX_TIMEOUT",
            "PDBMUX_BACKENDS",
            "PDBMUX_CONFIG",
            "PDBMUX_BUILD_VERSION",
        ] {
            assert!(!is_unknown_var(known, "x"), "{known}");
        }
        for (link, value) in [
            ("PDBMUX_SERVICE_HOST", "10.0.0.7"),
            ("PDBMUX_SERVICE_PORT", "8080"),
            ("PDBMUX_SERVICE_PORT_HTTP", "8080"),
            ("PDBMUX_PORT", "tcp://10.0.0.7:8080"),
            ("PDBMUX_PORT_8080_TCP", "tcp://10.0.0.7:8080"),
            ("PDBMUX_PORT_8080_TCP_PROTO", "tcp"),
            ("PDBMUX_PORT_8080_TCP_PORT", "8080"),
            ("PDBMUX_PORT_8080_TCP_ADDR", "10.0.0.7"),
            ("PDBMUX_METRICS_PORT_9180_TCP_ADDR", "fd00::7"),
            ("PDBMUX_METRICS_SERVICE_HOST", "10.0.0.8"),
        ] {
            assert!(!is_unknown_var(link, value), "{link}={value}");
        }
        for (unknown, value) in [
            ("PDBMUX_TIMOUT", "5s"),
            ("PDBMUX_CACHE_ENABLED", "false"),
            ("PDBMUX_PORT_8080_HTTP", "tcp://10.0.0.7:8080"),
            ("PDBMUX_PORT_X_TCP", "tcp://10.0.0.7:8080"),
            // A link's name with a value no link has: a misspelled setting.
            ("PDBMUX_METRICS_PORT", ":9180"),
            ("PDBMUX_LISTEN_PORT", "8080"),
            ("PDBMUX_SERVICE_HOST", "pdbmux.example.com"),
            ("PDBMUX_SERVICE_PORT", "http"),
            ("PDBMUX_PORT_8080_TCP_PROTO", "http"),
        ] {
            assert!(is_unknown_var(unknown, value), "{unknown}={value}");
        }
        assert!(!is_unknown_var("RUST_LOG", "debug"));
    }
}
