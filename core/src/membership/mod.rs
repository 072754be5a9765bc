//! The membership map (docs/merging.md, "Who owns a node"): which backends hold each certname,
//! with the producer times of what each holds (its latest report's, its facts', its catalog's)
//! and whether it is active there, and from it the owner of every node, per kind of data.
//!
//! Built by the membership map's machine (`refresh.rs`): each refresh asks every backend, at
//! once, its `/nodes` (certname, `report_timestamp`, `deactivated`, `expired`, every node state)
//! and when each node's facts and catalog were produced (`/factsets` and `/catalogs`, certname
//! and `producer_timestamp`), every time written by PostgreSQL ([`TIME_FORMAT`]). Reused for
//! `freshness_ttl`. A backend that fails any of its queries keeps the entries of its last good
//! refresh.
//!
//! Ownership has two scopes. Queries that see active nodes only (the default of `/nodes`,
//! `/facts`, `/resources` and the other node-owned entities) weigh only the backends where the
//! node is active; queries over every node state (`node_state` named in the query, `/catalogs`,
//! report and event history with `latest_report?`) weigh every backend holding it, so a node
//! deactivated in one backend and active in another still counts once.
//!
//! Under `merge: freshness` each kind of a node's data has its own owner, as one PuppetDB keeps
//! the copy with the newest producer time of each (docs/decisions.md, D14): its facts (and
//! everything derived from them) from the backend with the newest factset `producer_timestamp`,
//! its catalog (resources, edges) from the newest catalog `producer_timestamp`, its node record
//! and latest report from the newest report (then the newest facts, then the newest catalog).
//! Only on equal producer times does configured order decide. Receive times (`facts_timestamp`,
//! `catalog_timestamp`, `receive_time`) are never asked for: a backend with a command backlog
//! processes old data after new.

use std::borrow::Cow;
use std::cmp::Ordering;
use std::hash::{BuildHasher, RandomState};
use std::marker::PhantomData;
use std::sync::Arc;

use hashbrown::HashTable;

use serde::de::{Deserializer as _, SeqAccess, Visitor};
use serde::Deserialize;

use crate::config::MergeStrategy;
use crate::ids::BackendId;
use crate::instant::parse_written_instant;

mod refresh;

pub use refresh::MembershipStats;
pub(crate) use refresh::{MembershipMap, MembershipOutput, Sending};

/// How the refresh asks PuppetDB to write every time it reads: as `["function","to_string",
/// <field>,TIME_FORMAT]`, a PostgreSQL `to_char` pattern giving the time with microseconds and
/// its offset in whatever time zone the database runs (`2026-11-30T08:00:00.000000+00`,
/// `…T13:30:00.000000+05:30`: RFC 3339 but for a whole-hour offset's missing minutes, which
/// the map reads as `+00:00`; `OF` is in every PostgreSQL PuppetDB 7 runs on). PostgreSQL writes it: a timestamp column PuppetDB formats itself costs it about
/// 15 µs a row, most of a refresh's time (docs/merging.md, "Who owns a node").
pub const TIME_FORMAT: &str = r#"YYYY-MM-DD"T"HH24:MI:SS.USOF"#;

/// The key under which PuppetDB writes a `to_string` column, so each membership row's time.
pub const TIME_KEY: &str = "to_string";

/// The upstream path and query that fetches one backend's nodes:
/// `["extract",["certname",["function","to_string","report_timestamp",TIME_FORMAT],
/// "deactivated","expired"],["=","node_state","any"]]` (no receive times: each costs PuppetDB a
/// join, and none says anything of newness).
pub const MEMBERSHIP_QUERY: &str = "/pdb/query/v4/nodes?query=%5B%22extract%22%2C%5B%22certname%22%2C%5B%22function%22%2C%22to_string%22%2C%22report_timestamp%22%2C%22YYYY-MM-DD%5C%22T%5C%22HH24%3AMI%3ASS.USOF%22%5D%2C%22deactivated%22%2C%22expired%22%5D%2C%5B%22%3D%22%2C%22node_state%22%2C%22any%22%5D%5D";

/// The upstream path and query that fetches when every factset of one backend was produced:
/// `["extract",["certname",["function","to_string","producer_timestamp",TIME_FORMAT]],
/// ["=","node_state","any"]]` (`/factsets` sees active nodes only unless told otherwise).
pub const FACTS_PRODUCED_QUERY: &str = "/pdb/query/v4/factsets?query=%5B%22extract%22%2C%5B%22certname%22%2C%5B%22function%22%2C%22to_string%22%2C%22producer_timestamp%22%2C%22YYYY-MM-DD%5C%22T%5C%22HH24%3AMI%3ASS.USOF%22%5D%5D%2C%5B%22%3D%22%2C%22node_state%22%2C%22any%22%5D%5D";

/// The upstream path and query that fetches when every catalog of one backend was produced:
/// `["extract",["certname",["function","to_string","producer_timestamp",TIME_FORMAT]]]`
/// (`/catalogs` sees every node state).
pub const CATALOGS_PRODUCED_QUERY: &str = "/pdb/query/v4/catalogs?query=%5B%22extract%22%2C%5B%22certname%22%2C%5B%22function%22%2C%22to_string%22%2C%22producer_timestamp%22%2C%22YYYY-MM-DD%5C%22T%5C%22HH24%3AMI%3ASS.USOF%22%5D%5D%5D";

/// A refresh's queries of one backend, asked at once, in the order [`parse_membership`] takes
/// their answers: its nodes, and every node's producer times.
pub const MEMBERSHIP_QUERIES: [&str; 3] = [
    MEMBERSHIP_QUERY,
    FACTS_PRODUCED_QUERY,
    CATALOGS_PRODUCED_QUERY,
];

/// A kind of node data whose newest copy one PuppetDB keeps on its own (docs/decisions.md, D14):
/// which copy of a node a record comes from depends on the kind it derives from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    /// The node record and its reports: the newest report, then the newest facts, then the
    /// newest catalog (`/nodes`, `latest_report?` on history).
    Node,
    /// The factset and what derives from it (facts, fact contents, inventory, packages).
    Facts,
    /// The catalog and what derives from it (resources, edges, catalog inputs).
    Catalog,
}

impl Kind {
    const ALL: [Kind; 3] = [Kind::Node, Kind::Facts, Kind::Catalog];

    fn index(self) -> usize {
        match self {
            Kind::Node => 0,
            Kind::Facts => 1,
            Kind::Catalog => 2,
        }
    }
}

/// A producer time as ownership compares it: none (older than any time); its text when it does
/// not read as an instant (PuppetDB always writes RFC 3339), older than any instant; or an
/// instant, as PostgreSQL writes it for the refresh ([`TIME_FORMAT`]; offsets apart: `10:00+02`
/// is `08:00Z`). The derived order is that order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Stamp<'a> {
    None,
    Text(&'a str),
    Instant(i64, u32),
}

