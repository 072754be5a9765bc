//! The PuppetDB v4 entities pdbmux answers for the estate, and everything pdbmux needs to know
//! about each: where it is served, how its records merge, which nodes its queries see, the
//! columns it can be ordered by, how long its answers are cached. One row per entity;
//! docs/merging.md is the same table in prose.

mod columns;
mod orderable;

use crate::config::CacheClass;
use crate::membership::{Kind, Scope};
use crate::records::raw_str;
use serde_json::value::RawValue;

pub use self::columns::{Column, ColumnKind, ColumnSet, OrderColumns, SummarizeBy};

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

/// Which queries on an entity pdbmux answers by combining the backends' partial answers
/// (docs/merging.md, "Aggregates").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Combine {
    /// An extract with a function column on it (`count`, `sum`, `min`, `max`, `avg`) is
    /// folded; other queries merge records.
    Extracts,
    /// Every query: counts per subject, summed (`/event-counts`).
    EventCounts,
    /// Every query: the estate's event counts, summed (`/aggregate-event-counts`).
    AggregateEventCounts,
    /// None: its answers are records or names only (`/fact-names`).
    Never,
}

/// A parent an entity's records are listed below (`/environments/<env>/facts`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Parent {
    /// `/environments/<environment>/…`: the records whose `environment` is the parent's.
    Environment,
    /// `/producers/<producer>/…`: the records whose `producer` is the parent's.
    Producer,
}

impl Parent {
    /// The parent named by a path segment under `/pdb/query/v4/` (`environments`).
    pub fn from_segment(segment: &str) -> Option<Parent> {
        match segment {
            "environments" => Some(Parent::Environment),
            "producers" => Some(Parent::Producer),
            _ => None,
        }
    }

    /// The field a sub-route constrains to the parent's value (`environment`).
    pub fn field(self) -> &'static str {
        match self {
            Parent::Environment => "environment",
            Parent::Producer => "producer",
        }
    }
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

/// What a merge keeps of a record's identity to tell its copies: 128 bits of SHA-256, so that
/// no two records a merge reads share one (the buffered union, `merge/union.rs`, and the
/// streamed one, `streamed/mod.rs`, keep these rather than the identities).
pub(crate) type Digest = [u8; 16];

/// The field each backend stamps itself on an event (when it received its report): left out of
/// the event's identity.
const RECEIPT_FIELD: &str = "report_receive_time";

impl Identity {
    /// The field a record is read for to tell its copies apart: `hash` or `name`, whose value
    /// is the identity, or for [`Identity::Verbatim`] the receipt time, the one part of the
    /// record left out of it.
    pub(crate) fn field(self) -> &'static str {
        match self {
            Identity::Hash => "hash",
            Identity::Name => "name",
            Identity::Verbatim => RECEIPT_FIELD,
        }
    }

    /// The digest that tells the record `text` from other copies of it, given the raw value of
    /// [`Identity::field`] in it, borrowed from `text` (`None`: absent). `None` when the record
    /// has no identity (a report without its hash): it is never a copy.
    pub(crate) fn digest(self, text: &str, field: Option<&RawValue>) -> Option<Digest> {
        let mut context = ring::digest::Context::new(&ring::digest::SHA256);
        match self {
            Identity::Hash | Identity::Name => {
                context.update(raw_str(field?)?.as_bytes());
            }
            // The record's text but its receipt time's value: copies differ in nothing else
            // (each backend writes a record's fields alike).
            Identity::Verbatim => match field.and_then(|value| span_in(text, value.get())) {
                Some((start, end)) => {
                    context.update(&text.as_bytes()[..start]);
                    context.update(b"\0");
                    context.update(&text.as_bytes()[end..]);
                }
                None => context.update(text.as_bytes()),
            },
        }
        let mut digest = Digest::default();
        let length = digest.len();
        digest.copy_from_slice(&context.finish().as_ref()[..length]);
        Some(digest)
    }
}

/// Where `part`, a slice borrowed from `text`, lies in it; `None` when it is not one.
fn span_in(text: &str, part: &str) -> Option<(usize, usize)> {
    let start = (part.as_ptr() as usize).checked_sub(text.as_ptr() as usize)?;
    let end = start.checked_add(part.len())?;
    (end <= text.len()).then_some((start, end))
}

