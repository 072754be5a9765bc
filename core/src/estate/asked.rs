//! Which part of the estate asked each upstream request still unanswered, so that its answer is
//! handed to that part alone (docs/architecture.md, "The estate's parts"). The parts push their
//! requests onto the estate's one output queue; the estate notes each as the runtime takes it
//! and forgets it when it is answered, failed or cancelled.

use std::collections::HashMap;

use super::EstateOutput;
use crate::ids::UpstreamId;
use crate::message::{Purpose, UpstreamFailure, UpstreamResponse};

/// The part of the estate an upstream request belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Asker {
    /// The prober's health probe.
    Prober,
    /// A call of the `/healthz` reachability check.
    Reachability,
    /// A membership refresh query.
    Membership,
}

impl Asker {
    /// The part that sends requests of `purpose`; `None` for the purposes of a client's
    /// exchange, which the estate never sends.
    fn of(purpose: Purpose) -> Option<Asker> {
        match purpose {
            Purpose::Probe => Some(Asker::Prober),
            Purpose::Healthz => Some(Asker::Reachability),
            Purpose::Membership => Some(Asker::Membership),
            Purpose::Query | Purpose::Correction | Purpose::Translation => None,
        }
    }
}

/// How an upstream request of the estate's ended: the answer or the failure.
#[derive(Debug, Clone, Copy)]
pub(super) enum UpstreamEnd<'a> {
    /// The backend answered.
    Response(&'a UpstreamResponse),
    /// The request failed.
    Failure(&'a UpstreamFailure),
}

/// The estate's upstream requests in flight and the part that asked each.
#[derive(Debug, Default)]
pub(super) struct AskedBy(HashMap<UpstreamId, Asker>);

impl AskedBy {
    /// Notes what an output handed to the runtime means for the requests in flight: a send is
    /// noted against its part, a cancel forgets it.
    pub(super) fn note(&mut self, output: &EstateOutput) {
        match output {
            EstateOutput::Send(request) => {
                if let Some(asker) = Asker::of(request.purpose) {
                    self.0.insert(request.id, asker);
                }
            }
            EstateOutput::Cancel(id) => {
                self.0.remove(id);
            }
            _ => {}
        }
    }

    /// The part that asked `id`, which is forgotten: `None` for a request cancelled or never
    /// sent (its answer is nobody's).
    pub(super) fn take(&mut self, id: UpstreamId) -> Option<Asker> {
        self.0.remove(&id)
    }

    /// How many requests are in flight.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.0.len()
    }
}

#[cfg(test)]
#[allow(clippy::disallowed_methods)] // a request needs one real instant for its deadline
mod tests {
    use super::*;
    use crate::ids::BackendId;
    use crate::message::UpstreamRequest;

    fn send(id: u64, purpose: Purpose) -> EstateOutput {
        EstateOutput::Send(UpstreamRequest {
            id: UpstreamId(id),
            backend: BackendId(0),
            method: http::Method::GET,
            path_and_query: "/status/v1/services".into(),
            body: None,
            body_mode: crate::message::BodyMode::Buffer,
            deadline: std::time::Instant::now(),
            purpose,
            correlation: Vec::new(),
        })
    }

    #[test]
    fn each_answer_goes_to_the_part_that_asked_once() {
        let mut asked = AskedBy::default();
        asked.note(&send(1, Purpose::Probe));
        asked.note(&send(2, Purpose::Healthz));
        asked.note(&send(3, Purpose::Membership));
        assert_eq!(asked.take(UpstreamId(3)), Some(Asker::Membership));
        assert_eq!(asked.take(UpstreamId(1)), Some(Asker::Prober));
        assert_eq!(asked.take(UpstreamId(2)), Some(Asker::Reachability));
        assert_eq!(
            asked.take(UpstreamId(2)),
            None,
            "a second answer is nobody's"
        );
        assert_eq!(asked.len(), 0);
    }

    #[test]
    fn a_cancelled_request_is_forgotten_and_a_client_purpose_never_noted() {
        let mut asked = AskedBy::default();
        asked.note(&send(1, Purpose::Membership));
        asked.note(&EstateOutput::Cancel(UpstreamId(1)));
        asked.note(&send(2, Purpose::Query));
        assert_eq!(asked.take(UpstreamId(1)), None);
        assert_eq!(asked.take(UpstreamId(2)), None);
        assert_eq!(asked.len(), 0);
    }
}
