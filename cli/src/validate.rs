//! Turning gathered raw values into a validated [`Config`], naming the key and value of every
//! problem.

use std::collections::{BTreeMap, HashSet};
use std::net::Ipv6Addr;
use std::path::PathBuf;
use std::time::Duration;

use figment::value::{Num, Value};
use pdbmux_core::config::{
    BackendConfig, BackendUrl, CacheBackend, Config, ConfigKey, MergeStrategy, Secret, TlsFiles,
    FACTS_TTL_CAP,
};

use crate::duration;
use crate::keys::{self, LoaderKey, BACKEND_KEYS};
use crate::load::{Loaded, Setting, Source};
use crate::origin::{self, Origin};
use crate::{LogFormat, Settings};

/// The longest duration any key takes: longer is surely a mistake, and a deadline that far off
/// would overflow the clock (`Instant + Duration`) where it is computed.
const MAX_DURATION: Duration = Duration::from_secs(365 * 24 * 60 * 60);

/// The floors of durations and sizes (docs/operating.md, "Floors"): each is the least value at
/// which the key still does its job; below it, a value is a mistake that would hurt the estate.
/// An upstream request (and so a probe) cannot be answered by a PuppetDB in less than this.
const MIN_TIMEOUT: Duration = Duration::from_millis(100);
/// A probe more often than this only loads the backend.
const MIN_PROBE_INTERVAL: Duration = Duration::from_millis(100);
/// See [`MIN_TIMEOUT`].
const MIN_PROBE_TIMEOUT: Duration = Duration::from_millis(100);
/// A membership refresh asks every backend for every node: more often than this is a loop.
const MIN_FRESHNESS_TTL: Duration = Duration::from_secs(1);
/// A client on a slow link takes this long for a head or a write.
const MIN_CLIENT_TIMEOUT: Duration = Duration::from_secs(1);
/// No merge over HTTP keeps a p99 below this: a smaller objective is a mistaken unit, and its
/// alert would never be quiet.
const MIN_LATENCY_OBJECTIVE: Duration = Duration::from_millis(10);
/// Looking at the config file more often than this only costs system calls: a ConfigMap update
/// takes the kubelet a minute or so to arrive anyway.
const MIN_CONFIG_WATCH: Duration = Duration::from_secs(1);
/// A cache TTL other than 0 (off): ages are whole seconds.
const MIN_FACTS_TTL: Duration = Duration::from_secs(1);
/// PuppetDB's status answer (the health probe's) is about this long: a smaller body limit fails
/// every probe.
const MIN_BODY_BYTES: u64 = 1024;
/// A cache budget or entry limit smaller than this holds nothing worth keeping.
const MIN_CACHE_BYTES: u64 = 1024;
/// See [`MIN_CACHE_BYTES`].
const MIN_ENTRY_BYTES: u64 = 1024;
/// The shortest shared-store secret: 128 bits.
const MIN_SECRET_BYTES: usize = 16;

/// One problem with one key's value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigProblem {
    /// A duration that does not parse.
    #[error("{key}: invalid duration \"{value}\": {reason}")]
    InvalidDuration {
        /// The key.
        key: String,
        /// The value as given.
        value: String,
        /// Why it does not parse.
        reason: String,
    },
    /// A number that has to be an integer is not one.
    #[error("{key}: \"{value}\" is not a plain integer")]
    NotInteger {
        /// The key.
        key: String,
        /// The value as given.
        value: String,
    },
    /// An integer below its minimum.
    #[error("{key}: must be at least {min}, got {got}")]
    TooSmall {
        /// The key.
        key: String,
        /// The smallest allowed value.
        min: u64,
        /// The value given.
        got: i128,
    },
    /// An integer above its maximum.
    #[error("{key}: must be at most {max}, got {got}")]
    TooLarge {
        /// The key.
        key: String,
        /// The largest allowed value.
        max: u64,
        /// The value given.
        got: i128,
    },
    /// A duration under the smallest value its key takes.
    #[error("{key}: \"{value}\" is below the floor of {floor}")]
    BelowFloor {
        /// The key.
        key: String,
        /// The value as given.
        value: String,
        /// The floor, as a duration.
        floor: String,
    },
    /// A file a key names cannot be read, or does not hold what it must.
    #[error("{key}: {path}: {reason}")]
    File {
        /// The key.
        key: &'static str,
        /// The file.
        path: String,
        /// What is wrong.
        reason: String,
    },
    /// A boolean that is not one.
    #[error("{key}: \"{value}\" is not true or false")]
    NotBool {
        /// The key.
        key: String,
        /// The value as given.
        value: String,
    },
    /// A value outside a fixed set.
    #[error("{key}: unknown value \"{value}\" (expected {expected})")]
    UnknownValue {
        /// The key.
        key: String,
        /// The value as given.
        value: String,
        /// The allowed values, in words.
        expected: &'static str,
    },
    /// A value of the wrong shape (a list where one value belongs, and so on).
    #[error("{key}: expected {expected}, got {found}")]
    WrongShape {
        /// The key.
        key: String,
        /// What belongs there.
        expected: &'static str,
        /// What was there.
        found: String,
    },
    /// A value that breaks a key-specific rule.
    #[error("{key}: \"{value}\" {reason}")]
    Invalid {
        /// The key.
        key: String,
        /// The value as given.
        value: String,
        /// The rule, e.g. `must start with /`.
        reason: &'static str,
    },
    /// A key with a default has no value at all (cannot happen through [`crate::load()`]).
    #[error("{key}: not set")]
    Missing {
        /// The key.
        key: String,
    },
    /// A key in the config file pdbmux does not know (a typo, most likely).
    #[error("{key}: unknown key{}", did_you_mean(*suggestion))]
    UnknownKey {
        /// The key as written.
        key: String,
        /// The known key it is most likely a misspelling of.
        suggestion: Option<&'static str>,
    },
    /// A `PDBMUX_*` environment variable pdbmux does not read (a typo, most likely): refused like
    /// an unknown key, so that a misspelled setting never goes unnoticed.
    #[error("{var}: unknown variable{}", did_you_mean(*suggestion))]
    UnknownVariable {
        /// The variable.
        var: String,
        /// The known variable it is most likely a misspelling of.
        suggestion: Option<&'static str>,
    },
    /// No backends at all.
    #[error("backends: none configured (set backends in {} or PDBMUX_BACKENDS=name=url,...)", match file {
        Some(path) => path.display().to_string(),
        None => "a config file".to_owned(),
    })]
    NoBackends {
        /// The config file read, if any: where they would go.
        file: Option<PathBuf>,
    },
    /// Two backends share a name.
    #[error("backends: duplicate name \"{name}\"")]
    DuplicateBackend {
        /// The name.
        name: String,
    },
    /// A backend URL that is not `http(s)://host[:port]`.
    #[error("backends[{index}].url: \"{value}\" is not http(s)://host[:port]: {reason}")]
    BadBackendUrl {
        /// The backend's position, from 0.
        index: usize,
        /// The URL as given.
        value: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A backend entry in the file without `name` or `url`.
    #[error("backends[{index}].{field}: missing")]
    BackendFieldMissing {
        /// The backend's position, from 0.
        index: usize,
        /// `name` or `url`.
        field: &'static str,
    },
    /// A backend entry in the file with a key pdbmux does not know.
    #[error("backends[{index}]: unknown key \"{field}\" ({})", match suggestion {
        Some(near) => format!("did you mean {near}?"),
        None => "expected one of name, url, tls_ca_file, tls_cert_file, tls_key_file".to_owned(),
    })]
    UnknownBackendKey {
        /// The backend's position, from 0.
        index: usize,
        /// The key as written.
        field: String,
        /// The backend key it is most likely a misspelling of.
        suggestion: Option<&'static str>,
    },
    /// A `name=url,...` entry (`PDBMUX_BACKENDS`, or `backends` as a string) that is not one.
    #[error("backends: malformed entry \"{entry}\" (expected name=url)")]
    BadBackendsEntry {
        /// The entry as given.
        entry: String,
    },
    /// A backend ends up with a client certificate but no key, or the reverse.
    #[error("backends[{index}] ({name}): tls_cert_file and tls_key_file must be set together")]
    TlsPair {
        /// The backend's position, from 0.
        index: usize,
        /// The backend's name.
        name: String,
    },
    /// A log filter `tracing-subscriber` does not accept.
    #[error("{key}: invalid log filter \"{value}\": {reason}")]
    BadLogFilter {
        /// `log_level` or `RUST_LOG`.
        key: &'static str,
        /// The value as given.
        value: String,
        /// The parser's complaint.
        reason: String,
    },
}

