//! The provenance fact's own path (`/facts/pdbmux_source`, each backend asked a row a node)
//! names each node's owner exactly as the `/facts` merge's synthetic records do (two separate
//! implementations: `provenance_merge` and the node list of `merge`), for any estate.

use std::sync::Arc;

use proptest::prelude::*;
use serde_json::Value;

use super::tests::{config, merge, plan};
use crate::membership::{BackendNodes, Member, Ownership};

/// The certnames the generated estates draw from.
const NODES: [&str; 5] = ["n0", "n1", "n2", "n3", "n4"];

/// A node as one backend holds it: its environment, its facts' names (some named like the
/// provenance fact), and the hour its facts were produced, when the membership map knows it.
#[derive(Debug, Clone)]
struct HeldFacts {
    environment: Option<&'static str>,
    facts: Vec<&'static str>,
    produced: Option<u8>,
}

fn held() -> impl Strategy<Value = Option<HeldFacts>> {
    let environment = prop::sample::select(vec![Some("e1"), Some("e2"), None]);
    let facts = prop::collection::vec(prop::sample::select(vec!["a", "b", "pdbmux_source"]), 1..3);
    let produced = prop::option::of(0u8..3);
    prop::option::of((environment, facts, produced)).prop_map(|held| {
        held.map(|(environment, facts, produced)| HeldFacts {
            environment,
            facts,
            produced,
        })
    })
}

/// One backend's `/facts` answer, and its answer to the own path's question: its nodes with a
/// fact not named like the provenance fact, one row each (`certname`, `environment`).
fn answers(nodes: &[Option<HeldFacts>]) -> (String, String) {
    let mut facts = Vec::new();
    let mut rows = Vec::new();
    for (certname, held) in NODES.iter().zip(nodes) {
        let Some(held) = held else { continue };
        let environment = held.environment.map_or(Value::Null, Value::from);
        for name in &held.facts {
            facts.push(serde_json::json!({
                "certname": certname, "name": name, "value": 1, "environment": environment,
            }));
        }
        if held.facts.iter().any(|name| *name != "pdbmux_source") {
            rows.push(serde_json::json!({"certname": certname, "environment": environment}));
        }
    }
    (
        Value::from(facts).to_string(),
        Value::from(rows).to_string(),
    )
}

/// The membership map of both backends: the nodes each holds whose production time it knows.
fn map(backends: &[Vec<Option<HeldFacts>>]) -> Arc<Ownership> {
    let part = |nodes: &Vec<Option<HeldFacts>>| -> Option<BackendNodes> {
        let known = NODES.iter().zip(nodes).filter_map(|(certname, held)| {
            let hour = held.as_ref()?.produced?;
            let at = format!("2026-11-30T0{hour}:00:00.000Z");
            Some(((*certname).into(), Member::ran_at(&at)))
        });
        Some(known.collect())
    };
    let parts: Vec<Option<BackendNodes>> = backends.iter().map(part).collect();
    Arc::new(Ownership::build(&parts, 1))
}

/// The provenance records of a `/facts` answer, as `(certname, value, environment)`, sorted.
fn provenance(body: &str) -> Vec<(Value, Value, Value)> {
    let records: Vec<Value> = serde_json::from_str(body).expect("an array");
    let mut named: Vec<(Value, Value, Value)> = records
        .into_iter()
        .filter(|record| record["name"] == "pdbmux_source")
        .map(|r| {
            (
                r["certname"].clone(),
                r["value"].clone(),
                r["environment"].clone(),
            )
        })
        .collect();
    named.sort_by_key(|(certname, _, _)| certname.to_string());
    named
}

proptest! {
    #[test]
    fn the_own_path_names_the_owners_the_facts_merge_names(
        a in prop::collection::vec(held(), NODES.len()),
        b in prop::collection::vec(held(), NODES.len()),
    ) {
        let config = config();
        let ownership = map(&[a.clone(), b.clone()]);
        let ((facts_a, rows_a), (facts_b, rows_b)) = (answers(&a), answers(&b));
        let mut facts = plan(&config, "/pdb/query/v4/facts", Some(Arc::clone(&ownership)))
            .expect("plan");
        let (facts, _) = merge(&mut facts, &[(&facts_a, None), (&facts_b, None)]);
        let own_path = "/pdb/query/v4/facts/pdbmux_source?order_by=[{\"field\":\"certname\"}]";
        let mut own = plan(&config, own_path, Some(ownership)).expect("plan");
        let (own, _) = merge(&mut own, &[(&rows_a, None), (&rows_b, None)]);
        prop_assert_eq!(provenance(&own), provenance(&facts), "{} against {}", own, facts);
    }
}
