//! The listener: HTTP/1.1 with keep-alive and a header-read timeout, graceful shutdown on SIGTERM
//! or SIGINT (stop accepting, let in-flight requests finish for up to `timeout` + 5 s, exit 0),
//! and the configuration read again on SIGHUP (docs/operating.md, "Reload").
//! Large cached bodies are sealed (`pdbmux_sealed::Sealer`) and sent by reference by each connection's
//! [`SealedIo`].

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use pdbmux_cli::{Reloader, Settings};
use pdbmux_driver::StartError;
use tokio::net::TcpListener;

use crate::runtime::{Host, Tokio};
use crate::sealed_io::SealedIo;
use crate::service;

/// Why serving stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The tokio runtime could not start.
    #[error("starting the runtime: {0}")]
    Runtime(std::io::Error),
    /// Binding, or building the upstream or store clients, failed.
    #[error(transparent)]
    Start(#[from] StartError),
    /// The SIGHUP handler could not be installed.
    #[error("installing the SIGHUP handler: {0}")]
    Signals(std::io::Error),
}

/// Runs the server until a shutdown signal; the entry point of `pdbmux serve`.
pub fn run(settings: Settings, reloader: Reloader) -> Result<(), ServeError> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(ServeError::Runtime)?;
    runtime.block_on(serve(settings, reloader))
}

async fn bind(addr: &str) -> Result<TcpListener, StartError> {
    TcpListener::bind(addr)
        .await
        .map_err(StartError::bind(addr))
}

async fn serve(settings: Settings, reloader: Reloader) -> Result<(), ServeError> {
    use tokio::signal::unix::{signal, SignalKind};
    // Installed first: without a handler, SIGHUP would end the process.
    let mut hangups = signal(SignalKind::hangup()).map_err(ServeError::Signals)?;
    pdbmux_driver::prefer_runtime(false);
    let build = pdbmux_driver::Build {
        binary: "pdbmux",
        version: pdbmux_cli::version(),
    };
    let host = Host::start(settings.config, Tokio, build)?;
    let config = host.config();
    // The metrics listener first: once the query port accepts, so does it.
    let metrics_listener = match &config.metrics_listen {
        Some(addr) => Some(bind(addr).await?),
        None => None,
    };
    let listener = bind(&config.listen).await?;
    host.announce(
        listener.local_addr(),
        metrics_listener.as_ref().map(TcpListener::local_addr),
        &settings.config_source,
    );
    let driver = host.spawn_driver();
    let metrics_task = metrics_listener
        .map(|listener| tokio::spawn(crate::metrics::serve(listener, Arc::clone(&host))));
    // Reloads come from SIGHUP and, with config_watch_interval, from the file seen changed.
    let (changes, mut changed) = tokio::sync::mpsc::channel::<&'static str>(1);
    let watch = settings.config_watch.map(|every| {
        let (reloader, changes) = (reloader.clone(), changes.clone());
        tokio::spawn(async move {
            let stamp = || {
                let reloader = reloader.clone();
                async move {
                    tokio::task::spawn_blocking(move || reloader.file_stamp())
                        .await
                        .ok()
                        .flatten()
                }
            };
            let mut seen = reloader.started_from().cloned();
            loop {
                tokio::time::sleep(every).await;
                let now = stamp().await;
                if now != seen {
                    seen = now;
                    let _ = changes.try_send("the config file changed");
                }
            }
        })
    });
    let hangup_changes = changes;
    let hangup = tokio::spawn(async move {
        while hangups.recv().await.is_some() {
            let _ = hangup_changes.try_send("SIGHUP");
        }
    });
    let reload_host = Arc::clone(&host);
    let reloads = tokio::spawn(async move {
        while let Some(why) = changed.recv().await {
            let reloader = reloader.clone();
            let read = move |running: &_| reloader.reload(running).map_err(|e| e.to_string());
            reload_host.reread(why, read).await;
        }
    });
    let graceful = GracefulShutdown::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .keep_alive(true)
        .max_buf_size(pdbmux_driver::http1::MAX_HEAD_BYTES);
    let shutdown = shutdown_signal();
    tokio::pin!(shutdown);
    let signal = loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
                    Ok(accepted) => accepted,
                    Err(error) => {
                        tracing::warn!("accept failed: {error}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                let host = Arc::clone(&host);
                // The client timeouts current at accept (a reload changes them for new ones).
                let config = host.config();
                http.header_read_timeout(config.client_header_timeout);
                let io = SealedIo::new(stream, config.client_send_timeout, host.metrics().map(|m| m.sent_bytes()));
                let counts = io.counts();
                let open = host.metrics().map(|m| m.connection_opened());
                let connection = http.serve_connection(
                    TokioIo::new(io),
                    service_fn(move |request| service::handle(Arc::clone(&host), peer, request)),
                );
                let connection = graceful.watch(connection);
                tokio::spawn(async move {
                    let ended = connection.await;
                    drop(open);
                    tracing::debug!(
                        %peer,
                        sealed_bytes = counts.sealed_bytes.load(Ordering::Relaxed),
                        pipe_waits = counts.pipe_waits.load(Ordering::Relaxed),
                        written_bytes = counts.written_bytes.load(Ordering::Relaxed),
                        "connection ended{}",
                        ended.err().map_or_else(String::new, |error| format!(": {error}"))
                    );
                });
            }
            signal = &mut shutdown => break signal,
        }
    };
    drop(listener);
    host.shut_down(driver, signal, graceful.shutdown()).await;
    reloads.abort();
    hangup.abort();
    if let Some(watch) = watch {
        watch.abort();
    }
    if let Some(task) = metrics_task {
        task.abort();
    }
    Ok(())
}

/// Resolves with the name of the first SIGTERM or SIGINT.
async fn shutdown_signal() -> &'static str {
    use tokio::signal::unix::{signal, SignalKind};
    match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(mut term), Ok(mut int)) => tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        },
        _ => {
            let _ = tokio::signal::ctrl_c().await;
            "SIGINT"
        }
    }
}
