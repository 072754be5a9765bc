//! `scale`: one large merge through each pdbmux binary against two `fakepdb` backends, at growing
//! estate sizes: time to the first byte, total time, throughput, pdbmux's CPU time and peak resident memory, beside
//! the slower backend asked directly in the same run, and the merged answer's bytes sent from
//! memory by one fakepdb (`/fakepdb/bytes`): the floor of any merge's total, since the merged
//! answer is larger than either backend's (bench/README.md, figure 8).
//!
//! For each size: two fakepdb (a fifth of the nodes in both, `--facts` facts per node); then for
//! each binary a fresh process (cache off unless `--cache default`, health probes off, membership
//! map warmed by one request that asks for nothing else): each `--entities` entity unpaged, `/facts` ordered (certname first, and name first) and below an environment, `/nodes` ordered, `/events` projected
//! (`/environments/production/facts`: fakepdb ignores the constraint, so it is the whole `/facts`
//! merge with the parent check beside it), and `--concurrent` of the first entity's question
//! (or of the question `--concurrent-question` names, such as `facts ordered by name`) at once, each in a fresh process so its peak (`VmHWM`) is its own. The memory budgets are set
//! as `--budget` says: `off` (so large enough that the merge itself is measured) or `default`
//! (pdbmux's own, so the refusals show how the budget bounds memory). `--concurrent 0` skips the
//! concurrent run (with the budget off, eight merges of 100,000 nodes per backend need about
//! 30 GB).

#![forbid(unsafe_code)]

use std::error::Error;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use pdbmux_bench::procs::{free_port, start_fakepdb, wait_listening, Proc};
use pdbmux_bench::SyntheticEstate;

type Result<T> = std::result::Result<T, Box<dyn Error>>;

/// The ordered question: every fact in certname, then name order.
const ORDERED: &str =
    "/pdb/query/v4/facts?order_by=%5B%7B%22field%22%3A%22certname%22%7D%2C%7B%22field%22%3A%22name%22%7D%5D";

/// Every fact in name, then certname order: asked apart from the provenance records, which
/// are merged into it in their place (fakepdb sorts its answer so for this order).
const ORDERED_BY_NAME: &str =
    "/pdb/query/v4/facts?order_by=%5B%7B%22field%22%3A%22name%22%7D%2C%7B%22field%22%3A%22certname%22%7D%5D";

/// Every node by certname (fakepdb's node records come in certname order).
const NODES_ORDERED: &str = "/pdb/query/v4/nodes?order_by=%5B%7B%22field%22%3A%22certname%22%7D%5D";

/// A projection of history: each event's certname and time. fakepdb ignores the extract and
/// sends whole events, so the rows served are whole events less the fields a projection is
/// asked for beside its columns to tell copies apart: the merge does a projection's work on
/// each row, over longer rows.
const EVENTS_PROJECTED: &str =
    "/pdb/query/v4/events?query=%5B%22extract%22%2C%5B%22certname%22%2C%22timestamp%22%5D%5D";

/// The sub-route question: `/facts` below an environment, with its parent check.
const BELOW_AN_ENVIRONMENT: &str = "/pdb/query/v4/environments/production/facts";

/// One question asked of each binary: its name in the table, its target, and the target the
/// backends are asked directly for the baseline (the same but for a sub-route).
struct Question {
    name: String,
    target: String,
    direct: String,
}

impl Question {
    fn new(name: String, target: &str, direct: &str) -> Question {
        Question {
            name,
            target: target.to_owned(),
            direct: direct.to_owned(),
        }
    }
}

struct Args {
    sizes: Vec<usize>,
    entities: Vec<String>,
    facts: usize,
    concurrent: usize,
    /// The question asked `concurrent` times at once (its name in the table): the first when
    /// not given.
    concurrent_question: Option<String>,
    budget: String,
    /// `off`, or `default`: pdbmux's own TTLs, so each merge is a cached flight's.
    cache: String,
    binaries: Vec<PathBuf>,
    fakepdb: PathBuf,
}

