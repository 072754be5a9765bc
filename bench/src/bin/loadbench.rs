//! `loadbench`: requests/s through the `pdbmux` binary, measured with wrk on loopback.
//!
//! 1. Worker threads (issue 3): two `fakepdb` backends serving 2 × 5,000 fact records, pdbmux
//!    with the cache off (`PDBMUX_FACTS_TTL=0s`) and health probing off, run once with
//!    `TOKIO_WORKER_THREADS=1` and once with `=2`; wrk on `/pdb/query/v4/facts`, so every request
//!    is a full merge.
//! 2. Cache hits (issue 6): the same backends serving a ~1 MiB merged `/facts` body, pdbmux with
//!    the cache on (default workers), the entry warmed, then wrk on the cached URL; beside
//!    Debian's nginx serving the same bytes as a static file on another loopback port, in the
//!    same run.
//!
//! Each pdbmux run is a fresh process, so its peak RSS (`VmHWM`) is that run's. CPU time of every
//! process is read from `/proc` before and after each wrk run, so the table shows how many cores
//! each side actually got on this (shared, 2-core) machine.
//!
//! Everything it starts is stopped when it ends, also on error.

#![forbid(unsafe_code)]

use std::error::Error;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use pdbmux_bench::procs::{free_port, wait_listening, Proc};
use pdbmux_bench::SyntheticEstate;

type Result<T> = std::result::Result<T, Box<dyn Error>>;

const FACTS: &str = "/pdb/query/v4/facts";

#[derive(Debug, Clone)]
struct Args {
    pdbmux: PathBuf,
    fakepdb: PathBuf,
    nginx: PathBuf,
    wrk: PathBuf,
    redis: PathBuf,
    duration: u64,
    merge_connections: u32,
    cache_connections: u32,
    wrk_threads: u32,
    /// Merge scenario: nodes per backend, shared nodes, facts per node.
    merge_nodes: usize,
    merge_overlap: usize,
    facts: usize,
    /// Cache scenario: the merged body's target size, and how many rounds of one pdbmux run
    /// and one nginx run (in alternating order) to take the medians of.
    cache_bytes: usize,
    cache_rounds: usize,
    /// CPU lists for `taskset`, if any.
    pin_pdbmux: Option<String>,
    pin_load: Option<String>,
    only: Option<String>,
}

fn args() -> Result<Args> {
    let exe_dir = std::env::current_exe()?
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default();
    let mut args = Args {
        pdbmux: exe_dir.join("pdbmux"),
        fakepdb: exe_dir.join("fakepdb"),
        nginx: PathBuf::from("/usr/sbin/nginx"),
        wrk: PathBuf::from("wrk"),
        redis: PathBuf::from("redis-server"),
        duration: 10,
        merge_connections: 32,
        cache_connections: 64,
        wrk_threads: 2,
        merge_nodes: 50,
        merge_overlap: 10,
        facts: 100,
        cache_bytes: 1 << 20,
        cache_rounds: 3,
        pin_pdbmux: None,
        pin_load: None,
        only: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--pdbmux" => args.pdbmux = value.into(),
            "--fakepdb" => args.fakepdb = value.into(),
            "--nginx" => args.nginx = value.into(),
            "--wrk" => args.wrk = value.into(),
            "--redis" => args.redis = value.into(),
            "--duration" => args.duration = value.parse()?,
            "--merge-connections" => args.merge_connections = value.parse()?,
            "--cache-connections" => args.cache_connections = value.parse()?,
            "--wrk-threads" => args.wrk_threads = value.parse()?,
            "--merge-nodes" => args.merge_nodes = value.parse()?,
            "--merge-overlap" => args.merge_overlap = value.parse()?,
            "--facts" => args.facts = value.parse()?,
            "--cache-bytes" => args.cache_bytes = value.parse()?,
            "--cache-rounds" => args.cache_rounds = value.parse::<usize>()?.max(1),
            "--pin-pdbmux" => args.pin_pdbmux = Some(value),
            "--pin-load" => args.pin_load = Some(value),
            "--only" => args.only = Some(value),
            _ => return Err(format!("unknown flag {flag} (see bench/README.md)").into()),
        }
    }
    Ok(args)
}

/// `command` under `taskset -c cpus` when a CPU list is given.
fn pinned(program: &Path, cpus: Option<&str>) -> Command {
    match cpus {
        Some(cpus) => {
            let mut command = Command::new("taskset");
            command.arg("-c").arg(cpus).arg(program);
            command
        }
        None => Command::new(program),
    }
}

/// Starts a fake backend and returns it with its address.
fn start_fakepdb(
    args: &Args,
    backend: usize,
    spec: &SyntheticEstate,
) -> Result<(Proc, SocketAddr)> {
    pdbmux_bench::procs::start_fakepdb(
        pinned(&args.fakepdb, args.pin_load.as_deref()),
        backend,
        spec,
    )
}

/// How pdbmux is started: its cache TTL, tokio worker threads, whether it serves its metrics.
struct Setup<'a> {
    facts_ttl: &'a str,
    workers: Option<u32>,
    metrics: bool,
    /// `PDBMUX_LOG_LEVEL=warn`: no access log line per request.
    quiet: bool,
    /// A shared cache store: its URL and the key prefix.
    redis: Option<(&'a str, &'a str)>,
}

