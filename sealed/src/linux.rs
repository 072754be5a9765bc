//! The Linux implementation: sealed bodies in read-only anonymous mappings (in transparent huge
//! pages where the [`crate::Sealer`] chose them), the registry of live ones, and the pipes
//! through which a connection moves their pages to its socket with `vmsplice(2)` and
//! `splice(2)`.

use std::collections::BTreeMap;
use std::io::{self, IoSlice};
use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::Bytes;
use memmap2::{Mmap, MmapMut};
use rustix::net::{SendAncillaryBuffer, SendFlags};
use rustix::pipe::{IoSliceRaw, PipeFlags, SpliceFlags};

use crate::{HugePages, PaddingClaim};

/// Live sealed mappings: start address to length. An entry is added once a mapping is read-only
/// and removed by its owner's `Drop` before the mapping goes away, so a range found here is
/// mapped and can never change.
static REGISTRY: Mutex<BTreeMap<usize, usize>> = Mutex::new(BTreeMap::new());
/// How many entries `REGISTRY` has, so that [`crate::find`] skips the lock when there are none.
static LIVE: AtomicUsize = AtomicUsize::new(0);

/// The capacities a new pipe asks for, in turn: with 2 MiB a body of up to 2 MiB takes one
/// `vmsplice` and (when the socket's buffer has room) one `splice`. Linux's default is 64 KiB;
/// an unprivileged process may grow its pipes to `/proc/sys/fs/pipe-max-size` (1 MiB by default)
/// until all its pipes together pass `pipe-user-pages-soft` (64 MiB by default). A pipe that
/// cannot grow keeps its size and works the same, with more calls per body.
const PIPE_CAPACITIES: [usize; 2] = [2 << 20, 1 << 20];
/// Below this a pipe costs more calls than the copy it saves: such a send writes from the
/// mapping instead.
const MIN_PIPE_CAPACITY: usize = 64 * 1024;
/// Idle pipes kept for later sends; more are closed when they empty.
const MAX_IDLE_PIPES: usize = 16;
/// How long sends copy after the kernel gave a tiny pipe, before a new pipe is tried again.
const TINY_PIPE_BACKOFF: Duration = Duration::from_secs(1);

fn registry() -> MutexGuard<'static, BTreeMap<usize, usize>> {
    // The map stays consistent even if a holder panicked: every critical section is one map call.
    REGISTRY
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A slice [`crate::find`] found inside a live sealed mapping: what [`SealedSender::send`] may hand to
/// the kernel by reference. It borrows the slice, so the mapping outlives it.
#[derive(Debug, Clone, Copy)]
pub struct Sealed<'a> {
    bytes: &'a [u8],
}

impl Sealed<'_> {
    /// Bytes in this part.
    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    /// Whether this part is empty ([`crate::find`] never returns one that is).
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// The same part without its first `n` bytes (after a short send).
    pub fn advance(&mut self, n: usize) {
        self.bytes = &self.bytes[n.min(self.bytes.len())..];
    }
}

/// The owner of a sealed body's mapping: `Bytes::from_owner` keeps it alive while any clone or
/// slice of the body is. Dropping it removes the registry entry, then unmaps and gives back the
/// padding (field drops).
struct SealedBody {
    map: Mmap,
    /// Where the body starts in the mapping (on a huge-page boundary when it is in huge pages).
    offset: usize,
    /// The body's length; the mapping is longer when the body is padded to whole huge pages.
    len: usize,
    _padding: Option<PaddingClaim>,
}

impl SealedBody {
    fn body(&self) -> &[u8] {
        &self.map[self.offset..self.offset + self.len]
    }
}

impl AsRef<[u8]> for SealedBody {
    fn as_ref(&self) -> &[u8] {
        self.body()
    }
}

