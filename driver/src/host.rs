//! The shared estate behind a short-held lock, and the task that drives its outputs (upstream
//! requests it sends itself, answers to waiting clients, flights to start and cancel) and its one
//! deadline: the same on every runtime, which supplies a [`Runtime`] (its upstream client, timer,
//! task spawner and blocking pool).

use std::collections::BTreeMap;
use std::future::{self, Future};
use std::panic::AssertUnwindSafe;
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::task::Poll;
use std::time::Instant;

use futures_channel::oneshot;
use futures_util::future::{Either, FutureExt};
use futures_util::task::AtomicWaker;
use pdbmux_core::budget::BudgetScope;
use pdbmux_core::cache::shared::{StoreAnswer, StoreRequest};
use pdbmux_core::config::Config;
use pdbmux_core::{
    Admission, BackendId, ClientRequest, Estate, EstateOutput, Exchange, ExchangeReport, FlightId,
    Planned, Response, ResponseBody, RouteClass, Translating, UpstreamRequest, WaiterId,
};
use pdbmux_sealed::Sealer;
use tracing::Instrument;

use crate::access::{AccessLine, BodyWatch};
use crate::budget::{BodyBudget, MergeMemory};
use crate::context::ClientContext;
use crate::{Metrics, StreamedBody, Timings, UpstreamResult};

/// What a runtime gives the estate host.
pub trait Runtime: Send + Sync + 'static {
    /// An upstream body held open for streaming to the client, or read piece by piece into a
    /// streamed merge.
    type Held: Unpin + Send + 'static;
    /// A spawned task.
    type Task: Task;
    /// The upstream clients of one configuration (its backends' pools and TLS settings).
    type Clients: Send + Sync + 'static;

    /// Builds the clients `config` asks for. It reads TLS files: the host calls it at start and,
    /// for a reload, on the blocking pool.
    fn clients(config: &Config) -> Result<Self::Clients, crate::StartError>;

    /// Carries one request to the shared cache store of `clients` (its configuration's
    /// `cache_backend`); any failure is [`StoreAnswer::Failed`]. The caller bounds it by the
    /// request's deadline.
    fn store(
        &self,
        clients: &Self::Clients,
        request: StoreRequest,
    ) -> impl Future<Output = StoreAnswer> + Send;

    /// Sends one upstream request with `clients`. An exchange's sends are polled on its own task,
    /// beside each other, and dropped (closing their connections) when the core cancels them or
    /// answers; each of the estate's own requests runs on a task of its own
    /// ([`TaskRole::EstateCall`]), cancelled the same way.
    ///
    /// Take every byte of a body read whole from `budget` as it is read ([`BodyBudget::take`]),
    /// and stop with its failure when it refuses; a held body is not counted.
    fn send(
        &self,
        clients: &Self::Clients,
        request: UpstreamRequest,
        budget: BodyBudget,
    ) -> impl Future<Output = UpstreamResult<Self::Held>> + Send;

    /// Polls for the next piece of a held body a streamed merge reads: `None` at its end, or
    /// why it failed (its connection broke, it went over `max_body_bytes`).
    fn poll_piece(
        held: Pin<&mut Self::Held>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<bytes::Bytes, String>>>;

    /// Resolves at `deadline`.
    fn sleep_until(&self, deadline: Instant) -> impl Future<Output = ()> + Send;

    /// The time now, on the clock [`Runtime::sleep_until`] keeps: every instant the host gives
    /// the core comes from here. The system's monotonic clock unless a runtime simulates time.
    fn now(&self) -> Instant {
        Instant::now()
    }

    /// The wall-clock time now, read once at start to anchor the estate's timestamps to
    /// [`Runtime::now`]. The system's clock unless a runtime simulates time.
    fn wall_clock(&self) -> std::time::SystemTime {
        std::time::SystemTime::now()
    }

    /// Runs `future` on its own task; a panic in it ends that task only.
    fn spawn(&self, future: impl Future<Output = ()> + Send + 'static) -> Self::Task;

    /// Runs `future` on its own task, as [`Runtime::spawn`], knowing what it is for; the host
    /// spawns every task through here. A runtime that tells tasks apart (a simulation writing
    /// a transcript) overrides it.
    fn spawn_as(
        &self,
        role: TaskRole,
        future: impl Future<Output = ()> + Send + 'static,
    ) -> Self::Task {
        let _ = role;
        self.spawn(future)
    }

    /// Runs `work` where it may block (a blocking pool), not on an async worker thread.
    fn unblock<T: Send + 'static>(
        &self,
        work: impl FnOnce() -> T + Send + 'static,
    ) -> impl Future<Output = T> + Send;
}

/// The answer to a client, as a runtime writes it.
pub enum ClientAnswer<R: Runtime> {
    /// A whole body (in the response).
    Whole(Response),
    /// A response whose body is the held upstream body, to stream until `deadline`.
    Streamed {
        /// Status and headers (its body is [`ResponseBody::Upstream`]).
        response: Response,
        /// The upstream body.
        body: R::Held,
        /// What the body is checked and counted by on its way: feed it every piece read, and
        /// the end or failure (it writes the request's access line when the body ends).
        check: StreamedBody,
        /// When the body must be complete.
        deadline: Instant,
    },
    /// A response whose body is a streamed merge, to stream until `deadline`.
    Merged {
        /// Status and headers (its body is [`ResponseBody::Merged`]).
        response: Response,
        /// The merge and the upstream bodies that feed it.
        body: crate::MergedBody<R>,
        /// When the body must be complete.
        deadline: Instant,
    },
}

