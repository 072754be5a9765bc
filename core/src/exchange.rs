//! The per-request machine: plans a request's upstream calls, collects the answers, applies the
//! status policy and produces the one response.
//!
//! An [`Exchange`] runs on the request's own task, so merges of different requests run on
//! different cores at once; it touches no shared state. Create it with [`crate::Estate::admit`].

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode};

use crate::combine::{BackendParts, CombineFanOut};
use crate::config::Config;
use crate::healthz::Round;
use crate::ids::{BackendId, Counter, UpstreamId};
use crate::membership::{Ownership, Scope};
use crate::merge::{Answer, Planned, RecordPlan};
use crate::message::{
    BodyMode, Response, ResponseBody, UpstreamBody, UpstreamFailure, UpstreamRequest,
    UpstreamResponse,
};
use crate::meta;
use crate::metrics::MetricsPlan;
use crate::policy::{self, backend_name, Outcome, Rejection};
use crate::route::Route;

/// The header naming how many backends' records went into a merged answer.
pub const X_BACKENDS: HeaderName = HeaderName::from_static("x-backends");
/// PuppetDB's total-count header.
pub const X_RECORDS: HeaderName = HeaderName::from_static("x-records");

/// What an [`Exchange`] asks of the runtime; drain with [`Exchange::poll_output`].
#[derive(Debug, Clone)]
pub enum ExchangeOutput {
    /// Send this request upstream and report the answer with
    /// [`Exchange::handle_upstream_response`] or [`Exchange::handle_upstream_failure`].
    Send(UpstreamRequest),
    /// Abandon this upstream request (and drop a held body); its answer is no longer wanted.
    Cancel(UpstreamId),
    /// Send this response to the client. Always the last output of an exchange.
    Respond(Response),
}

/// How the exchange turns answers into a response.
#[derive(Debug)]
enum Plan {
    /// Ask every backend at once (each its own request), merge their records.
    Records(Box<RecordPlan>),
    /// Ask every backend at once (each its own requests), fold their aggregate rows.
    Combine(Box<CombineFanOut>),
    /// Ask every backend at once, merge their Jolokia answers.
    Metrics(Box<MetricsPlan>),
    /// Ask every backend at once, merge the successes.
    FanOut(Merge),
    /// Ask one backend at a time in order; the first success is streamed.
    FirstSuccess,
    /// Ask one backend at a time, owner first; the first answer other than 404 stands.
    OwnerFirst,
    /// Ask every backend at once; serve whichever holds the record.
    Holder,
}

/// The merge applied to a fan-out's successes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Merge {
    /// The lowest `version`.
    LowestVersion,
    /// The first success in configured order, verbatim.
    FirstInOrder,
}

#[derive(Debug)]
enum LegState {
    /// Not asked yet (sequential plans).
    Idle,
    /// Asked; waiting until `deadline`.
    Pending { id: UpstreamId, deadline: Instant },
    /// Over.
    Done(LegResult),
}

#[derive(Debug)]
enum LegResult {
    /// A 2xx whose body the runtime holds.
    Held {
        id: UpstreamId,
        status: StatusCode,
        headers: HeaderMap,
    },
    /// Any other answer or failure.
    Outcome(Outcome),
}

#[derive(Debug)]
struct Leg {
    backend: BackendId,
    /// Which of the plan's upstream requests to this backend (combined aggregates may send
    /// several; every other plan sends one).
    part: usize,
    state: LegState,
}

/// One client request's upstream work, as a sans-IO state machine.
///
/// Contract: after construction and after every `handle_*` call, drain [`Exchange::poll_output`]
/// until `None`, then read [`Exchange::poll_timeout`] and call [`Exchange::handle_timeout`] when it
/// passes. `now` never goes backwards. Answers for cancelled or unknown IDs are ignored (a held
/// body among them is cancelled again).
#[derive(Debug)]
pub struct Exchange {
    config: Arc<Config>,
    target: String,
    plan: Plan,
    legs: Vec<Leg>,
    ids: Counter,
    outputs: VecDeque<ExchangeOutput>,
    finished: bool,
    round: Option<Round>,
}

