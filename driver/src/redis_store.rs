//! The shared cache store on Redis or Valkey (docs/caching.md), through redis-rs's
//! `ConnectionManager`: connected lazily, reconnected by itself when the server comes back, each
//! request bounded by a short response timeout. The core decides what to ask; this only speaks
//! the protocol (`GETRANGE`, `SET … PX`, `SET … NX PX`, and a compare-and-delete script for
//! unlock).

use std::time::Duration;

use pdbmux_core::cache::shared::{StoreAnswer, StoreOp, StoreRequest};
use pdbmux_core::config::{Secret, TlsFiles};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::IntoConnectionInfo;

/// Deletes the lock only while it still holds this replica's token.
const UNLOCK: &str =
    "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end";

/// How long connecting and each answer may take: the core gives up on a request sooner anyway.
const TIMEOUT: Duration = Duration::from_millis(400);

/// A connection to the shared store, shared by every request of one configuration.
#[derive(Clone)]
pub(crate) struct RedisStore {
    manager: ConnectionManager,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore").finish_non_exhaustive()
    }
}

/// Which runtime redis-rs runs on when both are compiled in (a workspace build); call it once at
/// start, before any store is made.
pub fn prefer_runtime(smol: bool) {
    #[cfg(all(feature = "tokio", feature = "smol"))]
    {
        let _ = if smol {
            redis::aio::prefer_smol()
        } else {
            redis::aio::prefer_tokio()
        };
    }
    let _ = smol;
}

impl RedisStore {
    /// A store at `url` (`redis://` or `rediss://`, whose TLS uses `tls`: the CA, client
    /// certificate and key, read now), authenticating with `password` when given (else the
    /// URL's). Nothing is connected yet: a server down at start is a store failing, not a
    /// start-up error.
    pub fn new(url: &str, tls: &TlsFiles, password: Option<&Secret>) -> Result<RedisStore, String> {
        let read = |path: &Option<std::path::PathBuf>| -> Result<Option<Vec<u8>>, String> {
            path.as_ref()
                .map(|path| {
                    std::fs::read(path).map_err(|e| format!("reading {}: {e}", path.display()))
                })
                .transpose()
        };
        let url_error = |e: redis::RedisError| format!("the shared cache store's URL: {e}");
        let mut info = url.into_connection_info().map_err(url_error)?;
        if let Some(password) = password {
            let password = std::str::from_utf8(password.expose())
                .map_err(|_| "cache_redis_password_file does not hold UTF-8 text".to_owned())?;
            let settings = info.redis_settings().clone().set_password(password);
            info = info.set_redis_settings(settings);
        }
        let client = if url.starts_with("rediss://") {
            let client_tls = match (read(&tls.cert_file)?, read(&tls.key_file)?) {
                (Some(client_cert), Some(client_key)) => Some(redis::ClientTlsConfig {
                    client_cert,
                    client_key,
                }),
                _ => None,
            };
            let certificates = redis::TlsCertificates {
                client_tls,
                root_cert: read(&tls.ca_file)?,
            };
            redis::Client::build_with_tls(info, certificates)
        } else {
            redis::Client::open(info)
        }
        .map_err(url_error)?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(TIMEOUT))
            .set_response_timeout(Some(TIMEOUT))
            .set_number_of_retries(1)
            .set_max_delay(Duration::from_secs(1));
        let manager = ConnectionManager::new_lazy_with_config(client, config)
            .map_err(|e| format!("the shared cache store: {e}"))?;
        Ok(RedisStore { manager })
    }

    /// Carries out one request; every error is [`StoreAnswer::Failed`].
    pub async fn answer(&self, request: StoreRequest) -> StoreAnswer {
        let mut connection = self.manager.clone();
        let result = match request.op {
            // The range's end is inclusive: one byte past the limit tells a value too long.
            StoreOp::Get { key, limit } => redis::cmd("GETRANGE")
                .arg(key)
                .arg(0)
                .arg(limit)
                .query_async::<Option<Vec<u8>>>(&mut connection)
                .await
                .map(|value| StoreAnswer::Value(value.map(bytes::Bytes::from))),
            StoreOp::Put { key, value, keep } => redis::cmd("SET")
                .arg(key)
                .arg(value.as_ref())
                .arg("PX")
                .arg(millis(keep))
                .query_async::<()>(&mut connection)
                .await
                .map(|()| StoreAnswer::Done),
            StoreOp::Lock { key, token, lease } => redis::cmd("SET")
                .arg(key)
                .arg(token)
                .arg("NX")
                .arg("PX")
                .arg(millis(lease))
                .query_async::<Option<String>>(&mut connection)
                .await
                .map(|set| StoreAnswer::Locked(set.is_some())),
            StoreOp::Unlock { key, token } => redis::cmd("EVAL")
                .arg(UNLOCK)
                .arg(1)
                .arg(key)
                .arg(token)
                .query_async::<i64>(&mut connection)
                .await
                .map(|_| StoreAnswer::Done),
        };
        result.unwrap_or_else(|error| StoreAnswer::Failed(error.to_string()))
    }
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis())
        .unwrap_or(u64::MAX)
        .max(1)
}

/// One configuration's clients as a runtime keeps them: its upstream clients `U` and, for
/// `cache_backend: redis`, the shared store.
#[derive(Debug)]
pub struct Clients<U> {
    /// The backends' clients.
    pub upstreams: U,
    /// The shared cache store, when one is configured.
    store: Option<RedisStore>,
}

impl<U> Clients<U> {
    /// The clients `config` asks for: the upstream ones built by `upstreams`, and the shared
    /// store for `cache_backend: redis`; reads TLS files. A runtime's [`crate::Runtime::clients`].
    pub fn of(
        config: &pdbmux_core::config::Config,
        upstreams: impl FnOnce(&pdbmux_core::config::Config) -> Result<U, pdbmux_tls::ClientSetupError>,
    ) -> Result<Clients<U>, crate::StartError> {
        let upstreams = upstreams(config)?;
        let store = match &config.cache_backend {
            pdbmux_core::config::CacheBackend::Redis {
                url, tls, password, ..
            } => Some(
                RedisStore::new(url, tls, password.as_ref()).map_err(crate::StartError::Store)?,
            ),
            pdbmux_core::config::CacheBackend::Memory => None,
        };
        Ok(Clients { upstreams, store })
    }

    /// Carries one request to the shared store ([`StoreAnswer::Failed`] without one).
    pub async fn store(&self, request: StoreRequest) -> StoreAnswer {
        match &self.store {
            Some(store) => store.answer(request).await,
            None => StoreAnswer::Failed("no shared store is configured".to_owned()),
        }
    }
}
