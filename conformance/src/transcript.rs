//! Rendering events as transcript lines: one line per event, deterministic, readable in a diff.

use std::fmt::Write as _;
use std::time::Duration;

use http::HeaderMap;

/// Bodies longer than this many characters are cut in the transcript.
pub const MAX_BODY_CHARS: usize = 240;
/// Request targets longer than this many characters are cut in the transcript.
pub const MAX_TARGET_CHARS: usize = 120;

/// An ordered list of transcript lines.
#[derive(Debug, Default, Clone)]
pub struct Transcript {
    lines: Vec<String>,
}

impl Transcript {
    /// Appends a line stamped with the time since the start.
    pub fn push(&mut self, at: Duration, line: impl AsRef<str>) {
        self.lines
            .push(format!("+{}ms {}", at.as_millis(), line.as_ref()));
    }

    /// Moves every line of `self` to the end of `into`.
    pub(crate) fn move_into(&mut self, into: &mut Transcript) {
        into.lines.append(&mut self.lines);
    }

    /// The lines so far.
    pub fn lines(&self) -> &[String] {
        &self.lines
    }

    /// The whole transcript, one event per line, with a final newline.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for line in &self.lines {
            out.push_str(line);
            out.push('\n');
        }
        out
    }
}

/// A body as one line: lossy UTF-8, control characters escaped, cut after [`MAX_BODY_CHARS`].
pub fn body_text(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let mut out = String::new();
    for (count, c) in text.chars().enumerate() {
        if count == MAX_BODY_CHARS {
            let _ = write!(out, "…({} bytes)", body.len());
            break;
        }
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => {
                let _ = write!(out, "\\u{{{:x}}}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out
}

/// A request target as one line, cut after [`MAX_TARGET_CHARS`].
pub fn target_text(target: &str) -> String {
    if target.chars().count() <= MAX_TARGET_CHARS {
        return body_text(target.as_bytes());
    }
    let head: String = target.chars().take(MAX_TARGET_CHARS).collect();
    format!("{}…({} bytes)", body_text(head.as_bytes()), target.len())
}

/// Headers as `name=value` pairs sorted by name (then value), separated by spaces.
pub fn headers_text(headers: &HeaderMap) -> String {
    let mut pairs: Vec<(String, String)> = headers
        .iter()
        .map(|(name, value)| {
            (
                name.as_str().to_owned(),
                String::from_utf8_lossy(value.as_bytes()).into_owned(),
            )
        })
        .collect();
    pairs.sort();
    pairs
        .iter()
        .map(|(name, value)| format!("{name}={value}"))
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_are_one_line_and_cut() {
        assert_eq!(body_text(b"a\nb\r\t\x01"), "a\\nb\\r\\t\\u{1}");
        let long = "x".repeat(MAX_BODY_CHARS + 10);
        let text = body_text(long.as_bytes());
        assert!(
            text.ends_with(&format!("…({} bytes)", MAX_BODY_CHARS + 10)),
            "{text}"
        );
        assert_eq!(target_text("/a?b"), "/a?b");
    }
}
