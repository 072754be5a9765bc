//! The harness: one [`Estate`], the [`Exchange`]s of submitted client requests, fake backends and
//! a simulated clock, driven the way a runtime drives the core.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use bytes::Bytes;
use pdbmux_core::config::Config;
use pdbmux_core::{
    Admission, BackendId, BodyMode, ClientRequest, ClockAnchor, Estate, EstateOutput, Exchange,
    ExchangeOutput, FlightId, Planned, Response, ResponseBody, Translating, UpstreamBody,
    UpstreamId, UpstreamRequest, UpstreamResponse, WaiterId,
};

use crate::error::HarnessError;
use crate::record::{ClientId, ClientResponse, Machine, SentRequest};
use crate::script::{Asked, FakeBackend, ReplyOutcome};
use crate::setup::config_for;
use crate::store::{answer_text, describe, since, FakeStore};
use crate::transcript::{body_text, headers_text, target_text, Transcript};

#[derive(Debug)]
struct Client {
    request: ClientRequest,
    submitted: Duration,
    exchange: Option<Exchange>,
    /// While `exchange` is a PQL translation: the request it translates.
    translating: Option<Translating>,
    waiter: Option<WaiterId>,
    gone: bool,
    responses: Vec<ClientResponse>,
}

#[derive(Debug)]
struct InFlight {
    backend: BackendId,
    body_mode: BodyMode,
    /// Send order, the tie-break between replies due at the same instant.
    seq: u64,
    /// When the reply is delivered; `None` for a backend that never answers.
    due: Option<Instant>,
    outcome: ReplyOutcome,
}

type Key = (Machine, UpstreamId);

/// The next thing that happens on the simulated clock.
#[derive(Debug, Clone, Copy)]
enum Event {
    Reply(Key, Instant),
    Timer(Instant),
}

impl Event {
    fn at(self) -> Instant {
        match self {
            Event::Reply(_, at) | Event::Timer(at) => at,
        }
    }
}

/// Drives one estate and its exchanges against fake backends on a simulated clock.
///
/// The clock starts at one `Instant` captured at construction and only moves when
/// [`Harness::drive_bounded`] or [`Harness::run_until`] jump it to the next event: the earliest
/// of the machines' `poll_timeout` and the next scripted reply (a reply due at the same instant
/// as a deadline is delivered first). After every input the harness drains the machine's
/// `poll_output` and acts on each output as a runtime would: a `Send` asks the backend's script,
/// a `Cancel` drops the scheduled reply and any held body (see [`Harness::set_late_answers`]), a
/// respond is recorded for its client.
/// A run is deterministic: no hash order, no real clock after construction.
#[derive(Debug)]
pub struct Harness {
    estate: Estate,
    flights: BTreeMap<FlightId, Exchange>,
    backends: Vec<FakeBackend>,
    start: Instant,
    now: Instant,
    clients: Vec<Client>,
    waiters: BTreeMap<WaiterId, ClientId>,
    in_flight: BTreeMap<Key, InFlight>,
    issued: BTreeSet<Key>,
    held: BTreeMap<Key, Bytes>,
    sends: Vec<SentRequest>,
    transcript: Transcript,
    seq: u64,
    late_answers: bool,
    failure: Option<HarnessError>,
    /// The shared cache store the estate's `Store` requests go to (answered at once).
    store: FakeStore,
}

impl Harness {
    /// A harness over these backends (in configured order) with the core's default configuration,
    /// the harness's [`crate::DEFAULT_TIMEOUT`] and the prober off.
    pub fn new(backends: Vec<FakeBackend>) -> Result<Harness, HarnessError> {
        Harness::with_config(backends, |_| {})
    }

