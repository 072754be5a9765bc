//! PuppetDB's timestamps read as instants: the sort order compares `timestamptz` columns by them
//! (docs/decisions.md D11) and the membership map compares producer times by them.

/// An RFC 3339 timestamp (any offset, any fractional precision) as (Unix seconds, nanoseconds).
pub(crate) fn parse_instant(s: &str) -> Option<(i64, u32)> {
    let instant =
        time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339).ok()?;
    Some((instant.unix_timestamp(), instant.nanosecond()))
}
