//! The shared cache tier (docs/caching.md) on the simulated clock, against a scripted store that
//! several harnesses (replicas) share: one fan-out per key across replicas, a hit on another
//! replica with the writer's age, waiting for the lock holder and outliving it, the store failing
//! and coming back, a foreign value ignored, and another replica's expired entry as the stale
//! fallback.

mod common;

use std::time::Duration;

use common::{run_to, URL_A, URL_B};
use pdbmux_conformance::{ms, FakeBackend, FakeStore, Harness, Reply};
use pdbmux_core::cache::shared::{encode, EntryRefusal};
use pdbmux_core::config::{CacheBackend, Secret, TlsFiles};

const NAMES: &str = "/pdb/query/v4/fact-names";
const ENTRY: &str = "pdbmux:entry:/pdb/query/v4/fact-names";
const LOCK: &str = "pdbmux:lock:/pdb/query/v4/fact-names";

/// The key every replica of these tests signs entries with.
fn secret() -> Secret {
    Secret::new(b"conformance-secret-0123456789abcdef".to_vec())
}

fn shared_store() -> CacheBackend {
    CacheBackend::Redis {
        url: "redis://127.0.0.1:6379".to_owned(),
        tls: TlsFiles::default(),
        secret: secret(),
        password: None,
    }
}

/// A well-formed entry for `NAMES` holding `body`, dated `stored_at_ms` and signed with `key`.
fn entry(key: &Secret, stored_at_ms: u64, body: &'static str) -> bytes::Bytes {
    let mut headers = http::HeaderMap::new();
    headers.insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static(pdbmux_core::JSON_CONTENT_TYPE),
    );
    headers.insert("x-backends", http::HeaderValue::from_static("2/2"));
    let body = bytes::Bytes::from_static(body.as_bytes());
    encode(
        key,
        ENTRY,
        stored_at_ms,
        http::StatusCode::OK,
        &headers,
        &body,
    )
    .expect("a JSON 200")
}

/// Entries refused so far by the replica, for `reason`.
fn refused(h: &Harness, reason: EntryRefusal) -> u64 {
    let cache = h.stats().cache.expect("cache on");
    cache.shared_refused.expect("shared store")[reason.index()]
}

fn names(body: &str, latency: u64) -> Reply {
    Reply::ok(body.to_owned()).after(ms(latency))
}

/// One replica over two backends answering with `latency` ms, sharing `store`.
fn replica(store: &FakeStore, a: Reply, b: Reply) -> Harness {
    let backends = vec![
        FakeBackend::always("pdb-a", URL_A, a),
        FakeBackend::always("pdb-b", URL_B, b),
    ];
    let mut harness = Harness::with_config(backends, |config| {
        config.facts_ttl = Duration::from_secs(30);
        config.cache_backend = shared_store();
    })
    .expect("valid test backends");
    harness.set_store(store.clone());
    harness
}

