//! Checks pdbmux's monitoring files: `alternatives/servicemonitor.yaml` selects service.yaml's
//! Service by its labels and scrapes its `metrics` port at /metrics every 30 s;
//! `deploy/prometheus/pdbmux-rules.yaml` is a rule file holding the expected alerts, each with a
//! severity, a summary and a description, and `alternatives/prometheusrule.yaml` embeds the same
//! groups; `deploy/grafana/pdbmux-dashboard.json` is a Grafana 10 JSON model whose panels have
//! unique ids, fit the 24-column grid without overlapping, query the templated `DS_PROMETHEUS`
//! datasource, use only variables the dashboard defines, and cover what an operator watches.
//!
//! That every metric name the rules and the dashboard use is exported is checked against a real
//! scrape of both binaries by the runtime case `every_metric_the_dashboard_and_rules_use_is_exported`
//! (runtime-cases/src/cases/dashboard.rs).

use std::collections::{BTreeSet, HashSet};

use pdbmux_manifest_check::{
    at, deploy_dir, duration_secs, kubernetes_dir, labels_match, load, seq_at, str_at,
};
use serde_json::Value as Json;
use serde_norway::Value;

const ALERTS: [&str; 12] = [
    "PdbmuxScrapeDown",
    "PdbmuxBackendDown",
    "PdbmuxPartialAnswers",
    "PdbmuxAllBackendsFailing",
    "PdbmuxCacheServingStale",
    "PdbmuxMembershipStale",
    "PdbmuxCacheStoreDown",
    "PdbmuxConfigReloadFailed",
    "PdbmuxLatencyHigh",
    "PdbmuxErrorRatioHigh",
    "PdbmuxPartialRatioHigh",
    "PdbmuxBackendUnreachable",
];
const SEVERITIES: [&str; 2] = ["warning", "critical"];
/// The datasource every panel queries: the dashboard's own datasource variable.
const DATASOURCE_UID: &str = "${DS_PROMETHEUS}";
/// Grafana 10.0's schema version; older Grafanas would migrate the model.
const MIN_SCHEMA_VERSION: i64 = 38;

fn only_document(relative: &str) -> Value {
    let path = kubernetes_dir().join(relative);
    let mut docs = load(&path).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(docs.len(), 1, "{}: one document", path.display());
    docs.remove(0)
}

fn rules_file() -> Value {
    let path = deploy_dir().join("prometheus/pdbmux-rules.yaml");
    let mut docs = load(&path).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(docs.len(), 1, "{}: one document", path.display());
    docs.remove(0)
}

