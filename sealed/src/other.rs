//! Platforms other than Linux: nothing is sealed, so nothing is ever found or sent from a
//! sealed mapping, and the runtimes write every byte the plain way.

use std::io::{self, IoSlice};
use std::marker::PhantomData;
use std::os::fd::BorrowedFd;

use bytes::Bytes;

/// Never made on this platform.
#[derive(Debug, Clone, Copy)]
pub struct Sealed<'a> {
    len: usize,
    slice: PhantomData<&'a [u8]>,
}

impl Sealed<'_> {
    /// Bytes in this part.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether this part is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The same part without its first `n` bytes.
    pub fn advance(&mut self, n: usize) {
        self.len -= n.min(self.len);
    }
}

/// Never has anything to send on this platform ([`find`] never returns a [`Sealed`]).
#[derive(Debug, Default)]
pub struct SealedSender;

impl SealedSender {
    /// A sender.
    pub fn new() -> SealedSender {
        SealedSender
    }

    /// Always 0.
    pub fn pending(&self) -> usize {
        0
    }

    /// Nothing is ever pending.
    pub fn flush(&mut self, _socket: BorrowedFd<'_>) -> io::Result<()> {
        Ok(())
    }

    /// Nothing is ever pending.
    pub fn flush_some(&mut self, _socket: BorrowedFd<'_>) -> io::Result<usize> {
        Ok(0)
    }

    /// Unsupported here.
    pub fn send(&mut self, _socket: BorrowedFd<'_>, _sealed: Sealed<'_>) -> io::Result<usize> {
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "no sealed sends here",
        ))
    }
}

/// No huge pages are used on this platform.
pub fn huge_page_size() -> Option<usize> {
    None
}

pub(crate) fn seal(_body: &[u8], _huge_pages: Option<crate::HugePages>) -> io::Result<Bytes> {
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        "no sealed memory on this platform",
    ))
}

pub fn find(_slice: &[u8]) -> Option<Sealed<'_>> {
    None
}

/// Unsupported here.
pub fn send_head(_socket: BorrowedFd<'_>, _bufs: &[IoSlice<'_>]) -> io::Result<usize> {
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        "no MSG_MORE here",
    ))
}