/// Every entity, in the order of the v4 API's documentation (and of the entity table).
#[cfg(test)]
pub(crate) const ALL: [Entity; 20] = [
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

/// How a history entity's records, which every backend keeps, are counted once (D22): a report
/// stored in several backends is the same report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct History {
    /// The fields that tell one stored record from another, so that the copies several backends
    /// store are served once (a report's `hash`; an event's report, resource and property).
    pub identity: &'static [&'static str],
    /// The column naming the report a record belongs to, by which a paged total counts the
    /// copies of a report once.
    pub report_column: &'static str,
    /// Whether a report has several records (events), so a correction counts them per report.
    pub per_report: bool,
    /// The entity whose records these are, or are counted from (`/events` for the event
    /// counts): what a correction of a count asks.
    pub records: Entity,
}

/// Everything pdbmux knows about one entity: one row of the entity table. Read it with
/// [`Entity::row`]; a new PuppetDB entity is one row here (and its variant) plus tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EntityRow {
    /// The entity the row is about.
    pub entity: Entity,
    /// The path segment under `/pdb/query/v4/`.
    pub segment: &'static str,
    /// The path its own endpoint is served at.
    pub path: &'static str,
    /// How its records merge.
    pub merge: MergeRule,
    /// The kind of node data its records derive from, whose owner answers for a node (D14).
    pub kind: Kind,
    /// The nodes a query sees when it does not name `node_state`: PuppetDB adds
    /// `["=","node_state","active"]` to every node-owned entity's query but `/catalogs`'.
    pub default_scope: Scope,
    /// For history (reports, events and their counts): how copies are counted once.
    pub history: Option<History>,
    /// The node-owned entity this union is the distinct projection of, and the columns
    /// projected (docs/merging.md, "`/packages`").
    pub distinct_of: Option<(Entity, &'static [&'static str])>,
    /// Which of its queries pdbmux combines from the backends' partial answers.
    pub combine: Combine,
    /// Whether the provenance fact (`source_fact`: the backend a node's facts come from) is one
    /// of its records: injected once per node, and dropped from the backends' answers
    /// (docs/merging.md, "Provenance"). `/facts` alone.
    pub provenance: bool,
    /// Whether it takes `distinct_resources=true` (`/events` alone), which PuppetDB answers from
    /// its legacy query compiler: no extract function or `group_by`, so such a query is never
    /// combined (docs/merging.md, "Aggregates").
    pub distinct_resources: bool,
    /// Whether its `depth` column, which its records do not carry, orders by the length of its
    /// `path` less one (`/fact-paths`).
    pub depth_from_path: bool,
    /// The parents it is served below as a sub-route: `/environments/<env>/<segment>` and
    /// `/producers/<producer>/<segment>` answer as this entity's route with the parent's
    /// constraint added (docs/merging.md, "The route table").
    pub parents: &'static [Parent],
    /// Whether its REST endpoint sees every node state while PQL's `from` sees active nodes
    /// only, so a PQL query mapped onto the endpoint adds `["=","node_state","active"]`.
    pub pql_sees_every_state: bool,
    /// Whether a PQL query on it is mapped onto its REST endpoint (not the event counts, which
    /// PQL does not name that way).
    pub pql_mapped: bool,
    /// The columns an `order_by` may name and how each compares, in PuppetDB's "Supported
    /// columns" order (`orderable.rs`). A column in a set other than [`ColumnSet::Base`] is
    /// offered only when the request's parameters add that set: `/nodes`' two expiration
    /// columns, `/event-counts`' columns of each `summarize_by`. Empty for
    /// `/aggregate-event-counts`, which takes no `order_by`.
    pub order: &'static [Column],
    /// Which TTL its merged answers are cached for (docs/caching.md, "What is cached"): record
    /// sets `Records`, history `History`, the event-count endpoints, whose every answer is
    /// combined, `Aggregates`. A combined answer of any entity (an extract with functions) is
    /// cached as `Aggregates` whatever its row says.
    pub cache: CacheClass,
}

