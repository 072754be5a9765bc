//! Query-string parameters kept as received, so untouched ones are forwarded byte for byte.

use serde_json::value::RawValue;
use serde_json::Value;

use super::QueryText;

/// Parameters PuppetDB coerces to a boolean (`Boolean/parseBoolean`, or a JSON boolean in a POST
/// body).
const BOOLEAN_PARAMS: [&str; 7] = [
    "include_total",
    "ast_only",
    "optimize_drop_unused_joins",
    "pretty",
    "include_facts_expiration",
    "include_package_inventory",
    "distinct_resources",
];

/// Parameters that must be real JSON in a POST body (a GET sends them as JSON text).
const JSON_PARAMS: [&str; 2] = ["order_by", "counts_filter"];

/// The parameters that order or window an answer: an answer they shape is not the same records
/// in any order (a fold drops them upstream).
pub const WINDOW_PARAMS: [&str; 4] = ["order_by", "limit", "offset", "include_total"];

/// The parameters that cut a window of an answer or count it: answers joined would each be cut
/// or counted alone.
const CUTTING_PARAMS: [&str; 3] = ["limit", "offset", "include_total"];

/// Parameters PuppetDB reads as integers.
const INTEGER_PARAMS: [&str; 2] = ["limit", "offset"];

/// One `key=value` pair: the raw text as received and its form-decoded meaning.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Param {
    raw_key: String,
    raw_value: Option<String>,
    key: String,
    value: String,
}

impl Param {
    /// Reads one non-empty `&`-separated piece of a query string.
    fn parse(raw: &str) -> Param {
        let (raw_key, raw_value) = match raw.split_once('=') {
            Some((key, value)) => (key, Some(value)),
            None => (raw, None),
        };
        // form_urlencoded splits at the first '=' exactly like the line above, and decodes '+'
        // as a space and %xx escapes (invalid UTF-8 becomes U+FFFD).
        let (key, value) = form_urlencoded::parse(raw.as_bytes())
            .next()
            .map(|(key, value)| (key.into_owned(), value.into_owned()))
            .unwrap_or_default();
        Param {
            raw_key: raw_key.to_owned(),
            raw_value: raw_value.map(str::to_owned),
            key,
            value,
        }
    }

    /// A pair pdbmux sets itself, form-encoded on output.
    fn encoded(raw_key: String, key: &str, value: &str) -> Param {
        Param {
            raw_key,
            raw_value: Some(form_urlencoded::byte_serialize(value.as_bytes()).collect()),
            key: key.to_owned(),
            value: value.to_owned(),
        }
    }

    /// The decoded key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The decoded value (`""` when the pair had no `=`).
    pub fn value(&self) -> &str {
        &self.value
    }

    /// The key exactly as received.
    pub fn raw_key(&self) -> &str {
        &self.raw_key
    }

    /// The value exactly as received, or `None` when the pair had no `=`. After
    /// [`Params::set`], the form-encoded new value.
    pub fn raw_value(&self) -> Option<&str> {
        self.raw_value.as_deref()
    }

    fn write_raw(&self, out: &mut String) {
        out.push_str(&self.raw_key);
        if let Some(value) = &self.raw_value {
            out.push('=');
            out.push_str(value);
        }
    }
}

/// A piece of the query string between two `&`.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Segment {
    /// An empty piece (`a=1&&b=2`, a trailing `&`): kept so the string round-trips.
    Gap,
    Param(Param),
}

/// The parameters of one request, in the order received.
///
/// Use it for every request that reaches a backend: read parameters with [`Params::get`], change
/// only what pdbmux must change ([`Params::set`], [`Params::remove`]), and build the upstream
/// query string with [`Params::to_query_string`], which re-emits every untouched parameter byte for
/// byte.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Params {
    segments: Vec<Segment>,
}

/// Why a parameter set cannot become a PuppetDB POST body ([`Params::to_json_body`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JsonBodyError {
    /// A JSON object holds each key once; PuppetDB refuses a repeated GET parameter anyway.
    #[error("query parameter {0} given more than once")]
    Repeated(String),
    /// `order_by` or `counts_filter` is not JSON, so it cannot be sent typed.
    #[error("query parameter {0} is not valid json")]
    NotJson(String),
}

impl Params {
    /// Parses a raw query string (the part after `?`, not decoded), or `None` for no `?`.
    ///
    /// Never fails: every piece is kept, and decoding is lossy for invalid UTF-8.
    pub fn parse(raw: Option<&str>) -> Params {
        let segments = match raw {
            None | Some("") => Vec::new(),
            Some(raw) => raw
                .split('&')
                .map(|piece| {
                    if piece.is_empty() {
                        Segment::Gap
                    } else {
                        Segment::Param(Param::parse(piece))
                    }
                })
                .collect(),
        };
        Params { segments }
    }

