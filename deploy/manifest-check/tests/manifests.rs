//! Checks `deploy/kubernetes/` (issue 9): every file parses; the Deployment runs 2 replicas with
//! httpGet /livez liveness and /readyz readiness probes (they ask no backend), a
//! grace period above the preStop pause plus the shutdown drain (timeout + 5 s), a memory limit
//! above facts_cache_bytes (and room for one maximal fan-out beside a full cache), the ConfigMap
//! mounted at /etc/pdbmux/config.yaml; the Service and PodDisruptionBudget select its pods; the
//! env-var alternative carries the same guarantees with PDBMUX_* variables instead of the file.
//! Metrics: `metrics_listen` (file or env) is on, on port 9180, which the container exposes as
//! `metrics`, the pod template's prometheus.io/* scrape annotations name, and the Service
//! exposes (tests/monitoring.rs checks the ServiceMonitor, rules and dashboard).
//!
//! With `MUX_BIN` set (make deploy-check sets it when dist/pdbmux exists), the ConfigMap's file
//! and the alternative's env vars are also fed to `pdbmux config show`, which must accept them and
//! report the same timeout, facts_cache_bytes, max_body_bytes, merge_memory_bytes and metrics port as read here.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use pdbmux_manifest_check::{
    at, duration_secs, effective, int_at, kubernetes_dir, labels_match, listen_port, load,
    memory_bytes, seq_at, str_at, Effective, DRAIN_GRACE_SECS, KUSTOMIZATION,
};
use serde_norway::Value;

const CONFIG_PATH: &str = "/etc/pdbmux/config.yaml";
/// Liveness must tolerate at least this long of failed probes (a backend outage is no reason to
/// restart pdbmux).
const MIN_LIVENESS_TOLERANCE_SECS: i64 = 120;
/// Where pdbmux serves its own metrics in the manifests (its default `metrics_listen`).
const METRICS_PORT: u16 = 9180;

/// The main directory's documents by kind (each kind once).
fn main_documents() -> BTreeMap<String, Value> {
    let dir = kubernetes_dir();
    let mut by_kind = BTreeMap::new();
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("deploy/kubernetes")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml" || e == "yml"))
        // kustomize's list of them (tests/kustomize.rs), not a manifest.
        .filter(|p| !p.ends_with(KUSTOMIZATION))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no YAML in {}", dir.display());
    for file in files {
        for doc in load(&file).unwrap_or_else(|e| panic!("{e}")) {
            let kind = str_at(&doc, "kind")
                .unwrap_or_else(|| panic!("{}: a document without kind", file.display()))
                .to_string();
            assert!(
                str_at(&doc, "apiVersion").is_some(),
                "{}: {kind} without apiVersion",
                file.display()
            );
            assert!(
                by_kind.insert(kind.clone(), doc).is_none(),
                "two {kind}s in deploy/kubernetes/ (alternatives belong in a subdirectory)"
            );
        }
    }
    by_kind
}

fn the_container(deployment: &Value) -> &Value {
    let containers = seq_at(deployment, "spec.template.spec.containers");
    assert_eq!(containers.len(), 1, "one container expected");
    &containers[0]
}

fn env_of(container: &Value) -> Vec<(String, String)> {
    seq_at(container, "env")
        .iter()
        .filter_map(|e| {
            Some((
                str_at(e, "name")?.to_string(),
                str_at(e, "value")?.to_string(),
            ))
        })
        .collect()
}

/// Where the container sees the config file from `configmap` (None: not mounted).
fn config_file_path(deployment: &Value, configmap: &Value) -> Option<String> {
    let name = str_at(configmap, "metadata.name")?;
    let volume = seq_at(deployment, "spec.template.spec.volumes")
        .iter()
        .find(|v| str_at(v, "configMap.name") == Some(name))?;
    let volume_name = str_at(volume, "name")?;
    let items = seq_at(volume, "configMap.items");
    // the file name the key config.yaml gets inside the volume
    let file = if items.is_empty() {
        "config.yaml"
    } else {
        let item = items
            .iter()
            .find(|i| str_at(i, "key") == Some("config.yaml"))?;
        str_at(item, "path")?
    };
    let mount = seq_at(the_container(deployment), "volumeMounts")
        .iter()
        .find(|m| str_at(m, "name") == Some(volume_name))?;
    let mount_path = str_at(mount, "mountPath")?.trim_end_matches('/');
    Some(match str_at(mount, "subPath") {
        Some(sub) if sub == file => mount_path.to_string(),
        Some(_) => return None,
        None => format!("{mount_path}/{file}"),
    })
}