fn parse_args() -> Result<Args> {
    let dir = std::env::current_exe()?
        .parent()
        .ok_or("no binary directory")?
        .to_path_buf();
    let mut args = Args {
        sizes: vec![5_000, 20_000, 50_000],
        entities: [
            "facts",
            "nodes",
            "fact-contents",
            "inventory",
            "resources",
            "events",
        ]
        .map(String::from)
        .to_vec(),
        facts: 40,
        concurrent: 8,
        concurrent_question: None,
        budget: "off".into(),
        cache: "off".into(),
        binaries: vec![dir.join("pdbmux"), dir.join("pdbmux-smol")],
        fakepdb: dir.join("fakepdb"),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--sizes" => {
                args.sizes = value
                    .split(',')
                    .map(str::parse)
                    .collect::<std::result::Result<_, _>>()?
            }
            "--facts" => args.facts = value.parse()?,
            "--entities" => args.entities = value.split(',').map(String::from).collect(),
            "--concurrent" => args.concurrent = value.parse()?,
            "--concurrent-question" => args.concurrent_question = Some(value),
            "--budget" if value == "off" || value == "default" => args.budget = value,
            "--cache" if value == "off" || value == "default" => args.cache = value,
            "--binaries" => args.binaries = value.split(',').map(PathBuf::from).collect(),
            "--fakepdb" => args.fakepdb = PathBuf::from(value),
            _ => return Err(format!("unknown flag {flag}; flags: --sizes 5000,20000,50000 --entities facts,nodes,fact-contents,inventory,resources,events --facts 40 --concurrent 8 --concurrent-question NAME --budget off|default --cache off|default --binaries PATH,PATH --fakepdb PATH").into()),
        }
    }
    Ok(args)
}

/// One answer as a client sees it.
struct Answer {
    status: u16,
    first_byte: Duration,
    total: Duration,
    bytes: usize,
}

/// A GET with `Connection: close`, timed to its first byte and to its end; the body is counted
/// and dropped as it arrives.
fn timed_get(addr: SocketAddr, target: &str) -> Result<Answer> {
    let started = Instant::now();
    let mut stream = TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(Duration::from_secs(300)))?;
    write!(
        stream,
        "GET {target} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut buf = vec![0; 256 * 1024];
    let mut first_byte = None;
    let mut head = Vec::new();
    let mut bytes = 0usize;
    loop {
        let read = stream.read(&mut buf)?;
        if read == 0 {
            break;
        }
        first_byte.get_or_insert_with(|| started.elapsed());
        if head.len() < 64 {
            head.extend_from_slice(&buf[..read.min(64)]);
        }
        bytes += read;
    }
    let total = started.elapsed();
    let status = String::from_utf8_lossy(&head)
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or("no status line")?;
    Ok(Answer {
        status,
        first_byte: first_byte.unwrap_or(total),
        total,
        bytes,
    })
}

/// The peak resident set of `pid` so far (`VmHWM`), in MiB.
fn peak_rss_mib(pid: u32) -> Result<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kib: f64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
        .ok_or("no VmHWM")?;
    Ok(kib / 1024.0)
}

/// The CPU time `pid`'s threads have run so far (the sum of each thread's
/// `/proc/<pid>/task/<tid>/schedstat`, in nanoseconds).
fn cpu_time(pid: u32) -> Result<Duration> {
    let mut nanos: u64 = 0;
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))? {
        let schedstat = std::fs::read_to_string(task?.path().join("schedstat"))?;
        nanos += schedstat
            .split_whitespace()
            .next()
            .and_then(|ran| ran.parse::<u64>().ok())
            .ok_or("no schedstat")?;
    }
    Ok(Duration::from_nanos(nanos))
}

