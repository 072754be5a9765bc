//! Differential comparison: one question asked of pdbmux and of a PuppetDB that was sent every
//! command the backends were sent, and whether the answers are equal less each server's own
//! receipt times (`timestamp` of factsets and inventory, `facts_timestamp`, `catalog_timestamp`,
//! `receive_time`, `report_receive_time`) and pdbmux's documented additions (`pdbmux_source`).
//! Used by the fixture's union suite (tests/union.rs) and the history suite
//! (tests/histories.rs).

use serde_json::{json, Value};

use crate::{Backend, Error, Pdbmux, Response};

/// The fields each PuppetDB stamps itself on receipt, on every entity.
pub const RECEIPT_TIMES: [&str; 4] = [
    "facts_timestamp",
    "catalog_timestamp",
    "receive_time",
    "report_receive_time",
];

/// The name of pdbmux's provenance fact and `/nodes` key.
pub const SOURCE: &str = "pdbmux_source";

/// How two answers are compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compare {
    /// As multisets: the request does not order.
    Set,
    /// In order: the request orders by a key unique to each record.
    Sequence,
}

/// One question asked of pdbmux and the union.
#[derive(Debug, Clone)]
pub struct Question {
    /// The route asked.
    pub path: String,
    /// Its parameters, form-encoded when sent.
    pub params: Vec<(String, String)>,
    /// How the answers are compared.
    pub compare: Compare,
    /// The entity route whose records the answer holds (the root endpoint answers any entity's).
    pub entity_path: String,
}

impl Question {
    /// A question on `path`, compared in order when it names `order_by`.
    pub fn new(path: &str, params: &[(&str, String)]) -> Question {
        let compare = if params.iter().any(|(k, _)| *k == "order_by") {
            Compare::Sequence
        } else {
            Compare::Set
        };
        Question {
            path: path.to_owned(),
            params: params
                .iter()
                .map(|(k, v)| ((*k).to_owned(), v.clone()))
                .collect(),
            compare,
            entity_path: path.to_owned(),
        }
    }

    /// A root-endpoint question (PQL or a `from` AST) on `entity`'s records.
    pub fn root(entity: &str, query: String, extra: &[(&str, &str)], compare: Compare) -> Question {
        let mut params = vec![("query".to_owned(), query)];
        params.extend(
            extra
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
        );
        Question {
            path: "/pdb/query/v4".to_owned(),
            params,
            compare,
            entity_path: format!("/pdb/query/v4/{entity}"),
        }
    }

    /// The parameters as pairs of strings, as the HTTP helpers take them.
    pub fn pairs(&self) -> Vec<(&str, &str)> {
        self.params
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect()
    }
}

impl std::fmt::Display for Question {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {:?}", self.path, self.params)
    }
}

/// A record or value with the receipt times and pdbmux's additions removed, expanded
/// sub-collections in one order, and fractional numbers to 12 significant digits: an `avg`
/// pdbmux folds is a float64 division of sums and counts, PostgreSQL's a numeric one, and they
/// part in the last digits (docs/merging.md, "Aggregates"). `timestamp` is a receipt time on
/// factsets and inventory only (an event's is when it happened).
pub fn normalise(path: &str, value: &Value) -> Value {
    let receipt_timestamp = path.contains("/factsets") || path.contains("/inventory");
    match value {
        Value::Object(map) => Value::Object(
            map.iter()
                .filter(|(k, _)| {
                    !RECEIPT_TIMES.contains(&k.as_str())
                        && k.as_str() != SOURCE
                        && !(receipt_timestamp && k.as_str() == "timestamp")
                })
                .map(|(k, v)| match (k.as_str(), normalise(path, v)) {
                    // An expanded sub-collection (a catalog's resources and edges, a factset's
                    // facts) and a catalog's inputs (an `array_agg` without an order) are sets:
                    // each PuppetDB lists them in its own storage order.
                    ("data" | "inputs", Value::Array(mut items)) => {
                        items.sort_by_cached_key(Value::to_string);
                        (k.clone(), Value::Array(items))
                    }
                    (_, v) => (k.clone(), v),
                })
                .collect(),
        ),
        Value::Array(items) => Value::Array(
            items
                .iter()
                .filter(|item| {
                    // The synthetic provenance fact, and its name on /fact-names.
                    item.as_str() != Some(SOURCE) && item.get("name") != Some(&json!(SOURCE))
                })
                .map(|item| normalise(path, item))
                .collect(),
        ),
        Value::Number(n) if n.is_f64() => n
            .as_f64()
            .and_then(|f| format!("{f:.11e}").parse::<f64>().ok())
            .map_or_else(|| value.clone(), |f| json!(f)),
        other => other.clone(),
    }
}

/// Records as sorted canonical JSON texts: compares two answers as multisets.
pub fn multiset(records: &[Value]) -> Vec<String> {
    // serde_json's maps are sorted by key here (no preserve_order): to_string is canonical.
    let mut texts: Vec<String> = records.iter().map(Value::to_string).collect();
    texts.sort();
    texts
}

/// A response's `X-Records` total, if it sent one.
pub fn x_records(r: &Response) -> Option<u64> {
    r.header("x-records").and_then(|v| v.trim().parse().ok())
}

