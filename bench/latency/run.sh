#!/usr/bin/env bash
# Latency against real PuppetDBs (issue 16's figure): for each overlap level, three PuppetDB 7.12.1
# servers on loopback (started by e2e/run with a state dir of their own), a synthetic estate split
# across two of them and whole in the third, pdbmux (release build, cache off) over the two, and
# latency.py asking all four Puppetboard's questions in interleaved rounds.
#
#   bash bench/latency/run.sh                # 2,000 nodes at 20% and at 60% held by both
#   NODES=500 OVERLAPS="0.2" ROUNDS=5 bash bench/latency/run.sh
#   ONLY="overview" bash bench/latency/run.sh   # only questions whose name starts so
#
# Environment: NODES (2000), FACTS (150), REPORTS (1 per node and backend), OVERLAPS ("0.2 0.6"),
# ROUNDS (15), ONLY, CACHE (off: every cache TTL 0, every answer a fan-out; default: pdbmux's
# defaults, the cache warm after each question's first round), MUX_BIN
# (default target/release/pdbmux, built here), BASELINE_BIN (another pdbmux binary, run beside it
# with the same settings and asked in the same interleaved rounds: a "baseline" column and
# pdbmux's ratio to it), MUX_ENV (extra PDBMUX_* settings, space-separated, for the measured
# pdbmux only: with BASELINE_BIN the same binary, a setting's effect in one run), KEEP=1 (leave
# the PuppetDBs running afterwards).
# Loopback only; every process it starts is stopped before it exits unless KEEP=1.
set -euo pipefail

cd "$(dirname "$0")/../.."
NODES=${NODES:-2000}
FACTS=${FACTS:-150}
REPORTS=${REPORTS:-1}
OVERLAPS=${OVERLAPS:-0.2 0.6}
ROUNDS=${ROUNDS:-15}
CACHE=${CACHE:-off}
case $CACHE in
  off) CACHE_ENV=(PDBMUX_FACTS_TTL=0 PDBMUX_HISTORY_TTL=0 PDBMUX_AGGREGATE_TTL=0) ;;
  default) CACHE_ENV=() ;;
  *) echo "bench: CACHE is off or default" >&2; exit 2 ;;
esac
STATE=${BENCH_STATE:-$PWD/bench/.state}
PORTS=${BENCH_PORTS:-19080 19081 19443 19082}
MUX_PORT=${BENCH_LISTEN_PORT:-19900}
BASELINE_PORT=$((MUX_PORT + 1))

if [[ -z ${MUX_BIN:-} ]]; then
  echo "bench: building pdbmux (release)" >&2
  cargo build --release --locked -p pdbmux-runtime-tokio --bin pdbmux >&2
  MUX_BIN=target/release/pdbmux
fi

MUX_PID=""
BASELINE_PID=""
stop_all() {
  [[ -n $MUX_PID ]] && kill "$MUX_PID" 2>/dev/null && wait "$MUX_PID" 2>/dev/null || true
  [[ -n $BASELINE_PID ]] && kill "$BASELINE_PID" 2>/dev/null && wait "$BASELINE_PID" 2>/dev/null || true
  MUX_PID=""
  BASELINE_PID=""
  if [[ ${KEEP:-0} != 1 && -f $STATE/pids ]]; then
    # shellcheck disable=SC2046
    kill $(cat "$STATE/pids") 2>/dev/null || true
    rm -f "$STATE/pids"
  fi
}
trap stop_all EXIT

# serve BIN PORT LOG [SETTING...]: a pdbmux over the level's two backends with the bench's
# settings (and SETTING..., PDBMUX_*=value), in the background.
serve() {
  env -i PATH="$PATH" HOME="$STATE" PDBMUX_BACKENDS="$E2E_BACKENDS" \
    PDBMUX_LISTEN="127.0.0.1:$2" PDBMUX_METRICS_LISTEN= "${CACHE_ENV[@]}" PDBMUX_LOG_FORMAT=json \
    PDBMUX_LOG_LEVEL=warn,pdbmux::timing=debug "${@:4}" \
    "$1" serve >"$3" 2>&1 &
}
read -r -a mux_env <<<"${MUX_ENV:-}"
# What each run measures: the binaries, not the checkout (MUX_BIN may be another build).
measured="$MUX_BIN${BASELINE_BIN:+ against $BASELINE_BIN}${MUX_ENV:+ with $MUX_ENV}"

for overlap in $OVERLAPS; do
  echo "bench: $NODES nodes, $FACTS facts each, $overlap held by both: starting three PuppetDBs" >&2
  stop_all
  # The previous level's env.sh must not make e2e/run take its PuppetDBs for external ones.
  unset "${!E2E_@}"
  E2E_STATE=$STATE E2E_DB_PREFIX=pdbmux_bench E2E_PORTS=$PORTS \
    bash e2e/run --backends-only --no-fixture --no-puppetboard >"$STATE.log" 2>&1 ||
    { tail -n 30 "$STATE.log" >&2; exit 1; }
  # shellcheck disable=SC1091
  source "$STATE/env.sh"
  estate=$STATE/estate-$overlap.json
  python3 bench/latency/estate.py --backends "$E2E_BACKENDS" --union "$E2E_UNION" \
    --nodes "$NODES" --facts "$FACTS" --reports "$REPORTS" --shared "$overlap" --out "$estate"
  serve "$MUX_BIN" "$MUX_PORT" "$STATE/pdbmux.log" "${mux_env[@]}"
  MUX_PID=$!
  baseline_args=()
  if [[ -n ${BASELINE_BIN:-} ]]; then
    serve "$BASELINE_BIN" "$BASELINE_PORT" "$STATE/baseline.log"
    BASELINE_PID=$!
    baseline_args=(--baseline "http://127.0.0.1:$BASELINE_PORT")
  fi
  for port in "$MUX_PORT" ${BASELINE_BIN:+"$BASELINE_PORT"}; do
    for _ in $(seq 50); do (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break; sleep 0.1; done
  done
  echo
  echo "== $NODES nodes ($REPORTS reports each per backend), $overlap held by both, cache $CACHE ($(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet 2>/dev/null || echo '+dirty'), load average $(cut -d' ' -f1-3 /proc/loadavg); $measured)"
  python3 bench/latency/latency.py --estate "$estate" --pdbmux "http://127.0.0.1:$MUX_PORT" \
    --rounds "$ROUNDS" ${ONLY:+--only "$ONLY"} --json "$STATE/latency-$overlap.json" "${baseline_args[@]}" \
    --phases "$STATE/pdbmux.log"
done
