#!/usr/bin/env bash
# The image test (docs/decisions.md D13): containers cannot run in this sandbox, so the image's own
# binary is run from the mounted image root (`podman image mount` + `chroot`, as uid 65532 like the
# image's USER) against the e2e PuppetDBs on loopback.
#
# Usage: deploy/test-image.sh <image:tag> <version>      (`make image-test`; needs root and podman)
#
#  1. metadata: USER 65532, EXPOSE 8080/tcp and 9180/tcp (metrics), ENTRYPOINT the binary, the version label;
#  2. contents: exactly the binary, the CA bundle, passwd, group and nsswitch.conf (no shell);
#  3. `pdbmux version` prints "pdbmux <version>", the version the image is tagged with;
#  4. the binary is static and resolves host names without NSS modules (deploy/test-static.sh);
#  5. backends: the PuppetDBs of e2e/.state/env.sh when they answer, else `bash e2e/run
#     --backends-only` starts and loads them (and this script stops them again at the end unless
#     IMAGE_TEST_KEEP=1);
#  6. env-only run in the image root as it is: PDBMUX_BACKENDS only; /healthz is 200 "ok" with
#     every backend reachable, and /pdb/query/v4/nodes is the fixture's active nodes, merged
#     (X-Backends 2/2, each node from a backend that holds it active);
#  7. file-only run in a copy of the image root plus what Kubernetes would add: /etc/hosts with the
#     backends' host names (hostAliases), /etc/pdbmux/config.yaml (the ConfigMap) and the TLS
#     client files (a Secret); no PDBMUX_* variable at all, the second backend over https with a
#     client certificate when the harness has its TLS port. Same checks as 6.
set -Eeuo pipefail

IMAGE=${1:?usage: $0 <image:tag> <version>}
VERSION=${2:?usage: $0 <image:tag> <version>}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PODMAN=(podman --storage-driver vfs)
STATE=${E2E_STATE:-$ROOT/e2e/.state}
T0=$SECONDS

say() { printf '[image-test %4ss] %s\n' "$((SECONDS - T0))" "$*" >&2; }
fail() { say "FAIL: $*"; exit 1; }

[[ $(id -u) == 0 ]] || fail "needs root (podman image mount, chroot)"
command -v podman >/dev/null || fail "podman is not installed (make image installs it)"
for tool in curl python3 chroot; do command -v "$tool" >/dev/null || fail "needs $tool"; done
CHROOT=$(command -v chroot)
"${PODMAN[@]}" image exists "$IMAGE" || fail "no image $IMAGE: run make image"

WORK=$(mktemp -d)
MNT=""
PIDS=()
STARTED_BACKENDS=0
cleanup() {
  local rc=$? pid
  set +e
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; done
  [[ -z $MNT ]] || "${PODMAN[@]}" image unmount "$IMAGE" >/dev/null
  if [[ $STARTED_BACKENDS == 1 && ${IMAGE_TEST_KEEP:-0} != 1 ]]; then stop_backends; fi
  rm -rf "$WORK"
  if [[ $rc == 0 ]]; then say "ok: $IMAGE"; else say "FAILED (exit $rc)"; fi
  exit "$rc"
}
trap cleanup EXIT
trap 'say "ERROR: \"$BASH_COMMAND\" failed (exit $?, line $LINENO)"' ERR

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# ---- 1. metadata ----
"${PODMAN[@]}" image inspect "$IMAGE" >"$WORK/inspect.json"
python3 - "$WORK/inspect.json" "$VERSION" <<'PY' || fail "image metadata"
import json, sys
config = json.load(open(sys.argv[1]))[0]["Config"]
checks = {
    "User": (config.get("User"), "65532:65532"),
    "ExposedPorts": (sorted(config.get("ExposedPorts") or {}), ["8080/tcp", "9180/tcp"]),
    "Entrypoint": (config.get("Entrypoint"), ["/usr/local/bin/pdbmux"]),
    "Cmd": (config.get("Cmd"), None),
    "version label": ((config.get("Labels") or {}).get("org.opencontainers.image.version"), sys.argv[2]),
}
bad = {k: v for k, v in checks.items() if v[0] != v[1]}
for k, (got, want) in checks.items():
    print(f"  {k}: {got!r}" + (f" (want {want!r})" if k in bad else ""), file=sys.stderr)
sys.exit(1 if bad else 0)
PY
say "metadata ok"

# ---- 2. contents ----
MNT=$("${PODMAN[@]}" image mount "$IMAGE")
say "mounted $IMAGE at $MNT"
contents=$(cd "$MNT" && find . -not -type d | sort | tr '\n' ' ')
say "files: $contents"
want="./etc/group ./etc/nsswitch.conf ./etc/passwd ./etc/ssl/certs/ca-certificates.crt ./usr/local/bin/pdbmux "
[[ $contents == "$want" ]] || fail "image files differ from: $want"
certs=$(grep -c 'BEGIN CERTIFICATE' "$MNT/etc/ssl/certs/ca-certificates.crt")
((certs > 0)) || fail "the CA bundle holds no certificate"
say "contents ok ($certs CA certificates, no shell)"

