//! Logging setup: tracing-subscriber's fmt layer on stderr, text or JSON, with an env filter.

use tracing_subscriber::EnvFilter;

use crate::LogFormat;

/// Why logging could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum LoggingError {
    /// The level is not a valid filter (validation normally catches this first).
    #[error("log_level: invalid log filter \"{value}\": {reason}")]
    Filter {
        /// The filter as given.
        value: String,
        /// The parser's complaint.
        reason: String,
    },
    /// A global subscriber is already installed (a second call in one process).
    #[error("logging is already set up")]
    AlreadySet,
}

/// Installs the global subscriber: `format` on stderr, filtered by `level` (an `EnvFilter`
/// directive such as `info` or `pdbmux=debug,info`). Call once, before serving.
pub fn init_logging(format: LogFormat, level: &str) -> Result<(), LoggingError> {
    let filter = EnvFilter::try_new(level).map_err(|e| LoggingError::Filter {
        value: level.to_owned(),
        reason: e.to_string(),
    })?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    let installed = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
    installed.map_err(|_| LoggingError::AlreadySet)
}
