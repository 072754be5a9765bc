//! Durations as configuration values.
//!
//! The grammar, exactly (README "Configuration" documents the same, and a test reads its
//! examples from there): `0`, or one or more `<number><unit>` pairs written together, where
//! `<number>` is digits with an optional `.digits` fraction and `<unit>` is one of `ns`, `us` (or
//! `µs`), `ms`, `s`, `m`, `h`, in lower case; spaces around the whole value are trimmed. That is
//! Go's `time.ParseDuration` without a sign and without `.5s` or `1.s`. humantime computes the
//! value once the text is known to be in the grammar (it accepts a wider one: `10sec`, `1 day`).

use std::time::Duration;

/// The units, as the error for an unknown one lists them.
const UNITS: &[&str] = &["ns", "us", "µs", "ms", "s", "m", "h"];
/// What a near miss is told to write instead.
const EXAMPLES: &str = "e.g. 10s, 500ms, 1m30s";

/// Parses a duration in the grammar above; the error says what is wrong, in words.
pub fn parse(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    check_grammar(text)?;
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    // `us` is humantime's spelling too; `µs` is not, so it is handed over as `us`.
    humantime::parse_duration(&text.replace("µs", "us")).map_err(|e| e.to_string())
}

/// Checks `text` against the grammar, naming the first thing that is not in it.
fn check_grammar(text: &str) -> Result<(), String> {
    if text.is_empty() {
        return Err(format!("empty ({EXAMPLES})"));
    }
    if text.starts_with('-') {
        return Err("negative durations are not allowed".to_owned());
    }
    if text.contains(char::is_whitespace) {
        return Err(format!("no spaces allowed ({EXAMPLES})"));
    }
    if text == "0" {
        return Ok(());
    }
    let mut rest = text;
    while !rest.is_empty() {
        let number_len = number_prefix_len(rest);
        if number_len == 0 {
            return Err(format!("expected a number at \"{rest}\" ({EXAMPLES})"));
        }
        if rest[..number_len].ends_with('.') {
            return Err(format!(
                "expected digits after the \".\" in \"{text}\" ({EXAMPLES})"
            ));
        }
        let after_number = &rest[number_len..];
        let unit_len = after_number
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(after_number.len());
        let unit = &after_number[..unit_len];
        if unit.is_empty() {
            return Err(format!("missing unit ({EXAMPLES})"));
        }
        if !UNITS.contains(&unit) {
            return Err(format!(
                "unknown unit \"{unit}\" (units: ns, us or µs, ms, s, m, h; {EXAMPLES})"
            ));
        }
        rest = &after_number[unit_len..];
    }
    Ok(())
}

/// The length of the `digits[.[digits]]` at the start of `text`; 0 when there is none.
fn number_prefix_len(text: &str) -> usize {
    let digits = |s: &str| s.bytes().take_while(u8::is_ascii_digit).count();
    let whole = digits(text);
    if whole == 0 {
        return 0;
    }
    match text[whole..].strip_prefix('.') {
        Some(after_dot) => whole + 1 + digits(after_dot),
        None => whole,
    }
}

