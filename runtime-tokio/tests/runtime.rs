//! The shared runtime cases (runtime-smol/tests/cases) against `pdbmux`: the same behaviour is
//! asserted of both binaries.

#[macro_use]
#[path = "../../runtime-smol/tests/cases/mod.rs"]
mod cases;
#[path = "../../runtime-smol/tests/support/mod.rs"]
mod support;

runtime_cases!(env!("CARGO_BIN_EXE_pdbmux"));
