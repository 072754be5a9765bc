//! The shared machine: everything requests have in common. It holds no JSON work and is touched
//! only briefly per request, so it never serializes merges.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use http::{HeaderValue, Method};

use crate::config::Config;
use crate::exchange::Exchange;
use crate::healthz::{Probe, ReachabilityCheck, REACHABILITY_PATH};
use crate::ids::{BackendId, Counter, UpstreamId, WaiterId};
use crate::message::{BodyMode, ClientRequest, Response, UpstreamFailure, UpstreamRequest, UpstreamResponse};
use crate::route::{classify, Route};

/// What to do with a client request; returned by [`Estate::admit`].
#[derive(Debug)]
pub enum Admission {
    /// Answer with this right away (a refusal); no backend is asked.
    Respond(Response),
    /// Drive this exchange on the request's own task until it responds.
    Exchange(Exchange),
    /// The estate answers later with [`EstateOutput::Respond`] for this waiter.
    Wait(WaiterId),
}

/// What the [`Estate`] asks of the runtime; drain with [`Estate::poll_output`].
#[derive(Debug, Clone)]
pub enum EstateOutput {
    /// Send this request upstream; report the answer to [`Estate::handle_upstream_response`] or
    /// [`Estate::handle_upstream_failure`].
    Send(UpstreamRequest),
    /// Abandon this upstream request.
    Cancel(UpstreamId),
    /// Answer the client behind this waiter.
    Respond {
        /// Who is waiting.
        waiter: WaiterId,
        /// The answer.
        response: Response,
    },
}

/// The state every request shares: configuration and the `/healthz` check in flight (and, as
/// pdbmux grows, backend health, the membership map and the cache index).
///
/// Contract: after every `admit` or `handle_*` call, drain [`Estate::poll_output`] until `None`,
/// then read [`Estate::poll_timeout`]; call [`Estate::handle_timeout`] when it passes. `now` never
/// goes backwards; a spurious `handle_timeout` is a no-op.
#[derive(Debug)]
pub struct Estate {
    config: Arc<Config>,
    upstream_ids: Counter,
    waiter_ids: Counter,
    reachability: Option<ReachabilityCheck>,
    outputs: VecDeque<EstateOutput>,
}

impl Estate {
    /// A fresh estate for this configuration.
    pub fn new(config: Config) -> Estate {
        Estate {
            config: Arc::new(config),
            upstream_ids: Counter::default(),
            waiter_ids: Counter::default(),
            reachability: None,
            outputs: VecDeque::new(),
        }
    }

    /// The configuration this estate runs on.
    pub fn config(&self) -> &Arc<Config> {
        &self.config
    }

    /// Takes in a client request: refuses it, hands back an [`Exchange`] to drive, or registers a
    /// waiter the estate answers itself.
    pub fn admit(&mut self, now: Instant, request: &ClientRequest) -> Admission {
        let route = match classify(request) {
            Ok(route) => route,
            Err(refusal) => {
                let mut response = Response::text(refusal.status(), format!("pdbmux: {refusal}"));
                if refusal.status() == http::StatusCode::METHOD_NOT_ALLOWED {
                    response.headers.insert(http::header::ALLOW, HeaderValue::from_static("GET"));
                }
                return Admission::Respond(response);
            }
        };
        if route == Route::Healthz {
            return Admission::Wait(self.join_reachability_check(now));
        }
        let roster = self.roster();
        Admission::Exchange(Exchange::new(now, self.config.clone(), &route, request.target.clone(), &roster))
    }

    /// The backends a request asks, in configured order.
    fn roster(&self) -> Vec<BackendId> {
        (0..self.config.backends.len()).map(BackendId).collect()
    }

    fn join_reachability_check(&mut self, now: Instant) -> WaiterId {
        let waiter = WaiterId(self.waiter_ids.next());
        if let Some(check) = &mut self.reachability {
            check.waiters.push(waiter);
            return waiter;
        }
        let deadline = now + self.config.timeout;
        let mut probes = Vec::with_capacity(self.config.backends.len());
        for backend in self.roster() {
            let id = UpstreamId(self.upstream_ids.next());
            self.outputs.push_back(EstateOutput::Send(UpstreamRequest {
                id,
                backend,
                method: Method::GET,
                path_and_query: REACHABILITY_PATH.to_owned(),
                body_mode: BodyMode::Buffer,
                deadline,
            }));
            probes.push(Probe {
                backend,
                id,
                deadline,
                result: None,
            });
        }
        self.reachability = Some(ReachabilityCheck {
            waiters: vec![waiter],
            probes,
        });
        self.finish_reachability_if_complete();
        waiter
    }

    /// An upstream answer for a request the estate sent.
    pub fn handle_upstream_response(&mut self, _now: Instant, id: UpstreamId, response: UpstreamResponse) {
        if let Some(check) = &mut self.reachability {
            if check.record_response(id, &response) {
                self.finish_reachability_if_complete();
            }
        }
    }

    /// An upstream failure for a request the estate sent.
    pub fn handle_upstream_failure(&mut self, _now: Instant, id: UpstreamId, failure: UpstreamFailure) {
        if let Some(check) = &mut self.reachability {
            if check.record_failure(id, &failure) {
                self.finish_reachability_if_complete();
            }
        }
    }

    /// A waiting client went away; nothing is sent to it any more.
    pub fn handle_waiter_gone(&mut self, _now: Instant, waiter: WaiterId) {
        if let Some(check) = &mut self.reachability {
            check.waiters.retain(|w| *w != waiter);
        }
    }

    /// Time passed: expire what is past its deadline. A call before any deadline is a no-op.
    pub fn handle_timeout(&mut self, now: Instant) {
        if let Some(check) = &mut self.reachability {
            let expired = check.expire(now);
            if !expired.is_empty() {
                self.outputs.extend(expired.into_iter().map(EstateOutput::Cancel));
                self.finish_reachability_if_complete();
            }
        }
    }

    /// The next thing the runtime must do, if any.
    pub fn poll_output(&mut self) -> Option<EstateOutput> {
        self.outputs.pop_front()
    }

    /// The one next deadline the runtime must wake the estate at, if any.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.reachability.as_ref().and_then(ReachabilityCheck::deadline)
    }

    fn finish_reachability_if_complete(&mut self) {
        let Some(check) = &self.reachability else {
            return;
        };
        if !check.is_complete() {
            return;
        }
        let response = check.response(&self.config);
        if let Some(check) = self.reachability.take() {
            for waiter in check.waiters {
                self.outputs.push_back(EstateOutput::Respond {
                    waiter,
                    response: response.clone(),
                });
            }
        }
    }
}
