//! Replacing backend addresses in replayed bodies with backend names (docs/decisions.md D6).
//!
//! A replayed error body from PuppetDB can mention the address it was reached at. Clients of
//! pdbmux should see the backend's configured name instead, so internal addresses do not leak.

use crate::config::BackendConfig;

/// Rewrites every mention of a backend's address in `body` to that backend's name.
///
/// Matches, case-insensitively: the backend's host (IPv6 literals in brackets), optionally
/// preceded by `http://` or `https://` and optionally followed by `:<port>` (any port: the host
/// alone already names the machine). A host only matches as a whole word, so `db` does not rewrite
/// `database`. Non-UTF-8 bytes are preserved.
pub fn scrub_addresses(body: &[u8], backends: &[BackendConfig]) -> Vec<u8> {
    let mut patterns: Vec<(Vec<u8>, &str)> = Vec::new();
    for backend in backends {
        let host = backend.url.host_for_authority().to_ascii_lowercase();
        for scheme in ["https://", "http://", ""] {
            patterns.push((
                format!("{scheme}{host}").into_bytes(),
                backend.name.as_str(),
            ));
        }
    }
    patterns.sort_by_key(|(pattern, _)| std::cmp::Reverse(pattern.len()));

    let mut out = Vec::with_capacity(body.len());
    let mut i = 0;
    'scan: while i < body.len() {
        if word_start(body, i) {
            for (pattern, name) in &patterns {
                if !starts_with_ignore_case(&body[i..], pattern) {
                    continue;
                }
                let end = port_end(body, i + pattern.len());
                if word_end(body, end) {
                    out.extend_from_slice(name.as_bytes());
                    i = end;
                    continue 'scan;
                }
            }
        }
        out.push(body[i]);
        i += 1;
    }
    out
}

/// Past a `:<digits>` port at `at`, if there is one.
fn port_end(body: &[u8], at: usize) -> usize {
    if body.get(at) != Some(&b':') {
        return at;
    }
    let digits = body[at + 1..]
        .iter()
        .take_while(|b| b.is_ascii_digit())
        .count();
    if digits == 0 {
        at
    } else {
        at + 1 + digits
    }
}

fn starts_with_ignore_case(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.len() >= needle.len() && haystack[..needle.len()].eq_ignore_ascii_case(needle)
}

/// Bytes that continue a host name or number.
fn is_name_byte(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || byte == b'-' || byte == b'_'
}

/// A match may start here: not in the middle of a name, a dotted name or a port.
fn word_start(body: &[u8], at: usize) -> bool {
    match at.checked_sub(1).map(|i| body[i]) {
        None => true,
        Some(prev) => !(is_name_byte(prev) || prev == b'.' || prev == b'[' || prev == b':'),
    }
}

/// A match may end here: the next byte does not continue the name (a sentence's full stop may).
fn word_end(body: &[u8], at: usize) -> bool {
    match body.get(at) {
        None => true,
        Some(&next) if is_name_byte(next) || next == b']' => false,
        Some(b'.') => !body.get(at + 1).is_some_and(|b| is_name_byte(*b)),
        Some(b':') => !body.get(at + 1).is_some_and(u8::is_ascii_digit),
        Some(_) => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{BackendUrl, TlsFiles};

    fn backend(name: &str, scheme: &str, host: &str, port: Option<u16>) -> BackendConfig {
        BackendConfig {
            name: name.into(),
            url: BackendUrl {
                scheme: scheme.into(),
                host: host.into(),
                port,
            },
            tls: TlsFiles::default(),
        }
    }

    fn scrub(body: &str, backends: &[BackendConfig]) -> String {
        String::from_utf8(scrub_addresses(body.as_bytes(), backends)).expect("utf-8 stays utf-8")
    }

    #[test]
    fn url_with_and_without_port() {
        let backends = [backend("pdb-a", "http", "puppetdb1.example.com", None)];
        assert_eq!(
            scrub(
                "error at http://puppetdb1.example.com/pdb/query/v4",
                &backends
            ),
            "error at pdb-a/pdb/query/v4"
        );
        assert_eq!(
            scrub("error at http://puppetdb1.example.com:80/x", &backends),
            "error at pdb-a/x"
        );
        assert_eq!(
            scrub("host puppetdb1.example.com:80 down", &backends),
            "host pdb-a down"
        );
        assert_eq!(
            scrub("host puppetdb1.example.com.", &backends),
            "host pdb-a."
        );
    }

    #[test]
    fn ipv6_in_brackets() {
        let backends = [backend("pdb-b", "http", "::1", Some(8080))];
        assert_eq!(
            scrub(
                "Connection to [::1]:8080 refused; see http://[::1]:8080/status",
                &backends
            ),
            "Connection to pdb-b refused; see pdb-b/status"
        );
        assert_eq!(scrub("at [::1] now", &backends), "at pdb-b now");
    }

    #[test]
    fn any_scheme_and_port_of_the_host() {
        let backends = [backend("pdb-a", "http", "pdb1.example.com", Some(8080))];
        assert_eq!(
            scrub(
                "https://pdb1.example.com:8081/x and pdb1.example.com:443",
                &backends
            ),
            "pdb-a/x and pdb-a"
        );
    }

    #[test]
    fn upper_case_host() {
        let backends = [backend(
            "pdb-a",
            "https",
            "PuppetDB1.Example.COM",
            Some(8081),
        )];
        assert_eq!(
            scrub(
                "HTTPS://PUPPETDB1.EXAMPLE.COM:8081 and puppetdb1.example.com:8081",
                &backends
            ),
            "pdb-a and pdb-a"
        );
    }

    #[test]
    fn bare_host_only_as_a_whole_word() {
        let backends = [backend("pdb-a", "http", "db", Some(8080))];
        assert_eq!(
            scrub("database db.example db:8080 db", &backends),
            "database db.example pdb-a pdb-a"
        );
        let loopback = [backend("pdb-a", "http", "127.0.0.1", Some(18080))];
        assert_eq!(
            scrub(
                "127.0.0.1:18080 127.0.0.10 127.0.0.1:8081 x127.0.0.1",
                &loopback
            ),
            "pdb-a 127.0.0.10 pdb-a x127.0.0.1"
        );
    }

    #[test]
    fn non_utf8_survives() {
        let backends = [backend("pdb-a", "http", "h", Some(1))];
        assert_eq!(
            scrub_addresses(b"\xff h:1 \xfe", &backends),
            b"\xff pdb-a \xfe".to_vec()
        );
    }
}
