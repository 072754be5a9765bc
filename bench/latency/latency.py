#!/usr/bin/env python3
"""Latency of Puppetboard's questions: pdbmux over two PuppetDBs against each alone and a third
holding the union, measured in one run.

Usage: latency.py --estate estate.json --pdbmux URL [--rounds 15] [--only NAME,...]
                  [--phases LOG] [--json OUT]

`estate.json` is what estate.py wrote (the two backends, the union, and which certnames exercise
which case). pdbmux must run over the two backends with its cache off (PDBMUX_FACTS_TTL=0), so
every answer is a fan-out; bench/latency/run.sh starts it so.

Each question is asked of every target once per round, targets in a rotating order, over one
keep-alive connection per target; the figure is the median of the rounds. Before timing, each
question is asked once of pdbmux and of the union and their answers compared (JSON, receipt times
and pdbmux_source removed; arrays of records compared as sets when the question does not order,
and as the same order keys with the same records among equal keys when it does), and their
X-Records: the `same` column. Printed per question: the medians (ms), `both` (the two backends asked at the same
moment, until the slower answers: the fan-out's floor when they share this machine's cores), the
slower backend's, and pdbmux's ratio to the slower backend, to the union and to `both`; then the
geometric means of the ratios.

With `--phases LOG` (pdbmux's JSON log with `pdbmux::timing=debug`), a second table says where
pdbmux's time went per question, medians over the requests it logged for that target: planning,
waiting in the estate, the slowest upstream call (the fan-out's floor), the core's own work on
the answers (parsing, merging), pdbmux's total, and what the client saw beyond it (writing the
response, the client's own reading).

Python 3 standard library only.
"""

from __future__ import annotations

import argparse
import http.client
import json
import math
import statistics
import sys
import threading
import time
import urllib.parse

# Fields each PuppetDB stamps itself on receipt: never equal between two servers.
RECEIPT_TIMES = {"timestamp", "facts_timestamp", "catalog_timestamp", "receive_time",
                 "report_receive_time"}
PDBMUX_ADDED = {"pdbmux_source"}


