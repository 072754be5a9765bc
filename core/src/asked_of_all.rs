//! The plan of a route whose one GET is asked of every backend at once and answered from those
//! answers: the meta routes (`meta.rs`) and the report-hash routes (`sequence.rs`). What differs
//! between them, how the answer is reached, is an [`AnswerRule`].

use std::fmt;

use crate::fanout::{everyone, Calls, Context, Outbound, Plan, Step};
use crate::ids::BackendId;

/// How an [`AskedOfAll`] plan reaches its answer from the calls (one per backend, part 0). Use
/// one per route kind; it holds no state of its own.
pub(crate) trait AnswerRule: fmt::Debug + Clone + Send + 'static {
    /// Whether the answer is one backend's 2xx served as it came ([`Plan::answers_verbatim`]).
    const VERBATIM: bool;

    /// The next step after one of the calls finished (or timed out).
    fn progress(&self, calls: &Calls, context: &Context) -> Step;
}

/// Asks every backend in the roster for `target` at once and answers by `rule`. Use it for a
/// route that needs no membership map and asks each backend one thing, once.
#[derive(Debug, Clone)]
pub(crate) struct AskedOfAll<R> {
    target: String,
    rule: R,
}

impl<R: AnswerRule> AskedOfAll<R> {
    /// The plan for this target, answered by `rule`.
    pub(crate) fn new(target: String, rule: R) -> AskedOfAll<R> {
        AskedOfAll { target, rule }
    }
}

impl<R: AnswerRule> Plan for AskedOfAll<R> {
    fn again(&self) -> Box<dyn Plan> {
        Box::new(self.clone())
    }

    fn answers_verbatim(&self) -> bool {
        R::VERBATIM
    }

    fn start(&mut self, context: &Context) -> Vec<(BackendId, usize)> {
        everyone(context)
    }

    fn request(&self, _backend: BackendId, _part: usize, _context: &Context) -> Outbound {
        Outbound::get(self.target.clone())
    }

    fn progress(&mut self, calls: &Calls, context: &Context) -> Step {
        self.rule.progress(calls, context)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::config::Config;
    use crate::corrections::Corrections;
    use crate::meta::{FirstInOrder, LowestVersion};
    use crate::sequence::Holder;

    fn context(roster: Vec<BackendId>) -> Context {
        Context {
            config: Arc::new(Config::with_backends(Vec::new())),
            roster,
            ownership: None,
            corrections: Arc::new(Corrections::new(0)),
            uncounted: Vec::new(),
            may_stream: false,
        }
    }

    #[test]
    fn every_backend_in_the_roster_is_asked_the_target_once_and_a_copy_asks_the_same() {
        let context = context(vec![BackendId(0), BackendId(2)]);
        let mut plan = AskedOfAll::new("/pdb/meta/v1/server-time".to_owned(), FirstInOrder);
        let mut again = plan.again();
        let first = [(BackendId(0), 0), (BackendId(2), 0)];
        assert_eq!(plan.start(&context), first);
        assert_eq!(again.start(&context), first);
        let asked = Outbound::get("/pdb/meta/v1/server-time");
        assert_eq!(plan.request(BackendId(2), 0, &context), asked);
        assert_eq!(again.request(BackendId(0), 0, &context), asked);
        assert!(!plan.needs_ownership());
    }

    #[test]
    fn only_a_rule_that_serves_one_backend_s_answer_answers_verbatim() {
        let target = || "/pdb/meta/v1/version".to_owned();
        assert!(AskedOfAll::new(target(), FirstInOrder).answers_verbatim());
        assert!(AskedOfAll::new(target(), Holder).answers_verbatim());
        assert!(!AskedOfAll::new(target(), LowestVersion).answers_verbatim());
        assert!(!AskedOfAll::new(target(), LowestVersion)
            .again()
            .answers_verbatim());
    }
}
