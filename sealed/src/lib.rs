//! # pdbmux-sealed
//!
//! Large cached bodies kept in sealed memory, so that a cache hit hands the body's pages to the
//! client's socket by reference instead of copying them out of user memory for every response,
//! as nginx does for a static file with `sendfile on`.
//!
//! - [`Sealer::seal`] copies a body into its own anonymous mapping (in transparent huge pages
//!   when it is large enough, see [`Sealer`]), makes it read-only for good and returns it as a
//!   [`Bytes`] owned by that mapping. While the mapping lives, a process-wide registry holds its
//!   address range.
//! - [`find`] answers, for any byte slice about to be written to a socket, whether it lies in a
//!   live sealed mapping ([`Sealed`]): the runtimes' connection writers call it and send such a
//!   slice with their connection's [`SealedSender`] (`vmsplice(2)` into a pipe, `splice(2)` on
//!   to the socket: the pages are referenced, never copied); everything else is written as usual.
//! - The runtimes seal a flight's answer ([`Sealer::seal_flight_answer`], on their blocking
//!   pool) before handing it to the estate, which stores it in the core's memory store as it
//!   is: every cached body comes from a flight, so it is sealed once, off the estate's lock,
//!   and the miss goes out from the sealed mapping too.
//!
//! Why not a memfd and `sendfile`: the kernel reads a memfd (shared memory) for `sendfile` one
//! 4 KiB page at a time with a page-cache lookup and lock each, which cost a 1 MiB hit more
//! CPU than nginx spends sending its file; `vmsplice` takes the pages straight from the
//! mapping's page tables, and from huge pages once per 2 MiB. See bench/README.md, figure 3.
//!
//! On other platforms than Linux nothing is sealed: [`Sealer::seal`] returns the body as it is
//! and [`find`] never finds anything, so the runtimes' plain write path serves every byte.
//!
//! Every failure to seal (out of memory, out of mappings) keeps the heap body and is logged at
//! debug, and a send that cannot have a pipe copies instead: sealing is an optimisation, never a
//! reason to fail.

#![deny(unsafe_code)]

#[cfg(target_os = "linux")]
mod linux;
#[cfg(not(target_os = "linux"))]
mod other;

#[cfg(target_os = "linux")]
use linux as imp;
#[cfg(not(target_os = "linux"))]
use other as imp;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::Bytes;

pub use imp::{send_head, Sealed, SealedSender};

/// Bodies at least this long are sealed when stored. Below it the copy a sealed send saves is
/// small beside the syscalls it costs (mmap, mprotect, and per response a separate write of the
/// head, a `vmsplice` and a `splice`), and every sealed body holds a mapping of its own for as
/// long as it is cached; `/facts` answers worth it are far larger.
pub const SEAL_THRESHOLD: usize = 256 * 1024;

/// Seals bodies, and decides which of them go in transparent huge pages.
///
/// The kernel's per-page work for a sealed send (finding each page, taking and later dropping a
/// reference on it) is done once per huge page instead of once per 4 KiB page, which is what
/// lets a hit keep up with nginx sending a file from the page cache (whose large folios get the
/// same saving). A huge page is all or nothing, so a body in them is padded to a whole number
/// of them: that is done only for a body at least half a huge page long (the padding is never
/// more than the body), only while the padding of all live sealed bodies stays within a quarter
/// of the cache's budget, and only when the kernel hands out huge pages to mappings that ask
/// (`/sys/kernel/mm/transparent_hugepage/enabled` is `always` or `madvise`). Every other body
/// is sealed in ordinary pages. Clones share the padding count.
#[derive(Debug, Clone)]
pub struct Sealer {
    /// The cache's budget (`facts_cache_bytes`): a larger body is not stored, so not sealed.
    budget: u64,
    padding: Arc<Padding>,
}

#[derive(Debug)]
struct Padding {
    huge_page: Option<usize>,
    allowance: usize,
    used: AtomicUsize,
}

/// Padding reserved for one sealed body; given back when its mapping goes.
#[derive(Debug)]
struct PaddingClaim {
    padding: Arc<Padding>,
    bytes: usize,
}

impl Drop for PaddingClaim {
    fn drop(&mut self) {
        self.padding.used.fetch_sub(self.bytes, Ordering::Relaxed);
    }
}

/// A body to be laid out in huge pages: their size, the body's length padded to whole ones, and
/// the padding claimed for it. (Only Linux lays bodies out; elsewhere none is ever made.)
#[derive(Debug)]
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
struct HugePages {
    huge_page: usize,
    mapped: usize,
    claim: PaddingClaim,
}

