//! The command line: the subcommands and the flags each takes (clap derive).

use std::ffi::OsString;
use std::path::PathBuf;

use clap::builder::BoolishValueParser;
use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand};

/// The version printed by `version` and `--version`: `PDBMUX_BUILD_VERSION` at build time, else
/// the crate version.
pub fn version() -> &'static str {
    option_env!("PDBMUX_BUILD_VERSION").unwrap_or(env!("CARGO_PKG_VERSION"))
}

/// The whole command line: `pdbmux [FLAGS]` serves, as does `pdbmux serve [FLAGS]`; each other
/// subcommand takes only its own flags.
#[derive(Debug, Clone, Parser)]
#[command(
    about = "Fronts several PuppetDB servers and serves one merged PuppetDB v4 API.",
    after_help = "Every setting can also come from the config file or a PDBMUX_* env var; \
                  run `config show` to see the effective values and where each came from.",
    args_conflicts_with_subcommands = true
)]
pub struct Cli {
    /// The settings flags of `serve`, for `pdbmux` run without a subcommand.
    #[command(flatten)]
    pub flags: SettingFlags,
    /// What to do; `serve` when none is given.
    #[command(subcommand)]
    pub command: Option<Command>,
}

impl Cli {
    /// The command to run: the one given, else `serve` with the flags given before it.
    pub fn into_command(self) -> Command {
        self.command.unwrap_or(Command::Serve(self.flags))
    }
}

/// The flags of `serve` and `config show`: the config file to read, and the keys that have a
/// flag (the highest-precedence layer).
#[derive(Debug, Clone, Default, Args)]
pub struct SettingFlags {
    /// Config file to read; it must exist [env: PDBMUX_CONFIG]
    #[arg(long, value_name = "PATH")]
    pub config: Option<PathBuf>,
    /// Overrides `listen`.
    #[arg(
        long,
        value_name = "ADDR",
        help = "Address to listen on: :PORT, HOST:PORT or [V6]:PORT [env: PDBMUX_LISTEN]"
    )]
    pub listen: Option<String>,
    /// Which backend's copy answers for a node several backends hold (its facts, catalog and reports) [env: PDBMUX_MERGE]
    #[arg(long, value_name = "freshness|static", value_parser = ["freshness", "static"])]
    pub merge: Option<String>,
    /// Probe backends and skip unhealthy ones [env: PDBMUX_HEALTH_PROBE_ENABLED]
    #[arg(long, value_name = "true|false", value_parser = BoolishValueParser::new())]
    pub health_probe: Option<bool>,
    /// Log format on stderr [env: PDBMUX_LOG_FORMAT]
    #[arg(long, value_name = "text|json", value_parser = ["text", "json"])]
    pub log_format: Option<String>,
}

/// The flags of `config init`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Args)]
pub struct InitFlags {
    /// File to write; default: $PDBMUX_CONFIG, else $XDG_CONFIG_HOME/pdbmux/config.yaml (or ~/.config/pdbmux/config.yaml)
    #[arg(long, value_name = "PATH")]
    pub config: Option<PathBuf>,
    /// Overwrite an existing file
    #[arg(long)]
    pub force: bool,
}

/// The subcommands.
#[derive(Debug, Clone, Subcommand)]
pub enum Command {
    /// Run the server (the default)
    Serve(SettingFlags),
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
#[derive(Debug, Clone, Subcommand)]
pub enum ConfigCommand {
    /// Write a commented config file holding every default
    Init(InitFlags),
    /// Print every effective setting and where it came from
    Show(SettingFlags),
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
