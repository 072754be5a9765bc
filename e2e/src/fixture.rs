//! The fixture estate as `e2e/fixture/load.py` describes it in `fixture.json`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use pdbmux_core::membership::Kind;
use serde::Deserialize;

use crate::order::instant;
use crate::{Backend, Error};

/// What the loader put into the backends.
#[derive(Debug, Clone, Deserialize)]
pub struct Fixture {
    /// The file format version (1).
    pub format: u32,
    /// When the loader ran (the reference point of every timestamp).
    pub loaded_at: String,
    /// The DNS suffix of every fixture certname.
    pub domain: String,
    /// The backends loaded, in the order given to the loader (first, second).
    pub backends: Vec<Backend>,
    /// Per certname: the scenario and what each backend holding it was sent.
    pub nodes: BTreeMap<String, FixtureNode>,
    /// Every report as the backends stored it (hash computed by PuppetDB).
    pub reports: Vec<FixtureReport>,
    /// Every command sent, in order, with its payload.
    pub commands: Vec<FixtureCommand>,
}

/// One certname of the fixture.
#[derive(Debug, Clone, Deserialize)]
pub struct FixtureNode {
    /// What the node is there to exercise, e.g. `second-only` or `both-report-timestamp-tie`.
    pub scenario: String,
    /// Its state in each backend that holds it, by backend name.
    pub backends: BTreeMap<String, NodeState>,
}

/// One node as one backend holds it.
#[derive(Debug, Clone, Deserialize)]
pub struct NodeState {
    /// Environment of its facts, catalog and reports.
    pub environment: String,
    /// Not deactivated.
    pub active: bool,
    /// The deactivation's producer_timestamp, if deactivated.
    pub deactivated: Option<String>,
    /// The newest report's end_time (null for a node that only sent facts).
    pub report_timestamp: Option<String>,
    /// The newest report's status.
    pub latest_report_status: Option<String>,
    /// The newest run's kind in the loader (changed, failed, noop, unchanged).
    pub latest_report_kind: Option<String>,
    /// producer_timestamp of its factset.
    pub facts_producer_timestamp: String,
    /// When the backend received its facts (`/nodes` `facts_timestamp`, read back after
    /// loading): what breaks a tie of report timestamps.
    #[serde(default)]
    pub facts_timestamp: Option<String>,
    /// producer_timestamp of its catalog, if it has one.
    pub catalog_producer_timestamp: Option<String>,
    /// Number of reports stored.
    pub reports: usize,
    /// Status of every event of every report, sorted.
    pub event_statuses: Vec<String>,
    /// Resources in its catalog (0 without a catalog).
    pub catalog_resources: usize,
    /// Edges in its catalog.
    pub catalog_edges: usize,
}

/// One stored report.
#[derive(Debug, Clone, Deserialize)]
pub struct FixtureReport {
    /// The backend that stored it.
    pub backend: String,
    /// Its node.
    pub certname: String,
    /// The hash PuppetDB computed.
    pub hash: String,
    /// Its end_time.
    pub end_time: String,
    /// Its producer_timestamp.
    pub producer_timestamp: String,
    /// Its transaction_uuid (joins it to its command).
    pub transaction_uuid: Option<String>,
    /// Its environment.
    pub environment: String,
    /// Its status.
    pub status: Option<String>,
    /// Whether it was a noop run.
    pub noop: Option<bool>,
}

/// One command sent to one backend.
#[derive(Debug, Clone, Deserialize)]
pub struct FixtureCommand {
    /// The backend it was sent to.
    pub backend: String,
    /// `replace_facts`, `replace_catalog`, `store_report` or `deactivate_node`.
    pub command: String,
    /// The command version.
    pub version: u32,
    /// The node.
    pub certname: String,
    /// The payload as sent.
    pub payload: serde_json::Value,
}

