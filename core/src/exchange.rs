//! The per-request machine: sends the calls its [`Plan`] asks for, collects the answers, and
//! turns the plan's verdict into the one response (the status policy, `X-Backends`, the round
//! `/healthz` counts).
//!
//! An [`Exchange`] runs on the request's own task, so merges of different requests run on
//! different cores at once; it touches no shared state. Create it with [`crate::Estate::admit`].

use std::collections::VecDeque;
use std::time::Instant;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, StatusCode};

use crate::corrections::Learned;
use crate::fanout::{Call, CallState, Calls, Context, Plan, Step, StreamStart, Verdict};
use crate::healthz::Round;
use crate::ids::{BackendId, Counter, UpstreamId};
use crate::message::{
    Purpose, Response, ResponseBody, UpstreamBody, UpstreamFailure, UpstreamRequest,
    UpstreamResponse, X_BACKENDS,
};
use crate::route::RouteClass;
use crate::stats::CallOutcome;
use crate::status::{self, backend_name, Failure, Outcome, Rejection, Unusable};
use crate::streamed::MergeStream;

/// What an [`Exchange`] asks of the runtime; drain with [`Exchange::poll_output`].
#[derive(Debug, Clone)]
pub enum ExchangeOutput {
    /// Send this request upstream and report the answer with
    /// [`Exchange::handle_upstream_response`] or [`Exchange::handle_upstream_failure`].
    Send(UpstreamRequest),
    /// Abandon this upstream request (and drop a held body); its answer is no longer wanted.
    Cancel(UpstreamId),
    /// Read the next piece of this held body and report it with
    /// [`Exchange::handle_upstream_piece`], its end with [`Exchange::handle_upstream_end`], or
    /// its failure with [`Exchange::handle_upstream_failure`].
    Read(UpstreamId),
    /// Send this response to the client. Always the last output of an exchange.
    Respond(Response),
}

/// What a finished exchange tells the estate: the round `/healthz` counts, and the corrections
/// it learned (docs/merging.md). Hand it to [`crate::Estate::handle_report`].
#[derive(Debug, Clone)]
pub struct ExchangeReport {
    pub(crate) class: RouteClass,
    pub(crate) round: Option<Round>,
    /// The membership snapshot's generation and what was learned against it.
    pub(crate) learned: Option<(u64, Vec<Learned>)>,
    pub(crate) calls: Vec<(BackendId, Purpose, CallOutcome)>,
}

impl ExchangeReport {
    /// The route class of the request it answered ([`crate::Planned::class`]).
    pub fn class(&self) -> RouteClass {
        self.class
    }

    /// Each upstream call it made, what for and how it ended, in the order they were made (those
    /// a fail-over gave up, cancelled, last).
    pub fn calls(&self) -> &[(BackendId, Purpose, CallOutcome)] {
        &self.calls
    }
}

/// How many of each backend's first bytes a streamed merge reads before its first byte leaves:
/// enough records that a body which is not a JSON array of objects is found while it can still
/// be that backend's failure (a partial answer), few enough to merge in well under a
/// millisecond. A streamed answer's provenance answers are checked as far, however small
/// (`RecordPlan::merge_later`, `core/src/merge/mod.rs`).
pub(crate) const CHECKED_BEFORE_STREAMING: usize = 64 * 1024;

/// One client request's upstream work, as a sans-IO state machine.
///
/// Contract: after construction and after every `handle_*` call, drain [`Exchange::poll_output`]
/// until `None`, then read [`Exchange::poll_timeout`] and call [`Exchange::handle_timeout`] when it
/// passes. `now` never goes backwards. Answers for cancelled or unknown IDs are ignored (a held
/// body among them is cancelled again).
#[derive(Debug)]
pub struct Exchange {
    context: Context,
    target: String,
    plan: Box<dyn Plan>,
    calls: Calls,
    ids: Counter,
    outputs: VecDeque<ExchangeOutput>,
    finished: bool,
    /// The backends the prober kept out of this request's roster were asked once every backend
    /// in it failed (fail open per request).
    failed_over: bool,
    /// The plan as planned, kept (when some backend is out of the roster) to start again over
    /// the ones kept out.
    spare: Option<Box<dyn Plan>>,
    /// The streamed merge the response names ([`ResponseBody::Merged`]), until taken.
    stream: Option<Box<MergeStream>>,
    /// Calls still under way when the request failed over, cancelled then (their answers would
    /// be taken for the fail-over's own): reported as cancelled.
    abandoned: Vec<(BackendId, Purpose)>,
    report: ExchangeReport,
}

