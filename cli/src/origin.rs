//! Where a configuration problem's value came from, named at the start of its message:
//! `/etc/pdbmux/config.yaml:3: timeout: ...`, `env PDBMUX_TIMEOUT: timeout: ...`,
//! `flag --listen: listen: ...`.
//!
//! figment keeps which provider a value came from, not its line, so the line of a key in the
//! config file is found in the file's text: a top-level key written in block style (`key:` at the
//! start of a line, bare or quoted), and the `- ` items of a block list below one. A value written
//! in flow style (`{timeout: 5s}`) is named by its file alone.

use std::fmt;
use std::path::PathBuf;

/// Where a value was set, as a message names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// The config file, at this 1-based line when it could be found.
    File {
        /// The file.
        path: PathBuf,
        /// The line of the key (or of the list item) the value is on.
        line: Option<usize>,
    },
    /// This environment variable.
    Env(&'static str),
    /// This command-line flag.
    Flag(&'static str),
}

impl fmt::Display for Origin {
    /// `path:line` (as compilers write it, so editors can jump there), `path`, `env VAR` or
    /// `flag --x`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Origin::File {
                path,
                line: Some(line),
            } => write!(f, "{}:{line}", path.display()),
            Origin::File { path, line: None } => write!(f, "{}", path.display()),
            Origin::Env(var) => write!(f, "env {var}"),
            Origin::Flag(flag) => write!(f, "flag {flag}"),
        }
    }
}

/// The 1-based line on which top-level `key` is written in block style, if it is.
pub(crate) fn key_line(text: &str, key: &str) -> Option<usize> {
    text.lines()
        .position(|line| is_key_line(line, key))
        .map(|index| index + 1)
}

/// The 1-based line of item `index` (from 0) of the block list under top-level `key`.
pub(crate) fn item_line(text: &str, key: &str, index: usize) -> Option<usize> {
    let start = key_line(text, key)?;
    let mut item_indent = None;
    let mut seen = 0;
    for (offset, line) in text.lines().skip(start).enumerate() {
        let body = line.trim_start();
        if body.is_empty() || body.starts_with('#') {
            continue;
        }
        let indent = line.len() - body.len();
        let is_item = body == "-" || body.starts_with("- ");
        if indent == 0 && !is_item {
            return None; // the next top-level key: the list has fewer items
        }
        if !is_item || item_indent.is_some_and(|i| i != indent) {
            continue;
        }
        item_indent = Some(indent);
        if seen == index {
            return Some(start + offset + 1);
        }
        seen += 1;
    }
    None
}

/// The 1-based line of `field` in item `index` of the block list under top-level `key`, or of
/// the item itself when the field is not written on a line of its own.
pub(crate) fn item_field_line(text: &str, key: &str, index: usize, field: &str) -> Option<usize> {
    let item = item_line(text, key, index)?;
    let lines: Vec<&str> = text.lines().collect();
    let item_text = lines[item - 1];
    let indent = item_text.len() - item_text.trim_start().len();
    let is_field = |line: &str| {
        let body = line.trim_start().trim_start_matches("- ").trim_start();
        is_key_line(body, field)
    };
    if is_field(item_text) {
        return Some(item);
    }
    for (offset, line) in lines[item..].iter().enumerate() {
        let body = line.trim_start();
        if body.is_empty() || body.starts_with('#') {
            continue;
        }
        if line.len() - body.len() <= indent {
            break; // the next item, or the next top-level key
        }
        if is_field(line) {
            return Some(item + offset + 1);
        }
    }
    Some(item)
}

/// Whether `line` starts top-level `key` (`key:`, `"key":` or `'key':`, then a space or the end).
fn is_key_line(line: &str, key: &str) -> bool {
    let rest = [("", ""), ("\"", "\""), ("'", "'")]
        .iter()
        .find_map(|(open, close)| {
            line.strip_prefix(open)?
                .strip_prefix(key)?
                .strip_prefix(close)
        });
    match rest.map(str::trim_start).and_then(|r| r.strip_prefix(':')) {
        Some(after) => after.is_empty() || after.starts_with(char::is_whitespace),
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = "\
# pdbmux
listen: :8080
\"timeout\": 5s
backends:
  # the old one
  - name: a
    url: http://a.example.com
  - name: b
    url: http://b.example.com
log_level: debug
timeouts: 1s
";

    #[test]
    fn finds_block_keys_bare_or_quoted_and_not_their_prefixes() {
        assert_eq!(key_line(FILE, "listen"), Some(2));
        assert_eq!(key_line(FILE, "timeout"), Some(3));
        assert_eq!(key_line(FILE, "timeouts"), Some(11));
        assert_eq!(key_line(FILE, "log_level"), Some(10));
        assert_eq!(key_line(FILE, "url"), None, "not top-level");
        assert_eq!(key_line("{timeout: 5s}", "timeout"), None, "flow style");
    }

    #[test]
    fn finds_list_items_below_a_key() {
        assert_eq!(item_line(FILE, "backends", 0), Some(6));
        assert_eq!(item_line(FILE, "backends", 1), Some(8));
        assert_eq!(item_line(FILE, "backends", 2), None);
        let unindented = "backends:\n- name: a\n- name: b\nlisten: x\n";
        assert_eq!(item_line(unindented, "backends", 1), Some(3));
        assert_eq!(item_line(unindented, "backends", 2), None);
    }

    #[test]
    fn finds_a_field_of_a_list_item_or_falls_back_to_the_item() {
        assert_eq!(item_field_line(FILE, "backends", 0, "name"), Some(6));
        assert_eq!(item_field_line(FILE, "backends", 0, "url"), Some(7));
        assert_eq!(item_field_line(FILE, "backends", 1, "url"), Some(9));
        assert_eq!(item_field_line(FILE, "backends", 1, "tls_ca_file"), Some(8));
        assert_eq!(item_field_line(FILE, "backends", 2, "url"), None);
    }

    #[test]
    fn names_each_origin_as_messages_start() {
        let file = |line| Origin::File {
            path: PathBuf::from("/etc/pdbmux/config.yaml"),
            line,
        };
        assert_eq!(file(Some(3)).to_string(), "/etc/pdbmux/config.yaml:3");
        assert_eq!(file(None).to_string(), "/etc/pdbmux/config.yaml");
        assert_eq!(
            Origin::Env("PDBMUX_TIMEOUT").to_string(),
            "env PDBMUX_TIMEOUT"
        );
        assert_eq!(Origin::Flag("--listen").to_string(), "flag --listen");
    }
}
