//! A sub-route's parent check: `/environments/<env>/<entity>` and `/producers/<p>/<entity>`
//! answer 404 ("No information is known about environment `<env>`") when no backend knows the
//! environment or producer, as one PuppetDB does, and otherwise the entity's merged answer
//! (docs/merging.md, "The route table").
//!
//! The merge is planned as the entity's own route with the constraint added; this plan asks every
//! backend for the parent (`/environments/<env>`, one small record) at the same time, so the
//! check costs no round trip. A large merge streams as on the entity's own route, once the parent
//! is known to exist (its small answers come long before a large body's end): the 404 can then no
//! longer follow the first records.

use http::StatusCode;

use crate::fanout::{CallState, Calls, Context, Outbound, Plan, Step, StreamStart, Verdict};
use crate::ids::BackendId;
use crate::status::{replay, Outcome, Rejection};

/// The part number of the parent calls: far above any part a merge plan numbers its own calls
/// with, so the two never meet.
const PARENT: usize = usize::MAX;

/// Where the parent check stands.
enum ParentCheck {
    /// A parent call is in flight.
    Pending,
    /// Some backend may know the parent: the merge's answer is the answer.
    Found,
    /// Every configured backend was asked and said it does not know it: PuppetDB's 404.
    Unknown(Verdict),
}

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
    /// Whether every parent call is over and some backend may know the parent: the merge may
    /// stream from then on.
    parent_known: bool,
}

impl ParentChecked {
    /// `merge` answered below `parent_path`.
    pub(crate) fn new(merge: Box<dyn Plan>, parent_path: String) -> ParentChecked {
        ParentChecked {
            merge,
            parent_path,
            verdict: None,
            parent_known: false,
        }
    }

    /// Where the parent check stands in `calls`.
    fn parent_check(calls: &Calls, context: &Context) -> ParentCheck {
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
            return ParentCheck::Pending;
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
                ParentCheck::Unknown(Verdict::Verbatim(replay(first, &context.config.backends)))
            }
            _ => ParentCheck::Found,
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

    fn streams(&self) -> bool {
        self.merge.streams()
    }

    /// The merge's stream, once the parent is known (`None` until then).
    fn stream_start(&mut self, context: &Context) -> Option<StreamStart> {
        if !self.parent_known {
            return None;
        }
        self.merge.stream_start(context)
    }

    fn streaming(&mut self) {
        self.merge.streaming();
    }

    fn start(&mut self, context: &Context) -> Vec<(BackendId, usize)> {
        let mut calls = self.merge.start(context);
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
        match ParentChecked::parent_check(calls, context) {
            // The 404 at once: a merge's bodies are not read (or held) for an answer no one gets.
            ParentCheck::Unknown(not_found) => return Step::Done(not_found),
            ParentCheck::Found => self.parent_known = true,
            ParentCheck::Pending => {}
        }
        if self.verdict.is_none() {
            match self.merge.progress(calls, context) {
                Step::Done(verdict) => self.verdict = Some(verdict),
                step => return step,
            }
        }
        match self.parent_known {
            false => Step::Wait,
            true => self.verdict.take().map_or(Step::Wait, Step::Done),
        }
    }

    fn learned(&self, calls: &Calls) -> Vec<crate::corrections::Learned> {
        self.merge.learned(calls)
    }
}