fn healthy(store: &FakeStore) -> Harness {
    replica(store, names(r#"["kernel"]"#, 5), names(r#"["os"]"#, 5))
}

fn asked(h: &Harness) -> usize {
    h.sends()
        .iter()
        .filter(|s| s.request.path_and_query.starts_with(NAMES))
        .count()
}

/// Another replica stores the entry and lets go of its lock between this replica's miss and its
/// lock: holding the lock, this one looks again and serves the stored entry, asking no backend
/// (without the second look both replicas would fan out, as seen against real PuppetDBs under load).
#[test]
fn a_lock_taken_after_another_replica_stored_serves_its_entry_without_a_fan_out() {
    let store = FakeStore::default();
    let mut a = healthy(&store);
    store.store_before_next_lock(
        Duration::ZERO,
        ENTRY,
        entry(&secret(), 0, r#"["from","another","replica"]"#),
        Duration::from_secs(60),
    );
    let client = a.get(NAMES);
    run_to(&mut a, Duration::from_secs(1));
    let answer = a.response(client).expect("answered");
    assert_eq!(answer.body_str(), r#"["from","another","replica"]"#);
    assert_eq!(answer.header("x-cache"), Some("hit"));
    assert_eq!(asked(&a), 0, "no fan-out: {}", a.transcript());
    assert_eq!(
        store.ops(),
        [
            format!("get {ENTRY} none"),
            format!("(another replica stored {ENTRY})"),
            format!("lock {LOCK} taken"),
            format!("get {ENTRY} hit"),
            format!("unlock {LOCK} released"),
        ],
        "{}",
        a.transcript()
    );
}

#[test]
fn a_miss_locks_fans_out_and_stores_then_another_replica_hits_with_the_writers_age() {
    let store = FakeStore::default();
    let mut a = healthy(&store);
    let mut b = healthy(&store);
    let first = a.get(NAMES);
    run_to(&mut a, Duration::from_secs(1));
    let first = a.response(first).expect("answered").clone();
    assert_eq!(first.header("x-cache"), Some("miss"));
    assert_eq!(first.body_str(), r#"["kernel","os","pdbmux_source"]"#);
    assert_eq!(
        store.ops(),
        [
            format!("get {ENTRY} none"),
            format!("lock {LOCK} taken"),
            format!("get {ENTRY} none"),
            format!("put {ENTRY} stored"),
            format!("unlock {LOCK} released"),
        ],
        "{}",
        a.transcript()
    );
    run_to(&mut b, Duration::from_secs(4));
    let hit = b.get(NAMES);
    run_to(&mut b, Duration::from_secs(5));
    let hit = b.response(hit).expect("answered");
    assert_eq!(
        (hit.header("x-cache"), hit.header("age")),
        (Some("hit"), Some("3")),
        "{}",
        b.transcript()
    );
    assert_eq!(hit.body, first.body);
    assert_eq!(hit.header("x-backends"), Some("2/2"));
    assert_eq!(asked(&b), 0, "the hit asked no backend");
    // Now in B's memory too: the next hit does not ask the store.
    let ops = store.ops().len();
    let again = b.get(NAMES);
    run_to(&mut b, Duration::from_secs(6));
    assert_eq!(
        b.response(again).expect("answered").header("x-cache"),
        Some("hit")
    );
    assert_eq!(store.ops().len(), ops);
}

#[test]
fn a_replica_that_finds_the_key_locked_waits_and_reads_the_holders_answer() {
    let store = FakeStore::default();
    // The holder's backends are slow: it answers at about 200 ms.
    let mut holder = replica(&store, names(r#"["kernel"]"#, 200), names(r#"["os"]"#, 200));
    let mut waiter = healthy(&store);
    let held = holder.get(NAMES);
    run_to(&mut holder, Duration::from_millis(50));
    let waiting = waiter.get(NAMES);
    run_to(&mut waiter, Duration::from_millis(100));
    assert!(
        waiter.response(waiting).is_err(),
        "still waiting for the holder"
    );
    run_to(&mut holder, Duration::from_millis(300));
    run_to(&mut waiter, Duration::from_millis(400));
    let held = holder.response(held).expect("the holder answered");
    let read = waiter.response(waiting).expect("the waiter answered");
    assert_eq!(
        read.header("x-cache"),
        Some("hit"),
        "{}",
        waiter.transcript()
    );
    assert_eq!(read.body, held.body);
    assert_eq!(asked(&waiter), 0, "one fan-out for both replicas");
    assert_eq!(asked(&holder), 2);
}

#[test]
fn a_lock_whose_holder_is_gone_is_waited_out_then_this_replica_fans_out() {
    let store = FakeStore::default();
    // A holder that died: its lock stays until its lease, and no entry ever comes.
    store.put(
        Duration::ZERO,
        LOCK,
        "gone-replica".into(),
        Duration::from_secs(60),
    );
    let mut h = healthy(&store);
    let client = h.get(NAMES);
    run_to(&mut h, Duration::from_secs(9));
    assert!(
        h.response(client).is_err(),
        "waits up to the upstream timeout"
    );
    run_to(&mut h, Duration::from_secs(11));
    let answer = h.response(client).expect("answered after the wait");
    assert_eq!(answer.header("x-cache"), Some("miss"));
    assert_eq!(answer.body_str(), r#"["kernel","os","pdbmux_source"]"#);
    assert!(
        answer.at >= Duration::from_secs(10) && answer.at < Duration::from_millis(10_100),
        "{:?}",
        answer.at
    );
    assert_eq!(asked(&h), 2);
    assert!(
        store.get(Duration::from_secs(11), ENTRY).is_some(),
        "its answer is stored for the others"
    );
}

#[test]
fn the_store_failing_is_answered_as_without_it_and_sharing_resumes_when_it_is_back() {
    let store = FakeStore::default();
    store.set_failing(true);
    let mut h = healthy(&store);
    let first = h.get(NAMES);
    run_to(&mut h, Duration::from_millis(100));
    let first = h.response(first).expect("answered");
    assert_eq!(first.header("x-cache"), Some("miss"));
    assert_eq!(first.body_str(), r#"["kernel","os","pdbmux_source"]"#);
    let cache = h.stats().cache.expect("the cache is on");
    assert_eq!(cache.shared_reachable, Some(false));
    assert_eq!(
        store.ops(),
        [format!("get {ENTRY} failed")],
        "nothing more is asked of a failing store"
    );
    // Within a second of the failure another key's miss does not wait for the store.
    run_to(&mut h, Duration::from_millis(500));
    let during = h.get("/pdb/query/v4/fact-names?limit=1");
    run_to(&mut h, Duration::from_millis(600));
    assert_eq!(h.response(during).expect("answered").status, 200);
    assert_eq!(store.ops().len(), 1, "{:?}", store.ops());
    store.set_failing(false);
    run_to(&mut h, Duration::from_secs(62));
    let after = h.get(NAMES);
    run_to(&mut h, Duration::from_millis(62_100));
    assert_eq!(h.response(after).expect("answered").status, 200);
    assert_eq!(h.stats().cache.expect("on").shared_reachable, Some(true));
    assert!(
        store.get(Duration::from_millis(62_100), ENTRY).is_some(),
        "shared again: {:?}",
        store.ops()
    );
}

#[test]
fn a_value_that_is_not_pdbmuxs_is_ignored_and_replaced() {
    let store = FakeStore::default();
    store.put(
        Duration::ZERO,
        ENTRY,
        "[1,2,3]".into(),
        Duration::from_secs(60),
    );
    let mut h = healthy(&store);
    let client = h.get(NAMES);
    run_to(&mut h, Duration::from_millis(100));
    let answer = h.response(client).expect("answered");
    assert_eq!(answer.header("x-cache"), Some("miss"));
    assert_eq!(answer.body_str(), r#"["kernel","os","pdbmux_source"]"#);
    let stored = store
        .get(Duration::from_millis(100), ENTRY)
        .expect("replaced");
    assert!(stored.starts_with(b"pdbmux-cache-v2 "));
    assert_eq!(refused(&h, EntryRefusal::Malformed), 1);
}

#[test]
fn another_replicas_expired_entry_answers_when_every_backend_fails() {
    let store = FakeStore::default();
    let mut writer = healthy(&store);
    let written = writer.get(NAMES);
    run_to(&mut writer, Duration::from_secs(1));
    let written = writer.response(written).expect("answered").clone();
    let mut failing = replica(&store, Reply::refused(), Reply::refused());
    run_to(&mut failing, Duration::from_secs(40));
    let client = failing.get(NAMES);
    run_to(&mut failing, Duration::from_secs(41));
    let answer = failing.response(client).expect("answered");
    assert_eq!(answer.status, 200, "{}", failing.transcript());
    assert_eq!(
        (answer.header("x-cache"), answer.header("age")),
        (Some("stale"), Some("39"))
    );
    assert_eq!(answer.body, written.body);
}

#[test]
fn an_answer_over_cache_max_entry_bytes_is_kept_in_memory_only() {
    let store = FakeStore::default();
    let backends = vec![
        FakeBackend::always("pdb-a", URL_A, names(r#"["kernel"]"#, 5)),
        FakeBackend::always("pdb-b", URL_B, names(r#"["os"]"#, 5)),
    ];
    let mut h = Harness::with_config(backends, |config| {
        config.facts_ttl = Duration::from_secs(30);
        config.cache_max_entry_bytes = 10;
        config.cache_backend = shared_store();
    })
    .expect("valid test backends");
    h.set_store(store.clone());
    let first = h.get(NAMES);
    run_to(&mut h, Duration::from_secs(1));
    assert_eq!(
        h.response(first).expect("answered").header("x-cache"),
        Some("miss")
    );
    assert_eq!(
        store.ops(),
        [
            format!("get {ENTRY} none"),
            format!("lock {LOCK} taken"),
            format!("get {ENTRY} none"),
            format!("unlock {LOCK} released"),
        ],
        "no put of a 30-byte answer over a 10-byte limit"
    );
    let second = h.get(NAMES);
    run_to(&mut h, Duration::from_secs(2));
    assert_eq!(
        h.response(second).expect("answered").header("x-cache"),
        Some("hit"),
        "the memory layer still keeps it"
    );
}

/// Whatever a writer of the store puts there without the deployment's secret, or dates wrongly,
/// is a miss: the replica fans out, answers from the backends, counts the refusal and replaces
/// the entry with its own (docs/reliability.md, "The shared store is untrusted").
#[test]
fn a_poisoned_entry_is_never_served() {
    let forger = Secret::new(b"not the deployment's secret at all".to_vec());
    let invented = r#"["invented","nodes"]"#;
    for (name, value, reason) in [
        (
            "signed with another key",
            entry(&forger, 0, invented),
            EntryRefusal::Forged,
        ),
        (
            "dated a minute ahead",
            entry(&secret(), 60_000, invented),
            EntryRefusal::FromTheFuture,
        ),
        (
            "html under a valid tag",
            entry(&secret(), 0, "<script>alert(1)</script>"),
            EntryRefusal::NotJson,
        ),
        (
            "larger than cache_max_entry_bytes",
            bytes::Bytes::from(vec![b'['; 9 * 1024 * 1024]),
            EntryRefusal::Oversized,
        ),
    ] {
        let store = FakeStore::default();
        store.put(Duration::ZERO, ENTRY, value, Duration::from_secs(60));
        let mut h = healthy(&store);
        let client = h.get(NAMES);
        run_to(&mut h, Duration::from_millis(100));
        let answer = h.response(client).expect("answered");
        assert_eq!(answer.header("x-cache"), Some("miss"), "{name}");
        assert_eq!(
            answer.body_str(),
            r#"["kernel","os","pdbmux_source"]"#,
            "{name}"
        );
        assert_eq!(refused(&h, reason), 1, "{name}");
        assert_eq!(asked(&h), 2, "{name}: both backends asked");
        let stored = store
            .get(Duration::from_millis(100), ENTRY)
            .expect("replaced");
        assert!(stored.starts_with(b"pdbmux-cache-v2 "), "{name}");
    }
}

/// A replayed entry of this deployment's own, older than its TTL and the stale window, is
/// refused too: its date is under the tag, so it cannot be made to look new.
#[test]
fn an_entry_past_its_ttl_and_stale_window_is_refused() {
    let store = FakeStore::default();
    let mut h = healthy(&store);
    // Ten minutes in, an entry written at the start (TTL 30 s, stale window 5 min).
    run_to(&mut h, Duration::from_secs(600));
    store.put(
        Duration::from_secs(600),
        ENTRY,
        entry(&secret(), 0, r#"["old"]"#),
        Duration::from_secs(60),
    );
    let client = h.get(NAMES);
    run_to(&mut h, Duration::from_millis(600_100));
    let answer = h.response(client).expect("answered");
    assert_eq!(answer.header("x-cache"), Some("miss"));
    assert_eq!(answer.body_str(), r#"["kernel","os","pdbmux_source"]"#);
    assert_eq!(refused(&h, EntryRefusal::Expired), 1);
}

/// The entry's own fields are all a hit carries: its framing and headers are pdbmux's.
#[test]
fn a_hit_carries_only_the_headers_pdbmux_builds() {
    let store = FakeStore::default();
    store.put(
        Duration::ZERO,
        ENTRY,
        entry(&secret(), 0, r#"["from","another","replica"]"#),
        Duration::from_secs(60),
    );
    let mut h = healthy(&store);
    let client = h.get(NAMES);
    run_to(&mut h, Duration::from_millis(100));
    let answer = h.response(client).expect("answered");
    assert_eq!(answer.header("x-cache"), Some("hit"));
    assert_eq!(answer.body_str(), r#"["from","another","replica"]"#);
    let mut names: Vec<&str> = answer
        .headers
        .iter()
        .map(|(name, _)| name.as_str())
        .collect();
    names.sort_unstable();
    assert_eq!(
        names,
        [
            "age",
            "content-type",
            "x-backends",
            "x-cache",
            "x-content-type-options",
            "x-request-id"
        ]
    );
    assert_eq!(
        answer.header("x-request-id"),
        Some("c0"),
        "this request's, not the entry's"
    );
    assert_eq!(asked(&h), 0);
}

/// Two replicas with record sets fresh for 10 s, refreshed ahead past 80% of that.
fn refreshing(store: &FakeStore) -> Harness {
    let backends = vec![
        FakeBackend::always("pdb-a", URL_A, names(r#"["kernel"]"#, 5)),
        FakeBackend::always("pdb-b", URL_B, names(r#"["os"]"#, 5)),
    ];
    let mut harness = Harness::with_config(backends, |config| {
        config.facts_ttl = Duration::from_secs(10);
        config.cache_refresh_ahead_percent = 80;
        config.cache_backend = shared_store();
    })
    .expect("valid test backends");
    harness.set_store(store.clone());
    harness
}

/// Refresh ahead across replicas: one replica's refresh takes the lock and fans out like a miss
/// (the stored entry is as old as its own); another replica's refresh finds that renewed entry
/// in the store and takes it, asking no backend.
#[test]
fn a_refresh_ahead_is_shared_across_replicas_through_the_store() {
    let store = FakeStore::default();
    let (mut a, mut b) = (refreshing(&store), refreshing(&store));
    a.get(NAMES);
    run_to(&mut a, Duration::from_secs(1));
    run_to(&mut b, Duration::from_secs(1));
    let b_first = b.get(NAMES);
    run_to(&mut b, Duration::from_secs(2));
    assert_eq!(
        b.response(b_first).expect("answered").header("x-cache"),
        Some("hit"),
        "B takes A's entry"
    );
    run_to(&mut a, Duration::from_secs(9));
    let a_hit = a.get(NAMES);
    run_to(&mut a, Duration::from_millis(9_200));
    assert_eq!(
        a.response(a_hit).expect("answered").header("age"),
        Some("8"),
        "answered from the old entry"
    );
    assert_eq!(
        asked(&a),
        4,
        "A's first fan-out and its refresh: {}",
        a.transcript()
    );
    run_to(&mut b, Duration::from_millis(9_500));
    let b_hit = b.get(NAMES);
    run_to(&mut b, Duration::from_millis(9_600));
    let b_after = b.get(NAMES);
    run_to(&mut b, Duration::from_secs(10));
    assert_eq!(
        b.response(b_hit).expect("answered").header("age"),
        Some("9"),
        "B answers from its old entry and starts its own refresh"
    );
    assert_eq!(
        b.response(b_after).expect("answered").header("age"),
        Some("0"),
        "B's refresh took A's renewed entry: {}",
        b.transcript()
    );
    assert_eq!(asked(&b), 0, "B asked no backend: {}", b.transcript());
    let ops = store.ops();
    assert_eq!(
        ops.iter().filter(|op| op.starts_with("put ")).count(),
        2,
        "A's first answer and its refresh: {ops:?}"
    );
}
