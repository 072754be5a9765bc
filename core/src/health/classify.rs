//! Reading one answered probe: how statuses and trapperkeeper bodies are
//! classified (README, "Backend health").
//!
//! | Reply                                                          | ProbeVerdict     | Sets the latch |
//! |----------------------------------------------------------------|-------------|----------------|
//! | 200, trapperkeeper body, every service `"state": "running"`    | `Healthy`   | yes            |
//! | 200, trapperkeeper body, a service starting/stopping/error/... | `Unhealthy` | yes            |
//! | 200, body not in trapperkeeper's shape (judged on status)      | `Healthy`   | yes            |
//! | 429 (the backend reporting its own capacity)                   | `Unhealthy` | yes            |
//! | 501 (does not implement the endpoint)                          | `Rejected`  | no             |
//! | any other 5xx, 503 included                                    | `Unhealthy` | yes            |
//! | any other 4xx (404/410, 405, 401/403, ...)                     | `Rejected`  | no             |
//! | 1xx, other 2xx, 3xx, anything else                             | `Rejected`  | no             |
//! | transport failure (connect, DNS, TLS, timeout; no reply)       | unhealthy   | no             |
//!
//! The last row is not a reply, so [`classify`] never sees it; the health table handles it.
//!
//! The trapperkeeper shape is `GET /status/v1/services`'s: a non-empty JSON object whose every
//! value is an object with a string `"state"` (`{"puppetdb-status": {"state": "running", ...}}`).

use std::collections::BTreeMap;

use serde_json::{Map, Value};

/// What one answered probe says about its backend, as [`classify`] reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProbeVerdict {
    /// The backend is well: a 2xx whose body is not a degraded trapperkeeper report.
    Healthy,
    /// Evidence the backend is unwell: a 5xx but 501, a 429, or a 2xx whose trapperkeeper body
    /// names a service that is not running. It is an answer, so it sets the latch. The reason is a
    /// short description for logs and `/healthz`.
    Unhealthy(String),
    /// The backend refused the probe request itself (a 4xx but 429, a 501, a 1xx or 3xx):
    /// evidence about the probe, not the backend, so it never sets the latch.
    Rejected(String),
}

impl ProbeVerdict {
    /// Whether this reply sets the backend's latch: it was readable as healthy or unhealthy.
    /// Use it to decide which rule (gated or never-answered) applies from now on.
    #[cfg(test)]
    pub(crate) fn sets_latch(&self) -> bool {
        !matches!(self, ProbeVerdict::Rejected(_))
    }
}

/// How a status is read before the body is looked at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StatusClass {
    /// Success: judged on the body when it is in trapperkeeper's shape, else healthy.
    Success,
    /// Evidence about the backend: unhealthy, whatever the body.
    Evidence,
    /// A refusal of the probe request.
    Refusal,
}

/// The status table, `(first, last, class)`, read top to bottom; the first row whose inclusive
/// range holds the status wins. Anything no row holds is a refusal.
const STATUS_TABLE: [(u16, u16, StatusClass); 5] = [
    (200, 200, StatusClass::Success),
    (429, 429, StatusClass::Evidence),
    (501, 501, StatusClass::Refusal),
    (500, 599, StatusClass::Evidence),
    (400, 499, StatusClass::Refusal),
];

/// At most this many non-running services are named in a reason.
const NAMED_SERVICES: usize = 5;

/// Classifies an answered probe by its status and body (see the module table). Call it for every
/// probe that got a status line; a probe with no reply is a transport failure and never gets here.
pub fn classify(status: u16, body: &[u8]) -> ProbeVerdict {
    let class = STATUS_TABLE
        .iter()
        .find(|(first, last, _)| (*first..=*last).contains(&status))
        .map_or(StatusClass::Refusal, |row| row.2);
    match class {
        StatusClass::Success => match not_running(body) {
            Some(services) if !services.is_empty() => ProbeVerdict::Unhealthy(format!(
                "answered {status}; {}",
                describe_services(&services)
            )),
            _ => ProbeVerdict::Healthy,
        },
        StatusClass::Evidence => ProbeVerdict::Unhealthy(match not_running(body) {
            Some(services) if !services.is_empty() => {
                format!("answered {status}; {}", describe_services(&services))
            }
            _ => format!("answered {status}"),
        }),
        StatusClass::Refusal => ProbeVerdict::Rejected(format!("answered {status}")),
    }
}

/// The services of a trapperkeeper status body that are not running, by name; `None` when the
/// body is not in that shape.
fn not_running(body: &[u8]) -> Option<BTreeMap<String, String>> {
    let services: BTreeMap<String, Map<String, Value>> = serde_json::from_slice(body).ok()?;
    if services.is_empty() {
        return None;
    }
    let mut not_running = BTreeMap::new();
    for (name, service) in services {
        let state = service.get("state")?.as_str()?;
        if state != "running" {
            not_running.insert(name, state.to_owned());
        }
    }
    Some(not_running)
}

