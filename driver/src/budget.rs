//! The memory budget of buffered merges, counted as the runtimes read backend answers
//! (docs/operating.md, "Memory"; what the limits mean and the refusal: `pdbmux_core::budget`).
//!
//! Every byte of a backend answer read whole (to be merged) is taken from the request's share
//! ([`BodyBudget::take`]) as it arrives, before the next chunk is read, so a body too large is
//! stopped while it is read, not after. A request's bytes return to the process when its share
//! is dropped: when its exchange has answered (the merged body is then written from one buffer).
//! Bodies streamed through to the client, and the estate's own calls (probes, the membership
//! refresh, `/healthz`), are not counted.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use pdbmux_core::budget::BudgetScope;
use pdbmux_core::config::Config;
use pdbmux_core::UpstreamFailure;

/// The bytes every merge in flight holds, shared by the whole process. Make one per process and
/// give each exchange a share of it with [`MergeMemory::share`].
#[derive(Debug, Default)]
pub struct MergeMemory {
    used: AtomicU64,
}

impl MergeMemory {
    /// Bytes held by merges in flight now (the `pdbmux_merge_memory_bytes` gauge).
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    /// A new request's share under `config`'s limits, or `Err` when the merges in flight hold
    /// the whole process budget already (then the request is refused before it asks anyone).
    pub fn share(self: &Arc<Self>, config: &Config) -> Result<BodyBudget, BudgetScope> {
        if self.used() >= config.merge_memory_bytes {
            return Err(BudgetScope::Process);
        }
        Ok(BodyBudget(Some(Arc::new(Share {
            process: Arc::clone(self),
            used: AtomicU64::new(0),
            request_limit: config.merge_request_bytes,
            process_limit: config.merge_memory_bytes,
        }))))
    }
}

/// One request's share of [`MergeMemory`], handed to every upstream call it makes; clones count
/// into the same share. [`BodyBudget::unbudgeted`] counts nothing (the estate's own calls).
#[derive(Debug, Clone, Default)]
pub struct BodyBudget(Option<Arc<Share>>);

#[derive(Debug)]
struct Share {
    process: Arc<MergeMemory>,
    used: AtomicU64,
    request_limit: u64,
    process_limit: u64,
}

impl BodyBudget {
    /// A budget that counts nothing: for calls whose bodies are not merged for a client.
    pub fn unbudgeted() -> BodyBudget {
        BodyBudget(None)
    }

    /// Takes `bytes` just read from a body to be merged; `Err` when the request, or the process,
    /// now holds more than its limit (stop reading: the request is refused).
    pub fn take(&self, bytes: usize) -> Result<(), UpstreamFailure> {
        let Some(share) = &self.0 else {
            return Ok(());
        };
        let bytes = u64::try_from(bytes).unwrap_or(u64::MAX);
        let request = share.used.fetch_add(bytes, Ordering::Relaxed) + bytes;
        let process = share.process.used.fetch_add(bytes, Ordering::Relaxed) + bytes;
        if request > share.request_limit {
            return Err(over(BudgetScope::Request, share.request_limit));
        }
        if process > share.process_limit {
            return Err(over(BudgetScope::Process, share.process_limit));
        }
        Ok(())
    }
}

impl BodyBudget {
    /// A new share of the same process budget, under the same limits, holding nothing yet: for
    /// what a streamed merge holds as it grows once its exchange answered (and gave its own
    /// share back).
    pub fn fresh(&self) -> BodyBudget {
        BodyBudget(self.0.as_ref().map(|share| {
            Arc::new(Share {
                process: Arc::clone(&share.process),
                used: AtomicU64::new(0),
                request_limit: share.request_limit,
                process_limit: share.process_limit,
            })
        }))
    }

    /// Gives back `bytes` taken earlier and no longer held (a cached flight's copy let go).
    pub fn give(&self, bytes: usize) {
        let Some(share) = &self.0 else {
            return;
        };
        let bytes = u64::try_from(bytes).unwrap_or(u64::MAX);
        share.used.fetch_sub(bytes, Ordering::Relaxed);
        share.process.used.fetch_sub(bytes, Ordering::Relaxed);
    }
}

