//! Support for pdbmux's end-to-end tests: real PuppetDB servers, a real pdbmux binary.
//!
//! `e2e/run` starts three PuppetDBs, loads the fixture estate (`e2e/fixture/load.py`) split across
//! two and whole into the third, and runs the test targets of this crate (feature `live`) with
//! these variables set:
//!
//! | variable | meaning |
//! |---|---|
//! | `E2E_BACKENDS` | `name=url,...`: the plain-HTTP PuppetDBs, in configured order |
//! | `E2E_UNION` | the PuppetDB holding the whole estate: what pdbmux must answer |
//! | `E2E_BIN` | the pdbmux binary under test |
//! | `E2E_FIXTURE` | the `fixture.json` the loader wrote (default `$E2E_STATE/fixture.json`) |
//! | `E2E_STATE` | the harness's state dir; pdbmux logs go to `pdbmux-logs/` in it |
//! | `E2E_TLS_URL`, `_CA`, `_CERT`, `_KEY` | the second PuppetDB's TLS port, its CA, a client certificate and key |
//! | `E2E_ACCESS_LOGS` | `name=path,...`: each PuppetDB's Jetty access log |
//!
//! Tests spawn their own pdbmux ([`E2eEnv::pdbmux`]), configured by environment only, and compare
//! its answers with the union PuppetDB's answer to the same question ([`E2eEnv::union`]), or with
//! expectations computed from the fixture ([`Fixture`]) or from the backends queried directly
//! ([`Backend::get`]), never from pdbmux's own output.

#![forbid(unsafe_code)]

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::fmt;
use std::fs::{self, File};
use std::io::Read;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{self, AtomicUsize};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

pub mod differential;
mod fixture;
mod http;
pub mod order;
pub mod proxy;

pub use fixture::{Fixture, FixtureCommand, FixtureNode, FixtureReport, NodeState};
pub use http::{get, get_with_headers, raw_request, url_with_query, Response};
pub use proxy::{FaultCounts, Proxy, ProxyMode};

/// How long a spawned pdbmux may take to accept connections.
const READY_TIMEOUT: Duration = Duration::from_secs(20);

/// What went wrong in the support code. Tests report it with `expect`.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A required environment variable is missing.
    #[error("{0} is not set: run the e2e suite through e2e/run (see e2e/README.md)")]
    MissingEnv(&'static str),
    /// An environment variable has a value the harness cannot use.
    #[error("{name}: {reason}")]
    BadEnv {
        /// The variable.
        name: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// The fixture description could not be read.
    #[error("fixture {path}: {reason}")]
    Fixture {
        /// The fixture.json path.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// A file or socket operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The underlying error.
        source: std::io::Error,
    },
    /// pdbmux exited before it accepted connections.
    #[error("pdbmux exited ({status}) before listening on {addr}; its log ({log}):\n{log_text}")]
    Exited {
        /// How it exited.
        status: ExitStatus,
        /// The address it was told to listen on.
        addr: SocketAddr,
        /// Its log file.
        log: String,
        /// The log file's content.
        log_text: String,
    },
    /// pdbmux did not accept connections in time.
    #[error(
        "pdbmux did not accept connections on {addr} within {secs}s; its log ({log}):\n{log_text}"
    )]
    NotReady {
        /// The address it was told to listen on.
        addr: SocketAddr,
        /// The timeout.
        secs: u64,
        /// Its log file.
        log: String,
        /// The log file's content.
        log_text: String,
    },
    /// An HTTP exchange failed below the HTTP status level (connection, protocol, body).
    #[error("{what}: {reason}")]
    Http {
        /// The request.
        what: String,
        /// What failed.
        reason: String,
    },
}

fn io_err(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
    let what = what.into();
    move |source| Error::Io { what, source }
}

/// One PuppetDB the tests can query directly.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
pub struct Backend {
    /// The name pdbmux is given for it.
    pub name: String,
    /// Its base URL, `http://host:port`.
    pub url: String,
}

impl Backend {
    /// GET `path` (with its query string, already encoded) from this backend directly.
    pub fn get(&self, path_and_query: &str) -> Result<Response, Error> {
        get(&format!("{}{}", self.url, path_and_query))
    }