def questions(estate: dict) -> list[tuple[str, str, dict]]:
    """(name, path, params) for the pages Puppetboard shows, production environment."""
    env = "production"
    cases = estate["cases"]
    shared = next(c for c in cases.get("newer-second", []) if ".production." in c)
    own = next(c for c in cases.get("first-only", []) if ".production." in c)
    day_start = estate["loaded_at"][:10] + "T00:00:00.000000Z"
    day_end = estate["loaded_at"][:10] + "T23:59:59.999999Z"
    q = json.dumps
    in_env = ["and", ["=", "environment", env]]
    return [
        ("overview: node count", "/pdb/query/v4/nodes",
         {"query": q(["extract", [["function", "count"]], ["and", ["=", "catalog_environment", env]]])}),
        ("overview: resource count", "/pdb/query/v4/resources",
         {"query": q(["extract", [["function", "count"]], ["=", "environment", env]])}),
        ("overview: nodes", "/pdb/query/v4/nodes",
         {"query": q(["and", ["=", "catalog_environment", env]])}),
        ("overview: latest event-counts", "/pdb/query/v4/event-counts",
         {"query": q(["=", "latest_report?", True]), "summarize_by": "certname"}),
        ("nodes (all)", "/pdb/query/v4/nodes", {}),
        ("facts (all)", "/pdb/query/v4/facts", {}),
        ("facts: name osfamily", "/pdb/query/v4/facts", {"query": q(["=", "name", "osfamily"])}),
        ("node page: shared node", f"/pdb/query/v4/nodes/{shared}", {}),
        ("node page: facts of a shared node", "/pdb/query/v4/facts",
         {"query": q(["and", ["=", "certname", shared], ["=", "environment", env]])}),
        ("node page: facts of an own node", "/pdb/query/v4/facts",
         {"query": q(["and", ["=", "certname", own], ["=", "environment", env]])}),
        ("node page: reports", "/pdb/query/v4/reports",
         {"query": q(["and", ["=", "environment", env], ["=", "certname", shared]]),
          "order_by": q([{"field": "end_time", "order": "desc"}]), "limit": "10",
          "include_total": "true", "offset": "0"}),
        ("reports page", "/pdb/query/v4/reports",
         {"query": q(in_env), "order_by": q([{"field": "end_time", "order": "desc"}]),
          "limit": "10", "include_total": "true", "offset": "0"}),
        ("reports: 100 with a total", "/pdb/query/v4/reports",
         {"query": q(in_env), "order_by": q([{"field": "end_time", "order": "desc"}]),
          "limit": "100", "include_total": "true"}),
        ("reports: count by status", "/pdb/query/v4/reports",
         {"query": q(["extract", [["function", "count"], "status"], ["=", "environment", env],
                      ["group_by", "status"]])}),
        ("reports page 5", "/pdb/query/v4/reports",
         {"query": q(in_env), "order_by": q([{"field": "end_time", "order": "desc"}]),
          "limit": "10", "include_total": "true", "offset": "40"}),
        # What exact paging asks each backend for page 5 (offset + limit, no offset): its `both`
        # column is page 5's floor when every backend must serialize the window's candidates.
        ("reports: first 50 with a total", "/pdb/query/v4/reports",
         {"query": q(in_env), "order_by": q([{"field": "end_time", "order": "desc"}]),
          "limit": "50", "include_total": "true", "offset": "0"}),
        ("daily chart: one day", "/pdb/query/v4/reports",
         {"query": q(["extract", [["function", "count"], "status"],
                      ["and", [">=", "producer_timestamp", day_start],
                       ["<", "producer_timestamp", day_end], ["=", "environment", env]],
                      ["group_by", "status"]])}),
        ("fact page: kernelrelease", "/pdb/query/v4/facts/kernelrelease", {"query": q(in_env)}),
        ("fact value page: osfamily Debian", "/pdb/query/v4/facts/osfamily",
         {"query": q(["and", ["=", "environment", env], ["=", "value", "Debian"]])}),
        ("facts page: fact-names", "/pdb/query/v4/fact-names", {}),
        ("inventory page", "/pdb/query/v4/facts",
         {"query": q(["and", ["or", ["=", "name", "os"], ["=", "name", "kernelrelease"],
                              ["=", "name", "networking"], ["=", "name", "puppetversion"],
                              ["=", "name", "trusted"]], ["=", "environment", env]])}),
        ("catalogs page: nodes with total", "/pdb/query/v4/nodes",
         {"query": q(["and", ["=", "catalog_environment", env], ["null?", "catalog_timestamp", False]]),
          "order_by": q([{"field": "certname", "order": "asc"}]), "limit": "100", "offset": "0",
          "include_total": "true"}),
        ("failures page", "/pdb/query/v4/nodes",
         {"query": q(["and", ["=", "latest_report_status", "failed"], ["=", "catalog_environment", env]])}),
        ("environments", "/pdb/query/v4/environments", {}),
        # The same question as PQL on the root endpoint and as an AST on its route: pdbmux's
        # PQL costs its AST once the translation is kept.
        ("PQL: nodes in environment", "/pdb/query/v4",
         {"query": f'nodes[certname] {{ catalog_environment = "{env}" }}'}),
        ("AST: nodes in environment", "/pdb/query/v4/nodes",
         {"query": q(["extract", ["certname"], ["=", "catalog_environment", env]])}),
    ]


class Target:
    def __init__(self, name: str, url: str):
        self.name = name
        parsed = urllib.parse.urlsplit(url)
        self.host, self.port = parsed.hostname, parsed.port or 80
        self.conn = http.client.HTTPConnection(self.host, self.port, timeout=120)

    def get(self, path: str, params: dict) -> tuple[int, dict, bytes, float]:
        target = target_of(path, params)
        for attempt in (0, 1):
            try:
                started = time.perf_counter()
                self.conn.request("GET", target)
                response = self.conn.getresponse()
                body = response.read()
                elapsed = time.perf_counter() - started
                return response.status, dict(response.getheaders()), body, elapsed
            except (http.client.HTTPException, OSError):
                self.conn.close()
                self.conn = http.client.HTTPConnection(self.host, self.port, timeout=120)
                if attempt:
                    raise
        raise AssertionError("unreachable")


def normalise(value):
    if isinstance(value, dict):
        return {k: normalise(v) for k, v in value.items()
                if k not in RECEIPT_TIMES and k not in PDBMUX_ADDED}
    if isinstance(value, list):
        return [normalise(v) for v in value]
    return value


