//! Helpers for the checks of `deploy/` in `tests/manifests.rs` (the Kubernetes manifests) and
//! `tests/monitoring.rs` (scraping, alert rules, dashboard): reading multi-document YAML, walking
//! values by path, Kubernetes memory quantities, Go-style durations, listen addresses, and
//! pdbmux's effective settings (defaults < config file < `PDBMUX_*` env vars) for the values the
//! manifests are sized from.

#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};

use serde::Deserialize as _;
use serde_norway::Value;

/// `deploy/`.
pub fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// `deploy/kubernetes/`.
pub fn kubernetes_dir() -> PathBuf {
    deploy_dir().join("kubernetes")
}

/// `deploy/overlays/example/`: a kustomize overlay of `deploy/kubernetes/` for one site.
pub fn example_overlay_dir() -> PathBuf {
    deploy_dir().join("overlays").join("example")
}

/// The name kustomize reads in a directory.
pub const KUSTOMIZATION: &str = "kustomization.yaml";

/// Every non-empty YAML document in a file.
pub fn load(path: &Path) -> Result<Vec<Value>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    parse_documents(&text).map_err(|e| format!("{}: {e}", path.display()))
}

/// Every non-empty document of a multi-document YAML text.
pub fn parse_documents(text: &str) -> Result<Vec<Value>, String> {
    let mut documents = Vec::new();
    for document in serde_norway::Deserializer::from_str(text) {
        let value = serde_norway::Value::deserialize(document).map_err(|e| e.to_string())?;
        if !value.is_null() {
            documents.push(value);
        }
    }
    Ok(documents)
}

/// The value at a dotted path (`spec.template.spec.containers.0.ports`); numbers index sequences.
pub fn at<'a>(value: &'a Value, path: &str) -> Option<&'a Value> {
    path.split('.')
        .try_fold(value, |v, key| match key.parse::<usize>() {
            Ok(index) if v.is_sequence() => v.get(index),
            _ => v.get(key),
        })
}

/// The string at a path.
pub fn str_at<'a>(value: &'a Value, path: &str) -> Option<&'a str> {
    at(value, path).and_then(Value::as_str)
}

/// The integer at a path.
pub fn int_at(value: &Value, path: &str) -> Option<i64> {
    at(value, path).and_then(Value::as_i64)
}

/// The sequence at a path (empty when absent).
pub fn seq_at<'a>(value: &'a Value, path: &str) -> &'a [Value] {
    at(value, path)
        .and_then(Value::as_sequence)
        .map_or(&[], Vec::as_slice)
}

/// Whether a non-empty label `selector` (a mapping) selects `labels`: each of its pairs is there.
pub fn labels_match(selector: Option<&Value>, labels: Option<&Value>) -> bool {
    let (Some(selector), Some(labels)) = (
        selector.and_then(Value::as_mapping),
        labels.and_then(Value::as_mapping),
    ) else {
        return false;
    };
    !selector.is_empty() && selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

/// A Kubernetes memory quantity in bytes: `768Mi`, `1Gi`, `512M`, `1000000`.
pub fn memory_bytes(quantity: &str) -> Result<u64, String> {
    let quantity = quantity.trim();
    let split = quantity
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(quantity.len());
    let (number, suffix) = quantity.split_at(split);
    let number: u64 = number
        .parse()
        .map_err(|_| format!("memory quantity {quantity:?}: no integer"))?;
    let factor: u64 = match suffix {
        "" => 1,
        "k" => 1000,
        "M" => 1000u64.pow(2),
        "G" => 1000u64.pow(3),
        "T" => 1000u64.pow(4),
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        _ => {
            return Err(format!(
                "memory quantity {quantity:?}: unknown suffix {suffix:?}"
            ))
        }
    };
    number
        .checked_mul(factor)
        .ok_or_else(|| format!("memory quantity {quantity:?} overflows"))
}

/// A duration in the manifests, in seconds: pdbmux's (`500ms`, `10s`, `1m30s`, `1.5h`) and
/// Prometheus's (`30s`, `5m`) alike. Looser than either (`.5s` passes here, where pdbmux refuses
/// it): it reads values each tool checks itself (`pdbmux_accepts_the_config` runs pdbmux on the
/// ConfigMap, `make deploy-check` runs promtool on the rules where it is installed).
pub fn duration_secs(text: &str) -> Result<f64, String> {
    let mut rest = text.trim();
    if rest == "0" {
        return Ok(0.0);
    }
    let mut total = 0.0;
    if rest.is_empty() {
        return Err(format!("duration {text:?}: empty"));
    }
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(|| format!("duration {text:?}: a number without a unit"))?;
        let (number, tail) = rest.split_at(digits);
        let number: f64 = number
            .parse()
            .map_err(|_| format!("duration {text:?}: bad number {number:?}"))?;
        let unit_len = tail
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(unit_len);
        let scale = match unit {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(format!("duration {text:?}: unknown unit {unit:?}")),
        };
        total += number * scale;
        rest = tail;
    }
    Ok(total)
}