/// Everything wrong with a pdbmux Deployment; `config` is the mounted file's content, if any.
fn deployment_problems(deployment: &Value, config: Option<&Value>) -> Vec<String> {
    let mut problems = Vec::new();
    let mut check = |ok: bool, what: String| {
        if !ok {
            problems.push(what);
        }
    };
    check(
        str_at(deployment, "kind") == Some("Deployment"),
        "not a Deployment".into(),
    );
    check(
        int_at(deployment, "spec.replicas") == Some(2),
        format!(
            "spec.replicas is {:?}, want 2",
            at(deployment, "spec.replicas")
        ),
    );
    check(
        labels_match(
            at(deployment, "spec.selector.matchLabels"),
            at(deployment, "spec.template.metadata.labels"),
        ),
        "spec.selector.matchLabels does not select the pod template's labels".into(),
    );
    // The replicas spread over nodes: one node's loss leaves the other serving.
    let spread = at(deployment, "spec.template.spec.topologySpreadConstraints")
        .and_then(Value::as_sequence)
        .and_then(|constraints| constraints.first());
    check(
        spread.is_some_and(|constraint| {
            str_at(constraint, "topologyKey") == Some("kubernetes.io/hostname")
                && int_at(constraint, "maxSkew") == Some(1)
                && labels_match(
                    at(constraint, "labelSelector.matchLabels"),
                    at(deployment, "spec.template.metadata.labels"),
                )
        }),
        "spec.template.spec.topologySpreadConstraints should spread the pods over hosts \
         (kubernetes.io/hostname, maxSkew 1, selecting the pod labels)"
            .into(),
    );
    let container = the_container(deployment);
    let env = env_of(container);
    let settings = match effective(config, &env) {
        Ok(s) => s,
        Err(e) => {
            problems.push(format!("pdbmux settings: {e}"));
            return problems;
        }
    };
    check(
        settings.backends > 0,
        "no backends configured (file or PDBMUX_BACKENDS)".into(),
    );
    check(
        str_at(container, "image").is_some_and(|i| !i.is_empty()),
        "no image".into(),
    );
    check(
        at(container, "command").is_none(),
        "command set: the image's entrypoint is the binary".into(),
    );
    let http_port = seq_at(container, "ports")
        .iter()
        .find(|p| str_at(p, "name") == Some("http"));
    check(
        http_port.and_then(|p| int_at(p, "containerPort")) == Some(8080),
        "no container port named http on 8080".into(),
    );

    // Probes: httpGet (no shell in the image) on the two paths that ask no backend, so a
    // backend outage neither empties the Service nor restarts the replicas, and a hanging
    // backend cannot make a probe time out (/healthz, which asks every backend, is for people).
    for (probe, path) in [("readinessProbe", "/readyz"), ("livenessProbe", "/livez")] {
        let Some(p) = at(container, probe) else {
            check(false, format!("no {probe}"));
            continue;
        };
        check(
            str_at(p, "httpGet.path") == Some(path),
            format!("{probe}: httpGet.path is not {path}"),
        );
        let port = at(p, "httpGet.port");
        check(
            port.and_then(Value::as_str) == Some("http")
                || port.and_then(Value::as_i64) == Some(8080),
            format!("{probe}: httpGet.port is not http/8080"),
        );
        check(
            at(p, "exec").is_none(),
            format!("{probe}: exec needs a shell"),
        );
    }
    if let Some(p) = at(container, "livenessProbe") {
        let tolerance =
            int_at(p, "periodSeconds").unwrap_or(10) * int_at(p, "failureThreshold").unwrap_or(3);
        check(
            tolerance >= MIN_LIVENESS_TOLERANCE_SECS,
            format!("livenessProbe restarts after {tolerance}s of failures: a backend outage would restart every replica (want >= {MIN_LIVENESS_TOLERANCE_SECS}s)"),
        );
    }

    // Shutdown: preStop pause + drain (timeout + 5 s) within the grace period.
    check(
        at(container, "lifecycle.preStop.exec").is_none(),
        "preStop exec needs a shell".into(),
    );
    let pause = int_at(container, "lifecycle.preStop.sleep.seconds").unwrap_or(0) as f64;
    let grace = int_at(
        deployment,
        "spec.template.spec.terminationGracePeriodSeconds",
    )
    .unwrap_or(30);
    let needed = pause + settings.timeout_secs + DRAIN_GRACE_SECS;
    check(
        grace as f64 > needed,
        format!("terminationGracePeriodSeconds {grace} is not above preStop {pause}s + timeout {}s + {DRAIN_GRACE_SECS}s", settings.timeout_secs),
    );

    // Memory: the process, a full cache with its huge-page padding, and every merge in flight
    // at its peak of 4 times the answer bytes it holds (docs/operating.md, "Memory").
    match str_at(container, "resources.limits.memory").map(memory_bytes) {
        Some(Ok(limit)) => {
            let Effective {
                facts_cache_bytes,
                merge_memory_bytes,
                ..
            } = settings;
            check(
                limit > facts_cache_bytes,
                format!("memory limit {limit} is not above facts_cache_bytes {facts_cache_bytes}"),
            );
            let peak = (20 << 20) + facts_cache_bytes / 4 * 5 + merge_memory_bytes * 4;
            check(
                limit >= peak,
                format!("memory limit {limit} does not fit 20 MiB + 1.25 x facts_cache_bytes + 4 x merge_memory_bytes = {peak}"),
            );
            match str_at(container, "resources.requests.memory").map(memory_bytes) {
                Some(Ok(request)) => check(
                    request <= limit && request > facts_cache_bytes,
                    format!("memory request {request} should be above facts_cache_bytes and at most the limit"),
                ),
                _ => check(false, "no memory request".into()),
            }
        }
        Some(Err(e)) => check(false, e),
        None => check(false, "no memory limit".into()),
    }

    // Non-root (the image's USER is 65532; say so to the kubelet too).
    let pod_sc = at(deployment, "spec.template.spec.securityContext");
    let sc = |key: &str| {
        at(container, &format!("securityContext.{key}")).or_else(|| pod_sc.and_then(|s| s.get(key)))
    };
    check(
        sc("runAsNonRoot").and_then(Value::as_bool) == Some(true),
        "runAsNonRoot is not true".into(),
    );
    check(
        sc("runAsUser")
            .and_then(Value::as_i64)
            .is_some_and(|u| u != 0),
        "runAsUser is not a non-root uid".into(),
    );
    problems.extend(metrics_problems(deployment, &settings.metrics_listen));
    problems
}

