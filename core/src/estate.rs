//! The shared machine: everything requests have in common. It holds no JSON work on records and
//! is touched only briefly per request, so it never serializes merges.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use http::HeaderValue;

use crate::config::Config;
use crate::exchange::Exchange;
use crate::healthz::{ReachabilityCheck, REACHABILITY_PATH};
use crate::ids::{BackendId, Counter, UpstreamId, WaiterId};
use crate::legs::Legs;
use crate::membership::{parse_membership, BackendNodes, Ownership, MEMBERSHIP_QUERY};
use crate::message::{ClientRequest, Response, UpstreamFailure, UpstreamRequest, UpstreamResponse};
use crate::route::{classify, CountEndpoint, Entity, Route};

/// What to do with a client request; returned by [`Estate::admit`].
#[derive(Debug)]
pub enum Admission {
    /// Answer with this right away (a refusal); no backend is asked.
    Respond(Response),
    /// Drive this exchange on the request's own task until it responds.
    Exchange(Exchange),
    /// Wait: the estate later emits [`EstateOutput::Respond`] or [`EstateOutput::Resume`] for this
    /// waiter.
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
    /// What the waiter waited for is ready: admit its request again with [`Estate::readmit`].
    Resume {
        /// Who is waiting.
        waiter: WaiterId,
    },
}

/// The membership map's state: each backend's last good answer and the snapshot built from them.
#[derive(Debug)]
struct Membership {
    per_backend: Vec<Option<BackendNodes>>,
    snapshot: Arc<Ownership>,
    refreshed_at: Option<Instant>,
    refresh: Option<MembershipRefresh>,
}

#[derive(Debug)]
struct MembershipRefresh {
    legs: Legs,
    waiters: Vec<WaiterId>,
}

/// The state every request shares: configuration, the membership map and the `/healthz` check in
/// flight (and, as pdbmux grows, backend health and the cache index).
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
    membership: Membership,
    outputs: VecDeque<EstateOutput>,
}

impl Estate {
    /// A fresh estate for this configuration.
    pub fn new(config: Config) -> Estate {
        let backends = config.backends.len();
        Estate {
            config: Arc::new(config),
            upstream_ids: Counter::default(),
            waiter_ids: Counter::default(),
            reachability: None,
            membership: Membership {
                per_backend: vec![None; backends],
                snapshot: Ownership::empty(),
                refreshed_at: None,
                refresh: None,
            },
            outputs: VecDeque::new(),
        }
    }

    /// The configuration this estate runs on.
    pub fn config(&self) -> &Arc<Config> {
        &self.config
    }

    /// Takes in a client request: refuses it, hands back an [`Exchange`] to drive, or registers a
    /// waiter the estate answers (or resumes) itself.
    pub fn admit(&mut self, now: Instant, request: &ClientRequest) -> Admission {
        self.admit_inner(now, request, false)
    }

    /// Admits a request again after [`EstateOutput::Resume`]; it no longer waits for a refresh.
    pub fn readmit(&mut self, now: Instant, request: &ClientRequest) -> Admission {
        self.admit_inner(now, request, true)
    }

    fn admit_inner(&mut self, now: Instant, request: &ClientRequest, resumed: bool) -> Admission {
        let route = match classify(request) {
            Ok(route) => route,
            Err(refusal) => {
                let mut response = Response::text(refusal.status(), format!("pdbmux: {refusal}"));
                if refusal.status() == http::StatusCode::METHOD_NOT_ALLOWED {
                    response
                        .headers
                        .insert(http::header::ALLOW, HeaderValue::from_static("GET"));
                }
                return Admission::Respond(response);
            }
        };
        if route == Route::Healthz {
            return Admission::Wait(self.join_reachability_check(now));
        }
        let ownership = if needs_ownership(&route, request) {
            self.refresh_membership_if_due(now);
            if self.membership.refreshed_at.is_none() && !resumed {
                let waiter = WaiterId(self.waiter_ids.next());
                if let Some(refresh) = &mut self.membership.refresh {
                    refresh.waiters.push(waiter);
                    return Admission::Wait(waiter);
                }
            }
            Some(Arc::clone(&self.membership.snapshot))
        } else {
            None
        };
        let roster = self.roster();
        Admission::Exchange(Exchange::new(
            now,
            Arc::clone(&self.config),
            &route,
            request.target.clone(),
            &roster,
            ownership,
        ))
    }

    /// The backends a request asks, in configured order.
    fn roster(&self) -> Vec<BackendId> {
        (0..self.config.backends.len()).map(BackendId).collect()
    }

    fn refresh_membership_if_due(&mut self, now: Instant) {
        let due = match self.membership.refreshed_at {
            None => true,
            Some(at) => now >= at + self.config.freshness_ttl,
        };
        if !due || self.membership.refresh.is_some() {
            return;
        }
        let roster = self.roster();
        let (legs, requests) = Legs::send(
            &mut self.upstream_ids,
            &roster,
            MEMBERSHIP_QUERY,
            now + self.config.timeout,
        );
        self.outputs
            .extend(requests.into_iter().map(EstateOutput::Send));
        self.membership.refresh = Some(MembershipRefresh {
            legs,
            waiters: Vec::new(),
        });
    }

