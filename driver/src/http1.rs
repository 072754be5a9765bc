//! The HTTP/1 request head as pdbmux-smol reads it: a pure function from the bytes received so far
//! to a head, a need for more bytes, or a refusal. Sans-IO, so it is tested (and fuzzed) without
//! a socket; the connection (runtime-smol/src/conn.rs) reads, waits and writes around it.

use http::StatusCode;
use pdbmux_core::ClientRequest;

/// The most header fields parsed; the core refuses more than 100 (431), and so does this.
const MAX_HEADERS: usize = 128;

/// The most request-head bytes either binary buffers (hyper's buffer limit in the tokio one).
/// The core refuses targets over 8 KiB (414) and header blocks over 16 KiB (431); a head past
/// this is refused by the connection the same way.
pub const MAX_HEAD_BYTES: usize = 64 * 1024;

/// The headers every response pdbmux writes ends with, whatever made it (the core, a refusal of
/// the runtime's, the metrics listener): framing is the runtime's own (its HTTP library writes
/// `Content-Length` or chunks from the body it is given), so any framing or hop-by-hop header in
/// `headers` is dropped; and `X-Content-Type-Options: nosniff` is added, so a browser never reads
/// a body as another type than the one named (docs/reliability.md).
pub fn finish_response_headers(headers: &mut http::HeaderMap) {
    use http::header;
    for name in [
        header::CONTENT_LENGTH,
        header::TRANSFER_ENCODING,
        header::CONNECTION,
        header::TE,
        header::TRAILER,
        header::UPGRADE,
        http::HeaderName::from_static("keep-alive"),
    ] {
        headers.remove(name);
    }
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        http::HeaderValue::from_static("nosniff"),
    );
}

/// A parsed request head.
#[derive(Debug)]
pub struct Head {
    /// The core's view of the request: method, the raw target, header count and bytes.
    pub request: ClientRequest,
    /// Its request id and trace context, from the head's fields (the runtime adds the peer).
    pub context: crate::ClientContext,
    /// HTTP/1.1 (else 1.0).
    pub http11: bool,
    /// Whether the connection may serve another request after this one.
    pub keep_alive: bool,
    /// The request's body, as far as the connection needs to know.
    pub body: RequestBody,
}

/// What follows a request head on the connection.
#[derive(Debug, PartialEq, Eq)]
pub enum RequestBody {
    /// Nothing.
    None,
    /// This many bytes, to skip after the answer.
    Length(u64),
    /// Chunked or otherwise unframed: the connection closes after the answer.
    Unskippable,
}

/// What [`parse_head`] found in the bytes received so far.
#[derive(Debug)]
pub enum Parsed {
    /// A whole head (boxed: it is most of the enum's size), and how many bytes it took.
    Complete(Box<Head>, usize),
    /// More bytes are needed.
    Partial,
    /// A head to refuse with this status and reason (the connection closes after).
    Invalid(StatusCode, &'static str),
}

/// Parses the request head at the start of `bytes` (httparse), refusing what [`check_head`]
/// refuses. The raw target is kept as sent (but for an absolute form, [`origin_form`]): the core
/// judges it.
pub fn parse_head(bytes: &[u8]) -> Parsed {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut parsed = httparse::Request::new(&mut headers);
    let length = match parsed.parse(bytes) {
        Ok(httparse::Status::Complete(length)) => length,
        Ok(httparse::Status::Partial) => return Parsed::Partial,
        Err(httparse::Error::TooManyHeaders) => {
            return Parsed::Invalid(
                StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                "too many request header fields",
            )
        }
        Err(_) => return Parsed::Invalid(StatusCode::BAD_REQUEST, "malformed request"),
    };
    let (Some(method), Some(target), Some(version)) = (parsed.method, parsed.path, parsed.version)
    else {
        return Parsed::Invalid(StatusCode::BAD_REQUEST, "malformed request");
    };
    let Ok(method) = http::Method::from_bytes(method.as_bytes()) else {
        return Parsed::Invalid(StatusCode::BAD_REQUEST, "malformed request method");
    };
    let mut header_bytes = 0;
    let (mut close, mut keep_alive, mut expect) = (false, false, false);
    let fields = parsed.headers.iter().map(|h| (h.name, h.value));
    let Framing {
        content_length,
        chunked,
    } = match check_head(version == 0, fields) {
        Ok(framing) => framing,
        Err(why) => return Parsed::Invalid(StatusCode::BAD_REQUEST, why),
    };
    for header in parsed.headers.iter() {
        header_bytes += header.name.len() + header.value.len() + 4;
        let value = std::str::from_utf8(header.value).unwrap_or("");
        if header.name.eq_ignore_ascii_case("connection") {
            for token in value.split(',').map(str::trim) {
                close |= token.eq_ignore_ascii_case("close");
                keep_alive |= token.eq_ignore_ascii_case("keep-alive");
            }
        } else if header.name.eq_ignore_ascii_case("expect") {
            expect = true;
        }
    }
    let mut body = match (chunked, content_length) {
        (true, _) => RequestBody::Unskippable,
        (false, Some(0) | None) => RequestBody::None,
        (false, Some(n)) => RequestBody::Length(n),
    };
    if expect && !matches!(body, RequestBody::None) {
        // The client waits for a 100 Continue it never gets, and may never send the body.
        body = RequestBody::Unskippable;
    }
    let http11 = version == 1;
    let fields = parsed.headers.iter().map(|h| (h.name, h.value));
    let head = Head {
        request: ClientRequest {
            method,
            target: origin_form(target).to_owned(),
            header_count: parsed.headers.len(),
            header_bytes,
        },
        // The runtime sets the peer: parsing sees bytes only.
        context: crate::ClientContext::new(None, fields),
        http11,
        keep_alive: if http11 { !close } else { keep_alive && !close },
        body,
    };
    Parsed::Complete(Box::new(head), length)
}

/// How a request's body is framed, once [`check_head`] found it unambiguous.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Framing {
    /// The body's declared length, if any.
    pub content_length: Option<u64>,
    /// Whether the body is chunked.
    pub chunked: bool,
}