/// The count of one body read whole: [`BodyBudget::body`] starts it, [`BodyCount::chunk`] takes
/// each chunk as it is read.
#[derive(Debug)]
pub struct BodyCount<'a> {
    budget: &'a BodyBudget,
    /// The whole declared length was taken at the start.
    taken: bool,
}

impl BodyBudget {
    /// Starts counting one body read whole, `declared` bytes long if its answer says so: a
    /// declared length is taken at once (its buffer is allocated at once), a body of unknown
    /// length chunk by chunk.
    pub fn body(&self, declared: Option<u64>) -> Result<BodyCount<'_>, UpstreamFailure> {
        if let Some(length) = declared {
            self.take(usize::try_from(length).unwrap_or(usize::MAX))?;
        }
        Ok(BodyCount {
            budget: self,
            taken: declared.is_some(),
        })
    }
}

impl BodyCount<'_> {
    /// `bytes` more were read.
    pub fn chunk(&self, bytes: usize) -> Result<(), UpstreamFailure> {
        match self.taken {
            true => Ok(()),
            false => self.budget.take(bytes),
        }
    }
}

fn over(scope: BudgetScope, limit: u64) -> UpstreamFailure {
    UpstreamFailure::OverBudget { scope, limit }
}

impl Drop for Share {
    fn drop(&mut self) {
        self.process
            .used
            .fetch_sub(*self.used.get_mut(), Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(request: u64, process: u64) -> Config {
        Config {
            merge_request_bytes: request,
            merge_memory_bytes: process,
            ..Config::with_backends(Vec::new())
        }
    }

    #[test]
    fn a_request_over_its_own_limit_is_refused_and_its_bytes_return_when_it_ends() {
        let memory = Arc::new(MergeMemory::default());
        let config = config(100, 1000);
        let budget = memory.share(&config).expect("room");
        let other_call = budget.clone();
        assert_eq!(budget.take(60), Ok(()));
        assert_eq!(
            other_call.take(41),
            Err(UpstreamFailure::OverBudget {
                scope: BudgetScope::Request,
                limit: 100
            })
        );
        assert_eq!(memory.used(), 101);
        drop((budget, other_call));
        assert_eq!(memory.used(), 0);
    }

    #[test]
    fn bytes_given_back_leave_the_request_and_the_process() {
        let memory = Arc::new(MergeMemory::default());
        let budget = memory.share(&config(100, 1000)).expect("room");
        assert_eq!(budget.take(80), Ok(()));
        budget.give(80);
        assert_eq!(memory.used(), 0);
        assert_eq!(
            budget.take(90),
            Ok(()),
            "the request's own limit counts them back"
        );
        drop(budget);
        assert_eq!(memory.used(), 0);
    }

    #[test]
    fn requests_together_over_the_process_limit_are_refused_and_a_new_one_waits_for_room() {
        let memory = Arc::new(MergeMemory::default());
        let config = config(100, 150);
        let first = memory.share(&config).expect("room");
        let second = memory.share(&config).expect("room");
        assert_eq!(first.take(100), Ok(()));
        assert_eq!(
            second.take(51),
            Err(UpstreamFailure::OverBudget {
                scope: BudgetScope::Process,
                limit: 150
            })
        );
        assert_eq!(memory.share(&config).err(), Some(BudgetScope::Process));
        drop(second);
        assert_eq!(memory.used(), 100);
        let third = memory.share(&config).expect("room again");
        drop((first, third));
        assert_eq!(memory.used(), 0);
    }

    #[test]
    fn a_declared_body_is_taken_at_once_and_an_undeclared_one_chunk_by_chunk() {
        let memory = Arc::new(MergeMemory::default());
        let budget = memory.share(&config(100, 1000)).expect("room");
        assert!(
            budget.body(Some(101)).is_err(),
            "over before any byte is read"
        );
        drop(budget);
        let budget = memory.share(&config(100, 1000)).expect("room");
        let declared = budget.body(Some(60)).expect("fits");
        assert_eq!(declared.chunk(60), Ok(()));
        assert_eq!(memory.used(), 60);
        let chunked = budget.body(None).expect("nothing taken yet");
        assert_eq!(chunked.chunk(40), Ok(()));
        assert!(chunked.chunk(1).is_err());
    }

    #[test]
    fn the_estate_calls_count_nothing() {
        let budget = BodyBudget::unbudgeted();
        assert_eq!(budget.take(usize::MAX), Ok(()));
    }
}
