//! `replay_backend`: a record-and-replay stand-in for one PuppetDB, for `runtime-smol/compare.sh`.
//!
//! The first request for a given method, target and body goes to the real PuppetDB (as HTTP/1.0,
//! so its answer is close-delimited); the status, `Content-Type`, `X-Records` and body are kept
//! and replayed, with a `Content-Length`, to every later identical request. Behind it the
//! runtimes' requests/s measure pdbmux itself rather than the PuppetDB it fronts.
//!
//! Usage: `replay_backend <listen addr> <puppetdb host:port>`; prints `LISTEN <addr>` once it
//! accepts connections. HTTP/1.1 keep-alive, one thread per connection, plain http only.

#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::thread;

type Cache = Arc<Mutex<HashMap<String, Arc<Vec<u8>>>>>;

fn main() -> io::Result<()> {
    let mut args = std::env::args().skip(1);
    let (Some(listen), Some(upstream)) = (args.next(), args.next()) else {
        eprintln!("usage: replay_backend <listen addr> <puppetdb host:port>");
        std::process::exit(2);
    };
    let listener = TcpListener::bind(&listen)?;
    println!("LISTEN {}", listener.local_addr()?);
    io::stdout().flush()?;
    let cache: Cache = Arc::default();
    let upstream = Arc::new(upstream);
    for stream in listener.incoming() {
        let Ok(stream) = stream else { continue };
        let (cache, upstream) = (Arc::clone(&cache), Arc::clone(&upstream));
        thread::spawn(move || {
            let _ = serve(stream, &cache, &upstream);
        });
    }
    Ok(())
}

fn serve(stream: TcpStream, cache: &Cache, upstream: &str) -> io::Result<()> {
    stream.set_nodelay(true)?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut writer = stream;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 {
            return Ok(());
        }
        let mut length = 0usize;
        loop {
            let mut header = String::new();
            if reader.read_line(&mut header)? == 0 {
                return Ok(());
            }
            if header == "\r\n" || header == "\n" {
                break;
            }
            if let Some((name, value)) = header.split_once(':') {
                if name.trim().eq_ignore_ascii_case("content-length") {
                    length = value.trim().parse().unwrap_or(0);
                }
            }
        }
        let mut body = vec![0u8; length];
        reader.read_exact(&mut body)?;
        let mut words = line.split_whitespace();
        let (method, target) = (words.next().unwrap_or("GET"), words.next().unwrap_or("/"));
        let key = format!("{method} {target} {}", String::from_utf8_lossy(&body));
        let cached = cache.lock().unwrap().get(&key).cloned();
        let answer = match cached {
            Some(answer) => answer,
            None => {
                let answer = Arc::new(fetch(upstream, method, target, &body)?);
                cache.lock().unwrap().insert(key, Arc::clone(&answer));
                answer
            }
        };
        writer.write_all(&answer)?;
    }
}

/// Asks the real PuppetDB and renders its answer as a keep-alive HTTP/1.1 response.
fn fetch(upstream: &str, method: &str, target: &str, body: &[u8]) -> io::Result<Vec<u8>> {
    let mut stream = TcpStream::connect(upstream)?;
    let mut request =
        format!("{method} {target} HTTP/1.0\r\nHost: {upstream}\r\nAccept: application/json\r\n");
    if !body.is_empty() {
        request.push_str(&format!(
            "Content-Type: application/json\r\nContent-Length: {}\r\n",
            body.len()
        ));
    }
    request.push_str("\r\n");
    stream.write_all(request.as_bytes())?;
    stream.write_all(body)?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw)?;
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "no head in the answer"))?;
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let content = &raw[split + 4..];
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|line| line.split_once(' '))
        .map_or("502 Bad Gateway", |(_, status)| status);
    let mut out = format!("HTTP/1.1 {status}\r\n");
    for line in lines {
        if let Some((name, _)) = line.split_once(':') {
            let name = name.trim();
            if name.eq_ignore_ascii_case("content-type") || name.eq_ignore_ascii_case("x-records") {
                out.push_str(line);
                out.push_str("\r\n");
            }
        }
    }
    out.push_str(&format!("Content-Length: {}\r\n\r\n", content.len()));
    let mut out = out.into_bytes();
    out.extend_from_slice(content);
    Ok(out)
}
