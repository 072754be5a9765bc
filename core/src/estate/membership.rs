//! The part of the estate that knows whose copy of each node is newest: the membership map
//! (docs/merging.md, "Who owns a node"), its refreshes and the requests waiting for one. The
//! map's own inputs are passed through; what it asks of the runtime goes on the estate's output
//! queue, a resumed request with the backends its refresh did not hear from.

use std::sync::Arc;
use std::time::Instant;

use super::asked::UpstreamEnd;
use super::backends::{abandon, BackendWatch, Outputs};
use super::EstateOutput;
use crate::config::Config;
use crate::fanout::Context;
use crate::ids::{BackendId, UpstreamId, WaiterId};
use crate::membership::{MembershipMap, MembershipOutput, Ownership, Sending};
use crate::policy::Planned;
use crate::stats::BackendStats;

/// How many membership refreshes a request waits for while the map places no backend: the one
/// under way when it came (begun, perhaps, before the backends came back) and one more.
pub(crate) const MAP_WAITS: u8 = 2;

/// The membership map as a part of the estate (see the module doc).
#[derive(Debug)]
pub(super) struct MembershipPart {
    /// The map itself, for what only reads it.
    pub(super) map: MembershipMap<Planned>,
}

impl MembershipPart {
    /// An empty map of `backends` backends.
    pub(super) fn new(now: Instant, backends: usize) -> MembershipPart {
        MembershipPart {
            map: MembershipMap::new(now, backends),
        }
    }

    /// The current ownership snapshot.
    pub(super) fn snapshot(&self) -> Arc<Ownership> {
        Arc::clone(self.map.snapshot())
    }

    /// Fills in each backend's part of the map in `stats` (configured order): the nodes it owns
    /// under the configured merge, how old its part is and how many refreshes did not renew it.
    pub(super) fn fill_stats(&self, now: Instant, config: &Config, stats: &mut [BackendStats]) {
        let owned = self
            .map
            .snapshot()
            .owned_counts(config.merge, config.backends.len());
        for (index, backend) in stats.iter_mut().enumerate() {
            backend.owned_nodes = owned.get(index).copied().unwrap_or(0);
            backend.membership_age = self.map.part_age(now, BackendId(index));
            backend.membership_failures = self.map.failures(BackendId(index));
        }
    }

    /// Whether a request that needs ownership and has waited for `waits` refreshes waits for
    /// another: only while the map places no backend (nothing tells whose copy of a node is
    /// newest without it), and for [`MAP_WAITS`] refreshes at most.
    pub(super) fn must_wait(&self, waits: u8) -> bool {
        !self.map.places_any() && waits < MAP_WAITS
    }

    /// Starts a refresh of the backends in `roster` when one is due.
    pub(super) fn refresh_if_due(
        &mut self,
        now: Instant,
        roster: &[BackendId],
        sending: Sending<'_>,
        outputs: &mut Outputs,
    ) {
        self.map.refresh_if_due(now, roster, sending);
        self.drain(outputs);
    }

    /// Makes `waiter` wait for the refresh under way (resumed at once with none under way).
    pub(super) fn wait(&mut self, waiter: WaiterId, planned: Box<Planned>, outputs: &mut Outputs) {
        self.map.wait(waiter, planned);
        self.drain(outputs);
    }

