//! The rules of a call to a backend that do not depend on the HTTP library making it, so both
//! binaries' upstream clients apply them alike: what every request carries, the request bytes
//! pdbmux-smol writes itself, how pdbmux-smol judges an answer's framing, the body limit
//! (`max_body_bytes`) and the failures it gives, and whether an answer is held for streaming or
//! read whole. Sans-IO: tested without a socket.

use std::future::Future;

use bytes::Bytes;
use http::header::{
    ACCEPT, CONNECTION, CONTENT_LENGTH, CONTENT_TYPE, TRANSFER_ENCODING, USER_AGENT,
};
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use pdbmux_core::config::Config;
use pdbmux_core::{UpstreamBody, UpstreamFailure, UpstreamRequest, UpstreamResponse};

use crate::UpstreamResult;

/// pdbmux's `User-Agent` on every upstream request.
const USER_AGENT_VALUE: &str = concat!("pdbmux/", env!("CARGO_PKG_VERSION"));

/// The headers every upstream request carries besides `Host` and `Content-Length` (which the
/// HTTP library, or [`request_bytes`], sets): JSON asked for, pdbmux named, a JSON body's type
/// when the request has one (a query sent as a POST), and the request id and `traceparent` of
/// the client request the call is made for (docs/operating.md, "Following a request").
pub fn request_headers(
    request: &UpstreamRequest,
) -> impl Iterator<Item = (HeaderName, HeaderValue)> + '_ {
    let json = || HeaderValue::from_static("application/json");
    let always = [
        (ACCEPT, json()),
        (USER_AGENT, HeaderValue::from_static(USER_AGENT_VALUE)),
    ];
    let body = request.body.is_some().then(|| (CONTENT_TYPE, json()));
    always
        .into_iter()
        .chain(body)
        .chain(request.correlation.iter().cloned())
}

/// The request as pdbmux-smol writes it on the connection: the core's path and query go out
/// verbatim, then `Host: authority`, [`request_headers`], and a body with its length.
pub fn request_bytes(authority: &str, request: &UpstreamRequest) -> Vec<u8> {
    let body: &[u8] = request.body.as_deref().unwrap_or_default();
    let mut wire = Vec::with_capacity(256 + request.path_and_query.len() + body.len());
    wire.extend_from_slice(request.method.as_str().as_bytes());
    wire.push(b' ');
    wire.extend_from_slice(request.path_and_query.as_bytes());
    wire.extend_from_slice(b" HTTP/1.1\r\n");
    let mut field = |name: &[u8], value: &[u8]| {
        wire.extend_from_slice(name);
        wire.extend_from_slice(b": ");
        wire.extend_from_slice(value);
        wire.extend_from_slice(b"\r\n");
    };
    field(b"host", authority.as_bytes());
    for (name, value) in request_headers(request) {
        field(name.as_str().as_bytes(), value.as_bytes());
    }
    if request.body.is_some() {
        field(b"content-length", body.len().to_string().as_bytes());
    }
    wire.extend_from_slice(b"\r\n");
    wire.extend_from_slice(body);
    wire
}

/// How an answer's body is framed, as pdbmux-smol reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AnswerFraming {
    /// The declared length (`Content-Length`), if any.
    pub length: Option<u64>,
    /// Whether the connection may carry another request once the body is read (no
    /// `Connection: close`).
    pub reusable: bool,
}