/// Everything wrong with how a pdbmux Deployment exposes its metrics, `metrics_listen` being the
/// effective setting: on, on [`METRICS_PORT`], which the container port `metrics` and the pod
/// template's scrape annotations name too (a Prometheus scraping another port finds nothing).
fn metrics_problems(deployment: &Value, metrics_listen: &str) -> Vec<String> {
    let mut problems = Vec::new();
    let mut check = |ok: bool, what: String| {
        if !ok {
            problems.push(what);
        }
    };
    check(
        listen_port(metrics_listen) == Some(METRICS_PORT),
        format!("metrics_listen is {metrics_listen:?}, want port {METRICS_PORT}"),
    );
    let port = seq_at(the_container(deployment), "ports")
        .iter()
        .find(|p| str_at(p, "name") == Some("metrics"));
    check(
        port.and_then(|p| int_at(p, "containerPort")) == Some(METRICS_PORT.into()),
        format!("no container port named metrics on {METRICS_PORT}"),
    );
    // Annotation keys hold dots, so they are looked up by hand; values must be strings.
    let annotation = |key: &str| {
        at(deployment, "spec.template.metadata.annotations")
            .and_then(|a| a.get(key))
            .and_then(Value::as_str)
    };
    let metrics_port = METRICS_PORT.to_string();
    for (key, want) in [
        ("prometheus.io/scrape", "true"),
        ("prometheus.io/port", metrics_port.as_str()),
        ("prometheus.io/path", "/metrics"),
    ] {
        check(
            annotation(key) == Some(want),
            format!(
                "pod annotation {key} is {:?}, want {want:?}",
                annotation(key)
            ),
        );
    }
    problems
}