impl Stamp<'_> {
    fn of(text: Option<&str>) -> Stamp<'_> {
        match text {
            None => Stamp::None,
            Some(text) => match parse_written_instant(text) {
                Some((seconds, nanos)) => Stamp::Instant(seconds, nanos),
                None => Stamp::Text(text),
            },
        }
    }
}

/// [`Member::nanos`] of a kind of data it has no time for.
const NO_TIME: u32 = u32::MAX;
/// [`Member::nanos`] of a time that does not read as an instant: its text is in
/// [`Member::texts`].
const TEXT_TIME: u32 = u32::MAX - 1;

/// One node as one backend holds it: when its latest report ended (as the agent wrote it), when
/// its factset and its catalog were produced, each per [`Kind`] (by its index), and whether it
/// is active. Held as instants, 48 bytes (the map holds one a node a backend; as three optional
/// parsed times it took 80).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    seconds: [i64; 3],
    /// The nanoseconds of each time, or [`NO_TIME`], or [`TEXT_TIME`].
    nanos: [u32; 3],
    /// Neither deactivated nor expired there.
    pub active: bool,
    /// The times that are texts (none in practice).
    texts: Option<Box<[Option<Box<str>>; 3]>>,
}

impl Member {
    /// An active node with this report timestamp and neither facts nor a catalog.
    pub fn active(report_timestamp: Option<&str>) -> Member {
        let mut member = Member {
            seconds: [0; 3],
            nanos: [NO_TIME; 3],
            active: true,
            texts: None,
        };
        member.set(Kind::Node, report_timestamp);
        member
    }

    /// An active node whose last run produced its report, facts and catalog at `at` (one
    /// backend holding all of it, as a node that never moved mid-run).
    pub fn ran_at(at: &str) -> Member {
        Member::active(Some(at))
            .with_facts_produced(Some(at))
            .with_catalog_produced(Some(at))
    }

    /// The same node with facts produced at this time.
    #[must_use]
    pub fn with_facts_produced(mut self, produced: Option<&str>) -> Member {
        self.set(Kind::Facts, produced);
        self
    }

    /// The same node with a catalog produced at this time.
    #[must_use]
    pub fn with_catalog_produced(mut self, produced: Option<&str>) -> Member {
        self.set(Kind::Catalog, produced);
        self
    }

    /// Its time for `kind`: the report's end for [`Kind::Node`].
    fn stamp(&self, kind: Kind) -> Stamp<'_> {
        let at = kind.index();
        match self.nanos[at] {
            NO_TIME => Stamp::None,
            TEXT_TIME => {
                let text = self.texts.as_ref().and_then(|texts| texts[at].as_deref());
                text.map_or(Stamp::None, Stamp::Text)
            }
            nanos => Stamp::Instant(self.seconds[at], nanos),
        }
    }

    fn set(&mut self, kind: Kind, text: Option<&str>) {
        let at = kind.index();
        if let Some(texts) = self.texts.as_mut() {
            texts[at] = None;
        }
        (self.seconds[at], self.nanos[at]) = match Stamp::of(text) {
            Stamp::None => (0, NO_TIME),
            Stamp::Instant(seconds, nanos) => (seconds, nanos),
            Stamp::Text(text) => {
                let texts = self.texts.get_or_insert_with(Box::default);
                texts[at] = Some(text.into());
                (0, TEXT_TIME)
            }
        };
        // No text left: none held (two members with the same times are equal).
        if self
            .texts
            .as_ref()
            .is_some_and(|texts| texts.iter().all(Option::is_none))
        {
            self.texts = None;
        }
    }

    /// Whether this holding's `kind` is newer than `other`'s (D14); `false` on a tie
    /// (configured order decides). No time is older than any time.
    fn is_newer_than(&self, other: &Member, kind: Kind) -> bool {
        let by = |kind: Kind| self.stamp(kind).cmp(&other.stamp(kind));
        let order = match kind {
            Kind::Node => by(Kind::Node)
                .then_with(|| by(Kind::Facts))
                .then_with(|| by(Kind::Catalog)),
            Kind::Facts | Kind::Catalog => by(kind),
        };
        order == Ordering::Greater
    }
}

/// One backend's nodes, sorted by certname: how it holds each. Built once per refresh and only
/// read after; a certname is allocated once and shared by every snapshot built from it. Build it
/// with [`parse_membership`] or by collecting `(certname, member)` pairs (a certname given twice
/// keeps its last member).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BackendNodes(Box<[(Arc<str>, Member)]>);

impl BackendNodes {
    /// How this backend holds `certname`, if it does.
    pub fn get(&self, certname: &str) -> Option<&Member> {
        let at = self.position(certname).ok()?;
        self.0.get(at).map(|(_, member)| member)
    }

    fn get_mut(&mut self, certname: &str) -> Option<&mut Member> {
        let at = self.position(certname).ok()?;
        self.0.get_mut(at).map(|(_, member)| member)
    }

    fn position(&self, certname: &str) -> Result<usize, usize> {
        self.0.binary_search_by(|(held, _)| (**held).cmp(certname))
    }
}

impl FromIterator<(Arc<str>, Member)> for BackendNodes {
    fn from_iter<I: IntoIterator<Item = (Arc<str>, Member)>>(nodes: I) -> BackendNodes {
        let mut nodes: Vec<(Arc<str>, Member)> = nodes.into_iter().collect();
        // Stable, so of a certname given twice the later member is moved into the kept slot.
        nodes.sort_by(|(a, _), (b, _)| a.cmp(b));
        nodes.dedup_by(|later, kept| {
            let same = later.0 == kept.0;
            if same {
                std::mem::swap(later, kept);
            }
            same
        });
        BackendNodes(nodes.into_boxed_slice())
    }
}

/// A row of [`MEMBERSHIP_QUERY`]'s answer; its time is under [`TIME_KEY`].
#[derive(Deserialize)]
struct MembershipRow<'a> {
    #[serde(borrow)]
    certname: Cow<'a, str>,
    #[serde(borrow, rename = "to_string")]
    report_timestamp: Option<Cow<'a, str>>,
    /// Only whether it is set matters.
    #[serde(default)]
    deactivated: Option<serde::de::IgnoredAny>,
    #[serde(default)]
    expired: Option<serde::de::IgnoredAny>,
}

/// A row of [`FACTS_PRODUCED_QUERY`]'s or [`CATALOGS_PRODUCED_QUERY`]'s answer; its time is
/// under [`TIME_KEY`].
#[derive(Deserialize)]
struct ProducedRow<'a> {
    #[serde(borrow)]
    certname: Cow<'a, str>,
    #[serde(borrow, rename = "to_string")]
    producer_timestamp: Option<Cow<'a, str>>,
}

