//! Shared pieces of the pdbmux benchmarks (see `bench/README.md`).
//!
//! - [`SyntheticEstate`]: a deterministic estate spread over two backends with overlapping nodes,
//!   rendered as the `/facts` body and the membership (`/nodes` extract) body each backend would
//!   send. The merge benchmark feeds these bodies to the core; the fake PuppetDB (`fakepdb`)
//!   serves them over HTTP.
//! - [`best_of`] and [`mb_per_s`]: timing helpers.
//! - [`procs`]: the processes the load benchmarks start (stopped when dropped), and `fakepdb`'s
//!   start-up.
//!
//! Nothing here is a test; the figures are printed by the binaries under `src/bin/`.

#![forbid(unsafe_code)]

pub mod procs;

use std::ops::Range;
use std::time::{Duration, Instant};

use pdbmux_core::membership::TIME_KEY;
use serde_json::{json, Value};

/// A synthetic estate: `nodes_per_backend` nodes on each of `backends` backends, neighbouring
/// backends sharing `overlap` nodes, each node with `facts_per_node` fact records.
///
/// A node held by two backends has the newer report on one of them (alternating by node number),
/// so ownership genuinely differs per node, and its facts differ between the two copies (the
/// stale copy carries other values), as after a migration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SyntheticEstate {
    /// How many backends.
    pub backends: usize,
    /// Nodes each backend holds.
    pub nodes_per_backend: usize,
    /// Nodes each backend shares with the next one.
    pub overlap: usize,
    /// Fact records per node.
    pub facts_per_node: usize,
}

/// The fact names every node carries first; the rest are `custom_fact_<n>`.
const FACT_NAMES: [&str; 24] = [
    "os",
    "networking",
    "memory",
    "processors",
    "is_virtual",
    "virtual",
    "kernel",
    "kernelrelease",
    "uptime_seconds",
    "load_averages",
    "timezone",
    "ipaddress",
    "fqdn",
    "hostname",
    "puppetversion",
    "mountpoints",
    "ssh",
    "path",
    "disks",
    "ec2_metadata",
    "dhcp_servers",
    "swapsize_mb",
    "system_uptime",
    "role",
];

const ENVIRONMENTS: [&str; 3] = ["production", "staging", "development"];

/// A small deterministic generator (SplitMix64).
#[derive(Debug, Clone)]
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x9e37_79b9_7f4a_7c15)
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    fn hex(&mut self, len: usize) -> String {
        let mut out = String::with_capacity(len);
        while out.len() < len {
            out.push_str(&format!("{:016x}", self.next()));
        }
        out.truncate(len);
        out
    }
}

impl SyntheticEstate {
    /// The nodes (by number) that `backend` holds.
    pub fn nodes(&self, backend: usize) -> Range<usize> {
        let start = backend * self.nodes_per_backend.saturating_sub(self.overlap);
        start..start + self.nodes_per_backend
    }

    /// The backends (by index) that hold `node`.
    fn holders(&self, node: usize) -> Vec<usize> {
        (0..self.backends)
            .filter(|&b| self.nodes(b).contains(&node))
            .collect()
    }

    /// The backend whose report on `node` is the newest.
    pub fn freshest(&self, node: usize) -> Option<usize> {
        let holders = self.holders(node);
        holders.get(node % holders.len().max(1)).copied()
    }

    /// The certname of node `node`.
    pub fn certname(node: usize) -> String {
        format!("node-{node:05}.example.com")
    }

    /// `backend`'s report_timestamp for `node`: the freshest holder's is an hour newer.
    fn report_timestamp(&self, node: usize, backend: usize) -> String {
        let hour = if self.freshest(node) == Some(backend) {
            8
        } else {
            7
        };
        format!(
            "2026-11-30T{hour:02}:{:02}:{:02}.{:03}Z",
            node % 60,
            (node / 60) % 60,
            node % 1000
        )
    }

    /// `backend`'s report time for `node` as the membership refresh asks PuppetDB to write it
    /// (`membership::TIME_FORMAT`, in a UTC session): microseconds and the offset.
    fn report_time_written(&self, node: usize, backend: usize) -> String {
        let stamp = self.report_timestamp(node, backend);
        format!("{}000+00", stamp.trim_end_matches('Z'))
    }

    /// `backend`'s answer to the membership query (an extract of `/nodes`: certname, report
    /// time, deactivated, expired).
    pub fn membership_body(&self, backend: usize) -> Vec<u8> {
        let rows: Vec<Value> = self
            .nodes(backend)
            .map(|node| {
                json!({
                    "certname": Self::certname(node),
                    (TIME_KEY): self.report_time_written(node, backend),
                    "deactivated": null,
                    "expired": null,
                })
            })
            .collect();
        serde_json::to_vec(&rows).unwrap_or_default()
    }

