//! `merge-throughput`: the `/facts` merge through the core, against serde_json parsing the same
//! bytes, in one run (issue 3's first figure), plus the merge's scaling over threads in process.
//!
//! The merge is driven through the core's public API exactly as a runtime drives it: an `Estate`
//! whose membership map was answered by the two scripted backends, `admit` of
//! `GET /pdb/query/v4/facts` into an `Exchange`, the two scripted `/facts` bodies handed to
//! `handle_upstream_response`, until `ExchangeOutput::Respond`. That is planning, ownership
//! push-down, parsing and validating both bodies, per-record field extraction, ownership,
//! provenance records and serialisation of the merged body.
//!
//! The same merge streamed: the bodies held (`UpstreamBody::Held`) and handed in 64 KiB pieces
//! as the exchange and then its `MergeStream` ask for them, as a runtime reads a socket, the
//! answer's pieces taken as they are written (issue 32: the streamed merge's CPU per byte).
//!
//! Baselines, same bytes, same run: `serde_json::from_slice::<Vec<&RawValue>>` (the cheapest
//! full validation of an array) and `serde_json::from_slice::<serde_json::Value>` (a full parse
//! into a tree) of each body.

#![forbid(unsafe_code)]

use std::error::Error;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use http::StatusCode;
use pdbmux_bench::{best_of, mb_per_s, SyntheticEstate};
use pdbmux_core::config::{BackendConfig, BackendUrl, Config, TlsFiles};
use pdbmux_core::membership::MEMBERSHIP_QUERIES;
use pdbmux_core::{
    Admission, ClientRequest, ClockAnchor, Estate, EstateOutput, Exchange, ExchangeOutput,
    Response, ResponseBody, UpstreamBody, UpstreamId, UpstreamResponse, JSON_CONTENT_TYPE,
};
use serde_json::value::RawValue;

type Result<T> = std::result::Result<T, Box<dyn Error>>;

const FACTS: &str = "/pdb/query/v4/facts";
/// The pieces a streamed body is handed in: what a runtime reads from a socket at a time.
const PIECE: usize = 64 * 1024;

struct Args {
    nodes: usize,
    facts: usize,
    overlap: usize,
    runs: usize,
    scaling_secs: f64,
    /// Only run this many merges and print their time (for a profiler).
    merge_only: Option<usize>,
    /// Only run this many streamed merges and print their time (for a profiler).
    streamed_only: Option<usize>,
}

fn args() -> Result<Args> {
    let mut args = Args {
        nodes: 1000,
        facts: 100,
        overlap: 200,
        runs: 7,
        scaling_secs: 3.0,
        merge_only: None,
        streamed_only: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--nodes" => args.nodes = value.parse()?,
            "--facts" => args.facts = value.parse()?,
            "--overlap" => args.overlap = value.parse()?,
            "--runs" => args.runs = value.parse()?,
            "--scaling-secs" => args.scaling_secs = value.parse()?,
            "--merge-only" => args.merge_only = Some(value.parse()?),
            "--streamed-only" => args.streamed_only = Some(value.parse()?),
            _ => {
                return Err(format!(
                "unknown flag {flag}; flags: --nodes N --facts N --overlap N --runs N --scaling-secs S --merge-only N --streamed-only N"
            )
                .into())
            }
        }
    }
    Ok(args)
}

fn backend(name: &str, port: u16) -> BackendConfig {
    BackendConfig {
        name: name.to_owned(),
        url: BackendUrl {
            scheme: "http".to_owned(),
            host: "127.0.0.1".to_owned(),
            port: Some(port),
        },
        tls: TlsFiles::default(),
    }
}

