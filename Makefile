# pdbmux — build, test, lint and end-to-end targets. `make help` lists them.
SHELL := /bin/bash
CARGO ?= cargo
DIST  ?= dist

.PHONY: help build test lint lint-core lint-portable deny fuzz e2e e2e-newcomer e2e-histories ops-check demo bench-latency bench-membership

help:
	@echo "make build   release binaries into $(DIST)/"
	@echo "make test    unit and conformance tests (fast; no PuppetDB needed)"
	@echo "make lint    rustfmt, clippy -D warnings, the core's sans-IO rules, the README's route table against the routing, and every docs citation resolving"
	@echo "make lint-portable   clippy of pdbmux-sealed for a non-Linux target (rustup adds its std)"
	@echo "make e2e     end-to-end tests against real PuppetDBs (installs them if missing), one history per backend count, then the newcomer test"
	@echo "make e2e-newcomer   the newcomer test alone: README.md's Quick start (make demo and its examples) on a fresh clone"
	@echo "make e2e-histories SEEDS=20   the history suite alone: seeds 1..20 over 2, 3 and 4 PuppetDBs (SEED=n replays one)"
	@echo "make ops-check   the on-call check alone: every alert rule seen firing under its fault and resolving (real Prometheus; ~25 min, E2E_OPS_SCALE=20 for ~2), and request ids from client to log to backend"
	@echo "make demo    pdbmux and Puppetboard in front of two local PuppetDBs with sample data (or your PDBMUX_BACKENDS)"
	@echo "make bench-latency   Puppetboard's questions through pdbmux against real PuppetDBs (bench/latency)"
	@echo "make bench-membership BASELINE=<commit>  the membership refresh, this checkout against a baseline (bench/membership)"
	@echo "make image   the container image (podman); make image-test checks it against real PuppetDBs"
	@echo "make patch|minor|major   bump the version and tag it"

# ---- release: static binaries, container image, version tags (README "Deployment") ----------
# The version has one source: `version` under [workspace.package] in Cargo.toml, bumped by
# make patch/minor/major. `make build VERSION=x` overrides it for the binary and the image tag.
VERSION      := $(shell sed -n '/^\[workspace\.package\]/,/^\[/s/^version *= *"\([^"]*\)".*/\1/p' Cargo.toml)
RUST_TARGET  ?= x86_64-unknown-linux-gnu
# A target dir of its own: the static flags would otherwise invalidate target/release and the dev cache.
STATIC_DIR   ?= target/static
# The runtimes' binaries: pdbmux, plus pdbmux-smol once runtime-smol is a workspace member.
BINS         ?= pdbmux $(if $(shell grep -s '"runtime-smol"' Cargo.toml),pdbmux-smol)
IMAGE        ?= localhost/pdbmux
IMAGE_CONTEXT ?= target/image-context
CA_BUNDLE    ?= /etc/ssl/certs/ca-certificates.crt
PODMAN       ?= podman --storage-driver vfs

.PHONY: version static-test image-context image image-test deploy-check patch minor major

version:
	@echo $(VERSION)

# glibc linked statically (+crt-static; the musl target is not installable here). RUSTFLAGS reach
# only the --target build, not build scripts and proc macros.
build:
	RUSTFLAGS="-C target-feature=+crt-static" PDBMUX_BUILD_VERSION="$(VERSION)" \
	  $(CARGO) build --release --locked --target $(RUST_TARGET) --target-dir $(STATIC_DIR) $(addprefix --bin ,$(BINS))
	mkdir -p $(DIST)
	for b in $(BINS); do cp -f $(STATIC_DIR)/$(RUST_TARGET)/release/$$b $(DIST)/; done
	@for b in $(BINS); do \
	  file -b $(DIST)/$$b | grep -Eq 'static(-pie)? linked' || { echo "$(DIST)/$$b is not statically linked"; exit 1; }; \
	  echo "$(DIST)/$$b: static, $$($(DIST)/$$b version)"; done

# Static linking and host-name resolution (/etc/hosts, DNS) in a bare chroot; needs root.
static-test:
	for b in $(BINS); do bash deploy/test-static.sh $(DIST)/$$b || exit 1; done