impl Drop for SealedBody {
    fn drop(&mut self) {
        if registry()
            .remove(&(self.body().as_ptr() as usize))
            .is_some()
        {
            LIVE.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// Where the kernel says how large a transparent huge page is and whether mappings get them.
const THP: &str = "/sys/kernel/mm/transparent_hugepage";

/// The size of a transparent huge page when the kernel gives them to mappings that ask for
/// them (`enabled` is `always` or `madvise`); `None` when it does not, or cannot say.
pub fn huge_page_size() -> Option<usize> {
    let enabled = std::fs::read_to_string(format!("{THP}/enabled")).ok()?;
    if !(enabled.contains("[always]") || enabled.contains("[madvise]")) {
        return None;
    }
    let size = std::fs::read_to_string(format!("{THP}/hpage_pmd_size")).ok()?;
    size.trim().parse().ok().filter(|&size: &usize| size > 0)
}

/// Copies `body` into a new anonymous mapping (in huge pages, padded to whole ones, when
/// `huge_pages` says so), makes it read-only and registers it.
pub(crate) fn seal(body: &[u8], mut huge_pages: Option<HugePages>) -> io::Result<Bytes> {
    if body.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "an empty body is not sealed",
        ));
    }
    let (mut map, offset) = match &huge_pages {
        Some(huge) => {
            // One huge page more than the padded body, so that a huge-page boundary lies inside
            // wherever the kernel puts it; the slack around the body is never touched, so it
            // takes address space only.
            let map = MmapMut::map_anon(huge.mapped + huge.huge_page)?;
            let start = map.as_ptr() as usize;
            let offset = start.next_multiple_of(huge.huge_page) - start;
            // Before the first write, so that the pages are huge from the start.
            if let Err(error) = map.advise_range(memmap2::Advice::HugePage, offset, huge.mapped) {
                tracing::debug!(
                    "a sealed body stays in small pages: MADV_HUGEPAGE failed: {error}"
                );
                // Small pages beyond the body are never touched: no padding is held.
                huge_pages = None;
            }
            (map, offset)
        }
        None => (MmapMut::map_anon(body.len())?, 0),
    };
    map[offset..offset + body.len()].copy_from_slice(body);
    // mprotect(PROT_READ): from here on nothing in this process can write these pages (nothing
    // here ever calls mprotect on it again), and the mapping is private to `SealedBody`.
    let sealed = SealedBody {
        map: map.make_read_only()?,
        offset,
        len: body.len(),
        _padding: huge_pages.map(|huge| huge.claim),
    };
    let previous = registry().insert(sealed.body().as_ptr() as usize, body.len());
    debug_assert!(previous.is_none(), "a live mapping at the same address");
    if previous.is_none() {
        LIVE.fetch_add(1, Ordering::Relaxed);
    }
    Ok(Bytes::from_owner(sealed))
}

/// See [`crate::find`].
pub fn find(slice: &[u8]) -> Option<Sealed<'_>> {
    if slice.is_empty() || LIVE.load(Ordering::Relaxed) == 0 {
        return None;
    }
    let addr = slice.as_ptr() as usize;
    let registry = registry();
    let (&start, &len) = registry.range(..=addr).next_back()?;
    ((addr - start).checked_add(slice.len())? <= len).then_some(Sealed { bytes: slice })
}

/// A pipe for sealed sends; it goes back to [`IDLE_PIPES`] whenever it is empty.
#[derive(Debug)]
struct Pipe {
    read: OwnedFd,
    write: OwnedFd,
    capacity: usize,
}

/// Empty pipes, ready for the next sealed send of any connection, so that pipes exist for the
/// sends under way rather than for every open connection.
static IDLE_PIPES: Mutex<Vec<Pipe>> = Mutex::new(Vec::new());

/// When a new pipe last came out too small to use: for [`TINY_PIPE_BACKOFF`] after that, sends
/// copy without making (and closing) a pipe each time.
static TINY_PIPE_AT: Mutex<Option<Instant>> = Mutex::new(None);

fn idle_pipes() -> MutexGuard<'static, Vec<Pipe>> {
    // A push or a pop: the list stays consistent even if a holder panicked.
    IDLE_PIPES
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn tiny_pipe_at() -> MutexGuard<'static, Option<Instant>> {
    TINY_PIPE_AT
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Pipe {
    /// An idle pipe, or a new one worth using; `None` when the kernel has lately given only
    /// tiny ones (the body is copied then).
    fn take() -> io::Result<Option<Pipe>> {
        if let Some(pipe) = idle_pipes().pop() {
            return Ok(Some(pipe));
        }
        if tiny_pipe_at().is_some_and(|at| at.elapsed() < TINY_PIPE_BACKOFF) {
            return Ok(None);
        }
        let pipe = Pipe::new()?;
        if pipe.is_worth_it() {
            return Ok(Some(pipe));
        }
        tracing::debug!(
            capacity = pipe.capacity,
            "sealed bodies are copied for a while: the kernel gives only tiny pipes \
             (/proc/sys/fs/pipe-user-pages-soft)"
        );
        *tiny_pipe_at() = Some(Instant::now());
        Ok(None)
    }

    fn new() -> io::Result<Pipe> {
        let (read, write) = rustix::pipe::pipe_with(PipeFlags::CLOEXEC | PipeFlags::NONBLOCK)?;
        let grown = PIPE_CAPACITIES
            .iter()
            .find_map(|&capacity| rustix::pipe::fcntl_setpipe_size(&write, capacity).ok());
        let capacity = match grown {
            Some(capacity) => capacity,
            None => rustix::pipe::fcntl_getpipe_size(&write)?,
        };
        Ok(Pipe {
            read,
            write,
            capacity,
        })
    }

    /// Whether sending through this pipe beats copying (see [`MIN_PIPE_CAPACITY`]).
    fn is_worth_it(&self) -> bool {
        self.capacity >= MIN_PIPE_CAPACITY
    }

    /// Gives an empty pipe back for other sends; closed instead when enough are idle, or when
    /// it is too small to be worth using.
    fn put_back(self) {
        if self.is_worth_it() {
            let mut idle = idle_pipes();
            if idle.len() < MAX_IDLE_PIPES {
                idle.push(self);
            }
        }
    }
}