    /// Like [`Harness::new`], with `configure` applied to the configuration first.
    pub fn with_config(
        backends: Vec<FakeBackend>,
        configure: impl FnOnce(&mut Config),
    ) -> Result<Harness, HarnessError> {
        let mut config = config_for(&backends)?;
        configure(&mut config);
        // The one reading of the real clock; everything after is simulated.
        let start = Instant::now();
        Ok(Harness {
            estate: Estate::new(
                config,
                ClockAnchor {
                    instant: start,
                    wall: std::time::UNIX_EPOCH,
                },
            ),
            flights: BTreeMap::new(),
            backends,
            start,
            now: start,
            clients: Vec::new(),
            waiters: BTreeMap::new(),
            in_flight: BTreeMap::new(),
            issued: BTreeSet::new(),
            held: BTreeMap::new(),
            sends: Vec::new(),
            transcript: Transcript::default(),
            seq: 0,
            late_answers: false,
            failure: None,
            store: FakeStore::default(),
        })
    }

    /// Answers the estate's shared-store requests from `store` (shared with other harnesses:
    /// other replicas) instead of a store of its own.
    pub fn set_store(&mut self, store: FakeStore) {
        self.store = store;
    }

    /// The shared store the estate's requests go to.
    pub fn store(&self) -> &FakeStore {
        &self.store
    }

    /// The estate's numbers now (for metrics and the shared tier's state).
    pub fn stats(&self) -> pdbmux_core::stats::EstateStats {
        self.estate.stats(self.now)
    }

    /// Models the race where an answer is already on its way when the core cancels it: with
    /// `on`, a cancelled request that has a scripted reply is still delivered at its due time, and
    /// the core must ignore it (and cancel a held body again). Off by default.
    pub fn set_late_answers(&mut self, on: bool) {
        self.late_answers = on;
    }

    /// The configuration the estate runs on.
    pub fn config(&self) -> &Config {
        self.estate.config()
    }

    /// Simulated time since the start.
    pub fn elapsed(&self) -> Duration {
        self.now.duration_since(self.start)
    }

    /// The transcript so far, one event per line.
    pub fn transcript(&self) -> String {
        self.transcript.render()
    }

    /// The transcript lines so far.
    pub fn transcript_lines(&self) -> &[String] {
        self.transcript.lines()
    }

    /// Every upstream request sent so far, in order.
    pub fn sends(&self) -> &[SentRequest] {
        &self.sends
    }

    /// How many clients were submitted.
    pub fn client_count(&self) -> usize {
        self.clients.len()
    }

    /// The request a client submitted.
    pub fn request(&self, client: ClientId) -> Result<&ClientRequest, HarnessError> {
        self.client(client).map(|c| &c.request)
    }

    /// When a client was submitted, relative to the start.
    pub fn submitted_at(&self, client: ClientId) -> Result<Duration, HarnessError> {
        self.client(client).map(|c| c.submitted)
    }

    /// Every response a client received so far (a conforming core gives exactly one).
    pub fn responses(&self, client: ClientId) -> Result<&[ClientResponse], HarnessError> {
        self.client(client).map(|c| c.responses.as_slice())
    }

    /// The client's one response; an error when it got none or several.
    pub fn response(&self, client: ClientId) -> Result<&ClientResponse, HarnessError> {
        match self.responses(client)? {
            [response] => Ok(response),
            responses => Err(HarnessError::ResponseCount {
                client: client.to_string(),
                count: responses.len(),
            }),
        }
    }

    /// Submits a client request at the current simulated time and acts on the estate's decision.
    pub fn submit(&mut self, request: ClientRequest) -> ClientId {
        let id = ClientId(self.clients.len());
        let mut line = format!("{id} {} {}", request.method, target_text(&request.target));
        if request.header_count > 0 || request.header_bytes > 0 {
            line.push_str(&format!(
                " [headers={} header_bytes={}]",
                request.header_count, request.header_bytes
            ));
        }
        self.log(line);
        let planned = pdbmux_core::plan(&request, self.estate.config());
        let admission = self.estate.admit(self.now, planned);
        self.clients.push(Client {
            request,
            submitted: self.elapsed(),
            exchange: None,
            translating: None,
            waiter: None,
            gone: false,
            responses: Vec::new(),
        });
        self.admitted(id, admission);
        self.drain(Machine::Estate);
        id
    }

