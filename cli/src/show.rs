//! `config show`: every effective value, one per line, with where it came from.

use pdbmux_core::config::ConfigKey;

use crate::keys::{LoaderKey, KEYS};
use crate::load::{ConfigFile, Loaded, Source};
use crate::validate::{check, raw_display, ValidateError};
use crate::Settings;

/// What `config show` prints, and whether the configuration validated.
#[derive(Debug, Clone)]
pub struct Shown {
    /// The lines for stdout, `<key> : <value>  (<source>)`.
    pub lines: Vec<String>,
    /// The validated settings, or every problem found.
    pub result: Result<Settings, ValidateError>,
}

fn line(key: &str, value: &str, source: &str) -> String {
    format!("{key} : {value}  ({source})")
}

/// Renders every key's effective value and source; bad values are shown as given, marked invalid.
pub fn show(loaded: &Loaded) -> Shown {
    let checked = check(loaded);
    let mut lines = Vec::new();

    lines.push(match loaded.file() {
        ConfigFile::Given { path, via } => line("config", &path.display().to_string(), via),
        ConfigFile::Found { path } => line(
            "config",
            &path.display().to_string(),
            "first found on the search path",
        ),
        ConfigFile::NotFound { searched } => {
            let list: Vec<String> = searched.iter().map(|p| p.display().to_string()).collect();
            line("config", "none", &format!("searched {}", list.join(", ")))
        }
    });

    for key in KEYS.iter() {
        let source = loaded.source(key.name);
        if key.name == ConfigKey::backends.name() {
            if checked.backends.is_empty() {
                let value = match loaded.settings.get(key.name) {
                    Some(setting) => format!("{} (invalid)", raw_display(&setting.value)),
                    None => "(none)".to_owned(),
                };
                let source = source.map_or("not set".to_owned(), Source::to_string);
                lines.push(line(key.name, &value, &source));
            }
            for (i, backend) in checked.backends.iter().enumerate() {
                lines.push(line(
                    &format!("{}[{i}]", key.name),
                    &backend.line,
                    &backend.source.to_string(),
                ));
                for (field, path, source) in &backend.tls {
                    lines.push(line(
                        &format!("{}[{i}].{field}", key.name),
                        &path.display().to_string(),
                        &source.to_string(),
                    ));
                }
            }
            continue;
        }
        let source = if key.name == LoaderKey::log_level.name() {
            checked.log_level_source.as_ref().or(source)
        } else {
            source
        };
        let value = match (checked.shown.get(key.name), loaded.settings.get(key.name)) {
            (Some(value), _) => value.clone(),
            (None, Some(setting)) => format!("{} (invalid)", raw_display(&setting.value)),
            (None, None) => "(none)".to_owned(),
        };
        let source = source.map_or("default".to_owned(), Source::to_string);
        lines.push(line(key.name, &value, &source));
    }

    let result = match checked.settings {
        Some(settings) if checked.problems.is_empty() => Ok(settings),
        _ => Err(ValidateError {
            problems: checked.problems,
        }),
    };
    Shown { lines, result }
}