/// The ConfigMap's `config.yaml` text (a dotted path cannot name that key).
fn configmap_text(configmap: &Value) -> &str {
    at(configmap, "data")
        .and_then(|d| d.get("config.yaml"))
        .and_then(Value::as_str)
        .expect("ConfigMap data[config.yaml]")
}

fn configmap_file(configmap: &Value) -> Value {
    serde_norway::from_str(configmap_text(configmap)).expect("ConfigMap config.yaml parses")
}

/// The NetworkPolicy selects pdbmux's pods, governs both directions, lets clients reach the
/// `http` port and Prometheus the `metrics` port, and lets pdbmux resolve names, reach PuppetDB
/// (8080, 8081) and the shared cache (6379): every port the pods use, and only those.
fn network_policy_fits(policy: &Value, pod_labels: Option<&Value>) {
    assert!(labels_match(
        at(policy, "spec.podSelector.matchLabels"),
        pod_labels
    ));
    let types: Vec<&str> = seq_at(policy, "spec.policyTypes")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(types, ["Ingress", "Egress"]);
    let ports = |direction: &str| -> Vec<String> {
        seq_at(policy, &format!("spec.{direction}"))
            .iter()
            .flat_map(|rule| seq_at(rule, "ports"))
            .map(|p| {
                str_at(p, "port")
                    .map_or_else(|| int_at(p, "port").unwrap_or(0).to_string(), str::to_owned)
            })
            .collect()
    };
    assert_eq!(ports("ingress"), ["http", "metrics"]);
    let mut egress = ports("egress");
    egress.dedup();
    assert_eq!(egress, ["53", "8080", "8081", "6379"]);
}

#[test]
fn main_manifests() {
    let docs = main_documents();
    let kinds: Vec<_> = docs.keys().map(String::as_str).collect();
    assert_eq!(
        kinds,
        [
            "ConfigMap",
            "Deployment",
            "NetworkPolicy",
            "PodDisruptionBudget",
            "Service",
            "ServiceAccount"
        ]
    );
    let deployment = &docs["Deployment"];
    let configmap = &docs["ConfigMap"];
    let config = configmap_file(configmap);

    let problems = deployment_problems(deployment, Some(&config));
    assert!(problems.is_empty(), "deployment.yaml: {problems:#?}");

    // The ConfigMap's file is where pdbmux looks by default, and no env var points elsewhere.
    assert_eq!(
        config_file_path(deployment, configmap).as_deref(),
        Some(CONFIG_PATH),
        "the ConfigMap's config.yaml must appear as {CONFIG_PATH}"
    );
    let env = env_of(the_container(deployment));
    assert!(
        env.iter()
            .all(|(k, v)| k != "PDBMUX_CONFIG" || v == CONFIG_PATH),
        "PDBMUX_CONFIG points away from the mounted file"
    );
    assert!(
        config.get("metrics_listen").is_some(),
        "the ConfigMap sets metrics_listen explicitly, next to the port it must match"
    );
    let backends = seq_at(&config, "backends");
    assert!(
        !backends.is_empty(),
        "the ConfigMap's file names no backend"
    );
    for b in backends {
        assert!(
            str_at(b, "name").is_some() && str_at(b, "url").is_some(),
            "backend without name/url: {b:?}"
        );
    }

    // The Service and the PodDisruptionBudget select the pods; the Service reaches port http,
    // and port metrics for a ServiceMonitor.
    let pod_labels = at(deployment, "spec.template.metadata.labels");
    let service = &docs["Service"];
    assert!(labels_match(at(service, "spec.selector"), pod_labels));
    let service_port = |name: &str| {
        seq_at(service, "spec.ports")
            .iter()
            .find(|p| str_at(p, "name") == Some(name))
            .unwrap_or_else(|| panic!("the Service has no port named {name}"))
    };
    let port = service_port("http");
    assert!(str_at(port, "targetPort") == Some("http") || int_at(port, "targetPort") == Some(8080));
    let port = service_port("metrics");
    assert_eq!(int_at(port, "port"), Some(METRICS_PORT.into()));
    assert!(
        str_at(port, "targetPort") == Some("metrics")
            || int_at(port, "targetPort") == Some(METRICS_PORT.into()),
        "the Service's metrics port must reach the container port metrics"
    );
    // The pods run as the ServiceAccount of their own, which mounts no token.
    let account = &docs["ServiceAccount"];
    assert_eq!(
        str_at(deployment, "spec.template.spec.serviceAccountName"),
        str_at(account, "metadata.name"),
        "the pods run as serviceaccount.yaml's account"
    );
    assert_eq!(
        at(account, "automountServiceAccountToken").and_then(Value::as_bool),
        Some(false)
    );
    assert_eq!(
        at(
            deployment,
            "spec.template.spec.automountServiceAccountToken"
        )
        .and_then(Value::as_bool),
        Some(false)
    );
    network_policy_fits(&docs["NetworkPolicy"], pod_labels);

    let pdb = &docs["PodDisruptionBudget"];
    assert!(labels_match(
        at(pdb, "spec.selector.matchLabels"),
        pod_labels
    ));
    assert!(
        int_at(pdb, "spec.maxUnavailable") == Some(1)
            || int_at(pdb, "spec.minAvailable") == Some(1),
        "with 2 replicas the PodDisruptionBudget should keep one up"
    );
}

