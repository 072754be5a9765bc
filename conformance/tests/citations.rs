//! Every citation of the project's docs and files resolves: a repository file named by its path
//! from the root (`core/src/estate/mod.rs`) exists; where the code, the scripts, the manifests or
//! the docs themselves name `docs/<file>.md` (or one of the docs by its bare name), that file
//! exists, and a section it names — `docs/merging.md, "Who owns a node"`, `docs/merging.md
//! "Paging"`, `[text](merging.md#who-owns-a-node)` — is a heading of it. Nothing cites a file
//! outside the repository (a relative path climbing above its root): the project explains itself. `make lint` runs this,
//! so a renamed heading cannot leave a comment pointing nowhere.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The directories whose files are read (generated and vendored trees left out).
const SKIPPED_DIRS: &[&str] = &[
    "target",
    ".git",
    ".state",
    "node_modules",
    "corpus",
    "artifacts",
];

/// The kinds of file that hold citations.
fn is_text(path: &Path) -> bool {
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default();
    matches!(
        path.extension().and_then(|e| e.to_str()),
        Some("rs" | "py" | "sh" | "md" | "yaml" | "yml" | "toml" | "json")
    ) || matches!(
        name,
        "Makefile" | "run" | "demo" | "newcomer" | "Containerfile"
    )
}

fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if path.is_dir() {
            if !SKIPPED_DIRS
                .iter()
                .any(|s| name == *s || name.starts_with(".state"))
            {
                files(&path, out);
            }
        } else if is_text(&path) {
            out.push(path);
        }
    }
}

/// A heading's GitHub anchor: lower case, spaces to `-`, punctuation but `-` and `_` dropped.
fn anchor(heading: &str) -> String {
    heading
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c.to_ascii_lowercase()),
            _ => None,
        })
        .collect()
}

/// Each doc's headings (the text after the `#`s), by file name.
fn headings(docs: &Path) -> BTreeMap<String, Vec<String>> {
    let mut out = BTreeMap::new();
    for entry in std::fs::read_dir(docs).expect("docs/").flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.ends_with(".md") {
            continue;
        }
        let text = std::fs::read_to_string(entry.path()).expect("a doc");
        let mut in_code = false;
        let list = text
            .lines()
            .filter(|line| {
                if line.starts_with("```") {
                    in_code = !in_code;
                }
                !in_code && line.starts_with('#')
            })
            .map(|line| line.trim_start_matches('#').trim().to_owned())
            .collect();
        out.insert(name, list);
    }
    out
}

/// The section a citation names right after the file: `, "Heading"`, ` "Heading"`, or
/// `#anchor`; `None` when it names none.
fn section(after: &str) -> Option<Section> {
    if let Some(anchor) = after.strip_prefix('#') {
        let end = anchor
            .find(|c: char| !(c.is_alphanumeric() || c == '-' || c == '_'))
            .unwrap_or(anchor.len());
        return Some(Section::Anchor(anchor[..end].to_owned()));
    }
    let quoted = after
        .strip_prefix(", \"")
        .or_else(|| after.strip_prefix(" \""))?;
    let end = quoted.find('"')?;
    Some(Section::Heading(quoted[..end].to_owned()))
}

enum Section {
    Heading(String),
    Anchor(String),
}

/// Every citation of a doc in `text`: (line number, file name, section named).
fn citations(
    text: &str,
    docs: &BTreeMap<String, Vec<String>>,
) -> Vec<(usize, String, Option<Section>)> {
    let mut out = Vec::new();
    for (number, line) in text.lines().enumerate() {
        let mut at = 0;
        while let Some(found) = line[at..].find(".md") {
            let end = at + found + ".md".len();
            let start = line[..end - 3]
                .rfind(|c: char| {
                    !(c.is_alphanumeric() || c == '_' || c == '-' || c == '/' || c == '.')
                })
                .map_or(0, |i| i + 1);
            let cited = &line[start..end];
            at = end;
            // A doc named with its directory, or by a name only docs/ has.
            let name = match cited.rsplit_once('/') {
                Some((dir, name)) if dir.ends_with("docs") => name,
                Some(_) => continue,
                None if docs.contains_key(cited) && cited != "README.md" => cited,
                None => continue,
            };
            out.push((number + 1, name.to_owned(), section(&line[end..])));
        }
    }
    out
}

/// The directories a citation of a repository file starts with.
const TOP_DIRS: &[&str] = &[
    "core/",
    "driver/",
    "cli/",
    "tls/",
    "sealed/",
    "conformance/",
    "e2e/",
    "bench/",
    "deploy/",
    "runtime-tokio/",
    "runtime-smol/",
    "runtime-cases/",
    "fuzz/",
    "docs/",
];