# The image's build context: the static binary, the build machine's CA bundle, deploy/image/etc.
image-context:
	@test -x $(DIST)/pdbmux || { echo "no $(DIST)/pdbmux: run make build first"; exit 1; }
	@test -s $(CA_BUNDLE) || { echo "no CA bundle at $(CA_BUNDLE) (apt-get install ca-certificates)"; exit 1; }
	rm -rf $(IMAGE_CONTEXT)
	mkdir -p $(IMAGE_CONTEXT)/etc
	cp $(DIST)/pdbmux $(IMAGE_CONTEXT)/pdbmux
	cp $(CA_BUNDLE) $(IMAGE_CONTEXT)/ca-certificates.crt
	cp deploy/image/etc/passwd deploy/image/etc/group deploy/image/etc/nsswitch.conf $(IMAGE_CONTEXT)/etc/

image:
	$(MAKE) build BINS=pdbmux
	$(MAKE) image-context
	@command -v podman >/dev/null || { apt-get update -q && apt-get install -y -q podman; }
	$(PODMAN) build --layers=false --file Containerfile --build-arg VERSION="$(VERSION)" --tag $(IMAGE):$(VERSION) $(IMAGE_CONTEXT)
	@echo "built $(IMAGE):$(VERSION)"

# D13: the image's binary run from the mounted image root (podman image mount + chroot) against
# the e2e PuppetDBs on loopback (started with e2e/run --backends-only when they are down). Root.
image-test:
	bash deploy/test-image.sh $(IMAGE):$(VERSION) $(VERSION)

# deploy/kubernetes/ parsed and checked (deploy/manifest-check, a crate outside the workspace);
# with dist/pdbmux present, `pdbmux config show` must accept the ConfigMap's file and the env vars.
deploy-check:
	MUX_BIN="$(if $(wildcard $(DIST)/pdbmux),$(abspath $(DIST)/pdbmux))" \
	  $(CARGO) test --locked --manifest-path deploy/manifest-check/Cargo.toml --target-dir target/deploy-check
	@# The alert rules' PromQL, and each newer alert firing on synthetic series (Debian's prometheus package has promtool).
	@if command -v promtool >/dev/null; then \
	  promtool check rules deploy/prometheus/pdbmux-rules.yaml && \
	  promtool test rules deploy/prometheus/pdbmux-rules.test.yaml; \
	else echo "deploy-check: promtool not installed (apt-get install prometheus): alert rules not evaluated"; fi

# Bump the version, commit Cargo.toml and Cargo.lock, create the annotated tag v<version>; refuses
# on a dirty tree; never pushes.
patch minor major:
	bash deploy/release.sh $@

test:
	$(CARGO) test --workspace --locked

# Supply chain (deny.toml): licenses, duplicate versions and sources offline; the RustSec
# advisories (known vulnerabilities, unmaintained and yanked crates) when its database can be
# fetched from GitHub, else said to be skipped.
deny:
	cargo deny --locked check licenses bans sources
	@if cargo deny --locked check advisories 2>deny-advisories.log; then rm -f deny-advisories.log; \
	elif grep -q 'failed to fetch advisory database' deny-advisories.log; then \
	  echo "cargo deny check advisories: SKIPPED, the advisory database could not be fetched"; rm -f deny-advisories.log; \
	else cat deny-advisories.log; rm -f deny-advisories.log; exit 1; fi

# cargo-fuzz targets (fuzz/, nightly): FUZZ_SECONDS each (default 30), a crash fails. The
# corpora stay in fuzz/corpus between runs (not committed).
FUZZ_SECONDS ?= 30
FUZZ_TARGETS = plan_target http1_head merge_bodies shared_value json_check
fuzz:
	cd fuzz && for target in $(FUZZ_TARGETS); do \
	  cargo +nightly fuzz run $$target -- -max_total_time=$(FUZZ_SECONDS) -rss_limit_mb=2048 2>&1 \
	    | grep -E '^#[0-9]+.*DONE|^==|panicked|SUMMARY' | sed "s/^/$$target: /"; \
	  test $${PIPESTATUS[0]} -eq 0 || exit 1; done

