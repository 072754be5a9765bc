//! One request answered by two record plans together: each makes its own calls, and the answer
//! is the records of both, the first's then the second's (nested, by as many as it takes). A
//! `/facts` query whose constraints admit the provenance fact and other facts is several
//! questions: the other facts, which the backends hold, and the provenance records, which
//! pdbmux writes, one part for each query its constraints leave the backends (docs/merging.md,
//! "Provenance").
//!
//! The two plans' calls share the exchange: plan `which`'s part `p` is the exchange's part
//! `p * 2 + which`, and each plan sees only its own calls, numbered as it made them. The answer
//! counts a backend only where both plans could use it. The second is buffered; the first
//! streams where it would alone (a large answer, docs/merging.md "Streamed merges"), once the
//! second's answer is merged (or, below, once its calls are answered): the second's records are
//! written after the first's. Otherwise both are buffered and their records joined here.
//!
//! An ordered request's answers are merged rather than joined: each plan's answer comes sorted
//! by the request's `order_by`, and each record of the second takes its place among the
//! first's, after those it ties with (streamed: [`crate::streamed::RecordStream::then_merge`]).
//! When every record of the second sorts with one prefix (the provenance records under an order
//! by name, [`Plan::merge_later`]), the first streams once the second's calls are answered, and
//! the second is merged once the first records have left (or the stream reaches that prefix),
//! not before the first byte.

use std::cmp::Ordering;

use bytes::{Bytes, BytesMut};

use crate::corrections::Learned;
use crate::fanout::{Call, Calls, Context, Outbound, Plan, Step, StreamStart, Verdict};
use crate::ids::BackendId;
use crate::message::{Response, ResponseBody};
use crate::records::{parse_records, write_array, Fields};
use crate::sort::{self, OrderBy};
use crate::streamed::JoinedLater;

/// How many plans answer together.
const PLANS: usize = 2;

/// The exchange's part of plan `which`'s part `part`.
fn outer(which: usize, part: usize) -> usize {
    part * PLANS + which
}

/// Two record plans whose answers are joined ([`Concat::new`]).
#[derive(Debug)]
pub(crate) struct Concat {
    plans: [Box<dyn Plan>; PLANS],
    verdicts: [Option<Verdict>; PLANS],
    /// The request's order, which both answers come sorted by: merged in it, not joined.
    order: Option<OrderBy>,
    /// The second plan's calls, all answered, when its merge waits for the first's stream to
    /// reach its records ([`Plan::merge_later`]); merged at once if the first's answer is
    /// buffered after all.
    later: Option<Calls>,
    /// The second plan's merge that waits, until the first's stream takes it.
    joined: Option<JoinedLater>,
}

impl Concat {
    /// Answers with `first`'s records, then `second`'s; with `order` (both answers sorted by
    /// it), with their records merged in that order, `first`'s before `second`'s where they tie.
    pub(crate) fn new(
        first: Box<dyn Plan>,
        second: Box<dyn Plan>,
        order: Option<OrderBy>,
    ) -> Concat {
        Concat {
            plans: [first, second],
            verdicts: [None, None],
            order,
            later: None,
            joined: None,
        }
    }

    /// Plan `which`'s calls, as it numbered them.
    fn own_calls(calls: &Calls, which: usize) -> Calls {
        Calls(
            calls
                .0
                .iter()
                .filter(|call| call.part % PLANS == which)
                .map(|call| Call {
                    part: call.part / PLANS,
                    ..call.clone()
                })
                .collect(),
        )
    }