impl<R: Runtime> ClientAnswer<R> {
    /// A whole answer of the runtime's own, with the headers every answer ends with.
    pub fn whole(mut response: Response) -> ClientAnswer<R> {
        crate::http1::finish_response_headers(&mut response.headers);
        ClientAnswer::Whole(response)
    }

    /// The runtime's refusal of a request head it will not pass on (`status`, `why`), like
    /// every answer with its request id and one access line (at warn, with `why`); `request` is
    /// its method and target when the head was read that far.
    pub fn refused_head(
        context: &ClientContext,
        request: Option<(&http::Method, &str)>,
        status: http::StatusCode,
        why: &str,
    ) -> ClientAnswer<R> {
        let mut answer = ClientAnswer::whole(Response::text(status, format!("pdbmux: {why}")));
        answer.echo_request_id(context);
        let (method, target) = request.map_or(("-".to_owned(), "-"), |(m, t)| (m.to_string(), t));
        AccessLine {
            method,
            target: target.to_owned(),
            status: status.as_u16(),
            why: Some(why.to_owned()),
            ..AccessLine::of_context(context)
        }
        .log();
        answer
    }

    /// Sets the response's `X-Request-Id` to the request's id.
    fn echo_request_id(&mut self, context: &ClientContext) {
        if let Ok(id) = http::HeaderValue::from_str(&context.request_id) {
            self.headers_mut().insert(crate::context::REQUEST_ID, id);
        }
    }

    /// Pairs a response with the held body it names; one whose body went missing (a contract
    /// violation) becomes a 502.
    fn of((mut response, streamed): (Response, Option<crate::Streamed<R>>)) -> ClientAnswer<R> {
        crate::http1::finish_response_headers(&mut response.headers);
        match (&response.body, streamed) {
            (ResponseBody::Upstream(_), Some(crate::Streamed::Upstream(body, deadline))) => {
                ClientAnswer::Streamed {
                    response,
                    body,
                    check: StreamedBody::new(),
                    deadline,
                }
            }
            (ResponseBody::Merged, Some(crate::Streamed::Merged(body, deadline))) => {
                ClientAnswer::Merged {
                    response,
                    body,
                    deadline,
                }
            }
            (ResponseBody::Upstream(_) | ResponseBody::Merged, _) => {
                tracing::error!("no held body for a streamed response; answering 502");
                ClientAnswer::whole(Response::text(
                    http::StatusCode::BAD_GATEWAY,
                    "pdbmux: upstream body lost",
                ))
            }
            (ResponseBody::Full(_), _) => ClientAnswer::Whole(response),
        }
    }

    /// The status and headers.
    pub fn response(&self) -> &Response {
        match self {
            ClientAnswer::Whole(response)
            | ClientAnswer::Streamed { response, .. }
            | ClientAnswer::Merged { response, .. } => response,
        }
    }

    fn headers_mut(&mut self) -> &mut http::HeaderMap {
        match self {
            ClientAnswer::Whole(response)
            | ClientAnswer::Streamed { response, .. }
            | ClientAnswer::Merged { response, .. } => &mut response.headers,
        }
    }
}

/// The access line of an answered request ([`AccessLine`]): the answer's fields; a streamed
/// body's bytes are filled in when it ends.
fn access_line<R: Runtime>(
    request: &ClientRequest,
    context: &ClientContext,
    route: pdbmux_core::RouteClass,
    answer: &ClientAnswer<R>,
    took: std::time::Duration,
) -> AccessLine {
    let response = answer.response();
    let header = |name: &str| {
        response
            .headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("-")
            .to_owned()
    };
    let backends = header("x-backends");
    let why = if response.status.is_server_error() {
        match &response.body {
            ResponseBody::Full(body) => Some(reason_of(body)),
            ResponseBody::Upstream(_) | ResponseBody::Merged => {
                Some("a backend's error, streamed".to_owned())
            }
        }
    } else if pdbmux_core::Coverage::of(response) == pdbmux_core::Coverage::Partial {
        Some(format!("partial: {backends} backends answered"))
    } else {
        None
    };
    let bytes = match (answer, &response.body) {
        (ClientAnswer::Whole(_), ResponseBody::Full(body)) => body.len().to_string(),
        _ => "-".to_owned(),
    };
    AccessLine {
        method: request.method.to_string(),
        target: request.target.clone(),
        route,
        status: response.status.as_u16(),
        took,
        cache: header("x-cache"),
        backends,
        bytes,
        why,
        ..AccessLine::of_context(context)
    }
}

/// A 5xx body's reason for the log: its text (or PuppetDB's JSON `error`/`msg`), on one line,
/// at most 300 characters; only the body's first 4 KiB are read (a replayed answer can be large).
fn reason_of(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(&body[..body.len().min(4096)]);
    let from_json = serde_json::from_str::<serde_json::Value>(&text)
        .ok()
        .and_then(|v| {
            ["error", "msg", "message"]
                .iter()
                .find_map(|k| v.get(k).and_then(|m| m.as_str()).map(str::to_owned))
        });
    let one_line: String = from_json
        .unwrap_or_else(|| text.into_owned())
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    one_line.chars().take(300).collect()
}

/// What a task the estate host spawns is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskRole {
    /// The task driving the estate's outputs and deadline ([`EstateHost::spawn_driver`]).
    Driver,
    /// One upstream request the estate sends itself (membership, health).
    EstateCall,
    /// One request to the shared cache store.
    StoreCall,
    /// A single-flight exchange, driven apart from any client.
    Flight(FlightId),
}

