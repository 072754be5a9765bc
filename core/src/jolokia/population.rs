//! The Jolokia metrics routes as a plan: every backend's envelope merged (see
//! [`crate::jolokia`]), and the population MBeans answered for the estate as a whole
//! (docs/merging.md, "Metrics"), as PuppetDB 7.12.1 computes them (`query/population.clj`):
//! `num-nodes` and `num-active-nodes` are the distinct active certnames in the membership map,
//! `num-inactive-nodes` the other certnames it holds, `num-resources` every catalog's
//! resources, inactive nodes' included, each node's counted once (from its owner), and
//! `avg-resources-per-node` that count over every certname, written as PuppetDB writes the
//! Clojure ratio (`"57/8"`, or a number when it divides). PuppetDB itself reports
//! `num-resources` from PostgreSQL's row estimate (`pg_class.reltuples`); pdbmux counts.

use http::StatusCode;
use serde_json::{json, Value};

use crate::config::MergeStrategy;
use crate::fanout::{everyone, Calls, Context, Outbound, Plan, Step, Verdict};
use crate::ids::BackendId;
use crate::jolokia::{self, JolokiaMerge};
use crate::membership::{Kind, Scope};
use crate::message::Response;
use crate::outbound;
use crate::ownership::{NodeScope, Owning};
use crate::route::MetricsRoute;
use crate::status::Unusable;

const POPULATION: &str = "puppetlabs.puppetdb.population:name=";
const RESOURCE_COUNT_PATH: &str = "/pdb/query/v4/resources";
/// The Jolokia request itself.
const ENVELOPE: usize = 0;
/// The owned resource count the population MBeans are answered from.
const RESOURCE_COUNT: usize = 1;

/// Which population figure a request reads, if it reads one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Population {
    ActiveNodes,
    InactiveNodes,
    Resources,
    ResourcesPerNode,
}

/// A planned metrics fan-out.
#[derive(Debug, Clone)]
pub(crate) struct JolokiaPlan {
    route: MetricsRoute,
    target: String,
    population: Option<Population>,
    /// Whether the attribute path reads `Value` itself (a bare number) rather than the object.
    bare_value: bool,
    strategy: MergeStrategy,
}

fn population_of(path: &str) -> Option<Population> {
    let mbean = jolokia::mbean_of(path)?;
    match mbean.strip_prefix(POPULATION)? {
        "num-nodes" | "num-active-nodes" => Some(Population::ActiveNodes),
        "num-inactive-nodes" => Some(Population::InactiveNodes),
        "num-resources" => Some(Population::Resources),
        "avg-resources-per-node" => Some(Population::ResourcesPerNode),
        _ => None,
    }
}

impl JolokiaPlan {
    /// Plans a metrics request for `target` (path and query, as received).
    pub(crate) fn plan(
        route: MetricsRoute,
        target: String,
        strategy: MergeStrategy,
    ) -> JolokiaPlan {
        let path = target
            .split_once('?')
            .map_or(target.as_str(), |(path, _)| path);
        let population = match route {
            MetricsRoute::Read => population_of(path),
            MetricsRoute::List | MetricsRoute::V1Mbeans => None,
        };
        let bare_value =
            jolokia::attribute_of(path).is_some_and(|a| a.eq_ignore_ascii_case("value"));
        JolokiaPlan {
            route,
            target,
            population,
            bare_value,
            strategy,
        }
    }

    /// Whether the request reads a population MBean: a figure of the whole estate (cacheable
    /// as the counts are), not one of a backend's own JVM.
    pub(crate) fn reads_population(&self) -> bool {
        self.population.is_some()
    }

    fn counts_resources(&self) -> bool {
        matches!(
            self.population,
            Some(Population::Resources | Population::ResourcesPerNode)
        )
    }

