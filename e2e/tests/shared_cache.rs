//! The shared cache tier on a real Redis (docs/caching.md), with two pdbmux replicas in front of
//! the two real PuppetDBs (run through `e2e/run`, which installs `redis-server`; each test
//! starts a server of its own on a free loopback port).
//!
//! Covered: 50 concurrent identical requests spread over both replicas make one fan-out (one
//! request per PuppetDB in their access logs); a hit on replica B of what replica A stored, with
//! the Age counted from A's store; Redis stopped mid-run and started again: every client gets a
//! 200 throughout, `/healthz` says the store is unreachable, then sharing resumes.

mod common;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use common::{env, get, healthz, pdbmux_env, sealed_bytes};
use pdbmux_e2e::{free_port, marker, AccessLog, Pdbmux};

const FACTS: &str = "/pdb/query/v4/facts";

/// A `redis-server` on loopback, stopped on drop.
struct Redis {
    binary: PathBuf,
    port: u16,
    /// Serve TLS only, requiring a client certificate: the CA, server certificate and key.
    tls: Option<[PathBuf; 3]>,
    child: Option<Child>,
}

impl Redis {
    /// Starts one, or `None` when the harness named no `redis-server`.
    fn start() -> Option<Redis> {
        let binary = PathBuf::from(std::env::var_os("E2E_REDIS_SERVER")?);
        let mut redis = Redis {
            binary,
            port: free_port().expect("a free port"),
            tls: None,
            child: None,
        };
        redis.run();
        Some(redis)
    }

    /// Starts one that speaks TLS only and wants a client certificate signed by `ca`.
    fn start_tls(ca: PathBuf, cert: PathBuf, key: PathBuf) -> Option<Redis> {
        let binary = PathBuf::from(std::env::var_os("E2E_REDIS_SERVER")?);
        let mut redis = Redis {
            binary,
            port: free_port().expect("a free port"),
            tls: Some([ca, cert, key]),
            child: None,
        };
        redis.run();
        Some(redis)
    }

    fn url(&self) -> String {
        let scheme = if self.tls.is_some() {
            "rediss"
        } else {
            "redis"
        };
        format!("{scheme}://127.0.0.1:{}", self.port)
    }

    /// `redis-cli` beside `redis-server` (Debian ships both in redis-tools and redis-server).
    fn cli(&self) -> Command {
        let mut command = Command::new(self.binary.with_file_name("redis-cli"));
        command.args(["-h", "127.0.0.1", "-p", &self.port.to_string()]);
        command
    }

