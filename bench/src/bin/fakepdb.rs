//! `fakepdb`: a fake PuppetDB for the load benchmarks. It serves one backend of a
//! [`SyntheticEstate`] from bytes rendered once at start:
//!
//! - `/pdb/query/v4/nodes`: the membership extract (certname, report time) for any query,
//!   but whole node records (PuppetDB's fields, the same report times) for a query that is not
//!   an `extract` when `--entities` names `nodes`;
//! - `/pdb/query/v4/facts` (any query, GET or POST): every fact record of the backend, by
//!   certname then name, or by name then certname when `order_by` orders by name first; for a
//!   query with an `extract`, each node and its environment (the provenance records' ask);
//! - `/pdb/query/v4/fact-contents`, `/pdb/query/v4/inventory`, `/pdb/query/v4/resources`,
//!   `/pdb/query/v4/events` (any query), when `--entities` names them (`facts` only by default: each is rendered at start
//!   and held in memory);
//! - `/pdb/query/v4/factsets` and `/pdb/query/v4/catalogs` (any query): the membership
//!   refresh's producer times (certname and each node's report time);
//! - `/pdb/query/v4/environments/<name>`: the environment's record, `{"name":"<name>"}` (the
//!   parent check of a sub-route), for any name;
//! - `/pdb/meta/v1/version` and `/status/v1/services`: small canned answers;
//! - `/fakepdb/requests`: how many `/facts` and `/nodes` requests it has answered, as
//!   `{"facts":N,"nodes":N}` (for benchmarks that count fan-outs);
//! - `/fakepdb/bytes?n=N`: N bytes of its `/facts` response (head and body), repeated as often
//!   as it takes, sent from memory as every other answer is: what any server holding an answer
//!   of N bytes ready takes to send it (`scale` asks it for the merged answer's size, the floor
//!   of a merge's total);
//! - anything else: 404.
//!
//! HTTP/1.1 with keep-alive, one thread per connection, loopback only. It ignores the query (a
//! real PuppetDB would apply pdbmux's ownership push-down and send fewer records; the merge then
//! drops the records of nodes the backend does not own, which is the merge's own safety net).
//! Prints `LISTEN <addr>` on stdout once it accepts connections.

#![forbid(unsafe_code)]

use std::error::Error;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use pdbmux_bench::SyntheticEstate;

/// The path below which an environment's record is asked: `/pdb/query/v4/environments/<name>`.
const ENVIRONMENT: &str = "/pdb/query/v4/environments/";

type Result<T> = std::result::Result<T, Box<dyn Error>>;

struct Canned {
    /// The membership extract.
    nodes: Vec<u8>,
    /// Whole node records, when `--entities` names `nodes`: the answer to a `/nodes` question
    /// that is not an extract.
    node_records: Option<Vec<u8>>,
    produced: Vec<u8>,
    facts: Vec<u8>,
    /// `/facts` ordered by name first.
    facts_by_name: Vec<u8>,
    /// `/facts` asked as an extract: each node and its environment (the provenance records' ask).
    fact_nodes: Vec<u8>,
    /// The other entities' answers, by path, as `--entities` asked.
    entities: Vec<(&'static str, Vec<u8>)>,
    version: Vec<u8>,
    status: Vec<u8>,
    not_found: Vec<u8>,
    facts_asked: AtomicU64,
    nodes_asked: AtomicU64,
}

fn response(status: &str, content_type: &str, body: &[u8]) -> Vec<u8> {
    let mut out = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(body);
    out
}

fn main() -> Result<()> {
    let mut listen = "127.0.0.1:0".to_owned();
    let mut backend = 0usize;
    let mut spec = SyntheticEstate {
        backends: 2,
        nodes_per_backend: 50,
        overlap: 10,
        facts_per_node: 100,
    };
    let mut entities: Vec<String> = vec!["facts".to_owned()];
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--listen" => listen = value,
            "--backend" => backend = value.parse()?,
            "--nodes" => spec.nodes_per_backend = value.parse()?,
            "--overlap" => spec.overlap = value.parse()?,
            "--facts" => spec.facts_per_node = value.parse()?,
            "--entities" => entities = value.split(',').map(str::to_owned).collect(),
            _ => return Err(format!("unknown flag {flag}; flags: --listen ADDR --backend N --nodes N --overlap N --facts N --entities facts,nodes,fact-contents,inventory,resources,events").into()),
        }
    }
    if !listen.starts_with("127.")
        && !listen.starts_with("[::1]")
        && !listen.starts_with("localhost")
    {
        return Err("fakepdb listens on loopback only".into());
    }
    let json = "application/json;charset=utf-8";
    let mut rendered = Vec::new();
    let mut node_records = None;
    for entity in &entities {
        let (path, body) = match entity.as_str() {
            "facts" => continue,
            "nodes" => {
                node_records = Some(response("200 OK", json, &spec.nodes_body(backend)));
                continue;
            }
            "fact-contents" => (
                "/pdb/query/v4/fact-contents",
                spec.fact_contents_body(backend),
            ),
            "inventory" => ("/pdb/query/v4/inventory", spec.inventory_body(backend)),
            "resources" => ("/pdb/query/v4/resources", spec.resources_body(backend)),
            "events" => ("/pdb/query/v4/events", spec.events_body(backend)),
            other => return Err(format!("fakepdb serves no entity {other:?}").into()),
        };
        rendered.push((path, response("200 OK", json, &body)));
    }
    let canned = Arc::new(Canned {
        nodes: response("200 OK", json, &spec.membership_body(backend)),
        node_records,
        produced: response("200 OK", json, &spec.produced_body(backend)),
        facts: response("200 OK", json, &spec.facts_body(backend)),
        facts_by_name: response("200 OK", json, &spec.facts_by_name_body(backend)),
        fact_nodes: response("200 OK", json, &spec.fact_nodes_body(backend)),
        entities: rendered,
        version: response("200 OK", json, br#"{"version":"7.12.1"}"#),
        status: response(
            "200 OK",
            json,
            br#"{"puppetdb-status":{"state":"running"}}"#,
        ),
        not_found: response("404 Not Found", "text/plain", b"not found\n"),
        facts_asked: AtomicU64::new(0),
        nodes_asked: AtomicU64::new(0),
    });
    let listener = TcpListener::bind(&listen)?;
    println!("LISTEN {}", listener.local_addr()?);
    std::io::stdout().flush()?;
    for stream in listener.incoming() {
        let Ok(stream) = stream else { continue };
        let canned = Arc::clone(&canned);
        std::thread::spawn(move || {
            let _ = serve(stream, &canned);
        });
    }
    Ok(())
}