    /// Acts on the estate's decision about a client's request.
    fn admitted(&mut self, id: ClientId, admission: Admission) {
        match admission {
            Admission::Respond(response) => self.record_response(id, response),
            Admission::Exchange(exchange) => {
                self.clients[id.0].exchange = Some(exchange);
                self.drain(Machine::Exchange(id));
            }
            Admission::Wait(waiter) => {
                self.clients[id.0].waiter = Some(waiter);
                self.waiters.insert(waiter, id);
            }
            Admission::Translate {
                exchange,
                translating,
            } => {
                self.log(format!("{id} translate"));
                self.clients[id.0].exchange = Some(exchange);
                self.clients[id.0].translating = Some(translating);
                self.drain(Machine::Exchange(id));
            }
            Admission::Flight {
                flight,
                waiter,
                exchange,
            } => {
                self.clients[id.0].waiter = Some(waiter);
                self.waiters.insert(waiter, id);
                self.log(format!("{id} leads {flight}"));
                self.flights.insert(flight, exchange);
                self.drain(Machine::Flight(flight));
            }
        }
    }

    /// The estate resumed a waiting client: admit its request again.
    fn resume(&mut self, waiter: WaiterId, planned: Planned) {
        let Some(id) = self.waiters.remove(&waiter) else {
            return self.fail(HarnessError::UnknownWaiter(waiter.to_string()));
        };
        self.log(format!("{id} resume ({waiter})"));
        self.clients[id.0].waiter = None;
        let admission = self.estate.readmit(self.now, planned);
        self.admitted(id, admission);
    }

    /// Submits `GET target`.
    pub fn get(&mut self, target: &str) -> ClientId {
        self.submit(ClientRequest::get(target))
    }

    /// The client went away: a waiter is reported to the estate; an exchange is dropped and its
    /// upstream requests are abandoned, as a runtime does when the request's task ends.
    pub fn disconnect(&mut self, client: ClientId) -> Result<(), HarnessError> {
        self.client(client)?;
        let machine = Machine::Exchange(client);
        let aborted: Vec<Key> = self
            .in_flight
            .keys()
            .filter(|(m, _)| *m == machine)
            .copied()
            .collect();
        let mut line = format!("{client} gone");
        if !aborted.is_empty() {
            let ids: Vec<String> = aborted.iter().map(|(_, id)| id.to_string()).collect();
            line.push_str(&format!(" (aborted {})", ids.join(", ")));
        }
        self.log(line);
        for key in aborted {
            self.in_flight.remove(&key);
        }
        self.held.retain(|(m, _), _| *m != machine);
        let state = &mut self.clients[client.0];
        state.gone = true;
        state.exchange = None;
        if let Some(waiter) = state.waiter.take() {
            self.waiters.remove(&waiter);
            self.estate.handle_waiter_gone(self.now, waiter);
            self.drain(Machine::Estate);
        }
        Ok(())
    }

    /// Runs until quiescent (no deadline and no scripted reply pending), one event per step.
    /// Fails after `max_steps` steps instead of hanging, or as soon as the core breaks its
    /// contract. Returns the number of steps taken.
    pub fn drive_bounded(&mut self, max_steps: usize) -> Result<usize, HarnessError> {
        self.drive(max_steps, None)
    }

    /// Runs every event up to `offset` after the start, then moves the clock to exactly `offset`
    /// (never backwards), so the next [`Harness::submit`] happens then. Fails like
    /// [`Harness::drive_bounded`].
    pub fn run_until(&mut self, offset: Duration, max_steps: usize) -> Result<usize, HarnessError> {
        let until = self.start + offset;
        let steps = self.drive(max_steps, Some(until))?;
        self.now = self.now.max(until);
        Ok(steps)
    }