    /// GET `path` with `params` form-encoded into the query string, from this backend directly.
    pub fn get_query(&self, path: &str, params: &[(&str, &str)]) -> Result<Response, Error> {
        get(&url_with_query(&format!("{}{}", self.url, path), params))
    }
}

/// The second backend's TLS port and the material to reach it (docs/decisions.md D8).
#[derive(Debug, Clone)]
pub struct TlsBackend {
    /// `https://127.0.0.1:<port>`.
    pub url: String,
    /// The throwaway CA that signed the server and client certificates.
    pub ca_file: PathBuf,
    /// A client certificate the PuppetDB accepts.
    pub cert_file: PathBuf,
    /// Its private key.
    pub key_file: PathBuf,
}

/// Everything the harness handed to the tests.
#[derive(Debug)]
pub struct E2eEnv {
    /// The plain-HTTP backends in configured order (`E2E_BACKENDS`).
    pub backends: Vec<Backend>,
    /// The pdbmux binary under test (`E2E_BIN`).
    pub bin: PathBuf,
    /// The harness's state dir, when it set one (`E2E_STATE`).
    pub state_dir: Option<PathBuf>,
    /// What was loaded into the backends (`E2E_FIXTURE`).
    pub fixture: Fixture,
    /// The TLS port of the second backend, when the harness opened one.
    pub tls: Option<TlsBackend>,
    /// Each backend's Jetty access log by backend name, when the harness has them.
    pub access_logs: BTreeMap<String, PathBuf>,
    /// The PuppetDB holding the whole estate (`E2E_UNION`), when the harness started one.
    pub union: Option<Backend>,
}

fn var(name: &'static str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

fn required(name: &'static str) -> Result<String, Error> {
    var(name).ok_or(Error::MissingEnv(name))
}

/// Parses `name=value,name=value` (the PDBMUX_BACKENDS format).
fn parse_pairs(name: &'static str, spec: &str) -> Result<Vec<(String, String)>, Error> {
    spec.split(',')
        .map(str::trim)
        .filter(|part| !part.is_empty())
        .map(|part| match part.split_once('=') {
            Some((k, v)) if !k.is_empty() && !v.is_empty() => Ok((k.to_owned(), v.to_owned())),
            _ => Err(Error::BadEnv {
                name,
                reason: format!("{part:?} is not name=value"),
            }),
        })
        .collect()
}

impl E2eEnv {
    /// Reads the `E2E_*` variables and the fixture description.
    pub fn from_env() -> Result<Self, Error> {
        let backends: Vec<Backend> = parse_pairs("E2E_BACKENDS", &required("E2E_BACKENDS")?)?
            .into_iter()
            .map(|(name, url)| Backend {
                name,
                url: url.trim_end_matches('/').to_owned(),
            })
            .collect();
        if backends.len() < 2 {
            return Err(Error::BadEnv {
                name: "E2E_BACKENDS",
                reason: format!("the suite needs two backends, got {}", backends.len()),
            });
        }
        let mut bin = PathBuf::from(required("E2E_BIN")?);
        if bin.is_relative() && !bin.is_file() {
            // cargo runs tests in the package dir; a path relative to the workspace root is
            // what a developer types.
            bin = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(bin);
        }
        if !bin.is_file() {
            return Err(Error::BadEnv {
                name: "E2E_BIN",
                reason: format!("{} is not a file", bin.display()),
            });
        }
        let state_dir = var("E2E_STATE").map(PathBuf::from);
        let fixture_path = match (var("E2E_FIXTURE"), &state_dir) {
            (Some(path), _) => PathBuf::from(path),
            (None, Some(state)) => state.join("fixture.json"),
            (None, None) => return Err(Error::MissingEnv("E2E_FIXTURE")),
        };
        let fixture = Fixture::load(&fixture_path)?;
        let loaded: Vec<&str> = fixture.backends.iter().map(|b| b.name.as_str()).collect();
        let given: Vec<&str> = backends.iter().map(|b| b.name.as_str()).collect();
        if loaded != given {
            return Err(Error::BadEnv {
                name: "E2E_BACKENDS",
                reason: format!(
                    "names {given:?} differ from the fixture's {loaded:?} ({})",
                    fixture_path.display()
                ),
            });
        }
        let tls = match var("E2E_TLS_URL") {
            None => None,
            Some(url) => Some(TlsBackend {
                url: url.trim_end_matches('/').to_owned(),
                ca_file: required("E2E_TLS_CA")?.into(),
                cert_file: required("E2E_TLS_CERT")?.into(),
                key_file: required("E2E_TLS_KEY")?.into(),
            }),
        };
        let access_logs = match var("E2E_ACCESS_LOGS") {
            None => BTreeMap::new(),
            Some(spec) => parse_pairs("E2E_ACCESS_LOGS", &spec)?
                .into_iter()
                .map(|(k, v)| (k, PathBuf::from(v)))
                .collect(),
        };
        let union = var("E2E_UNION").map(|url| Backend {
            name: "union".to_owned(),
            url: url.trim_end_matches('/').to_owned(),
        });
        Ok(Self {
            backends,
            bin,
            state_dir,
            fixture,
            tls,
            access_logs,
            union,
        })
    }

    /// The environment, read once per test binary. The error is kept as text for later callers.
    pub fn shared() -> Result<&'static Self, Error> {
        static ENV: OnceLock<Result<E2eEnv, String>> = OnceLock::new();
        ENV.get_or_init(|| Self::from_env().map_err(|e| e.to_string()))
            .as_ref()
            .map_err(|reason| Error::BadEnv {
                name: "E2E_*",
                reason: reason.clone(),
            })
    }

    /// The first backend in configured order.
    pub fn first(&self) -> &Backend {
        &self.backends[0]
    }

    /// The second backend in configured order.
    pub fn second(&self) -> &Backend {
        &self.backends[1]
    }

    /// A pdbmux in front of every backend, in configured order, with the harness defaults.
    pub fn pdbmux(&self) -> PdbmuxBuilder {
        let mut builder = PdbmuxBuilder::new(&self.bin, self.state_dir.as_deref());
        for b in &self.backends {
            builder = builder.backend(&b.name, &b.url);
        }
        builder
    }

    /// A pdbmux with the given backends only.
    pub fn pdbmux_with(&self, backends: &[(&str, &str)]) -> PdbmuxBuilder {
        let mut builder = PdbmuxBuilder::new(&self.bin, self.state_dir.as_deref());
        for (name, url) in backends {
            builder = builder.backend(name, url);
        }
        builder
    }
}

