//! Fake backends: what each one answers, after how long.
//!
//! A [`FakeBackend`] is a name, a base URL (as pdbmux would be configured with it) and a
//! [`Script`] that turns each upstream request into a [`Reply`]. The harness asks the script when
//! the core emits the `Send`, and delivers the reply after its latency on the simulated clock.

use std::collections::VecDeque;
use std::fmt;
use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderName, CONTENT_TYPE};
use http::{HeaderMap, HeaderValue, Method, StatusCode};
use pdbmux_core::{UpstreamFailure, UpstreamRequest, JSON_CONTENT_TYPE, TEXT_CONTENT_TYPE};

use crate::error::HarnessError;

/// A scripted answer from a backend: a status line with headers and body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScriptedAnswer {
    /// The status the backend answers with.
    pub status: StatusCode,
    /// The `Content-Type` it sends, if any.
    pub content_type: Option<String>,
    /// Further headers, in the order sent (name, value).
    pub headers: Vec<(String, String)>,
    /// The whole body.
    pub body: Bytes,
}

impl ScriptedAnswer {
    /// The answer's headers as an HTTP header map; an error names a header that is not valid.
    pub fn header_map(&self) -> Result<HeaderMap, HarnessError> {
        let mut headers = HeaderMap::new();
        let bad = |name: &str, value: &str| HarnessError::BadHeader {
            name: name.to_owned(),
            value: value.to_owned(),
        };
        if let Some(content_type) = &self.content_type {
            let value = HeaderValue::from_str(content_type)
                .map_err(|_| bad("content-type", content_type))?;
            headers.insert(CONTENT_TYPE, value);
        }
        for (name, value) in &self.headers {
            let header_name =
                HeaderName::from_bytes(name.as_bytes()).map_err(|_| bad(name, value))?;
            let header_value = HeaderValue::from_str(value).map_err(|_| bad(name, value))?;
            headers.append(header_name, header_value);
        }
        Ok(headers)
    }
}

/// What happens to one upstream request once its latency has passed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplyOutcome {
    /// The backend answers.
    Answer(ScriptedAnswer),
    /// The request fails without an answer (`Timeout` is the core's to decide, so scripts use
    /// `Connect`, `Transport` or `BodyTooLarge`).
    Fail(UpstreamFailure),
    /// The backend never answers; only the core's deadline ends the request.
    Never,
    /// Reading the answer panics the task that reads it: a defect in pdbmux's own code,
    /// simulated, to see that one task's panic ends that task only.
    Panic,
}

/// One scripted reply: a latency on the simulated clock, then an outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    /// How long after the send the outcome is delivered (ignored for [`ReplyOutcome::Never`]).
    pub latency: Duration,
    /// What is delivered.
    pub outcome: ReplyOutcome,
}

impl Reply {
    /// An answer with this status, content type and body, delivered without delay.
    pub fn answer(status: StatusCode, content_type: Option<&str>, body: impl Into<Bytes>) -> Reply {
        Reply {
            latency: Duration::ZERO,
            outcome: ReplyOutcome::Answer(ScriptedAnswer {
                status,
                content_type: content_type.map(str::to_owned),
                headers: Vec::new(),
                body: body.into(),
            }),
        }
    }

    /// A JSON answer under PuppetDB's content type.
    pub fn json(status: StatusCode, body: impl Into<Bytes>) -> Reply {
        Reply::answer(status, Some(JSON_CONTENT_TYPE), body)
    }

    /// A 200 JSON answer.
    pub fn ok(body: impl Into<Bytes>) -> Reply {
        Reply::json(StatusCode::OK, body)
    }

    /// A plain-text answer (PuppetDB sends its 400s as text).
    pub fn text(status: StatusCode, body: impl Into<Bytes>) -> Reply {
        Reply::answer(status, Some(TEXT_CONTENT_TYPE), body)
    }

    /// A failure without an answer.
    pub fn fail(failure: UpstreamFailure) -> Reply {
        Reply {
            latency: Duration::ZERO,
            outcome: ReplyOutcome::Fail(failure),
        }
    }

    /// Connection refused.
    pub fn refused() -> Reply {
        Reply::fail(UpstreamFailure::Connect {
            cause: pdbmux_core::ConnectCause::Refused,
            detail: "connection refused".to_owned(),
        })
    }

    /// The connection broke after it was made.
    pub fn reset() -> Reply {
        Reply::fail(UpstreamFailure::Transport("connection reset".to_owned()))
    }

    /// The body went over this many bytes.
    pub fn too_large(limit: u64) -> Reply {
        Reply::fail(UpstreamFailure::BodyTooLarge { limit })
    }

    /// The backend never answers.
    pub fn never() -> Reply {
        Reply {
            latency: Duration::ZERO,
            outcome: ReplyOutcome::Never,
        }
    }

    /// An answer whose reading panics the task reading it ([`ReplyOutcome::Panic`]).
    pub fn panic() -> Reply {
        Reply {
            latency: Duration::ZERO,
            outcome: ReplyOutcome::Panic,
        }
    }

    /// The same reply, delivered `latency` after the send.
    #[must_use]
    pub fn after(mut self, latency: Duration) -> Reply {
        self.latency = latency;
        self
    }

    /// The same reply with one more header (ignored unless it is an answer).
    #[must_use]
    pub fn header(mut self, name: &str, value: &str) -> Reply {
        if let ReplyOutcome::Answer(answer) = &mut self.outcome {
            answer.headers.push((name.to_owned(), value.to_owned()));
        }
        self
    }
}

