//! The simulated runtime the harness runs the real estate host on: virtual time, a task queue
//! polled one task at a time in wake order, upstream sends answered by the fake backends'
//! scripts, and the shared store answered by a [`FakeStore`]. Nothing in it reads the real
//! clock after construction or depends on hash order, so a run is deterministic.
//!
//! The world (clock, timers, calls in flight, transcript) and the task table sit behind
//! separate locks, and no lock is held while a task is polled or a future dropped: dropping a
//! send, a timer or a held body reports to the world itself.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use bytes::Bytes;
use pdbmux_core::cache::shared::{StoreAnswer, StoreRequest};
use pdbmux_core::{
    BackendId, BodyMode, UpstreamBody, UpstreamId, UpstreamRequest, UpstreamResponse,
};
use pdbmux_driver::{TaskRole, UpstreamResult};

use crate::error::HarnessError;
use crate::record::{Machine, SentRequest};
use crate::script::{Asked, FakeBackend, ReplyOutcome};
use crate::store::{answer_text, describe, since, FakeStore};
use crate::transcript::{body_text, target_text, Transcript};

/// What a scripted panic says; the harness tells such panics from real ones by it.
pub(crate) const SCRIPTED_PANIC: &str = "scripted panic";

/// Polls in one [`Sim::run_ready`] beyond which the run counts as a busy loop.
const MAX_POLLS: usize = 1_000_000;

type BoxedTask = Pin<Box<dyn Future<Output = ()> + Send>>;

/// The simulated runtime: a cheap handle on one shared world.
#[derive(Clone)]
pub(crate) struct Sim(Arc<Shared>);

struct Shared {
    world: Mutex<World>,
    tasks: Mutex<BTreeMap<u64, Slot>>,
    ready: Arc<Mutex<ReadyQueue>>,
    /// The task being polled and its machine (whose sends and timers these are).
    current: Mutex<Option<(u64, Machine)>>,
}

/// One task: what it runs for, and its future while it is not being polled.
struct Slot {
    machine: Machine,
    /// Whether its start, end and cancellation go into the transcript (flights).
    announced: bool,
    future: Option<BoxedTask>,
    /// Cancelled while it was being polled: dropped when the poll returns.
    cancelled: bool,
}

#[derive(Default)]
struct ReadyQueue {
    queue: VecDeque<u64>,
    queued: BTreeSet<u64>,
}

struct TaskWaker {
    id: u64,
    ready: Weak<Mutex<ReadyQueue>>,
}

impl Wake for TaskWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        if let Some(ready) = self.ready.upgrade() {
            let mut ready = lock(&ready);
            if ready.queued.insert(self.id) {
                ready.queue.push_back(self.id);
            }
        }
    }
}

/// An upstream call in flight: its scripted outcome and, once delivered, its result.
struct Call {
    machine: Machine,
    id: UpstreamId,
    backend: BackendId,
    body_mode: BodyMode,
    /// When the outcome is delivered; `None` for a backend that never answers.
    due: Option<Instant>,
    outcome: Option<ReplyOutcome>,
    delivered: Option<Delivered>,
    waker: Waker,
}

enum Delivered {
    Result(UpstreamResult<SimHeld>),
    Panic,
}

/// A timer a task waits on.
struct Timer {
    task: u64,
    machine: Machine,
    waker: Waker,
}

/// A client's answer, as its task hands it to the harness.
pub(crate) struct Answered {
    pub(crate) client: usize,
    pub(crate) response: crate::record::ClientResponse,
}

