#!/usr/bin/env python3
"""How long pdbmux's membership refresh takes, for two pdbmux binaries over the same PuppetDBs.

Each binary is started in turn (rounds interleaved, so a drift in the machine's load falls on
both alike) with a short `freshness_ttl`; a request that needs the membership map is sent once
the map is older than that, and the refresh it starts is read from pdbmux's own metric,
`pdbmux_membership_last_refresh_duration`. Prints the median and 90th percentile of each binary
and their ratio, and the CPU the machine's PuppetDBs and PostgreSQL spent from each refresh's
trigger to its end (every `java` and `postgres` process, so keep the machine otherwise quiet):
where the PuppetDBs share the cores, the refresh's time follows that CPU.

With `--churn N`, N nodes both backends hold receive new facts (produced now, in turn from one
backend and the other) before each refresh, as a migrating estate's agent runs do between two
refreshes: a pdbmux that learns producer times only where a shared copy changed pays for
those N then.

    refresh.py --backends pdb-a=http://127.0.0.1:19080,pdb-b=... \\
        --binary baseline=/path/to/old/pdbmux --binary current=target/release/pdbmux
"""

import argparse
import datetime as dt
import importlib.util
import itertools
import json
import os
import statistics
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

_LOADER = importlib.util.spec_from_file_location(
    "fixture_load", Path(__file__).resolve().parents[2] / "e2e" / "fixture" / "load.py")
load = importlib.util.module_from_spec(_LOADER)
_LOADER.loader.exec_module(load)

TTL_SECONDS = 1
# A request that needs the membership map (a page of /nodes may not: it is pushed down) and
# costs the backends little: its own fan-out runs beside the refresh it starts, and a heavy one
# (a whole /nodes) would weigh on the refresh's time as much as the refresh's own queries.
QUESTION = "/pdb/query/v4/nodes?query=" + urllib.parse.quote(
    json.dumps(["=", "certname", "refresh.bench.invalid"]))


def scrape(metrics: str) -> dict:
    """The samples of the Prometheus text at `metrics`, by series name."""
    with urllib.request.urlopen(metrics, timeout=10) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def backend_cpu_seconds() -> float:
    """CPU time (user and system) of every PuppetDB (`java`) and PostgreSQL process so far."""
    ticks = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        comm, rest = text[text.index("(") + 1:text.rindex(")")], text[text.rindex(")") + 2:]
        if comm in ("java", "postgres"):
            fields = rest.split()
            ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def wait_listening(url: str, deadline: float) -> None:
    while True:
        try:
            urllib.request.urlopen(url, timeout=1).read()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


class Churn:
    """New facts for `per_refresh` shared nodes before each refresh (none when 0)."""

    def __init__(self, backends: str, per_refresh: int):
        self.urls = [part.split("=", 1)[1].rstrip("/") for part in backends.split(",")]
        self.per_refresh = per_refresh
        if per_refresh == 0:
            return
        held = [set(self.certnames(url)) for url in self.urls]
        shared = sorted(set.intersection(*held))
        if not shared:
            sys.exit("--churn: no node is held by every backend")
        self.next = itertools.cycle(shared)
        self.turn = itertools.cycle(self.urls)

    @staticmethod
    def certnames(url: str) -> list[str]:
        query = urllib.parse.quote(json.dumps(["extract", ["certname"]]))
        with urllib.request.urlopen(f"{url}/pdb/query/v4/nodes?query={query}", timeout=60) as r:
            return [row["certname"] for row in json.load(r)]

    def run(self) -> None:
        """Sends this refresh's new facts and waits until the backends processed them."""
        used = set()
        for _ in range(self.per_refresh):
            certname, url = next(self.next), next(self.turn)
            with urllib.request.urlopen(f"{url}/pdb/query/v4/factsets/{certname}",
                                        timeout=60) as r:
                factset = json.load(r)
            values = {fact["name"]: fact["value"] for fact in factset["facts"]["data"]}
            now = dt.datetime.now(dt.timezone.utc).isoformat(timespec="milliseconds")
            load.submit(url, {"command": "replace_facts", "version": 5, "certname": certname,
                              "payload": {"certname": certname,
                                          "environment": factset["environment"],
                                          "producer_timestamp": now,
                                          "producer": factset.get("producer"),
                                          "values": values}})
            used.add(url)
        for url in used:
            load.wait_queue_empty(url)