/// A loopback port nothing listens on (bound, then released).
pub fn free_port() -> Result<u16, Error> {
    let listener = TcpListener::bind("127.0.0.1:0").map_err(io_err("bind 127.0.0.1:0"))?;
    let port = listener
        .local_addr()
        .map_err(io_err("local_addr of 127.0.0.1:0"))?
        .port();
    Ok(port)
}

/// A backend that is down, for as long as this value lives: a loopback port bound and not
/// listening, so connections to it are refused. Held, not merely found free: a released port is
/// the kernel's to give to the next `bind` of port 0, such as a pdbmux another test starts, which
/// would then answer for the dead backend. Without `SO_REUSEADDR` no other socket can bind it.
#[derive(Debug)]
pub struct ClosedBackend {
    _bound: socket2::Socket,
    url: String,
}

impl ClosedBackend {
    /// Its URL, for a backend list.
    pub fn url(&self) -> &str {
        &self.url
    }
}

/// A backend that refuses every connection ([`ClosedBackend`]); keep it until the test ends.
pub fn closed_backend() -> Result<ClosedBackend, Error> {
    let bound = bound_not_listening(SocketAddr::from(([127, 0, 0, 1], 0)), false)
        .map_err(io_err("bind 127.0.0.1:0"))?;
    let port = bound
        .local_addr()
        .map_err(io_err("local_addr of 127.0.0.1:0"))?
        .as_socket()
        .ok_or_else(|| std::io::Error::other("not an IP address"))
        .map_err(io_err("local_addr of 127.0.0.1:0"))?
        .port();
    Ok(ClosedBackend {
        _bound: bound,
        url: format!("http://127.0.0.1:{port}"),
    })
}

/// A TCP socket bound to `addr` that does not listen: connections to it are refused, and the
/// kernel gives its port to no other socket (not to `bind` of port 0, not as a connection's
/// source port; without `reuse_address`, not to an explicit `bind` of it either).
pub(crate) fn bound_not_listening(
    addr: SocketAddr,
    reuse_address: bool,
) -> std::io::Result<socket2::Socket> {
    let socket = socket2::Socket::new(
        socket2::Domain::for_address(addr),
        socket2::Type::STREAM,
        None,
    )?;
    socket.set_reuse_address(reuse_address)?;
    socket.bind(&addr.into())?;
    Ok(socket)
}