    /// `backend`'s answer to an unpaged `/pdb/query/v4/nodes`: every node it holds as PuppetDB
    /// 7 writes a node record (about 600 bytes), its report timestamp the one
    /// [`SyntheticEstate::membership_body`] gives.
    pub fn nodes_body(&self, backend: usize) -> Vec<u8> {
        let mut out = Records::with_capacity(self.nodes_per_backend * 640);
        for node in self.nodes(backend) {
            let stamp = self.report_timestamp(node, backend);
            let environment = ENVIRONMENTS[node % ENVIRONMENTS.len()];
            let mut rng = Rng::new((node as u64) << 8 | backend as u64);
            let status = ["changed", "unchanged", "failed"][node % 3];
            out.push(&json!({
                "certname": Self::certname(node),
                "deactivated": null,
                "expired": null,
                "facts_timestamp": stamp,
                "catalog_timestamp": stamp,
                "report_timestamp": stamp,
                "facts_environment": environment,
                "catalog_environment": environment,
                "report_environment": environment,
                "latest_report_status": status,
                "latest_report_hash": rng.hex(40),
                "latest_report_noop": false,
                "latest_report_noop_pending": false,
                "latest_report_corrective_change": null,
                "latest_report_job_id": null,
                "cached_catalog_status": "not_used",
            }));
        }
        out.finish()
    }

    /// `backend`'s answer to the membership refresh's producer-time queries (certname and
    /// `producer_timestamp` as `TIME_FORMAT` writes it, on `/factsets` and on `/catalogs`):
    /// each node's facts and catalog produced in the run of its report.
    pub fn produced_body(&self, backend: usize) -> Vec<u8> {
        let rows: Vec<Value> = self
            .nodes(backend)
            .map(|node| {
                json!({
                    "certname": Self::certname(node),
                    (TIME_KEY): self.report_time_written(node, backend),
                })
            })
            .collect();
        serde_json::to_vec(&rows).unwrap_or_default()
    }

    /// Calls `each` with every fact of every node `backend` holds, in node order and each node's
    /// by name (byte-wise), as PuppetDB sorts `order_by` certname then name (fakepdb serves
    /// one body for every question, ordered ones included): the node's number, certname and
    /// environment, the fact's name and value.
    fn each_fact(&self, backend: usize, mut each: impl FnMut(usize, &str, &str, String, Value)) {
        for node in self.nodes(backend) {
            let certname = Self::certname(node);
            let environment = ENVIRONMENTS[node % ENVIRONMENTS.len()];
            let mut rng = Rng::new((node as u64) << 8 | backend as u64);
            let mut facts: Vec<(String, Value)> = (0..self.facts_per_node)
                .map(|index| {
                    let name = match FACT_NAMES.get(index) {
                        Some(name) => (*name).to_owned(),
                        None => format!("custom_fact_{index}"),
                    };
                    let value = fact_value(&name, index, node, &certname, &mut rng);
                    (name, value)
                })
                .collect();
            facts.sort_by(|a, b| a.0.cmp(&b.0));
            for (name, value) in facts {
                each(node, &certname, environment, name, value);
            }
        }
    }

    /// `backend`'s answer to an unpaged `/pdb/query/v4/facts`: every fact of every node it holds,
    /// as `{certname, environment, name, value}` records with mixed value types.
    pub fn facts_body(&self, backend: usize) -> Vec<u8> {
        let mut out = Records::with_capacity(self.nodes_per_backend * self.facts_per_node * 220);
        self.each_fact(backend, |_, certname, environment, name, value| {
            out.push(&json!({
                "certname": certname,
                "environment": environment,
                "name": name,
                "value": value,
            }));
        });
        out.finish()
    }