lint: lint-core
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets --locked -- -D warnings
	RUSTDOCFLAGS="-D warnings" $(CARGO) doc --workspace --no-deps --locked
	@# the README's route table against the binary's routing (conformance/tests/readme.rs), and
	@# every docs/<file>.md and section a comment or doc cites exists (conformance/tests/citations.rs), and
	@# no two types in the core share a name (conformance/tests/core_names.rs), and no import cycle
	@# among the core's modules (conformance/tests/core_modules.rs)
	$(CARGO) test -q --locked -p pdbmux-conformance --test readme --test citations --test core_names --test core_modules

# The core stays sans-IO: no async runtime, HTTP stack, config loader or OS-call crate (rustix,
# memmap2: those live in sealed/) in its dependency tree,
# no unsafe code, and no clock or sleep (clippy.toml's disallowed-methods, enforced by clippy above).
lint-core:
	@deps=$$($(CARGO) tree -p pdbmux-core -e normal --prefix none --locked | grep -Eo '^(tokio|smol|hyper|hyper-util|async-h1|async-std|futures|futures-util|figment|rustix|memmap2) ' | sort -u | tr '\n' ' '); \
	if [ -n "$$deps" ]; then echo "core depends on I/O or config crates: $$deps"; exit 1; fi
	@for root in core/src/lib.rs cli/src/lib.rs tls/src/lib.rs driver/src/lib.rs runtime-tokio/src/main.rs \
	  runtime-smol/src/main.rs conformance/src/lib.rs e2e/src/lib.rs bench/src/lib.rs bench/src/bin/*.rs \
	  deploy/manifest-check/src/lib.rs; do \
	  grep -q '^#!\[forbid(unsafe_code)\]' $$root || { echo "$$root must #![forbid(unsafe_code)] (only sealed/ may hold unsafe code)"; exit 1; }; done
	@for m in std::time::Instant::now std::time::SystemTime::now std::thread::sleep; do \
	  grep -q "\"$$m\"" core/clippy.toml || { echo "core/clippy.toml must disallow $$m"; exit 1; }; done
	@echo "core: sans-IO dependency tree, forbid(unsafe_code), clock and sleep disallowed"

# pdbmux-sealed has a second implementation for platforms other than Linux (nothing sealed,
# every byte written the plain way); this keeps it compiling and clippy-clean. The target's std
# comes from rustup (the only thing fetched from outside the package registries).
PORTABLE_TARGET ?= x86_64-unknown-freebsd
lint-portable:
	rustup target list --installed | grep -qx '$(PORTABLE_TARGET)' || rustup target add $(PORTABLE_TARGET)
	$(CARGO) clippy --locked --target $(PORTABLE_TARGET) -p pdbmux-sealed --all-targets -- -D warnings

# e2e/run's suite, then the newcomer test (e2e/newcomer: README.md's Quick start on a fresh clone,
# about 2 minutes, 4 the first time; it runs even when the suite failed, not after an interrupt). Both count.
e2e:
	@run=0; bash e2e/run || run=$$?; [ $$run != 130 ] || exit 130; \
	newcomer=0; bash e2e/newcomer || newcomer=$$?; \
	echo "make e2e: e2e/run exited $$run, e2e/newcomer $$newcomer"; [ $$run = 0 ] && [ $$newcomer = 0 ]

e2e-newcomer:
	bash e2e/newcomer

# The on-call check alone (e2e/tests/ops.rs, docs/operating.md "On call"): every alert rule as
# shipped seen firing under its fault and resolving, against real PuppetDBs and a real Prometheus
# (about 25 minutes; E2E_OPS_SCALE=20 divides its times by 20).
ops-check:
	bash e2e/run --ops-only

# The history suite alone (e2e/tests/histories.rs): SEEDS histories per backend count, or SEED.
SEEDS ?= 1
e2e-histories:
	E2E_HISTORY_SEEDS=$(SEEDS) $(if $(SEED),E2E_HISTORY_SEED=$(SEED)) bash e2e/run --histories-only

demo:
	bash e2e/demo

bench-latency:
	bash bench/latency/run.sh

bench-membership:
	BASELINE=$(BASELINE) bash bench/membership/run.sh
