//! How much of the estate a response's answer covers, read from the headers the core puts on it
//! (`X-Backends: n/m`, `X-Cache: stale`): the one reading of them, for the cache (only a whole
//! answer is stored) and for the metrics (partial and unanswered responses are counted).

use crate::cache::X_CACHE;
use crate::message::Response;
use crate::message::X_BACKENDS;

/// How much of the estate an answer covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Coverage {
    /// Every configured backend's part (`X-Backends: m/m`), or not a merged answer; also a
    /// refusal every backend gave (a 4xx with `0/m`: the client's own bad request, which the
    /// estate answered).
    Whole,
    /// Some backends' parts (`X-Backends: n/m`, 0 < n < m).
    Partial,
    /// No backend's: `X-Backends: 0/m` on a 5xx (a replayed failure, a 502), or the stale cache
    /// entry served in its place.
    Unanswered,
}

impl Coverage {
    /// The coverage of `response`, as the client receives it.
    pub fn of(response: &Response) -> Coverage {
        if response.headers.get(X_CACHE).map(|v| v.as_bytes()) == Some(b"stale") {
            return Coverage::Unanswered;
        }
        let parts = response
            .headers
            .get(X_BACKENDS)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split_once('/'));
        match parts {
            Some(("0", _)) if response.status.is_server_error() => Coverage::Unanswered,
            Some(("0", _)) => Coverage::Whole,
            Some((contributed, configured)) if contributed != configured => Coverage::Partial,
            _ => Coverage::Whole,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::StatusCode;

    fn with(headers: &[(&'static str, &'static str)]) -> Response {
        with_status(StatusCode::OK, headers)
    }

    fn with_status(status: StatusCode, headers: &[(&'static str, &'static str)]) -> Response {
        let mut response = Response::text(status, "[]");
        for (name, value) in headers {
            response
                .headers
                .insert(*name, http::HeaderValue::from_static(value));
        }
        response
    }

    #[test]
    fn each_response_is_classed_by_the_part_of_the_estate_its_answer_covers() {
        let cases = [
            (with(&[("x-backends", "2/2")]), Coverage::Whole),
            (with(&[]), Coverage::Whole),
            (with(&[("x-backends", "1/2")]), Coverage::Partial),
            (with(&[("x-backends", "2/3")]), Coverage::Partial),
            (
                with_status(StatusCode::BAD_GATEWAY, &[("x-backends", "0/2")]),
                Coverage::Unanswered,
            ),
            (
                with_status(StatusCode::INTERNAL_SERVER_ERROR, &[("x-backends", "0/2")]),
                Coverage::Unanswered,
            ),
            // Every backend refused the client's own bad request: answered, not failing.
            (
                with_status(StatusCode::BAD_REQUEST, &[("x-backends", "0/2")]),
                Coverage::Whole,
            ),
            (
                with(&[("x-backends", "2/2"), ("x-cache", "stale")]),
                Coverage::Unanswered,
            ),
            (
                with(&[("x-backends", "2/2"), ("x-cache", "hit")]),
                Coverage::Whole,
            ),
        ];
        for (response, want) in cases {
            assert_eq!(Coverage::of(&response), want, "{:?}", response.headers);
        }
    }
}