    /// `backend`'s answer to `/pdb/query/v4/facts` ordered by name, then certname, as PuppetDB
    /// sorts it: [`SyntheticEstate::facts_body`]'s records, name first (byte-wise).
    pub fn facts_by_name_body(&self, backend: usize) -> Vec<u8> {
        let mut records: Vec<(String, String, Vec<u8>)> = Vec::new();
        self.each_fact(backend, |_, certname, environment, name, value| {
            let record = json!({
                "certname": certname,
                "environment": environment,
                "name": name,
                "value": value,
            });
            let text = serde_json::to_vec(&record).unwrap_or_default();
            records.push((name, certname.to_owned(), text));
        });
        records.sort_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)));
        let bytes: usize = records.iter().map(|(_, _, text)| text.len() + 1).sum();
        let mut out = Records::with_capacity(bytes);
        for (_, _, text) in &records {
            out.push_text(text);
        }
        out.finish()
    }

    /// `backend`'s answer to the provenance records' ask (`["extract",["certname","environment"],
    /// <query>,["group_by","certname","environment"]]` on `/pdb/query/v4/facts`): one row per
    /// node it holds.
    pub fn fact_nodes_body(&self, backend: usize) -> Vec<u8> {
        let rows: Vec<Value> = self
            .nodes(backend)
            .map(|node| {
                json!({
                    "certname": Self::certname(node),
                    "environment": ENVIRONMENTS[node % ENVIRONMENTS.len()],
                })
            })
            .collect();
        serde_json::to_vec(&rows).unwrap_or_default()
    }

    /// `backend`'s answer to an unpaged `/pdb/query/v4/fact-contents`: every leaf of every fact,
    /// as `{certname, environment, name, path, value}` records.
    pub fn fact_contents_body(&self, backend: usize) -> Vec<u8> {
        let mut out = Records::with_capacity(self.nodes_per_backend * self.facts_per_node * 300);
        self.each_fact(backend, |_, certname, environment, name, value| {
            let mut path = vec![Value::String(name.clone())];
            each_leaf(&value, &mut path, &mut |path, leaf| {
                out.push(&json!({
                    "certname": certname,
                    "environment": environment,
                    "name": name,
                    "path": path,
                    "value": leaf,
                }));
            });
        });
        out.finish()
    }

    /// `backend`'s answer to an unpaged `/pdb/query/v4/inventory`: one record per node with all
    /// its facts and its trusted facts.
    pub fn inventory_body(&self, backend: usize) -> Vec<u8> {
        let mut out = Records::with_capacity(self.nodes_per_backend * self.facts_per_node * 200);
        let mut current: Option<(usize, serde_json::Map<String, Value>, Value)> = None;
        let flush = |out: &mut Records, node: usize, facts, environment: Value| {
            let certname = Self::certname(node);
            out.push(&json!({
                "certname": certname,
                "timestamp": self.report_timestamp(node, backend),
                "environment": environment,
                "facts": Value::Object(facts),
                "trusted": {"certname": certname, "authenticated": "remote", "extensions": {}},
            }));
        };
        self.each_fact(backend, |node, _, environment, name, value| {
            if current.as_ref().is_some_and(|(n, _, _)| *n != node) {
                if let Some((n, facts, environment)) = current.take() {
                    flush(&mut out, n, facts, environment);
                }
            }
            let (_, facts, _) = current
                .get_or_insert_with(|| (node, serde_json::Map::new(), Value::from(environment)));
            facts.insert(name, value);
        });
        if let Some((n, facts, environment)) = current {
            flush(&mut out, n, facts, environment);
        }
        out.finish()
    }

    /// `backend`'s answer to an unpaged `/pdb/query/v4/resources`: half as many file resources
    /// per node as it has facts, with parameters.
    pub fn resources_body(&self, backend: usize) -> Vec<u8> {
        let per_node = self.facts_per_node / 2;
        let mut out = Records::with_capacity(self.nodes_per_backend * per_node * 560);
        for node in self.nodes(backend) {
            let certname = Self::certname(node);
            let environment = ENVIRONMENTS[node % ENVIRONMENTS.len()];
            let mut rng = Rng::new((node as u64) << 8 | backend as u64 | 1 << 40);
            for index in 0..per_node {
                let title = format!("/etc/app/conf.d/{index:03}.conf");
                out.push(&json!({
                    "certname": certname,
                    "resource": rng.hex(40),
                    "type": "File",
                    "title": title,
                    "tags": ["file", "class", "app", "app::config", "node"],
                    "exported": false,
                    "file": format!("/etc/puppetlabs/code/environments/{environment}/modules/app/manifests/config.pp"),
                    "line": 10 + index,
                    "environment": environment,
                    "parameters": {
                        "ensure": "file",
                        "owner": "root",
                        "group": "root",
                        "mode": "0644",
                        "content": format!("# managed by Puppet\nsetting_{index} = {}\n", rng.hex(16)),
                        "notify": "Service[app]",
                    },
                }));
            }
        }
        out.finish()
    }

    /// How many records the merged, unpaged `/facts` answer holds: each node's facts once (from
    /// its owner) plus one synthetic `pdbmux_source` record per node.
    pub fn merged_records(&self) -> usize {
        let nodes = (0..self.backends)
            .flat_map(|b| self.nodes(b))
            .max()
            .map_or(0, |last| last + 1);
        nodes * (self.facts_per_node + 1)
    }

    /// `/events` as `backend` stores them: `facts_per_node / 4` events of each node's last run,
    /// the same in every backend holding the node (an agent that reported to both) but for the
    /// `report_receive_time` each backend stamps, so that a merge serves each once.
    pub fn events_body(&self, backend: usize) -> Vec<u8> {
        let per_node = self.facts_per_node / 4;
        let mut out = Records::with_capacity(self.nodes_per_backend * per_node * 700);
        for node in self.nodes(backend) {
            let certname = Self::certname(node);
            let environment = ENVIRONMENTS[node % ENVIRONMENTS.len()];
            let mut rng = Rng::new((node as u64) << 8 | 1 << 41);
            let report = rng.hex(40);
            for index in 0..per_node {
                let title = format!("/etc/app/conf.d/{index:03}.conf");
                out.push(&json!({
                    "certname": certname,
                    "report": report,
                    "status": "success",
                    "timestamp": "2026-12-01T10:00:05.000Z",
                    "run_start_time": "2026-12-01T10:00:00.000Z",
                    "run_end_time": "2026-12-01T10:00:30.000Z",
                    "report_receive_time": format!("2026-12-01T10:00:3{backend}.000Z"),
                    "resource_type": "File",
                    "resource_title": title,
                    "property": "content",
                    "new_value": format!("{{sha256}}{}", rng.hex(64)),
                    "old_value": format!("{{sha256}}{}", rng.hex(64)),
                    "message": "content changed",
                    "file": format!("/etc/puppetlabs/code/environments/{environment}/modules/app/manifests/config.pp"),
                    "line": 10 + index,
                    "containment_path": ["Stage[main]", "App::Config", format!("File[{title}]")],
                    "containing_class": "App::Config",
                    "corrective_change": false,
                    "configuration_version": "1764583200",
                    "environment": environment,
                }));
            }
        }
        out.finish()
    }
}