    /// The answer, once it is known (`verdicts` keeps what is not yet): the first plan that did
    /// not merge, its part as the exchange numbers it, as soon as one has not (the exchange
    /// cancels the other's calls with the answer, or gives them up when it fails over: the
    /// first's bodies, held unread while it waits to stream, would otherwise keep it until the
    /// deadline); else, both merged, their records joined (merged in `order`, when given).
    fn decided(
        verdicts: &mut [Option<Verdict>; PLANS],
        order: Option<&OrderBy>,
    ) -> Option<Verdict> {
        let failed = verdicts
            .iter()
            .position(|verdict| matches!(verdict, Some(v) if !matches!(v, Verdict::Merged { .. })));
        if let Some(which) = failed {
            return verdicts[which]
                .take()
                .map(|verdict| renumbered(verdict, which));
        }
        match std::mem::take(verdicts) {
            [Some(Verdict::Merged {
                response,
                contributed,
                mut unusable,
            }), Some(Verdict::Merged {
                response: other,
                contributed: other_contributed,
                unusable: other_unusable,
            })] => {
                for (backend, why) in other_unusable {
                    if !unusable.iter().any(|(b, _)| *b == backend) {
                        unusable.push((backend, why));
                    }
                }
                let body = match (&response.body, &other.body, order) {
                    (ResponseBody::Full(a), ResponseBody::Full(b), Some(order)) => {
                        merge_arrays(a, b, order)
                    }
                    (ResponseBody::Full(a), ResponseBody::Full(b), None) => join_arrays(a, b),
                    // Neither plan streams (`buffered`): unreachable, and answered as the first.
                    _ => None,
                };
                Some(Verdict::Merged {
                    response: match body {
                        Some(body) => Response {
                            body: ResponseBody::Full(body),
                            ..response
                        },
                        None => response,
                    },
                    contributed: contributed.min(other_contributed),
                    unusable,
                })
            }
            // A plan still under way.
            pending => {
                *verdicts = pending;
                None
            }
        }
    }
}

/// The first plan's streamed merge, its inputs numbered as the exchange numbers them.
fn first_stream_start(first: &mut dyn Plan, context: &Context) -> Option<StreamStart> {
    let mut start = first.stream_start(context)?;
    start.inputs = start
        .inputs
        .into_iter()
        .map(|(backend, part)| (backend, outer(0, part)))
        .collect();
    Some(start)
}

/// Plan `which`'s verdict with its part numbered as the exchange numbers it.
fn renumbered(verdict: Verdict, which: usize) -> Verdict {
    match verdict {
        Verdict::Unanswered { part, unusable } => Verdict::Unanswered {
            part: outer(which, part),
            unusable,
        },
        other => other,
    }
}

/// The elements of a JSON array as pdbmux writes it, separated by commas as they are inside it
/// (empty for `[]`); `None` when it is not an array.
fn array_inner(body: &Bytes) -> Option<Bytes> {
    let text = body.trim_ascii();
    let inner = text.strip_prefix(b"[")?.strip_suffix(b"]")?;
    Some(body.slice_ref(inner.trim_ascii()))
}

/// Two JSON arrays (as pdbmux writes them) as one: `a`'s elements, then `b`'s. `None` when either
/// is not an array.
fn join_arrays(a: &Bytes, b: &Bytes) -> Option<Bytes> {
    let (a_inner, b_inner) = (array_inner(a)?, array_inner(b)?);
    if b_inner.is_empty() {
        return Some(a.clone());
    }
    if a_inner.is_empty() {
        return Some(b.clone());
    }
    let mut joined = BytesMut::with_capacity(a_inner.len() + b_inner.len() + 3);
    joined.extend_from_slice(b"[");
    joined.extend_from_slice(&a_inner);
    joined.extend_from_slice(b",");
    joined.extend_from_slice(&b_inner);
    joined.extend_from_slice(b"]");
    Some(joined.freeze())
}

