//! One access line per request (docs/operating.md, "Following a request"): every field of it,
//! so that answered requests and refused heads write the same line in one place
//! ([`AccessLine::log`]). A whole body's line is written with its response; a streamed body's
//! (passed through from a backend, or a streamed merge) when the body ends, so that it has the
//! bytes sent and how the body ended ([`BodyWatch`]).

use crate::context::ClientContext;
use crate::StreamFailure;

/// One request's access line, its fields owned so that a streamed body can carry it to its end.
#[derive(Debug, Clone)]
pub(crate) struct AccessLine {
    pub(crate) request_id: String,
    /// The client's address, `-` when unknown.
    pub(crate) client: String,
    pub(crate) method: String,
    pub(crate) target: String,
    pub(crate) route: pdbmux_core::RouteClass,
    pub(crate) status: u16,
    /// From the request's arrival to its response head.
    pub(crate) took: std::time::Duration,
    pub(crate) backends: String,
    pub(crate) cache: String,
    /// The body's length, or the bytes a streamed body sent.
    pub(crate) bytes: String,
    /// How the body went: `whole`, or for a streamed one `streamed` (to its end), `cut_off`
    /// (a failure after the first byte: the client's body does not parse) or `client_left`.
    pub(crate) body: &'static str,
    /// Why the answer is not a whole success: set for a 5xx, a partial answer, a refused head, a
    /// streamed body cut off.
    pub(crate) why: Option<String>,
}

impl AccessLine {
    /// A line for the request of `context`; the rest of its fields are the answer's.
    pub(crate) fn of_context(context: &ClientContext) -> AccessLine {
        AccessLine {
            request_id: context.request_id.clone(),
            client: context
                .peer
                .map_or_else(|| "-".to_owned(), |peer| peer.to_string()),
            method: "-".to_owned(),
            target: "-".to_owned(),
            route: pdbmux_core::RouteClass::Refused,
            status: 0,
            took: std::time::Duration::ZERO,
            backends: "-".to_owned(),
            cache: "-".to_owned(),
            bytes: "-".to_owned(),
            body: "whole",
            why: None,
        }
    }

    /// Writes it: at info, or at warn with `why` when there is one.
    pub(crate) fn log(&self) {
        macro_rules! access {
            ($level:ident, $($why:tt)*) => {
                tracing::$level!(
                    target: "pdbmux::access",
                    request_id = %self.request_id,
                    method = %self.method,
                    target = %self.target,
                    route = %self.route,
                    status = self.status,
                    ms = self.took.as_millis() as u64,
                    backends = %self.backends,
                    cache = %self.cache,
                    bytes = %self.bytes,
                    body = %self.body,
                    client = %self.client,
                    $($why)*
                )
            };
        }
        match &self.why {
            Some(why) => access!(warn, why = %why),
            None => access!(info,),
        }
    }
}

/// A streamed body's access line, written once when the body ends: with the bytes it sent, and
/// at warn with why when it was cut off. A body dropped before its end (the client left) writes
/// it as `client_left`.
#[derive(Debug, Default)]
pub(crate) struct BodyWatch {
    /// Boxed: every streamed body carries one, most of them never watched.
    line: Option<Box<AccessLine>>,
    sent: u64,
}

impl BodyWatch {
    /// Watches a body for `line`.
    pub(crate) fn new(line: AccessLine) -> BodyWatch {
        BodyWatch {
            line: Some(Box::new(line)),
            sent: 0,
        }
    }

    /// `bytes` more went to the client.
    pub(crate) fn sent(&mut self, bytes: usize) {
        self.sent += bytes as u64;
    }

    /// The body is whole.
    pub(crate) fn complete(&mut self) {
        self.write("streamed", None);
    }

    /// The body was cut off after the first byte, for `failure`: whether that was written on
    /// the request's line (`false`: nothing watched, the caller logs it itself).
    pub(crate) fn cut_off(&mut self, failure: &StreamFailure) -> bool {
        let why = format!("cut off after {} bytes: {failure}", self.sent);
        self.write("cut_off", Some(why))
    }

    fn write(&mut self, body: &'static str, why: Option<String>) -> bool {
        let Some(mut line) = self.line.take() else {
            return false;
        };
        line.bytes = self.sent.to_string();
        line.body = body;
        line.why = match (line.why, why) {
            (Some(answer), Some(body)) => Some(format!("{answer}; {body}")),
            (answer, body) => answer.or(body),
        };
        line.log();
        true
    }
}

impl Drop for BodyWatch {
    fn drop(&mut self) {
        self.write("client_left", None);
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::sync::{Arc, Mutex};

    use super::*;

    /// The lines `run` logs, as text.
    fn logged(run: impl FnOnce()) -> Vec<String> {
        #[derive(Clone, Default)]
        struct Lines(Arc<Mutex<Vec<u8>>>);
        impl Write for Lines {
            fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
                self.0
                    .lock()
                    .expect("not poisoned")
                    .extend_from_slice(bytes);
                Ok(bytes.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let lines = Lines::default();
        let writer = lines.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, run);
        let text = lines.0.lock().expect("not poisoned").clone();
        let text = String::from_utf8(text).expect("UTF-8 lines");
        text.lines().map(str::to_owned).collect()
    }

    fn line(why: Option<&str>) -> AccessLine {
        AccessLine {
            target: "/pdb/query/v4/facts".to_owned(),
            status: 200,
            why: why.map(str::to_owned),
            ..AccessLine::of_context(&ClientContext::internal())
        }
    }

    #[test]
    fn a_streamed_body_writes_its_line_once_when_it_ends_with_the_bytes_it_sent() {
        let lines = logged(|| {
            let mut watch = BodyWatch::new(line(None));
            watch.sent(1000);
            watch.sent(24);
            watch.complete();
            watch.complete();
        });
        assert_eq!(lines.len(), 1, "{lines:?}");
        for field in [" INFO ", " bytes=1024 ", " body=streamed ", " status=200 "] {
            assert!(lines[0].contains(field), "{field} in {}", lines[0]);
        }
    }

    #[test]
    fn a_body_cut_off_is_the_lines_reason_at_warn_beside_a_partial_answers() {
        let lines = logged(|| {
            let mut watch = BodyWatch::new(line(Some("partial: 1/2 backends answered")));
            watch.sent(7);
            assert!(watch.cut_off(&StreamFailure::DeadlinePassed));
            let mut unwatched = BodyWatch::default();
            assert!(
                !unwatched.cut_off(&StreamFailure::DeadlinePassed),
                "no line to write"
            );
        });
        assert_eq!(lines.len(), 1, "{lines:?}");
        let expected = format!(
            " why=partial: 1/2 backends answered; cut off after 7 bytes: {}",
            StreamFailure::DeadlinePassed
        );
        for field in [" WARN ", " bytes=7 ", " body=cut_off ", &expected] {
            assert!(lines[0].contains(field), "{field} in {}", lines[0]);
        }
    }

    #[test]
    fn a_body_dropped_before_its_end_is_a_client_that_left() {
        let lines = logged(|| {
            let mut watch = BodyWatch::new(line(None));
            watch.sent(3);
            drop(watch);
        });
        assert_eq!(lines.len(), 1, "{lines:?}");
        for field in [" INFO ", " bytes=3 ", " body=client_left "] {
            assert!(lines[0].contains(field), "{field} in {}", lines[0]);
        }
    }
}