/// `" (did you mean x?)"`, or nothing without a suggestion.
fn did_you_mean(suggestion: Option<&str>) -> String {
    suggestion.map_or_else(String::new, |near| format!(" (did you mean {near}?)"))
}

impl ConfigProblem {
    /// The top-level key the problem is about, and for a problem with one entry of `backends`
    /// its position and field; `None` for a problem that names its own source.
    fn subject(&self) -> Option<Subject<'_>> {
        use ConfigProblem as P;
        /// `key`, `key[i]` or `key[i].field`.
        fn of_key(key: &str) -> Subject<'_> {
            let (path, field) = match key.split_once('.') {
                Some((path, field)) => (path, Some(field)),
                None => (key, None),
            };
            match path.split_once('[') {
                Some((top, rest)) => Subject {
                    key: top,
                    item: rest.strip_suffix(']').and_then(|i| i.parse().ok()),
                    field,
                },
                None => Subject::key(path),
            }
        }
        let entry = |index: usize, field: Option<&'static str>| Subject {
            key: ConfigKey::backends.name(),
            item: Some(index),
            field,
        };
        match self {
            P::InvalidDuration { key, .. }
            | P::NotInteger { key, .. }
            | P::TooSmall { key, .. }
            | P::TooLarge { key, .. }
            | P::BelowFloor { key, .. }
            | P::NotBool { key, .. }
            | P::UnknownValue { key, .. }
            | P::WrongShape { key, .. }
            | P::Invalid { key, .. }
            | P::Missing { key } => Some(of_key(key)),
            // Written as is in the file, dots and brackets included.
            P::UnknownKey { key, .. } => Some(Subject::key(key)),
            P::File { key, .. } => Some(of_key(key)),
            P::BadLogFilter { key, .. } => Some(Subject::key(key)),
            P::BadBackendUrl { index, .. } => Some(entry(*index, Some("url"))),
            P::UnknownBackendKey { index, field, .. } => Some(Subject {
                field: Some(field),
                ..entry(*index, None)
            }),
            P::BackendFieldMissing { index, .. } | P::TlsPair { index, .. } => {
                Some(entry(*index, None))
            }
            P::NoBackends { .. } | P::DuplicateBackend { .. } | P::BadBackendsEntry { .. } => {
                Some(Subject::key(ConfigKey::backends.name()))
            }
            P::UnknownVariable { .. } => None,
        }
    }
}

/// What a problem is about, as far as finding its line goes.
struct Subject<'a> {
    /// The top-level key.
    key: &'a str,
    /// The list item, for a problem with one entry of `backends`.
    item: Option<usize>,
    /// The item's field, when the problem is about one.
    field: Option<&'a str>,
}

impl Subject<'_> {
    fn key(key: &str) -> Subject<'_> {
        Subject {
            key,
            item: None,
            field: None,
        }
    }
}

/// One problem and where its value was set: the message a user reads, with its source first.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}{problem}", origin.as_ref().map_or_else(String::new, |o| format!("{o}: ")))]
pub struct Problem {
    /// Where the value was set; `None` for a default, or a problem that names its own source.
    pub origin: Option<Origin>,
    /// What is wrong.
    pub problem: ConfigProblem,
}