/// A spawned task's handle.
pub trait Task: Send + 'static {
    /// Stops the task at its next await (its future is dropped, releasing what it holds).
    fn cancel(self);
    /// Lets the task run on without this handle.
    fn detach(self);
    /// Whether the task has ended.
    fn is_finished(&self) -> bool;
}

/// One configuration and the upstream clients built for it: what an exchange runs on from its
/// admission to its answer, whatever reloads happen meanwhile.
struct Generation<R: Runtime> {
    config: Arc<Config>,
    clients: Arc<R::Clients>,
}

impl<R: Runtime> Clone for Generation<R> {
    fn clone(&self) -> Self {
        Generation {
            config: Arc::clone(&self.config),
            clients: Arc::clone(&self.clients),
        }
    }
}

/// Counts a request whose client left (its answer future dropped before the answer) when it is
/// dropped unanswered.
struct ClientGone<'a> {
    metrics: &'a Metrics,
    class: RouteClass,
    started: Instant,
    answered: bool,
}

impl Drop for ClientGone<'_> {
    fn drop(&mut self) {
        if !self.answered {
            self.metrics
                .observe_client_gone(self.class, self.started.elapsed());
        }
    }
}

/// What admitting a request gives ([`EstateHost::answer`] acts on it).
enum Admitted<R: Runtime> {
    /// Answer right away.
    Respond(Response),
    /// Drive this exchange on the request's own task, on the generation it was admitted in.
    Exchange(Exchange, Generation<R>),
    /// Drive this PQL translation on the request's own task, then hand it back.
    Translate(Exchange, Translating, Generation<R>),
    /// Wait for the estate's word.
    Wait(WaitTicket<R>),
}

/// A client's place in the estate's queue: resolves to the estate's word. Dropping it before
/// then (the client went away) tells the estate, so a flight nobody waits for is cancelled.
struct WaitTicket<R: Runtime> {
    host: Arc<EstateHost<R>>,
    waiter: WaiterId,
    receiver: Option<oneshot::Receiver<WaiterEvent<R>>>,
}

impl<R: Runtime> WaitTicket<R> {
    /// Waits for the estate's word; `None` when the estate is gone (shutting down). Dropped
    /// while waiting, the ticket still holds its receiver, so its `Drop` tells the estate.
    async fn wait(mut self) -> Option<WaiterEvent<R>> {
        let event = match self.receiver.as_mut() {
            Some(receiver) => receiver.await.ok(),
            None => None,
        };
        // Answered (or the estate is gone): nothing to tell it.
        self.receiver = None;
        event
    }
}

impl<R: Runtime> Drop for WaitTicket<R> {
    fn drop(&mut self) {
        if self.receiver.is_some() {
            self.host.waiter_gone(self.waiter);
        }
    }
}

/// What the estate tells a waiting request.
enum WaiterEvent<R: Runtime> {
    /// Answer with this.
    Respond(Response),
    /// Answer with this head and a cached flight's merge, written as it comes, until the
    /// instant.
    Stream(Response, crate::MergedBody<R>, Instant),
    /// What the request waited for (a membership refresh) is ready: admit it again.
    Resume(Box<Planned>),
}

/// Wakes the estate's driver: a wake-up while it is busy is kept for its next wait.
#[derive(Default)]
struct Wake {
    pending: AtomicBool,
    waker: AtomicWaker,
}

impl Wake {
    fn notify(&self) {
        self.pending.store(true, Ordering::Release);
        self.waker.wake();
    }

    async fn notified(&self) {
        future::poll_fn(|cx| {
            self.waker.register(cx.waker());
            if self.pending.swap(false, Ordering::AcqRel) {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        })
        .await;
    }
}

/// The estate as every connection task of a runtime shares it.
pub struct EstateHost<R: Runtime> {
    estate: Mutex<Estate>,
    /// The configuration requests are planned with (outside the estate's lock) and its clients;
    /// replaced with the estate's configuration, under the estate's lock, so an exchange the
    /// estate admits always gets the clients of the configuration it was built with.
    current: RwLock<Generation<R>>,
    waiters: Mutex<BTreeMap<WaiterId, oneshot::Sender<WaiterEvent<R>>>>,
    flights: Mutex<BTreeMap<FlightId, R::Task>>,
    wake: Wake,
    /// Seals flights' answers before the estate stores them (the store's own sealer).
    sealer: Sealer,
    /// pdbmux's own metrics, when they are served.
    metrics: Option<Metrics>,
    /// The bytes of backend answers merges in flight hold (docs/operating.md, "Memory").
    merge_memory: Arc<MergeMemory>,
    /// The runtime it runs on (also [`crate::lifecycle`]'s).
    pub(crate) runtime: R,
}

/// Takes a lock whose holder may have panicked: every critical section here is one call on the
/// estate or one map operation, so the state is as it was between two calls; keep going.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl<R: Runtime> EstateHost<R> {
    /// Wraps a fresh estate, the sealer of its store, the runtime and the clients built for the
    /// estate's configuration; `metrics` (when they are served) get the estate's numbers at
    /// each scrape.
    pub fn new(
        estate: Estate,
        sealer: Sealer,
        (runtime, clients): (R, R::Clients),
        metrics: Option<Metrics>,
    ) -> Arc<EstateHost<R>> {
        let merge_memory = Arc::new(MergeMemory::default());
        Arc::new_cyclic(|host: &std::sync::Weak<EstateHost<R>>| {
            let host = host.clone();
            let metrics = metrics.map(|metrics| {
                metrics
                    .with_estate(move || Some(host.upgrade()?.stats()))
                    .with_merge_memory(Arc::clone(&merge_memory))
            });
            if let Some(metrics) = &metrics {
                metrics.know_config(estate.config());
            }
            EstateHost {
                current: RwLock::new(Generation {
                    config: Arc::clone(estate.config()),
                    clients: Arc::new(clients),
                }),
                estate: Mutex::new(estate),
                waiters: Mutex::new(BTreeMap::new()),
                flights: Mutex::new(BTreeMap::new()),
                wake: Wake::default(),
                sealer,
                metrics,
                merge_memory,
                runtime,
            }
        })
    }