/// Two JSON arrays of records, each sorted by `order`, as one sorted array: each of `b`'s records
/// after `a`'s that sort before it or with it. `None` when either is not an array of records.
/// `b` (the provenance records, one a node) is keyed whole; `a`'s records one at a time.
fn merge_arrays(a: &Bytes, b: &Bytes, order: &OrderBy) -> Option<Bytes> {
    let records = parse_records(a).ok()?;
    let mut others = keyed(b, order)?.into_iter().peekable();
    let mut merged = Vec::with_capacity(records.len() + others.len());
    for record in records {
        let fields = Fields::of(record.get())?;
        let key = sort::sort_key(order, |name| fields.raw(name));
        while let Some((_, text)) =
            others.next_if(|(other, _)| sort::compare(other, &key, order) == Ordering::Less)
        {
            merged.push(text);
        }
        merged.push(record.get());
    }
    merged.extend(others.map(|(_, text)| text));
    let bytes: usize = merged.iter().map(|text| text.len() + 1).sum();
    Some(Bytes::from(write_array(merged, bytes)))
}

/// The records of a JSON array, each with its sort key under `order`; `None` when it is not an
/// array of records.
fn keyed<'b>(body: &'b Bytes, order: &OrderBy) -> Option<Vec<(sort::SortKey, &'b str)>> {
    parse_records(body)
        .ok()?
        .into_iter()
        .map(|record| {
            let fields = Fields::of(record.get())?;
            Some((sort::sort_key(order, |name| fields.raw(name)), record.get()))
        })
        .collect()
}

/// `context` for a plan whose answer is joined: never streamed.
fn buffered(context: &Context) -> Context {
    Context {
        may_stream: false,
        ..context.clone()
    }
}

/// The context plan `which` is driven with: the first may stream as the request may, the
/// second is buffered.
fn context_of(which: usize, context: &Context) -> Context {
    match which {
        0 => context.clone(),
        _ => buffered(context),
    }
}

impl Plan for Concat {
    fn needs_ownership(&self) -> bool {
        self.plans.iter().any(|plan| plan.needs_ownership())
    }

    fn counts_rounds(&self) -> bool {
        self.plans.iter().any(|plan| plan.counts_rounds())
    }

    fn streams(&self) -> bool {
        self.plans[0].streams()
    }

    /// The first plan's streamed merge, the second's records written after its own, once the
    /// second merged; `None` until then. Ordered, the second's merge can wait for the stream to
    /// reach its records ([`Plan::merge_later`]): the first byte does not wait for it.
    fn stream_start(&mut self, context: &Context) -> Option<StreamStart> {
        if let (Some(calls), Some(order)) = (&self.later, &self.order) {
            // Taken by an earlier start that a backend's broken first bytes undid: made again.
            let later = match self.joined.take() {
                Some(later) => later,
                None => self.plans[1].merge_later(calls, &buffered(context), order)?,
            };
            let mut start = first_stream_start(&mut *self.plans[0], context)?;
            start.merge.then_merge_later(later)?;
            return Some(start);
        }
        let Some(Verdict::Merged {
            response,
            contributed,
            unusable,
        }) = &self.verdicts[1]
        else {
            return None;
        };
        let body = response.full_body()?;
        let mut start = first_stream_start(&mut *self.plans[0], context)?;
        match self.order {
            Some(_) => start.merge.then_merge(body.clone())?,
            None => start.merge.then_write(array_inner(body)?),
        }
        start.at_most = Some(
            start
                .at_most
                .map_or(*contributed, |most| most.min(*contributed)),
        );
        for (backend, why) in unusable {
            if !start.unusable.iter().any(|(b, _)| b == backend) {
                start.unusable.push((*backend, why.clone()));
            }
        }
        Some(start)
    }

    /// The second's records are in the stream now: its answer (the provenance records, megabytes
    /// at 100,000 nodes) is let go rather than held while the answer streams; an ordered join's,
    /// that is (an unordered join writes the answer's own bytes after the first's, so they stay).
    fn streaming(&mut self) {
        self.verdicts = [None, None];
        (self.later, self.joined) = (None, None);
        self.plans[0].streaming();
    }

    fn again(&self) -> Box<dyn Plan> {
        Box::new(Concat::new(
            self.plans[0].again(),
            self.plans[1].again(),
            self.order.clone(),
        ))
    }

