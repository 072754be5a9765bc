//! Starting, reloading and stopping pdbmux, the same on every runtime: what the estate is built
//! with, the line that says pdbmux is serving, a reload read off the async threads, and the
//! shutdown drain (README.md, "Probes and shutdown"; docs/operating.md, "Reload"). A runtime
//! binds its sockets, catches its signals and accepts connections around these.

use std::future::Future;
use std::net::SocketAddr;
use std::panic::AssertUnwindSafe;
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::{self, Either};
use pdbmux_core::config::Config;
use pdbmux_core::{ClockAnchor, Estate};
use pdbmux_sealed::Sealer;

use crate::{Build, EstateHost, Metrics, Runtime, Task};

/// Extra time in-flight requests get after the upstream timeout when shutting down.
const DRAIN_GRACE: Duration = Duration::from_secs(5);

/// Why pdbmux could not start serving, whatever the runtime.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
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
    Client(#[from] pdbmux_tls::ClientSetupError),
    /// The shared cache store's client could not be built.
    #[error("{0}")]
    Store(String),
}

impl StartError {
    /// The error binding `addr` failed with.
    pub fn bind(addr: &str) -> impl FnOnce(std::io::Error) -> StartError + '_ {
        move |source| StartError::Bind {
            addr: addr.to_owned(),
            source,
        }
    }
}

impl<R: Runtime> EstateHost<R> {
    /// Builds what serving `config` on `runtime` needs: the clients it asks for
    /// ([`Runtime::clients`]; call it before binding, so a TLS file that cannot be read stops the
    /// start with no port bound), the estate (its clock anchored now), the sealer for its cache
    /// budget, and pdbmux's own metrics (as `build`) when `metrics_listen` is set. Then bind,
    /// [`EstateHost::announce`], and start the estate's task ([`EstateHost::spawn_driver`]),
    /// whose handle [`EstateHost::shut_down`] takes.
    pub fn start(config: Config, runtime: R, build: Build) -> Result<Arc<Self>, StartError> {
        let clients = R::clients(&config)?;
        let anchor = ClockAnchor {
            instant: runtime.now(),
            wall: runtime.wall_clock(),
        };
        let sealer = Sealer::new(config.facts_cache_bytes);
        let metrics = config.metrics_listen.is_some().then(|| Metrics::new(build));
        let host = EstateHost::new(
            Estate::new(config, anchor),
            sealer,
            (runtime, clients),
            metrics,
        );
        Ok(host)
    }

    /// Logs the line that says pdbmux is serving: the address it listens on (as bound, else as
    /// configured), its backends, its metrics address and where its configuration came from.
    pub fn announce(
        &self,
        listen: std::io::Result<SocketAddr>,
        metrics: Option<std::io::Result<SocketAddr>>,
        config_source: &str,
    ) {
        let config = self.config();
        let listen = listen.map_or_else(|_| config.listen.clone(), |a| a.to_string());
        let metrics = metrics
            .and_then(Result::ok)
            .map_or_else(|| "off".to_owned(), |a| a.to_string());
        let backends = crate::host::backend_list(&config);
        tracing::info!(%listen, %backends, %metrics, config = %config_source, "pdbmux serving");
    }

    /// A reload (a SIGHUP, or the config file seen changed: `why`, for the log): `read` reads
    /// the configuration again for the running one, then the clients it asks for are built
    /// ([`Runtime::clients`]); both read files, so they run on the blocking pool, and a panic in
    /// them refuses the reload. [`EstateHost::reload`] applies the result. Returns whether it was
    /// applied.
    pub async fn reread(
        &self,
        why: &str,
        read: impl FnOnce(&Config) -> Result<Config, String> + Send + 'static,
    ) -> bool {
        tracing::info!("{why}: reading the configuration again");
        let running = self.config();
        let prepare = move || {
            let config = read(&running)?;
            let clients = R::clients(&config).map_err(|error| error.to_string())?;
            Ok((config, clients))
        };
        let prepared = self
            .runtime
            .unblock(move || {
                std::panic::catch_unwind(AssertUnwindSafe(prepare))
                    .unwrap_or_else(|_| Err("reading the configuration panicked".to_owned()))
            })
            .await;
        self.reload(prepared)
    }

    /// Shuts down once the runtime has stopped accepting (after `signal`): waits until
    /// `drained` (every connection closed) for up to the upstream timeout and 5 s more, then
    /// stops the estate's task (`driver`, from [`EstateHost::start`]).
    pub async fn shut_down(
        &self,
        driver: R::Task,
        signal: &str,
        drained: impl Future<Output = ()>,
    ) {
        let limit = self.config().timeout + DRAIN_GRACE;
        tracing::info!(
            "{signal}: no longer accepting; draining in-flight requests for up to {limit:?}"
        );
        let expired = pin!(self.runtime.sleep_until(self.runtime.now() + limit));
        match future::select(pin!(drained), expired).await {
            Either::Left(_) => tracing::info!("drained; exiting"),
            Either::Right(_) => {
                tracing::warn!("drain limit reached; exiting with requests still in flight")
            }
        }
        driver.cancel();
    }
}
