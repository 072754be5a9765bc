//! The merged-response cache (README "Caching"): hits, expiry, stale on failure only, the byte
//! budget, and single-flight, on the simulated clock.

mod common;

use std::time::Duration;

use common::{finish, run_to, URL_A, URL_B};
use http::StatusCode;
use pdbmux_conformance::{ms, FakeBackend, Harness, Reply};

const NAMES: &str = "/pdb/query/v4/fact-names";

fn cached(backends: Vec<FakeBackend>) -> Harness {
    Harness::with_config(backends, |config| {
        config.facts_ttl = Duration::from_secs(30);
    })
    .expect("valid test backends")
}

fn names(body: &str) -> Reply {
    Reply::ok(body.to_owned()).after(ms(5))
}

fn sends_to(h: &Harness, path: &str) -> usize {
    h.sends()
        .iter()
        .filter(|s| s.request.path_and_query.starts_with(path))
        .count()
}

#[test]
fn miss_then_hit_then_expiry() {
    let mut h = cached(vec![
        FakeBackend::always("pdb-a", URL_A, names(r#"["kernel"]"#)),
        FakeBackend::always("pdb-b", URL_B, names(r#"["os"]"#)),
    ]);
    let first = h.get(NAMES);
    run_to(&mut h, Duration::from_secs(5));
    let second = h.get(NAMES);
    run_to(&mut h, Duration::from_secs(31));
    let third = h.get(NAMES);
    let transcript = finish(&mut h);

    let first = h.response(first).expect("answered");
    assert_eq!(
        (first.header("x-cache"), first.header("age")),
        (Some("miss"), Some("0"))
    );
    assert_eq!(first.body_str(), r#"["kernel","os","pdbmux_source"]"#);
    let second = h.response(second).expect("answered");
    assert_eq!(
        (second.header("x-cache"), second.header("age")),
        (Some("hit"), Some("4"))
    );
    assert_eq!(
        second.header("x-backends"),
        Some("2/2"),
        "the stored body's X-Backends"
    );
    assert_eq!(second.body, first.body);
    assert_eq!(second.at, Duration::from_secs(5), "a hit asks no backend");
    let third = h.response(third).expect("answered");
    assert_eq!(
        third.header("x-cache"),
        Some("miss"),
        "after the TTL the backends are asked again"
    );
    assert_eq!(sends_to(&h, NAMES), 4);
    insta::assert_snapshot!(transcript);
}

#[test]
fn stale_is_served_only_when_every_backend_fails() {
    let mut h = cached(vec![
        FakeBackend::queue(
            "pdb-a",
            URL_A,
            [
                names(r#"["a"]"#),
                Reply::refused().after(ms(1)),
                Reply::refused().after(ms(1)),
            ],
        ),
        FakeBackend::queue(
            "pdb-b",
            URL_B,
            [
                names(r#"["b"]"#),
                names(r#"["b2"]"#),
                Reply::text(StatusCode::INTERNAL_SERVER_ERROR, "boom").after(ms(2)),
            ],
        ),
    ]);
    let fresh = h.get(NAMES);
    run_to(&mut h, Duration::from_secs(40));
    let partial = h.get(NAMES);
    run_to(&mut h, Duration::from_secs(80));
    let stale = h.get(NAMES);
    let transcript = finish(&mut h);

    assert_eq!(
        h.response(fresh).expect("answered").body_str(),
        r#"["a","b","pdbmux_source"]"#
    );
    let partial = h.response(partial).expect("answered");
    assert_eq!(
        partial.header("x-cache"),
        Some("miss"),
        "a healthy backend is never shadowed"
    );
    assert_eq!(partial.header("x-backends"), Some("1/2"));
    assert_eq!(partial.body_str(), r#"["b2","pdbmux_source"]"#);
    let stale = h.response(stale).expect("answered");
    assert_eq!(stale.status, StatusCode::OK);
    assert_eq!(stale.header("x-cache"), Some("stale"));
    assert_eq!(
        stale.header("age"),
        Some("79"),
        "the whole answer stored at +0s: the partial one at +40s was never stored"
    );
    assert_eq!(
        stale.header("x-backends"),
        Some("2/2"),
        "the stored body's X-Backends"
    );
    assert_eq!(stale.body_str(), r#"["a","b","pdbmux_source"]"#);
    insta::assert_snapshot!(transcript);
}

/// A partial answer is served but not stored: the next request within the TTL asks every
/// backend again, so a backend that is back is seen at once rather than one TTL later, and the
/// whole answer is what the cache then holds.
#[test]
fn a_partial_answer_is_never_stored() {
    let mut h = cached(vec![
        FakeBackend::queue(
            "pdb-a",
            URL_A,
            [
                Reply::refused().after(ms(1)),
                names(r#"["a"]"#),
                names(r#"["unasked"]"#),
            ],
        ),
        FakeBackend::queue(
            "pdb-b",
            URL_B,
            [
                names(r#"["b"]"#),
                names(r#"["b"]"#),
                names(r#"["unasked"]"#),
            ],
        ),
    ]);
    let partial = h.get(NAMES);
    run_to(&mut h, Duration::from_secs(2));
    let again = h.get(NAMES);
    run_to(&mut h, Duration::from_secs(4));
    let hit = h.get(NAMES);
    let transcript = finish(&mut h);

    let partial = h.response(partial).expect("answered");
    assert_eq!(
        (partial.header("x-cache"), partial.header("x-backends")),
        (Some("miss"), Some("1/2"))
    );
    let again = h.response(again).expect("answered");
    assert_eq!(
        (again.header("x-cache"), again.header("x-backends")),
        (Some("miss"), Some("2/2")),
        "asked again within the TTL: the partial answer was not stored"
    );
    assert_eq!(again.body_str(), r#"["a","b","pdbmux_source"]"#);
    let hit = h.response(hit).expect("answered");
    assert_eq!(
        (hit.header("x-cache"), hit.header("x-backends")),
        (Some("hit"), Some("2/2"))
    );
    assert_eq!(sends_to(&h, NAMES), 4, "the hit asked no backend");
    insta::assert_snapshot!(transcript);
}

#[test]
fn after_a_failed_refresh_the_stale_entry_answers_without_asking_for_a_while() {
    // Every backend fails after the first answer: the first request past the TTL asks them and
    // serves the expired entry; the requests of the next 5 s (STALE_RETRY) get it without a
    // fan-out, so failing backends are not asked once per client; then they are asked again.
    let failing = || Reply::text(StatusCode::INTERNAL_SERVER_ERROR, "boom").after(ms(1));
    let mut h = cached(vec![
        FakeBackend::queue("pdb-a", URL_A, [names(r#"["a"]"#), failing(), failing()]),
        FakeBackend::queue("pdb-b", URL_B, [names(r#"["b"]"#), failing(), failing()]),
    ]);
    h.get(NAMES);
    run_to(&mut h, Duration::from_secs(31));
    let first = h.get(NAMES);
    run_to(&mut h, Duration::from_secs(33));
    let quiet: Vec<_> = (0..20).map(|_| h.get(NAMES)).collect();
    run_to(&mut h, Duration::from_secs(37));
    let again = h.get(NAMES);
    finish(&mut h);
    for client in std::iter::once(first)
        .chain(quiet.iter().copied())
        .chain([again])
    {
        let response = h.response(client).expect("answered");
        assert_eq!(response.header("x-cache"), Some("stale"), "{client}");
        assert_eq!(response.body_str(), r#"["a","b","pdbmux_source"]"#);
    }
    assert_eq!(
        sends_to(&h, NAMES),
        6,
        "the first answer, one refresh at +31 s, one more at +37 s: two backends each"
    );
}

#[test]
fn a_unanimous_refusal_is_answered_and_never_cached_or_replaced_by_stale() {
    let refusal =
        || Reply::text(StatusCode::BAD_REQUEST, "Unsupported query parameter 'x'").after(ms(2));
    let mut h = cached(vec![
        FakeBackend::queue(
            "pdb-a",
            URL_A,
            [names(r#"["a"]"#), refusal(), names(r#"["a"]"#)],
        ),
        FakeBackend::queue(
            "pdb-b",
            URL_B,
            [names(r#"["b"]"#), refusal(), names(r#"["b"]"#)],
        ),
    ]);
    let _ = h.get(NAMES);
    run_to(&mut h, Duration::from_secs(31));
    let refused = h.get(NAMES);
    run_to(&mut h, Duration::from_secs(32));
    let after = h.get(NAMES);
    finish(&mut h);
    let refused = h.response(refused).expect("answered");
    assert_eq!(refused.status, StatusCode::BAD_REQUEST);
    assert_eq!(refused.header("x-cache"), Some("miss"));
    assert_eq!(
        h.response(after).expect("answered").header("x-cache"),
        Some("miss")
    );
}

#[test]
fn a_failed_flight_is_not_cached() {
    let mut h = cached(vec![
        FakeBackend::queue(
            "pdb-a",
            URL_A,
            [Reply::refused().after(ms(1)), names(r#"["a"]"#)],
        ),
        FakeBackend::queue(
            "pdb-b",
            URL_B,
            [Reply::refused().after(ms(1)), names(r#"["b"]"#)],
        ),
    ]);
    let failed = h.get(NAMES);
    run_to(&mut h, Duration::from_secs(1));
    let next = h.get(NAMES);
    finish(&mut h);
    assert_eq!(
        h.response(failed).expect("answered").status,
        StatusCode::BAD_GATEWAY
    );
    let next = h.response(next).expect("answered");
    assert_eq!(
        (next.status, next.header("x-cache")),
        (StatusCode::OK, Some("miss"))
    );
}

#[test]
fn a_thousand_concurrent_requests_share_one_fan_out() {
    let mut h = cached(vec![
        FakeBackend::always("pdb-a", URL_A, names(r#"["a"]"#)),
        FakeBackend::always("pdb-b", URL_B, names(r#"["b"]"#)),
    ]);
    let clients: Vec<_> = (0..1000).map(|_| h.get(NAMES)).collect();
    finish(&mut h);
    assert_eq!(sends_to(&h, NAMES), 2, "one upstream request per backend");
    for client in clients {
        let response = h.response(client).expect("every client answered once");
        assert_eq!(
            (response.status, response.header("x-cache")),
            (StatusCode::OK, Some("miss"))
        );
        assert_eq!(response.body_str(), r#"["a","b","pdbmux_source"]"#);
    }
}

#[test]
fn the_leader_leaving_does_not_fail_the_others_and_the_last_one_leaving_cancels() {
    let mut h = cached(vec![
        FakeBackend::always("pdb-a", URL_A, names(r#"["a"]"#)),
        FakeBackend::always("pdb-b", URL_B, names(r#"["b"]"#)),
    ]);
    let leader = h.get(NAMES);
    let waiter = h.get(NAMES);
    h.disconnect(leader).expect("known client");
    finish(&mut h);
    let response = h.response(waiter).expect("the waiter is still answered");
    assert_eq!(response.body_str(), r#"["a","b","pdbmux_source"]"#);

    let mut h = cached(vec![
        FakeBackend::always("pdb-a", URL_A, names(r#"["a"]"#).after(ms(50))),
        FakeBackend::always("pdb-b", URL_B, names(r#"["b"]"#).after(ms(50))),
    ]);
    let one = h.get(NAMES);
    let two = h.get(NAMES);
    run_to(&mut h, ms(10));
    h.disconnect(one).expect("known client");
    h.disconnect(two).expect("known client");
    let transcript = finish(&mut h);
    let cancelled = ["f0 cancelled\n", "f0 cancel u0\n", "f0 cancel u1\n"];
    assert!(
        cancelled.iter().all(|line| transcript.contains(line)),
        "{transcript}"
    );
    assert_eq!(sends_to(&h, NAMES), 2);
    insta::assert_snapshot!(transcript);
}

#[test]
fn the_byte_budget_evicts_least_recently_used() {
    let mut h = Harness::with_config(
        vec![
            FakeBackend::by_path("pdb-a", URL_A, |path| {
                names(if path.contains("limit=1") {
                    r#"["a"]"#
                } else {
                    r#"["a","b"]"#
                })
            }),
            FakeBackend::always("pdb-b", URL_B, names("[]")),
        ],
        |config| {
            config.facts_ttl = Duration::from_secs(30);
            // Room for one of the two bodies (25 and 5 bytes) only.
            config.facts_cache_bytes = 29;
        },
    )
    .expect("valid test backends");
    let _ = h.get(NAMES);
    run_to(&mut h, ms(100));
    let _ = h.get("/pdb/query/v4/fact-names?limit=1");
    run_to(&mut h, ms(200));
    let evicted = h.get(NAMES);
    let kept = h.get("/pdb/query/v4/fact-names?limit=1");
    let transcript = finish(&mut h);
    assert_eq!(
        h.response(evicted).expect("answered").header("x-cache"),
        Some("miss"),
        "{transcript}"
    );
    assert_eq!(
        h.response(kept).expect("answered").header("x-cache"),
        Some("hit")
    );
}

#[test]
fn a_panicking_flight_answers_its_waiters_500_and_the_next_miss_flies_again() {
    let mut h = cached(vec![
        FakeBackend::queue(
            "pdb-a",
            URL_A,
            [Reply::panic().after(ms(5)), names(r#"["a"]"#)],
        ),
        FakeBackend::always("pdb-b", URL_B, names(r#"["b"]"#)),
    ]);
    let leader = h.get(NAMES);
    let waiter = h.get(NAMES);
    run_to(&mut h, ms(100));
    for client in [leader, waiter] {
        let response = h.response(client).expect("answered");
        assert_eq!(response.status, StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(response.body_str(), "pdbmux: internal error\n");
    }
    // Not cached: the next request is a miss with a flight of its own.
    let again = h.get(NAMES);
    let transcript = finish(&mut h);
    let response = h.response(again).expect("answered");
    assert_eq!(response.status, StatusCode::OK);
    assert_eq!(response.body_str(), r#"["a","b","pdbmux_source"]"#);
    assert!(transcript.contains("+5ms f0 done\n"), "{transcript}");
    assert!(transcript.contains("+100ms f1 starts\n"), "{transcript}");
    insta::assert_snapshot!(transcript);
}

/// Record sets fresh for 10 s, refreshed ahead past 80% of that.
fn refreshing(backends: Vec<FakeBackend>) -> Harness {
    Harness::with_config(backends, |config| {
        config.facts_ttl = Duration::from_secs(10);
        config.cache_refresh_ahead_percent = 80;
    })
    .expect("valid test backends")
}

#[test]
fn a_hit_past_its_share_of_the_ttl_refreshes_the_entry_once_in_the_background() {
    let mut h = refreshing(vec![
        FakeBackend::queue(
            "pdb-a",
            URL_A,
            [names(r#"["kernel"]"#), names(r#"["kernel","uptime"]"#)],
        ),
        FakeBackend::queue("pdb-b", URL_B, [names(r#"["os"]"#), names(r#"["os"]"#)]),
    ]);
    let first = h.get(NAMES);
    run_to(&mut h, Duration::from_secs(7));
    let early = h.get(NAMES);
    run_to(&mut h, Duration::from_secs(9));
    // Past 8 s: answered from the entry at once; the first starts the one refresh.
    let hits: Vec<_> = (0..3).map(|_| h.get(NAMES)).collect();
    run_to(&mut h, Duration::from_millis(9_500));
    let renewed = h.get(NAMES);
    run_to(&mut h, Duration::from_secs(12));
    let later = h.get(NAMES);
    let transcript = finish(&mut h);

    assert_eq!(
        h.response(first).expect("answered").header("x-cache"),
        Some("miss")
    );
    assert_eq!(
        h.response(early).expect("answered").header("x-cache"),
        Some("hit")
    );
    for hit in hits {
        let hit = h.response(hit).expect("answered");
        assert_eq!(
            (
                hit.header("x-cache"),
                hit.header("age"),
                hit.body_str().as_str()
            ),
            (Some("hit"), Some("8"), r#"["kernel","os","pdbmux_source"]"#),
            "stored at 5 ms: 8.995 s old"
        );
        assert_eq!(
            hit.at,
            Duration::from_secs(9),
            "no hit waits for the refresh"
        );
    }
    let renewed = h.response(renewed).expect("answered");
    assert_eq!(
        (
            renewed.header("x-cache"),
            renewed.header("age"),
            renewed.body_str().as_str()
        ),
        (
            Some("hit"),
            Some("0"),
            r#"["kernel","os","pdbmux_source","uptime"]"#
        ),
        "the refresh renewed the entry"
    );
    assert_eq!(
        h.response(later).expect("answered").header("x-cache"),
        Some("hit"),
        "a renewed entry is not refreshed again before its own 80%"
    );
    assert_eq!(sends_to(&h, NAMES), 4, "the first fan-out and one refresh");
    assert_eq!(h.stats().cache.map(|c| c.refreshes_ahead), Some(1));
    insta::assert_snapshot!(transcript);
}

#[test]
fn a_key_nobody_asks_is_not_refreshed_and_expires() {
    let mut h = refreshing(vec![
        FakeBackend::always("pdb-a", URL_A, names(r#"["kernel"]"#)),
        FakeBackend::always("pdb-b", URL_B, names(r#"["os"]"#)),
    ]);
    let first = h.get(NAMES);
    run_to(&mut h, Duration::from_secs(7));
    let young = h.get(NAMES);
    run_to(&mut h, Duration::from_secs(20));
    let cold = h.get(NAMES);
    finish(&mut h);
    assert_eq!(
        h.response(first).expect("answered").header("x-cache"),
        Some("miss")
    );
    assert_eq!(
        h.response(young).expect("answered").header("x-cache"),
        Some("hit")
    );
    assert_eq!(
        h.response(cold).expect("answered").header("x-cache"),
        Some("miss"),
        "nothing renewed it: it expired at 10 s"
    );
    assert_eq!(sends_to(&h, NAMES), 4, "two fan-outs, no refresh");
    assert_eq!(h.stats().cache.map(|c| c.refreshes_ahead), Some(0));
}

#[test]
fn a_failed_refresh_leaves_the_entry_to_expire_and_starts_no_other() {
    let failed = || Reply::text(StatusCode::INTERNAL_SERVER_ERROR, "down").after(ms(5));
    let mut h = refreshing(vec![
        FakeBackend::queue("pdb-a", URL_A, [names(r#"["kernel"]"#), failed(), failed()]),
        FakeBackend::queue("pdb-b", URL_B, [names(r#"["os"]"#), failed(), failed()]),
    ]);
    h.get(NAMES);
    run_to(&mut h, Duration::from_secs(9));
    let refreshing_hit = h.get(NAMES);
    run_to(&mut h, Duration::from_millis(9_500));
    let after_failure = h.get(NAMES);
    run_to(&mut h, Duration::from_secs(12));
    let expired = h.get(NAMES);
    let transcript = finish(&mut h);

    for (client, age) in [(refreshing_hit, "8"), (after_failure, "9")] {
        let hit = h.response(client).expect("answered");
        assert_eq!(
            (hit.header("x-cache"), hit.header("age")),
            (Some("hit"), Some(age)),
            "the entry answers until it expires"
        );
    }
    let expired = h.response(expired).expect("answered");
    assert_eq!(
        (expired.header("x-cache"), expired.body_str().as_str()),
        (Some("stale"), r#"["kernel","os","pdbmux_source"]"#),
        "past its TTL a miss asks again, and every backend failing serves the expired entry"
    );
    assert_eq!(
        sends_to(&h, NAMES),
        6,
        "the first fan-out, one refresh (none after it failed), the miss at 12 s:\n{transcript}"
    );
    insta::assert_snapshot!(transcript);
}

#[test]
fn a_reload_that_changes_a_class_ttl_empties_the_cache_and_applies_the_new_ttl() {
    const REPORTS: &str = "/pdb/query/v4/reports";
    let report = |hash: &str| {
        Reply::ok(format!(
            r#"[{{"hash":"{hash}","certname":"n1","end_time":"2024-05-01T10:00:00.000Z"}}]"#
        ))
        .after(ms(5))
    };
    let mut h = Harness::with_config(
        vec![
            FakeBackend::always("pdb-a", URL_A, report("a1")),
            FakeBackend::always("pdb-b", URL_B, report("b1")),
        ],
        |config| {
            config.history_ttl = Duration::from_secs(20);
            config.cache_refresh_ahead_percent = 0;
        },
    )
    .expect("valid test backends");
    let first = h.get(REPORTS);
    run_to(&mut h, Duration::from_secs(1));
    let hit = h.get(REPORTS);
    run_to(&mut h, Duration::from_secs(2));
    h.reload(|config| config.history_ttl = Duration::from_secs(5));
    run_to(&mut h, Duration::from_secs(3));
    let after_reload = h.get(REPORTS);
    run_to(&mut h, Duration::from_secs(7));
    let within = h.get(REPORTS);
    run_to(&mut h, Duration::from_secs(9));
    let past = h.get(REPORTS);
    let transcript = finish(&mut h);

    let cache = |client| {
        h.response(client)
            .expect("answered")
            .header("x-cache")
            .map(str::to_owned)
    };
    assert_eq!(cache(first).as_deref(), Some("miss"));
    assert_eq!(
        cache(hit).as_deref(),
        Some("hit"),
        "history is cached for its own TTL"
    );
    assert_eq!(
        cache(after_reload).as_deref(),
        Some("miss"),
        "a changed TTL empties the cache (Config::KEYS: history_ttl renews answers)"
    );
    assert_eq!(
        cache(within).as_deref(),
        Some("hit"),
        "4 s old, under the new 5 s"
    );
    assert_eq!(
        cache(past).as_deref(),
        Some("miss"),
        "6 s old, past the new 5 s"
    );
    assert_eq!(sends_to(&h, REPORTS), 6);
    insta::assert_snapshot!(transcript);
}

#[test]
fn a_partial_answer_shared_by_a_flight_counts_once_per_client() {
    // Three clients ask at once and share one fan-out; pdb-a is refused, so each gets 1/2. The
    // partial share of answers is what clients saw: three partial answers, not one fan-out.
    let mut h = Harness::with_config(
        vec![
            FakeBackend::queue("pdb-a", URL_A, [Reply::refused().after(ms(1))]),
            FakeBackend::queue("pdb-b", URL_B, [names(r#"["b"]"#)]),
        ],
        |config| {
            config.facts_ttl = Duration::from_secs(30);
            config.metrics_listen = Some("127.0.0.1:0".to_owned());
        },
    )
    .expect("valid test backends");
    let clients: Vec<_> = (0..3).map(|_| h.get(NAMES)).collect();
    finish(&mut h);
    for client in clients {
        let response = h.response(client).expect("answered");
        assert_eq!(response.header("x-backends"), Some("1/2"));
    }
    assert_eq!(sends_to(&h, NAMES), 2, "one fan-out for the three");
    let metrics = h.metrics_text().expect("metrics are on");
    assert!(
        metrics.contains("pdbmux_partial_answers_total{route=\"query\"} 3\n"),
        "{metrics}"
    );
}
