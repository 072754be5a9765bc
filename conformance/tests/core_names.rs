//! No two types in the core share a name: a reader who meets `Asked` or `Verdict` should find
//! one definition (`make lint` runs this). Top-level `struct`, `enum`, `type` and `trait` items
//! of `core/src` are read; associated types and items inside functions are not.

mod common;

use std::collections::BTreeMap;

/// The name a top-level type item declares on this line, if it declares one.
fn declared(line: &str) -> Option<&str> {
    let rest = ["pub(crate) ", "pub(super) ", "pub "]
        .iter()
        .find_map(|vis| line.strip_prefix(vis))
        .unwrap_or(line);
    let rest = ["struct ", "enum ", "type ", "trait "]
        .iter()
        .find_map(|kind| rest.strip_prefix(kind))?;
    let end = rest
        .find(|c: char| !(c.is_alphanumeric() || c == '_'))
        .unwrap_or(rest.len());
    Some(&rest[..end])
}

#[test]
fn every_type_name_in_the_core_is_unique() {
    let (root, all) = common::core_sources();
    let mut seen: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for path in &all {
        let text = std::fs::read_to_string(path).expect("a source file");
        for (number, line) in text.lines().enumerate() {
            if let Some(name) = declared(line) {
                let at = format!(
                    "{}:{}",
                    path.strip_prefix(&root).unwrap_or(path).display(),
                    number + 1
                );
                seen.entry(name.to_owned()).or_default().push(at);
            }
        }
    }
    assert!(
        seen.len() > 100,
        "only {} types found: is the scan broken?",
        seen.len()
    );
    let twins: Vec<String> = seen
        .iter()
        .filter(|(_, places)| places.len() > 1)
        .map(|(name, places)| format!("{name}: {}", places.join(", ")))
        .collect();
    assert!(
        twins.is_empty(),
        "types declared twice in core/src:\n{}",
        twins.join("\n")
    );
}