/// A JSON array written record by record.
struct Records {
    out: Vec<u8>,
}

impl Records {
    fn with_capacity(bytes: usize) -> Records {
        let mut out = Vec::with_capacity(bytes);
        out.push(b'[');
        Records { out }
    }

    fn push(&mut self, record: &Value) {
        if self.out.len() > 1 {
            self.out.push(b',');
        }
        // Writing a Value to a Vec cannot fail.
        let _ = serde_json::to_writer(&mut self.out, record);
    }

    /// Appends a record already written as JSON.
    fn push_text(&mut self, record: &[u8]) {
        if self.out.len() > 1 {
            self.out.push(b',');
        }
        self.out.extend_from_slice(record);
    }

    fn finish(mut self) -> Vec<u8> {
        self.out.push(b']');
        self.out
    }
}

/// Calls `each` with every leaf of `value` and its path below `path` (object keys and array
/// indexes), as `/fact-contents` lists them.
fn each_leaf(value: &Value, path: &mut Vec<Value>, each: &mut impl FnMut(&[Value], &Value)) {
    match value {
        Value::Object(map) => {
            for (key, inner) in map {
                path.push(Value::String(key.clone()));
                each_leaf(inner, path, each);
                path.pop();
            }
        }
        Value::Array(items) => {
            for (index, inner) in items.iter().enumerate() {
                path.push(Value::from(index));
                each_leaf(inner, path, each);
                path.pop();
            }
        }
        leaf => each(path, leaf),
    }
}

