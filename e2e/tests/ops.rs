//! The on-call check (`make ops-check`; docs/operating.md, "On call"): a real Prometheus scrapes
//! several pdbmux processes in front of the real PuppetDBs, evaluating the shipped alert rules
//! (deploy/prometheus/pdbmux-rules.yaml), while each process lives through one fault: a backend
//! answering 503, every backend down after the cache was warm, a backend that hangs, a backend
//! never reached, a refused reload, the shared store down, the process itself gone. Every alert
//! rule must be seen firing for the process whose fault it names, and resolved once the fault is
//! undone; no alert may fire where its fault is not (a process with no fault at all fires
//! nothing); and every query of the Grafana dashboard must return data from what was scraped.
//!
//! Time is scaled by `E2E_OPS_SCALE` (default 1, the rules as shipped: about 25 minutes): every
//! `for:`, every range window and the membership-age threshold divided by it, scrapes and
//! evaluations every second. `e2e/run` runs it at scale 20 (about two minutes).
//!
//! Needs `prometheus` on PATH (Debian's package) and `E2E_REDIS_SERVER`; run by `e2e/run` with
//! the `ops` feature.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use pdbmux_e2e::{free_port, E2eEnv, Pdbmux, Proxy, ProxyMode};
use serde_json::Value;

/// Where the rules and the dashboard live in the repository.
fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(path)
}