impl Problem {
    /// `problem`, with the place `loaded` took its value from: the config file's line, the
    /// environment variable, or the flag.
    fn locate(problem: ConfigProblem, loaded: &Loaded) -> Problem {
        let origin = problem.subject().and_then(|subject| {
            let source = match &problem {
                // An unknown key has no setting; it can only be in the file.
                ConfigProblem::UnknownKey { .. } => {
                    Source::File(loaded.file.path().map(PathBuf::from).unwrap_or_default())
                }
                _ => loaded.settings.get(subject.key)?.source.clone(),
            };
            match source {
                Source::Default => None,
                Source::Env(var) => Some(Origin::Env(var)),
                Source::Flag(flag) => Some(Origin::Flag(flag)),
                Source::File(path) => {
                    let text = loaded.file_text.as_deref().unwrap_or_default();
                    let item = subject.item.and_then(|i| match subject.field {
                        Some(field) => origin::item_field_line(text, subject.key, i, field),
                        None => origin::item_line(text, subject.key, i),
                    });
                    let line = item.or_else(|| origin::key_line(text, subject.key));
                    Some(Origin::File { path, line })
                }
            }
        });
        Problem { origin, problem }
    }
}

/// Every problem found while validating, in key order.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", problems.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
pub struct ValidateError {
    /// The problems; never empty.
    pub problems: Vec<Problem>,
}

/// One backend as `config show` prints it.
#[derive(Debug, Clone)]
pub(crate) struct BackendShown {
    pub line: String,
    pub source: Source,
    pub tls: Vec<(&'static str, PathBuf, Source)>,
}

/// Everything validation learned: normalized values for `config show`, problems, the result.
#[derive(Debug, Clone)]
pub(crate) struct Checked {
    pub shown: BTreeMap<&'static str, String>,
    pub backends: Vec<BackendShown>,
    pub log_level_source: Option<Source>,
    /// The cache TTLs above the cap, clamped to it: each key and the value as written.
    pub clamped: Vec<(&'static str, String)>,
    pub problems: Vec<Problem>,
    pub settings: Option<Settings>,
}

/// Validates gathered values into [`Settings`]; the error lists every bad key.
pub fn validate(loaded: &Loaded) -> Result<Settings, ValidateError> {
    let checked = check(loaded);
    match checked.settings {
        Some(settings) if checked.problems.is_empty() => Ok(settings),
        _ => Err(ValidateError {
            problems: checked.problems,
        }),
    }
}

/// A scalar's text: strings as they are, numbers and booleans as written.
fn scalar_text(value: &Value) -> Option<String> {
    match value {
        Value::String(_, s) => Some(s.clone()),
        Value::Char(_, c) => Some(c.to_string()),
        Value::Bool(_, b) => Some(b.to_string()),
        Value::Num(_, n) => Some(num_text(*n)),
        _ => None,
    }
}

fn num_text(n: Num) -> String {
    if let Some(u) = n.to_u128() {
        u.to_string()
    } else if let Some(i) = n.to_i128() {
        i.to_string()
    } else {
        n.to_f64().map(|f| f.to_string()).unwrap_or_default()
    }
}

/// A short description of a value's shape, for [`ConfigProblem::WrongShape`].
fn shape(value: &Value) -> String {
    match value {
        Value::Dict(..) => "a mapping".to_owned(),
        Value::Array(..) => "a list".to_owned(),
        Value::Empty(..) => "nothing".to_owned(),
        other => format!("\"{}\"", scalar_text(other).unwrap_or_default()),
    }
}

/// The raw value as `config show` prints it when it did not validate.
pub(crate) fn raw_display(value: &Value) -> String {
    match scalar_text(value) {
        Some(text) => format!("{text:?}"),
        None => shape(value),
    }
}

struct Checker<'a> {
    loaded: &'a Loaded,
    problems: Vec<ConfigProblem>,
    shown: BTreeMap<&'static str, String>,
}

impl<'a> Checker<'a> {
    fn setting(&self, key: &str) -> Option<&'a Setting> {
        self.loaded.settings.get(key)
    }

    /// The text of a key that always has a value (a default at least).
    fn scalar(&mut self, key: &'static str) -> Option<String> {
        let Some(setting) = self.setting(key) else {
            self.problems.push(ConfigProblem::Missing {
                key: key.to_owned(),
            });
            return None;
        };
        self.scalar_of(key, &setting.value)
    }

    fn scalar_of(&mut self, key: &str, value: &Value) -> Option<String> {
        let text = scalar_text(value);
        if text.is_none() {
            self.problems.push(ConfigProblem::WrongShape {
                key: key.to_owned(),
                expected: "a single value",
                found: shape(value),
            });
        }
        text
    }

    fn show(&mut self, key: &'static str, text: impl Into<String>) {
        self.shown.insert(key, text.into());
    }

    fn text(&mut self, key: &'static str) -> Option<String> {
        let text = self.scalar(key)?;
        if text.trim().is_empty() {
            self.problems.push(ConfigProblem::Invalid {
                key: key.to_owned(),
                value: text,
                reason: "must not be empty",
            });
            return None;
        }
        self.show(key, text.clone());
        Some(text)
    }

    fn duration(&mut self, key: &'static str) -> Option<(Duration, String)> {
        let text = self.scalar(key)?;
        match duration::parse(&text) {
            Ok(d) if d > MAX_DURATION => {
                self.problems.push(ConfigProblem::Invalid {
                    key: key.to_owned(),
                    value: text,
                    reason: "must be at most a year",
                });
                None
            }
            Ok(d) => {
                self.show(key, duration::format(d));
                Some((d, text))
            }
            Err(reason) => {
                self.problems.push(ConfigProblem::InvalidDuration {
                    key: key.to_owned(),
                    value: text,
                    reason,
                });
                None
            }
        }
    }

    /// A duration of at least `floor` (docs/operating.md, "Floors"): below it a timeout fails
    /// requests that would succeed, an interval probes or refreshes in a tight loop.
    fn duration_at_least(
        &mut self,
        key: &'static str,
        floor: Duration,
    ) -> Option<(Duration, String)> {
        let (duration, text) = self.duration(key)?;
        if duration < floor {
            self.shown.remove(key);
            self.problems.push(ConfigProblem::BelowFloor {
                key: key.to_owned(),
                value: text.trim().to_owned(),
                floor: duration::format(floor),
            });
            return None;
        }
        Some((duration, text))
    }

