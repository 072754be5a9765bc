//! The listener: HTTP/1.1 with keep-alive and a header-read timeout, graceful shutdown on SIGTERM
//! or SIGINT (stop accepting, let in-flight requests finish for up to `timeout` + 5 s, exit 0),
//! and the configuration read again on SIGHUP (docs/operating.md, "Reload").
//! Large cached bodies are sealed ([`Sealer`]) and sent by reference by each connection's
//! [`SealedIo`].

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use pdbmux_cli::{Reloader, Settings};
use pdbmux_core::{ClockAnchor, Estate};
use pdbmux_sealed::Sealer;
use tokio::net::TcpListener;

use crate::runtime::{Host, Tokio};
use crate::sealed_io::SealedIo;
use crate::service;
use crate::upstream::Upstreams;

/// Extra time in-flight requests get after the upstream timeout when shutting down.
const DRAIN_GRACE: Duration = Duration::from_secs(5);

/// Why serving stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The tokio runtime could not start.
    #[error("starting the runtime: {0}")]
    Runtime(std::io::Error),
    /// The listen address could not be bound.
    #[error("listening on {addr}: {source}")]
    Bind {
        /// The configured address.
        addr: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// A backend's client could not be built.
    #[error(transparent)]
    Client(#[from] crate::upstream::ClientSetupError),
    /// The shared cache store's client could not be built.
    #[error("{0}")]
    Store(String),
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

async fn bind(addr: &str) -> Result<TcpListener, ServeError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| ServeError::Bind {
            addr: addr.to_owned(),
            source,
        })
}

async fn serve(settings: Settings, reloader: Reloader) -> Result<(), ServeError> {
    use tokio::signal::unix::{signal, SignalKind};
    // Installed first: without a handler, SIGHUP would end the process.
    let mut hangups = signal(SignalKind::hangup()).map_err(ServeError::Signals)?;
    let config = settings.config;
    pdbmux_driver::prefer_runtime(false);
    let clients = pdbmux_driver::Clients::with_store(&config, Upstreams::new(&config)?)
        .map_err(ServeError::Store)?;
    // The metrics listener first: once the query port accepts, so does it.
    let metrics_listener = match &config.metrics_listen {
        Some(addr) => Some(bind(addr).await?),
        None => None,
    };
    let listener = bind(&config.listen).await?;
    let drain_limit = config.timeout + DRAIN_GRACE;
    tracing::info!(
        listen = %listener.local_addr().map_or_else(|_| config.listen.clone(), |a| a.to_string()),
        backends = %config.backends.iter().map(|b| format!("{}={}", b.name, b.url.base())).collect::<Vec<_>>().join(","),
        metrics = %metrics_listener.as_ref().and_then(|l| l.local_addr().ok()).map_or_else(|| "off".to_owned(), |a| a.to_string()),
        config = %settings.config_source,
        "pdbmux serving"
    );
    let clock = ClockAnchor {
        instant: std::time::Instant::now(),
        wall: std::time::SystemTime::now(),
    };
    let sealer = Sealer::new(config.facts_cache_bytes);
    let estate = Estate::new(config, clock);
    let metrics = metrics_listener.as_ref().map(|_| {
        pdbmux_driver::Metrics::new(pdbmux_driver::Build {
            binary: "pdbmux",
            version: pdbmux_cli::version(),
        })
    });
    let host = Host::new(estate, sealer, (Tokio, clients), metrics);
    let driver = host.spawn_driver();
    let metrics_task = metrics_listener
        .map(|listener| tokio::spawn(crate::metrics::serve(listener, Arc::clone(&host))));
    let reload_host = Arc::clone(&host);
    let reloads = tokio::spawn(async move {
        while hangups.recv().await.is_some() {
            tracing::info!("SIGHUP: reading the configuration again");
            let (running, reloader) = (reload_host.config(), reloader.clone());
            // Files are read (the config, the TLS material) off the async workers.
            let prepared = tokio::task::spawn_blocking(move || {
                reloader.prepare(&running, |config| {
                    pdbmux_driver::Clients::build(config, Upstreams::new)
                })
            })
            .await
            .unwrap_or_else(|error| Err(format!("reading the configuration: {error}")));
            reload_host.reload(prepared);
        }
    });
    let graceful = GracefulShutdown::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .keep_alive(true)
        .max_buf_size(64 * 1024);
    let shutdown = shutdown_signal();
    tokio::pin!(shutdown);
    loop {
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
                    service_fn(move |request| service::handle(Arc::clone(&host), request)),
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
            signal = &mut shutdown => {
                tracing::info!("{signal}: no longer accepting; draining in-flight requests for up to {drain_limit:?}");
                break;
            }
        }
    }
    drop(listener);
    match tokio::time::timeout(drain_limit, graceful.shutdown()).await {
        Ok(()) => tracing::info!("drained; exiting"),
        Err(_) => tracing::warn!("drain limit reached; exiting with requests still in flight"),
    }
    pdbmux_driver::Task::cancel(driver);
    reloads.abort();
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