#[test]
fn env_alternative() {
    let path = kubernetes_dir().join("alternatives/deployment-env.yaml");
    let docs = load(&path).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(docs.len(), 1, "{}: one Deployment", path.display());
    let deployment = &docs[0];
    let problems = deployment_problems(deployment, None);
    assert!(problems.is_empty(), "deployment-env.yaml: {problems:#?}");
    let env = env_of(the_container(deployment));
    assert!(env.iter().any(|(k, _)| k == "PDBMUX_BACKENDS"));
    // The default would do; set explicitly, it stays in step with the port when either changes.
    assert!(env.iter().any(|(k, _)| k == "PDBMUX_METRICS_LISTEN"));
    assert!(
        seq_at(deployment, "spec.template.spec.volumes").is_empty(),
        "the env-var alternative mounts no config file"
    );
    // Same name as the main Deployment: one replaces the other.
    let main = &main_documents()["Deployment"];
    assert_eq!(
        str_at(deployment, "metadata.name"),
        str_at(main, "metadata.name")
    );
}

/// The checks are not vacuous: each broken copy of the main Deployment is caught.
#[test]
fn broken_deployments_are_caught() {
    let docs = main_documents();
    let config = configmap_file(&docs["ConfigMap"]);
    let good = docs["Deployment"].clone();
    let container = "spec.template.spec.containers.0";
    let cases: &[(&str, &str, Value)] = &[
        ("spec", "replicas", Value::from(1)),
        (
            "spec.template.spec.topologySpreadConstraints.0",
            "topologyKey",
            Value::from("topology.kubernetes.io/zone-typo"),
        ),
        (
            "spec.template.spec",
            "terminationGracePeriodSeconds",
            Value::from(15),
        ),
        (
            &format!("{container}.readinessProbe.httpGet"),
            "path",
            Value::from("/healthz"),
        ),
        (
            &format!("{container}.livenessProbe"),
            "failureThreshold",
            Value::from(1),
        ),
        (
            &format!("{container}.livenessProbe.httpGet"),
            "path",
            Value::from("/"),
        ),
        (
            &format!("{container}.resources.limits"),
            "memory",
            Value::from("64Mi"),
        ),
        (
            &format!("{container}.resources.limits"),
            "memory",
            Value::from("300Mi"),
        ),
        (
            &format!("{container}.securityContext"),
            "runAsUser",
            Value::from(0),
        ),
        (
            &format!("{container}.ports.1"),
            "containerPort",
            Value::from(9190),
        ),
        (&format!("{container}.ports.1"), "name", Value::from("prom")),
        (
            "spec.template.metadata.annotations",
            "prometheus.io/port",
            Value::from("8080"),
        ),
        (
            "spec.template.metadata.annotations",
            "prometheus.io/port",
            Value::from(9180),
        ),
        (
            "spec.template.metadata.annotations",
            "prometheus.io/scrape",
            Value::from("false"),
        ),
        (
            "spec.template.metadata.annotations",
            "prometheus.io/path",
            Value::from("/"),
        ),
    ];
    for (parent, key, value) in cases {
        let mut broken = good.clone();
        let mut node = &mut broken;
        for part in parent.split('.') {
            node = match part.parse::<usize>() {
                Ok(i) => &mut node[i],
                Err(_) => &mut node[part],
            };
        }
        node[*key] = value.clone();
        let problems = deployment_problems(&broken, Some(&config));
        assert!(
            !problems.is_empty(),
            "{parent}.{key} = {value:?} went unnoticed"
        );
    }
    // A longer timeout in the file needs a longer grace period (the drain waits that long).
    let mut slow = config.clone();
    slow["timeout"] = Value::from("30s");
    assert_eq!(deployment_problems(&good, Some(&slow)).len(), 1);
    // metrics_listen off, or on a port nothing scrapes.
    for listen in ["", ":9999"] {
        let mut moved = config.clone();
        moved["metrics_listen"] = Value::from(listen);
        assert_eq!(
            deployment_problems(&good, Some(&moved)).len(),
            1,
            "metrics_listen {listen:?}"
        );
    }
    // The mount path is checked too.
    let mut moved = good.clone();
    moved["spec"]["template"]["spec"]["containers"][0]["volumeMounts"][0]["mountPath"] =
        Value::from("/config");
    assert_ne!(
        config_file_path(&moved, &docs["ConfigMap"]).as_deref(),
        Some(CONFIG_PATH)
    );
}