/// Configures and starts one pdbmux process.
#[derive(Debug, Clone)]
pub struct PdbmuxBuilder {
    bin: PathBuf,
    log_dir: PathBuf,
    backends: Vec<(String, String)>,
    env: BTreeMap<String, String>,
    args: Vec<String>,
    label: String,
}

impl PdbmuxBuilder {
    /// A pdbmux running `bin` with no backends yet, logging under `state_dir` (else a temporary
    /// directory): for suites whose backends are not `E2E_BACKENDS` (the history suite).
    pub fn new(bin: &Path, state_dir: Option<&Path>) -> Self {
        let log_dir = state_dir
            .map(|d| d.join("pdbmux-logs"))
            .unwrap_or_else(|| std::env::temp_dir().join("pdbmux-e2e-logs"));
        let env = [
            ("PDBMUX_HEALTH_PROBE_ENABLED", "false"),
            ("PDBMUX_LOG_LEVEL", "debug"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        Self {
            bin: bin.to_owned(),
            log_dir,
            backends: Vec::new(),
            env,
            args: Vec::new(),
            label: "pdbmux".to_owned(),
        }
    }

    /// Runs `bin` instead of `E2E_BIN` (the fault soak runs both binaries at once).
    pub fn binary(mut self, bin: &Path) -> Self {
        bin.clone_into(&mut self.bin);
        self
    }

    /// Adds a backend (appended to the configured order).
    pub fn backend(mut self, name: &str, url: &str) -> Self {
        self.backends.push((name.to_owned(), url.to_owned()));
        self
    }

    /// Sets an environment variable for the process (overrides the harness defaults, e.g.
    /// `PDBMUX_HEALTH_PROBE_ENABLED=true`).
    pub fn env(mut self, key: &str, value: &str) -> Self {
        self.env.insert(key.to_owned(), value.to_owned());
        self
    }

    /// Passes command-line arguments (none by default: `serve` is the default subcommand).
    pub fn args(mut self, args: &[&str]) -> Self {
        self.args = args.iter().map(|a| (*a).to_owned()).collect();
        self
    }

    /// Names the log file (`<label>-<n>.log`), e.g. after the test.
    pub fn label(mut self, label: &str) -> Self {
        self.label = label.replace(|c: char| !c.is_ascii_alphanumeric() && c != '-', "_");
        self
    }

    /// Starts pdbmux on a loopback port it picks itself and waits until it accepts connections.
    ///
    /// Its environment holds only PATH, a fresh HOME/XDG_CONFIG_HOME (so no user config file is
    /// read; PDBMUX_CONFIG is unset), NO_COLOR=1 and the PDBMUX_* variables of this builder. stdout and
    /// stderr go to a log file, shown when a test panics while the process is alive.
    pub fn spawn(self) -> Result<Pdbmux, Error> {
        static SEQ: AtomicUsize = AtomicUsize::new(0);
        let home = tempfile::Builder::new()
            .prefix("pdbmux-e2e-home-")
            .tempdir()
            .map_err(io_err("create a temporary HOME"))?;
        let config_home = home.path().join(".config");
        fs::create_dir_all(&config_home).map_err(io_err("create XDG_CONFIG_HOME"))?;
        fs::create_dir_all(&self.log_dir)
            .map_err(io_err(format!("create {}", self.log_dir.display())))?;
        let log_path = self.log_dir.join(format!(
            "{}-{}-{}.log",
            self.label,
            std::process::id(),
            SEQ.fetch_add(1, atomic::Ordering::Relaxed)
        ));
        let log =
            File::create(&log_path).map_err(io_err(format!("create {}", log_path.display())))?;
        let log_out = log
            .try_clone()
            .map_err(io_err(format!("clone {}", log_path.display())))?;
        // Port 0: pdbmux binds a free port itself and logs it, so parallel tests can never race
        // for one (a port probed free here could be taken before pdbmux binds it).
        let requested = SocketAddr::from(([127, 0, 0, 1], 0));
        let backends = self
            .backends
            .iter()
            .map(|(n, u)| format!("{n}={u}"))
            .collect::<Vec<_>>()
            .join(",");

        let mut cmd = Command::new(&self.bin);
        cmd.env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", home.path())
            .env("XDG_CONFIG_HOME", &config_home)
            .env("PDBMUX_BACKENDS", &backends)
            .env("PDBMUX_LISTEN", requested.to_string())
            // No metrics listener unless a test asks for one: several instances run at once.
            .env("PDBMUX_METRICS_LISTEN", "")
            // The log is a file: no terminal colours in it.
            .env("NO_COLOR", "1")
            .envs(&self.env)
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(Stdio::from(log_out))
            .stderr(Stdio::from(log));
        let child = cmd
            .spawn()
            .map_err(io_err(format!("spawn {}", self.bin.display())))?;
        let mut pdbmux = Pdbmux {
            child,
            addr: requested,
            log_path,
            _home: home,
        };
        pdbmux.wait_ready()?;
        Ok(pdbmux)
    }
}

/// A running pdbmux; killed when dropped.
#[derive(Debug)]
pub struct Pdbmux {
    child: Child,
    addr: SocketAddr,
    log_path: PathBuf,
    _home: tempfile::TempDir,
}

impl Pdbmux {
    /// The address from pdbmux's startup line (`pdbmux serving listen=<addr>`), once logged.
    fn logged_addr(&self) -> Option<SocketAddr> {
        self.serving_address("listen=")
    }

    /// Where pdbmux serves its own metrics (`metrics=<addr>` on its startup line), when a
    /// metrics listener was asked for (`PDBMUX_METRICS_LISTEN`, `127.0.0.1:0` for a free port).
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.serving_address("metrics=")
    }

    fn serving_address(&self, key: &str) -> Option<SocketAddr> {
        let text = fs::read_to_string(&self.log_path).ok()?;
        let line = text.lines().find(|l| l.contains("pdbmux serving"))?;
        let rest = &line[line.find(key)? + key.len()..];
        rest.split_whitespace().next()?.parse().ok()
    }

    fn wait_ready(&mut self) -> Result<(), Error> {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if self.addr.port() == 0 {
                if let Some(addr) = self.logged_addr() {
                    self.addr = addr;
                }
            }
            if let Some(status) = self.child.try_wait().map_err(io_err("wait for pdbmux"))? {
                return Err(Error::Exited {
                    status,
                    addr: self.addr,
                    log: self.log_path.display().to_string(),
                    log_text: self.log(),
                });
            }
            if self.addr.port() != 0
                && TcpStream::connect_timeout(&self.addr, Duration::from_millis(200)).is_ok()
            {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(Error::NotReady {
                    addr: self.addr,
                    secs: READY_TIMEOUT.as_secs(),
                    log: self.log_path.display().to_string(),
                    log_text: self.log(),
                });
            }
            std::thread::sleep(Duration::from_millis(25));
        }
    }