/// Starts pdbmux in a clean environment (no config file, no inherited PDBMUX_* variables); the
/// address of its metrics listener when `setup.metrics`.
fn start_pdbmux(
    args: &Args,
    backends: &[SocketAddr],
    setup: Setup<'_>,
    log: &Path,
) -> Result<(Proc, SocketAddr, Option<SocketAddr>)> {
    let port = free_port()?;
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse()?;
    let metrics = if setup.metrics {
        Some(format!("127.0.0.1:{}", free_port()?).parse::<SocketAddr>()?)
    } else {
        None
    };
    let backends = backends
        .iter()
        .enumerate()
        .map(|(i, a)| format!("pdb-{}=http://{a}", (b'a' + i as u8) as char))
        .collect::<Vec<_>>()
        .join(",");
    let mut command = pinned(&args.pdbmux, args.pin_pdbmux.as_deref());
    command
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("PDBMUX_LISTEN", addr.to_string())
        .env("PDBMUX_BACKENDS", backends)
        .env("PDBMUX_FACTS_TTL", setup.facts_ttl)
        .env("PDBMUX_HEALTH_PROBE_ENABLED", "false")
        .env(
            "PDBMUX_METRICS_LISTEN",
            metrics.map_or_else(String::new, |m| m.to_string()),
        )
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log)?);
    if let Some(workers) = setup.workers {
        command.env("TOKIO_WORKER_THREADS", workers.to_string());
    }
    if setup.quiet {
        command.env("PDBMUX_LOG_LEVEL", "warn");
    }
    if let Some((url, prefix)) = setup.redis {
        // Every replica reads the same key, so each one's entries authenticate on the others.
        let secret = log.with_extension("cache.key");
        std::fs::write(&secret, "loadbench-shared-cache-secret-0123456789")?;
        command
            .env("PDBMUX_CACHE_BACKEND", "redis")
            .env("PDBMUX_CACHE_REDIS_URL", url)
            .env("PDBMUX_CACHE_SECRET_FILE", secret)
            .env("PDBMUX_CACHE_KEY_PREFIX", prefix);
    }
    let child = command
        .spawn()
        .map_err(|e| format!("starting {}: {e}", args.pdbmux.display()))?;
    let proc = Proc::new("pdbmux", child);
    wait_listening(addr, "pdbmux")?;
    Ok((proc, addr, metrics))
}

/// A plain HTTP/1.1 GET with `Connection: close`: status, head, body.
fn get(addr: SocketAddr, target: &str) -> Result<(u16, String, Vec<u8>)> {
    let mut stream = TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    write!(
        stream,
        "GET {target} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw)?;
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or("no end of headers")?;
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let body = raw[split + 4..].to_vec();
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or("no status")?;
    if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        return Err("chunked answers are not handled here".into());
    }
    Ok((status, head, body))
}

fn header<'h>(head: &'h str, name: &str) -> Option<&'h str> {
    head.lines().find_map(|line| {
        let (key, value) = line.split_once(':')?;
        key.eq_ignore_ascii_case(name).then(|| value.trim())
    })
}

/// `pid` and every descendant of it.
fn process_tree(pid: u32) -> Vec<u32> {
    let mut pids = vec![pid];
    let mut i = 0;
    while let Some(&current) = pids.get(i) {
        i += 1;
        if let Ok(entries) = std::fs::read_dir("/proc") {
            for entry in entries.flatten() {
                let Some(child) = entry
                    .file_name()
                    .to_str()
                    .and_then(|n| n.parse::<u32>().ok())
                else {
                    continue;
                };
                if proc_stat(child).is_some_and(|(ppid, _, _)| ppid == current)
                    && !pids.contains(&child)
                {
                    pids.push(child);
                }
            }
        }
    }
    pids
}

/// CPU time (user + system) of `pid` and every descendant, in seconds.
fn cpu_seconds(pid: u32) -> f64 {
    let total: u64 = process_tree(pid)
        .into_iter()
        .filter_map(proc_stat)
        .map(|(_, utime, stime)| utime + stime)
        .sum();
    total as f64 / clock_ticks()
}

/// Peak RSS (VmHWM) of `pid` and its descendants, summed, in MiB.
fn peak_rss_mib(pid: u32) -> Option<f64> {
    let kb: Vec<u64> = process_tree(pid)
        .into_iter()
        .filter_map(|p| status_kb(p, "VmHWM"))
        .collect();
    (!kb.is_empty()).then(|| kb.iter().sum::<u64>() as f64 / 1024.0)
}

/// (ppid, utime, stime) from `/proc/<pid>/stat`.
fn proc_stat(pid: u32) -> Option<(u32, u64, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    Some((
        fields.get(1)?.parse().ok()?,
        fields.get(11)?.parse().ok()?,
        fields.get(12)?.parse().ok()?,
    ))
}

fn clock_ticks() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok()?.trim().parse().ok())
        .unwrap_or(100.0)
}

/// Busy and total jiffies of the whole machine (/proc/stat).
fn machine_cpu() -> (u64, u64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let values: Vec<u64> = stat
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .skip(1)
        .filter_map(|v| v.parse().ok())
        .collect();
    let total: u64 = values.iter().take(8).sum();
    let idle = values.get(3).copied().unwrap_or(0) + values.get(4).copied().unwrap_or(0);
    (total - idle, total)
}

