//! A sub-route's parent check: `/environments/<env>/<entity>` and `/producers/<p>/<entity>`
//! answer 404 ("No information is known about environment `<env>`") when no backend knows the
//! environment or producer, as one PuppetDB does, and otherwise the entity's merged answer
//! (docs/merging.md, "The route table").
//!
//! The merge is planned as the entity's own route with the constraint added; this plan asks every
//! backend for the parent (`/environments/<env>`, one small record) at the same time, so the
//! check costs no round trip.

use http::StatusCode;

use crate::fanout::{CallState, Calls, Context, Outbound, Plan, Step, Verdict};
use crate::ids::BackendId;
use crate::status::{replay, Outcome, Rejection};

/// The part number of the parent calls: far above any part a merge plan numbers its own calls
/// with, so the two never meet.
const PARENT: usize = usize::MAX;

/// A merge below a parent, with the parent asked for alongside: use it for every sub-route whose
/// answer is merged.
#[derive(Debug)]
pub(crate) struct ParentChecked {
    merge: Box<dyn Plan>,
    /// `/pdb/query/v4/environments/<env>` or `/pdb/query/v4/producers/<p>`, as the client wrote
    /// the name.
    parent_path: String,
    /// The merge's verdict, once it has one, until every parent call is over.
    verdict: Option<Verdict>,
}

impl ParentChecked {
    /// `merge` answered below `parent_path`.
    pub(crate) fn new(merge: Box<dyn Plan>, parent_path: String) -> ParentChecked {
        ParentChecked {
            merge,
            parent_path,
            verdict: None,
        }
    }
}

impl Plan for ParentChecked {
    fn needs_ownership(&self) -> bool {
        self.merge.needs_ownership()
    }

    fn counts_rounds(&self) -> bool {
        self.merge.counts_rounds()
    }

    fn again(&self) -> Box<dyn Plan> {
        Box::new(ParentChecked::new(
            self.merge.again(),
            self.parent_path.clone(),
        ))
    }

    fn start(&mut self, context: &Context) -> Vec<(BackendId, usize)> {
        // The parent's verdict can turn the answer into a 404 after the merge's first records:
        // the merge is buffered.
        let buffered = Context {
            may_stream: false,
            ..context.clone()
        };
        let mut calls = self.merge.start(&buffered);
        calls.extend(context.roster.iter().map(|backend| (*backend, PARENT)));
        calls
    }

    fn request(&self, backend: BackendId, part: usize, context: &Context) -> Outbound {
        if part == PARENT {
            Outbound::get(self.parent_path.clone())
        } else {
            self.merge.request(backend, part, context)
        }
    }

    fn progress(&mut self, calls: &Calls, context: &Context) -> Step {
        if self.verdict.is_none() {
            match self.merge.progress(calls, context) {
                Step::Done(verdict) => self.verdict = Some(verdict),
                step => return step,
            }
        }
        let parent: Vec<&CallState> = calls
            .0
            .iter()
            .filter(|call| call.part == PARENT)
            .map(|call| &call.state)
            .collect();
        if parent
            .iter()
            .any(|state| matches!(state, CallState::Pending { .. }))
        {
            return Step::Wait;
        }
        // Unknown only when every configured backend was asked and each said it does not know
        // the name; one that could not answer, or was not asked, may know it.
        let not_found: Option<Vec<&Rejection>> = parent
            .iter()
            .map(|state| match state {
                CallState::Done(Outcome::Rejected(r)) if r.status == StatusCode::NOT_FOUND => {
                    Some(r)
                }
                _ => None,
            })
            .collect();
        let everyone_asked = context.roster.len() == context.config.backends.len();
        match not_found.as_deref() {
            Some([first, ..]) if everyone_asked => {
                Step::Done(Verdict::Verbatim(replay(first, &context.config.backends)))
            }
            _ => self.verdict.take().map_or(Step::Wait, Step::Done),
        }
    }

    fn learned(&self, calls: &Calls) -> Vec<crate::corrections::Learned> {
        self.merge.learned(calls)
    }
}