/// One connection's way of sending sealed bodies: `vmsplice` hands the kernel references to the
/// body's pages (no copy) in a pipe, and `splice` moves them on to the socket, where they stay
/// referenced until the peer has acknowledged them; the mapping being read-only for good is
/// what makes that safe. Bytes the socket could not take yet stay in the pipe
/// ([`SealedSender::pending`]) and go first on the next call ([`SealedSender::flush`]), so
/// the runtime must flush before it writes anything else to the socket, and must not take the
/// bytes as sent before the pipe is empty. The pipe is borrowed from a process-wide set of idle
/// pipes for as long as it holds bytes. When no usable pipe can be had (out of descriptors, or
/// an unprivileged process past `/proc/sys/fs/pipe-user-pages-soft`, whose new pipes get two
/// pages), the body is written from the mapping with `send` instead, a copy as for any other
/// body.
#[derive(Debug, Default)]
pub struct SealedSender {
    pipe: Option<Pipe>,
    pending: usize,
}

impl SealedSender {
    /// A sender (pipes are borrowed when there is something to send).
    pub fn new() -> SealedSender {
        SealedSender::default()
    }

    /// Bytes already taken from a body that are still in the pipe.
    pub fn pending(&self) -> usize {
        self.pending
    }

    /// Gives the pipe back once it is empty.
    fn release_if_empty(&mut self) {
        if self.pending == 0 {
            if let Some(pipe) = self.pipe.take() {
                pipe.put_back();
            }
        }
    }

    /// Moves the pipe's pending bytes to the non-blocking `socket`: `Ok` once none are left,
    /// `WouldBlock` when the socket's buffer is full (wait for writability and call again).
    pub fn flush(&mut self, socket: BorrowedFd<'_>) -> io::Result<()> {
        while self.pending > 0 {
            self.flush_some(socket)?;
        }
        self.release_if_empty();
        Ok(())
    }

    /// Moves what the non-blocking `socket` takes now of the pipe's pending bytes, with one
    /// `splice`: the count (0 when nothing is pending), or `WouldBlock` when it takes none. For
    /// a caller that wants to see each step's progress (a send timeout).
    pub fn flush_some(&mut self, socket: BorrowedFd<'_>) -> io::Result<usize> {
        let Some(pipe) = &self.pipe else {
            return Ok(0);
        };
        if self.pending == 0 {
            self.release_if_empty();
            return Ok(0);
        }
        let moved = rustix::pipe::splice(
            &pipe.read,
            None,
            socket,
            None,
            self.pending,
            SpliceFlags::NONBLOCK,
        )?;
        if moved == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        self.pending -= moved;
        self.release_if_empty();
        Ok(moved)
    }