/// A `/proc/<pid>/status` field in kB.
fn status_kb(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find_map(|line| {
        line.strip_prefix(field)?
            .strip_prefix(':')?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    })
}

/// How many threads of `pid` are tokio workers.
fn tokio_workers(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|tasks| {
            tasks
                .flatten()
                .filter(|task| {
                    std::fs::read_to_string(task.path().join("comm"))
                        // "tokio-rt-worker" (tokio >= 1.44) or "tokio-runtime-w" (older)
                        .is_ok_and(|comm| {
                            comm.starts_with("tokio-rt-worker")
                                || comm.starts_with("tokio-runtime-w")
                        })
                })
                .count()
        })
        .unwrap_or(0)
}

/// The run with the median request rate (the upper one of the middle two).
fn median_run(runs: &[Load]) -> Load {
    let mut sorted = runs.to_vec();
    sorted.sort_by(|a, b| a.rps().total_cmp(&b.rps()));
    sorted.get(sorted.len() / 2).cloned().unwrap_or_default()
}

/// One wrk run's figures.
#[derive(Debug, Clone, Default)]
struct Load {
    requests: u64,
    bytes: u64,
    seconds: f64,
    p50_ms: f64,
    p99_ms: f64,
    errors: u64,
    non_2xx: u64,
    /// CPU seconds per wall second used by the server, by the other processes we started, and
    /// by the whole machine.
    server_cores: f64,
    machine_cores: f64,
}

impl Load {
    fn rps(&self) -> f64 {
        self.requests as f64 / self.seconds.max(1e-9)
    }

    fn mb_s(&self) -> f64 {
        self.bytes as f64 / 1e6 / self.seconds.max(1e-9)
    }
}

const WRK_SCRIPT: &str = r#"
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("WRKRESULT %d %d %d %d %d %d %d\n",
    summary.requests, summary.bytes, summary.duration,
    latency:percentile(50), latency:percentile(99),
    e.connect + e.read + e.write + e.timeout, e.status))
end
"#;

/// Runs wrk against `url`, measuring `server`'s CPU alongside.
fn wrk(args: &Args, dir: &Path, url: &str, connections: u32, server: u32) -> Result<Load> {
    let script = dir.join("report.lua");
    std::fs::write(&script, WRK_SCRIPT)?;
    let threads = args.wrk_threads.min(connections).max(1);
    let mut command = pinned(&args.wrk, args.pin_load.as_deref());
    command
        .arg(format!("-t{threads}"))
        .arg(format!("-c{connections}"))
        .arg(format!("-d{}s", args.duration))
        .args(["--timeout", "30s", "-s"])
        .arg(&script)
        .arg(url)
        .stdin(Stdio::null());
    let (busy0, total0) = machine_cpu();
    let cpu0 = cpu_seconds(server);
    let started = Instant::now();
    let output = command.output().map_err(|e| format!("running wrk: {e}"))?;
    let wall = started.elapsed().as_secs_f64();
    let cpu1 = cpu_seconds(server);
    let (busy1, total1) = machine_cpu();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let line = stdout
        .lines()
        .find_map(|l| l.strip_prefix("WRKRESULT "))
        .ok_or_else(|| {
            format!(
                "wrk printed no result: {stdout}{}",
                String::from_utf8_lossy(&output.stderr)
            )
        })?;
    let n: Vec<u64> = line
        .split_whitespace()
        .filter_map(|v| v.parse().ok())
        .collect();
    if n.len() != 7 {
        return Err(format!("unexpected wrk result {line:?}").into());
    }
    let cores = |busy: u64, total: u64| {
        // jiffies of all CPUs over the wall time: how many cores were busy on average
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
        busy as f64 / total.max(1) as f64 * cpus
    };
    Ok(Load {
        requests: n[0],
        bytes: n[1],
        seconds: n[2] as f64 / 1e6,
        p50_ms: n[3] as f64 / 1e3,
        p99_ms: n[4] as f64 / 1e3,
        errors: n[5],
        non_2xx: n[6],
        server_cores: (cpu1 - cpu0) / wall,
        machine_cores: cores(busy1 - busy0, total1 - total0),
    })
}

fn load_row(what: &str, load: &Load, rss_mb: Option<f64>, extra: &str) {
    println!(
        "{:<30} {:>9.1} {:>8.2} {:>8.2} {:>9.0} {:>7.2} {:>10.0} {:>8.2} {:>7} {:>9} {}",
        what,
        load.rps(),
        load.p50_ms,
        load.p99_ms,
        load.mb_s(),
        load.server_cores,
        load.rps() / load.server_cores.max(1e-9),
        load.machine_cores,
        load.errors + load.non_2xx,
        rss_mb.map_or("-".to_owned(), |mb| format!("{mb:.1}")),
        extra
    );
}

fn load_header() {
    println!(
        "{:<30} {:>9} {:>8} {:>8} {:>9} {:>7} {:>10} {:>8} {:>7} {:>9}",
        "server",
        "req/s",
        "p50 ms",
        "p99 ms",
        "MB/s",
        "srv cpu",
        "req/srv-s",
        "all cpu",
        "errors",
        "peak MiB"
    );
}

fn temp_dir() -> Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("pdbmux-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

fn verdict(ok: bool) -> &'static str {
    if ok {
        "met"
    } else {
        "NOT met"
    }
}

