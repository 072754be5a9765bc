//! What a merged `/nodes` record is made of, for the buffered merge (`merge/nodes.rs`) and the
//! streamed one (`streamed/nodes.rs`) alike (docs/merging.md, "Who owns a node"): the key naming
//! the backend it came from, the fields a split node takes from its facts' and catalog's owners,
//! and how two copies of a node the map does not place compare.

use std::cmp::Ordering;

use crate::config::BackendConfig;
use crate::ids::BackendId;
use crate::membership::{compare_timestamps, Kind};
use crate::ownership::Owning;
use crate::records::{entry_text, with_key};
use crate::status::backend_name;

/// The key naming the winning backend on each merged node record.
pub(crate) const SOURCE_KEY: &str = "pdbmux_source";

/// The fields of a node record that come from another kind of data than its latest report:
/// its facts' and its catalog's.
pub(crate) const COMPOSED: [(Kind, [&str; 2]); 2] = [
    (Kind::Facts, ["facts_timestamp", "facts_environment"]),
    (Kind::Catalog, ["catalog_timestamp", "catalog_environment"]),
];

/// `record` with [`SOURCE_KEY`] naming `backend` by its name among `backends`.
pub(crate) fn stamped(record: &str, backends: &[BackendConfig], backend: BackendId) -> String {
    with_key(record, SOURCE_KEY, backend_name(backends, backend))
}

/// The entry [`stamped`] appends for `backend`, as text: for a merge that appends it to many
/// records as it writes them.
pub(crate) fn source_entry(backends: &[BackendConfig], backend: BackendId) -> String {
    entry_text(SOURCE_KEY, backend_name(backends, backend))
}

/// The asked backend owning `certname`'s record (its node owner), and the other asked backends,
/// in [`COMPOSED`]'s order, owning its facts and its catalog: a split node has one of these,
/// whose fields its record takes.
pub(crate) fn composed_sources(
    owning: &Owning<'_>,
    certname: &str,
) -> (Option<BackendId>, [Option<BackendId>; 2]) {
    let owner = owning.kind_owner(certname, Kind::Node);
    let sources = COMPOSED.map(|(kind, _)| {
        owning
            .kind_owner(certname, kind)
            .filter(|source| Some(*source) != owner)
    });
    (owner, sources)
}

/// How two node records of a node the map does not place compare by their raw
/// `report_timestamp` (JSON text: a string or `null`): the greater is kept, a tie goes to the
/// earlier backend in configured order.
pub(crate) fn compare_reports(report: Option<&str>, other: Option<&str>) -> Ordering {
    compare_timestamps(json_str(report), json_str(other))
}

/// A raw JSON timestamp (`"…"` or `null`) as text; `None` for null or anything else.
fn json_str(raw: Option<&str>) -> Option<&str> {
    raw.and_then(|raw| raw.strip_prefix('"')?.strip_suffix('"'))
}
