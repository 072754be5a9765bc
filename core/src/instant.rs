//! PuppetDB's timestamps read as instants: the sort order compares `timestamptz` columns by them
//! (docs/decisions.md D11) and the membership map compares producer times by them.

/// An RFC 3339 timestamp (any offset, any fractional precision) as (Unix seconds, nanoseconds).
pub(crate) fn parse_instant(s: &str) -> Option<(i64, u32)> {
    let instant =
        time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339).ok()?;
    Some((instant.unix_timestamp(), instant.nanosecond()))
}

/// A time as PostgreSQL's `to_char` writes it with the `OF` pattern (the membership refresh's
/// `TIME_FORMAT`): RFC 3339 but for an offset of whole hours, written without its minutes
/// (`…+00`, `…-05`); any RFC 3339 timestamp too. The refresh reads one per node and kind, most
/// of them `+00`: that form is completed on the stack and parsed once, never tried as RFC 3339
/// first.
pub(crate) fn parse_written_instant(s: &str) -> Option<(i64, u32)> {
    /// Longer than any time `to_char` writes (`YYYY-MM-DDTHH:MI:SS.US+HH:MM`, 32 bytes).
    const LONGEST: usize = 48;
    let whole_hours = s
        .len()
        .checked_sub(3)
        .and_then(|at| s.get(at..))
        .is_some_and(|end| {
            matches!(end.as_bytes(), [b'+' | b'-', tens, ones]
            if tens.is_ascii_digit() && ones.is_ascii_digit())
        });
    if !whole_hours {
        return parse_instant(s);
    }
    let mut completed = [0u8; LONGEST];
    let written = completed.get_mut(..s.len() + 3)?;
    let (time, minutes) = written.split_at_mut(s.len());
    time.copy_from_slice(s.as_bytes());
    minutes.copy_from_slice(b":00");
    parse_instant(std::str::from_utf8(written).ok()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_whole_hour_offset_without_minutes_is_read_as_postgresql_writes_it() {
        let utc = parse_instant("2026-11-30T08:00:00.5Z");
        assert!(utc.is_some());
        for written in [
            "2026-11-30T08:00:00.500000+00",
            "2026-11-30T03:00:00.500000-05",
            "2026-11-30T13:30:00.500000+05:30",
            "2026-11-30T13:45:00.500000+05:45",
            "2026-11-30T08:00:00.5Z",
        ] {
            assert_eq!(parse_written_instant(written), utc, "{written}");
        }
        for not_a_time in [
            "2026-11-30T08:00:00+0",
            "2026-11-30T08:00:00+ab",
            "+00",
            "",
            "x+00",
        ] {
            assert_eq!(parse_written_instant(not_a_time), None, "{not_a_time}");
        }
    }
}