/// Figure 2: requests/s at 1 and 2 worker threads, cache off.
fn worker_threads(args: &Args, dir: &Path) -> Result<()> {
    let spec = SyntheticEstate {
        backends: 2,
        nodes_per_backend: args.merge_nodes,
        overlap: args.merge_overlap,
        facts_per_node: args.facts,
    };
    let (_a, addr_a) = start_fakepdb(args, 0, &spec)?;
    let (_b, addr_b) = start_fakepdb(args, 1, &spec)?;
    let upstream_bytes = spec.facts_body(0).len() + spec.facts_body(1).len();
    println!();
    println!(
        "== requests/s by worker threads (issue 3): GET {FACTS}, cache off (PDBMUX_FACTS_TTL=0s), probes off =="
    );
    println!(
        "backends: 2 fakepdb, {} fact records each ({:.2} MB upstream per request); wrk -t{} -c{} -d{}s{}{}",
        spec.nodes_per_backend * spec.facts_per_node,
        upstream_bytes as f64 / 1e6,
        args.wrk_threads.min(args.merge_connections),
        args.merge_connections,
        args.duration,
        args.pin_pdbmux.as_ref().map_or(String::new(), |c| format!("; pdbmux on cpus {c}")),
        args.pin_load.as_ref().map_or(String::new(), |c| format!("; wrk+fakepdb on cpus {c}")),
    );
    load_header();
    let mut results = Vec::new();
    for workers in [1u32, 2] {
        let log = dir.join(format!("pdbmux-workers{workers}.log"));
        let setup = Setup {
            facts_ttl: "0s",
            workers: Some(workers),
            metrics: false,
            quiet: false,
            redis: None,
        };
        let (pdbmux, addr, _) = start_pdbmux(args, &[addr_a, addr_b], setup, &log)?;
        let (status, head, body) = get(addr, FACTS)?;
        let records = serde_json::from_slice::<Vec<&serde_json::value::RawValue>>(&body)
            .map(|v| v.len())
            .unwrap_or(0);
        if status != 200 || records != spec.merged_records() {
            return Err(format!(
                "warm-up: status {status}, {records} records (expected {}); {head}",
                spec.merged_records()
            )
            .into());
        }
        let seen = tokio_workers(pdbmux.pid());
        let load = wrk(
            args,
            dir,
            &format!("http://{addr}{FACTS}"),
            args.merge_connections,
            pdbmux.pid(),
        )?;
        let rss = peak_rss_mib(pdbmux.pid());
        load_row(
            &format!("pdbmux TOKIO_WORKER_THREADS={workers}"),
            &load,
            rss,
            &format!(
                "({seen} tokio workers seen; merged body {:.2} MB)",
                body.len() as f64 / 1e6
            ),
        );
        if seen != workers as usize {
            println!("  warning: expected {workers} tokio worker threads, saw {seen}");
        }
        results.push((workers, load, rss));
        drop(pdbmux);
    }
    let (one, two) = (&results[0].1, &results[1].1);
    let ratio = two.rps() / one.rps().max(1e-9);
    let per_core = |l: &Load| l.rps() / l.server_cores.max(1e-9);
    println!(
        "2 workers / 1 worker: {ratio:.2}x req/s; pdbmux used {:.2} vs {:.2} cores; req/s per pdbmux core {:.1} vs {:.1} ({:.2}x)",
        two.server_cores,
        one.server_cores,
        per_core(two),
        per_core(one),
        per_core(two) / per_core(one).max(1e-9)
    );
    println!(
        "SUMMARY\t2 workers\treq/s, 2 workers: {:.1} (p50 {:.1} / p99 {:.1} ms)\t1 worker: {:.1} (p50 {:.1} / p99 {:.1} ms)\t{:.2}x\t>= 1.8x\t{}",
        two.rps(), two.p50_ms, two.p99_ms, one.rps(), one.p50_ms, one.p99_ms, ratio, verdict(ratio >= 1.8)
    );
    println!(
        "SUMMARY\t2 workers\treq/s per pdbmux CPU-second, 2 workers: {:.1} ({:.2} cores)\t1 worker: {:.1} ({:.2} cores)\t{:.2}x\t(info)\t-",
        per_core(two), two.server_cores, per_core(one), one.server_cores, per_core(two) / per_core(one).max(1e-9)
    );
    for (workers, _, rss) in &results {
        println!(
            "SUMMARY\t2 workers\tpdbmux peak RSS, {workers} worker(s): {}\t-\t-\t(info)\t-",
            rss.map_or("-".to_owned(), |mb| format!("{mb:.1} MiB"))
        );
    }
    Ok(())
}

