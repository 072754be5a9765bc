#!/usr/bin/env bash
# The membership refresh's cost against real PuppetDBs, before and after a change: two PuppetDB
# 7.12.1 servers on loopback (started by e2e/run with a state dir of their own) holding the
# latency bench's synthetic estate (bench/latency/estate.py: 2,000 nodes, a fifth held by both),
# and refresh.py timing the refresh of a baseline pdbmux and of this checkout's, side by side.
#
#   BASELINE=b855c8b^ bash bench/membership/run.sh     # the commit before producer times
#   BASELINE_BIN=/path/pdbmux bash bench/membership/run.sh
#
# Environment: BASELINE (a commit, built in a worktree with its own target dir), or
# BASELINE_BIN; MUX_BIN (default target/release/pdbmux, built here); NODES (2000),
# FACTS (150), SHARED (0.2), ROUNDS (5), CHURN (0: shared nodes given new facts before each
# refresh, refresh.py --churn), KEEP=1 (leave the PuppetDBs running afterwards).
# Loopback only; every process it starts is stopped before it exits unless KEEP=1.
set -euo pipefail

cd "$(dirname "$0")/../.."
NODES=${NODES:-2000}
FACTS=${FACTS:-150}
SHARED=${SHARED:-0.2}
ROUNDS=${ROUNDS:-5}
CHURN=${CHURN:-0}
STATE=${BENCH_STATE:-$PWD/bench/.state-membership}
PORTS=${BENCH_PORTS:-19180 19181 19543 19182}
mkdir -p "$STATE"

if [[ -z ${MUX_BIN:-} ]]; then
  echo "bench: building pdbmux (release)" >&2
  cargo build --release --locked -p pdbmux-runtime-tokio --bin pdbmux >&2
  MUX_BIN=$PWD/target/release/pdbmux
fi
if [[ -z ${BASELINE_BIN:-} ]]; then
  [[ -n ${BASELINE:-} ]] || { echo "bench: set BASELINE=<commit> or BASELINE_BIN" >&2; exit 2; }
  tree=$STATE/baseline-tree
  rm -rf "$tree"
  git worktree prune
  git worktree add --detach "$tree" "$BASELINE" >&2
  echo "bench: building the baseline $(git rev-parse --short "$BASELINE") (release)" >&2
  (cd "$tree" && CARGO_TARGET_DIR=$STATE/baseline-target \
    cargo build --release --locked -p pdbmux-runtime-tokio --bin pdbmux >&2)
  BASELINE_BIN=$STATE/baseline-target/release/pdbmux
  git worktree remove --force "$tree"
fi

stop_all() {
  if [[ ${KEEP:-0} != 1 && -f $STATE/pids ]]; then
    # shellcheck disable=SC2046
    kill $(cat "$STATE/pids") 2>/dev/null || true
    rm -f "$STATE/pids"
  fi
}
trap stop_all EXIT

echo "bench: $NODES nodes, $FACTS facts each, $SHARED held by both: starting the PuppetDBs" >&2
unset "${!E2E_@}"
E2E_STATE=$STATE E2E_DB_PREFIX=pdbmux_bench_m E2E_PORTS=$PORTS \
  bash e2e/run --backends-only --no-fixture --no-puppetboard >"$STATE.log" 2>&1 ||
  { tail -n 30 "$STATE.log" >&2; exit 1; }
# shellcheck disable=SC1091
source "$STATE/env.sh"
python3 bench/latency/estate.py --backends "$E2E_BACKENDS" --union "$E2E_UNION" \
  --nodes "$NODES" --facts "$FACTS" --shared "$SHARED" --out "$STATE/estate.json"
echo
echo "== $NODES nodes, $SHARED held by both ($(git rev-parse --short HEAD)$(git diff --quiet || echo '+dirty'), load average $(cut -d' ' -f1-3 /proc/loadavg))"
python3 bench/membership/refresh.py --backends "$E2E_BACKENDS" --rounds "$ROUNDS" --churn "$CHURN" \
  --binary "baseline=$BASELINE_BIN" --binary "current=$MUX_BIN"
