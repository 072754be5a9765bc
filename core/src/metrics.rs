//! The Jolokia metrics routes as a fan-out: every backend's envelope merged (see
//! [`crate::jolokia`]), and the population MBeans answered for the estate as a whole
//! (DECISIONS.md D9): `num-nodes` is the number of distinct active certnames in the membership
//! map, `num-resources` the resource count with node ownership pushed down (so a node two
//! backends hold is counted once), and `avg-resources-per-node` their quotient.

use std::sync::Arc;

use bytes::Bytes;
use http::{Method, StatusCode};
use serde_json::{json, Value};

use crate::config::Config;
use crate::ids::BackendId;
use crate::jolokia::{self, JolokiaMerge};
use crate::membership::{Ownership, Scope};
use crate::message::Response;
use crate::outbound::{self, Pushdown};
use crate::query::Params;
use crate::route::MetricsRoute;

const POPULATION: &str = "puppetlabs.puppetdb.population:name=";
const RESOURCE_COUNT_PATH: &str = "/pdb/query/v4/resources";

/// Which population figure a request reads, if it reads one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Population {
    Nodes,
    Resources,
    ResourcesPerNode,
}

/// A planned metrics fan-out.
#[derive(Debug)]
pub(crate) struct MetricsPlan {
    route: MetricsRoute,
    population: Option<Population>,
    /// Whether the attribute path reads `Value` itself (a bare number) rather than the object.
    bare_value: bool,
    ownership: Option<Arc<Ownership>>,
    strategy: crate::config::MergeStrategy,
}

/// Whether a metrics request reads a population MBean, so its answer needs the membership map.
pub(crate) fn reads_population(path: &str) -> bool {
    population_of(path).is_some()
}

fn population_of(path: &str) -> Option<Population> {
    let mbean = jolokia::mbean_of(path)?;
    match mbean.strip_prefix(POPULATION)? {
        "num-nodes" => Some(Population::Nodes),
        "num-resources" => Some(Population::Resources),
        "avg-resources-per-node" => Some(Population::ResourcesPerNode),
        _ => None,
    }
}

impl MetricsPlan {
    /// Plans a metrics request.
    pub(crate) fn plan(route: MetricsRoute, path: &str, config: &Config) -> MetricsPlan {
        let population = match route {
            MetricsRoute::Read => population_of(path),
            MetricsRoute::List | MetricsRoute::V1Mbeans => None,
        };
        let bare_value =
            jolokia::attribute_of(path).is_some_and(|a| a.eq_ignore_ascii_case("value"));
        MetricsPlan {
            route,
            population,
            bare_value,
            ownership: None,
            strategy: config.merge,
        }
    }

    /// Adds the membership snapshot the population MBeans are answered from.
    pub(crate) fn attach(&mut self, ownership: Option<Arc<Ownership>>) {
        self.ownership = ownership;
    }

    /// Upstream requests per backend: the metrics request itself, plus the owned resource count
    /// when the answer needs it.
    pub(crate) fn parts(&self) -> usize {
        match self.population {
            Some(Population::Resources | Population::ResourcesPerNode) => 2,
            _ => 1,
        }
    }

    /// The request for one backend's part (part 0 is the client's own target, verbatim).
    pub(crate) fn upstream_request(
        &self,
        target: &str,
        backend: BackendId,
        part: usize,
        asked: &[BackendId],
    ) -> (Method, String, Option<Bytes>) {
        if part == 0 {
            return (Method::GET, target.to_owned(), None);
        }
        let count = json!(["extract", [["function", "count"]]]);
        let query = match &self.ownership {
            Some(ownership) => {
                let pushdown: Pushdown = (Arc::clone(ownership), self.strategy, Scope::Active);
                outbound::owned_query(Some(&count), &pushdown, backend, asked).unwrap_or(count)
            }
            None => count,
        };
        let params = Params::parse(Some(&format!(
            "query={}",
            percent_encoding::utf8_percent_encode(
                &query.to_string(),
                percent_encoding::NON_ALPHANUMERIC
            )
        )));
        outbound::request(RESOURCE_COUNT_PATH, &params, true)
    }

    /// Merges the answers: `envelopes` are the 2xx metrics bodies in configured order,
    /// `resource_counts` the owned resource counts (for the population MBeans). `None` when no
    /// body was usable.
    pub(crate) fn respond(
        &self,
        envelopes: &[&[u8]],
        resource_counts: &[&[u8]],
    ) -> Option<(Response, usize)> {
        let merged = match self.route {
            MetricsRoute::V1Mbeans => jolokia::merge_v1(envelopes),
            MetricsRoute::Read | MetricsRoute::List => jolokia::merge_v2(envelopes),
        };
        let (body, contributed) = match merged {
            JolokiaMerge::Merged { body, contributed } => (body, contributed),
            // Every backend reported an in-band error: the first one's envelope is the answer.
            JolokiaMerge::AllInBandErrors {
                first_error_body_index,
            } => {
                let body = envelopes.get(first_error_body_index)?;
                return Some((Response::json(StatusCode::OK, body.to_vec()), 0));
            }
            JolokiaMerge::NothingUsable => return None,
        };
        let body = match self.population_value(resource_counts) {
            Some(value) => {
                let value = if self.bare_value {
                    value
                } else {
                    json!({ "Value": value })
                };
                jolokia::set_population_value(&body, value).unwrap_or(body)
            }
            None => body,
        };
        Some((Response::json(StatusCode::OK, body), contributed))
    }

