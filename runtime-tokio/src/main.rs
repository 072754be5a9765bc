//! `pdbmux`: the production binary. A merging PuppetDB proxy on tokio, hyper and rustls.

#![forbid(unsafe_code)]

mod body;
mod metrics;
mod runtime;
mod sealed_io;
mod serve;
mod service;
mod upstream;

use std::process::ExitCode;

fn main() -> ExitCode {
    pdbmux_cli::run("pdbmux", |settings, reloader| {
        serve::run(settings, reloader).map_err(Into::into)
    })
}