    /// The answer to one of the refresh's queries (one of an abandoned refresh is ignored).
    pub(super) fn answered(
        &mut self,
        now: Instant,
        (id, answer): (UpstreamId, UpstreamEnd<'_>),
        sending: Sending<'_>,
        outputs: &mut Outputs,
    ) {
        let taken = match answer {
            UpstreamEnd::Response(response) => self.map.handle_response(now, id, response, sending),
            UpstreamEnd::Failure(failure) => self.map.handle_failure(now, id, failure, sending),
        };
        if taken {
            self.drain(outputs);
        }
    }

    /// Time passed: the refresh's calls past their deadline time out.
    pub(super) fn handle_timeout(
        &mut self,
        now: Instant,
        sending: Sending<'_>,
        outputs: &mut Outputs,
    ) {
        self.map.handle_timeout(now, sending);
        self.drain(outputs);
    }

    /// Other backends (a reload): the map starts empty, the refresh under way is abandoned (its
    /// answers would land on other backends' indices) and its waiters wait for a new one over
    /// `roster`.
    pub(super) fn reset(
        &mut self,
        now: Instant,
        (carried, roster): (&[Option<usize>], &[BackendId]),
        sending: Sending<'_>,
        outputs: &mut Outputs,
    ) {
        let (abandoned, waiting) = self.map.reset(now, carried);
        abandon(outputs, abandoned);
        if waiting.is_empty() {
            return;
        }
        self.map.refresh_if_due(now, roster, sending);
        for (waiter, planned) in waiting {
            self.map.wait(waiter, planned);
        }
        self.drain(outputs);
    }

    /// What a fan-out runs in: the backends in service less `left_out` (those the membership
    /// refresh a request waited for did not hear from) and, when ownership decides the answer,
    /// less those the map has never placed. When that leaves nobody, every backend in service
    /// is asked, but those left out do not count in the answer's `X-Backends`: without the map
    /// nothing tells whose copy of a node is the newest, so the answer is not whole. Its merge
    /// may stream: to the client, or for a flight into the one answer its driver shares.
    pub(super) fn context(
        &self,
        (config, backends): (&Arc<Config>, &BackendWatch),
        (ownership, mut left_out): (Option<Arc<Ownership>>, Vec<BackendId>),
    ) -> Context {
        if ownership.is_some() {
            left_out.extend(self.map.unplaced());
        }
        let roster = backends.roster_without(&left_out);
        let uncounted = roster
            .iter()
            .filter(|backend| left_out.contains(backend))
            .copied()
            .collect();
        Context {
            config: Arc::clone(config),
            roster,
            ownership,
            corrections: Arc::clone(self.map.corrections()),
            uncounted,
            may_stream: true,
        }
    }

    /// Moves what the map asks for to the estate's outputs.
    fn drain(&mut self, outputs: &mut Outputs) {
        outputs.extend(
            std::iter::from_fn(|| self.map.poll_output()).map(|output| match output {
                MembershipOutput::Send(request) => EstateOutput::Send(request),
                MembershipOutput::Cancel(id) => EstateOutput::Cancel(id),
                MembershipOutput::Resume {
                    waiter,
                    mut planned,
                    waited_out,
                } => {
                    if let Some(waited_out) = waited_out {
                        planned.waited_out = waited_out;
                    }
                    EstateOutput::Resume { waiter, planned }
                }
            }),
        );
    }
}

#[cfg(test)]
#[allow(clippy::disallowed_methods)] // tests need one real instant to start from
mod tests {
    use super::*;
    use crate::estate::tests::{config, MEMBERSHIP};
    use crate::ids::Counter;
    use crate::membership::MEMBERSHIP_QUERY;
    use crate::message::{UpstreamFailure, UpstreamResponse};

    #[test]
    fn a_fan_out_that_needs_ownership_leaves_out_what_the_map_never_placed() {
        let now = Instant::now();
        let config = Arc::new(config(&[("a", 1), ("b", 2)]));
        let watch = BackendWatch::new(now, &config);
        let mut part = MembershipPart::new(now, 2);
        let (mut ids, mut outputs) = (Counter::default(), Outputs::new());
        let both = [BackendId(0), BackendId(1)];

        // Nothing placed: a request that needs ownership waits, for two refreshes at most; a
        // fan-out then asks everyone and counts nobody.
        assert!(part.must_wait(0) && part.must_wait(1) && !part.must_wait(2));
        let blind = part.context((&config, &watch), (Some(part.snapshot()), Vec::new()));
        assert_eq!(
            (blind.roster.as_slice(), blind.uncounted.as_slice()),
            (&both[..], &both[..])
        );
        assert!(blind.may_stream);

        // a's refresh answers, b's fails: b is left out of what ownership decides only.
        part.refresh_if_due(now, &watch.roster(), (&mut ids, &config), &mut outputs);
        while let Some(output) = outputs.pop_front() {
            let EstateOutput::Send(request) = output else {
                continue;
            };
            if request.backend == BackendId(1) {
                let failure = UpstreamFailure::Timeout;
                part.answered(
                    now,
                    (request.id, UpstreamEnd::Failure(&failure)),
                    (&mut ids, &config),
                    &mut outputs,
                );
                continue;
            }
            let body = if request.path_and_query == MEMBERSHIP_QUERY {
                MEMBERSHIP
            } else {
                "[]"
            };
            let answer = UpstreamResponse::full(http::StatusCode::OK, "application/json", body);
            part.answered(
                now,
                (request.id, UpstreamEnd::Response(&answer)),
                (&mut ids, &config),
                &mut outputs,
            );
        }
        assert!(
            !part.must_wait(0),
            "a map that places a backend is not waited for"
        );
        let owned = part.context((&config, &watch), (Some(part.snapshot()), Vec::new()));
        assert_eq!(owned.roster, [BackendId(0)]);
        assert!(owned.uncounted.is_empty());
        let unowned = part.context((&config, &watch), (None, Vec::new()));
        assert_eq!(
            unowned.roster, both,
            "a fan-out ownership does not decide asks everyone"
        );
        let mut stats = BackendWatch::new(now, &config).stats(&config);
        part.fill_stats(now, &config, &mut stats);
        assert_eq!((stats[0].owned_nodes, stats[1].membership_failures), (1, 1));
    }
}
