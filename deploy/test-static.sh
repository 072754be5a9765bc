#!/usr/bin/env bash
# Checks that a pdbmux binary is fully static and resolves upstream host names without NSS modules.
#
# Usage: deploy/test-static.sh [binary]   (default dist/pdbmux; needs root for chroot)
#
# 1. `file` and `ldd` must call it statically linked (no interpreter, no shared libraries).
# 2. It is run with chroot, as uid 65532, in an otherwise empty root holding only the binary and
#    an /etc/hosts (no libc, no NSS modules, no nsswitch.conf, no resolv.conf: what a scratch image
#    holds before the container runtime adds its own /etc/hosts). Its backend is a stub PuppetDB
#    (python3, on loopback) addressed by a host name that only that /etc/hosts maps, and /healthz
#    must report it reachable. A second backend with a name that resolves nowhere must be reported
#    unreachable with a DNS error, so the check can tell resolution from luck.
# 3. The same again with the image's /etc/nsswitch.conf ("hosts: files dns") in the root.
# 4. DNS: a root with only /etc/resolv.conf (and nsswitch.conf) pointing at a stub DNS server on
#    127.53.0.1:53, and a backend host name only that server knows, as in a Kubernetes pod where
#    Service names come from the cluster DNS.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN=${1:-$ROOT/dist/pdbmux}
[[ -x $BIN ]] || { echo "test-static: $BIN is not an executable (run make build)" >&2; exit 1; }
BIN=$(realpath "$BIN")

say() { printf '[test-static] %s\n' "$*" >&2; }
fail() { say "FAIL: $*"; exit 1; }

# ---- 1. statically linked ----
desc=$(file -b "$BIN")
say "file: $desc"
[[ $desc == *"statically linked"* || $desc == *"static-pie linked"* ]] || fail "file does not call it static"
[[ $desc != *"interpreter"* ]] || fail "it names a dynamic loader"
ldd_out=$(ldd "$BIN" 2>&1 || true)
say "ldd: $ldd_out"
[[ $ldd_out == *"not a dynamic executable"* || $ldd_out == *"statically linked"* ]] ||
  fail "ldd lists shared libraries"

# ---- 2./3. host names from /etc/hosts in a bare root ----
[[ $(id -u) == 0 ]] || fail "needs root (chroot)"
command -v python3 >/dev/null || fail "needs python3 (the stub backend)"
command -v curl >/dev/null || fail "needs curl"
CHROOT=$(command -v chroot) || fail "needs chroot"

WORK=$(mktemp -d)
STUB_PID=""
DNS_PID=""
PDBMUX_PID=""
cleanup() {
  [[ -z $PDBMUX_PID ]] || kill "$PDBMUX_PID" 2>/dev/null || true
  [[ -z $STUB_PID ]] || kill "$STUB_PID" 2>/dev/null || true
  [[ -z $DNS_PID ]] || kill "$DNS_PID" 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# A stub PuppetDB: every GET answers PuppetDB's version document.
STUB_PORT=$(free_port)
python3 - "$STUB_PORT" >"$WORK/stub.log" 2>&1 <<'PY' &
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        body = b'{"version":"7.12.1"}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
PY
STUB_PID=$!
for _ in $(seq 50); do curl -fsS "http://127.0.0.1:$STUB_PORT/" >/dev/null 2>&1 && break; sleep 0.1; done
curl -fsS "http://127.0.0.1:$STUB_PORT/" >/dev/null || fail "stub backend did not start"

# A stub DNS server on 127.53.0.1:53: A records for one name (127.0.0.1), NXDOMAIN for others.
python3 - "$WORK/dns.ready" >"$WORK/dns.log" 2>&1 <<'PY' &
import socket, struct, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("127.53.0.1", 53))
open(sys.argv[1], "w").close()
while True:
    data, peer = s.recvfrom(512)
    tid = struct.unpack(">H", data[:2])[0]
    i, labels = 12, []
    while data[i]:
        labels.append(data[i + 1:i + 1 + data[i]].decode().lower())
        i += data[i] + 1
    qtype = struct.unpack(">H", data[i + 1:i + 3])[0]
    question = data[12:i + 5]
    known = ".".join(labels) == "pdb-dns.test"
    answers = b""
    if known and qtype == 1:
        answers = b"\xc0\x0c" + struct.pack(">HHIH", 1, 1, 30, 4) + socket.inet_aton("127.0.0.1")
    header = struct.pack(">HHHHHH", tid, 0x8180 | (0 if known else 3), 1, 1 if answers else 0, 0, 0)
    s.sendto(header + question + answers, peer)