/// Whether `target`'s `order_by` orders by name first.
fn ordered_by_name(target: &str) -> bool {
    let query = target.split_once('?').map_or("", |(_, query)| query);
    form_urlencoded::parse(query.as_bytes())
        .find(|(key, _)| key == "order_by")
        .and_then(|(_, order)| serde_json::from_str::<serde_json::Value>(&order).ok())
        .is_some_and(|order| order[0]["field"] == "name")
}

/// Answers `/fakepdb/bytes?n=N` (`target`): a body of N bytes of `source`, repeated as often as
/// it takes (what the bytes say does not matter: only how long they take); 400 without a number.
fn send_bytes(writer: &mut TcpStream, target: &str, source: &[u8]) -> std::io::Result<()> {
    let query = target.split_once('?').map_or("", |(_, query)| query);
    let asked = form_urlencoded::parse(query.as_bytes())
        .find(|(key, _)| key == "n")
        .and_then(|(_, n)| n.parse::<usize>().ok());
    let Some(mut left) = asked else {
        return writer.write_all(&response(
            "400 Bad Request",
            "text/plain",
            b"n: a number of bytes\n",
        ));
    };
    if source.is_empty() {
        return Err(std::io::Error::other("no answer to repeat"));
    }
    writer.write_all(
        format!(
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {left}\r\n\r\n"
        )
        .as_bytes(),
    )?;
    while left > 0 {
        let piece = &source[..left.min(source.len())];
        writer.write_all(piece)?;
        left -= piece.len();
    }
    Ok(())
}

/// Answers requests on one connection until the peer closes it.
fn serve(stream: TcpStream, canned: &Canned) -> std::io::Result<()> {
    stream.set_nodelay(true)?;
    let mut writer = stream.try_clone()?;
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    loop {
        line.clear();
        if reader.read_line(&mut line)? == 0 {
            return Ok(());
        }
        let target = line.split_whitespace().nth(1).unwrap_or("/").to_owned();
        let mut length = 0usize;
        let mut close = false;
        loop {
            line.clear();
            if reader.read_line(&mut line)? == 0 {
                return Ok(());
            }
            let header = line.trim_end();
            if header.is_empty() {
                break;
            }
            if let Some((name, value)) = header.split_once(':') {
                let value = value.trim();
                if name.eq_ignore_ascii_case("content-length") {
                    length = value.parse().unwrap_or(0);
                } else if name.eq_ignore_ascii_case("connection") {
                    close = value.eq_ignore_ascii_case("close");
                }
            }
        }
        if length > 0 {
            let mut body = vec![0; length];
            reader.read_exact(&mut body)?;
        }
        let path = target.split('?').next().unwrap_or("/");
        if path == "/fakepdb/bytes" {
            send_bytes(&mut writer, &target, &canned.facts)?;
            if close {
                return Ok(());
            }
            continue;
        }
        let counts;
        let environment;
        let answer = match path {
            "/pdb/query/v4/nodes" => {
                canned.nodes_asked.fetch_add(1, Ordering::Relaxed);
                match &canned.node_records {
                    Some(records) if !target.contains("extract") => records,
                    _ => &canned.nodes,
                }
            }
            "/pdb/query/v4/facts" => {
                canned.facts_asked.fetch_add(1, Ordering::Relaxed);
                if target.contains("extract") {
                    &canned.fact_nodes
                } else if ordered_by_name(&target) {
                    &canned.facts_by_name
                } else {
                    &canned.facts
                }
            }
            "/pdb/query/v4/factsets" | "/pdb/query/v4/catalogs" => &canned.produced,
            "/fakepdb/requests" => {
                let body = format!(
                    r#"{{"facts":{},"nodes":{}}}"#,
                    canned.facts_asked.load(Ordering::Relaxed),
                    canned.nodes_asked.load(Ordering::Relaxed)
                );
                counts = response("200 OK", "application/json", body.as_bytes());
                &counts
            }
            "/pdb/meta/v1/version" => &canned.version,
            other
                if other.starts_with(ENVIRONMENT) && !other[ENVIRONMENT.len()..].contains('/') =>
            {
                let name = serde_json::to_string(&other[ENVIRONMENT.len()..])?;
                environment = response(
                    "200 OK",
                    "application/json",
                    format!(r#"{{"name":{name}}}"#).as_bytes(),
                );
                &environment
            }
            "/status/v1/services" => &canned.status,
            other => canned
                .entities
                .iter()
                .find(|(path, _)| *path == other)
                .map_or(&canned.not_found, |(_, body)| body),
        };
        writer.write_all(answer)?;
        if close {
            return Ok(());
        }
    }
}
