//! Wall-clock rendering without a clock: the runtime captures one (monotonic, wall) pair at
//! start, and the core maps later `Instant`s onto wall time from it for `/healthz`.

use std::time::{Instant, SystemTime};

/// One moment seen on both clocks; pass it to [`crate::Estate::new`].
#[derive(Debug, Clone, Copy)]
pub struct ClockAnchor {
    /// The monotonic reading.
    pub instant: Instant,
    /// The wall-clock reading at the same moment.
    pub wall: SystemTime,
}

impl ClockAnchor {
    /// `at` in milliseconds since the Unix epoch, mapped through the anchor (0 before it).
    pub fn unix_millis(&self, at: Instant) -> u64 {
        let wall = if at >= self.instant {
            self.wall + at.duration_since(self.instant)
        } else {
            self.wall - self.instant.duration_since(at)
        };
        wall.duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |since| {
                u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
            })
    }

    /// The instant at `millis` since the Unix epoch, mapped through the anchor; a time before
    /// the anchor's instant can be represented only as far back as the monotonic clock goes,
    /// and is clamped there.
    pub fn instant_at_unix_millis(&self, millis: u64) -> Instant {
        let anchor = self.unix_millis(self.instant);
        if millis >= anchor {
            self.instant + std::time::Duration::from_millis(millis - anchor)
        } else {
            let back = std::time::Duration::from_millis(anchor - millis);
            self.instant.checked_sub(back).unwrap_or(self.instant)
        }
    }

    /// `at` as RFC 3339 UTC (`2026-11-30T10:00:00.123Z`), mapped through the anchor.
    pub fn rfc3339(&self, at: Instant) -> String {
        let wall = if at >= self.instant {
            self.wall + at.duration_since(self.instant)
        } else {
            self.wall - self.instant.duration_since(at)
        };
        let time = time::OffsetDateTime::from(wall);
        let format = time::macros::format_description!(
            "[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:3]Z"
        );
        time.format(&format).unwrap_or_default()
    }
}

#[cfg(test)]
#[allow(clippy::disallowed_methods)] // tests need one real instant to start from
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn instants_render_as_utc() {
        let instant = Instant::now();
        let anchor = ClockAnchor {
            instant,
            wall: SystemTime::UNIX_EPOCH + Duration::from_secs(1_796_022_240),
        };
        assert_eq!(anchor.rfc3339(instant), "2026-11-30T07:04:00.000Z");
        assert_eq!(
            anchor.rfc3339(instant + Duration::from_millis(1500)),
            "2026-11-30T07:04:01.500Z"
        );
    }
}
