//! The membership map (DECISIONS.md D4): which backends hold each active certname, with its
//! `report_timestamp` there, and from it the owner of every node.
//!
//! Built from `["extract",["certname","report_timestamp"]]` on every backend's `/nodes`, reused for
//! `freshness_ttl`, refreshed by one fan-out at a time. A backend that fails a refresh keeps the
//! entries of its last good one.

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::sync::Arc;

use serde::Deserialize;

use crate::config::MergeStrategy;
use crate::ids::BackendId;
use crate::sort::parse_instant;

/// The upstream path and query that fetches one backend's membership.
pub const MEMBERSHIP_QUERY: &str =
    "/pdb/query/v4/nodes?query=%5B%22extract%22%2C%5B%22certname%22%2C%22report_timestamp%22%5D%5D";

/// One backend's nodes: certname → report_timestamp (None when the node has no report).
pub type BackendNodes = BTreeMap<String, Option<String>>;

#[derive(Deserialize)]
struct MembershipRow {
    certname: String,
    report_timestamp: Option<String>,
}

/// Parses a membership answer; `None` when the body is not an array of such rows.
pub fn parse_membership(body: &[u8]) -> Option<BackendNodes> {
    let rows: Vec<MembershipRow> = serde_json::from_slice(body).ok()?;
    Some(
        rows.into_iter()
            .map(|row| (row.certname, row.report_timestamp))
            .collect(),
    )
}

/// Who owns one certname under each strategy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Owners {
    /// The backend with the newer report_timestamp (null is older than any; ties to configured order).
    pub freshness: BackendId,
    /// The first backend in configured order that holds the node.
    pub first: BackendId,
}

impl Owners {
    /// The owner under `strategy`.
    pub fn under(&self, strategy: MergeStrategy) -> BackendId {
        match strategy {
            MergeStrategy::Freshness => self.freshness,
            MergeStrategy::Static => self.first,
        }
    }
}

/// An immutable snapshot of node ownership, shared by every exchange admitted while it is current.
#[derive(Debug, Default)]
pub struct Ownership {
    owners: BTreeMap<String, Owners>,
    /// For each backend (index) and strategy, the certnames it holds that another backend owns.
    excluded_freshness: Vec<Vec<String>>,
    excluded_static: Vec<Vec<String>>,
}

impl Ownership {
    /// Builds the snapshot from each backend's nodes (index = configured order; `None` = never
    /// answered).
    pub fn build(per_backend: &[Option<BackendNodes>]) -> Ownership {
        let mut holders: BTreeMap<&str, Vec<(BackendId, Option<&str>)>> = BTreeMap::new();
        for (index, nodes) in per_backend.iter().enumerate() {
            for (certname, timestamp) in nodes.iter().flatten() {
                holders
                    .entry(certname.as_str())
                    .or_default()
                    .push((BackendId(index), timestamp.as_deref()));
            }
        }
        let mut ownership = Ownership {
            owners: BTreeMap::new(),
            excluded_freshness: vec![Vec::new(); per_backend.len()],
            excluded_static: vec![Vec::new(); per_backend.len()],
        };
        for (certname, held) in holders {
            let first = held[0].0;
            let mut freshness = held[0];
            for candidate in &held[1..] {
                if compare_report_timestamps(candidate.1, freshness.1) == Ordering::Greater {
                    freshness = *candidate;
                }
            }
            let owners = Owners {
                freshness: freshness.0,
                first,
            };
            if held.len() > 1 {
                for (backend, _) in &held {
                    if *backend != owners.freshness {
                        ownership.excluded_freshness[backend.0].push(certname.to_owned());
                    }
                    if *backend != owners.first {
                        ownership.excluded_static[backend.0].push(certname.to_owned());
                    }
                }
            }
            ownership.owners.insert(certname.to_owned(), owners);
        }
        ownership
    }

    /// The owners of a certname, if any backend held it at the last refresh.
    pub fn owners(&self, certname: &str) -> Option<Owners> {
        self.owners.get(certname).copied()
    }

    /// The certnames `backend` holds but another backend owns under `strategy`: the list pushed
    /// into that backend's query so it answers only for its own nodes.
    pub fn excluded(&self, backend: BackendId, strategy: MergeStrategy) -> &[String] {
        let lists = match strategy {
            MergeStrategy::Freshness => &self.excluded_freshness,
            MergeStrategy::Static => &self.excluded_static,
        };
        lists.get(backend.0).map_or(&[], Vec::as_slice)
    }

