//! The estate host's runtime on smol: pdbmux's own upstream pool, async-io's timer, the
//! executor's tasks (panics caught) and smol's blocking pool (see [`pdbmux_driver::Runtime`]).

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Instant;

use pdbmux_core::cache::shared::{StoreAnswer, StoreRequest};
use pdbmux_core::config::Config;
use pdbmux_core::UpstreamRequest;
use pdbmux_driver::UpstreamResult;
use smol::future::FutureExt;
use smol::{Executor, Task};

use crate::body::HeldBody;
use crate::upstream::Upstreams;

/// The estate as this binary's connections share it.
pub type Host = pdbmux_driver::EstateHost<Smol>;

/// smol's executor; each configuration's upstream clients are an [`Upstreams`].
pub struct Smol {
    executor: Arc<Executor<'static>>,
}

impl Smol {
    /// The runtime the host uses: tasks go to `executor`.
    pub fn new(executor: Arc<Executor<'static>>) -> Smol {
        Smol { executor }
    }
}

/// A smol task; dropping it cancels it, so the host's handles are kept until they end.
pub struct SmolTask(Task<Option<()>>);

impl pdbmux_driver::Task for SmolTask {
    fn cancel(self) {
        drop(self.0);
    }

    fn detach(self) {
        self.0.detach();
    }

    fn is_finished(&self) -> bool {
        self.0.is_finished()
    }
}

impl pdbmux_driver::Runtime for Smol {
    type Held = HeldBody;
    type Task = SmolTask;
    type Clients = pdbmux_driver::Clients<Upstreams>;

    fn clients(config: &Config) -> Result<Self::Clients, pdbmux_driver::StartError> {
        pdbmux_driver::Clients::of(config, Upstreams::new)
    }

    async fn send(
        &self,
        clients: &Self::Clients,
        request: UpstreamRequest,
        budget: pdbmux_driver::budget::BodyBudget,
    ) -> UpstreamResult<HeldBody> {
        clients.upstreams.send(&request, &budget).await
    }

    async fn store(&self, clients: &Self::Clients, request: StoreRequest) -> StoreAnswer {
        clients.store(request).await
    }

    fn poll_piece(
        held: std::pin::Pin<&mut HeldBody>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<bytes::Bytes, String>>> {
        crate::body::poll_piece(held, cx)
    }

    async fn sleep_until(&self, deadline: Instant) {
        smol::Timer::at(deadline).await;
    }

    fn spawn(&self, future: impl Future<Output = ()> + Send + 'static) -> SmolTask {
        SmolTask(spawn_guarded(&self.executor, "estate host", future))
    }

    async fn unblock<T: Send + 'static>(&self, work: impl FnOnce() -> T + Send + 'static) -> T {
        smol::unblock(work).await
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
                tracing::error!("{what} task panicked");
                None
            }
        }
    })
}
