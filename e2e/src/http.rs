//! HTTP for the tests: ordinary GETs through `ureq`, and raw requests over a `TcpStream` for
//! targets a client library would normalise or refuse (`..`, `%2e`, POST, oversized URLs).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::OnceLock;
use std::time::Duration;

use crate::Error;

/// Upper bound on one exchange.
const TIMEOUT: Duration = Duration::from_secs(60);
/// Upper bound on a response body the tests read.
const BODY_LIMIT: u64 = 256 * 1024 * 1024;

/// One HTTP response: status, headers in received order, body as text.
#[derive(Debug, Clone)]
pub struct Response {
    /// The status code.
    pub status: u16,
    /// Header names (lower-case) and values.
    pub headers: Vec<(String, String)>,
    /// The body (decoded from chunked transfer encoding; invalid UTF-8 replaced).
    pub body: String,
}

impl Response {
    /// The first value of a header, by case-insensitive name.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The Content-Type header, or "".
    pub fn content_type(&self) -> &str {
        self.header("content-type").unwrap_or("")
    }

    /// The body parsed as JSON.
    pub fn json(&self) -> Result<serde_json::Value, Error> {
        serde_json::from_str(&self.body).map_err(|e| Error::Http {
            what: format!("HTTP {} body", self.status),
            reason: format!("not JSON ({e}): {}", excerpt(&self.body)),
        })
    }
}

/// The first 500 characters of a body, for messages.
pub(crate) fn excerpt(body: &str) -> String {
    let mut s: String = body.chars().take(500).collect();
    if s.len() < body.len() {
        s.push('…');
    }
    s
}

fn agent() -> &'static ureq::Agent {
    static AGENT: OnceLock<ureq::Agent> = OnceLock::new();
    AGENT.get_or_init(|| {
        ureq::Agent::config_builder()
            .http_status_as_error(false)
            .max_redirects(0)
            .proxy(None)
            .timeout_global(Some(TIMEOUT))
            .build()
            .into()
    })
}

/// GET a URL; every status is a response, only transport failures are errors.
pub fn get(url: &str) -> Result<Response, Error> {
    get_with_headers(url, &[])
}

