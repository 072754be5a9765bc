//! What can go wrong while driving the host: a broken script, or the core or the host breaking
//! its contract.

use std::time::Duration;

/// A harness failure. Variants after `BadUrl` and `ScriptExhausted` describe the core breaking its
/// contract (or the harness being misused by a test).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HarnessError {
    /// The host did not start on the simulated runtime (`EstateHost::start`).
    #[error("the host did not start: {0}")]
    Start(String),
    /// A fake backend's URL is not `http(s)://host[:port]`.
    #[error("bad backend url {0:?}")]
    BadUrl(String),
    /// A scripted header is not a valid HTTP header.
    #[error("bad scripted header {name:?}: {value:?}")]
    BadHeader {
        /// The header name.
        name: String,
        /// The header value.
        value: String,
    },
    /// A backend was asked more often than its script has replies.
    #[error("script of {backend} exhausted at {path}")]
    ScriptExhausted {
        /// The backend's name.
        backend: String,
        /// The request's path and query.
        path: String,
    },
    /// The run did not become quiescent within the step budget.
    #[error("no quiescence after {steps} steps (at +{}ms): livelock?", at.as_millis())]
    Livelock {
        /// The step budget.
        steps: usize,
        /// Simulated time when the budget ran out.
        at: Duration,
    },
    /// A task's timer fired twice at one instant: after `handle_timeout(now)` its machine still
    /// reported a deadline at or before `now`.
    #[error("{machine} still reports a deadline at +{}ms after handle_timeout", at.as_millis())]
    StuckDeadline {
        /// Which machine.
        machine: String,
        /// The stuck deadline.
        at: Duration,
    },
    /// A machine sent to a backend that is not configured.
    #[error("{machine} sent {id} to unknown backend {backend}")]
    UnknownBackend {
        /// Which machine.
        machine: String,
        /// The upstream ID.
        id: String,
        /// The backend index.
        backend: usize,
    },
    /// A machine reused the upstream ID of a request still in flight.
    #[error("{machine} reused upstream id {id}")]
    DuplicateId {
        /// Which machine.
        machine: String,
        /// The upstream ID.
        id: String,
    },
    /// A test referred to a client that was never submitted.
    #[error("no client {0}")]
    UnknownClient(String),
    /// A task panicked (not by script): a defect in the code it ran.
    #[error("a task panicked: {0}")]
    Panicked(String),
    /// A client got no response or more than one.
    #[error("{client} got {count} responses, expected exactly one")]
    ResponseCount {
        /// Which client.
        client: String,
        /// How many it got.
        count: usize,
    },
    /// At quiescence, upstream requests are still in flight that nobody will ever cancel.
    #[error("upstream requests left in flight at quiescence: {0}")]
    LeftInFlight(String),
}