    /// Every parameter, in order.
    pub fn iter(&self) -> impl Iterator<Item = &Param> {
        self.segments.iter().filter_map(|segment| match segment {
            Segment::Param(param) => Some(param),
            Segment::Gap => None,
        })
    }

    /// The decoded value of the first parameter whose decoded key is `key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.iter().find(|param| param.key == key).map(Param::value)
    }

    /// Whether `limit`, `offset` or `include_total` is given: the answer is a window of the
    /// records, or counts them (an order alone is neither).
    pub fn cuts_window(&self) -> bool {
        CUTTING_PARAMS.iter().any(|key| self.get(key).is_some())
    }

    /// The decoded values of every parameter named `key`, in order (to spot a repeated param).
    pub fn get_all<'a>(&'a self, key: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.iter()
            .filter(move |param| param.key == key)
            .map(Param::value)
    }

    /// Whether any parameter is named `key`.
    pub fn contains(&self, key: &str) -> bool {
        self.iter().any(|param| param.key == key)
    }

    /// The number of parameters.
    pub fn len(&self) -> usize {
        self.iter().count()
    }

    /// Whether there are no parameters.
    pub fn is_empty(&self) -> bool {
        self.iter().next().is_none()
    }

    /// Classifies the `query` parameter ([`QueryText::classify`] of `get("query")`), parsing its
    /// JSON. A request's is read once, by `ParsedRequest::parsed_query`, and kept: read it from
    /// there.
    pub fn query_text(&self) -> QueryText {
        QueryText::classify(self.get("query"))
    }

    /// Sets `key` to `value` for the upstream request: the first occurrence keeps its place (and
    /// its raw key), later ones are dropped, and a missing key is appended. The value is
    /// form-encoded on output.
    pub fn set(&mut self, key: &str, value: &str) {
        let mut placed = false;
        self.segments.retain_mut(|segment| match segment {
            Segment::Param(param) if param.key == key => {
                if placed {
                    return false;
                }
                placed = true;
                let raw_key = std::mem::take(&mut param.raw_key);
                *param = Param::encoded(raw_key, key, value);
                true
            }
            _ => true,
        });
        if !placed {
            let raw_key = form_urlencoded::byte_serialize(key.as_bytes()).collect();
            let param = Segment::Param(Param::encoded(raw_key, key, value));
            match self.segments.last_mut() {
                Some(last @ Segment::Gap) => *last = param,
                _ => self.segments.push(param),
            }
        }
    }

    /// Removes every parameter named `key`; returns whether there was one.
    pub fn remove(&mut self, key: &str) -> bool {
        let before = self.segments.len();
        self.segments
            .retain(|segment| !matches!(segment, Segment::Param(param) if param.key == key));
        self.segments.len() != before
    }

    /// The query string for the upstream request (without `?`; `""` when there is nothing).
    ///
    /// Untouched parameters come out exactly as received, in their original order.
    pub fn to_query_string(&self) -> String {
        let mut out = String::new();
        for (index, segment) in self.segments.iter().enumerate() {
            if index > 0 {
                out.push('&');
            }
            if let Segment::Param(param) = segment {
                param.write_raw(&mut out);
            }
        }
        out
    }

    /// The same request as a PuppetDB POST body, for a query too long for a URL (D4). Send it with
    /// `Content-Type: application/json` (PuppetDB answers 415 otherwise).
    ///
    /// PuppetDB's `post-req->query` (puppetlabs/puppetdb `src/puppetlabs/puppetdb/http/query.clj`,
    /// 7.12.1 and 8.x) reads the body with `json/parse-string` and then runs the same
    /// `convert-query-params` as a GET, minus the GET-only JSON decoding. So:
    /// - `query` must be the AST itself (`(if (vector? query) query (parse-fn query))`); PQL and
    ///   malformed text stay strings, which PuppetDB parses exactly as it would from a URL;
    /// - `order_by` and `counts_filter` must be real JSON (`parse-order-by` and `event_counts`
    ///   expect sequences, and only `get-req->query` decodes them from text);
    /// - `limit` and `offset` are sent as numbers (`coerce-to-int` takes an integer or a string;
    ///   text that is not a plain integer stays a string so the backend's 400 is the GET one);
    /// - `include_total`, `ast_only`, `pretty`, `optimize_drop_unused_joins`,
    ///   `include_facts_expiration`, `include_package_inventory` and `distinct_resources` are JSON
    ///   booleans (`coerce-to-boolean`, i.e. `Boolean/parseBoolean`: true only for `true` in any
    ///   case);
    /// - everything else (`summarize_by`, `count_by`, `origin`, `explain`, `timeout`,
    ///   `distinct_start_time`, ...) is a string, as in a GET.
    ///
    /// Keys keep their order; the AST keeps its exact text.
    pub fn to_json_body(&self) -> Result<Vec<u8>, JsonBodyError> {
        let mut out = String::from("{");
        let mut seen: Vec<&str> = Vec::new();
        for param in self.iter() {
            let key = param.key();
            if seen.contains(&key) {
                return Err(JsonBodyError::Repeated(key.to_owned()));
            }
            seen.push(key);
            if out.len() > 1 {
                out.push(',');
            }
            out.push_str(&Value::from(key).to_string());
            out.push(':');
            out.push_str(&body_value(key, param.value())?);
        }
        out.push('}');
        Ok(out.into_bytes())
    }
}

