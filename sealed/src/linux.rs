//! The Linux implementation: memfd, seals, a read-only shared mapping, the registry of live
//! mappings, and `sendfile(2)` / `sendmsg(2, MSG_MORE)` on a non-blocking socket.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, IoSlice, Write};
use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use memmap2::{Mmap, MmapOptions};
use rustix::fs::{MemfdFlags, SealFlags};
use rustix::net::{SendAncillaryBuffer, SendFlags};

/// The seals every body gets, all of them before it is mapped: its contents and length can never
/// change again, and no seal can be removed (F_SEAL_SEAL forbids changing the set).
const SEALS: SealFlags = SealFlags::SHRINK
    .union(SealFlags::GROW)
    .union(SealFlags::WRITE)
    .union(SealFlags::SEAL);

/// One live mapping: its length and its memfd.
struct Region {
    len: usize,
    fd: Arc<OwnedFd>,
}

/// Live sealed mappings by start address. An entry is added when a mapping is made and removed
/// by its owner's `Drop`, before the mapping goes away, so an address range found here is mapped.
static REGISTRY: Mutex<BTreeMap<usize, Region>> = Mutex::new(BTreeMap::new());
/// How many entries `REGISTRY` has, so that [`find`] skips the lock when there are none.
static LIVE: AtomicUsize = AtomicUsize::new(0);

fn registry() -> MutexGuard<'static, BTreeMap<usize, Region>> {
    // The map stays consistent even if a holder panicked: every critical section is one map call.
    REGISTRY
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A part of a live sealed mapping, as [`find`] found it: what `sendfile` needs to send it.
#[derive(Debug, Clone)]
pub struct Sealed {
    fd: Arc<OwnedFd>,
    offset: u64,
    len: usize,
}

impl Sealed {
    /// Bytes in this part.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether this part is empty ([`find`] never returns one that is).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The same part without its first `n` bytes (after a short send).
    pub fn advance(&mut self, n: usize) {
        let n = n.min(self.len);
        self.offset += n as u64;
        self.len -= n;
    }
}

/// The owner of a sealed body's mapping: `Bytes::from_owner` keeps it alive while any clone or
/// slice of the body is. Dropping it removes the registry entry, then unmaps (field drop).
struct SealedBody {
    map: Mmap,
}

impl AsRef<[u8]> for SealedBody {
    fn as_ref(&self) -> &[u8] {
        &self.map
    }
}

impl Drop for SealedBody {
    fn drop(&mut self) {
        if registry().remove(&(self.map.as_ptr() as usize)).is_some() {
            LIVE.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// Copies `body` into a new sealed memfd, maps it and registers the mapping.
pub fn seal(body: &[u8]) -> io::Result<Bytes> {
    if body.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "an empty body is not sealed",
        ));
    }
    let fd = rustix::fs::memfd_create(
        "pdbmux-cache-body",
        MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING,
    )?;
    let mut file = File::from(fd);
    file.write_all(body)?;
    rustix::fs::fcntl_add_seals(&file, SEALS)?;
    if rustix::fs::fstat(&file)?.st_size != body.len() as i64 {
        return Err(io::Error::other("the memfd's length is not the body's"));
    }
    // SAFETY: `Mmap` hands out the mapped file as a `&[u8]`, which is sound only while nobody can
    // change or shorten the file under it. This memfd was made here, is known only to this
    // process (CLOEXEC, never passed on), and carries F_SEAL_WRITE (no write(2), no writable
    // shared mapping), F_SEAL_SHRINK (no truncation, so no SIGBUS on a vanished page),
    // F_SEAL_GROW and F_SEAL_SEAL (the seals can never be lifted) — all added above, before this
    // mapping, and seals belong to the file itself, so they bind every descriptor of it,
    // /proc/<pid>/fd included. Its length was checked to be `body.len()`. The mapping is read-only
    // and private to `SealedBody`, which unmaps it only when the last `Bytes` of it is gone.
    #[allow(unsafe_code)]
    let map = unsafe { MmapOptions::new().len(body.len()).map(&file)? };
    let fd = Arc::new(OwnedFd::from(file));
    let start = map.as_ptr() as usize;
    let previous = registry().insert(start, Region { len: map.len(), fd });
    debug_assert!(previous.is_none(), "a live mapping at the same address");
    if previous.is_none() {
        LIVE.fetch_add(1, Ordering::Relaxed);
    }
    Ok(Bytes::from_owner(SealedBody { map }))
}