/// A request read and planned, before the estate knows whether it must wait for the membership
/// map: either answered already (a refusal, or an answer known from the configuration alone) or
/// a plan to start with [`Exchange::new`]. Planning happens once per request.
#[derive(Debug)]
pub(crate) struct Prepared {
    route: Route,
    target: String,
    plan: Option<Plan>,
    immediate: Option<Response>,
}

impl Prepared {
    /// Reads and plans a classified request (`route` must not be [`Route::Healthz`]).
    pub(crate) fn new(route: &Route, target: String, config: &Arc<Config>) -> Prepared {
        let (path, raw_query) = match target.split_once('?') {
            Some((path, query)) => (path, Some(query)),
            None => (target.as_str(), None),
        };
        let mut immediate = None;
        let combine = CombineFanOut::plan(route, path, raw_query, config);
        let plan = match (route, combine) {
            (_, Some(Ok(combine))) => Some(Plan::Combine(Box::new(combine))),
            (_, Some(Err(refusal))) => {
                immediate = Some(refusal);
                None
            }
            (Route::Merged(_) | Route::FactsByName { .. }, None) => {
                match RecordPlan::plan(route, path, raw_query, config) {
                    Planned::FanOut(plan) => Some(Plan::Records(plan)),
                    Planned::Respond(response) => {
                        immediate = Some(response);
                        None
                    }
                }
            }
            (Route::MetaVersion, None) => Some(Plan::FanOut(Merge::LowestVersion)),
            (Route::ServerTime, None) => Some(Plan::FanOut(Merge::FirstInOrder)),
            (Route::PassThrough | Route::Resources, None) => Some(Plan::FirstSuccess),
            (Route::PerCertname { .. }, None) => Some(Plan::OwnerFirst),
            (Route::ReportHash { .. }, None) => Some(Plan::Holder),
            (Route::Metrics(metrics), None) => Some(Plan::Metrics(Box::new(MetricsPlan::plan(
                *metrics, path, config,
            )))),
            (Route::Combined(_) | Route::Healthz, None) => None,
        };
        Prepared {
            route: route.clone(),
            target,
            plan,
            immediate,
        }
    }

    /// The answer when the request needs no backend at all.
    pub(crate) fn local_answer(&mut self) -> Option<Response> {
        self.immediate.take()
    }
}

