//! The routes one backend answers verbatim: pass-through (backends in configured order, the first
//! success streamed), per-certname (the node's owner first, the first answer other than 404
//! stands) and report-hash (every backend at once, whichever holds the report).

use http::{HeaderMap, HeaderValue, StatusCode};
use percent_encoding::percent_decode_str;

use crate::asked_of_all::AnswerRule;
use crate::fanout::{CallState, Calls, Context, Outbound, Plan, Step, Verdict};
use crate::ids::BackendId;
use crate::membership::{Kind, Scope};
use crate::message::{BodyMode, Response, ResponseBody};
use crate::status::{self, Outcome, Rejection};

/// Backends asked one at a time; the first success is the answer, streamed when it is a held
/// body.
#[derive(Debug, Clone)]
pub(crate) struct Sequence {
    target: String,
    /// The certname of a per-certname route: its owner is asked first, and an answer other than
    /// 404 stands (the owner's refusal is the answer, not a reason to ask the others).
    owner_of: Option<String>,
    /// Which kind of the node's data the answer derives from (whose owner is asked first).
    kind: Kind,
    /// How the answer is read: streamed to the client, or whole (a translation pdbmux reads).
    body_mode: BodyMode,
    /// What its requests are for: a client's query, or a translation pdbmux asks for itself.
    purpose: crate::message::Purpose,
    order: Vec<BackendId>,
    /// The node's owner in the membership map, once started: when it fails, another backend's
    /// 404 is no answer (the node exists; its owner could not say what it holds).
    owner: Option<BackendId>,
}

impl Sequence {
    /// Pass-through: backends in configured order, the first success streamed; when every one
    /// refuses, the first refusal is replayed.
    pub(crate) fn first_success(target: String) -> Sequence {
        Sequence {
            target,
            owner_of: None,
            kind: Kind::Node,
            body_mode: BodyMode::StreamSuccess,
            purpose: crate::message::Purpose::Query,
            order: Vec::new(),
            owner: None,
        }
    }

    /// A PQL translation (`ast_only=true`): asked like a pass-through, the answer read whole.
    pub(crate) fn translation(target: String) -> Sequence {
        Sequence {
            body_mode: BodyMode::Buffer,
            purpose: crate::message::Purpose::Translation,
            ..Sequence::first_success(target)
        }
    }

    /// Per-certname: the owner of the raw certname segment's `kind` of data first.
    pub(crate) fn owner_first(target: String, raw_certname: &str, kind: Kind) -> Sequence {
        Sequence {
            owner_of: Some(
                percent_decode_str(raw_certname)
                    .decode_utf8_lossy()
                    .into_owned(),
            ),
            kind,
            ..Sequence::first_success(target)
        }
    }
}

impl Sequence {
    /// When the node's owner failed and another backend's answer stands in for it (as an
    /// unreachable owner must not take the node with it), says so: that answer may be a 404 or
    /// an old copy of a node the owner holds.
    fn warn_if_owner_failed(&self, calls: &Calls, context: &Context) {
        let Some(owner) = self.owner else {
            return;
        };
        let failed = calls
            .outcomes(0)
            .into_iter()
            .find_map(|(backend, outcome)| {
                (backend == owner && matches!(outcome, Outcome::Failed(_))).then_some(outcome)
            });
        if let Some(outcome) = failed {
            tracing::warn!(
                certname = self.owner_of.as_deref().unwrap_or_default(),
                owner = status::backend_name(&context.config.backends, owner),
                "the node's owner failed ({}); another backend's answer stands in",
                outcome.describe()
            );
        }
    }
}

impl Plan for Sequence {
    fn answers_verbatim(&self) -> bool {
        true
    }

    fn again(&self) -> Box<dyn Plan> {
        Box::new(Sequence {
            order: Vec::new(),
            ..self.clone()
        })
    }

    fn needs_ownership(&self) -> bool {
        self.owner_of.is_some()
    }

    fn start(&mut self, context: &Context) -> Vec<(BackendId, usize)> {
        self.order = context.roster.clone();
        if let (Some(certname), Some(ownership)) = (&self.owner_of, &context.ownership) {
            let owners = ownership
                .owners(certname, Scope::Active)
                .or_else(|| ownership.owners(certname, Scope::Any));
            if let Some(owners) = owners {
                let owner = owners.under(context.config.merge, self.kind);
                self.owner = Some(owner);
                if let Some(position) = self.order.iter().position(|b| *b == owner) {
                    let owner = self.order.remove(position);
                    self.order.insert(0, owner);
                }
            }
        }
        self.order
            .first()
            .map(|b| vec![(*b, 0)])
            .unwrap_or_default()
    }

    fn request(&self, _backend: BackendId, _part: usize, _context: &Context) -> Outbound {
        Outbound {
            body_mode: self.body_mode,
            purpose: self.purpose,
            ..Outbound::get(self.target.clone())
        }
    }