def sample(binary: str, backends: str, port: int, refreshes: int,
           churn: Churn) -> tuple[list[float], list[float]]:
    """`refreshes` refresh durations of one pdbmux process, and the backends' CPU during each
    (seconds)."""
    env = {
        "PATH": os.environ["PATH"],
        "PDBMUX_BACKENDS": backends,
        "PDBMUX_LISTEN": f"127.0.0.1:{port}",
        "PDBMUX_METRICS_LISTEN": f"127.0.0.1:{port + 1}",
        "PDBMUX_FRESHNESS_TTL": f"{TTL_SECONDS}s",
        # No cache: a hit would answer /nodes without the map.
        "PDBMUX_FACTS_TTL": "0",
        "PDBMUX_LOG_LEVEL": "warn",
    }
    proc = subprocess.Popen([binary, "serve"], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    base, metrics = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{port + 1}/metrics"
    try:
        wait_listening(metrics, time.monotonic() + 30)
        took, cpu = [], []
        seen = 0.0
        while len(took) < refreshes:
            cpu_before = backend_cpu_seconds()
            urllib.request.urlopen(base + QUESTION, timeout=60).read()
            deadline = time.monotonic() + 60
            while True:
                m = scrape(metrics)
                done = m.get("pdbmux_membership_refreshes_total", 0.0)
                if done > seen:
                    seen = done
                    took.append(m["pdbmux_membership_last_refresh_duration_seconds"])
                    cpu.append(backend_cpu_seconds() - cpu_before)
                    break
                if time.monotonic() > deadline:
                    sys.exit(f"{binary}: no membership refresh within 60 s")
                time.sleep(0.05)
            before = time.monotonic()
            churn.run()
            time.sleep(max(0.0, TTL_SECONDS + 0.2 - (time.monotonic() - before)))
        return took, cpu
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", required=True, help="name=url,... (PDBMUX_BACKENDS)")
    parser.add_argument("--binary", action="append", required=True,
                        help="label=path; the first is the baseline")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--per-round", type=int, default=6, help="refreshes per process")
    parser.add_argument("--port", type=int, default=19950)
    parser.add_argument("--churn", type=int, default=0,
                        help="shared nodes given new facts before each refresh")
    args = parser.parse_args()
    churn = Churn(args.backends, args.churn)
    binaries = [b.split("=", 1) for b in args.binary]
    took = {label: [] for label, _ in binaries}
    cpu = {label: [] for label, _ in binaries}
    for _ in range(args.rounds):
        for label, path in binaries:
            # The first refresh of a process also opens its connections: left out.
            durations, spent = sample(path, args.backends, args.port, args.per_round + 1, churn)
            took[label] += durations[1:]
            cpu[label] += spent[1:]
    print(f"membership refresh over {args.backends.count('=')} backends "
          f"({args.rounds} rounds x {args.per_round} refreshes per binary, "
          f"{args.churn} shared nodes with new facts before each)")
    # CPU is counted in clock ticks per process (10 ms each): a mean over many refreshes.
    print(f"{'binary':<12} {'median ms':>10} {'p90 ms':>10} {'n':>4} {'backend CPU ms (mean)':>22}")
    medians, cpu_means = {}, {}
    for label, _ in binaries:
        values = sorted(took[label])
        medians[label] = statistics.median(values)
        cpu_means[label] = statistics.mean(cpu[label])
        p90 = values[min(len(values) - 1, int(len(values) * 0.9))]
        print(f"{label:<12} {medians[label] * 1000:>10.1f} {p90 * 1000:>10.1f} {len(values):>4} "
              f"{cpu_means[label] * 1000:>22.1f}")
    base = binaries[0][0]
    for label, _ in binaries[1:]:
        print(f"{label} / {base}: {medians[label] / medians[base]:.2f}x (median), "
              f"backend CPU {cpu_means[label] / cpu_means[base]:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
