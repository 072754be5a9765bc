//! What ties one client request to its log lines and its upstream calls: its request id (the
//! client's `X-Request-Id`, or one pdbmux makes), its W3C trace context, and its address.
//!
//! The id is echoed in the response, is a field of the request's span (so of every log line
//! about it), and goes out on each upstream call the request makes, with a `traceparent` whose
//! trace is the client's (a fresh one when it sent none) and whose span id is new for each call
//! (docs/operating.md, "Following a request").

use std::fmt::Write as _;
use std::net::SocketAddr;

use http::{HeaderName, HeaderValue};

/// The request id header, accepted, echoed and sent upstream.
pub const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");
/// The W3C trace context header.
pub const TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");
/// The W3C vendor trace state, forwarded with a continued trace.
pub const TRACESTATE: HeaderName = HeaderName::from_static("tracestate");

/// The longest `tracestate` forwarded (W3C Trace Context allows cutting it; 512 is what it asks
/// every participant to pass on at least).
const MAX_TRACESTATE: usize = 512;

/// The longest request id accepted from a client; a longer (or otherwise unfit) one is replaced.
const MAX_REQUEST_ID: usize = 128;

/// One client request's ids and address; build it with [`ClientContext::new`] from the head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientContext {
    /// The client's address, when the runtime knows it.
    pub peer: Option<SocketAddr>,
    /// The request id: the client's when it sent a fit one, else 32 random hex digits.
    pub request_id: String,
    trace: Trace,
}

/// The W3C trace the request belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Trace {
    /// 32 lower-case hex digits, not all zero.
    trace_id: String,
    /// The trace flags pdbmux knows (only `sampled`), as two hex digits: `01` or `00`.
    flags: String,
    /// The client's `tracestate`, passed on with its trace.
    state: Option<String>,
}

impl ClientContext {
    /// The context of a request with these header fields from `peer`. An `X-Request-Id` of 1 to
    /// 128 characters from `A-Z a-z 0-9 - _ . ~ : / + = @` is kept; another (or none) is
    /// replaced by a fresh id. One valid `traceparent` is continued, with its `tracestate`;
    /// without one (or with two, which W3C Trace Context calls invalid), a new trace is started.
    pub fn new<'a>(
        peer: Option<SocketAddr>,
        fields: impl IntoIterator<Item = (&'a str, &'a [u8])>,
    ) -> ClientContext {
        let (mut request_id, mut traceparents, mut states) = (None, Vec::new(), Vec::new());
        for (name, value) in fields {
            if name.eq_ignore_ascii_case(REQUEST_ID.as_str()) && request_id.is_none() {
                request_id = fit_request_id(value);
            } else if name.eq_ignore_ascii_case(TRACEPARENT.as_str()) {
                traceparents.push(value);
            } else if name.eq_ignore_ascii_case(TRACESTATE.as_str()) {
                states.push(String::from_utf8_lossy(value).trim().to_owned());
            }
        }
        let continued = match traceparents.as_slice() {
            [one] => parse_traceparent(one).map(|mut trace| {
                let state = states.join(",");
                let fit = !state.is_empty()
                    && state.len() <= MAX_TRACESTATE
                    && state.bytes().all(|b| b == b' ' || b.is_ascii_graphic());
                trace.state = fit.then_some(state);
                trace
            }),
            _ => None,
        };
        ClientContext {
            peer,
            request_id: request_id.unwrap_or_else(random_hex::<16>),
            trace: continued.unwrap_or_else(|| Trace {
                trace_id: random_hex::<16>(),
                flags: "00".to_owned(),
                state: None,
            }),
        }
    }

    /// A context for a request that came with no head to read (internal callers, tests).
    pub fn internal() -> ClientContext {
        ClientContext::new(None, [])
    }

    /// The trace id the request's upstream calls carry.
    pub fn trace_id(&self) -> &str {
        &self.trace.trace_id
    }

    /// The headers one upstream call of this request carries: the request id, a `traceparent`
    /// in the request's trace with a span id of the call's own (pdbmux records no spans: the
    /// id tells the calls apart in the backend's logs and in a tracer downstream), and the
    /// client's `tracestate` when its trace is continued.
    pub fn upstream_headers(&self) -> Vec<(HeaderName, HeaderValue)> {
        let traceparent = format!(
            "00-{}-{}-{}",
            self.trace.trace_id,
            random_hex::<8>(),
            self.trace.flags
        );
        // Both are visible ASCII by construction (checked or generated), so they are header values.
        let value = |text: &str| {
            HeaderValue::from_str(text).unwrap_or_else(|_| HeaderValue::from_static("invalid"))
        };
        let mut headers = vec![
            (REQUEST_ID, value(&self.request_id)),
            (TRACEPARENT, value(&traceparent)),
        ];
        if let Some(state) = &self.trace.state {
            headers.push((TRACESTATE, value(state)));
        }
        headers
    }
}

