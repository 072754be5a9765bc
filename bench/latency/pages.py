#!/usr/bin/env python3
"""How long Puppetboard's pages take through pdbmux and straight at one PuppetDB holding the union,
as a user waits for them: the page's HTML plus the data requests its scripts make, rendered by
Puppetboard 7 (gunicorn, one worker) in front of each.

Usage: pages.py --estate estate.json --pdbmux-bin target/release/pdbmux --venv DIR
                [--rounds 8] [--json OUT]

`estate.json` is what estate.py wrote (the two backends, the union). Two Puppetboards are started
(e2e/puppetboard/serve): one in front of a pdbmux over the two backends, one in front of the
union. For each page:

- cold: pdbmux is started afresh (its cache empty; its membership map built first by one
  pinned question, as a running pdbmux has it), then the page is asked once; the union's first
  visit is timed beside it;
- warm: the page asked again at once (within every TTL), the median of `--rounds` visits.

pdbmux runs with its default configuration (every merged answer cached, refresh ahead). A
page's time is its HTML's plus each data request found in it (URLs ending in `json` in its
scripts), asked one after another as its scripts do; Puppetboard's own rendering is inside both.
Prints a table of medians and ratios (pdbmux / union), and how much of a warm page was pdbmux's
own time (its access lines: the requests Puppetboard made of it and their `ms`).

Python 3 standard library only (Puppetboard runs in the venv given).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SERVE = ROOT / "e2e" / "puppetboard" / "serve"
DATA_URL = re.compile(r"""["'](/[^"'<>\s]*?json[^"'<>\s]*)["']""")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(url: str, deadline: float) -> None:
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                r.read()
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class Board:
    """A Puppetboard in front of `api` (an http://host:port PuppetDB API)."""

    def __init__(self, venv: str, api: str, work: Path, name: str):
        self.base = f"http://127.0.0.1:{free_port()}"
        run = work / name
        run.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, PUPPETBOARD_UNRESPONSIVE_HOURS="87600")
        self.log = open(run / "gunicorn.log", "wb")
        self.proc = subprocess.Popen([str(SERVE), venv, api, self.base[len("http://"):], str(run)],
                                     env=env, stdin=subprocess.DEVNULL, stdout=self.log,
                                     stderr=subprocess.STDOUT)
        wait_for(self.base + "/status", time.monotonic() + 90)

    def visit(self, page: str) -> float:
        """Seconds for the page and its data requests, one after another."""
        started = time.perf_counter()
        with urllib.request.urlopen(self.base + page, timeout=120) as r:
            html = r.read().decode(errors="replace")
        for data in dict.fromkeys(DATA_URL.findall(html)):
            try:
                with urllib.request.urlopen(self.base + data.replace("&amp;", "&"),
                                            timeout=120) as r:
                    r.read()
            except urllib.error.HTTPError:
                pass  # a data URL the script completes itself: its refusal costs the same
        return time.perf_counter() - started

    def close(self) -> None:
        stop(self.proc)
        self.log.close()


class Mux:
    """A pdbmux over the estate's two backends, default configuration, its access lines in a
    file (to tell its own share of a page's time)."""

    def __init__(self, binary: str, backends: str, work: Path):
        port = free_port()
        self.base = f"http://127.0.0.1:{port}"
        env = {"PATH": os.environ["PATH"], "HOME": str(work), "PDBMUX_BACKENDS": backends,
               "PDBMUX_LISTEN": f"127.0.0.1:{port}", "PDBMUX_METRICS_LISTEN": "",
               "PDBMUX_LOG_LEVEL": "warn,pdbmux::access=info", "NO_COLOR": "1"}
        self.log_path = work / "pdbmux.log"
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen([binary, "serve"], env=env, stdout=self.log,
                                     stderr=subprocess.STDOUT)
        pinned = "/pdb/query/v4/nodes?query=%5B%22%3D%22%2C%22certname%22%2C%22x.invalid%22%5D"
        wait_for(self.base + pinned, time.monotonic() + 30)

    def mark(self) -> int:
        """Where its log ends now."""
        self.log.flush()
        return self.log_path.stat().st_size

    def served_since(self, mark: int) -> tuple[int, float]:
        """Requests answered since `mark`, and the seconds pdbmux spent on them (its access
        lines' `ms`)."""
        time.sleep(0.05)
        with open(self.log_path, "rb") as log:
            log.seek(mark)
            lines = log.read().decode(errors="replace").splitlines()
        took = [int(m.group(1)) for line in lines
                if (m := re.search(r" ms=(\d+) ", line)) and "pdbmux::access" in line]
        return len(took), sum(took) / 1000

    def close(self) -> None:
        stop(self.proc)
        self.log.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--estate", required=True)
    ap.add_argument("--pdbmux-bin", required=True)
    ap.add_argument("--venv", required=True, help="a virtualenv with Puppetboard 7 and gunicorn")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--json")
    args = ap.parse_args()
    estate = json.loads(Path(args.estate).read_text())
    backends = ",".join(f"{b['name']}={b['url']}" for b in estate["backends"])
    # A node both backends hold, the newer copy in the second: its page asks the owner.
    cases = estate["cases"]
    node = sorted(cases.get("newer-second") or next(iter(cases.values())))[0]
    pages = [
        ("overview, production", "/"),
        ("overview, all environments", "/%2A/"),
        ("nodes", "/%2A/nodes"),
        ("node", f"/node/{node}"),
        ("reports", "/%2A/reports"),
    ]
    work = Path(tempfile.mkdtemp(prefix="pdbmux-pages-"))
    union = Board(args.venv, estate["union"], work, "union")
    results = {}
    try:
        for name, page in pages:
            mux = Mux(args.pdbmux_bin, backends, work)
            board = Board(args.venv, mux.base, work, "pdbmux")
            try:
                cold = (board.visit(page), union.visit(page))
                warm_mux, own = [], []
                for _ in range(args.rounds):
                    mark = mux.mark()
                    warm_mux.append(board.visit(page))
                    own.append(mux.served_since(mark))
                warm_union = [union.visit(page) for _ in range(args.rounds)]
            finally:
                board.close()
                mux.close()
            results[name] = {"cold": cold,
                             "warm": (statistics.median(warm_mux), statistics.median(warm_union)),
                             "pdbmux_requests": statistics.median(n for n, _ in own),
                             "pdbmux_seconds": statistics.median(t for _, t in own)}
    finally:
        union.close()
    print(f"Puppetboard pages through pdbmux (default configuration) and straight at the union "
          f"(ms; warm: median of {args.rounds} visits)")
    print(f"{'page':<28} {'cold pdbmux':>11} {'cold U':>8} {'ratio':>6}   "
          f"{'warm pdbmux':>11} {'warm U':>8} {'ratio':>6}   {'of it pdbmux':>12}")
    warm_ratios = []
    for name, r in results.items():
        (cm, cu), (wm, wu) = r["cold"], r["warm"]
        warm_ratios.append(wm / wu)
        own = f"{r['pdbmux_seconds'] * 1000:.0f} ms/{r['pdbmux_requests']:.0f} req"
        print(f"{name:<28} {cm * 1000:>11.0f} {cu * 1000:>8.0f} {cm / cu:>6.2f}   "
              f"{wm * 1000:>11.0f} {wu * 1000:>8.0f} {wm / wu:>6.2f}   {own:>12}")
    geo = statistics.geometric_mean(warm_ratios)
    print(f"warm geometric mean: {geo:.2f}x the union")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