/// Figure 3: cache hits against nginx serving the same bytes.
fn cache_hits(args: &Args, dir: &Path) -> Result<()> {
    // Size the estate so that the merged body is about `cache_bytes`.
    let probe = SyntheticEstate {
        backends: 2,
        nodes_per_backend: 10,
        overlap: 0,
        facts_per_node: args.facts,
    };
    let per_node = probe.facts_body(0).len() as f64 / 10.0;
    let total_nodes = (args.cache_bytes as f64 / per_node).round().max(2.0) as usize;
    let overlap = total_nodes / 5;
    let spec = SyntheticEstate {
        backends: 2,
        nodes_per_backend: (total_nodes + overlap).div_ceil(2),
        overlap,
        facts_per_node: args.facts,
    };
    let (_a, addr_a) = start_fakepdb(args, 0, &spec)?;
    let (_b, addr_b) = start_fakepdb(args, 1, &spec)?;
    let log = dir.join("pdbmux-cache.log");
    let setup = Setup {
        facts_ttl: "30s",
        workers: None,
        metrics: false,
        quiet: false,
        redis: None,
    };
    let (pdbmux, addr, _) = start_pdbmux(args, &[addr_a, addr_b], setup, &log)?;
    let (status, head, body) = get(addr, FACTS)?;
    if status != 200 || header(&head, "x-cache") != Some("miss") {
        return Err(format!("cache warm-up: status {status}; {head}").into());
    }
    let (status, head, hit) = get(addr, FACTS)?;
    if status != 200 || header(&head, "x-cache") != Some("hit") || hit != body {
        return Err(format!(
            "cache check: status {status}, expected a hit with the same body; {head}"
        )
        .into());
    }

    // nginx: the same bytes at the same path, as a static file.
    let root = dir.join("html");
    std::fs::create_dir_all(root.join("pdb/query/v4"))?;
    std::fs::write(root.join("pdb/query/v4/facts"), &body)?;
    let nginx_port = free_port()?;
    let nginx_addr: SocketAddr = format!("127.0.0.1:{nginx_port}").parse()?;
    // A second server block without sendfile: a copy from user memory for every response, as
    // pdbmux writes bodies it has not sealed (under 256 KiB); an informative row only.
    let copy_addr: SocketAddr = format!("127.0.0.1:{}", free_port()?).parse()?;
    let conf = dir.join("nginx.conf");
    std::fs::write(
        &conf,
        format!(
            "worker_processes auto;\n\
             pid {dir}/nginx.pid;\n\
             error_log {dir}/nginx-error.log warn;\n\
             daemon off;\n\
             events {{ worker_connections 1024; }}\n\
             http {{\n\
               access_log {dir}/nginx-access.log;\n\
               sendfile on;\n\
               tcp_nopush on;\n\
               keepalive_requests 1000000;\n\
               types {{ }}\n\
               default_type \"application/json;charset=utf-8\";\n\
               client_body_temp_path {dir}/client_body;\n\
               proxy_temp_path {dir}/proxy;\n\
               server {{ listen {nginx_addr}; root {root}; }}\n\
               server {{ listen {copy_addr}; root {root}; sendfile off; }}\n\
             }}\n",
            dir = dir.display(),
            root = root.display(),
        ),
    )?;
    let mut command = pinned(&args.nginx, args.pin_pdbmux.as_deref());
    command
        .arg("-p")
        .arg(dir)
        .arg("-e")
        .arg(dir.join("nginx-error.log"))
        .arg("-c")
        .arg(&conf)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let nginx = Proc::new(
        "nginx",
        command
            .spawn()
            .map_err(|e| format!("starting nginx: {e}"))?,
    );
    wait_listening(nginx_addr, "nginx")?;
    for server in [nginx_addr, copy_addr] {
        wait_listening(server, "nginx")?;
        let (status, _, static_body) = get(server, FACTS)?;
        if status != 200 || static_body != body {
            return Err(format!(
                "nginx on {server} answered {status} with {} bytes",
                static_body.len()
            )
            .into());
        }
    }

    println!();
    println!(
        "== cache hits (issue 6): GET {FACTS}, merged body {} bytes ({:.2} MiB), wrk -t{} -c{} -d{}s ==",
        body.len(),
        body.len() as f64 / 1048576.0,
        args.wrk_threads.min(args.cache_connections),
        args.cache_connections,
        args.duration
    );
    println!("pdbmux: default worker threads, PDBMUX_FACTS_TTL=30s, entry warmed; nginx {}: worker_processes auto, sendfile on, same bytes as a static file", nginx_version(&args.nginx));
    println!(
        "{} rounds of one run each, in alternating order (the machine drifts); the figures are the medians",
        args.cache_rounds
    );
    load_header();
    let (mut hit_runs, mut static_runs) = (Vec::new(), Vec::new());
    let mut nginx_rss = None;
    let mut rss = None;
    for round in 1..=args.cache_rounds {
        for pdbmux_turn in [round % 2 == 1, round % 2 == 0] {
            if pdbmux_turn {
                // Warm right before: a run longer than the TTL (30 s) sees one refresh.
                let _ = get(addr, FACTS)?;
                let hits = wrk(
                    args,
                    dir,
                    &format!("http://{addr}{FACTS}"),
                    args.cache_connections,
                    pdbmux.pid(),
                )?;
                rss = peak_rss_mib(pdbmux.pid());
                let (_, head, _) = get(addr, FACTS)?;
                let note = if header(&head, "x-cache") == Some("hit") {
                    String::new()
                } else {
                    "(entry was no longer a hit at the end)".to_owned()
                };
                load_row(&format!("pdbmux (cache hit) #{round}"), &hits, rss, &note);
                hit_runs.push(hits);
            } else {
                let static_load = wrk(
                    args,
                    dir,
                    &format!("http://{nginx_addr}{FACTS}"),
                    args.cache_connections,
                    nginx.pid(),
                )?;
                nginx_rss = peak_rss_mib(nginx.pid());
                load_row(
                    &format!("nginx (static file) #{round}"),
                    &static_load,
                    nginx_rss,
                    "(peak RSS: master + workers, summed)",
                );
                static_runs.push(static_load);
            }
        }
    }
    let hits = median_run(&hit_runs);
    let static_load = median_run(&static_runs);
    load_row("pdbmux (cache hit), median", &hits, rss, "");
    load_row("nginx (static file), median", &static_load, nginx_rss, "");
    let copy_load = wrk(
        args,
        dir,
        &format!("http://{copy_addr}{FACTS}"),
        args.cache_connections,
        nginx.pid(),
    )?;
    load_row(
        "nginx, sendfile off (info)",
        &copy_load,
        None,
        "(reads the file into user memory and writes it, as pdbmux writes unsealed bodies)",
    );
    let ratio = hits.rps() / static_load.rps().max(1e-9);
    let rounds: Vec<String> = hit_runs
        .iter()
        .zip(&static_runs)
        .map(|(hit, file)| format!("{:.2}x", hit.rps() / file.rps().max(1e-9)))
        .collect();
    println!(
        "pdbmux / nginx: {ratio:.2}x req/s (medians); by round: {}",
        rounds.join(" ")
    );
    println!(
        "SUMMARY\t3 cache\thit req/s: {:.0} (p50 {:.2} / p99 {:.2} ms, {:.0} MB/s)\tnginx: {:.0} (p50 {:.2} / p99 {:.2} ms, {:.0} MB/s)\t{:.2}x\t>= nginx\t{}",
        hits.rps(), hits.p50_ms, hits.p99_ms, hits.mb_s(),
        static_load.rps(), static_load.p50_ms, static_load.p99_ms, static_load.mb_s(),
        ratio, verdict(ratio >= 1.0)
    );
    let per_core = |l: &Load| l.rps() / l.server_cores.max(1e-9);
    println!(
        "SUMMARY\t3 cache\thit req per pdbmux CPU-second: {:.0} ({:.2} cores)\tnginx: {:.0} ({:.2} cores)\t{:.2}x\t(info)\t-",
        per_core(&hits),
        hits.server_cores,
        per_core(&static_load),
        static_load.server_cores,
        per_core(&hits) / per_core(&static_load).max(1e-9)
    );
    println!(
        "SUMMARY\t3 cache\t(same hit run)\tnginx with sendfile off: {:.0} req/s, {:.0} per CPU-second\t{:.2}x\t(info)\t-",
        copy_load.rps(),
        per_core(&copy_load),
        hits.rps() / copy_load.rps().max(1e-9)
    );
    let mib = |rss: Option<f64>| rss.map_or("-".to_owned(), |mb| format!("{mb:.1} MiB"));
    println!(
        "SUMMARY\t3 cache\tpdbmux peak RSS: {}\tnginx: {}\t-\t(info)\t-",
        mib(rss),
        mib(nginx_rss)
    );
    drop(nginx);
    drop(pdbmux);
    Ok(())
}