/// The port of a listen address as pdbmux reads them (`:9180`, `0.0.0.0:9180`, `[::]:9180`);
/// None for anything else, the empty string (no listener) included.
pub fn listen_port(addr: &str) -> Option<u16> {
    addr.trim().rsplit_once(':')?.1.parse().ok()
}

/// pdbmux's built-in `timeout`.
pub const DEFAULT_TIMEOUT: &str = "10s";
/// pdbmux's built-in `facts_cache_bytes`.
pub const DEFAULT_FACTS_CACHE_BYTES: u64 = 64 * 1024 * 1024;
/// pdbmux's built-in `max_body_bytes`.
pub const DEFAULT_MAX_BODY_BYTES: u64 = 512 * 1024 * 1024;
/// pdbmux's built-in `merge_memory_bytes`.
pub const DEFAULT_MERGE_MEMORY_BYTES: u64 = 1024 * 1024 * 1024;
/// pdbmux's built-in `metrics_listen` (empty turns the metrics listener off).
pub const DEFAULT_METRICS_LISTEN: &str = ":9180";
/// The drain after SIGTERM lasts up to `timeout` plus this (runtime-tokio/src/serve.rs).
pub const DRAIN_GRACE_SECS: f64 = 5.0;

/// The settings the manifests are sized from, as pdbmux would see them.
#[derive(Debug, Clone, PartialEq)]
pub struct Effective {
    /// `timeout` in seconds.
    pub timeout_secs: f64,
    /// `facts_cache_bytes`.
    pub facts_cache_bytes: u64,
    /// `max_body_bytes`.
    pub max_body_bytes: u64,
    /// `merge_memory_bytes`.
    pub merge_memory_bytes: u64,
    /// How many backends are configured.
    pub backends: usize,
    /// `metrics_listen`, as written (empty: no metrics listener).
    pub metrics_listen: String,
}