    /// Merges the answers: `envelopes` are the 2xx metrics bodies in configured order,
    /// `resources` the sum of the owned resource counts (for the population MBeans). `None`
    /// when no body was usable.
    fn respond(
        &self,
        envelopes: &[&[u8]],
        resources: u64,
        nodes: Option<PopulationNodes>,
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
        let body = match self.population_value(resources, nodes) {
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

    fn population_value(&self, resources: u64, nodes: Option<PopulationNodes>) -> Option<Value> {
        let population = self.population?;
        let nodes = nodes?;
        Some(match population {
            Population::ActiveNodes => json!(nodes.active),
            Population::InactiveNodes => json!(nodes.any.saturating_sub(nodes.active)),
            Population::Resources => json!(resources),
            Population::ResourcesPerNode => clojure_ratio(resources, nodes.any as u64),
        })
    }
}

/// The count a backend's owned resource count answered (`[{"count":n}]`), if it reads.
fn resource_count(body: &[u8]) -> Option<u64> {
    let rows: Vec<Value> = serde_json::from_slice(body).ok()?;
    rows.first()?.get("count")?.as_u64()
}

/// How many nodes the estate holds: active, and in any state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct PopulationNodes {
    active: usize,
    any: usize,
}

/// `numerator / denominator` as PuppetDB's JSON writes the Clojure value: an integer when it
/// divides, else the reduced ratio as a string (`"57/8"`). Zero nodes: 0 (PuppetDB's gauge
/// fails there and reports nothing).
fn clojure_ratio(numerator: u64, denominator: u64) -> Value {
    if denominator == 0 {
        return json!(0);
    }
    let gcd = {
        let (mut a, mut b) = (numerator, denominator);
        while b != 0 {
            (a, b) = (b, a % b);
        }
        a.max(1)
    };
    let (p, q) = (numerator / gcd, denominator / gcd);
    if q == 1 {
        json!(p)
    } else {
        json!(format!("{p}/{q}"))
    }
}

impl Plan for JolokiaPlan {
    fn again(&self) -> Box<dyn Plan> {
        Box::new(self.clone())
    }

    fn needs_ownership(&self) -> bool {
        self.reads_population()
    }

    fn start(&mut self, context: &Context) -> Vec<(BackendId, usize)> {
        let mut calls = everyone(context);
        if self.counts_resources() {
            calls.extend(context.roster.iter().map(|b| (*b, RESOURCE_COUNT)));
        }
        calls
    }

    fn request(&self, backend: BackendId, part: usize, context: &Context) -> Outbound {
        if part == ENVELOPE {
            return Outbound::get(self.target.clone());
        }
        // Every catalog's resources, as PuppetDB's own metric counts them: inactive nodes'
        // too, each node's once.
        let all = json!(["=", "node_state", "any"]);
        let owning = context.ownership.as_deref().map(|ownership| Owning {
            ownership,
            scope: NodeScope {
                strategy: self.strategy,
                kind: Kind::Catalog,
                scope: Scope::Any,
            },
            asked: &context.roster,
        });
        let excluded: Vec<&str> = owning.map_or_else(Vec::new, |o| o.excluded(backend, None));
        let filter = crate::query::exclude_certnames(Some(&all), &excluded).unwrap_or(all);
        let count = json!(["extract", [["function", "count"]], filter]);
        outbound::query_only(RESOURCE_COUNT_PATH, &count).0
    }