    /// Checks the end state of a run: every client still there got exactly one response, no
    /// upstream request is left in flight, no held body is left unstreamed and uncancelled, and
    /// the core broke no contract on the way.
    pub fn check_quiescent(&self) -> Result<(), HarnessError> {
        if let Some(failure) = &self.failure {
            return Err(failure.clone());
        }
        for (index, client) in self.clients.iter().enumerate() {
            if !client.gone && client.responses.len() != 1 {
                return Err(HarnessError::ResponseCount {
                    client: ClientId(index).to_string(),
                    count: client.responses.len(),
                });
            }
        }
        if !self.in_flight.is_empty() {
            let keys: Vec<String> = self
                .in_flight
                .keys()
                .map(|(m, id)| format!("{m} {id}"))
                .collect();
            return Err(HarnessError::LeftInFlight(keys.join(", ")));
        }
        if !self.held.is_empty() {
            let keys: Vec<String> = self
                .held
                .keys()
                .map(|(m, id)| format!("{m} {id}"))
                .collect();
            return Err(HarnessError::LeakedHeldBodies(keys.join(", ")));
        }
        Ok(())
    }

    /// Checks a run that cannot become quiescent (the health prober keeps a timer for ever):
    /// every client still there got exactly one response and the core broke no contract. Upstream
    /// requests may still be in flight (a probe, say).
    pub fn check_answered(&self) -> Result<(), HarnessError> {
        if let Some(failure) = &self.failure {
            return Err(failure.clone());
        }
        for (index, client) in self.clients.iter().enumerate() {
            if !client.gone && client.responses.len() != 1 {
                return Err(HarnessError::ResponseCount {
                    client: ClientId(index).to_string(),
                    count: client.responses.len(),
                });
            }
        }
        Ok(())
    }

    /// The names of the backends a client's own exchange sent upstream requests to, in send
    /// order (the estate's membership fetches and probes are not the exchange's).
    pub fn exchange_backends(&self, client: ClientId) -> Vec<String> {
        self.sends
            .iter()
            .filter(|sent| sent.machine == Machine::Exchange(client))
            .map(|sent| sent.backend_name.clone())
            .collect()
    }

    fn client(&self, client: ClientId) -> Result<&Client, HarnessError> {
        self.clients
            .get(client.0)
            .ok_or_else(|| HarnessError::UnknownClient(client.to_string()))
    }

    fn log(&mut self, line: impl AsRef<str>) {
        let at = self.elapsed();
        self.transcript.push(at, line);
    }

    fn fail(&mut self, error: HarnessError) {
        self.log(format!("HARNESS FAILURE: {error}"));
        self.failure.get_or_insert(error);
    }

    fn drive(&mut self, max_steps: usize, until: Option<Instant>) -> Result<usize, HarnessError> {
        let mut steps = 0;
        loop {
            if let Some(failure) = &self.failure {
                return Err(failure.clone());
            }
            let Some(event) = self.next_event() else {
                return Ok(steps);
            };
            if until.is_some_and(|until| event.at() > until) {
                return Ok(steps);
            }
            if steps >= max_steps {
                return Err(HarnessError::Livelock {
                    steps,
                    at: self.elapsed(),
                });
            }
            steps += 1;
            self.now = self.now.max(event.at());
            match event {
                Event::Reply(key, _) => self.deliver(key),
                Event::Timer(_) => self.fire_timers(),
            }
        }
    }

    /// The earliest scripted reply (ties in send order) or machine deadline; replies first.
    fn next_event(&self) -> Option<Event> {
        let reply = self
            .in_flight
            .iter()
            .filter_map(|(key, flight)| flight.due.map(|due| (due, flight.seq, *key)))
            .min();
        let timer = self.machine_deadlines().into_iter().map(|(_, at)| at).min();
        match (reply, timer) {
            (Some((due, _, key)), Some(timer)) if due <= timer => Some(Event::Reply(key, due)),
            (Some((due, _, key)), None) => Some(Event::Reply(key, due)),
            (_, Some(timer)) => Some(Event::Timer(timer)),
            (None, None) => None,
        }
    }