/// An estate for two scripted backends, with its membership map answered (each backend's nodes
/// and producer times).
fn ready_estate(now: Instant, membership: &[(Bytes, Bytes)]) -> Result<Estate> {
    let mut config = Config::with_backends(vec![backend("pdb-a", 18001), backend("pdb-b", 18002)]);
    config.facts_ttl = Duration::ZERO;
    config.health_probe_enabled = false;
    config.freshness_ttl = Duration::from_secs(30);
    let mut estate = Estate::new(
        config,
        ClockAnchor {
            instant: now,
            wall: SystemTime::now(),
        },
    );
    let planned = pdbmux_core::plan(&ClientRequest::get(FACTS), estate.config());
    match estate.admit(now, planned) {
        Admission::Wait(_) => {}
        other => {
            return Err(format!("expected to wait for the membership map, got {other:?}").into())
        }
    }
    let mut resumed = false;
    let mut sends = Vec::new();
    while let Some(output) = estate.poll_output() {
        if let EstateOutput::Send(send) = output {
            sends.push(send);
        }
    }
    if sends.len() != membership.len() * MEMBERSHIP_QUERIES.len() {
        return Err(format!(
            "expected {} membership queries, got {}",
            membership.len() * MEMBERSHIP_QUERIES.len(),
            sends.len()
        )
        .into());
    }
    for send in sends {
        let (nodes, produced) = membership
            .get(send.backend.0)
            .ok_or("membership query to an unknown backend")?;
        let body = if send.path_and_query == MEMBERSHIP_QUERIES[0] {
            nodes.clone()
        } else {
            produced.clone()
        };
        estate.handle_upstream_response(
            now,
            send.id,
            UpstreamResponse::full(StatusCode::OK, JSON_CONTENT_TYPE, body),
        );
        while let Some(output) = estate.poll_output() {
            resumed |= matches!(output, EstateOutput::Resume { .. });
        }
    }
    if !resumed {
        return Err("the membership map did not resume the waiting request".into());
    }
    Ok(estate)
}

/// Admits one `/facts` request under `estate`'s lock, planned outside it as the driver does.
fn admit_facts(estate: &Mutex<Estate>, now: Instant) -> Result<Exchange> {
    let config = Arc::clone(estate.lock().map_err(|_| "estate lock poisoned")?.config());
    let planned = pdbmux_core::plan(&ClientRequest::get(FACTS), &config);
    let admission = estate
        .lock()
        .map_err(|_| "estate lock poisoned")?
        .admit(now, planned);
    match admission {
        Admission::Exchange(exchange) => Ok(exchange),
        admission => Err(format!("expected an exchange, got {admission:?}").into()),
    }
}

/// Drives one `/facts` exchange (admitted under `estate`'s lock) to its response.
fn merge_once(estate: &Mutex<Estate>, now: Instant, facts: &[Bytes]) -> Result<Response> {
    let mut exchange = admit_facts(estate, now)?;
    let mut sends = Vec::new();
    while let Some(output) = exchange.poll_output() {
        match output {
            ExchangeOutput::Send(send) => sends.push(send),
            ExchangeOutput::Respond(response) => return Ok(response),
            // Bodies are handed whole (`UpstreamResponse::full`): nothing is held to read.
            ExchangeOutput::Cancel(_) | ExchangeOutput::Read(_) => {}
        }
    }
    for send in sends {
        let body = facts
            .get(send.backend.0)
            .ok_or("facts query to an unknown backend")?
            .clone();
        exchange.handle_upstream_response(
            now,
            send.id,
            UpstreamResponse::full(StatusCode::OK, JSON_CONTENT_TYPE, body),
        );
    }
    while let Some(output) = exchange.poll_output() {
        if let ExchangeOutput::Respond(response) = output {
            return Ok(response);
        }
    }
    Err("the exchange did not respond".into())
}

/// One held body being handed over in pieces.
struct HeldBody {
    id: UpstreamId,
    body: Bytes,
    offset: usize,
    ended: bool,
}

impl HeldBody {
    /// The next piece, or `None` at the body's end.
    fn next_piece(&mut self) -> Option<Bytes> {
        let end = (self.offset + PIECE).min(self.body.len());
        let piece = (end > self.offset).then(|| self.body.slice(self.offset..end));
        self.offset = end;
        piece
    }
}

