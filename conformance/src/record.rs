//! What a run records: who sent what upstream, and what each client received.

use std::fmt;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, StatusCode};
use pdbmux_core::{UpstreamId, UpstreamRequest};

/// A submitted client request, numbered in submission order (`c0`, `c1`, …).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ClientId(pub usize);

impl fmt::Display for ClientId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "c{}", self.0)
    }
}

/// The machine that issued an upstream request. Upstream IDs are unique per machine only.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Machine {
    /// The shared [`pdbmux_core::Estate`] (for example a `/healthz` check).
    Estate,
    /// The [`pdbmux_core::Exchange`] of this client's request.
    Exchange(ClientId),
    /// The exchange of a shared cache flight, driven apart from any client.
    Flight(pdbmux_core::FlightId),
}

impl fmt::Display for Machine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Machine::Estate => f.write_str("estate"),
            Machine::Exchange(client) => client.fmt(f),
            Machine::Flight(flight) => flight.fmt(f),
        }
    }
}

/// An upstream request the core asked for, as the harness received it.
#[derive(Debug, Clone)]
pub struct SentRequest {
    /// Time since the start.
    pub at: Duration,
    /// Who sent it.
    pub machine: Machine,
    /// The backend's configured name.
    pub backend_name: String,
    /// The request itself.
    pub request: UpstreamRequest,
}

/// A response a client received, with a streamed body resolved to the held bytes.
#[derive(Debug, Clone)]
pub struct ClientResponse {
    /// Time since the start.
    pub at: Duration,
    /// The status.
    pub status: StatusCode,
    /// The headers the core set.
    pub headers: HeaderMap,
    /// The whole body (for a streamed response, the held upstream body).
    pub body: Bytes,
    /// The upstream answer whose held body was streamed, if any.
    pub streamed_from: Option<UpstreamId>,
    /// For a streamed merge: `Some`, with why its body was cut off when it was (the client saw
    /// a body that does not parse, and the connection end).
    pub merged: Option<Option<String>>,
}

impl ClientResponse {
    /// A header's value as text, if present and printable.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// The body as (lossy) text.
    pub fn body_str(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}