impl Sealer {
    /// A sealer for a cache of `budget` body bytes (`facts_cache_bytes`), using huge pages when
    /// the kernel offers them.
    pub fn new(budget: u64) -> Sealer {
        Sealer::with_huge_page(budget, imp::huge_page_size())
    }

    fn with_huge_page(budget: u64, huge_page: Option<usize>) -> Sealer {
        Sealer {
            budget,
            padding: Arc::new(Padding {
                huge_page,
                allowance: usize::try_from(budget / 4).unwrap_or(usize::MAX),
                used: AtomicUsize::new(0),
            }),
        }
    }

    /// Bytes of padding the live sealed bodies hold (see the type's docs).
    pub fn padding(&self) -> usize {
        self.padding.used.load(Ordering::Relaxed)
    }

    fn huge_pages_for(&self, len: usize) -> Option<HugePages> {
        let huge_page = self.padding.huge_page?;
        if len < huge_page / 2 {
            return None;
        }
        let mapped = len.checked_next_multiple_of(huge_page)?;
        let bytes = mapped - len;
        let allowance = self.padding.allowance;
        self.padding
            .used
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |used| {
                used.checked_add(bytes).filter(|&after| after <= allowance)
            })
            .ok()?;
        Some(HugePages {
            huge_page,
            mapped,
            claim: PaddingClaim {
                padding: Arc::clone(&self.padding),
                bytes,
            },
        })
    }

    /// `body` in its own sealed (read-only for good) mapping, registered for [`find`]; on any
    /// failure (or on a platform other than Linux) `body` itself, with the reason logged at
    /// debug.
    pub fn seal(&self, body: Bytes) -> Bytes {
        let huge_pages = self.huge_pages_for(body.len());
        let huge = huge_pages.is_some();
        match imp::seal(&body, huge_pages) {
            Ok(sealed) => {
                tracing::debug!(
                    bytes = body.len(),
                    huge_pages = huge,
                    "cache body sealed in a read-only mapping"
                );
                sealed
            }
            Err(error) => {
                tracing::debug!(
                    bytes = body.len(),
                    "keeping a cache body on the heap: sealing it failed: {error}"
                );
                body
            }
        }
    }

    /// Whether [`Sealer::seal_flight_answer`] would seal `response`'s body: a success (what the
    /// cache stores), whole, at least [`SEAL_THRESHOLD`] long, within the cache's budget (a
    /// larger body is not stored) and not sealed yet. The runtimes seal only such answers off
    /// their worker threads.
    pub fn is_worth_sealing(&self, response: &pdbmux_core::Response) -> bool {
        matches!(&response.body, pdbmux_core::ResponseBody::Full(body)
            if response.status.is_success() && self.is_worth_sealing_bytes(body))
    }

    /// Whether bytes the cache will hold are worth [`Sealer::seal`]: at least
    /// [`SEAL_THRESHOLD`] long, within the cache's budget and not sealed yet (an entry read
    /// from the shared store, whose body then goes out by reference on every hit).
    pub fn is_worth_sealing_bytes(&self, bytes: &Bytes) -> bool {
        bytes.len() >= SEAL_THRESHOLD && bytes.len() as u64 <= self.budget && find(bytes).is_none()
    }

    /// A flight's answer, its body sealed when it is worth it ([`Sealer::is_worth_sealing`]),
    /// before the estate stores it (as it is); the miss is then sent from the sealed mapping
    /// too. The runtimes call it when a flight's exchange has answered, on a
    /// thread that may block: copying a large body and faulting in huge pages can make the
    /// kernel compact memory.
    pub fn seal_flight_answer(&self, mut response: pdbmux_core::Response) -> pdbmux_core::Response {
        if self.is_worth_sealing(&response) {
            if let pdbmux_core::ResponseBody::Full(body) = &mut response.body {
                *body = self.seal(std::mem::take(body));
            }
        }
        response
    }
}

/// `slice` as a [`Sealed`] when it lies inside a live sealed mapping (made by [`Sealer::seal`]);
/// `None` for an empty slice and for any other memory. Cheap when no sealed body is alive (one
/// atomic load); otherwise one short lock of the registry.
pub fn find(slice: &[u8]) -> Option<Sealed<'_>> {
    imp::find(slice)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::disallowed_methods)]
