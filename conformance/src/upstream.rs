//! Reading upstream requests back: client targets built from unencoded parameters, and every
//! upstream request with its query string decoded, so a snapshot shows the query pdbmux wrote.

use crate::harness::Harness;
use crate::puppetdb::decode_component;

/// A GET target with these (unencoded) parameters, form-encoded in this order.
pub fn form_target(path: &str, params: &[(&str, &str)]) -> String {
    if params.is_empty() {
        return path.to_owned();
    }
    let query: Vec<String> = params
        .iter()
        .map(|(key, value)| format!("{key}={}", form_encode(value)))
        .collect();
    format!("{path}?{}", query.join("&"))
}

/// Percent-encodes a parameter value (unreserved characters kept).
pub fn form_encode(value: &str) -> String {
    let mut out = String::new();
    for byte in value.bytes() {
        match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(char::from(byte))
            }
            _ => out.push_str(&format!("%{byte:02X}")),
        }
    }
    out
}

/// Every upstream request sent so far, one per line (`machine id -> backend METHOD path ? k=v &
/// …`, or `body …` for a POST), query parameters decoded; lines longer than `max` characters are
/// cut.
pub fn decoded_upstream(h: &Harness, max: usize) -> String {
    let mut out = String::new();
    for sent in h.sends() {
        let request = &sent.request;
        let (path, query) = match request.path_and_query.split_once('?') {
            Some((path, query)) => (path, Some(query)),
            None => (request.path_and_query.as_str(), None),
        };
        let mut line = format!(
            "{} {} -> {} {} {path}",
            sent.machine, request.id, sent.backend_name, request.method
        );
        if let Some(query) = query {
            let params: Vec<String> = query
                .split('&')
                .map(|piece| match piece.split_once('=') {
                    Some((key, value)) => {
                        format!("{}={}", decode_component(key), decode_component(value))
                    }
                    None => decode_component(piece),
                })
                .collect();
            line.push_str(&format!(" ? {}", params.join(" & ")));
        }
        if let Some(body) = &request.body {
            line.push_str(&format!(" body {}", String::from_utf8_lossy(body)));
        }
        if line.chars().count() > max {
            let total = line.len();
            line = line.chars().take(max).collect();
            line.push_str(&format!("…({total} bytes)"));
        }
        out.push_str(&line);
        out.push('\n');
    }
    out
}