/// Every repository file `text` names by its path from the root (`core/src/estate/mod.rs`,
/// `e2e/histories/generate.py`), with its line number.
fn cited_files(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (number, line) in text.lines().enumerate() {
        for dir in TOP_DIRS {
            let mut at = 0;
            while let Some(found) = line[at..].find(dir) {
                let start = at + found;
                at = start + dir.len();
                // Part of a longer path (`../core/…`, `deploy/kubernetes/…` inside another).
                if start > 0
                    && line[..start].ends_with(|c: char| {
                        c.is_alphanumeric() || c == '/' || c == '.' || c == '-' || c == '_'
                    })
                {
                    continue;
                }
                let end = line[start..]
                    .find(|c: char| !(c.is_alphanumeric() || "_./-".contains(c)))
                    .map_or(line.len(), |e| start + e);
                let path = line[start..end].trim_end_matches('.');
                let is_file = [".rs", ".py", ".sh", ".md", ".yaml", ".json", ".toml"]
                    .iter()
                    .any(|ext| path.ends_with(ext));
                // A glob, or a file a run writes (under a hidden state directory), is not one
                // the repository holds.
                if is_file && !path.contains("..") && !path.contains('*') && !path.contains("/.") {
                    out.push((number + 1, path.to_owned()));
                }
            }
        }
    }
    out
}

/// The relative paths in `text` (a `../` at the start of a path) that climb out of the repository when
/// read from `dir`, the directory of the file they are in, with their line numbers. A `../`
/// inside a longer path (`/pdb/query/v4/../..`, a request target) is not a citation.
fn climbing_out(text: &str, dir: &Path, root: &Path) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (number, line) in text.lines().enumerate() {
        let mut at = 0;
        while let Some(found) = line[at..].find("../") {
            let start = at + found;
            at = start + 3;
            if line[..start].ends_with(|c: char| c.is_alphanumeric() || "_./-".contains(c)) {
                continue;
            }
            let end = line[start..]
                .find(|c: char| !(c.is_alphanumeric() || "_./-".contains(c)))
                .map_or(line.len(), |e| start + e);
            let token = line[start..end].trim_end_matches('.');
            let mut resolved = PathBuf::new();
            for part in dir.join(token).components() {
                match part {
                    std::path::Component::ParentDir => {
                        resolved.pop();
                    }
                    std::path::Component::CurDir => {}
                    other => resolved.push(other),
                }
            }
            if !resolved.starts_with(root) {
                out.push((number + 1, token.to_owned()));
            }
            at = end.max(at);
        }
    }
    out
}

#[test]
fn every_cited_doc_and_section_exists() {
    let root = root();
    let docs = headings(&root.join("docs"));
    let mut all = Vec::new();
    files(&root, &mut all);
    let mut problems = Vec::new();
    let mut checked = 0;
    let canonical_root = root.canonicalize().unwrap_or_else(|_| root.clone());
    for path in &all {
        let Ok(text) = std::fs::read_to_string(path) else {
            continue;
        };
        let shown = path
            .strip_prefix(&root)
            .unwrap_or(path)
            .display()
            .to_string();
        let dir = path
            .parent()
            .and_then(|d| d.canonicalize().ok())
            .unwrap_or_else(|| canonical_root.clone());
        for (line, cited) in climbing_out(&text, &dir, &canonical_root) {
            problems.push(format!(
                "{shown}:{line}: cites a file outside the repository: {cited}"
            ));
        }
        for (line, file) in cited_files(&text) {
            checked += 1;
            if !root.join(&file).exists() {
                problems.push(format!("{shown}:{line}: {file} does not exist"));
            }
        }
        for (line, name, section) in citations(&text, &docs) {
            checked += 1;
            let Some(list) = docs.get(&name) else {
                problems.push(format!("{shown}:{line}: docs/{name} does not exist"));
                continue;
            };
            match section {
                Some(Section::Heading(heading)) if !list.contains(&heading) => {
                    problems.push(format!(
                        "{shown}:{line}: docs/{name} has no heading \"{heading}\""
                    ));
                }
                Some(Section::Anchor(wanted)) if !list.iter().any(|h| anchor(h) == wanted) => {
                    problems.push(format!(
                        "{shown}:{line}: docs/{name} has no heading #{wanted}"
                    ));
                }
                _ => {}
            }
        }
    }
    assert!(
        checked > 100,
        "only {checked} citations found: is the scan broken?"
    );
    assert!(
        problems.is_empty(),
        "{} of {checked} citations point nowhere:\n{}",
        problems.len(),
        problems.join("\n")
    );
}

#[test]
fn anchors_and_sections_are_read_as_github_and_the_comments_write_them() {
    assert_eq!(anchor("Who owns a node"), "who-owns-a-node");
    assert_eq!(anchor("`/packages`"), "packages");
    assert_eq!(
        anchor("PQL and the root endpoint"),
        "pql-and-the-root-endpoint"
    );
    assert!(
        matches!(section(", \"Corrections\" and more"), Some(Section::Heading(h)) if h == "Corrections")
    );
    assert!(
        matches!(section("#who-owns-a-node)"), Some(Section::Anchor(a)) if a == "who-owns-a-node")
    );
    assert!(section(": nothing named").is_none());
}

#[test]
fn a_relative_path_is_outside_only_when_it_climbs_above_the_root() {
    let root = Path::new("/repo");
    let docs = root.join("docs");
    let text = "[the estate](../core/src/estate/mod.rs)\n\
                GET /pdb/query/v4/../../pdb/admin/v1/archive\n\
                see ../../elsewhere/notes.md";
    assert_eq!(
        climbing_out(text, &docs, root),
        vec![(3, "../../elsewhere/notes.md".to_owned())]
    );
}