fn describe_services(services: &BTreeMap<String, String>) -> String {
    let mut named: Vec<String> = services
        .iter()
        .take(NAMED_SERVICES)
        .map(|(name, state)| format!("{name}={state}"))
        .collect();
    if services.len() > NAMED_SERVICES {
        named.push(format!("and {} more", services.len() - NAMED_SERVICES));
    }
    format!("services not running: {}", named.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    const RUNNING: &str = r#"{"puppetdb-status":{"service_version":"7.12.1","service_status_version":1,"detail_level":"info","state":"running","status":{}},"status-service":{"state":"running","status":{}}}"#;

    fn degraded(state: &str) -> String {
        format!(
            r#"{{"puppetdb-status":{{"state":"{state}","status":{{}}}},"status-service":{{"state":"running"}}}}"#
        )
    }

    #[test]
    fn a_200_with_every_service_running_is_healthy() {
        assert_eq!(classify(200, RUNNING.as_bytes()), ProbeVerdict::Healthy);
    }

    #[test]
    fn a_200_naming_a_service_not_running_is_unhealthy() {
        for state in ["starting", "stopping", "error", "unknown", "RUNNING", ""] {
            assert_eq!(
                classify(200, degraded(state).as_bytes()),
                ProbeVerdict::Unhealthy(format!(
                    "answered 200; services not running: puppetdb-status={state}"
                )),
                "state {state:?}"
            );
        }
    }

    #[test]
    fn a_200_not_in_trapperkeeper_shape_is_judged_on_its_status() {
        for body in [
            "",
            "OK",
            "[]",
            "{}",
            "null",
            r#"{"status":"ok"}"#,
            r#"{"svc":{"status":"stopping"}}"#,
            r#"{"svc":{"state":1}}"#,
            r#"{"svc":["stopping"]}"#,
            r#"{"a":{"state":"running"},"b":"stopping"}"#,
            r#"{"svc":{"state":"stopping"}"#,
        ] {
            assert_eq!(
                classify(200, body.as_bytes()),
                ProbeVerdict::Healthy,
                "{body}"
            );
        }
    }

    #[test]
    fn only_200_is_healthy() {
        assert!(matches!(classify(204, b""), ProbeVerdict::Rejected(_)));
        assert!(matches!(
            classify(299, RUNNING.as_bytes()),
            ProbeVerdict::Rejected(_)
        ));
    }

    #[test]
    fn a_503_is_unhealthy_and_names_services_when_the_body_does() {
        assert_eq!(
            classify(503, degraded("stopping").as_bytes()),
            ProbeVerdict::Unhealthy(
                "answered 503; services not running: puppetdb-status=stopping".into()
            )
        );
        assert_eq!(
            classify(503, b"Service Unavailable"),
            ProbeVerdict::Unhealthy("answered 503".into())
        );
        assert_eq!(
            classify(503, RUNNING.as_bytes()),
            ProbeVerdict::Unhealthy("answered 503".into())
        );
    }

    #[test]
    fn every_5xx_but_501_and_429_are_evidence_about_the_backend() {
        for status in [500, 502, 504, 505, 507, 599, 429] {
            assert_eq!(
                classify(status, b"x"),
                ProbeVerdict::Unhealthy(format!("answered {status}")),
                "{status}"
            );
        }
    }

    #[test]
    fn other_4xx_and_501_refuse_the_probe() {
        for status in [400, 401, 403, 404, 405, 406, 410, 418, 428, 431, 499, 501] {
            assert_eq!(
                classify(status, RUNNING.as_bytes()),
                ProbeVerdict::Rejected(format!("answered {status}")),
                "{status}"
            );
        }
    }

    #[test]
    fn informational_redirects_and_nonsense_refuse_the_probe() {
        for status in [
            0,
            100,
            101,
            199,
            300,
            301,
            302,
            304,
            307,
            399,
            600,
            999,
            u16::MAX,
        ] {
            assert!(
                matches!(classify(status, b""), ProbeVerdict::Rejected(_)),
                "{status}"
            );
        }
    }

    #[test]
    fn many_services_are_named_up_to_a_bound() {
        let body: String = (0..8)
            .map(|i| format!(r#""s{i}":{{"state":"error"}}"#))
            .collect::<Vec<_>>()
            .join(",");
        let verdict = classify(503, format!("{{{body}}}").as_bytes());
        assert_eq!(
            verdict,
            ProbeVerdict::Unhealthy(
                "answered 503; services not running: s0=error, s1=error, s2=error, s3=error, \
                 s4=error, and 3 more"
                    .into()
            )
        );
    }

    #[test]
    fn the_latch_follows_the_verdict() {
        assert!(ProbeVerdict::Healthy.sets_latch());
        assert!(ProbeVerdict::Unhealthy(String::new()).sets_latch());
        assert!(!ProbeVerdict::Rejected(String::new()).sets_latch());
    }
}