def same_answer(params: dict, a: bytes, b: bytes) -> bool:
    x, y = normalise(json.loads(a)), normalise(json.loads(b))
    if isinstance(x, list):
        # pdbmux's synthetic provenance fact and its name on /fact-names are documented additions.
        x = [r for r in x if r != "pdbmux_source" and
             not (isinstance(r, dict) and r.get("name") == "pdbmux_source")]
    if not (isinstance(x, list) and isinstance(y, list)):
        return x == y
    key = lambda r: json.dumps(r, sort_keys=True)
    if "order_by" not in params:
        return sorted(x, key=key) == sorted(y, key=key)
    return same_ordered_window(json.loads(params["order_by"]), x, y)


def same_ordered_window(order_by: list, x: list, y: list) -> bool:
    """Two windows of one ordered answer: the same order keys in the same order, and the same
    records among each run of equal keys, except the first and last runs, which the window may
    cut (any member of a run of ties is a valid record to find at the window's edge)."""
    fields = [o["field"] for o in order_by]
    order_key = lambda r: json.dumps([r.get(f) if isinstance(r, dict) else r for f in fields])
    if [order_key(r) for r in x] != [order_key(r) for r in y]:
        return False
    runs = lambda rows: [[json.dumps(r, sort_keys=True) for r in rows if order_key(r) == k]
                         for k in dict.fromkeys(order_key(r) for r in rows)]
    rx, ry = runs(x), runs(y)
    return all(sorted(p) == sorted(q) for p, q in list(zip(rx, ry))[1:-1])


# The column of both backends asked at once.
FLOOR = "both"


def both_at_once(pairs: list, path: str, params: dict) -> float:
    """Seconds until every backend in `pairs` answered `path`, all asked at the same moment."""
    done = []
    threads = [threading.Thread(target=lambda t=t: done.append(t.get(path, params)))
               for t in pairs]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.perf_counter() - started


def target_of(path: str, params: dict) -> str:
    return path + ("?" + urllib.parse.urlencode(params) if params else "")


