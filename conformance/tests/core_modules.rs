//! No import cycle among the core's modules (`make lint` runs this): each top-level module of
//! `core/src` (a file, or a folder with its `mod.rs`) may use the ones below it, never one that
//! uses it back, so each can be read and tested from the bottom up. A module's uses are the
//! `crate::<module>` paths in its code, comments and `#[cfg(test)]` parts left out.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The top-level module a file belongs to (`None`: the crate root).
fn module_of(root: &Path, path: &Path) -> Option<String> {
    let first = path.strip_prefix(root).ok()?.components().next()?;
    let name = first.as_os_str().to_str()?.trim_end_matches(".rs");
    (name != "lib").then(|| name.to_owned())
}

/// The modules `text` names as `crate::<module>` or inside `crate::{...}`, outside comments and
/// the test module.
fn uses(text: &str) -> BTreeSet<String> {
    let code: Vec<&str> = text
        .split("#[cfg(test)]")
        .next()
        .unwrap_or_default()
        .lines()
        .filter(|line| !line.trim_start().starts_with("//"))
        .collect();
    let code = code.join("\n");
    let mut used = BTreeSet::new();
    for (at, _) in code.match_indices("crate::") {
        let rest = &code[at + "crate::".len()..];
        let names: Vec<&str> = match rest.strip_prefix('{') {
            Some(group) => group
                .split('}')
                .next()
                .unwrap_or_default()
                .split(',')
                .collect(),
            None => vec![rest],
        };
        for name in names {
            let name: String = name
                .trim()
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
                .collect();
            if !name.is_empty() {
                used.insert(name);
            }
        }
    }
    used
}

/// A cycle through `graph` as a path of modules, if there is one.
fn cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        module: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(start) = path.iter().position(|m| m == module) {
            let mut found = path[start..].to_vec();
            found.push(module.to_owned());
            return Some(found);
        }
        if done.contains(module) {
            return None;
        }
        path.push(module.to_owned());
        for next in graph.get(module).into_iter().flatten() {
            if let Some(found) = visit(next, graph, path, done) {
                return Some(found);
            }
        }
        path.pop();
        done.insert(module.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|module| visit(module, graph, &mut Vec::new(), &mut done))
}

#[test]
fn no_module_of_the_core_uses_one_that_uses_it_back() {
    let (root, all) = common::core_sources();
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for path in &all {
        let Some(module) = module_of(&root, path) else {
            continue;
        };
        let text = std::fs::read_to_string(path).expect("a source file");
        let used = uses(&text);
        graph
            .entry(module.clone())
            .or_default()
            .extend(used.into_iter().filter(|used| *used != module));
    }
    let modules: BTreeSet<String> = graph.keys().cloned().collect();
    for used in graph.values_mut() {
        used.retain(|m| modules.contains(m));
    }
    assert!(
        graph.len() > 30 && graph.values().map(BTreeSet::len).sum::<usize>() > 60,
        "only {} modules and their uses found: is the scan broken?",
        graph.len()
    );
    if let Some(cycle) = cycle(&graph) {
        panic!(
            "the core's modules use each other in a cycle: {}",
            cycle.join(" -> ")
        );
    }
}

#[test]
fn the_scan_finds_a_cycle_where_there_is_one() {
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let text = "use crate::{b, c::D};\nfn f() { crate::d::g() }\n// crate::e\n";
    graph.insert("a".into(), uses(text));
    assert_eq!(
        graph["a"],
        ["b", "c", "d"].map(String::from).into_iter().collect()
    );
    graph.insert("b".into(), uses("use crate::c;"));
    graph.insert("c".into(), BTreeSet::new());
    graph.insert("d".into(), BTreeSet::new());
    assert_eq!(cycle(&graph), None);
    graph.insert("c".into(), uses("use crate::a::X;"));
    assert_eq!(
        cycle(&graph),
        Some(["a", "b", "c", "a"].map(String::from).to_vec())
    );
}
