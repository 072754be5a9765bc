//! The streamed `/nodes` merge keeps the records the buffered merge keeps, composed and stamped
//! the same, however the answers' bytes arrive: split nodes (facts or catalog newest elsewhere),
//! nodes the map does not place, deactivated copies (every node state, or active only), nodes
//! the map places but an answer lacks, owners not asked, a backend failing before its head;
//! unordered, and ordered by certname (k-way), also where a backend sorts certnames otherwise
//! (another collation: the same records, in another order).

use std::sync::Arc;

use proptest::prelude::*;
use serde_json::{json, Value};

use super::tests::{merge, plan_over};
use super::tests_stream::{feed, order_of};
use crate::entity::Entity;
use crate::ids::BackendId;
use crate::membership::{BackendNodes, Member, Ownership};
use crate::ownership::NodeScope;
use crate::streamed::{NodeRecords, RecordStream, StreamRule};

/// The producer times the estates draw from (ties included).
const STAMPS: [&str; 3] = [
    "2026-12-01T08:00:00.000Z",
    "2026-12-01T09:00:00.000Z",
    "2026-12-01T10:00:00.000Z",
];

/// One backend's copy of one node: its report, facts and catalog times (`None`: none), whether
/// it is active, whether the map knows it, whether its answer holds it.
#[derive(Debug, Clone)]
struct Held {
    times: [Option<usize>; 3],
    active: bool,
    mapped: bool,
    answered: bool,
}

fn held() -> impl Strategy<Value = Option<Held>> {
    let time = prop::option::weighted(0.85, 0..STAMPS.len());
    prop::option::weighted(
        0.75,
        (
            [time.clone(), time.clone(), time],
            prop::bool::weighted(0.9),
            prop::bool::weighted(0.85),
            prop::bool::weighted(0.95),
        )
            .prop_map(|(times, active, mapped, answered)| Held {
                times,
                active,
                mapped,
                answered,
            }),
    )
}

/// An estate: per node, each backend's copy.
fn estate(backends: usize) -> impl Strategy<Value = Vec<Vec<Option<Held>>>> {
    prop::collection::vec(prop::collection::vec(held(), backends), 1..8)
}

/// The membership map of `estate` as its backends' refreshes would build it.
fn map_of(estate: &[Vec<Option<Held>>], backends: usize) -> Arc<Ownership> {
    let parts: Vec<Option<BackendNodes>> = (0..backends)
        .map(|backend| {
            Some(
                estate
                    .iter()
                    .enumerate()
                    .filter_map(|(node, copies)| {
                        let copy = copies[backend].as_ref().filter(|c| c.mapped)?;
                        let at = |kind: usize| copy.times[kind].map(|t| STAMPS[t]);
                        let mut member = Member::active(at(0))
                            .with_facts_produced(at(1))
                            .with_catalog_produced(at(2));
                        member.active = copy.active;
                        Some((format!("n{node}").into(), member))
                    })
                    .collect(),
            )
        })
        .collect();
    Arc::new(Ownership::build(&parts, 1))
}

/// Each backend's `/nodes` answer: whole node records, each backend's fields its own, in the
/// order `order` sorts them.
fn answers(
    estate: &[Vec<Option<Held>>],
    backends: usize,
    (any_state, order): (bool, Option<&Order>),
) -> Vec<String> {
    (0..backends)
        .map(|backend| {
            let mut nodes: Vec<usize> = (0..estate.len()).collect();
            match order {
                Some(Order {
                    collation: Some(keys),
                    ..
                }) => nodes.sort_by_key(|node| keys[(node + backend * 3) % keys.len()]),
                Some(Order { descending, .. }) => nodes.sort_by(|a, b| {
                    let (a, b) = (format!("n{a}"), format!("n{b}"));
                    if *descending {
                        b.cmp(&a)
                    } else {
                        a.cmp(&b)
                    }
                }),
                None => {}
            }
            let records: Vec<Value> = nodes
                .into_iter()
                .map(|node| (node, &estate[node]))
                .filter_map(|(node, copies)| {
                    let copy = copies[backend]
                        .as_ref()
                        .filter(|c| c.answered && (c.active || any_state))?;
                    let at = |kind: usize| copy.times[kind].map(|t| STAMPS[t]);
                    Some(json!({
                        "certname": format!("n{node}"),
                        "deactivated": (!copy.active).then_some(STAMPS[0]),
                        "report_timestamp": at(0),
                        "facts_timestamp": at(1),
                        "facts_environment": format!("env-{backend}"),
                        "catalog_timestamp": at(2),
                        "catalog_environment": format!("cat-{backend}"),
                        "latest_report_status": if backend == 0 { "changed" } else { "unchanged" },
                    }))
                })
                .collect();
            serde_json::to_string_pretty(&records).expect("json")
        })
        .collect()
}