fn nginx_version(nginx: &Path) -> String {
    Command::new(nginx)
        .arg("-v")
        .output()
        .ok()
        .map(|o| {
            String::from_utf8_lossy(&o.stderr)
                .trim()
                .replace("nginx version: ", "")
        })
        .unwrap_or_default()
}

/// Figure 5: the cost of pdbmux's own metrics on the hot path: merged and cache-hit req/s with
/// the metrics listener on against off, in alternating runs, medians compared.
fn metrics_overhead(args: &Args, dir: &Path) -> Result<()> {
    let merged = SyntheticEstate {
        backends: 2,
        nodes_per_backend: args.merge_nodes,
        overlap: args.merge_overlap,
        facts_per_node: args.facts,
    };
    // A small cached body: per-request work, not byte copying, dominates a hit.
    let small = SyntheticEstate {
        backends: 2,
        nodes_per_backend: 4,
        overlap: 1,
        facts_per_node: 10,
    };
    println!();
    println!(
        "== metrics on vs off (issue 17): GET {FACTS}, medians of {} alternating runs each; wrk -d{}s; probes off ==",
        args.cache_rounds, args.duration
    );
    load_header();
    let scenarios = [
        ("merged (cache off)", &merged, "0s", args.merge_connections),
        ("cache hit", &small, "30s", args.cache_connections),
    ];
    for (label, spec, facts_ttl, connections) in scenarios {
        let (_a, addr_a) = start_fakepdb(args, 0, spec)?;
        let (_b, addr_b) = start_fakepdb(args, 1, spec)?;
        let mut runs: [Vec<Load>; 2] = Default::default();
        for round in 0..args.cache_rounds {
            let order = if round % 2 == 0 {
                [false, true]
            } else {
                [true, false]
            };
            for metrics in order {
                let log = dir.join(format!("pdbmux-metrics-{metrics}-{round}.log"));
                // No access log: the figure is about the request path, not a log file's writes.
                let setup = Setup {
                    facts_ttl,
                    workers: None,
                    metrics,
                    quiet: true,
                    redis: None,
                };
                let (pdbmux, addr, scrape) = start_pdbmux(args, &[addr_a, addr_b], setup, &log)?;
                let (status, head, _) = get(addr, FACTS)?;
                if status != 200 {
                    return Err(format!("{label} warm-up: status {status}; {head}").into());
                }
                let url = format!("http://{addr}{FACTS}");
                let load = wrk(args, dir, &url, connections, pdbmux.pid())?;
                if let Some(scrape) = scrape {
                    // The metrics really were recorded: every request is counted.
                    let (status, _, body) = get(scrape, "/metrics")?;
                    let text = String::from_utf8_lossy(&body);
                    let counted = text
                        .lines()
                        .find(|l| {
                            l.starts_with("pdbmux_requests_total{route=\"query\",code=\"200\"}")
                        })
                        .and_then(|l| l.rsplit(' ').next())
                        .and_then(|v| v.parse::<f64>().ok())
                        .unwrap_or(0.0);
                    if status != 200 || counted < load.requests as f64 {
                        return Err(format!(
                            "{label}: the scrape counted {counted} requests, wrk made {}",
                            load.requests
                        )
                        .into());
                    }
                }
                runs[usize::from(metrics)].push(load);
                drop(pdbmux);
            }
        }
        let (off, on) = (median_run(&runs[0]), median_run(&runs[1]));
        // How far runs of one setting spread: the noise a difference has to stand out of.
        let spread = |runs: &[Load]| {
            let rates: Vec<f64> = runs.iter().map(Load::rps).collect();
            let (low, high) = rates
                .iter()
                .fold((f64::MAX, 0.0_f64), |(l, h), r| (l.min(*r), h.max(*r)));
            let each: Vec<String> = rates.iter().map(|r| format!("{r:.0}")).collect();
            format!(
                "runs {} (spread {:.1}%)",
                each.join(" "),
                (high / low.max(1e-9) - 1.0) * 100.0
            )
        };
        load_row(
            &format!("{label}, metrics off"),
            &off,
            None,
            &spread(&runs[0]),
        );
        load_row(
            &format!("{label}, metrics on"),
            &on,
            None,
            &spread(&runs[1]),
        );
        let change = (on.rps() / off.rps().max(1e-9) - 1.0) * 100.0;
        let per_cpu = |l: &Load| l.rps() / l.server_cores.max(1e-9);
        let cpu_change = (per_cpu(&on) / per_cpu(&off).max(1e-9) - 1.0) * 100.0;
        println!(
            "SUMMARY\tmetrics\t{label} req/s, metrics on: {:.1}\toff: {:.1}\t{change:+.1}%\twithin -2%\t{}",
            on.rps(),
            off.rps(),
            verdict(change >= -2.0)
        );
        println!(
            "SUMMARY\tmetrics\t{label} req/s per pdbmux CPU-second, on: {:.1}\toff: {:.1}\t{cpu_change:+.1}%\twithin -2%\t{}",
            per_cpu(&on),
            per_cpu(&off),
            verdict(cpu_change >= -2.0)
        );
    }
    Ok(())
}