/// The JSON text of one parameter's value in a POST body.
fn body_value(key: &str, value: &str) -> Result<String, JsonBodyError> {
    if key == "query" {
        // An AST goes in as JSON, anything else (PQL, malformed JSON) as a string, as
        // `QueryText::classify` tells them apart; told here by one validating pass, not a parse
        // into a tree: a query sent as a body is a long one (often a rewritten push-down).
        let ast = super::reads_as_ast(value)
            .then(|| serde_json::from_str::<&RawValue>(value).ok())
            .flatten();
        return Ok(match ast {
            Some(raw) => raw.get().to_owned(),
            None => Value::from(value).to_string(),
        });
    }
    if JSON_PARAMS.contains(&key) {
        return serde_json::from_str::<&RawValue>(value)
            .map(|raw| raw.get().to_owned())
            .map_err(|_| JsonBodyError::NotJson(key.to_owned()));
    }
    if INTEGER_PARAMS.contains(&key) {
        if let Some(number) = plain_integer(value) {
            return Ok(number.to_string());
        }
        return Ok(Value::from(value).to_string());
    }
    if BOOLEAN_PARAMS.contains(&key) {
        return Ok(value.eq_ignore_ascii_case("true").to_string());
    }
    Ok(Value::from(value).to_string())
}

