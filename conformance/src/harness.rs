//! The harness: the real estate host (`pdbmux_driver::EstateHost`, its exchanges, flights,
//! waiters and estate task) on the simulated runtime, fake backends and a simulated clock.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use pdbmux_core::config::Config;
use pdbmux_core::{ClientRequest, ResponseBody};
use pdbmux_driver::{ClientAnswer, ClientContext, EstateHost, Task};

use crate::error::HarnessError;
use crate::record::{ClientId, ClientResponse, Machine, SentRequest};
use crate::script::FakeBackend;
use crate::setup::config_for;
use crate::sim::{Answered, Sim, SimTask};
use crate::store::FakeStore;
use crate::transcript::{body_text, headers_text, target_text, Transcript};

#[derive(Debug)]
struct Client {
    request: ClientRequest,
    submitted: Duration,
    /// The task answering it (see [`Harness::disconnect`]).
    task: u64,
    gone: bool,
    responses: Vec<ClientResponse>,
}

/// Drives the real estate host and its exchanges against fake backends on a simulated clock.
///
/// Each client request runs on its own simulated task, as a connection's task would run
/// [`EstateHost::answer`]; the host spawns its estate task, flights, and the estate's own
/// upstream calls and store requests on the same runtime. The clock starts at one `Instant`
/// captured at construction and only moves when [`Harness::drive_bounded`] or
/// [`Harness::run_until`] take a step: to the earliest scripted reply or timer (a reply due at
/// the same instant as a timer is delivered first), after which every task that was woken
/// runs until it waits again. Every send, answer, timeout, cancellation, flight and response
/// is written to the transcript. A run is deterministic: no hash order, no real clock after
/// construction.
pub struct Harness {
    sim: Sim,
    host: Arc<EstateHost<Sim>>,
    config: Arc<Config>,
    store: FakeStore,
    start: Instant,
    clients: Vec<Client>,
    transcript: Transcript,
    sends: Vec<SentRequest>,
}

