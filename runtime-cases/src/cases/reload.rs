//! The configuration read again on SIGHUP: backends added and removed while requests run, and a
//! bad file refused with the running configuration still serving.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use super::metrics::{metrics_addr, scrape_until, Scrape};
use crate::support::{closed_by_server, keep_getting, respond, FakeBackend, Pdbmux};

/// A backend whose only fact name is `name`.
fn naming(name: &'static str) -> FakeBackend {
    FakeBackend::start(move |_| respond("200 OK", "application/json", &format!(r#"["{name}"]"#)))
}

fn config_file(dir: &Path, backends: &[(&str, &FakeBackend)]) -> String {
    config_file_with(dir, backends, "")
}

/// [`config_file`] with more lines of YAML.
fn config_file_with(dir: &Path, backends: &[(&str, &FakeBackend)], more: &str) -> String {
    let mut text = String::from("backends:\n");
    for (name, backend) in backends {
        text.push_str(&format!("  - name: {name}\n    url: {}\n", backend.url()));
    }
    text.push_str("facts_ttl: 0s\n");
    text.push_str(more);
    let path = dir.join("pdbmux.yaml");
    // Written whole, then renamed: pdbmux never reads half a file.
    let partial = dir.join("pdbmux.yaml.new");
    std::fs::write(&partial, text).unwrap();
    std::fs::rename(&partial, &path).unwrap();
    path.display().to_string()
}

/// Clients keep asking for `/fact-names` while the file changes; every answer is a 200.
fn keep_asking(addr: std::net::SocketAddr, stop: Arc<AtomicBool>) -> thread::JoinHandle<usize> {
    keep_getting(
        addr,
        "/pdb/query/v4/fact-names",
        stop,
        Duration::from_millis(5),
    )
}

fn fact_names(pdbmux: &Pdbmux) -> (String, Option<String>) {
    let response = pdbmux.get("/pdb/query/v4/fact-names");
    assert_eq!(response.status(), 200, "{}", response.text);
    (response.body().to_owned(), response.header("x-backends"))
}

/// a and b are configured; the file changes to b and c and SIGHUP is sent while clients keep
/// asking: from then on answers merge b and c, every request in between is answered, and the
/// reload is counted.
pub fn sighup_adds_and_removes_backends_while_requests_run(bin: &Path) {
    let (a, b, c) = (naming("from_a"), naming("from_b"), naming("from_c"));
    let dir = tempfile::tempdir().unwrap();
    let file = config_file(dir.path(), &[("a", &a), ("b", &b)]);
    let metrics = metrics_addr();
    let mut pdbmux = Pdbmux::start(
        bin,
        &[
            ("PDBMUX_CONFIG", file),
            ("PDBMUX_METRICS_LISTEN", metrics.to_string()),
            ("PDBMUX_LOG_LEVEL", "warn,pdbmux_driver=info".to_owned()),
        ],
    );
    assert_eq!(
        fact_names(&pdbmux),
        (
            r#"["from_a","from_b","pdbmux_source"]"#.to_owned(),
            Some("2/2".to_owned())
        )
    );
    let stop = Arc::new(AtomicBool::new(false));
    let clients: Vec<_> = (0..4)
        .map(|_| keep_asking(pdbmux.addr, Arc::clone(&stop)))
        .collect();
    thread::sleep(Duration::from_millis(100));
    config_file(dir.path(), &[("b", &b), ("c", &c)]);
    pdbmux.signal("HUP");
    scrape_until(metrics, |s| {
        s.value("pdbmux_config_reloads_total", "result=ok") == 1.0
    });
    let reloaded = fact_names(&pdbmux);
    thread::sleep(Duration::from_millis(100));
    stop.store(true, Ordering::SeqCst);
    let answered: usize = clients.into_iter().map(|c| c.join().unwrap()).sum();
    assert!(
        answered > 10,
        "the clients kept asking ({answered} answers)"
    );
    assert_eq!(
        reloaded,
        (
            r#"["from_b","from_c","pdbmux_source"]"#.to_owned(),
            Some("2/2".to_owned())
        )
    );
    let removed_before = a.request_lines().len();
    thread::sleep(Duration::from_millis(50));
    fact_names(&pdbmux);
    assert_eq!(
        a.request_lines().len(),
        removed_before,
        "a is no longer asked"
    );
    let scrape = Scrape::of(metrics);
    assert_eq!(
        scrape.value("pdbmux_config_reloads_total", "result=failed"),
        0.0
    );
    let log = pdbmux.stderr();
    assert!(
        log.contains("configuration reloaded") && log.contains("changed=backends"),
        "{log}"
    );
}

/// A file that no longer validates is refused on SIGHUP with one error line naming the key; the
/// running configuration keeps answering; the next good file is applied.
pub fn a_bad_configuration_on_sighup_is_refused_and_the_old_one_serves(bin: &Path) {
    let (a, b) = (naming("from_a"), naming("from_b"));
    let dir = tempfile::tempdir().unwrap();
    let file = config_file(dir.path(), &[("a", &a)]);
    let metrics = metrics_addr();
    let mut pdbmux = Pdbmux::start(
        bin,
        &[
            ("PDBMUX_CONFIG", file.clone()),
            ("PDBMUX_METRICS_LISTEN", metrics.to_string()),
            ("PDBMUX_LOG_LEVEL", "warn".to_owned()),
        ],
    );
    let started = Scrape::of(metrics);
    assert_eq!(
        started.value("pdbmux_config_last_reload_successful", ""),
        1.0,
        "the configuration read at start is in force"
    );
    let read_at = started.value("pdbmux_config_last_reload_success_timestamp_seconds", "");
    assert!(read_at > 1.7e9, "a Unix time: {read_at}");
    std::fs::write(
        &file,
        format!(
            "backends:\n  - name: b\n    url: {}\ntimeout: forever\n",
            b.url()
        ),
    )
    .unwrap();
    pdbmux.signal("HUP");
    scrape_until(metrics, |s| {
        s.value("pdbmux_config_reloads_total", "result=failed") == 1.0
    });
    assert_eq!(
        fact_names(&pdbmux),
        (
            r#"["from_a","pdbmux_source"]"#.to_owned(),
            Some("1/1".to_owned())
        ),
        "the running configuration still answers"
    );
    assert!(b.request_lines().is_empty(), "b was never asked");
    let refused = Scrape::of(metrics);
    assert_eq!(
        refused.value("pdbmux_config_last_reload_successful", ""),
        0.0,
        "stays 0 while the refused file stays"
    );
    assert_eq!(
        refused.value("pdbmux_config_last_reload_success_timestamp_seconds", ""),
        read_at,
        "the configuration in force is still the one read at start"
    );
    // What takes a restart (here the log format; the listeners come from the environment, which
    // outranks the file) is kept and named while the rest applies.
    std::fs::write(
        &file,
        format!(
            "backends:\n  - name: b\n    url: {}\nlog_format: json\nfacts_ttl: 0s\n",
            b.url()
        ),
    )
    .unwrap();
    pdbmux.signal("HUP");
    let deadline = Instant::now() + Duration::from_secs(10);
    while Scrape::of(metrics).value("pdbmux_config_reloads_total", "result=ok") < 1.0 {
        assert!(Instant::now() < deadline, "the good file was never applied");
        thread::sleep(Duration::from_millis(50));
    }
    let applied = Scrape::of(metrics);
    assert_eq!(
        applied.value("pdbmux_config_last_reload_successful", ""),
        1.0
    );
    assert!(applied.value("pdbmux_config_last_reload_success_timestamp_seconds", "") >= read_at);
    assert_eq!(
        fact_names(&pdbmux),
        (
            r#"["from_b","pdbmux_source"]"#.to_owned(),
            Some("1/1".to_owned())
        )
    );
    let log = pdbmux.stderr();
    let refused: Vec<&str> = log
        .lines()
        .filter(|line| line.contains("configuration reload refused"))
        .collect();
    assert_eq!(refused.len(), 1, "{log}");
    assert!(
        refused[0].contains("timeout"),
        "names the key: {}",
        refused[0]
    );
    assert!(
        log.contains("reload: log_format changed; that takes a restart"),
        "{log}"
    );
}

/// A request started before the reload is answered by the backend it was sent to, though the
/// reload removed it; the next request goes to the new one.
pub fn a_request_in_flight_finishes_on_the_configuration_it_started_with(bin: &Path) {
    let slow = FakeBackend::start(|_| {
        let mut pieces = vec![crate::support::Piece::Pause(Duration::from_millis(800))];
        pieces.extend(respond("200 OK", "application/json", r#"["from_slow"]"#));
        pieces
    });
    let fast = naming("from_fast");
    let dir = tempfile::tempdir().unwrap();
    let file = config_file(dir.path(), &[("slow", &slow)]);
    let metrics = metrics_addr();
    let pdbmux = Pdbmux::start(
        bin,
        &[
            ("PDBMUX_CONFIG", file),
            ("PDBMUX_METRICS_LISTEN", metrics.to_string()),
        ],
    );
    let addr = pdbmux.addr;
    let in_flight = thread::spawn(move || {
        Pdbmux::raw_at(
            addr,
            "GET /pdb/query/v4/fact-names HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        )
    });
    let deadline = Instant::now() + Duration::from_secs(5);
    while slow.request_lines().is_empty() {
        assert!(
            Instant::now() < deadline,
            "the request never reached the slow backend"
        );
        thread::sleep(Duration::from_millis(10));
    }
    config_file(dir.path(), &[("fast", &fast)]);
    pdbmux.signal("HUP");
    scrape_until(metrics, |s| {
        s.value("pdbmux_config_reloads_total", "result=ok") == 1.0
    });
    assert_eq!(
        fact_names(&pdbmux).0,
        r#"["from_fast","pdbmux_source"]"#,
        "a new request runs on the new configuration"
    );
    let answered = in_flight.join().unwrap();
    assert_eq!(answered.status(), 200, "{}", answered.text);
    assert_eq!(answered.body(), r#"["from_slow","pdbmux_source"]"#);
}

/// A reload's `client_header_timeout` applies to connections accepted after it; an idle
/// connection accepted before keeps the value it was accepted with (docs/operating.md).
pub fn reloaded_client_timeouts_apply_to_new_connections(bin: &Path) {
    let a = naming("from_a");
    let dir = tempfile::tempdir().unwrap();
    let file = config_file_with(dir.path(), &[("a", &a)], "client_header_timeout: 30s\n");
    let metrics = metrics_addr();
    let pdbmux = Pdbmux::start(
        bin,
        &[
            ("PDBMUX_CONFIG", file),
            ("PDBMUX_METRICS_LISTEN", metrics.to_string()),
            ("PDBMUX_LOG_LEVEL", "warn".to_owned()),
        ],
    );
    let before = std::net::TcpStream::connect(pdbmux.addr).unwrap();
    config_file_with(dir.path(), &[("a", &a)], "client_header_timeout: 1s\n");
    pdbmux.signal("HUP");
    scrape_until(metrics, |s| {
        s.value("pdbmux_config_reloads_total", "result=ok") == 1.0
    });
    let after = std::net::TcpStream::connect(pdbmux.addr).unwrap();
    let started = Instant::now();
    while !closed_by_server(&after) {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "an idle connection accepted after the reload was not closed at its 1 s timeout"
        );
        thread::sleep(Duration::from_millis(50));
    }
    assert!(
        !closed_by_server(&before),
        "the connection accepted before the reload keeps its 30 s timeout"
    );
}

/// With `config_watch_interval`, a ConfigMap-style update (the file reached through a `..data`
/// symlink that is swapped to a new directory) is read again without a SIGHUP: the new backends
/// answer, the reload is counted; a refused file leaves the running configuration serving and
/// the gauge at 0; an untouched file is never read again.
pub fn a_configmap_update_is_read_again_without_a_sighup(bin: &Path) {
    let (a, b) = (naming("from_a"), naming("from_b"));
    let dir = tempfile::tempdir().unwrap();
    // What the kubelet makes: <dir>/pdbmux.yaml -> ..data/pdbmux.yaml, ..data -> ..<version>.
    let version = |n: usize, text: &str| {
        let versioned = dir.path().join(format!("..v{n}"));
        std::fs::create_dir(&versioned).unwrap();
        std::fs::write(versioned.join("pdbmux.yaml"), text).unwrap();
        let swap = dir.path().join("..data_tmp");
        std::os::unix::fs::symlink(format!("..v{n}"), &swap).unwrap();
        std::fs::rename(&swap, dir.path().join("..data")).unwrap();
    };
    let backend = |name: &str, fake: &FakeBackend| {
        format!(
            "backends:\n  - name: {name}\n    url: {}\nfacts_ttl: 0s\n",
            fake.url()
        )
    };
    version(1, &backend("a", &a));
    let file = dir.path().join("pdbmux.yaml");
    std::os::unix::fs::symlink("..data/pdbmux.yaml", &file).unwrap();
    let metrics = metrics_addr();
    let mut pdbmux = Pdbmux::start(
        bin,
        &[
            ("PDBMUX_CONFIG", file.display().to_string()),
            ("PDBMUX_METRICS_LISTEN", metrics.to_string()),
            ("PDBMUX_CONFIG_WATCH_INTERVAL", "1s".to_owned()),
        ],
    );
    assert_eq!(fact_names(&pdbmux).0, r#"["from_a","pdbmux_source"]"#);
    // Untouched: no reload however long it watches.
    thread::sleep(Duration::from_millis(2500));
    let idle = Scrape::of(metrics);
    assert_eq!(idle.value("pdbmux_config_reloads_total", "result=ok"), 0.0);

    version(2, &backend("b", &b));
    scrape_until(metrics, |s| {
        s.value("pdbmux_config_reloads_total", "result=ok") == 1.0
    });
    assert_eq!(
        fact_names(&pdbmux),
        (
            r#"["from_b","pdbmux_source"]"#.to_owned(),
            Some("1/1".to_owned())
        ),
        "the updated file's backends answer"
    );

    version(3, "backends: []\n");
    let refused = scrape_until(metrics, |s| {
        s.value("pdbmux_config_reloads_total", "result=failed") == 1.0
    });
    assert_eq!(
        refused.value("pdbmux_config_last_reload_successful", ""),
        0.0
    );
    assert_eq!(fact_names(&pdbmux).0, r#"["from_b","pdbmux_source"]"#);
    // Still refused, not read again until it changes.
    thread::sleep(Duration::from_millis(2500));
    let later = Scrape::of(metrics);
    assert_eq!(
        later.value("pdbmux_config_reloads_total", "result=failed"),
        1.0
    );
    let log = pdbmux.stderr();
    assert_eq!(
        log.matches("the config file changed: reading the configuration again")
            .count(),
        2,
        "one reload per change: {log}"
    );
}