    /// Every machine's current deadline, estate first, then exchanges in client order.
    fn machine_deadlines(&self) -> Vec<(Machine, Instant)> {
        let mut deadlines = Vec::new();
        if let Some(at) = self.estate.poll_timeout() {
            deadlines.push((Machine::Estate, at));
        }
        for (index, client) in self.clients.iter().enumerate() {
            if let Some(at) = client.exchange.as_ref().and_then(Exchange::poll_timeout) {
                deadlines.push((Machine::Exchange(ClientId(index)), at));
            }
        }
        for (flight, exchange) in &self.flights {
            if let Some(at) = exchange.poll_timeout() {
                deadlines.push((Machine::Flight(*flight), at));
            }
        }
        deadlines
    }

    fn fire_timers(&mut self) {
        let due: Vec<Machine> = self
            .machine_deadlines()
            .into_iter()
            .filter(|(_, at)| *at <= self.now)
            .map(|(machine, _)| machine)
            .collect();
        for machine in due {
            self.log(format!("{machine} timeout"));
            match machine {
                Machine::Estate => self.estate.handle_timeout(self.now),
                Machine::Exchange(client) => {
                    if let Some(exchange) = self.clients[client.0].exchange.as_mut() {
                        exchange.handle_timeout(self.now);
                    }
                }
                Machine::Flight(flight) => {
                    if let Some(exchange) = self.flights.get_mut(&flight) {
                        exchange.handle_timeout(self.now);
                    }
                }
            }
            self.drain(machine);
            let next = match machine {
                Machine::Estate => self.estate.poll_timeout(),
                Machine::Exchange(client) => self.clients[client.0]
                    .exchange
                    .as_ref()
                    .and_then(Exchange::poll_timeout),
                Machine::Flight(flight) => {
                    self.flights.get(&flight).and_then(Exchange::poll_timeout)
                }
            };
            if let Some(at) = next.filter(|at| *at <= self.now) {
                let at = at.saturating_duration_since(self.start);
                self.fail(HarnessError::StuckDeadline {
                    machine: machine.to_string(),
                    at,
                });
            }
        }
    }

    /// Delivers a scripted reply to the machine that sent the request.
    fn deliver(&mut self, key: Key) {
        let Some(flight) = self.in_flight.remove(&key) else {
            return;
        };
        let (machine, id) = key;
        let backend = self.backend_name(flight.backend);
        enum Input {
            Response(UpstreamResponse),
            Failure(pdbmux_core::UpstreamFailure),
        }
        let input = match flight.outcome {
            ReplyOutcome::Never => return,
            ReplyOutcome::Fail(failure) => {
                self.log(format!("{machine} {id} <- {backend} failed: {failure}"));
                Input::Failure(failure)
            }
            ReplyOutcome::Answer(answer) => {
                let headers = match answer.header_map() {
                    Ok(headers) => headers,
                    Err(error) => return self.fail(error),
                };
                // The scripted backends frame their answers as chunked, as PuppetDB does, unless
                // a script gives a Content-Length (then a short answer is read whole).
                let declared = answer
                    .headers
                    .iter()
                    .find(|(name, _)| name.eq_ignore_ascii_case("content-length"))
                    .and_then(|(_, value)| value.parse().ok());
                let held = flight.body_mode.holds(answer.status, declared);
                let content_type = answer.content_type.as_deref().unwrap_or("-");
                let extra = if answer.headers.is_empty() {
                    String::new()
                } else {
                    let pairs: Vec<String> = answer
                        .headers
                        .iter()
                        .map(|(n, v)| format!("{n}={v}"))
                        .collect();
                    format!(" [{}]", pairs.join(" "))
                };
                self.log(format!(
                    "{machine} {id} <- {backend} {}{extra} {content_type} {}{}",
                    answer.status.as_u16(),
                    if held { "held:" } else { "" },
                    body_text(&answer.body)
                ));
                let body = if held {
                    self.held.insert(key, answer.body);
                    UpstreamBody::Held
                } else {
                    UpstreamBody::Full(answer.body)
                };
                Input::Response(UpstreamResponse {
                    status: answer.status,
                    headers,
                    body,
                })
            }
        };
        let now = self.now;
        match machine {
            Machine::Estate => match input {
                Input::Response(response) => {
                    self.estate.handle_upstream_response(now, id, response)
                }
                Input::Failure(failure) => self.estate.handle_upstream_failure(now, id, failure),
            },
            Machine::Exchange(client) => {
                let Some(exchange) = self.clients[client.0].exchange.as_mut() else {
                    return;
                };
                match input {
                    Input::Response(response) => {
                        exchange.handle_upstream_response(now, id, response)
                    }
                    Input::Failure(failure) => exchange.handle_upstream_failure(now, id, failure),
                }
            }
            Machine::Flight(flight) => {
                let Some(exchange) = self.flights.get_mut(&flight) else {
                    return;
                };
                match input {
                    Input::Response(response) => {
                        exchange.handle_upstream_response(now, id, response)
                    }
                    Input::Failure(failure) => exchange.handle_upstream_failure(now, id, failure),
                }
            }
        }
        self.drain(machine);
    }