/// Everything the simulation knows besides its tasks.
pub(crate) struct World {
    pub(crate) start: Instant,
    pub(crate) now: Instant,
    backends: Vec<FakeBackend>,
    pub(crate) store: FakeStore,
    /// Deliver every reply due at one instant before any task runs (see
    /// [`crate::Harness::set_late_answers`]).
    pub(crate) late_answers: bool,
    /// The most a held body gives one read ([`crate::Harness::set_piece_bytes`]).
    pub(crate) piece_bytes: usize,
    seq: u64,
    /// Keyed by send order, the tie-break between replies due at the same instant.
    calls: BTreeMap<u64, Call>,
    timers: BTreeMap<(Instant, u64), Timer>,
    /// Timers fired at the current instant, by task: firing one again means a deadline that
    /// `handle_timeout` did not move.
    fired: BTreeSet<(u64, Instant)>,
    pub(crate) transcript: Transcript,
    pub(crate) sends: Vec<SentRequest>,
    pub(crate) answered: Vec<Answered>,
    /// Clients that leave after the first bytes of a streamed merge ([`crate::Harness::leave_mid_body`]).
    pub(crate) leave_mid_body: BTreeSet<usize>,
    /// Clients that stop reading a streamed merge's body after its first bytes, for how long
    /// ([`crate::Harness::stall_mid_body`]).
    pub(crate) stall_mid_body: BTreeMap<usize, Duration>,
    /// Panics other than scripted ones (a defect), by task.
    pub(crate) panics: Vec<String>,
    /// Tasks that ended in a scripted panic.
    pub(crate) panicked: BTreeSet<Machine>,
    pub(crate) failure: Option<HarnessError>,
}

impl World {
    pub(crate) fn elapsed(&self) -> Duration {
        self.now.duration_since(self.start)
    }

    pub(crate) fn log(&mut self, line: impl AsRef<str>) {
        let at = self.elapsed();
        self.transcript.push(at, line);
    }

    pub(crate) fn fail(&mut self, error: HarnessError) {
        self.log(format!("HARNESS FAILURE: {error}"));
        self.failure.get_or_insert(error);
    }

    fn backend_name(&self, backend: BackendId) -> String {
        self.backends
            .get(backend.0)
            .map_or_else(|| backend.to_string(), |b| b.name.clone())
    }

    /// The calls not answered yet (scripted to answer or never), for the quiescence check.
    pub(crate) fn calls_in_flight(&self) -> Vec<String> {
        self.calls
            .values()
            .filter(|call| call.delivered.is_none())
            .map(|call| format!("{} {}", call.machine, call.id))
            .collect()
    }

    /// Asks the backend's script about a request `machine` sends; the call's key, or `None`
    /// (with the failure recorded) when the request cannot be answered.
    fn register(
        &mut self,
        machine: Machine,
        request: UpstreamRequest,
        waker: &Waker,
    ) -> Option<u64> {
        let duplicate = self
            .calls
            .values()
            .any(|call| call.machine == machine && call.id == request.id);
        if duplicate {
            self.fail(HarnessError::DuplicateId {
                machine: machine.to_string(),
                id: request.id.to_string(),
            });
            return None;
        }
        let Some(backend) = self.backends.get_mut(request.backend.0) else {
            self.fail(HarnessError::UnknownBackend {
                machine: machine.to_string(),
                id: request.id.to_string(),
                backend: request.backend.0,
            });
            return None;
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
            self.fail(HarnessError::ScriptExhausted {
                backend: name,
                path: request.path_and_query,
            });
            return None;
        };
        let due = match reply.outcome {
            ReplyOutcome::Never => None,
            _ => Some(self.now + reply.latency),
        };
        self.seq += 1;
        let key = self.seq;
        self.calls.insert(
            key,
            Call {
                machine,
                id: request.id,
                backend: request.backend,
                body_mode: request.body_mode,
                due,
                outcome: Some(reply.outcome),
                delivered: None,
                waker: waker.clone(),
            },
        );
        self.sends.push(SentRequest {
            at: self.elapsed(),
            machine,
            backend_name: name,
            request,
        });
        Some(key)
    }

    /// The earliest undelivered reply (ties in send order) and the earliest timer.
    pub(crate) fn next_event(&self) -> Option<Instant> {
        let reply = self
            .calls
            .values()
            .filter(|call| call.delivered.is_none())
            .filter_map(|call| call.due)
            .min();
        let timer = self.timers.keys().next().map(|(at, _)| *at);
        match (reply, timer) {
            (Some(reply), Some(timer)) => Some(reply.min(timer)),
            (reply, timer) => reply.or(timer),
        }
    }