/// An optional `-` and ASCII digits that fit an `i64`.
fn plain_integer(text: &str) -> Option<i64> {
    let digits = text.strip_prefix('-').unwrap_or(text);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    const PUPPETBOARD: &str = "query=%5B%22and%22%2C+%5B%22%3D%22%2C+%22environment%22%2C+%22production%22%5D%5D&order_by=%5B%7B%22field%22%3A+%22end_time%22%2C+%22order%22%3A+%22desc%22%7D%5D&limit=5&include_total=true&offset=10";

    fn body(params: &Params) -> Value {
        let bytes = params.to_json_body().expect("body");
        serde_json::from_slice(&bytes).expect("json")
    }

    #[test]
    fn decodes_plus_as_space_and_escapes() {
        let params = Params::parse(Some(PUPPETBOARD));
        assert_eq!(
            params.get("query"),
            Some("[\"and\", [\"=\", \"environment\", \"production\"]]")
        );
        assert_eq!(
            params.get("order_by"),
            Some("[{\"field\": \"end_time\", \"order\": \"desc\"}]")
        );
        assert_eq!(params.get("limit"), Some("5"));
        assert_eq!(params.get("include_total"), Some("true"));
        assert_eq!(params.get("offset"), Some("10"));
        assert_eq!(params.get("summarize_by"), None);
        assert_eq!(params.len(), 5);
        let keys: Vec<&str> = params.iter().map(Param::key).collect();
        assert_eq!(
            keys,
            ["query", "order_by", "limit", "include_total", "offset"]
        );
    }

    #[test]
    fn keeps_raw_text() {
        let params = Params::parse(Some("q%75ery=a+b%20c&flag&x="));
        let all: Vec<(&str, Option<&str>, &str, &str)> = params
            .iter()
            .map(|p| (p.raw_key(), p.raw_value(), p.key(), p.value()))
            .collect();
        assert_eq!(
            all,
            [
                ("q%75ery", Some("a+b%20c"), "query", "a b c"),
                ("flag", None, "flag", ""),
                ("x", Some(""), "x", ""),
            ]
        );
        assert!(params.contains("flag"));
        assert!(!params.contains("q%75ery"));
    }

    #[test]
    fn value_may_hold_equals_signs() {
        let params = Params::parse(Some("a=b=c&d=%3D"));
        assert_eq!(params.get("a"), Some("b=c"));
        assert_eq!(params.get("d"), Some("="));
    }

    #[test]
    fn get_returns_first_and_get_all_every_occurrence() {
        let params = Params::parse(Some("limit=1&x=2&limit=3"));
        assert_eq!(params.get("limit"), Some("1"));
        assert_eq!(params.get_all("limit").collect::<Vec<_>>(), ["1", "3"]);
    }

    #[test]
    fn empty_and_missing_query_strings() {
        for raw in [None, Some("")] {
            let params = Params::parse(raw);
            assert!(params.is_empty());
            assert_eq!(params.len(), 0);
            assert_eq!(params.to_query_string(), "");
            assert_eq!(params.query_text(), QueryText::Absent);
        }
    }

    #[test]
    fn untouched_round_trip_is_byte_exact() {
        for raw in [
            PUPPETBOARD,
            "a=1&&b=2&",
            "&",
            "x",
            "%zz=%4",
            "a=%FF%FE+",
            "==&==",
        ] {
            assert_eq!(Params::parse(Some(raw)).to_query_string(), raw);
        }
    }

    #[test]
    fn set_replaces_in_place_and_drops_repeats() {
        let mut params = Params::parse(Some("limit=1&query=%5B%5D&limit=3&pretty"));
        params.set("limit", "20");
        assert_eq!(params.to_query_string(), "limit=20&query=%5B%5D&pretty");
        params.set("query", "[\"=\", \"certname\", \"a b\"]");
        assert_eq!(
            params.to_query_string(),
            "limit=20&query=%5B%22%3D%22%2C+%22certname%22%2C+%22a+b%22%5D&pretty"
        );
        assert_eq!(params.get("query"), Some("[\"=\", \"certname\", \"a b\"]"));
    }

    #[test]
    fn set_keeps_the_raw_key() {
        let mut params = Params::parse(Some("q%75ery=1"));
        params.set("query", "2");
        assert_eq!(params.to_query_string(), "q%75ery=2");
    }

    #[test]
    fn set_appends_a_missing_key() {
        let mut params = Params::parse(None);
        params.set("query", "[\"=\",\"name\",\"a&b\"]");
        assert_eq!(
            params.to_query_string(),
            "query=%5B%22%3D%22%2C%22name%22%2C%22a%26b%22%5D"
        );
        let mut params = Params::parse(Some("a=1&"));
        params.set("b", "x y");
        assert_eq!(params.to_query_string(), "a=1&b=x+y");
        let mut params = Params::parse(Some("a=1"));
        params.set("order by", "é");
        assert_eq!(params.to_query_string(), "a=1&order+by=%C3%A9");
        assert_eq!(params.get("order by"), Some("é"));
    }

    #[test]
    fn remove_drops_every_occurrence() {
        let mut params = Params::parse(Some("offset=1&query=x&offset=2"));
        assert!(params.remove("offset"));
        assert!(!params.remove("offset"));
        assert_eq!(params.to_query_string(), "query=x");
        assert!(params.remove("query"));
        assert_eq!(params.to_query_string(), "");
        assert!(params.is_empty());
    }

    #[test]
    fn json_body_types_puppetdb_params() {
        let params = Params::parse(Some(PUPPETBOARD));
        assert_eq!(
            body(&params),
            json!({
                "query": ["and", ["=", "environment", "production"]],
                "order_by": [{"field": "end_time", "order": "desc"}],
                "limit": 5,
                "include_total": true,
                "offset": 10,
            })
        );
    }

    #[test]
    fn json_body_keeps_key_order_and_ast_text() {
        let mut params = Params::parse(Some("limit=007&summarize_by=certname"));
        params.set(
            "query",
            " [\"=\", \"value\", 123456789012345678901234567890]\n",
        );
        let bytes = params.to_json_body().expect("body");
        assert_eq!(
            String::from_utf8(bytes).expect("utf8"),
            "{\"limit\":7,\"summarize_by\":\"certname\",\
             \"query\":[\"=\", \"value\", 123456789012345678901234567890]}"
        );
    }

    /// The body embeds a query as JSON exactly when `QueryText::classify` reads it as an AST.
    #[test]
    fn json_body_embeds_the_query_exactly_when_it_classifies_as_an_ast() {
        for query in [
            r#"["=","certname","a"]"#,
            " \t\n[\"extract\",[\"certname\"]]",
            "\u{0B}[\"=\",\"a\",1]",
            "[1,",
            "[\"=\",\"a\",1] trailing",
            r#"{"a":1}"#,
            "nodes { certname = 'a' }",
            "\"[1]\"",
            "[]",
        ] {
            let mut params = Params::parse(None);
            params.set("query", query);
            let embedded = body(&params)["query"].is_array();
            let ast = matches!(QueryText::classify(Some(query)), QueryText::Ast(_));
            assert_eq!(embedded, ast, "{query:?}");
        }
    }

    #[test]
    fn json_body_strings_for_pql_and_malformed_queries() {
        let mut params = Params::parse(None);
        params.set("query", "nodes[certname] { }");
        assert_eq!(body(&params), json!({"query": "nodes[certname] { }"}));
        params.set("query", "[\"=\", \"certname\"");
        assert_eq!(body(&params), json!({"query": "[\"=\", \"certname\""}));
        params.set("query", "");
        assert_eq!(body(&params), json!({"query": ""}));
    }

    #[test]
    fn json_body_booleans_follow_parse_boolean() {
        let params = Params::parse(Some(
            "include_total=TRUE&pretty=yes&distinct_resources=true&ast_only=&\
             optimize_drop_unused_joins=false&include_facts_expiration=True&\
             include_package_inventory=1",
        ));
        assert_eq!(
            body(&params),
            json!({
                "include_total": true,
                "pretty": false,
                "distinct_resources": true,
                "ast_only": false,
                "optimize_drop_unused_joins": false,
                "include_facts_expiration": true,
                "include_package_inventory": false,
            })
        );
    }

    #[test]
    fn json_body_integers_and_strings() {
        let params = Params::parse(Some(
            "limit=-3&offset=1x&timeout=2.5&count_by=certname&distinct_start_time=2024-01-01T00:00:00Z",
        ));
        assert_eq!(
            body(&params),
            json!({
                "limit": -3,
                "offset": "1x",
                "timeout": "2.5",
                "count_by": "certname",
                "distinct_start_time": "2024-01-01T00:00:00Z",
            })
        );
        let params = Params::parse(Some("limit=99999999999999999999&offset=%2B1"));
        assert_eq!(
            body(&params),
            json!({"limit": "99999999999999999999", "offset": "+1"})
        );
    }

    #[test]
    fn json_body_counts_filter_is_typed() {
        let params = Params::parse(Some(
            "summarize_by=certname&counts_filter=%5B%22%3E%22%2C%22failures%22%2C0%5D",
        ));
        assert_eq!(
            body(&params),
            json!({"summarize_by": "certname", "counts_filter": [">", "failures", 0]})
        );
    }

    #[test]
    fn json_body_refusals() {
        let params = Params::parse(Some("limit=1&limit=2"));
        assert_eq!(
            params.to_json_body(),
            Err(JsonBodyError::Repeated("limit".into()))
        );
        assert_eq!(
            JsonBodyError::Repeated("limit".into()).to_string(),
            "query parameter limit given more than once"
        );
        let params = Params::parse(Some("order_by=%5Bnope"));
        assert_eq!(
            params.to_json_body(),
            Err(JsonBodyError::NotJson("order_by".into()))
        );
        assert_eq!(
            JsonBodyError::NotJson("order_by".into()).to_string(),
            "query parameter order_by is not valid json"
        );
    }

    #[test]
    fn json_body_of_nothing_is_an_empty_object() {
        assert_eq!(Params::parse(None).to_json_body(), Ok(b"{}".to_vec()));
    }

    /// Pieces of raw query strings: param-ish characters, %xx escapes (valid, invalid UTF-8 and
    /// broken), `+`, `=` and `&`.
    fn raw_query() -> impl Strategy<Value = String> {
        let piece = prop_oneof![
            "[a-z_]{1,8}",
            "[0-9]{1,3}",
            Just("=".to_owned()),
            Just("&".to_owned()),
            Just("+".to_owned()),
            "%[0-9A-Fa-f]{2}",
            Just("%".to_owned()),
            Just("%z".to_owned()),
            "[-._~!$'()*,;:@/?\\[\\]\"]",
        ];
        proptest::collection::vec(piece, 0..24).prop_map(|pieces| pieces.concat())
    }

    proptest! {
        #[test]
        fn round_trips_byte_for_byte(raw in raw_query()) {
            prop_assert_eq!(Params::parse(Some(&raw)).to_query_string(), raw);
        }

        #[test]
        fn set_value_reads_back(raw in raw_query(), key in "[a-z_ ]{1,6}", value in "\\PC{0,12}") {
            let mut params = Params::parse(Some(&raw));
            params.set(&key, &value);
            let reparsed = Params::parse(Some(&params.to_query_string()));
            prop_assert_eq!(reparsed.get(&key), Some(value.as_str()));
            prop_assert_eq!(reparsed.get_all(&key).count(), 1);
        }
    }
}
