//! The shared estate behind a short-held lock, and the background task that drives its outputs
//! (upstream requests it sends itself, answers to waiting clients) and its one deadline.

use std::collections::BTreeMap;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use pdbmux_core::{
    Admission, ClientRequest, Estate, EstateOutput, Exchange, FlightId, Response, Round,
    UpstreamId, UpstreamRequest, WaiterId,
};
use smol::channel::{self, Receiver, Sender};
use smol::future::FutureExt;
use smol::{Executor, Task};

use pdbmux_driver::UpstreamResult;
use pdbmux_sealed::Sealer;

use crate::body::HeldBody;
use crate::upstream::Upstreams;

/// What a request handler does next; see [`Shared::admit`].
pub enum Admitted {
    /// Answer right away.
    Respond(Response),
    /// Drive this exchange on the request's own task.
    Exchange(Exchange),
    /// Wait for the estate's word.
    Wait(WaitTicket),
}

/// A client's place in the estate's queue: resolves to the estate's word. Dropping it before
/// then (the client went away) tells the estate, so a flight nobody waits for is cancelled.
pub struct WaitTicket {
    shared: Arc<Shared>,
    waiter: WaiterId,
    receiver: Option<Receiver<WaiterEvent>>,
}

impl WaitTicket {
    /// Waits for the estate's word; `None` when the estate is gone (shutting down).
    pub async fn wait(mut self) -> Option<WaiterEvent> {
        let receiver = self.receiver.take()?;
        receiver.recv().await.ok()
    }
}

impl Drop for WaitTicket {
    fn drop(&mut self) {
        if self.receiver.is_some() {
            self.shared.waiter_gone(self.waiter);
        }
    }
}

/// What the estate tells a waiting request.
pub enum WaiterEvent {
    /// Answer with this.
    Respond(Response),
    /// Admit the request again ([`Shared::readmit`]).
    Resume,
}

/// State shared by every connection task.
pub struct Shared {
    estate: Mutex<Estate>,
    waiters: Mutex<BTreeMap<WaiterId, Sender<WaiterEvent>>>,
    flights: Mutex<BTreeMap<FlightId, Task<Option<()>>>>,
    /// Wakes the driver; a full channel already holds a pending wake-up (like tokio's `Notify`).
    wake: Sender<()>,
    woken: Receiver<()>,
    executor: Arc<Executor<'static>>,
    /// Seals flights' answers before the estate stores them (the store's own sealer).
    sealer: Sealer,
    /// The upstream clients, one per backend.
    pub upstreams: Arc<Upstreams>,
}

impl Shared {
    /// Wraps a fresh estate, the sealer of its store and the upstream clients; tasks go to
    /// `executor`.
    pub fn new(
        estate: Estate,
        sealer: Sealer,
        upstreams: Upstreams,
        executor: Arc<Executor<'static>>,
    ) -> Arc<Shared> {
        let (wake, woken) = channel::bounded(1);
        Arc::new(Shared {
            estate: Mutex::new(estate),
            waiters: Mutex::new(BTreeMap::new()),
            flights: Mutex::new(BTreeMap::new()),
            wake,
            woken,
            executor,
            sealer,
            upstreams: Arc::new(upstreams),
        })
    }

