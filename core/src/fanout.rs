//! The one interface every way of answering a request implements: which upstream calls it makes,
//! what it does as their answers arrive, and the verdict it reaches. The [`crate::Exchange`] owns
//! the calls (their IDs, deadlines, cancellation) and the headers and counters every answer gets;
//! a [`Plan`] owns only PuppetDB meaning.
//!
//! A plan numbers its calls to each backend itself (`part`): most make one call per backend
//! (part 0); some ask a backend several things at once (an aggregate's correction, the Jolokia
//! resource count) or ask again in a second round (a page the first answers could not fill).

use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderMap, Method, StatusCode};

use crate::config::Config;
use crate::corrections::{Corrections, Learned};
use crate::ids::{BackendId, UpstreamId};
use crate::membership::Ownership;
use crate::message::{BodyMode, Response};
use crate::status::{Outcome, Unusable};

/// One backend's correction request within a plan (docs/merging.md, "Corrections"): the request,
/// the key its answer is kept under, and the body the estate already knew (then it is not asked
/// again).
#[derive(Debug, Clone)]
pub(crate) struct CorrectionCall {
    pub(crate) backend: BackendId,
    pub(crate) outbound: Outbound,
    pub(crate) key: String,
    pub(crate) known: Option<Bytes>,
}

impl CorrectionCall {
    /// The request to send, marked as a correction for the metrics.
    pub(crate) fn request(&self) -> Outbound {
        Outbound {
            purpose: crate::message::Purpose::Correction,
            ..self.outbound.clone()
        }
    }

    /// What an exchange learned: each correction it asked (its answer not known before) that
    /// a backend answered, as call `part` of `calls`.
    pub(crate) fn learned(
        corrections: &[CorrectionCall],
        calls: &Calls,
        part: usize,
    ) -> Vec<Learned> {
        corrections
            .iter()
            .filter(|c| c.known.is_none())
            .filter_map(|c| {
                let (_, body) = calls.success(c.backend, part)?;
                Some(Learned {
                    backend: c.backend,
                    target: c.key.clone(),
                    body: body.clone(),
                })
            })
            .collect()
    }
}

/// One upstream request as a plan writes it; the exchange adds the ID and the deadline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Outbound {
    pub(crate) method: Method,
    pub(crate) path_and_query: String,
    /// The JSON body of a POST (a rewritten query too long for a URL).
    pub(crate) body: Option<Bytes>,
    pub(crate) body_mode: BodyMode,
    /// What it is for: a query unless the plan says otherwise.
    pub(crate) purpose: crate::message::Purpose,
}

impl Outbound {
    /// A buffered GET of `path_and_query`.
    pub(crate) fn get(path_and_query: impl Into<String>) -> Outbound {
        Outbound {
            method: Method::GET,
            path_and_query: path_and_query.into(),
            body: None,
            body_mode: BodyMode::Buffer,
            purpose: crate::message::Purpose::Query,
        }
    }
}

/// What a plan reads besides the answers: the configuration, the backends this request may ask
/// (in service, configured order), the membership snapshot when the plan needs one, and the
/// corrections learned against that snapshot.
#[derive(Debug, Clone)]
pub(crate) struct Context {
    pub(crate) config: Arc<Config>,
    pub(crate) roster: Vec<BackendId>,
    pub(crate) ownership: Option<Arc<Ownership>>,
    pub(crate) corrections: Arc<Corrections>,
    /// Backends asked although this request leaves them out (it waited them out, or the map
    /// never placed them): every backend in service was, and an answer beats none, but it is
    /// not whole without them, so they do not count in `X-Backends`.
    pub(crate) uncounted: Vec<BackendId>,
    /// Whether the answer may be streamed: it goes to this request's client alone (a flight's
    /// answer is shared and cached whole).
    pub(crate) may_stream: bool,
}

