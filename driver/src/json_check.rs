//! Streamed upstream bodies checked as JSON on their way to the client (docs/reliability.md,
//! "Verbatim answers are checked").
//!
//! A pass-through or per-certname answer is streamed, not buffered, so pdbmux cannot choose
//! another backend once bytes have gone out. What it can do is never complete a body that is
//! not one JSON value: [`CheckedStream`] holds back the latest chunk until the next one (or the
//! end) shows the body is still JSON, so a body found broken ends with the client missing at
//! least that chunk and the runtime aborting the connection: an unterminated chunked body, a
//! Content-Length not reached.

use actson::feeder::PushJsonFeeder;
use actson::options::JsonParserOptionsBuilder;
use actson::{JsonEvent, JsonParser};
use bytes::Bytes;

use pdbmux_core::MAX_JSON_DEPTH;

use crate::access::BodyWatch;

/// A streamed body that is not one JSON value (or nests deeper than [`MAX_JSON_DEPTH`], as a
/// buffered answer may not either).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("upstream body is not JSON: {reason} at byte {offset}")]
pub struct NotJson {
    /// What the parser found.
    pub reason: String,
    /// How many bytes of the body it had read.
    pub offset: usize,
}

/// The JSON check of one streamed body, with the chunk it holds back. Use it between the
/// upstream body and the client: [`CheckedStream::push`] each chunk as it arrives and send what
/// it gives back; at the upstream body's end, [`CheckedStream::finish`] gives the last chunk or
/// says the body was not JSON (then abort the client connection instead of ending the body).
pub struct CheckedStream {
    parser: JsonParser<PushJsonFeeder>,
    held: Option<Bytes>,
    failed: Option<NotJson>,
    /// The start of a UTF-8 sequence the last chunk ended inside (actson does not check UTF-8;
    /// JSON text must be UTF-8, and serde_json refuses anything else).
    utf8_tail: Vec<u8>,
}

impl Default for CheckedStream {
    fn default() -> Self {
        CheckedStream::new()
    }
}

impl CheckedStream {
    /// A check for a new body.
    pub fn new() -> CheckedStream {
        let options = JsonParserOptionsBuilder::default()
            // actson counts the bottom of its stack as a level.
            .with_max_depth(MAX_JSON_DEPTH + 1)
            .build();
        CheckedStream {
            parser: JsonParser::new_with_options(PushJsonFeeder::new(), options),
            held: None,
            failed: None,
            utf8_tail: Vec::new(),
        }
    }

    /// Checks the next chunk of the body. `Ok` gives the chunk that may now be sent (the one
    /// held before, `None` for the first), holding `chunk` back in its place; `Err` when the
    /// body so far cannot begin a JSON value, and for every chunk after that.
    pub fn push(&mut self, chunk: Bytes) -> Result<Option<Bytes>, NotJson> {
        self.check(&chunk)?;
        if chunk.is_empty() {
            return Ok(None);
        }
        Ok(self.held.replace(chunk))
    }

    /// How many bytes are held back (the chunk [`CheckedStream::push`] kept last).
    pub fn held_len(&self) -> usize {
        self.held.as_ref().map_or(0, Bytes::len)
    }

    /// Ends the body: `Ok` gives the held chunk, the last to send, when the whole body was one
    /// JSON value with nothing but whitespace after it.
    pub fn finish(&mut self) -> Result<Option<Bytes>, NotJson> {
        if let Some(failed) = &self.failed {
            return Err(failed.clone());
        }
        if !self.utf8_tail.is_empty() {
            return Err(self.fail("the body ended inside a UTF-8 sequence"));
        }
        // A space ends a last token first: at the end of input, actson takes a cut-off literal
        // or number (`nul`, `2e`) for a whole one. Whitespace after the value is JSON.
        self.check(b" ")?;
        self.parser.feeder.done();
        loop {
            match self.parser.next_event() {
                Ok(None) => return Ok(self.held.take()),
                Ok(Some(JsonEvent::NeedMoreInput)) => {
                    return Err(self.fail("the body ended inside a value"))
                }
                Ok(Some(event)) => self.check_number(event)?,
                Err(error) => return Err(self.fail(&error.to_string())),
            }
        }
    }