    /// Sends the start of `sealed` to the non-blocking `socket`: flushes what is pending first
    /// (its `WouldBlock` is returned as is), then takes up to a pipe's capacity of `sealed`
    /// into the pipe and moves as much of it on as the socket accepts. The count taken: those
    /// bytes are on their way (the rest of them [`SealedSender::pending`]); call again with
    /// the rest of `sealed` ([`Sealed::advance`]).
    pub fn send(&mut self, socket: BorrowedFd<'_>, sealed: Sealed<'_>) -> io::Result<usize> {
        self.flush(socket)?;
        let pipe = match Pipe::take() {
            Ok(Some(pipe)) => self.pipe.insert(pipe),
            unusable => {
                if let Err(error) = unusable {
                    tracing::debug!("a sealed body is copied: no pipe for it: {error}");
                }
                return Ok(rustix::net::send(socket, sealed.bytes, SendFlags::empty())?);
            }
        };
        let chunk = &sealed.bytes[..sealed.len().min(pipe.capacity)];
        // SAFETY: vmsplice without SPLICE_F_GIFT puts references to the pages under `chunk`
        // in the pipe; they are read when the socket sends them, and again on a retransmit,
        // until the peer acknowledges them. That is sound only if those pages never change:
        // `chunk` lies in a sealed mapping (`Sealed` is only made by `find`, which checked the
        // registry, and borrows the slice, so the mapping stays mapped through this call),
        // which was made read-only before it was registered and is never made writable again;
        // when its last `Bytes` goes it is unmapped, and the pages the kernel still references
        // stay allocated, unchanged, until it lets go of them. `pipe.write` is the pipe's write
        // end, so the kernel only reads `chunk`.
        #[allow(unsafe_code)]
        let taken = unsafe {
            rustix::pipe::vmsplice(
                &pipe.write,
                &[IoSliceRaw::from_slice(chunk)],
                SpliceFlags::NONBLOCK,
            )?
        };
        self.pending = taken;
        // More of the body follows: let the kernel fill whole segments across the calls.
        let more = if taken < sealed.len() {
            SpliceFlags::MORE
        } else {
            SpliceFlags::empty()
        };
        match rustix::pipe::splice(
            &pipe.read,
            None,
            socket,
            None,
            taken,
            SpliceFlags::NONBLOCK | more,
        ) {
            Ok(moved) => self.pending -= moved,
            Err(rustix::io::Errno::AGAIN) => {}
            Err(error) => return Err(error.into()),
        }
        self.release_if_empty();
        Ok(taken)
    }
}

impl Drop for SealedSender {
    fn drop(&mut self) {
        // A pipe still holding bytes (the connection ended mid-body) is closed with them.
        self.release_if_empty();
    }
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
    use std::io::Read;
    use std::net::{TcpListener, TcpStream};
    use std::os::fd::AsFd;
    use std::thread;

    use super::*;