/// The records of a JSON array as a sorted list of texts.
fn as_set(body: &str) -> Vec<String> {
    let records: Vec<Value> = serde_json::from_str(body).expect("a JSON array");
    let mut texts: Vec<String> = records.iter().map(Value::to_string).collect();
    texts.sort();
    texts
}

/// An order by certname, and how each backend sorts.
#[derive(Debug, Clone)]
struct Order {
    descending: bool,
    /// A second field (a node record's own, which the merge also reads for its decisions).
    then: Option<&'static str>,
    /// A collation other than pdbmux's: each backend's answer in its own order (node `n` by the
    /// key at `n + 3 × backend`, wrapping), rather than byte-wise.
    collation: Option<Vec<u8>>,
}

/// Which `/nodes` question is asked of which backends.
#[derive(Debug, Clone)]
struct Question {
    /// Every node state (`["=","node_state","any"]`), deactivated copies answered too.
    any_state: bool,
    /// `order_by` certname (merged k-way).
    order: Option<Order>,
    /// The backends asked (the others out of service), in configured order.
    roster: Vec<usize>,
    /// An asked backend (its index among them) failing before its answer's head.
    failed: Option<usize>,
}

impl Question {
    /// Every backend asked of `backends`, active nodes only.
    fn all(backends: usize) -> Question {
        Question {
            any_state: false,
            order: None,
            roster: (0..backends).collect(),
            failed: None,
        }
    }
}

fn question(backends: usize) -> impl Strategy<Value = Question> {
    let then = prop::sample::select(vec![
        "report_timestamp",
        "facts_timestamp",
        "catalog_environment",
        "latest_report_status",
    ]);
    let order = (
        any::<bool>(),
        prop::option::weighted(0.5, then),
        prop::option::weighted(0.3, prop::collection::vec(any::<u8>(), 1..9)),
    )
        .prop_map(|(descending, then, collation)| Order {
            descending,
            then,
            collation,
        });
    (
        any::<bool>(),
        prop::option::weighted(0.5, order),
        prop::sample::subsequence((0..backends).collect::<Vec<_>>(), 1..=backends),
        prop::option::weighted(0.2, 0..backends),
    )
        .prop_map(|(any_state, order, roster, failed)| Question {
            failed: failed.filter(|f| *f < roster.len()),
            any_state,
            order,
            roster,
        })
}

/// The records of a JSON array as texts, in their order.
fn as_list(body: &str) -> Vec<String> {
    let records: Vec<Value> = serde_json::from_str(body).expect("a JSON array");
    records.iter().map(Value::to_string).collect()
}