impl Fixture {
    /// Reads and parses a fixture.json.
    pub fn load(path: &Path) -> Result<Self, Error> {
        let fail = |reason: String| Error::Fixture {
            path: path.to_owned(),
            reason,
        };
        let text = std::fs::read_to_string(path).map_err(|e| fail(e.to_string()))?;
        let fixture: Self = serde_json::from_str(&text).map_err(|e| fail(e.to_string()))?;
        if fixture.format != 1 {
            return Err(fail(format!(
                "format {} (this crate reads 1)",
                fixture.format
            )));
        }
        if fixture.backends.len() != 2 {
            return Err(fail(format!(
                "{} backends (the fixture has two)",
                fixture.backends.len()
            )));
        }
        Ok(fixture)
    }

    /// The backend names in load order.
    pub fn backend_names(&self) -> Vec<&str> {
        self.backends.iter().map(|b| b.name.as_str()).collect()
    }

    /// Certnames of a scenario, sorted.
    pub fn scenario(&self, scenario: &str) -> Vec<&str> {
        self.nodes
            .iter()
            .filter(|(_, n)| n.scenario == scenario)
            .map(|(c, _)| c.as_str())
            .collect()
    }

    /// Certnames held (active or not) by exactly the given backends.
    pub fn held_by_exactly(&self, backends: &[&str]) -> Vec<&str> {
        let want: BTreeSet<&str> = backends.iter().copied().collect();
        self.nodes
            .iter()
            .filter(|(_, n)| {
                n.backends
                    .keys()
                    .map(String::as_str)
                    .collect::<BTreeSet<_>>()
                    == want
            })
            .map(|(c, _)| c.as_str())
            .collect()
    }

    /// Certnames active in a backend.
    pub fn active_in(&self, backend: &str) -> BTreeSet<&str> {
        self.nodes
            .iter()
            .filter(|(_, n)| n.backends.get(backend).is_some_and(|s| s.active))
            .map(|(c, _)| c.as_str())
            .collect()
    }

    /// Certnames active in at least one backend.
    pub fn active_anywhere(&self) -> BTreeSet<&str> {
        self.nodes
            .iter()
            .filter(|(_, n)| n.backends.values().any(|s| s.active))
            .map(|(c, _)| c.as_str())
            .collect()
    }

    /// A node's state in a backend.
    pub fn state(&self, certname: &str, backend: &str) -> Option<&NodeState> {
        self.nodes.get(certname)?.backends.get(backend)
    }

    /// Environments with at least one node in a backend.
    pub fn environments_in(&self, backend: &str) -> BTreeSet<&str> {
        self.nodes
            .values()
            .filter_map(|n| n.backends.get(backend))
            .map(|s| s.environment.as_str())
            .collect()
    }

    /// Reports whose hash only the given backend stored.
    pub fn reports_only_in(&self, backend: &str) -> Vec<&FixtureReport> {
        self.reports
            .iter()
            .filter(|r| r.backend == backend)
            .filter(|r| {
                !self
                    .reports
                    .iter()
                    .any(|o| o.hash == r.hash && o.backend != backend)
            })
            .collect()
    }

    /// Report hashes stored by more than one backend.
    pub fn shared_report_hashes(&self) -> BTreeSet<&str> {
        self.reports
            .iter()
            .filter(|r| {
                self.reports
                    .iter()
                    .any(|o| o.hash == r.hash && o.backend != r.backend)
            })
            .map(|r| r.hash.as_str())
            .collect()
    }

    /// Commands of a kind sent to a backend for a node, in order.
    pub fn commands(&self, backend: &str, certname: &str, command: &str) -> Vec<&FixtureCommand> {
        self.commands
            .iter()
            .filter(|c| c.backend == backend && c.certname == certname && c.command == command)
            .collect()
    }

    /// The store_report payload of a stored report (joined on transaction_uuid).
    pub fn report_payload(&self, report: &FixtureReport) -> Option<&serde_json::Value> {
        let uuid = report.transaction_uuid.as_deref()?;
        self.commands(&report.backend, &report.certname, "store_report")
            .into_iter()
            .map(|c| &c.payload)
            .find(|p| p.get("transaction_uuid").and_then(|v| v.as_str()) == Some(uuid))
    }