/// Asks every question of pdbmux and the union; the mismatches, one line each (with a minimal
/// diff of the records: what only one side holds).
pub fn mismatches(
    p: &Pdbmux,
    union: &Backend,
    questions: &[Question],
) -> Result<Vec<String>, Error> {
    let mut out = Vec::new();
    for question in questions {
        let pairs = question.pairs();
        let got = p.get_query(&question.path, &pairs)?;
        let want = union.get_query(&question.path, &pairs)?;
        if let Some(problem) = compare(question, &got, &want) {
            out.push(format!("{question}: {problem}"));
        }
    }
    Ok(out)
}

/// Why pdbmux's answer `got` differs from the union's `want`, if it does.
pub fn compare(question: &Question, got: &Response, want: &Response) -> Option<String> {
    if got.status != want.status {
        return Some(format!(
            "status {} (the union {}): {}",
            got.status,
            want.status,
            got.body.trim()
        ));
    }
    if want.status != 200 {
        return (got.body.trim() != want.body.trim())
            .then(|| format!("the refusal {:?}, the union's {:?}", got.body, want.body));
    }
    let (Ok(got_body), Ok(want_body)) = (got.json(), want.json()) else {
        return Some("a body is not JSON".to_owned());
    };
    // Only /facts adds records of its own: elsewhere the provenance fact is a name or a path
    // the union holds too (the fixture forges an upstream `pdbmux_source` fact).
    let synthetic = match question.entity_path.ends_with("/facts") {
        true => count_synthetic(&got_body),
        false => 0,
    };
    let (got_body, want_body) = (
        normalise(&question.entity_path, &got_body),
        normalise(&question.entity_path, &want_body),
    );
    let same = match (question.compare, &got_body, &want_body) {
        (Compare::Set, Value::Array(a), Value::Array(b)) => multiset(a) == multiset(b),
        _ => got_body == want_body,
    };
    if !same {
        return Some(format!(
            "the records differ\n{}",
            diff(&got_body, &want_body)
        ));
    }
    let got_total = x_records(got).map(|t| t.saturating_sub(synthetic));
    let want_total = x_records(want);
    (got_total != want_total)
        .then(|| format!("X-Records {got_total:?}, the union's {want_total:?}"))
}

/// A minimal diff of two answers: for arrays, the records only one side holds (as multisets);
/// otherwise both values, shortened.
fn diff(got: &Value, want: &Value) -> String {
    let (Value::Array(got), Value::Array(want)) = (got, want) else {
        return format!(
            "    pdbmux:    {}\n    the union: {}",
            shorten(got),
            shorten(want)
        );
    };
    let (mut only_got, mut only_want) = (multiset(got), multiset(want));
    let mut common = 0;
    only_got.retain(|record| match only_want.iter().position(|w| w == record) {
        Some(at) => {
            only_want.remove(at);
            common += 1;
            false
        }
        None => true,
    });
    let lines = |side: &str, records: &[String]| -> String {
        records
            .iter()
            .take(8)
            .map(|r| format!("    only {side}: {}\n", shorten_text(r)))
            .chain((records.len() > 8).then(|| format!("    … {} more\n", records.len() - 8)))
            .collect()
    };
    let order = if only_got.is_empty() && only_want.is_empty() {
        format!("    the same {common} records in another order\n")
    } else {
        String::new()
    };
    format!(
        "    {} records, the union {} ({common} in both)\n{order}{}{}",
        got.len(),
        want.len(),
        lines("pdbmux", &only_got),
        lines("the union", &only_want)
    )
}

/// The synthetic provenance records in an answer (an unpaged /facts total counts them).
fn count_synthetic(body: &Value) -> u64 {
    body.as_array().map_or(0, |records| {
        records
            .iter()
            .filter(|r| r.get("name") == Some(&json!(SOURCE)))
            .count() as u64
    })
}

fn shorten(value: &Value) -> String {
    shorten_text(&value.to_string())
}

fn shorten_text(text: &str) -> String {
    match text.char_indices().nth(1500) {
        Some((at, _)) => format!("{}… ({} bytes)", &text[..at], text.len()),
        None => text.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn storage_ordered_lists_compare_as_sets_and_ordered_ones_in_order() {
        let path = "/pdb/query/v4/catalog-inputs";
        let a = json!({"certname": "n", "inputs": [["hiera", "b"], ["hiera", "a"]]});
        let b = json!({"certname": "n", "inputs": [["hiera", "a"], ["hiera", "b"]]});
        assert_eq!(normalise(path, &a), normalise(path, &b));
        let data = |items: Value| json!({"resources": {"data": items}});
        assert_eq!(
            normalise("/pdb/query/v4/catalogs", &data(json!([1, 2]))),
            normalise("/pdb/query/v4/catalogs", &data(json!([2, 1])))
        );
        let tags = |tags: Value| json!({"certname": "n", "tags": tags});
        assert_ne!(
            normalise("/pdb/query/v4/resources", &tags(json!(["a", "b"]))),
            normalise("/pdb/query/v4/resources", &tags(json!(["b", "a"]))),
            "other arrays keep their order"
        );
    }
}
