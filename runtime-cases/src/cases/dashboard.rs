//! The metric names the shipped Grafana dashboard and Prometheus alert rules query, checked
//! against a real scrape of the binary under test: a metric renamed or dropped in pdbmux would
//! otherwise leave a panel empty or an alert silent, and nothing else would notice.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use super::metrics::{metrics_addr, Scrape};
use crate::support::{respond, FakeBackend, Pdbmux};

/// Names the files may use that pdbmux does not export: Prometheus's own `up`, which
/// PdbmuxScrapeDown watches.
const NOT_PDBMUX: [&str; 1] = ["up"];
/// Fewer names than this means the extraction broke, not that the files use few metrics.
const AT_LEAST: usize = 10;

/// `deploy/`: both runtime crates sit one level below the repository root.
fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

fn ident_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// The metric names a text uses: every word that starts with `pdbmux_` or `process_`, and every
/// other word that opens a PromQL selector (`up{job=...}`; `{{` opens a template, not one).
fn metric_names(text: &str, into: &mut BTreeSet<String>) {
    let mut rest = text;
    while let Some(start) = rest.find(ident_char) {
        let word_len = rest[start..]
            .find(|c: char| !ident_char(c))
            .unwrap_or(rest.len() - start);
        let word = &rest[start..start + word_len];
        let after = &rest[start + word_len..];
        let selector = after.starts_with('{') && !after.starts_with("{{");
        let is_name = !word.starts_with(|c: char| c.is_ascii_digit());
        if is_name && (word.starts_with("pdbmux_") || word.starts_with("process_") || selector) {
            into.insert(word.to_owned());
        }
        rest = after;
    }
}

/// Every string in a JSON document (the dashboard's queries, legends and texts), decoded, so an
/// escape such as `\n` before a name cannot hide it.
fn json_strings(value: &serde_json::Value, into: &mut Vec<String>) {
    match value {
        serde_json::Value::String(s) => into.push(s.clone()),
        serde_json::Value::Array(items) => items.iter().for_each(|v| json_strings(v, into)),
        serde_json::Value::Object(map) => map.values().for_each(|v| json_strings(v, into)),
        _ => {}
    }
}

/// Every name a scrape exports: `# TYPE` names (a family without samples yet shows only those),
/// with a histogram's `_bucket`, `_sum` and `_count` series, and every sample's name. Counters
/// are typed under their `_total` name in the text format 0.0.4 (what a scrape without an
/// OpenMetrics `Accept` gets), so that form needs no deriving.
fn exported_names(scrape: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in scrape.lines() {
        if let Some(typed) = line.strip_prefix("# TYPE ") {
            let mut parts = typed.split_whitespace();
            let (Some(name), Some(kind)) = (parts.next(), parts.next()) else {
                continue;
            };
            names.insert(name.to_owned());
            if kind == "histogram" {
                for suffix in ["_bucket", "_sum", "_count"] {
                    names.insert(format!("{name}{suffix}"));
                }
            }
        } else if !line.starts_with('#') && !line.is_empty() {
            let end = line.find(['{', ' ']).unwrap_or(line.len());
            names.insert(line[..end].to_owned());
        }
    }
    names
}

/// Runs pdbmux with one backend that answers (all but `/facts`) and one that fails every query,
/// so that each family the files use has samples (partial answers, upstream errors, a request no
/// backend answered, the membership map, the cache), then checks every name the dashboard and
/// the rules use against the scrape.
pub fn every_metric_the_dashboard_and_rules_use_is_exported(bin: &Path) {
    let answering = FakeBackend::start(|line| {
        if line.starts_with("GET /pdb/query/v4/facts ") {
            respond("500 Server Error", "text/plain", "boom")
        } else {
            super::metrics::one_node(line)
        }
    });
    let failing = FakeBackend::start(|_| respond("500 Server Error", "text/plain", "boom"));
    let metrics = metrics_addr();
    // A shared store nobody listens on: the store's metrics are exported (down) all the same.
    let store = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let store_url = format!("redis://{}", store.local_addr().unwrap());
    drop(store);
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("cache.key");
    std::fs::write(&secret, "dashboard-test-secret-0123456789").unwrap();
    let pdbmux = Pdbmux::start(
        bin,
        &[
            (
                "PDBMUX_BACKENDS",
                format!("a={},b={}", answering.url(), failing.url()),
            ),
            ("PDBMUX_METRICS_LISTEN", metrics.to_string()),
            ("PDBMUX_CACHE_BACKEND", "redis".to_owned()),
            ("PDBMUX_CACHE_REDIS_URL", store_url),
            ("PDBMUX_CACHE_SECRET_FILE", secret.display().to_string()),
        ],
    );
    let nodes = pdbmux.get("/pdb/query/v4/nodes");
    assert_eq!(nodes.status(), 200, "{}", nodes.text);
    assert_eq!(nodes.header("x-backends").as_deref(), Some("1/2"));
    let names = pdbmux.get("/pdb/query/v4/fact-names");
    assert_eq!(names.status(), 200, "{}", names.text);
    // Both backends fail /facts: pdbmux relays the error, answered by none of them.
    let unanswered = pdbmux.get("/pdb/query/v4/facts");
    assert_eq!(
        unanswered.header("x-backends").as_deref(),
        Some("0/2"),
        "{}",
        unanswered.text
    );

    // Fetched, checked for a 200 and parsed with a Prometheus text parser by `Scrape::of`.
    let scrape = Scrape::of(metrics).text;
    let exported = exported_names(&scrape);

    let mut used = BTreeSet::new();
    let dashboard_path = deploy_dir().join("grafana/pdbmux-dashboard.json");
    let dashboard: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&dashboard_path).unwrap()).unwrap();
    let mut strings = Vec::new();
    json_strings(&dashboard, &mut strings);
    strings.iter().for_each(|s| metric_names(s, &mut used));
    let rules_path = deploy_dir().join("prometheus/pdbmux-rules.yaml");
    metric_names(&std::fs::read_to_string(&rules_path).unwrap(), &mut used);

    assert!(
        used.len() >= AT_LEAST,
        "only {} metric names found in {} and {}: {used:?}",
        used.len(),
        dashboard_path.display(),
        rules_path.display()
    );
    let missing: Vec<&String> = used
        .iter()
        .filter(|name| !exported.contains(*name) && !NOT_PDBMUX.contains(&name.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "used by the dashboard or the rules but not exported: {missing:?}\n{scrape}"
    );
}