    /// Drains a machine's outputs and acts on each.
    fn drain(&mut self, machine: Machine) {
        match machine {
            Machine::Estate => {
                while let Some(output) = self.estate.poll_output() {
                    match output {
                        EstateOutput::Send(request) => self.on_send(machine, request),
                        EstateOutput::Cancel(id) => self.on_cancel(machine, id),
                        EstateOutput::Respond { waiter, response } => {
                            match self.waiters.remove(&waiter) {
                                Some(client) => self.record_response(client, response),
                                None => self.fail(HarnessError::UnknownWaiter(waiter.to_string())),
                            }
                        }
                        EstateOutput::Resume { waiter, planned } => self.resume(waiter, *planned),
                        EstateOutput::CancelFlight(flight) => self.cancel_flight(flight),
                        EstateOutput::StartFlight { flight, exchange } => {
                            self.log(format!("{flight} starts"));
                            self.flights.insert(flight, exchange);
                            self.drain(Machine::Flight(flight));
                        }
                        EstateOutput::Store(request) => {
                            let at = since(self.start, self.now);
                            let answer = self.store.answer(at, &request.op);
                            let line = format!(
                                "store {} -> {}",
                                describe(&request.op),
                                answer_text(&answer)
                            );
                            self.log(line);
                            self.estate
                                .handle_store_answer(self.now, request.id, answer);
                        }
                    }
                }
            }
            Machine::Exchange(client) => {
                let Some(exchange) = self.clients[client.0].exchange.as_mut() else {
                    return;
                };
                let outputs: Vec<ExchangeOutput> =
                    std::iter::from_fn(|| exchange.poll_output()).collect();
                for output in outputs {
                    match output {
                        ExchangeOutput::Send(request) => self.on_send(machine, request),
                        ExchangeOutput::Cancel(id) => self.on_cancel(machine, id),
                        ExchangeOutput::Respond(response) => {
                            let report = self.clients[client.0]
                                .exchange
                                .as_ref()
                                .map(Exchange::report);
                            if let Some(report) = report {
                                self.estate.handle_report(self.now, report);
                            }
                            match self.clients[client.0].translating.take() {
                                Some(translating) => {
                                    self.log(format!(
                                        "{client} translated: {}",
                                        response.status.as_u16()
                                    ));
                                    // The translation's exchange is done: the next one
                                    // on this client's task numbers its requests afresh.
                                    self.clients[client.0].exchange = None;
                                    self.issued.retain(|(m, _)| *m != machine);
                                    self.in_flight.retain(|(m, _), _| *m != machine);
                                    self.held.retain(|(m, _), _| *m != machine);
                                    let admission = self.estate.handle_translated(
                                        self.now,
                                        translating,
                                        response,
                                    );
                                    self.admitted(client, admission);
                                    self.drain(Machine::Estate);
                                }
                                None => self.record_response(client, response),
                            }
                        }
                    }
                }
            }
            Machine::Flight(flight) => {
                let Some(exchange) = self.flights.get_mut(&flight) else {
                    return;
                };
                let outputs: Vec<ExchangeOutput> =
                    std::iter::from_fn(|| exchange.poll_output()).collect();
                for output in outputs {
                    match output {
                        ExchangeOutput::Send(request) => self.on_send(machine, request),
                        ExchangeOutput::Cancel(id) => self.on_cancel(machine, id),
                        ExchangeOutput::Respond(response) => {
                            if let Some(exchange) = self.flights.get(&flight) {
                                self.estate.handle_report(self.now, exchange.report());
                            }
                            self.flights.remove(&flight);
                            self.log(format!("{flight} done: {}", response.status.as_u16()));
                            self.estate.handle_flight_done(self.now, flight, response);
                            self.drain(Machine::Estate);
                        }
                    }
                }
            }
        }
    }

