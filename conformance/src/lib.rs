//! # pdbmux-conformance
//!
//! A simulated harness that runs pdbmux as a binary does, the sans-IO core inside the real
//! estate host (`pdbmux_driver::EstateHost`: admission, waiters, flights, cancellation, the
//! estate's task), on a deterministic runtime instead of tokio or smol, in the style of
//! quinn-proto's test `Pair`: fake backends answer with scripted latency, status, body,
//! failure or panic ([`FakeBackend`], [`Reply`]); a simulated clock jumps straight to the next
//! event (the earliest scripted reply or timer); a manual task queue runs every woken task
//! until it waits again; and [`Harness::drive_bounded`] fails a livelock after a step budget
//! instead of hanging.
//!
//! Every send, answer, timeout, cancellation, flight and response is written to a
//! [`Transcript`], one line per event with the time since the start, which the tests snapshot
//! with insta:
//!
//! ```text
//! +0ms c0 GET /pdb/meta/v1/version
//! +0ms c0 send u0 -> pdb-a GET /pdb/meta/v1/version (buffer, deadline +10000ms)
//! +5ms c0 u0 <- pdb-a 200 application/json;charset=utf-8 {"version":"7.12.1"}
//! +5ms c0 respond 200 content-type=application/json;charset=utf-8 x-backends=1/1 body={"version":"7.12.1"}
//! ```
//!
//! Use: build a [`Harness`] from fake backends, [`Harness::submit`] client requests (optionally
//! after [`Harness::run_until`] a later time), [`Harness::drive_bounded`] until quiescent, then read
//! [`Harness::response`] per client, [`Harness::sends`], [`Harness::check_quiescent`] and
//! [`Harness::transcript`].

#![forbid(unsafe_code)]

mod error;
mod harness;
mod probe;
mod puppetdb;
mod record;
mod script;
mod setup;
mod sim;
mod store;
mod transcript;
mod upstream;

pub use error::HarnessError;
pub use harness::Harness;
pub use probe::{probe_degraded, probe_running, probe_status, PROBE_PATH};
pub use puppetdb::{
    aggregate, compare_column, compare_jsonb, compare_records, decode_component,
    excluded_certnames, fact_record, matches, membership_rows, node_record, parse_instant,
    produced_at_report_time, produced_in_runs, produced_query_entity, read_asking, resource_record,
    sort_records, window, written_by_postgresql, Asking, Column, Dir, PuppetDb,
};
pub use record::{ClientId, ClientResponse, Machine, SentRequest};
pub use script::{ms, Asked, FakeBackend, Reply, ReplyOutcome, Script, ScriptedAnswer};
pub use setup::{config_for, parse_backend_url, DEFAULT_TIMEOUT};
pub use store::FakeStore;
pub use transcript::{
    body_text, headers_text, target_text, Transcript, MAX_BODY_CHARS, MAX_TARGET_CHARS,
};
pub use upstream::{decoded_upstream, form_encode, form_target};