/// `pdbmux config show` accepts the ConfigMap's file and the alternative's env vars and reports
/// the values the manifests are sized from. Skipped unless MUX_BIN names a pdbmux binary.
#[test]
fn pdbmux_accepts_the_config() {
    let Some(bin) = std::env::var_os("MUX_BIN").filter(|b| !b.is_empty()) else {
        eprintln!("MUX_BIN not set: not running pdbmux config show");
        return;
    };
    let docs = main_documents();
    let config = configmap_file(&docs["ConfigMap"]);
    let dir = std::env::temp_dir().join(format!("pdbmux-manifest-check-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let file = dir.join("config.yaml");
    std::fs::write(&file, configmap_text(&docs["ConfigMap"])).expect("write config");

    let from_file = config_show(
        Path::new(&bin),
        &["--config", file.to_str().expect("utf-8")],
        &[],
    );
    let want = effective(Some(&config), &[]).expect("effective");
    compare(&from_file, &want, "ConfigMap config.yaml");

    let alternative = load(&kubernetes_dir().join("alternatives/deployment-env.yaml"))
        .expect("deployment-env.yaml")
        .remove(0);
    let env = env_of(the_container(&alternative));
    let from_env = config_show(Path::new(&bin), &[], &env);
    let want = effective(None, &env).expect("effective");
    compare(&from_env, &want, "deployment-env.yaml env");
    let _ = std::fs::remove_dir_all(&dir);
}

fn config_show(bin: &Path, args: &[&str], env: &[(String, String)]) -> BTreeMap<String, String> {
    let home = std::env::temp_dir().join("pdbmux-manifest-check-home");
    let output = Command::new(bin)
        .args(args)
        .args(["config", "show"])
        .env_clear()
        .env("HOME", &home)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .output()
        .expect("run pdbmux");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "pdbmux config show {args:?} failed: {}{stdout}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
        .lines()
        .filter_map(|l| {
            let (key, rest) = l.split_once(" : ")?;
            let value = rest.split("  (").next()?.trim();
            Some((key.trim().to_string(), value.to_string()))
        })
        .collect()
}

fn compare(shown: &BTreeMap<String, String>, want: &Effective, what: &str) {
    let timeout = duration_secs(&shown["timeout"]).expect("timeout shown");
    assert_eq!(timeout, want.timeout_secs, "{what}: timeout");
    assert_eq!(
        shown["facts_cache_bytes"],
        want.facts_cache_bytes.to_string(),
        "{what}: facts_cache_bytes"
    );
    assert_eq!(
        shown["max_body_bytes"],
        want.max_body_bytes.to_string(),
        "{what}: max_body_bytes"
    );
    assert_eq!(
        shown["merge_memory_bytes"],
        want.merge_memory_bytes.to_string(),
        "{what}: merge_memory_bytes"
    );
    let backends = shown.keys().filter(|k| k.starts_with("backends[")).count();
    assert_eq!(backends, want.backends, "{what}: backends");
    // `:9180` is shown as 0.0.0.0:9180, so the ports are compared.
    assert_eq!(
        listen_port(&shown["metrics_listen"]),
        listen_port(&want.metrics_listen),
        "{what}: metrics_listen"
    );
}