/// Parses one backend's answers to [`MEMBERSHIP_QUERIES`] (nodes, factsets, catalogs): every
/// node with its producer times (none where no row names it); `None` when one is not an array
/// of such rows. A factset or catalog of a certname `/nodes` did not list is ignored. Rows are
/// read one at a time and borrow from the bodies: the only memory that stays is the map itself.
pub fn parse_membership(nodes: &[u8], factsets: &[u8], catalogs: &[u8]) -> Option<BackendNodes> {
    let mut held = Vec::new();
    for_each_row(nodes, |row: MembershipRow<'_>| {
        let mut member = Member::active(row.report_timestamp.as_deref());
        member.active = row.deactivated.is_none() && row.expired.is_none();
        held.push((Arc::from(row.certname), member));
    })?;
    let mut held: BackendNodes = held.into_iter().collect();
    for_each_row(factsets, |row: ProducedRow<'_>| {
        if let (Some(member), Some(at)) = (held.get_mut(&row.certname), row.producer_timestamp) {
            member.set(Kind::Facts, Some(&at));
        }
    })?;
    for_each_row(catalogs, |row: ProducedRow<'_>| {
        if let (Some(member), Some(at)) = (held.get_mut(&row.certname), row.producer_timestamp) {
            member.set(Kind::Catalog, Some(&at));
        }
    })?;
    Some(held)
}

/// Calls `each` with every element of the JSON array `body` as a `T`, keeping none of them;
/// `None` when `body` is not an array of `T`.
fn for_each_row<'de, T: Deserialize<'de>>(body: &'de [u8], each: impl FnMut(T)) -> Option<()> {
    struct Rows<T, F>(F, PhantomData<T>);

    impl<'de, T: Deserialize<'de>, F: FnMut(T)> Visitor<'de> for Rows<T, F> {
        type Value = ();

        fn expecting(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            formatter.write_str("an array of rows")
        }

        fn visit_seq<A: SeqAccess<'de>>(mut self, mut rows: A) -> Result<(), A::Error> {
            while let Some(row) = rows.next_element()? {
                (self.0)(row);
            }
            Ok(())
        }
    }

    let mut deserializer = serde_json::Deserializer::from_slice(body);
    deserializer.deserialize_seq(Rows(each, PhantomData)).ok()?;
    deserializer.end().ok()
}

/// Which nodes a query can see, and so which holders ownership weighs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// Active nodes only (the implicit filter of `/nodes`, `/facts`, `/resources`).
    Active,
    /// Every node state (`node_state` in the query; report and event history).
    Any,
}

/// Who owns one certname under each strategy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Owners {
    /// Per [`Kind`] (by its index): the backend holding its newest copy (null is older than any
    /// timestamp; ties to configured order).
    newest: [BackendId; 3],
    /// The first backend in configured order that holds the node.
    pub first: BackendId,
}

impl Owners {
    /// The owners among `held` (configured order, not empty).
    fn of(held: &[(BackendId, &Member)]) -> Option<Owners> {
        let (&(first, _), rest) = held.split_first()?;
        let newest = Kind::ALL.map(|kind| {
            let mut newest = held[0];
            for candidate in rest {
                if candidate.1.is_newer_than(newest.1, kind) {
                    newest = *candidate;
                }
            }
            newest.0
        });
        Some(Owners { newest, first })
    }

    /// The owner of the node's `kind` of data under `strategy`.
    pub fn under(&self, strategy: MergeStrategy, kind: Kind) -> BackendId {
        match strategy {
            MergeStrategy::Freshness => self.newest[kind.index()],
            MergeStrategy::Static => self.first,
        }
    }

    /// Whether one backend owns all of the node's data under `strategy`.
    fn is_whole(&self, strategy: MergeStrategy) -> bool {
        Kind::ALL
            .iter()
            .all(|kind| self.under(strategy, *kind) == self.under(strategy, Kind::Node))
    }
}

/// [`Owners`] as a [`Placement`] holds them: each backend's index in four bytes (the snapshot
/// holds two a certname).
#[derive(Debug, Clone, Copy)]
struct PlacedOwners {
    newest: [u32; 3],
    first: u32,
}

impl PlacedOwners {
    /// `owners`, `None` past four billion backends.
    fn of(owners: Owners) -> Option<PlacedOwners> {
        let index = |backend: BackendId| u32::try_from(backend.0).ok();
        let [node, facts, catalog] = owners.newest;
        Some(PlacedOwners {
            newest: [index(node)?, index(facts)?, index(catalog)?],
            first: index(owners.first)?,
        })
    }

    fn owners(self) -> Owners {
        let backend = |index: u32| BackendId(index as usize);
        Owners {
            newest: self.newest.map(backend),
            first: backend(self.first),
        }
    }
}

/// One certname in the snapshot: where it is held, and its owners within each scope; 44 bytes
/// (88 with each index a `usize`: some 4 MB more at 100,000 certnames, every replica).
#[derive(Debug, Clone, Copy)]
struct Placement {
    /// Where its holders start in [`Ownership::holders`]: every backend holding it, then those
    /// holding it active (each in configured order).
    start: u32,
    /// How many backends hold it at all, and how many hold it active.
    held: u32,
    held_active: u32,
    owners: PlacedOwners,
    /// Meaningful only when some backend holds it active.
    owners_active: PlacedOwners,
}

impl Placement {
    /// Its owners within `scope`, if any backend holds it there.
    fn owners(&self, scope: Scope) -> Option<Owners> {
        match scope {
            Scope::Any => Some(self.owners.owners()),
            Scope::Active => (self.held_active > 0).then(|| self.owners_active.owners()),
        }
    }

    /// Where its holders within `scope` are in [`Ownership::holders`].
    fn holders(&self, scope: Scope) -> std::ops::Range<usize> {
        let start = self.start as usize;
        let all = start + self.held as usize;
        match scope {
            Scope::Any => start..all,
            Scope::Active => all..all + self.held_active as usize,
        }
    }
}

/// The numbers of one scope, counted once when the snapshot is built (a scrape, under the
/// estate's lock, does not walk the map), and each backend's shared certnames.
#[derive(Debug, Default)]
struct Tally {
    /// Per backend: the certnames it holds that another backend holds too (positions in
    /// [`Ownership::placements`], so by certname).
    shared: Vec<Vec<usize>>,
    held: Vec<usize>,
    /// How many certnames each backend owns under [`MergeStrategy::Freshness`] and
    /// [`MergeStrategy::Static`].
    owned: [Vec<usize>; 2],
    /// How many certnames any backend holds.
    nodes: usize,
    /// How many certnames more than one backend holds.
    shared_nodes: usize,
    /// How many certnames have kinds of data owned by different backends.
    split_nodes: usize,
}

impl Tally {
    fn new(backends: usize) -> Tally {
        Tally {
            shared: vec![Vec::new(); backends],
            held: vec![0; backends],
            owned: [vec![0; backends], vec![0; backends]],
            ..Tally::default()
        }
    }