    /// A duration that is 0 (`what` is turned off) or at least `floor`: the value and its text.
    fn duration_off_or_at_least(
        &mut self,
        key: &'static str,
        floor: Duration,
        what: &str,
    ) -> Option<(Duration, String)> {
        let (duration, text) = self.duration(key)?;
        if !duration.is_zero() && duration < floor {
            self.shown.remove(key);
            self.problems.push(ConfigProblem::BelowFloor {
                key: key.to_owned(),
                value: text.trim().to_owned(),
                floor: format!("{} (or 0 to turn {what} off)", duration::format(floor)),
            });
            return None;
        }
        Some((duration, text))
    }

    fn flag(&mut self, key: &'static str) -> Option<bool> {
        let text = self.scalar(key)?;
        let value = match text.trim().to_ascii_lowercase().as_str() {
            "true" | "1" | "yes" | "on" => true,
            "false" | "0" | "no" | "off" => false,
            _ => {
                self.problems.push(ConfigProblem::NotBool {
                    key: key.to_owned(),
                    value: text,
                });
                return None;
            }
        };
        self.show(key, value.to_string());
        Some(value)
    }

    fn integer(&mut self, key: &'static str, min: u64, max: u64) -> Option<u64> {
        let setting = self.setting(key);
        let parsed = match setting.map(|s| &s.value) {
            Some(Value::Num(_, n)) => n
                .to_i128()
                .or_else(|| n.to_u128().and_then(|u| i128::try_from(u).ok())),
            Some(Value::String(_, s)) => s.trim().parse::<i128>().ok(),
            _ => None,
        };
        let Some(n) = parsed else {
            let value = match setting {
                Some(s) => self.scalar_of(key, &s.value)?,
                None => {
                    self.problems.push(ConfigProblem::Missing {
                        key: key.to_owned(),
                    });
                    return None;
                }
            };
            self.problems.push(ConfigProblem::NotInteger {
                key: key.to_owned(),
                value,
            });
            return None;
        };
        if n < i128::from(min) {
            self.problems.push(ConfigProblem::TooSmall {
                key: key.to_owned(),
                min,
                got: n,
            });
            return None;
        }
        let Ok(n) = u64::try_from(n) else {
            self.problems.push(ConfigProblem::TooLarge {
                key: key.to_owned(),
                max,
                got: n,
            });
            return None;
        };
        if n > max {
            self.problems.push(ConfigProblem::TooLarge {
                key: key.to_owned(),
                max,
                got: i128::from(n),
            });
            return None;
        }
        self.show(key, n.to_string());
        Some(n)
    }

