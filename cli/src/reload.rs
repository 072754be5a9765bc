//! Reading the configuration again on SIGHUP (docs/operating.md, "Reload"): the same flags and
//! environment as at start, the config file read afresh, validated like at start. What cannot
//! change without a restart (the listeners, logging) is kept and named in a warning.

use pdbmux_core::config::Config;

use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use crate::keys::{LoadedOnce, LoaderKey};
use crate::{load, validate, Environment, LogFormat, SettingFlags, Settings};

/// What a binary keeps from its start to reload its configuration; handed to `serve` by
/// [`crate::run`].
#[derive(Debug, Clone)]
pub struct Reloader {
    args: SettingFlags,
    env: Environment,
    log_format: LogFormat,
    log_level: String,
    config_watch: Option<Duration>,
    /// The config file's stamp taken before it was read at start.
    started_from: Option<FileStamp>,
}

/// The config file as it is on disk, to tell a change from none ([`Reloader::file_stamp`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileStamp {
    /// The file the path resolves to: a ConfigMap update swaps the symlink it goes through.
    target: PathBuf,
    modified: Option<SystemTime>,
    len: u64,
    /// Device, inode and status change time (seconds, nanoseconds); zeros off Unix.
    identity: (u64, u64, i64, i64),
}

impl FileStamp {
    /// The stamp of the config file these flags and this environment choose: the file its path
    /// resolves to, its modification time and length (and on Unix its device, inode and status
    /// change time, so that an edit keeping mtime and length is seen); `None` when there is none
    /// (none on the search path, or the one named is gone). Compare two to see whether the file
    /// changed (`config_watch_interval`); it reads no content, only metadata.
    pub fn of(args: &SettingFlags, env: &Environment) -> Option<FileStamp> {
        let file = crate::load::choose_file(args, env).ok()?;
        let target = std::fs::canonicalize(file.path()?).ok()?;
        let metadata = std::fs::metadata(&target).ok()?;
        #[cfg(unix)]
        let identity = {
            use std::os::unix::fs::MetadataExt;
            (
                metadata.dev(),
                metadata.ino(),
                metadata.ctime(),
                metadata.ctime_nsec(),
            )
        };
        #[cfg(not(unix))]
        let identity = (0, 0, 0, 0);
        Some(FileStamp {
            target,
            modified: metadata.modified().ok(),
            len: metadata.len(),
            identity,
        })
    }
}

/// Why a reload was refused: every problem, on one line.
#[derive(Debug, thiserror::Error)]
#[error("{}", .problems.join("; "))]
pub struct ReloadError {
    /// Each problem, as `config show` would name it.
    pub problems: Vec<String>,
}

impl Reloader {
    /// A reloader for a process started with these flags and environment into `settings`, from
    /// the config file as `started_from` stamped it before it was read.
    pub fn new(
        args: SettingFlags,
        env: Environment,
        settings: &Settings,
        started_from: Option<FileStamp>,
    ) -> Reloader {
        Reloader {
            args,
            env,
            log_format: settings.log_format,
            log_level: settings.log_level.clone(),
            config_watch: settings.config_watch,
            started_from,
        }
    }

    /// The config file's stamp taken before it was read at start: what a watch compares the
    /// first look with, so that a change while pdbmux was starting is not missed.
    pub fn started_from(&self) -> Option<&FileStamp> {
        self.started_from.as_ref()
    }

    /// The config file's stamp now ([`FileStamp::of`]).
    pub fn file_stamp(&self) -> Option<FileStamp> {
        FileStamp::of(&self.args, &self.env)
    }

    /// The configuration as it reads now, for a process running `running`: the keys `Config::KEYS`
    /// classes as taking a restart (the listeners) stay as they are (a warning says a restart is
    /// needed to move them), as do logging and the config watch. An invalid configuration is an
    /// error and changes nothing.
    pub fn reload(&self, running: &Config) -> Result<Config, ReloadError> {
        let loaded = load(&self.args, &self.env).map_err(|error| ReloadError {
            problems: vec![error.to_string()],
        })?;
        let checked = validate::check(&loaded);
        let settings = match checked.settings {
            Some(settings) if checked.problems.is_empty() => settings,
            _ => {
                return Err(ReloadError {
                    problems: checked.problems.iter().map(ToString::to_string).collect(),
                })
            }
        };
        for (key, from) in &checked.clamped {
            tracing::warn!(key, from = %from, "{key} is above the cap; clamped");
        }
        let mut config = settings.config;
        let mut needs_restart = config.keep_restart_keys(running);
        // The loader's own keys a reload leaves, each compared with its running value.
        let running_once = LoadedOnce {
            log_format: self.log_format,
            log_level: &self.log_level,
            config_watch: self.config_watch,
        };
        let loaded_once = LoadedOnce {
            log_format: settings.log_format,
            log_level: &settings.log_level,
            config_watch: settings.config_watch,
        };
        needs_restart.extend(
            LoaderKey::ALL
                .iter()
                .filter(|key| key.restart_value(&running_once) != key.restart_value(&loaded_once))
                .map(|key| key.name()),
        );
        if !needs_restart.is_empty() {
            tracing::warn!(
                "reload: {} changed; that takes a restart, the running value stays",
                needs_restart.join(", ")
            );
        }
        Ok(config)
    }
}