/// Where one call stands.
#[derive(Debug, Clone)]
pub(crate) enum CallState {
    /// Asked; waiting until `deadline`.
    Pending {
        id: UpstreamId,
        deadline: std::time::Instant,
    },
    /// A 2xx whose body the runtime holds, to stream.
    Held {
        id: UpstreamId,
        status: StatusCode,
        headers: HeaderMap,
    },
    /// A 2xx whose held body is being read for a merge that can stream: the pieces so far,
    /// whether a read is asked and not answered yet, and when the body must be whole.
    Reading {
        id: UpstreamId,
        status: StatusCode,
        headers: HeaderMap,
        pieces: Vec<Bytes>,
        asked: bool,
        deadline: std::time::Instant,
    },
    /// Over.
    Done(Outcome),
}

/// One upstream call of an exchange.
#[derive(Debug, Clone)]
pub(crate) struct Call {
    pub(crate) backend: BackendId,
    pub(crate) part: usize,
    /// What it was sent for (a query, a correction, a translation).
    pub(crate) purpose: crate::message::Purpose,
    pub(crate) state: CallState,
}

/// An exchange's calls so far, in the order they were made.
#[derive(Debug, Default)]
pub(crate) struct Calls(pub(crate) Vec<Call>);

impl Calls {
    /// Whether every call has an answer (a body being read has not yet).
    pub(crate) fn all_done(&self) -> bool {
        self.0.iter().all(|call| {
            !matches!(
                call.state,
                CallState::Pending { .. } | CallState::Reading { .. }
            )
        })
    }

    /// The call to `backend` for `part`, if one was made.
    pub(crate) fn get(&self, backend: BackendId, part: usize) -> Option<&Call> {
        self.0
            .iter()
            .find(|call| call.backend == backend && call.part == part)
    }

    /// The 2xx answer of that call, if it has one.
    pub(crate) fn success(&self, backend: BackendId, part: usize) -> Option<(&HeaderMap, &Bytes)> {
        match &self.get(backend, part)?.state {
            CallState::Done(Outcome::Success { headers, body, .. }) => Some((headers, body)),
            _ => None,
        }
    }

    /// The outcome of every finished call for `part`, for the status policy.
    pub(crate) fn outcomes(&self, part: usize) -> Vec<(BackendId, Outcome)> {
        self.0
            .iter()
            .filter(|call| call.part == part)
            .filter_map(|call| match &call.state {
                CallState::Done(outcome) => Some((call.backend, outcome.clone())),
                _ => None,
            })
            .collect()
    }
}

/// What a plan does after an answer.
#[derive(Debug)]
pub(crate) enum Step {
    /// Wait for more answers.
    Wait,
    /// Make these calls too: `(backend, part)`, each written by [`Plan::request`].
    Call(Vec<(BackendId, usize)>),
    /// The answer is known.
    Done(Verdict),
}

/// How a plan answers.
#[derive(Debug)]
pub(crate) enum Verdict {
    /// The estate's answer, built from `contributed` backends: those whose records went in,
    /// and those the membership map shows hold nothing the request asks about (so they were not
    /// asked). Gets `X-Backends` and counts as a round on `/healthz`.
    Merged {
        response: Response,
        contributed: usize,
        unusable: Vec<(BackendId, Unusable)>,
    },
    /// No backend gave a usable answer: the status policy decides from the calls for `part`,
    /// the unusable ones counted as failed.
    Unanswered {
        part: usize,
        unusable: Vec<(BackendId, Unusable)>,
    },
    /// One backend's answer, as it is (a pass-through, the owner's node, the holder's report).
    Verbatim(Response),
}

/// A way of answering a request: one per plan kind (record merges, aggregates, Jolokia, meta,
/// pass-through and per-certname sequences, report holders). Built by [`crate::policy`] once
/// per request; driven by the exchange.
pub(crate) trait Plan: fmt::Debug + Send {
    /// Whether answering needs the membership map (node ownership, docs/merging.md).
    fn needs_ownership(&self) -> bool {
        false
    }

    /// Whether its merged answers are query rounds, counted by `/healthz`'s query object (the
    /// record merges and aggregates; not meta or Jolokia).
    fn counts_rounds(&self) -> bool {
        false
    }

