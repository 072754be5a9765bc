//! The streamed node-owned merge keeps the records the buffered merge keeps, however the answers'
//! bytes arrive: in pieces of any size, interleaved in any order.

use proptest::prelude::*;
use serde_json::{json, Value};

use super::tests::{config, merge, ownership, plan};
use crate::entity::Entity;
use crate::ids::BackendId;
use crate::ownership::NodeScope;
use crate::streamed::{JoinedLater, MergeBroken, MergeStream, RecordStream, StreamRule};

/// The certnames the generated estates draw from.
const NODES: [&str; 6] = ["n0", "n1", "n2", "n3", "n4", "n5"];

/// One backend's `/resources` answer: `records` (node index, resource index), in order.
fn answer(backend: usize, records: &[(usize, usize)]) -> String {
    let records: Vec<String> = records
        .iter()
        .map(|(node, index)| {
            format!(
                r#"{{"certname": "{}", "type":"File", "title":"/b{backend}/{index}", "parameters":{{"mode":"0644","a\"b":[1,2]}}}}"#,
                NODES[*node]
            )
        })
        .collect();
    format!("[ {} ]\n", records.join(",\n  "))
}

/// Feeds `answers` to a stream in `pieces` (each answer cut at those lengths, cycling), taking
/// turns by `turns` (an input index each; an input whose pieces ran out is ended).
fn streamed(answers: &[String], pieces: &[usize], turns: &[usize], scope: NodeScope) -> String {
    let ownership = ownership(&[], &[]);
    streamed_with(answers, pieces, turns, (ownership, scope))
}

fn streamed_with(
    answers: &[String],
    pieces: &[usize],
    turns: &[usize],
    (ownership, scope): (std::sync::Arc<crate::membership::Ownership>, NodeScope),
) -> String {
    let asked: Vec<BackendId> = (0..answers.len()).map(BackendId).collect();
    let mut stream = RecordStream::new(StreamRule::Owned(ownership, scope), asked, (None, None));
    feed(&mut stream, answers, pieces, turns)
}

/// Feeds `answers` to `stream` in `pieces`, taking turns by `turns` (see [`streamed`]).
pub(super) fn feed(
    stream: &mut RecordStream,
    answers: &[String],
    pieces: &[usize],
    turns: &[usize],
) -> String {
    let mut at = vec![0; answers.len()];
    let mut cut = 0;
    let mut out = Vec::new();
    let mut turn = 0;
    while !stream.is_finished() {
        let input = turns.get(turn).copied().unwrap_or(turn) % answers.len();
        turn += 1;
        let body = answers[input].as_bytes();
        if at[input] >= body.len() {
            stream.end(input).expect("a whole array");
        } else {
            let length = pieces[cut % pieces.len()].max(1);
            cut += 1;
            let end = (at[input] + length).min(body.len());
            stream.push(input, &body[at[input]..end]).expect("records");
            at[input] = end;
        }
        out.extend(stream.take().expect("merged"));
    }
    String::from_utf8(out).expect("utf-8")
}

/// What `stream` writes once every answer has ended: each [`RecordStream::take`] until it gives
/// nothing (an ordered merge writes a few hundred KiB at a time), then the answer is whole.
fn taken_whole(stream: &mut RecordStream) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let piece = stream.take().expect("merged");
        if piece.is_empty() {
            break;
        }
        out.extend(piece);
    }
    assert!(
        stream.is_finished(),
        "every answer ended, the merge did not"
    );
    out
}

/// The membership map of two backends holding `a` and `b` (node index, timestamp index; a
/// node's first entry counts).
pub(super) fn map_of(
    a: &[(usize, usize)],
    b: &[(usize, usize)],
) -> std::sync::Arc<crate::membership::Ownership> {
    let stamp = [
        "2026-12-01T08:00:00Z",
        "2026-12-01T09:00:00Z",
        "2026-12-01T10:00:00Z",
    ];
    let rows = |nodes: &[(usize, usize)]| -> Vec<(&str, &str)> {
        let mut rows: Vec<(&str, &str)> =
            nodes.iter().map(|(n, t)| (NODES[*n], stamp[*t])).collect();
        rows.sort();
        rows.dedup_by(|x, y| x.0 == y.0);
        rows
    };
    ownership(&rows(a), &rows(b))
}

/// The records of a JSON array, each as text, sorted: the answer as a set.
fn sorted(body: &str) -> Vec<String> {
    let records: Vec<Value> = serde_json::from_str(body).expect("a JSON array");
    let mut records: Vec<String> = records.iter().map(Value::to_string).collect();
    records.sort();
    records
}

fn scope() -> NodeScope {
    scope_of(Entity::Resources)
}

/// How `entity`'s records are owned under the test configuration.
pub(super) fn scope_of(entity: Entity) -> NodeScope {
    NodeScope::of(entity, config().merge, false)
}