    fn join_reachability_check(&mut self, now: Instant) -> WaiterId {
        let waiter = WaiterId(self.waiter_ids.next());
        if let Some(check) = &mut self.reachability {
            check.waiters.push(waiter);
            return waiter;
        }
        let roster = self.roster();
        let (legs, requests) = Legs::send(
            &mut self.upstream_ids,
            &roster,
            REACHABILITY_PATH,
            now + self.config.timeout,
        );
        self.outputs
            .extend(requests.into_iter().map(EstateOutput::Send));
        self.reachability = Some(ReachabilityCheck {
            waiters: vec![waiter],
            legs,
        });
        self.finish(now);
        waiter
    }

    /// An upstream answer for a request the estate sent.
    pub fn handle_upstream_response(
        &mut self,
        now: Instant,
        id: UpstreamId,
        response: UpstreamResponse,
    ) {
        if let Some(check) = &mut self.reachability {
            check.legs.record_response(id, &response);
        }
        if let Some(refresh) = &mut self.membership.refresh {
            refresh.legs.record_response(id, &response);
        }
        self.finish(now);
    }

    /// An upstream failure for a request the estate sent.
    pub fn handle_upstream_failure(
        &mut self,
        now: Instant,
        id: UpstreamId,
        failure: UpstreamFailure,
    ) {
        if let Some(check) = &mut self.reachability {
            check.legs.record_failure(id, &failure);
        }
        if let Some(refresh) = &mut self.membership.refresh {
            refresh.legs.record_failure(id, &failure);
        }
        self.finish(now);
    }

    /// A waiting client went away; nothing is sent to it any more.
    pub fn handle_waiter_gone(&mut self, _now: Instant, waiter: WaiterId) {
        if let Some(check) = &mut self.reachability {
            check.waiters.retain(|w| *w != waiter);
        }
        if let Some(refresh) = &mut self.membership.refresh {
            refresh.waiters.retain(|w| *w != waiter);
        }
    }

    /// Time passed: expire what is past its deadline. A call before any deadline is a no-op.
    pub fn handle_timeout(&mut self, now: Instant) {
        let mut expired = Vec::new();
        if let Some(check) = &mut self.reachability {
            expired.extend(check.legs.expire(now));
        }
        if let Some(refresh) = &mut self.membership.refresh {
            expired.extend(refresh.legs.expire(now));
        }
        if !expired.is_empty() {
            self.outputs
                .extend(expired.into_iter().map(EstateOutput::Cancel));
            self.finish(now);
        }
    }

    /// The next thing the runtime must do, if any.
    pub fn poll_output(&mut self) -> Option<EstateOutput> {
        self.outputs.pop_front()
    }

    /// The one next deadline the runtime must wake the estate at, if any.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let reachability = self.reachability.as_ref().and_then(|c| c.legs.deadline());
        let membership = self
            .membership
            .refresh
            .as_ref()
            .and_then(|r| r.legs.deadline());
        match (reachability, membership) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The current ownership snapshot (for tests and `/healthz`).
    pub fn ownership(&self) -> Arc<Ownership> {
        Arc::clone(&self.membership.snapshot)
    }

    /// Completes whatever fan-out has every result.
    fn finish(&mut self, now: Instant) {
        if self
            .reachability
            .as_ref()
            .is_some_and(|c| c.legs.is_complete())
        {
            if let Some(check) = self.reachability.take() {
                let response = check.response(&self.config);
                for waiter in check.waiters {
                    self.outputs.push_back(EstateOutput::Respond {
                        waiter,
                        response: response.clone(),
                    });
                }
            }
        }
        if self
            .membership
            .refresh
            .as_ref()
            .is_some_and(|r| r.legs.is_complete())
        {
            if let Some(refresh) = self.membership.refresh.take() {
                self.apply_membership(now, refresh);
            }
        }
    }

    fn apply_membership(&mut self, now: Instant, refresh: MembershipRefresh) {
        for leg in &refresh.legs.0 {
            let parsed = match &leg.result {
                Some(Ok(body)) => {
                    parse_membership(body).ok_or_else(|| "unparseable body".to_owned())
                }
                Some(Err(reason)) => Err(reason.clone()),
                None => Err("no answer".to_owned()),
            };
            match parsed {
                Ok(nodes) => self.membership.per_backend[leg.backend.0] = Some(nodes),
                Err(reason) => tracing::warn!(
                    backend = crate::policy::backend_name(&self.config.backends, leg.backend),
                    "membership refresh failed; keeping this backend's previous entries: {reason}"
                ),
            }
        }
        self.membership.snapshot = Arc::new(Ownership::build(&self.membership.per_backend));
        self.membership.refreshed_at = Some(now);
        self.outputs.extend(
            refresh
                .waiters
                .into_iter()
                .map(|waiter| EstateOutput::Resume { waiter }),
        );
    }
}

/// Whether answering `route` needs node ownership (DECISIONS.md D4): node-scoped entities, the
/// per-certname routes, and any query that uses `latest_report?`.
fn needs_ownership(route: &Route, request: &ClientRequest) -> bool {
    match route {
        Route::Merged(Entity::Nodes | Entity::Facts)
        | Route::FactsByName { .. }
        | Route::PerCertname { .. } => true,
        Route::Merged(Entity::Reports | Entity::Events)
        | Route::Combined(CountEndpoint::EventCounts | CountEndpoint::AggregateEventCounts) => {
            request.query().is_some_and(|q| q.contains("latest_report"))
        }
        _ => false,
    }
}