    /// The estate's numbers now (what a scrape reads).
    pub fn stats(&self) -> pdbmux_core::stats::EstateStats {
        self.estate().stats(self.runtime.now())
    }

    /// The metrics listener's answer to one request ([`Metrics::answer`]); 404 when the metrics
    /// are off.
    pub fn scrape(&self, method: &http::Method, path: &str, accept: Option<&str>) -> Response {
        let mut response = match &self.metrics {
            Some(metrics) => metrics.answer(method, path, accept),
            None => Response::text(http::StatusCode::NOT_FOUND, "pdbmux: metrics are off"),
        };
        crate::http1::finish_response_headers(&mut response.headers);
        response
    }

    /// pdbmux's own metrics, when they are served (`metrics_listen`).
    pub fn metrics(&self) -> Option<&Metrics> {
        self.metrics.as_ref()
    }

    /// The upstream clients of the configuration in force now (for a runtime's own upkeep, such
    /// as closing idle connections).
    pub fn clients(&self) -> Arc<R::Clients> {
        Arc::clone(&self.generation().clients)
    }

    /// The configuration in force now.
    pub fn config(&self) -> Arc<Config> {
        let current = self
            .current
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        Arc::clone(&current.config)
    }

    /// Runs on `config`, with `clients` built for it, from now on (a reload, docs/operating.md):
    /// requests admitted before finish on the configuration and clients they started with.
    pub fn reconfigure(&self, config: Config, clients: R::Clients) {
        let config = Arc::new(config);
        if let Some(metrics) = &self.metrics {
            metrics.know_config(&config);
        }
        {
            let mut estate = self.estate();
            estate.reconfigure(self.runtime.now(), Arc::clone(&config));
            *self.current.write().unwrap_or_else(|p| p.into_inner()) = Generation {
                config,
                clients: Arc::new(clients),
            };
        }
        // The estate may have queued requests (a membership refresh, a `/healthz` check).
        self.wake.notify();
    }

    /// Applies a reload (SIGHUP, docs/operating.md): `prepared` is the configuration as read
    /// again with its upstream clients (the TLS files read afresh), or why either failed; read
    /// them off the async threads (file reads). On an error the running configuration stays.
    /// One log line either way, and `pdbmux_config_reloads_total` counts it; returns whether it
    /// was applied.
    pub fn reload(&self, prepared: Result<(Config, R::Clients), String>) -> bool {
        let applied = match prepared {
            Ok((config, clients)) => {
                let changed = self.config().changed_keys(&config);
                let backends = backend_list(&config);
                self.reconfigure(config, clients);
                tracing::info!(
                    changed = %if changed.is_empty() { "nothing".to_owned() } else { changed.join(",") },
                    %backends,
                    "configuration reloaded; TLS files re-read; requests in flight finish on the previous one"
                );
                true
            }
            Err(problem) => {
                tracing::error!("configuration reload refused, the running one stays: {problem}");
                false
            }
        };
        if let Some(metrics) = &self.metrics {
            metrics.observe_reload(applied);
        }
        applied
    }

