//! The docs' lists of the keys a reload does not apply ("take a restart") against
//! [`restart_keys`]: README.md, docs/operating.md ("Reload") and deploy/kubernetes/README.md (a
//! sentence and its table's row) name them, and a key added to either class must not leave them
//! behind.

use super::restart_keys;

/// The `backticked` names of the first sentence (or table cell) of `text` that says `says`.
fn named_in_sentence<'a>(text: &'a str, says: &str) -> Vec<&'a str> {
    let at = text
        .find(says)
        .unwrap_or_else(|| panic!("no sentence says {says:?}"));
    let start = text[..at].rfind(['.', '|']).map_or(0, |i| i + 1);
    text[start..at].split('`').skip(1).step_by(2).collect()
}

/// The docs' sentence names exactly the keys that take a restart.
fn check(doc: &str, text: &str, says: &str) {
    let mut named = named_in_sentence(text, says);
    let mut keys = restart_keys();
    named.sort_unstable();
    keys.sort_unstable();
    assert_eq!(
        named, keys,
        "{doc}'s sentence ending {says:?} must name exactly the keys a reload leaves (left: the \
         doc's, right: the keys')"
    );
}

#[test]
fn operating_md_names_every_key_that_takes_a_restart() {
    check(
        "docs/operating.md",
        include_str!("../../../docs/operating.md"),
        "take a\n  restart",
    );
}

#[test]
fn the_kubernetes_readme_names_every_key_that_takes_a_restart() {
    check(
        "deploy/kubernetes/README.md",
        include_str!("../../../deploy/kubernetes/README.md"),
        "need a restart",
    );
}

#[test]
fn the_readme_names_every_key_that_takes_a_restart() {
    check(
        "README.md",
        include_str!("../../../README.md"),
        "take a restart",
    );
}

#[test]
fn the_kubernetes_readmes_table_names_every_key_that_takes_a_restart() {
    check(
        "deploy/kubernetes/README.md",
        include_str!("../../../deploy/kubernetes/README.md"),
        " in the ConfigMap | `kubectl rollout restart",
    );
}
