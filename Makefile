# pdbmux — build, test, lint and end-to-end targets. `make help` lists them.
SHELL := /bin/bash
CARGO ?= cargo
DIST  ?= dist

.PHONY: help build test lint lint-core e2e demo

help:
	@echo "make build   release binaries into $(DIST)/"
	@echo "make test    unit and conformance tests (fast; no PuppetDB needed)"
	@echo "make lint    rustfmt, clippy -D warnings, and the core's sans-IO rules"
	@echo "make e2e     end-to-end tests against two real PuppetDBs (installs them if missing)"
	@echo "make demo    pdbmux in front of two local PuppetDBs with sample data (or your PDBMUX_BACKENDS)"

build:
	$(CARGO) build --release --locked --bin pdbmux
	mkdir -p $(DIST)
	cp target/release/pdbmux $(DIST)/

test:
	$(CARGO) test --workspace --locked

lint: lint-core
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets --locked -- -D warnings

# The core stays sans-IO: no async runtime, HTTP stack or config loader in its dependency tree,
# no unsafe code, and no clock or sleep (clippy.toml's disallowed-methods, enforced by clippy above).
lint-core:
	@deps=$$($(CARGO) tree -p pdbmux-core -e normal --prefix none --locked | grep -Eo '^(tokio|smol|hyper|hyper-util|async-h1|async-std|futures|futures-util|figment) ' | sort -u | tr '\n' ' '); \
	if [ -n "$$deps" ]; then echo "core depends on I/O or config crates: $$deps"; exit 1; fi
	@grep -q '^#!\[forbid(unsafe_code)\]' core/src/lib.rs || { echo "core/src/lib.rs must #![forbid(unsafe_code)]"; exit 1; }
	@for m in std::time::Instant::now std::time::SystemTime::now std::thread::sleep; do \
	  grep -q "\"$$m\"" core/clippy.toml || { echo "core/clippy.toml must disallow $$m"; exit 1; }; done
	@echo "core: sans-IO dependency tree, forbid(unsafe_code), clock and sleep disallowed"

e2e:
	bash e2e/run

demo:
	bash e2e/demo