/// One fact's value: structured facts for the well-known names, rotating scalar and small
/// compound types for the custom ones.
fn fact_value(name: &str, index: usize, node: usize, certname: &str, rng: &mut Rng) -> Value {
    let ip = format!(
        "10.{}.{}.{}",
        (node >> 16) & 255,
        (node >> 8) & 255,
        node & 255
    );
    match name {
        "os" => json!({
            "name": "Debian", "family": "Debian", "architecture": "amd64", "hardware": "x86_64",
            "release": {"full": format!("12.{}", rng.below(9)), "major": "12", "minor": rng.below(9).to_string()},
            "distro": {"codename": "bookworm", "id": "Debian", "description": "Debian GNU/Linux 12 (bookworm)"},
            "selinux": {"enabled": false},
        }),
        "networking" => json!({
            "hostname": certname.split('.').next().unwrap_or(certname), "domain": "example.com",
            "fqdn": certname, "ip": ip, "mac": format!("52:54:00:{}", &rng.hex(6)), "mtu": 1500,
            "primary": "eth0",
            "interfaces": {
                "eth0": {"ip": ip, "netmask": "255.255.0.0", "network": "10.0.0.0", "mtu": 1500},
                "lo": {"ip": "127.0.0.1", "netmask": "255.0.0.0", "network": "127.0.0.0", "mtu": 65536},
            },
        }),
        "memory" => {
            let total: u64 = 8 << 30;
            let used = rng.below(total);
            json!({"system": {"total": "8.00 GiB", "total_bytes": total, "used_bytes": used,
                "available_bytes": total - used,
                "capacity": format!("{:.2}%", used as f64 * 100.0 / total as f64)}})
        }
        "processors" => json!({"count": 1 << rng.below(4), "physicalcount": 1,
            "models": ["Intel(R) Xeon(R) Gold 6230 CPU @ 2.10GHz", "Intel(R) Xeon(R) Gold 6230 CPU @ 2.10GHz"],
            "speed": "2.10 GHz"}),
        "is_virtual" => json!(node % 7 != 0),
        "virtual" => json!(if node % 7 != 0 { "kvm" } else { "physical" }),
        "kernel" => json!("Linux"),
        "kernelrelease" => json!(format!("6.1.0-{}-amd64", 10 + rng.below(10))),
        "uptime_seconds" => json!(rng.below(10_000_000)),
        "load_averages" => json!({"1m": rng.below(400) as f64 / 100.0,
            "5m": rng.below(400) as f64 / 100.0, "15m": rng.below(400) as f64 / 100.0}),
        "timezone" => json!("UTC"),
        "ipaddress" => json!(ip),
        "fqdn" => json!(certname),
        "hostname" => json!(certname.split('.').next().unwrap_or(certname)),
        "puppetversion" => json!(format!("7.{}.0", 20 + rng.below(9))),
        "mountpoints" => json!({
            "/": {"device": "/dev/vda1", "filesystem": "ext4", "size_bytes": 42_949_672_960_u64,
                  "available_bytes": rng.below(42_949_672_960), "options": ["rw", "relatime"]},
            "/boot/efi": {"device": "/dev/vda15", "filesystem": "vfat", "size_bytes": 129_718_272,
                  "available_bytes": 123_456_000, "options": ["rw", "relatime", "fmask=0022"]},
        }),
        "ssh" => json!({"ed25519": {"fingerprints": {
                "sha1": format!("SSHFP 4 1 {}", rng.hex(40)),
                "sha256": format!("SSHFP 4 2 {}", rng.hex(64))},
            "key": format!("AAAAC3NzaC1lZDI1NTE5AAAAI{}", rng.hex(43)), "type": "ssh-ed25519"}}),
        "path" => json!("/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"),
        "disks" => json!({"vda": {"size": "40.00 GiB", "size_bytes": 42_949_672_960_u64,
            "type": "disk", "vendor": "0x1af4"}}),
        "ec2_metadata" => Value::Null,
        "dhcp_servers" => json!({"system": "10.0.0.1", "eth0": "10.0.0.1"}),
        "swapsize_mb" => json!(rng.below(409_600) as f64 / 100.0),
        "system_uptime" => {
            let seconds = rng.below(10_000_000);
            json!({"days": seconds / 86_400, "hours": seconds / 3600, "seconds": seconds,
                "uptime": format!("{} days", seconds / 86_400)})
        }
        "role" => json!(["web", "db", "cache", "worker"][node % 4]),
        _ => match index % 6 {
            0 => json!(format!("value-{}", rng.hex(12))),
            1 => json!(rng.below(1_000_000)),
            2 => json!(rng.below(100_000) as f64 / 7.0),
            3 => json!(rng.below(2) == 1),
            4 => json!([
                rng.below(100),
                rng.below(100),
                format!("item-{}", rng.hex(4))
            ]),
            _ => json!({"enabled": rng.below(2) == 1, "level": rng.below(10), "label": rng.hex(8)}),
        },
    }
}

/// The fastest of `runs` timings of `f` (at least one).
pub fn best_of<T>(runs: usize, mut f: impl FnMut() -> T) -> (Duration, T) {
    let mut best: Option<(Duration, T)> = None;
    for _ in 0..runs.max(1) {
        let started = Instant::now();
        let out = f();
        let elapsed = started.elapsed();
        if best.as_ref().is_none_or(|(fastest, _)| elapsed < *fastest) {
            best = Some((elapsed, out));
        } else {
            drop(out);
        }
    }
    match best {
        Some(best) => best,
        None => (Duration::ZERO, f()),
    }
}

/// Megabytes (10^6 bytes) per second.
pub fn mb_per_s(bytes: usize, elapsed: Duration) -> f64 {
    bytes as f64 / 1e6 / elapsed.as_secs_f64().max(1e-9)
}
