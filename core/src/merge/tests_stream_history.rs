//! The streamed history merge serves each stored report (or event) once, as the buffered union
//! does, however the answers' bytes arrive; ordered, in the buffered merge's order.

use proptest::prelude::*;
use serde_json::Value;

use super::tests::{config, merge, plan};
use super::tests_stream::{feed, map_of, scope_of};
use crate::entity::{Entity, Identity};
use crate::ids::BackendId;
use crate::sort::OrderBy;
use crate::streamed::{RecordStream, StreamRule};

/// The certnames the generated reports belong to.
const NODES: [&str; 4] = ["n0", "n1", "n2", "n3"];

/// Report `id` as `backend` stores it: its node, hash and end time follow from the id (so no two
/// reports tie on `end_time`); its `receive_time` is the backend's own.
fn report(backend: usize, id: usize) -> String {
    format!(
        r#"{{"certname":"{}","hash":"h{id:03}","end_time":"2026-12-01T10:{:02}:00.000Z","receive_time":"2026-12-01T11:00:0{backend}.000Z","status":"changed","logs":{{"data":[{{"message":"m{id}"}}]}}}}"#,
        NODES[id % NODES.len()],
        id % 60,
    )
}

/// Event `id` of report `id / 3` as `backend` stores it: equal to its copies but for
/// `report_receive_time`.
fn event(backend: usize, id: usize) -> String {
    format!(
        r#"{{"certname":"{}","report":"h{:03}","resource_title":"/e/{id}","timestamp":"2026-12-01T10:{:02}:00.000Z","report_receive_time":"2026-12-01T11:00:0{backend}.000Z"}}"#,
        NODES[id % NODES.len()],
        id / 3,
        id % 60,
    )
}

/// The orders the generated report answers come in: `end_time` descending, `hash` descending
/// (the identity's own field, read once for both), and `certname` (many ties: a report stored
/// twice goes where the buffered merge's stable sort puts the first backend's copy).
const ORDERS: [&str; 3] = [
    r#"[{"field":"end_time","order":"desc"}]"#,
    r#"[{"field":"hash","order":"desc"}]"#,
    r#"[{"field":"certname"}]"#,
];

/// One backend's answer: the records of `ids` (each once, as one PuppetDB stores it), sorted as
/// `ORDERS[order]` says (`None`: by id).
fn history_answer(
    backend: usize,
    ids: &[usize],
    order: Option<usize>,
    record: fn(usize, usize) -> String,
) -> String {
    let mut ids: Vec<usize> = ids.to_vec();
    ids.sort_unstable();
    ids.dedup();
    match order {
        Some(0) => ids.sort_by_key(|id| std::cmp::Reverse(id % 60)),
        Some(1) => ids.sort_by_key(|id| std::cmp::Reverse(*id)),
        Some(_) => ids.sort_by_key(|id| NODES[id % NODES.len()]),
        None => {}
    }
    let records: Vec<String> = ids.iter().map(|id| record(backend, *id)).collect();
    format!("[{}]", records.join(","))
}

/// What tells a record's copies apart, in the answer's order: its identity less the receive time.
fn identities(body: &str, field: &str) -> Vec<String> {
    let records: Vec<Value> = serde_json::from_str(body).expect("a JSON array");
    records
        .iter()
        .map(|record| {
            let mut record = record.clone();
            if let Some(fields) = record.as_object_mut() {
                fields.remove("receive_time");
                fields.remove("report_receive_time");
            }
            match field {
                "" => record.to_string(),
                field => record[field].to_string(),
            }
        })
        .collect()
}

/// The history stream of two backends' `answers` (no ownership), fed in `pieces` by `turns`.
fn streamed_history(
    identity: Identity,
    order: Option<OrderBy>,
    answers: &[String; 2],
    (pieces, turns): (&[usize], &[usize]),
) -> String {
    let rule = StreamRule::History {
        identity,
        owned: None,
        helpers: Vec::new(),
    };
    let asked = vec![BackendId(0), BackendId(1)];
    let mut stream = RecordStream::new(rule, asked, (None, order));
    feed(&mut stream, answers, pieces, turns)
}

