#!/usr/bin/env bash
# Compares the two pdbmux binaries side by side on the e2e fixture estate (issue 7): release binary
# size, idle RSS, peak RSS under 64 concurrent clients (wrk), and requests/s on a pass-through
# route (/pdb/query/v4/catalogs) and a merged route (/pdb/query/v4/nodes, with PDBMUX_FACTS_TTL=0
# so the merged-response cache does not answer).
#
# Two setups, each binary started afresh in each:
#   direct    pdbmux -> the e2e PuppetDBs. PuppetDB's own speed bounds the figures.
#   replayed  pdbmux -> replay_backend (runtime-smol/examples) -> the e2e PuppetDBs: each distinct
#             upstream request reaches PuppetDB once and is replayed from memory afterwards, so
#             the figures measure pdbmux itself, on the fixture's real answers.
#
# Usage: runtime-smol/compare.sh [--no-build]
#   --no-build   use the binaries as they are
# Env:
#   DURATION=10      seconds of wrk per route, binary and setup
#   CONNECTIONS=64   wrk connections (concurrent clients)
#   THREADS=2        wrk threads
#   ROUNDS=1         repeat everything, alternating which binary goes first; the best round counts
#   SETUPS="direct replayed"
#   TOKIO_BIN, SMOL_BIN, REPLAY_BIN  default target/release/{pdbmux,pdbmux-smol,examples/replay_backend}
#
# The e2e backends are started (`bash e2e/run --backends-only`) when 127.0.0.1:18080 does not
# answer; `e2e/.state/env.sh` gives E2E_BACKENDS. wrk is Debian's `wrk` (installed if
# missing and root).
set -Eeuo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DURATION=${DURATION:-10}
CONNECTIONS=${CONNECTIONS:-64}
THREADS=${THREADS:-2}
ROUNDS=${ROUNDS:-1}
SETUPS=${SETUPS:-direct replayed}
BUILD=1
[[ ${1:-} == --no-build ]] && BUILD=0