    fn generation(&self) -> Generation<R> {
        self.current
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    /// Records one upstream call's time for each call in `timings`.
    fn observe_upstream_durations(&self, config: &Config, timings: &Timings) {
        if let Some(metrics) = &self.metrics {
            for (backend, took) in timings.upstream_calls() {
                metrics.observe_upstream_duration(config, *backend, *took);
            }
        }
    }

    /// Answers one client request: admits it, drives its exchange on this task or waits for
    /// the estate (a flight, the first membership map), admits it again when told to, and
    /// writes its access log line. Never fails: every outcome is a response. Every log line
    /// about the request is in a `request` span carrying its id; the id is echoed in the
    /// response's `X-Request-Id` and sent, with a `traceparent`, on the upstream calls it makes
    /// ([`ClientContext`]).
    pub async fn answer(
        self: &Arc<Self>,
        request: &ClientRequest,
        context: &ClientContext,
    ) -> ClientAnswer<R> {
        let span = tracing::info_span!("request", id = %context.request_id);
        let (mut answer, class, took) =
            self.answer_in_span(request, context).instrument(span).await;
        answer.echo_request_id(context);
        // Outside the span: the line names the id itself, as a field of its own. A streamed
        // body writes it when it ends, with the bytes it sent.
        let line = access_line(request, context, class, &answer, took);
        match &mut answer {
            ClientAnswer::Whole(_) => line.log(),
            ClientAnswer::Streamed { check, .. } => check.watched(BodyWatch::new(line)),
            ClientAnswer::Merged { body, .. } => {
                let counts = self.metrics.as_ref().map(Metrics::streamed_merges);
                body.watched(BodyWatch::new(line), counts);
            }
        }
        answer
    }

    /// [`EstateHost::answer`] inside the request's span: the answer, its route class and how
    /// long it took.
    async fn answer_in_span(
        self: &Arc<Self>,
        request: &ClientRequest,
        context: &ClientContext,
    ) -> (
        ClientAnswer<R>,
        pdbmux_core::RouteClass,
        std::time::Duration,
    ) {
        let mut timings = Timings::start();
        // Planned once, before the estate's lock is taken.
        let config = self.config();
        let planned = pdbmux_core::plan(request, &config);
        timings.planned();
        let mut gone = self.metrics.as_ref().map(|metrics| ClientGone {
            metrics,
            class: planned.class(),
            started: timings.started(),
            answered: false,
        });
        let labels = (planned.class(), planned.is_cacheable());
        let answer = self
            .answer_planned(request, context, planned, &mut timings)
            .await;
        if let Some(gone) = &mut gone {
            gone.answered = true;
        }
        if let Some(metrics) = &self.metrics {
            metrics.observe_request(labels, &answer.0, timings.elapsed());
            self.observe_upstream_durations(&config, &timings);
        }
        (ClientAnswer::of(answer), labels.0, timings.elapsed())
    }

    async fn answer_planned(
        self: &Arc<Self>,
        request: &ClientRequest,
        context: &ClientContext,
        planned: Planned,
        timings: &mut Timings,
    ) -> (Response, Option<crate::Streamed<R>>) {
        let mut admission = self.admit_with(Some(context), |estate| {
            estate.admit(self.runtime.now(), planned)
        });
        // Names are looked up only when the timing line is enabled.
        let log = |timings: &Timings, how: &str| {
            timings.log(&request.target, how, |id: BackendId| {
                backend_name(&self.config(), id)
            });
        };
        loop {
            match admission {
                Admitted::Respond(response) => {
                    log(timings, "local");
                    return (response, None);
                }
                Admitted::Exchange(exchange, generation) => {
                    timings.exchange_started();
                    let bound = Bound::new(self, generation, Some(context.clone()));
                    let answer = crate::drive(&bound, exchange, timings).await;
                    log(timings, "exchange");
                    return answer;
                }
                Admitted::Translate(exchange, translating, generation) => {
                    // Buffered (never a held body): the translation is read, not forwarded.
                    let bound = Bound::new(self, generation, Some(context.clone()));
                    let (response, _) = crate::drive(&bound, exchange, timings).await;
                    admission = self.admit_with(Some(context), |estate| {
                        estate.handle_translated(self.runtime.now(), translating, response)
                    });
                }
                Admitted::Wait(ticket) => match ticket.wait().await {
                    Some(WaiterEvent::Respond(response)) => {
                        log(timings, "waited");
                        return (response, None);
                    }
                    Some(WaiterEvent::Stream(head, body, deadline)) => {
                        log(timings, "waited");
                        return (head, Some(crate::Streamed::Merged(body, deadline)));
                    }
                    Some(WaiterEvent::Resume(planned)) => {
                        admission = self.admit_with(Some(context), |estate| {
                            estate.readmit(self.runtime.now(), *planned)
                        })
                    }
                    None => {
                        let response = Response::text(
                            http::StatusCode::SERVICE_UNAVAILABLE,
                            "pdbmux: shutting down",
                        );
                        return (response, None);
                    }
                },
            }
        }
    }

    /// Starts the task that drives the estate; cancel it to stop it.
    pub fn spawn_driver(self: &Arc<Self>) -> R::Task {
        let host = Arc::clone(self);
        self.runtime
            .spawn_as(TaskRole::Driver, async move { host.run_driver().await })
    }

    fn estate(&self) -> MutexGuard<'_, Estate> {
        lock(&self.estate)
    }

    fn waiter_gone(&self, waiter: WaiterId) {
        lock(&self.waiters).remove(&waiter);
        self.estate().handle_waiter_gone(self.runtime.now(), waiter);
        self.wake.notify();
    }

    fn ticket(self: &Arc<Self>, waiter: WaiterId) -> WaitTicket<R> {
        let (sender, receiver) = oneshot::channel();
        lock(&self.waiters).insert(waiter, sender);
        WaitTicket {
            host: Arc::clone(self),
            waiter,
            receiver: Some(receiver),
        }
    }

    /// Runs `admit` under the estate's lock; a flight it starts runs on a task of its own with
    /// `context`, the request it was started for (its calls carry that request's id).
    fn admit_with(
        self: &Arc<Self>,
        context: Option<&ClientContext>,
        admit: impl FnOnce(&mut Estate) -> Admission,
    ) -> Admitted<R> {
        let mut estate = self.estate();
        let admission = admit(&mut estate);
        // The admission may have queued upstream requests (a membership refresh) or a flight
        // to start (a refresh ahead of expiry, beside a hit).
        let wake = !matches!(admission, Admission::Respond(_)) || estate.has_output();
        // Read under the estate's lock, so it is the generation of the configuration the
        // exchange was built on; not at all for an answer (a cache hit).
        let generation = || self.generation();
        let admitted = match admission {
            Admission::Respond(response) => Admitted::Respond(response),
            Admission::Exchange(exchange) => Admitted::Exchange(exchange, generation()),
            Admission::Translate {
                exchange,
                translating,
            } => Admitted::Translate(exchange, translating, generation()),
            // Registered before the lock is released, so the driver cannot answer first.
            Admission::Wait(waiter) => Admitted::Wait(self.ticket(waiter)),
            Admission::Flight {
                flight,
                waiter,
                exchange,
            } => {
                let ticket = self.ticket(waiter);
                self.spawn_flight(flight, exchange, generation(), context.cloned());
                Admitted::Wait(ticket)
            }
        };
        drop(estate);
        if wake {
            self.wake.notify();
        }
        admitted
    }

