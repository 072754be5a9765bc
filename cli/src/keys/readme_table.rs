//! README.md's table of configuration keys ("## Configuration") against [`KEYS`]: every key pdbmux
//! reads has a row naming its variable and default, and every row names keys pdbmux reads. The
//! README is the table users read; this keeps it from drifting from the keys.

use super::{find, KEYS};

const README: &str = include_str!("../../../README.md");

/// One key as a row of the table names it (a row may name several, e.g. the TLS pair).
#[derive(Debug)]
struct Row {
    key: String,
    /// The `PDBMUX_*` variable written for it.
    env: String,
    /// The default as written; `None` for a `—`.
    default: Option<String>,
}

/// The `backticked` items of a cell.
fn backticked(cell: &str) -> impl Iterator<Item = &str> {
    cell.split('`').skip(1).step_by(2)
}

/// The keys of the table's rows, each with its row's variable and default.
fn rows() -> Vec<Row> {
    let section = README
        .split("\n## Configuration\n")
        .nth(1)
        .expect("README.md has a \"Configuration\" section");
    let rows: Vec<Row> = section
        .lines()
        .skip_while(|line| !line.starts_with("| Key |"))
        .skip(2)
        .take_while(|line| line.starts_with('|'))
        .flat_map(|line| {
            let cells: Vec<&str> = line.trim_matches('|').splitn(4, " | ").collect();
            assert_eq!(cells.len(), 4, "a row of four cells: {line}");
            let keys: Vec<&str> = backticked(cells[0]).collect();
            let envs: Vec<&str> = backticked(cells[1])
                .filter(|var| var.starts_with("PDBMUX_"))
                .collect();
            assert_eq!(
                keys.len(),
                envs.len(),
                "a row names one variable per key: {line}"
            );
            let default = if cells[2].trim().starts_with('—') {
                None
            } else {
                backticked(cells[2]).next().map(str::to_owned)
            };
            keys.into_iter()
                .zip(envs)
                .map(|(key, env)| Row {
                    key: key.to_owned(),
                    env: env.to_owned(),
                    default: default.clone(),
                })
                .collect::<Vec<_>>()
        })
        .collect();
    assert!(!rows.is_empty(), "README.md's table of keys was not found");
    rows
}

#[test]
fn every_key_has_a_row_in_the_readme() {
    let rows = rows();
    for key in KEYS.iter() {
        assert!(
            rows.iter().any(|row| row.key == key.name),
            "README.md's configuration table has no row for `{}`: add one (its variable is `{}`)",
            key.name,
            key.env
        );
    }
}

#[test]
fn every_row_of_the_readme_is_a_key() {
    let rows = rows();
    for (i, row) in rows.iter().enumerate() {
        assert!(
            find(&row.key).is_some(),
            "README.md's configuration table has a row for `{}`, which is no configuration key",
            row.key
        );
        assert!(
            rows[..i].iter().all(|earlier| earlier.key != row.key),
            "README.md's configuration table has two rows for `{}`",
            row.key
        );
    }
}

#[test]
fn each_row_names_its_keys_variable_and_default() {
    for row in rows() {
        let Some(key) = find(&row.key) else {
            continue;
        };
        assert_eq!(
            row.env, key.env,
            "README.md's variable for `{}` (left) is not the key's (right)",
            row.key
        );
        assert_eq!(
            row.default.as_deref(),
            key.default,
            "README.md's default for `{}` (left) is not the key's (right)",
            row.key
        );
    }
}
