//! The memory budget of buffered merges (docs/operating.md, "Memory"): how many bytes of backend
//! answers one request, and all requests together, may hold in memory while they are merged, and
//! the answer a request gets when it would go over. The runtime counts the bytes as it reads
//! them (the driver's `MergeMemory`); this is what the limits mean and what the client is told.

use std::time::Duration;

use http::{HeaderValue, StatusCode};

use crate::config::Config;
use crate::message::Response;

/// How long a client refused for the process-wide budget is asked to wait: merges in flight take
/// seconds, and a retry sooner would find the same merges still holding their answers.
pub const RETRY_AFTER: Duration = Duration::from_secs(2);

pub use crate::message::BudgetScope;

/// The limit `config` sets for `scope`, in bytes.
pub fn limit(scope: BudgetScope, config: &Config) -> u64 {
    match scope {
        BudgetScope::Request => config.merge_request_bytes,
        BudgetScope::Process => config.merge_memory_bytes,
    }
}

/// The answer to a request refused for the memory budget: a 503 with `Retry-After`, saying which
/// budget and what the client or the operator can do. The request loses nothing: no backend
/// holds state for it, and asking again later (or narrower) is safe.
pub fn over_budget(scope: BudgetScope, limit: u64) -> Response {
    let advice = match scope {
        BudgetScope::Request => format!(
            "this request's backend answers are more than {} ({limit} bytes) allows one request \
             to hold while merging; narrow the query, page it (limit/offset) or raise {}",
            scope.key(),
            scope.key()
        ),
        BudgetScope::Process => format!(
            "merges in flight already hold {} ({limit} bytes) of backend answers; retry shortly",
            scope.key()
        ),
    };
    let mut response = Response::text(
        StatusCode::SERVICE_UNAVAILABLE,
        format!("pdbmux: over the memory budget: {advice}"),
    );
    response.headers.insert(
        http::header::RETRY_AFTER,
        HeaderValue::from(RETRY_AFTER.as_secs()),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_is_a_503_with_retry_after_naming_its_key() {
        for scope in [BudgetScope::Request, BudgetScope::Process] {
            let response = over_budget(scope, 1000);
            assert_eq!(response.status, StatusCode::SERVICE_UNAVAILABLE);
            assert_eq!(response.headers[http::header::RETRY_AFTER], "2");
            let body = String::from_utf8_lossy(response.full_body().expect("whole")).into_owned();
            assert!(body.contains(scope.key()), "{body}");
            assert!(body.contains("1000 bytes"), "{body}");
        }
    }
}