/// `ORDERS[order]`, parsed for `/reports`.
fn report_order(order: usize) -> OrderBy {
    let columns = Entity::Reports.order_columns(crate::entity::ColumnSet::Base);
    crate::sort::parse_paging(Some(ORDERS[order]), None, None, columns)
        .expect("an order")
        .order_by
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn reports_stored_twice_are_served_once_as_the_buffered_union_serves_them(
        a_ids in prop::collection::vec(0..40usize, 0..12),
        b_ids in prop::collection::vec(0..40usize, 0..12),
        order in prop::option::of(0..ORDERS.len()),
        pieces in prop::collection::vec(1..64usize, 1..8),
        turns in prop::collection::vec(0..2usize, 0..64),
    ) {
        let answers = [
            history_answer(0, &a_ids, order, report),
            history_answer(1, &b_ids, order, report),
        ];
        let target = match order {
            Some(order) => {
                let encoded: String = form_urlencoded::byte_serialize(ORDERS[order].as_bytes()).collect();
                format!("/pdb/query/v4/reports?order_by={encoded}")
            }
            None => "/pdb/query/v4/reports".to_owned(),
        };
        let mut planned = plan(&config(), &target, None).expect("plan");
        let (buffered, _) = merge(&mut planned, &[(&answers[0], None), (&answers[1], None)]);
        let streamed = streamed_history(Identity::Hash, order.map(report_order), &answers, (&pieces, &turns));
        let (mut from_stream, mut from_buffer) =
            (identities(&streamed, "hash"), identities(&buffered, "hash"));
        if order.is_some() {
            // In the buffered merge's order, ties included.
            prop_assert_eq!(&from_stream, &from_buffer);
        }
        from_stream.sort();
        from_buffer.sort();
        let mut once = from_stream.clone();
        once.dedup();
        prop_assert_eq!(&once, &from_stream, "each report once");
        prop_assert_eq!(from_stream, from_buffer);
        // Each record written is one a backend sent, whole.
        let sent: Vec<Value> = answers
            .iter()
            .flat_map(|a| serde_json::from_str::<Vec<Value>>(a).expect("an array"))
            .collect();
        for record in serde_json::from_str::<Vec<Value>>(&streamed).expect("an array") {
            prop_assert!(sent.contains(&record), "{}", record);
        }
    }

    #[test]
    fn events_equal_but_for_their_receive_time_are_served_once(
        a_ids in prop::collection::vec(0..40usize, 0..12),
        b_ids in prop::collection::vec(0..40usize, 0..12),
        pieces in prop::collection::vec(1..64usize, 1..8),
        turns in prop::collection::vec(0..2usize, 0..64),
    ) {
        let answers = [
            history_answer(0, &a_ids, None, event),
            history_answer(1, &b_ids, None, event),
        ];
        let mut planned = plan(&config(), "/pdb/query/v4/events", None).expect("plan");
        let (buffered, _) = merge(&mut planned, &[(&answers[0], None), (&answers[1], None)]);
        let streamed =
            streamed_history(Identity::Verbatim, None, &answers, (&pieces, &turns));
        let (mut from_stream, mut from_buffer) =
            (identities(&streamed, ""), identities(&buffered, ""));
        from_stream.sort();
        from_buffer.sort();
        prop_assert_eq!(from_stream, from_buffer);
    }

    #[test]
    fn latest_reports_are_their_node_owner_s_each_once(
        a_nodes in prop::collection::vec((0..NODES.len(), 0..3usize), 0..4),
        b_nodes in prop::collection::vec((0..NODES.len(), 0..3usize), 0..4),
        a_ids in prop::collection::vec(0..40usize, 0..12),
        b_ids in prop::collection::vec(0..40usize, 0..12),
        pieces in prop::collection::vec(1..64usize, 1..8),
        turns in prop::collection::vec(0..2usize, 0..64),
    ) {
        let map = map_of(&a_nodes, &b_nodes);
        let answers = [
            history_answer(0, &a_ids, None, report),
            history_answer(1, &b_ids, None, report),
        ];
        let target = "/pdb/query/v4/reports?query=%5B%22%3D%22%2C%22latest_report%3F%22%2Ctrue%5D";
        let mut planned = plan(&config(), target, Some(map.clone())).expect("plan");
        let (buffered, _) = merge(&mut planned, &[(&answers[0], None), (&answers[1], None)]);
        let rule = StreamRule::History {
            identity: Identity::Hash,
            owned: Some((map, scope_of(Entity::Reports))),
            helpers: Vec::new(),
        };
        let mut stream = RecordStream::new(rule, vec![BackendId(0), BackendId(1)], (None, None));
        let streamed = feed(&mut stream, &answers, &pieces, &turns);
        let (mut from_stream, mut from_buffer) =
            (identities(&streamed, "hash"), identities(&buffered, "hash"));
        from_stream.sort();
        from_buffer.sort();
        prop_assert_eq!(from_stream, from_buffer);
    }
}

