//! Checks the kustomize forms of the manifests: `deploy/kubernetes/kustomization.yaml` (the base,
//! `kubectl apply -k deploy/kubernetes`) lists every manifest of that directory and nothing else;
//! `deploy/overlays/example/` (one site's overlay) renders, with `kubectl kustomize` where kubectl
//! is installed, to the base's objects with the overlay's image, the base's ConfigMap replaced by
//! one generated from the overlay's `config.yaml` under a name that changes with its content (so
//! a configuration change rolls the pods out), and the Deployment mounting that one. Without
//! kubectl the overlay's files are checked as written. With `MUX_BIN`, `pdbmux config show`
//! accepts the overlay's config.yaml.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

use pdbmux_manifest_check::{
    example_overlay_dir, kubernetes_dir, load, parse_documents, seq_at, str_at, KUSTOMIZATION,
};
use serde_norway::Value;

fn strings(value: &[Value]) -> Vec<String> {
    value
        .iter()
        .filter_map(Value::as_str)
        .map(str::to_owned)
        .collect()
}

#[test]
fn the_base_lists_every_manifest() {
    let dir = kubernetes_dir();
    let base = load(&dir.join(KUSTOMIZATION)).expect("the base").remove(0);
    let listed: BTreeSet<String> = strings(seq_at(&base, "resources")).into_iter().collect();
    let present: BTreeSet<String> = std::fs::read_dir(&dir)
        .expect("deploy/kubernetes")
        .map(|e| {
            e.expect("an entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .filter(|name| name.ends_with(".yaml") && name != KUSTOMIZATION)
        .collect();
    assert_eq!(
        listed, present,
        "deploy/kubernetes/kustomization.yaml must list every manifest beside it"
    );
}

/// The overlay's parts as written: its base, its image, its generated ConfigMap's file.
struct Overlay {
    image: String,
    config_name: String,
    config_text: String,
}

fn overlay() -> Overlay {
    let dir = example_overlay_dir();
    let kustomization = load(&dir.join(KUSTOMIZATION))
        .expect("the overlay")
        .remove(0);
    assert_eq!(
        strings(seq_at(&kustomization, "resources")),
        ["../../kubernetes"],
        "the overlay builds on deploy/kubernetes"
    );
    let image = &seq_at(&kustomization, "images")[0];
    let base_image =
        load(&kubernetes_dir().join("deployment.yaml")).expect("the Deployment")[0].clone();
    let base_image = str_at(&base_image, "spec.template.spec.containers.0.image")
        .expect("the base's image")
        .to_owned();
    assert_eq!(
        Some(base_image.split(':').next().unwrap_or_default()),
        str_at(image, "name"),
        "the overlay's images entry names the base's image"
    );
    let generator = &seq_at(&kustomization, "configMapGenerator")[0];
    let files = strings(seq_at(generator, "files"));
    assert_eq!(files, ["config.yaml"]);
    let config_text = std::fs::read_to_string(dir.join("config.yaml")).expect("config.yaml");
    let config = parse_documents(&config_text)
        .expect("config.yaml parses")
        .remove(0);
    assert!(
        !seq_at(&config, "backends").is_empty(),
        "the overlay's config.yaml names the backends"
    );
    Overlay {
        image: format!(
            "{}:{}",
            str_at(image, "newName").expect("newName"),
            str_at(image, "newTag").expect("newTag")
        ),
        config_name: str_at(generator, "name").expect("a name").to_owned(),
        config_text,
    }
}

/// `kubectl kustomize dir`, parsed; `None` without kubectl.
fn render(dir: &Path) -> Option<Vec<Value>> {
    let output = Command::new("kubectl")
        .arg("kustomize")
        .arg(dir)
        .output()
        .ok()?;
    assert!(
        output.status.success(),
        "kubectl kustomize {}: {}",
        dir.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    Some(parse_documents(&String::from_utf8_lossy(&output.stdout)).expect("its output parses"))
}

fn of_kind<'a>(docs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    docs.iter()
        .filter(|d| str_at(d, "kind") == Some(kind))
        .collect()
}

/// The rendered ConfigMap's name (hashed), checking the rest of the rendering on the way.
fn check_rendering(docs: &[Value], overlay: &Overlay) -> String {
    let base = render(&kubernetes_dir()).expect("kubectl renders the base");
    let kinds = |docs: &[Value]| -> BTreeSet<String> {
        docs.iter()
            .filter_map(|d| str_at(d, "kind"))
            .map(str::to_owned)
            .collect()
    };
    assert_eq!(
        kinds(docs),
        kinds(&base),
        "the overlay renders the base's kinds"
    );
    let configmaps = of_kind(docs, "ConfigMap");
    assert_eq!(configmaps.len(), 1, "one ConfigMap: the base's is replaced");
    let name = str_at(configmaps[0], "metadata.name").expect("its name");
    let prefix = format!("{}-", overlay.config_name);
    assert!(
        name.starts_with(&prefix) && name.len() > prefix.len(),
        "the generated ConfigMap's name carries its content's hash: {name}"
    );
    assert_eq!(
        // (a dotted path would split the key)
        configmaps[0]
            .get("data")
            .and_then(|data| data.get("config.yaml"))
            .and_then(Value::as_str),
        Some(overlay.config_text.as_str()),
        "the ConfigMap holds the overlay's config.yaml"
    );
    let deployment = of_kind(docs, "Deployment")[0];
    assert_eq!(
        str_at(deployment, "spec.template.spec.containers.0.image"),
        Some(overlay.image.as_str())
    );
    let mounted: Vec<&str> = seq_at(deployment, "spec.template.spec.volumes")
        .iter()
        .filter_map(|v| str_at(v, "configMap.name"))
        .collect();
    assert_eq!(
        mounted,
        [name],
        "the Deployment mounts the generated ConfigMap"
    );
    name.to_owned()
}

#[test]
fn the_example_overlay_sets_the_image_and_rolls_out_on_a_config_change() {
    let overlay = overlay();
    let dir = example_overlay_dir();
    let Some(docs) = render(&dir) else {
        eprintln!("kubectl not installed: the overlay checked as written, not rendered");
        return;
    };
    let name = check_rendering(&docs, &overlay);
    // Another config.yaml, another name: the Deployment changes, the pods roll out.
    let copy = std::env::temp_dir().join(format!("pdbmux-overlay-{}", std::process::id()));
    let site = copy.join("overlays").join("example");
    std::fs::create_dir_all(&site).expect("a copy");
    std::fs::create_dir_all(copy.join("kubernetes")).expect("a copy of the base");
    for entry in std::fs::read_dir(kubernetes_dir()).expect("the base") {
        let path = entry.expect("an entry").path();
        if path.is_file() {
            std::fs::copy(
                &path,
                copy.join("kubernetes")
                    .join(path.file_name().expect("a name")),
            )
            .expect("copy a manifest");
        }
    }
    std::fs::copy(dir.join(KUSTOMIZATION), site.join(KUSTOMIZATION)).expect("copy");
    let changed = overlay.config_text.replace("timeout: 10s", "timeout: 20s");
    assert_ne!(
        changed, overlay.config_text,
        "config.yaml sets timeout: 10s"
    );
    std::fs::write(site.join("config.yaml"), &changed).expect("write");
    let again = render(&site).expect("rendered");
    let renamed = check_rendering(
        &again,
        &Overlay {
            config_text: changed,
            ..overlay
        },
    );
    assert_ne!(renamed, name, "a changed config.yaml renames the ConfigMap");
    let _ = std::fs::remove_dir_all(&copy);
}

#[test]
fn pdbmux_accepts_the_overlays_config() {
    let Some(bin) = std::env::var_os("MUX_BIN").filter(|b| !b.is_empty()) else {
        eprintln!("MUX_BIN not set: not running pdbmux config show");
        return;
    };
    let file = example_overlay_dir().join("config.yaml");
    let home = std::env::temp_dir().join("pdbmux-manifest-check-home");
    let output = Command::new(bin)
        .args(["--config", file.to_str().expect("utf-8"), "config", "show"])
        .env_clear()
        .env("HOME", &home)
        .output()
        .expect("run pdbmux");
    assert!(
        output.status.success(),
        "pdbmux config show rejects the overlay's config.yaml: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}