    /// Moves the clock to `at` (never back) and makes what is due there happen: the earliest
    /// reply (every one due then, with late answers on), or else every timer due then.
    pub(crate) fn step(&mut self, sim: &Sim, at: Instant) {
        if at > self.now {
            self.fired.clear();
        }
        self.now = self.now.max(at);
        let due: Vec<u64> = self
            .calls
            .iter()
            .filter(|(_, call)| call.delivered.is_none() && call.due.is_some_and(|d| d <= self.now))
            .map(|(key, _)| *key)
            .collect();
        if !due.is_empty() {
            let take = if self.late_answers { due.len() } else { 1 };
            for key in due.into_iter().take(take) {
                self.deliver(sim, key);
            }
            return;
        }
        let mut firing: Vec<((Instant, u64), Timer)> = Vec::new();
        while let Some(entry) = self.timers.first_entry() {
            if entry.key().0 > self.now {
                break;
            }
            let (key, timer) = entry.remove_entry();
            firing.push((key, timer));
        }
        // Machines in a fixed order: the estate, then clients, then flights.
        firing.sort_by_key(|((at, seq), timer)| (timer.machine, *at, *seq));
        for ((at, _), timer) in firing {
            if !self.fired.insert((timer.task, at)) {
                self.fail(HarnessError::StuckDeadline {
                    machine: timer.machine.to_string(),
                    at: at.saturating_duration_since(self.start),
                });
            }
            self.log(format!("{} timeout", timer.machine));
            timer.waker.wake();
        }
    }

    /// Delivers a call's scripted outcome and wakes the task waiting for it.
    fn deliver(&mut self, sim: &Sim, key: u64) {
        let Some(call) = self.calls.get_mut(&key) else {
            return;
        };
        let (machine, id, body_mode) = (call.machine, call.id, call.body_mode);
        let backend = call.backend;
        let outcome = call.outcome.take();
        let waker = call.waker.clone();
        let name = self.backend_name(backend);
        let delivered = match outcome {
            None | Some(ReplyOutcome::Never) => return,
            Some(ReplyOutcome::Panic) => {
                self.log(format!(
                    "{machine} {id} <- {name} (the task reading it panics)"
                ));
                Delivered::Panic
            }
            Some(ReplyOutcome::Fail(failure)) => {
                self.log(format!("{machine} {id} <- {name} failed: {failure}"));
                Delivered::Result(Err(failure))
            }
            Some(ReplyOutcome::Answer(answer)) => {
                let headers = match answer.header_map() {
                    Ok(headers) => headers,
                    Err(error) => return self.fail(error),
                };
                // The scripted backends frame their answers as chunked, as PuppetDB does,
                // unless a script gives a Content-Length (then a short answer is read whole).
                let declared = answer
                    .headers
                    .iter()
                    .find(|(name, _)| name.eq_ignore_ascii_case("content-length"))
                    .and_then(|(_, value)| value.parse().ok());
                let held = body_mode.holds(answer.status, declared);
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
                    "{machine} {id} <- {name} {}{extra} {content_type} {}{}",
                    answer.status.as_u16(),
                    if held { "held:" } else { "" },
                    body_text(&answer.body)
                ));
                let (body, held) = if held {
                    let held = SimHeld {
                        sim: sim.clone(),
                        machine,
                        id,
                        body: Some(answer.body),
                    };
                    (UpstreamBody::Held, Some(held))
                } else {
                    (UpstreamBody::Full(answer.body), None)
                };
                let response = UpstreamResponse {
                    status: answer.status,
                    headers,
                    body,
                };
                Delivered::Result(Ok((response, held)))
            }
        };
        if let Some(call) = self.calls.get_mut(&key) {
            call.delivered = Some(delivered);
        }
        waker.wake();
    }
}

impl Sim {
    /// A world over these backends, its clock starting at `start`.
    pub(crate) fn new(backends: Vec<FakeBackend>, start: Instant) -> Sim {
        Sim(Arc::new(Shared {
            world: Mutex::new(World {
                start,
                now: start,
                backends,
                store: FakeStore::default(),
                late_answers: false,
                piece_bytes: SIM_PIECE,
                seq: 0,
                calls: BTreeMap::new(),
                timers: BTreeMap::new(),
                fired: BTreeSet::new(),
                transcript: Transcript::default(),
                sends: Vec::new(),
                answered: Vec::new(),
                leave_mid_body: BTreeSet::new(),
                stall_mid_body: BTreeMap::new(),
                panics: Vec::new(),
                panicked: BTreeSet::new(),
                failure: None,
            }),
            tasks: Mutex::new(BTreeMap::new()),
            ready: Arc::new(Mutex::new(ReadyQueue::default())),
            current: Mutex::new(None),
        }))
    }

