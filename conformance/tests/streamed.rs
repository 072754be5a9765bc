//! Streamed merges (docs/merging.md, "Streamed merges"): past `STREAM_ABOVE_BYTES` an unpaged
//! node-owned answer is written as it is merged (an ordered one k-way). The records are the buffered merge's;
//! the head is known before the first byte; a backend failing before it is a partial answer, a
//! body failing after it is cut off so that it does not parse.

mod common;

use std::collections::BTreeMap;

use http::StatusCode;
use pdbmux_conformance::{
    ms, Asked, ClientResponse, FakeBackend, Harness, PuppetDb, Reply, ReplyOutcome,
};
use serde_json::{json, Value};

use common::{finish, harness, run_to, URL_A, URL_B};

const T09: Option<&str> = Some("2024-05-01T09:00:00.000Z");
const T10: Option<&str> = Some("2024-05-01T10:00:00.000Z");
const T11: Option<&str> = Some("2024-05-01T11:00:00.000Z");

/// Resources per node: enough that two backends' answers hold more than
/// [`pdbmux_core::STREAM_ABOVE_BYTES`] together, and one alone more than half of it.
const PER_NODE: usize = 6_000;

/// One resource of `certname`, naming the backend it came from.
fn resource(certname: &str, backend: &str, index: usize) -> Value {
    json!({"certname": certname, "type": "File", "title": format!("/etc/{index:05}"),
        "backend": backend, "parameters": {"ensure": "file", "mode": "0644", "owner": "root",
        "content": "x".repeat(600)}})
}

/// pdb-a holding `only-a` and an older `shared`, pdb-b a newer `shared` and `only-b`, each node
/// with [`PER_NODE`] resources: about 5 MB per backend.
fn estate() -> (PuppetDb, PuppetDb) {
    moved_estate(
        ["only-a", "shared", "only-b"],
        ("resources", PER_NODE),
        resource,
    )
}

/// pdb-a holding `only_a` and `moved` (its report older), pdb-b `moved` (newer) and `only_b`,
/// each node with `count` records of `entity` made by `record(certname, backend, index)`.
fn moved_estate(
    [only_a, moved, only_b]: [&str; 3],
    (entity, count): (&str, usize),
    record: fn(&str, &str, usize) -> Value,
) -> (PuppetDb, PuppetDb) {
    let mut a = PuppetDb::new().node(only_a, T09).node(moved, T10);
    let mut b = PuppetDb::new().node(moved, T11).node(only_b, T09);
    for index in 0..count {
        a = a
            .record(entity, record(only_a, "pdb-a", index))
            .record(entity, record(moved, "pdb-a", index));
        b = b
            .record(entity, record(moved, "pdb-b", index))
            .record(entity, record(only_b, "pdb-b", index));
    }
    (a, b)
}

/// The body a scripted answer carries.
fn body_of(reply: &Reply) -> Vec<u8> {
    match &reply.outcome {
        ReplyOutcome::Answer(answer) => answer.body.to_vec(),
        _ => Vec::new(),
    }
}

/// How many records of each (certname, backend) an answer holds.
fn counted(response: &ClientResponse) -> BTreeMap<(String, String), usize> {
    let records: Vec<Value> = serde_json::from_slice(&response.body)
        .unwrap_or_else(|e| panic!("{e}: {} bytes", response.body.len()));
    let mut counts = BTreeMap::new();
    for record in records {
        let key = (
            record["certname"].as_str().unwrap_or("?").to_owned(),
            record["backend"].as_str().unwrap_or("?").to_owned(),
        );
        *counts.entry(key).or_insert(0) += 1;
    }
    counts
}

fn count(pairs: &[(&str, &str)]) -> BTreeMap<(String, String), usize> {
    pairs
        .iter()
        .map(|(c, b)| (((*c).to_owned(), (*b).to_owned()), PER_NODE))
        .collect()
}

/// A backend answering as `db` does, except its `/resources` answer, which `resources` gives.
fn with_resources(
    name: &str,
    url: &str,
    db: PuppetDb,
    resources: impl Fn(Reply) -> Reply + Send + 'static,
) -> FakeBackend {
    FakeBackend::by_request(name, url, move |asked: &Asked<'_>| {
        let reply = db.answer(asked).after(ms(3));
        if asked.path_and_query == "/pdb/query/v4/resources" {
            resources(reply)
        } else {
            reply
        }
    })
}

fn resources_of(h: &mut Harness) -> ClientResponse {
    answer_to(h, RESOURCES)
}

fn answer_to(h: &mut Harness, target: &str) -> ClientResponse {
    let client = h.get(target);
    finish(h);
    h.response(client).expect("one response").clone()
}

/// The answer to `path` with `order_by` (JSON).
fn ordered_answer_to(h: &mut Harness, path: &str, order_by: &str) -> ClientResponse {
    let encoded: String = form_urlencoded::byte_serialize(order_by.as_bytes()).collect();
    answer_to(h, &format!("{path}?order_by={encoded}"))
}

/// pdb-a answering as `a` does and pdb-b as `b` does, whole.
fn both(a: PuppetDb, b: PuppetDb) -> Vec<FakeBackend> {
    vec![
        FakeBackend::puppetdb("pdb-a", URL_A, a, ms(2)),
        FakeBackend::puppetdb("pdb-b", URL_B, b, ms(3)),
    ]
}

/// Both fake PuppetDBs answering the [`estate`] whole.
fn estate_backends() -> Vec<FakeBackend> {
    let (a, b) = estate();
    both(a, b)
}

/// A harness over the [`estate_backends`].
fn estate_harness() -> Harness {
    harness(estate_backends())
}

/// A streamed answer that completed: 200, from both backends.
fn assert_streamed_whole(response: &ClientResponse) {
    assert_eq!(response.merged, Some(None), "streamed, and whole");
    assert_eq!(response.status, StatusCode::OK);
    assert_eq!(response.header("x-backends"), Some("2/2"));
}

/// A streamed, whole 200 from both backends holding each node's records from its owner.
fn assert_streamed_from_owners(response: &ClientResponse) {
    assert_streamed_whole(response);
    assert_eq!(
        counted(response),
        count(&[
            ("only-a", "pdb-a"),
            ("only-b", "pdb-b"),
            ("shared", "pdb-b")
        ]),
        "each node from its owner"
    );
}

