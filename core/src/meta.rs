//! The meta routes: `/pdb/meta/v1/version` (the lowest version any backend runs) and
//! `/pdb/meta/v1/server-time` (the first backend in configured order that answers).

use std::cmp::Ordering;

use http::StatusCode;
use serde::Deserialize;

use crate::asked_of_all::AnswerRule;
use crate::fanout::{CallState, Calls, Context, Step, Verdict};
use crate::message::Response;
use crate::sequence::verbatim;
use crate::status::{Outcome, Unusable};

/// `/pdb/meta/v1/version` asked of every backend ([`crate::asked_of_all::AskedOfAll`]): the
/// lowest version among those that answered one.
#[derive(Debug, Clone)]
pub(crate) struct LowestVersion;

impl AnswerRule for LowestVersion {
    const VERBATIM: bool = false;

    fn progress(&self, calls: &Calls, _context: &Context) -> Step {
        if !calls.all_done() {
            return Step::Wait;
        }
        let mut versions = Vec::new();
        let mut unusable = Vec::new();
        for call in &calls.0 {
            if let CallState::Done(Outcome::Success { body, .. }) = &call.state {
                match parse_version_body(body) {
                    Some(version) => versions.push(version),
                    None => unusable.push((call.backend, Unusable::Version)),
                }
            }
        }
        let Some(lowest) = lowest_version(versions.iter().map(String::as_str)) else {
            return Step::Done(Verdict::Unanswered { part: 0, unusable });
        };
        let body = serde_json::json!({ "version": lowest }).to_string();
        Step::Done(Verdict::Merged {
            response: Response::json(StatusCode::OK, body),
            contributed: versions.len(),
            unusable,
        })
    }
}

/// `/pdb/meta/v1/server-time` asked of every backend ([`crate::asked_of_all::AskedOfAll`]): the
/// first success in configured order, served as soon as it is known.
#[derive(Debug, Clone)]
pub(crate) struct FirstInOrder;

impl AnswerRule for FirstInOrder {
    const VERBATIM: bool = true;

    fn progress(&self, calls: &Calls, _context: &Context) -> Step {
        for call in &calls.0 {
            match &call.state {
                CallState::Pending { .. } | CallState::Held { .. } | CallState::Reading { .. } => {
                    return Step::Wait
                }
                CallState::Done(Outcome::Success {
                    status,
                    headers,
                    body,
                }) => {
                    return Step::Done(Verdict::Merged {
                        response: verbatim(*status, headers, body),
                        contributed: 1,
                        unusable: Vec::new(),
                    })
                }
                CallState::Done(_) => {}
            }
        }
        Step::Done(Verdict::Unanswered {
            part: 0,
            unusable: Vec::new(),
        })
    }
}

#[derive(Deserialize)]
struct VersionBody {
    version: String,
}

/// Reads the `version` field of a `/pdb/meta/v1/version` body; `None` when unparseable.
pub fn parse_version_body(body: &[u8]) -> Option<String> {
    serde_json::from_slice::<VersionBody>(body)
        .ok()
        .map(|b| b.version)
}

/// Compares two versions segment by segment (split on `.`), numerically where both segments are
/// numbers (7.9.0 < 7.12.0), lexically otherwise; a version that runs out of segments first is
/// lower. A pre-release suffix after `-` (7.12.1-SNAPSHOT) is lower than the release itself.
pub fn compare_versions(a: &str, b: &str) -> Ordering {
    let (a_release, a_pre) = split_pre_release(a);
    let (b_release, b_pre) = split_pre_release(b);
    compare_segments(a_release, b_release).then_with(|| match (a_pre, b_pre) {
        (None, None) => Ordering::Equal,
        (Some(_), None) => Ordering::Less,
        (None, Some(_)) => Ordering::Greater,
        (Some(a), Some(b)) => compare_segments(a, b),
    })
}

fn split_pre_release(version: &str) -> (&str, Option<&str>) {
    match version.split_once('-') {
        Some((release, pre)) => (release, Some(pre)),
        None => (version, None),
    }
}

fn compare_segments(a: &str, b: &str) -> Ordering {
    let mut left = a.split('.');
    let mut right = b.split('.');
    loop {
        match (left.next(), right.next()) {
            (None, None) => return Ordering::Equal,
            (None, Some(_)) => return Ordering::Less,
            (Some(_), None) => return Ordering::Greater,
            (Some(x), Some(y)) => {
                let order = match (x.parse::<u64>(), y.parse::<u64>()) {
                    (Ok(x), Ok(y)) => x.cmp(&y),
                    _ => x.cmp(y),
                };
                if order != Ordering::Equal {
                    return order;
                }
            }
        }
    }
}

/// The lowest of the given versions, first one winning ties; `None` for none.
pub fn lowest_version<'a>(versions: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    versions.into_iter().fold(None, |lowest, v| match lowest {
        Some(l) if compare_versions(v, l) != Ordering::Less => Some(l),
        _ => Some(v),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numeric_segments_compare_as_numbers() {
        assert_eq!(compare_versions("7.9.0", "7.12.0"), Ordering::Less);
        assert_eq!(compare_versions("8.0.0", "7.12.1"), Ordering::Greater);
        assert_eq!(compare_versions("7.12.1", "7.12.1"), Ordering::Equal);
        assert_eq!(compare_versions("7.12", "7.12.1"), Ordering::Less);
        assert_eq!(
            compare_versions("7.12.1-SNAPSHOT", "7.12.1"),
            Ordering::Less
        );
        assert_eq!(
            compare_versions("7.12.1-SNAPSHOT", "7.12.0"),
            Ordering::Greater
        );
        assert_eq!(
            compare_versions("8.0.0-rc.2", "8.0.0-rc.10"),
            Ordering::Less
        );
        assert_eq!(compare_versions("7.x", "7.1"), Ordering::Greater);
    }

    #[test]
    fn lowest_and_parse() {
        assert_eq!(lowest_version(["8.15.0", "7.12.1", "7.9.0"]), Some("7.9.0"));
        assert_eq!(lowest_version([]), None);
        assert_eq!(
            parse_version_body(br#"{"version":"7.12.1"}"#),
            Some("7.12.1".into())
        );
        assert_eq!(parse_version_body(b"<html>"), None);
        assert_eq!(parse_version_body(br#"{"version":7}"#), None);
    }
}
