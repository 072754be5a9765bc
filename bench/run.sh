#!/usr/bin/env bash
# pdbmux benchmarks: builds the release binaries, runs the three figures, prints one table.
#
#   bash bench/run.sh                 # everything (about 1.5 min after the build)
#   bash bench/run.sh merge           # only the in-process merge figure
#   bash bench/run.sh workers         # only requests/s at 1 and 2 worker threads
#   bash bench/run.sh cache           # only cache hits against nginx
#   bash bench/run.sh metrics         # only the cost of pdbmux's own metrics (on against off)
#   bash bench/run.sh shared          # only the shared cache: fan-outs with 4 replicas, hit latency
#
# Environment: DURATION (seconds per wrk run, default 10), RUNS (best-of for the merge, default 7),
# PIN_PDBMUX / PIN_LOAD (taskset CPU lists for pdbmux+nginx and for wrk+fakepdb, default unpinned),
# LOADBENCH_ARGS / MERGE_ARGS (extra flags, see bench/README.md), NO_INSTALL=1 (never apt-get).
# Loopback only. Every process it starts is stopped before it exits.
set -euo pipefail

cd "$(dirname "$0")/.."
what="${1:-all}"
DURATION="${DURATION:-10}"
RUNS="${RUNS:-7}"

need() { # need <command> <debian package>
  command -v "$1" >/dev/null 2>&1 && return 0
  if [[ "${NO_INSTALL:-}" == 1 || $(id -u) != 0 ]]; then
    echo "bench: $1 is missing (Debian package $2)" >&2
    exit 1
  fi
  echo "bench: installing $2" >&2
  apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$2" >&2
}
if [[ "$what" != merge ]]; then
  need wrk wrk
  need taskset util-linux
fi
if [[ "$what" == all || "$what" == cache ]]; then
  [[ -x /usr/sbin/nginx ]] || need nginx nginx-light
fi
if [[ "$what" == all || "$what" == shared ]]; then
  need redis-server redis-server
fi

echo "bench: building release binaries (pdbmux, pdbmux-bench)" >&2
cargo build --release --locked -p pdbmux-runtime-tokio -p pdbmux-bench >&2
bin=target/release

out=$(mktemp)
trap 'rm -f "$out"' EXIT

{
  echo "pdbmux bench $(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet 2>/dev/null || echo '+dirty'), $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "machine: $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')), load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
} | tee -a "$out"

pins=()
[[ -n "${PIN_PDBMUX:-}" ]] && pins+=(--pin-pdbmux "$PIN_PDBMUX")
[[ -n "${PIN_LOAD:-}" ]] && pins+=(--pin-load "$PIN_LOAD")

if [[ "$what" == all || "$what" == merge ]]; then
  # shellcheck disable=SC2086
  "$bin/merge-throughput" --runs "$RUNS" ${MERGE_ARGS:-} | tee -a "$out" | grep -v '^SUMMARY'
fi
if [[ "$what" == all || "$what" == workers || "$what" == cache || "$what" == metrics || "$what" == shared ]]; then
  only=()
  [[ "$what" != all ]] && only=(--only "$what")
  # shellcheck disable=SC2086
  "$bin/loadbench" --pdbmux "$bin/pdbmux" --fakepdb "$bin/fakepdb" --duration "$DURATION" \
    "${pins[@]}" "${only[@]}" ${LOADBENCH_ARGS:-} | tee -a "$out" | grep -v '^SUMMARY'
fi

echo
echo "== summary (baselines measured in this run; load average after: $(cut -d' ' -f1-3 /proc/loadavg)) =="
{
  printf 'figure\tmeasured\tbaseline (same run)\tratio\ttarget\tverdict\n'
  grep '^SUMMARY' "$out" | cut -f2-
} | column -t -s $'\t'