/// Drives one `/facts` exchange with held bodies, read in pieces as the exchange and then its
/// streamed merge ask, to the answer's end, handing each piece of the answer to `sink`.
fn merge_streamed_once(
    estate: &Mutex<Estate>,
    now: Instant,
    facts: &[Bytes],
    sink: &mut dyn FnMut(&[u8]),
) -> Result<()> {
    let mut exchange = admit_facts(estate, now)?;
    let mut held = Vec::new();
    while let Some(output) = exchange.poll_output() {
        if let ExchangeOutput::Send(send) = output {
            let body = facts
                .get(send.backend.0)
                .ok_or("facts query to an unknown backend")?
                .clone();
            held.push(HeldBody {
                id: send.id,
                body,
                offset: 0,
                ended: false,
            });
        }
    }
    let mut response = None;
    for body in &held {
        let mut head = UpstreamResponse::full(StatusCode::OK, JSON_CONTENT_TYPE, Bytes::new());
        head.body = UpstreamBody::Held;
        exchange.handle_upstream_response(now, body.id, head);
    }
    while response.is_none() {
        let Some(output) = exchange.poll_output() else {
            return Err("the exchange stopped before it responded".into());
        };
        match output {
            ExchangeOutput::Read(id) => {
                let body = held
                    .iter_mut()
                    .find(|b| b.id == id)
                    .ok_or("read of an unknown body")?;
                match body.next_piece() {
                    Some(piece) => exchange.handle_upstream_piece(now, id, piece),
                    None => exchange.handle_upstream_end(now, id),
                }
            }
            ExchangeOutput::Respond(answer) => response = Some(answer),
            ExchangeOutput::Send(_) | ExchangeOutput::Cancel(_) => {}
        }
    }
    if !matches!(response.map(|r| r.body), Some(ResponseBody::Merged)) {
        return Err("the exchange merged whole instead of streaming".into());
    }
    let mut stream = exchange.take_stream().ok_or("no streamed merge")?;
    let broken = |e| format!("the streamed merge broke: {e:?}");
    let inputs: Vec<(usize, UpstreamId)> = stream.bodies().to_vec();
    while !stream.is_finished() {
        // As the driver does: a piece read before the merge streamed while the merge wants one,
        // else the next piece of each body it wants.
        if let Some(merged) = stream.merge_read_ahead() {
            merged.map_err(broken)?;
            sink(&stream.take().map_err(broken)?);
            continue;
        }
        for &(input, id) in &inputs {
            if !stream.wants(input) {
                continue;
            }
            let body = held
                .iter_mut()
                .find(|b| b.id == id)
                .ok_or("an unknown body to stream")?;
            match body.next_piece() {
                Some(piece) => stream.push(input, &piece).map_err(broken)?,
                None if !body.ended => {
                    stream.end(input).map_err(broken)?;
                    body.ended = true;
                }
                None => {}
            }
            sink(&stream.take().map_err(broken)?);
        }
    }
    sink(&stream.take().map_err(broken)?);
    Ok(())
}

/// CPU time (user + system) this process has used, in seconds (from /proc/self/stat).
fn process_cpu_seconds() -> f64 {
    let ticks: f64 = std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok()?.trim().parse().ok())
        .unwrap_or(100.0);
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let rest = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<u64> = rest
        .split_whitespace()
        .skip(11)
        .take(2)
        .filter_map(|v| v.parse().ok())
        .collect();
    fields.iter().sum::<u64>() as f64 / ticks
}