/// Starts `binary` over `backends`, probes off, budgets and cache as `budget` and `cache` say, and
/// warms its membership map.
fn start_pdbmux(
    binary: &Path,
    backends: &[SocketAddr],
    (budget, cache): (&str, &str),
) -> Result<(Proc, SocketAddr)> {
    let addr: SocketAddr = format!("127.0.0.1:{}", free_port()?).parse()?;
    let list = backends
        .iter()
        .enumerate()
        .map(|(i, a)| format!("pdb-{}=http://{a}", (b'a' + i as u8) as char))
        .collect::<Vec<_>>()
        .join(",");
    let mut command = Command::new(binary);
    command
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("PDBMUX_LISTEN", addr.to_string())
        .env("PDBMUX_BACKENDS", list)
        .env("PDBMUX_METRICS_LISTEN", "")
        .env("PDBMUX_HEALTH_PROBE_ENABLED", "false")
        .env("PDBMUX_LOG_LEVEL", "warn")
        .env("PDBMUX_MAX_BODY_BYTES", (8u64 << 30).to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    if cache == "off" {
        for ttl in [
            "PDBMUX_FACTS_TTL",
            "PDBMUX_HISTORY_TTL",
            "PDBMUX_AGGREGATE_TTL",
        ] {
            command.env(ttl, "0");
        }
    }
    if budget == "off" {
        command
            .env("PDBMUX_MERGE_REQUEST_BYTES", (64u64 << 30).to_string())
            .env("PDBMUX_MERGE_MEMORY_BYTES", (64u64 << 30).to_string());
    }
    let proc = Proc::new("pdbmux", command.spawn()?);
    wait_listening(addr, "pdbmux")?;
    // A node's own route needs the map (its owner is asked) and costs nothing else: fakepdb
    // answers it 404. A page of `/nodes` would not do: fakepdb ignores the page and sends every
    // node, a merge a real PuppetDB never causes, which raised the peak before the measured one.
    let warm = timed_get(addr, "/pdb/query/v4/nodes/warm-up.invalid")?;
    if warm.status != 404 {
        return Err(format!("pdbmux answered the warm-up with {}", warm.status).into());
    }
    Ok((proc, addr))
}

/// How long `fakepdb` at `addr` takes to send `bytes` bytes from memory (`/fakepdb/bytes`), asked
/// twice and the second kept, as the backends are for their baseline: the floor of a merge's
/// total whose answer is that large.
fn from_memory(addr: SocketAddr, bytes: usize) -> Result<Duration> {
    let target = format!("/fakepdb/bytes?n={bytes}");
    timed_get(addr, &target)?;
    let answer = timed_get(addr, &target)?;
    if answer.status != 200 {
        return Err(format!("fakepdb answered {target} with {}", answer.status).into());
    }
    Ok(answer.total)
}

fn mb(bytes: usize) -> f64 {
    bytes as f64 / 1e6
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn main() -> Result<()> {
    let args = parse_args()?;
    println!(
        "| nodes per backend | backend bodies | binary | question | first byte | total | slower backend first byte / total | its bytes from memory | total / from memory | throughput | pdbmux CPU | merged MB per CPU-second | peak RSS | merged answer |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for &nodes in &args.sizes {
        let spec = SyntheticEstate {
            backends: 2,
            nodes_per_backend: nodes,
            overlap: nodes / 5,
            facts_per_node: args.facts,
        };
        let fakepdb = || {
            let mut command = Command::new(&args.fakepdb);
            command.args(["--entities", &args.entities.join(",")]);
            command
        };
        let (_a, a) = start_fakepdb(fakepdb(), 0, &spec)?;
        let (_b, b) = start_fakepdb(fakepdb(), 1, &spec)?;
        // Each question: the entity's unpaged answer, and facts ordered and below an environment.
        let mut questions: Vec<Question> = args
            .entities
            .iter()
            .map(|entity| {
                let target = format!("/pdb/query/v4/{entity}");
                Question::new(format!("{entity} unpaged"), &target, &target)
            })
            .collect();
        if args.entities.iter().any(|e| e == "nodes") {
            questions.push(Question::new(
                "nodes ordered".into(),
                NODES_ORDERED,
                NODES_ORDERED,
            ));
        }
        if args.entities.iter().any(|e| e == "events") {
            questions.push(Question::new(
                "events projected".into(),
                EVENTS_PROJECTED,
                EVENTS_PROJECTED,
            ));
        }
        if args.entities.iter().any(|e| e == "facts") {
            questions.push(Question::new("facts ordered".into(), ORDERED, ORDERED));
            questions.push(Question::new(
                "facts ordered by name".into(),
                ORDERED_BY_NAME,
                ORDERED_BY_NAME,
            ));
            // The backends serve no sub-route: asked directly, the entity's own route.
            questions.push(Question::new(
                "facts below an environment".into(),
                BELOW_AN_ENVIRONMENT,
                "/pdb/query/v4/facts",
            ));
        }
        // The backends alone, each asked twice (the first warms their sockets); the slower counts.
        let mut baselines = Vec::new();
        for Question { direct: target, .. } in &questions {
            let direct: Vec<Answer> = [a, b]
                .iter()
                .map(|&addr| {
                    timed_get(addr, target)?;
                    timed_get(addr, target)
                })
                .collect::<Result<_>>()?;
            let bodies = format!("{:.0} + {:.0} MB", mb(direct[0].bytes), mb(direct[1].bytes));
            let slower = direct
                .into_iter()
                .max_by_key(|answer| answer.total)
                .ok_or("no backend")?;
            baselines.push((bodies, slower));
        }
        // The merged answer's bytes sent from memory, by question: asked once its size is known.
        let mut floors: Vec<Option<Duration>> = vec![None; questions.len()];
        for binary in &args.binaries {
            let name = binary
                .file_name()
                .map_or("?".into(), |n| n.to_string_lossy().into_owned());
            for (
                (
                    Question {
                        name: question,
                        target,
                        ..
                    },
                    (bodies, slower),
                ),
                floor,
            ) in questions.iter().zip(&baselines).zip(&mut floors)
            {
                let (proc, addr) = start_pdbmux(binary, &[a, b], (&args.budget, &args.cache))?;
                let cpu_before = cpu_time(proc.pid())?;
                let answer = timed_get(addr, target)?;
                let cpu = cpu_time(proc.pid())?.saturating_sub(cpu_before);
                let peak = peak_rss_mib(proc.pid())?;
                // Taken from a whole merged answer only: a refusal's size says nothing.
                let floor = match floor {
                    Some(floor) => Some(*floor),
                    None if answer.status == 200 => {
                        Some(*floor.insert(from_memory(a, answer.bytes)?))
                    }
                    None => None,
                };
                let (floor_ms, times_floor) = match floor {
                    Some(floor) => (
                        format!("{:.0} ms", ms(floor)),
                        format!(
                            "{:.1}×",
                            answer.total.as_secs_f64() / floor.as_secs_f64().max(1e-9)
                        ),
                    ),
                    None => ("—".to_owned(), "—".to_owned()),
                };
                println!(
                    "| {nodes} | {bodies} | {name} | {question} ({}) | {:.0} ms | {:.0} ms | {:.0} / {:.0} ms | {floor_ms} | {times_floor} | {:.0} MB/s | {:.0} ms | {:.0} | {peak:.0} MiB | {:.0} MB |",
                    answer.status,
                    ms(answer.first_byte),
                    ms(answer.total),
                    ms(slower.first_byte),
                    ms(slower.total),
                    mb(answer.bytes) / answer.total.as_secs_f64(),
                    ms(cpu),
                    mb(answer.bytes) / cpu.as_secs_f64().max(1e-9),
                    mb(answer.bytes),
                );
            }
            if args.concurrent == 0 {
                continue;
            }
            let asked = match &args.concurrent_question {
                Some(wanted) => questions
                    .iter()
                    .position(|q| q.name == *wanted)
                    .ok_or_else(|| format!("no question named {wanted:?} at these entities"))?,
                None => 0,
            };
            let (proc, addr) = start_pdbmux(binary, &[a, b], (&args.budget, &args.cache))?;
            let started = Instant::now();
            let answers: Vec<Result<Answer>> = std::thread::scope(|scope| {
                let handles: Vec<_> = (0..args.concurrent)
                    .map(|_| {
                        let target = &questions[asked].target;
                        scope.spawn(move || timed_get(addr, target).map_err(|e| e.to_string()))
                    })
                    .collect();
                handles
                    .into_iter()
                    .map(|h| {
                        h.join()
                            .map_err(|_| "a client thread panicked".to_string())?
                            .map_err(Into::into)
                    })
                    .collect()
            });
            let took = started.elapsed();
            let peak = peak_rss_mib(proc.pid())?;
            let answers = answers.into_iter().collect::<Result<Vec<_>>>()?;
            let mut statuses = std::collections::BTreeMap::<u16, usize>::new();
            for answer in &answers {
                *statuses.entry(answer.status).or_default() += 1;
            }
            let statuses = statuses
                .iter()
                .map(|(status, count)| format!("{count} × {status}"))
                .collect::<Vec<_>>()
                .join(", ");
            let (bodies, slower) = &baselines[asked];
            println!(
                "| {nodes} | {bodies} | {name} | {} × {} at once ({statuses}) | — | {:.0} ms | {:.0} / {:.0} ms | — | — | — | — | — | {peak:.0} MiB | — |",
                args.concurrent,
                questions[asked].name,
                ms(took),
                ms(slower.first_byte),
                ms(slower.total),
            );
        }
    }
    Ok(())
}