    /// Counts the certname at `position`, held by `holders` with these `owners`.
    fn count(&mut self, position: usize, holders: &[BackendId], owners: Owners) {
        self.nodes += 1;
        for backend in holders {
            self.held[backend.0] += 1;
        }
        if !owners.is_whole(MergeStrategy::Freshness) {
            self.split_nodes += 1;
        }
        self.owned[0][owners.under(MergeStrategy::Freshness, Kind::Node).0] += 1;
        self.owned[1][owners.first.0] += 1;
        if holders.len() > 1 {
            self.shared_nodes += 1;
            for backend in holders {
                self.shared[backend.0].push(position);
            }
        }
    }
}

/// How many places after the last certname found [`Ownership::owners_near`] looks before it
/// asks the index: a backend holding most of the estate's nodes has its next node a place or two
/// on.
const PLACEMENTS_AHEAD: usize = 4;

/// An immutable snapshot of node ownership, shared by every exchange admitted while it is
/// current. Every certname is one entry of a sorted list, with its owners in both scopes; its
/// holders are a run of one shared list: a snapshot of 100,000 certnames is a few MiB beside
/// the certnames themselves. A certname is looked up through a hash index of positions (10–20
/// bytes an entry, its buckets up to 7/8 full): a binary search compared it with some 17
/// certnames, each behind a pointer, which an ordered merge whose records do not come grouped
/// by node (`/facts` by name) paid on every record (bench/README.md, figure 8).
#[derive(Debug, Default)]
pub struct Ownership {
    generation: u64,
    placements: Box<[(Arc<str>, Placement)]>,
    /// The position in `placements` of each certname, hashed by `hasher`.
    index: HashTable<usize>,
    hasher: RandomState,
    holders: Box<[BackendId]>,
    active: Tally,
    any: Tally,
}

impl Ownership {
    /// Builds the snapshot from each backend's nodes (index = configured order; `None` = never
    /// answered). `generation` tells snapshots apart: what was learned against one snapshot (a
    /// correction, docs/merging.md) is valid for that snapshot only.
    pub fn build(per_backend: &[Option<BackendNodes>], generation: u64) -> Ownership {
        let parts: Vec<&[(Arc<str>, Member)]> = per_backend
            .iter()
            .map(|part| part.as_ref().map_or(&[][..], |nodes| &nodes.0[..]))
            .collect();
        let mut cursors = vec![0; parts.len()];
        // Room for every certname at once (the parts' sum: each at most once a part): the list
        // does not grow by copying itself, and is cut to its length once built.
        let mut placements = Vec::with_capacity(parts.iter().map(|part| part.len()).sum());
        let mut holders = Vec::new();
        let (mut active, mut any) = (Tally::new(parts.len()), Tally::new(parts.len()));
        let mut held: Vec<(BackendId, &Member)> = Vec::new();
        let mut held_active: Vec<(BackendId, &Member)> = Vec::new();
        // A merge of the backends' sorted parts: each step takes the smallest certname left.
        while let Some(certname) = parts
            .iter()
            .zip(&cursors)
            .filter_map(|(part, cursor)| part.get(*cursor).map(|(certname, _)| certname))
            .min()
        {
            held.clear();
            for (index, (part, cursor)) in parts.iter().zip(cursors.iter_mut()).enumerate() {
                if let Some((_, member)) = part.get(*cursor).filter(|(c, _)| c == certname) {
                    held.push((BackendId(index), member));
                    *cursor += 1;
                }
            }
            held_active.clear();
            held_active.extend(held.iter().filter(|(_, member)| member.active));
            let Some(owners) = Owners::of(&held) else {
                continue;
            };
            let owners_active = Owners::of(&held_active);
            let start = holders.len();
            let placement = (
                u32::try_from(start).ok(),
                u32::try_from(held.len()).ok(),
                u32::try_from(held_active.len()).ok(),
                PlacedOwners::of(owners),
                PlacedOwners::of(owners_active.unwrap_or(owners)),
            );
            // Past four billion holders or backends (no memory holds that many) a certname is
            // left out: its records are then those of a node the map does not know.
            let (Some(at), Some(count), Some(count_active), Some(placed), Some(placed_active)) =
                placement
            else {
                continue;
            };
            holders.extend(held.iter().map(|(backend, _)| *backend));
            let any_holders = start..holders.len();
            holders.extend(held_active.iter().map(|(backend, _)| *backend));
            let position = placements.len();
            any.count(position, &holders[any_holders.clone()], owners);
            if let Some(owners_active) = owners_active {
                active.count(position, &holders[any_holders.end..], owners_active);
            }
            let placement = Placement {
                start: at,
                held: count,
                held_active: count_active,
                owners: placed,
                owners_active: placed_active,
            };
            placements.push((Arc::clone(certname), placement));
        }
        let hasher = RandomState::new();
        let mut index = HashTable::with_capacity(placements.len());
        for (position, (certname, _)) in placements.iter().enumerate() {
            let hash = hasher.hash_one(&**certname);
            index.insert_unique(hash, position, |at: &usize| {
                hasher.hash_one(&*placements[*at].0)
            });
        }
        Ownership {
            generation,
            placements: placements.into_boxed_slice(),
            index,
            hasher,
            holders: holders.into_boxed_slice(),
            active,
            any,
        }
    }

    /// Which snapshot this is (see [`Ownership::build`]).
    pub fn generation(&self) -> u64 {
        self.generation
    }

    fn tally(&self, scope: Scope) -> &Tally {
        match scope {
            Scope::Active => &self.active,
            Scope::Any => &self.any,
        }
    }

    fn placement(&self, certname: &str) -> Option<&Placement> {
        let at = self.position(certname)?;
        self.placements.get(at).map(|(_, placement)| placement)
    }

    /// Where `certname` is in `placements`, by the index.
    fn position(&self, certname: &str) -> Option<usize> {
        let hash = self.hasher.hash_one(certname);
        self.index
            .find(hash, |at| {
                self.placements
                    .get(*at)
                    .is_some_and(|(held, _)| **held == *certname)
            })
            .copied()
    }

    /// [`Ownership::owners`] for certnames asked in ascending order, as one backend's records
    /// come (by certname, or by certname within each value of an order's first field): `near`
    /// is where the last one asked was found, and the next is looked for in the
    /// `PLACEMENTS_AHEAD` places from there before the index is asked. A merge ordered by
    /// another field first asks once a record (its consecutive records are different nodes):
    /// [`Ownership::owners`] was a fifth of its perf samples (bench/README.md, figure 8).
    pub fn owners_near(&self, certname: &str, scope: Scope, near: &mut usize) -> Option<Owners> {
        let ahead = self.placements.get(*near..).unwrap_or_default();
        let found = ahead
            .iter()
            .take(PLACEMENTS_AHEAD)
            .position(|(held, _)| **held == *certname);
        let at = match found {
            Some(offset) => *near + offset,
            None => self.position(certname)?,
        };
        *near = at + 1;
        self.placements.get(at)?.1.owners(scope)
    }