    /// The estate cancelled a flight nobody waits for: drop its exchange and abandon its requests.
    fn cancel_flight(&mut self, flight: FlightId) {
        let machine = Machine::Flight(flight);
        self.flights.remove(&flight);
        let aborted: Vec<Key> = self
            .in_flight
            .keys()
            .filter(|(m, _)| *m == machine)
            .copied()
            .collect();
        let ids: Vec<String> = aborted.iter().map(|(_, id)| id.to_string()).collect();
        self.log(format!("{flight} cancelled (aborted {})", ids.join(", ")));
        for key in aborted {
            self.in_flight.remove(&key);
        }
        self.held.retain(|(m, _), _| *m != machine);
    }

    fn on_send(&mut self, machine: Machine, request: UpstreamRequest) {
        let key = (machine, request.id);
        if !self.issued.insert(key) {
            return self.fail(HarnessError::DuplicateId {
                machine: machine.to_string(),
                id: request.id.to_string(),
            });
        }
        let Some(backend) = self.backends.get_mut(request.backend.0) else {
            return self.fail(HarnessError::UnknownBackend {
                machine: machine.to_string(),
                id: request.id.to_string(),
                backend: request.backend.0,
            });
        };
        let reply = backend.reply_to_request(&Asked::of(&request));
        let name = backend.name.clone();
        let mode = match request.body_mode {
            BodyMode::Buffer => "buffer",
            BodyMode::StreamSuccess => "stream",
        };
        let body = match &request.body {
            Some(body) => format!(" body={}", body_text(body)),
            None => String::new(),
        };
        self.log(format!(
            "{machine} send {} -> {name} {} {}{body} ({mode}, deadline +{}ms)",
            request.id,
            request.method,
            target_text(&request.path_and_query),
            request
                .deadline
                .saturating_duration_since(self.start)
                .as_millis()
        ));
        let Some(reply) = reply else {
            return self.fail(HarnessError::ScriptExhausted {
                backend: name,
                path: request.path_and_query,
            });
        };
        let due = match reply.outcome {
            ReplyOutcome::Never => None,
            _ => Some(self.now + reply.latency),
        };
        self.seq += 1;
        self.in_flight.insert(
            key,
            InFlight {
                backend: request.backend,
                body_mode: request.body_mode,
                seq: self.seq,
                due,
                outcome: reply.outcome,
            },
        );
        self.sends.push(SentRequest {
            at: self.elapsed(),
            machine,
            backend_name: name,
            request,
        });
    }

    fn on_cancel(&mut self, machine: Machine, id: UpstreamId) {
        let key = (machine, id);
        if !self.issued.contains(&key) {
            return self.fail(HarnessError::UnknownCancel {
                machine: machine.to_string(),
                id: id.to_string(),
            });
        }
        let late = self.late_answers
            && self
                .in_flight
                .get(&key)
                .is_some_and(|flight| flight.due.is_some());
        if !late {
            self.in_flight.remove(&key);
        }
        let dropped = self.held.remove(&key).is_some();
        let note = match (dropped, late) {
            (true, _) => " (held body dropped)",
            (false, true) => " (its answer is already on the way)",
            (false, false) => "",
        };
        self.log(format!("{machine} cancel {id}{note}"));
    }