    /// Runs a flight's exchange on its own task and reports its response to the estate.
    fn spawn_flight(
        self: &Arc<Self>,
        flight: FlightId,
        exchange: Exchange,
        generation: Generation<R>,
        context: Option<ClientContext>,
    ) {
        let host = Arc::clone(self);
        // Held across the spawn so the task cannot remove its entry before it is inserted.
        let mut flights = lock(&self.flights);
        let task = self.runtime.spawn_as(TaskRole::Flight(flight), async move {
            let answered = AssertUnwindSafe(async {
                let mut timings = Timings::start();
                timings.exchange_started();
                let target = exchange.target().to_owned();
                let config = Arc::clone(&generation.config);
                let bound = Bound::new(&host, generation, context);
                let (response, streamed) = crate::drive(&bound, exchange, &mut timings).await;
                let response = match streamed {
                    Some(crate::Streamed::Merged(body, deadline)) => {
                        host.flight_merge(&bound, flight, response, (body, deadline))
                            .await
                    }
                    _ => response,
                };
                timings.log(&target, "flight", |id: BackendId| backend_name(&config, id));
                host.observe_upstream_durations(&config, &timings);
                host.sealed(response).await
            })
            .catch_unwind()
            .await;
            // A panic would leave the flight's waiters waiting: answer them with a 500.
            let response = answered.unwrap_or_else(|_| {
                tracing::error!("flight {flight} panicked");
                Response::text(
                    http::StatusCode::INTERNAL_SERVER_ERROR,
                    "pdbmux: internal error",
                )
            });
            // Our own handle: detached, so that letting go of it does not cancel this task.
            let own = lock(&host.flights).remove(&flight);
            if let Some(own) = own {
                own.detach();
            }
            host.estate()
                .handle_flight_done(host.runtime.now(), flight, response);
            host.wake.notify();
        });
        flights.insert(flight, task);
    }

    /// A flight's streamed merge (`flight_merge.rs`): written to its clients as it comes when
    /// the estate lets it (each client's waiter told its head and given its body now), else read
    /// whole; the flight's answer for the estate to store.
    async fn flight_merge(
        &self,
        bound: &Bound<'_, R>,
        flight: FlightId,
        head: Response,
        (mut body, deadline): (crate::MergedBody<R>, Instant),
    ) -> Response {
        // Its failure is logged under the request the flight started for.
        if let Some(request_id) = bound.request_id() {
            body.failure_logged_under(request_id);
        }
        let clients = self
            .estate()
            .stream_flight(self.runtime.now(), flight, &head);
        // The lock it let go of may be asked for (a store request to send).
        self.wake.notify();
        let Some(clients) = clients else {
            return crate::flight_merge::read_whole(bound, head, body, deadline).await;
        };
        let senders = clients
            .into_iter()
            .map(|(waiter, head)| {
                let (sender, pieces) =
                    futures_channel::mpsc::channel(crate::flight_merge::CLIENT_PIECES);
                let body = crate::MergedBody::shared(pieces);
                self.tell(waiter, WaiterEvent::Stream(head, body, deadline));
                sender
            })
            .collect();
        let keep = bound.config().streamed_cache_entry_bytes();
        crate::flight_merge::write_to_clients(bound, head, (body, deadline), senders, keep).await
    }

    /// A flight's answer sealed ([`Sealer::seal_flight_answer`]) when there is something to
    /// seal, on the runtime's blocking pool: copying a large body into huge pages may make the
    /// kernel compact memory, which must not stall a worker thread and the connections on it.
    async fn sealed(&self, response: Response) -> Response {
        if !self.sealer.is_worth_sealing(&response) {
            return response;
        }
        let sealer = self.sealer.clone();
        self.runtime
            .unblock(move || sealer.seal_flight_answer(response))
            .await
    }

    fn tell(&self, waiter: WaiterId, event: WaiterEvent<R>) {
        let sender = lock(&self.waiters).remove(&waiter);
        if let Some(sender) = sender {
            // The client may have gone; nothing to do then.
            let _ = sender.send(event);
        }
    }

    async fn run_driver(self: Arc<Self>) {
        let mut sends = BTreeMap::new();
        loop {
            let (outputs, deadline, generation) = {
                let mut estate = self.estate();
                let outputs: Vec<EstateOutput> =
                    std::iter::from_fn(|| estate.poll_output()).collect();
                // Under the same lock: the clients of the configuration these requests are for.
                (outputs, estate.poll_timeout(), self.generation())
            };
            for output in outputs {
                match output {
                    EstateOutput::Send(request) => {
                        let call = EstateCall::of(&request, &generation);
                        let sent = self.send_for_estate(request, generation.clone(), &call);
                        let task = self.runtime.spawn_as(TaskRole::EstateCall, sent);
                        sends
                            .retain(|_, (task, _): &mut (R::Task, EstateCall)| !task.is_finished());
                        sends.insert(call.id, (task, call));
                    }
                    EstateOutput::Cancel(id) => {
                        if let Some((task, call)) = sends.remove(&id) {
                            task.cancel();
                            call.cancelled(self.metrics.as_ref(), self.runtime.now());
                        }
                    }
                    EstateOutput::Respond { waiter, response } => {
                        self.tell(waiter, WaiterEvent::Respond(response))
                    }
                    EstateOutput::Resume { waiter, planned } => {
                        self.tell(waiter, WaiterEvent::Resume(planned))
                    }
                    EstateOutput::Store(request) => {
                        let asked = self.ask_store(request, generation.clone());
                        self.runtime.spawn_as(TaskRole::StoreCall, asked).detach();
                    }
                    EstateOutput::StartFlight { flight, exchange } => {
                        // Started by the estate (the shared store missed), not on a request's
                        // task: its calls carry an id of their own.
                        let context = ClientContext::internal();
                        self.spawn_flight(flight, exchange, generation.clone(), Some(context));
                    }
                    EstateOutput::CancelFlight(flight) => {
                        // Taken out first: cancelling may drop the flight's future right here.
                        let task = lock(&self.flights).remove(&flight);
                        if let Some(task) = task {
                            task.cancel();
                        }
                    }
                }
            }
            let woken = pin!(self.wake.notified());
            let timer = pin!(async {
                match deadline {
                    Some(deadline) => self.runtime.sleep_until(deadline).await,
                    None => future::pending().await,
                }
            });
            if let Either::Right(_) = futures_util::future::select(woken, timer).await {
                self.estate().handle_timeout(self.runtime.now());
            }
        }
    }