PY
DNS_PID=$!
for _ in $(seq 50); do [[ -e $WORK/dns.ready ]] && break; sleep 0.1; done
[[ -e $WORK/dns.ready ]] || { cat "$WORK/dns.log" >&2; fail "stub DNS server did not start"; }

run_case() { # label host files...: files are hosts, nsswitch, resolv
  local label=$1 host=$2 root port health code f
  shift 2
  root=$WORK/root-$label
  mkdir -p "$root/etc"
  cp "$BIN" "$root/pdbmux"
  for f in "$@"; do
    case $f in
      hosts) printf '127.0.0.1\tlocalhost\n127.0.0.1\tpdb-a.test\n' >"$root/etc/hosts" ;;
      nsswitch) printf 'hosts: files dns\n' >"$root/etc/nsswitch.conf" ;;
      resolv) printf 'nameserver 127.53.0.1\noptions timeout:1 attempts:2\n' >"$root/etc/resolv.conf" ;;
    esac
  done
  say "$label: root holds $(cd "$root" && find . -type f | sort | tr '\n' ' ')"
  port=$(free_port)
  env -i PDBMUX_LISTEN="127.0.0.1:$port" PDBMUX_METRICS_LISTEN= \
    PDBMUX_BACKENDS="pdb-a=http://$host:$STUB_PORT,nowhere=http://pdbmux-no-such-host.invalid:$STUB_PORT" \
    PDBMUX_HEALTH_PROBE_ENABLED=false PDBMUX_TIMEOUT=5s \
    "$CHROOT" --userspec=65532:65532 "$root" /pdbmux >"$WORK/$label.log" 2>&1 &
  PDBMUX_PID=$!
  for _ in $(seq 100); do
    curl -sS -o /dev/null "http://127.0.0.1:$port/healthz" 2>/dev/null && break
    kill -0 "$PDBMUX_PID" 2>/dev/null || { cat "$WORK/$label.log" >&2; fail "$label: pdbmux exited"; }
    sleep 0.1
  done
  code=$(curl -sS -o "$WORK/$label.healthz" -w '%{http_code}' "http://127.0.0.1:$port/healthz")
  health=$(cat "$WORK/$label.healthz")
  say "$label: /healthz $code ${health:0:120}…"
  python3 - "$WORK/$label.healthz" "$host" <<'PY' || { cat "$WORK/$label.log" >&2; fail "$label: host name resolution"; }
import json, re, sys
h = json.load(open(sys.argv[1]))
b = {x["name"]: x for x in h["backends"]}
assert b["pdb-a"]["reachable"] is True, f"{sys.argv[2]} not reachable: {b['pdb-a']['error']}"
assert b["nowhere"]["reachable"] is False, "a name nobody knows was reachable"
assert re.search(r"dns|lookup|resolution", b["nowhere"]["error"], re.I), b["nowhere"]["error"]
assert h["status"] == "degraded", h["status"]
print(f"  {sys.argv[2]} reachable; unknown name refused: {b['nowhere']['error']}", file=sys.stderr)
PY
  [[ $code == 200 ]] || fail "$label: /healthz answered $code"
  kill "$PDBMUX_PID"
  wait "$PDBMUX_PID" 2>/dev/null || true
  PDBMUX_PID=""
  say "$label: ok"
}

run_case hosts-only pdb-a.test hosts
run_case hosts-nsswitch pdb-a.test hosts nsswitch
run_case dns pdb-dns.test resolv nsswitch
say "ok: $BIN is static and resolves host names (/etc/hosts and DNS) without NSS modules"
