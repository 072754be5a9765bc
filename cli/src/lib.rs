//! Config loading, the command line and logging setup shared by the pdbmux binaries.
//!
//! A binary's `main` is one call: [`run`] with its name and a `serve` function that receives the
//! validated [`Settings`]. The lower-level steps ([`load()`], [`validate()`], [`show()`], [`init()`]) are
//! public for tests and tools.
//!
//! Configuration precedence, lowest to highest: defaults < config file < `PDBMUX_*` env vars <
//! flags.

#![forbid(unsafe_code)]

pub mod args;
pub mod duration;
pub mod env;
pub mod init;
mod keys;
mod limits;
pub mod load;
pub mod logging;
pub mod origin;
pub mod reload;
pub mod show;
pub mod validate;

use std::ffi::OsString;
use std::io::Write;
use std::process::ExitCode;

pub use args::{version, Cli, Command, ConfigCommand, InitFlags, SettingFlags};
pub use env::Environment;
pub use init::{init, template, InitError};
pub use keys::names as key_names;
pub use load::{load, ConfigFile, LoadError, Loaded, Source};
pub use logging::{init_logging, LoggingError};
pub use origin::Origin;
pub use reload::{FileStamp, ReloadError, Reloader};
pub use show::{show, Shown};
pub use validate::{parse_backend_url, validate, ConfigProblem, Problem, ValidateError};

/// The error type a `serve` function returns.
pub type ServeError = Box<dyn std::error::Error + Send + Sync>;

/// Exit code for usage and configuration errors.
pub const EXIT_USAGE: u8 = 2;
/// Exit code for a failure while serving (or writing a config file).
pub const EXIT_FAILURE: u8 = 1;

/// The log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    /// Human-readable lines (the default).
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

impl LogFormat {
    /// The spelling used in config files, env vars and flags.
    pub fn as_str(self) -> &'static str {
        match self {
            LogFormat::Text => "text",
            LogFormat::Json => "json",
        }
    }
}

/// What `serve` needs: the validated config plus logging choices.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// The validated configuration.
    pub config: pdbmux_core::config::Config,
    /// The log format (logging is already set up when `serve` is called).
    pub log_format: LogFormat,
    /// The `EnvFilter` directive in effect (`log_level`, else `RUST_LOG`, else `info`).
    pub log_level: String,
    /// The config file loaded, or the paths searched; for a startup log line.
    pub config_source: String,
    /// How often the config file is looked at for a change, which is then read like a SIGHUP
    /// (`config_watch_interval`); `None`: only on SIGHUP. Fixed at start, like the listeners.
    pub config_watch: Option<std::time::Duration>,
}

/// Loads and validates the configuration in one step; for callers that need no `config show`.
pub fn settings(args: &SettingFlags, env: &Environment) -> Result<Settings, ConfigError> {
    Ok(validate(&load(args, env)?)?)
}

/// Why [`settings`] failed.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The config file could not be found or read.
    #[error(transparent)]
    Load(#[from] LoadError),
    /// Some values are invalid.
    #[error(transparent)]
    Invalid(#[from] ValidateError),
}

/// Parses argv, handles `config init`/`config show`/`version` itself, sets up logging, and calls
/// `serve` for the serve command, with the [`Reloader`] that reads its configuration again. Returns the process exit code: errors go to stderr as
/// `<binary>: <error>`; 2 for usage and config errors, 1 for a serve error.
pub fn run<F>(binary: &str, serve: F) -> ExitCode
where
    F: FnOnce(Settings, Reloader) -> Result<(), ServeError>,
{
    // Until the runtime installs its reload handler, a SIGHUP (an early `systemctl reload`)
    // must not end the process; this handler only records it.
    #[cfg(unix)]
    let _ = signal_hook::flag::register(
        signal_hook::consts::SIGHUP,
        std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false)),
    );
    let env = Environment::from_process();
    let code = run_with(
        binary,
        std::env::args_os(),
        &env,
        &mut std::io::stdout(),
        &mut std::io::stderr(),
        serve,
    );
    ExitCode::from(code)
}

/// [`run`] with argv, the environment and the output streams passed in; returns the exit code.
///
/// For tests. Note that the serve path installs the global log subscriber (once per process).
pub fn run_with<I, T, F>(
    binary: &str,
    argv: I,
    env: &Environment,
    out: &mut dyn Write,
    err: &mut dyn Write,
    serve: F,
) -> u8
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
    F: FnOnce(Settings, Reloader) -> Result<(), ServeError>,
{
    let cli = match args::parse(binary, argv) {
        Ok(cli) => cli,
        Err(e) => {
            let _ = if e.use_stderr() {
                write!(err, "{}", e.render())
            } else {
                write!(out, "{}", e.render())
            };
            return u8::try_from(e.exit_code()).unwrap_or(EXIT_USAGE);
        }
    };
    match cli.into_command() {
        Command::Version => {
            let _ = writeln!(out, "{binary} {}", version());
            0
        }
        Command::Config {
            command: ConfigCommand::Init(flags),
        } => match init(&flags, env) {
            Ok(path) => {
                let _ = writeln!(out, "wrote {}", path.display());
                0
            }
            Err(e) => fail(binary, err, &e, EXIT_FAILURE),
        },
        Command::Config {
            command: ConfigCommand::Show(flags),
        } => {
            let loaded = match load(&flags, env) {
                Ok(loaded) => loaded,
                Err(e) => return fail(binary, err, &e, EXIT_USAGE),
            };
            let shown = show(&loaded);
            for line in &shown.lines {
                let _ = writeln!(out, "{line}");
            }
            match shown.result {
                Ok(_) => 0,
                Err(e) => {
                    for problem in &e.problems {
                        fail(binary, err, problem, EXIT_USAGE);
                    }
                    EXIT_USAGE
                }
            }
        }
        Command::Serve(flags) => {
            // Before the file is read: a change from here on is one the watch must see.
            let started_from = FileStamp::of(&flags, env);
            let loaded = match load(&flags, env) {
                Ok(loaded) => loaded,
                Err(e) => return fail(binary, err, &e, EXIT_USAGE),
            };
            let checked = validate::check(&loaded);
            let settings = match checked.settings {
                Some(settings) if checked.problems.is_empty() => settings,
                _ => {
                    for problem in &checked.problems {
                        fail(binary, err, problem, EXIT_USAGE);
                    }
                    return EXIT_USAGE;
                }
            };
            match init_logging(settings.log_format, &settings.log_level) {
                Ok(()) | Err(LoggingError::AlreadySet) => {}
                Err(e) => return fail(binary, err, &e, EXIT_USAGE),
            }
            for (key, from) in &checked.clamped {
                tracing::warn!(
                    key,
                    from = %from,
                    cap = %duration::format(pdbmux_core::config::FACTS_TTL_CAP),
                    "{key} is above the cap; clamped"
                );
            }
            if let Some((before, after)) = limits::raise_open_files_limit() {
                tracing::info!("open files limit raised from {before} to {after}");
            }
            let reloader = Reloader::new(flags, env.clone(), &settings, started_from);
            match serve(settings, reloader) {
                Ok(()) => 0,
                Err(e) => fail(binary, err, &e, EXIT_FAILURE),
            }
        }
    }
}

/// Prints `<binary>: <message>` to `err` and returns `code`.
fn fail(binary: &str, err: &mut dyn Write, message: &dyn std::fmt::Display, code: u8) -> u8 {
    let _ = writeln!(err, "{binary}: {message}");
    code
}
