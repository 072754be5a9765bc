//! # pdbmux-sealed
//!
//! Large cached bodies kept in sealed memory, so that a cache hit can hand them to the client's
//! socket with `sendfile(2)` instead of copying them out of user memory, as nginx does with a
//! static file and `sendfile on`.
//!
//! - [`seal`] copies a body into its own memfd, seals it (no write, no shrink, no grow, no
//!   further seals), maps it read-only and returns it as a [`Bytes`] owned by that mapping. While
//!   the mapping lives, a process-wide registry maps its address range to the memfd.
//! - [`find`] answers, for any byte slice about to be written to a socket, whether it lies in a
//!   live sealed mapping, and where ([`Sealed`]): the runtimes' connection writers call it and
//!   send such a slice with [`send_sealed`] (the file's pages go to the socket, no user-space
//!   copy); everything else is written as usual.
//! - [`SealingStore`] is the cache store the runtimes give the core ([`pdbmux_core::Estate::with_store`]):
//!   the core's memory store, with bodies of at least [`SEAL_THRESHOLD`] bytes sealed when stored.
//!   The runtimes seal a flight's answer on the flight's task ([`seal_flight_answer`]) before the
//!   estate stores it, so the store finds it sealed already and the estate's lock is not held
//!   while a body is copied into a memfd.
//!
//! On other platforms than Linux nothing is sealed: [`seal`] returns the body as it is and
//! [`find`] never finds anything, so the runtimes' plain write path serves every byte.
//!
//! Every failure to seal (out of file descriptors, out of memory, a kernel without memfd) keeps
//! the heap body and is logged at debug: sealing is an optimisation, never a reason to fail.

#![deny(unsafe_code)]

#[cfg(target_os = "linux")]
mod linux;
#[cfg(not(target_os = "linux"))]
mod other;
mod store;

#[cfg(target_os = "linux")]
use linux as imp;
#[cfg(not(target_os = "linux"))]
use other as imp;

use bytes::Bytes;

pub use imp::{send_head, send_sealed, Sealed};
pub use store::SealingStore;

/// Bodies at least this long are sealed when stored. Below it the copy `sendfile` saves is
/// small beside the syscalls it costs (memfd, write, seals, mmap, and one more write per
/// response, since the head is sent separately), and every sealed body holds a file descriptor
/// and a mapping for as long as it is cached; `/facts` answers worth it are far larger.
pub const SEAL_THRESHOLD: usize = 256 * 1024;

/// `body` in its own sealed, read-only memfd mapping, registered for [`find`]; on any failure
/// (or on a platform without memfds) `body` itself, with the reason logged at debug.
pub fn seal(body: Bytes) -> Bytes {
    match imp::seal(&body) {
        Ok(sealed) => {
            tracing::debug!(
                bytes = body.len(),
                "cache body sealed in a memfd for sendfile"
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

/// A flight's answer, its body sealed when it is a success large enough to be worth it, so that
/// the cache stores it as it is ([`SealingStore`] does not seal a body twice) and the sealing
/// happens on the flight's own task rather than under the estate's lock; the miss is then sent
/// with `sendfile` too. The runtimes call it when a flight's exchange has answered.
pub fn seal_flight_answer(mut response: pdbmux_core::Response) -> pdbmux_core::Response {
    if let pdbmux_core::ResponseBody::Full(body) = &mut response.body {
        if response.status.is_success() && body.len() >= SEAL_THRESHOLD && find(body).is_none() {
            *body = seal(std::mem::take(body));
        }
    }
    response
}

/// Where `slice` lies when it is inside a live sealed mapping (made by [`seal`]): the memfd and
/// the offset to send it from. `None` for an empty slice and for any other memory. Cheap when no
/// sealed body is alive (one atomic load); otherwise one short lock of the registry.
pub fn find(slice: &[u8]) -> Option<Sealed> {
    imp::find(slice)
}
