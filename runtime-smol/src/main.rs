//! `pdbmux-smol`: the minimal-footprint binary. A merging PuppetDB proxy on smol, async-h1 and
//! futures-rustls, driving the same sans-IO core as `pdbmux` (tokio), with the same CLI and config.
//!
//! - [`serve`]: one `smol::Executor` run by a thread per core; the listener; SIGTERM/SIGINT
//!   (async-signal) stop accepting, close idle connections and wait up to `timeout` + 5 s.
//! - [`conn`]: a client connection. Heads parsed by `pdbmux_driver::http1` (raw target and header
//!   sizes go to the core, which answers 414/431), `client_header_timeout` and
//!   `client_send_timeout`, keep-alive, the client's leaving noticed mid-request; each request
//!   answered by the estate host (`pdbmux_driver::EstateHost`, shared with `pdbmux`), which drives
//!   its `Exchange` on the request's own task; answers written by async-h1's encoder.
//! - [`runtime`]: what the host runs on here: smol tasks (panics caught; dropping one cancels
//!   it), `smol::Timer`, smol's blocking pool, and the upstream clients.
//! - [`metrics`]: the metrics listener (`metrics_listen`), served with async-h1's server.
//! - [`upstream`], [`pool`], [`body`]: request heads written verbatim, answers decoded by
//!   async-h1, a bounded pool of keep-alive connections per backend (futures-rustls for https),
//!   bodies bounded by `max_body_bytes` and, when streamed, by their deadline.

#![forbid(unsafe_code)]

mod body;
mod conn;
mod metrics;
mod pool;
mod runtime;
mod serve;
mod upstream;

use std::process::ExitCode;

fn main() -> ExitCode {
    pdbmux_cli::run("pdbmux-smol", |settings, reloader| {
        serve::run(settings, reloader).map_err(Into::into)
    })
}