    fn population_value(&self, resource_counts: &[&[u8]]) -> Option<Value> {
        let population = self.population?;
        let nodes = self.ownership.as_ref()?.node_count() as u64;
        let resources = || -> Option<u64> {
            let mut total = 0u64;
            for body in resource_counts {
                let rows: Vec<Value> = serde_json::from_slice(body).ok()?;
                total += rows.first()?.get("count")?.as_u64()?;
            }
            Some(total)
        };
        match population {
            Population::Nodes => Some(json!(nodes)),
            Population::Resources => resources().map(|r| json!(r)),
            Population::ResourcesPerNode => {
                let resources = resources()?;
                Some(if nodes == 0 {
                    json!(0)
                } else {
                    json!(resources as f64 / nodes as f64)
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::membership::{BackendNodes, Member};

    fn ownership() -> Arc<Ownership> {
        let nodes = |names: &[&str]| -> Option<BackendNodes> {
            Some(
                names
                    .iter()
                    .map(|n| ((*n).to_owned(), Member::active(None)))
                    .collect(),
            )
        };
        Arc::new(Ownership::build(&[
            nodes(&["a", "shared"]),
            nodes(&["shared", "b", "c"]),
        ]))
    }

    fn envelope(mbean: &str, value: Value) -> Vec<u8> {
        json!({"request": {"mbean": mbean, "type": "read"}, "value": value, "timestamp": 1_700_000_000, "status": 200})
            .to_string()
            .into_bytes()
    }

    #[test]
    fn num_nodes_counts_each_certname_once() {
        let config = Config::with_backends(Vec::new());
        let path = "/metrics/v2/read/puppetlabs.puppetdb.population%3Aname%3Dnum-nodes";
        let mut plan = MetricsPlan::plan(MetricsRoute::Read, path, &config);
        plan.attach(Some(ownership()));
        assert_eq!(plan.parts(), 1);
        let a = envelope(
            "puppetlabs.puppetdb.population:name=num-nodes",
            json!({"Value": 2}),
        );
        let b = envelope(
            "puppetlabs.puppetdb.population:name=num-nodes",
            json!({"Value": 3}),
        );
        let (response, contributed) = plan.respond(&[&a, &b], &[]).expect("merged");
        let body: Value =
            serde_json::from_slice(response.full_body().expect("full")).expect("json");
        assert_eq!(body["value"], json!({"Value": 4}), "5 summed, 4 distinct");
        assert_eq!(contributed, 2);
    }

    #[test]
    fn num_resources_is_the_owned_count() {
        let config = Config::with_backends(Vec::new());
        let path = "/metrics/v2/read/puppetlabs.puppetdb.population:name=avg-resources-per-node";
        let mut plan = MetricsPlan::plan(MetricsRoute::Read, path, &config);
        plan.attach(Some(ownership()));
        assert_eq!(plan.parts(), 2);
        let (_, target, _) =
            plan.upstream_request(path, BackendId(1), 1, &[BackendId(0), BackendId(1)]);
        assert!(
            target.starts_with("/pdb/query/v4/resources?query="),
            "{target}"
        );
        assert!(
            target.contains("shared"),
            "b does not own the shared node: {target}"
        );
        let a = envelope(
            "puppetlabs.puppetdb.population:name=avg-resources-per-node",
            json!({"Value": 10.0}),
        );
        let (response, _) = plan
            .respond(&[&a], &[br#"[{"count":30}]"#, br#"[{"count":50}]"#])
            .expect("merged");
        let body: Value =
            serde_json::from_slice(response.full_body().expect("full")).expect("json");
        assert_eq!(body["value"], json!({"Value": 20.0}));
    }

    #[test]
    fn other_mbeans_are_merged_as_they_are() {
        let config = Config::with_backends(Vec::new());
        let path = "/metrics/v2/read/java.lang:type=Memory";
        let plan = MetricsPlan::plan(MetricsRoute::Read, path, &config);
        let a = envelope(
            "java.lang:type=Memory",
            json!({"HeapMemoryUsage": {"used": 5}}),
        );
        let b = envelope(
            "java.lang:type=Memory",
            json!({"HeapMemoryUsage": {"used": 7}}),
        );
        let (response, _) = plan.respond(&[&a, &b], &[]).expect("merged");
        let body: Value =
            serde_json::from_slice(response.full_body().expect("full")).expect("json");
        assert_eq!(body["value"]["HeapMemoryUsage"]["used"], json!(12));
    }
}