fn dashboard() -> Json {
    let path = deploy_dir().join("grafana/pdbmux-dashboard.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn the_servicemonitor_scrapes_the_services_metrics_port() {
    let monitor = only_document("alternatives/servicemonitor.yaml");
    let service = only_document("service.yaml");
    assert_eq!(
        str_at(&monitor, "apiVersion"),
        Some("monitoring.coreos.com/v1")
    );
    assert_eq!(str_at(&monitor, "kind"), Some("ServiceMonitor"));
    assert!(
        labels_match(
            at(&monitor, "spec.selector.matchLabels"),
            at(&service, "metadata.labels")
        ),
        "the ServiceMonitor's selector does not select service.yaml's labels"
    );
    let endpoints = seq_at(&monitor, "spec.endpoints");
    assert_eq!(endpoints.len(), 1, "one endpoint");
    let endpoint = &endpoints[0];
    // A ServiceMonitor names the Service's port, which must lead to the container's metrics port.
    assert_eq!(str_at(endpoint, "port"), Some("metrics"));
    let port = seq_at(&service, "spec.ports")
        .iter()
        .find(|p| str_at(p, "name") == Some("metrics"))
        .expect("service.yaml has a port named metrics");
    assert_eq!(str_at(port, "targetPort"), Some("metrics"));
    assert_eq!(str_at(endpoint, "path"), Some("/metrics"));
    let interval = str_at(endpoint, "interval").expect("an interval");
    assert_eq!(duration_secs(interval), Ok(30.0));
}

fn blank(text: Option<&str>) -> bool {
    text.is_none_or(|t| t.trim().is_empty())
}

/// Everything wrong with a Prometheus rule file's `groups`.
fn rules_problems(rules: &Value) -> Vec<String> {
    let mut problems = Vec::new();
    let groups = seq_at(rules, "groups");
    if groups.is_empty() {
        problems.push("no groups".to_owned());
    }
    let mut names = HashSet::new();
    for group in groups {
        let group_name = str_at(group, "name").unwrap_or_default();
        if group_name.is_empty() || !names.insert(group_name) {
            problems.push(format!("a group without a name of its own: {group_name:?}"));
        }
        for rule in seq_at(group, "rules") {
            let Some(alert) = str_at(rule, "alert") else {
                problems.push(format!(
                    "{group_name}: a rule that is not an alert: {rule:?}"
                ));
                continue;
            };
            if blank(str_at(rule, "expr")) {
                problems.push(format!("{alert}: no expr"));
            }
            if let Some(wait) = at(rule, "for") {
                if wait.as_str().map(duration_secs).is_none_or(|d| d.is_err()) {
                    problems.push(format!("{alert}: `for` is not a duration: {wait:?}"));
                }
            }
            let severity = str_at(rule, "labels.severity");
            if !severity.is_some_and(|s| SEVERITIES.contains(&s)) {
                problems.push(format!(
                    "{alert}: severity {severity:?}, want one of {SEVERITIES:?}"
                ));
            }
            for key in ["summary", "description"] {
                if blank(str_at(rule, &format!("annotations.{key}"))) {
                    problems.push(format!("{alert}: no {key} annotation"));
                }
            }
        }
    }
    problems
}

fn alert_names(rules: &Value) -> Vec<&str> {
    seq_at(rules, "groups")
        .iter()
        .flat_map(|g| seq_at(g, "rules"))
        .filter_map(|r| str_at(r, "alert"))
        .collect()
}

#[test]
fn the_rules_file_holds_every_alert() {
    let rules = rules_file();
    let problems = rules_problems(&rules);
    assert!(problems.is_empty(), "pdbmux-rules.yaml: {problems:#?}");
    let mut names = alert_names(&rules);
    names.sort_unstable();
    let mut want = ALERTS.to_vec();
    want.sort_unstable();
    assert_eq!(names, want);
}

#[test]
fn the_prometheusrule_embeds_the_rules_file() {
    let rule = only_document("alternatives/prometheusrule.yaml");
    assert_eq!(
        str_at(&rule, "apiVersion"),
        Some("monitoring.coreos.com/v1")
    );
    assert_eq!(str_at(&rule, "kind"), Some("PrometheusRule"));
    assert_eq!(
        at(&rule, "spec.groups"),
        at(&rules_file(), "groups"),
        "prometheusrule.yaml's spec.groups must equal pdbmux-rules.yaml's groups"
    );
}

/// Every `$name` and `${name}` in a query text.
fn variables_used(text: &str) -> Vec<String> {
    text.split('$')
        .skip(1)
        .map(|rest| {
            let rest = rest.strip_prefix('{').unwrap_or(rest);
            rest.chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect()
        })
        .collect()
}

/// Every PromQL expression of the dashboard's panels, with its panel's title.
fn expressions(dashboard: &Json) -> Vec<(String, String)> {
    let empty = Vec::new();
    let panels = dashboard["panels"].as_array().unwrap_or(&empty);
    panels
        .iter()
        .flat_map(|panel| {
            let title = panel["title"].as_str().unwrap_or_default().to_owned();
            let targets = panel["targets"].as_array().unwrap_or(&empty);
            targets.iter().map(move |target| {
                let expr = target["expr"].as_str().unwrap_or_default().to_owned();
                (title.clone(), expr)
            })
        })
        .collect()
}

/// Everything wrong with a Grafana dashboard model for pdbmux.
fn dashboard_problems(dashboard: &Json) -> Vec<String> {
    let mut problems = Vec::new();
    let mut check = |ok: bool, what: String| {
        if !ok {
            problems.push(what);
        }
    };
    for key in ["title", "uid"] {
        check(
            dashboard[key].as_str().is_some_and(|v| !v.is_empty()),
            format!("no {key}"),
        );
    }
    check(
        dashboard["schemaVersion"]
            .as_i64()
            .is_some_and(|v| v >= MIN_SCHEMA_VERSION),
        format!("schemaVersion below {MIN_SCHEMA_VERSION} (Grafana 10)"),
    );

    // Variables: the datasource one the panels name, and a backend one from the prober's gauge.
    let variables = dashboard["templating"]["list"].as_array();
    let variable = |name: &str| variables?.iter().find(|v| v["name"] == name);
    check(
        variable("DS_PROMETHEUS")
            .is_some_and(|v| v["type"] == "datasource" && v["query"] == "prometheus"),
        "no datasource variable DS_PROMETHEUS of type prometheus".into(),
    );
    check(
        variable("backend").is_some_and(|v| {
            v["definition"].as_str().is_some_and(|d| {
                d.starts_with("label_values(pdbmux_backend_state") && d.ends_with(", backend)")
            })
        }),
        "no backend variable from label_values(pdbmux_backend_state..., backend)".into(),
    );
    let defined: HashSet<&str> = variables
        .into_iter()
        .flatten()
        .filter_map(|v| v["name"].as_str())
        .collect();
    let mut queries = expressions(dashboard);
    queries.extend(variables.into_iter().flatten().filter_map(|v| {
        let name = v["name"].as_str()?;
        Some((
            format!("variable {name}"),
            v["definition"].as_str()?.to_owned(),
        ))
    }));
    for (title, query) in &queries {
        for name in variables_used(query) {
            // `$__rate_interval` and the like are Grafana's own.
            check(
                name.starts_with("__") || defined.contains(name.as_str()),
                format!("{title}: ${name} is not a dashboard variable"),
            );
        }
    }

    // Panels: unique ids, on the grid, not overlapping; each queries the datasource variable.
    let empty = Vec::new();
    let panels = dashboard["panels"].as_array().unwrap_or(&empty);
    check(!panels.is_empty(), "no panels".into());
    let mut ids = HashSet::new();
    let mut boxes: Vec<(String, [i64; 4])> = Vec::new();
    for panel in panels {
        let title = panel["title"].as_str().unwrap_or_default().to_owned();
        check(
            panel["id"].as_i64().is_some_and(|id| ids.insert(id)),
            format!("{title}: no id of its own"),
        );
        let grid = ["x", "y", "w", "h"].map(|k| panel["gridPos"][k].as_i64().unwrap_or(-1));
        let [x, y, w, h] = grid;
        check(
            x >= 0 && y >= 0 && w >= 1 && h >= 1 && x + w <= 24,
            format!("{title}: gridPos {grid:?} is off the 24-column grid"),
        );
        for (other, [ox, oy, ow, oh]) in &boxes {
            check(
                x >= ox + ow || ox >= &(x + w) || y >= oy + oh || oy >= &(y + h),
                format!("{title} overlaps {other}"),
            );
        }
        boxes.push((title.clone(), grid));
        if panel["type"] == "row" {
            continue;
        }
        check(
            panel["datasource"]["uid"] == DATASOURCE_UID,
            format!("{title}: datasource is not {DATASOURCE_UID}"),
        );
        let targets = panel["targets"].as_array().unwrap_or(&empty);
        check(!targets.is_empty(), format!("{title}: no query"));
        let mut ref_ids = HashSet::new();
        for target in targets {
            check(
                target["expr"]
                    .as_str()
                    .is_some_and(|e| !e.trim().is_empty()),
                format!("{title}: a query without expr"),
            );
            check(
                target["refId"].as_str().is_some_and(|r| ref_ids.insert(r)),
                format!("{title}: a query without a refId of its own"),
            );
        }
    }

    // Coverage: for each question an operator asks, one expression holding all of its parts.
    let coverage: &[&[&str]] = &[
        &["pdbmux_requests_total", "route", "code"],
        &[
            "histogram_quantile(0.5,",
            "pdbmux_request_duration_seconds_bucket",
            "route",
        ],
        &[
            "histogram_quantile(0.95,",
            "pdbmux_request_duration_seconds_bucket",
            "route",
        ],
        &[
            "histogram_quantile(0.99,",
            "pdbmux_request_duration_seconds_bucket",
            "route",
        ],
        &[
            "histogram_quantile(0.95,",
            "pdbmux_upstream_request_duration_seconds_bucket",
            "backend",
        ],
        &[
            "pdbmux_upstream_requests_total",
            "outcome!=\"ok\"",
            "backend, purpose, outcome",
        ],
        &["pdbmux_partial_answers_total", "by (route)"],
        &["pdbmux_unanswered_total", "by (route)"],
        &["pdbmux_backend_owned_nodes", "backend"],
        &["pdbmux_membership_shared_nodes"],
        &["pdbmux_backend_state", "== 1"],
        &[
            "pdbmux_cache_requests_total",
            "result=\"hit\"",
            "result=~\"hit|miss|stale\"",
        ],
        &["pdbmux_cache_requests_total", "by (result)"],
        &["pdbmux_cache_entries"],
        &["pdbmux_cache_body_bytes"],
        &["pdbmux_cache_evictions_total"],
        &["pdbmux_cache_store_up"],
        &["pdbmux_cache_store_requests_total", "by (op, outcome)"],
        &["pdbmux_membership_age_seconds"],
        &["pdbmux_membership_refresh_failures_total"],
        &["pdbmux_config_reloads_total", "result"],
        &["process_cpu_seconds_total"],
        &["process_resident_memory_bytes"],
        &["vector($memory_limit)"],
        &["pdbmux_requests_total", "code=~\"5..\"", "by (instance)"],
        &["pdbmux_partial_answers_total", "by (instance)", "route=~"],
        &[
            "pdbmux_request_duration_seconds_bucket",
            "0.99",
            "by (instance, le)",
        ],
        &["pdbmux_upstream_request_duration_seconds_bucket", "0.99"],
    ];
    for parts in coverage {
        check(
            queries
                .iter()
                .any(|(_, q)| parts.iter().all(|part| q.contains(part))),
            format!("no panel queries {parts:?}"),
        );
    }
    problems
}

#[test]
fn the_dashboard_is_a_grafana_model_covering_pdbmux() {
    let problems = dashboard_problems(&dashboard());
    assert!(problems.is_empty(), "pdbmux-dashboard.json: {problems:#?}");
}

/// The checks are not vacuous: each broken copy of the rules and of the dashboard is caught.
#[test]
fn broken_rules_and_dashboards_are_caught() {
    let good = rules_file();
    let breakages: [fn(&mut Value); 5] = [
        |r| r["labels"]["severity"] = Value::from("page"),
        |r| r["annotations"]["description"] = Value::from(" "),
        |r| r["for"] = Value::from("two minutes"),
        |r| r["expr"] = Value::from(""),
        |r| {
            let alert = r["alert"].clone();
            r["record"] = alert;
            r.as_mapping_mut().expect("a rule").remove("alert");
        },
    ];
    for (i, breakage) in breakages.iter().enumerate() {
        let mut broken = good.clone();
        breakage(&mut broken["groups"][0]["rules"][0]);
        assert!(
            !rules_problems(&broken).is_empty(),
            "rule breakage {i} went unnoticed"
        );
    }

    let good = dashboard();
    // Panel 0 is a row, panels 1 and 2 the first two stat panels side by side.
    let breakages: [fn(&mut Json); 8] = [
        |d| d["panels"][1]["id"] = d["panels"][2]["id"].clone(),
        |d| d["panels"][2]["gridPos"] = d["panels"][1]["gridPos"].clone(),
        |d| d["panels"][1]["gridPos"]["x"] = Json::from(20),
        |d| d["panels"][1]["datasource"]["uid"] = Json::from("prometheus"),
        |d| {
            let expr = d["panels"][1]["targets"][0]["expr"].as_str().expect("expr");
            let typo = expr.replace("$instance", "$instnace");
            d["panels"][1]["targets"][0]["expr"] = Json::from(typo);
        },
        |d| d["schemaVersion"] = Json::from(27),
        |d| {
            let list = d["templating"]["list"].as_array_mut().expect("variables");
            list.retain(|v| v["name"] != "backend");
        },
        |d| {
            for panel in d["panels"].as_array_mut().expect("panels") {
                for target in panel["targets"].as_array_mut().into_iter().flatten() {
                    let expr = target["expr"].as_str().unwrap_or_default();
                    target["expr"] = Json::from(expr.replace("pdbmux_backend_owned_nodes", "x"));
                }
            }
        },
    ];
    for (i, breakage) in breakages.iter().enumerate() {
        let mut broken = good.clone();
        breakage(&mut broken);
        assert_ne!(broken, good, "dashboard breakage {i} changed nothing");
        assert!(
            !dashboard_problems(&broken).is_empty(),
            "dashboard breakage {i} went unnoticed"
        );
    }
}

/// No alert annotation (`$labels.x`) or panel legend (`{{x}}`) names a label pdbmux's metrics do
/// not carry: a typo there shows as a blank in every alert or legend, which nothing else catches.
#[test]
fn templates_name_only_labels_pdbmux_metrics_carry() {
    let known: BTreeSet<&str> = [
        "job",
        "instance",
        "route",
        "code",
        "backend",
        "purpose",
        "outcome",
        "state",
        "transition",
        "result",
        "binary",
        "version",
        "op",
    ]
    .into();
    let rules = rules_file();
    let mut used = Vec::new();
    for rule in seq_at(&rules, "groups")
        .iter()
        .flat_map(|g| seq_at(g, "rules"))
    {
        for key in ["summary", "description"] {
            let text = str_at(rule, &format!("annotations.{key}")).unwrap_or_default();
            for piece in text.split("$labels.").skip(1) {
                let label: String = piece
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                used.push((str_at(rule, "alert").unwrap_or_default().to_owned(), label));
            }
        }
    }
    let dashboard = dashboard();
    for panel in dashboard["panels"].as_array().expect("panels") {
        for target in panel["targets"].as_array().into_iter().flatten() {
            let legend = target["legendFormat"].as_str().unwrap_or_default();
            for piece in legend.split("{{").skip(1) {
                let label = piece
                    .split("}}")
                    .next()
                    .unwrap_or_default()
                    .trim()
                    .to_owned();
                used.push((
                    panel["title"].as_str().unwrap_or_default().to_owned(),
                    label,
                ));
            }
        }
    }
    assert!(used.len() >= 10, "too few label references found: {used:?}");
    let unknown: Vec<_> = used
        .iter()
        .filter(|(_, label)| !known.contains(label.as_str()))
        .collect();
    assert!(unknown.is_empty(), "unknown labels: {unknown:?}");
}