    /// Whether a 2xx answer may be served as the backend sent it (pass-through, per-certname,
    /// report holders, server time). The exchange then checks a buffered one is JSON before the
    /// plan sees it: one that is not is that backend failing (docs/reliability.md); a streamed
    /// one is checked by the driver on its way out.
    fn answers_verbatim(&self) -> bool {
        false
    }

    /// Whether its record calls are asked with held bodies, read whole up to
    /// `stream_above_bytes` and streamed past it (docs/merging.md, "Streamed merges");
    /// known once [`Plan::start`] ran.
    fn streams(&self) -> bool {
        false
    }

    /// The streamed merge of its record calls, when [`Plan::streams`]: the merge over the
    /// backends asked (its inputs, in order) and how many backends the answer counts beyond
    /// those that answered (those it did not need to ask).
    fn stream_start(&mut self, _context: &Context) -> Option<StreamStart> {
        None
    }

    /// Its merge streams (the exchange took [`Plan::stream_start`]'s): what it kept only for a
    /// buffered answer can go, such as a join's other answers, now held in the stream.
    fn streaming(&mut self) {}

    /// Its answer's merge, to run later, when `calls` answered everything it asks and every
    /// record of its answer sorts with one key prefix under `order` (the provenance records'
    /// `name`): an ordered stream it is joined with starts without it, and merges it once its
    /// first records have left, or when it reaches that prefix (`core/src/concat.rs`). `None`
    /// when it cannot wait: a call under way or failed, a body whose first bytes are not an
    /// array of records (checked as far as a streamed answer's bodies are: that backend failing
    /// is decided before the first byte, a break further on ends the body after it), more calls
    /// to come, or no such prefix. Asked on every event until then.
    fn merge_later(
        &mut self,
        _calls: &Calls,
        _context: &Context,
        _order: &crate::sort::OrderBy,
    ) -> Option<crate::streamed::JoinedLater> {
        None
    }

    /// A copy of this plan as it was planned, to ask the backends the prober kept out when every
    /// backend in service failed (fail open). The exchange takes it before [`Plan::start`], and
    /// only when some backend is kept out, so the request is never planned again from its target.
    fn again(&self) -> Box<dyn Plan>;

    /// The first calls, `(backend, part)`, over the backends in `context.roster`.
    fn start(&mut self, context: &Context) -> Vec<(BackendId, usize)>;

    /// The request one call sends.
    fn request(&self, backend: BackendId, part: usize, context: &Context) -> Outbound;

    /// Looks at the calls after one of them finished (or timed out).
    fn progress(&mut self, calls: &Calls, context: &Context) -> Step;

    /// Corrections learned from this exchange's answers, to keep for the rest of the
    /// membership snapshot (docs/merging.md, "Corrections"); read once the exchange responded.
    fn learned(&self, _calls: &Calls) -> Vec<Learned> {
        Vec::new()
    }
}

/// The start of a streamed merge ([`Plan::stream_start`]).
#[derive(Debug)]
pub(crate) struct StreamStart {
    /// The merge, one input per backend in `inputs` (then, for an ordered join, an input for
    /// each joined answer: merged already and read as it is written, `RecordStream::then_merge`,
    /// or merged later, `RecordStream::then_merge_later`).
    pub(crate) merge: crate::streamed::RecordStream,
    /// The record calls that feed it, `(backend, part)`, in input order.
    pub(crate) inputs: Vec<(BackendId, usize)>,
    /// Backends the answer counts without asking them.
    pub(crate) excused: usize,
    /// The most backends the answer counts, when it is joined with answers already merged
    /// (`core/src/concat.rs`): a backend counts only where every part could use it.
    pub(crate) at_most: Option<usize>,
    /// Backends whose answers to the parts already merged could not be used.
    pub(crate) unusable: Vec<(BackendId, Unusable)>,
}

/// Every backend in the roster, part 0: the first round of a plan that asks everyone once.
pub(crate) fn everyone(context: &Context) -> Vec<(BackendId, usize)> {
    context.roster.iter().map(|backend| (*backend, 0)).collect()
}
