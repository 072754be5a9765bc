//! The processes the load benchmarks start: stopped when dropped, on loopback ports, with the
//! fake PuppetDB's start-up handshake (`LISTEN <addr>`).

use std::error::Error;
use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::SyntheticEstate;

type Result<T> = std::result::Result<T, Box<dyn Error>>;

/// A child process stopped (SIGTERM, then SIGKILL) when dropped.
pub struct Proc {
    name: &'static str,
    child: Child,
}

impl Proc {
    /// Takes charge of `child`, named `name` in messages.
    pub fn new(name: &'static str, child: Child) -> Proc {
        Proc { name, child }
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let pid = self.child.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        eprintln!(
            "{} (pid {pid}) did not stop on SIGTERM; killing it",
            self.name
        );
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A loopback port free now.
pub fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Waits (up to 20 s) until `addr` accepts connections.
pub fn wait_listening(addr: SocketAddr, what: &str) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if TcpStream::connect(addr).is_ok() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    Err(format!("{what} did not listen on {addr}").into())
}

/// Starts `fakepdb` (the program `command` runs, with any flags it has, such as `--entities`)
/// as `backend` of `spec`, and returns it with its address once it listens.
pub fn start_fakepdb(
    mut command: Command,
    backend: usize,
    spec: &SyntheticEstate,
) -> Result<(Proc, SocketAddr)> {
    command
        .args(["--listen", "127.0.0.1:0", "--backend", &backend.to_string()])
        .args(["--nodes", &spec.nodes_per_backend.to_string()])
        .args(["--overlap", &spec.overlap.to_string()])
        .args(["--facts", &spec.facts_per_node.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::piped());
    let mut child = command
        .spawn()
        .map_err(|e| format!("starting {:?}: {e}", command.get_program()))?;
    let stdout = child.stdout.take().ok_or("fakepdb stdout")?;
    let proc = Proc::new("fakepdb", child);
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line)?;
    let addr: SocketAddr = line
        .trim()
        .strip_prefix("LISTEN ")
        .ok_or_else(|| format!("fakepdb said {line:?}"))?
        .parse()?;
    Ok((proc, addr))
}