    fn choice<T: Copy>(
        &mut self,
        key: &'static str,
        options: &[(&'static str, T)],
        expected: &'static str,
    ) -> Option<T> {
        let text = self.scalar(key)?;
        let wanted = text.trim().to_ascii_lowercase();
        match options.iter().find(|(name, _)| *name == wanted) {
            Some((name, value)) => {
                self.show(key, *name);
                Some(*value)
            }
            None => {
                self.problems.push(ConfigProblem::UnknownValue {
                    key: key.to_owned(),
                    value: text,
                    expected,
                });
                None
            }
        }
    }

    /// The contents of the file an optional path key names, trailing whitespace (a final
    /// newline) removed; `Ok(None)` when unset. `config show` shows the path and the length, never
    /// the contents.
    fn secret_file(&mut self, key: &'static str) -> Result<Option<Secret>, ()> {
        let Some(path) = self.optional_path(key)? else {
            return Ok(None);
        };
        match std::fs::read(&path) {
            Ok(mut bytes) => {
                while bytes.last().is_some_and(u8::is_ascii_whitespace) {
                    bytes.pop();
                }
                let shown = format!("{} ({} bytes)", path.display(), bytes.len());
                self.show(key, shown);
                Ok(Some(Secret::new(bytes)))
            }
            Err(error) => {
                self.problems.push(ConfigProblem::File {
                    key,
                    path: path.display().to_string(),
                    reason: error.to_string(),
                });
                Err(())
            }
        }
    }

    /// An optional path; empty means unset. `Err` when the value is malformed.
    fn optional_path(&mut self, key: &'static str) -> Result<Option<PathBuf>, ()> {
        let Some(setting) = self.setting(key) else {
            self.show(key, "(none)");
            return Ok(None);
        };
        let text = self.scalar_of(key, &setting.value).ok_or(())?;
        if text.is_empty() {
            self.show(key, "(none)");
            return Ok(None);
        }
        self.show(key, text.clone());
        Ok(Some(PathBuf::from(text)))
    }

    fn listen(&mut self) -> Option<String> {
        let text = self.scalar(ConfigKey::listen.name())?;
        match parse_listen(&text) {
            Some(addr) => {
                self.show(ConfigKey::listen.name(), addr.clone());
                Some(addr)
            }
            None => {
                self.problems.push(ConfigProblem::Invalid {
                    key: ConfigKey::listen.name().to_owned(),
                    value: text,
                    reason: "is not :port, host:port or [v6]:port",
                });
                None
            }
        }
    }

    /// `metrics_listen`: an address like `listen`, or empty for no metrics listener. `Err` when
    /// the value is malformed.
    fn metrics_listen(&mut self) -> Result<Option<String>, ()> {
        let text = self.scalar(ConfigKey::metrics_listen.name()).ok_or(())?;
        if text.trim().is_empty() {
            self.show(ConfigKey::metrics_listen.name(), "(off)");
            return Ok(None);
        }
        match parse_listen(&text) {
            Some(addr) => {
                self.show(ConfigKey::metrics_listen.name(), addr.clone());
                Ok(Some(addr))
            }
            None => {
                self.problems.push(ConfigProblem::Invalid {
                    key: ConfigKey::metrics_listen.name().to_owned(),
                    value: text,
                    reason: "is not :port, host:port or [v6]:port (empty turns it off)",
                });
                Err(())
            }
        }
    }

    fn log_level(&mut self) -> (Option<String>, Option<Source>) {
        let Some(setting) = self.setting(LoaderKey::log_level.name()) else {
            return (None, None);
        };
        let (key, text, source) = match (&setting.source, &self.loaded.rust_log) {
            (Source::Default, Some(rust_log)) => {
                ("RUST_LOG", rust_log.clone(), Source::Env("RUST_LOG"))
            }
            (source, _) => match self.scalar_of(LoaderKey::log_level.name(), &setting.value) {
                Some(text) => (LoaderKey::log_level.name(), text, source.clone()),
                None => return (None, Some(source.clone())),
            },
        };
        match tracing_subscriber::EnvFilter::try_new(&text) {
            Ok(_) => {
                self.show(LoaderKey::log_level.name(), text.clone());
                (Some(text), Some(source))
            }
            Err(e) => {
                self.problems.push(ConfigProblem::BadLogFilter {
                    key,
                    value: text,
                    reason: e.to_string(),
                });
                (None, Some(source))
            }
        }
    }
}

/// A backend as given, before validation.
#[derive(Debug, Default)]
struct RawBackend {
    /// Its position among the entries as written (a malformed entry before it counts), so a
    /// problem names the entry the user wrote.
    index: usize,
    name: String,
    url: String,
    /// ca, cert, key: `None` when the entry does not mention the key.
    tls: [Option<String>; 3],
}

const TLS_KEYS: [&str; 3] = [
    LoaderKey::tls_ca_file.name(),
    LoaderKey::tls_cert_file.name(),
    LoaderKey::tls_key_file.name(),
];

/// Splits `name=url,name=url` (the `PDBMUX_BACKENDS` form); blank entries are skipped.
fn split_backends(text: &str, problems: &mut Vec<ConfigProblem>) -> Vec<RawBackend> {
    let mut out = Vec::new();
    let entries = text.split(',').map(str::trim).filter(|e| !e.is_empty());
    for (index, entry) in entries.enumerate() {
        match entry.split_once('=') {
            Some((name, url)) if !name.trim().is_empty() && !url.trim().is_empty() => {
                out.push(RawBackend {
                    index,
                    name: name.trim().to_owned(),
                    url: url.trim().to_owned(),
                    tls: [None, None, None],
                });
            }
            _ => problems.push(ConfigProblem::BadBackendsEntry {
                entry: redact_userinfo(entry),
            }),
        }
    }
    out
}

fn raw_backends(checker: &mut Checker<'_>, setting: &Setting) -> Vec<RawBackend> {
    match &setting.value {
        Value::String(_, text) => split_backends(text, &mut checker.problems),
        Value::Array(_, items) => {
            let mut out = Vec::new();
            for (index, item) in items.iter().enumerate() {
                let Value::Dict(_, dict) = item else {
                    checker.problems.push(ConfigProblem::WrongShape {
                        key: format!("backends[{index}]"),
                        expected: "a mapping with name and url",
                        found: shape(item),
                    });
                    continue;
                };
                let mut raw = RawBackend {
                    index,
                    ..RawBackend::default()
                };
                let mut complete = true;
                for field in dict.keys().filter(|k| !BACKEND_KEYS.contains(&k.as_str())) {
                    checker.problems.push(ConfigProblem::UnknownBackendKey {
                        index,
                        field: field.clone(),
                        suggestion: keys::nearest_backend_key(field),
                    });
                }
                for field in ["name", "url"] {
                    let text = match dict.get(field) {
                        Some(Value::Empty(..)) | None => None,
                        Some(v) => checker.scalar_of(&format!("backends[{index}].{field}"), v),
                    };
                    match (text, field) {
                        (Some(text), "name") => raw.name = text,
                        (Some(text), _) => raw.url = text,
                        (None, _) => {
                            if matches!(dict.get(field), Some(Value::Empty(..)) | None) {
                                checker
                                    .problems
                                    .push(ConfigProblem::BackendFieldMissing { index, field });
                            }
                            complete = false;
                        }
                    }
                }
                for (slot, field) in raw.tls.iter_mut().zip(TLS_KEYS) {
                    *slot = match dict.get(field) {
                        Some(Value::Empty(..)) | None => None,
                        Some(v) => checker.scalar_of(&format!("backends[{index}].{field}"), v),
                    };
                }
                if complete {
                    out.push(raw);
                }
            }
            out
        }
        other => {
            checker.problems.push(ConfigProblem::WrongShape {
                key: ConfigKey::backends.name().to_owned(),
                expected: "a list of {name, url} or name=url,...",
                found: shape(other),
            });
            Vec::new()
        }
    }
}

/// `cache_backend` and, for `redis`, `cache_redis_url` (`redis://` or `rediss://`, shown with
/// its password redacted); a `rediss://` store uses the global `tls_*` files.
fn check_cache_backend(
    c: &mut Checker<'_>,
    global_tls: &[(Option<PathBuf>, Option<Source>); 3],
) -> Option<CacheBackend> {
    #[derive(Clone, Copy)]
    enum Kind {
        Memory,
        Redis,
    }
    let kind = c.choice(
        ConfigKey::cache_backend.name(),
        &[("memory", Kind::Memory), ("redis", Kind::Redis)],
        "memory or redis",
    )?;
    let url = c
        .setting(LoaderKey::cache_redis_url.name())
        .and_then(|setting| c.scalar_of(LoaderKey::cache_redis_url.name(), &setting.value));
    match (kind, url) {
        (Kind::Memory, _) => {
            // Shown as given; they are read only for a shared store.
            for key in [
                LoaderKey::cache_secret_file.name(),
                LoaderKey::cache_redis_password_file.name(),
            ] {
                c.optional_path(key).ok()?;
            }
            Some(CacheBackend::Memory)
        }
        (Kind::Redis, None) => {
            c.problems.push(ConfigProblem::Invalid {
                key: LoaderKey::cache_redis_url.name().to_owned(),
                value: String::new(),
                reason: "is required with cache_backend: redis",
            });
            None
        }
        (Kind::Redis, Some(url)) => {
            let url = url.trim().to_owned();
            let scheme_ok = url.starts_with("redis://") || url.starts_with("rediss://");
            if !scheme_ok || url.len() <= "rediss://".len() {
                c.problems.push(ConfigProblem::Invalid {
                    key: LoaderKey::cache_redis_url.name().to_owned(),
                    value: redact_userinfo(&url),
                    reason: "is not a redis:// or rediss:// URL",
                });
                return None;
            }
            c.show(LoaderKey::cache_redis_url.name(), redact_userinfo(&url));
            let tls = TlsFiles {
                ca_file: global_tls[0].0.clone(),
                cert_file: global_tls[1].0.clone(),
                key_file: global_tls[2].0.clone(),
            };
            let secret = match c.secret_file(LoaderKey::cache_secret_file.name()) {
                Ok(Some(secret)) if secret.expose().len() >= MIN_SECRET_BYTES => Some(secret),
                Ok(Some(_)) => {
                    c.problems.push(ConfigProblem::Invalid {
                        key: LoaderKey::cache_secret_file.name().to_owned(),
                        value: c.shown.get(LoaderKey::cache_secret_file.name()).cloned().unwrap_or_default(),
                        reason: "holds fewer than 16 bytes: write at least 32 random bytes, e.g. `openssl rand -hex 32`",
                    });
                    None
                }
                Ok(None) => {
                    c.problems.push(ConfigProblem::Invalid {
                        key: LoaderKey::cache_secret_file.name().to_owned(),
                        value: String::new(),
                        reason: "is required with cache_backend: redis (the key replicas sign \
                                 shared entries with, so a writer of the store cannot change \
                                 answers; docs/caching.md)",
                    });
                    None
                }
                Err(()) => None,
            };
            let password = c
                .secret_file(LoaderKey::cache_redis_password_file.name())
                .ok()?;
            Some(CacheBackend::Redis {
                url,
                tls,
                secret: secret?,
                password,
            })
        }
    }
}

/// Parses `:port`, `host:port` or `[v6]:port`; `:port` becomes `0.0.0.0:port`.
fn parse_listen(text: &str) -> Option<String> {
    fn port(p: &str) -> Option<u16> {
        if p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        p.parse().ok()
    }
    let text = text.trim();
    if let Some(p) = text.strip_prefix(':') {
        return Some(format!("0.0.0.0:{}", port(p)?));
    }
    if let Some(rest) = text.strip_prefix('[') {
        let (host, p) = rest.split_once("]:")?;
        let ip: Ipv6Addr = host.parse().ok()?;
        return Some(format!("[{ip}]:{}", port(p)?));
    }
    let (host, p) = text.rsplit_once(':')?;
    if host.is_empty() || host.contains([':', '[', ']', '/']) || host.contains(char::is_whitespace)
    {
        return None;
    }
    Some(format!("{host}:{}", port(p)?))
}

/// `text` with any user info of a URL in it (`user:secret@`) replaced by `***@`, for messages:
/// a password must not reach a log. It works on the text, before anything parses it, so no
/// character in a password (`/`, `?`, `#`, `@`, `:`) and no malformed scheme (`http:/u:pw@h`,
/// none at all) lets it through: everything from the first `:` and the slashes after it to the
/// last `@` is hidden, which may hide more than the user
/// info (an `@` in a path) but never less.
pub fn redact_userinfo(text: &str) -> String {
    // The first `:` ends a scheme (`http:`, `pdb-a=http:`) or, with none, a user name: a `://`
    // inside a password comes later and cannot move the start into it.
    let start = text.find(':').map_or(0, |colon| {
        colon + 1 + text[colon + 1..].bytes().take_while(|b| *b == b'/').count()
    });
    match text[start..].rfind('@') {
        Some(at) => format!("{}***{}", &text[..start], &text[start + at..]),
        None => text.to_owned(),
    }
}

/// Parses a backend base URL: `http` or `https`, a host, an optional port and nothing else.
pub fn parse_backend_url(text: &str) -> Result<BackendUrl, String> {
    let text = text.trim();
    let Some((scheme, rest)) = text.split_once("://") else {
        return Err("missing scheme (e.g. http://host:8080)".to_owned());
    };
    let scheme = scheme.to_ascii_lowercase();
    if scheme != "http" && scheme != "https" {
        return Err(format!("scheme \"{scheme}\" is not http or https"));
    }
    let url = url::Url::parse(text).map_err(|e| e.to_string())?;
    if !url.username().is_empty() || url.password().is_some() {
        return Err("user info is not allowed".to_owned());
    }
    if url.query().is_some() {
        return Err("a query is not allowed".to_owned());
    }
    if url.fragment().is_some() {
        return Err("a fragment is not allowed".to_owned());
    }
    if !matches!(url.path(), "" | "/") {
        return Err(format!(
            "a path (\"{}\") is not allowed; pdbmux appends /pdb/query/v4/... itself",
            url.path()
        ));
    }
    let host = match url.host() {
        Some(url::Host::Domain(d)) => d.to_owned(),
        Some(url::Host::Ipv4(ip)) => ip.to_string(),
        Some(url::Host::Ipv6(ip)) => ip.to_string(),
        None => return Err("no host".to_owned()),
    };
    // The url crate drops a port equal to the scheme's default; keep it when it was written.
    let authority = rest.split(['/', '?', '#', '\\']).next().unwrap_or_default();
    let after_host = match authority.rfind(']') {
        Some(end) => &authority[end + 1..],
        None => authority.rfind(':').map_or("", |i| &authority[i..]),
    };
    let explicit = after_host.len() > 1 && after_host.starts_with(':');
    let port = if explicit {
        url.port_or_known_default()
    } else {
        None
    };
    Ok(BackendUrl { scheme, host, port })
}

fn check_backends(
    checker: &mut Checker<'_>,
    global_tls: &[(Option<PathBuf>, Option<Source>); 3],
) -> (Option<Vec<BackendConfig>>, Vec<BackendShown>) {
    let none = ConfigProblem::NoBackends {
        file: checker.loaded.file.path().map(PathBuf::from),
    };
    let Some(setting) = checker.setting(ConfigKey::backends.name()) else {
        checker.problems.push(none);
        return (None, Vec::new());
    };
    let before = checker.problems.len();
    let raws = raw_backends(checker, setting);
    if raws.is_empty() && checker.problems.len() == before {
        checker.problems.push(none);
    }

    let mut seen = HashSet::new();
    let mut backends = Vec::new();
    let mut shown = Vec::new();
    for raw in raws {
        let index = raw.index;
        let url = match parse_backend_url(&raw.url) {
            Ok(url) => Some(url),
            Err(reason) => {
                checker.problems.push(ConfigProblem::BadBackendUrl {
                    index,
                    value: redact_userinfo(&raw.url),
                    reason,
                });
                None
            }
        };
        if raw.name.trim().is_empty() {
            checker.problems.push(ConfigProblem::Invalid {
                key: format!("backends[{index}].name"),
                value: raw.name.clone(),
                reason: "must not be empty",
            });
        } else if raw.name.chars().any(char::is_control) {
            checker.problems.push(ConfigProblem::Invalid {
                key: format!("backends[{index}].name"),
                value: raw.name.clone(),
                reason: "must not contain control characters",
            });
        } else if !seen.insert(raw.name.clone()) {
            checker.problems.push(ConfigProblem::DuplicateBackend {
                name: raw.name.clone(),
            });
        }

        let mut tls = [None, None, None];
        let mut tls_shown = Vec::new();
        for (i, field) in TLS_KEYS.into_iter().enumerate() {
            let (path, source) = match &raw.tls[i] {
                Some(own) if own.is_empty() => (None, None),
                Some(own) => (Some(PathBuf::from(own)), Some(setting.source.clone())),
                None => global_tls[i].clone(),
            };
            if let (Some(path), Some(source)) = (&path, source) {
                tls_shown.push((field, path.clone(), source));
            }
            tls[i] = path;
        }
        let [ca_file, cert_file, key_file] = tls;
        if cert_file.is_some() != key_file.is_some() {
            checker.problems.push(ConfigProblem::TlsPair {
                index,
                name: raw.name.clone(),
            });
        }
        shown.push(BackendShown {
            line: format!(
                "{}={}",
                raw.name,
                url.as_ref().map_or(raw.url.clone(), BackendUrl::base)
            ),
            source: setting.source.clone(),
            tls: tls_shown,
        });
        if let Some(url) = url {
            backends.push(BackendConfig {
                name: raw.name,
                url,
                tls: TlsFiles {
                    ca_file,
                    cert_file,
                    key_file,
                },
            });
        }
    }
    (Some(backends), shown)
}

/// Validates every key, keeping what `config show` needs even when some keys are bad.
pub(crate) fn check(loaded: &Loaded) -> Checked {
    let mut c = Checker {
        loaded,
        problems: Vec::new(),
        shown: BTreeMap::new(),
    };
    for key in &loaded.unknown_keys {
        c.problems.push(ConfigProblem::UnknownKey {
            key: key.clone(),
            suggestion: keys::nearest_key(key),
        });
    }
    for var in &loaded.unknown_vars {
        c.problems.push(ConfigProblem::UnknownVariable {
            var: var.clone(),
            suggestion: keys::nearest_var(var),
        });
    }

    let listen = c.listen();
    let metrics_listen = c.metrics_listen();
    // The global TLS files come first: backends inherit them.
    let mut global_tls: [(Option<PathBuf>, Option<Source>); 3] = Default::default();
    let mut tls_ok = true;
    for (slot, key) in global_tls.iter_mut().zip(TLS_KEYS) {
        match c.optional_path(key) {
            Ok(path) => {
                let source = path.as_ref().and(loaded.source(key).cloned());
                *slot = (path, source);
            }
            Err(()) => tls_ok = false,
        }
    }
    let (backends, backends_shown) = check_backends(&mut c, &global_tls);
    let merge = c.choice(
        ConfigKey::merge.name(),
        &[
            ("freshness", MergeStrategy::Freshness),
            ("static", MergeStrategy::Static),
        ],
        "freshness or static",
    );
    let timeout = c.duration_at_least(ConfigKey::timeout.name(), MIN_TIMEOUT);
    let freshness_ttl = c.duration_at_least(ConfigKey::freshness_ttl.name(), MIN_FRESHNESS_TTL);
    let mut clamped = Vec::new();
    let mut cache_ttl = |c: &mut Checker, key: &'static str, what: &str| {
        c.duration_off_or_at_least(key, MIN_FACTS_TTL, what)
            .map(|(ttl, raw)| {
                if ttl > FACTS_TTL_CAP {
                    let cap = duration::format(FACTS_TTL_CAP);
                    c.show(
                        key,
                        format!("{cap} (clamped from {}, cap {cap})", raw.trim()),
                    );
                    clamped.push((key, raw.trim().to_owned()));
                    FACTS_TTL_CAP
                } else {
                    ttl
                }
            })
    };
    let facts_ttl = cache_ttl(&mut c, ConfigKey::facts_ttl.name(), "the cache");
    let history_ttl = cache_ttl(&mut c, ConfigKey::history_ttl.name(), "caching history");
    let aggregate_ttl = cache_ttl(
        &mut c,
        ConfigKey::aggregate_ttl.name(),
        "caching combined answers",
    );
    let cache_refresh_ahead_percent =
        c.integer(ConfigKey::cache_refresh_ahead_percent.name(), 0, 99);
    // A zero budget stores nothing: `facts_ttl: 0` is how the cache is turned off.
    let facts_cache_bytes = c.integer(
        ConfigKey::facts_cache_bytes.name(),
        MIN_CACHE_BYTES,
        u64::MAX,
    );
    let source_fact = c.text(ConfigKey::source_fact.name());
    let source_fact_enabled = c.flag(ConfigKey::source_fact_enabled.name());
    let health_probe_enabled = c.flag(ConfigKey::health_probe_enabled.name());
    let health_probe_path = c.text(ConfigKey::health_probe_path.name()).filter(|path| {
        let ok = path.starts_with('/') && !path.contains(char::is_whitespace);
        if !ok {
            c.shown.remove(ConfigKey::health_probe_path.name());
            c.problems.push(ConfigProblem::Invalid {
                key: ConfigKey::health_probe_path.name().to_owned(),
                value: path.clone(),
                reason: "must be a path starting with /",
            });
        }
        ok
    });
    let health_probe_interval =
        c.duration_at_least(ConfigKey::health_probe_interval.name(), MIN_PROBE_INTERVAL);
    let health_probe_timeout =
        c.duration_at_least(ConfigKey::health_probe_timeout.name(), MIN_PROBE_TIMEOUT);
    let max_count = u64::from(u32::MAX);
    let health_probe_failures = c.integer(ConfigKey::health_probe_failures.name(), 1, max_count);
    let health_probe_successes = c.integer(ConfigKey::health_probe_successes.name(), 1, max_count);
    let max_body_bytes = c.integer(ConfigKey::max_body_bytes.name(), MIN_BODY_BYTES, u64::MAX);
    let merge_request_bytes = c.integer(
        ConfigKey::merge_request_bytes.name(),
        MIN_BODY_BYTES,
        u64::MAX,
    );
    let merge_memory_bytes = c.integer(
        ConfigKey::merge_memory_bytes.name(),
        MIN_BODY_BYTES,
        u64::MAX,
    );
    let stream_above_bytes = c.integer(ConfigKey::stream_above_bytes.name(), 0, u64::MAX);
    let client_header_timeout =
        c.duration_at_least(ConfigKey::client_header_timeout.name(), MIN_CLIENT_TIMEOUT);
    let client_send_timeout =
        c.duration_at_least(ConfigKey::client_send_timeout.name(), MIN_CLIENT_TIMEOUT);
    let latency_objective =
        c.duration_at_least(ConfigKey::latency_objective.name(), MIN_LATENCY_OBJECTIVE);
    let cache_backend = check_cache_backend(&mut c, &global_tls);
    let cache_key_prefix = c.text(ConfigKey::cache_key_prefix.name());
    let cache_stale_ttl = c.duration(ConfigKey::cache_stale_ttl.name());
    let cache_max_entry_bytes = c.integer(
        ConfigKey::cache_max_entry_bytes.name(),
        MIN_ENTRY_BYTES,
        u64::MAX,
    );
    let log_format = c.choice(
        LoaderKey::log_format.name(),
        &[("text", LogFormat::Text), ("json", LogFormat::Json)],
        "text or json",
    );
    let (log_level, log_level_source) = c.log_level();
    let config_watch = c
        .duration_off_or_at_least(
            LoaderKey::config_watch_interval.name(),
            MIN_CONFIG_WATCH,
            "the watch",
        )
        .map(|(every, _)| (!every.is_zero()).then_some(every));

    let settings = match (
        listen,
        backends,
        merge,
        timeout,
        freshness_ttl,
        (
            facts_ttl,
            history_ttl,
            aggregate_ttl,
            cache_refresh_ahead_percent,
        ),
        facts_cache_bytes,
        source_fact,
        source_fact_enabled,
        health_probe_enabled,
        health_probe_path,
        health_probe_interval,
        health_probe_timeout,
        health_probe_failures,
        health_probe_successes,
        max_body_bytes,
        log_format,
        log_level,
    ) {
        (
            Some(listen),
            Some(backends),
            Some(merge),
            Some((timeout, _)),
            Some((freshness_ttl, _)),
            (
                Some(facts_ttl),
                Some(history_ttl),
                Some(aggregate_ttl),
                Some(cache_refresh_ahead_percent),
            ),
            Some(facts_cache_bytes),
            Some(source_fact),
            Some(source_fact_enabled),
            Some(health_probe_enabled),
            Some(health_probe_path),
            Some((health_probe_interval, _)),
            Some((health_probe_timeout, _)),
            Some(health_probe_failures),
            Some(health_probe_successes),
            Some(max_body_bytes),
            Some(log_format),
            Some(log_level),
        ) if tls_ok && metrics_listen.is_ok() && c.problems.is_empty() => {
            let (
                Some(cache_backend),
                Some(cache_key_prefix),
                Some((cache_stale_ttl, _)),
                Some(cache_max_entry_bytes),
                Some((client_header_timeout, _)),
                Some((client_send_timeout, _)),
                Some((latency_objective, _)),
                Some(merge_request_bytes),
                Some(merge_memory_bytes),
                Some(stream_above_bytes),
            ) = (
                cache_backend,
                cache_key_prefix,
                cache_stale_ttl,
                cache_max_entry_bytes,
                client_header_timeout,
                client_send_timeout,
                latency_objective,
                merge_request_bytes,
                merge_memory_bytes,
                stream_above_bytes,
            )
            else {
                return Checked {
                    shown: c.shown,
                    backends: backends_shown,
                    log_level_source,
                    clamped,
                    problems: locate_all(c.problems, loaded),
                    settings: None,
                };
            };
            // Both counts were checked against u32::MAX above.
            let failures = u32::try_from(health_probe_failures).unwrap_or(u32::MAX);
            let successes = u32::try_from(health_probe_successes).unwrap_or(u32::MAX);
            Some(Settings {
                config: Config {
                    listen,
                    metrics_listen: metrics_listen.clone().unwrap_or_default(),
                    backends,
                    merge,
                    timeout,
                    freshness_ttl,
                    facts_ttl,
                    history_ttl,
                    aggregate_ttl,
                    // Checked against 0..=99 above.
                    cache_refresh_ahead_percent: u8::try_from(cache_refresh_ahead_percent)
                        .unwrap_or(0),
                    facts_cache_bytes,
                    source_fact,
                    source_fact_enabled,
                    health_probe_enabled,
                    health_probe_path,
                    health_probe_interval,
                    health_probe_timeout,
                    health_probe_failures: failures,
                    health_probe_successes: successes,
                    max_body_bytes,
                    merge_request_bytes,
                    merge_memory_bytes,
                    stream_above_bytes,
                    client_header_timeout,
                    client_send_timeout,
                    latency_objective,
                    cache_backend,
                    cache_key_prefix,
                    cache_stale_ttl,
                    cache_max_entry_bytes,
                },
                log_format,
                log_level,
                config_source: loaded.file.to_string(),
                config_watch: config_watch.flatten(),
            })
        }
        _ => None,
    };

    Checked {
        shown: c.shown,
        backends: backends_shown,
        log_level_source,
        clamped,
        problems: locate_all(c.problems, loaded),
        settings,
    }
}

/// Each problem with where its value was set ([`Problem::locate`]).
fn locate_all(problems: Vec<ConfigProblem>, loaded: &Loaded) -> Vec<Problem> {
    problems
        .into_iter()
        .map(|problem| Problem::locate(problem, loaded))
        .collect()
}