/// The entity table, in [`ALL`]'s order (docs/merging.md is the same table in prose).
const ROWS: [EntityRow; 20] = [
    EntityRow {
        entity: Entity::Nodes,
        segment: "nodes",
        path: "/pdb/query/v4/nodes",
        merge: MergeRule::Node,
        kind: Kind::Node,
        default_scope: Scope::Active,
        history: None,
        distinct_of: None,
        combine: Combine::Extracts,
        provenance: false,
        distinct_resources: false,
        parents: &[],
        depth_from_path: false,
        pql_sees_every_state: false,
        pql_mapped: true,
        order: orderable::NODES,
        cache: CacheClass::Records,
    },
    EntityRow {
        entity: Entity::Facts,
        segment: "facts",
        path: "/pdb/query/v4/facts",
        merge: MergeRule::Owned,
        kind: Kind::Facts,
        default_scope: Scope::Active,
        history: None,
        distinct_of: None,
        combine: Combine::Extracts,
        provenance: true,
        distinct_resources: false,
        parents: &[Parent::Environment],
        depth_from_path: false,
        pql_sees_every_state: false,
        pql_mapped: true,
        order: orderable::FACTS,
        cache: CacheClass::Records,
    },
    EntityRow {
        entity: Entity::FactContents,
        segment: "fact-contents",
        path: "/pdb/query/v4/fact-contents",
        merge: MergeRule::Owned,
        kind: Kind::Facts,
        default_scope: Scope::Active,
        history: None,
        distinct_of: None,
        combine: Combine::Extracts,
        provenance: false,
        distinct_resources: false,
        parents: &[],
        depth_from_path: false,
        pql_sees_every_state: false,
        pql_mapped: true,
        order: orderable::FACT_CONTENTS,
        cache: CacheClass::Records,
    },
    EntityRow {
        entity: Entity::FactNames,
        segment: "fact-names",
        path: "/pdb/query/v4/fact-names",
        merge: MergeRule::Names,
        kind: Kind::Facts,
        default_scope: Scope::Any,
        history: None,
        distinct_of: None,
        combine: Combine::Never,
        provenance: false,
        distinct_resources: false,
        parents: &[],
        depth_from_path: false,
        pql_sees_every_state: false,
        pql_mapped: true,
        order: orderable::NAME_ONLY,
        cache: CacheClass::Records,
    },
    EntityRow {
        entity: Entity::FactPaths,
        segment: "fact-paths",
        path: "/pdb/query/v4/fact-paths",
        merge: MergeRule::Union(Identity::Verbatim),
        kind: Kind::Facts,
        default_scope: Scope::Any,
        history: None,
        distinct_of: None,
        combine: Combine::Extracts,
        provenance: false,
        distinct_resources: false,
        parents: &[],
        depth_from_path: true,
        pql_sees_every_state: false,
        pql_mapped: true,
        order: orderable::FACT_PATHS,
        cache: CacheClass::Records,
    },
    EntityRow {
        entity: Entity::Factsets,
        segment: "factsets",
        path: "/pdb/query/v4/factsets",
        merge: MergeRule::Owned,
        kind: Kind::Facts,
        default_scope: Scope::Active,
        history: None,
        distinct_of: None,
        combine: Combine::Extracts,
        provenance: false,
        distinct_resources: false,
        parents: &[Parent::Producer],
        depth_from_path: false,
        pql_sees_every_state: false,
        pql_mapped: true,
        order: orderable::FACTSETS,
        cache: CacheClass::Records,
    },
    EntityRow {
        entity: Entity::Catalogs,
        segment: "catalogs",
        path: "/pdb/query/v4/catalogs",
        merge: MergeRule::Owned,
        kind: Kind::Catalog,
        default_scope: Scope::Any,
        history: None,
        distinct_of: None,
        combine: Combine::Extracts,
        provenance: false,
        distinct_resources: false,
        parents: &[Parent::Producer],
        depth_from_path: false,
        pql_sees_every_state: true,
        pql_mapped: true,
        order: orderable::CATALOGS,
        cache: CacheClass::Records,
    },
    EntityRow {
        entity: Entity::CatalogInputs,
        segment: "catalog-inputs",
        path: "/pdb/query/v4/catalog-inputs",
        merge: MergeRule::Owned,
        kind: Kind::Catalog,
        default_scope: Scope::Active,
        history: None,
        distinct_of: None,
        combine: Combine::Extracts,
        provenance: false,
        distinct_resources: false,
        parents: &[],
        depth_from_path: false,
        pql_sees_every_state: false,
        pql_mapped: true,
        order: orderable::CATALOG_INPUTS,
        cache: CacheClass::Records,
    },
    EntityRow {
        entity: Entity::CatalogInputContents,
        segment: "catalog-input-contents",
        path: "/pdb/query/v4/catalog-input-contents",
        merge: MergeRule::Owned,
        kind: Kind::Catalog,
        default_scope: Scope::Active,
        history: None,
        distinct_of: None,
        combine: Combine::Extracts,
        provenance: false,
        distinct_resources: false,
        parents: &[],
        depth_from_path: false,
        pql_sees_every_state: false,
        pql_mapped: true,
        order: orderable::CATALOG_INPUT_CONTENTS,
        cache: CacheClass::Records,
    },
    EntityRow {
        entity: Entity::Edges,
        segment: "edges",
        path: "/pdb/query/v4/edges",
        merge: MergeRule::Owned,
        kind: Kind::Catalog,
        default_scope: Scope::Active,
        history: None,
        distinct_of: None,
        combine: Combine::Extracts,
        provenance: false,
        distinct_resources: false,
        parents: &[],
        depth_from_path: false,
        pql_sees_every_state: false,
        pql_mapped: true,
        order: orderable::EDGES,
        cache: CacheClass::Records,
    },
    EntityRow {
        entity: Entity::Resources,
        segment: "resources",
        path: "/pdb/query/v4/resources",
        merge: MergeRule::Owned,
        kind: Kind::Catalog,
        default_scope: Scope::Active,
        history: None,
        distinct_of: None,
        combine: Combine::Extracts,
        provenance: false,
        distinct_resources: false,
        parents: &[Parent::Environment],
        depth_from_path: false,
        pql_sees_every_state: false,
        pql_mapped: true,
        order: orderable::RESOURCES,
        cache: CacheClass::Records,
    },
    EntityRow {
        entity: Entity::Inventory,
        segment: "inventory",
        path: "/pdb/query/v4/inventory",
        merge: MergeRule::Owned,
        kind: Kind::Facts,
        default_scope: Scope::Active,
        history: None,
        distinct_of: None,
        combine: Combine::Extracts,
        provenance: false,
        distinct_resources: false,
        parents: &[],
        depth_from_path: false,
        pql_sees_every_state: false,
        pql_mapped: true,
        order: orderable::INVENTORY,
        cache: CacheClass::Records,
    },
    EntityRow {
        entity: Entity::Packages,
        segment: "packages",
        path: "/pdb/query/v4/packages",
        merge: MergeRule::Union(Identity::Verbatim),
        kind: Kind::Facts,
        default_scope: Scope::Any,
        history: None,
        distinct_of: Some((
            Entity::PackageInventory,
            &["package_name", "version", "provider"],
        )),
        combine: Combine::Extracts,
        provenance: false,
        distinct_resources: false,
        parents: &[],
        depth_from_path: false,
        pql_sees_every_state: false,
        pql_mapped: true,
        order: orderable::PACKAGES,
        cache: CacheClass::Records,
    },
    EntityRow {
        entity: Entity::PackageInventory,
        segment: "package-inventory",
        path: "/pdb/query/v4/package-inventory",
        merge: MergeRule::Owned,
        kind: Kind::Facts,
        default_scope: Scope::Active,
        history: None,
        distinct_of: None,
        combine: Combine::Extracts,
        provenance: false,
        distinct_resources: false,
        parents: &[],
        depth_from_path: false,
        pql_sees_every_state: false,
        pql_mapped: true,
        order: orderable::PACKAGE_INVENTORY,
        cache: CacheClass::Records,
    },
    EntityRow {
        entity: Entity::Producers,
        segment: "producers",
        path: "/pdb/query/v4/producers",
        merge: MergeRule::Union(Identity::Name),
        kind: Kind::Node,
        default_scope: Scope::Any,
        history: None,
        distinct_of: None,
        combine: Combine::Extracts,
        provenance: false,
        distinct_resources: false,
        parents: &[],
        depth_from_path: false,
        pql_sees_every_state: false,
        pql_mapped: true,
        order: orderable::NAME_ONLY,
        cache: CacheClass::Records,
    },
    EntityRow {
        entity: Entity::Environments,
        segment: "environments",
        path: "/pdb/query/v4/environments",
        merge: MergeRule::Union(Identity::Name),
        kind: Kind::Node,
        default_scope: Scope::Any,
        history: None,
        distinct_of: None,
        combine: Combine::Extracts,
        provenance: false,
        distinct_resources: false,
        parents: &[],
        depth_from_path: false,
        pql_sees_every_state: false,
        pql_mapped: true,
        order: orderable::NAME_ONLY,
        cache: CacheClass::Records,
    },
    EntityRow {
        entity: Entity::Reports,
        segment: "reports",
        path: "/pdb/query/v4/reports",
        merge: MergeRule::Union(Identity::Hash),
        kind: Kind::Node,
        default_scope: Scope::Any,
        history: Some(History {
            identity: &["hash"],
            report_column: "hash",
            per_report: false,
            records: Entity::Reports,
        }),
        distinct_of: None,
        combine: Combine::Extracts,
        provenance: false,
        distinct_resources: false,
        parents: &[Parent::Environment, Parent::Producer],
        depth_from_path: false,
        pql_sees_every_state: true,
        pql_mapped: true,
        order: orderable::REPORTS,
        cache: CacheClass::History,
    },
    EntityRow {
        entity: Entity::Events,
        segment: "events",
        path: "/pdb/query/v4/events",
        merge: MergeRule::Union(Identity::Verbatim),
        kind: Kind::Node,
        default_scope: Scope::Any,
        history: Some(History {
            identity: &["report", "resource_type", "resource_title", "property"],
            report_column: "report",
            per_report: true,
            records: Entity::Events,
        }),
        distinct_of: None,
        combine: Combine::Extracts,
        provenance: false,
        distinct_resources: true,
        parents: &[Parent::Environment],
        depth_from_path: false,
        pql_sees_every_state: true,
        pql_mapped: true,
        order: orderable::EVENTS,
        cache: CacheClass::History,
    },
    EntityRow {
        entity: Entity::EventCounts,
        segment: "event-counts",
        path: "/pdb/query/v4/event-counts",
        merge: MergeRule::Counts,
        kind: Kind::Node,
        default_scope: Scope::Any,
        history: Some(History {
            identity: &[],
            report_column: "report",
            per_report: true,
            records: Entity::Events,
        }),
        distinct_of: None,
        combine: Combine::EventCounts,
        provenance: false,
        distinct_resources: false,
        parents: &[],
        depth_from_path: false,
        pql_sees_every_state: false,
        pql_mapped: false,
        order: orderable::EVENT_COUNTS,
        cache: CacheClass::Aggregates,
    },
    EntityRow {
        entity: Entity::AggregateEventCounts,
        segment: "aggregate-event-counts",
        path: "/pdb/query/v4/aggregate-event-counts",
        merge: MergeRule::Counts,
        kind: Kind::Node,
        default_scope: Scope::Any,
        history: Some(History {
            identity: &[],
            report_column: "report",
            per_report: true,
            records: Entity::Events,
        }),
        distinct_of: None,
        combine: Combine::AggregateEventCounts,
        provenance: false,
        distinct_resources: false,
        parents: &[],
        depth_from_path: false,
        pql_sees_every_state: false,
        pql_mapped: false,
        order: &[],
        cache: CacheClass::Aggregates,
    },
];