    /// A shared-store request the estate makes, answered into it by its deadline.
    fn ask_store(
        self: &Arc<Self>,
        request: StoreRequest,
        generation: Generation<R>,
    ) -> impl Future<Output = ()> + Send + 'static {
        let host = Arc::clone(self);
        async move {
            let (id, deadline) = (request.id, request.deadline);
            let op = store_op_name(&request.op);
            let asked = pin!(host.runtime.store(&generation.clients, request));
            let expired = pin!(host.runtime.sleep_until(deadline));
            let answer = match futures_util::future::select(asked, expired).await {
                Either::Left((answer, _)) => answer,
                Either::Right(((), _)) => StoreAnswer::Failed("no answer in time".to_owned()),
            };
            // A large entry from the shared store is sealed before the estate keeps it, so its
            // hits go out by reference like those of entries this replica fetched itself.
            let answer = match answer {
                StoreAnswer::Value(Some(value)) if host.sealer.is_worth_sealing_bytes(&value) => {
                    let sealer = host.sealer.clone();
                    StoreAnswer::Value(Some(host.runtime.unblock(move || sealer.seal(value)).await))
                }
                answer => answer,
            };
            if let Some(metrics) = &host.metrics {
                metrics.observe_store(op, !matches!(answer, StoreAnswer::Failed(_)));
            }
            host.estate()
                .handle_store_answer(host.runtime.now(), id, answer);
            host.wake.notify();
        }
    }

    /// An upstream request the estate sends itself (membership, health), answered into it.
    fn send_for_estate(
        self: &Arc<Self>,
        request: UpstreamRequest,
        generation: Generation<R>,
        call: &EstateCall,
    ) -> impl Future<Output = ()> + Send + 'static {
        let host = Arc::clone(self);
        let counted = Arc::clone(&call.counted);
        async move {
            let (id, backend, purpose) = (request.id, request.backend, request.purpose);
            let sent = host.runtime.now();
            let result = host
                .runtime
                .send(&generation.clients, request, BodyBudget::unbudgeted())
                .await;
            let now = host.runtime.now();
            let first = !counted.swap(true, Ordering::AcqRel);
            if let Some(metrics) = host.metrics.as_ref().filter(|_| first) {
                let outcome = pdbmux_core::stats::CallOutcome::of(
                    result.as_ref().map(|(response, _)| response.status),
                );
                let config = &generation.config;
                metrics.observe_upstream(config, backend, purpose, outcome);
                let took = now.saturating_duration_since(sent);
                metrics.observe_upstream_duration(config, backend, took);
            }
            {
                let mut estate = host.estate();
                match result {
                    Ok((response, _)) => estate.handle_upstream_response(now, id, response),
                    Err(failure) => estate.handle_upstream_failure(now, id, failure),
                }
            }
            host.wake.notify();
        }
    }
}

/// One of the estate's own upstream calls in flight, as the driver cancels it: the estate
/// cancels a call past its deadline (a probe, the membership refresh, the `/healthz` check)
/// before the runtime's own timeout may end it, and such a call still counts, once.
struct EstateCall {
    id: pdbmux_core::UpstreamId,
    backend: pdbmux_core::BackendId,
    purpose: pdbmux_core::Purpose,
    deadline: Instant,
    config: Arc<Config>,
    /// Set by whichever counts the call first: its task on an answer, or its cancellation.
    counted: Arc<AtomicBool>,
}

impl EstateCall {
    fn of<R: Runtime>(request: &UpstreamRequest, generation: &Generation<R>) -> EstateCall {
        EstateCall {
            id: request.id,
            backend: request.backend,
            purpose: request.purpose,
            deadline: request.deadline,
            config: Arc::clone(&generation.config),
            counted: Arc::default(),
        }
    }

    /// The estate cancelled the call: unless its task counted an answer, it counts as timed out
    /// (cancelled at or past its deadline) or cancelled (a reload abandoned it).
    fn cancelled(&self, metrics: Option<&Metrics>, now: Instant) {
        if self.counted.swap(true, Ordering::AcqRel) {
            return;
        }
        let outcome = if now >= self.deadline {
            pdbmux_core::stats::CallOutcome::Timeout
        } else {
            pdbmux_core::stats::CallOutcome::Cancelled
        };
        if let Some(metrics) = metrics {
            metrics.observe_upstream(&self.config, self.backend, self.purpose, outcome);
        }
    }
}

/// What an exchange's loop ([`crate::drive`]) runs on: the host's runtime, with the clients of
/// the generation the exchange was admitted in.
pub(crate) struct Bound<'a, R: Runtime> {
    host: &'a EstateHost<R>,
    generation: Generation<R>,
    /// The client request the exchange answers, whose ids its calls carry.
    context: Option<ClientContext>,
    /// The exchange's share of the merge memory budget, or the budget that refused it.
    budget: Result<BodyBudget, BudgetScope>,
}