    fn check(&mut self, mut chunk: &[u8]) -> Result<(), NotJson> {
        if let Some(failed) = &self.failed {
            return Err(failed.clone());
        }
        self.check_utf8(chunk)?;
        while !chunk.is_empty() {
            let pushed = self.parser.feeder.push_bytes(chunk);
            chunk = &chunk[pushed..];
            loop {
                match self.parser.next_event() {
                    Ok(Some(JsonEvent::NeedMoreInput)) => break,
                    Ok(Some(event)) => self.check_number(event)?,
                    // The value ended and bytes follow it.
                    Ok(None) => return Err(self.fail("bytes after the value")),
                    Err(error) => return Err(self.fail(&error.to_string())),
                }
            }
        }
        Ok(())
    }

    /// Checks a number's syntax as the buffered check does (serde_json, skipping it as a raw
    /// value, so any magnitude passes): actson lets some malformed numbers through (`2e` at the
    /// end of a body).
    fn check_number(&mut self, event: JsonEvent) -> Result<(), NotJson> {
        if !matches!(event, JsonEvent::ValueInt | JsonEvent::ValueFloat) {
            return Ok(());
        }
        let valid = self
            .parser
            .current_str()
            .is_ok_and(|text| serde_json::from_str::<&serde_json::value::RawValue>(text).is_ok());
        if valid {
            Ok(())
        } else {
            Err(self.fail("a malformed number"))
        }
    }

    /// Checks that the body so far is UTF-8, keeping a sequence the chunk ends inside for the
    /// next one (a chunk boundary can split a character).
    fn check_utf8(&mut self, chunk: &[u8]) -> Result<(), NotJson> {
        let joined;
        let bytes = if self.utf8_tail.is_empty() {
            chunk
        } else {
            joined = [self.utf8_tail.as_slice(), chunk].concat();
            joined.as_slice()
        };
        self.utf8_tail.clear();
        match std::str::from_utf8(bytes) {
            Ok(_) => Ok(()),
            Err(error) if error.error_len().is_none() => {
                self.utf8_tail
                    .extend_from_slice(&bytes[error.valid_up_to()..]);
                Ok(())
            }
            Err(_) => Err(self.fail("not UTF-8")),
        }
    }

    fn fail(&mut self, reason: &str) -> NotJson {
        let failed = NotJson {
            reason: reason.to_owned(),
            offset: self.parser.parsed_bytes(),
        };
        self.failed = Some(failed.clone());
        self.held = None;
        failed
    }
}

/// Why a streamed body was cut off.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StreamFailure {
    /// The body is not one JSON value.
    #[error(transparent)]
    NotJson(#[from] NotJson),
    /// Reading the upstream body failed (it went over `max_body_bytes`, its connection broke).
    #[error("reading the upstream body: {0}")]
    Upstream(String),
    /// The deadline passed before the body's end.
    #[error("upstream body not complete before the deadline")]
    DeadlinePassed,
    /// A streamed merge's own memory (the digests that tell a history record's copies) went over
    /// a memory budget.
    #[error("the merge's record digests went {0}")]
    OverBudget(pdbmux_core::UpstreamFailure),
}

/// What both binaries' streamed-body wrappers decide, whatever their body type: each chunk
/// checked ([`CheckedStream`]), the upstream body's end, its failure and the deadline. A failure
/// sticks (every later call fails the same way, so nothing can complete the body) and is logged
/// once. A wrapper feeds it what it reads and sends what it gives back; on `Err` it fails the
/// client's body.
#[derive(Default)]
pub struct StreamedBody {
    check: CheckedStream,
    ended: bool,
    failed: Option<StreamFailure>,
    /// The request's access line, written when the body ends.
    watch: BodyWatch,
}

impl StreamedBody {
    /// A new body, nothing read yet.
    pub fn new() -> StreamedBody {
        StreamedBody::default()
    }

    /// Writes the request's access line (`watch`) when the body ends.
    pub(crate) fn watched(&mut self, watch: BodyWatch) {
        self.watch = watch;
    }

