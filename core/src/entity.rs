//! The PuppetDB v4 entities pdbmux answers for the estate, and everything pdbmux needs to know
//! about each: where it is served, how its records merge, which nodes its queries see, the
//! columns it can be ordered by. One row per entity; docs/merging.md is the same table in prose.

use crate::membership::{Kind, Scope};
use crate::sort::OrderEntity;

/// A v4 query entity pdbmux merges across backends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Entity {
    /// `/nodes`.
    Nodes,
    /// `/facts` (and `/facts/<name>[/<value>]`).
    Facts,
    /// `/fact-contents`.
    FactContents,
    /// `/fact-names`.
    FactNames,
    /// `/fact-paths`.
    FactPaths,
    /// `/factsets`.
    Factsets,
    /// `/catalogs`.
    Catalogs,
    /// `/catalog-inputs` (one record per node: its catalog's inputs).
    CatalogInputs,
    /// `/catalog-input-contents` (one record per input of a node's catalog).
    CatalogInputContents,
    /// `/edges`.
    Edges,
    /// `/resources`.
    Resources,
    /// `/inventory`.
    Inventory,
    /// `/packages`.
    Packages,
    /// `/package-inventory`.
    PackageInventory,
    /// `/producers`.
    Producers,
    /// `/environments`.
    Environments,
    /// `/reports`.
    Reports,
    /// `/events`.
    Events,
    /// `/event-counts`.
    EventCounts,
    /// `/aggregate-event-counts`.
    AggregateEventCounts,
}

/// How an entity's records from several backends become one answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MergeRule {
    /// One record per node, from the node's owner (`/nodes`, with `pdbmux_source`).
    Node,
    /// Every record of a node comes from the node's owner, the others' copies are dropped
    /// (facts, fact-contents, factsets, catalogs, catalog inputs, edges, resources, inventory,
    /// package-inventory).
    Owned,
    /// Every backend's records, each distinct record once.
    Union(Identity),
    /// A flat array of names, sorted and deduped (`/fact-names`).
    Names,
    /// Counts per subject, summed (`/event-counts`, `/aggregate-event-counts`).
    Counts,
}

/// What makes two records of a union the same record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Identity {
    /// The `hash` field (a report is immutable: the same report can be stored in two backends).
    Hash,
    /// The record's exact fields except `report_receive_time`, which each backend stamps itself
    /// (events carry no id; a node reporting to two backends stores identical events in each).
    Verbatim,
    /// The `name` field (environments, producers).
    Name,
}

/// Every entity, in the order of the v4 API's documentation.
pub const ALL: [Entity; 20] = [
    Entity::Nodes,
    Entity::Facts,
    Entity::FactContents,
    Entity::FactNames,
    Entity::FactPaths,
    Entity::Factsets,
    Entity::Catalogs,
    Entity::CatalogInputs,
    Entity::CatalogInputContents,
    Entity::Edges,
    Entity::Resources,
    Entity::Inventory,
    Entity::Packages,
    Entity::PackageInventory,
    Entity::Producers,
    Entity::Environments,
    Entity::Reports,
    Entity::Events,
    Entity::EventCounts,
    Entity::AggregateEventCounts,
];

impl Entity {
    /// The entity served at `/pdb/query/v4/<segment>`, if pdbmux merges it.
    pub fn from_segment(segment: &str) -> Option<Entity> {
        ALL.into_iter().find(|entity| entity.segment() == segment)
    }

