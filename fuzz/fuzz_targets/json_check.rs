//! Any bytes as a streamed verbatim body, cut into chunks at the positions the first bytes give:
//! the driver's streamed check (`CheckedStream`) and the core's buffered one (`check_json`) agree
//! on whether the body is JSON, a body that passes comes out byte for byte, and one that fails
//! never comes out whole. One known difference: a `\u` escape of a surrogate that is not part of
//! a pair is JSON's grammar, which serde_json lets by, but actson refuses (docs/reliability.md).

#![no_main]
#![forbid(unsafe_code)]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use pdbmux_driver::CheckedStream;

fuzz_target!(|data: &[u8]| {
    let Some((&cuts, rest)) = data.split_first() else {
        return;
    };
    let Some((sizes, body)) = rest.split_at_checked(usize::from(cuts % 8)) else {
        return;
    };
    let mut check = CheckedStream::new();
    let mut sent = Vec::new();
    let mut left = body;
    let mut passed = true;
    for size in sizes
        .iter()
        .map(|s| usize::from(*s) + 1)
        .chain(std::iter::repeat(16_384))
    {
        if left.is_empty() {
            break;
        }
        let (chunk, after) = left.split_at(size.min(left.len()));
        left = after;
        match check.push(Bytes::copy_from_slice(chunk)) {
            Ok(ready) => sent.extend_from_slice(&ready.unwrap_or_default()),
            Err(_) => {
                passed = false;
                break;
            }
        }
    }
    if passed {
        match check.finish() {
            Ok(last) => sent.extend_from_slice(&last.unwrap_or_default()),
            Err(_) => passed = false,
        }
    }
    let buffered = pdbmux_core::check_json(body).is_ok();
    if passed != buffered {
        assert!(
            buffered && has_surrogate_escape(body),
            "streamed and buffered disagree (streamed {passed}, buffered {buffered})"
        );
    }
    if passed {
        assert_eq!(sent, body);
    } else {
        assert!(sent.len() < body.len() || body.is_empty());
    }
});

/// Whether `body` holds a `\u` escape of a UTF-16 surrogate (D800 to DFFF).
fn has_surrogate_escape(body: &[u8]) -> bool {
    body.windows(4).any(|w| {
        w[0] == b'\\'
            && w[1] == b'u'
            && w[2].eq_ignore_ascii_case(&b'd')
            && matches!(w[3].to_ascii_lowercase(), b'8'..=b'9' | b'a'..=b'f')
    })
}