/// `text` (the rules file) with every duration divided by `scale`: `for: 10m`, range windows
/// `[5m]`, and the membership-age threshold in seconds (none below 4 s: a window holds a few
/// scrapes). At scale 1 the text is unchanged.
fn scaled_rules(text: &str, scale: u64) -> String {
    if scale == 1 {
        return text.to_owned();
    }
    let scaled = |minutes: u64| (minutes * 60 / scale).max(4);
    text.lines()
        .map(|line| {
            let body = line.trim_start();
            let indent = &line[..line.len() - body.len()];
            if let Some(minutes) = body
                .strip_prefix("for: ")
                .and_then(|rest| rest.strip_suffix('m'))
                .and_then(|m| m.parse::<u64>().ok())
            {
                return format!("{indent}for: {}s", scaled(minutes));
            }
            let mut out = String::with_capacity(line.len());
            let mut rest = line;
            while let Some(open) = rest.find('[') {
                out.push_str(&rest[..=open]);
                rest = &rest[open + 1..];
                let digits = rest.chars().take_while(char::is_ascii_digit).count();
                if digits > 0 && rest[digits..].starts_with("m]") {
                    let minutes: u64 = rest[..digits].parse().unwrap_or(1);
                    out.push_str(&format!("{}s", scaled(minutes)));
                    rest = &rest[digits + 1..];
                }
            }
            out.push_str(rest);
            out.replace(
                "pdbmux_backend_membership_age_seconds) > 600",
                &format!("pdbmux_backend_membership_age_seconds) > {}", scaled(10)),
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
        + "\n"
}

/// Each query of the Grafana dashboard (its panel's title, the expression with the dashboard's
/// variables set to every job, instance and backend, and Grafana's rate interval to 1m).
fn dashboard_queries() -> Vec<(String, String)> {
    let dashboard: Value = serde_json::from_str(
        &std::fs::read_to_string(repo("deploy/grafana/pdbmux-dashboard.json"))
            .expect("the dashboard"),
    )
    .expect("the dashboard is JSON");
    let mut out = Vec::new();
    for panel in dashboard["panels"].as_array().into_iter().flatten() {
        for target in panel["targets"].as_array().into_iter().flatten() {
            let Some(expr) = target["expr"].as_str() else {
                continue;
            };
            let expr = expr
                .replace("$__rate_interval", "1m")
                .replace("${memory_limit}", "805306368")
                .replace("$memory_limit", "805306368")
                .replace("\"$job\"", "\".*\"")
                .replace("\"$instance\"", "\".*\"")
                .replace("\"$backend\"", "\".*\"");
            let title = panel["title"].as_str().unwrap_or("a panel").to_owned();
            out.push((title, expr));
        }
    }
    out
}

/// A Prometheus server of the test's own, in a temporary directory; stopped when dropped.
struct Prometheus {
    child: Child,
    url: String,
    _dir: tempfile::TempDir,
}

impl Prometheus {
    /// Starts Prometheus scraping `targets` (job `pdbmux`, each with a `scenario` label) every
    /// second and evaluating `rules` every second; waits until it answers.
    fn start(targets: &[(String, SocketAddr)], rules: &str) -> Prometheus {
        let dir = tempfile::tempdir().expect("a directory for Prometheus");
        std::fs::write(dir.path().join("rules.yaml"), rules).expect("write the rules");
        let static_configs: Vec<String> = targets
            .iter()
            .map(|(scenario, addr)| {
                format!("      - targets: [\"{addr}\"]\n        labels: {{scenario: {scenario}}}")
            })
            .collect();
        let config = format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
             rule_files: [rules.yaml]\nscrape_configs:\n  - job_name: pdbmux\n    \
             static_configs:\n{}\n",
            static_configs.join("\n")
        );
        std::fs::write(dir.path().join("prometheus.yml"), config).expect("write the config");
        let port = free_port().expect("a port for Prometheus");
        let log = std::fs::File::create(dir.path().join("prometheus.log")).expect("a log file");
        let child = Command::new("prometheus")
            .arg(format!(
                "--config.file={}",
                dir.path().join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .expect("start prometheus (Debian's prometheus package)");
        let prometheus = Prometheus {
            child,
            url: format!("http://127.0.0.1:{port}"),
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        while pdbmux_e2e::get(&format!("{}/-/ready", prometheus.url))
            .map_or(true, |r| r.status != 200)
        {
            assert!(Instant::now() < deadline, "Prometheus did not become ready");
            thread::sleep(Duration::from_millis(200));
        }
        prometheus
    }

    /// The alerts firing now: (alert name, its labels).
    fn firing(&self) -> Vec<(String, BTreeMap<String, String>)> {
        let Ok(response) = pdbmux_e2e::get(&format!("{}/api/v1/alerts", self.url)) else {
            return Vec::new();
        };
        let body: Value = response.json().unwrap_or(Value::Null);
        body["data"]["alerts"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|alert| alert["state"] == "firing")
            .map(|alert| {
                let labels: BTreeMap<String, String> = alert["labels"]
                    .as_object()
                    .into_iter()
                    .flatten()
                    .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned()))
                    .collect();
                (labels.get("alertname").cloned().unwrap_or_default(), labels)
            })
            .collect()
    }

    /// The result of an instant query (empty on any error).
    fn query(&self, expr: &str) -> Vec<Value> {
        let url =
            pdbmux_e2e::url_with_query(&format!("{}/api/v1/query", self.url), &[("query", expr)]);
        pdbmux_e2e::get(&url)
            .ok()
            .and_then(|r| r.json().ok())
            .and_then(|body: Value| body["data"]["result"].as_array().cloned())
            .unwrap_or_default()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A redis-server of the test's own on `port`, in memory only; stopped when dropped.
struct Redis(Child);

impl Redis {
    fn start(port: u16) -> Redis {
        let binary =
            std::env::var_os("E2E_REDIS_SERVER").expect("E2E_REDIS_SERVER (e2e/run sets it)");
        let child = Command::new(binary)
            .args([
                "--bind",
                "127.0.0.1",
                "--port",
                &port.to_string(),
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start redis-server");
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "redis-server did not listen");
            thread::sleep(Duration::from_millis(50));
        }
        Redis(child)
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// One pdbmux process and the fault it lives through.
struct Scenario {
    name: &'static str,
    /// Its proxies, in front of pdb-a and pdb-b.
    proxies: [Proxy; 2],
    /// The process (`None` while it is gone, for the scrape fault).
    mux: Option<Pdbmux>,
    /// The alerts its fault must fire (with the backend named, where the alert names one).
    expected: Vec<(&'static str, Option<&'static str>)>,
    /// Alerts its fault may fire besides (a backend that answers 503 also makes answers
    /// partial, and so on); any other alert for it fails the check.
    allowed: Vec<&'static str>,
}

/// The index of the scenario called `name`.
fn find(scenarios: &[Scenario], name: &str) -> usize {
    scenarios
        .iter()
        .position(|s| s.name == name)
        .expect("a scenario of that name")
}

impl Scenario {
    fn mux(&self) -> &Pdbmux {
        self.mux.as_ref().expect("the process runs")
    }
}

/// What the clients ask: merged answers (cached: with every backend down they are served stale)
/// and a node's own answer (never cached: with every backend down it is a 5xx).
fn client_paths(env: &E2eEnv) -> Vec<String> {
    let node = env.fixture.nodes.keys().next().expect("a fixture node");
    vec![
        "/pdb/query/v4/nodes".to_owned(),
        "/pdb/query/v4/facts?query=%5B%22%3D%22%2C%22name%22%2C%22kernel%22%5D".to_owned(),
        "/pdb/query/v4/reports?limit=5".to_owned(),
        format!("/pdb/query/v4/nodes/{node}"),
    ]
}

fn secret_file(dir: &Path) -> String {
    let path = dir.join("cache.key");
    std::fs::write(&path, "ops-check-shared-cache-secret-0123456789\n").expect("write the key");
    path.display().to_string()
}

#[test]
#[allow(clippy::too_many_lines)] // one story: set up, break, watch, mend, watch
fn every_alert_fires_under_its_fault_and_resolves_after_it() {
    let env = E2eEnv::shared().expect("e2e environment");
    if Command::new("prometheus")
        .arg("--version")
        .output()
        .is_err()
    {
        panic!("prometheus is not installed (apt-get install prometheus)");
    }
    let scale: u64 = std::env::var("E2E_OPS_SCALE")
        .ok()
        .and_then(|s| s.parse().ok())
        .filter(|s| *s > 0)
        .unwrap_or(1);
    let rules = scaled_rules(
        &std::fs::read_to_string(repo("deploy/prometheus/pdbmux-rules.yaml")).expect("the rules"),
        scale,
    );
    let work = tempfile::tempdir().expect("a working directory");
    let (a, b) = (env.first(), env.second());
    let proxies = || {
        [
            Proxy::start(&a.url).expect("proxy a"),
            Proxy::start(&b.url).expect("proxy b"),
        ]
    };
    // Every process: metrics on a port of its own, the map refreshed every second so that a
    // refresh failure shows at once, probes every second.
    let start =
        |label: &str, proxies: &[Proxy; 2], metrics: u16, extra: &[(&str, &str)]| -> Pdbmux {
            let mut builder = env
                .pdbmux_with(&[(&a.name, &proxies[0].url()), (&b.name, &proxies[1].url())])
                .label(&format!("ops-{label}"))
                .env("PDBMUX_METRICS_LISTEN", &format!("127.0.0.1:{metrics}"))
                .env("PDBMUX_FRESHNESS_TTL", "1s")
                .env("PDBMUX_TIMEOUT", "3s")
                .env("PDBMUX_HEALTH_PROBE_ENABLED", "true")
                .env("PDBMUX_HEALTH_PROBE_INTERVAL", "1s")
                .env("PDBMUX_HEALTH_PROBE_FAILURES", "2")
                .env("PDBMUX_HEALTH_PROBE_SUCCESSES", "1")
                // Info: the harness reads the serving line; debug would log every request.
                .env("PDBMUX_LOG_LEVEL", "info");
            for (key, value) in extra {
                builder = builder.env(key, value);
            }
            builder.spawn().expect("start pdbmux")
        };
    let port = || free_port().expect("a free port");

    let mut scenarios: Vec<Scenario> = Vec::new();
    let add = |name: &'static str,
               extra: &[(&str, &str)],
               expected: Vec<(&'static str, Option<&'static str>)>,
               allowed: Vec<&'static str>,
               scenarios: &mut Vec<Scenario>| {
        let proxies = proxies();
        if name == "unreachable" {
            // Refused from the first probe on: never reached since start.
            proxies[1].set_mode(ProxyMode::Closed);
        }
        let mux = start(name, &proxies, port(), extra);
        scenarios.push(Scenario {
            name,
            proxies,
            mux: Some(mux),
            expected,
            allowed,
        });
    };
    let b_name: &'static str = Box::leak(b.name.clone().into_boxed_str());
    add("calm", &[], vec![], vec![], &mut scenarios);
    add(
        "backend-down",
        &[],
        vec![
            ("PdbmuxBackendDown", Some(b_name)),
            ("PdbmuxPartialAnswers", None),
            ("PdbmuxPartialRatioHigh", None),
            ("PdbmuxMembershipStale", Some(b_name)),
        ],
        vec![],
        &mut scenarios,
    );
    add(
        "all-down",
        &[("PDBMUX_FACTS_TTL", "2s")],
        vec![
            ("PdbmuxAllBackendsFailing", None),
            ("PdbmuxErrorRatioHigh", None),
            ("PdbmuxCacheServingStale", None),
        ],
        vec!["PdbmuxBackendDown", "PdbmuxMembershipStale"],
        &mut scenarios,
    );
    add(
        "slow",
        // No probes: every merged request waits the whole timeout for the hung backend.
        &[("PDBMUX_HEALTH_PROBE_ENABLED", "false")],
        vec![("PdbmuxLatencyHigh", None)],
        vec![
            "PdbmuxPartialAnswers",
            "PdbmuxPartialRatioHigh",
            "PdbmuxMembershipStale",
        ],
        &mut scenarios,
    );
    add(
        "unreachable",
        &[],
        vec![("PdbmuxBackendUnreachable", Some(b_name))],
        vec![
            "PdbmuxPartialAnswers",
            "PdbmuxPartialRatioHigh",
            "PdbmuxMembershipStale",
        ],
        &mut scenarios,
    );
    let config_file = work.path().join("reload.yaml");
    std::fs::write(&config_file, "freshness_ttl: 30s\n").expect("write the config file");
    let config_arg = config_file.display().to_string();
    {
        let proxies = proxies();
        let mux = env
            .pdbmux_with(&[(&a.name, &proxies[0].url()), (&b.name, &proxies[1].url())])
            .label("ops-reload")
            .args(&["serve", "--config", &config_arg])
            .env("PDBMUX_METRICS_LISTEN", &format!("127.0.0.1:{}", port()))
            .spawn()
            .expect("start pdbmux");
        scenarios.push(Scenario {
            name: "reload",
            proxies,
            mux: Some(mux),
            expected: vec![("PdbmuxConfigReloadFailed", None)],
            allowed: vec![],
        });
    }
    let redis_port = port();
    let secret = secret_file(work.path());
    let redis_url = format!("redis://127.0.0.1:{redis_port}");
    add(
        "store",
        &[
            ("PDBMUX_CACHE_BACKEND", "redis"),
            ("PDBMUX_CACHE_REDIS_URL", &redis_url),
            ("PDBMUX_CACHE_SECRET_FILE", &secret),
        ],
        vec![("PdbmuxCacheStoreDown", None)],
        vec![],
        &mut scenarios,
    );
    let scrape_port = port();
    let scrape_proxies = proxies();
    let scrape_mux = start("scrape", &scrape_proxies, scrape_port, &[]);
    scenarios.push(Scenario {
        name: "scrape",
        proxies: scrape_proxies,
        mux: Some(scrape_mux),
        expected: vec![("PdbmuxScrapeDown", None)],
        allowed: vec![],
    });

    // Every rule the project ships has a fault that must make it fire: a new rule without one
    // fails here, before the long watch.
    let shipped: BTreeSet<String> = rules
        .lines()
        .filter_map(|line| line.trim().strip_prefix("- alert: "))
        .map(str::to_owned)
        .collect();
    let covered: BTreeSet<String> = scenarios
        .iter()
        .flat_map(|s| s.expected.iter().map(|(alert, _)| (*alert).to_owned()))
        .collect();
    let uncovered: Vec<&String> = shipped.difference(&covered).collect();
    assert!(
        uncovered.is_empty() && shipped.len() >= 12,
        "alert rules no scenario expects to fire: {uncovered:?} (of {shipped:?})"
    );

    let targets: Vec<(String, SocketAddr)> = scenarios
        .iter()
        .map(|s| {
            let addr = s.mux().metrics_addr().expect("a metrics listener");
            (s.name.to_owned(), addr)
        })
        .collect();
    let scenario_of: BTreeMap<String, &'static str> = scenarios
        .iter()
        .zip(&targets)
        .map(|(s, (_, addr))| (addr.to_string(), s.name))
        .collect();
    let prometheus = Prometheus::start(&targets, &rules);

    // Clients: each process is asked the same questions, four times a second.
    let stop = Arc::new(AtomicBool::new(false));
    let paths = client_paths(env);
    let clients: Vec<_> = scenarios
        .iter()
        .map(|s| {
            let (stop, addr, paths) = (Arc::clone(&stop), s.mux().addr(), paths.clone());
            thread::spawn(move || {
                let mut i = 0;
                while !stop.load(Ordering::SeqCst) {
                    let path = &paths[i % paths.len()];
                    let _ = pdbmux_e2e::get(&format!("http://{addr}{path}"));
                    i += 1;
                    thread::sleep(Duration::from_millis(250));
                }
            })
        })
        .collect();
    // In calm, a client's own bad request too, four times a second: every backend refuses it
    // (a 400 pdbmux passes on), which is no backend failing and no 5xx, so nothing may fire.
    let bad = {
        let (stop, addr) = (
            Arc::clone(&stop),
            scenarios[find(&scenarios, "calm")].mux().addr(),
        );
        thread::spawn(move || {
            let path = "/pdb/query/v4/nodes?query=%5B%22%3D%22%2C%22no_such_field%22%2C%22x%22%5D";
            while !stop.load(Ordering::SeqCst) {
                if let Ok(response) = pdbmux_e2e::get(&format!("http://{addr}{path}")) {
                    assert_eq!(
                        response.status, 400,
                        "a bad query is the client's: {}",
                        response.body
                    );
                }
                thread::sleep(Duration::from_millis(250));
            }
        })
    };
    // A warm start: the cache of all-down holds its answers before its backends go.
    thread::sleep(Duration::from_secs(5));

    let faults_started = Instant::now();
    scenarios[find(&scenarios, "backend-down")].proxies[1].set_mode(ProxyMode::Unavailable);
    for proxy in &scenarios[find(&scenarios, "all-down")].proxies {
        proxy.set_mode(ProxyMode::Unavailable);
    }
    scenarios[find(&scenarios, "slow")].proxies[1].set_mode(ProxyMode::Hang);
    std::fs::write(&config_file, "timeout: abc\n").expect("write a bad config file");
    scenarios[find(&scenarios, "reload")]
        .mux()
        .signal("HUP")
        .expect("SIGHUP");
    let scrape = find(&scenarios, "scrape");
    scenarios[scrape].mux = None;

    // Watch: every expected alert firing, nothing unexpected.
    let limit = Duration::from_secs(25 * 60 / scale + 90);
    let mut seen: BTreeMap<(String, &'static str), Duration> = BTreeMap::new();
    let mut unexpected: BTreeSet<String> = BTreeSet::new();
    let expected_count: usize = scenarios.iter().map(|s| s.expected.len()).sum();
    let watch = |seen: &mut BTreeMap<(String, &'static str), Duration>,
                 unexpected: &mut BTreeSet<String>,
                 at: Duration| {
        for (alert, labels) in prometheus.firing() {
            let scenario = labels
                .get("instance")
                .and_then(|i| scenario_of.get(i))
                .copied()
                .unwrap_or("?");
            let Some(s) = scenarios.iter().find(|s| s.name == scenario) else {
                unexpected.insert(format!("{alert} {labels:?}"));
                continue;
            };
            let matched = s.expected.iter().find(|(name, backend)| {
                *name == alert
                    && backend.is_none_or(|b| labels.get("backend").map(String::as_str) == Some(b))
            });
            match matched {
                Some((name, _)) => {
                    seen.entry((s.name.to_owned(), name)).or_insert(at);
                }
                None if s.allowed.contains(&alert.as_str()) => {}
                None => {
                    unexpected.insert(format!("{alert} for {scenario}: {labels:?}"));
                }
            }
        }
    };
    while seen.len() < expected_count && faults_started.elapsed() < limit {
        watch(&mut seen, &mut unexpected, faults_started.elapsed());
        thread::sleep(Duration::from_secs(1));
    }
    let fired: Vec<String> = seen
        .iter()
        .map(|((scenario, alert), at)| format!("{alert} ({scenario}) after {at:.0?}"))
        .collect();
    println!("ops check (scale {scale}): fired {}", fired.join(", "));
    let missing: Vec<String> = scenarios
        .iter()
        .flat_map(|s| {
            s.expected
                .iter()
                .filter(|(alert, _)| !seen.contains_key(&(s.name.to_owned(), *alert)))
                .map(|(alert, _)| format!("{alert} ({})", s.name))
        })
        .collect();
    // What each scenario with a missing alert says of its backends while its fault is on: the
    // alerts read these states, so a failure shows whether pdbmux or the rule is wrong.
    let diagnosis: Vec<String> = scenarios
        .iter()
        .filter(|s| {
            s.expected
                .iter()
                .any(|(alert, _)| !seen.contains_key(&(s.name.to_owned(), *alert)))
        })
        .filter_map(|s| {
            let mux = s.mux.as_ref()?;
            let healthz = mux
                .get("/healthz")
                .map_or_else(|e| format!("no answer: {e}"), |r| r.body);
            let states: Vec<String> = mux
                .metrics_addr()
                .and_then(|addr| pdbmux_e2e::get(&format!("http://{addr}/metrics")).ok())
                .map(|r| {
                    r.body
                        .lines()
                        .filter(|l| l.starts_with("pdbmux_backend_state{") && l.ends_with(" 1"))
                        .map(str::to_owned)
                        .collect()
                })
                .unwrap_or_default();
            Some(format!(
                "{}: {}; /healthz {}",
                s.name,
                states.join(", "),
                healthz.chars().take(1500).collect::<String>()
            ))
        })
        .collect();

    // The dashboard's queries that return data with the faults on.
    let with_faults: BTreeSet<String> = dashboard_queries()
        .into_iter()
        .filter(|(_, expr)| !prometheus.query(expr).is_empty())
        .map(|(_, expr)| expr)
        .collect();

    // Mend every fault, then watch every alert resolve.
    let mended = Instant::now();
    for s in &scenarios {
        for proxy in &s.proxies {
            proxy.set_mode(ProxyMode::Forward);
        }
    }
    std::fs::write(&config_file, "freshness_ttl: 30s\n").expect("write the good config file");
    scenarios[find(&scenarios, "reload")]
        .mux()
        .signal("HUP")
        .expect("SIGHUP");
    let _redis = Redis::start(redis_port);
    let back = start("scrape", &scenarios[scrape].proxies, scrape_port, &[]);
    scenarios[scrape].mux = Some(back);
    let mut still: Vec<String> = Vec::new();
    while mended.elapsed() < limit {
        still = prometheus
            .firing()
            .into_iter()
            .map(|(alert, labels)| {
                let scenario = labels
                    .get("instance")
                    .and_then(|i| scenario_of.get(i))
                    .copied()
                    .unwrap_or("?");
                format!("{alert} ({scenario})")
            })
            .collect();
        if still.is_empty() {
            break;
        }
        thread::sleep(Duration::from_secs(1));
    }
    println!(
        "ops check: {} resolved {:.0?} after the faults were undone",
        if still.is_empty() {
            "every alert"
        } else {
            "not every alert"
        },
        mended.elapsed()
    );

    // Every dashboard query had data: some panels show faults (upstream errors, stale answers)
    // and are empty in calm, others show the calm: each is read while the faults were on and
    // again now, and must have had data at one of those times.
    let empty: Vec<String> = dashboard_queries()
        .into_iter()
        .filter(|(_, expr)| !with_faults.contains(expr) && prometheus.query(expr).is_empty())
        .map(|(title, expr)| format!("{title}: {expr}"))
        .collect();
    println!(
        "ops check: {} of {} dashboard queries returned data",
        dashboard_queries().len() - empty.len(),
        dashboard_queries().len()
    );
    stop.store(true, Ordering::SeqCst);
    for client in clients {
        let _ = client.join();
    }
    let bad_answered_400 = bad.join().is_ok();

    let mut failures = Vec::new();
    if !bad_answered_400 {
        failures.push("a client's bad request in calm was not answered 400".to_owned());
    }
    if !missing.is_empty() {
        failures.push(format!(
            "never fired within {limit:?}: {}\n{}",
            missing.join(", "),
            diagnosis.join("\n")
        ));
    }
    if !unexpected.is_empty() {
        failures.push(format!(
            "fired where its fault is not: {}",
            unexpected.into_iter().collect::<Vec<_>>().join("; ")
        ));
    }
    if !still.is_empty() {
        failures.push(format!(
            "still firing {limit:?} after the faults were undone: {}",
            still.join(", ")
        ));
    }
    if !empty.is_empty() {
        failures.push(format!(
            "dashboard queries without data: {}",
            empty.join("; ")
        ));
    }
    assert!(
        failures.is_empty(),
        "the ops check failed:\n{}",
        failures.join("\n")
    );
}

#[test]
fn rules_scale_every_duration_and_nothing_else() {
    let text = "      - alert: X\n        expr: rate(a[5m]) > 0 and increase(b[10m]) > 0\n        for: 10m\n        expr: (max by (x) (pdbmux_backend_membership_age_seconds) > 600)\n";
    assert_eq!(scaled_rules(text, 1), text);
    assert_eq!(
        scaled_rules(text, 20),
        "      - alert: X\n        expr: rate(a[15s]) > 0 and increase(b[30s]) > 0\n        for: 30s\n        expr: (max by (x) (pdbmux_backend_membership_age_seconds) > 30)\n"
    );
}
