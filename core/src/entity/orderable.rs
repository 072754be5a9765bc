//! The entity table's `order` column: each entity's columns an `order_by` may name and how each
//! compares, in the order PuppetDB 7.12.1 lists them in "Supported columns are ..." (its
//! `orderable-columns`: the entity's queryable projections in its projection map's order; for the
//! event counts, `event-counts-columns`). Error messages quote these lists as they stand.

use super::ColumnKind::{
    Boolean, EncodedPath, JsonText, Jsonb, Number, Other, PathArray, Text, TextArray, Timestamp,
};
use super::{Column, ColumnSet, SummarizeBy};

/// `/nodes`; `include_facts_expiration=true` adds `expires_facts` and `expires_facts_updated`.
pub(super) const NODES: &[Column] = &[
    Column::new("latest_report_corrective_change", Boolean),
    Column::new("deactivated", Timestamp),
    Column::new("expired", Timestamp),
    Column::new("report_environment", Text),
    Column::new("certname", Text),
    Column::new("expires_facts", Boolean).only_in(ColumnSet::FactsExpiration),
    Column::new("facts_timestamp", Timestamp),
    Column::new("facts_environment", Text),
    Column::new("cached_catalog_status", Text),
    Column::new("latest_report_status", Text),
    Column::new("latest_report_hash", Text),
    Column::new("catalog_timestamp", Timestamp),
    Column::new("latest_report_noop_pending", Boolean),
    Column::new("report_timestamp", Timestamp),
    Column::new("latest_report_noop", Boolean),
    Column::new("expires_facts_updated", Timestamp).only_in(ColumnSet::FactsExpiration),
    Column::new("catalog_environment", Text),
    Column::new("latest_report_job_id", Text),
];

/// `/facts`, `/facts/<name>`, `/facts/<name>/<value>`.
pub(super) const FACTS: &[Column] = &[
    Column::new("certname", Text),
    Column::new("environment", Text),
    Column::new("name", Text),
    Column::new("value", Jsonb),
];

/// `/fact-names`, `/environments`, `/producers`.
pub(super) const NAME_ONLY: &[Column] = &[Column::new("name", Text)];

/// `/reports`.
pub(super) const REPORTS: &[Column] = &[
    Column::new("receive_time", Timestamp),
    Column::new("corrective_change", Boolean),
    Column::new("code_id", Text),
    Column::new("noop", Boolean),
    Column::new("certname", Text),
    Column::new("puppet_version", Text),
    Column::new("hash", Text),
    Column::new("cached_catalog_status", Text),
    Column::new("transaction_uuid", Text),
    Column::new("configuration_version", Text),
    Column::new("status", Text),
    Column::new("job_id", Text),
    Column::new("producer", Text),
    Column::new("catalog_uuid", Text),
    Column::new("noop_pending", Boolean),
    Column::new("end_time", Timestamp),
    Column::new("type", Text),
    Column::new("environment", Text),
    Column::new("latest_report?", Boolean),
    Column::new("start_time", Timestamp),
    Column::new("producer_timestamp", Timestamp),
    Column::new("report_format", Number),
];

/// `/events` (without `distinct_resources`, which PuppetDB checks against another list).
pub(super) const EVENTS: &[Column] = &[
    Column::new("message", Text),
    Column::new("old_value", JsonText),
    Column::new("report_receive_time", Timestamp),
    Column::new("corrective_change", Boolean),
    Column::new("containment_path", TextArray),
    Column::new("certname", Text),
    Column::new("timestamp", Timestamp),
    Column::new("run_end_time", Timestamp),
    Column::new("name", Text),
    Column::new("configuration_version", Text),
    Column::new("new_value", JsonText),
    Column::new("resource_title", Text),
    Column::new("status", Text),
    Column::new("property", Text),
    Column::new("resource_type", Text),
    Column::new("line", Number),
    Column::new("environment", Text),
    Column::new("containing_class", Text),
    Column::new("run_start_time", Timestamp),
    Column::new("latest_report?", Boolean),
    Column::new("file", Text),
    Column::new("report", Text),
];