/// How many `/facts` requests a fakepdb has answered.
fn facts_asked(backend: SocketAddr) -> Result<u64> {
    let (_, _, body) = get(backend, "/fakepdb/requests")?;
    let counts: serde_json::Value = serde_json::from_slice(&body)?;
    counts["facts"]
        .as_u64()
        .ok_or_else(|| "fakepdb /fakepdb/requests".into())
}

/// A `redis-server` on a free loopback port, in memory only; stopped on drop.
fn start_redis(args: &Args) -> Result<(Proc, SocketAddr)> {
    let addr: SocketAddr = format!("127.0.0.1:{}", free_port()?).parse()?;
    let mut command = pinned(&args.redis, args.pin_load.as_deref());
    command
        .args(["--bind", "127.0.0.1", "--port", &addr.port().to_string()])
        .args(["--save", "", "--appendonly", "no"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let child = command
        .spawn()
        .map_err(|e| format!("starting {}: {e}", args.redis.display()))?;
    let proc = Proc::new("redis-server", child);
    wait_listening(addr, "redis-server")?;
    Ok((proc, addr))
}

/// Figure 6: the shared cache. Upstream fan-outs per key per TTL with four replicas under a
/// steady Puppetboard-like load (eight clients asking five `/facts` questions round-robin over
/// the replicas), memory store against Redis store; then the latency of a hit another replica
/// stored (read from Redis) against a hit in the replica's own memory.
fn shared_cache(args: &Args, dir: &Path) -> Result<()> {
    const REPLICAS: usize = 4;
    const KEYS: usize = 5;
    const CLIENTS: usize = 8;
    let ttl = Duration::from_secs(2);
    let spec = SyntheticEstate {
        backends: 2,
        nodes_per_backend: 20,
        overlap: 5,
        facts_per_node: 20,
    };
    let (_a, addr_a) = start_fakepdb(args, 0, &spec)?;
    let (_b, addr_b) = start_fakepdb(args, 1, &spec)?;
    let (_redis, redis_addr) = start_redis(args)?;
    let redis_url = format!("redis://{redis_addr}");
    println!();
    println!(
        "== shared cache (issue 18): {REPLICAS} replicas, {CLIENTS} clients, {KEYS} /facts questions round-robin, facts_ttl {}s, {}s per store ==",
        ttl.as_secs(),
        args.duration
    );
    println!(
        "{:<8} {:>10} {:>10} {:>14} {:>22}",
        "store", "requests", "errors", "fan-outs", "fan-outs/key/TTL"
    );
    let mut per_key = Vec::new();
    for (store, prefix) in [("memory", None), ("redis", Some("bench-fanout:"))] {
        let mut replicas = Vec::new();
        for replica in 0..REPLICAS {
            let log = dir.join(format!("pdbmux-shared-{store}-{replica}.log"));
            let setup = Setup {
                facts_ttl: "2s",
                workers: None,
                metrics: false,
                quiet: true,
                redis: prefix.map(|prefix| (redis_url.as_str(), prefix)),
            };
            replicas.push(start_pdbmux(args, &[addr_a, addr_b], setup, &log)?);
        }
        let addrs: Vec<SocketAddr> = replicas.iter().map(|(_, addr, _)| *addr).collect();
        let before = facts_asked(addr_a)?;
        let started = Instant::now();
        let stop = started + Duration::from_secs(args.duration);
        let clients: Vec<_> = (0..CLIENTS)
            .map(|client| {
                let addrs = addrs.clone();
                std::thread::spawn(move || {
                    let (mut answered, mut errors, mut turn) = (0u64, 0u64, client);
                    while Instant::now() < stop {
                        let key = turn % KEYS;
                        let target =
                            format!("{FACTS}?query=%5B%22%3D%22%2C%22name%22%2C%22q{key}%22%5D");
                        match get(addrs[turn % REPLICAS], &target) {
                            Ok((200, _, _)) => answered += 1,
                            _ => errors += 1,
                        }
                        turn += 1;
                    }
                    (answered, errors)
                })
            })
            .collect();
        let (mut answered, mut errors) = (0, 0);
        for client in clients {
            let (a, e) = client.join().map_err(|_| "a client thread panicked")?;
            answered += a;
            errors += e;
        }
        let windows = started.elapsed().as_secs_f64() / ttl.as_secs_f64();
        let fan_outs = facts_asked(addr_a)? - before;
        let ratio = fan_outs as f64 / (KEYS as f64 * windows);
        println!("{store:<8} {answered:>10} {errors:>10} {fan_outs:>14} {ratio:>22.2}");
        per_key.push(ratio);
        drop(replicas);
    }

    // Hit latency: a key replica A fetched, asked on replica B (its first time: read from the
    // shared store), then on B again (from B's own memory).
    let prefix = "bench-latency:";
    let mut replicas = Vec::new();
    for replica in 0..2 {
        let log = dir.join(format!("pdbmux-shared-latency-{replica}.log"));
        let setup = Setup {
            facts_ttl: "30s",
            workers: None,
            metrics: false,
            quiet: true,
            redis: Some((redis_url.as_str(), prefix)),
        };
        replicas.push(start_pdbmux(args, &[addr_a, addr_b], setup, &log)?);
    }
    let (a, b) = (replicas[0].1, replicas[1].1);
    let (mut shared, mut local) = (Vec::new(), Vec::new());
    for n in 0..300 {
        let target = format!("{FACTS}?query=%5B%22%3D%22%2C%22name%22%2C%22lat{n}%22%5D");
        let (status, head, _) = get(a, &target)?;
        if status != 200 || header(&head, "x-cache") != Some("miss") {
            return Err(format!("shared-cache latency: replica A's miss: {head}").into());
        }
        for (times, what) in [(&mut shared, "shared"), (&mut local, "local")] {
            let started = Instant::now();
            let (status, head, _) = get(b, &target)?;
            times.push(started.elapsed().as_secs_f64() * 1e3);
            if status != 200 || header(&head, "x-cache") != Some("hit") {
                return Err(format!("shared-cache latency: a {what} hit on B: {head}").into());
            }
        }
    }
    let median = |times: &mut Vec<f64>| {
        times.sort_by(f64::total_cmp);
        times[times.len() / 2]
    };
    let p99 = |times: &Vec<f64>| times[times.len() * 99 / 100];
    let (shared_p50, local_p50) = (median(&mut shared), median(&mut local));
    println!(
        "hit latency on replica B, 300 keys: from Redis (A stored it) p50 {shared_p50:.3} ms p99 {:.3} ms; from B's memory p50 {local_p50:.3} ms p99 {:.3} ms (one connection per request)",
        p99(&shared),
        p99(&local)
    );
    println!(
        "SUMMARY\tshared\tfan-outs per key per TTL, 4 replicas, Redis: {:.2}\tmemory: {:.2}\t{:.2}x\tabout 1 (against about 4)\t{}",
        per_key[1],
        per_key[0],
        per_key[0] / per_key[1].max(1e-9),
        verdict(per_key[1] <= 1.5)
    );
    println!(
        "SUMMARY\tshared\thit p50, from Redis: {shared_p50:.3} ms\tfrom memory: {local_p50:.3} ms\t{:.2}x\t(info)\t-",
        shared_p50 / local_p50.max(1e-9)
    );
    Ok(())
}

fn main() -> Result<()> {
    let args = args()?;
    let dir = temp_dir()?;
    let result = (|| -> Result<()> {
        let only = args.only.as_deref();
        if only.is_none() || only == Some("workers") {
            worker_threads(&args, &dir)?;
        }
        if only.is_none() || only == Some("cache") {
            cache_hits(&args, &dir)?;
        }
        if only.is_none() || only == Some("metrics") {
            metrics_overhead(&args, &dir)?;
        }
        if only.is_none() || only == Some("shared") {
            shared_cache(&args, &dir)?;
        }
        Ok(())
    })();
    let _ = std::fs::remove_dir_all(&dir);
    result
}