    /// The world, locked; never held across a poll or a drop of a simulated future.
    pub(crate) fn world(&self) -> MutexGuard<'_, World> {
        lock(&self.0.world)
    }

    /// The task being polled and its machine.
    fn current(&self) -> (u64, Machine) {
        lock(&self.0.current).unwrap_or((0, Machine::Estate))
    }

    /// Spawns a task for `machine`, queued to run.
    pub(crate) fn spawn_for(
        &self,
        machine: Machine,
        announced: bool,
        future: impl Future<Output = ()> + Send + 'static,
    ) -> SimTask {
        let id = {
            let mut world = self.world();
            world.seq += 1;
            if announced {
                world.log(format!("{machine} starts"));
            }
            world.seq
        };
        lock(&self.0.tasks).insert(
            id,
            Slot {
                machine,
                announced,
                future: Some(Box::pin(future)),
                cancelled: false,
            },
        );
        let mut ready = lock(&self.0.ready);
        ready.queued.insert(id);
        ready.queue.push_back(id);
        SimTask {
            id,
            shared: Arc::downgrade(&self.0),
        }
    }

    /// Polls queued tasks, in wake order, until none is queued.
    pub(crate) fn run_ready(&self) {
        for _ in 0..MAX_POLLS {
            let next = {
                let mut ready = lock(&self.0.ready);
                let next = ready.queue.pop_front();
                if let Some(id) = next {
                    ready.queued.remove(&id);
                }
                next
            };
            let Some(id) = next else {
                return;
            };
            let taken = {
                let mut tasks = lock(&self.0.tasks);
                tasks
                    .get_mut(&id)
                    .and_then(|slot| Some((slot.future.take()?, slot.machine, slot.announced)))
            };
            let Some((mut future, machine, announced)) = taken else {
                continue;
            };
            *lock(&self.0.current) = Some((id, machine));
            let waker = Waker::from(Arc::new(TaskWaker {
                id,
                ready: Arc::downgrade(&self.0.ready),
            }));
            let polled = std::panic::catch_unwind(AssertUnwindSafe(|| {
                future.as_mut().poll(&mut Context::from_waker(&waker))
            }));
            *lock(&self.0.current) = None;
            match polled {
                Ok(Poll::Pending) => {
                    let dropped = {
                        let mut tasks = lock(&self.0.tasks);
                        match tasks.get_mut(&id) {
                            Some(slot) if !slot.cancelled => {
                                slot.future = Some(future);
                                None
                            }
                            _ => {
                                tasks.remove(&id);
                                Some(future)
                            }
                        }
                    };
                    if dropped.is_some() && announced {
                        self.world().log(format!("{machine} cancelled"));
                    }
                    drop(dropped);
                }
                Ok(Poll::Ready(())) => {
                    lock(&self.0.tasks).remove(&id);
                    drop(future);
                    if announced {
                        self.world().log(format!("{machine} done"));
                    }
                }
                Err(panic) => {
                    lock(&self.0.tasks).remove(&id);
                    drop(future);
                    let message = panic_message(panic.as_ref());
                    let mut world = self.world();
                    world.log(format!("{machine} panicked: {message}"));
                    if message.starts_with(SCRIPTED_PANIC) {
                        world.panicked.insert(machine);
                    } else {
                        world.panics.push(format!("{machine}: {message}"));
                    }
                }
            }
        }
        let mut world = self.world();
        let at = world.elapsed();
        world.fail(HarnessError::Livelock {
            steps: MAX_POLLS,
            at,
        });
    }

    /// Stops a task: its future is dropped now (or, while it is being polled, when the poll
    /// returns), abandoning what it was waiting for.
    pub(crate) fn cancel(&self, id: u64) {
        let dropped = {
            let mut tasks = lock(&self.0.tasks);
            match tasks.get_mut(&id) {
                Some(slot) if slot.future.is_some() => tasks.remove(&id),
                Some(slot) => {
                    slot.cancelled = true;
                    None
                }
                None => None,
            }
        };
        if let Some(slot) = dropped {
            if slot.announced {
                self.world().log(format!("{} cancelled", slot.machine));
            }
            drop(slot);
        }
    }

    /// Drops every task (the end of a run): breaks the cycle between the tasks and the host.
    pub(crate) fn drop_tasks(&self) {
        let tasks = std::mem::take(&mut *lock(&self.0.tasks));
        drop(tasks);
    }
}