    fn start(&mut self, context: &Context) -> Vec<(BackendId, usize)> {
        let mut calls = Vec::new();
        for (which, plan) in self.plans.iter_mut().enumerate() {
            let first = plan.start(&context_of(which, context));
            calls.extend(first.into_iter().map(|(b, part)| (b, outer(which, part))));
        }
        calls
    }

    fn request(&self, backend: BackendId, part: usize, context: &Context) -> Outbound {
        let which = part % PLANS;
        self.plans[which].request(backend, part / PLANS, &context_of(which, context))
    }

    fn progress(&mut self, calls: &Calls, context: &Context) -> Step {
        let first_streams = self.plans[0].streams();
        let mut more = Vec::new();
        for (which, (plan, verdict)) in self.plans.iter_mut().zip(&mut self.verdicts).enumerate() {
            if verdict.is_some() {
                continue;
            }
            if which == 1 && self.later.is_some() {
                continue;
            }
            let own = Concat::own_calls(calls, which);
            if let (1, Some(order), true) = (which, &self.order, first_streams) {
                if let Some(joined) = plan.merge_later(&own, &buffered(context), order) {
                    (self.later, self.joined) = (Some(own), Some(joined));
                    continue;
                }
            }
            match plan.progress(&own, &context_of(which, context)) {
                Step::Wait => {}
                Step::Call(next) => {
                    more.extend(next.into_iter().map(|(b, part)| (b, outer(which, part))));
                }
                Step::Done(done) => *verdict = Some(done),
            }
        }
        if !more.is_empty() {
            return Step::Call(more);
        }
        // The first's answer buffered after all (under the streaming threshold): the second's
        // merge that waited for its stream is merged now.
        if let Some(later) = self.later.take_if(|_| self.verdicts[0].is_some()) {
            self.joined = None;
            match self.plans[1].progress(&later, &buffered(context)) {
                Step::Done(done) => self.verdicts[1] = Some(done),
                // A merge that waits asks nothing more (`Plan::merge_later`); were it to, it is
                // asked, and progresses as any other.
                Step::Call(next) => {
                    return Step::Call(
                        next.into_iter()
                            .map(|(b, part)| (b, outer(1, part)))
                            .collect(),
                    )
                }
                Step::Wait => {}
            }
        }
        Concat::decided(&mut self.verdicts, self.order.as_ref()).map_or(Step::Wait, Step::Done)
    }

