//! `config init`: writes a commented config file holding every key's default.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::PathBuf;

use crate::args::InitFlags;
use crate::env::Environment;
use pdbmux_core::config::ConfigKey;

use crate::keys::{LoaderKey, KEYS};

/// Why `config init` wrote nothing.
#[derive(Debug, thiserror::Error)]
pub enum InitError {
    /// Neither a path nor `XDG_CONFIG_HOME`/`HOME` to derive one from.
    #[error(
        "no path for the config file: pass --config or set PDBMUX_CONFIG, XDG_CONFIG_HOME or HOME"
    )]
    NoPath,
    /// The file exists and `--force` was not given.
    #[error("\"{}\" already exists (use --force to overwrite)", path.display())]
    Exists {
        /// The file.
        path: PathBuf,
    },
    /// Creating the parent directory or writing the file failed.
    #[error("cannot write \"{}\": {source}", path.display())]
    Write {
        /// The file or directory.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
}

/// Where `config init` writes: `--config`, else `PDBMUX_CONFIG`, else the per-user path.
pub fn init_path(args: &InitFlags, env: &Environment) -> Option<PathBuf> {
    args.config
        .clone()
        .or_else(|| env.get("PDBMUX_CONFIG").map(PathBuf::from))
        .or_else(|| env.user_config())
}

const BACKENDS_EXAMPLE: &str = "\
# backends:                             # the PuppetDBs; order is a tie-break only, not a ranking
#   - name: pdb-a
#     url: http://puppetdb-a.example.com:8080
#   - name: pdb-b
#     url: https://puppetdb-b.example.com:8081
#     tls_ca_file: /etc/pdbmux/ca.pem           # a backend's own TLS files override the global ones
#     tls_cert_file: /etc/pdbmux/client.pem
#     tls_key_file: /etc/pdbmux/client-key.pem
";

/// The commented default config file `config init` writes.
///
/// Keys without a default (backends, TLS files) and `log_level` (so `RUST_LOG` still applies)
/// are commented out; every other key is set to its default.
pub fn template() -> String {
    let mut out = String::from(
        "# pdbmux configuration.\n\
         # Precedence: defaults < this file < PDBMUX_* env vars < flags; `pdbmux config show` prints\n\
         # the effective values. Durations are <number><unit> pairs written together, units ns us ms\n\
         # s m h (500ms, 10s, 1m30s, 1.5s, 2h; 0 needs no unit).\n\n",
    );
    for key in KEYS.iter() {
        if key.name == ConfigKey::backends.name() {
            out.push_str(BACKENDS_EXAMPLE);
            continue;
        }
        let (prefix, value) = match key.default {
            Some(default) if key.name == LoaderKey::log_level.name() => ("# ", default.to_owned()),
            Some(default) if default.contains(':') => ("", format!("\"{default}\"")),
            Some(default) => ("", default.to_owned()),
            None => ("# ", example_value(key.name)),
        };
        let setting = format!("{prefix}{}: {value}", key.name);
        out.push_str(&format!("{setting:<38}  # {}\n", key.comment));
    }
    out
}

/// The value shown, commented out, for a key without a default: a URL or a file.
fn example_value(key: &str) -> String {
    if key == LoaderKey::cache_redis_url.name() {
        return "redis://127.0.0.1:6379".to_owned();
    }
    let file = if key == LoaderKey::tls_ca_file.name() {
        "ca.pem"
    } else if key == LoaderKey::tls_cert_file.name() {
        "client.pem"
    } else {
        "client-key.pem"
    };
    format!("/etc/pdbmux/{file}")
}

/// Writes [`template`] to [`init_path`], creating parent directories; refuses to overwrite an
/// existing file unless `--force`. Returns the path written.
pub fn init(args: &InitFlags, env: &Environment) -> Result<PathBuf, InitError> {
    let force = args.force;
    let path = init_path(args, env).ok_or(InitError::NoPath)?;
    if !force && path.exists() {
        return Err(InitError::Exists { path });
    }
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(|source| InitError::Write {
            path: parent.to_path_buf(),
            source,
        })?;
    }
    let mut options = OpenOptions::new();
    options.write(true);
    if force {
        options.create(true).truncate(true);
    } else {
        options.create_new(true);
    }
    let write = options
        .open(&path)
        .and_then(|mut file| file.write_all(template().as_bytes()));
    match write {
        Ok(()) => Ok(path),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Err(InitError::Exists { path }),
        Err(source) => Err(InitError::Write { path, source }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every key of the table has its line, with its comment: set to its default, or commented
    /// out when it has none (and `log_level`, so that `RUST_LOG` still applies).
    #[test]
    fn the_template_has_a_line_for_every_key() {
        let text = template();
        for key in KEYS.iter() {
            let set = format!("{}: ", key.name);
            let commented = format!("# {}:", key.name);
            let line = text
                .lines()
                .find(|line| line.starts_with(&set) || line.starts_with(&commented))
                .unwrap_or_else(|| panic!("no line for {}:\n{text}", key.name));
            assert!(line.contains("  # "), "no comment on {line:?}");
            match key.default {
                Some(default) if key.name != LoaderKey::log_level.name() => {
                    assert!(line.starts_with(&set), "{line:?} sets {}", key.name);
                    assert!(line.contains(default), "{line:?} holds {default}");
                }
                _ => assert!(line.starts_with(&commented), "{line:?} is commented out"),
            }
        }
    }
}