impl Entity {
    /// Its row of the entity table.
    pub fn row(self) -> &'static EntityRow {
        &ROWS[self as usize]
    }

    /// The entity served at `/pdb/query/v4/<segment>`, if pdbmux merges it.
    pub fn from_segment(segment: &str) -> Option<Entity> {
        ROWS.iter()
            .find(|row| row.segment == segment)
            .map(|row| row.entity)
    }

    /// The path segment under `/pdb/query/v4/`.
    pub fn segment(self) -> &'static str {
        self.row().segment
    }

    /// The path the entity's own endpoint is served at.
    pub fn path(self) -> String {
        self.path_static().to_owned()
    }

    /// [`Entity::path`] as a static string.
    pub fn path_static(self) -> &'static str {
        self.row().path
    }

    /// How its records merge.
    pub fn merge_rule(self) -> MergeRule {
        self.row().merge
    }

    /// The node-owned entity this union entity is the distinct projection of, and the columns
    /// projected: `/packages` lists the packages `/package-inventory` holds. A backend holding
    /// nodes that other backends own is asked this projection less those nodes, so that what
    /// only its stale copies hold is not listed (docs/merging.md, "`/packages`").
    pub fn distinct_of(self) -> Option<(Entity, &'static [&'static str])> {
        self.row().distinct_of
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
        self.row().history.is_some()
    }

    /// How its copies are counted once, for history.
    pub fn history(self) -> Option<History> {
        self.row().history
    }

    /// The kind of node data its records derive from, whose owner answers for a node
    /// (docs/decisions.md, D14): facts for the fact entities, inventory and packages, the
    /// catalog for catalogs, catalog inputs, resources and edges, the node record and latest report
    /// for the rest.
    pub fn kind(self) -> Kind {
        self.row().kind
    }

    /// The nodes a query on this entity sees when it does not name `node_state`: PuppetDB adds
    /// `["=","node_state","active"]` to every node-owned entity's query but `/catalogs`'.
    pub fn default_scope(self) -> Scope {
        self.row().default_scope
    }

    /// The columns an `order_by` on it may name, for a request whose parameters add `added`
    /// ([`ColumnSet::facts_expiration`] for a record or extract request; `/event-counts` adds
    /// its `summarize_by`'s). Use it to parse the request's paging.
    pub fn order_columns(self, added: ColumnSet) -> OrderColumns {
        OrderColumns::new(self.row().order, added)
    }

    /// Which TTL its merged (not combined) answers are cached for.
    pub fn cache_class(self) -> CacheClass {
        self.row().cache
    }

    /// Which of its queries pdbmux combines.
    pub fn combine(self) -> Combine {
        self.row().combine
    }

    /// Whether the provenance fact is one of its records (`/facts`).
    pub fn carries_provenance(self) -> bool {
        self.row().provenance
    }

    /// Whether it takes `distinct_resources=true`, whose queries are never combined (`/events`).
    pub fn takes_distinct_resources(self) -> bool {
        self.row().distinct_resources
    }

    /// Whether it is served below `parent` (`/environments/<env>/facts`).
    pub fn is_below(self, parent: Parent) -> bool {
        self.row().parents.contains(&parent)
    }

    /// Whether its `depth` column orders by its `path`'s length (`/fact-paths`).
    pub fn depth_from_path(self) -> bool {
        self.row().depth_from_path
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `identity`'s digest of `text`, its field read as a merge reads it (borrowed from `text`).
    fn digest_of(identity: Identity, text: &str) -> Option<Digest> {
        let fields = crate::records::Fields::of(text);
        identity.digest(text, fields.as_ref().and_then(|f| f.raw(identity.field())))
    }

    #[test]
    fn copies_share_a_digest_that_other_records_do_not() {
        let event = |receipt: &str, status: &str| {
            format!(r#"{{"certname":"a","report_receive_time":"{receipt}","status":"{status}"}}"#)
        };
        let copy = digest_of(Identity::Verbatim, &event("10:00:01", "success"));
        assert!(copy.is_some());
        assert_eq!(
            copy,
            digest_of(Identity::Verbatim, &event("10:00:02", "success")),
            "equal but for the receipt time"
        );
        assert_ne!(
            copy,
            digest_of(Identity::Verbatim, &event("10:00:01", "failure"))
        );
        // Without the receipt field, the whole record.
        assert_ne!(
            digest_of(Identity::Verbatim, r#"{"path":["a"]}"#),
            digest_of(Identity::Verbatim, r#"{"path":["b"]}"#)
        );
        let report =
            |hash: &str, receipt: &str| format!(r#"{{"hash":{hash},"receive_time":"{receipt}"}}"#);
        assert_eq!(
            digest_of(Identity::Hash, &report(r#""h1""#, "1")),
            digest_of(Identity::Hash, &report(r#""h1""#, "2"))
        );
        assert_ne!(
            digest_of(Identity::Hash, &report(r#""h1""#, "1")),
            digest_of(Identity::Hash, &report(r#""h2""#, "1"))
        );
        assert_eq!(
            digest_of(Identity::Hash, &report("null", "1")),
            None,
            "no hash: never a copy"
        );
        // A value not borrowed from the text is not cut from it.
        let text = event("10:00:01", "success");
        let elsewhere = RawValue::from_string(r#""10:00:01""#.to_owned()).expect("json");
        assert_eq!(
            Identity::Verbatim.digest(&text, Some(&elsewhere)),
            Identity::Verbatim.digest(&text, None)
        );
    }

    #[test]
    fn the_table_has_one_row_per_entity_in_order() {
        for (index, entity) in ALL.into_iter().enumerate() {
            assert_eq!(entity as usize, index);
            assert_eq!(ROWS[index].entity, entity);
        }
    }

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

    #[test]
    fn the_rows_name_each_entity_with_a_rule_of_its_own() {
        let with = |has: fn(Entity) -> bool| -> Vec<Entity> {
            ALL.into_iter().filter(|e| has(*e)).collect()
        };
        assert_eq!(with(Entity::carries_provenance), [Entity::Facts]);
        assert_eq!(with(Entity::depth_from_path), [Entity::FactPaths]);
        assert_eq!(with(|e| e.combine() == Combine::Never), [Entity::FactNames]);
        assert_eq!(Entity::EventCounts.combine(), Combine::EventCounts);
        assert_eq!(
            Entity::AggregateEventCounts.combine(),
            Combine::AggregateEventCounts
        );
        // A history entity's corrections ask its own records, the event counts' the events'.
        for entity in ALL {
            let Some(history) = entity.history() else {
                continue;
            };
            let expected = match entity.merge_rule() {
                MergeRule::Counts => Entity::Events,
                _ => entity,
            };
            assert_eq!(history.records, expected, "{entity:?}");
        }
    }

    #[test]
    fn each_order_column_is_named_once_and_its_set_belongs_to_its_entity() {
        for entity in ALL {
            let columns = entity.row().order;
            for (at, column) in columns.iter().enumerate() {
                assert!(
                    columns[..at].iter().all(|c| c.name != column.name),
                    "{entity:?} {}",
                    column.name
                );
                let own_set = match column.set {
                    ColumnSet::Base => true,
                    ColumnSet::FactsExpiration => entity == Entity::Nodes,
                    ColumnSet::SummarizedBy(_) => entity == Entity::EventCounts,
                };
                assert!(own_set, "{entity:?} {column:?}");
            }
        }
        // `include_facts_expiration=true` adds its two columns where PuppetDB lists them.
        let expiring: Vec<&str> = Entity::Nodes
            .order_columns(ColumnSet::FactsExpiration)
            .supported()
            .collect();
        assert_eq!(
            expiring[4..7],
            ["certname", "expires_facts", "facts_timestamp"]
        );
        assert_eq!(
            expiring[14..],
            [
                "latest_report_noop",
                "expires_facts_updated",
                "catalog_environment",
                "latest_report_job_id"
            ]
        );
        let plain = Entity::Nodes.order_columns(ColumnSet::Base).supported();
        assert!(plain.eq(expiring
            .into_iter()
            .filter(|c| !c.starts_with("expires_facts"))));
        let subject = |by| -> Vec<&str> {
            Entity::EventCounts
                .order_columns(ColumnSet::SummarizedBy(by))
                .supported()
                .skip(4)
                .collect()
        };
        assert_eq!(subject(SummarizeBy::Certname), ["certname"]);
        assert_eq!(
            subject(SummarizeBy::Resource),
            ["resource_type", "resource_title"]
        );
        assert_eq!(subject(SummarizeBy::ContainingClass), ["containing_class"]);
        assert!(Entity::AggregateEventCounts.row().order.is_empty());
    }

    #[test]
    fn history_is_cached_as_history_and_the_event_counts_as_aggregates() {
        let cached_as = |class| -> Vec<Entity> {
            ALL.into_iter()
                .filter(|e| e.cache_class() == class)
                .collect()
        };
        assert_eq!(
            cached_as(CacheClass::History),
            [Entity::Reports, Entity::Events]
        );
        assert_eq!(
            cached_as(CacheClass::Aggregates),
            [Entity::EventCounts, Entity::AggregateEventCounts]
        );
        assert_eq!(cached_as(CacheClass::Records).len(), ALL.len() - 4);
    }
}
