//! Any bytes as the start of an HTTP/1 request head (pdbmux-smol's parser): never panics, and a
//! complete head never claims more bytes than it was given.

#![no_main]
#![forbid(unsafe_code)]

use libfuzzer_sys::fuzz_target;
use pdbmux_driver::http1::{parse_head, Parsed};

fuzz_target!(|data: &[u8]| {
    if let Parsed::Complete(head, length) = parse_head(data) {
        assert!(length <= data.len());
        assert!(!head.request.target.is_empty());
    }
});