    /// A chunk read from upstream: `Ok` gives what may go out now (see [`CheckedStream::push`]).
    pub fn chunk(&mut self, chunk: Bytes) -> Result<Option<Bytes>, StreamFailure> {
        self.still_going()?;
        match self.check.push(chunk) {
            Ok(out) => {
                self.watch.sent(out.as_ref().map_or(0, Bytes::len));
                Ok(out)
            }
            Err(not_json) => Err(self.fail(not_json.into())),
        }
    }

    /// The upstream body ended: `Ok` gives the last chunk to send; after it, only trailers.
    pub fn end(&mut self) -> Result<Option<Bytes>, StreamFailure> {
        self.still_going()?;
        match self.check.finish() {
            Ok(last) => {
                self.ended = true;
                self.watch.sent(last.as_ref().map_or(0, Bytes::len));
                self.watch.complete();
                Ok(last)
            }
            Err(not_json) => Err(self.fail(not_json.into())),
        }
    }

    /// Reading the upstream body failed with `why`.
    pub fn upstream_failed(&mut self, why: &dyn std::fmt::Display) -> StreamFailure {
        self.failed
            .clone()
            .unwrap_or_else(|| self.fail(StreamFailure::Upstream(why.to_string())))
    }

    /// The deadline passed while the body was still streaming.
    pub fn deadline_passed(&mut self) -> StreamFailure {
        self.failed
            .clone()
            .unwrap_or_else(|| self.fail(StreamFailure::DeadlinePassed))
    }

    /// Whether the body was read and checked to its end.
    pub fn ended(&self) -> bool {
        self.ended
    }

    /// Why the body failed, if it did.
    pub fn failure(&self) -> Option<&StreamFailure> {
        self.failed.as_ref()
    }

    /// How many bytes are held back, to count in a size hint.
    pub fn held_len(&self) -> usize {
        self.check.held_len()
    }

    fn still_going(&self) -> Result<(), StreamFailure> {
        match &self.failed {
            Some(failure) => Err(failure.clone()),
            None => Ok(()),
        }
    }