/// Judges an answer's head: a `Content-Length` that is not a number, or a body framed by
/// neither `Content-Length` nor chunked coding (async-h1 does not read one delimited by the
/// connection's close), is a transport failure.
pub fn answer_framing(
    status: StatusCode,
    headers: &HeaderMap,
) -> Result<AnswerFraming, UpstreamFailure> {
    let length = match headers.get(CONTENT_LENGTH) {
        Some(value) => Some(
            value
                .to_str()
                .ok()
                .and_then(|v| v.trim().parse::<u64>().ok())
                .ok_or_else(|| UpstreamFailure::Transport("bad Content-Length".into()))?,
        ),
        None => None,
    };
    let chunked = headers
        .get(TRANSFER_ENCODING)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim().to_ascii_lowercase().ends_with("chunked"));
    let bodiless = status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED;
    if length.is_none() && !chunked && !bodiless {
        return Err(UpstreamFailure::Transport(
            "answer without Content-Length or chunked framing".into(),
        ));
    }
    let close = headers
        .get_all(CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|token| token.trim().eq_ignore_ascii_case("close"));
    Ok(AnswerFraming {
        length,
        reusable: !close,
    })
}

/// The most body bytes read from one answer (`max_body_bytes`), and the failure going over it
/// is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BodyLimit(u64);

impl BodyLimit {
    /// The limit `config` sets.
    pub fn of(config: &Config) -> BodyLimit {
        BodyLimit(config.max_body_bytes)
    }

    /// The limit in bytes.
    pub fn bytes(self) -> u64 {
        self.0
    }

    /// Refuses an answer whose declared length is over the limit, before any of it is read.
    pub fn check_declared(self, length: Option<u64>) -> Result<(), UpstreamFailure> {
        match length {
            Some(length) if length > self.0 => Err(self.exceeded()),
            _ => Ok(()),
        }
    }

