//! Platforms without memfds: nothing is sealed, so nothing is ever found or sent from one.

use std::io::{self, IoSlice};
use std::os::fd::BorrowedFd;

use bytes::Bytes;

/// Never made on this platform.
#[derive(Debug, Clone)]
pub struct Sealed {
    len: usize,
}

impl Sealed {
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

pub fn seal(_body: &[u8]) -> io::Result<Bytes> {
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        "no sealed memory on this platform",
    ))
}

pub fn find(_slice: &[u8]) -> Option<Sealed> {
    None
}

/// Unsupported here ([`find`] never returns a [`Sealed`]).
pub fn send_sealed(_socket: BorrowedFd<'_>, _sealed: &Sealed) -> io::Result<usize> {
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        "no sendfile here",
    ))
}

/// Unsupported here.
pub fn send_head(_socket: BorrowedFd<'_>, _bufs: &[IoSlice<'_>]) -> io::Result<usize> {
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        "no MSG_MORE here",
    ))
}