/// GET a URL with extra request headers.
pub fn get_with_headers(url: &str, headers: &[(&str, &str)]) -> Result<Response, Error> {
    let fail = |reason: String| Error::Http {
        what: format!("GET {url}"),
        reason,
    };
    let mut request = agent().get(url);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let mut resp = request.call().map_err(|e| fail(e.to_string()))?;
    let status = resp.status().as_u16();
    let headers = resp
        .headers()
        .iter()
        .map(|(n, v)| {
            (
                n.as_str().to_owned(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect();
    let body = resp
        .body_mut()
        .with_config()
        .limit(BODY_LIMIT)
        .read_to_vec()
        .map_err(|e| fail(format!("reading the body: {e}")))?;
    Ok(Response {
        status,
        headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    })
}

/// `base` with `params` appended as a form-encoded query string.
pub fn url_with_query(base: &str, params: &[(&str, &str)]) -> String {
    if params.is_empty() {
        return base.to_owned();
    }
    let mut out = String::from(base);
    out.push(if base.contains('?') { '&' } else { '?' });
    for (i, (k, v)) in params.iter().enumerate() {
        if i > 0 {
            out.push('&');
        }
        out.push_str(&encode(k));
        out.push('=');
        out.push_str(&encode(v));
    }
    out
}

/// Percent-encodes everything but RFC 3986 unreserved characters.
fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Sends `request` as is to `addr` and reads one response (the request should say
/// `Connection: close`; the response is complete at its framing's end or at EOF).
pub fn raw_request(addr: SocketAddr, request: &[u8]) -> Result<Response, Error> {
    let line = String::from_utf8_lossy(request.split(|b| *b == b'\r').next().unwrap_or(&[]))
        .chars()
        .take(200)
        .collect::<String>();
    let fail = |reason: String| Error::Http {
        what: format!("raw request {line:?} to {addr}"),
        reason,
    };
    let mut stream =
        TcpStream::connect_timeout(&addr, TIMEOUT).map_err(|e| fail(format!("connect: {e}")))?;
    stream
        .set_read_timeout(Some(TIMEOUT))
        .and_then(|()| stream.set_write_timeout(Some(TIMEOUT)))
        .map_err(|e| fail(format!("set timeouts: {e}")))?;
    let head_request = request.starts_with(b"HEAD ");
    let bytes = exchange(&mut stream, request, head_request).map_err(|e| fail(e.to_string()))?;
    parse(&bytes, head_request).map_err(fail)
}

/// Splits a response into head and body start; None while the head is incomplete.
fn split_head(buf: &[u8]) -> Option<(&[u8], &[u8])> {
    buf.windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|i| (&buf[..i], &buf[i + 4..]))
}

struct Head {
    status: u16,
    headers: Vec<(String, String)>,
}

fn parse_head(head: &[u8]) -> Result<Head, String> {
    let text = String::from_utf8_lossy(head);
    let mut lines = text.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let mut parts = status_line.splitn(3, ' ');
    let version = parts.next().unwrap_or_default();
    if !version.starts_with("HTTP/1.") {
        return Err(format!("not an HTTP/1.x status line: {status_line:?}"));
    }
    let status = parts
        .next()
        .and_then(|s| s.parse::<u16>().ok())
        .ok_or_else(|| format!("bad status line: {status_line:?}"))?;
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    Ok(Head { status, headers })
}

enum Framing {
    Chunked,
    Length(usize),
    UntilClose,
}

fn framing(head: &Head, head_request: bool) -> Framing {
    let value = |name: &str| {
        head.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    };
    if head_request || head.status == 204 || head.status == 304 || (100..200).contains(&head.status)
    {
        return Framing::Length(0);
    }
    if value("transfer-encoding").is_some_and(|v| v.to_ascii_lowercase().contains("chunked")) {
        return Framing::Chunked;
    }
    match value("content-length").and_then(|v| v.parse().ok()) {
        Some(n) => Framing::Length(n),
        None => Framing::UntilClose,
    }
}

/// Decodes a chunked body; None while incomplete.
fn dechunk(mut body: &[u8]) -> Option<Result<Vec<u8>, String>> {
    let mut out = Vec::new();
    loop {
        let (size_line, rest) = match body.windows(2).position(|w| w == b"\r\n") {
            Some(i) => (&body[..i], &body[i + 2..]),
            None => return None,
        };
        let size_text = String::from_utf8_lossy(size_line);
        let size_hex = size_text.split(';').next().unwrap_or_default().trim();
        let size = match usize::from_str_radix(size_hex, 16) {
            Ok(n) => n,
            Err(_) => return Some(Err(format!("bad chunk size line {size_text:?}"))),
        };
        if size == 0 {
            // Trailers (if any) end with an empty line; a missing final CRLF is tolerated.
            return Some(Ok(out));
        }
        if rest.len() < size + 2 {
            return None;
        }
        out.extend_from_slice(&rest[..size]);
        body = &rest[size + 2..];
    }
}

/// Whether `buf` holds a complete response by its own framing.
fn complete(buf: &[u8], head_request: bool) -> bool {
    let Some((head, body)) = split_head(buf) else {
        return false;
    };
    let Ok(head) = parse_head(head) else {
        return true; // garbage: stop reading, parse() reports it
    };
    match framing(&head, head_request) {
        Framing::Chunked => dechunk(body).is_some(),
        Framing::Length(n) => body.len() >= n,
        Framing::UntilClose => false,
    }
}

fn parse(buf: &[u8], head_request: bool) -> Result<Response, String> {
    let (head, body) = split_head(buf).ok_or_else(|| {
        format!(
            "connection closed before a complete response head ({} bytes: {:?})",
            buf.len(),
            excerpt(&String::from_utf8_lossy(buf))
        )
    })?;
    let head = parse_head(head)?;
    let body = match framing(&head, head_request) {
        Framing::Chunked => dechunk(body).ok_or("connection closed inside a chunked body")??,
        Framing::Length(n) if body.len() >= n => body[..n].to_vec(),
        Framing::Length(n) => {
            return Err(format!(
                "connection closed after {} of {n} body bytes",
                body.len()
            ))
        }
        Framing::UntilClose => body.to_vec(),
    };
    Ok(Response {
        status: head.status,
        headers: head.headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    })
}

/// Writes `bytes` to `stream` and reads one response.
fn exchange(stream: &mut TcpStream, bytes: &[u8], head_request: bool) -> std::io::Result<Vec<u8>> {
    stream.write_all(bytes)?;
    stream.flush()?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    loop {
        match stream.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => {
                buf.extend_from_slice(&chunk[..n]);
                if complete(&buf, head_request) {
                    break;
                }
            }
            // A server that answers early (414, 431) and closes may reset the connection
            // while unread request bytes are in flight: keep what was read.
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset && !buf.is_empty() => break,
            Err(e) => return Err(e),
        }
    }
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_content_length_and_chunked_bodies() {
        let r = parse(
            b"HTTP/1.1 405 Method Not Allowed\r\nAllow: GET\r\nContent-Length: 2\r\n\r\nno",
            false,
        )
        .expect("parse");
        assert_eq!(
            (r.status, r.header("allow"), r.body.as_str()),
            (405, Some("GET"), "no")
        );
        let chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\n[1,\r\n2\r\n2]\r\n0\r\n\r\n";
        assert!(complete(chunked, false));
        assert!(!complete(&chunked[..chunked.len() - 7], false));
        assert_eq!(parse(chunked, false).expect("parse").body, "[1,2]");
        let head = b"HTTP/1.1 405 Method Not Allowed\r\nContent-Length: 20\r\n\r\n";
        assert!(complete(head, true));
        assert_eq!(parse(head, true).expect("parse").body, "");
    }

    #[test]
    fn encodes_query_parameters() {
        assert_eq!(
            url_with_query(
                "http://h/p",
                &[("query", r#"["=","certname","a b"]"#), ("limit", "1")]
            ),
            "http://h/p?query=%5B%22%3D%22%2C%22certname%22%2C%22a%20b%22%5D&limit=1"
        );
    }
}