/// A task's handle on the simulated runtime.
pub(crate) struct SimTask {
    id: u64,
    shared: Weak<Shared>,
}

impl SimTask {
    /// The task's number, for [`Sim::cancel`].
    pub(crate) fn id(&self) -> u64 {
        self.id
    }
}

impl pdbmux_driver::Task for SimTask {
    fn cancel(self) {
        if let Some(shared) = self.shared.upgrade() {
            Sim(shared).cancel(self.id);
        }
    }

    fn detach(self) {}

    fn is_finished(&self) -> bool {
        self.shared
            .upgrade()
            .is_none_or(|shared| !lock(&shared.tasks).contains_key(&self.id))
    }
}

impl pdbmux_driver::Runtime for Sim {
    type Held = SimHeld;

    fn poll_piece(
        held: std::pin::Pin<&mut SimHeld>,
        _cx: &mut std::task::Context<'_>,
    ) -> Poll<Option<Result<Bytes, String>>> {
        held.get_mut().poll_piece()
    }
    type Task = SimTask;
    type Clients = ();

    fn clients(_config: &pdbmux_core::config::Config) -> Result<(), pdbmux_driver::StartError> {
        Ok(())
    }

    fn store(
        &self,
        _clients: &(),
        request: StoreRequest,
    ) -> impl Future<Output = StoreAnswer> + Send {
        let sim = self.clone();
        async move {
            let mut world = sim.world();
            let at = since(world.start, world.now);
            let answer = world.store.answer(at, &request.op);
            let line = format!(
                "store {} -> {}",
                describe(&request.op),
                answer_text(&answer)
            );
            world.log(line);
            answer
        }
    }

    fn send(
        &self,
        _clients: &(),
        request: UpstreamRequest,
        budget: pdbmux_driver::budget::BodyBudget,
    ) -> impl Future<Output = UpstreamResult<SimHeld>> + Send {
        SimSend {
            sim: self.clone(),
            request: Some(request),
            budget,
            call: None,
        }
    }

    fn sleep_until(&self, deadline: Instant) -> impl Future<Output = ()> + Send {
        SimSleep {
            sim: self.clone(),
            deadline,
            timer: None,
        }
    }

    fn now(&self) -> Instant {
        self.world().now
    }

    /// The Unix epoch at the start, moving with the simulated clock: no real wall clock.
    fn wall_clock(&self) -> std::time::SystemTime {
        std::time::UNIX_EPOCH + self.world().elapsed()
    }

    fn spawn(&self, future: impl Future<Output = ()> + Send + 'static) -> SimTask {
        self.spawn_for(self.current().1, false, future)
    }

    fn spawn_as(
        &self,
        role: TaskRole,
        future: impl Future<Output = ()> + Send + 'static,
    ) -> SimTask {
        match role {
            TaskRole::Flight(flight) => self.spawn_for(Machine::Flight(flight), true, future),
            TaskRole::Driver | TaskRole::EstateCall | TaskRole::StoreCall => {
                self.spawn_for(Machine::Estate, false, future)
            }
        }
    }

    async fn unblock<T: Send + 'static>(&self, work: impl FnOnce() -> T + Send + 'static) -> T {
        work()
    }
}

/// An upstream send: registered with the world when first polled, answered when the world
/// delivers its scripted outcome; dropped unanswered, it is cancelled.
struct SimSend {
    sim: Sim,
    request: Option<UpstreamRequest>,
    /// A whole body delivered is counted here, as a runtime counts it while reading.
    budget: pdbmux_driver::budget::BodyBudget,
    /// The call's key once registered; `None` again once answered.
    call: Option<u64>,
}