    /// The failure of a body that could not be read: over the limit (`over`), or the transport
    /// failing, with the error's whole chain of causes.
    pub fn read_failure(
        self,
        over: bool,
        error: &(dyn std::error::Error + 'static),
    ) -> UpstreamFailure {
        if over {
            self.exceeded()
        } else {
            UpstreamFailure::Transport(pdbmux_tls::error_chain(error))
        }
    }

    fn exceeded(self) -> UpstreamFailure {
        UpstreamFailure::BodyTooLarge { limit: self.0 }
    }
}

/// Completes an answer the way the request's body mode asks ([`pdbmux_core::BodyMode::holds`]):
/// its body held unread for streaming to the client, or read whole with `read_whole`.
pub async fn take_answer<B, Read>(
    request: &UpstreamRequest,
    (status, headers): (StatusCode, HeaderMap),
    length: Option<u64>,
    body: B,
    read_whole: impl FnOnce(B) -> Read,
) -> UpstreamResult<B>
where
    Read: Future<Output = Result<Bytes, UpstreamFailure>>,
{
    if request.body_mode.holds(status, length) {
        let response = UpstreamResponse {
            status,
            headers,
            body: UpstreamBody::Held,
        };
        return Ok((response, Some(body)));
    }
    let bytes = read_whole(body).await?;
    let response = UpstreamResponse {
        status,
        headers,
        body: UpstreamBody::Full(bytes),
    };
    Ok((response, None))
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use futures_util::FutureExt;
    use http::Method;
    use pdbmux_core::{BackendId, BodyMode, UpstreamId};

    use super::*;

    fn request(method: Method, target: &str, body: Option<&'static str>) -> UpstreamRequest {
        UpstreamRequest {
            id: UpstreamId(0),
            backend: BackendId(0),
            method,
            path_and_query: target.to_owned(),
            body: body.map(Bytes::from),
            body_mode: BodyMode::StreamSuccess,
            deadline: Instant::now(),
            purpose: pdbmux_core::Purpose::Query,
            correlation: Vec::new(),
        }
    }

    fn headers(fields: &[(&'static str, &'static str)]) -> HeaderMap {
        fields
            .iter()
            .map(|(n, v)| (HeaderName::from_static(n), HeaderValue::from_static(v)))
            .collect()
    }

    #[test]
    fn the_target_goes_out_verbatim() {
        let target = "/pdb/query/v4/nodes?query=%5B%22=%22%5D&x='y'";
        let wire = request_bytes("db:8081", &request(Method::GET, target, None));
        let text = String::from_utf8(wire).unwrap_or_default();
        let head = format!(
            "GET {target} HTTP/1.1\r\nhost: db:8081\r\naccept: application/json\r\nuser-agent: {USER_AGENT_VALUE}\r\n\r\n"
        );
        assert_eq!(text, head);
    }

    #[test]
    fn a_post_carries_its_json_body_with_a_length() {
        let wire = request_bytes(
            "db",
            &request(Method::POST, "/pdb/query/v4/nodes", Some("{\"q\":1}")),
        );
        let text = String::from_utf8(wire).unwrap_or_default();
        assert!(text.starts_with("POST /pdb/query/v4/nodes HTTP/1.1\r\nhost: db\r\n"));
        assert!(text.contains("content-type: application/json\r\ncontent-length: 7\r\n"));
        assert!(text.ends_with("\r\n\r\n{\"q\":1}"));
    }

    #[test]
    fn an_answer_needs_a_length_or_chunks_unless_it_has_no_body() {
        let ok = StatusCode::OK;
        let framed = answer_framing(ok, &headers(&[("content-length", " 12 ")]));
        let expected = AnswerFraming {
            length: Some(12),
            reusable: true,
        };
        assert_eq!(framed, Ok(expected));
        let chunked = answer_framing(ok, &headers(&[("transfer-encoding", "gzip, chunked")]));
        assert_eq!(chunked.map(|f| f.length), Ok(None));
        for status in [
            StatusCode::NO_CONTENT,
            StatusCode::NOT_MODIFIED,
            StatusCode::CONTINUE,
        ] {
            assert!(
                answer_framing(status, &HeaderMap::new()).is_ok(),
                "{status}"
            );
        }
        assert!(matches!(
            answer_framing(ok, &HeaderMap::new()),
            Err(UpstreamFailure::Transport(why)) if why.contains("framing")
        ));
        assert!(matches!(
            answer_framing(ok, &headers(&[("content-length", "12x")])),
            Err(UpstreamFailure::Transport(why)) if why == "bad Content-Length"
        ));
    }

    #[test]
    fn connection_close_in_any_field_or_case_ends_reuse() {
        let fields = [("content-length", "0"), ("connection", "keep-alive, Close")];
        let framed = answer_framing(StatusCode::OK, &headers(&fields));
        assert_eq!(framed.map(|f| f.reusable), Ok(false));
    }

    #[test]
    fn a_declared_length_over_the_limit_fails_before_reading() {
        let limit = BodyLimit(10);
        assert_eq!(limit.check_declared(None), Ok(()));
        assert_eq!(limit.check_declared(Some(10)), Ok(()));
        assert_eq!(
            limit.check_declared(Some(11)),
            Err(UpstreamFailure::BodyTooLarge { limit: 10 })
        );
        let reset = std::io::Error::other("reset");
        assert_eq!(
            limit.read_failure(true, &reset),
            UpstreamFailure::BodyTooLarge { limit: 10 }
        );
        assert!(
            matches!(limit.read_failure(false, &reset), UpstreamFailure::Transport(why) if why.contains("reset"))
        );
    }

    #[test]
    fn a_success_to_stream_is_held_and_anything_else_read_whole() {
        let streamed = request(Method::GET, "/pdb/query/v4/catalogs/web1", None);
        let read = |body: &'static str| async move { Ok(Bytes::from(body)) };
        let held = take_answer(
            &streamed,
            (StatusCode::OK, HeaderMap::new()),
            None,
            "body",
            read,
        )
        .now_or_never();
        let Some(Ok((response, Some("body")))) = held else {
            panic!("a streamed success is held: {held:?}");
        };
        assert_eq!(response.body, UpstreamBody::Held);
        let failed = take_answer(
            &streamed,
            (StatusCode::NOT_FOUND, HeaderMap::new()),
            None,
            "404",
            read,
        )
        .now_or_never();
        let Some(Ok((response, None))) = failed else {
            panic!("a failure is read whole: {failed:?}");
        };
        assert_eq!(response.body, UpstreamBody::Full(Bytes::from("404")));
    }
}