    fn progress(&mut self, calls: &Calls, context: &Context) -> Step {
        let owner_first = self.owner_of.is_some();
        for backend in &self.order {
            let Some(call) = calls.get(*backend, 0) else {
                return Step::Call(vec![(*backend, 0)]);
            };
            match &call.state {
                // Only a merge reads held bodies.
                CallState::Pending { .. } | CallState::Reading { .. } => return Step::Wait,
                CallState::Held {
                    id,
                    status,
                    headers,
                } => {
                    self.warn_if_owner_failed(calls, context);
                    return Step::Done(Verdict::Verbatim(Response {
                        status: *status,
                        headers: forwarded_headers(headers),
                        body: ResponseBody::Upstream(*id),
                    }));
                }
                CallState::Done(Outcome::Success {
                    status,
                    headers,
                    body,
                }) => {
                    self.warn_if_owner_failed(calls, context);
                    return Step::Done(Verdict::Verbatim(verbatim(*status, headers, body)));
                }
                CallState::Done(Outcome::Rejected(rejection))
                    if owner_first && rejection.status != StatusCode::NOT_FOUND =>
                {
                    let response = status::replay(rejection, &context.config.backends);
                    return Step::Done(Verdict::Verbatim(response));
                }
                CallState::Done(_) => {}
            }
        }
        // Every backend was asked and none succeeded: replay the first error answer (a 404 for
        // per-certname routes), or 502 when nobody answered or the node's owner failed.
        let outcomes = calls.outcomes(0);
        let first_rejection = outcomes.iter().find_map(|(_, outcome)| match outcome {
            Outcome::Rejected(rejection) => Some(rejection),
            _ => None,
        });
        Step::Done(Verdict::Verbatim(match first_rejection {
            Some(rejection) => {
                self.warn_if_owner_failed(calls, context);
                status::replay(rejection, &context.config.backends)
            }
            None => status::bad_gateway(&outcomes, &context.config.backends),
        }))
    }
}

/// `/reports/<hash>/{events,logs,metrics}` asked of every backend
/// ([`crate::asked_of_all::AskedOfAll`]): only the one holding the report answers 2xx, so the
/// first success is served at once. Without one: the holder's error (anything but 404), else 502
/// when a backend did not answer (it may hold the report), else the unanimous 404.
#[derive(Debug, Clone)]
pub(crate) struct Holder;

impl AnswerRule for Holder {
    const VERBATIM: bool = true;

    fn progress(&self, calls: &Calls, context: &Context) -> Step {
        for call in &calls.0 {
            if let CallState::Done(Outcome::Success {
                status,
                headers,
                body,
            }) = &call.state
            {
                return Step::Done(Verdict::Verbatim(verbatim(*status, headers, body)));
            }
        }
        if !calls.all_done() {
            return Step::Wait;
        }
        let outcomes = calls.outcomes(0);
        let mut holder_error: Option<&Rejection> = None;
        let mut not_found: Option<&Rejection> = None;
        let mut unanswered = false;
        for (_, outcome) in &outcomes {
            match outcome {
                Outcome::Rejected(rejection) if rejection.status == StatusCode::NOT_FOUND => {
                    not_found.get_or_insert(rejection);
                }
                Outcome::Rejected(rejection) => {
                    holder_error.get_or_insert(rejection);
                }
                _ => unanswered = true,
            }
        }
        let backends = &context.config.backends;
        Step::Done(Verdict::Verbatim(
            match (holder_error, unanswered, not_found) {
                (Some(rejection), _, _) => status::replay(rejection, backends),
                (None, false, Some(rejection)) => status::replay(rejection, backends),
                _ => status::bad_gateway(&outcomes, backends),
            },
        ))
    }
}

/// A buffered success served as the backend sent it: its status, its end-to-end headers, and
/// PuppetDB's JSON content type (its body was checked as JSON before it got here).
pub(crate) fn verbatim(status: StatusCode, headers: &HeaderMap, body: &bytes::Bytes) -> Response {
    Response {
        status,
        headers: forwarded_headers(headers),
        body: ResponseBody::Full(body.clone()),
    }
}

/// The upstream headers a verbatim success carries: end-to-end headers only, without framing
/// (the runtime frames the body itself) and without the backend's Date and Server; its content
/// type is always PuppetDB's JSON one, whatever the backend named, because the body is checked
/// as JSON (whole before it is served, or as it streams), so a backend that labels JSON
/// `text/html` cannot make a browser run it (docs/reliability.md).
pub fn forwarded_headers(upstream: &HeaderMap) -> HeaderMap {
    use http::header;
    let named_by_connection: Vec<String> = upstream
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|name| name.trim().to_ascii_lowercase())
        .collect();
    let mut headers = HeaderMap::new();
    for (name, value) in upstream {
        let dropped = matches!(
            name.as_str(),
            "connection"
                | "keep-alive"
                | "proxy-authenticate"
                | "proxy-authorization"
                | "proxy-connection"
                | "te"
                | "trailer"
                | "transfer-encoding"
                | "upgrade"
                | "content-length"
                | "date"
                | "server"
                | "content-type"
        ) || named_by_connection.iter().any(|n| n == name.as_str());
        if !dropped {
            headers.append(name.clone(), value.clone());
        }
    }
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(crate::message::JSON_CONTENT_TYPE),
    );
    headers
}