/// Each record's `(first, second)` fields (as JSON text) in the answer's order, checked to be
/// `first` descending, then `second` ascending.
fn descending_then_ascending(
    response: &ClientResponse,
    (first, second): (&str, &str),
) -> Vec<(String, String)> {
    let records: Vec<Value> = serde_json::from_slice(&response.body).expect("an array");
    let keys: Vec<(String, String)> = records
        .iter()
        .map(|r| (r[first].to_string(), r[second].to_string()))
        .collect();
    let mut sorted = keys.clone();
    sorted.sort_by(|x, y| y.0.cmp(&x.0).then_with(|| x.1.cmp(&y.1)));
    assert!(
        keys == sorted,
        "in the requested order across both backends"
    );
    keys
}

#[test]
fn a_large_answer_streams_the_records_the_buffered_merge_keeps() {
    let mut h = estate_harness();
    assert_streamed_from_owners(&resources_of(&mut h));
}

#[test]
fn a_large_ordered_answer_streams_merged_in_order() {
    let mut h = estate_harness();
    let order = r#"[{"field":"title","order":"desc"},{"field":"certname"}]"#;
    let response = ordered_answer_to(&mut h, "/pdb/query/v4/resources", order);
    assert_streamed_from_owners(&response);
    let keys = descending_then_ascending(&response, ("title", "certname"));
    assert_eq!(
        keys[..3],
        [
            (r#""/etc/05999""#.to_owned(), r#""only-a""#.to_owned()),
            (r#""/etc/05999""#.to_owned(), r#""only-b""#.to_owned()),
            (r#""/etc/05999""#.to_owned(), r#""shared""#.to_owned()),
        ],
        "interleaved: one title's records from both backends"
    );
}

#[test]
fn a_small_answer_is_merged_whole_as_before() {
    let a = PuppetDb::new()
        .node("shared", T10)
        .record("resources", resource("shared", "pdb-a", 0));
    let b = PuppetDb::new()
        .node("shared", T11)
        .record("resources", resource("shared", "pdb-b", 0));
    let mut h = harness(both(a, b));
    let response = resources_of(&mut h);
    assert_eq!(response.merged, None, "a buffered answer");
    assert_eq!(
        counted(&response).into_iter().collect::<Vec<_>>(),
        vec![(("shared".to_owned(), "pdb-b".to_owned()), 1)]
    );
}

#[test]
fn a_backend_failing_before_its_head_leaves_a_partial_streamed_answer() {
    let (mut a, b) = estate();
    // pdb-a alone holds more than the threshold.
    for index in PER_NODE..3 * PER_NODE {
        a = a.record("resources", resource("only-a", "pdb-a", index));
    }
    let mut h = harness(vec![
        FakeBackend::puppetdb("pdb-a", URL_A, a, ms(2)),
        with_resources("pdb-b", URL_B, b, |_| {
            Reply::text(StatusCode::SERVICE_UNAVAILABLE, "starting").after(ms(3))
        }),
    ]);
    let response = resources_of(&mut h);
    assert_eq!(response.merged, Some(None), "streamed, and whole");
    assert_eq!(response.header("x-backends"), Some("1/2"), "partial");
    let mut expected = count(&[("only-a", "pdb-a")]);
    expected.insert(("only-a".to_owned(), "pdb-a".to_owned()), 3 * PER_NODE);
    // shared is pdb-b's: pdb-a's older copy is not served in its place.
    assert_eq!(counted(&response), expected);
}

#[test]
fn a_body_failing_after_the_first_byte_is_cut_off_so_that_it_does_not_parse() {
    let (a, b) = estate();
    let mut h = harness(vec![
        FakeBackend::puppetdb("pdb-a", URL_A, a, ms(2)),
        with_resources("pdb-b", URL_B, b, |reply| {
            // The connection closes a few records before the end of pdb-b's body.
            let mut body = body_of(&reply);
            body.truncate(body.len() - 2_000);
            Reply::ok(body).after(ms(3))
        }),
    ]);
    let response = resources_of(&mut h);
    let cut_off = response.merged.clone().flatten();
    assert!(
        cut_off
            .as_deref()
            .is_some_and(|why| why.contains("ended inside the array")),
        "{cut_off:?}"
    );
    assert_eq!(response.status, StatusCode::OK, "the head had left");
    assert_eq!(response.header("x-backends"), Some("2/2"));
    assert!(
        serde_json::from_slice::<Value>(&response.body).is_err(),
        "what the client got does not parse"
    );
}

#[test]
fn a_backend_whose_first_bytes_are_not_json_is_left_out_before_the_first_byte() {
    let (a, b) = estate();
    let mut h = harness(vec![
        FakeBackend::puppetdb("pdb-a", URL_A, a, ms(2)),
        with_resources("pdb-b", URL_B, b, |reply| {
            let mut body = body_of(&reply);
            body[1] = b'!';
            Reply::ok(body).after(ms(3))
        }),
    ]);
    let response = resources_of(&mut h);
    assert_eq!(response.merged, Some(None), "streamed, and whole");
    assert_eq!(response.header("x-backends"), Some("1/2"), "pdb-b unusable");
    assert_eq!(counted(&response), count(&[("only-a", "pdb-a")]));
}

#[test]
fn a_body_broken_after_its_first_piece_but_within_its_first_64_kib_is_left_out_before_the_first_byte(
) {
    // Reads of 16 KiB: pdb-b's body breaks in its second read, within the 64 KiB of each body
    // a streamed merge checks before its first byte leaves; so it is pdb-b failing (a partial,
    // whole answer), not an answer cut off.
    let (a, b) = estate();
    let mut h = harness(vec![
        FakeBackend::puppetdb("pdb-a", URL_A, a, ms(2)),
        with_resources("pdb-b", URL_B, b, |reply| {
            let mut body = body_of(&reply);
            // A control character is no JSON, inside a string or out.
            body[20_000] = 0x01;
            Reply::ok(body).after(ms(3))
        }),
    ]);
    h.set_piece_bytes(16 * 1024);
    let response = resources_of(&mut h);
    assert_eq!(response.merged, Some(None), "streamed, and whole");
    assert_eq!(response.header("x-backends"), Some("1/2"), "pdb-b unusable");
    assert_eq!(counted(&response), count(&[("only-a", "pdb-a")]));
}

/// A harness over `backends` whose `/resources` answers are cached for `ttl` (a flight per
/// key), refreshed ahead past 80% of it, and configured further by `configure`.
fn cached_harness(
    backends: Vec<FakeBackend>,
    ttl: std::time::Duration,
    configure: impl FnOnce(&mut pdbmux_core::config::Config),
) -> Harness {
    Harness::with_config(backends, |config| {
        config.facts_ttl = ttl;
        config.cache_refresh_ahead_percent = 80;
        configure(config);
    })
    .expect("valid test backends")
}

/// The [`estate_harness`] with its `/resources` answers cached for `ttl`.
fn cached_estate_harness(ttl: std::time::Duration) -> Harness {
    cached_harness(estate_backends(), ttl, |_| {})
}

/// The transcript's upstream answers that were held and read in pieces (a streamed merge's),
/// not read whole.
fn held_answers(transcript: &str) -> usize {
    transcript
        .lines()
        .filter(|line| line.contains(" <- ") && line.contains("held:"))
        .count()
}

const RESOURCES: &str = "/pdb/query/v4/resources";

#[test]
fn a_cached_answer_streams_to_every_client_of_its_flight_and_enters_the_cache() {
    let mut h = cached_estate_harness(std::time::Duration::from_secs(30));
    let clients = [h.get(RESOURCES), h.get(RESOURCES)];
    let transcript = finish(&mut h);
    assert_eq!(
        held_answers(&transcript),
        2,
        "one fan-out, both answers merged as they were read:\n{transcript}"
    );
    let answers: Vec<ClientResponse> = clients
        .iter()
        .map(|client| h.response(*client).expect("one response").clone())
        .collect();
    for answer in &answers {
        assert_streamed_from_owners(answer);
        assert_eq!(answer.header("x-cache"), Some("miss"));
    }
    assert_eq!(
        answers[0].body, answers[1].body,
        "one merge, written to both"
    );
    let again = answer_to(&mut h, RESOURCES);
    assert_eq!(again.header("x-cache"), Some("hit"), "stored once whole");
    assert_eq!(again.merged, None);
    assert_eq!(again.body, answers[0].body);
}

#[test]
fn a_client_leaving_a_flight_mid_body_leaves_the_others_and_the_cache_their_answer() {
    let mut h = cached_estate_harness(std::time::Duration::from_secs(30));
    let [leaving, staying] = [h.get(RESOURCES), h.get(RESOURCES)];
    h.leave_mid_body(leaving);
    finish(&mut h);
    let left = h.response(leaving).expect("answered").clone();
    assert_eq!(left.merged, Some(Some("the client left".to_owned())));
    let stayed = h.response(staying).expect("answered").clone();
    assert_streamed_from_owners(&stayed);
    let again = answer_to(&mut h, RESOURCES);
    assert_eq!(again.header("x-cache"), Some("hit"), "stored once whole");
    assert_eq!(again.body, stayed.body);
}

#[test]
fn a_client_that_stops_reading_is_let_go_and_does_not_hold_the_others() {
    let mut h = cached_estate_harness(std::time::Duration::from_secs(30));
    let [stalled, reading] = [h.get(RESOURCES), h.get(RESOURCES)];
    // Longer than the flight waits for one client, shorter than the answer's deadline.
    h.stall_mid_body(stalled, std::time::Duration::from_secs(5));
    finish(&mut h);
    let stalled = h.response(stalled).expect("answered").clone();
    let why = stalled.merged.clone().flatten();
    assert!(
        why.as_deref()
            .is_some_and(|why| why.contains("fell behind")),
        "{why:?}"
    );
    assert!(serde_json::from_slice::<Value>(&stalled.body).is_err());
    let reading = h.response(reading).expect("answered").clone();
    assert_streamed_from_owners(&reading);
    assert!(
        reading.at < std::time::Duration::from_secs(3),
        "answered once the stalled client was let go, at {:?}",
        reading.at
    );
    let again = answer_to(&mut h, RESOURCES);
    assert_eq!(again.header("x-cache"), Some("hit"), "the copy was whole");
}

#[test]
fn a_cached_answer_over_a_quarter_of_the_cache_streams_and_is_not_stored() {
    // The answer's size, from a cache that keeps it (64 MiB, a quarter 16 MiB).
    let size = resources_of(&mut cached_estate_harness(std::time::Duration::from_secs(
        30,
    )))
    .body
    .len() as u64;
    // Twice the answer: room for it in the cache, but it is over a quarter of it.
    let mut h = cached_harness(
        estate_backends(),
        std::time::Duration::from_secs(30),
        |config| {
            config.facts_cache_bytes = 2 * size;
        },
    );
    assert_streamed_from_owners(&resources_of(&mut h));
    let again = answer_to(&mut h, RESOURCES);
    assert_eq!(again.header("x-cache"), Some("miss"), "the copy was let go");
    assert_streamed_from_owners(&again);
}

#[test]
fn a_flight_that_streams_lets_go_of_the_shared_lock_before_its_answer_ends() {
    let mut h = cached_harness(
        estate_backends(),
        std::time::Duration::from_secs(30),
        |config| {
            config.cache_backend = pdbmux_core::config::CacheBackend::Redis {
                url: "redis://127.0.0.1:6379".to_owned(),
                tls: pdbmux_core::config::TlsFiles::default(),
                secret: pdbmux_core::config::Secret::new(
                    b"streamed-flight-secret-0123456789".to_vec(),
                ),
                password: None,
            };
        },
    );
    h.set_store(pdbmux_conformance::FakeStore::default());
    let client = h.get(RESOURCES);
    let transcript = finish(&mut h);
    assert_streamed_from_owners(h.response(client).expect("answered"));
    let line_of = |needle: &str| {
        transcript
            .lines()
            .position(|line| line.contains(needle))
            .unwrap_or_else(|| panic!("no {needle:?} in\n{transcript}"))
    };
    assert!(
        line_of("unlock pdbmux:lock:/pdb/query/v4/resources") < line_of("f0 done"),
        "the lock goes when the flight streams, not when it ends:\n{transcript}"
    );
}

#[test]
fn a_cached_answer_whose_body_breaks_after_the_head_is_cut_off_and_not_stored() {
    let (a, b) = estate();
    let mut h = cached_harness(
        vec![
            FakeBackend::puppetdb("pdb-a", URL_A, a, ms(2)),
            with_resources("pdb-b", URL_B, b, |reply| {
                let mut body = body_of(&reply);
                body.truncate(body.len() - 2_000);
                Reply::ok(body).after(ms(3))
            }),
        ],
        std::time::Duration::from_secs(30),
        |_| {},
    );
    let response = resources_of(&mut h);
    let cut_off = response.merged.clone().flatten();
    assert!(
        cut_off
            .as_deref()
            .is_some_and(|why| why.contains("ended inside the array")),
        "{cut_off:?}"
    );
    assert!(
        serde_json::from_slice::<Value>(&response.body).is_err(),
        "what the client got does not parse"
    );
    let again = answer_to(&mut h, RESOURCES);
    assert_eq!(again.header("x-cache"), Some("miss"), "nothing was stored");
}

#[test]
fn a_refresh_ahead_of_a_large_entry_reads_its_merge_whole_and_renews_the_entry() {
    let mut h = cached_estate_harness(std::time::Duration::from_secs(10));
    let first = h.get(RESOURCES);
    run_to(&mut h, std::time::Duration::from_secs(9));
    // Past 8 s: a hit, which starts the refresh (no client waits on it).
    let hit = h.get(RESOURCES);
    run_to(&mut h, std::time::Duration::from_millis(9_500));
    let renewed = h.get(RESOURCES);
    let transcript = finish(&mut h);
    assert_eq!(
        held_answers(&transcript),
        4,
        "the first answer and the refresh both merged as read:\n{transcript}"
    );
    let first = h.response(first).expect("answered").clone();
    assert_streamed_from_owners(&first);
    let hit = h.response(hit).expect("answered");
    assert_eq!(
        (hit.header("x-cache"), hit.header("age")),
        (Some("hit"), Some("8"))
    );
    let renewed = h.response(renewed).expect("answered");
    assert_eq!(
        (renewed.header("x-cache"), renewed.header("age")),
        (Some("hit"), Some("0")),
        "the refresh renewed the entry"
    );
    assert_eq!(renewed.body, first.body);
}

#[test]
fn a_client_leaving_mid_body_drops_the_merge_and_the_backends_bodies() {
    let mut h = estate_harness();
    let client = h.get("/pdb/query/v4/resources");
    h.leave_mid_body(client);
    let transcript = finish(&mut h);
    let response = h.response(client).expect("one response").clone();
    assert_eq!(response.merged, Some(Some("the client left".to_owned())));
    assert!(!response.body.is_empty(), "it read the first bytes");
    // The bodies still being read are dropped with the merge: their connections are closed.
    let dropped = transcript
        .lines()
        .filter(|line| line.contains("(held body dropped)"))
        .count();
    assert!(dropped >= 1, "{transcript}");
}

/// Facts per node of the [`facts_estate`]: as with [`PER_NODE`] resources, enough that the two
/// backends' answers hold more than [`pdbmux_core::STREAM_ABOVE_BYTES`] together.
const FACTS_PER_NODE: usize = 6_000;

/// The [`estate`]'s nodes with [`FACTS_PER_NODE`] facts each, every value naming the backend
/// it came from.
fn facts_estate() -> (PuppetDb, PuppetDb) {
    let fact = |db: PuppetDb, certname: &str, backend: &str, index: usize| {
        let value = format!("{backend}:{}", "x".repeat(600));
        db.fact(certname, &format!("fact-{index:05}"), value, "production")
    };
    let mut a = PuppetDb::new().node("only-a", T09).node("shared", T10);
    let mut b = PuppetDb::new().node("shared", T11).node("only-b", T09);
    for index in 0..FACTS_PER_NODE {
        a = fact(fact(a, "only-a", "pdb-a", index), "shared", "pdb-a", index);
        b = fact(fact(b, "shared", "pdb-b", index), "only-b", "pdb-b", index);
    }
    (a, b)
}

/// An answer's facts by (certname, the backend their values name), and its provenance records
/// as (certname, value) in order.
fn facts_and_sources(response: &ClientResponse) -> FactsAndSources {
    let records: Vec<Value> = serde_json::from_slice(&response.body)
        .unwrap_or_else(|e| panic!("{e}: {} bytes", response.body.len()));
    let mut facts = BTreeMap::new();
    let mut sources = Vec::new();
    for record in &records {
        let certname = record["certname"].as_str().unwrap_or("?").to_owned();
        let value = record["value"].as_str().unwrap_or("?");
        match record["name"].as_str() {
            Some("pdbmux_source") => sources.push((certname, value.to_owned())),
            _ => {
                let backend = value.split(':').next().unwrap_or("?").to_owned();
                *facts.entry((certname, backend)).or_insert(0) += 1;
            }
        }
    }
    (facts, sources)
}

type FactsAndSources = (BTreeMap<(String, String), usize>, Vec<(String, String)>);

/// Each node of the [`facts_estate`] and the backend that owns its facts.
const FACTS_OWNERS: [(&str, &str); 3] = [
    ("only-a", "pdb-a"),
    ("only-b", "pdb-b"),
    ("shared", "pdb-b"),
];

/// [`facts_and_sources`]'s facts when each node's `each` facts come from its owner.
fn from_owners(each: usize) -> BTreeMap<(String, String), usize> {
    FACTS_OWNERS
        .iter()
        .map(|(c, b)| (((*c).to_owned(), (*b).to_owned()), each))
        .collect()
}

/// [`facts_and_sources`]'s provenance records when each names its node's owner, by certname.
fn owners_named() -> Vec<(String, String)> {
    FACTS_OWNERS
        .map(|(c, b)| (c.to_owned(), b.to_owned()))
        .to_vec()
}

/// A query admitting the provenance fact and nearly every other fact is two parts joined
/// (docs/merging.md, "Provenance"): the other facts' records stream as they would alone, and
/// the provenance records, merged first, are written after them.
#[test]
fn a_large_answer_joined_with_the_provenance_fact_streams_it_after_the_records() {
    let (a, b) = facts_estate();
    let mut h = harness(both(a, b));
    let query: String =
        form_urlencoded::byte_serialize(br#"["not",["=","name","fact-00000"]]"#).collect();
    let response = answer_to(&mut h, &format!("/pdb/query/v4/facts?query={query}"));
    assert_streamed_whole(&response);
    let (facts, sources) = facts_and_sources(&response);
    assert_eq!(
        facts,
        from_owners(FACTS_PER_NODE - 1),
        "each node's facts from its owner, fact-00000 left out"
    );
    let mut sorted = sources.clone();
    sorted.sort();
    assert_eq!(
        sorted,
        owners_named(),
        "one provenance record a node, naming its facts owner"
    );
    let body = String::from_utf8_lossy(&response.body);
    let last_fact = body.rfind("\"fact-").expect("facts");
    let first_source = body.find("\"pdbmux_source\"").expect("provenance records");
    assert!(
        first_source > last_fact,
        "the provenance records come after the facts"
    );
}

/// A `/facts` question ordered by another field than certname first is the other facts and
/// the provenance records asked apart (docs/merging.md, "Streamed merges"): the other facts
/// stream merged k-way, and each provenance record takes its place among them in the order,
/// here first (`pdbmux_source` sorts after every `fact-…` name, and the order is descending).
#[test]
fn a_large_answer_ordered_by_name_streams_its_provenance_records_in_their_place() {
    let (a, b) = facts_estate();
    let mut h = harness(both(a, b));
    let order = r#"[{"field":"name","order":"desc"},{"field":"certname"}]"#;
    let response = ordered_answer_to(&mut h, "/pdb/query/v4/facts", order);
    assert_streamed_whole(&response);
    let (facts, sources) = facts_and_sources(&response);
    assert_eq!(
        facts,
        from_owners(FACTS_PER_NODE),
        "each node's facts from its owner"
    );
    assert_eq!(
        sources,
        owners_named(),
        "one provenance record a node, naming its facts owner, by certname"
    );
    let keys = descending_then_ascending(&response, ("name", "certname"));
    assert_eq!(
        keys[0].0, r#""pdbmux_source""#,
        "the provenance records in their place, not after the facts"
    );
}

/// The start of what the provenance part asks each backend (its nodes: an extract).
const PROVENANCE_PART: &str = "/pdb/query/v4/facts?query=%5B%22extract%22";

/// A backend answering as `db` does, but the provenance part with what `provenance` gives.
fn with_provenance_part(
    name: &str,
    url: &str,
    db: PuppetDb,
    provenance: impl Fn() -> Reply + Send + 'static,
) -> FakeBackend {
    FakeBackend::by_request(name, url, move |asked: &Asked<'_>| {
        match asked.path_and_query.starts_with(PROVENANCE_PART) {
            true => provenance(),
            false => db.answer(asked).after(ms(3)),
        }
    })
}

/// A streamed, whole answer that left pdb-b's provenance answer out: partial, every node's
/// facts from its owner, and only pdb-a's node named by a provenance record.
fn assert_whole_without_pdb_b_provenance(response: &ClientResponse) {
    assert_eq!(response.merged, Some(None), "streamed, and whole");
    assert_eq!(response.header("x-backends"), Some("1/2"), "partial");
    let (facts, sources) = facts_and_sources(response);
    assert_eq!(facts, from_owners(FACTS_PER_NODE), "the facts of both");
    assert_eq!(sources, [("only-a".to_owned(), "pdb-a".to_owned())]);
}

/// The provenance part failing on one backend while the other facts' records stream: the
/// answer streams, says it is partial, and names the nodes the other backend owns.
#[test]
fn a_streamed_join_whose_provenance_part_fails_on_a_backend_is_partial() {
    let (a, b) = facts_estate();
    let mut h = harness(vec![
        FakeBackend::puppetdb("pdb-a", URL_A, a, ms(2)),
        with_provenance_part("pdb-b", URL_B, b, || {
            Reply::text(StatusCode::SERVICE_UNAVAILABLE, "busy").after(ms(3))
        }),
    ]);
    let query: String =
        form_urlencoded::byte_serialize(br#"["not",["=","name","fact-00000"]]"#).collect();
    let response = answer_to(&mut h, &format!("/pdb/query/v4/facts?query={query}"));
    assert_eq!(response.merged, Some(None), "streamed, and whole");
    assert_eq!(response.header("x-backends"), Some("1/2"), "partial");
    let (facts, sources) = facts_and_sources(&response);
    assert_eq!(
        facts.len(),
        3,
        "every node's facts from its owner: {facts:?}"
    );
    assert_eq!(sources, [("only-a".to_owned(), "pdb-a".to_owned())]);
}

/// Ordered by name ascending, the provenance records (`pdbmux_source`) sort after every
/// `fact-…` record: the facts stream first, and the provenance part is merged once the first
/// records have left, not before the first byte (docs/merging.md, "Streamed merges"). A
/// provenance answer that is not an array of records is still found before the first byte:
/// that backend is left out of the provenance records and the answer says it is partial, as
/// when its merge came first.
#[test]
fn a_streamed_join_ordered_by_name_merges_its_provenance_part_when_it_gets_there() {
    let (a, b) = facts_estate();
    let mut h = harness(both(a, b));
    let order = r#"[{"field":"name"},{"field":"certname"}]"#;
    let response = ordered_answer_to(&mut h, "/pdb/query/v4/facts", order);
    assert_streamed_whole(&response);
    assert_eq!(response.header("x-backends"), Some("2/2"));
    let (facts, sources) = facts_and_sources(&response);
    assert_eq!(facts, from_owners(FACTS_PER_NODE));
    assert_eq!(sources, owners_named(), "by certname, after every fact");
    let records: Vec<Value> = serde_json::from_slice(&response.body).expect("an array");
    let keys: Vec<(String, String)> = records
        .iter()
        .map(|r| (r["name"].to_string(), r["certname"].to_string()))
        .collect();
    let mut sorted = keys.clone();
    sorted.sort();
    assert!(
        keys == sorted,
        "in the requested order across both backends"
    );

    let (a, b) = facts_estate();
    let mut h = harness(vec![
        FakeBackend::puppetdb("pdb-a", URL_A, a, ms(2)),
        with_provenance_part("pdb-b", URL_B, b, || {
            Reply::json(StatusCode::OK, r#"[{"certname":"shared","#).after(ms(3))
        }),
    ]);
    let response = ordered_answer_to(&mut h, "/pdb/query/v4/facts", order);
    assert_whole_without_pdb_b_provenance(&response);
}

/// Before the first byte of a streamed answer, each provenance answer is checked as far as a
/// streamed answer's bodies are (its first 64 KiB), however small, so that the first byte does
/// not wait for a check of every record (docs/merging.md, "Streamed merges"). An answer broken
/// after those bytes is found when the part is merged, after the first byte: the body is cut
/// off so that it does not parse (D26). When the request's bodies hold at most
/// `stream_above_bytes` together, the answer is buffered, and the same answer is that backend
/// failing: the answer is partial and whole.
#[test]
fn a_provenance_answer_broken_after_its_first_bytes_cuts_a_streamed_body_off() {
    let backends = || {
        let (a, b) = facts_estate();
        // About 100 KB of pdb-b's nodes, then a record that is not JSON.
        let record = r#"{"certname":"only-b","environment":"production"},"#;
        let broken = format!("[{}{{\"certname\" 1}}]", record.repeat(2_000));
        vec![
            FakeBackend::puppetdb("pdb-a", URL_A, a, ms(2)),
            with_provenance_part("pdb-b", URL_B, b, move || {
                Reply::json(StatusCode::OK, broken.clone()).after(ms(3))
            }),
        ]
    };
    let order = r#"[{"field":"name"},{"field":"certname"}]"#;
    // The other facts' bodies are past the threshold (8 MiB by default): the answer streams.
    let mut h = harness(backends());
    let response = ordered_answer_to(&mut h, "/pdb/query/v4/facts", order);
    let cut_off = response.merged.clone().flatten();
    assert!(
        cut_off
            .as_deref()
            .is_some_and(|why| why.contains("joined answer could not be merged")),
        "streamed, then cut off by the provenance merge: {:?}, {:?}",
        response.merged,
        response.header("x-backends")
    );
    assert_eq!(response.status, StatusCode::OK, "the head had left");
    assert_eq!(response.header("x-backends"), Some("2/2"));
    assert!(
        serde_json::from_slice::<Value>(&response.body).is_err(),
        "what the client got does not parse"
    );
    let body = String::from_utf8_lossy(&response.body);
    assert!(body.contains("\"fact-"), "the facts before it were written");
    assert!(!body.contains("pdbmux_source"), "no provenance record was");

    // Every body of the request under the threshold: buffered, pdb-b's provenance answer left
    // out, and the answer whole.
    let mut h = Harness::with_config(backends(), |config| {
        config.stream_above_bytes = 64 << 20;
    })
    .expect("valid test backends");
    let response = ordered_answer_to(&mut h, "/pdb/query/v4/facts", order);
    assert_eq!(response.merged, None, "buffered");
    assert_eq!(response.status, StatusCode::OK);
    assert_eq!(response.header("x-backends"), Some("1/2"), "partial");
    let (facts, sources) = facts_and_sources(&response);
    assert_eq!(facts, from_owners(FACTS_PER_NODE), "the facts of both");
    assert_eq!(sources, [("only-a".to_owned(), "pdb-a".to_owned())]);
}

/// A streamed join whose other facts' bodies all break in their first bytes, tried once the
/// provenance part's answers came (last): every backend failed before the first byte, and the
/// answer says so at once rather than when the request's deadline passes.
#[test]
fn a_streamed_join_whose_every_body_breaks_before_the_first_byte_answers_at_once() {
    let (a, b) = facts_estate();
    let broken = |name: &'static str, url: &'static str, db: PuppetDb| {
        FakeBackend::by_request(name, url, move |asked: &Asked<'_>| {
            match asked.path_and_query.starts_with(PROVENANCE_PART) {
                true => db.answer(asked).after(ms(20)),
                // Larger than what is read before the merge may stream: still being read.
                false => {
                    let body = format!("[{{\"certname\" 1}}{}]", " ".repeat(300_000));
                    Reply::json(StatusCode::OK, body).after(ms(2))
                }
            }
        })
    };
    let mut h = Harness::with_config(
        vec![broken("pdb-a", URL_A, a), broken("pdb-b", URL_B, b)],
        |config| config.stream_above_bytes = 0,
    )
    .expect("valid test backends");
    let order = r#"[{"field":"name"},{"field":"certname"}]"#;
    let response = ordered_answer_to(&mut h, "/pdb/query/v4/facts", order);
    assert_eq!(response.status, StatusCode::BAD_GATEWAY, "{response:?}");
    assert_eq!(response.merged, None, "never streamed");
    assert!(
        response.at < std::time::Duration::from_secs(1),
        "answered at {:?}, once the provenance answers came",
        response.at
    );
}

/// Cached, a streamed join is one flight for its clients, and the whole answer, the provenance
/// records with it, enters the cache.
#[test]
fn a_cached_streamed_join_is_stored_whole_with_the_provenance_records() {
    let (a, b) = facts_estate();
    let backends = both(a, b);
    let mut h = cached_harness(backends, std::time::Duration::from_secs(30), |_| {});
    let query: String =
        form_urlencoded::byte_serialize(br#"["not",["=","name","fact-00000"]]"#).collect();
    let target = format!("/pdb/query/v4/facts?query={query}");
    let first = answer_to(&mut h, &target);
    assert_eq!(first.merged, Some(None), "streamed, and whole");
    assert_eq!(first.header("x-cache"), Some("miss"));
    let (_, sources) = facts_and_sources(&first);
    assert_eq!(sources.len(), 3, "a provenance record a node");
    let again = answer_to(&mut h, &target);
    assert_eq!(again.header("x-cache"), Some("hit"), "stored once whole");
    assert_eq!(again.body, first.body);
}

/// A backend answering as `db` does, its answer to `/environments/production` (the parent check)
/// replaced by `parent`, which comes after the large bodies' heads.
fn with_parent(name: &str, url: &str, db: PuppetDb, parent: Option<Reply>) -> FakeBackend {
    FakeBackend::by_request(name, url, move |asked: &Asked<'_>| {
        match (&parent, asked.path_and_query) {
            (Some(reply), "/pdb/query/v4/environments/production") => reply.clone().after(ms(40)),
            (None, "/pdb/query/v4/environments/production") => db.answer(asked).after(ms(40)),
            _ => db.answer(asked).after(ms(3)),
        }
    })
}

/// A sub-route below an environment is its entity's route with the environment's constraint
/// (docs/merging.md, "Streamed merges"): large, it streams as `/facts` does, once the parent
/// check, answered after the bodies' heads, found the environment.
#[test]
fn a_large_answer_below_an_environment_streams_once_the_environment_is_known() {
    let (a, b) = facts_estate();
    let mut h = harness(vec![
        with_parent("pdb-a", URL_A, a, None),
        with_parent("pdb-b", URL_B, b, None),
    ]);
    let response = answer_to(&mut h, "/pdb/query/v4/environments/production/facts");
    assert_streamed_whole(&response);
    let (facts, mut sources) = facts_and_sources(&response);
    assert_eq!(
        facts,
        from_owners(FACTS_PER_NODE),
        "each node's facts from its owner"
    );
    sources.sort();
    assert_eq!(sources, owners_named(), "the provenance fact, as on /facts");
}

/// Every backend saying it does not know the environment makes the answer PuppetDB's 404, even
/// where they answered the merge's large bodies first: the bodies are let go, no record is
/// written before the 404.
#[test]
fn a_large_answer_below_an_environment_no_backend_knows_is_the_404_and_never_streams() {
    let (a, b) = facts_estate();
    let unknown = || {
        Some(Reply::json(
            StatusCode::NOT_FOUND,
            r#"{"error":"No information is known about environment production"}"#,
        ))
    };
    let mut h = harness(vec![
        with_parent("pdb-a", URL_A, a, unknown()),
        with_parent("pdb-b", URL_B, b, unknown()),
    ]);
    let response = answer_to(&mut h, "/pdb/query/v4/environments/production/facts");
    assert_eq!(response.merged, None, "not streamed");
    assert_eq!(response.status, StatusCode::NOT_FOUND);
    assert_eq!(
        String::from_utf8_lossy(&response.body),
        r#"{"error":"No information is known about environment production"}"#
    );
}

/// Reports per backend in [`history_estate`]: with their logs, enough that the two answers hold
/// more than [`pdbmux_core::STREAM_ABOVE_BYTES`] together.
const REPORTS: usize = 4_000;

/// Report `index` of `certname` as `backend` stores it (its own `receive_time`).
fn stored_report(certname: &str, backend: &str, index: usize) -> Value {
    json!({"certname": certname, "hash": format!("{certname}-{index:05}"),
        "end_time": format!("2024-05-01T09:{:02}:{:02}.000Z", index / 60 % 60, index % 60),
        "receive_time": if backend == "pdb-a" { "2024-05-01T12:00:00.000Z" } else { "2024-05-01T12:00:01.000Z" },
        "status": "changed", "backend": backend,
        "logs": {"href": "/logs", "data": [{"message": "x".repeat(2_000)}]}})
}

/// pdb-a holding `old`'s reports, pdb-b `new`'s, and both the `moved` node's reports of its
/// move (the same reports stored twice: a node sending to both during a migration).
fn history_estate() -> (PuppetDb, PuppetDb) {
    moved_estate(["old", "moved", "new"], ("reports", REPORTS), stored_report)
}

/// The hashes of an answer's reports, each with how many times it was served.
fn served(response: &ClientResponse) -> BTreeMap<String, usize> {
    let records: Vec<Value> = serde_json::from_slice(&response.body)
        .unwrap_or_else(|e| panic!("{e}: {} bytes", response.body.len()));
    let mut served = BTreeMap::new();
    for record in records {
        *served
            .entry(record["hash"].as_str().unwrap_or("?").to_owned())
            .or_insert(0) += 1;
    }
    served
}

/// Large history streams as node-owned records do (docs/merging.md, "Streamed merges"): every
/// backend's reports, a report stored in both served once.
#[test]
fn a_large_history_answer_streams_each_stored_report_once() {
    let (a, b) = history_estate();
    let mut h = harness(both(a, b));
    let response = answer_to(&mut h, "/pdb/query/v4/reports");
    assert_streamed_whole(&response);
    let served = served(&response);
    assert_eq!(served.len(), 3 * REPORTS, "every node's reports");
    assert!(
        served.values().all(|copies| *copies == 1),
        "each stored report once"
    );
}

/// Ordered, large history is merged k-way: the backends' sorted answers, each report once, in
/// the requested order.
#[test]
fn a_large_ordered_history_answer_streams_in_order_each_report_once() {
    let (a, b) = history_estate();
    let mut h = harness(both(a, b));
    let order = r#"[{"field":"hash","order":"desc"}]"#;
    let response = ordered_answer_to(&mut h, "/pdb/query/v4/reports", order);
    assert_eq!(response.merged, Some(None), "streamed, and whole");
    let records: Vec<Value> = serde_json::from_slice(&response.body).expect("an array");
    let hashes: Vec<&str> = records.iter().filter_map(|r| r["hash"].as_str()).collect();
    let mut expected = hashes.clone();
    expected.sort_unstable_by(|x, y| y.cmp(x));
    expected.dedup();
    let first_difference = hashes.iter().zip(&expected).position(|(x, y)| x != y);
    assert_eq!(
        (hashes.len(), first_difference),
        (3 * REPORTS, None),
        "in order, each once: {:?}",
        first_difference.map(|at| &hashes[at.saturating_sub(2)..(at + 3).min(hashes.len())])
    );
}

/// A large projection of history streams too: each stored report's row once (D22: a
/// report stored in both backends is one row, told apart by its hash, asked for beside the
/// projection and not served), however alike the rows' projected contents are.
#[test]
fn a_large_projection_of_history_streams_each_stored_report_s_row_once() {
    let (a, b) = history_estate();
    let mut h = harness(both(a, b));
    let response = answer_to(
        &mut h,
        "/pdb/query/v4/reports?query=%5B%22extract%22%2C%5B%22certname%22%2C%22logs%22%5D%5D",
    );
    assert_streamed_whole(&response);
    let rows: Vec<Value> = serde_json::from_slice(&response.body).expect("an array");
    assert_eq!(rows.len(), 3 * REPORTS, "each stored report's row once");
    let mut per_node: BTreeMap<&str, usize> = BTreeMap::new();
    for row in &rows {
        let fields: Vec<&String> = row.as_object().expect("an object").keys().collect();
        assert_eq!(fields, ["certname", "logs"], "the projection alone");
        *per_node
            .entry(row["certname"].as_str().expect("certname"))
            .or_default() += 1;
    }
    assert_eq!(
        per_node.into_iter().collect::<Vec<_>>(),
        [("moved", REPORTS), ("new", REPORTS), ("old", REPORTS)]
    );
}

/// A page of history stays buffered (its size is the page's).
#[test]
fn a_page_of_history_stays_buffered() {
    let (a, b) = history_estate();
    let mut h = harness(both(a, b));
    let response = answer_to(&mut h, "/pdb/query/v4/reports?limit=2000");
    assert_eq!(response.status, StatusCode::OK);
    assert_eq!(response.merged, None, "buffered");
}

/// `stream_above_bytes` sets where merges stream: at 0 a small answer streams (its records the
/// buffered merge's), and a threshold above a large answer keeps it buffered.
#[test]
fn the_threshold_is_the_configured_stream_above_bytes() {
    let small = || {
        let a = PuppetDb::new()
            .node("shared", T10)
            .record("resources", resource("shared", "pdb-a", 0));
        let b = PuppetDb::new()
            .node("shared", T11)
            .record("resources", resource("shared", "pdb-b", 0));
        both(a, b)
    };
    let mut h = Harness::with_config(small(), |config| config.stream_above_bytes = 0)
        .expect("valid test backends");
    let response = resources_of(&mut h);
    assert_eq!(response.merged, Some(None), "streamed, and whole");
    assert_eq!(
        counted(&response).into_iter().collect::<Vec<_>>(),
        vec![(("shared".to_owned(), "pdb-b".to_owned()), 1)]
    );

    let mut h = Harness::with_config(estate_backends(), |config| {
        config.stream_above_bytes = 64 << 20;
    })
    .expect("valid test backends");
    let response = resources_of(&mut h);
    assert_eq!(response.merged, None, "buffered: under 64 MiB");
    assert_eq!(response.header("x-backends"), Some("2/2"));
}

/// Every backend failing the provenance part while the other facts' records are large: the
/// answer is the provenance part's failure, as a buffered join's, at once, not at the deadline
/// with the records' bodies held unread.
#[test]
fn a_join_whose_provenance_part_every_backend_fails_answers_at_once() {
    let (a, b) = facts_estate();
    let failing = |name: &str, url: &str, db: PuppetDb| {
        with_provenance_part(name, url, db, || {
            Reply::text(StatusCode::INTERNAL_SERVER_ERROR, "boom").after(ms(5))
        })
    };
    let mut h = harness(vec![failing("pdb-a", URL_A, a), failing("pdb-b", URL_B, b)]);
    let query: String =
        form_urlencoded::byte_serialize(br#"["not",["=","name","fact-00000"]]"#).collect();
    let response = answer_to(&mut h, &format!("/pdb/query/v4/facts?query={query}"));
    assert!(response.status.is_server_error(), "{}", response.status);
    assert_eq!(response.merged, None, "no stream");
    assert!(
        response.at < std::time::Duration::from_secs(1),
        "answered at {:?}, not at the deadline",
        response.at
    );
}

/// Nodes per backend in [`nodes_estate`]: with [`node_row`]'s padding, the two answers hold more
/// than [`pdbmux_core::STREAM_ABOVE_BYTES`] together.
const NODES_PER_BACKEND: usize = 6_000;

/// `certname`'s `/nodes` record in `backend`, its report at `report`, its facts' environment
/// naming the backend, padded as a record with every field PuppetDB gives is long.
fn node_row(certname: &str, backend: &str, report: Option<&str>) -> Value {
    json!({"certname": certname, "deactivated": null, "expired": null,
        "report_timestamp": report, "facts_timestamp": report, "catalog_timestamp": report,
        "facts_environment": format!("env-{backend}"), "catalog_environment": "production",
        "latest_report_status": "unchanged", "latest_report_hash": "0".repeat(40),
        "cached_catalog_status": "not_used", "backend": backend, "padding": "x".repeat(500)})
}

/// pdb-a holding `a-<n>` and `s-<n>`, pdb-b `s-<n>` and `b-<n>`: `s-<n>` newer in pdb-b for
/// even n, in pdb-a for odd n; and `split`, whose report is newest in pdb-a and its facts in
/// pdb-b.
fn nodes_estate() -> (PuppetDb, PuppetDb) {
    let mut a = PuppetDb::new();
    let mut b = PuppetDb::new();
    let per_kind = NODES_PER_BACKEND / 2;
    for n in 0..per_kind {
        let (in_a, in_b) = if n % 2 == 0 { (T09, T10) } else { (T10, T09) };
        let shared = format!("s-{n:05}");
        a.nodes.push(node_row(&format!("a-{n:05}"), "pdb-a", T09));
        a.nodes.push(node_row(&shared, "pdb-a", in_a));
        b.nodes.push(node_row(&shared, "pdb-b", in_b));
        b.nodes.push(node_row(&format!("b-{n:05}"), "pdb-b", T09));
    }
    a.nodes.push(node_row("split", "pdb-a", T11));
    b.nodes.push(node_row("split", "pdb-b", T10));
    let b = b.produced(
        "factsets",
        "split",
        T11.map(|t| t.replace("11:", "12:")).as_deref(),
    );
    (a, b)
}

/// A large `/nodes` answer ordered by certname streams too, merged k-way: in order, each node
/// once from its owner, the split node composed in its place.
#[test]
fn a_large_nodes_answer_ordered_by_certname_streams_in_order_each_node_once() {
    let (a, b) = nodes_estate();
    let mut h = harness(both(a, b));
    let order = r#"[{"field":"certname","order":"desc"}]"#;
    let response = ordered_answer_to(&mut h, "/pdb/query/v4/nodes", order);
    assert_streamed_whole(&response);
    let records: Vec<Value> = serde_json::from_slice(&response.body).expect("a JSON array");
    let certnames: Vec<&str> = records
        .iter()
        .map(|record| record["certname"].as_str().expect("certname"))
        .collect();
    let mut expected = certnames.clone();
    expected.sort_unstable_by(|x, y| y.cmp(x));
    expected.dedup();
    assert_eq!(certnames, expected, "in order, each node once");
    assert_eq!(certnames.len(), 3 * (NODES_PER_BACKEND / 2) + 1);
    for record in &records {
        let source = record["pdbmux_source"].as_str().expect("pdbmux_source");
        assert_eq!(record["backend"], source, "stamped with its own backend");
    }
    let split = records
        .iter()
        .find(|record| record["certname"] == "split")
        .expect("split");
    assert_eq!(split["pdbmux_source"], "pdb-a");
    assert_eq!(split["facts_environment"], "env-pdb-b");
    assert_eq!(
        records
            .iter()
            .find(|record| record["certname"] == "s-00000")
            .map(|record| &record["pdbmux_source"]),
        Some(&json!("pdb-b")),
        "newer in pdb-b"
    );
}

/// A large `/nodes` answer streams: each node once, from its owner, named by `pdbmux_source`;
/// a node whose facts are newest in the other backend takes its facts' fields from there.
#[test]
fn a_large_nodes_answer_streams_each_node_once_from_its_owner() {
    let (a, b) = nodes_estate();
    let mut h = harness(both(a, b));
    let response = answer_to(&mut h, "/pdb/query/v4/nodes");
    assert_streamed_whole(&response);
    let records: Vec<Value> = serde_json::from_slice(&response.body).expect("a JSON array");
    let mut sources = BTreeMap::new();
    for record in &records {
        let certname = record["certname"].as_str().expect("certname").to_owned();
        let source = record["pdbmux_source"].as_str().expect("pdbmux_source");
        assert_eq!(
            record["backend"], source,
            "{certname}: stamped with its own backend"
        );
        assert!(
            sources.insert(certname, record.clone()).is_none(),
            "each node once"
        );
    }
    let per_kind = NODES_PER_BACKEND / 2;
    assert_eq!(sources.len(), 3 * per_kind + 1);
    for n in 0..per_kind {
        let owner = if n % 2 == 0 { "pdb-b" } else { "pdb-a" };
        assert_eq!(sources[&format!("s-{n:05}")]["pdbmux_source"], owner);
    }
    let split = &sources["split"];
    assert_eq!(
        split["pdbmux_source"], "pdb-a",
        "its report is newest in pdb-a"
    );
    assert_eq!(
        split["facts_environment"], "env-pdb-b",
        "its facts are newest in pdb-b"
    );
    assert_eq!(split["report_timestamp"], json!(T11));
}