impl<'a, R: Runtime> Bound<'a, R> {
    fn new(
        host: &'a EstateHost<R>,
        generation: Generation<R>,
        context: Option<ClientContext>,
    ) -> Bound<'a, R> {
        let budget = host.merge_memory.share(&generation.config);
        Bound {
            host,
            generation,
            context,
            budget,
        }
    }
}

/// Exchanges run on the host's runtime, and hand their rounds to the estate.
impl<R: Runtime> Bound<'_, R> {
    /// Sends one upstream request with this generation's clients ([`Runtime::send`]).
    pub(crate) async fn send(&self, mut request: UpstreamRequest) -> UpstreamResult<R::Held> {
        if let Some(context) = &self.context {
            request.correlation = context.upstream_headers();
        }
        let budget = self.budget.clone().unwrap_or_default();
        self.host
            .runtime
            .send(&self.generation.clients, request, budget)
            .await
    }

    /// Takes `bytes` of a held body a merge reads before it streams from the request's share of
    /// the merge memory budget ([`BodyBudget::take`]).
    pub(crate) fn take_budget(&self, bytes: usize) -> Result<(), pdbmux_core::UpstreamFailure> {
        match &self.budget {
            Ok(budget) => budget.take(bytes),
            Err(_) => Ok(()),
        }
    }

    /// A share of the memory budget for what a streamed merge holds as it grows, once this
    /// exchange answered ([`BodyBudget::fresh`]).
    pub(crate) fn stream_budget(&self) -> BodyBudget {
        self.budget
            .as_ref()
            .map(BodyBudget::fresh)
            .unwrap_or_default()
    }

    /// Gives back `bytes` taken with [`Bound::take_budget`] and no longer held.
    pub(crate) fn give_budget(&self, bytes: usize) {
        if let Ok(budget) = &self.budget {
            budget.give(bytes);
        }
    }

    /// The refusal of an exchange the merge memory budget has no room for, before it asks
    /// anyone; `None` when it has its share.
    pub(crate) fn refusal(&self) -> Option<Response> {
        let scope = *self.budget.as_ref().err()?;
        self.observe_budget_refusal(scope);
        Some(pdbmux_core::budget::over_budget(
            scope,
            pdbmux_core::budget::limit(scope, &self.generation.config),
        ))
    }

    /// Counts a request refused for the memory budget.
    pub(crate) fn observe_budget_refusal(&self, scope: BudgetScope) {
        if let Some(metrics) = &self.host.metrics {
            metrics.observe_budget_refusal(scope);
        }
    }

    /// The configuration the exchange runs under.
    pub(crate) fn config(&self) -> &Config {
        &self.generation.config
    }

    /// The id of the client request the exchange answers (a flight's: the one it started
    /// for), for log lines.
    pub(crate) fn request_id(&self) -> Option<&str> {
        self.context
            .as_ref()
            .map(|context| context.request_id.as_str())
    }

    /// Resolves at `deadline` ([`Runtime::sleep_until`]).
    pub(crate) fn sleep_until(&self, deadline: Instant) -> impl Future<Output = ()> + Send + '_ {
        self.host.runtime.sleep_until(deadline)
    }

    /// The runtime's clock ([`Runtime::now`]).
    pub(crate) fn now(&self) -> Instant {
        self.host.runtime.now()
    }

    /// Hands what the exchange tells the estate once it answered (its `/healthz` round, the
    /// corrections it learned) to the estate and the metrics.
    pub(crate) fn report(&self, report: ExchangeReport) {
        if let Some(metrics) = &self.host.metrics {
            metrics.observe_exchange(&report, &self.generation.config);
        }
        self.host
            .estate()
            .handle_report(self.host.runtime.now(), report);
    }
}

/// A store request's kind, as the metrics label it.
fn store_op_name(op: &pdbmux_core::cache::shared::StoreOp) -> &'static str {
    use pdbmux_core::cache::shared::StoreOp;
    crate::metrics::STORE_OPS[match op {
        StoreOp::Get { .. } => 0,
        StoreOp::Put { .. } => 1,
        StoreOp::Lock { .. } => 2,
        StoreOp::Unlock { .. } => 3,
    }]
}

/// Every backend as `name=url`, in configured order, for log lines.
pub(crate) fn backend_list(config: &Config) -> String {
    let backends: Vec<String> = config
        .backends
        .iter()
        .map(|b| format!("{}={}", b.name, b.url.base()))
        .collect();
    backends.join(",")
}

/// A backend's configured name, for log lines and metric labels.
pub(crate) fn backend_name(config: &Config, id: BackendId) -> String {
    config
        .backends
        .get(id.0)
        .map_or_else(|| "?".to_owned(), |b| b.name.clone())
}

#[cfg(test)]
mod tests {
    use std::future::Future;
    use std::pin::pin;
    use std::task::{Context, Waker};

    use super::Wake;

    #[test]
    fn a_wake_up_is_kept_until_the_next_wait_and_used_once() {
        let wake = Wake::default();
        let mut cx = Context::from_waker(Waker::noop());
        wake.notify();
        wake.notify();
        assert!(pin!(wake.notified()).poll(&mut cx).is_ready(), "kept");
        let mut next = pin!(wake.notified());
        assert!(next.as_mut().poll(&mut cx).is_pending(), "used once");
        wake.notify();
        assert!(next.poll(&mut cx).is_ready(), "a wake-up while waiting");
    }
}
