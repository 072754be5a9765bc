//! Layering the configuration with figment: defaults < config file < env vars < flags.
//!
//! This step only gathers raw values and where each came from; [`crate::validate()`] turns them
//! into a [`pdbmux_core::config::Config`].

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use figment::providers::Format;
use figment::value::{Dict, Map, Value};
use figment::{Figment, Metadata, Profile, Provider};
use pdbmux_core::config::ConfigKey;

use crate::args::SettingFlags;
use crate::env::Environment;
use crate::keys::{self, LoaderKey, KEYS};

const DEFAULTS: &str = "pdbmux defaults";
const ENVIRONMENT: &str = "pdbmux environment";
const FLAGS: &str = "pdbmux flags";

/// Why the configuration could not be gathered.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// A path given by `--config` or `PDBMUX_CONFIG` does not exist.
    #[error("config file \"{}\" not found (given by {via})", path.display())]
    Missing {
        /// The path given.
        path: PathBuf,
        /// `--config` or `PDBMUX_CONFIG`.
        via: &'static str,
    },
    /// The config file could not be read or is not a YAML mapping.
    #[error("config file \"{}\": {message}", path.display())]
    File {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
}

/// Which config file was read, or where one was looked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfigFile {
    /// Named by `--config` or `PDBMUX_CONFIG` (and it exists).
    Given {
        /// The file.
        path: PathBuf,
        /// `--config` or `PDBMUX_CONFIG`.
        via: &'static str,
    },
    /// The first file that exists on the search path.
    Found {
        /// The file.
        path: PathBuf,
    },
    /// No file: none of these exist.
    NotFound {
        /// The paths searched, in order.
        searched: Vec<PathBuf>,
    },
}

impl ConfigFile {
    /// The file read, if any.
    pub fn path(&self) -> Option<&Path> {
        match self {
            ConfigFile::Given { path, .. } | ConfigFile::Found { path } => Some(path),
            ConfigFile::NotFound { .. } => None,
        }
    }
}

impl fmt::Display for ConfigFile {
    /// `/path (from --config)`, `/path`, or `none (searched a, b)`; for startup logs and show.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigFile::Given { path, via } => write!(f, "{} (from {via})", path.display()),
            ConfigFile::Found { path } => write!(f, "{}", path.display()),
            ConfigFile::NotFound { searched } => {
                let list: Vec<String> = searched.iter().map(|p| p.display().to_string()).collect();
                write!(f, "none (searched {})", list.join(", "))
            }
        }
    }
}

/// Where an effective value came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// The built-in default.
    Default,
    /// The config file at this path.
    File(PathBuf),
    /// This env var.
    Env(&'static str),
    /// This flag.
    Flag(&'static str),
}

impl fmt::Display for Source {
    /// `default`, `file <path>`, `env PDBMUX_X` or `flag --x`, as `config show` prints it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Default => f.write_str("default"),
            Source::File(path) => write!(f, "file {}", path.display()),
            Source::Env(var) => write!(f, "env {var}"),
            Source::Flag(flag) => write!(f, "flag {flag}"),
        }
    }
}

/// One key's effective raw value and its source.
#[derive(Debug, Clone)]
pub(crate) struct Setting {
    pub value: Value,
    pub source: Source,
}

/// The gathered, not yet validated configuration: one raw value per key that has one.
///
/// Get one from [`load`]; pass it to [`crate::validate()`] or [`crate::show()`].
#[derive(Debug, Clone)]
pub struct Loaded {
    pub(crate) file: ConfigFile,
    pub(crate) settings: BTreeMap<&'static str, Setting>,
    pub(crate) unknown_keys: Vec<String>,
    /// `PDBMUX_*` variables that are no key's (misspellings, most likely), in name order.
    pub(crate) unknown_vars: Vec<String>,
    /// The config file's text, for naming the line a key is on ([`crate::origin`]).
    pub(crate) file_text: Option<String>,
    pub(crate) rust_log: Option<String>,
}

impl Loaded {
    /// The config file read, or the paths searched.
    pub fn file(&self) -> &ConfigFile {
        &self.file
    }

    /// Where `key`'s effective value came from; `None` when it has no value (e.g. no backends).
    pub fn source(&self, key: &str) -> Option<&Source> {
        self.settings.get(key).map(|s| &s.source)
    }
}

/// A figment provider holding a fixed dictionary under a name we recognise later.
struct Layer {
    name: &'static str,
    dict: Dict,
}

impl Provider for Layer {
    fn metadata(&self) -> Metadata {
        Metadata::named(self.name)
    }

    fn data(&self) -> Result<Map<Profile, Dict>, figment::Error> {
        Ok(Profile::Default.collect(self.dict.clone()))
    }
}

fn defaults_layer() -> Layer {
    let dict = KEYS
        .iter()
        .filter_map(|k| Some((k.name.to_owned(), Value::from(k.default?))))
        .collect();
    Layer {
        name: DEFAULTS,
        dict,
    }
}

fn env_layer(env: &Environment) -> Layer {
    let dict = KEYS
        .iter()
        .filter_map(|k| {
            let value = if k.empty_is_a_value {
                env.get_even_empty(&k.env)?
            } else {
                env.get(&k.env)?
            };
            Some((k.name.to_owned(), Value::from(value)))
        })
        .collect();
    Layer {
        name: ENVIRONMENT,
        dict,
    }
}