    /// Spawns `future` on the executor; a panic in it ends that task only (logged), as in tokio.
    pub fn spawn<T: Send + 'static>(
        &self,
        what: &'static str,
        future: impl Future<Output = T> + Send + 'static,
    ) -> Task<Option<T>> {
        spawn_guarded(&self.executor, what, future)
    }

    fn estate(&self) -> MutexGuard<'_, Estate> {
        // A panic while holding the lock leaves the estate as it was between two calls; keep going.
        self.estate
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn waiters(&self) -> MutexGuard<'_, BTreeMap<WaiterId, Sender<WaiterEvent>>> {
        self.waiters
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn flights(&self) -> MutexGuard<'_, BTreeMap<FlightId, Task<Option<()>>>> {
        self.flights
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn notify(&self) {
        // Full means a wake-up is already pending.
        let _ = self.wake.try_send(());
    }

    /// Admits a client request (briefly under the estate lock).
    pub fn admit(self: &Arc<Self>, now: Instant, request: &ClientRequest) -> Admitted {
        self.admit_with(now, request, Estate::admit)
    }

    /// Admits a request again after [`WaiterEvent::Resume`].
    pub fn readmit(self: &Arc<Self>, now: Instant, request: &ClientRequest) -> Admitted {
        self.admit_with(now, request, Estate::readmit)
    }

    fn waiter_gone(&self, waiter: WaiterId) {
        self.waiters().remove(&waiter);
        self.estate().handle_waiter_gone(Instant::now(), waiter);
        self.notify();
    }

    fn ticket(self: &Arc<Self>, waiter: WaiterId) -> WaitTicket {
        let (sender, receiver) = channel::bounded(1);
        self.waiters().insert(waiter, sender);
        WaitTicket {
            shared: Arc::clone(self),
            waiter,
            receiver: Some(receiver),
        }
    }

    /// Runs a flight's exchange on its own task and reports its response to the estate.
    fn spawn_flight(self: &Arc<Self>, flight: FlightId, exchange: Exchange) {
        let shared = Arc::clone(self);
        // Held across the spawn so the task cannot remove its entry before it is inserted.
        let mut flights = self.flights();
        let task = self.spawn("flight", async move {
            let driven = AssertUnwindSafe(async {
                let (response, _) = pdbmux_driver::drive(&*shared, exchange).await;
                // Copying a large body into huge pages may make the kernel compact memory:
                // not on an executor thread.
                if shared.sealer.is_worth_sealing(&response) {
                    let sealer = shared.sealer.clone();
                    smol::unblock(move || sealer.seal_flight_answer(response)).await
                } else {
                    response
                }
            })
            .catch_unwind()
            .await;
            // A panic would leave the flight's waiters waiting: answer them with a 500.
            let response = driven.unwrap_or_else(|_| {
                tracing::error!("flight {flight} panicked");
                Response::text(
                    http::StatusCode::INTERNAL_SERVER_ERROR,
                    "pdbmux: internal error",
                )
            });
            // Our own handle: detach it so removing it does not cancel the running task.
            let own = shared.flights().remove(&flight);
            if let Some(own) = own {
                own.detach();
            }
            shared
                .estate()
                .handle_flight_done(Instant::now(), flight, response);
            shared.notify();
        });
        flights.insert(flight, task);
    }

    fn admit_with(
        self: &Arc<Self>,
        now: Instant,
        request: &ClientRequest,
        admit: fn(&mut Estate, Instant, &ClientRequest) -> Admission,
    ) -> Admitted {
        let mut estate = self.estate();
        let admission = admit(&mut estate, now, request);
        // The admission may have queued upstream requests (a membership refresh).
        let wake = !matches!(admission, Admission::Respond(_));
        let admitted = match admission {
            Admission::Respond(response) => Admitted::Respond(response),
            Admission::Exchange(exchange) => Admitted::Exchange(exchange),
            // Registered before the lock is released, so the driver cannot answer first.
            Admission::Wait(waiter) => Admitted::Wait(self.ticket(waiter)),
            Admission::Flight {
                flight,
                waiter,
                exchange,
            } => {
                let ticket = self.ticket(waiter);
                self.spawn_flight(flight, exchange);
                Admitted::Wait(ticket)
            }
        };
        drop(estate);
        if wake {
            self.notify();
        }
        admitted
    }

    /// Starts the task that drives the estate; dropping the returned task stops it.
    pub fn spawn_driver(self: &Arc<Self>) -> Task<Option<()>> {
        let shared = Arc::clone(self);
        self.spawn("estate driver", async move { shared.run_driver().await })
    }

    fn tell(&self, waiter: WaiterId, event: WaiterEvent) {
        let sender = self.waiters().remove(&waiter);
        if let Some(sender) = sender {
            // The client may have gone; nothing to do then.
            let _ = sender.try_send(event);
        }
    }

    async fn run_driver(self: Arc<Self>) {
        // Dropping a smol task cancels it: these handles are the upstream requests' abort handles.
        let mut sends: BTreeMap<UpstreamId, Task<Option<()>>> = BTreeMap::new();
        loop {
            let (outputs, deadline) = {
                let mut estate = self.estate();
                let outputs: Vec<EstateOutput> =
                    std::iter::from_fn(|| estate.poll_output()).collect();
                (outputs, estate.poll_timeout())
            };
            for output in outputs {
                match output {
                    EstateOutput::Send(request) => {
                        let shared = Arc::clone(&self);
                        let id = request.id;
                        let task = self.spawn("upstream request", async move {
                            let result = shared.upstreams.send(&request).await;
                            let now = Instant::now();
                            {
                                let mut estate = shared.estate();
                                match result {
                                    Ok((response, _)) => {
                                        estate.handle_upstream_response(now, request.id, response)
                                    }
                                    Err(failure) => {
                                        estate.handle_upstream_failure(now, request.id, failure)
                                    }
                                }
                            }
                            shared.notify();
                        });
                        sends.retain(|_, task| !task.is_finished());
                        sends.insert(id, task);
                    }
                    EstateOutput::Cancel(id) => drop(sends.remove(&id)),
                    EstateOutput::Respond { waiter, response } => {
                        self.tell(waiter, WaiterEvent::Respond(response))
                    }
                    EstateOutput::Resume { waiter } => self.tell(waiter, WaiterEvent::Resume),
                    EstateOutput::CancelFlight(flight) => {
                        // Taken out first: cancelling drops the flight's future here.
                        let task = self.flights().remove(&flight);
                        drop(task);
                    }
                }
            }
            let woken = async {
                let _ = self.woken.recv().await;
                false
            };
            let timed_out = async {
                crate::service::sleep_until(deadline).await;
                true
            };
            if woken.or(timed_out).await {
                self.estate().handle_timeout(Instant::now());
            }
        }
    }
}

/// Spawns `future` on `executor`, catching a panic so that it ends that task only (logged): an
/// uncaught panic would unwind through the executor thread.
pub fn spawn_guarded<T: Send + 'static>(
    executor: &Executor<'static>,
    what: &'static str,
    future: impl Future<Output = T> + Send + 'static,
) -> Task<Option<T>> {
    executor.spawn(async move {
        match AssertUnwindSafe(future).catch_unwind().await {
            Ok(value) => Some(value),
            Err(_) => {
                tracing::error!("a {what} task panicked");
                None
            }
        }
    })
}

/// Exchanges run on smol: pdbmux's own upstream pool, async-io's timer, rounds into the estate.
impl pdbmux_driver::Transport for Shared {
    type Held = HeldBody;

    fn send(
        &self,
        request: UpstreamRequest,
    ) -> impl Future<Output = UpstreamResult<HeldBody>> + Send {
        let upstreams = Arc::clone(&self.upstreams);
        async move { upstreams.send(&request).await }
    }

    async fn sleep_until(&self, deadline: Instant) {
        smol::Timer::at(deadline).await;
    }

    fn round(&self, round: Round) {
        self.estate().handle_round(Instant::now(), round);
    }
}