    /// The path segment under `/pdb/query/v4/`.
    pub fn segment(self) -> &'static str {
        match self {
            Entity::Nodes => "nodes",
            Entity::Facts => "facts",
            Entity::FactContents => "fact-contents",
            Entity::FactNames => "fact-names",
            Entity::FactPaths => "fact-paths",
            Entity::Factsets => "factsets",
            Entity::Catalogs => "catalogs",
            Entity::CatalogInputs => "catalog-inputs",
            Entity::CatalogInputContents => "catalog-input-contents",
            Entity::Edges => "edges",
            Entity::Resources => "resources",
            Entity::Inventory => "inventory",
            Entity::Packages => "packages",
            Entity::PackageInventory => "package-inventory",
            Entity::Producers => "producers",
            Entity::Environments => "environments",
            Entity::Reports => "reports",
            Entity::Events => "events",
            Entity::EventCounts => "event-counts",
            Entity::AggregateEventCounts => "aggregate-event-counts",
        }
    }

    /// The path the entity's own endpoint is served at.
    pub fn path(self) -> String {
        self.path_static().to_owned()
    }

    /// [`Entity::path`] as a static string.
    pub fn path_static(self) -> &'static str {
        match self {
            Entity::Nodes => "/pdb/query/v4/nodes",
            Entity::Facts => "/pdb/query/v4/facts",
            Entity::FactContents => "/pdb/query/v4/fact-contents",
            Entity::FactNames => "/pdb/query/v4/fact-names",
            Entity::FactPaths => "/pdb/query/v4/fact-paths",
            Entity::Factsets => "/pdb/query/v4/factsets",
            Entity::Catalogs => "/pdb/query/v4/catalogs",
            Entity::CatalogInputs => "/pdb/query/v4/catalog-inputs",
            Entity::CatalogInputContents => "/pdb/query/v4/catalog-input-contents",
            Entity::Edges => "/pdb/query/v4/edges",
            Entity::Resources => "/pdb/query/v4/resources",
            Entity::Inventory => "/pdb/query/v4/inventory",
            Entity::Packages => "/pdb/query/v4/packages",
            Entity::PackageInventory => "/pdb/query/v4/package-inventory",
            Entity::Producers => "/pdb/query/v4/producers",
            Entity::Environments => "/pdb/query/v4/environments",
            Entity::Reports => "/pdb/query/v4/reports",
            Entity::Events => "/pdb/query/v4/events",
            Entity::EventCounts => "/pdb/query/v4/event-counts",
            Entity::AggregateEventCounts => "/pdb/query/v4/aggregate-event-counts",
        }
    }

    /// How its records merge.
    pub fn merge_rule(self) -> MergeRule {
        match self {
            Entity::Nodes => MergeRule::Node,
            Entity::Facts
            | Entity::FactContents
            | Entity::Factsets
            | Entity::Catalogs
            | Entity::CatalogInputs
            | Entity::CatalogInputContents
            | Entity::Edges
            | Entity::Resources
            | Entity::Inventory
            | Entity::PackageInventory => MergeRule::Owned,
            Entity::FactNames => MergeRule::Names,
            Entity::FactPaths | Entity::Packages => MergeRule::Union(Identity::Verbatim),
            Entity::Producers | Entity::Environments => MergeRule::Union(Identity::Name),
            Entity::Reports => MergeRule::Union(Identity::Hash),
            Entity::Events => MergeRule::Union(Identity::Verbatim),
            Entity::EventCounts | Entity::AggregateEventCounts => MergeRule::Counts,
        }
    }

    /// The node-owned entity this union entity is the distinct projection of, and the columns
    /// projected: `/packages` lists the packages `/package-inventory` holds. A backend holding
    /// nodes that other backends own is asked this projection less those nodes, so that what
    /// only its stale copies hold is not listed (docs/merging.md, "`/packages`").
    pub fn distinct_of(self) -> Option<(Entity, &'static [&'static str])> {
        match self {
            Entity::Packages => Some((
                Entity::PackageInventory,
                &["package_name", "version", "provider"],
            )),
            _ => None,
        }
    }

    /// Whether each of its records belongs to one node (it carries `certname`), so a node two
    /// backends hold is answered from its owner alone.
    pub fn is_node_owned(self) -> bool {
        matches!(self.merge_rule(), MergeRule::Node | MergeRule::Owned)
    }

    /// Whether its records are history: reports and events, which every backend keeps, so that a
    /// node's records belong to whichever backends hold them (and `latest_report?` picks the
    /// owner's).
    pub fn is_history(self) -> bool {
        matches!(
            self,
            Entity::Reports | Entity::Events | Entity::EventCounts | Entity::AggregateEventCounts
        )
    }

    /// The kind of node data its records derive from, whose owner answers for a node
    /// (docs/decisions.md, D14): facts for the fact entities, inventory and packages, the
    /// catalog for catalogs, catalog inputs, resources and edges, the node record and latest report
    /// for the rest.
    pub fn kind(self) -> Kind {
        match self {
            Entity::Facts
            | Entity::FactContents
            | Entity::FactNames
            | Entity::FactPaths
            | Entity::Factsets
            | Entity::Inventory
            | Entity::Packages
            | Entity::PackageInventory => Kind::Facts,
            Entity::Catalogs
            | Entity::CatalogInputs
            | Entity::CatalogInputContents
            | Entity::Edges
            | Entity::Resources => Kind::Catalog,
            Entity::Nodes
            | Entity::Producers
            | Entity::Environments
            | Entity::Reports
            | Entity::Events
            | Entity::EventCounts
            | Entity::AggregateEventCounts => Kind::Node,
        }
    }

    /// The nodes a query on this entity sees when it does not name `node_state`: PuppetDB adds
    /// `["=","node_state","active"]` to every node-owned entity's query but `/catalogs`'.
    pub fn default_scope(self) -> Scope {
        match self {
            Entity::Nodes
            | Entity::Facts
            | Entity::FactContents
            | Entity::Factsets
            | Entity::CatalogInputs
            | Entity::CatalogInputContents
            | Entity::Edges
            | Entity::Resources
            | Entity::Inventory
            | Entity::PackageInventory => Scope::Active,
            _ => Scope::Any,
        }
    }

    /// Which columns an `order_by` may name and how they compare; `None` for the event-count
    /// endpoints, whose columns depend on `summarize_by`.
    pub fn order_entity(self, include_facts_expiration: bool) -> Option<OrderEntity> {
        Some(match self {
            Entity::Nodes => OrderEntity::Nodes {
                include_facts_expiration,
            },
            Entity::Facts => OrderEntity::Facts,
            Entity::FactContents => OrderEntity::FactContents,
            Entity::FactNames => OrderEntity::FactNames,
            Entity::FactPaths => OrderEntity::FactPaths,
            Entity::Factsets => OrderEntity::Factsets,
            Entity::Catalogs => OrderEntity::Catalogs,
            Entity::CatalogInputs => OrderEntity::CatalogInputs,
            Entity::CatalogInputContents => OrderEntity::CatalogInputContents,
            Entity::Edges => OrderEntity::Edges,
            Entity::Resources => OrderEntity::Resources,
            Entity::Inventory => OrderEntity::Inventory,
            Entity::Packages => OrderEntity::Packages,
            Entity::PackageInventory => OrderEntity::PackageInventory,
            Entity::Producers => OrderEntity::Producers,
            Entity::Environments => OrderEntity::Environments,
            Entity::Reports => OrderEntity::Reports,
            Entity::Events => OrderEntity::Events,
            Entity::EventCounts | Entity::AggregateEventCounts => return None,
        })
    }

    /// Whether an extract with a function column on it is folded (the aggregates pdbmux
    /// combines); the event-count endpoints are always combined.
    pub fn folds_extracts(self) -> bool {
        !matches!(
            self,
            Entity::FactNames | Entity::EventCounts | Entity::AggregateEventCounts
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_entity_round_trips_through_its_segment() {
        for entity in ALL {
            assert_eq!(Entity::from_segment(entity.segment()), Some(entity));
            assert_eq!(entity.path(), format!("/pdb/query/v4/{}", entity.segment()));
        }
        assert_eq!(Entity::from_segment("nodes/x"), None);
    }

    #[test]
    fn node_owned_entities_are_the_ones_with_a_certname_per_record() {
        let owned: Vec<Entity> = ALL.into_iter().filter(|e| e.is_node_owned()).collect();
        assert_eq!(
            owned,
            [
                Entity::Nodes,
                Entity::Facts,
                Entity::FactContents,
                Entity::Factsets,
                Entity::Catalogs,
                Entity::CatalogInputs,
                Entity::CatalogInputContents,
                Entity::Edges,
                Entity::Resources,
                Entity::Inventory,
                Entity::PackageInventory,
            ]
        );
        assert_eq!(Entity::Catalogs.default_scope(), Scope::Any);
        assert_eq!(Entity::Edges.default_scope(), Scope::Active);
    }
}
