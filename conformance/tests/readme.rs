//! The README's route table ("What it answers") against the routing the binary does: every path
//! it names is routed the way its row says, every way of answering has a row, and the paths it
//! says are not served are refused. `make lint` runs this, so the table cannot drift from the code.

use std::sync::Arc;

use pdbmux_core::config::Config;
use pdbmux_core::{plan, ClientRequest, RouteClass};

const README: &str = include_str!("../../README.md");

/// How each row's description says it is answered, by a phrase only that row has.
const ANSWERS: &[(&str, RouteClass)] = &[
    ("fan-out to every backend and merge", RouteClass::Query),
    ("combined per subject", RouteClass::Query),
    ("the entity's own route with", RouteClass::Query),
    ("the node's owner first", RouteClass::PerCertname),
    (
        "the backend holding the report answers",
        RouteClass::ReportHash,
    ),
    ("PQL translated by a backend", RouteClass::Root),
    (
        "backends tried in configured order",
        RouteClass::PassThrough,
    ),
    ("the lowest version any backend runs", RouteClass::Meta),
    (
        "the first backend in configured order that answers",
        RouteClass::Meta,
    ),
    ("Jolokia merge", RouteClass::Metrics),
    ("pdbmux's own health report", RouteClass::Healthz),
];

/// A sample value for each placeholder the table writes.
const SAMPLES: &[(&str, &str)] = &[
    ("<name>", "kernel"),
    ("<value>", "Linux"),
    ("<type>", "Class"),
    ("<title>", "Main"),
    ("<certname>", "web1.example.com"),
    ("<hash>", "0123abcd"),
    ("<env>", "production"),
    ("...", "java.lang:type=Memory"),
];

/// The table's rows: the paths of the first cell (relative ones completed with the prefix of the
/// first) and the description.
fn rows() -> Vec<(Vec<String>, String)> {
    let section = README
        .split("\n## What it answers\n")
        .nth(1)
        .expect("README has a \"What it answers\" section");
    section
        .lines()
        .skip_while(|line| !line.starts_with("| Route |"))
        .skip(2)
        .take_while(|line| line.starts_with('|'))
        .map(|line| {
            let cells: Vec<&str> = line.trim_matches('|').split(" | ").collect();
            assert_eq!(cells.len(), 2, "a row of two cells: {line}");
            let mut paths = Vec::new();
            let mut prefix = String::new();
            for item in backticked(cells[0]).filter(|item| item.starts_with('/')) {
                let full = if item.starts_with("/pdb/")
                    || item.starts_with("/metrics/")
                    || item == "/healthz"
                {
                    if let Some(at) = item.find("/v4") {
                        prefix = item[..at + 3].to_owned();
                    }
                    item.to_owned()
                } else {
                    format!("{prefix}{item}")
                };
                paths.extend(expand(&full));
            }
            (paths, cells[1].to_owned())
        })
        .collect()
}

/// The `backticked` items of a cell.
fn backticked(cell: &str) -> impl Iterator<Item = &str> {
    cell.split('`').skip(1).step_by(2)
}

/// Every concrete path a pattern stands for: `[optional]` parts with and without, `{a,b}` each,
/// placeholders by their sample; a `[/...]` tail is left off.
fn expand(pattern: &str) -> Vec<String> {
    if let Some(start) = pattern.find('[') {
        let end = start + pattern[start..].find(']').expect("closing ]");
        let (head, optional, tail) = (
            &pattern[..start],
            &pattern[start + 1..end],
            &pattern[end + 1..],
        );
        let mut out = expand(&format!("{head}{tail}"));
        if optional != "/..." {
            out.extend(expand(&format!("{head}{optional}{tail}")));
        }
        return out;
    }
    if let Some(start) = pattern.find('{') {
        let end = start + pattern[start..].find('}').expect("closing }");
        let (head, choices, tail) = (
            &pattern[..start],
            &pattern[start + 1..end],
            &pattern[end + 1..],
        );
        return choices
            .split(',')
            .flat_map(|choice| expand(&format!("{head}{choice}{tail}")))
            .collect();
    }
    let mut path = pattern.to_owned();
    for (placeholder, sample) in SAMPLES {
        path = path.replace(placeholder, sample);
    }
    vec![path]
}

fn class_of(path: &str) -> RouteClass {
    let config = Arc::new(Config::with_backends(Vec::new()));
    plan(&ClientRequest::get(path), &config).class()
}

#[test]
fn every_path_in_the_route_table_is_routed_as_its_row_says() {
    let rows = rows();
    assert!(
        rows.len() >= ANSWERS.len() - 1,
        "the table was not found: {rows:?}"
    );
    for (paths, description) in &rows {
        let matching: Vec<RouteClass> = ANSWERS
            .iter()
            .filter(|(phrase, _)| description.contains(phrase))
            .map(|(_, class)| *class)
            .collect();
        assert_eq!(
            matching.len(),
            1,
            "say in ANSWERS how this README row is answered: {description}"
        );
        assert!(!paths.is_empty(), "a row without paths: {description}");
        for path in paths {
            assert_eq!(
                class_of(path),
                matching[0],
                "{path} (README: {description})"
            );
        }
    }
}

#[test]
fn every_way_of_answering_has_a_row() {
    let listed: Vec<RouteClass> = rows()
        .iter()
        .flat_map(|(paths, _)| paths.iter().map(|p| class_of(p)))
        .collect();
    for class in RouteClass::ALL {
        if class != RouteClass::Refused {
            assert!(
                listed.contains(&class),
                "no README row is answered as {class}"
            );
        }
    }
}

#[test]
fn what_the_readme_says_is_not_served_is_refused() {
    // "Everything else — including `/pdb/admin` (…), `/pdb/cmd` and `/status` — is answered 404"
    let text = README
        .split("Everything else — including")
        .nth(1)
        .and_then(|s| s.split(" — is answered `404`").next())
        .expect("the README says what is not served");
    let refused: Vec<&str> = backticked(text)
        .filter(|item| item.starts_with('/'))
        .collect();
    assert!(refused.contains(&"/pdb/admin"), "{refused:?}");
    for path in refused {
        assert_eq!(class_of(path), RouteClass::Refused, "{path}");
        let below = format!("{path}/v1/archive");
        assert_eq!(class_of(&below), RouteClass::Refused, "{below}");
    }
    // "and so is a path under `/pdb/query/v4` that is no PuppetDB endpoint"
    assert_eq!(class_of("/pdb/query/v4/nope"), RouteClass::Refused);
}
