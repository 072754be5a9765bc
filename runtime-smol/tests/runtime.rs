//! The runtime cases (`tests/cases`, on `tests/support`) against `pdbmux-smol`.
//!
//! runtime-tokio runs the same cases against `pdbmux` with this file's body, the module paths
//! pointing here (`#[path = "../../runtime-smol/tests/cases/mod.rs"]` on `mod cases;`, and
//! likewise for `support`) and `env!("CARGO_BIN_EXE_pdbmux")`. `RUNTIME_TEST_BIN=<binary>`
//! runs them against any other binary, e.g. `RUNTIME_TEST_BIN=$PWD/target/debug/pdbmux
//! cargo test -p pdbmux-runtime-smol`.

#[macro_use]
mod cases;
mod support;

runtime_cases!(env!("CARGO_BIN_EXE_pdbmux-smol"));