/// `/nodes` over `estate` buffered, and streamed in `pieces` taking turns by `turns`.
fn both_merges(
    estate: &[Vec<Option<Held>>],
    backends: usize,
    question: &Question,
    (pieces, turns): (&[usize], &[usize]),
) -> (String, String) {
    let config = Arc::new(crate::config::Config::on_loopback(
        &[("pdb-a", 1), ("pdb-b", 2), ("pdb-c", 3)][..backends],
    ));
    let map = map_of(estate, backends);
    let every = answers(
        estate,
        backends,
        (question.any_state, question.order.as_ref()),
    );
    // A backend failing before its head adds no records, as an empty answer would.
    let answers: Vec<String> = (question.roster.iter().enumerate())
        .map(|(input, backend)| match question.failed == Some(input) {
            true => "[]".to_owned(),
            false => every[*backend].clone(),
        })
        .collect();
    let order_by = question.order.as_ref().map(|order| {
        let direction = if order.descending { "desc" } else { "asc" };
        let then = order.then.map(|field| format!(r#",{{"field":"{field}"}}"#));
        format!(
            r#"[{{"field":"certname","order":"{direction}"}}{}]"#,
            then.unwrap_or_default()
        )
    });
    let mut target = match question.any_state {
        true => "/pdb/query/v4/nodes?query=%5B%22%3D%22%2C%22node_state%22%2C%22any%22%5D",
        false => "/pdb/query/v4/nodes?",
    }
    .to_owned();
    if let Some(order_by) = &order_by {
        let encoded: String = form_urlencoded::byte_serialize(order_by.as_bytes()).collect();
        target.push_str(&format!("&order_by={encoded}"));
    }
    let asked: Vec<BackendId> = question.roster.iter().copied().map(BackendId).collect();
    let ownership = Some(Arc::clone(&map));
    let mut planned = plan_over(&config, &target, ownership, asked.clone()).expect("plan");
    let bodies: Vec<(&str, Option<u64>)> = answers.iter().map(|a| (a.as_str(), None)).collect();
    let (buffered, _) = merge(&mut planned, &bodies);
    let scope = NodeScope::of(Entity::Nodes, config.merge, question.any_state);
    let rule = StreamRule::Node(NodeRecords::new(map, scope, &config.backends));
    let order = order_by.map(|order_by| order_of("nodes", &order_by));
    let mut stream = RecordStream::new(rule, asked, (None, order));
    if let Some(failed) = question.failed {
        stream.skip(failed);
    }
    // What the skip wrote (the whole answer when no other backend was asked).
    let written = String::from_utf8(stream.take().expect("merged")).expect("utf-8");
    let streamed = written + &feed(&mut stream, &answers, pieces, turns);
    // Whatever waited was let go once written or known not to be.
    assert_eq!(
        stream.held_bytes(),
        0,
        "nothing held once the answer is whole"
    );
    (buffered, streamed)
}

/// A copy answered and active, its report, facts and catalog produced at those [`STAMPS`],
/// which the map knows (`mapped`) or not.
fn copy_at(times: [usize; 3], mapped: bool) -> Option<Held> {
    Some(Held {
        times: times.map(Some),
        active: true,
        mapped,
        answered: true,
    })
}

#[test]
fn a_split_node_is_composed_and_an_unplaced_one_is_the_newest_copy() {
    // Report newest in a, facts in b, catalog in a.
    let split = vec![copy_at([2, 0, 1], true), copy_at([1, 1, 0], true)];
    let unplaced = vec![copy_at([0, 0, 0], false), copy_at([1, 0, 0], false)];
    let estate = vec![split, unplaced];
    // b's answer first, a record at a time: a's record of n0 waits for b's facts fields.
    let turns = [1, 1, 1, 1, 1, 1, 1, 1, 1, 1];
    let (buffered, streamed) = both_merges(&estate, 2, &Question::all(2), (&[40], &turns));
    assert_eq!(as_set(&streamed), as_set(&buffered));
    let records: Vec<Value> = serde_json::from_str(&streamed).expect("json");
    let n0 = records.iter().find(|r| r["certname"] == "n0").expect("n0");
    assert_eq!(n0["pdbmux_source"], "pdb-a");
    assert_eq!(n0["facts_environment"], "env-1");
    assert_eq!(n0["facts_timestamp"], STAMPS[1]);
    assert_eq!(n0["catalog_environment"], "cat-0");
    let n1 = records.iter().find(|r| r["certname"] == "n1").expect("n1");
    assert_eq!(n1["pdbmux_source"], "pdb-b");
    assert_eq!(records.len(), 2);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn streamed_nodes_are_the_buffered_merge(
        (backends, estate, question) in (2usize..4)
            .prop_flat_map(|backends| (Just(backends), estate(backends), question(backends))),
        pieces in prop::collection::vec(1usize..300, 1..6),
        turns in prop::collection::vec(0usize..3, 0..40),
    ) {
        let (buffered, streamed) = both_merges(&estate, backends, &question, (&pieces, &turns));
        match &question.order {
            // Sorted as pdbmux sorts: the same records in the same order.
            Some(Order { collation: None, .. }) => {
                prop_assert_eq!(as_list(&streamed), as_list(&buffered))
            }
            // Sorted otherwise: in another order, but each node once and composed alike.
            _ => prop_assert_eq!(as_set(&streamed), as_set(&buffered)),
        }
    }
}