    fn fail(&mut self, failure: StreamFailure) -> StreamFailure {
        if !self.watch.cut_off(&failure) {
            tracing::warn!("aborting a streamed response: {failure}");
        }
        self.failed = Some(failure.clone());
        failure
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_streamed_body_failure_sticks_whatever_comes_after() {
        let mut body = StreamedBody::new();
        assert_eq!(body.chunk(Bytes::from_static(b"[1,")), Ok(None));
        assert_eq!(
            body.deadline_passed(),
            StreamFailure::DeadlinePassed,
            "the first failure is the one"
        );
        assert_eq!(
            body.upstream_failed(&"reset"),
            StreamFailure::DeadlinePassed
        );
        assert_eq!(
            body.chunk(Bytes::from_static(b"2]")),
            Err(StreamFailure::DeadlinePassed)
        );
        assert_eq!(body.end(), Err(StreamFailure::DeadlinePassed));
        assert!(!body.ended());
    }

    #[test]
    fn a_streamed_body_that_is_not_json_fails_at_the_chunk_that_shows_it() {
        let mut body = StreamedBody::new();
        assert_eq!(body.chunk(Bytes::from_static(b"[1]")), Ok(None));
        let failed = body.chunk(Bytes::from_static(b"x"));
        assert!(
            matches!(failed, Err(StreamFailure::NotJson(_))),
            "{failed:?}"
        );
        assert_eq!(body.failure().cloned(), failed.err());
    }

    #[test]
    fn a_whole_streamed_body_ends_with_its_held_chunk() {
        let mut body = StreamedBody::new();
        assert_eq!(body.chunk(Bytes::from_static(b"[1,")), Ok(None));
        assert_eq!(body.held_len(), 3);
        assert_eq!(
            body.chunk(Bytes::from_static(b"2]")),
            Ok(Some(Bytes::from_static(b"[1,")))
        );
        assert_eq!(body.end(), Ok(Some(Bytes::from_static(b"2]"))));
        assert!(body.ended() && body.failure().is_none());
    }

    /// The body in chunks of `size`: what was sent, and whether it finished.
    fn stream(body: &[u8], size: usize) -> (Vec<u8>, Result<(), NotJson>) {
        let mut check = CheckedStream::new();
        let mut sent = Vec::new();
        for chunk in body.chunks(size.max(1)) {
            match check.push(Bytes::copy_from_slice(chunk)) {
                Ok(ready) => sent.extend(ready.unwrap_or_default()),
                Err(error) => return (sent, Err(error)),
            }
        }
        match check.finish() {
            Ok(last) => {
                sent.extend(last.unwrap_or_default());
                (sent, Ok(()))
            }
            Err(error) => (sent, Err(error)),
        }
    }

    #[test]
    fn json_bodies_pass_whole_in_any_chunking() {
        let bodies: [&[u8]; 6] = [
            b"[]",
            b"[{\"certname\":\"a.example\",\"n\":-1.5e3,\"ok\":true,\"x\":null}]",
            b"  {\"a\": [1, 2, {\"b\": \"\\u00e9\\\"\"}]}\n",
            "[\"caf\u{e9} \u{1f600}\"]".as_bytes(),
            b"0",
            b"\"just a string\"",
        ];
        for body in bodies {
            for size in [1, 2, 3, 7, 4096] {
                let (sent, result) = stream(body, size);
                assert_eq!(
                    result,
                    Ok(()),
                    "{:?} in chunks of {size}",
                    String::from_utf8_lossy(body)
                );
                assert_eq!(sent, body);
            }
        }
    }

    #[test]
    fn broken_bodies_never_reach_the_client_whole() {
        let bodies: [&[u8]; 10] = [
            b"",
            b"[",
            b"[1,",
            b"[{\"a\":1}",
            b"[1]]",
            b"[1] x",
            b"[1][2]",
            b"<html>login</html>",
            b"[\"unterminated]",
            b"{\"a\" 1}",
        ];
        for body in bodies {
            for size in [1, 2, 5, 4096] {
                let (sent, result) = stream(body, size);
                assert!(
                    result.is_err(),
                    "{:?} in chunks of {size}",
                    String::from_utf8_lossy(body)
                );
                assert!(
                    sent.len() < body.len() || body.is_empty(),
                    "{:?} in chunks of {size}: {} of {} bytes sent",
                    String::from_utf8_lossy(body),
                    sent.len(),
                    body.len()
                );
            }
        }
    }

    #[test]
    fn streamed_and_buffered_bodies_agree_on_json_and_depth() {
        let nested = |depth: usize| format!("{}{}", "[".repeat(depth), "]".repeat(depth));
        let bodies = [
            nested(MAX_JSON_DEPTH),
            nested(MAX_JSON_DEPTH + 1),
            "[1]".to_owned(),
            "[1]]".to_owned(),
            "[1".to_owned(),
            "\"\u{e9}\"".to_owned(),
            "2e".to_owned(),
            "nul".to_owned(),
            "[tru".to_owned(),
            "fals".to_owned(),
            "12".to_owned(),
            "[1.]".to_owned(),
            "[-]".to_owned(),
            "[01]".to_owned(),
            "[1e+]".to_owned(),
            "[-0.5e-3, 1E9, 0, 2555555555555555E55555555]".to_owned(),
            " {\"a\":\"]\"} ".to_owned(),
        ];
        for body in bodies {
            let buffered = pdbmux_core::check_json(body.as_bytes()).is_ok();
            assert_eq!(stream(body.as_bytes(), 64).1.is_ok(), buffered, "{body:?}");
        }
        assert!(stream(nested(MAX_JSON_DEPTH + 1).as_bytes(), 64).1.is_err());
    }

    #[test]
    fn a_body_that_is_not_utf8_fails_wherever_the_chunks_split_it() {
        for body in [
            &b"\"\xd9\xff\xff\"\n"[..],
            b"[\"\xff\"]",
            b"[\"\xc3\"]",
            b"\"\xe2\x82\"",
        ] {
            for size in [1, 2, 3, 4096] {
                assert!(
                    stream(body, size).1.is_err(),
                    "{body:?} in chunks of {size}"
                );
            }
            assert!(pdbmux_core::check_json(body).is_err());
        }
    }

    #[test]
    fn after_a_failure_every_chunk_fails() {
        let mut check = CheckedStream::new();
        assert!(check.push(Bytes::from_static(b"[1]]")).is_err());
        assert!(check.push(Bytes::from_static(b" ")).is_err());
        assert!(check.finish().is_err());
    }
}