/// The client's request id when it is fit to log and send on: 1 to 128 characters of
/// `A-Z a-z 0-9 - _ . ~ : / + = @` (what UUIDs, trace ids and the usual proxies' ids are made
/// of; no quotes or backslashes that would muddle a log line).
fn fit_request_id(value: &[u8]) -> Option<String> {
    let fit = !value.is_empty()
        && value.len() <= MAX_REQUEST_ID
        && value
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.~:/+=@".contains(b));
    fit.then(|| String::from_utf8_lossy(value).into_owned())
}

/// A `traceparent` as W3C Trace Context reads one: `<version>-<32 hex>-<16 hex>-<2 hex>`,
/// lower-case, ids not all zero, version not `ff`; version `00` has nothing after the flags, a
/// later version may (it is read as version 00). Anything else is ignored and a new trace
/// started, as the spec says. Of the flags only `sampled` is kept (the spec's rule for flags a
/// participant does not know).
fn parse_traceparent(value: &[u8]) -> Option<Trace> {
    let text = std::str::from_utf8(value).ok()?.trim();
    let hex = |s: &str, len: usize| {
        s.len() == len && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    };
    let zero = |s: &str| s.bytes().all(|b| b == b'0');
    let (head, rest) = (text.get(..55)?, &text[55..]);
    let mut parts = head.split('-');
    let (version, trace_id, parent_id, flags) =
        (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    let ending_fits = match version {
        "00" => rest.is_empty(),
        _ => rest.is_empty() || rest.starts_with('-'),
    };
    let valid = hex(version, 2)
        && version != "ff"
        && ending_fits
        && parts.next().is_none()
        && hex(trace_id, 32)
        && !zero(trace_id)
        && hex(parent_id, 16)
        && !zero(parent_id)
        && hex(flags, 2);
    let sampled = u8::from_str_radix(flags, 16).ok()? & 0x01;
    valid.then(|| Trace {
        trace_id: trace_id.to_owned(),
        flags: format!("{sampled:02x}"),
        state: None,
    })
}

/// `N` random bytes as `2N` lower-case hex digits (never all zero).
fn random_hex<const N: usize>() -> String {
    let mut bytes = [0u8; N];
    if getrandom::getrandom(&mut bytes).is_err() || bytes.iter().all(|b| *b == 0) {
        // No entropy source: an id that is still unique within the process.
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        for (slot, byte) in bytes.iter_mut().rev().zip(n.to_be_bytes().iter().rev()) {
            *slot = *byte;
        }
    }
    let mut out = String::with_capacity(2 * N);
    for byte in bytes {
        let _ = write!(out, "{byte:02x}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn context(fields: &[(&str, &str)]) -> ClientContext {
        ClientContext::new(None, fields.iter().map(|(n, v)| (*n, v.as_bytes())))
    }

    #[test]
    fn a_fit_request_id_is_kept_and_an_unfit_one_replaced() {
        assert_eq!(
            context(&[("X-Request-Id", "abc-123")]).request_id,
            "abc-123"
        );
        assert_eq!(
            context(&[("x-request-id", "3f2a6c1e-7b1d-4c55-9a0e-2b9d8c7f6a51")]).request_id,
            "3f2a6c1e-7b1d-4c55-9a0e-2b9d8c7f6a51"
        );
        for unfit in [
            "",
            "has space",
            "tab\there",
            "quo\"te",
            "back\\slash",
            &"x".repeat(129),
        ] {
            let id = context(&[("x-request-id", unfit)]).request_id;
            assert_ne!(id, unfit);
            assert_eq!(id.len(), 32, "{id}");
            assert!(id.bytes().all(|b| b.is_ascii_hexdigit()), "{id}");
        }
        let (a, b) = (context(&[]).request_id, context(&[]).request_id);
        assert_ne!(a, b, "fresh ids differ");
    }

    #[test]
    fn a_valid_traceparent_is_continued_with_a_new_span_per_call() {
        let incoming = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let c = context(&[("traceparent", incoming)]);
        assert_eq!(c.trace_id(), "4bf92f3577b34da6a3ce929d0e0e4736");
        let spans: Vec<String> = (0..2)
            .map(|_| {
                let headers = c.upstream_headers();
                let [(id_name, id), (tp_name, tp)] = &headers[..] else {
                    panic!("no tracestate was sent: {headers:?}");
                };
                assert_eq!((id_name, tp_name), (&REQUEST_ID, &TRACEPARENT));
                assert_eq!(id.to_str().ok(), Some(c.request_id.as_str()));
                let tp = tp.to_str().expect("ascii").to_owned();
                assert!(
                    tp.starts_with("00-4bf92f3577b34da6a3ce929d0e0e4736-"),
                    "{tp}"
                );
                assert!(tp.ends_with("-01"), "the flags carry on: {tp}");
                assert!(parse_traceparent(tp.as_bytes()).is_some(), "{tp}");
                tp[36..52].to_owned()
            })
            .collect();
        assert_ne!(spans[0], spans[1], "each call its own span id");
        assert_ne!(
            spans[0], "00f067aa0ba902b7",
            "a child span, not the parent's"
        );
    }

    #[test]
    fn an_invalid_traceparent_starts_a_new_trace() {
        for invalid in [
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "garbage",
        ] {
            let c = context(&[("traceparent", invalid)]);
            assert_ne!(
                c.trace_id(),
                "4bf92f3577b34da6a3ce929d0e0e4736",
                "{invalid}"
            );
            assert_eq!(c.trace_id().len(), 32);
            let headers = c.upstream_headers();
            assert_eq!(headers.len(), 2, "no tracestate with a new trace");
            assert!(
                headers[1].1.to_str().expect("ascii").ends_with("-00"),
                "not sampled"
            );
        }
    }

    #[test]
    fn later_versions_unknown_flags_tracestate_and_two_traceparents() {
        let trace = "4bf92f3577b34da6a3ce929d0e0e4736";
        // A later version is read as 00, with what follows the flags ignored.
        let later = format!("cc-{trace}-00f067aa0ba902b7-09-future");
        let c = context(&[("traceparent", &later), ("tracestate", "congo=t61rcWkgMzE")]);
        assert_eq!(c.trace_id(), trace);
        let headers = c.upstream_headers();
        let traceparent = headers[1].1.to_str().expect("ascii");
        assert!(
            traceparent.ends_with("-01"),
            "only sampled kept: {traceparent}"
        );
        assert_eq!(headers[2].0, TRACESTATE);
        assert_eq!(headers[2].1.to_str().ok(), Some("congo=t61rcWkgMzE"));
        // Version 00 with anything after the flags, version ff, or two of them: a new trace.
        let parent = format!("00-{trace}-00f067aa0ba902b7-01");
        for fields in [
            vec![("traceparent", format!("{parent}-x"))],
            vec![("traceparent", format!("ff-{trace}-00f067aa0ba902b7-01"))],
            vec![
                ("traceparent", parent.clone()),
                ("traceparent", parent.clone()),
            ],
        ] {
            let fields: Vec<(&str, &str)> = fields.iter().map(|(n, v)| (*n, v.as_str())).collect();
            assert_ne!(context(&fields).trace_id(), trace, "{fields:?}");
        }
    }
}