/// See [`crate::find`].
pub fn find(slice: &[u8]) -> Option<Sealed> {
    if slice.is_empty() || LIVE.load(Ordering::Relaxed) == 0 {
        return None;
    }
    let addr = slice.as_ptr() as usize;
    let registry = registry();
    let (&start, region) = registry.range(..=addr).next_back()?;
    let offset = addr - start;
    (offset.checked_add(slice.len())? <= region.len).then(|| Sealed {
        fd: Arc::clone(&region.fd),
        offset: offset as u64,
        len: slice.len(),
    })
}

/// Sends (part of) `sealed` to a non-blocking `socket` with one `sendfile(2)`: the count sent,
/// which may be short, or `WouldBlock` when the socket's buffer is full. The caller waits for
/// writability and calls again with the rest ([`Sealed::advance`]).
pub fn send_sealed(socket: BorrowedFd<'_>, sealed: &Sealed) -> io::Result<usize> {
    let mut offset = sealed.offset;
    Ok(rustix::fs::sendfile(
        socket,
        &*sealed.fd,
        Some(&mut offset),
        sealed.len,
    )?)
}

/// Writes `bufs` to a non-blocking `socket` with `MSG_MORE`: for what precedes a sealed body
/// (the response head), so that the kernel sends it together with the body's first bytes
/// instead of in a small packet of its own. The count written, possibly short, or `WouldBlock`.
pub fn send_head(socket: BorrowedFd<'_>, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
    Ok(rustix::net::sendmsg(
        socket,
        bufs,
        &mut SendAncillaryBuffer::default(),
        SendFlags::MORE,
    )?)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn body(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 7 % 251) as u8).collect()
    }

    fn live_fd(sealed: &Bytes) -> Arc<OwnedFd> {
        Arc::clone(&find(sealed).expect("registered").fd)
    }

    #[test]
    fn a_sealed_body_reads_back_identical_and_is_found_anywhere_inside() {
        let original = body(300 * 1024 + 17);
        let sealed = seal(&original).unwrap();
        assert_eq!(&sealed[..], &original[..]);
        let whole = find(&sealed).expect("the whole body is sealed");
        assert_eq!((whole.offset, whole.len()), (0, original.len()));
        let part = find(&sealed[1000..2000]).expect("a slice of it too");
        assert_eq!((part.offset, part.len()), (1000, 1000));
        let tail = sealed.slice(original.len() - 5..);
        assert_eq!(
            find(&tail).map(|s| (s.offset, s.len)),
            Some((original.len() as u64 - 5, 5))
        );
        assert!(find(&original).is_none(), "the heap copy is not sealed");
        assert!(find(&sealed[..0]).is_none(), "an empty slice never is");
    }

    #[test]
    fn the_memfd_refuses_writes_truncation_and_growth_after_sealing() {
        let sealed = seal(&body(4096)).unwrap();
        let fd = live_fd(&sealed);
        let seals = rustix::fs::fcntl_get_seals(&*fd).unwrap();
        assert!(seals.contains(SEALS), "{seals:?}");
        assert!(
            rustix::io::pwrite(&*fd, b"x", 0).is_err(),
            "write after F_SEAL_WRITE"
        );
        assert!(
            rustix::fs::ftruncate(&*fd, 10).is_err(),
            "shrink after F_SEAL_SHRINK"
        );
        assert!(
            rustix::fs::ftruncate(&*fd, 1 << 20).is_err(),
            "grow after F_SEAL_GROW"
        );
        assert!(
            rustix::fs::fcntl_add_seals(&*fd, SealFlags::FUTURE_WRITE).is_err(),
            "no more seals after F_SEAL_SEAL"
        );
        assert_eq!(&sealed[..], &body(4096)[..], "contents unchanged");
    }

    #[test]
    fn the_registry_entry_goes_with_the_last_clone() {
        let sealed = seal(&body(8192)).unwrap();
        let fd = live_fd(&sealed);
        assert_eq!(Arc::strong_count(&fd), 2, "the registry's and this one");
        let clone = sealed.slice(100..200);
        drop(sealed);
        assert_eq!(Arc::strong_count(&fd), 2, "a slice keeps the entry");
        assert!(find(&clone).is_some());
        drop(clone);
        assert_eq!(
            Arc::strong_count(&fd),
            1,
            "the entry is gone with the last slice"
        );
    }

    #[test]
    fn an_empty_body_is_refused() {
        assert!(seal(&[]).is_err());
    }
}