fn flags_layer(args: &SettingFlags) -> Layer {
    let mut dict = Dict::new();
    if let Some(listen) = &args.listen {
        dict.insert(
            ConfigKey::listen.name().to_owned(),
            Value::from(listen.as_str()),
        );
    }
    if let Some(merge) = &args.merge {
        dict.insert(
            ConfigKey::merge.name().to_owned(),
            Value::from(merge.as_str()),
        );
    }
    if let Some(probe) = args.health_probe {
        dict.insert(
            ConfigKey::health_probe_enabled.name().to_owned(),
            Value::from(probe),
        );
    }
    if let Some(format) = &args.log_format {
        dict.insert(
            LoaderKey::log_format.name().to_owned(),
            Value::from(format.as_str()),
        );
    }
    Layer { name: FLAGS, dict }
}

/// Picks the config file: `--config`, else `PDBMUX_CONFIG`, else the first existing file on the
/// search path ([`search_paths`]).
pub fn choose_file(args: &SettingFlags, env: &Environment) -> Result<ConfigFile, LoadError> {
    let given = match (&args.config, env.get("PDBMUX_CONFIG")) {
        (Some(path), _) => Some((path.clone(), "--config")),
        (None, Some(path)) => Some((PathBuf::from(path), "PDBMUX_CONFIG")),
        (None, None) => None,
    };
    if let Some((path, via)) = given {
        return if path.exists() {
            Ok(ConfigFile::Given { path, via })
        } else {
            Err(LoadError::Missing { path, via })
        };
    }
    let searched = search_paths(env);
    match searched.iter().find(|p| p.exists()) {
        Some(path) => Ok(ConfigFile::Found { path: path.clone() }),
        None => Ok(ConfigFile::NotFound { searched }),
    }
}

/// The default search path: the per-user file ([`Environment::user_config`]), then the system one.
pub fn search_paths(env: &Environment) -> Vec<PathBuf> {
    env.user_config()
        .into_iter()
        .chain(std::iter::once(env.system_config().to_path_buf()))
        .collect()
}

/// Gathers every key's raw value from defaults, the config file, `PDBMUX_*` env vars and flags.
///
/// Fails only when a config file cannot be found or read; bad values are reported by
/// [`crate::validate()`].
pub fn load(args: &SettingFlags, env: &Environment) -> Result<Loaded, LoadError> {
    let file = choose_file(args, env)?;
    // Read once: figment parses this text, and problems find their lines in the same text.
    let file_text = match file.path() {
        Some(path) => Some(std::fs::read_to_string(path).map_err(|e| LoadError::File {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?),
        None => None,
    };
    let mut figment = Figment::from(defaults_layer());
    if let Some(text) = &file_text {
        figment = figment.merge(Yaml::string(text));
    }
    figment = figment.merge(env_layer(env)).merge(flags_layer(args));

    let file_error = |e: figment::Error| LoadError::File {
        path: file.path().map(Path::to_path_buf).unwrap_or_default(),
        message: e.kind.to_string(),
    };
    let root = match figment.find_value("").map_err(file_error)? {
        Value::Dict(_, dict) => dict,
        _ => Dict::new(),
    };

    let mut settings = BTreeMap::new();
    let mut unknown_keys = Vec::new();
    for (name, value) in root {
        let Some(key) = keys::find(&name) else {
            unknown_keys.push(name);
            continue;
        };
        let value = match (value, key.default) {
            // An explicit null in the file means "not set": fall back to the default.
            (Value::Empty(..), Some(default)) => Setting {
                value: Value::from(default),
                source: Source::Default,
            },
            (Value::Empty(..), None) => continue,
            (value, _) => {
                let source = match figment.get_metadata(value.tag()) {
                    Some(md) if md.name == DEFAULTS => Source::Default,
                    Some(md) if md.name == ENVIRONMENT => Source::Env(&key.env),
                    Some(md) if md.name == FLAGS => Source::Flag(key.flag.unwrap_or(key.name)),
                    _ => Source::File(file.path().map(Path::to_path_buf).unwrap_or_default()),
                };
                Setting { value, source }
            }
        };
        settings.insert(key.name, value);
    }

    let unknown_vars = env
        .names()
        .filter(|var| keys::is_unknown_var(var, env.get_even_empty(var).unwrap_or_default()))
        .map(str::to_owned)
        .collect();
    Ok(Loaded {
        file,
        settings,
        unknown_keys,
        unknown_vars,
        file_text,
        rust_log: env.get("RUST_LOG").map(str::to_owned),
    })
}

/// YAML for figment, parsed by serde_norway (serde_yaml's maintained fork): the same syntax and
/// messages as figment's own `Yaml`, without the retired serde_yaml.
pub(crate) struct Yaml;

impl Format for Yaml {
    type Error = serde_norway::Error;

    const NAME: &'static str = "YAML";

    fn from_str<T: serde::de::DeserializeOwned>(string: &str) -> Result<T, Self::Error> {
        serde_norway::from_str(string)
    }
}