impl Exchange {
    /// Starts `plan` for the request to `target` (for logs) of route `class` in `context`.
    pub(crate) fn new(
        now: Instant,
        context: Context,
        (class, target): (RouteClass, String),
        plan: Box<dyn Plan>,
    ) -> Exchange {
        let kept_out = context.roster.len() < context.config.backends.len();
        let spare = kept_out.then(|| plan.again());
        let mut exchange = Exchange {
            context,
            target,
            plan,
            spare,
            stream: None,
            abandoned: Vec::new(),
            calls: Calls::default(),
            ids: Counter::default(),
            outputs: VecDeque::new(),
            finished: false,
            failed_over: false,
            report: ExchangeReport {
                class,
                round: None,
                learned: None,
                calls: Vec::new(),
            },
        };
        let first = exchange.plan.start(&exchange.context);
        if first.is_empty() {
            exchange.respond(Response::text(
                StatusCode::BAD_GATEWAY,
                "pdbmux: no backend to ask",
            ));
        }
        for (backend, part) in first {
            exchange.send(now, backend, part);
        }
        exchange
    }

    /// An upstream answer arrived (any status).
    pub fn handle_upstream_response(
        &mut self,
        now: Instant,
        id: UpstreamId,
        response: UpstreamResponse,
    ) {
        let Some(index) = self.pending(id) else {
            if response.body == UpstreamBody::Held {
                self.outputs.push_back(ExchangeOutput::Cancel(id));
            }
            return;
        };
        let state = match response.body {
            // A merge that can stream reads it (docs/merging.md, "Streamed merges").
            UpstreamBody::Held if response.status.is_success() && self.plan.streams() => {
                let deadline = match self.calls.0[index].state {
                    CallState::Pending { deadline, .. } => deadline,
                    _ => now,
                };
                CallState::Reading {
                    id,
                    status: response.status,
                    headers: response.headers,
                    pieces: Vec::new(),
                    asked: false,
                    deadline,
                }
            }
            UpstreamBody::Held if response.status.is_success() => CallState::Held {
                id,
                status: response.status,
                headers: response.headers,
            },
            UpstreamBody::Held => {
                // A runtime must buffer non-2xx bodies; treat a violation as a failed backend.
                self.outputs.push_back(ExchangeOutput::Cancel(id));
                CallState::Done(Outcome::Failed(Failure::HeldBody(response.status)))
            }
            UpstreamBody::Full(body) => {
                let outcome = outcome_of(response.status, response.headers, body);
                CallState::Done(match outcome {
                    Outcome::Success { ref body, .. } if self.plan.answers_verbatim() => {
                        match crate::records::check_json(body) {
                            Ok(()) => outcome,
                            Err(error) => Outcome::Failed(Failure::Unusable(
                                Unusable::Unparseable(error.to_string()),
                            )),
                        }
                    }
                    outcome => outcome,
                })
            }
        };
        self.calls.0[index].state = state;
        self.progress(now);
    }

    /// The next piece of a held body this exchange asked to read ([`ExchangeOutput::Read`]).
    pub fn handle_upstream_piece(&mut self, now: Instant, id: UpstreamId, piece: Bytes) {
        let Some(index) = self.reading(id) else {
            return;
        };
        if let CallState::Reading { pieces, asked, .. } = &mut self.calls.0[index].state {
            *asked = false;
            if !piece.is_empty() {
                pieces.push(piece);
            }
        }
        self.progress(now);
    }

