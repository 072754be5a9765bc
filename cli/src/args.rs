//! The command line: global flags and subcommands (clap derive).

use std::ffi::OsString;
use std::path::PathBuf;

use clap::builder::BoolishValueParser;
use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand};

/// The version printed by `version` and `--version`: `PDBMUX_BUILD_VERSION` at build time, else
/// the crate version.
pub fn version() -> &'static str {
    option_env!("PDBMUX_BUILD_VERSION").unwrap_or(env!("CARGO_PKG_VERSION"))
}

/// The whole command line.
#[derive(Debug, Clone, Parser)]
#[command(
    about = "Fronts several PuppetDB servers and serves one merged PuppetDB v4 API.",
    after_help = "Every setting can also come from the config file or a PDBMUX_* env var; \
                  run `config show` to see the effective values and where each came from."
)]
pub struct Cli {
    /// Flags accepted before or after any subcommand.
    #[command(flatten)]
    pub global: GlobalArgs,
    /// What to do; `serve` when none is given.
    #[command(subcommand)]
    pub command: Option<Command>,
}

/// Flags that override config keys (the highest-precedence layer) and pick the config file.
#[derive(Debug, Clone, Default, Args)]
pub struct GlobalArgs {
    /// Config file to read (it must exist); for `config init`, the file to write [env: PDBMUX_CONFIG]
    #[arg(long, global = true, value_name = "PATH")]
    pub config: Option<PathBuf>,
    /// Overrides `listen`.
    #[arg(
        long,
        global = true,
        value_name = "ADDR",
        help = "Address to listen on: :PORT, HOST:PORT or [V6]:PORT [env: PDBMUX_LISTEN]"
    )]
    pub listen: Option<String>,
    /// How a node several backends hold is owned: which copy of its facts, catalog and reports answers [env: PDBMUX_MERGE]
    #[arg(long, global = true, value_name = "freshness|static", value_parser = ["freshness", "static"])]
    pub merge: Option<String>,
    /// Probe backends and skip unhealthy ones [env: PDBMUX_HEALTH_PROBE_ENABLED]
    #[arg(long, global = true, value_name = "true|false", value_parser = BoolishValueParser::new())]
    pub health_probe: Option<bool>,
    /// Log format on stderr [env: PDBMUX_LOG_FORMAT]
    #[arg(long, global = true, value_name = "text|json", value_parser = ["text", "json"])]
    pub log_format: Option<String>,
}

/// The subcommands.
#[derive(Debug, Clone, PartialEq, Eq, Subcommand)]
pub enum Command {
    /// Run the server (the default)
    Serve,
    /// Write or inspect the configuration
    Config {
        /// Which config action.
        #[command(subcommand)]
        command: ConfigCommand,
    },
    /// Print the version
    Version,
}

/// The `config` subcommands.
#[derive(Debug, Clone, PartialEq, Eq, Subcommand)]
pub enum ConfigCommand {
    /// Write a commented default config file (--config, PDBMUX_CONFIG, else the per-user path)
    Init {
        /// Overwrite an existing file
        #[arg(long)]
        force: bool,
    },
    /// Print every effective setting and where it came from
    Show,
}

/// Parses `argv` (program name first) for the binary called `binary`.
///
/// A help or version request comes back as an `Err` whose `exit_code()` is 0; print it and exit.
pub fn parse<I, T>(binary: &str, argv: I) -> Result<Cli, clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let mut command = Cli::command()
        .name(binary.to_owned())
        .bin_name(binary.to_owned())
        .version(version());
    let matches = command.try_get_matches_from_mut(argv)?;
    Cli::from_arg_matches(&matches).map_err(|e| e.format(&mut command))
}