impl std::fmt::Debug for Harness {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Harness")
            .field("clients", &self.clients)
            .field("elapsed", &self.elapsed())
            .finish_non_exhaustive()
    }
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
        let sim = Sim::new(backends, start);
        let build = pdbmux_driver::Build {
            binary: "pdbmux-conformance",
            version: env!("CARGO_PKG_VERSION"),
        };
        // Started as a binary starts it (its clients, sealer, metrics, the estate's task).
        let host = EstateHost::start(config, sim.clone(), build)
            .map_err(|error| HarnessError::Start(error.to_string()))?;
        host.spawn_driver().detach();
        let store = sim.world().store.clone();
        let mut harness = Harness {
            config: host.config(),
            store,
            sim,
            host,
            start,
            clients: Vec::new(),
            transcript: Transcript::default(),
            sends: Vec::new(),
        };
        harness.settle();
        Ok(harness)
    }

    /// Answers the estate's shared-store requests from `store` (shared with other harnesses:
    /// other replicas) instead of a store of its own.
    pub fn set_store(&mut self, store: FakeStore) {
        self.sim.world().store = store.clone();
        self.store = store;
    }

    /// The shared store the estate's requests go to.
    pub fn store(&self) -> &FakeStore {
        &self.store
    }

    /// The estate's numbers now (for metrics and the shared tier's state).
    pub fn stats(&self) -> pdbmux_core::stats::EstateStats {
        self.host.stats()
    }

    /// pdbmux's own metrics as a scrape of `/metrics` reads them now (`None`: the configuration
    /// has no `metrics_listen`, so there are none).
    pub fn metrics_text(&self) -> Option<String> {
        let metrics = self.host.metrics()?;
        match metrics.answer(&http::Method::GET, "/metrics", None).body {
            ResponseBody::Full(bytes) => Some(String::from_utf8_lossy(&bytes).into()),
            other => panic!("a scrape is answered whole: {other:?}"),
        }
    }

    /// Models answers arriving together: with `on`, every scripted reply due at one instant is
    /// delivered before any task runs, so an answer can already be on its way when the core
    /// cancels its request (the driver must drop it unread). Off by default: one reply per
    /// step.
    pub fn set_late_answers(&mut self, on: bool) {
        self.sim.world().late_answers = on;
    }

    /// Held bodies give each read at most `bytes` (64 KiB by default, a socket read's worth):
    /// smaller pieces put a body's first bytes in several reads.
    pub fn set_piece_bytes(&mut self, bytes: usize) {
        self.sim.world().piece_bytes = bytes.max(1);
    }

    /// Reloads (as a SIGHUP does) with the running configuration changed by `configure`, at
    /// the current simulated time.
    pub fn reload(&mut self, configure: impl FnOnce(&mut Config)) {
        let mut config = (*self.config).clone();
        configure(&mut config);
        self.host.reconfigure(config, ());
        self.config = self.host.config();
        self.settle();
    }

    /// The configuration the estate runs on.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Simulated time since the start.
    pub fn elapsed(&self) -> Duration {
        self.sim.world().elapsed()
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

    /// Every response a client received so far (a conforming host gives exactly one).
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

    /// Submits a client request at the current simulated time: its task starts answering it at
    /// once and runs until it waits.
    pub fn submit(&mut self, request: ClientRequest) -> ClientId {
        self.submit_with(request, &[])
    }

    /// [`Harness::submit`] for a request whose head carried these header fields (an
    /// `X-Request-Id`, a `traceparent`); without one the request id is the client's name (`c0`).
    pub fn submit_with(&mut self, request: ClientRequest, fields: &[(&str, &str)]) -> ClientId {
        let id = ClientId(self.clients.len());
        let own_id = id.to_string();
        let context = ClientContext::new(
            None,
            [("x-request-id", own_id.as_bytes())]
                .into_iter()
                .filter(|_| {
                    !fields
                        .iter()
                        .any(|(n, _)| n.eq_ignore_ascii_case("x-request-id"))
                })
                .chain(fields.iter().map(|(n, v)| (*n, v.as_bytes()))),
        );
        let mut line = format!("{id} {} {}", request.method, target_text(&request.target));
        if request.header_count > 0 || request.header_bytes > 0 {
            line.push_str(&format!(
                " [headers={} header_bytes={}]",
                request.header_count, request.header_bytes
            ));
        }
        let submitted = {
            let mut world = self.sim.world();
            world.log(line);
            world.elapsed()
        };
        let host = Arc::clone(&self.host);
        let sim = self.sim.clone();
        let asked = request.clone();
        let task: SimTask = self
            .sim
            .spawn_for(Machine::Exchange(id), false, async move {
                let answer = host.answer(&asked, &context).await;
                record(&sim, id, answer).await;
            });
        self.clients.push(Client {
            request,
            submitted,
            task: task.id(),
            gone: false,
            responses: Vec::new(),
        });
        self.settle();
        id
    }

    /// Submits `GET target`.
    pub fn get(&mut self, target: &str) -> ClientId {
        self.submit(ClientRequest::get(target))
    }

    /// Makes `client` leave once it has read the first bytes of a streamed merge's body: the
    /// rest is never read, and the merge (with the upstream bodies it holds) is dropped.
    pub fn leave_mid_body(&mut self, client: ClientId) {
        self.sim.world().leave_mid_body.insert(client.0);
    }

    /// Makes `client` stop reading a streamed merge's body for `pause` once it has read its
    /// first bytes, as a client on a stalled connection does; it then reads on.
    pub fn stall_mid_body(&mut self, client: ClientId, pause: Duration) {
        self.sim.world().stall_mid_body.insert(client.0, pause);
    }

    /// The client went away: its task is dropped, as a runtime drops a connection's task, which
    /// abandons its upstream requests or tells the estate it no longer waits.
    pub fn disconnect(&mut self, client: ClientId) -> Result<(), HarnessError> {
        let task = self.client(client)?.task;
        self.sim.world().log(format!("{client} gone"));
        self.clients[client.0].gone = true;
        self.sim.cancel(task);
        self.settle();
        Ok(())
    }

    /// Runs until quiescent (no timer and no scripted reply pending), one event per step.
    /// Fails after `max_steps` steps instead of hanging, or as soon as the host breaks its
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
        let mut world = self.sim.world();
        world.now = world.now.max(until);
        Ok(steps)
    }

    /// Checks the end state of a run: every client still there got exactly one response, no
    /// upstream request is left in flight, no task panicked but by script, and the host broke
    /// no contract on the way.
    pub fn check_quiescent(&self) -> Result<(), HarnessError> {
        self.check_answered()?;
        let left = self.sim.world().calls_in_flight();
        if !left.is_empty() {
            return Err(HarnessError::LeftInFlight(left.join(", ")));
        }
        Ok(())
    }

    /// Checks a run that cannot become quiescent (the health prober keeps a timer for ever):
    /// every client still there got exactly one response, no task panicked but by script, and
    /// the host broke no contract. Upstream requests may still be in flight (a probe, say).
    pub fn check_answered(&self) -> Result<(), HarnessError> {
        let world = self.sim.world();
        if let Some(failure) = &world.failure {
            return Err(failure.clone());
        }
        if let Some(panic) = world.panics.first() {
            return Err(HarnessError::Panicked(panic.clone()));
        }
        for (index, client) in self.clients.iter().enumerate() {
            let id = ClientId(index);
            // A client whose task panicked lost its connection, as it would in a runtime.
            let dropped = client.gone || world.panicked.contains(&Machine::Exchange(id));
            if !dropped && client.responses.len() != 1 {
                return Err(HarnessError::ResponseCount {
                    client: id.to_string(),
                    count: client.responses.len(),
                });
            }
        }
        Ok(())
    }

    /// Whether the client's task ended in a scripted panic ([`crate::Reply::panic`]).
    pub fn panicked(&self, client: ClientId) -> bool {
        self.sim
            .world()
            .panicked
            .contains(&Machine::Exchange(client))
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

    fn drive(&mut self, max_steps: usize, until: Option<Instant>) -> Result<usize, HarnessError> {
        let mut steps = 0;
        loop {
            self.settle();
            let next = {
                let world = self.sim.world();
                if let Some(failure) = &world.failure {
                    return Err(failure.clone());
                }
                world.next_event()
            };
            let Some(at) = next else {
                return Ok(steps);
            };
            if until.is_some_and(|until| at > until) {
                return Ok(steps);
            }
            if steps >= max_steps {
                return Err(HarnessError::Livelock {
                    steps,
                    at: self.elapsed(),
                });
            }
            steps += 1;
            self.sim.world().step(&self.sim, at);
        }
    }

    /// Runs every woken task until all wait, then takes what the run recorded.
    fn settle(&mut self) {
        self.sim.run_ready();
        let mut world = self.sim.world();
        world.transcript.move_into(&mut self.transcript);
        self.sends.append(&mut world.sends);
        for Answered { client, response } in world.answered.drain(..) {
            if let Some(client) = self.clients.get_mut(client) {
                client.responses.push(response);
            }
        }
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        // The tasks hold the host, whose runtime holds the tasks.
        self.sim.drop_tasks();
    }
}