    /// The end of a held body this exchange was reading: the call's answer is whole.
    pub fn handle_upstream_end(&mut self, now: Instant, id: UpstreamId) {
        let Some(index) = self.reading(id) else {
            return;
        };
        let call = &mut self.calls.0[index];
        if let CallState::Reading {
            status,
            headers,
            pieces,
            ..
        } = &mut call.state
        {
            let body = match pieces.as_slice() {
                [one] => one.clone(),
                _ => Bytes::from(pieces.concat()),
            };
            let outcome = outcome_of(*status, std::mem::take(headers), body);
            call.state = CallState::Done(outcome);
        }
        self.progress(now);
    }

    /// The streamed merge the response names ([`ResponseBody::Merged`]); `None` before the
    /// exchange responded so, and after it was taken.
    pub fn take_stream(&mut self) -> Option<MergeStream> {
        self.stream.take().map(|stream| *stream)
    }

    /// An upstream request failed without an answer, or a held body being read failed.
    pub fn handle_upstream_failure(
        &mut self,
        now: Instant,
        id: UpstreamId,
        failure: UpstreamFailure,
    ) {
        let Some(index) = self.pending(id).or_else(|| self.reading(id)) else {
            return;
        };
        // Over a memory budget: the request is refused whole, whatever the other backends
        // answer; no backend failed, so no round is counted against them.
        let refusal = match &failure {
            UpstreamFailure::OverBudget { scope, limit } => {
                Some(crate::budget::over_budget(*scope, *limit))
            }
            _ => None,
        };
        self.calls.0[index].state = CallState::Done(Outcome::Failed(failure.into()));
        match refusal {
            Some(response) => self.respond(response),
            None => self.progress(now),
        }
    }

    /// Time passed; upstream requests past their deadline count as timed out. A call before any
    /// deadline is a no-op.
    pub fn handle_timeout(&mut self, now: Instant) {
        if self.finished {
            return;
        }
        let mut expired = false;
        for call in &mut self.calls.0 {
            let (CallState::Pending { id, deadline } | CallState::Reading { id, deadline, .. }) =
                call.state
            else {
                continue;
            };
            if deadline <= now {
                self.outputs.push_back(ExchangeOutput::Cancel(id));
                call.state = CallState::Done(Outcome::Failed(UpstreamFailure::Timeout.into()));
                expired = true;
            }
        }
        if expired {
            self.progress(now);
        }
    }

    /// The next thing the runtime must do, if any.
    pub fn poll_output(&mut self) -> Option<ExchangeOutput> {
        self.outputs.pop_front()
    }

