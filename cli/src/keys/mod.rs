//! The table of configuration keys: file key, env var, flag, default and a one-line comment.
//!
//! The table is built from two lists: the core's keys ([`ConfigKey`], the one list in
//! `core/src/config.rs` that also says what a reload renews) and the loader's own
//! ([`LoaderKey`]). Each key's env var is its name upper-cased after `PDBMUX_`. Everything that
//! lists keys (the loader's layers, `config show`, `config init`, the unknown-variable check)
//! walks this one table, and a test holds README.md's table of keys to it, so a key added to
//! either list is picked up everywhere.

mod core_keys;
mod loader_keys;
mod nearest;
#[cfg(test)]
mod readme_table;
#[cfg(test)]
mod restart_docs;
mod variables;

use std::sync::LazyLock;

use pdbmux_core::config::ConfigKey;

pub(crate) use loader_keys::{LoadedOnce, LoaderKey};
pub(crate) use nearest::{nearest_backend_key, nearest_key, nearest_var};
pub(crate) use variables::is_unknown_var;

/// The prefix every variable pdbmux reads starts with.
const ENV_PREFIX: &str = "PDBMUX_";

/// One configuration key.
#[derive(Debug)]
pub(crate) struct Key {
    /// The key as written in the config file.
    pub name: &'static str,
    /// The env var that overrides it: `PDBMUX_` and the name in upper case.
    pub env: String,
    /// The flag that overrides it, if any.
    pub flag: Option<&'static str>,
    /// The default, spelled as in a config file; `None` when the key has no default.
    pub default: Option<&'static str>,
    /// A one-line description for the `config init` template.
    pub comment: &'static str,
    /// Whether an empty env var sets the key (to empty) rather than counting as unset.
    pub empty_is_a_value: bool,
}

impl Key {
    /// The entry for key `name`, read from its env var, where an empty value counts as unset.
    fn new(
        name: &'static str,
        flag: Option<&'static str>,
        default: Option<&'static str>,
        comment: &'static str,
    ) -> Key {
        Key {
            name,
            env: format!("{ENV_PREFIX}{}", name.to_ascii_uppercase()),
            flag,
            default,
            comment,
            empty_is_a_value: false,
        }
    }

    /// This entry, for a key whose empty value means something (turns a feature off), from the
    /// env too.
    fn empty_is_a_value(self) -> Key {
        Key {
            empty_is_a_value: true,
            ..self
        }
    }
}

/// Every key, in the order `config show` and `config init` print them: the core's, in
/// [`ConfigKey::ALL`] order, each followed by the loader's keys placed after it
/// ([`LoaderKey::placed_after`]), then the rest of the loader's.
pub(crate) static KEYS: LazyLock<Vec<Key>> = LazyLock::new(|| {
    let loader_keys_after = |core: Option<ConfigKey>| {
        LoaderKey::ALL
            .iter()
            .filter(move |key| key.placed_after() == core)
            .map(|key| key.entry())
    };
    ConfigKey::ALL
        .iter()
        .flat_map(|&key| std::iter::once(core_keys::entry(key)).chain(loader_keys_after(Some(key))))
        .chain(loader_keys_after(None))
        .collect()
});

/// The keys a backend entry in the config file may have.
pub(crate) const BACKEND_KEYS: &[&str] = &[
    "name",
    "url",
    LoaderKey::tls_ca_file.name(),
    LoaderKey::tls_cert_file.name(),
    LoaderKey::tls_key_file.name(),
];

/// Every key's name, in the order `config show` and `config init` print them; for tests and
/// tools that walk the keys.
pub fn names() -> impl Iterator<Item = &'static str> {
    KEYS.iter().map(|key| key.name)
}

/// The keys a reload does not apply (a changed value is named in a warning and takes a
/// restart), in the table's order: the core's classed [`pdbmux_core::config::Renews::Restart`]
/// and the loader's that [`LoaderKey::takes_restart`]. The docs name them (`restart_docs`).
#[cfg(test)]
pub(crate) fn restart_keys() -> Vec<&'static str> {
    let core: Vec<&str> = pdbmux_core::config::Config::KEYS
        .iter()
        .filter(|(_, renews)| renews.contains(&pdbmux_core::config::Renews::Restart))
        .map(|(name, _)| *name)
        .collect();
    let loader = LoaderKey::ALL.iter().filter(|key| key.takes_restart());
    names()
        .filter(|name| core.contains(name) || loader.clone().any(|key| key.name() == *name))
        .collect()
}

/// The entry for `name`; `None` for a name not in the table.
pub(crate) fn find(name: &str) -> Option<&'static Key> {
    KEYS.iter().find(|k| k.name == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The table holds each key of both lists once: a key the core gains that the loader also
    /// lists as its own would be read twice.
    #[test]
    fn the_table_holds_every_key_of_the_core_and_the_loader_once() {
        let mut listed: Vec<&str> = ConfigKey::ALL
            .iter()
            .map(|key| key.name())
            .chain(LoaderKey::ALL.iter().map(|key| key.name()))
            .collect();
        let mut table: Vec<&str> = KEYS.iter().map(|key| key.name).collect();
        listed.sort_unstable();
        table.sort_unstable();
        assert_eq!(table, listed);
        for pair in table.windows(2) {
            assert_ne!(pair[0], pair[1], "{} is in both lists", pair[0]);
        }
    }

    #[test]
    fn the_loaders_keys_are_printed_after_the_key_they_belong_with() {
        let names: Vec<&str> = KEYS.iter().map(|key| key.name).collect();
        let at = |name: &str| names.iter().position(|n| *n == name).expect(name);
        assert_eq!(at("cache_redis_url"), at("cache_backend") + 1);
        assert_eq!(at("cache_secret_file"), at("cache_backend") + 3);
        assert_eq!(names[0], "listen");
        assert_eq!(names.last(), Some(&"config_watch_interval"));
        assert!(at("tls_ca_file") > at("latency_objective"));
    }

    #[test]
    fn each_variable_is_its_key_upper_cased_after_the_prefix() {
        let env = |name: &str| find(name).map(|key| key.env.as_str());
        assert_eq!(
            env("health_probe_interval"),
            Some("PDBMUX_HEALTH_PROBE_INTERVAL")
        );
        assert_eq!(env("tls_ca_file"), Some("PDBMUX_TLS_CA_FILE"));
        assert_eq!(env("metrics_listen"), Some("PDBMUX_METRICS_LISTEN"));
        assert!(find("metrics_listen").is_some_and(|key| key.empty_is_a_value));
        assert!(find("listen").is_some_and(|key| !key.empty_is_a_value));
    }
}