    /// How many distinct active certnames the estate holds.
    pub fn node_count(&self) -> usize {
        self.owners.len()
    }

    /// An empty snapshot, for requests admitted before any refresh succeeded.
    pub fn empty() -> Arc<Ownership> {
        Arc::new(Ownership::default())
    }
}

/// Orders report timestamps: null is older than any timestamp; instants compare as instants.
pub(crate) fn compare_report_timestamps(a: Option<&str>, b: Option<&str>) -> Ordering {
    match (a, b) {
        (None, None) => Ordering::Equal,
        (None, Some(_)) => Ordering::Less,
        (Some(_), None) => Ordering::Greater,
        (Some(a), Some(b)) => match (parse_instant(a), parse_instant(b)) {
            (Some(a), Some(b)) => a.cmp(&b),
            // PuppetDB always writes RFC 3339; anything else is compared as text after instants.
            (Some(_), None) => Ordering::Greater,
            (None, Some(_)) => Ordering::Less,
            (None, None) => a.cmp(b),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nodes(rows: &[(&str, Option<&str>)]) -> Option<BackendNodes> {
        Some(
            rows.iter()
                .map(|(c, t)| ((*c).to_owned(), t.map(str::to_owned)))
                .collect(),
        )
    }

    #[test]
    fn owners_follow_freshness_and_configured_order() {
        let a = nodes(&[
            ("only-a", Some("2026-11-30T08:00:00.000Z")),
            ("newer-in-b", Some("2026-11-30T08:00:00.000Z")),
            ("newer-in-a", Some("2026-11-30T09:00:00.000Z")),
            ("tie", Some("2026-11-30T08:00:00.000Z")),
            ("null-in-a", None),
            ("both-null", None),
        ]);
        let b = nodes(&[
            ("only-b", None),
            ("newer-in-b", Some("2026-11-30T08:30:00.000Z")),
            ("newer-in-a", Some("2026-11-30T10:00:00.000+02:00")),
            ("tie", Some("2026-11-30T09:00:00.000+01:00")),
            ("null-in-a", Some("2000-01-01T00:00:00.000Z")),
            ("both-null", None),
        ]);
        let ownership = Ownership::build(&[a, b]);
        let (a, b) = (BackendId(0), BackendId(1));
        let owner = |c: &str| ownership.owners(c).map(|o| (o.freshness, o.first));
        assert_eq!(owner("only-a"), Some((a, a)));
        assert_eq!(owner("only-b"), Some((b, b)));
        assert_eq!(owner("newer-in-b"), Some((b, a)));
        assert_eq!(
            owner("newer-in-a"),
            Some((a, a)),
            "10:00+02:00 is 08:00Z, older than 09:00Z"
        );
        assert_eq!(
            owner("tie"),
            Some((a, a)),
            "equal instants tie to configured order"
        );
        assert_eq!(owner("null-in-a"), Some((b, a)));
        assert_eq!(owner("both-null"), Some((a, a)));
        assert_eq!(owner("nowhere"), None);
        assert_eq!(
            ownership.excluded(a, MergeStrategy::Freshness),
            ["newer-in-b", "null-in-a"]
        );
        assert_eq!(
            ownership.excluded(b, MergeStrategy::Freshness),
            ["both-null", "newer-in-a", "tie"]
        );
        assert!(ownership.excluded(a, MergeStrategy::Static).is_empty());
        assert_eq!(ownership.excluded(b, MergeStrategy::Static).len(), 5);
        assert_eq!(ownership.node_count(), 7);
    }

    #[test]
    fn a_backend_that_never_answered_holds_nothing() {
        let ownership = Ownership::build(&[None, nodes(&[("x", None)])]);
        assert_eq!(
            ownership.owners("x").map(|o| o.freshness),
            Some(BackendId(1))
        );
    }

    #[test]
    fn membership_bodies() {
        let parsed = parse_membership(br#"[{"certname":"a","report_timestamp":null},{"certname":"b","report_timestamp":"2026-11-30T08:00:00.000Z"}]"#);
        assert_eq!(parsed.map(|n| n.len()), Some(2));
        assert!(parse_membership(b"[{\"certname\":1}]").is_none());
        assert!(parse_membership(b"[").is_none());
    }
}
