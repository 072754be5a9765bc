# shellcheck shell=bash
# Sourced by e2e/run and e2e/demo: start Puppetboard in the background and wait until it serves.

PB_LIB_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

# pb_free_port preferred: prints a free loopback port, the preferred one when it is free (0: any).
pb_free_port() {
  python3 - "${1:-0}" <<'PY'
import socket, sys

def free(port):
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", port))
        return True
    except OSError:
        return False
    finally:
        s.close()

if int(sys.argv[1]) and free(int(sys.argv[1])):
    print(sys.argv[1])
else:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    print(s.getsockname()[1])
    s.close()
PY
}

# pb_wait_port host port pid seconds: 0 once host:port accepts a connection; 1 when the process
# exits first or the time runs out.
pb_wait_port() {
  local host=$1 port=$2 pid=$3 deadline=$((SECONDS + $4))
  while ((SECONDS < deadline)); do
    kill -0 "$pid" 2>/dev/null || return 1
    (exec 3<>"/dev/tcp/$host/$port") 2>/dev/null && return 0
    sleep 0.2
  done
  return 1
}

# pb_start_puppetboard venv pdbmux-url bind-host:port run-dir log-file
# Starts e2e/puppetboard/serve in the background (PB_PID is set to gunicorn's pid) and waits up to
# 90 s for GET /status to answer OK. Puppetboard asks pdbmux for /pdb/meta/v1/version when its
# worker boots; a worker that cannot boot makes gunicorn respawn it forever and /status never
# answers, so a failed boot in the log ends the wait early. Returns 1 (gunicorn left running; the
# caller stops PB_PID) with the log's tail on stderr when it does not come up.
pb_start_puppetboard() {
  local venv=$1 url=$2 bind=$3 run=$4 log=$5 deadline=$((SECONDS + 90))
  mkdir -p "$run"
  "$PB_LIB_DIR/serve" "$venv" "$url" "$bind" "$run" >"$log" 2>&1 </dev/null &
  PB_PID=$!
  while ((SECONDS < deadline)); do
    if [[ $(curl -s --max-time 5 "http://$bind/status" 2>/dev/null) == OK ]]; then
      return 0
    fi
    if ! kill -0 "$PB_PID" 2>/dev/null || grep -q -E 'exited with code|Worker failed to boot' "$log"; then
      break
    fi
    sleep 0.3
  done
  echo "---- Puppetboard did not come up on $bind; last 30 lines of $log ----" >&2
  tail -n 30 "$log" >&2
  return 1
}