/// Shorthand for a latency of `n` milliseconds.
pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// How a fake backend chooses its reply to each request.
pub enum Script {
    /// Replies in order, one per request; a request after the last is a harness error.
    Queue(VecDeque<Reply>),
    /// Replies in order, starting over after the last; an empty cycle is a harness error.
    Cycle {
        /// The replies.
        replies: Vec<Reply>,
        /// Index of the next reply.
        next: usize,
    },
    /// A function of the request's path and query.
    ByPath(Box<dyn FnMut(&str) -> Reply + Send>),
    /// A function of the whole request (method, path and query, POST body), for a fake that
    /// evaluates what it is asked (see [`crate::PuppetDb`]).
    ByRequest(Box<dyn FnMut(&Asked<'_>) -> Reply + Send>),
}

impl fmt::Debug for Script {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Script::Queue(replies) => f.debug_tuple("Queue").field(replies).finish(),
            Script::Cycle { replies, next } => f
                .debug_struct("Cycle")
                .field("replies", replies)
                .field("next", next)
                .finish(),
            Script::ByPath(_) => f.write_str("ByPath(..)"),
            Script::ByRequest(_) => f.write_str("ByRequest(..)"),
        }
    }
}

impl Script {
    /// The reply to a GET of `path_and_query`, or `None` when the script has run out.
    pub fn next_reply(&mut self, path_and_query: &str) -> Option<Reply> {
        self.next_reply_to(&Asked::get(path_and_query))
    }

    /// The reply to this request, or `None` when the script has run out.
    pub fn next_reply_to(&mut self, request: &Asked<'_>) -> Option<Reply> {
        match self {
            Script::Queue(replies) => replies.pop_front(),
            Script::Cycle { replies, next } => {
                let reply = replies.get(*next % replies.len().max(1)).cloned();
                *next += 1;
                reply
            }
            Script::ByPath(function) => Some(function(request.path_and_query)),
            Script::ByRequest(function) => Some(function(request)),
        }
    }
}

/// One scripted backend as pdbmux is configured with it.
#[derive(Debug)]
pub struct FakeBackend {
    /// The backend's configured name.
    pub name: String,
    /// The backend's configured base URL, `http(s)://host[:port]` (IPv6 in brackets).
    pub url: String,
    /// What it answers.
    pub script: Script,
    /// Fixed replies for exact paths and queries (for example the membership queries), asked
    /// before `script`.
    pub fixed: Vec<(String, Reply)>,
}

impl FakeBackend {
    /// A backend with this script.
    pub fn new(name: &str, url: &str, script: Script) -> FakeBackend {
        FakeBackend {
            name: name.to_owned(),
            url: url.to_owned(),
            script,
            fixed: Vec::new(),
        }
    }

    /// The same backend, answering every request for exactly `path_and_query` with `reply`
    /// instead of asking its script.
    #[must_use]
    pub fn on(mut self, path_and_query: &str, reply: Reply) -> FakeBackend {
        self.fixed.push((path_and_query.to_owned(), reply));
        self
    }

    /// The reply to a request for `path_and_query`: a fixed one, else the script's next; `None`
    /// when the script has run out.
    pub fn reply_to(&mut self, path_and_query: &str) -> Option<Reply> {
        self.reply_to_request(&Asked::get(path_and_query))
    }

    /// The reply to this upstream request: a fixed one for its exact path and query, else the
    /// script's next; `None` when the script has run out.
    pub fn reply_to_request(&mut self, request: &Asked<'_>) -> Option<Reply> {
        match self
            .fixed
            .iter()
            .find(|(fixed, _)| fixed == request.path_and_query)
        {
            Some((_, reply)) => Some(reply.clone()),
            None => self.script.next_reply_to(request),
        }
    }

    /// A backend that answers its requests with these replies, in order.
    pub fn queue(name: &str, url: &str, replies: impl IntoIterator<Item = Reply>) -> FakeBackend {
        FakeBackend::new(name, url, Script::Queue(replies.into_iter().collect()))
    }

    /// A backend that answers every request with the same reply.
    pub fn always(name: &str, url: &str, reply: Reply) -> FakeBackend {
        FakeBackend::cycle(name, url, vec![reply])
    }

    /// A backend that cycles through these replies.
    pub fn cycle(name: &str, url: &str, replies: Vec<Reply>) -> FakeBackend {
        FakeBackend::new(name, url, Script::Cycle { replies, next: 0 })
    }

    /// A backend whose reply is a function of the whole upstream request (method, path and
    /// query, POST body).
    pub fn by_request(
        name: &str,
        url: &str,
        function: impl FnMut(&Asked<'_>) -> Reply + Send + 'static,
    ) -> FakeBackend {
        FakeBackend::new(name, url, Script::ByRequest(Box::new(function)))
    }

    /// A backend whose reply is a function of the request's path and query.
    pub fn by_path(
        name: &str,
        url: &str,
        function: impl FnMut(&str) -> Reply + Send + 'static,
    ) -> FakeBackend {
        FakeBackend::new(name, url, Script::ByPath(Box::new(function)))
    }
}

/// What a fake backend is asked: the parts of an upstream request a backend sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Asked<'a> {
    /// GET, or POST for a rewritten query too long for a URL.
    pub method: &'a Method,
    /// The path and query string.
    pub path_and_query: &'a str,
    /// The POST body, if any.
    pub body: Option<&'a [u8]>,
}

impl<'a> Asked<'a> {
    /// A GET of `path_and_query`.
    pub fn get(path_and_query: &'a str) -> Asked<'a> {
        Asked {
            method: &Method::GET,
            path_and_query,
            body: None,
        }
    }

    /// What the backend sees of this upstream request.
    pub fn of(request: &'a UpstreamRequest) -> Asked<'a> {
        Asked {
            method: &request.method,
            path_and_query: &request.path_and_query,
            body: request.body.as_deref(),
        }
    }
}