/// The RFC 9112 rules both binaries apply to a request head, whichever library parsed it; `Err`
/// says why the request gets a 400 and its connection closes:
///
/// - framing two readers could read differently (section 6.3, request smuggling): conflicting or
///   malformed `Content-Length`, a `Transfer-Encoding` whose last coding is not `chunked` or that
///   names it twice (across fields too), both together, chunked on HTTP/1.0;
/// - `Host` (section 3.2): an HTTP/1.1 request without one, any request with two.
pub fn check_head<'a>(
    http10: bool,
    fields: impl IntoIterator<Item = (&'a str, &'a [u8])>,
) -> Result<Framing, &'static str> {
    let mut framing = Framing::default();
    let mut hosts = 0;
    for (name, value) in fields {
        let value = std::str::from_utf8(value).unwrap_or("\u{0}").trim();
        if name.eq_ignore_ascii_case("content-length") {
            let digits = !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit());
            match (
                digits.then(|| value.parse::<u64>().ok()).flatten(),
                framing.content_length,
            ) {
                (Some(n), None) => framing.content_length = Some(n),
                (Some(n), Some(known)) if n == known => {}
                _ => return Err("bad Content-Length"),
            }
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            let codings: Vec<&str> = value.split(',').map(str::trim).collect();
            let last_is_chunked = codings
                .last()
                .is_some_and(|c| c.eq_ignore_ascii_case("chunked"));
            let chunked_once = codings
                .iter()
                .filter(|c| c.eq_ignore_ascii_case("chunked"))
                .count()
                == 1;
            if framing.chunked || !last_is_chunked || !chunked_once {
                return Err("bad Transfer-Encoding");
            }
            framing.chunked = true;
        } else if name.eq_ignore_ascii_case("host") {
            hosts += 1;
        }
    }
    if framing.chunked && (framing.content_length.is_some() || http10) {
        return Err("ambiguous message framing");
    }
    if hosts > 1 || (hosts == 0 && !http10) {
        return Err("a request needs exactly one Host header");
    }
    Ok(framing)
}

