//! The runtime cases both binaries must pass, against scripted raw-TCP backends and a pdbmux
//! process on loopback: body limits while streaming, request limits, keep-alive, graceful
//! shutdown and cancellation, metrics, reload, slow clients, refusals (`cases`), on the test
//! support in `support`. Each case is a function of the binary under test; each runtime's
//! `tests/runtime.rs` turns the list into `#[test]`s for its binary with [`runtime_cases!`].
//! `RUNTIME_TEST_BIN=<binary>` runs them against any other binary.

#[macro_use]
pub mod cases;
pub mod support;
