//! The executor and the listener: a smol executor on every core, HTTP/1.1 connections, and
//! graceful shutdown on SIGTERM or SIGINT (stop accepting, let in-flight requests finish for up to
//! `timeout` + 5 s, exit 0), and the configuration read again on SIGHUP (docs/operating.md,
//! "Reload").

use std::net::TcpListener;
use std::num::NonZeroUsize;
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use async_signal::{Signal, Signals};
use pdbmux_cli::{Reloader, Settings};
use pdbmux_driver::StartError;
use smol::channel;
use smol::future::FutureExt;
use smol::stream::StreamExt;
use smol::{Async, Executor, Timer};

use crate::conn;
use crate::runtime::{spawn_guarded, Host, Smol};

/// Why serving stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// An executor thread could not start.
    #[error("starting the executor threads: {0}")]
    Threads(std::io::Error),
    /// The signal handlers could not be installed.
    #[error("installing signal handlers: {0}")]
    Signals(std::io::Error),
    /// Binding, or building the upstream or store clients, failed.
    #[error(transparent)]
    Start(#[from] StartError),
}

fn bind(addr: &str) -> Result<Async<TcpListener>, StartError> {
    TcpListener::bind(addr)
        .and_then(Async::new)
        .map_err(StartError::bind(addr))
}

/// Runs the server until a shutdown signal; the entry point of `pdbmux-smol serve`.
///
/// One `smol::Executor` is run by one thread per available core (this thread among them), so
/// merges of different requests run on different cores at once. smol's own global executor
/// (`smol::spawn`) would run a single thread unless `SMOL_THREADS` is set.
pub fn run(settings: Settings, reloader: Reloader) -> Result<(), ServeError> {
    let threads = thread::available_parallelism().map_or(1, NonZeroUsize::get);
    let executor = Arc::new(Executor::new());
    // Dropping `stop` ends the other threads' loops.
    let (stop, stopped) = channel::bounded::<()>(1);
    for index in 1..threads {
        let (executor, stopped) = (Arc::clone(&executor), stopped.clone());
        thread::Builder::new()
            .name(format!("pdbmux-smol-{index}"))
            .spawn(move || smol::block_on(executor.run(stopped.recv())))
            .map_err(ServeError::Threads)?;
    }
    let served = serve(Arc::clone(&executor), settings, reloader);
    let result = smol::block_on(executor.run(served));
    drop(stop);
    result
}

async fn serve(
    executor: Arc<Executor<'static>>,
    settings: Settings,
    reloader: Reloader,
) -> Result<(), ServeError> {
    pdbmux_driver::prefer_runtime(true);
    let mut signals =
        Signals::new([Signal::Term, Signal::Int, Signal::Hup]).map_err(ServeError::Signals)?;
    let build = pdbmux_driver::Build {
        binary: "pdbmux-smol",
        version: pdbmux_cli::version(),
    };
    let runtime = Smol::new(Arc::clone(&executor));
    let host = Host::start(settings.config, runtime, build)?;
    let config = host.config();
    // The metrics listener first: once the query port accepts, so does it.
    let metrics_listener = config.metrics_listen.as_deref().map(bind).transpose()?;
    let listener = bind(&config.listen)?;
    host.announce(
        listener.get_ref().local_addr(),
        metrics_listener.as_ref().map(|l| l.get_ref().local_addr()),
        &settings.config_source,
    );
    let driver = host.spawn_driver();
    // Dropped (and so stopped) when serving ends.
    let _metrics_task = metrics_listener.map(|listener| {
        let served = crate::metrics::serve(listener, Arc::clone(&host), Arc::clone(&executor));
        spawn_guarded(&executor, "metrics listener", served)
    });
    // `closing` is dropped when shutdown starts; every connection holds a clone of `open`.
    let (closing, closing_watch) = channel::bounded::<()>(1);
    let (open, drained) = channel::bounded::<()>(1);
    // Reloads come from SIGHUP and, with config_watch_interval, from the file seen changed.
    let (hangups, reloads) = channel::unbounded::<&'static str>();
    let _watch_task = settings.config_watch.map(|every| {
        let (reloader, changes) = (reloader.clone(), hangups.clone());
        spawn_guarded(&executor, "config file watch", async move {
            let stamp = || {
                let reloader = reloader.clone();
                smol::unblock(move || reloader.file_stamp())
            };
            let mut seen = reloader.started_from().cloned();
            loop {
                Timer::after(every).await;
                let now = stamp().await;
                if now != seen {
                    seen = now;
                    let _ = changes.try_send("the config file changed");
                }
            }
        })
    });
    let reload_host = Arc::clone(&host);
    let _reloader_task = spawn_guarded(&executor, "reload", async move {
        while let Ok(why) = reloads.recv().await {
            let reloader = reloader.clone();
            let read = move |running: &_| reloader.reload(running).map_err(|e| e.to_string());
            reload_host.reread(why, read).await;
        }
    });
    // Idle upstream connections the backends closed are closed here too, not left in CLOSE-WAIT.
    let sweep_host = Arc::clone(&host);
    let _sweeper = spawn_guarded(&executor, "idle connection sweep", async move {
        loop {
            Timer::after(crate::pool::SWEEP_INTERVAL).await;
            sweep_host.clients().upstreams.sweep();
        }
    });
    let context = conn::Context::new(Arc::clone(&host), closing_watch, open);
    let signal = loop {
        let accepted = async { Ok(listener.accept().await) };
        let signalled = async { Err(signals.next().await) };
        match accepted.or(signalled).await {
            Ok(Ok((stream, peer))) => {
                let _ = stream.get_ref().set_nodelay(true);
                let context = context.clone();
                spawn_guarded(&executor, "connection", async move {
                    conn::serve(stream, context).await;
                    tracing::trace!(%peer, "connection closed");
                })
                .detach();
            }
            Ok(Err(error)) => {
                tracing::warn!("accept failed: {error}");
                Timer::after(Duration::from_millis(50)).await;
            }
            Err(Some(Ok(Signal::Hup))) => {
                // One reload at a time, in the order of the signals.
                let _ = hangups.try_send("SIGHUP");
            }
            Err(Some(Ok(Signal::Term))) => break "SIGTERM",
            Err(_) => break "SIGINT",
        }
    };
    drop(listener);
    drop(closing);
    drop(context);
    let drained = async {
        let _ = drained.recv().await;
    };
    host.shut_down(driver, signal, drained).await;
    Ok(())
}