    fn record_response(&mut self, client: ClientId, response: Response) {
        let machine = Machine::Exchange(client);
        let (body, streamed_from) = match response.body {
            ResponseBody::Full(bytes) => (bytes, None),
            ResponseBody::Upstream(id) => match self.held.remove(&(machine, id)) {
                Some(bytes) => (bytes, Some(id)),
                None => {
                    self.fail(HarnessError::MissingHeldBody {
                        machine: machine.to_string(),
                        id: id.to_string(),
                    });
                    (Bytes::new(), Some(id))
                }
            },
        };
        let headers = headers_text(&response.headers);
        let body_label = match streamed_from {
            Some(id) => format!("body=stream({id}) "),
            None => "body=".to_owned(),
        };
        self.log(format!(
            "{client} respond {}{}{headers} {body_label}{}",
            response.status.as_u16(),
            if headers.is_empty() { "" } else { " " },
            body_text(&body)
        ));
        let at = self.elapsed();
        self.clients[client.0].responses.push(ClientResponse {
            at,
            status: response.status,
            headers: response.headers,
            body,
            streamed_from,
        });
    }

    fn backend_name(&self, backend: BackendId) -> String {
        self.backends
            .get(backend.0)
            .map_or_else(|| backend.to_string(), |b| b.name.clone())
    }
}

#[cfg(test)]
mod tests {
    use http::StatusCode;

    use super::*;
    use crate::script::{ms, Reply};

    fn one_backend(replies: Vec<Reply>) -> Harness {
        Harness::new(vec![FakeBackend::queue("pdb-a", "http://a:8080", replies)]).expect("valid")
    }

    #[test]
    fn the_step_budget_turns_a_hang_into_an_error() {
        let mut h = one_backend(vec![Reply::never()]);
        let c = h.get("/pdb/meta/v1/version");
        assert!(matches!(
            h.drive_bounded(0),
            Err(HarnessError::Livelock { steps: 0, .. })
        ));
        assert_eq!(h.drive_bounded(10), Ok(1));
        assert_eq!(h.response(c).map(|r| r.status), Ok(StatusCode::BAD_GATEWAY));
        assert_eq!(h.elapsed(), crate::DEFAULT_TIMEOUT);
        assert_eq!(h.check_quiescent(), Ok(()));
    }

    #[test]
    fn an_exhausted_script_fails_the_run() {
        let mut h = one_backend(vec![]);
        h.get("/pdb/meta/v1/version");
        assert!(matches!(
            h.drive_bounded(10),
            Err(HarnessError::ScriptExhausted { .. })
        ));
    }

    #[test]
    fn the_clock_jumps_to_the_next_event_and_run_until_stops_there() {
        let mut h = one_backend(vec![Reply::ok(r#"{"version":"1"}"#).after(ms(7))]);
        let c = h.get("/pdb/meta/v1/version");
        assert_eq!(h.run_until(ms(3), 10), Ok(0));
        assert_eq!(h.elapsed(), ms(3));
        assert_eq!(h.drive_bounded(10), Ok(1));
        assert_eq!(h.elapsed(), ms(7));
        assert_eq!(h.response(c).map(|r| r.at), Ok(ms(7)));
    }

    #[test]
    fn a_client_that_left_has_no_response() {
        let mut h = one_backend(vec![Reply::never()]);
        let c = h.get("/pdb/query/v4/catalog-inputs");
        assert_eq!(h.disconnect(c), Ok(()));
        assert_eq!(h.drive_bounded(10), Ok(0));
        assert!(matches!(
            h.response(c),
            Err(HarnessError::ResponseCount { count: 0, .. })
        ));
        assert_eq!(h.check_quiescent(), Ok(()));
        assert!(
            h.transcript().contains("c0 gone (aborted u0)"),
            "{}",
            h.transcript()
        );
    }
}