/// The origin form (`/path?query`) of a request target, as hyper gives it to the tokio binary:
/// an absolute-form target (`http://host/path`), which a server must accept (RFC 9112 section
/// 3.2.2), loses its scheme and authority, and a fragment (which a client should never send) is
/// dropped; anything else is kept as sent, for the core to judge.
pub fn origin_form(target: &str) -> &str {
    // A target that is only a fragment stays as sent: the core refuses it (no leading `/`).
    let target = match target.split_once('#') {
        Some((before, _)) if !before.is_empty() => before,
        _ => target,
    };
    let lower = target.get(..8).unwrap_or(target).to_ascii_lowercase();
    let Some(scheme) = ["http://", "https://"]
        .into_iter()
        .find(|scheme| lower.starts_with(scheme))
    else {
        return target;
    };
    let rest = &target[scheme.len()..];
    match rest.find(['/', '?']) {
        Some(at) if rest.as_bytes()[at] == b'/' => &rest[at..],
        _ => "/",
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn complete(bytes: &str) -> (Head, usize) {
        match parse_head(bytes.as_bytes()) {
            Parsed::Complete(head, length) => (*head, length),
            Parsed::Partial => panic!("partial: {bytes:?}"),
            Parsed::Invalid(status, why) => panic!("{status} {why}: {bytes:?}"),
        }
    }

    #[test]
    fn the_core_sees_the_raw_target_and_header_sizes() {
        let raw = "GET /pdb/query/v4/../x?q=%22a%22 HTTP/1.1\r\nHost: h\r\nX-A: bc\r\n\r\nrest";
        let (head, length) = complete(raw);
        assert_eq!(length, raw.len() - "rest".len());
        assert_eq!(head.request.target, "/pdb/query/v4/../x?q=%22a%22");
        assert_eq!(head.request.header_count, 2);
        // name + value + ": " + CRLF, as the tokio binary counts.
        assert_eq!(head.request.header_bytes, (4 + 1 + 4) + (3 + 2 + 4));
        assert!(head.http11 && head.keep_alive);
        assert!(matches!(head.body, RequestBody::None));
    }

    #[test]
    fn keep_alive_follows_the_version_and_connection_header() {
        let (head, _) = complete("GET / HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n");
        assert!(!head.keep_alive);
        let (head, _) = complete("GET / HTTP/1.0\r\n\r\n");
        assert!(!head.http11 && !head.keep_alive);
        let (head, _) = complete("GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n");
        assert!(head.keep_alive);
    }

    #[test]
    fn request_bodies_are_skipped_only_when_their_length_is_known() {
        let (head, _) = complete("POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\n");
        assert!(matches!(head.body, RequestBody::Length(5)));
        let (head, _) =
            complete("POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n");
        assert!(matches!(head.body, RequestBody::Unskippable));
        let (head, _) = complete(
            "POST / HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n",
        );
        assert!(matches!(head.body, RequestBody::Unskippable));
        let (head, _) = complete(
            "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n",
        );
        assert!(matches!(head.body, RequestBody::Length(5)));
        let (head, _) =
            complete("POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: gzip, chunked\r\n\r\n");
        assert!(matches!(head.body, RequestBody::Unskippable));
    }

    #[test]
    fn framing_two_readers_could_read_differently_is_refused() {
        // RFC 9112 section 6.3, and the request-smuggling shapes of the reliability plan.
        for head in [
            "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
            "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: +56\r\n\r\n",
            "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: -1\r\n\r\n",
            "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 5, 5\r\n\r\n",
            "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 0x10\r\n\r\n",
            "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: \r\n\r\n",
            "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: gzip\r\n\r\n",
            "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: xchunked\r\n\r\n",
            "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked, gzip\r\n\r\n",
            "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked, chunked\r\n\r\n",
            "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
            "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n",
            "POST / HTTP/1.0\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n",
        ] {
            assert!(
                matches!(
                    parse_head(head.as_bytes()),
                    Parsed::Invalid(StatusCode::BAD_REQUEST, why) if why.contains("Content-Length")
                        || why.contains("Transfer-Encoding") || why.contains("framing")
                ),
                "{head:?}"
            );
        }
    }

    #[test]
    fn a_request_needs_exactly_one_host() {
        for head in [
            "GET / HTTP/1.1\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
            "GET / HTTP/1.0\r\nHost: a\r\nhost: a\r\n\r\n",
        ] {
            assert!(
                matches!(
                    parse_head(head.as_bytes()),
                    Parsed::Invalid(StatusCode::BAD_REQUEST, _)
                ),
                "{head:?}"
            );
        }
        // HTTP/1.0 predates Host.
        let (head, _) = complete("GET / HTTP/1.0\r\n\r\n");
        assert!(!head.http11);
    }

    #[test]
    fn an_absolute_form_target_is_served_as_its_origin_form() {
        for (target, origin) in [
            (
                "http://pdb.example/pdb/query/v4/nodes?limit=1",
                "/pdb/query/v4/nodes?limit=1",
            ),
            ("HTTPS://pdb.example:8081/pdb/query/v4", "/pdb/query/v4"),
            ("http://pdb.example", "/"),
            ("http://pdb.example?x=1", "/"),
            ("/pdb/query/v4/nodes", "/pdb/query/v4/nodes"),
            (
                "/pdb/query/v4/nodes?limit=1#top",
                "/pdb/query/v4/nodes?limit=1",
            ),
            ("#top", "#top"),
            ("*", "*"),
            ("pdb.example:443", "pdb.example:443"),
        ] {
            assert_eq!(origin_form(target), origin, "{target}");
        }
        let (head, _) = complete("GET http://x/pdb/query/v4/nodes HTTP/1.1\r\nHost: x\r\n\r\n");
        assert_eq!(head.request.target, "/pdb/query/v4/nodes");
    }

    #[test]
    fn incomplete_malformed_and_overfull_heads() {
        assert!(matches!(
            parse_head(b"GET / HTTP/1.1\r\nHost: x\r\n"),
            Parsed::Partial
        ));
        assert!(matches!(
            parse_head(b"GET / HTTP/1.1\r\nHost: h\r\nBad Header\r\n\r\n"),
            Parsed::Invalid(StatusCode::BAD_REQUEST, _)
        ));
        let many: String = (0..=MAX_HEADERS).map(|i| format!("X-{i}: 1\r\n")).collect();
        assert!(matches!(
            parse_head(format!("GET / HTTP/1.1\r\nHost: h\r\n{many}\r\n").as_bytes()),
            Parsed::Invalid(StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE, _)
        ));
    }
}