/// Defaults, then the config file's values, then `PDBMUX_*` env vars (pdbmux's precedence).
pub fn effective(file: Option<&Value>, env: &[(String, String)]) -> Result<Effective, String> {
    let mut timeout = DEFAULT_TIMEOUT.to_string();
    let mut facts_cache_bytes = DEFAULT_FACTS_CACHE_BYTES;
    let mut max_body_bytes = DEFAULT_MAX_BODY_BYTES;
    let mut merge_memory_bytes = DEFAULT_MERGE_MEMORY_BYTES;
    let mut backends = 0;
    let mut metrics_listen = DEFAULT_METRICS_LISTEN.to_string();
    let bytes = |v: &Value, key: &str| -> Result<u64, String> {
        v.as_u64()
            .or_else(|| v.as_str().and_then(|s| s.trim().parse().ok()))
            .ok_or_else(|| format!("{key}: not a byte count: {v:?}"))
    };
    if let Some(file) = file {
        if let Some(v) = file.get("timeout") {
            timeout = v
                .as_str()
                .ok_or_else(|| format!("timeout: not a string: {v:?}"))?
                .to_string();
        }
        if let Some(v) = file.get("facts_cache_bytes") {
            facts_cache_bytes = bytes(v, "facts_cache_bytes")?;
        }
        if let Some(v) = file.get("max_body_bytes") {
            max_body_bytes = bytes(v, "max_body_bytes")?;
        }
        if let Some(v) = file.get("merge_memory_bytes") {
            merge_memory_bytes = bytes(v, "merge_memory_bytes")?;
        }
        if let Some(v) = file.get("metrics_listen") {
            metrics_listen = v
                .as_str()
                .ok_or_else(|| format!("metrics_listen: not a string: {v:?}"))?
                .to_string();
        }
        backends = seq_at(file, "backends").len();
    }
    for (name, value) in env {
        let v = Value::String(value.clone());
        match name.as_str() {
            "PDBMUX_TIMEOUT" => timeout = value.clone(),
            "PDBMUX_FACTS_CACHE_BYTES" => facts_cache_bytes = bytes(&v, name)?,
            "PDBMUX_MAX_BODY_BYTES" => max_body_bytes = bytes(&v, name)?,
            "PDBMUX_MERGE_MEMORY_BYTES" => merge_memory_bytes = bytes(&v, name)?,
            "PDBMUX_METRICS_LISTEN" => metrics_listen = value.clone(),
            "PDBMUX_BACKENDS" => {
                backends = value.split(',').filter(|e| !e.trim().is_empty()).count()
            }
            _ => {}
        }
    }
    Ok(Effective {
        timeout_secs: duration_secs(&timeout)?,
        facts_cache_bytes,
        max_body_bytes,
        merge_memory_bytes,
        backends,
        metrics_listen,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_quantities() {
        assert_eq!(memory_bytes("768Mi"), Ok(768 << 20));
        assert_eq!(memory_bytes("1Gi"), Ok(1 << 30));
        assert_eq!(memory_bytes("512M"), Ok(512_000_000));
        assert_eq!(memory_bytes("1048576"), Ok(1 << 20));
        assert!(memory_bytes("1.5Gi").is_err());
        assert!(memory_bytes("12Xi").is_err());
    }

    #[test]
    fn durations() {
        assert_eq!(duration_secs("10s"), Ok(10.0));
        assert_eq!(duration_secs("1m30s"), Ok(90.0));
        assert_eq!(duration_secs("500ms"), Ok(0.5));
        assert_eq!(duration_secs("1h"), Ok(3600.0));
        assert!(duration_secs("10").is_err());
        assert!(duration_secs("").is_err());
    }

    #[test]
    fn env_overrides_file() {
        let file: Value = serde_norway::from_str(
            "timeout: 20s\nfacts_cache_bytes: 1000\nbackends: [{name: a, url: http://a}]",
        )
        .expect("yaml");
        let env = [("PDBMUX_TIMEOUT".to_string(), "3s".to_string())];
        let got = effective(Some(&file), &env).expect("effective");
        assert_eq!(got.timeout_secs, 3.0);
        assert_eq!(got.facts_cache_bytes, 1000);
        assert_eq!(got.max_body_bytes, DEFAULT_MAX_BODY_BYTES);
        assert_eq!(got.merge_memory_bytes, DEFAULT_MERGE_MEMORY_BYTES);
        assert_eq!(got.backends, 1);
        assert_eq!(got.metrics_listen, DEFAULT_METRICS_LISTEN);
        let off = [("PDBMUX_METRICS_LISTEN".to_string(), String::new())];
        assert_eq!(
            effective(Some(&file), &off)
                .expect("effective")
                .metrics_listen,
            ""
        );
    }

    #[test]
    fn listen_ports() {
        assert_eq!(listen_port(":9180"), Some(9180));
        assert_eq!(listen_port("0.0.0.0:9180"), Some(9180));
        assert_eq!(listen_port("[::]:9180"), Some(9180));
        assert_eq!(listen_port(""), None);
        assert_eq!(listen_port("9180"), None);
        assert_eq!(listen_port(":http"), None);
    }

    #[test]
    fn paths() {
        let v: Value = serde_norway::from_str("a: {b: [{c: 1}, {c: 2}]}").expect("yaml");
        assert_eq!(int_at(&v, "a.b.1.c"), Some(2));
        assert_eq!(at(&v, "a.x"), None);
        assert_eq!(seq_at(&v, "a.b").len(), 2);
        assert!(seq_at(&v, "a.x").is_empty());
    }
}
