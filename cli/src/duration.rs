//! Go-style durations ("10s", "500ms", "1m30s", "2h", "0"), parsed with humantime.

use std::time::Duration;

/// Parses a Go-style duration; `0` needs no unit, any other bare number is an error.
///
/// humantime also accepts its longer unit names ("10sec", "1 day"); those are allowed too.
pub fn parse(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    if text.starts_with('-') {
        return Err("negative durations are not allowed".to_owned());
    }
    humantime::parse_duration(text).map_err(|e| match e {
        humantime::DurationError::UnknownUnit { ref unit, .. } if unit.is_empty() => {
            "missing unit (e.g. 10s, 500ms, 1m30s)".to_owned()
        }
        humantime::DurationError::Empty => "empty".to_owned(),
        other => other.to_string(),
    })
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

    #[test]
    fn parses_go_durations() {
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
        ];
        for (text, want) in cases {
            assert_eq!(parse(text), Ok(want), "{text}");
        }
    }

    #[test]
    fn rejects_bare_numbers_and_junk() {
        assert_eq!(
            parse("10"),
            Err("missing unit (e.g. 10s, 500ms, 1m30s)".to_owned())
        );
        assert_eq!(
            parse("-1s"),
            Err("negative durations are not allowed".to_owned())
        );
        assert!(parse("ten").is_err());
        assert!(parse("").is_err());
        assert!(parse("10x").is_err());
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
}