    /// The earliest upstream deadline, or `None` once the exchange has responded. While output is
    /// queued this is never later than the queued work needs.
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.finished {
            return None;
        }
        self.calls
            .0
            .iter()
            .filter_map(|call| match call.state {
                CallState::Pending { deadline, .. } | CallState::Reading { deadline, .. } => {
                    Some(deadline)
                }
                _ => None,
            })
            .min()
    }

    /// The request target this exchange answers, as received (for log lines).
    pub fn target(&self) -> &str {
        &self.target
    }

    /// What the estate should learn from this exchange once it has responded (the `/healthz`
    /// round, corrections); empty before then.
    pub fn report(&self) -> ExchangeReport {
        self.report.clone()
    }

    /// Whether the response has been produced (it may still be queued in `poll_output`).
    pub fn is_finished(&self) -> bool {
        self.finished
    }

    fn pending(&self, id: UpstreamId) -> Option<usize> {
        if self.finished {
            return None;
        }
        self.calls.0.iter().position(
            |call| matches!(call.state, CallState::Pending { id: pending, .. } if pending == id),
        )
    }

    /// The call whose held body is being read under `id`, if this exchange still wants it.
    fn reading(&self, id: UpstreamId) -> Option<usize> {
        if self.finished {
            return None;
        }
        self.calls.0.iter().position(
            |call| matches!(call.state, CallState::Reading { id: reading, .. } if reading == id),
        )
    }

    fn send(&mut self, now: Instant, backend: BackendId, part: usize) {
        let outbound = self.plan.request(backend, part, &self.context);
        let id = UpstreamId(self.ids.next());
        let deadline = now + self.context.config.timeout;
        self.calls.0.push(Call {
            backend,
            part,
            purpose: outbound.purpose,
            state: CallState::Pending { id, deadline },
        });
        self.outputs
            .push_back(ExchangeOutput::Send(UpstreamRequest {
                id,
                backend,
                method: outbound.method,
                path_and_query: outbound.path_and_query,
                body: outbound.body,
                body_mode: outbound.body_mode,
                deadline,
                purpose: outbound.purpose,
                correlation: Vec::new(),
            }));
    }

    fn progress(&mut self, now: Instant) {
        if self.finished {
            return;
        }
        if self.read_on() {
            return;
        }
        match self.plan.progress(&self.calls, &self.context) {
            // A plan whose stream waited on its own progress (a join whose other parts were
            // merged just now, `core/src/concat.rs`) streams now. Should every body it would
            // stream break in its first bytes as it starts, those calls have failed: the plan
            // is asked again (each time with fewer calls under way, so this ends).
            Step::Wait => {
                let under_way = self.calls_under_way();
                if !self.read_on() && self.calls_under_way() < under_way {
                    self.progress(now);
                }
            }
            Step::Call(more) => {
                for (backend, part) in more {
                    self.send(now, backend, part);
                }
            }
            Step::Done(verdict) if self.fails_over(&verdict) => self.fail_over(now),
            Step::Done(verdict) => self.finish(verdict),
        }
    }

    /// How many calls have not ended (asked, or a body held or being read).
    fn calls_under_way(&self) -> usize {
        self.calls
            .0
            .iter()
            .filter(|call| !matches!(call.state, CallState::Done(_)))
            .count()
    }

    /// Whether this verdict means no backend this request asked could answer while the prober
    /// kept others out of its roster: those may answer (a prober can be wrong about a backend
    /// whose queries work), so they are asked before the request fails.
    fn fails_over(&self, verdict: &Verdict) -> bool {
        let unanswered = match verdict {
            Verdict::Unanswered { part, .. } => {
                status::failure_verdict(&self.calls.outcomes(*part), &self.context.config.backends)
                    .into_response()
                    .status
                    .is_server_error()
            }
            // A per-certname, report-hash, pass-through or translation answer: a 5xx replayed
            // from every backend in service is no answer either.
            Verdict::Verbatim(response) => response.status.is_server_error(),
            Verdict::Merged { .. } => false,
        };
        unanswered && !self.failed_over && !self.kept_out().is_empty()
    }

    /// The configured backends not in this request's roster.
    fn kept_out(&self) -> Vec<BackendId> {
        (0..self.context.config.backends.len())
            .map(BackendId)
            .filter(|backend| !self.context.roster.contains(backend))
            .collect()
    }

    /// Starts the request again, planned afresh, over the backends the prober kept out.
    fn fail_over(&mut self, now: Instant) {
        self.failed_over = true;
        let Some(plan) = self.spare.take() else {
            return self.respond(Response::text(
                StatusCode::BAD_GATEWAY,
                "pdbmux: no backend answered",
            ));
        };
        tracing::warn!(
            target = %self.target,
            "every backend in service failed; asking the ones the prober took out"
        );
        self.abandon_unfinished();
        self.plan = plan;
        self.context.roster = self.kept_out();
        let first = self.plan.start(&self.context);
        if first.is_empty() {
            return self.respond(Response::text(
                StatusCode::BAD_GATEWAY,
                "pdbmux: no backend to ask",
            ));
        }
        for (backend, part) in first {
            self.send(now, backend, part);
        }
    }

    /// Cancels the calls still under way (asked, or a held body) and takes them out of the
    /// calls the plan sees: a plan can answer before all its calls are over (a join whose one
    /// part failed), and a fail-over's plan must not wait on, or take, the first attempt's.
    fn abandon_unfinished(&mut self) {
        let (over, unfinished): (Vec<Call>, Vec<Call>) = std::mem::take(&mut self.calls.0)
            .into_iter()
            .partition(|call| matches!(call.state, CallState::Done(_)));
        for call in unfinished {
            if let CallState::Pending { id, .. }
            | CallState::Held { id, .. }
            | CallState::Reading { id, .. } = call.state
            {
                self.outputs.push_back(ExchangeOutput::Cancel(id));
            }
            self.abandoned.push((call.backend, call.purpose));
        }
        self.calls.0 = over;
    }

    /// Reads the held bodies of a merge that can stream: each is asked piece by piece while
    /// they hold at most `stream_above_bytes` together. Past it, once every call has its head,
    /// each body its first [`CHECKED_BEFORE_STREAMING`] bytes and no read is outstanding, the
    /// merge streams (and the exchange responds): `true` then.
    fn read_on(&mut self) -> bool {
        if !self.plan.streams() {
            return false;
        }
        let mut read = 0;
        let mut outstanding = false;
        let mut reading = false;
        for call in &self.calls.0 {
            match &call.state {
                CallState::Reading { pieces, asked, .. } => {
                    read += pieces.iter().map(Bytes::len).sum::<usize>();
                    outstanding |= *asked;
                    reading = true;
                }
                CallState::Done(Outcome::Success { body, .. }) => read += body.len(),
                _ => {}
            }
        }
        let over = u64::try_from(read).unwrap_or(u64::MAX) > self.context.config.stream_above_bytes;
        let mut unread = false;
        for call in &mut self.calls.0 {
            if let CallState::Reading {
                id, asked, pieces, ..
            } = &mut call.state
            {
                // Past the threshold, each body is still read to its first
                // CHECKED_BEFORE_STREAMING bytes: a body that is not JSON there is found before
                // the first byte leaves, however fast another backend filled the threshold.
                let checked = pieces.iter().map(Bytes::len).sum::<usize>();
                if !*asked && (!over || checked < CHECKED_BEFORE_STREAMING) {
                    *asked = true;
                    unread = true;
                    self.outputs.push_back(ExchangeOutput::Read(*id));
                }
            }
        }
        // Bodies all whole already (none held, or every one read to its end): nothing is gained
        // by streaming them, and the buffered answer can be cached and shared; unless
        // `stream_above_bytes` is 0, which streams every answer that can stream.
        let stream_whole = self.context.config.stream_above_bytes == 0;
        if !over || unread || outstanding || !(reading || stream_whole) {
            return false;
        }
        let heads_known = !self
            .calls
            .0
            .iter()
            .any(|call| matches!(call.state, CallState::Pending { .. }));
        heads_known && self.stream_merge()
    }

    /// Starts the plan's streamed merge over each backend's first bytes read so far (the
    /// pieces holding its first [`CHECKED_BEFORE_STREAMING`] bytes; the rest is merged as the
    /// answer is written), and responds with it: the head as a buffered merge's (`X-Backends`,
    /// the round), the body [`ResponseBody::Merged`].
    /// A backend whose first bytes are not a JSON array of objects is unusable (D7) and the
    /// merge starts again without it; `false` when no body is left to stream.
    fn stream_merge(&mut self) -> bool {
        loop {
            let Some(StreamStart {
                mut merge,
                inputs,
                excused,
                at_most,
                unusable,
            }) = self.plan.stream_start(&self.context)
            else {
                return false;
            };
            let mut bodies = Vec::new();
            let mut read_ahead = Vec::new();
            let mut contributed = excused;
            let mut broken = None;
            for (input, &(backend, part)) in inputs.iter().enumerate() {
                let state = self.calls.get(backend, part).map(|call| &call.state);
                let fed = match state {
                    Some(CallState::Reading { id, pieces, .. }) => {
                        bodies.push((input, *id));
                        // Its first bytes now (a body whose first bytes do not parse is that
                        // backend's failure, before the first byte), the rest as the answer is
                        // written, so that the first byte does not wait for them.
                        let mut checked = 0;
                        pieces.iter().try_for_each(|piece| {
                            if checked >= CHECKED_BEFORE_STREAMING {
                                read_ahead.push((input, piece.clone()));
                                return Ok(());
                            }
                            checked += piece.len();
                            merge.push(input, piece)
                        })
                    }
                    Some(CallState::Done(Outcome::Success { body, .. })) => {
                        merge.push(input, body).and_then(|()| merge.end(input))
                    }
                    _ => {
                        merge.skip(input);
                        continue;
                    }
                };
                match fed {
                    Ok(()) => contributed += 1,
                    Err(error) => {
                        broken = Some((backend, part, error));
                        break;
                    }
                }
            }
            if let Some((backend, part, error)) = broken {
                let unusable = Unusable::Unparseable(error.to_string());
                if let Some(call) = self
                    .calls
                    .0
                    .iter_mut()
                    .find(|call| call.backend == backend && call.part == part)
                {
                    if let CallState::Reading { id, .. } = call.state {
                        self.outputs.push_back(ExchangeOutput::Cancel(id));
                    }
                    call.state = CallState::Done(Outcome::Failed(unusable.into()));
                }
                let reading = self
                    .calls
                    .0
                    .iter()
                    .any(|call| matches!(call.state, CallState::Reading { .. }));
                if !reading {
                    return false;
                }
                continue;
            }
            // No backend's answer is left to stream (each failed before its first byte): not
            // an answer of none, but every backend failing, which the plan's verdict says.
            if contributed == excused {
                return false;
            }
            for call in &mut self.calls.0 {
                if let CallState::Reading { pieces, .. } = &mut call.state {
                    pieces.clear();
                }
            }
            self.stream = Some(Box::new(MergeStream::new(merge, bodies, read_ahead)));
            self.plan.streaming();
            let mut response = Response::json(StatusCode::OK, "");
            response.body = ResponseBody::Merged;
            self.finish(Verdict::Merged {
                response,
                contributed: at_most.map_or(contributed, |most| contributed.min(most)),
                unusable,
            });
            return true;
        }
    }

    fn finish(&mut self, verdict: Verdict) {
        // Partial against the estate: a backend the prober kept out is missing from the answer.
        let asked = self.context.config.backends.len();
        let rounds = self.plan.counts_rounds();
        let response = match verdict {
            Verdict::Verbatim(response) => {
                if response.status.is_server_error() {
                    self.log_unanswered(response.status);
                } else {
                    self.log_failures();
                }
                response
            }
            Verdict::Merged {
                response,
                contributed,
                unusable,
            } => {
                self.mark_unusable(unusable);
                // Backends asked only because every one in service was left out do not count:
                // those of them whose answer went in are taken off (one that failed was never
                // counted).
                let contributed = contributed.saturating_sub(self.uncounted_contributors());
                if rounds {
                    self.report.round = Some(Round {
                        asked,
                        contributed,
                        refused: false,
                    });
                }
                self.log_partial();
                self.with_backends_header(response, contributed)
            }
            Verdict::Unanswered { part, unusable } => {
                self.mark_unusable(unusable);
                self.log_failures();
                let verdict = status::failure_verdict(
                    &self.calls.outcomes(part),
                    &self.context.config.backends,
                );
                let refused = matches!(&verdict, status::FailureVerdict::Unanimous(r) if r.status.is_client_error());
                if rounds {
                    self.report.round = Some(Round {
                        asked,
                        contributed: 0,
                        refused,
                    });
                }
                self.with_backends_header(verdict.into_response(), 0)
            }
        };
        let learned = self.plan.learned(&self.calls);
        if let (false, Some(ownership)) = (learned.is_empty(), &self.context.ownership) {
            self.report.learned = Some((ownership.generation(), learned));
        }
        self.respond(response);
    }

    /// The answers a plan could not use count as that backend failing (D7).
    /// How many of the context's uncounted backends have an answer in the merge: a call that
    /// succeeded, or a body still being read into a streamed answer.
    fn uncounted_contributors(&self) -> usize {
        self.context
            .uncounted
            .iter()
            .filter(|backend| {
                self.calls.0.iter().any(|call| {
                    call.backend == **backend
                        && matches!(
                            call.state,
                            CallState::Done(Outcome::Success { .. }) | CallState::Reading { .. }
                        )
                })
            })
            .count()
    }

    fn mark_unusable(&mut self, unusable: Vec<(BackendId, Unusable)>) {
        for (backend, reason) in unusable {
            for call in self
                .calls
                .0
                .iter_mut()
                .filter(|call| call.backend == backend)
            {
                if matches!(call.state, CallState::Done(Outcome::Success { .. })) {
                    call.state = CallState::Done(Outcome::Failed(reason.clone().into()));
                }
            }
        }
    }

    fn respond(&mut self, response: Response) {
        self.report.calls = self
            .calls
            .0
            .iter()
            .map(|call| {
                (
                    call.backend,
                    call.purpose,
                    CallOutcome::of_call(&call.state),
                )
            })
            .chain(
                self.abandoned
                    .iter()
                    .map(|(backend, purpose)| (*backend, *purpose, CallOutcome::Cancelled)),
            )
            .collect();
        for call in &self.calls.0 {
            match call.state {
                CallState::Pending { id, .. } => {
                    self.outputs.push_back(ExchangeOutput::Cancel(id));
                }
                // A held body that is not the answer is released.
                CallState::Held { id, .. }
                    if response.body != crate::message::ResponseBody::Upstream(id) =>
                {
                    self.outputs.push_back(ExchangeOutput::Cancel(id));
                }
                // So is one being read that no streamed merge goes on reading.
                CallState::Reading { id, .. }
                    if !self
                        .stream
                        .as_ref()
                        .is_some_and(|stream| stream.bodies().iter().any(|(_, b)| *b == id)) =>
                {
                    self.outputs.push_back(ExchangeOutput::Cancel(id));
                }
                _ => {}
            }
        }
        self.finished = true;
        self.outputs.push_back(ExchangeOutput::Respond(response));
    }

    fn with_backends_header(&self, mut response: Response, contributed: usize) -> Response {
        let value = format!("{}/{}", contributed, self.context.config.backends.len());
        if let Ok(value) = HeaderValue::from_str(&value) {
            response.headers.insert(X_BACKENDS, value);
        }
        response
    }

    fn failed_calls(&self) -> impl Iterator<Item = (BackendId, &Outcome)> {
        self.calls.0.iter().filter_map(|call| match &call.state {
            CallState::Done(outcome @ (Outcome::Failed(_) | Outcome::Rejected(_))) => {
                Some((call.backend, outcome))
            }
            _ => None,
        })
    }

    /// Logs, at info, the backends that failed while others' answers are served: the request's
    /// one warn line is its access line (`why=partial`), written by the driver.
    fn log_partial(&self) {
        for (backend, outcome) in self.failed_calls() {
            tracing::info!(
                backend = backend_name(&self.context.config.backends, backend),
                target = %self.target,
                "backend failed; serving the others: {}",
                outcome.describe()
            );
        }
    }

    /// Logs, at info, why a request is answered with a 5xx: each backend that failed. The
    /// request's one warn line is its access line, whose `why` is the answer's own reason.
    fn log_unanswered(&self, status: StatusCode) {
        let reasons: Vec<String> = self
            .failed_calls()
            .map(|(backend, outcome)| {
                let name = backend_name(&self.context.config.backends, backend);
                format!("{name}: {}", outcome.describe())
            })
            .collect();
        tracing::info!(
            target = %self.target,
            status = status.as_u16(),
            "no backend could answer: {}",
            reasons.join("; ")
        );
    }

    fn log_failures(&self) {
        for (backend, outcome) in self.failed_calls() {
            tracing::debug!(
                backend = backend_name(&self.context.config.backends, backend),
                target = %self.target,
                "no success from backend: {}",
                outcome.describe()
            );
        }
    }
}

/// Classifies a buffered upstream answer.
fn outcome_of(status: StatusCode, headers: HeaderMap, body: Bytes) -> Outcome {
    if status.is_success() {
        Outcome::Success {
            status,
            headers,
            body,
        }
    } else if (400..600).contains(&status.as_u16()) {
        Outcome::Rejected(Rejection { status, body })
    } else {
        // 1xx and 3xx (PuppetDB sends neither to a query) and 600-999 (HTTP has none): not an
        // answer to replay, so that backend failed.
        Outcome::Failed(Failure::UnexpectedStatus(status))
    }
}
