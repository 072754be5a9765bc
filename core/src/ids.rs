//! Counter-based identifiers.
//!
//! Every ID comes from a counter owned by the machine that issued it, so transcripts of a run are
//! deterministic and comparable across runs.

use std::fmt;

/// Index of a backend in the configured order (`Config::backends[i]`).
///
/// Use it wherever "which backend" matters; the configured order is the tie-break everywhere.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BackendId(pub usize);

/// One upstream request issued by a machine ([`crate::Exchange`] or [`crate::Estate`]).
///
/// Unique within the machine that issued it; the runtime hands it back with the answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct UpstreamId(pub u64);

/// A client waiting on a shared answer from the [`crate::Estate`] (for example a `/healthz` check).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct WaiterId(pub u64);

/// A shared fan-out for one cache key (single-flight), issued by the [`crate::Estate`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FlightId(pub u64);

impl fmt::Display for FlightId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "f{}", self.0)
    }
}

impl fmt::Display for BackendId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "b{}", self.0)
    }
}

impl fmt::Display for UpstreamId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "u{}", self.0)
    }
}

impl fmt::Display for WaiterId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "w{}", self.0)
    }
}

/// A monotonically increasing source of IDs.
#[derive(Debug, Default, Clone)]
pub(crate) struct Counter(u64);

impl Counter {
    /// The next value; starts at 0.
    pub(crate) fn next(&mut self) -> u64 {
        let value = self.0;
        self.0 += 1;
        value
    }
}
