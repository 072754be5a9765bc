//! Any backend answers to a merged question: the first byte picks one of the merged routes (low
//! four bits) and how many backends answer (two to four, the high bits); the rest, split at NUL
//! bytes, are the bodies the backends send (membership refreshes included), each a 200 JSON
//! answer. The record parser, the body validator and every merge run on them:
//! never a panic, and an answer always comes.

#![no_main]
#![forbid(unsafe_code)]

use libfuzzer_sys::fuzz_target;
use pdbmux_core::{
    Admission, ClientRequest, ClockAnchor, Estate, EstateOutput, Exchange, ExchangeOutput,
    UpstreamResponse,
};

const TARGETS: [&str; 14] = [
    "/pdb/query/v4/nodes",
    "/pdb/query/v4/facts",
    "/pdb/query/v4/fact-names",
    "/pdb/query/v4/resources",
    "/pdb/query/v4/reports?limit=2&order_by=%5B%7B%22field%22%3A%22end_time%22%7D%5D",
    "/pdb/query/v4/events?include_total=true",
    "/pdb/query/v4/event-counts?summarize_by=certname",
    "/pdb/query/v4/fact-contents",
    "/pdb/query/v4/catalogs",
    "/pdb/query/v4/nodes?query=%5B%22extract%22%2C%5B%5B%22function%22%2C%22count%22%5D%5D%5D",
    "/pdb/query/v4/packages",
    "/pdb/query/v4/inventory?limit=3&offset=1",
    "/pdb/query/v4/catalogs/web1.example",
    "/pdb/query/v4/facts?order_by=%5B%7B%22field%22%3A%22certname%22%7D%2C%7B%22field%22%3A%22value%22%2C%22order%22%3A%22desc%22%7D%5D",
];

/// `backends` backends, no cache (every question fans out).
fn config(backends: u16) -> pdbmux_core::config::Config {
    pdbmux_core::config::Config {
        facts_ttl: std::time::Duration::ZERO,
        ..pdbmux_fuzz::config(backends)
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&pick, rest)) = data.split_first() else {
        return;
    };
    let bodies: Vec<&[u8]> = rest.split(|b| *b == 0).collect();
    let mut turn = 0;
    let mut answer = || {
        let body = bodies[turn % bodies.len()].to_vec();
        turn += 1;
        UpstreamResponse::full(http::StatusCode::OK, "application/json", body)
    };
    let now = std::time::Instant::now();
    let clock = ClockAnchor {
        instant: now,
        wall: std::time::UNIX_EPOCH,
    };
    let mut estate = Estate::new(config(2 + u16::from(pick >> 4) % 3), clock);
    let target = TARGETS[usize::from(pick & 0x0f) % TARGETS.len()];
    let planned = pdbmux_core::plan(&ClientRequest::get(target), estate.config());
    let mut exchange: Option<Exchange> = None;
    let take = |admission: Admission, exchange: &mut Option<Exchange>| match admission {
        Admission::Exchange(e) | Admission::Flight { exchange: e, .. } => *exchange = Some(e),
        Admission::Translate { exchange: e, .. } => *exchange = Some(e),
        Admission::Wait(_) | Admission::Respond(_) => {}
    };
    take(estate.admit(now, planned), &mut exchange);
    for _ in 0..64 {
        while let Some(output) = estate.poll_output() {
            match output {
                EstateOutput::Send(request) => {
                    estate.handle_upstream_response(now, request.id, answer())
                }
                EstateOutput::Resume { planned, .. } => {
                    take(estate.readmit(now, *planned), &mut exchange)
                }
                EstateOutput::Respond { .. } => return,
                _ => {}
            }
        }
        let Some(running) = exchange.as_mut() else {
            continue;
        };
        let mut sends = Vec::new();
        while let Some(output) = running.poll_output() {
            match output {
                ExchangeOutput::Send(request) => sends.push(request.id),
                ExchangeOutput::Respond(_) => return,
                // Every answer here is whole (`UpstreamResponse::full`): nothing is held to read.
                ExchangeOutput::Cancel(_) | ExchangeOutput::Read(_) => {}
            }
        }
        for id in sends {
            running.handle_upstream_response(now, id, answer());
        }
    }
    panic!("no answer after 64 rounds for {target}");
});