def print_phases(log: str, qs: list, rows: list) -> None:
    """The per-phase table from pdbmux's `pdbmux::timing` lines (see the module doc)."""
    by_target: dict[str, list[dict]] = {}
    with open(log) as f:
        for line in f:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            fields = event.get("fields", {})
            if event.get("target") == "pdbmux::timing" and "total_us" in fields:
                by_target.setdefault(fields["target"], []).append(fields)
    print()
    print(f"{'where pdbmux spends it (ms)':36s} {'plan':>6s} {'wait':>6s} {'upstream':>9s} "
          f"{'core':>6s} {'total':>7s} {'client':>7s} {'calls':>5s}")
    for (name, path, params), row in zip(qs, rows):
        lines = by_target.get(target_of(path, params), [])
        if not lines:
            print(f"{name[:36]:36s} (no timing lines)")
            continue
        med = lambda xs: statistics.median(xs) / 1000
        slowest = []
        calls = []
        for fields in lines:
            upstream = [int(part.rsplit(":", 1)[1]) for part in fields["upstream_us"].split()]
            slowest.append(max(upstream, default=0))
            calls.append(len(upstream))
        total = med([f["total_us"] for f in lines])
        print(f"{name[:36]:36s} {med([f['plan_us'] for f in lines]):6.2f} "
              f"{med([f['wait_us'] for f in lines]):6.2f} {med(slowest):9.2f} "
              f"{med([f['core_us'] for f in lines]):6.2f} {total:7.2f} "
              f"{row['median_ms']['pdbmux'] - total:7.2f} {statistics.median(calls):5.0f}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--estate", required=True)
    ap.add_argument("--pdbmux", required=True, help="pdbmux's base URL")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--only", help="comma-separated question name prefixes")
    ap.add_argument("--json", help="write the medians here")
    ap.add_argument("--phases", help="pdbmux's JSON log, for the per-phase table")
    ap.add_argument("--baseline", help="another pdbmux's base URL (an earlier build, same "
                    "settings), asked in the same rounds: pdbmux's ratio to it")
    args = ap.parse_args()
    estate = json.load(open(args.estate))
    targets = [Target("pdbmux", args.pdbmux)]
    targets += [Target(b["name"], b["url"]) for b in estate["backends"]]
    targets.append(Target("union", estate["union"]))
    if args.baseline:
        targets.append(Target("baseline", args.baseline))
    qs = questions(estate)
    # The fan-out's floor on this machine: both backends asked the same question at once, each
    # over its own connection, timed until the slower answers (what pdbmux cannot beat when the
    # backends share the machine's cores).
    pairs = [Target(b["name"], b["url"]) for b in estate["backends"]]
    if args.only:
        wanted = args.only.split(",")
        qs = [x for x in qs if any(x[0].startswith(w) for w in wanted)]

    rows = []
    for name, path, params in qs:
        answers = {}
        for t in targets:
            status, headers, body, _ = t.get(path, params)
            answers[t.name] = (status, headers, body)
        (ps, ph, pb), (us, uh, ub) = answers["pdbmux"], answers["union"]
        same = ps == us == 200 and same_answer(params, pb, ub)
        records = lambda h: next((v for k, v in h.items() if k.lower() == "x-records"), None)
        total_same = records(ph) == records(uh)
        times = {t.name: [] for t in targets}
        times[FLOOR] = []
        for r in range(args.rounds):
            order = targets[r % len(targets):] + targets[:r % len(targets)] + [FLOOR]
            for t in order:
                if t is FLOOR:
                    times[FLOOR].append(both_at_once(pairs, path, params) * 1000)
                    continue
                status, _, _, elapsed = t.get(path, params)
                if status != 200:
                    print(f"latency.py: {name}: {t.name} answered {status}", file=sys.stderr)
                times[t.name].append(elapsed * 1000)
        med = {k: statistics.median(v) for k, v in times.items()}
        backends = [b["name"] for b in estate["backends"]]
        slower = max(med[b] for b in backends)
        rows.append({"question": name, "median_ms": med, "slower_backend_ms": slower,
                     "vs_slower": med["pdbmux"] / slower, "vs_union": med["pdbmux"] / med["union"],
                     "vs_floor": med["pdbmux"] / med[FLOOR],
                     **({"vs_baseline": med["pdbmux"] / med["baseline"]} if args.baseline else {}),
                     "same": same and total_same, "bytes": len(pb)})

    names = [t.name for t in targets] + [FLOOR]
    base_col = f" {'/base':>6s}" if args.baseline else ""
    header = f"{'question':36s} " + " ".join(f"{n:>9s}" for n in names) + \
        f" {'slower':>9s} {'/slower':>8s} {'/union':>7s} {'/floor':>7s}{base_col}  same"
    print(header)
    for row in rows:
        med = row["median_ms"]
        print(f"{row['question'][:36]:36s} " + " ".join(f"{med[n]:9.1f}" for n in names) +
              f" {row['slower_backend_ms']:9.1f} {row['vs_slower']:8.2f} {row['vs_union']:7.2f}"
              f" {row['vs_floor']:7.2f}" +
              (f" {row['vs_baseline']:6.2f}" if args.baseline else "") +
              f"  {'yes' if row['same'] else 'NO'}")
    geo = lambda xs: math.exp(sum(math.log(x) for x in xs) / len(xs))
    g_slower = geo([r["vs_slower"] for r in rows])
    g_union = geo([r["vs_union"] for r in rows])
    g_floor = geo([r["vs_floor"] for r in rows])
    print(f"geometric mean: {g_slower:.2f}x the slower backend, {g_union:.2f}x the union, "
          f"{g_floor:.2f}x both backends at once ({len(rows)} questions, {args.rounds} rounds; "
          f"{sum(not r['same'] for r in rows)} answers differ from the union's)")
    if args.baseline:
        g_base = geo([r["vs_baseline"] for r in rows])
        worst = max(rows, key=lambda r: r["vs_baseline"])
        print(f"against the baseline build (same settings, same rounds): geometric mean "
              f"{g_base:.2f}x, highest {worst['vs_baseline']:.2f}x ({worst['question']})")
    if args.phases:
        print_phases(args.phases, qs, rows)
    if args.json:
        with open(args.json, "w") as f:
            summary = {"rows": rows, "geomean_vs_slower": g_slower, "geomean_vs_union": g_union,
                       "geomean_vs_floor": g_floor}
            if args.baseline:
                summary["geomean_vs_baseline"] = g_base
            json.dump(summary, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
