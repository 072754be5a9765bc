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
        let binary = PathBuf::from(std::env::var_os("PDBMUX_E2E_REDIS_SERVER")?);
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
        let binary = PathBuf::from(std::env::var_os("PDBMUX_E2E_REDIS_SERVER")?);
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

/// A replica sharing `redis` under `prefix`.
fn replica(label: &str, redis: &Redis, prefix: &str) -> Pdbmux {
    pdbmux_env(
        label,
        &[
            ("PDBMUX_CACHE_BACKEND", "redis"),
            ("PDBMUX_CACHE_REDIS_URL", &redis.url()),
            ("PDBMUX_CACHE_KEY_PREFIX", prefix),
            ("PDBMUX_HEALTH_PROBE_ENABLED", "false"),
        ],
    )
}

/// A `/facts` question only this test asks (its marker in the query), so the PuppetDBs' access
/// logs show exactly its fan-outs.
fn question(marker: &str) -> String {
    format!(r#"["=","name","{marker}"]"#)
}

#[test]
fn fifty_concurrent_requests_over_two_replicas_make_one_fan_out_and_a_hit_carries_the_age() {
    let Some(redis) = Redis::start() else {
        eprintln!("PDBMUX_E2E_REDIS_SERVER not set: no shared cache to test");
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
        eprintln!("no PDBMUX_E2E_ACCESS_LOGS: fan-outs not counted");
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
        eprintln!("PDBMUX_E2E_REDIS_SERVER not set: no shared cache to test");
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
        eprintln!("PDBMUX_E2E_REDIS_SERVER not set: no shared cache to test");
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
        eprintln!("PDBMUX_E2E_TLS_URL not set: no PKI for a TLS store");
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
        eprintln!("PDBMUX_E2E_REDIS_SERVER not set: no shared cache to test");
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
