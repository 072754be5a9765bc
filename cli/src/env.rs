//! A snapshot of the environment variables the loader reads.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The system-wide config file, searched after the per-user one.
pub const SYSTEM_CONFIG_PATH: &str = "/etc/pdbmux/config.yaml";

/// The environment the loader reads: `PDBMUX_*`, `RUST_LOG`, `HOME` and `XDG_CONFIG_HOME`.
///
/// Use [`Environment::from_process`] in binaries; tests build one from pairs (or inside a
/// `figment::Jail`) and may point the system config path somewhere harmless.
#[derive(Debug, Clone)]
pub struct Environment {
    vars: BTreeMap<String, String>,
    system_config: PathBuf,
}

impl Environment {
    /// Snapshot of the current process environment (non-UTF-8 values converted lossily).
    pub fn from_process() -> Environment {
        Environment::from_pairs(std::env::vars_os().map(|(k, v)| {
            (
                k.to_string_lossy().into_owned(),
                v.to_string_lossy().into_owned(),
            )
        }))
    }

    /// An environment holding exactly these variables; for tests.
    pub fn from_pairs<I, K, V>(pairs: I) -> Environment
    where
        I: IntoIterator<Item = (K, V)>,
        K: Into<String>,
        V: Into<String>,
    {
        Environment {
            vars: pairs
                .into_iter()
                .map(|(k, v)| (k.into(), v.into()))
                .collect(),
            system_config: PathBuf::from(SYSTEM_CONFIG_PATH),
        }
    }

    /// Replaces the system config path (`/etc/pdbmux/config.yaml`) searched last; for tests.
    pub fn with_system_config(mut self, path: impl Into<PathBuf>) -> Environment {
        self.system_config = path.into();
        self
    }

    /// The value of `name`; an empty value counts as unset.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.vars
            .get(name)
            .map(String::as_str)
            .filter(|v| !v.is_empty())
    }

    /// The value of `name` when it is set, even to the empty string (for a key whose empty value
    /// means something: `PDBMUX_METRICS_LISTEN=` turns the metrics listener off).
    pub fn get_even_empty(&self, name: &str) -> Option<&str> {
        self.vars.get(name).map(String::as_str)
    }

    /// Every variable's name, in order; for finding the `PDBMUX_*` ones pdbmux does not know.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.vars.keys().map(String::as_str)
    }

    /// The system-wide config path searched last.
    pub fn system_config(&self) -> &Path {
        &self.system_config
    }

    /// Where the per-user config file lives: `$XDG_CONFIG_HOME/pdbmux/config.yaml`, or
    /// `$HOME/.config/pdbmux/config.yaml` when `XDG_CONFIG_HOME` is unset, empty or relative.
    pub fn user_config(&self) -> Option<PathBuf> {
        let base = match self.get("XDG_CONFIG_HOME").map(PathBuf::from) {
            Some(xdg) if xdg.is_absolute() => xdg,
            _ => PathBuf::from(self.get("HOME")?).join(".config"),
        };
        Some(base.join("pdbmux").join("config.yaml"))
    }
}