/// What a client's task does with its answer: reads a streamed body whole and hands the
/// response to the harness.
async fn record(sim: &Sim, client: ClientId, answer: ClientAnswer<Sim>) {
    let mut merged = None;
    let (response, body, streamed_from) = match answer {
        ClientAnswer::Whole(response) => {
            let body = match &response.body {
                ResponseBody::Full(bytes) => bytes.clone(),
                ResponseBody::Upstream(_) | ResponseBody::Merged => Bytes::new(),
            };
            (response, body, None)
        }
        ClientAnswer::Streamed { response, body, .. } => {
            let id = body.id();
            (response, body.read(), Some(id))
        }
        ClientAnswer::Merged {
            response, mut body, ..
        } => {
            let leaves = sim.world().leave_mid_body.contains(&client.0);
            let stalls = sim.world().stall_mid_body.get(&client.0).copied();
            let (bytes, cut_off) = if let Some(pause) = stalls {
                let (first, _) = read_merged(&mut body, true).await;
                sim.world().log(format!(
                    "{client} stops reading for {} ms",
                    pause.as_millis()
                ));
                pdbmux_driver::Runtime::sleep_until(sim, pdbmux_driver::Runtime::now(sim) + pause)
                    .await;
                let (rest, cut_off) = read_merged(&mut body, false).await;
                ([first, rest].concat().into(), cut_off)
            } else if leaves {
                let (bytes, _) = read_merged(&mut body, true).await;
                sim.world().log(format!(
                    "{client} gone after {} bytes of the body",
                    bytes.len()
                ));
                drop(body);
                (bytes, Some("the client left".to_owned()))
            } else {
                read_merged(&mut body, false).await
            };
            merged = Some(cut_off);
            (response, bytes, None)
        }
    };
    // Every answer echoes its request id (the client's name unless a test sent one); it is
    // left out of transcripts and asserted where it is the subject (tests/correlation.rs).
    let mut shown = response.headers.clone();
    shown.remove(pdbmux_driver::REQUEST_ID);
    let headers = headers_text(&shown);
    let body_label = match (streamed_from, &merged) {
        (Some(id), _) => format!("body=stream({id}) "),
        (None, Some(None)) => "body=merged ".to_owned(),
        (None, Some(Some(why))) => format!("body=merged(cut off: {why}) "),
        (None, None) => "body=".to_owned(),
    };
    let mut world = sim.world();
    world.log(format!(
        "{client} respond {}{}{headers} {body_label}{}",
        response.status.as_u16(),
        if headers.is_empty() { "" } else { " " },
        body_text(&body)
    ));
    let at = world.elapsed();
    world.answered.push(Answered {
        client: client.0,
        response: ClientResponse {
            at,
            status: response.status,
            headers: response.headers,
            body,
            streamed_from,
            merged,
        },
    });
}

/// Reads a streamed merge's body as the client's task would (its first bytes only, for a client
/// that leaves then): a merge of its own is fed by simulated bodies whole at once; a cached
/// flight's comes as the flight's task writes it. The bytes the client got, and why they
/// stopped short, if they did.
async fn read_merged(
    body: &mut pdbmux_driver::MergedBody<Sim>,
    first_only: bool,
) -> (Bytes, Option<String>) {
    let mut out = Vec::new();
    loop {
        match std::future::poll_fn(|cx| body.poll_next(cx)).await {
            Some(Ok(bytes)) if first_only => return (bytes, None),
            Some(Ok(bytes)) => out.extend_from_slice(&bytes),
            None => return (out.into(), None),
            Some(Err(failure)) => return (out.into(), Some(failure.to_string())),
        }
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
        let c = h.get("/pdb/query/v4/environments/production");
        assert_eq!(h.disconnect(c), Ok(()));
        assert_eq!(h.drive_bounded(10), Ok(0));
        assert!(matches!(
            h.response(c),
            Err(HarnessError::ResponseCount { count: 0, .. })
        ));
        assert_eq!(h.check_quiescent(), Ok(()));
        assert!(
            h.transcript().contains("+0ms c0 gone\n+0ms c0 cancel u0\n"),
            "{}",
            h.transcript()
        );
    }
}
