//! Test vectors for the provenance gates and the other [`Analysis`] flags: Puppetboard's real
//! query shapes (the data requests of the pages `e2e/puppetboard/test_puppetboard.py` loads
//! through a real Puppetboard 7) and the edge cases around subqueries.

use serde_json::{json, Value};

use super::{analyze, Analysis};

/// The expected flags of one test vector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Flags {
    extract: bool,
    name: bool,
    latest: bool,
    paging: bool,
    aggregate: bool,
}

const NONE: Flags = Flags {
    extract: false,
    name: false,
    latest: false,
    paging: false,
    aggregate: false,
};
const EXTRACT: Flags = Flags {
    extract: true,
    ..NONE
};
const AGGREGATE: Flags = Flags {
    extract: true,
    aggregate: true,
    ..NONE
};
const NAME: Flags = Flags { name: true, ..NONE };
const LATEST: Flags = Flags {
    latest: true,
    ..NONE
};

fn flags(analysis: &Analysis) -> Flags {
    Flags {
        extract: analysis.extract_outside_subquery,
        name: analysis.outer_name_constraint,
        latest: analysis.uses_latest_report,
        paging: analysis.in_query_paging,
        aggregate: analysis.is_aggregate(),
    }
}

/// Test vectors for every gate: (what it is, the AST, the expected flags).
fn vectors() -> Vec<(&'static str, Value, Flags)> {
    vec![
        // Puppetboard's shapes, as its pages ask them (e2e/puppetboard/).
        (
            "overview node count",
            json!([
                "extract",
                [["function", "count"]],
                ["and", ["=", "catalog_environment", "production"]]
            ]),
            AGGREGATE,
        ),
        (
            "overview resource count",
            json!([
                "extract",
                [["function", "count"]],
                ["=", "environment", "production"]
            ]),
            AGGREGATE,
        ),
        (
            "single-child and",
            json!(["and", ["=", "catalog_environment", "production"]]),
            NONE,
        ),
        (
            "event-counts latest report",
            json!(["=", "latest_report?", true]),
            LATEST,
        ),
        (
            "unreported nodes: null? with a boolean",
            json!([
                "and",
                ["=", "catalog_environment", "production"],
                [
                    "or",
                    ["null?", "report_timestamp", true],
                    ["<=", "report_timestamp", "2026-11-30T07:04:00"]
                ]
            ]),
            NONE,
        ),
        (
            "node facts",
            json!([
                "and",
                ["=", "certname", "web1"],
                ["=", "environment", "production"]
            ]),
            NONE,
        ),
        (
            "all facts of an environment",
            json!(["and", ["=", "environment", "production"]]),
            NONE,
        ),
        (
            "fact value drilldown",
            json!([
                "and",
                ["=", "environment", "production"],
                ["=", "value", "Debian"]
            ]),
            NONE,
        ),
        (
            "fact children",
            json!([
                "and",
                ["=", "environment", "production"],
                ["=", "name", "os"]
            ]),
            NAME,
        ),
        (
            "inventory: name under or under and",
            json!([
                "and",
                [
                    "or",
                    ["=", "name", "os"],
                    ["=", "name", "kernelrelease"],
                    ["=", "name", "networking"],
                    ["=", "name", "puppetversion"],
                    ["=", "name", "trusted"]
                ],
                ["=", "environment", "production"]
            ]),
            NAME,
        ),
        (
            "report by hash or configuration version",
            json!([
                "and",
                ["=", "environment", "production"],
                ["=", "certname", "web1"],
                [
                    "or",
                    ["=", "hash", "abc"],
                    ["=", "configuration_version", "abc"]
                ]
            ]),
            NONE,
        ),
        ("events of a report", json!(["=", "report", "abc"]), NONE),
        (
            "catalogs: null? false",
            json!([
                "and",
                ["=", "catalog_environment", "production"],
                ["null?", "catalog_timestamp", false]
            ]),
            NONE,
        ),
        (
            "classes: null? deactivated",
            json!([
                "and",
                ["=", "report_environment", "production"],
                ["null?", "deactivated", true]
            ]),
            NONE,
        ),
        (
            "class resource: in/from/extract subquery",
            json!([
                "in",
                "certname",
                [
                    "from",
                    "resources",
                    [
                        "extract",
                        ["certname"],
                        [
                            "and",
                            ["=", "type", "Class"],
                            ["=", "title", "Main"],
                            ["=", "environment", "production"]
                        ]
                    ]
                ]
            ]),
            NONE,
        ),
        (
            "daily chart: count + status, group_by status",
            json!([
                "extract",
                [["function", "count"], "status"],
                [
                    "and",
                    [">=", "producer_timestamp", "2026-11-23T00:00:00.000000Z"],
                    ["<", "producer_timestamp", "2026-11-24T00:00:00.000000Z"],
                    ["=", "certname", "web1"],
                    ["=", "environment", "production"]
                ],
                ["group_by", "status"]
            ]),
            AGGREGATE,
        ),
        // Subqueries never gate.
        (
            "name filter inside select_facts",
            json!([
                "in",
                "certname",
                ["extract", "certname", ["select_facts", ["=", "name", "x"]]]
            ]),
            NONE,
        ),
        (
            "implicit subquery",
            json!([
                "subquery",
                "fact_contents",
                ["and", ["=", "name", "os"], ["extract", "certname"]]
            ]),
            NONE,
        ),
        (
            "name in an in/from subquery beside an outer name filter",
            json!([
                "and",
                [
                    "in",
                    "certname",
                    ["from", "facts", ["extract", "certname", ["=", "name", "x"]]]
                ],
                ["null?", "name", false]
            ]),
            NAME,
        ),
        // Name constraints.
        (
            "in array on name",
            json!(["in", "name", ["array", ["os", "kernel"]]]),
            NAME,
        ),
        (
            "regexp under not",
            json!(["not", ["~", "name", "^os"]]),
            NAME,
        ),
        (
            "comparison under or/and/not",
            json!([
                "or",
                ["=", "certname", "a"],
                ["and", ["not", [">=", "name", "m"]]]
            ]),
            NAME,
        ),
        (
            "multi-column in naming name",
            json!([
                "in",
                ["certname", "name"],
                [
                    "extract",
                    ["certname", "name"],
                    ["select_fact_contents", ["=", "path", ["os", "family"]]]
                ]
            ]),
            NAME,
        ),
        (
            "name only as a value",
            json!(["=", "certname", "name"]),
            NONE,
        ),
        (
            "fact path regexp on name",
            json!(["~>", "name", ["os", ".*"]]),
            NAME,
        ),
        // Extracts outside subqueries.
        (
            "projection filtering on name",
            json!([
                "extract",
                ["certname", "value"],
                ["=", "name", "pdbmux_source"]
            ]),
            Flags {
                extract: true,
                name: true,
                ..NONE
            },
        ),
        (
            "extract under not",
            json!(["not", ["extract", "certname", ["=", "certname", "a"]]]),
            EXTRACT,
        ),
        (
            "extract with group_by and no filter",
            json!(["extract", "certname", ["group_by", "certname"]]),
            EXTRACT,
        ),
        (
            "row functions only",
            json!([
                "extract",
                [["function", "to_string", "receive_time", "FMDay"], "status"],
                [
                    "group_by",
                    "status",
                    ["function", "to_string", "receive_time", "FMDay"]
                ]
            ]),
            EXTRACT,
        ),
        (
            "top-level from on the root endpoint",
            json!([
                "from",
                "facts",
                ["extract", [["function", "count"]], ["=", "name", "os"]]
            ]),
            Flags {
                name: true,
                ..AGGREGATE
            },
        ),
        // latest_report? counts everywhere.
        (
            "latest_report? inside a subquery",
            json!([
                "in",
                "certname",
                [
                    "from",
                    "reports",
                    ["extract", "certname", ["=", "latest_report?", true]]
                ]
            ]),
            LATEST,
        ),
        (
            "latest_report? as a value is not a use",
            json!(["=", "name", "latest_report?"]),
            NAME,
        ),
        // In-query paging.
        (
            "paging in a top-level from",
            json!([
                "from",
                "nodes",
                ["=", "certname", "a"],
                ["order_by", ["certname"]],
                ["limit", 10],
                ["offset", 5]
            ]),
            Flags {
                paging: true,
                ..NONE
            },
        ),
        (
            "paging straight after the entity",
            json!(["from", "reports", ["limit", 1]]),
            Flags {
                paging: true,
                ..NONE
            },
        ),
        (
            "paging inside a subquery is not top-level paging",
            json!([
                "in",
                "certname",
                ["from", "nodes", ["extract", "certname"], ["limit", 1]]
            ]),
            NONE,
        ),
        // Odd shapes never panic.
        ("empty array", json!([]), NONE),
        ("bare extract", json!(["extract"]), EXTRACT),
        ("non-string operator", json!([1, "name", 2]), NONE),
    ]
}

#[test]
fn gate_vectors() {
    let vectors = vectors();
    assert!(vectors.len() >= 25);
    for (what, ast, expected) in vectors {
        assert_eq!(flags(&analyze(&ast)), expected, "{what}: {ast}");
    }
}