    fn progress(&mut self, calls: &Calls, context: &Context) -> Step {
        if !calls.all_done() {
            return Step::Wait;
        }
        // A backend whose resource count failed or does not read is left out of the answer,
        // envelope too: its resources would be missing from a total that says every backend
        // answered (and the answer could be cached as whole). Each count is read once.
        let mut uncounted: Vec<(BackendId, Unusable)> = Vec::new();
        let mut envelopes: Vec<&[u8]> = Vec::new();
        let mut resources = 0u64;
        for &backend in &context.roster {
            let envelope = calls.success(backend, ENVELOPE).map(|(_, body)| &body[..]);
            if self.counts_resources() {
                let count = calls
                    .success(backend, RESOURCE_COUNT)
                    .and_then(|(_, body)| resource_count(body));
                match count {
                    Some(count) => resources = resources.saturating_add(count),
                    None => {
                        if envelope.is_some() {
                            uncounted.push((backend, Unusable::IncompleteParts));
                        }
                        continue;
                    }
                }
            }
            envelopes.extend(envelope);
        }
        let nodes = context.ownership.as_ref().map(|o| PopulationNodes {
            active: o.node_count(),
            any: o.certname_count(),
        });
        match self.respond(&envelopes, resources, nodes) {
            Some((response, contributed)) => Step::Done(Verdict::Merged {
                response,
                contributed,
                unusable: uncounted,
            }),
            None => {
                let unusable = context
                    .roster
                    .iter()
                    .filter(|b| calls.success(**b, ENVELOPE).is_some())
                    .map(|b| (*b, Unusable::Jolokia))
                    .collect();
                Step::Done(Verdict::Unanswered {
                    part: ENVELOPE,
                    unusable,
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::config::Config;
    use crate::corrections::Corrections;
    use crate::membership::{BackendNodes, Member, Ownership};

    fn ownership() -> Arc<Ownership> {
        let nodes = |names: &[&str]| -> Option<BackendNodes> {
            Some(
                names
                    .iter()
                    .map(|n| ((*n).into(), Member::active(None)))
                    .collect(),
            )
        };
        Arc::new(Ownership::build(
            &[nodes(&["a", "shared"]), nodes(&["shared", "b", "c"])],
            1,
        ))
    }

    /// The sum of owned resource counts as the plan reads them, each body once.
    fn resources(bodies: &[&[u8]]) -> u64 {
        bodies
            .iter()
            .map(|body| resource_count(body).expect("a count"))
            .sum()
    }

    fn envelope(mbean: &str, value: Value) -> Vec<u8> {
        json!({"request": {"mbean": mbean, "type": "read"}, "value": value, "timestamp": 1_700_000_000, "status": 200})
            .to_string()
            .into_bytes()
    }

    fn plan(path: &str) -> JolokiaPlan {
        JolokiaPlan::plan(
            MetricsRoute::Read,
            path.to_owned(),
            MergeStrategy::Freshness,
        )
    }

    #[test]
    fn num_nodes_counts_each_certname_once() {
        let plan = plan("/metrics/v2/read/puppetlabs.puppetdb.population%3Aname%3Dnum-nodes");
        assert!(!plan.counts_resources());
        let a = envelope(
            "puppetlabs.puppetdb.population:name=num-nodes",
            json!({"Value": 2}),
        );
        let b = envelope(
            "puppetlabs.puppetdb.population:name=num-nodes",
            json!({"Value": 3}),
        );
        let ownership = ownership();
        let nodes = Some(PopulationNodes {
            active: ownership.node_count(),
            any: ownership.certname_count(),
        });
        let (response, contributed) = plan.respond(&[&a, &b], 0, nodes).expect("merged");
        let body: Value =
            serde_json::from_slice(response.full_body().expect("full")).expect("json");
        assert_eq!(body["value"], json!({"Value": 4}), "5 summed, 4 distinct");
        assert_eq!(contributed, 2);
    }

    #[test]
    fn num_resources_counts_every_node_state_once() {
        let path = "/metrics/v2/read/puppetlabs.puppetdb.population:name=avg-resources-per-node";
        let plan = plan(path);
        let context = Context {
            config: Arc::new(Config::with_backends(Vec::new())),
            roster: vec![BackendId(0), BackendId(1)],
            ownership: Some(ownership()),
            corrections: Arc::new(Corrections::new(1)),
            uncounted: Vec::new(),
            may_stream: false,
        };
        let outbound = plan.request(BackendId(1), RESOURCE_COUNT, &context);
        let target = percent_encoding::percent_decode_str(&outbound.path_and_query)
            .decode_utf8_lossy()
            .into_owned();
        assert!(
            target.starts_with("/pdb/query/v4/resources?query="),
            "{target}"
        );
        assert!(target.contains("\"node_state\",\"any\""), "{target}");
        assert!(
            target.contains("shared"),
            "b does not own the shared node: {target}"
        );
        let a = envelope(
            "puppetlabs.puppetdb.population:name=avg-resources-per-node",
            json!({"Value": 10.0}),
        );
        let nodes = Some(PopulationNodes { active: 4, any: 6 });
        let (response, _) = plan
            .respond(
                &[&a],
                resources(&[br#"[{"count":30}]"#, br#"[{"count":50}]"#]),
                nodes,
            )
            .expect("merged");
        let body: Value =
            serde_json::from_slice(response.full_body().expect("full")).expect("json");
        assert_eq!(
            body["value"],
            json!({"Value": "40/3"}),
            "80 resources over 6 certnames"
        );
        assert_eq!(clojure_ratio(80, 4), json!(20));
        assert_eq!(clojure_ratio(57, 8), json!("57/8"));
        assert_eq!(clojure_ratio(3, 0), json!(0));
    }

    #[test]
    fn other_mbeans_are_merged_as_they_are() {
        let plan = plan("/metrics/v2/read/java.lang:type=Memory");
        let a = envelope(
            "java.lang:type=Memory",
            json!({"HeapMemoryUsage": {"used": 5}}),
        );
        let b = envelope(
            "java.lang:type=Memory",
            json!({"HeapMemoryUsage": {"used": 7}}),
        );
        let (response, _) = plan.respond(&[&a, &b], 0, None).expect("merged");
        let body: Value =
            serde_json::from_slice(response.full_body().expect("full")).expect("json");
        assert_eq!(body["value"]["HeapMemoryUsage"]["used"], json!(12));
    }
}
