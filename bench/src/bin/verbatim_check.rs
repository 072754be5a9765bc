//! `verbatim-check`: what checking a streamed verbatim answer as JSON costs (issue 19), on a
//! large catalog: the driver's `CheckedStream` fed 16 KiB chunks, as both runtimes feed it,
//! against copying the same chunks (what streaming costs without the check) and against
//! serde_json validating the whole body at once (what a buffered answer's check costs).

#![forbid(unsafe_code)]

use std::error::Error;

use bytes::Bytes;
use pdbmux_bench::{best_of, mb_per_s};
use pdbmux_driver::CheckedStream;
use serde_json::value::RawValue;

/// The chunk size the runtimes read a streamed body in.
const CHUNK: usize = 16 * 1024;

/// A catalog as PuppetDB's `/pdb/query/v4/catalogs/<certname>` answers it, with `resources`
/// resources of a few parameters each, and the edges between them.
fn catalog(resources: usize) -> String {
    let resource = |i: usize| {
        format!(
            r##"{{"type":"File","title":"/etc/app/conf.d/{i}.conf","tags":["file","class","app::config","node"],"exported":false,"file":"/etc/puppetlabs/code/environments/production/modules/app/manifests/config.pp","line":{line},"parameters":{{"ensure":"file","owner":"root","group":"root","mode":"0644","content":"# managed by puppet\nsetting_{i} = value {i}\n","notify":"Service[app]"}}}}"##,
            line = 10 + i % 300
        )
    };
    let edge = |i: usize| {
        format!(
            r#"{{"source_type":"Class","source_title":"App::Config","target_type":"File","target_title":"/etc/app/conf.d/{i}.conf","relationship":"contains"}}"#
        )
    };
    let resources: Vec<String> = (0..resources).map(resource).collect();
    let edges: Vec<String> = (0..resources.len()).map(edge).collect();
    format!(
        r#"[{{"certname":"web1.example","version":"1733040000","transaction_uuid":"9d3c1f0e-2b7a-4c47-9a8e-1f2f3a4b5c6d","producer_timestamp":"2026-12-01T10:00:00.000Z","catalog_uuid":"5e2a9b1c-7d3f-4e8a-b6c0-112233445566","code_id":null,"producer":"puppet.example","environment":"production","hash":"c0ffee","resources":{{"href":"/pdb/query/v4/catalogs/web1.example/resources","data":[{}]}},"edges":{{"href":"/pdb/query/v4/catalogs/web1.example/edges","data":[{}]}}}}]"#,
        resources.join(","),
        edges.join(",")
    )
}

fn main() -> Result<(), Box<dyn Error>> {
    let resources = std::env::args()
        .nth(1)
        .map(|n| n.parse())
        .transpose()?
        .unwrap_or(20_000);
    let runs = 7;
    let body = catalog(resources);
    let chunks: Vec<Bytes> = body
        .as_bytes()
        .chunks(CHUNK)
        .map(Bytes::copy_from_slice)
        .collect();
    println!(
        "catalog of {resources} resources: {:.1} MB in {} chunks of {} KiB",
        body.len() as f64 / 1e6,
        chunks.len(),
        CHUNK / 1024
    );

    let (copied, sent) = best_of(runs, || {
        chunks
            .iter()
            .map(|chunk| Bytes::copy_from_slice(chunk).len())
            .sum::<usize>()
    });
    assert_eq!(sent, body.len());
    let (checked, sent) = best_of(runs, || {
        let mut check = CheckedStream::new();
        let mut sent = 0;
        for chunk in &chunks {
            sent += check
                .push(Bytes::copy_from_slice(chunk))
                .expect("the catalog is JSON")
                .map_or(0, |ready| ready.len());
        }
        sent + check
            .finish()
            .expect("the catalog is JSON")
            .map_or(0, |last| last.len())
    });
    assert_eq!(sent, body.len());
    let (whole, ()) = best_of(runs, || {
        serde_json::from_slice::<&RawValue>(body.as_bytes()).expect("the catalog is JSON");
    });

    let row = |name: &str, elapsed: std::time::Duration| {
        println!(
            "{name:<48} {:>8.2} ms {:>9.0} MB/s",
            elapsed.as_secs_f64() * 1e3,
            mb_per_s(body.len(), elapsed)
        );
    };
    row("copying the chunks (streaming, no check)", copied);
    row("CheckedStream over the chunks (streamed check)", checked);
    row("serde_json RawValue over the body (buffered check)", whole);
    println!(
        "streamed check: {:.1} ns per byte, {:.2}x serde_json's whole-body validation",
        checked.as_secs_f64() * 1e9 / body.len() as f64,
        checked.as_secs_f64() / whole.as_secs_f64()
    );
    Ok(())
}