#[test]
fn one_piece_each_in_configured_order_is_the_buffered_merge_byte_for_byte() {
    let config = config();
    // n0 both (b newer), n1 a only, n2 both (a newer), n3 unplaced in both, n4 unplaced in b.
    let map = ownership(
        &[
            ("n0", "2026-12-01T08:00:00Z"),
            ("n1", "2026-12-01T08:00:00Z"),
            ("n2", "2026-12-01T10:00:00Z"),
        ],
        &[
            ("n0", "2026-12-01T09:00:00Z"),
            ("n2", "2026-12-01T09:00:00Z"),
        ],
    );
    let a = answer(0, &[(0, 0), (1, 1), (1, 2), (2, 3), (3, 4)]);
    let b = answer(1, &[(0, 0), (2, 1), (3, 2), (4, 3), (3, 5)]);
    let mut planned = plan(&config, "/pdb/query/v4/resources", Some(map.clone())).expect("plan");
    let (buffered, _) = merge(&mut planned, &[(&a, None), (&b, None)]);
    let pieces = [usize::MAX];
    let streamed = streamed_with(&[a, b], &pieces, &[0, 0, 1, 1], (map, scope()));
    assert_eq!(streamed, buffered);
    // What the merge kept: a's n1, n2 and n3; b's n0 and n4 (n3 is a's: a returned it first).
    let titles: Vec<String> = sorted(&streamed)
        .iter()
        .map(|r| serde_json::from_str::<Value>(r).expect("json")["title"].to_string())
        .collect();
    assert_eq!(titles.len(), 6, "{streamed}");
}

#[test]
fn an_empty_answer_and_whitespace_anywhere_between_tokens() {
    let out = streamed(&[" [ ] ".to_owned(), "\n[]".to_owned()], &[1], &[], scope());
    assert_eq!(out, "[]");
}