mod tests {
    use pdbmux_core::cache::CacheStore;

    use super::*;

    const HUGE: usize = 2 << 20;

    fn body(len: usize) -> Bytes {
        (0..len)
            .map(|i| (i % 253) as u8)
            .collect::<Vec<u8>>()
            .into()
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn bodies_of_half_a_huge_page_or_more_are_padded_within_a_quarter_of_the_budget() {
        // A budget of 8 MiB allows 2 MiB (one huge page) of padding.
        let sealer = Sealer::with_huge_page(8 << 20, Some(HUGE));
        let small = sealer.seal(body(HUGE / 2 - 1));
        assert_eq!(sealer.padding(), 0, "under half a huge page: no padding");
        let first = sealer.seal(body(HUGE + HUGE / 2));
        assert_eq!(sealer.padding(), HUGE / 2, "padded to two huge pages");
        let second = sealer.seal(body(HUGE / 2));
        assert_eq!(sealer.padding(), HUGE, "the allowance is used up");
        let third = sealer.seal(body(HUGE + HUGE / 2));
        assert_eq!(sealer.padding(), HUGE, "over the allowance: small pages");
        for (sealed, len) in [
            (&small, HUGE / 2 - 1),
            (&first, HUGE + HUGE / 2),
            (&second, HUGE / 2),
            (&third, HUGE + HUGE / 2),
        ] {
            assert_eq!(sealed.len(), len);
            assert!(sealed[..] == body(len)[..], "a {len}-byte body reads back");
            assert_eq!(cfg!(target_os = "linux"), find(sealed).is_some());
        }
        let slice = first.slice(10..20);
        drop(first);
        assert_eq!(sealer.padding(), HUGE, "a slice keeps the padding");
        drop(slice);
        assert_eq!(sealer.padding(), HUGE / 2, "given back with the mapping");
        drop(second);
        assert_eq!(sealer.padding(), 0);
    }

    #[test]
    fn a_flight_answer_is_sealed_when_the_cache_would_keep_it() {
        let large: Vec<u8> = (0..SEAL_THRESHOLD).map(|i| (i % 251) as u8).collect();
        let answer = |status: http::StatusCode, body: &[u8]| pdbmux_core::Response {
            status,
            headers: http::HeaderMap::new(),
            body: pdbmux_core::ResponseBody::Full(Bytes::copy_from_slice(body)),
        };
        let body_of = |response: &pdbmux_core::Response| match &response.body {
            pdbmux_core::ResponseBody::Full(body) => body.clone(),
            other => panic!("unexpected body {other:?}"),
        };
        let sealer = Sealer::new(4 << 20);
        let sealed = body_of(&sealer.seal_flight_answer(answer(http::StatusCode::OK, &large)));
        assert_eq!(&sealed[..], &large[..]);
        assert_eq!(find(&sealed).is_some(), cfg!(target_os = "linux"));
        // Errors and small bodies stay on the heap.
        let error = sealer.seal_flight_answer(answer(http::StatusCode::BAD_GATEWAY, &large));
        assert!(find(&body_of(&error)).is_none());
        let small = sealer.seal_flight_answer(answer(http::StatusCode::OK, b"[]"));
        assert!(find(&body_of(&small)).is_none());
        // A body over the cache's budget is not stored, so not sealed either.
        let tight = Sealer::new(SEAL_THRESHOLD as u64 - 1);
        let over = tight.seal_flight_answer(answer(http::StatusCode::OK, &large));
        assert!(find(&body_of(&over)).is_none());
        // The core's store keeps the sealed body it is given, as it is.
        let mut store = pdbmux_core::cache::MemoryStore::new(4 << 20);
        store.put(
            "k".into(),
            pdbmux_core::cache::CachedResponse {
                body: sealed.clone(),
                headers: http::HeaderMap::new(),
                stored_at: std::time::Instant::now(),
                ttl: std::time::Duration::from_secs(30),
            },
        );
        let kept = store.get("k").expect("stored");
        assert_eq!(kept.body.as_ptr(), sealed.as_ptr());
        assert_eq!(find(&kept.body).is_some(), cfg!(target_os = "linux"));
    }

    #[test]
    fn without_huge_pages_nothing_is_padded() {
        let sealer = Sealer::with_huge_page(u64::MAX, None);
        let sealed = sealer.seal(body(HUGE + 1));
        assert_eq!(sealer.padding(), 0);
        assert!(sealed[..] == body(HUGE + 1)[..]);
    }
}