    /// pdbmux's memory mappings, one `/proc/<pid>/maps` line each (Linux only), to see from
    /// outside where it keeps its sealed cache bodies.
    pub fn memory_maps(&self) -> Result<Vec<String>, Error> {
        let path = format!("/proc/{}/maps", self.child.id());
        let maps = fs::read_to_string(&path).map_err(io_err("read pdbmux's memory maps"))?;
        Ok(maps.lines().map(str::to_owned).collect())
    }

    /// pdbmux's resident memory (`VmRSS` in `/proc/<pid>/status`, Linux only), in KiB.
    pub fn resident_kib(&self) -> Result<u64, Error> {
        let path = format!("/proc/{}/status", self.child.id());
        let status = fs::read_to_string(&path).map_err(io_err("read pdbmux's status"))?;
        let rss = status
            .lines()
            .find_map(|line| line.strip_prefix("VmRSS:"))
            .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok());
        Ok(rss.unwrap_or(0))
    }

    /// The address pdbmux listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:<port><path_and_query>`.
    pub fn url(&self, path_and_query: &str) -> String {
        format!("http://{}{}", self.addr, path_and_query)
    }

    /// GET a path (with its query string, already encoded) through pdbmux.
    pub fn get(&self, path_and_query: &str) -> Result<Response, Error> {
        get(&self.url(path_and_query))
    }

    /// GET `path` with `params` form-encoded into the query string, through pdbmux.
    pub fn get_query(&self, path: &str, params: &[(&str, &str)]) -> Result<Response, Error> {
        get(&url_with_query(&self.url(path), params))
    }

    /// Sends `GET <target> HTTP/1.1` as written: no client library normalises the target.
    pub fn raw_get(&self, target: &str) -> Result<Response, Error> {
        let request = format!(
            "GET {target} HTTP/1.1\r\nHost: {}\r\nAccept: application/json\r\nConnection: close\r\n\r\n",
            self.addr
        );
        raw_request(self.addr, request.as_bytes())
    }

    /// Sends a complete raw HTTP/1.1 request (request line, headers and body as given).
    pub fn raw(&self, request: &[u8]) -> Result<Response, Error> {
        raw_request(self.addr, request)
    }

    /// What pdbmux has written to stdout and stderr so far.
    pub fn log(&self) -> String {
        fs::read(&self.log_path)
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_else(|e| format!("(cannot read {}: {e})", self.log_path.display()))
    }

    /// The log file's path.
    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// Sends the signal `name` (`HUP`, `TERM`, …) to pdbmux.
    pub fn signal(&self, name: &str) -> Result<(), Error> {
        let status = Command::new("kill")
            .arg(format!("-{name}"))
            .arg(self.child.id().to_string())
            .status()
            .map_err(io_err("run kill"))?;
        if status.success() {
            Ok(())
        } else {
            Err(Error::Io {
                what: "kill".to_owned(),
                source: std::io::Error::other(format!("kill -{name} exited {status}")),
            })
        }
    }

    /// Waits (at most 10 s) until pdbmux's log holds `count` lines containing `text`.
    pub fn wait_for_log(&self, text: &str, count: usize) -> Result<(), Error> {
        let deadline = Instant::now() + Duration::from_secs(10);
        while self
            .log()
            .lines()
            .filter(|line| line.contains(text))
            .count()
            < count
        {
            if Instant::now() >= deadline {
                return Err(Error::Io {
                    what: "wait for a log line".to_owned(),
                    source: std::io::Error::other(format!(
                        "{count} × {text:?} never logged:\n{}",
                        self.log()
                    )),
                });
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        Ok(())
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for Pdbmux {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let log = self.log();
            let lines: Vec<&str> = log.lines().collect();
            let tail = lines[lines.len().saturating_sub(60)..].join("\n");
            eprintln!(
                "---- pdbmux on {} (log {}), last {} lines ----\n{tail}\n----",
                self.addr,
                self.log_path.display(),
                lines.len().min(60)
            );
        }
        // Already exited is fine: kill then reports an error we have no use for.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A Jetty access log of one backend, read from a remembered offset: lets a test show that a
/// request never reached that backend.
#[derive(Debug)]
pub struct AccessLog {
    /// The backend's name.
    pub backend: String,
    path: PathBuf,
    start: u64,
}

impl AccessLog {
    /// Remembers the current end of every backend's access log.
    pub fn mark_all(env: &E2eEnv) -> Result<Vec<Self>, Error> {
        env.access_logs
            .iter()
            .map(|(backend, path)| {
                let start = fs::metadata(path)
                    .map_err(io_err(format!("stat {}", path.display())))?
                    .len();
                Ok(Self {
                    backend: backend.clone(),
                    path: path.clone(),
                    start,
                })
            })
            .collect()
    }

    /// The lines written since the mark.
    pub fn new_lines(&self) -> Result<Vec<String>, Error> {
        let mut file =
            File::open(&self.path).map_err(io_err(format!("open {}", self.path.display())))?;
        let mut all = Vec::new();
        file.read_to_end(&mut all)
            .map_err(io_err(format!("read {}", self.path.display())))?;
        let start = usize::try_from(self.start)
            .unwrap_or(usize::MAX)
            .min(all.len());
        Ok(String::from_utf8_lossy(&all[start..])
            .lines()
            .map(str::to_owned)
            .collect())
    }

    /// Waits (up to `timeout`) until a line containing `needle` has been written since the mark.
    pub fn wait_for(&self, needle: &str, timeout: Duration) -> Result<bool, Error> {
        let deadline = Instant::now() + timeout;
        loop {
            if self.new_lines()?.iter().any(|l| l.contains(needle)) {
                return Ok(true);
            }
            if Instant::now() >= deadline {
                return Ok(false);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl fmt::Display for AccessLog {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.backend, self.path.display())
    }
}

/// A token unique to this test process and call, to find one request in an access log.
pub fn marker(label: &str) -> String {
    static SEQ: AtomicUsize = AtomicUsize::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!(
        "e2e-{label}-{}-{}-{nanos}",
        std::process::id(),
        SEQ.fetch_add(1, atomic::Ordering::Relaxed)
    )
}

/// Segment-wise numeric version order ("7.9.0" < "7.12.1").
pub fn cmp_version(a: &str, b: &str) -> Ordering {
    let parts = |v: &str| -> Vec<u64> { v.split('.').map(|s| s.parse().unwrap_or(0)).collect() };
    parts(a).cmp(&parts(b))
}

/// Seconds since the epoch of a PuppetDB timestamp, `YYYY-MM-DDTHH:MM:SS[.fff]Z`; None for
/// anything else.
pub fn epoch_seconds(ts: &str) -> Option<i64> {
    let b = ts.as_bytes();
    if b.len() < 20 || b[4] != b'-' || b[10] != b'T' || !ts.ends_with('Z') {
        return None;
    }
    let n = |r: std::ops::Range<usize>| ts.get(r)?.parse::<i64>().ok();
    let (y, m, d) = (n(0..4)?, n(5..7)?, n(8..10)?);
    let (hh, mm, ss) = (n(11..13)?, n(14..16)?, n(17..19)?);
    // Days from civil (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(days * 86_400 + hh * 3600 + mm * 60 + ss)
}

/// A PuppetDB-style UTC timestamp with microseconds, `YYYY-MM-DDTHH:MM:SS.000000Z` (the form
/// Puppetboard's daily chart sends), for seconds since the epoch.
pub fn timestamp_micros(secs: i64) -> String {
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Civil from days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.000000Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_closed_backend_refuses_connections_and_no_listener_can_take_its_port() {
        let closed = closed_backend().expect("a closed backend");
        let addr: SocketAddr = closed
            .url()
            .trim_start_matches("http://")
            .parse()
            .expect("an address");
        let refused = TcpStream::connect_timeout(&addr, Duration::from_secs(2))
            .expect_err("a connection to a closed backend");
        assert_eq!(refused.kind(), std::io::ErrorKind::ConnectionRefused);
        // std's listeners set SO_REUSEADDR, as tokio's and async-io's do: even so the port is
        // not theirs while the closed backend lives, and is once it is dropped.
        let taken = TcpListener::bind(addr).expect_err("a listener on the closed backend's port");
        assert_eq!(taken.kind(), std::io::ErrorKind::AddrInUse);
        drop(closed);
        TcpListener::bind(addr).expect("the port, released");
    }

    #[test]
    fn timestamps_format_from_epoch_seconds() {
        assert_eq!(timestamp_micros(0), "1970-01-01T00:00:00.000000Z");
        assert_eq!(
            timestamp_micros(1_709_296_215),
            "2024-03-01T12:30:15.000000Z"
        );
        for secs in [951_782_400, 1_709_251_199, 1_796_034_372] {
            assert_eq!(epoch_seconds(&timestamp_micros(secs)), Some(secs));
        }
    }

    #[test]
    fn versions_compare_segment_wise() {
        assert_eq!(cmp_version("7.9.0", "7.12.1"), Ordering::Less);
        assert_eq!(cmp_version("8.0.0", "7.12.1"), Ordering::Greater);
        assert_eq!(cmp_version("7.12.1", "7.12.1"), Ordering::Equal);
    }

    #[test]
    fn timestamps_convert_to_epoch_seconds() {
        assert_eq!(epoch_seconds("1970-01-01T00:00:00.000Z"), Some(0));
        assert_eq!(
            epoch_seconds("2024-03-01T12:30:15.123Z"),
            Some(1_709_296_215)
        );
        assert_eq!(epoch_seconds("2024-03-01 12:30:15"), None);
    }

    #[test]
    fn pairs_parse_and_reject_garbage() {
        assert_eq!(
            parse_pairs("X", "a=http://h:1, b=http://h:2").ok(),
            Some(vec![
                ("a".to_owned(), "http://h:1".to_owned()),
                ("b".to_owned(), "http://h:2".to_owned())
            ])
        );
        assert!(parse_pairs("X", "a=http://h:1,nourl").is_err());
    }
}