impl Future for SimSend {
    type Output = UpstreamResult<SimHeld>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        if let Some(request) = this.request.take() {
            let (_, machine) = this.sim.current();
            this.call = this.sim.world().register(machine, request, cx.waker());
            return Poll::Pending;
        }
        let Some(key) = this.call else {
            return Poll::Pending;
        };
        let delivered = {
            let mut world = this.sim.world();
            match world.calls.get_mut(&key) {
                Some(call) if call.delivered.is_some() => {
                    world.calls.remove(&key).and_then(|call| call.delivered)
                }
                Some(call) => {
                    call.waker = cx.waker().clone();
                    None
                }
                None => None,
            }
        };
        match delivered {
            Some(Delivered::Result(result)) => {
                this.call = None;
                Poll::Ready(result.and_then(|(response, held)| {
                    if let pdbmux_core::UpstreamBody::Full(body) = &response.body {
                        this.budget.body(None)?.chunk(body.len())?;
                    }
                    Ok((response, held))
                }))
            }
            Some(Delivered::Panic) => {
                this.call = None;
                panic!("{SCRIPTED_PANIC} reading an upstream answer");
            }
            None => Poll::Pending,
        }
    }
}

impl Drop for SimSend {
    fn drop(&mut self) {
        let Some(key) = self.call.take() else {
            return;
        };
        let call = self.sim.world().calls.remove(&key);
        let Some(call) = call else {
            return;
        };
        let note = if call.delivered.is_some() {
            " (its answer was already on the way)"
        } else {
            ""
        };
        self.sim
            .world()
            .log(format!("{} cancel {}{note}", call.machine, call.id));
        // A held body in an answer nobody reads is dropped here, outside the world's lock.
        drop(call);
    }
}

/// A timer: due at its deadline on the simulated clock.
struct SimSleep {
    sim: Sim,
    deadline: Instant,
    timer: Option<(Instant, u64)>,
}

impl Future for SimSleep {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = &mut *self;
        let (task, machine) = this.sim.current();
        let mut world = this.sim.world();
        match this.timer {
            // Fired (taken off the world's timers) or already past when first polled after
            // the clock moved on.
            Some(key) if !world.timers.contains_key(&key) => {
                this.timer = None;
                Poll::Ready(())
            }
            Some(key) => {
                if let Some(timer) = world.timers.get_mut(&key) {
                    timer.waker = cx.waker().clone();
                }
                Poll::Pending
            }
            None => {
                // Even a deadline already reached waits for its step, so each timeout is one
                // step of the run and a deadline that never moves is a livelock, not a hang.
                world.seq += 1;
                let key = (this.deadline, world.seq);
                let waker = cx.waker().clone();
                let timer = Timer {
                    task,
                    machine,
                    waker,
                };
                world.timers.insert(key, timer);
                this.timer = Some(key);
                Poll::Pending
            }
        }
    }
}

impl Drop for SimSleep {
    fn drop(&mut self) {
        if let Some(key) = self.timer.take() {
            self.sim.world().timers.remove(&key);
        }
    }
}

/// The most a simulated held body gives a read at once by default (a socket read's worth).
const SIM_PIECE: usize = 64 * 1024;

/// An upstream body held for streaming: its bytes, read by the client's task when the
/// response streams it; dropped unread, it is cancelled.
pub struct SimHeld {
    sim: Sim,
    machine: Machine,
    id: UpstreamId,
    body: Option<Bytes>,
}

impl SimHeld {
    /// A streamed merge's read: the body in pieces of at most the world's `piece_bytes`
    /// ([`SIM_PIECE`] unless a test sets it), each ready at once, then its end.
    fn poll_piece(&mut self) -> Poll<Option<Result<Bytes, String>>> {
        let most = self.sim.world().piece_bytes;
        let piece = match self.body.as_mut() {
            Some(body) if body.len() > most => Some(body.split_to(most)),
            _ => self.body.take(),
        };
        Poll::Ready(piece.map(Ok))
    }

    /// The upstream answer it is the body of.
    pub(crate) fn id(&self) -> UpstreamId {
        self.id
    }

    /// The whole body, read by the client.
    pub(crate) fn read(mut self) -> Bytes {
        self.body.take().unwrap_or_default()
    }
}

impl Drop for SimHeld {
    fn drop(&mut self) {
        if self.body.is_some() {
            let line = format!("{} cancel {} (held body dropped)", self.machine, self.id);
            self.sim.world().log(line);
        }
    }
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(text) = panic.downcast_ref::<&str>() {
        (*text).to_owned()
    } else if let Some(text) = panic.downcast_ref::<String>() {
        text.clone()
    } else {
        "(no message)".to_owned()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
