//! The runtime cases (`pdbmux-runtime-cases`, shared with runtime-smol) against `pdbmux`: the
//! same behaviour is asserted of both binaries.

pdbmux_runtime_cases::runtime_cases!(env!("CARGO_BIN_EXE_pdbmux"));
