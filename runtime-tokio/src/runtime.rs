//! The estate host's runtime on tokio: hyper-util's pooled clients, tokio's timer, tasks and
//! blocking pool (see [`pdbmux_driver::Runtime`]).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use pdbmux_core::cache::shared::{StoreAnswer, StoreRequest};
use pdbmux_core::config::Config;
use pdbmux_core::UpstreamRequest;
use pdbmux_driver::UpstreamResult;
use tokio::task::JoinHandle;

use crate::upstream::{HeldBody, Upstreams};

/// The estate as this binary's connections share it.
pub type Host = pdbmux_driver::EstateHost<Tokio>;

/// tokio; each configuration's upstream clients are an [`Upstreams`].
pub struct Tokio;

/// A tokio task; dropping the handle lets it run on.
pub struct TokioTask(JoinHandle<()>);

impl pdbmux_driver::Task for TokioTask {
    fn cancel(self) {
        self.0.abort();
    }

    fn detach(self) {}

    fn is_finished(&self) -> bool {
        self.0.is_finished()
    }
}

impl pdbmux_driver::Runtime for Tokio {
    type Held = HeldBody;
    type Task = TokioTask;
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
        held: Pin<&mut HeldBody>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Bytes, String>>> {
        crate::body::poll_piece(held, cx)
    }

    fn sleep_until(&self, deadline: Instant) -> impl Future<Output = ()> + Send {
        tokio::time::sleep_until(deadline.into())
    }

    /// tokio's clock, the one its timers keep (paused in tests that pause it).
    fn now(&self) -> Instant {
        tokio::time::Instant::now().into_std()
    }

    fn spawn(&self, future: impl Future<Output = ()> + Send + 'static) -> TokioTask {
        TokioTask(tokio::spawn(future))
    }

    async fn unblock<T: Send + 'static>(&self, work: impl FnOnce() -> T + Send + 'static) -> T {
        match tokio::task::spawn_blocking(work).await {
            Ok(value) => value,
            // Carried on to the awaiting task, as if `work` had run there.
            Err(error) if error.is_panic() => std::panic::resume_unwind(error.into_panic()),
            // Cancelled: the runtime is shutting down, and the awaiting task goes with it.
            Err(_) => std::future::pending().await,
        }
    }
}
