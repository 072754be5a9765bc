//! How the loader reads and describes each key of the core's configuration ([`ConfigKey`], the
//! one list in `core/src/config.rs`): the flag that sets it, its default as written in a config
//! file and its comment in the `config init` template. The match has no catch-all, so a key added
//! to the core's list does not compile until it is described here.

use pdbmux_core::config::ConfigKey;

use super::Key;

/// The table's entry for the core's `key`.
pub(super) fn entry(key: ConfigKey) -> Key {
    use ConfigKey as K;
    match key {
        K::listen => Key::new(
            key.name(),
            Some("--listen"),
            Some(":8080"),
            "address to listen on; \":8080\" means every interface",
        ),
        K::metrics_listen => Key::new(
            key.name(),
            None,
            Some(":9180"),
            "where pdbmux's own /metrics are served (never on listen); empty turns them off",
        )
        .empty_is_a_value(),
        K::backends => Key::new(
            key.name(),
            None,
            None,
            "the PuppetDBs; order is a tie-break only, not a ranking",
        ),
        K::merge => Key::new(
            key.name(),
            Some("--merge"),
            Some("freshness"),
            "freshness | static",
        ),
        K::timeout => Key::new(
            key.name(),
            None,
            Some("10s"),
            "per-upstream request timeout",
        ),
        K::freshness_ttl => Key::new(
            key.name(),
            None,
            Some("30s"),
            "freshness-map cache TTL (freshness merge only)",
        ),
        K::facts_ttl => Key::new(
            key.name(),
            None,
            Some("30s"),
            "merged record sets' cache TTL (/nodes, /facts, every entity but history); 0 disables, capped at 30s",
        ),
        K::history_ttl => Key::new(
            key.name(),
            None,
            Some("15s"),
            "/reports + /events response cache TTL; 0 disables, capped at 30s",
        ),
        K::aggregate_ttl => Key::new(
            key.name(),
            None,
            Some("15s"),
            "cache TTL of counts, extract functions and event counts; 0 disables, capped at 30s",
        ),
        K::cache_refresh_ahead_percent => Key::new(
            key.name(),
            None,
            Some("80"),
            "a hit past this share of its TTL (%) also refreshes the entry in the background; 0 turns it off",
        ),
        K::facts_cache_bytes => Key::new(
            key.name(),
            None,
            Some("67108864"),
            "byte budget for that cache (64 MiB), LRU-evicted",
        ),
        K::cache_backend => Key::new(
            key.name(),
            None,
            Some("memory"),
            "memory | redis: redis also shares entries and fan-outs between replicas",
        ),
        K::cache_key_prefix => Key::new(
            key.name(),
            None,
            Some("pdbmux:"),
            "prefix of every key pdbmux writes in the shared store",
        ),
        K::cache_stale_ttl => Key::new(
            key.name(),
            None,
            Some("5m"),
            "how long past facts_ttl a shared entry is kept to answer when every backend fails",
        ),
        K::cache_max_entry_bytes => Key::new(
            key.name(),
            None,
            Some("8388608"),
            "larger answers are not stored in the shared store (8 MiB)",
        ),
        K::source_fact => Key::new(
            key.name(),
            None,
            Some("pdbmux_source"),
            "name of the synthetic provenance fact",
        ),
        K::source_fact_enabled => Key::new(
            key.name(),
            None,
            Some("true"),
            "false serves backends' records untouched",
        ),
        K::health_probe_enabled => Key::new(
            key.name(),
            Some("--health-probe"),
            Some("true"),
            "false queries every backend on every request",
        ),
        K::health_probe_path => Key::new(
            key.name(),
            None,
            Some("/status/v1/services"),
            "backend health endpoint",
        ),
        K::health_probe_interval => Key::new(
            key.name(),
            None,
            Some("10s"),
            "how often each backend is probed",
        ),
        K::health_probe_timeout => Key::new(
            key.name(),
            None,
            Some("5s"),
            "per-probe timeout",
        ),
        K::health_probe_failures => Key::new(
            key.name(),
            None,
            Some("3"),
            "consecutive failures before a backend is skipped (at least 1)",
        ),
        K::health_probe_successes => Key::new(
            key.name(),
            None,
            Some("2"),
            "consecutive successes before it is used again (at least 1)",
        ),
        K::max_body_bytes => Key::new(
            key.name(),
            None,
            Some("536870912"),
            "most bytes read from one upstream body (512 MiB); more fails that backend",
        ),
        K::merge_request_bytes => Key::new(
            key.name(),
            None,
            Some("536870912"),
            "most backend answer bytes one merge holds (512 MiB); more answers 503",
        ),
        K::merge_memory_bytes => Key::new(
            key.name(),
            None,
            Some("1073741824"),
            "most backend answer bytes all merges in flight hold (1 GiB); more answers 503",
        ),
        K::stream_above_bytes => Key::new(
            key.name(),
            None,
            Some("8388608"),
            "answers a merge reads whole before it streams (8 MiB); 0 streams all that can",
        ),
        K::client_header_timeout => Key::new(
            key.name(),
            None,
            Some("30s"),
            "longest a client may take to send a request head; also the keep-alive idle limit",
        ),
        K::client_send_timeout => Key::new(
            key.name(),
            None,
            Some("60s"),
            "longest a client may take no bytes of an answer before it is cut",
        ),
        K::latency_objective => Key::new(
            key.name(),
            None,
            Some("2s"),
            "the p99 answer time to keep; PdbmuxLatencyHigh fires above it (pdbmux_latency_objective_seconds)",
        ),
    }
}
