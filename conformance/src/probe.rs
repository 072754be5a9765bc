//! Health probes as a fake backend sees them: the replies to `GET health_probe_path`, and a
//! backend that answers its probes from a script of their own and everything else from another.
//!
//! The prober runs on the estate, so with `health_probe_enabled` on, every backend is asked
//! [`PROBE_PATH`] once per `health_probe_interval` besides whatever the clients ask. A probe that
//! must time out is [`Reply::never`]: the core's probe deadline ends it.

use std::collections::VecDeque;

use http::StatusCode;

use crate::script::{Asked, FakeBackend, Reply};

/// The default `health_probe_path`, PuppetDB's trapperkeeper status service.
pub const PROBE_PATH: &str = "/status/v1/services";

/// A trapperkeeper status body whose every service is `running`: a healthy probe.
pub fn probe_running() -> Reply {
    Reply::ok(r#"{"puppetdb-status":{"state":"running"},"status-service":{"state":"running"}}"#)
}

/// A 200 trapperkeeper status body naming one service in `state` (`starting`, `error`, …): an
/// answer, so it sets the latch, and a failure.
pub fn probe_degraded(state: &str) -> Reply {
    Reply::ok(format!(
        r#"{{"puppetdb-status":{{"state":"{state}"}},"status-service":{{"state":"running"}}}}"#
    ))
}

/// A plain-text answer with this status (a 503 from trapperkeeper, a 404 from a proxy, …).
pub fn probe_status(status: u16) -> Reply {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    Reply::text(status, format!("probe answered {}", status.as_u16()))
}

impl FakeBackend {
    /// A backend that answers its health probes (`GET` [`PROBE_PATH`]) with `probes` in order and
    /// then with `then` forever, and every other request with `other`.
    pub fn probed(
        name: &str,
        url: &str,
        probes: impl IntoIterator<Item = Reply>,
        then: Reply,
        mut other: impl FnMut(&Asked<'_>) -> Reply + Send + 'static,
    ) -> FakeBackend {
        let mut probes: VecDeque<Reply> = probes.into_iter().collect();
        FakeBackend::by_request(name, url, move |asked| {
            if asked.path_and_query == PROBE_PATH {
                probes.pop_front().unwrap_or_else(|| then.clone())
            } else {
                other(asked)
            }
        })
    }
}