    /// The backend whose record wins a node's /nodes merge (and owns it under `merge:
    /// freshness`): among the backends holding it active, the newer newest report (no report is
    /// older than any), then the facts produced later, then the catalog produced later, a tie
    /// going to the first in load order (receive times never decide). None when no backend
    /// holds it active.
    pub fn freshness_winner(&self, certname: &str) -> Option<&str> {
        self.fresher_holder(certname, true)
    }

    /// [`Fixture::freshness_winner`] over every backend holding the node, active or not (the
    /// owner of its history and of `/catalogs`, which sees every node state).
    pub fn freshness_winner_any_state(&self, certname: &str) -> Option<&str> {
        self.fresher_holder(certname, false)
    }

    /// The backend owning a node's `kind` of data under `merge: freshness` among the backends
    /// holding it active: the one whose copy of that kind was produced last (a node record by
    /// [`Fixture::freshness_winner`]'s rule), a tie going to the first in load order.
    pub fn kind_owner(&self, certname: &str, kind: Kind) -> Option<&str> {
        self.newest_holder(certname, true, kind)
    }

    fn fresher_holder(&self, certname: &str, active_only: bool) -> Option<&str> {
        self.newest_holder(certname, active_only, Kind::Node)
    }

    fn newest_holder(&self, certname: &str, active_only: bool, kind: Kind) -> Option<&str> {
        let node = self.nodes.get(certname)?;
        type Freshness = [Option<(i64, u32)>; 3];
        let mut winner: Option<(&str, Freshness)> = None;
        for b in &self.backends {
            let Some(state) = node
                .backends
                .get(&b.name)
                .filter(|s| s.active || !active_only)
            else {
                continue;
            };
            let report = state.report_timestamp.as_deref().and_then(instant);
            let facts = instant(&state.facts_producer_timestamp);
            let catalog = state
                .catalog_producer_timestamp
                .as_deref()
                .and_then(instant);
            let freshness = match kind {
                Kind::Node => [report, facts, catalog],
                Kind::Facts => [facts, None, None],
                Kind::Catalog => [catalog, None, None],
            };
            match winner {
                Some((_, best)) if freshness <= best => {}
                _ => winner = Some((b.name.as_str(), freshness)),
            }
        }
        winner.map(|(name, _)| name)
    }

    /// The backend owning a node under `merge: static`: the first in load order holding it active.
    pub fn static_owner(&self, certname: &str) -> Option<&str> {
        let node = self.nodes.get(certname)?;
        self.backends
            .iter()
            .find(|b| node.backends.get(&b.name).is_some_and(|s| s.active))
            .map(|b| b.name.as_str())
    }

    /// Certnames held active by every backend.
    pub fn active_in_all(&self) -> Vec<&str> {
        self.nodes
            .iter()
            .filter(|(_, n)| {
                self.backends
                    .iter()
                    .all(|b| n.backends.get(&b.name).is_some_and(|s| s.active))
            })
            .map(|(c, _)| c.as_str())
            .collect()
    }

    /// Every (backend, certname, value) of a fact the loader sent under `name` (in the last
    /// replace_facts payload of each node).
    pub fn fact_values(&self, name: &str) -> Vec<(&str, &str, &serde_json::Value)> {
        let mut out = Vec::new();
        for (certname, node) in &self.nodes {
            for backend in node.backends.keys() {
                if let Some(v) = self
                    .facts_payload(backend, certname)
                    .and_then(|p| p["values"].get(name))
                {
                    out.push((backend.as_str(), certname.as_str(), v));
                }
            }
        }
        out
    }

    /// The last replace_facts payload a backend got for a node.
    pub fn facts_payload(&self, backend: &str, certname: &str) -> Option<&serde_json::Value> {
        self.commands(backend, certname, "replace_facts")
            .last()
            .map(|c| &c.payload)
    }
}