#[test]
fn a_body_that_is_not_an_array_of_objects_is_broken() {
    for (body, whole) in [
        ("{}", true),
        ("[1]", true),
        ("[{\"certname\":\"n0\"} {}]", true),
        ("[{\"certname\":\"n0\"}] x", true),
        ("[{\"certname\":\"n0\"}", false),
        ("[{\"certname\":\"n0\",", false),
    ] {
        let map = ownership(&[], &[]);
        let mut stream = RecordStream::new(
            StreamRule::Owned(map, scope()),
            vec![BackendId(0)],
            (None, None),
        );
        let pushed = stream.push(0, body.as_bytes());
        let ended = pushed.clone().and_then(|()| stream.end(0));
        assert!(ended.is_err(), "{body}: {ended:?}");
        assert_eq!(pushed.is_err(), whole, "{body}: {pushed:?}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn any_pieces_in_any_order_keep_the_buffered_merge_s_records(
        a_nodes in prop::collection::vec((0..NODES.len(), 0..3usize), 0..6),
        b_nodes in prop::collection::vec((0..NODES.len(), 0..3usize), 0..6),
        a_records in prop::collection::vec((0..NODES.len(), 0..20usize), 0..12),
        b_records in prop::collection::vec((0..NODES.len(), 0..20usize), 0..12),
        pieces in prop::collection::vec(1..64usize, 1..8),
        turns in prop::collection::vec(0..2usize, 0..64),
    ) {
        let map = map_of(&a_nodes, &b_nodes);
        let answers = [answer(0, &a_records), answer(1, &b_records)];
        let config = config();
        let mut planned = plan(&config, "/pdb/query/v4/resources", Some(map.clone())).expect("plan");
        let (buffered, _) = merge(&mut planned, &[(&answers[0], None), (&answers[1], None)]);
        let streamed = streamed_with(&answers, &pieces, &turns, (map, scope()));
        prop_assert_eq!(sorted(&streamed), sorted(&buffered));
    }
}

/// One backend's `/facts` answer: `records` (node index, fact index, environment index), with
/// fact 0 named like the provenance fact (which the backends do not hold: dropped).
fn facts_answer(backend: usize, records: &[(usize, usize, usize)]) -> String {
    let records: Vec<String> = records
        .iter()
        .map(|(node, fact, environment)| {
            let name = match fact {
                0 => "pdbmux_source".to_owned(),
                n => format!("f{n}"),
            };
            let environment = ["production", "dev"][*environment];
            json!({"certname": NODES[*node], "name": name, "value": {"from": backend, "n": [1.5, -2e3]},
                "environment": environment})
            .to_string()
        })
        .collect();
    format!("[{}]", records.join(","))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn facts_streamed_keep_the_buffered_records_and_one_provenance_record_per_node(
        a_nodes in prop::collection::vec((0..NODES.len(), 0..3usize), 0..6),
        b_nodes in prop::collection::vec((0..NODES.len(), 0..3usize), 0..6),
        a_records in prop::collection::vec((0..NODES.len(), 0..4usize, 0..2usize), 0..12),
        b_records in prop::collection::vec((0..NODES.len(), 0..4usize, 0..2usize), 0..12),
        pieces in prop::collection::vec(1..64usize, 1..8),
        turns in prop::collection::vec(0..2usize, 0..64),
    ) {
        let map = map_of(&a_nodes, &b_nodes);
        // A node's records come together in one backend's answer, as PuppetDB writes them.
        let grouped = |mut records: Vec<(usize, usize, usize)>| {
            records.sort_by_key(|(node, _, _)| *node);
            records
        };
        let answers = [
            facts_answer(0, &grouped(a_records)),
            facts_answer(1, &grouped(b_records)),
        ];
        let config = config();
        let mut planned = plan(&config, "/pdb/query/v4/facts", Some(map.clone())).expect("plan");
        let (buffered, _) = merge(&mut planned, &[(&answers[0], None), (&answers[1], None)]);
        let provenance = crate::streamed::StreamedProvenance {
            source_fact: config.source_fact.clone(),
            inject: Some(vec!["pdb-a".to_owned(), "pdb-b".to_owned()]),
        };
        let scope = NodeScope::of(Entity::Facts, config.merge, false);
        let streamed = streamed_facts(&answers, &pieces, &turns, (map, scope, provenance));
        prop_assert_eq!(sorted(&streamed), sorted(&buffered));
    }
}

fn streamed_facts(
    answers: &[String],
    pieces: &[usize],
    turns: &[usize],
    (ownership, scope, provenance): (
        std::sync::Arc<crate::membership::Ownership>,
        NodeScope,
        crate::streamed::StreamedProvenance,
    ),
) -> String {
    let asked: Vec<BackendId> = (0..answers.len()).map(BackendId).collect();
    let mut stream = RecordStream::new(
        StreamRule::Owned(ownership, scope),
        asked,
        (Some(provenance), None),
    );
    feed(&mut stream, answers, pieces, turns)
}

/// The orders the ordered merge is checked under: every record tied (`type`: ties to configured
/// order), by node (a node's records come from one backend), and by keys no two backends share
/// (each title is its backend's), ascending and descending.
const ORDERS: [&str; 4] = [
    r#"[{"field":"type"}]"#,
    r#"[{"field":"certname"}]"#,
    r#"[{"field":"title","order":"desc"}]"#,
    r#"[{"field":"certname","order":"desc"},{"field":"title"}]"#,
];

/// `records` as one backend's answer sorted by `ORDERS[order]`, as PuppetDB sorts (byte-wise
/// strings; ties in the order PuppetDB read them).
fn sorted_answer(backend: usize, mut records: Vec<(usize, usize)>, order: usize) -> String {
    let title = |index: usize| format!("/b{backend}/{index}");
    match order {
        0 => {}
        1 => records.sort_by_key(|(node, _)| NODES[*node]),
        2 => records.sort_by_key(|(_, index)| std::cmp::Reverse(title(*index))),
        _ => records.sort_by(|x, y| NODES[y.0].cmp(NODES[x.0]).then(title(x.1).cmp(&title(y.1)))),
    }
    answer(backend, &records)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn an_ordered_answer_merged_k_way_is_the_buffered_merge_byte_for_byte(
        a_nodes in prop::collection::vec((0..NODES.len(), 0..3usize), 0..6),
        b_nodes in prop::collection::vec((0..NODES.len(), 0..3usize), 0..6),
        a_records in prop::collection::vec((0..NODES.len(), 0..20usize), 0..12),
        b_records in prop::collection::vec((0..NODES.len(), 0..20usize), 0..12),
        order in 0..ORDERS.len(),
        pieces in prop::collection::vec(1..64usize, 1..8),
        turns in prop::collection::vec(0..2usize, 0..64),
    ) {
        let map = map_of(&a_nodes, &b_nodes);
        let answers = [
            sorted_answer(0, a_records, order),
            sorted_answer(1, b_records, order),
        ];
        let (buffered, order_by) =
            buffered_ordered("resources", ORDERS[order], map.clone(), &answers);
        let asked = vec![BackendId(0), BackendId(1)];
        let mut stream = RecordStream::new(StreamRule::Owned(map, scope()), asked, (None, Some(order_by)));
        let streamed = feed(&mut stream, &answers, &pieces, &turns);
        prop_assert_eq!(streamed, buffered);
    }
}

/// The orders `/facts` streams under with its synthetic provenance records (certname first), and
/// one backend's answer sorted by `FACT_ORDERS[order]`: names on both sides of the synthetic
/// record's (`a_fact`, `q_fact`, `z_fact`; fact 0 is named like the provenance fact: dropped).
const FACT_ORDERS: [&str; 2] = [
    r#"[{"field":"certname"},{"field":"name"}]"#,
    r#"[{"field":"certname","order":"desc"}]"#,
];

fn sorted_facts_answer(
    backend: usize,
    mut records: Vec<(usize, usize, usize)>,
    order: usize,
) -> String {
    const NAMES: [&str; 4] = ["pdbmux_source", "a_fact", "q_fact", "z_fact"];
    match order {
        0 => records.sort_by_key(|(node, fact, _)| (NODES[*node], NAMES[*fact])),
        _ => records.sort_by_key(|(node, _, _)| std::cmp::Reverse(NODES[*node])),
    }
    let records: Vec<String> = records
        .iter()
        .map(|(node, fact, environment)| {
            let environment = ["production", "dev"][*environment];
            json!({"certname": NODES[*node], "name": NAMES[*fact], "value": backend,
                "environment": environment})
            .to_string()
        })
        .collect();
    format!("[{}]", records.join(","))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn ordered_facts_with_provenance_records_merged_k_way_are_the_buffered_merge(
        a_nodes in prop::collection::vec((0..NODES.len(), 0..3usize), 0..6),
        b_nodes in prop::collection::vec((0..NODES.len(), 0..3usize), 0..6),
        a_records in prop::collection::vec((0..NODES.len(), 0..4usize, 0..2usize), 0..12),
        b_records in prop::collection::vec((0..NODES.len(), 0..4usize, 0..2usize), 0..12),
        order in 0..FACT_ORDERS.len(),
        pieces in prop::collection::vec(1..64usize, 1..8),
        turns in prop::collection::vec(0..2usize, 0..64),
    ) {
        let map = map_of(&a_nodes, &b_nodes);
        let answers = [
            sorted_facts_answer(0, a_records, order),
            sorted_facts_answer(1, b_records, order),
        ];
        let config = config();
        let (buffered, order_by) =
            buffered_ordered("facts", FACT_ORDERS[order], map.clone(), &answers);
        let provenance = crate::streamed::StreamedProvenance {
            source_fact: config.source_fact.clone(),
            inject: Some(vec!["pdb-a".to_owned(), "pdb-b".to_owned()]),
        };
        let scope = NodeScope::of(Entity::Facts, config.merge, false);
        let asked = vec![BackendId(0), BackendId(1)];
        let mut stream =
            RecordStream::new(StreamRule::Owned(map, scope), asked, (Some(provenance), Some(order_by)));
        let streamed = feed(&mut stream, &answers, &pieces, &turns);
        prop_assert_eq!(streamed, buffered);
    }
}

/// `order_by` (JSON) parsed for `entity` (`resources`, `facts` or `nodes`).
pub(super) fn order_of(entity: &str, order: &str) -> crate::sort::OrderBy {
    let entity = match entity {
        "facts" => crate::entity::Entity::Facts,
        "nodes" => crate::entity::Entity::Nodes,
        _ => crate::entity::Entity::Resources,
    };
    let columns = entity.order_columns(crate::entity::ColumnSet::Base);
    crate::sort::parse_paging(Some(order), None, None, columns)
        .expect("an order")
        .order_by
}

/// The buffered merge of two backends' `answers` to `/pdb/query/v4/<entity>?order_by=<order>`
/// under `map`, and that order parsed (for the streamed merge to compare with).
fn buffered_ordered(
    entity: &str,
    order: &str,
    map: std::sync::Arc<crate::membership::Ownership>,
    answers: &[String; 2],
) -> (String, crate::sort::OrderBy) {
    let encoded: String = form_urlencoded::byte_serialize(order.as_bytes()).collect();
    let target = format!("/pdb/query/v4/{entity}?order_by={encoded}");
    let mut planned = plan(&config(), &target, Some(map)).expect("plan");
    let (buffered, _) = merge(&mut planned, &[(&answers[0], None), (&answers[1], None)]);
    (buffered, order_of(entity, order))
}

#[test]
fn an_ordered_merge_stops_wanting_a_backend_that_read_far_ahead_of_another() {
    let order = order_of("resources", r#"[{"field":"certname"}]"#);
    let map = ownership(&[], &[]);
    let asked = vec![BackendId(0), BackendId(1)];
    let mut stream = RecordStream::new(StreamRule::Owned(map, scope()), asked, (None, Some(order)));
    // Backend 1's nodes all sort after backend 0's: its records wait for backend 0's.
    let ahead = answer(1, &vec![(5, 0); 20_000]);
    let behind = answer(0, &[(0, 0), (1, 1)]);
    let mut read = 0;
    while stream.wants(1) && read < ahead.len() {
        let end = (read + 64 * 1024).min(ahead.len());
        stream
            .push(1, &ahead.as_bytes()[read..end])
            .expect("records");
        read = end;
    }
    assert!(read < ahead.len(), "stopped before backend 1's end");
    assert!(stream.wants(0), "the backend with nothing queued is read");
    assert!(
        stream.take().expect("merged").is_empty(),
        "nothing is known to come first yet"
    );
    stream.push(0, behind.as_bytes()).expect("records");
    stream.end(0).expect("whole");
    assert!(
        stream.wants(1),
        "backend 0 ended: backend 1's records are written"
    );
    stream.push(1, &ahead.as_bytes()[read..]).expect("records");
    stream.end(1).expect("whole");
    let out = String::from_utf8(taken_whole(&mut stream)).expect("utf-8");
    let records: Vec<Value> = serde_json::from_str(&out).expect("one array");
    assert_eq!(records.len(), 20_002);
    assert_eq!(records[0]["certname"], "n0");
    assert_eq!(records[2]["certname"], "n5");
}

#[test]
fn a_backend_holding_only_a_synthetic_provenance_record_is_read_before_one_far_ahead() {
    // Ordered /facts with provenance: backend 0's n0 has given one record, so its queue holds
    // n0's synthetic pdbmux_source record, which waits for n0's next record; backend 1's n5
    // records all sort after it. Backend 1 is read only until it holds its share.
    let order = order_of("facts", FACT_ORDERS[0]);
    let config = config();
    let provenance = crate::streamed::StreamedProvenance {
        source_fact: config.source_fact.clone(),
        inject: Some(vec!["pdb-a".to_owned(), "pdb-b".to_owned()]),
    };
    let scope = NodeScope::of(Entity::Facts, config.merge, false);
    let asked = vec![BackendId(0), BackendId(1)];
    let map = map_of(&[(0, 0)], &[(5, 0)]);
    let mut stream = RecordStream::new(
        StreamRule::Owned(map, scope),
        asked,
        (Some(provenance), Some(order)),
    );
    let behind = sorted_facts_answer(0, vec![(0, 1, 0), (0, 2, 0)], 0);
    let comma = behind.find("},{").expect("two records") + 2;
    stream
        .push(0, &behind.as_bytes()[..comma])
        .expect("records");
    let ahead = sorted_facts_answer(1, vec![(5, 1, 0); 40_000], 0);
    let mut read = 0;
    while stream.wants(1) && read < ahead.len() {
        let end = (read + 64 * 1024).min(ahead.len());
        stream
            .push(1, &ahead.as_bytes()[read..end])
            .expect("records");
        read = end;
    }
    assert!(
        read < ahead.len() / 2,
        "backend 1 read {read} bytes of {} while backend 0 had nothing to write",
        ahead.len()
    );
    assert!(stream.wants(0));
    stream
        .push(0, &behind.as_bytes()[comma..])
        .expect("records");
    stream.end(0).expect("whole");
    stream.push(1, &ahead.as_bytes()[read..]).expect("records");
    stream.end(1).expect("whole");
    let out = String::from_utf8(taken_whole(&mut stream)).expect("utf-8");
    let records: Vec<Value> = serde_json::from_str(&out).expect("one array");
    let names: Vec<&str> = records[..4]
        .iter()
        .map(|r| r["name"].as_str().unwrap_or("?"))
        .collect();
    assert_eq!(names, ["a_fact", "pdbmux_source", "q_fact", "a_fact"]);
    assert_eq!(records.len(), 3 + 40_001);
}

#[test]
fn pieces_read_ahead_of_a_backend_past_its_share_wait_for_the_backend_an_ordered_merge_waits_for() {
    // Read before the merge streamed: many pieces of backend 1 (whose nodes all sort after
    // backend 0's), then one of backend 0. Merged in the order they came, all of backend 1's
    // would be queued before backend 0's first record could be written.
    let order = order_of("resources", r#"[{"field":"certname"}]"#);
    let asked = vec![BackendId(0), BackendId(1)];
    let owned = RecordStream::new(
        StreamRule::Owned(ownership(&[], &[]), scope()),
        asked,
        (None, Some(order)),
    );
    let ahead = answer(1, &vec![(5, 0); 40_000]);
    let behind = answer(0, &[(0, 0), (1, 1)]);
    // Backend 0's answer without its `]`: its body is still being read.
    let (first, rest) = behind.split_at(behind.rfind(']').expect("an array"));
    let pieces: Vec<(usize, bytes::Bytes)> = ahead
        .as_bytes()
        .chunks(64 * 1024)
        .map(|piece| (1, bytes::Bytes::copy_from_slice(piece)))
        .chain([(0, bytes::Bytes::copy_from_slice(first.as_bytes()))])
        .collect();
    let of_backend_1 = pieces.len() - 1;
    let mut stream = MergeStream::new(owned, Vec::new(), pieces);
    assert!(
        !stream.wants(0),
        "a body is not read while pieces of it read before wait"
    );
    let mut out = String::new();
    let mut merged = 0;
    while !out.contains(r#""n1""#) {
        stream
            .merge_read_ahead()
            .expect("backend 0's piece is still to merge")
            .expect("records");
        merged += 1;
        out.push_str(std::str::from_utf8(&stream.take().expect("merged")).expect("utf-8"));
    }
    // Backend 1's pieces go first until it holds its share (1 MiB, 16 pieces), then backend
    // 0's: not after all of backend 1's.
    assert!(
        merged <= 16 + 2,
        "backend 0's records written after {merged} pieces, of backend 1's {of_backend_1}"
    );
    // Backend 1 holds its share queued and backend 0 has nothing: backend 1's other pieces
    // wait, and backend 0's body is read.
    assert!(stream.merge_read_ahead().is_none());
    assert!(stream.wants(0) && !stream.wants(1));
    stream.push(0, rest.as_bytes()).expect("records");
    stream.end(0).expect("whole");
    while let Some(merged) = stream.merge_read_ahead() {
        merged.expect("records");
        out.push_str(std::str::from_utf8(&stream.take().expect("merged")).expect("utf-8"));
    }
    stream.end(1).expect("whole");
    assert!(stream.is_finished());
    out.push_str(std::str::from_utf8(&stream.take().expect("merged")).expect("utf-8"));
    let records: Vec<Value> = serde_json::from_str(&out).expect("one array");
    assert_eq!(records.len(), 40_002);
    assert_eq!(
        (&records[0]["certname"], &records[2]["certname"]),
        (&json!("n0"), &json!("n5"))
    );
}

/// A node the map does not place, first returned by backend 1, waits until backend 0 (before it
/// in configured order) has ended: both backends are read on, what sorts after the node queued
/// meanwhile, and the queues count as held (so the memory budget bounds the wait).
#[test]
fn an_unplaced_node_of_a_later_backend_holds_what_sorts_after_it_counted_as_held() {
    let order = order_of("resources", r#"[{"field":"certname"}]"#);
    let map = ownership(&[], &[]);
    let asked = vec![BackendId(0), BackendId(1)];
    let mut stream = RecordStream::new(StreamRule::Owned(map, scope()), asked, (None, Some(order)));
    // n0 is backend 1's alone and unplaced: it sorts first and waits for backend 0's end. Both
    // backends hold far more than ORDERED_AHEAD_BYTES of records sorting after it.
    let first = answer(1, &[(0, 0)]);
    let first = first.trim_end().trim_end_matches(']').to_owned();
    stream.push(1, first.as_bytes()).expect("records");
    let later = answer(1, &vec![(5, 1); 20_000]);
    let later = format!(",{}", &later.trim_start()[1..]);
    let earlier = answer(0, &vec![(4, 0); 20_000]);
    let bodies = [earlier.as_bytes(), later.as_bytes()];
    let mut read = [0, 0];
    let mut most_held = 0;
    for _ in 0..10_000 {
        let mut progressed = false;
        // Each backend's next 64 KiB while the merge wants it, as the driver reads them.
        for (input, body) in bodies.iter().enumerate() {
            if !stream.wants(input) || read[input] == body.len() {
                continue;
            }
            let end = (read[input] + 64 * 1024).min(body.len());
            stream
                .push(input, &body[read[input]..end])
                .expect("records");
            read[input] = end;
            if end == body.len() {
                stream.end(input).expect("whole");
            }
            progressed = true;
        }
        most_held = most_held.max(stream.held_bytes());
        // Taken as the driver takes it: until nothing more is written, before reading on.
        while !stream.take().expect("merged").is_empty() {}
        if !progressed {
            break;
        }
    }
    assert!(
        stream.is_finished(),
        "stalled: read {read:?} of {} and {} bytes",
        earlier.len(),
        later.len()
    );
    // Backend 0's whole answer waited for its end, with backend 1's read meanwhile.
    assert!(
        most_held >= earlier.len() - 1024,
        "held at most {most_held} bytes"
    );
    assert_eq!(stream.held_bytes(), 0, "given back once written");
}

/// A joined answer whose records all sort together (every provenance record of an order by
/// name) is read and written a bounded piece at a time, not whole in one take, and let go once
/// written.
#[test]
fn a_large_joined_answer_is_written_a_piece_at_a_time_and_let_go() {
    let order = order_of("resources", r#"[{"field":"title"}]"#);
    let map = ownership(&[], &[]);
    let asked = vec![BackendId(0), BackendId(1)];
    let mut stream = RecordStream::new(StreamRule::Owned(map, scope()), asked, (None, Some(order)));
    let joined: Vec<String> = (0..20_000)
        .map(|n| {
            format!(
                r#"{{"certname":"j{n:05}","title":"/m","pad":"{}"}}"#,
                "x".repeat(40)
            )
        })
        .collect();
    let records = format!("[{}]", joined.join(","));
    stream
        .then_merge(bytes::Bytes::from(records.clone()))
        .expect("records");
    let held = stream.held_bytes();
    assert!(held >= records.len(), "the joined records are held: {held}");
    // Queued a piece at a time: the answer and one piece's records with their keys, not every
    // record's key at once (about three times the answer).
    assert!(
        held < records.len() + 256 * 1024,
        "{held} bytes held for {} of records",
        records.len()
    );
    // Both backends' records sort before the joined ones ("/b0/…", "/b1/…" < "/m").
    stream
        .push(0, answer(0, &[(0, 1)]).as_bytes())
        .expect("records");
    stream.end(0).expect("whole");
    stream
        .push(1, answer(1, &[(1, 2)]).as_bytes())
        .expect("records");
    stream.end(1).expect("whole");
    let mut out = Vec::new();
    let mut largest = 0;
    loop {
        let piece = stream.take().expect("merged");
        if piece.is_empty() {
            break;
        }
        largest = largest.max(piece.len());
        out.extend(piece);
    }
    assert!(stream.is_finished());
    assert!(
        largest < 512 * 1024,
        "{largest} bytes written at once of {}",
        out.len()
    );
    let merged: Vec<serde_json::Value> = serde_json::from_slice(&out).expect("one array");
    assert_eq!(merged.len(), 20_002);
    assert_eq!(
        (&merged[0]["title"], &merged[2]["certname"]),
        (&json!("/b0/1"), &json!("j00000"))
    );
    assert_eq!(merged[20_001]["certname"], "j19999");
    assert_eq!(
        stream.held_bytes(),
        0,
        "the joined records' queue is let go"
    );
}

#[test]
fn records_merged_into_an_ordered_stream_take_their_place_after_those_they_tie_with() {
    let order = order_of("resources", r#"[{"field":"title","order":"desc"}]"#);
    let map = ownership(&[], &[]);
    let asked = vec![BackendId(0), BackendId(1)];
    let mut stream = RecordStream::new(StreamRule::Owned(map, scope()), asked, (None, Some(order)));
    let joined = |title: &str| format!(r#"{{"certname":"n9","title":"{title}"}}"#);
    let records = format!(
        "[{}]",
        [joined("/b1/9"), joined("/b0/3"), joined("/a")].join(",")
    );
    stream
        .then_merge(bytes::Bytes::from(records.clone()))
        .expect("records");
    let answers = [answer(0, &[(0, 5), (0, 3)]), answer(1, &[(1, 4), (1, 2)])];
    let merged: Vec<serde_json::Value> =
        serde_json::from_str(&feed(&mut stream, &answers, &[7], &[0, 1])).expect("an array");
    let titles: Vec<&str> = merged.iter().filter_map(|r| r["title"].as_str()).collect();
    assert_eq!(
        titles,
        ["/b1/9", "/b1/4", "/b1/2", "/b0/5", "/b0/3", "/b0/3", "/a"]
    );
    assert_eq!(
        merged[5]["certname"], "n9",
        "after the streamed record it ties with"
    );
    assert_eq!(
        stream.held_bytes(),
        0,
        "nothing held once the answer is whole"
    );
    let mut refused = RecordStream::new(
        StreamRule::Owned(ownership(&[], &[]), scope()),
        vec![BackendId(0)],
        (None, Some(order_of("resources", r#"[{"field":"title"}]"#))),
    );
    assert_eq!(
        refused.then_merge(bytes::Bytes::from_static(b"[1,2]")),
        None,
        "not records"
    );
    let mut unordered = RecordStream::new(
        StreamRule::Owned(ownership(&[], &[]), scope()),
        vec![BackendId(0)],
        (None, None),
    );
    assert_eq!(
        unordered.then_merge(bytes::Bytes::from_static(b"[]")),
        None,
        "not ordered"
    );
}

/// A stream over two backends ordered by title then certname, joined with `later`, and the
/// joined records every one of which has the title `/m`.
fn joined_later_stream(
    later: impl FnOnce() -> Result<bytes::Bytes, MergeBroken> + Send + Sync + 'static,
) -> RecordStream {
    let order = order_of("resources", r#"[{"field":"title"},{"field":"certname"}]"#);
    let title = serde_json::value::RawValue::from_string(r#""/m""#.to_owned()).expect("JSON");
    let prefix = crate::sort::sort_key(&order, |field| (field == "title").then_some(&*title));
    let asked = vec![BackendId(0), BackendId(1)];
    let map = ownership(&[], &[]);
    let mut stream = RecordStream::new(StreamRule::Owned(map, scope()), asked, (None, Some(order)));
    stream
        .then_merge_later(JoinedLater::new(prefix.leading(1), later))
        .expect("ordered");
    stream
}

/// The joined records of [`joined_later_stream`].
const JOINED_LATER: &str = r#"[{"certname":"j0","title":"/m"},{"certname":"j1","title":"/m"}]"#;

/// The titles and certnames of a merged answer, in order.
fn titled(merged: &[u8]) -> Vec<(String, String)> {
    let records: Vec<Value> = serde_json::from_slice(merged).expect("one array");
    records
        .iter()
        .map(|r| {
            (
                r["title"].as_str().unwrap_or("").to_owned(),
                r["certname"].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect()
}

/// A joined answer whose records all sort with one prefix (the provenance records of an order
/// by name) is merged only once the stream's first records were taken (the first byte does not
/// wait for it), or when the stream reaches that prefix; and the answer is the one merged whole
/// beforehand gives.
#[test]
fn a_joined_answer_merged_later_waits_until_the_first_records_are_taken() {
    let merged = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let told = merged.clone();
    let mut stream = joined_later_stream(move || {
        told.store(true, std::sync::atomic::Ordering::SeqCst);
        Ok(bytes::Bytes::from_static(JOINED_LATER.as_bytes()))
    });
    let is_merged = || merged.load(std::sync::atomic::Ordering::SeqCst);
    let mut out = Vec::new();
    stream
        .push(0, br#"[{"certname":"n0","title":"/a"},"#)
        .expect("records");
    stream
        .push(
            1,
            br#"[{"certname":"n1","title":"/b"},{"certname":"n1","title":"/c"},"#,
        )
        .expect("records");
    out.extend(stream.take().expect("merged"));
    assert_eq!(
        (titled(&[&out[..], b"]"].concat()).len(), is_merged()),
        (1, false),
        "/a written and taken before the joined answer is merged"
    );
    stream
        .push(0, br#"{"certname":"n0","title":"/z"}]"#)
        .expect("records");
    stream.end(0).expect("whole");
    out.extend(stream.take().expect("merged"));
    assert!(is_merged(), "merged once the first records were taken");
    stream
        .push(
            1,
            br#"{"certname":"n1","title":"/m"},{"certname":"n1","title":"/y"}]"#,
        )
        .expect("records");
    stream.end(1).expect("whole");
    out.extend(taken_whole(&mut stream));
    assert!(is_merged());
    let pairs = |list: &[(&str, &str)]| -> Vec<(String, String)> {
        list.iter()
            .map(|(t, c)| (t.to_string(), c.to_string()))
            .collect()
    };
    assert_eq!(
        titled(&out),
        pairs(&[
            ("/a", "n0"),
            ("/b", "n1"),
            ("/c", "n1"),
            ("/m", "j0"),
            ("/m", "j1"),
            ("/m", "n1"),
            ("/y", "n1"),
            ("/z", "n0")
        ])
    );
    assert_eq!(
        stream.held_bytes(),
        0,
        "nothing held once the answer is whole"
    );

    // The same answers with the joined records merged beforehand: the same answer.
    let order = order_of("resources", r#"[{"field":"title"},{"field":"certname"}]"#);
    let asked = vec![BackendId(0), BackendId(1)];
    let mut before = RecordStream::new(
        StreamRule::Owned(ownership(&[], &[]), scope()),
        asked,
        (None, Some(order)),
    );
    before
        .then_merge(bytes::Bytes::from_static(JOINED_LATER.as_bytes()))
        .expect("records");
    let answers = [
        r#"[{"certname":"n0","title":"/a"},{"certname":"n0","title":"/z"}]"#.to_owned(),
        r#"[{"certname":"n1","title":"/b"},{"certname":"n1","title":"/c"},{"certname":"n1","title":"/m"},{"certname":"n1","title":"/y"}]"#.to_owned(),
    ];
    assert_eq!(
        titled(feed(&mut before, &answers, &[9], &[0, 1]).as_bytes()),
        titled(&out)
    );
}

/// A joined answer that cannot be merged when the stream reaches it breaks the answer: what was
/// written stays, nothing more is, and the answer never completes (the driver ends the body so
/// that it does not parse).
#[test]
fn a_joined_answer_that_cannot_be_merged_later_breaks_the_stream() {
    let mut stream = joined_later_stream(|| {
        Err(MergeBroken::Joined(
            "backend 1: unparseable body".to_owned(),
        ))
    });
    let first = br#"[{"certname":"n0","title":"/a"},{"certname":"n0","title":"/z"}]"#;
    stream.push(0, first).expect("records");
    stream.end(0).expect("whole");
    stream
        .push(1, br#"[{"certname":"n1","title":"/b"},"#)
        .expect("records");
    let written = stream.take().expect("what sorts before the joined records");
    assert_eq!(
        titled(&[&written[..], b"]"].concat()),
        vec![
            ("/a".to_owned(), "n0".to_owned()),
            ("/b".to_owned(), "n1".to_owned())
        ]
    );
    stream
        .push(1, br#"{"certname":"n1","title":"/y"}]"#)
        .expect("records");
    stream.end(1).expect("whole");
    let broken = stream
        .take()
        .expect_err("the joined answer could not be merged");
    assert!(broken.to_string().contains("unparseable body"), "{broken}");
    assert!(!stream.is_finished());
    assert!(stream.take().is_err(), "and stays broken");
}