    fn body(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 7 % 251) as u8).collect()
    }

    fn registered(start: usize) -> bool {
        registry().contains_key(&start)
    }

    /// A connected pair on loopback: the sending side non-blocking with a small send buffer
    /// (so one call cannot take a large body), the receiving side blocking.
    fn small_buffer_pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let receiver = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (sender, _) = listener.accept().unwrap();
        rustix::net::sockopt::set_socket_send_buffer_size(&sender, 16 * 1024).unwrap();
        sender.set_nonblocking(true).unwrap();
        (sender, receiver)
    }

    fn read_exactly(mut receiver: TcpStream, len: usize) -> thread::JoinHandle<Vec<u8>> {
        thread::spawn(move || {
            let mut received = vec![0; len];
            receiver.read_exact(&mut received).unwrap();
            received
        })
    }

    /// Sends all of `sealed` and flushes, waiting (briefly sleeping) whenever the socket is
    /// full; returns how many times bytes were left in the pipe when a call returned.
    fn send_all(sender: &mut SealedSender, socket: &TcpStream, mut sealed: Sealed<'_>) -> usize {
        let mut left_pending = 0;
        while !sealed.is_empty() {
            match sender.send(socket.as_fd(), sealed) {
                Ok(taken) => sealed.advance(taken),
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => {
                    thread::sleep(std::time::Duration::from_millis(1))
                }
                Err(error) => panic!("send: {error}"),
            }
            if sender.pending() > 0 {
                left_pending += 1;
            }
        }
        flush_all(sender, socket);
        left_pending
    }

    fn flush_all(sender: &mut SealedSender, socket: &TcpStream) {
        loop {
            match sender.flush(socket.as_fd()) {
                Ok(()) => return,
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => {
                    thread::sleep(std::time::Duration::from_millis(1))
                }
                Err(error) => panic!("flush: {error}"),
            }
        }
    }

    #[test]
    fn a_sealed_body_reads_back_identical_and_is_found_anywhere_inside() {
        let original = body(300 * 1024 + 17);
        let sealed = seal(&original, None).unwrap();
        assert_eq!(&sealed[..], &original[..]);
        assert_eq!(
            find(&sealed).expect("the whole body is sealed").len(),
            original.len()
        );
        assert_eq!(
            find(&sealed[1000..2000]).expect("a slice of it too").len(),
            1000
        );
        let tail = sealed.slice(original.len() - 5..);
        assert_eq!(find(&tail).map(|found| found.len()), Some(5));
        assert!(find(&original).is_none(), "the heap copy is not sealed");
        assert!(find(&sealed[..0]).is_none(), "an empty slice never is");
    }

    /// The lines /proc/self/smaps has for the mapping that holds `addr`: its range and
    /// permissions first, then its fields.
    fn smaps_of(addr: usize) -> Vec<String> {
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let mut lines = smaps.lines().peekable();
        while let Some(line) = lines.next() {
            let Some((from, to)) = line.split(' ').next().and_then(|r| r.split_once('-')) else {
                continue;
            };
            let (Ok(from), Ok(to)) = (
                usize::from_str_radix(from, 16),
                usize::from_str_radix(to, 16),
            ) else {
                continue;
            };
            if (from..to).contains(&addr) {
                let mut block = vec![line.to_owned()];
                let is_field = |next: &&str| {
                    let name = next.split_whitespace().next().unwrap_or_default();
                    name.ends_with(':')
                };
                while let Some(field) = lines.next_if(is_field) {
                    block.push(field.to_owned());
                }
                return block;
            }
        }
        panic!("no mapping holds {addr:x}");
    }

    #[test]
    fn the_mapping_is_read_only() {
        let sealed = seal(&body(8192), None).unwrap();
        let block = smaps_of(sealed.as_ptr() as usize);
        let permissions = block[0].split(' ').nth(1).unwrap();
        assert!(permissions.starts_with("r--"), "{block:?}");
    }

    #[test]
    fn a_padded_body_starts_on_a_huge_page_and_asks_for_huge_pages() {
        let Some(huge) = huge_page_size() else {
            eprintln!("this kernel gives mappings no transparent huge pages: nothing to check");
            return;
        };
        let sealer = crate::Sealer::new(u64::MAX);
        let sealed = sealer.seal(Bytes::from(body(huge / 2 + 1)));
        assert_eq!(sealer.padding(), huge / 2 - 1);
        assert_eq!(
            sealed.as_ptr() as usize % huge,
            0,
            "on a huge-page boundary"
        );
        let block = smaps_of(sealed.as_ptr() as usize);
        let flags = block
            .iter()
            .find_map(|line| line.strip_prefix("VmFlags:"))
            .expect("smaps lists VmFlags");
        assert!(
            flags.split_whitespace().any(|flag| flag == "hg"),
            "MADV_HUGEPAGE: {block:?}"
        );
        assert!(sealed[..] == body(huge / 2 + 1)[..]);
    }

    #[test]
    fn the_registry_entry_goes_with_the_last_clone() {
        let sealed = seal(&body(8192), None).unwrap();
        let start = sealed.as_ptr() as usize;
        let clone = sealed.slice(100..200);
        drop(sealed);
        assert!(registered(start), "a slice keeps the entry");
        assert!(find(&clone).is_some());
        drop(clone);
        assert!(!registered(start), "the entry is gone with the last slice");
    }

    #[test]
    fn an_empty_body_is_refused() {
        assert!(seal(&[], None).is_err());
    }

    #[test]
    fn a_body_larger_than_the_socket_buffer_arrives_whole_through_the_pipe() {
        let original = body(600 * 1024 + 3);
        let sealed = seal(&original, None).unwrap();
        let (socket, receiver) = small_buffer_pair();
        let reader = read_exactly(receiver, 2 * original.len());
        let mut sender = SealedSender::new();
        let mut left_pending = 0;
        for _ in 0..2 {
            left_pending += send_all(&mut sender, &socket, find(&sealed).unwrap());
            assert_eq!(sender.pending(), 0, "flushed");
            assert!(
                sender.pipe.is_none(),
                "an empty pipe goes back to the idle ones"
            );
        }
        let received = reader.join().unwrap();
        assert!(
            received[..original.len()] == original[..],
            "first copy differs"
        );
        assert!(
            received[original.len()..] == original[..],
            "second copy differs"
        );
        assert!(left_pending > 0, "the small buffer left bytes in the pipe");
    }

    #[test]
    fn bytes_in_the_pipe_keep_their_value_after_the_body_is_gone() {
        let original = body(512 * 1024);
        let sealed = seal(&original, None).unwrap();
        let (socket, receiver) = small_buffer_pair();
        let mut sender = SealedSender::new();
        // Nothing reads yet: the socket takes its buffer's worth, the pipe holds the rest.
        let taken = sender.send(socket.as_fd(), find(&sealed).unwrap()).unwrap();
        assert!(sender.pending() > 0, "the pipe holds bytes");
        assert!(
            sender.pipe.is_some(),
            "and stays with the connection meanwhile"
        );
        drop(sealed);
        // New bodies, likely in the memory just unmapped, with other bytes.
        let others: Vec<Bytes> = (0..4)
            .map(|_| seal(&vec![0xAA; 512 * 1024], None).unwrap())
            .collect();
        let reader = read_exactly(receiver, taken);
        flush_all(&mut sender, &socket);
        let received = reader.join().unwrap();
        assert!(
            received[..] == original[..taken],
            "the pipe's bytes changed"
        );
        drop(others);
    }
}
