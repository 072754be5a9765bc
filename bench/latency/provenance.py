#!/usr/bin/env python3
"""Puppetboard's questions about pdbmux's provenance fact, through two pdbmux binaries over the
latency bench's backends, cache off, asked in interleaved rounds: the fact's page and a value's
page (`/facts/pdbmux_source[/<backend>]` in one environment), and the inventory with and without
the fact among its facts (`INVENTORY_FACTS`).

Usage: provenance.py --estate estate.json --mux-bin NEW --baseline-bin OLD [--rounds 7]

Run it on the PuppetDBs a `KEEP=1 bash bench/latency/run.sh` left running (the estate is
the `estate-<overlap>.json` estate.py wrote in bench/.state). Prints each question's median seconds through each binary, its records
and provenance records, and whether the answers agree: the fact's pages between the binaries,
and the inventory with the fact as the inventory without it plus the fact's page.

Python 3 standard library only.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request

NAMES = ["os", "kernelrelease", "networking", "puppetversion", "trusted"]
SOURCE = "pdbmux_source"
ENV = ["=", "environment", "production"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def url(path: str, query) -> str:
    return f"{path}?query={urllib.parse.quote(json.dumps(query))}"


QUESTIONS = {
    "fact page": url(f"/pdb/query/v4/facts/{SOURCE}", ENV),
    "value page": url(f"/pdb/query/v4/facts/{SOURCE}/pdb-a", ENV),
    "inventory": url("/pdb/query/v4/facts",
                     ["and", ["or"] + [["=", "name", n] for n in NAMES], ENV]),
    "inventory with the fact": url("/pdb/query/v4/facts",
                                   ["and", ["or"] + [["=", "name", n] for n in NAMES + [SOURCE]],
                                    ENV]),
}


class Mux:
    """A pdbmux over the backends with every cache TTL 0."""

    def __init__(self, binary: str, backends: str, work: str):
        port = free_port()
        self.base = f"http://127.0.0.1:{port}"
        env = {"PATH": os.environ["PATH"], "HOME": work, "PDBMUX_BACKENDS": backends,
               "PDBMUX_LISTEN": f"127.0.0.1:{port}", "PDBMUX_METRICS_LISTEN": "",
               "PDBMUX_FACTS_TTL": "0", "PDBMUX_HISTORY_TTL": "0", "PDBMUX_AGGREGATE_TTL": "0",
               "PDBMUX_LOG_LEVEL": "warn"}
        self.proc = subprocess.Popen([binary, "serve"], env=env, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while True:
            try:
                self.get(QUESTIONS["value page"])  # builds the membership map
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def get(self, target: str) -> tuple[float, list]:
        started = time.perf_counter()
        with urllib.request.urlopen(self.base + target, timeout=120) as r:
            body = r.read()
        return time.perf_counter() - started, json.loads(body)

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


def key(record: dict) -> str:
    return json.dumps(record, sort_keys=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--estate", required=True)
    ap.add_argument("--mux-bin", required=True)
    ap.add_argument("--baseline-bin", required=True)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    with open(args.estate) as f:
        estate = json.load(f)
    backends = ",".join(f"{b['name']}={b['url']}" for b in estate["backends"])
    with tempfile.TemporaryDirectory() as work:
        muxes = {"baseline": Mux(args.baseline_bin, backends, work),
                 "pdbmux": Mux(args.mux_bin, backends, work)}
        try:
            times = {(q, m): [] for q in QUESTIONS for m in muxes}
            answers = {}
            for _ in range(args.rounds):
                for q, target in QUESTIONS.items():
                    for m, mux in muxes.items():
                        seconds, answers[q, m] = mux.get(target)
                        times[q, m].append(seconds)
        finally:
            for mux in muxes.values():
                mux.close()
    print(f"{'question':26} {'baseline s':>10} {'pdbmux s':>9}  records (provenance) "
          f"baseline / pdbmux")
    for q in QUESTIONS:
        counts = []
        for m in muxes:
            rows = answers[q, m]
            counts.append(f"{len(rows)} ({sum(1 for r in rows if r.get('name') == SOURCE)})")
        print(f"{q:26} {statistics.median(times[q, 'baseline']):10.3f} "
              f"{statistics.median(times[q, 'pdbmux']):9.3f}  {' / '.join(counts)}")
    same_pages = all(sorted(map(key, answers[q, "baseline"])) == sorted(map(key, answers[q, "pdbmux"]))
                     for q in ("fact page", "value page"))
    joined = sorted(map(key, answers["inventory with the fact", "pdbmux"]))
    parts = sorted(map(key, answers["inventory", "pdbmux"] + answers["fact page", "pdbmux"]))
    print(f"the fact's pages the same through both: {same_pages}; the inventory with the fact is "
          f"the inventory and the fact's page: {joined == parts} "
          f"({args.rounds} rounds, cache off, medians)")


if __name__ == "__main__":
    main()