# ---- 3. version ----
got=$(env -i "$CHROOT" --userspec=65532:65532 "$MNT" /usr/local/bin/pdbmux version)
say "pdbmux version: $got"
[[ $got == "pdbmux $VERSION" ]] || fail "pdbmux version printed '$got', the image is tagged $VERSION"

# ---- 4. static, name resolution ----
bash "$ROOT/deploy/test-static.sh" "$MNT/usr/local/bin/pdbmux" 2>&1 | sed 's/^/  /' >&2 ||
  fail "static binary check"
say "static and resolution ok"

# ---- 5. backends ----
backends_up() { # every backend of E2E_BACKENDS answers /pdb/meta/v1/version
  local entry
  [[ -n ${E2E_BACKENDS:-} && -f ${E2E_FIXTURE:-/nonexistent} ]] || return 1
  for entry in ${E2E_BACKENDS//,/ }; do
    curl -fsS -m 5 -o /dev/null "${entry#*=}/pdb/meta/v1/version" 2>/dev/null || return 1
  done
}
stop_backends() { # what e2e/run --backends-only started for this test: its PuppetDBs and PostgreSQL
  local pid pg i alive ours=()
  if [[ -f $STATE/pids ]]; then
    while read -r pid; do
      if [[ -r /proc/$pid/cmdline ]] && tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q -- "--config $STATE/"; then
        kill "$pid" && ours+=("$pid")
      fi
    done <"$STATE/pids"
    for ((i = 0; i < 150; i++)); do # up to 30 s, then KILL
      alive=0
      for pid in "${ours[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
      ((alive)) || break
      sleep 0.2
    done
    for pid in "${ours[@]}"; do kill -0 "$pid" 2>/dev/null && kill -KILL "$pid"; done
    say "stopped the PuppetDBs e2e/run started (pids ${ours[*]})"
    rm -f "$STATE/pids" "$STATE/env.sh"
  fi
  if [[ $PG_WAS_STARTED == 0 && -f $STATE/pg-started ]]; then
    read -r -a pg <"$STATE/pg-started"
    pg_ctlcluster --skip-systemctl-redirect "${pg[0]}" "${pg[1]}" stop -m fast && say "stopped PostgreSQL ${pg[*]}"
    rm -f "$STATE/pg-started"
  fi
}
PG_WAS_STARTED=0
[[ ! -f $STATE/pg-started ]] || PG_WAS_STARTED=1
if [[ -z ${E2E_BACKENDS:-} && -f $STATE/env.sh ]]; then
  # shellcheck disable=SC1091
  source "$STATE/env.sh"
fi
E2E_FIXTURE=${E2E_FIXTURE:-$STATE/fixture.json}
if backends_up; then
  say "using the running PuppetDBs: $E2E_BACKENDS"
else
  say "PuppetDBs are down: bash e2e/run --backends-only"
  unset E2E_BACKENDS E2E_TLS_URL E2E_TLS_CA E2E_TLS_CERT E2E_TLS_KEY
  STARTED_BACKENDS=1
  bash "$ROOT/e2e/run" --backends-only >"$WORK/e2e-run.log" 2>&1 || { tail -n 30 "$WORK/e2e-run.log" >&2; fail "e2e/run --backends-only"; }
  # shellcheck disable=SC1091
  source "$STATE/env.sh"
  backends_up || fail "the PuppetDBs e2e/run started do not answer"
  say "started and loaded: $E2E_BACKENDS"
fi

# ---- 6./7. runs ----
# check_run label port: /healthz and /nodes of a pdbmux listening on 127.0.0.1:port
check_run() {
  local label=$1 port=$2 log=$3 i code
  for i in $(seq 100); do
    curl -s -o /dev/null "http://127.0.0.1:$port/healthz" && break
    kill -0 "${PIDS[-1]}" 2>/dev/null || { cat "$log" >&2; fail "$label: pdbmux exited"; }
    sleep 0.1
  done
  code=$(curl -sS -o "$WORK/$label.healthz" -w '%{http_code}' "http://127.0.0.1:$port/healthz")
  say "$label: /healthz $code $(head -c 300 "$WORK/$label.healthz")…"
  [[ $code == 200 ]] || { cat "$log" >&2; fail "$label: /healthz answered $code"; }
  code=$(curl -sS -D "$WORK/$label.nodes.headers" -o "$WORK/$label.nodes" -w '%{http_code}' \
    "http://127.0.0.1:$port/pdb/query/v4/nodes")
  [[ $code == 200 ]] || { cat "$log" >&2; fail "$label: /pdb/query/v4/nodes answered $code"; }
  python3 - "$WORK/$label.healthz" "$WORK/$label.nodes" "$WORK/$label.nodes.headers" "$E2E_FIXTURE" <<'PY' ||
import json, sys
health, nodes, headers, fixture = (open(p).read() for p in sys.argv[1:5])
health, nodes, fixture = json.loads(health), json.loads(nodes), json.loads(fixture)
names = [b["name"] for b in health["backends"]]
assert health["status"] == "ok", f"/healthz status {health['status']}"
assert all(b["reachable"] for b in health["backends"]), health["backends"]
x_backends = [l.split(":", 1)[1].strip() for l in headers.splitlines() if l.lower().startswith("x-backends:")]
assert x_backends == [f"{len(names)}/{len(names)}"], f"X-Backends {x_backends}"
active = {c: {b for b, s in n["backends"].items() if s["active"]} for c, n in fixture["nodes"].items()}
want = sorted(c for c, holders in active.items() if holders)
got = sorted(n["certname"] for n in nodes)
assert got == want, f"/nodes certnames {got}, the fixture's active nodes {want}"
for n in nodes:
    assert n["pdbmux_source"] in active[n["certname"]], f"{n['certname']} from {n['pdbmux_source']}"
both = sum(1 for h in active.values() if len(h) > 1)
print(f"  /healthz ok, {len(names)} backends reachable; /nodes: {len(got)} active nodes merged "
      f"({both} held by both), X-Backends {x_backends[0]}", file=sys.stderr)
PY
    { cat "$log" >&2; fail "$label: merged answer"; }
  say "$label: ok"
}

# 6. env only, the image root as it is
port=$(free_port)
env -i PDBMUX_BACKENDS="$E2E_BACKENDS" PDBMUX_LISTEN="127.0.0.1:$port" PDBMUX_METRICS_LISTEN= \
  "$CHROOT" --userspec=65532:65532 "$MNT" /usr/local/bin/pdbmux >"$WORK/env.log" 2>&1 &
PIDS+=($!)
check_run env-config "$port" "$WORK/env.log"
grep -q 'config=none' "$WORK/env.log" || fail "env-config: a config file was read: $(grep 'pdbmux serving' "$WORK/env.log")"

# 7. the mounted config file, host names from /etc/hosts, TLS client files
root2=$WORK/root
cp -a "$MNT/." "$root2"
mkdir -p "$root2/etc/pdbmux/tls"
hosts="127.0.0.1\tlocalhost\n"
config="listen: \"127.0.0.1:$(free_port)\"\nbackends:\n"
i=0
for entry in ${E2E_BACKENDS//,/ }; do
  name=${entry%%=*} url=${entry#*=}
  hostport=${url#*://}
  port_n=${hostport##*:}
  if ((i == 1)) && [[ -n ${E2E_TLS_URL:-} ]]; then
    # the second backend's TLS port (certificate for 127.0.0.1/localhost, client certificate required)
    cp "$E2E_TLS_CA" "$root2/etc/pdbmux/tls/ca.pem"
    cp "$E2E_TLS_CERT" "$root2/etc/pdbmux/tls/client.pem"
    cp "$E2E_TLS_KEY" "$root2/etc/pdbmux/tls/client.key"
    config+="  - name: $name\n    url: https://localhost:${E2E_TLS_URL##*:}\n"
    config+="    tls_ca_file: /etc/pdbmux/tls/ca.pem\n    tls_cert_file: /etc/pdbmux/tls/client.pem\n"
    config+="    tls_key_file: /etc/pdbmux/tls/client.key\n"
  else
    hosts+="127.0.0.1\t$name.pdbmux-image.test\n"
    config+="  - name: $name\n    url: http://$name.pdbmux-image.test:$port_n\n"
  fi
  i=$((i + 1))
done
printf '%b' "$hosts" >"$root2/etc/hosts"
printf '%b' "$config" >"$root2/etc/pdbmux/config.yaml"
chmod -R a+rX "$root2/etc/pdbmux"
say "file-config: /etc/pdbmux/config.yaml:"$'\n'"$(sed 's/^/    /' "$root2/etc/pdbmux/config.yaml")"
port=$(sed -n 's/^listen: "127.0.0.1:\([0-9]*\)"/\1/p' "$root2/etc/pdbmux/config.yaml")
env -i "$CHROOT" --userspec=65532:65532 "$root2" /usr/local/bin/pdbmux >"$WORK/file.log" 2>&1 &
PIDS+=($!)
check_run file-config "$port" "$WORK/file.log"
grep -q 'config=/etc/pdbmux/config.yaml' "$WORK/file.log" ||
  fail "file-config: /etc/pdbmux/config.yaml was not read: $(grep 'pdbmux serving' "$WORK/file.log")"
say "all checks passed in $((SECONDS - T0))s"
