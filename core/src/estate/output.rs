//! What the estate tells its runtime: how a client request is admitted ([`Admission`]) and the
//! work it asks for ([`EstateOutput`]). The contract that ties them together is [`Estate`](super::Estate)'s.

use crate::cache::shared::StoreRequest;
use crate::exchange::Exchange;
use crate::ids::{FlightId, UpstreamId, WaiterId};
use crate::message::{Response, UpstreamRequest};
use crate::policy::Planned;
use crate::root::Translating;

/// What to do with a client request; returned by [`Estate::admit`](super::Estate::admit).
#[derive(Debug)]
pub enum Admission {
    /// Answer with this right away (a refusal); no backend is asked.
    Respond(Response),
    /// Drive this exchange on the request's own task until it responds.
    Exchange(Exchange),
    /// Wait: the estate later emits [`EstateOutput::Respond`] or [`EstateOutput::Resume`] for this
    /// waiter.
    Wait(WaiterId),
    /// Start a shared flight: drive `exchange` on a task of its own (not the client's, so the
    /// client leaving cannot cancel it), hand its response to [`Estate::handle_flight_done`](super::Estate::handle_flight_done), and
    /// wait for this waiter's [`EstateOutput::Respond`] like any other waiter.
    Flight {
        /// The flight to report back on.
        flight: FlightId,
        /// The client that started it.
        waiter: WaiterId,
        /// The fan-out to drive.
        exchange: Exchange,
    },
    /// PQL whose translation is not known: drive `exchange` (the translation request) on the
    /// request's own task and hand its response, with `translating`, to
    /// [`Estate::handle_translated`](super::Estate::handle_translated), which admits the translated query.
    Translate {
        /// The translation request to drive.
        exchange: Exchange,
        /// The request it translates.
        translating: Translating,
    },
}

/// What the [`Estate`](super::Estate) asks of the runtime; drain with [`Estate::poll_output`](super::Estate::poll_output).
#[derive(Debug)]
pub enum EstateOutput {
    /// Send this request upstream; report the answer to [`Estate::handle_upstream_response`](super::Estate::handle_upstream_response) or
    /// [`Estate::handle_upstream_failure`](super::Estate::handle_upstream_failure).
    Send(UpstreamRequest),
    /// Abandon this upstream request.
    Cancel(UpstreamId),
    /// Answer the client behind this waiter.
    Respond {
        /// Who is waiting.
        waiter: WaiterId,
        /// The answer.
        response: Response,
    },
    /// What the waiter waited for (the first membership map) is ready: admit its request again
    /// with [`Estate::readmit`](super::Estate::readmit).
    Resume {
        /// Who is waiting.
        waiter: WaiterId,
        /// Its request, as planned.
        planned: Box<Planned>,
    },
    /// Every participant of this flight left: abort its task, releasing its upstream requests.
    CancelFlight(FlightId),
    /// Carry this request to the shared cache store; hand its answer to
    /// [`Estate::handle_store_answer`](super::Estate::handle_store_answer).
    Store(StoreRequest),
    /// Start this flight's fan-out now (the shared store did not answer it): drive `exchange` on
    /// a task of its own and hand its response to [`Estate::handle_flight_done`](super::Estate::handle_flight_done), as for
    /// [`Admission::Flight`].
    StartFlight {
        /// The flight.
        flight: FlightId,
        /// Its fan-out.
        exchange: Exchange,
    },
}
