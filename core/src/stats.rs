//! The estate's state and its running counts as numbers, read when pdbmux's own metrics are
//! scraped (docs/operating.md): the prober's verdict on each backend and its transitions, who
//! owns how many nodes (the number a migration is steered by), the membership refreshes, and
//! what the cache holds. The core only counts; a runtime publishes.

use std::time::Duration;

pub use crate::membership::MembershipStats;

use crate::cache::StoreStats;
use crate::fanout::CallState;
use crate::message::{ConnectCause, UpstreamFailure};
use crate::status::{Failure, Outcome};

/// One backend's numbers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendStats {
    /// Its configured name.
    pub name: String,
    /// The prober's state, as `/healthz` spells it (one of [`BACKEND_STATES`]).
    pub state: &'static str,
    /// Prober transitions since start, by kind (one of [`TRANSITIONS`]), in that order.
    pub transitions: [u64; TRANSITIONS.len()],
    /// The active nodes it owns under the configured merge.
    pub owned_nodes: usize,
    /// Membership refreshes that did not renew its part of the map: its answer could not be
    /// used, or it was out of service and not asked (its previous part is kept).
    pub membership_failures: u64,
    /// How long since its part of the map was last renewed (since start, or since the
    /// configuration gave this backend list, until a first renewal).
    pub membership_age: Duration,
}

/// The cache's numbers, when it is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheStats {
    /// What the store holds.
    pub store: StoreStats,
    /// Entries evicted to stay within `facts_cache_bytes` since start.
    pub evictions: u64,
    /// Requests that joined a fan-out already in flight for their key since start.
    pub flight_joins: u64,
    /// Background refreshes hits started past their share of the TTL, since start.
    pub refreshes_ahead: u64,
    /// With a shared store: whether it answers; `None` for memory only.
    pub shared_reachable: Option<bool>,
    /// With a shared store: entries read from it and refused since start, by
    /// [`crate::cache::shared::EntryRefusal::index`]; `None` for memory only.
    pub shared_refused: Option<[u64; crate::cache::shared::EntryRefusal::ALL.len()]>,
}

/// The estate's numbers at one instant; from [`crate::Estate::stats`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EstateStats {
    /// Per backend, in configured order.
    pub backends: Vec<BackendStats>,
    /// The membership map.
    pub membership: MembershipStats,
    /// The cache, when it is on.
    pub cache: Option<CacheStats>,
}

/// Every state a backend can be in, for gauges that are 1 for the current one and 0 otherwise.
pub const BACKEND_STATES: [&str; 6] = [
    "healthy",
    "unhealthy",
    "probe_unsupported",
    "unreachable",
    "unprobed",
    "unmonitored",
];

/// Every kind of prober transition, as the metrics label them.
pub const TRANSITIONS: [&str; 6] = [
    "down",
    "up",
    "probe_unsupported",
    "unreachable",
    "first_answer",
    "rejection_run",
];

/// How one upstream call ended, as the metrics label it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallOutcome {
    /// A 2xx the answer could use (or stream).
    Ok,
    /// A 4xx.
    ClientError,
    /// A 5xx.
    ServerError,
    /// No answer within the timeout.
    Timeout,
    /// No connection, for this cause.
    Connect(ConnectCause),
    /// The body went over `max_body_bytes`.
    BodyTooLarge,
    /// Reading the body went over a memory budget of buffered merges (the request was refused).
    OverBudget,
    /// The connection failed after it was made.
    Transport,
    /// A 2xx whose body could not be used.
    Unparseable,
    /// A status that is neither success nor error (1xx, 3xx).
    UnexpectedStatus,
    /// Abandoned unanswered: the answer no longer needed it.
    Cancelled,
}

impl CallOutcome {
    /// Every outcome, for counters that show each one from the start.
    pub const ALL: [CallOutcome; 15] = [
        CallOutcome::Ok,
        CallOutcome::ClientError,
        CallOutcome::ServerError,
        CallOutcome::Timeout,
        CallOutcome::Connect(ConnectCause::Refused),
        CallOutcome::Connect(ConnectCause::Dns),
        CallOutcome::Connect(ConnectCause::Tls),
        CallOutcome::Connect(ConnectCause::Timeout),
        CallOutcome::Connect(ConnectCause::Other),
        CallOutcome::BodyTooLarge,
        CallOutcome::OverBudget,
        CallOutcome::Transport,
        CallOutcome::Unparseable,
        CallOutcome::UnexpectedStatus,
        CallOutcome::Cancelled,
    ];

    /// Its label value.
    pub fn as_str(self) -> &'static str {
        match self {
            CallOutcome::Ok => "ok",
            CallOutcome::ClientError => "4xx",
            CallOutcome::ServerError => "5xx",
            CallOutcome::Timeout => "timeout",
            CallOutcome::Connect(cause) => cause.as_str(),
            CallOutcome::BodyTooLarge => "body_too_large",
            CallOutcome::OverBudget => "over_budget",
            CallOutcome::Transport => "transport_error",
            CallOutcome::Unparseable => "unparseable",
            CallOutcome::UnexpectedStatus => "unexpected_status",
            CallOutcome::Cancelled => "cancelled",
        }
    }

    /// A request the runtime sent for the estate itself (a probe, a membership refresh), by the
    /// status that came back or the failure; whether its body was usable is not judged here.
    pub fn of(result: Result<http::StatusCode, &UpstreamFailure>) -> CallOutcome {
        match result {
            Ok(status) => CallOutcome::of_status(status),
            Err(failure) => CallOutcome::of_failure(failure),
        }
    }

    fn of_status(status: http::StatusCode) -> CallOutcome {
        if status.is_success() {
            CallOutcome::Ok
        } else if status.is_client_error() {
            CallOutcome::ClientError
        } else if status.is_server_error() {
            CallOutcome::ServerError
        } else {
            CallOutcome::UnexpectedStatus
        }
    }

    fn of_failure(failure: &UpstreamFailure) -> CallOutcome {
        match failure {
            UpstreamFailure::Connect { cause, .. } => CallOutcome::Connect(*cause),
            UpstreamFailure::Timeout => CallOutcome::Timeout,
            UpstreamFailure::BodyTooLarge { .. } => CallOutcome::BodyTooLarge,
            UpstreamFailure::OverBudget { .. } => CallOutcome::OverBudget,
            UpstreamFailure::Transport(_) => CallOutcome::Transport,
        }
    }

    /// One call of an exchange, once the exchange has answered.
    pub(crate) fn of_call(state: &CallState) -> CallOutcome {
        match state {
            CallState::Pending { .. } => CallOutcome::Cancelled,
            // A body being read when the answer streamed went on to the client.
            CallState::Held { .. }
            | CallState::Reading { .. }
            | CallState::Done(Outcome::Success { .. }) => CallOutcome::Ok,
            CallState::Done(Outcome::Rejected(rejection)) => {
                CallOutcome::of_status(rejection.status)
            }
            CallState::Done(Outcome::Failed(failure)) => match failure {
                Failure::Upstream(failure) => CallOutcome::of_failure(failure),
                Failure::UnexpectedStatus(_) | Failure::HeldBody(_) => {
                    CallOutcome::UnexpectedStatus
                }
                Failure::Unusable(_) => CallOutcome::Unparseable,
                Failure::Rejected(rejected) => CallOutcome::of_status(rejected.status),
            },
        }
    }
}
