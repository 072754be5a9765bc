//! The runtime cases (`pdbmux-runtime-cases`, shared with runtime-tokio) against `pdbmux-smol`.
//! `RUNTIME_TEST_BIN=<binary>` runs them against any other binary, e.g.
//! `RUNTIME_TEST_BIN=$PWD/target/debug/pdbmux cargo test -p pdbmux-runtime-smol`.

pdbmux_runtime_cases::runtime_cases!(env!("CARGO_BIN_EXE_pdbmux-smol"));