    /// The owners of a certname within `scope`, if any backend held it at the last refresh.
    pub fn owners(&self, certname: &str, scope: Scope) -> Option<Owners> {
        self.placement(certname)?.owners(scope)
    }

    /// Every backend holding `certname` within `scope` (configured order; empty when none).
    pub fn holders(&self, certname: &str, scope: Scope) -> &[BackendId] {
        self.placement(certname)
            .and_then(|placement| self.holders.get(placement.holders(scope)))
            .unwrap_or_default()
    }

    /// The certnames `backend` holds but another backend owns the `kind` of (under `strategy`,
    /// within `scope`): what that backend must not answer for. Only owners among `asked` count:
    /// a node whose owner this fan-out does not ask (the prober took it out) is answered by the
    /// others that hold it.
    pub fn excluded(
        &self,
        backend: BackendId,
        (strategy, kind): (MergeStrategy, Kind),
        scope: Scope,
        asked: &[BackendId],
    ) -> Vec<&str> {
        self.shared(backend, scope)
            .filter(|(_, owners)| {
                let owner = owners.under(strategy, kind);
                owner != backend && asked.contains(&owner)
            })
            .map(|(certname, _)| certname)
            .collect()
    }

    /// The certnames `backend` holds that another backend holds too (within `scope`), sorted:
    /// the only nodes whose history can be stored twice (docs/merging.md, "History counted once").
    pub fn shared_with_others(&self, backend: BackendId, scope: Scope) -> Vec<&str> {
        self.shared(backend, scope)
            .map(|(certname, _)| certname)
            .collect()
    }

    fn shared(&self, backend: BackendId, scope: Scope) -> impl Iterator<Item = (&str, Owners)> {
        self.tally(scope)
            .shared
            .get(backend.0)
            .map_or(&[][..], Vec::as_slice)
            .iter()
            .filter_map(move |position| {
                let (certname, placement) = self.placements.get(*position)?;
                Some((&**certname, placement.owners(scope)?))
            })
    }

    /// The certnames `backend` holds deactivated (or expired) that another backend holds active:
    /// nodes that moved away from it. Its own `node_state` filter on history counts them
    /// inactive, where the estate counts them active (docs/merging.md, "History counted once").
    pub fn revived(&self, backend: BackendId) -> Vec<&str> {
        self.placements
            .iter()
            .filter(|(_, placement)| {
                let in_scope = |scope| self.holders.get(placement.holders(scope));
                let (any, active) = (in_scope(Scope::Any), in_scope(Scope::Active));
                any.is_some_and(|any| any.contains(&backend))
                    && active.is_some_and(|active| !active.is_empty() && !active.contains(&backend))
            })
            .map(|(certname, _)| &**certname)
            .collect()
    }

    /// How many certnames `backend` holds within `scope`.
    pub fn held(&self, backend: BackendId, scope: Scope) -> usize {
        self.tally(scope).held.get(backend.0).copied().unwrap_or(0)
    }

    /// How many active nodes each of `backends` backends owns (their node record and latest
    /// report) under `strategy` (configured order).
    pub fn owned_counts(&self, strategy: MergeStrategy, backends: usize) -> Vec<usize> {
        let owned = match strategy {
            MergeStrategy::Freshness => &self.active.owned[0],
            MergeStrategy::Static => &self.active.owned[1],
        };
        let mut counts = owned.clone();
        counts.resize(backends, 0);
        counts
    }

    /// How many active certnames more than one backend holds.
    pub fn shared_count(&self) -> usize {
        self.active.shared_nodes
    }

    /// How many active certnames have their facts, catalog or latest report newest in different
    /// backends (a command that reached one backend and not the other).
    pub fn split_count(&self) -> usize {
        self.active.split_nodes
    }

    /// How many distinct active certnames the estate holds.
    pub fn node_count(&self) -> usize {
        self.active.nodes
    }

    /// How many distinct certnames the estate holds in any node state (a node deactivated in
    /// one backend and active in another is one of them).
    pub fn certname_count(&self) -> usize {
        self.placements.len()
    }

    /// An empty snapshot, for requests admitted before any refresh succeeded.
    pub fn empty() -> Arc<Ownership> {
        Arc::new(Ownership::default())
    }
}

