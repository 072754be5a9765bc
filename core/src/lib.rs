//! # pdbmux-core
//!
//! The sans-IO core of pdbmux, a merging PuppetDB proxy. It knows what PuppetDB requests mean —
//! routes, the path allowlist, the status policy, merge rules, the headers pdbmux sets — and
//! nothing about sockets, TLS, HTTP framing or the clock. The runtimes (`pdbmux` on tokio and
//! hyper; `pdbmux-smol`) supply those.
//!
//! ## The contract
//!
//! The core is two kinds of state machine, both driven the same way:
//!
//! - [`Estate`]: one per process, shared by every request and touched only briefly (under a lock
//!   in a multi-threaded runtime). It admits requests and owns what requests share.
//! - [`Exchange`]: one per client request, created by [`Estate::admit`] and driven on the
//!   request's own task, so merges of different requests run on different cores at once.
//!
//! Each machine is driven by three kinds of call:
//!
//! 1. **Inputs** are `handle_*` methods taking `now: Instant` first: an upstream answer or failure
//!    arrived, a client went away, a deadline passed.
//! 2. **Outputs** are drained with `poll_output()` until it returns `None`: send this request to
//!    that backend, cancel that upstream request, respond to that client.
//! 3. **One deadline**: `poll_timeout()` is the single next instant at which the machine wants
//!    `handle_timeout(now)`; the runtime keeps a single sleep per machine.
//!
//! Rules: after every input, drain `poll_output`, then read `poll_timeout`. `now` never goes
//! backwards. A spurious `handle_timeout` (before any deadline) is a no-op. Answers for unknown or
//! cancelled IDs are ignored. IDs ([`UpstreamId`], [`WaiterId`]) come from counters in the
//! machine that issues them, so runs are deterministic; any iteration that reaches an output goes
//! in configured or ID order, never hash order. Bodies cross the boundary as owned `Bytes`.
//!
//! The core never reads the clock: `Instant::now`, `SystemTime::now` and `thread::sleep` are
//! disallowed by `clippy.toml`, and its dependency tree has no async runtime or HTTP stack.

#![forbid(unsafe_code)]

mod aggregate;
mod asked_of_all;
mod broadcast;
pub mod budget;
pub mod cache;
mod clock;
mod concat;
pub mod config;
mod corrections;
mod coverage;
mod entity;
mod estate;
mod exchange;
mod fanout;
mod health;
mod healthz;
mod ids;
mod instant;
mod jolokia;
pub mod membership;
mod merge;
mod message;
mod meta;
mod node_record;
mod outbound;
mod ownership;
mod parent;
mod parsed;
mod policy;
pub mod query;
mod records;
mod root;
mod route;
mod scrub;
mod sequence;
mod sort;
mod source_ask;
pub mod stats;
mod status;
mod streamed;
mod translations;

pub use clock::ClockAnchor;
pub use coverage::Coverage;
pub use estate::{Admission, Estate, EstateOutput};
pub use exchange::{Exchange, ExchangeOutput, ExchangeReport};
pub use healthz::REACHABILITY_PATH;
pub use ids::{BackendId, FlightId, UpstreamId, WaiterId};
pub use message::{
    BodyMode, ClientRequest, ConnectCause, Purpose, Response, ResponseBody, UpstreamBody,
    UpstreamFailure, UpstreamRequest, UpstreamResponse, HELD_ABOVE_BYTES, JSON_CONTENT_TYPE,
    STREAM_ABOVE_BYTES, TEXT_CONTENT_TYPE, X_BACKENDS, X_RECORDS,
};
pub use policy::{plan, Planned};
pub use records::{check_json, MAX_DEPTH as MAX_JSON_DEPTH};
pub use root::Translating;
pub use route::RouteClass;
pub use sequence::forwarded_headers;
pub use streamed::{MergeBroken, MergeStream};