impl Exchange {
    /// Starts a prepared request over the backends in `roster` (configured order), with
    /// `ownership`, the membership snapshot for node-scoped routes (DECISIONS.md D4).
    pub(crate) fn new(
        now: Instant,
        config: Arc<Config>,
        prepared: Prepared,
        roster: &[BackendId],
        ownership: Option<Arc<Ownership>>,
    ) -> Exchange {
        let Prepared {
            route,
            target,
            plan,
            immediate,
        } = prepared;
        let mut roster = roster.to_vec();
        if let (Route::PerCertname { certname }, Some(ownership)) = (&route, &ownership) {
            let certname = percent_encoding::percent_decode_str(certname).decode_utf8_lossy();
            let owners = ownership
                .owners(&certname, Scope::Active)
                .or_else(|| ownership.owners(&certname, Scope::Any));
            if let Some(owners) = owners {
                let owner = owners.under(config.merge);
                if let Some(position) = roster.iter().position(|b| *b == owner) {
                    let owner = roster.remove(position);
                    roster.insert(0, owner);
                }
            }
        }
        let mut plan = plan;
        match &mut plan {
            Some(Plan::Records(records)) => records.attach(ownership),
            Some(Plan::Combine(combine)) => combine.attach(ownership),
            Some(Plan::Metrics(metrics)) => metrics.attach(ownership),
            _ => {}
        }
        let parts = match &plan {
            Some(Plan::Combine(combine)) => combine.parts(),
            Some(Plan::Metrics(metrics)) => metrics.parts(),
            _ => 1,
        };
        let plan_missing = plan.is_none() && immediate.is_none();
        let route = &route;
        let sends_all = matches!(
            plan,
            Some(
                Plan::FanOut(_)
                    | Plan::Holder
                    | Plan::Records(_)
                    | Plan::Combine(_)
                    | Plan::Metrics(_)
            )
        );
        let sequential = matches!(plan, Some(Plan::FirstSuccess | Plan::OwnerFirst));
        let mut exchange = Exchange {
            config,
            target,
            plan: plan.unwrap_or(Plan::FirstSuccess),
            legs: roster
                .iter()
                .flat_map(|&backend| {
                    (0..parts).map(move |part| Leg {
                        backend,
                        part,
                        state: LegState::Idle,
                    })
                })
                .collect(),
            ids: Counter::default(),
            outputs: VecDeque::new(),
            finished: false,
            round: None,
        };
        if let Some(response) = immediate {
            exchange.respond(response);
        } else if plan_missing {
            exchange.respond(Response::text(
                StatusCode::NOT_IMPLEMENTED,
                format!(
                    "pdbmux: the {} merge for this route is not implemented yet",
                    route.class()
                ),
            ));
        } else if sends_all {
            for index in 0..exchange.legs.len() {
                exchange.send(now, index, BodyMode::Buffer);
            }
        } else if sequential {
            exchange.advance(now);
        }
        if exchange.legs.is_empty() && !exchange.finished {
            exchange.respond(Response::text(
                StatusCode::BAD_GATEWAY,
                "pdbmux: no backend to ask",
            ));
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
        let Some(index) = self.pending_leg(id) else {
            if response.body == UpstreamBody::Held {
                self.outputs.push_back(ExchangeOutput::Cancel(id));
            }
            return;
        };
        let result = match response.body {
            UpstreamBody::Held if response.status.is_success() => LegResult::Held {
                id,
                status: response.status,
                headers: response.headers,
            },
            UpstreamBody::Held => {
                // A runtime must buffer non-2xx bodies; treat a violation as a failed backend.
                self.outputs.push_back(ExchangeOutput::Cancel(id));
                LegResult::Outcome(Outcome::Failed(format!(
                    "unexpected held body on status {}",
                    response.status
                )))
            }
            UpstreamBody::Full(body) => {
                LegResult::Outcome(outcome_of(response.status, response.headers, body))
            }
        };
        self.legs[index].state = LegState::Done(result);
        self.progress(now);
    }

    /// An upstream request failed without an answer.
    pub fn handle_upstream_failure(
        &mut self,
        now: Instant,
        id: UpstreamId,
        failure: UpstreamFailure,
    ) {
        let Some(index) = self.pending_leg(id) else {
            return;
        };
        self.legs[index].state = LegState::Done(LegResult::Outcome(Outcome::failure(&failure)));
        self.progress(now);
    }

    /// Time passed; upstream requests past their deadline count as timed out. A call before any
    /// deadline is a no-op.
    pub fn handle_timeout(&mut self, now: Instant) {
        let mut expired = false;
        for leg in &mut self.legs {
            if let LegState::Pending { id, deadline } = leg.state {
                if deadline <= now {
                    self.outputs.push_back(ExchangeOutput::Cancel(id));
                    leg.state = LegState::Done(LegResult::Outcome(Outcome::failure(
                        &UpstreamFailure::Timeout,
                    )));
                    expired = true;
                }
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
        self.legs
            .iter()
            .filter_map(|leg| match leg.state {
                LegState::Pending { deadline, .. } => Some(deadline),
                _ => None,
            })
            .min()
    }

    /// For a merged fan-out that has responded: how many backends were asked and contributed,
    /// for the estate's `/healthz` counters ([`crate::Estate::handle_round`]).
    pub fn round(&self) -> Option<Round> {
        self.round
    }

    /// Whether the response has been produced (it may still be queued in `poll_output`).
    pub fn is_finished(&self) -> bool {
        self.finished
    }

    fn pending_leg(&self, id: UpstreamId) -> Option<usize> {
        if self.finished {
            return None;
        }
        self.legs.iter().position(
            |leg| matches!(leg.state, LegState::Pending { id: pending, .. } if pending == id),
        )
    }

    fn send(&mut self, now: Instant, index: usize, body_mode: BodyMode) {
        let id = UpstreamId(self.ids.next());
        let deadline = now + self.config.timeout;
        let backend = self.legs[index].backend;
        let mut asked: Vec<BackendId> = self.legs.iter().map(|leg| leg.backend).collect();
        asked.dedup();
        let (method, path_and_query, body) = match &self.plan {
            Plan::Records(plan) => plan.upstream_request(backend, &asked),
            Plan::Combine(combine) => {
                combine.upstream_request(backend, self.legs[index].part, &asked)
            }
            Plan::Metrics(metrics) => {
                metrics.upstream_request(&self.target, backend, self.legs[index].part, &asked)
            }
            _ => (Method::GET, self.target.clone(), None),
        };
        self.legs[index].state = LegState::Pending { id, deadline };
        self.outputs
            .push_back(ExchangeOutput::Send(UpstreamRequest {
                id,
                backend,
                method,
                path_and_query,
                body,
                body_mode,
                deadline,
            }));
    }

    fn respond(&mut self, response: Response) {
        for leg in &self.legs {
            if let LegState::Pending { id, .. } = leg.state {
                self.outputs.push_back(ExchangeOutput::Cancel(id));
            }
        }
        self.finished = true;
        self.outputs.push_back(ExchangeOutput::Respond(response));
    }

    fn progress(&mut self, now: Instant) {
        match &self.plan {
            Plan::Records(_) => self.progress_records(),
            Plan::Combine(_) => self.progress_combine(),
            Plan::Metrics(_) => self.progress_metrics(),
            Plan::FanOut(merge) => {
                let merge = *merge;
                self.progress_fan_out(merge)
            }
            Plan::Holder => self.progress_holder(),
            Plan::FirstSuccess | Plan::OwnerFirst => self.advance(now),
        }
    }

    /// Sequential plans: settle on the latest answer or ask the next backend.
    fn advance(&mut self, now: Instant) {
        if self.finished {
            return;
        }
        let owner_first = matches!(self.plan, Plan::OwnerFirst);
        for index in 0..self.legs.len() {
            match &self.legs[index].state {
                LegState::Pending { .. } => return,
                LegState::Idle => {
                    self.send(now, index, BodyMode::StreamSuccess);
                    return;
                }
                LegState::Done(LegResult::Held {
                    id,
                    status,
                    headers,
                }) => {
                    let response = streamed(*id, *status, headers);
                    return self.respond(response);
                }
                LegState::Done(LegResult::Outcome(Outcome::Success { .. })) => {
                    let response = self.success_response(index);
                    return self.respond(response);
                }
                LegState::Done(LegResult::Outcome(Outcome::Rejected(rejection)))
                    if owner_first && rejection.status != StatusCode::NOT_FOUND =>
                {
                    let response = policy::replay(rejection, &self.config.backends);
                    return self.respond(response);
                }
                LegState::Done(LegResult::Outcome(_)) => {}
            }
        }
        // Every backend was asked and none succeeded: replay the first error answer (a 404 for
        // per-certname routes), or 502 when nobody answered.
        self.log_failures();
        let first_rejection = self.legs.iter().find_map(|leg| match &leg.state {
            LegState::Done(LegResult::Outcome(Outcome::Rejected(rejection))) => {
                Some(rejection.clone())
            }
            _ => None,
        });
        let response = match first_rejection {
            Some(rejection) => policy::replay(&rejection, &self.config.backends),
            None => policy::bad_gateway(&self.outcomes(), &self.config.backends),
        };
        self.respond(response);
    }

    /// Report-hash routes: only the backend holding the report answers 2xx, so the first success
    /// is served at once. Without one: the holder's error (anything but 404), else 502 when a
    /// backend did not answer (it may hold the report), else the unanimous 404.
    fn progress_holder(&mut self) {
        if self.finished {
            return;
        }
        let success = self.legs.iter().position(|leg| {
            matches!(
                leg.state,
                LegState::Done(LegResult::Outcome(Outcome::Success { .. }))
            )
        });
        if let Some(index) = success {
            let response = self.success_response(index);
            return self.respond(response);
        }
        if !self.all_done() {
            return;
        }
        let mut holder_error: Option<&Rejection> = None;
        let mut not_found: Option<&Rejection> = None;
        let mut unanswered = false;
        for leg in &self.legs {
            match &leg.state {
                LegState::Done(LegResult::Outcome(Outcome::Rejected(rejection))) => {
                    if rejection.status == StatusCode::NOT_FOUND {
                        not_found.get_or_insert(rejection);
                    } else {
                        holder_error.get_or_insert(rejection);
                    }
                }
                _ => unanswered = true,
            }
        }
        let response = match (holder_error, unanswered, not_found) {
            (Some(rejection), _, _) => policy::replay(rejection, &self.config.backends),
            (None, false, Some(rejection)) => policy::replay(rejection, &self.config.backends),
            _ => policy::bad_gateway(&self.outcomes(), &self.config.backends),
        };
        self.log_failures();
        self.respond(response);
    }

    /// Record merges: once every backend is done, merge the usable answers; a body that does not
    /// parse counts as that backend failing (D7).
    fn progress_records(&mut self) {
        if self.finished || !self.all_done() {
            return;
        }
        let Plan::Records(plan) = &self.plan else {
            return;
        };
        let answers: Vec<Answer<'_>> = self
            .legs
            .iter()
            .filter_map(|leg| match &leg.state {
                LegState::Done(LegResult::Outcome(Outcome::Success { headers, body, .. })) => {
                    Some(Answer {
                        backend: leg.backend,
                        headers,
                        body,
                    })
                }
                _ => None,
            })
            .collect();
        let merged = plan.merge(&answers);
        for (backend, reason) in merged.unusable {
            if let Some(leg) = self.legs.iter_mut().find(|leg| leg.backend == backend) {
                leg.state = LegState::Done(LegResult::Outcome(Outcome::Failed(reason)));
            }
        }
        let asked = self.legs.len();
        self.finish_merged(merged.response, merged.contributed, asked);
    }

    /// Answers a merged fan-out: the merged response with X-Backends, or, when no backend's
    /// answer was usable, the status policy's verdict; and records the round for `/healthz`.
    fn finish_merged(&mut self, response: Option<Response>, contributed: usize, asked: usize) {
        match response {
            Some(response) => {
                self.round = Some(Round {
                    asked,
                    contributed,
                    refused: false,
                });
                self.warn_partial();
                let response = self.with_backends_header(response, contributed);
                self.respond(response);
            }
            None => {
                self.log_failures();
                let verdict = policy::failure_verdict(&self.outcomes(), &self.config.backends);
                let refused = matches!(&verdict, policy::FailureVerdict::Unanimous(r) if r.status.is_client_error());
                self.round = Some(Round {
                    asked,
                    contributed: 0,
                    refused,
                });
                let response = self.with_backends_header(verdict.into_response(), 0);
                self.respond(response);
            }
        }
    }

    /// Combined aggregates: once every backend is done, fold the answers of the backends whose
    /// every part succeeded; the rest count as failed.
    fn progress_combine(&mut self) {
        if self.finished || !self.all_done() {
            return;
        }
        let Plan::Combine(combine) = &self.plan else {
            return;
        };
        let mut answers: Vec<BackendParts<'_>> = Vec::new();
        for leg in &self.legs {
            let success = match &leg.state {
                LegState::Done(LegResult::Outcome(Outcome::Success { headers, body, .. })) => {
                    Some((headers, body))
                }
                _ => None,
            };
            let current = answers.last_mut().filter(|a| a.backend == leg.backend);
            match (current, success) {
                (Some(answer), Some((_, body))) if answer.bodies.len() == leg.part => {
                    answer.bodies.push(&body[..])
                }
                (None, Some((headers, body))) if leg.part == 0 => answers.push(BackendParts {
                    backend: leg.backend,
                    bodies: vec![&body[..]],
                    records: headers
                        .get(X_RECORDS)
                        .and_then(|v| v.to_str().ok()?.trim().parse().ok()),
                }),
                (Some(_), None) => {
                    answers.pop();
                }
                _ => {}
            }
        }
        let complete = combine.parts();
        answers.retain(|answer| answer.bodies.len() == complete);
        let result = combine.combine(&answers);
        let asked = self.legs.len() / complete.max(1);
        for (backend, reason) in result.unusable {
            for leg in self.legs.iter_mut().filter(|leg| leg.backend == backend) {
                leg.state = LegState::Done(LegResult::Outcome(Outcome::Failed(reason.clone())));
            }
        }
        self.finish_merged(result.response, result.contributed, asked);
    }

    /// Metrics: once every backend is done, merge the envelopes of those that answered 2xx.
    fn progress_metrics(&mut self) {
        if self.finished || !self.all_done() {
            return;
        }
        let Plan::Metrics(metrics) = &self.plan else {
            return;
        };
        fn success(leg: &Leg) -> Option<&[u8]> {
            match &leg.state {
                LegState::Done(LegResult::Outcome(Outcome::Success { body, .. })) => {
                    Some(&body[..])
                }
                _ => None,
            }
        }
        let envelopes: Vec<&[u8]> = self
            .legs
            .iter()
            .filter(|l| l.part == 0)
            .filter_map(success)
            .collect();
        let counts: Vec<&[u8]> = self
            .legs
            .iter()
            .filter(|l| l.part == 1)
            .filter_map(success)
            .collect();
        match metrics.respond(&envelopes, &counts) {
            Some((response, contributed)) => {
                self.warn_partial();
                let response = self.with_backends_header(response, contributed);
                self.respond(response);
            }
            None => {
                self.log_failures();
                let outcomes: Vec<(BackendId, Outcome)> = self
                    .legs
                    .iter()
                    .filter(|leg| leg.part == 0)
                    .filter_map(|leg| match &leg.state {
                        LegState::Done(LegResult::Outcome(Outcome::Success { .. })) => Some((
                            leg.backend,
                            Outcome::Failed("unusable jolokia body".to_owned()),
                        )),
                        LegState::Done(LegResult::Outcome(outcome)) => {
                            Some((leg.backend, outcome.clone()))
                        }
                        _ => None,
                    })
                    .collect();
                let verdict = policy::failure_verdict(&outcomes, &self.config.backends);
                let response = self.with_backends_header(verdict.into_response(), 0);
                self.respond(response);
            }
        }
    }

    fn progress_fan_out(&mut self, merge: Merge) {
        if self.finished {
            return;
        }
        if merge == Merge::FirstInOrder {
            // Respond as soon as the first success in configured order is known.
            for index in 0..self.legs.len() {
                match &self.legs[index].state {
                    LegState::Pending { .. } | LegState::Idle => return,
                    LegState::Done(LegResult::Outcome(Outcome::Success { .. })) => {
                        let response = self.with_backends_header(self.success_response(index), 1);
                        self.warn_partial();
                        return self.respond(response);
                    }
                    LegState::Done(_) => {}
                }
            }
        }
        if !self.all_done() {
            return;
        }
        let response = match merge {
            Merge::LowestVersion => self.lowest_version(),
            Merge::FirstInOrder => None,
        };
        match response {
            Some((response, contributed)) => {
                self.warn_partial();
                let response = self.with_backends_header(response, contributed);
                self.respond(response);
            }
            None => {
                self.log_failures();
                let verdict = policy::failure_verdict(&self.outcomes(), &self.config.backends);
                let response = self.with_backends_header(verdict.into_response(), 0);
                self.respond(response);
            }
        }
    }

    /// `/pdb/meta/v1/version`: the lowest version among parseable successes.
    fn lowest_version(&mut self) -> Option<(Response, usize)> {
        let mut versions = Vec::new();
        for leg in &mut self.legs {
            if let LegState::Done(LegResult::Outcome(Outcome::Success { body, .. })) = &leg.state {
                match meta::parse_version_body(body) {
                    Some(version) => versions.push(version),
                    None => {
                        leg.state = LegState::Done(LegResult::Outcome(Outcome::Failed(
                            "unparseable version body".to_owned(),
                        )))
                    }
                }
            }
        }
        let lowest = meta::lowest_version(versions.iter().map(String::as_str))?;
        let body = serde_json::json!({ "version": lowest }).to_string();
        Some((Response::json(StatusCode::OK, body), versions.len()))
    }

    fn success_response(&self, index: usize) -> Response {
        match &self.legs[index].state {
            LegState::Done(LegResult::Outcome(Outcome::Success {
                status,
                headers,
                body,
            })) => {
                let mut response = Response {
                    status: *status,
                    headers: forwarded_headers(headers),
                    body: ResponseBody::Full(body.clone()),
                };
                if !response.headers.contains_key(http::header::CONTENT_TYPE) {
                    response.headers.insert(
                        http::header::CONTENT_TYPE,
                        HeaderValue::from_static(crate::message::JSON_CONTENT_TYPE),
                    );
                }
                response
            }
            _ => Response::text(
                StatusCode::INTERNAL_SERVER_ERROR,
                "pdbmux: internal error: no success to serve",
            ),
        }
    }

    fn with_backends_header(&self, mut response: Response, contributed: usize) -> Response {
        let value = format!("{}/{}", contributed, self.config.backends.len());
        if let Ok(value) = HeaderValue::from_str(&value) {
            response.headers.insert(X_BACKENDS, value);
        }
        response
    }

    fn all_done(&self) -> bool {
        self.legs
            .iter()
            .all(|leg| matches!(leg.state, LegState::Done(_)))
    }

    fn outcomes(&self) -> Vec<(BackendId, Outcome)> {
        self.legs
            .iter()
            .filter_map(|leg| match &leg.state {
                LegState::Done(LegResult::Outcome(outcome)) => Some((leg.backend, outcome.clone())),
                _ => None,
            })
            .collect()
    }

    /// Logs the backends that failed while others' answers are served.
    fn warn_partial(&self) {
        for (backend, outcome) in self.outcomes() {
            if !matches!(outcome, Outcome::Success { .. }) {
                tracing::warn!(
                    backend = backend_name(&self.config.backends, backend),
                    target = %self.target,
                    "backend failed; serving the others: {}",
                    outcome.describe()
                );
            }
        }
    }

    fn log_failures(&self) {
        for (backend, outcome) in self.outcomes() {
            tracing::debug!(
                backend = backend_name(&self.config.backends, backend),
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
    } else if status.as_u16() >= 400 {
        Outcome::Rejected(Rejection {
            status,
            content_type: headers.get(http::header::CONTENT_TYPE).cloned(),
            body,
        })
    } else {
        Outcome::Failed(format!("unexpected status {}", status.as_u16()))
    }
}

/// A response streaming a held upstream body, with the backend's status and end-to-end headers.
fn streamed(id: UpstreamId, status: StatusCode, headers: &HeaderMap) -> Response {
    Response {
        status,
        headers: forwarded_headers(headers),
        body: ResponseBody::Upstream(id),
    }
}

/// The upstream headers a verbatim answer carries: end-to-end headers only, without framing
/// (the runtime frames the body itself) and without the backend's Date and Server.
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
        ) || named_by_connection.iter().any(|n| n == name.as_str());
        if !dropped {
            headers.append(name.clone(), value.clone());
        }
    }
    headers
}