/// `/event-counts`: the four counts, then the columns of the request's `summarize_by`. Rows carry
/// those in `subject` (`title`, or `type` and `title`), so the record lookup maps them.
pub(super) const EVENT_COUNTS: &[Column] = &[
    Column::new("failures", Number),
    Column::new("skips", Number),
    Column::new("successes", Number),
    Column::new("noops", Number),
    Column::new("certname", Text).only_in(ColumnSet::SummarizedBy(SummarizeBy::Certname)),
    Column::new("resource_type", Text).only_in(ColumnSet::SummarizedBy(SummarizeBy::Resource)),
    Column::new("resource_title", Text).only_in(ColumnSet::SummarizedBy(SummarizeBy::Resource)),
    Column::new("containing_class", Text)
        .only_in(ColumnSet::SummarizedBy(SummarizeBy::ContainingClass)),
];

/// `/resources`.
pub(super) const RESOURCES: &[Column] = &[
    Column::new("resource", Text),
    Column::new("certname", Text),
    Column::new("tags", TextArray),
    Column::new("tag", Other),
    Column::new("exported", Boolean),
    Column::new("line", Number),
    Column::new("title", Text),
    Column::new("type", Text),
    Column::new("environment", Text),
    Column::new("file", Text),
    Column::new("parameters", Jsonb),
];

/// `/catalogs`.
pub(super) const CATALOGS: &[Column] = &[
    Column::new("code_id", Text),
    Column::new("certname", Text),
    Column::new("hash", Text),
    Column::new("transaction_uuid", Text),
    Column::new("job_id", Text),
    Column::new("producer", Text),
    Column::new("catalog_uuid", Text),
    Column::new("environment", Text),
    Column::new("version", Text),
    Column::new("producer_timestamp", Timestamp),
];

/// `/catalog-inputs`.
pub(super) const CATALOG_INPUTS: &[Column] = &[
    Column::new("certname", Text),
    Column::new("producer_timestamp", Timestamp),
    Column::new("catalog_uuid", Text),
    Column::new("inputs", TextArray),
];

/// `/catalog-input-contents`.
pub(super) const CATALOG_INPUT_CONTENTS: &[Column] = &[
    Column::new("certname", Text),
    Column::new("producer_timestamp", Timestamp),
    Column::new("catalog_uuid", Text),
    Column::new("name", Text),
    Column::new("type", Text),
];

/// `/factsets` (`facts` is the stored jsonb map, not the expanded `{href, data}`).
pub(super) const FACTSETS: &[Column] = &[
    Column::new("timestamp", Timestamp),
    Column::new("facts", Jsonb),
    Column::new("certname", Text),
    Column::new("hash", Text),
    Column::new("producer_timestamp", Timestamp),
    Column::new("producer", Text),
    Column::new("environment", Text),
];

/// `/inventory`.
pub(super) const INVENTORY: &[Column] = &[
    Column::new("certname", Text),
    Column::new("timestamp", Timestamp),
    Column::new("environment", Text),
    Column::new("facts", Jsonb),
    Column::new("trusted", Jsonb),
];

/// `/fact-contents`.
pub(super) const FACT_CONTENTS: &[Column] = &[
    Column::new("certname", Text),
    Column::new("environment", Text),
    Column::new("path", PathArray),
    Column::new("name", Text),
    Column::new("value", Jsonb),
];

/// `/fact-paths` (`depth` orders but is not projected: the path's length less one, see the
/// row's `depth_from_path`).
pub(super) const FACT_PATHS: &[Column] = &[
    Column::new("type", Text),
    Column::new("path", EncodedPath),
    Column::new("name", Text),
    Column::new("depth", Number),
];

/// `/edges`.
pub(super) const EDGES: &[Column] = &[
    Column::new("certname", Text),
    Column::new("relationship", Text),
    Column::new("source_title", Text),
    Column::new("source_type", Text),
    Column::new("target_title", Text),
    Column::new("target_type", Text),
];

/// `/packages`.
pub(super) const PACKAGES: &[Column] = &[
    Column::new("package_name", Text),
    Column::new("version", Text),
    Column::new("provider", Text),
];

/// `/package-inventory`.
pub(super) const PACKAGE_INVENTORY: &[Column] = &[
    Column::new("certname", Text),
    Column::new("package_name", Text),
    Column::new("version", Text),
    Column::new("provider", Text),
];
