//! One request's view of node ownership (docs/merging.md, "Who owns a node" and "What it
//! costs"): which backends a query pinned to certnames needs at all, whose copy of a node's
//! records a merge keeps, what a backend is told not to answer for when ownership has to be
//! pushed into its query, and how far a paged request over-fetches so that dropping other
//! owners' records still fills the page.

use crate::config::MergeStrategy;
use crate::entity::{Entity, MergeRule};
use crate::ids::BackendId;
use crate::membership::{Kind, Ownership, Scope};

/// How a request weighs the membership map: the strategy that picks a node's owner, the kind
/// of data its records derive from (each kind has its own owner) and the nodes its query sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct NodeScope {
    pub(crate) strategy: MergeStrategy,
    pub(crate) kind: Kind,
    pub(crate) scope: Scope,
}

impl NodeScope {
    /// For a query on `entity`: `/nodes` and history always take the newest holding (a node's
    /// record and latest report are the newest one's); the other node-owned entities take the
    /// configured merge. A query naming `node_state` (`Analysis::names_node_state`) sees every
    /// node state.
    pub(crate) fn of(
        entity: Entity,
        configured: MergeStrategy,
        names_node_state: bool,
    ) -> NodeScope {
        let strategy = match entity.merge_rule() {
            MergeRule::Node => MergeStrategy::Freshness,
            _ if entity.is_history() => MergeStrategy::Freshness,
            _ => configured,
        };
        let scope = if names_node_state {
            Scope::Any
        } else {
            entity.default_scope()
        };
        NodeScope {
            strategy,
            kind: entity.kind(),
            scope,
        }
    }
}

/// Whose copy a backend's records of one node are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Holding {
    /// The backend owns the node: keep them.
    Own,
    /// Another backend this request asks owns it: drop them.
    Other,
    /// The map does not know the node, or its owner is not asked: keep the first backend's.
    Unknown,
}

/// Ownership as one request sees it: the snapshot, the scope, and the backends it asks.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Owning<'a> {
    pub(crate) ownership: &'a Ownership,
    pub(crate) scope: NodeScope,
    pub(crate) asked: &'a [BackendId],
}

impl<'a> Owning<'a> {
    /// Whose copy `backend`'s records of `certname` are.
    pub(crate) fn holding(&self, backend: BackendId, certname: &str) -> Holding {
        self.holding_of(backend, self.ownership.owners(certname, self.scope.scope))
    }

    /// [`Owning::holding`] for the certnames of one backend's records as they come, ascending
    /// (`near`: where the last was found, [`Ownership::owners_near`]).
    pub(crate) fn holding_near(
        &self,
        backend: BackendId,
        certname: &str,
        near: &mut usize,
    ) -> Holding {
        let owners = self.ownership.owners_near(certname, self.scope.scope, near);
        self.holding_of(backend, owners)
    }

    /// Whose copy `backend`'s records of a node with `owners` are.
    fn holding_of(&self, backend: BackendId, owners: Option<crate::membership::Owners>) -> Holding {
        match owners {
            None => Holding::Unknown,
            Some(owners) => {
                let owner = owners.under(self.scope.strategy, self.scope.kind);
                if owner == backend {
                    Holding::Own
                } else if self.asked.contains(&owner) {
                    Holding::Other
                } else {
                    Holding::Unknown
                }
            }
        }
    }

    /// The backend this request asks that owns `certname`'s `kind` of data, if the map knows
    /// the node and that owner is asked.
    pub(crate) fn kind_owner(&self, certname: &str, kind: Kind) -> Option<BackendId> {
        let owner = self
            .ownership
            .owners(certname, self.scope.scope)?
            .under(self.scope.strategy, kind);
        self.asked.contains(&owner).then_some(owner)
    }

    /// The certnames `backend` must not answer for when ownership is pushed into its query:
    /// the nodes it holds that an asked backend owns, only those among `pinned` when the query
    /// is pinned.
    pub(crate) fn excluded(&self, backend: BackendId, pinned: Option<&[String]>) -> Vec<&'a str> {
        let excluded = self.ownership.excluded(
            backend,
            (self.scope.strategy, self.scope.kind),
            self.scope.scope,
            self.asked,
        );
        match pinned {
            None => excluded,
            Some(pinned) => excluded
                .into_iter()
                .filter(|c| pinned.binary_search_by(|p| p.as_str().cmp(c)).is_ok())
                .collect(),
        }
    }

    /// How many records `backend` is asked for so that, after the nodes it holds for others are
    /// dropped, its page still reaches `reach` records: `reach` scaled by the share of its nodes
    /// it owns (with a quarter more and four records of slack). A page that still comes up short
    /// is asked again with ownership pushed down (exact, but slower). `None` when the backend
    /// owns less than a quarter of the nodes it holds: most of any page would be dropped, so
    /// ownership is pushed down at once.
    pub(crate) fn over_fetch(
        &self,
        backend: BackendId,
        reach: u64,
        pinned: Option<&[String]>,
    ) -> Option<u64> {
        let excluded = self.excluded(backend, pinned).len() as u64;
        if excluded == 0 {
            return Some(reach);
        }
        let held = match pinned {
            Some(pinned) => pinned.len() as u64,
            None => self.ownership.held(backend, self.scope.scope) as u64,
        }
        .max(excluded);
        let owned = held - excluded;
        if owned.saturating_mul(4) < held {
            return None;
        }
        let extra = reach.saturating_mul(excluded).saturating_mul(5) / owned.saturating_mul(4);
        Some(reach.saturating_add(extra).saturating_add(4))
    }
}