/// `record`'s fields among `columns`, as a backend answers an extract of them.
fn projected(record: &str, columns: &[&str]) -> Value {
    let record: Value = serde_json::from_str(record).expect("a record");
    let fields = columns
        .iter()
        .filter_map(|column| Some(((*column).to_owned(), record.get(*column)?.clone())))
        .collect();
    Value::Object(fields)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// A projection is asked with the fields that tell copies apart, which leave each row as
    /// it is written: the streamed rows are the buffered union's, in its order when ordered.
    #[test]
    fn projections_of_history_stream_the_rows_the_buffered_union_serves(
        a_ids in prop::collection::vec(0..40usize, 0..12),
        b_ids in prop::collection::vec(0..40usize, 0..12),
        events in any::<bool>(),
        ordered in any::<bool>(),
        pieces in prop::collection::vec(1..64usize, 1..8),
        turns in prop::collection::vec(0..2usize, 0..64),
    ) {
        let (entity, columns) = match events {
            true => (Entity::Events, ["certname", "timestamp"]),
            false => (Entity::Reports, ["certname", "end_time"]),
        };
        let record = if events { event } else { report };
        let helpers: Vec<&str> = entity
            .history()
            .expect("history")
            .identity
            .iter()
            .copied()
            .filter(|field| !columns.contains(field))
            .collect();
        let asked: Vec<&str> = columns.iter().copied().chain(helpers.iter().copied()).collect();
        let answers = [0, 1].map(|backend| {
            let ids = if backend == 0 { &a_ids } else { &b_ids };
            let whole = history_answer(backend, ids, ordered.then_some(0), record);
            let rows: Vec<Value> = serde_json::from_str::<Vec<Value>>(&whole)
                .expect("an array")
                .iter()
                .map(|r| projected(&r.to_string(), &asked))
                .collect();
            serde_json::to_string(&rows).expect("json")
        });
        let query = format!(r#"["extract",["{}","{}"]]"#, columns[0], columns[1]);
        let query: String = form_urlencoded::byte_serialize(query.as_bytes()).collect();
        let order = format!(r#"[{{"field":"{}","order":"desc"}}]"#, columns[1]);
        let order: String = form_urlencoded::byte_serialize(order.as_bytes()).collect();
        let target = match ordered {
            true => format!("{}?query={query}&order_by={order}", entity.path()),
            false => format!("{}?query={query}", entity.path()),
        };
        let mut planned = plan(&config(), &target, None).expect("plan");
        let (buffered, _) = merge(&mut planned, &[(&answers[0], None), (&answers[1], None)]);
        let mut streaming = plan(&config(), &target, None).expect("plan");
        let mut stream = streaming.streamed().expect("a projection of history streams");
        let streamed = feed(&mut stream, &answers, &pieces, &turns);
        let rows = |body: &str| serde_json::from_str::<Vec<Value>>(body).expect("an array");
        let (mut from_stream, mut from_buffer) = (rows(&streamed), rows(&buffered));
        for row in &from_stream {
            prop_assert!(helpers.iter().all(|h| row.get(*h).is_none()), "{}", row);
        }
        if !ordered {
            from_stream.sort_by_key(Value::to_string);
            from_buffer.sort_by_key(Value::to_string);
        }
        prop_assert_eq!(from_stream, from_buffer);
    }
}
