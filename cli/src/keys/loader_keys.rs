//! The keys the loader reads itself, which are no field of the core's configuration: the shared
//! store's URL and the files holding its password and key (read into the core's
//! `cache_backend`), the global TLS files (each backend's own default to them), and the
//! process's logging and config watch.

use pdbmux_core::config::ConfigKey;

use super::Key;

/// Defines [`LoaderKey`] from one list of the loader's keys, each named as written in a config
/// file, in the order they are printed.
macro_rules! loader_keys {
    ($($key:ident),* $(,)?) => {
        /// A key the loader reads itself; each variant is named as the key is written in a
        /// config file.
        #[allow(non_camel_case_types)]
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub(crate) enum LoaderKey {
            $(
                #[doc = concat!("`", stringify!($key), "`.")]
                $key,
            )*
        }

        impl LoaderKey {
            /// Every loader key, in the order they are printed.
            pub(crate) const ALL: &'static [LoaderKey] = &[$(LoaderKey::$key),*];

            /// The key as written in a config file.
            pub(crate) const fn name(self) -> &'static str {
                match self {
                    $(LoaderKey::$key => stringify!($key),)*
                }
            }
        }
    };
}

loader_keys!(
    cache_redis_url,
    cache_redis_password_file,
    cache_secret_file,
    tls_ca_file,
    tls_cert_file,
    tls_key_file,
    log_format,
    log_level,
    config_watch_interval,
);

/// The loader's settings read once, at start: what a reload compares and keeps.
#[derive(Debug, Default)]
pub(crate) struct LoadedOnce<'a> {
    /// `log_format`.
    pub(crate) log_format: crate::LogFormat,
    /// `log_level` (the filter in effect).
    pub(crate) log_level: &'a str,
    /// `config_watch_interval`.
    pub(crate) config_watch: Option<std::time::Duration>,
}

impl LoaderKey {
    /// The core's key this one is printed right after (the shared store's keys follow
    /// `cache_backend`); `None`: after all of the core's.
    pub(super) fn placed_after(self) -> Option<ConfigKey> {
        use LoaderKey as L;
        match self {
            L::cache_redis_url | L::cache_redis_password_file | L::cache_secret_file => {
                Some(ConfigKey::cache_backend)
            }
            L::tls_ca_file
            | L::tls_cert_file
            | L::tls_key_file
            | L::log_format
            | L::log_level
            | L::config_watch_interval => None,
        }
    }

    /// This key's value in `loaded` when a reload leaves its running value (a changed one takes
    /// a restart: the log settings, set up once at start, and the file watch, which runs the
    /// reloads); `None` for a key a reload applies (it is read into the new configuration). The
    /// one place that says which of the loader's keys take a restart: the reload compares these
    /// values, the docs test lists the keys.
    pub(crate) fn restart_value(self, loaded: &LoadedOnce<'_>) -> Option<String> {
        use LoaderKey as L;
        match self {
            L::log_format => Some(loaded.log_format.as_str().to_owned()),
            L::log_level => Some(loaded.log_level.to_owned()),
            L::config_watch_interval => Some(format!("{:?}", loaded.config_watch)),
            L::cache_redis_url
            | L::cache_redis_password_file
            | L::cache_secret_file
            | L::tls_ca_file
            | L::tls_cert_file
            | L::tls_key_file => None,
        }
    }

    /// Whether a reload leaves this key's running value ([`LoaderKey::restart_value`]).
    #[cfg(test)]
    pub(crate) fn takes_restart(self) -> bool {
        self.restart_value(&LoadedOnce::default()).is_some()
    }

    /// The table's entry for this key.
    pub(super) fn entry(self) -> Key {
        use LoaderKey as L;
        match self {
            L::cache_redis_url => Key::new(
                self.name(),
                None,
                None,
                "for cache_backend redis: redis://[user:password@]host:6379[/db] or rediss://",
            ),
            L::cache_redis_password_file => Key::new(
                self.name(),
                None,
                None,
                "for cache_backend redis: a file holding the store's password (instead of one in the URL)",
            ),
            L::cache_secret_file => Key::new(
                self.name(),
                None,
                None,
                "for cache_backend redis (required): a file holding the key, at least 16 bytes, every replica signs entries with",
            ),
            L::tls_ca_file => Key::new(
                self.name(),
                None,
                None,
                "extra CA bundle (PEM) for https backends, e.g. the Puppet CA",
            ),
            L::tls_cert_file => Key::new(
                self.name(),
                None,
                None,
                "client certificate (PEM) for https backends",
            ),
            L::tls_key_file => Key::new(
                self.name(),
                None,
                None,
                "private key (PEM) for tls_cert_file",
            ),
            L::log_format => Key::new(
                self.name(),
                Some("--log-format"),
                Some("text"),
                "text | json; logs go to stderr",
            ),
            L::log_level => Key::new(
                self.name(),
                None,
                Some("info"),
                "log filter, e.g. debug or pdbmux=debug,info; RUST_LOG applies when unset",
            ),
            L::config_watch_interval => Key::new(
                self.name(),
                None,
                Some("0"),
                "how often the config file is looked at and read again when it changed (a Kubernetes ConfigMap update); 0: only on SIGHUP",
            ),
        }
    }
}