/// The backends a query pinned to `pinned` certnames needs, among `roster` (configured order):
/// each node's owner when it is in the roster, else every backend in the roster holding it; for
/// history without an owner (`scope` `None`), every holder. A certname the map does not know (a
/// node that appeared since the last refresh) needs everyone, and so does an empty pin.
pub(crate) fn narrow(
    roster: &[BackendId],
    ownership: &Ownership,
    scope: Option<NodeScope>,
    pinned: &[String],
) -> Vec<BackendId> {
    if pinned.is_empty() {
        return roster.to_vec();
    }
    let mut needed: Vec<BackendId> = Vec::new();
    for certname in pinned {
        let view = scope.map_or(Scope::Any, |s| s.scope);
        let holders: Vec<BackendId> = ownership
            .holders(certname, view)
            .iter()
            .copied()
            .filter(|b| roster.contains(b))
            .collect();
        if holders.is_empty() {
            return roster.to_vec();
        }
        let owner = scope.and_then(|scope| {
            let owners = ownership.owners(certname, scope.scope)?;
            let owner = owners.under(scope.strategy, scope.kind);
            roster.contains(&owner).then_some((owners, scope))
        });
        match owner {
            Some((owners, scope)) => {
                // A node record takes its facts and catalog fields from their owners.
                let kinds: &[Kind] = match scope.kind {
                    Kind::Node => &[Kind::Node, Kind::Facts, Kind::Catalog],
                    kind => &[kind][..],
                };
                needed.extend(
                    kinds
                        .iter()
                        .map(|kind| owners.under(scope.strategy, *kind))
                        .filter(|b| roster.contains(b)),
                );
            }
            None => needed.extend(holders),
        }
    }
    roster
        .iter()
        .copied()
        .filter(|b| needed.contains(b))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::membership::{BackendNodes, Member};

    fn ownership() -> Ownership {
        let nodes = |rows: &[(&str, &str)]| -> Option<BackendNodes> {
            Some(
                rows.iter()
                    .map(|(c, t)| ((*c).into(), Member::ran_at(t)))
                    .collect(),
            )
        };
        Ownership::build(
            &[
                nodes(&[
                    ("a-only", "2026-11-30T08:00:00.000Z"),
                    ("newer-in-a", "2026-11-30T09:00:00.000Z"),
                    ("newer-in-b", "2026-11-30T07:00:00.000Z"),
                ]),
                nodes(&[
                    ("b-only", "2026-11-30T08:00:00.000Z"),
                    ("newer-in-a", "2026-11-30T08:00:00.000Z"),
                    ("newer-in-b", "2026-11-30T08:00:00.000Z"),
                ]),
            ],
            1,
        )
    }

    const A: BackendId = BackendId(0);
    const B: BackendId = BackendId(1);
    const FRESH: NodeScope = NodeScope {
        strategy: MergeStrategy::Freshness,
        kind: Kind::Node,
        scope: Scope::Active,
    };

    fn pins(names: &[&str]) -> Vec<String> {
        names.iter().map(|n| (*n).to_owned()).collect()
    }

    #[test]
    fn a_pinned_query_goes_to_the_owners_only() {
        let o = ownership();
        let both = [A, B];
        assert_eq!(narrow(&both, &o, Some(FRESH), &pins(&["newer-in-b"])), [B]);
        assert_eq!(
            narrow(&both, &o, Some(FRESH), &pins(&["a-only", "newer-in-b"])),
            [A, B]
        );
        assert_eq!(narrow(&both, &o, Some(FRESH), &pins(&["newer-in-a"])), [A]);
        // History without an owner: every holder.
        assert_eq!(narrow(&both, &o, None, &pins(&["newer-in-a"])), [A, B]);
        assert_eq!(narrow(&both, &o, None, &pins(&["b-only"])), [B]);
        // Unknown nodes and empty pins need everyone.
        assert_eq!(
            narrow(&both, &o, Some(FRESH), &pins(&["new", "a-only"])),
            [A, B]
        );
        assert_eq!(narrow(&both, &o, Some(FRESH), &[]), [A, B]);
        // An owner the prober took out: the other holders answer.
        assert_eq!(narrow(&[A], &o, Some(FRESH), &pins(&["newer-in-b"])), [A]);
    }

    #[test]
    fn holdings_excluded_lists_and_over_fetch() {
        let o = ownership();
        let asked = [A, B];
        let owning = Owning {
            ownership: &o,
            scope: FRESH,
            asked: &asked,
        };
        assert_eq!(owning.holding(A, "newer-in-a"), Holding::Own);
        assert_eq!(owning.holding(A, "newer-in-b"), Holding::Other);
        assert_eq!(owning.holding(A, "unknown"), Holding::Unknown);
        assert_eq!(owning.excluded(A, None), ["newer-in-b"]);
        assert!(owning.excluded(A, Some(&pins(&["a-only"]))).is_empty());
        // A holds 3, owns 2: asked for 10 + 10 * 1 * 5 / (2 * 4) + 4.
        assert_eq!(owning.over_fetch(A, 10, None), Some(10 + 6 + 4));
        assert_eq!(owning.over_fetch(A, 10, Some(&pins(&["a-only"]))), Some(10));
        // Pinned to the one node it holds for B: it owns nothing of it, so push down at once.
        assert_eq!(owning.over_fetch(A, 10, Some(&pins(&["newer-in-b"]))), None);
        let alone = [A];
        let owning = Owning {
            asked: &alone,
            ..owning
        };
        assert_eq!(owning.holding(A, "newer-in-b"), Holding::Unknown);
        assert!(owning.excluded(A, None).is_empty());
    }
}
