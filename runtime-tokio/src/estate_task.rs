//! The shared estate behind a short-held lock, and the background task that drives its outputs
//! (upstream requests it sends itself, answers to waiting clients) and its one deadline.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use pdbmux_core::{
    Admission, ClientRequest, Estate, EstateOutput, Exchange, FlightId, Response, Round,
    UpstreamId, UpstreamRequest, WaiterId,
};
use tokio::sync::{oneshot, Notify};
use tokio::task::JoinHandle;

use pdbmux_driver::UpstreamResult;
use pdbmux_sealed::Sealer;

use crate::upstream::{HeldBody, Upstreams};

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
    receiver: Option<oneshot::Receiver<WaiterEvent>>,
}

impl WaitTicket {
    /// Waits for the estate's word; `None` when the estate is gone (shutting down).
    pub async fn wait(mut self) -> Option<WaiterEvent> {
        let receiver = self.receiver.take()?;
        receiver.await.ok()
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
    waiters: Mutex<BTreeMap<WaiterId, oneshot::Sender<WaiterEvent>>>,
    flights: Mutex<BTreeMap<FlightId, tokio::task::AbortHandle>>,
    wake: Notify,
    /// Seals flights' answers before the estate stores them (the store's own sealer).
    sealer: Sealer,
    /// The upstream clients, one per backend.
    pub upstreams: Arc<Upstreams>,
}

impl Shared {
    /// Wraps a fresh estate, the sealer of its store and the upstream clients.
    pub fn new(estate: Estate, sealer: Sealer, upstreams: Upstreams) -> Arc<Shared> {
        Arc::new(Shared {
            estate: Mutex::new(estate),
            waiters: Mutex::new(BTreeMap::new()),
            flights: Mutex::new(BTreeMap::new()),
            wake: Notify::new(),
            sealer,
            upstreams: Arc::new(upstreams),
        })
    }

    fn estate(&self) -> MutexGuard<'_, Estate> {
        // A panic while holding the lock leaves the estate as it was between two calls; keep going.
        self.estate
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn waiters(&self) -> MutexGuard<'_, BTreeMap<WaiterId, oneshot::Sender<WaiterEvent>>> {
        self.waiters
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
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
        self.wake.notify_one();
    }

    fn ticket(self: &Arc<Self>, waiter: WaiterId) -> WaitTicket {
        let (sender, receiver) = oneshot::channel();
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
        let task = tokio::spawn(async move {
            let (response, _) = pdbmux_driver::drive(&*shared, exchange).await;
            let response = seal_flight_answer(&shared.sealer, response).await;
            shared.flights().remove(&flight);
            shared
                .estate()
                .handle_flight_done(Instant::now(), flight, response);
            shared.wake.notify_one();
        });
        flights.insert(flight, task.abort_handle());
    }

    fn flights(&self) -> MutexGuard<'_, BTreeMap<FlightId, tokio::task::AbortHandle>> {
        self.flights
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
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
            self.wake.notify_one();
        }
        admitted
    }

    /// Starts the task that drives the estate until the process exits.
    pub fn spawn_driver(self: &Arc<Self>) -> JoinHandle<()> {
        let shared = Arc::clone(self);
        tokio::spawn(async move { shared.run_driver().await })
    }

    fn tell(&self, waiter: WaiterId, event: WaiterEvent) {
        if let Some(sender) = self.waiters().remove(&waiter) {
            // The client may have gone; nothing to do then.
            let _ = sender.send(event);
        }
    }

    async fn run_driver(self: Arc<Self>) {
        let mut aborts: BTreeMap<UpstreamId, tokio::task::AbortHandle> = BTreeMap::new();
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
                        let task = tokio::spawn(async move {
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
                            shared.wake.notify_one();
                        });
                        aborts.retain(|_, handle| !handle.is_finished());
                        aborts.insert(id, task.abort_handle());
                    }
                    EstateOutput::Cancel(id) => {
                        if let Some(handle) = aborts.remove(&id) {
                            handle.abort();
                        }
                    }
                    EstateOutput::Respond { waiter, response } => {
                        self.tell(waiter, WaiterEvent::Respond(response))
                    }
                    EstateOutput::Resume { waiter } => self.tell(waiter, WaiterEvent::Resume),
                    EstateOutput::CancelFlight(flight) => {
                        if let Some(task) = self.flights().remove(&flight) {
                            task.abort();
                        }
                    }
                }
            }
            tokio::select! {
                () = self.wake.notified() => {}
                () = crate::service::sleep_until(deadline) => self.estate().handle_timeout(Instant::now()),
            }
        }
    }
}

/// Exchanges run on tokio: hyper-util's pooled clients, tokio's timer, rounds into the estate.
impl pdbmux_driver::Transport for Shared {
    type Held = HeldBody;

    fn send(
        &self,
        request: UpstreamRequest,
    ) -> impl Future<Output = UpstreamResult<HeldBody>> + Send {
        let upstreams = Arc::clone(&self.upstreams);
        async move { upstreams.send(&request).await }
    }

    fn sleep_until(&self, deadline: Instant) -> impl Future<Output = ()> + Send {
        tokio::time::sleep_until(deadline.into())
    }

    fn round(&self, round: Round) {
        self.estate().handle_round(Instant::now(), round);
    }
}

/// Seals a flight's answer ([`Sealer::seal_flight_answer`]) on tokio's blocking pool when there
/// is something to seal: copying a large body into huge pages may make the kernel compact
/// memory, which must not stall a worker thread and the connections on it.
async fn seal_flight_answer(sealer: &Sealer, response: Response) -> Response {
    if !sealer.is_worth_sealing(&response) {
        return response;
    }
    let sealer = sealer.clone();
    match tokio::task::spawn_blocking(move || sealer.seal_flight_answer(response)).await {
        Ok(response) => response,
        Err(error) => {
            tracing::error!("sealing a flight's answer failed: {error}");
            Response::text(
                http::StatusCode::INTERNAL_SERVER_ERROR,
                "pdbmux: internal error",
            )
        }
    }
}