log() { printf '[compare] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

cd "$ROOT"
if [[ $BUILD == 1 ]]; then
  log "building release binaries"
  cargo build --release -p pdbmux-runtime-smol -p pdbmux-runtime-tokio >&2
  cargo build --release -p pdbmux-runtime-smol --example replay_backend >&2
fi
BINS=(pdbmux pdbmux-smol)
declare -A PATH_OF=(
  [pdbmux]=${TOKIO_BIN:-target/release/pdbmux}
  [pdbmux-smol]=${SMOL_BIN:-target/release/pdbmux-smol}
)
REPLAY_BIN=${REPLAY_BIN:-target/release/examples/replay_backend}
for bin in "${BINS[@]}"; do
  [[ -x ${PATH_OF[$bin]} ]] || die "${PATH_OF[$bin]} is missing (run without --no-build)"
done

if ! command -v wrk >/dev/null; then
  [[ $(id -u) == 0 ]] || die "wrk is missing: apt-get install wrk"
  log "installing wrk"
  apt-get install -y --no-install-recommends wrk >&2 ||
    { apt-get update >&2 && apt-get install -y --no-install-recommends wrk >&2; }
fi

if ! curl -sf --max-time 5 127.0.0.1:18080/pdb/meta/v1/version >/dev/null; then
  log "starting the e2e backends"
  bash e2e/run --backends-only >&2
fi
# shellcheck source=/dev/null
source e2e/.state/env.sh
[[ -n ${E2E_BACKENDS:-} ]] || die "E2E_BACKENDS is not set by e2e/.state/env.sh"

PIDS=()
cleanup() {
  local pid
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
kib() { awk '/^'"$1"':/ { print $2 }' "/proc/$2/status"; }
wait_listening() { # addr
  local _
  for _ in $(seq 100); do
    (exec 3<>"/dev/tcp/${1%:*}/${1##*:}") 2>/dev/null && return 0
    sleep 0.1
  done
  die "nothing listens on $1"
}

# The backends of each setup, as PDBMUX_BACKENDS.
declare -A BACKENDS=([direct]=$E2E_BACKENDS)
if [[ " $SETUPS " == *" replayed "* ]]; then
  [[ -x $REPLAY_BIN ]] || die "$REPLAY_BIN is missing (run without --no-build)"
  replayed=()
  IFS=, read -ra pairs <<<"$E2E_BACKENDS"
  for pair in "${pairs[@]}"; do
    name=${pair%%=*} url=${pair#*=}
    [[ $url == http://* ]] || die "replayed setup: $name is not plain http ($url)"
    addr=127.0.0.1:$(free_port)
    "$REPLAY_BIN" "$addr" "${url#http://}" >/dev/null &
    PIDS+=($!)
    wait_listening "$addr"
    replayed+=("$name=http://$addr")
  done
  BACKENDS[replayed]=$(IFS=,; echo "${replayed[*]}")
fi

# wrk's requests/s and its errors (socket errors plus non-2xx answers): "rps errors".
run_wrk() { # url
  local out rps errors
  out=$(wrk -t "$THREADS" -c "$CONNECTIONS" -d "${DURATION}s" --timeout 30s "$1")
  rps=$(awk '/^Requests\/sec:/ { print $2 }' <<<"$out")
  errors=$(awk '/Non-2xx or 3xx responses:/ { n += $NF }
    /Socket errors:/ { gsub(",", ""); n += $4 + $6 + $8 + $10 } END { print n + 0 }' <<<"$out")
  echo "${rps:-0} $errors"
}

declare -A SIZE IDLE PEAK PASS MERGED ERRORS
better() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a > b) }'; }
measure() { # bin setup round
  local bin=$1 setup=$2 round=$3 addr logfile pid idle peak pass merged pass_err merged_err route code k
  addr=127.0.0.1:$(free_port)
  logfile=$(mktemp -t "compare-$bin.XXXX.log")
  PDBMUX_BACKENDS=${BACKENDS[$setup]} PDBMUX_LISTEN=$addr PDBMUX_METRICS_LISTEN= PDBMUX_FACTS_TTL=0 \
    PDBMUX_LOG_LEVEL=warn "${PATH_OF[$bin]}" 2>"$logfile" &
  pid=$!
  wait_listening "$addr"
  sleep 1
  idle=$(kib VmRSS "$pid")
  for route in /pdb/query/v4/catalogs /pdb/query/v4/nodes; do
    code=$(curl -s -o /dev/null -w '%{http_code}' "http://$addr$route")
    [[ $code == 200 ]] || die "$bin ($setup): $route answered $code (log: $logfile)"
  done
  read -r pass pass_err < <(run_wrk "http://$addr/pdb/query/v4/catalogs")
  read -r merged merged_err < <(run_wrk "http://$addr/pdb/query/v4/nodes")
  peak=$(kib VmHWM "$pid")
  kill "$pid"
  wait "$pid" 2>/dev/null || true
  rm -f "$logfile"
  log "round $round, $setup, $bin: idle ${idle} KiB, peak ${peak} KiB," \
    "catalogs ${pass}/s (${pass_err} errors), nodes ${merged}/s (${merged_err} errors)"
  k="$setup $bin"
  # Throughput: the best round. Memory: the lowest.
  if [[ -z ${PASS[$k]:-} ]] || better "$pass" "${PASS[$k]}"; then PASS[$k]=$pass; fi
  if [[ -z ${MERGED[$k]:-} ]] || better "$merged" "${MERGED[$k]}"; then MERGED[$k]=$merged; fi
  if [[ -z ${IDLE[$bin]:-} ]] || better "${IDLE[$bin]}" "$idle"; then IDLE[$bin]=$idle; fi
  if [[ -z ${PEAK[$k]:-} ]] || better "${PEAK[$k]}" "$peak"; then PEAK[$k]=$peak; fi
  ERRORS[$k]="$((${ERRORS[$k]%% *} + pass_err)) / $((${ERRORS[$k]##* } + merged_err))"
}

for bin in "${BINS[@]}"; do SIZE[$bin]=$(stat -c %s "${PATH_OF[$bin]}"); done
for setup in $SETUPS; do for bin in "${BINS[@]}"; do ERRORS["$setup $bin"]="0 / 0"; done; done
for ((round = 1; round <= ROUNDS; round++)); do
  order=("${BINS[@]}")
  ((round % 2)) || order=(pdbmux-smol pdbmux)
  for setup in $SETUPS; do
    for bin in "${order[@]}"; do measure "$bin" "$setup" "$round"; done
  done
done

mib() { awk -v b="$1" 'BEGIN { printf "%.2f MiB", b / 1048576 }'; }
kmib() { awk -v k="$1" 'BEGIN { printf "%.1f MiB", k / 1024 }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.0f%%", 100 * a / b; else print "-" }'; }
row() { printf '%-44s %16s %16s %10s\n' "$@"; }
T=pdbmux S=pdbmux-smol
echo
echo "pdbmux (tokio) vs pdbmux-smol on the e2e fixture estate ($E2E_BACKENDS)"
echo "wrk -t$THREADS -c$CONNECTIONS -d${DURATION}s --timeout 30s; $(nproc) cores; best of $ROUNDS round(s);" \
  "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
row "" "pdbmux (tokio)" "pdbmux-smol" "smol/tokio"
row "release binary size" "$(mib "${SIZE[$T]}")" "$(mib "${SIZE[$S]}")" "$(ratio "${SIZE[$S]}" "${SIZE[$T]}")"
row "idle RSS (started, no request yet)" "$(kmib "${IDLE[$T]}")" "$(kmib "${IDLE[$S]}")" "$(ratio "${IDLE[$S]}" "${IDLE[$T]}")"
for setup in $SETUPS; do
  row "[$setup] peak RSS, $CONNECTIONS clients" "$(kmib "${PEAK[$setup $T]}")" "$(kmib "${PEAK[$setup $S]}")" \
    "$(ratio "${PEAK[$setup $S]}" "${PEAK[$setup $T]}")"
  row "[$setup] req/s /pdb/query/v4/catalogs" "${PASS[$setup $T]}" "${PASS[$setup $S]}" \
    "$(ratio "${PASS[$setup $S]}" "${PASS[$setup $T]}")"
  row "[$setup] req/s /pdb/query/v4/nodes" "${MERGED[$setup $T]}" "${MERGED[$setup $S]}" \
    "$(ratio "${MERGED[$setup $S]}" "${MERGED[$setup $T]}")"
  row "[$setup] wrk errors (catalogs / nodes)" "${ERRORS[$setup $T]}" "${ERRORS[$setup $S]}" ""
done