    /// The keys matching `pattern`, as another client of the store sees them.
    fn keys(&self, pattern: &str) -> Vec<String> {
        let out = self
            .cli()
            .args(["--scan", "--pattern", pattern])
            .output()
            .expect("run redis-cli");
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// Writes `value` under `key` for a minute, as anyone who can write the store can.
    fn set(&self, key: &str, value: &[u8]) {
        use std::io::Write as _;
        let mut child = self
            .cli()
            .args(["-x", "SET", key])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .expect("run redis-cli");
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(value)
            .expect("write the value");
        assert!(child.wait().expect("redis-cli").success());
        let expire = self.cli().args(["PEXPIRE", key, "60000"]).output();
        assert!(expire.expect("redis-cli").status.success());
    }

    /// Starts the server (again), in memory only, and waits until it accepts connections.
    fn run(&mut self) {
        let mut command = Command::new(&self.binary);
        command.args(["--bind", "127.0.0.1"]);
        match &self.tls {
            None => command.args(["--port", &self.port.to_string()]),
            Some([ca, cert, key]) => command
                .args(["--port", "0", "--tls-port", &self.port.to_string()])
                .arg("--tls-ca-cert-file")
                .arg(ca)
                .arg("--tls-cert-file")
                .arg(cert)
                .arg("--tls-key-file")
                .arg(key)
                .args(["--tls-auth-clients", "yes"]),
        };
        let child = command
            .args(["--save", "", "--appendonly", "no", "--protected-mode", "no"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start redis-server");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(Instant::now() < deadline, "redis-server never listened");
            thread::sleep(Duration::from_millis(20));
        }
    }

    fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The file every replica of these tests reads the key it signs shared entries with from.
fn secret_file() -> String {
    static FILE: std::sync::OnceLock<(tempfile::TempDir, PathBuf)> = std::sync::OnceLock::new();
    let (_, path) = FILE.get_or_init(|| {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let path = dir.path().join("cache.key");
        std::fs::write(&path, "e2e-shared-cache-secret-0123456789\n").expect("write the key");
        (dir, path)
    });
    path.display().to_string()
}

/// A replica sharing `redis` under `prefix`.
fn replica(label: &str, redis: &Redis, prefix: &str) -> Pdbmux {
    pdbmux_env(
        label,
        &[
            ("PDBMUX_CACHE_BACKEND", "redis"),
            ("PDBMUX_CACHE_REDIS_URL", &redis.url()),
            ("PDBMUX_CACHE_SECRET_FILE", &secret_file()),
            ("PDBMUX_CACHE_KEY_PREFIX", prefix),
            ("PDBMUX_HEALTH_PROBE_ENABLED", "false"),
        ],
    )
}

/// The key in `secret_file`, for writing entries as a replica would.
fn secret() -> pdbmux_core::config::Secret {
    let text = std::fs::read_to_string(secret_file()).expect("read the key");
    pdbmux_core::config::Secret::new(text.trim_end().as_bytes().to_vec())
}

/// An entry for the full `key` holding `body`, dated `stored_at_ms` and signed with `secret`.
fn signed(
    secret: &pdbmux_core::config::Secret,
    key: &str,
    stored_at_ms: u64,
    body: &str,
) -> Vec<u8> {
    let mut headers = http::HeaderMap::new();
    headers.insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static(pdbmux_core::JSON_CONTENT_TYPE),
    );
    headers.insert("x-backends", http::HeaderValue::from_static("2/2"));
    let body = bytes::Bytes::copy_from_slice(body.as_bytes());
    let value = pdbmux_core::cache::shared::encode(
        secret,
        key,
        stored_at_ms,
        http::StatusCode::OK,
        &headers,
        &body,
    );
    value.expect("a JSON 200").to_vec()
}

fn now_ms() -> u64 {
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    u64::try_from(since.expect("after 1970").as_millis()).expect("in range")
}

/// A `/facts` question only this test asks (its marker in the query), so the PuppetDBs' access
/// logs show exactly its fan-outs.
fn question(marker: &str) -> String {
    format!(r#"["=","name","{marker}"]"#)
}

#[test]
fn fifty_concurrent_requests_over_two_replicas_make_one_fan_out_and_a_hit_carries_the_age() {
    let Some(redis) = Redis::start() else {
        eprintln!("E2E_REDIS_SERVER not set: no shared cache to test");
        return;
    };
    let env = env();
    let prefix = format!("{}:", marker("prefix"));
    let replicas = Arc::new([
        replica("shared-a", &redis, &prefix),
        replica("shared-b", &redis, &prefix),
    ]);
    let fact = marker("fanout");
    let query = question(&fact);
    let logs = AccessLog::mark_all(env).expect("mark the access logs");
    let start = Arc::new(Barrier::new(50));
    let clients: Vec<_> = (0..50)
        .map(|i| {
            let (replicas, start, query) =
                (Arc::clone(&replicas), Arc::clone(&start), query.clone());
            thread::spawn(move || {
                start.wait();
                get(&replicas[i % 2], FACTS, &[("query", &query)])
            })
        })
        .collect();
    let answers: Vec<_> = clients
        .into_iter()
        .map(|c| c.join().expect("client"))
        .collect();
    for answer in &answers {
        assert_eq!(answer.status, 200, "{answer:?}");
        assert_eq!(answer.body, answers[0].body);
    }
    if logs.is_empty() {
        eprintln!("no E2E_ACCESS_LOGS: fan-outs not counted");
    }
    // Jetty writes its log lines shortly after answering.
    thread::sleep(Duration::from_millis(500));
    for log in &logs {
        let asked = log
            .new_lines()
            .expect("read the access log")
            .into_iter()
            .filter(|line| line.contains(&fact))
            .count();
        assert_eq!(
            asked, 1,
            "{log}: one fan-out for 50 requests on two replicas"
        );
    }
    // Replica B's hit of what was stored carries the age since the store, whoever stored it.
    thread::sleep(Duration::from_millis(2100));
    let hit = get(&replicas[1], FACTS, &[("query", &query)]);
    assert_eq!(hit.header("x-cache"), Some("hit"), "{hit:?}");
    let age: u64 = hit
        .header("age")
        .and_then(|a| a.parse().ok())
        .expect("an Age");
    assert!((2..=4).contains(&age), "Age {age}: {hit:?}");
    let (_, body) = healthz(&replicas[0]);
    assert_eq!(body["cache"]["backend"], "redis", "{body}");
    assert_eq!(body["cache"]["store_reachable"], true, "{body}");
}

#[test]
fn a_large_entry_read_from_the_store_is_sealed_on_the_reading_replica() {
    let Some(redis) = Redis::start() else {
        eprintln!("E2E_REDIS_SERVER not set: no shared cache to test");
        return;
    };
    let prefix = format!("{}:", marker("prefix"));
    let (a, b) = (
        replica("sealed-a", &redis, &prefix),
        replica("sealed-b", &redis, &prefix),
    );
    // Every fact (the fixture's package inventory makes it larger than the sealing threshold).
    let query = format!(r#"["not",["=","certname","{}"]]"#, marker("sealed"));
    let miss = get(&a, FACTS, &[("query", &query)]);
    assert_eq!(miss.header("x-cache"), Some("miss"), "{miss:?}");
    assert!(miss.body.len() >= 256 * 1024, "{} bytes", miss.body.len());
    assert_eq!(sealed_bytes(&b), 0, "B holds nothing yet");
    let hit = get(&b, FACTS, &[("query", &query)]);
    assert_eq!(hit.header("x-cache"), Some("hit"), "{hit:?}");
    assert_eq!(hit.body, miss.body);
    let local = get(&b, FACTS, &[("query", &query)]);
    assert_eq!(
        local.body, miss.body,
        "B's own hit, sent from the sealed copy"
    );
    if cfg!(target_os = "linux") {
        let sealed = sealed_bytes(&b);
        assert!(sealed >= miss.body.len(), "{sealed} bytes sealed on B");
    }
}

#[test]
fn redis_stopped_and_started_again_mid_run_is_never_an_error_for_a_client() {
    let Some(mut redis) = Redis::start() else {
        eprintln!("E2E_REDIS_SERVER not set: no shared cache to test");
        return;
    };
    let prefix = format!("{}:", marker("prefix"));
    let (a, b) = (
        replica("restart-a", &redis, &prefix),
        replica("restart-b", &redis, &prefix),
    );
    let ask = |p: &Pdbmux, what: &str| {
        let r = get(p, FACTS, &[("query", &question(&marker(what)))]);
        assert_eq!(r.status, 200, "{what}: {r:?}");
        r
    };
    for _ in 0..5 {
        ask(&a, "before");
        ask(&b, "before");
    }
    redis.stop();
    for _ in 0..10 {
        ask(&a, "during");
        ask(&b, "during");
    }
    let (_, body) = healthz(&a);
    assert_eq!(body["cache"]["store_reachable"], false, "{body}");
    redis.run();
    // The connection manager reconnects by itself; the store is tried again within a second.
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        // A new question each time: B can only hit it through the shared store.
        let query = question(&marker("after"));
        let stored = get(&a, FACTS, &[("query", &query)]);
        assert_eq!(stored.status, 200, "{stored:?}");
        let read = get(&b, FACTS, &[("query", &query)]);
        assert_eq!(read.status, 200, "{read:?}");
        if read.header("x-cache") == Some("hit") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "sharing never resumed after Redis came back: {read:?}\n{}",
            b.log()
        );
        thread::sleep(Duration::from_millis(300));
    }
    let (_, body) = healthz(&b);
    assert_eq!(body["cache"]["store_reachable"], true, "{body}");
    let log = a.log();
    let failing = log.matches("shared cache store failing").count();
    assert_eq!(failing, 1, "one warning for the outage: {log}");
}

#[test]
fn a_rediss_store_is_reached_with_the_tls_files_of_the_backends() {
    let env = env();
    let Some(tls) = &env.tls else {
        eprintln!("E2E_TLS_URL not set: no PKI for a TLS store");
        return;
    };
    // e2e/run's throwaway PKI: the server certificate (127.0.0.1) beside the CA.
    let pki = tls
        .ca_file
        .parent()
        .expect("the PKI directory")
        .to_path_buf();
    let Some(redis) = Redis::start_tls(
        tls.ca_file.clone(),
        pki.join("server.pem"),
        pki.join("server.key"),
    ) else {
        eprintln!("E2E_REDIS_SERVER not set: no shared cache to test");
        return;
    };
    let prefix = format!("{}:", marker("prefix"));
    let files = [
        ("PDBMUX_TLS_CA_FILE", tls.ca_file.display().to_string()),
        ("PDBMUX_TLS_CERT_FILE", tls.cert_file.display().to_string()),
        ("PDBMUX_TLS_KEY_FILE", tls.key_file.display().to_string()),
    ];
    let start = |label: &str| {
        let mut vars: Vec<(&str, &str)> = vec![
            ("PDBMUX_CACHE_BACKEND", "redis"),
            ("PDBMUX_HEALTH_PROBE_ENABLED", "false"),
            ("PDBMUX_CACHE_KEY_PREFIX", &prefix),
        ];
        let url = redis.url();
        vars.push(("PDBMUX_CACHE_REDIS_URL", &url));
        let secret = secret_file();
        vars.push(("PDBMUX_CACHE_SECRET_FILE", &secret));
        vars.extend(files.iter().map(|(k, v)| (*k, v.as_str())));
        pdbmux_env(label, &vars)
    };
    let (a, b) = (start("rediss-a"), start("rediss-b"));
    let query = question(&marker("rediss"));
    let miss = get(&a, FACTS, &[("query", &query)]);
    assert_eq!(miss.header("x-cache"), Some("miss"), "{miss:?}");
    let hit = get(&b, FACTS, &[("query", &query)]);
    assert_eq!(
        hit.header("x-cache"),
        Some("hit"),
        "through the TLS store: {hit:?}\n{}",
        b.log()
    );
    assert_eq!(hit.body, miss.body);
}

/// Anything that can write the store can at most cause misses (docs/reliability.md, "The shared
/// store is untrusted"): for each poisoned value under a key replica A stored, replica B (which
/// never asked before) answers from the PuppetDBs, with its own framing, and its kept-alive
/// connection stays in step; an entry signed with the deployment's key is the control that B
/// reads that very key.
#[test]
fn a_poisoned_store_entry_is_never_served_and_never_desyncs_a_client() {
    let Some(redis) = Redis::start() else {
        eprintln!("E2E_REDIS_SERVER not set: no shared cache to test");
        return;
    };
    let prefix = format!("{}:", marker("prefix"));
    let a = replica("poison-a", &redis, &prefix);
    let b = replica("poison-b", &redis, &prefix);
    let invented = r#"[{"certname":"invented.example","name":"os","value":"pwned"}]"#;
    let forger = pdbmux_core::config::Secret::new(b"a key that is not the deployment's".to_vec());
    // The old envelope, with framing and cookies that would desync or hijack a client.
    let v1_headers = |body: &str| {
        format!(
            "pdbmux-cache-v1 {} 88 {}\ncontent-length: 5\ntransfer-encoding: chunked\n\
             set-cookie: session=stolen\nlocation: http://evil.invalid/\n{body}",
            now_ms(),
            body.len()
        )
        .into_bytes()
    };
    type Poison = Box<dyn Fn(&str) -> Vec<u8>>;
    let shapes: Vec<(&str, Poison, &str)> = vec![
        (
            "headers and framing",
            Box::new(move |_| v1_headers(invented)),
            "malformed",
        ),
        (
            "signed with another key",
            Box::new(move |key| signed(&forger, key, now_ms(), invented)),
            "forged",
        ),
        (
            "dated an hour ahead",
            Box::new(move |key| signed(&secret(), key, now_ms() + 3_600_000, invented)),
            "future",
        ),
        (
            "html under a valid tag",
            Box::new(move |key| signed(&secret(), key, now_ms(), "<script>alert(1)</script>")),
            "not_json",
        ),
        (
            "100 MB",
            Box::new(|_| {
                let mut value = b"pdbmux-cache-v2 ".to_vec();
                value.resize(100 << 20, b'x');
                value
            }),
            "oversized",
        ),
    ];
    let rss_before = b.resident_kib().unwrap_or(0);
    for (name, poison, reason) in &shapes {
        let mark = marker("poison");
        let query = question(&mark);
        let stored = get(&a, FACTS, &[("query", &query)]);
        assert_eq!(stored.header("x-cache"), Some("miss"), "{name}: {stored:?}");
        let keys = redis.keys(&format!("{prefix}entry:*"));
        let key = keys
            .iter()
            .find(|key| key.contains(&mark))
            .unwrap_or_else(|| panic!("{name}: A's entry among {keys:?}"));
        redis.set(key, &poison(key));
        // Two requests in a row through the tests' one pooled agent, so on one kept-alive
        // connection: a response framed by the store would leave the second reading garbage.
        for (round, want) in [(0, "miss"), (1, "hit")] {
            let answer = get(&b, FACTS, &[("query", &query)]);
            assert_eq!(answer.status, 200, "{name} round {round}: {answer:?}");
            assert_eq!(answer.header("x-cache"), Some(want), "{name} round {round}");
            assert_eq!(
                answer.body, stored.body,
                "{name} round {round}: the PuppetDBs' answer"
            );
            assert_eq!(answer.header("set-cookie"), None, "{name}");
            assert_eq!(answer.header("location"), None, "{name}");
            assert_eq!(
                answer.header("x-content-type-options"),
                Some("nosniff"),
                "{name}"
            );
        }
        b.wait_for_log(&format!("reason=\"{reason}\""), 1)
            .or_else(|_| b.wait_for_log(&format!("reason={reason}"), 1))
            .unwrap_or_else(|e| panic!("{name}: refusal not logged: {e}\n{}", b.log()));
    }
    let rss_after = b.resident_kib().unwrap_or(0);
    assert!(
        rss_after < rss_before + 32 * 1024,
        "the 100 MB value was not read whole: {rss_before} KiB -> {rss_after} KiB"
    );
    // The control: an entry signed with the deployment's key is served, so B read that key.
    let mark = marker("poison-control");
    let query = question(&mark);
    get(&a, FACTS, &[("query", &query)]);
    let keys = redis.keys(&format!("{prefix}entry:*"));
    let key = keys
        .iter()
        .find(|key| key.contains(&mark))
        .expect("A's entry");
    redis.set(
        key,
        &signed(&secret(), key, now_ms(), r#"["signed","by","a","replica"]"#),
    );
    let hit = get(&b, FACTS, &[("query", &query)]);
    assert_eq!(hit.header("x-cache"), Some("hit"), "{hit:?}");
    assert_eq!(hit.body, r#"["signed","by","a","replica"]"#);
}