fn main() -> Result<()> {
    let args = args()?;
    let spec = SyntheticEstate {
        backends: 2,
        nodes_per_backend: args.nodes,
        overlap: args.overlap,
        facts_per_node: args.facts,
    };
    let facts: Vec<Bytes> = (0..2).map(|b| Bytes::from(spec.facts_body(b))).collect();
    let membership: Vec<(Bytes, Bytes)> = (0..2)
        .map(|b| {
            (
                Bytes::from(spec.membership_body(b)),
                Bytes::from(spec.produced_body(b)),
            )
        })
        .collect();
    let input_bytes: usize = facts.iter().map(Bytes::len).sum();
    let input_records = 2 * args.nodes * args.facts;

    let now = Instant::now();
    let estate = Mutex::new(ready_estate(now, &membership)?);

    // Check the answer once, outside any timing.
    let response = merge_once(&estate, now, &facts)?;
    let body = response
        .full_body()
        .ok_or("the merge streamed instead of merging")?;
    if response.status != StatusCode::OK {
        return Err(format!(
            "merge answered {}: {}",
            response.status,
            String::from_utf8_lossy(body)
        )
        .into());
    }
    let merged: Vec<&RawValue> = serde_json::from_slice(body)?;
    if merged.len() != spec.merged_records() {
        return Err(format!(
            "merged {} records, expected {}",
            merged.len(),
            spec.merged_records()
        )
        .into());
    }
    let mut streamed = Vec::new();
    merge_streamed_once(&estate, now, &facts, &mut |piece| {
        streamed.extend_from_slice(piece)
    })?;
    let streamed_records = serde_json::from_slice::<Vec<&RawValue>>(&streamed)?.len();
    if (streamed.len(), streamed_records) != (body.len(), merged.len()) {
        return Err(format!(
            "streamed {} records in {} bytes, buffered {} in {}",
            streamed_records,
            streamed.len(),
            merged.len(),
            body.len()
        )
        .into());
    }
    drop(streamed);
    let output_bytes = body.len();
    let backends_header = response
        .headers
        .get("x-backends")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("-")
        .to_owned();
    drop(merged);

    if let Some(merges) = args.merge_only.or(args.streamed_only) {
        let started = Instant::now();
        for _ in 0..merges {
            match args.streamed_only {
                Some(_) => merge_streamed_once(&estate, now, &facts, &mut |_| {})?,
                None => drop(merge_once(&estate, now, &facts)?),
            }
        }
        let each = started.elapsed() / merges.max(1) as u32;
        println!(
            "{merges} merges of {:.1} MB: {:.1} ms each, {:.0} MB/s",
            input_bytes as f64 / 1e6,
            each.as_secs_f64() * 1e3,
            mb_per_s(input_bytes, each)
        );
        return Ok(());
    }

    println!("== merge throughput (issue 3): GET /pdb/query/v4/facts, 2 backends, in process ==");
    println!(
        "input: 2 bodies, {input_records} records, {:.1} MB ({} nodes/backend, {} shared, {} facts/node); \
         merged: {} records, {:.1} MB, X-Backends {backends_header}",
        input_bytes as f64 / 1e6,
        args.nodes,
        args.overlap,
        args.facts,
        spec.merged_records(),
        output_bytes as f64 / 1e6,
    );
    println!(
        "best of {} runs each, release build; MB/s = input MB (both bodies) / time",
        args.runs
    );

    // Interleave the three so that drifting background load hits each alike.
    let mut merge_best = Duration::MAX;
    let mut streamed_best = Duration::MAX;
    let mut raw_best = Duration::MAX;
    let mut value_best = Duration::MAX;
    for _ in 0..args.runs {
        let (t, response) = best_of(1, || merge_once(&estate, now, &facts));
        let response = response?;
        if response.status != StatusCode::OK {
            return Err(format!("merge answered {}", response.status).into());
        }
        merge_best = merge_best.min(t);
        let mut written = 0;
        let (t, streamed) = best_of(1, || {
            merge_streamed_once(&estate, now, &facts, &mut |piece| written += piece.len())
        });
        streamed?;
        if written != output_bytes {
            return Err(format!("streamed {written} bytes, buffered {output_bytes}").into());
        }
        streamed_best = streamed_best.min(t);
        let (t, parsed) = best_of(1, || {
            facts
                .iter()
                .map(|body| serde_json::from_slice::<Vec<&RawValue>>(body).map(|v| v.len()))
                .sum::<std::result::Result<usize, _>>()
        });
        if parsed? != input_records {
            return Err("RawValue parse miscounted".into());
        }
        raw_best = raw_best.min(t);
        let (t, parsed) = best_of(1, || {
            facts
                .iter()
                .map(|body| {
                    serde_json::from_slice::<serde_json::Value>(body)
                        .map(|v| v.as_array().map_or(0, Vec::len))
                })
                .sum::<std::result::Result<usize, _>>()
        });
        if parsed? != input_records {
            return Err("Value parse miscounted".into());
        }
        value_best = value_best.min(t);
    }
    let rows = [
        ("pdbmux /facts merge (Exchange)", merge_best),
        ("the same merge, streamed", streamed_best),
        ("serde_json -> Vec<&RawValue>", raw_best),
        ("serde_json -> Value", value_best),
    ];
    println!(
        "{:<34} {:>10} {:>9} {:>14}",
        "what", "best ms", "MB/s", "merge / this"
    );
    for (what, t) in rows {
        println!(
            "{:<34} {:>10.1} {:>9.0} {:>14.2}",
            what,
            t.as_secs_f64() * 1e3,
            mb_per_s(input_bytes, t),
            merge_best.as_secs_f64() / t.as_secs_f64(),
        );
    }
    let vs_raw = merge_best.as_secs_f64() / raw_best.as_secs_f64();
    let vs_value = merge_best.as_secs_f64() / value_best.as_secs_f64();

    // Scaling: threads merging at once, admitted through one shared estate behind a lock, as the
    // tokio runtime does.
    let estate = Arc::new(estate);
    let facts = Arc::new(facts);
    let mut rates = Vec::new();
    for threads in [1usize, 2] {
        let deadline = Instant::now() + Duration::from_secs_f64(args.scaling_secs);
        let cpu_before = process_cpu_seconds();
        let started = Instant::now();
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                let estate = Arc::clone(&estate);
                let facts = Arc::clone(&facts);
                std::thread::spawn(move || -> std::result::Result<usize, String> {
                    let mut done = 0;
                    while Instant::now() < deadline {
                        merge_once(&estate, now, &facts).map_err(|e| e.to_string())?;
                        done += 1;
                    }
                    Ok(done)
                })
            })
            .collect();
        let mut merges = 0;
        for handle in handles {
            merges += handle.join().map_err(|_| "merge thread panicked")??;
        }
        let wall = started.elapsed().as_secs_f64();
        let cpu = process_cpu_seconds() - cpu_before;
        let rate = merges as f64 / wall;
        rates.push((threads, rate, cpu / wall, merges as f64 / cpu.max(1e-9)));
    }
    println!();
    println!(
        "in-process merge scaling ({:.0} s per row; threads share one Estate behind a Mutex):",
        args.scaling_secs
    );
    println!(
        "{:<10} {:>12} {:>9} {:>10} {:>16}",
        "threads", "merges/s", "MB/s", "cpu used", "merges/cpu-sec"
    );
    for (threads, rate, cores, per_cpu) in &rates {
        println!(
            "{:<10} {:>12.2} {:>9.0} {:>10.2} {:>16.2}",
            threads,
            rate,
            rate * input_bytes as f64 / 1e6,
            cores,
            per_cpu
        );
    }
    let scaling = rates[1].1 / rates[0].1;
    println!(
        "2 threads / 1 thread: {scaling:.2}x merges/s; {:.2}x merges per CPU-second (1.00 = no contention between threads)",
        rates[1].3 / rates[0].3
    );

    let verdict = |ok: bool| if ok { "met" } else { "NOT met" };
    println!(
        "SUMMARY\t1 merge\t/facts merge 2x{}k records, {:.0} MB/s\tRawValue parse {:.0} MB/s\t{:.2}x\t<= 2x parse\t{}",
        input_records / 2000,
        mb_per_s(input_bytes, merge_best),
        mb_per_s(input_bytes, raw_best),
        vs_raw,
        verdict(vs_raw <= 2.0)
    );
    println!(
        "SUMMARY\t1 merge\t(same merge)\tValue parse {:.0} MB/s\t{:.2}x\t<= 2x parse\t{}",
        mb_per_s(input_bytes, value_best),
        vs_value,
        verdict(vs_value <= 2.0)
    );
    println!(
        "SUMMARY\t1 merge\tstreamed /facts merge {:.0} MB/s\tbuffered {:.0} MB/s\t{:.2}x\t(info)\t-",
        mb_per_s(input_bytes, streamed_best),
        mb_per_s(input_bytes, merge_best),
        streamed_best.as_secs_f64() / merge_best.as_secs_f64(),
    );
    println!(
        "SUMMARY\t1 merge\tin-process merges/s, 2 threads: {:.2} ({:.2} cores)\t1 thread: {:.2} ({:.2} cores)\t{:.2}x\t(info)\t-",
        rates[1].1, rates[1].2, rates[0].1, rates[0].2, scaling
    );
    Ok(())
}