/// Orders two timestamps as ownership does: null is older than any timestamp; instants compare
/// as instants; anything else (PuppetDB always writes RFC 3339) as text, older than any instant.
pub(crate) fn compare_timestamps(a: Option<&str>, b: Option<&str>) -> Ordering {
    Stamp::of(a).cmp(&Stamp::of(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nodes(rows: &[(&str, Option<&str>)]) -> Option<BackendNodes> {
        Some(
            rows.iter()
                .map(|(c, t)| ((*c).into(), Member::active(*t)))
                .collect(),
        )
    }

    const BOTH: [BackendId; 2] = [BackendId(0), BackendId(1)];

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
        let ownership = Ownership::build(&[a, b], 1);
        let (a, b) = (BackendId(0), BackendId(1));
        let owner = |c: &str| {
            ownership
                .owners(c, Scope::Active)
                .map(|o| (o.under(MergeStrategy::Freshness, Kind::Node), o.first))
        };
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
        let fresh = MergeStrategy::Freshness;
        assert_eq!(ownership.owned_counts(fresh, 2), [4, 3]);
        assert_eq!(ownership.owned_counts(MergeStrategy::Static, 2), [6, 1]);
        assert_eq!(ownership.shared_count(), 5);
        assert_eq!(ownership.node_count(), 7);
        assert_eq!(
            ownership.excluded(a, (fresh, Kind::Node), Scope::Active, &BOTH),
            ["newer-in-b", "null-in-a"]
        );
        assert_eq!(
            ownership.excluded(b, (fresh, Kind::Node), Scope::Active, &BOTH),
            ["both-null", "newer-in-a", "tie"]
        );
        assert!(ownership
            .excluded(a, (MergeStrategy::Static, Kind::Node), Scope::Active, &BOTH)
            .is_empty());
        assert_eq!(
            ownership
                .excluded(b, (MergeStrategy::Static, Kind::Node), Scope::Active, &BOTH)
                .len(),
            5
        );
        assert_eq!(ownership.node_count(), 7);
    }

    #[test]
    fn a_report_tie_goes_to_the_newer_facts_then_the_newer_catalog_then_configured_order() {
        let report = Some("2026-11-30T08:00:00.000Z");
        let member = |facts: Option<&str>, catalog: Option<&str>| {
            Member::active(report)
                .with_facts_produced(facts)
                .with_catalog_produced(catalog)
        };
        let at = |minute: u32| format!("2026-11-30T08:{minute:02}:00.000Z");
        let (m1, m2, m5) = (at(1), at(2), at(5));
        let a: BackendNodes = [
            ("facts-newer-in-b", member(Some(&m1), None)),
            ("facts-newer-in-a", member(Some(&m5), None)),
            ("facts-tie-catalog-newer-in-b", member(Some(&m1), Some(&m1))),
            ("all-tie", member(Some(&m1), Some(&m1))),
            ("facts-null-in-a", member(None, None)),
        ]
        .into_iter()
        .map(|(c, m)| (c.into(), m))
        .collect();
        let b: BackendNodes = [
            ("facts-newer-in-b", member(Some(&m2), None)),
            (
                "facts-newer-in-a",
                member(Some("2026-11-30T09:00:00.000+02:00"), None),
            ),
            ("facts-tie-catalog-newer-in-b", member(Some(&m1), Some(&m2))),
            ("all-tie", member(Some(&m1), Some(&m1))),
            (
                "facts-null-in-a",
                member(Some("2020-01-01T00:00:00.000Z"), None),
            ),
        ]
        .into_iter()
        .map(|(c, m)| (c.into(), m))
        .collect();
        let ownership = Ownership::build(&[Some(a), Some(b)], 1);
        let owner = |c: &str| {
            ownership
                .owners(c, Scope::Active)
                .map(|o| o.under(MergeStrategy::Freshness, Kind::Node))
        };
        assert_eq!(owner("facts-newer-in-b"), Some(BackendId(1)));
        assert_eq!(
            owner("facts-newer-in-a"),
            Some(BackendId(0)),
            "09:00+02:00 is 07:00Z"
        );
        assert_eq!(owner("facts-tie-catalog-newer-in-b"), Some(BackendId(1)));
        assert_eq!(owner("all-tie"), Some(BackendId(0)));
        assert_eq!(owner("facts-null-in-a"), Some(BackendId(1)));
        assert_eq!(
            ownership.holders("all-tie", Scope::Active),
            [BackendId(0), BackendId(1)]
        );
        assert_eq!(ownership.held(BackendId(1), Scope::Active), 5);
    }

    #[test]
    fn each_kind_of_data_is_owned_where_its_newest_copy_was_produced() {
        // The move: the old backend (a) processed the node's last facts after the new one (b)
        // had its newer catalog and report; a receive time would make a's copy look fresher.
        let a: BackendNodes = [(
            "moved".into(),
            Member::active(Some("2026-11-30T08:00:00.000Z"))
                .with_facts_produced(Some("2026-11-30T09:00:00.000Z"))
                .with_catalog_produced(Some("2026-11-30T07:59:00.000Z")),
        )]
        .into_iter()
        .collect();
        let b: BackendNodes = [(
            "moved".into(),
            Member::active(Some("2026-11-30T08:30:00.000Z"))
                .with_facts_produced(Some("2026-11-30T08:29:00.000Z"))
                .with_catalog_produced(Some("2026-11-30T08:29:30.000Z")),
        )]
        .into_iter()
        .collect();
        let ownership = Ownership::build(&[Some(a), Some(b)], 1);
        let owners = ownership.owners("moved", Scope::Active).expect("held");
        let fresh = MergeStrategy::Freshness;
        assert_eq!(owners.under(fresh, Kind::Node), BackendId(1));
        assert_eq!(owners.under(fresh, Kind::Facts), BackendId(0));
        assert_eq!(owners.under(fresh, Kind::Catalog), BackendId(1));
        for kind in Kind::ALL {
            assert_eq!(owners.under(MergeStrategy::Static, kind), BackendId(0));
        }
        assert_eq!(ownership.split_count(), 1);
        assert_eq!(
            ownership.excluded(BackendId(0), (fresh, Kind::Facts), Scope::Active, &BOTH),
            Vec::<&str>::new()
        );
        assert_eq!(
            ownership.excluded(BackendId(1), (fresh, Kind::Facts), Scope::Active, &BOTH),
            ["moved"]
        );
        assert_eq!(
            ownership.excluded(BackendId(0), (fresh, Kind::Catalog), Scope::Active, &BOTH),
            ["moved"]
        );
        assert_eq!(ownership.owned_counts(fresh, 2), [0, 1]);
    }

    #[test]
    fn an_owner_not_asked_excludes_nothing() {
        let ownership = Ownership::build(
            &[
                nodes(&[("n", Some("2026-11-30T08:00:00.000Z"))]),
                nodes(&[("n", Some("2026-11-30T09:00:00.000Z"))]),
            ],
            1,
        );
        let fresh = MergeStrategy::Freshness;
        assert_eq!(
            ownership.excluded(BackendId(0), (fresh, Kind::Node), Scope::Active, &BOTH),
            ["n"]
        );
        assert!(ownership
            .excluded(
                BackendId(0),
                (fresh, Kind::Node),
                Scope::Active,
                &[BackendId(0)]
            )
            .is_empty());
    }

    #[test]
    fn a_node_deactivated_in_one_backend_is_owned_where_it_is_active() {
        let mut a = nodes(&[("moved", Some("2026-11-30T08:00:00.000Z"))]).unwrap_or_default();
        if let Some(member) = a.get_mut("moved") {
            member.active = false;
        }
        let b = nodes(&[("moved", Some("2026-11-30T09:00:00.000Z"))]);
        let ownership = Ownership::build(&[Some(a), b], 1);
        let fresh = MergeStrategy::Freshness;
        assert_eq!(
            ownership.owners("moved", Scope::Active).map(|o| o.first),
            Some(BackendId(1))
        );
        assert!(
            ownership
                .excluded(BackendId(0), (fresh, Kind::Node), Scope::Active, &BOTH)
                .is_empty(),
            "a does not answer for it anyway"
        );
        assert_eq!(
            ownership.excluded(BackendId(0), (fresh, Kind::Node), Scope::Any, &BOTH),
            ["moved"]
        );
        assert_eq!(ownership.node_count(), 1);
    }

    #[test]
    fn a_backend_that_never_answered_holds_nothing() {
        let ownership = Ownership::build(&[None, nodes(&[("x", None)])], 1);
        assert_eq!(
            ownership
                .owners("x", Scope::Active)
                .map(|o| o.under(MergeStrategy::Freshness, Kind::Facts)),
            Some(BackendId(1))
        );
    }

    #[test]
    fn timestamps_order_as_instants_then_text_with_null_oldest() {
        use Ordering::{Equal, Greater, Less};
        let cases = [
            (None, None, Equal),
            (None, Some("not a time"), Less),
            (Some("2026-11-30T08:00:00.000Z"), None, Greater),
            (
                Some("2026-11-30T10:00:00.000+02:00"),
                Some("2026-11-30T08:00:00Z"),
                Equal,
            ),
            (
                Some("2026-11-30T08:00:00.001Z"),
                Some("2026-11-30T08:00:00.000Z"),
                Greater,
            ),
            (Some("garbage"), Some("2000-01-01T00:00:00Z"), Less),
            (Some("b"), Some("a"), Greater),
        ];
        for (a, b, expected) in cases {
            assert_eq!(compare_timestamps(a, b), expected, "{a:?} against {b:?}");
            assert_eq!(
                compare_timestamps(b, a),
                expected.reverse(),
                "{b:?} against {a:?}"
            );
        }
    }

    #[test]
    fn membership_bodies_in_any_order_with_escapes_and_repeats() {
        // PuppetDB sorts nothing here; a certname escaped in JSON is the same certname; a
        // certname listed twice keeps its last row, as a map would.
        let nodes = br#"[{"certname":"z","to_string":null},{"certname":"a\u002eb","to_string":"2026-11-30T08:00:00.000Z"},{"certname":"m","to_string":null},{"certname":"z","to_string":null,"expired":"2026-11-30T09:00:00.000Z"}]"#;
        let factsets = br#"[{"certname":"m","to_string":"2026-11-30T07:00:00.000Z"},{"certname":"a.b","to_string":null},{"certname":"m","to_string":"2026-11-30T07:05:00.000Z"}]"#;
        let parsed = parse_membership(nodes, factsets, b"[]").expect("parses");
        let certnames: Vec<&str> = parsed.0.iter().map(|(c, _)| &**c).collect();
        assert_eq!(certnames, ["a.b", "m", "z"]);
        assert_eq!(
            parsed.get("z").map(|m| m.active),
            Some(false),
            "the last row"
        );
        assert_eq!(
            parsed.get("a.b").map(|m| m.stamp(Kind::Node)),
            Some(Stamp::of(Some("2026-11-30T08:00:00.000Z")))
        );
        assert_eq!(
            parsed.get("a.b").map(|m| m.stamp(Kind::Facts)),
            Some(Stamp::None)
        );
        assert_eq!(
            parsed.get("m").map(|m| m.stamp(Kind::Facts)),
            Some(Stamp::of(Some("2026-11-30T07:05:00.000Z"))),
            "the last factset row"
        );
        assert!(
            parse_membership(b"[] x", b"[]", b"[]").is_none(),
            "trailing bytes"
        );
        assert!(
            parse_membership(b"[]", b"[{}]", b"[]").is_none(),
            "a row without certname"
        );
    }

    proptest::proptest! {
        /// The certname index finds every certname the backends hold, with exactly its
        /// holders, and no other name.
        #[test]
        fn every_certname_held_is_found_with_its_holders_and_no_other(
            held in proptest::collection::vec((0..300usize, 0..3usize), 0..400),
        ) {
            let name = |n: usize| format!("node-{n:03}.example");
            let parts: Vec<Option<BackendNodes>> = (0..3)
                .map(|backend| {
                    Some(
                        held.iter()
                            .filter(|(_, b)| *b == backend)
                            .map(|(n, _)| (name(*n).into(), Member::ran_at("2026-11-30T01:00:00Z")))
                            .collect(),
                    )
                })
                .collect();
            let ownership = Ownership::build(&parts, 1);
            for n in 0..320 {
                let expected: Vec<BackendId> = (0..3)
                    .filter(|b| held.contains(&(n, *b)))
                    .map(BackendId)
                    .collect();
                proptest::prop_assert_eq!(ownership.holders(&name(n), Scope::Any), &expected[..]);
                proptest::prop_assert_eq!(
                    ownership.owners(&name(n), Scope::Any).is_some(),
                    !expected.is_empty()
                );
            }
        }

        /// Looked up near the last one found, each certname has the owners the index gives it,
        /// whatever order they are asked in (ascending as a backend's records come, runs of
        /// them, out of order, or not held at all).
        #[test]
        fn owners_found_near_the_last_are_the_owners(
            held in proptest::collection::vec((0..200usize, 0..3usize), 0..300),
            asked in proptest::collection::vec(0..220usize, 0..300),
            sorted in proptest::bool::ANY,
        ) {
            let name = |n: usize| format!("node-{n:03}.example");
            let at = |n: usize| format!("2026-11-30T{:02}:00:00Z", n % 24);
            let parts: Vec<Option<BackendNodes>> = (0..3)
                .map(|backend| {
                    Some(
                        held.iter()
                            .filter(|(_, b)| *b == backend)
                            .map(|(n, _)| (name(*n).into(), Member::ran_at(&at(n + backend))))
                            .collect(),
                    )
                })
                .collect();
            let ownership = Ownership::build(&parts, 1);
            let mut asked = asked;
            if sorted {
                asked.sort_unstable();
            }
            for scope in [Scope::Any, Scope::Active] {
                let mut near = 0;
                for n in &asked {
                    let owners = |o: Option<Owners>| o.map(|o| o.under(MergeStrategy::Freshness, Kind::Facts));
                    proptest::prop_assert_eq!(
                        owners(ownership.owners_near(&name(*n), scope, &mut near)),
                        owners(ownership.owners(&name(*n), scope))
                    );
                }
            }
        }
    }

    #[test]
    fn a_snapshot_over_four_backends_places_every_certname_once() {
        let at = |hour: u32| format!("2026-11-30T{hour:02}:00:00.000Z");
        let part = |rows: &[(&str, u32, bool)]| -> Option<BackendNodes> {
            Some(
                rows.iter()
                    .map(|(c, hour, active)| {
                        let member = Member {
                            active: *active,
                            ..Member::ran_at(&at(*hour))
                        };
                        ((*c).into(), member)
                    })
                    .collect(),
            )
        };
        let ownership = Ownership::build(
            &[
                part(&[("a", 1, true), ("c", 5, false), ("e", 1, true)]),
                None,
                part(&[("b", 1, true), ("c", 3, true), ("e", 2, true)]),
                part(&[("c", 4, true), ("d", 1, false), ("e", 2, true)]),
            ],
            7,
        );
        let (b0, b2, b3) = (BackendId(0), BackendId(2), BackendId(3));
        assert_eq!(ownership.certname_count(), 5);
        assert_eq!(ownership.node_count(), 4, "d is active nowhere");
        assert_eq!(ownership.holders("c", Scope::Any), [b0, b2, b3]);
        assert_eq!(ownership.holders("c", Scope::Active), [b2, b3]);
        assert_eq!(ownership.holders("d", Scope::Active), [] as [BackendId; 0]);
        assert_eq!(
            ownership.holders("nowhere", Scope::Any),
            [] as [BackendId; 0]
        );
        let fresh = MergeStrategy::Freshness;
        let owner = |c: &str, scope| {
            ownership
                .owners(c, scope)
                .map(|o| o.under(fresh, Kind::Node))
        };
        assert_eq!(owner("c", Scope::Any), Some(b0), "05:00, deactivated there");
        assert_eq!(owner("c", Scope::Active), Some(b3));
        assert_eq!(owner("d", Scope::Active), None);
        assert_eq!(owner("d", Scope::Any), Some(b3));
        assert_eq!(
            owner("e", Scope::Active),
            Some(b2),
            "a tie goes to configured order"
        );
        assert_eq!(ownership.revived(b0), ["c"]);
        assert_eq!(ownership.shared_with_others(b2, Scope::Active), ["c", "e"]);
        assert_eq!(ownership.shared_with_others(b0, Scope::Active), ["e"]);
        assert_eq!(ownership.shared_with_others(b0, Scope::Any), ["c", "e"]);
        assert_eq!(
            ownership.excluded(b3, (fresh, Kind::Facts), Scope::Active, &[b0, b2, b3]),
            ["e"]
        );
        assert_eq!(ownership.held(b3, Scope::Any), 3);
        assert_eq!(ownership.held(b3, Scope::Active), 2);
        assert_eq!(ownership.owned_counts(fresh, 4), [1, 0, 2, 1]);
        assert_eq!(
            ownership.owned_counts(MergeStrategy::Static, 4),
            [2, 0, 2, 0]
        );
        assert_eq!(ownership.shared_count(), 2);
        assert_eq!(ownership.generation(), 7);
    }

    #[test]
    fn each_query_asks_postgresql_to_write_its_times() {
        let asked = |path_and_query: &str| -> (String, serde_json::Value) {
            let (path, query) = path_and_query.split_once('?').expect("a query string");
            let (key, value) = form_urlencoded::parse(query.as_bytes())
                .next()
                .expect("one parameter");
            assert_eq!(key, "query");
            (path.to_owned(), serde_json::from_str(&value).expect("JSON"))
        };
        let time = |field: &str| serde_json::json!(["function", TIME_KEY, field, TIME_FORMAT]);
        let every_state = serde_json::json!(["=", "node_state", "any"]);
        assert_eq!(
            asked(MEMBERSHIP_QUERY),
            (
                "/pdb/query/v4/nodes".to_owned(),
                serde_json::json!([
                    "extract",
                    [
                        "certname",
                        time("report_timestamp"),
                        "deactivated",
                        "expired"
                    ],
                    every_state
                ])
            )
        );
        assert_eq!(
            asked(FACTS_PRODUCED_QUERY),
            (
                "/pdb/query/v4/factsets".to_owned(),
                serde_json::json!([
                    "extract",
                    ["certname", time("producer_timestamp")],
                    every_state
                ])
            )
        );
        assert_eq!(
            asked(CATALOGS_PRODUCED_QUERY),
            (
                "/pdb/query/v4/catalogs".to_owned(),
                serde_json::json!(["extract", ["certname", time("producer_timestamp")]])
            )
        );
    }

    #[test]
    fn a_time_that_is_not_an_instant_is_held_as_text_older_than_any_instant() {
        let text = Member::active(Some("b, not a time"));
        let older_text = Member::active(Some("a, not a time"));
        let instant = Member::active(Some("2000-01-01T00:00:00Z"));
        let none = Member::active(None);
        assert!(instant.is_newer_than(&text, Kind::Node));
        assert!(text.is_newer_than(&older_text, Kind::Node));
        assert!(text.is_newer_than(&none, Kind::Node));
        assert!(!text.is_newer_than(&text.clone(), Kind::Node));
        assert_eq!(text.stamp(Kind::Node), Stamp::Text("b, not a time"));
        // Its text let go once an instant replaces it: equal to the member made with the instant.
        let replaced = Member::active(Some("b, not a time"))
            .with_facts_produced(Some("c"))
            .with_facts_produced(Some("2000-01-01T00:00:00Z"));
        assert!(replaced.texts.is_some(), "the report's text stays");
        let mut replaced = replaced;
        replaced.set(Kind::Node, Some("2000-01-01T00:00:00Z"));
        let direct = instant.with_facts_produced(Some("2000-01-01T00:00:00Z"));
        assert_eq!(replaced, direct);
        assert!(replaced.texts.is_none());
    }

    #[test]
    fn times_as_postgresql_writes_them_compare_as_instants() {
        // `to_char` with TIME_FORMAT in a server whose time zone is not UTC: the same instant as
        // PuppetDB's own `…Z` form, and a microsecond later is newer.
        let nodes = br#"[{"certname":"a","to_string":"2026-11-30T10:00:00.000000+02","deactivated":null,"expired":null}]"#;
        let factsets = br#"[{"certname":"a","to_string":"2026-11-30T02:30:00.000001-05:30"}]"#;
        let parsed = parse_membership(nodes, factsets, b"[]").expect("parses");
        let a = parsed.get("a").expect("a");
        let at = |t: &'static str| Stamp::of(Some(t));
        assert_eq!(a.stamp(Kind::Node), at("2026-11-30T08:00:00.000Z"));
        assert!(a.stamp(Kind::Facts) > at("2026-11-30T08:00:00.000Z"));
        assert!(a.stamp(Kind::Facts) < at("2026-11-30T08:00:00.001Z"));
    }

    #[test]
    fn membership_bodies() {
        let nodes = br#"[{"certname":"a","to_string":null,"deactivated":null,"expired":null},{"certname":"b","to_string":"2026-11-30T08:00:00.000Z","deactivated":"2026-11-30T09:00:00.000Z"}]"#;
        let factsets = br#"[{"certname":"a","to_string":"2026-11-30T07:00:00.000Z"},{"certname":"gone","to_string":"2026-11-30T07:00:00.000Z"}]"#;
        let catalogs = br#"[{"certname":"b","to_string":"2026-11-30T07:30:00.000Z"}]"#;
        let parsed = parse_membership(nodes, factsets, catalogs).expect("parses");
        assert_eq!(parsed.get("a").map(|m| m.active), Some(true));
        assert_eq!(parsed.get("b").map(|m| m.active), Some(false));
        let at = |t: &'static str| Some(Stamp::of(Some(t)));
        let (a, b) = (parsed.get("a"), parsed.get("b"));
        fn stamp(member: Option<&Member>, kind: Kind) -> Option<Stamp<'_>> {
            member.map(|member| member.stamp(kind))
        }
        assert_eq!(stamp(a, Kind::Facts), at("2026-11-30T07:00:00.000Z"));
        assert_eq!(stamp(a, Kind::Catalog), Some(Stamp::None));
        assert_eq!(stamp(b, Kind::Catalog), at("2026-11-30T07:30:00.000Z"));
        assert_eq!(stamp(b, Kind::Node), at("2026-11-30T08:00:00.000Z"));
        assert!(
            parsed.get("gone").is_none(),
            "a factset without a node is not a node"
        );
        assert!(parse_membership(b"[{\"certname\":1}]", b"[]", b"[]").is_none());
        assert!(parse_membership(b"[", b"[]", b"[]").is_none());
        assert!(parse_membership(b"[]", b"{}", b"[]").is_none());
    }
}