/// Formats a duration the way Go prints short ones: `0s`, `500ms`, `10s`, `1m30s`, `2h`, `1.5s`.
pub fn format(d: Duration) -> String {
    if d.is_zero() {
        return "0s".to_owned();
    }
    let nanos = d.subsec_nanos();
    let secs = d.as_secs();
    if secs == 0 {
        return if nanos % 1_000_000 == 0 {
            format!("{}ms", nanos / 1_000_000)
        } else if nanos % 1_000 == 0 {
            format!("{}us", nanos / 1_000)
        } else {
            format!("{nanos}ns")
        };
    }
    let (h, m, s) = (secs / 3600, secs / 60 % 60, secs % 60);
    let mut out = String::new();
    if h > 0 {
        out.push_str(&format!("{h}h"));
    }
    if m > 0 {
        out.push_str(&format!("{m}m"));
    }
    if s > 0 || nanos > 0 {
        if nanos > 0 {
            let frac = format!("{nanos:09}");
            out.push_str(&format!("{s}.{}s", frac.trim_end_matches('0')));
        } else {
            out.push_str(&format!("{s}s"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every example the README and the module doc give, with its value.
    #[test]
    fn parses_the_documented_examples() {
        let cases = [
            ("10s", Duration::from_secs(10)),
            ("500ms", Duration::from_millis(500)),
            ("1m30s", Duration::from_secs(90)),
            ("2h", Duration::from_secs(7200)),
            ("1h0m0s", Duration::from_secs(3600)),
            ("0", Duration::ZERO),
            ("0s", Duration::ZERO),
            ("1.5s", Duration::from_millis(1500)),
            ("250us", Duration::from_micros(250)),
            ("250µs", Duration::from_micros(250)),
            ("100ns", Duration::from_nanos(100)),
            ("1h1m1s1ms", Duration::from_millis(3_661_001)),
            (" 10s ", Duration::from_secs(10)),
        ];
        for (text, want) in cases {
            assert_eq!(parse(text), Ok(want), "{text}");
        }
    }

    /// The near misses a newcomer writes, each with the reason it is told.
    #[test]
    fn refuses_near_misses_with_their_reason() {
        let units = "(units: ns, us or µs, ms, s, m, h; e.g. 10s, 500ms, 1m30s)";
        let cases = [
            ("10", "missing unit (e.g. 10s, 500ms, 1m30s)".to_owned()),
            ("1m30", "missing unit (e.g. 10s, 500ms, 1m30s)".to_owned()),
            ("10S", format!("unknown unit \"S\" {units}")),
            ("1y", format!("unknown unit \"y\" {units}")),
            ("10sec", format!("unknown unit \"sec\" {units}")),
            ("1d", format!("unknown unit \"d\" {units}")),
            (
                "10 s",
                "no spaces allowed (e.g. 10s, 500ms, 1m30s)".to_owned(),
            ),
            ("-1s", "negative durations are not allowed".to_owned()),
            ("", "empty (e.g. 10s, 500ms, 1m30s)".to_owned()),
            (
                "ten",
                "expected a number at \"ten\" (e.g. 10s, 500ms, 1m30s)".to_owned(),
            ),
            (
                "+5s",
                "expected a number at \"+5s\" (e.g. 10s, 500ms, 1m30s)".to_owned(),
            ),
            (
                ".5s",
                "expected a number at \".5s\" (e.g. 10s, 500ms, 1m30s)".to_owned(),
            ),
            (
                "1.s",
                "expected digits after the \".\" in \"1.s\" (e.g. 10s, 500ms, 1m30s)".to_owned(),
            ),
        ];
        for (text, want) in cases {
            assert_eq!(parse(text), Err(want), "{text:?}");
        }
    }

    /// The README's "Durations" paragraph, read as written: every example before "are durations"
    /// parses, every one between that and "are not" is refused.
    #[test]
    fn the_readme_examples_are_what_the_parser_does() {
        let readme = include_str!("../../README.md");
        let start = readme
            .find("**Durations**")
            .expect("README has a Durations paragraph");
        let paragraph = &readme[start..];
        let paragraph = &paragraph[..paragraph.find("\n\n").unwrap_or(paragraph.len())];
        let examples = |text: &str| -> Vec<String> {
            text.split('`')
                .skip(1)
                .step_by(2)
                .map(str::to_owned)
                .collect()
        };
        let so = paragraph
            .find("So `")
            .expect("the examples start with \"So\"");
        let (good, rest) = paragraph[so..]
            .split_once("are durations")
            .expect("\"are durations\" follows the good examples");
        let (bad, _) = rest
            .split_once("are not")
            .expect("\"are not\" follows the bad ones");
        let (good, bad) = (examples(good), examples(bad));
        assert!(good.len() >= 5 && bad.len() >= 9, "{good:?} {bad:?}");
        for text in good {
            assert!(parse(&text).is_ok(), "README says {text:?} is a duration");
        }
        for text in bad {
            assert!(
                parse(&text).is_err(),
                "README says {text:?} is not a duration"
            );
        }
    }

    #[test]
    fn formats_like_go() {
        let cases = [
            (Duration::ZERO, "0s"),
            (Duration::from_millis(500), "500ms"),
            (Duration::from_secs(10), "10s"),
            (Duration::from_secs(90), "1m30s"),
            (Duration::from_secs(7200), "2h"),
            (Duration::from_secs(3601), "1h1s"),
            (Duration::from_millis(1500), "1.5s"),
        ];
        for (d, want) in cases {
            assert_eq!(format(d), want);
        }
    }

    proptest::proptest! {
        /// Whatever Go-style text `format` writes, `parse` reads back to the same duration.
        #[test]
        fn format_then_parse_is_the_identity(nanos in 0u64..(366 * 24 * 3600 * 1_000_000_000)) {
            let d = Duration::from_nanos(nanos);
            proptest::prop_assert_eq!(parse(&format(d)), Ok(d));
        }
    }
}
