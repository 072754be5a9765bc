//! Checks `alternatives/redis.yaml`, the optional shared cache (docs/caching.md): a Deployment
//! and a Service that selects it by its labels and reaches its named `redis` port, under the name
//! and port the comment's `cache_redis_url` uses, in memory only, non-root, asking for the
//! password pdbmux is told to read (`cache_redis_password_file`), with a disruption budget that
//! selects its pod.

use pdbmux_manifest_check::{at, int_at, kubernetes_dir, labels_match, load, seq_at, str_at};

#[test]
fn the_shared_cache_example_is_a_service_over_an_in_memory_valkey() {
    let path = kubernetes_dir().join("alternatives/redis.yaml");
    let docs = load(&path).unwrap_or_else(|e| panic!("{e}"));
    let of_kind = |kind: &str| {
        docs.iter()
            .find(|doc| str_at(doc, "kind") == Some(kind))
            .unwrap_or_else(|| panic!("{}: a {kind}", path.display()))
    };
    let (deployment, service) = (of_kind("Deployment"), of_kind("Service"));
    assert!(labels_match(
        at(service, "spec.selector"),
        at(deployment, "spec.template.metadata.labels")
    ));
    let budget = of_kind("PodDisruptionBudget");
    assert!(labels_match(
        at(budget, "spec.selector.matchLabels"),
        at(deployment, "spec.template.metadata.labels")
    ));
    let container = &seq_at(deployment, "spec.template.spec.containers")[0];
    let port = seq_at(container, "ports")
        .iter()
        .find(|p| str_at(p, "name") == Some("redis"))
        .expect("a container port named redis");
    let service_port = &seq_at(service, "spec.ports")[0];
    assert_eq!(str_at(service_port, "targetPort"), Some("redis"));
    assert_eq!(int_at(service_port, "port"), int_at(port, "containerPort"));
    let name = str_at(service, "metadata.name").expect("a name");
    let text = std::fs::read_to_string(&path).expect("read");
    let url = format!(
        "cache_redis_url: redis://{name}:{}",
        int_at(service_port, "port").unwrap_or(0)
    );
    assert!(text.contains(&url), "the comment names {url}");
    let args: Vec<&str> = seq_at(container, "args")
        .iter()
        .filter_map(|a| a.as_str())
        .collect();
    for wanted in [
        ["--requirepass", "$(VALKEY_PASSWORD)"],
        ["--save", ""],
        ["--appendonly", "no"],
        ["--maxmemory-policy", "allkeys-lru"],
    ] {
        assert!(
            args.windows(2).any(|w| w == wanted),
            "{wanted:?} in {args:?}"
        );
    }
    // The password comes from the Secret pdbmux mounts, and pdbmux is told where to read it.
    let password = seq_at(container, "env")
        .iter()
        .find(|e| str_at(e, "name") == Some("VALKEY_PASSWORD"))
        .expect("VALKEY_PASSWORD from a Secret");
    assert_eq!(
        str_at(password, "valueFrom.secretKeyRef.name"),
        Some("pdbmux-cache-key")
    );
    assert!(
        text.contains("cache_redis_password_file: /etc/pdbmux-cache/password"),
        "the comment tells pdbmux where the password is"
    );
    assert_eq!(
        at(
            deployment,
            "spec.template.spec.securityContext.runAsNonRoot"
        )
        .and_then(|v| v.as_bool()),
        Some(true)
    );
}