    fn learned(&self, calls: &Calls) -> Vec<Learned> {
        let mut learned = Vec::new();
        for (which, plan) in self.plans.iter().enumerate() {
            learned.extend(plan.learned(&Concat::own_calls(calls, which)));
        }
        learned
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arrays_join_in_order_and_an_empty_side_adds_nothing() {
        let join = |a: &'static str, b: &'static str| {
            join_arrays(
                &Bytes::from_static(a.as_bytes()),
                &Bytes::from_static(b.as_bytes()),
            )
            .map(|joined| String::from_utf8(joined.to_vec()).expect("utf-8"))
        };
        assert_eq!(join("[1,2]", "[3]").as_deref(), Some("[1,2,3]"));
        assert_eq!(join("[]", "[3]").as_deref(), Some("[3]"));
        assert_eq!(join("[1]", " [ ] ").as_deref(), Some("[1]"));
        assert_eq!(join("[]", "[]").as_deref(), Some("[]"));
        assert_eq!(join("{}", "[1]"), None);
    }

    #[test]
    fn ordered_arrays_merge_in_order_the_first_before_the_second_where_they_tie() {
        let order = OrderBy {
            fields: vec![sort::OrderField {
                field: "name".to_owned(),
                direction: sort::Direction::Descending,
                kind: crate::entity::ColumnKind::Text,
            }],
        };
        let merge = |a: &'static str, b: &'static str| {
            merge_arrays(
                &Bytes::from_static(a.as_bytes()),
                &Bytes::from_static(b.as_bytes()),
                &order,
            )
            .map(|merged| String::from_utf8(merged.to_vec()).expect("utf-8"))
        };
        let a = r#"[{"name":"z","n":1},{"name":"p","n":1},{"name":"a","n":1}]"#;
        let b = r#"[{"name":"q","n":2},{"name":"p","n":2},{"name":"b","n":2}]"#;
        assert_eq!(
            merge(a, b).as_deref(),
            Some(
                r#"[{"name":"z","n":1},{"name":"q","n":2},{"name":"p","n":1},{"name":"p","n":2},{"name":"b","n":2},{"name":"a","n":1}]"#
            )
        );
        assert_eq!(merge("[]", b).as_deref(), Some(&b.replace(' ', "")[..]));
        assert_eq!(merge(a, "[]").as_deref(), Some(a));
        assert_eq!(merge("[1]", b), None, "not records");
        assert_eq!(merge(a, "{}"), None, "not an array");
    }

    /// A part that asks nothing: a join whose own state a test sets.
    #[derive(Debug)]
    struct Idle;

    impl Plan for Idle {
        fn again(&self) -> Box<dyn Plan> {
            Box::new(Idle)
        }

        fn start(&mut self, _context: &Context) -> Vec<(BackendId, usize)> {
            Vec::new()
        }

        fn request(&self, _backend: BackendId, _part: usize, _context: &Context) -> Outbound {
            unreachable!("an idle part asks nothing")
        }

        fn progress(&mut self, _calls: &Calls, _context: &Context) -> Step {
            Step::Wait
        }
    }

    #[test]
    fn a_streaming_join_lets_go_of_the_answer_merged_into_the_stream() {
        let body = Bytes::from(b"[{\"certname\":\"n1\"}]".to_vec());
        let mut join = Concat::new(Box::new(Idle), Box::new(Idle), None);
        join.verdicts[1] = Some(Verdict::Merged {
            response: Response {
                body: ResponseBody::Full(body.clone()),
                ..Response::json(http::StatusCode::OK, "")
            },
            contributed: 2,
            unusable: Vec::new(),
        });
        assert!(!body.is_unique(), "held by the join");
        join.streaming();
        assert!(body.is_unique(), "let go once the answer streams");
    }

    #[test]
    fn a_plan_that_did_not_merge_answers_with_its_part_as_the_exchange_numbers_it() {
        let unanswered = |part| Verdict::Unanswered {
            part,
            unusable: Vec::new(),
        };
        let merged = || Verdict::Merged {
            response: Response::json(http::StatusCode::OK, "[1]"),
            contributed: 2,
            unusable: Vec::new(),
        };
        let part = |verdict: Verdict| match verdict {
            Verdict::Unanswered { part, .. } => Some(part),
            _ => None,
        };
        let decided = |verdicts: [Option<Verdict>; PLANS]| {
            let mut verdicts = verdicts;
            Concat::decided(&mut verdicts, None)
        };
        assert_eq!(
            decided([Some(merged()), Some(unanswered(0))]).and_then(part),
            Some(1)
        );
        assert_eq!(
            decided([Some(unanswered(2)), Some(merged())]).and_then(part),
            Some(4)
        );
        assert_eq!(
            decided([None, Some(unanswered(0))]).and_then(part),
            Some(1),
            "a part that did not merge answers while the other is under way"
        );
        assert!(decided([Some(merged()), None]).is_none(), "waits for both");
        match decided([Some(merged()), Some(merged())]).expect("joined") {
            Verdict::Merged {
                response,
                contributed,
                ..
            } => {
                assert_eq!(contributed, 2);
                assert!(matches!(response.body, ResponseBody::Full(b) if &b[..] == b"[1,1]"));
            }
            other => panic!("{other:?}"),
        }
    }
}
