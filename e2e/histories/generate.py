#!/usr/bin/env python3
"""Send a seeded, replayable fleet history to several PuppetDBs and all of it to one more.

Usage: generate.py --seed 7 --backends h1=http://127.0.0.1:18090,h2=http://127.0.0.1:18091 \
                   --union http://127.0.0.1:18094 --out history.json [--nodes 16] [--late late.json]
       generate.py --send-late late.json

A history is what a fleet in a migration sends (docs/decisions.md, D23): every node runs every
30 minutes or so; each run sends its facts, then its catalog (and its catalog inputs), then its report to the PuppetDB the
node reports to. Nodes move through one to all of the backends, each move leaving a full stale
copy behind (other facts, packages, environment, catalog, resources, reports); at a move a
command can miss the new backend (the facts still go to the old one while the catalog and report
reach the new one), a report can be sent to the old and the new backend, and some nodes report to
two backends for a while. Some nodes send facts and never a report; some are deactivated at the
end (in every backend that held them). The union PuppetDB is sent every command once.

Delivery is a fleet's, not a loader's: each PuppetDB is fed by its own thread at once, in an
order shuffled across nodes, and for some nodes a backend's commands arrive out of order (a
command backlog: older facts processed after newer). One PuppetDB keeps the newest copy of each
kind of data by producer time whatever the order, so the union's answers do not depend on it.
Once every queue is empty, each PuppetDB is asked to collect its package garbage (the admin
`clean` command's `gc_packages`): a PuppetDB lists a package no node holds any more until its
periodic collection runs, so without it `/packages` would depend on when that last ran.

With --late, the last run of about half the nodes (and their deactivations) is held back and
written to that file instead of sent; `--send-late` sends it later, the same way, and removes the
file. The history suite uses it to build pdbmux's membership map before those runs arrive, so
that the answers it checks come from a map refreshed over a changing estate (producer times
learned again only for the copies that changed, docs/merging.md), as in production.

Everything follows from the seed: the certnames (`s<seed>-b<k>-n<i>.hist.test`, so histories
over different backend counts never share a node), the runs, the moves, the faults, the delivery
order. Timestamps are relative to the time of the run. The output file describes the history
(seed, backends, union, each node's runs and where each command went) for the test that asks
pdbmux and the union the same questions (e2e/tests/histories.rs).

Python 3 standard library only; the HTTP helpers are the fixture loader's.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import json
import random
import sys
import threading
import time
import uuid
from pathlib import Path

_LOADER = importlib.util.spec_from_file_location(
    "fixture_load", Path(__file__).resolve().parent.parent / "fixture" / "load.py")
load = importlib.util.module_from_spec(_LOADER)
_LOADER.loader.exec_module(load)

DOMAIN = "hist.test"
PRODUCER = f"puppet.{DOMAIN}"
UUID_NS = uuid.UUID("0b7e6d1c-3f53-4c4e-9d0e-5d2e1b7f9a01")
ENVIRONMENTS = ["production", "staging", "development"]
KINDS = ["changed", "unchanged", "unchanged", "failed", "noop"]
RUN_EVERY = dt.timedelta(minutes=30)


def stamp(t: dt.datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{t.microsecond // 1000:03d}Z"


def uid(*parts) -> str:
    return str(uuid.uuid5(UUID_NS, "/".join(str(p) for p in parts)))


# --- payloads -------------------------------------------------------------------------------------

def facts_payload(certname: str, run: dict) -> dict:
    i, env = run["index"], run["env"]
    return {
        "certname": certname,
        "environment": env,
        "producer_timestamp": run["facts_at"],
        "producer": PRODUCER,
        "values": {
            "kernel": "Linux",
            "kernelrelease": f"6.1.0-{20 + i}-amd64",
            "osfamily": "Debian",
            "os": {"name": "Debian", "family": "Debian",
                   "release": {"major": "12", "minor": str(i), "full": f"12.{i}"}},
            "uptime_seconds": 1800 * i + 11,
            "is_virtual": i % 2 == 0,
            "memorysize_mb": 2048.5 + i,
            "hist_run": i,
            "hist_backend": run["facts_to"][0],
            "hist_env": env,
            "hist_roles": ["web", "db", "cache"][: 1 + i % 3],
        },
        "package_inventory": [
            ["openssh-server", f"1:9.2p1-{i}", "apt"],
            ["puppet-agent", f"7.{20 + i}.0", "apt"],
            *([["nginx", f"1.22.{i}", "apt"]] if env == "production" else []),
        ],
    }


def catalog_payload(certname: str, run: dict) -> dict:
    i, env = run["index"], run["env"]
    site = f"/etc/puppetlabs/code/environments/{env}/manifests/site.pp"

    def res(rtype, title, params, line=None, exported=False):
        r = {"type": rtype, "title": title, "exported": exported,
             "tags": [rtype.lower(), "class"], "parameters": params}
        if line is not None:
            r["file"], r["line"] = site, line
        return r

    resources = [
        res("Stage", "main", {"name": "main"}),
        res("Class", "Main", {"name": "main"}),
        res("Package", "openssh-server", {"ensure": f"1:9.2p1-{i}"}, line=3),
        res("File", "/etc/motd", {"content": f"{certname} run {i} in {env}"}, line=12),
        *[res("File", f"/etc/hist/{env}-{k}.conf", {"index": k}, line=20 + k)
          for k in range(i % 3)],
    ]
    if env == "production":
        resources.append(res("Service", "nginx", {"ensure": "running"}, line=30))
    if i % 4 == 1:
        resources.append(res("Sshkey", certname, {"key": f"AAAAhist{i}"}, line=40, exported=True))
    edges = [{"source": {"type": "Stage", "title": "main"},
              "target": {"type": "Class", "title": "Main"}, "relationship": "contains"}]
    edges += [{"source": {"type": "Class", "title": "Main"},
               "target": {"type": r["type"], "title": r["title"]}, "relationship": "contains"}
              for r in resources[2:]]
    return {
        "certname": certname,
        "version": str(1_700_000_000 + i),
        "environment": env,
        "transaction_uuid": uid("transaction", certname, i),
        "catalog_uuid": uid("catalog", certname, i),
        "code_id": None,
        "producer_timestamp": run["catalog_at"],
        "producer": PRODUCER,
        "edges": edges,
        "resources": resources,
    }


def catalog_inputs_payload(certname: str, run: dict) -> dict:
    """The hiera keys the run's catalog looked up, as Puppet Server sends them beside the catalog
    (same catalog, same producer time): a common key and some of the environment's own."""
    i, env = run["index"], run["env"]
    keys = ["common::ntp_servers", *[f"{env}::key{k}" for k in range(i % 3 + 1)]]
    return {
        "certname": certname,
        "catalog_uuid": uid("catalog", certname, i),
        "producer_timestamp": run["catalog_at"],
        "inputs": [["hiera", key] for key in keys],
    }


def report_payload(certname: str, run: dict) -> dict:
    kind, env = run["kind"], run["env"]
    resources = load.report_resources(kind, env, run["report_end"])
    statuses = [e["status"] for r in resources for e in r["events"]]
    status = {"changed": "changed", "failed": "failed"}.get(kind, "unchanged")
    return {
        "certname": certname,
        "environment": env,
        "puppet_version": "7.23.0",
        "report_format": 12,
        "configuration_version": str(1_700_000_000 + run["index"]),
        "start_time": run["report_start"],
        "end_time": run["report_end"],
        "producer_timestamp": run["report_at"],
        "producer": PRODUCER,
        "resources": resources,
        "metrics": [
            {"category": "resources", "name": "total", "value": 4 + run["index"] % 3},
            {"category": "events", "name": "failure", "value": statuses.count("failure")},
            {"category": "events", "name": "success", "value": statuses.count("success")},
            {"category": "time", "name": "total", "value": 12.5},
        ],
        "logs": [{"file": None, "line": None, "level": "notice", "source": "Puppet",
                  "message": f"Applied catalog ({kind})", "tags": ["notice"],
                  "time": run["report_end"]}],
        "noop": kind == "noop",
        "noop_pending": kind == "noop",
        "corrective_change": False,
        "transaction_uuid": uid("transaction", certname, run["index"]),
        "catalog_uuid": uid("catalog", certname, run["index"]),
        "code_id": None,
        "cached_catalog_status": "not_used",
        "status": status,
    }


# --- the history ----------------------------------------------------------------------------------

def plan_node(rng: random.Random, certname: str, backends: list[str], start: dt.datetime) -> dict:
    """One node's runs: where each run's facts, catalog and report go."""
    runs_n = rng.randint(1, 5)
    facts_only = rng.random() < 0.15
    holder = rng.choice(backends)
    moves = sorted(rng.sample(range(1, runs_n), min(runs_n - 1, rng.randint(0, len(backends) - 1))))
    env = rng.choice(ENVIRONMENTS)
    dual_until = rng.randint(0, runs_n) if rng.random() < 0.2 else -1
    runs = []
    t = start + dt.timedelta(seconds=rng.randint(0, 1700))
    previous = None
    for index in range(runs_n):
        fault = None
        if index in moves:
            previous = holder
            holder = rng.choice([b for b in backends if b != holder])
            if rng.random() < 0.5:
                env = rng.choice(ENVIRONMENTS)
            fault = rng.choice([None, "facts-to-old", "report-twice"])
        facts_to = [holder]
        catalog_to = [holder]
        report_to = [holder]
        if fault == "facts-to-old":
            facts_to = [previous]
        elif fault == "report-twice":
            report_to = [previous, holder]
        if index < dual_until:
            other = next((b for b in backends if b != holder), holder)
            if other != holder:
                report_to = sorted(set(report_to) | {other})
        run = {
            "index": index,
            "env": env,
            "kind": rng.choice(KINDS),
            "fault": fault,
            "facts_at": stamp(t),
            "catalog_at": stamp(t + dt.timedelta(seconds=5)),
            "report_start": stamp(t + dt.timedelta(seconds=6)),
            "report_end": stamp(t + dt.timedelta(seconds=20)),
            "report_at": stamp(t + dt.timedelta(seconds=25)),
            "facts_to": facts_to,
            "catalog_to": [] if facts_only else catalog_to,
            "report_to": [] if facts_only else report_to,
        }
        runs.append(run)
        t += RUN_EVERY + dt.timedelta(seconds=rng.randint(-120, 120))
    held = sorted({b for r in runs for b in r["facts_to"] + r["catalog_to"] + r["report_to"]})
    deactivated = stamp(t) if rng.random() < 0.15 else None
    return {"certname": certname, "facts_only": facts_only, "runs": runs, "held_by": held,
            "deactivated": deactivated, "last_holder": holder,
            "split": is_split(runs, backends)}


def is_split(runs: list[dict], backends: list[str]) -> bool:
    """Whether the node's newest facts, catalog and report are not all in one backend (a command
    that missed the new backend): pdbmux composes its /nodes record from several backends."""
    def newest(key: str) -> list[str]:
        for run in reversed(runs):
            if run[key]:
                return run[key]
        return []

    first = lambda among: min(among, key=backends.index) if among else None  # noqa: E731
    facts, catalog, reports = newest("facts_to"), newest("catalog_to"), newest("report_to")
    facts_owner, catalog_owner = first(facts), first(catalog)
    # The node record's owner: the newest report, then the newest facts, then the catalog.
    node_owner = first(reports)
    if len(reports) > 1:
        node_owner = next((b for b in (facts_owner, catalog_owner) if b in reports), node_owner)
    if node_owner is None:
        node_owner = facts_owner
    return len({o for o in (node_owner, facts_owner, catalog_owner) if o is not None}) > 1


def commands(node: dict) -> list[tuple[list[str], dict]]:
    """Every command of a node, oldest first, with the backends it goes to."""
    c = node["certname"]
    out = []
    for run in node["runs"]:
        out.append((run["facts_to"], {"command": "replace_facts", "version": 5, "certname": c,
                                      "payload": facts_payload(c, run)}))
        if run["catalog_to"]:
            out.append((run["catalog_to"], {"command": "replace_catalog", "version": 9,
                                            "certname": c, "payload": catalog_payload(c, run)}))
            out.append((run["catalog_to"], {"command": "replace_catalog_inputs", "version": 1,
                                            "certname": c,
                                            "payload": catalog_inputs_payload(c, run)}))
        if run["report_to"]:
            out.append((run["report_to"], {"command": "store_report", "version": 8,
                                           "certname": c, "payload": report_payload(c, run)}))
    if node["deactivated"]:
        out.append((node["held_by"], {"command": "deactivate_node", "version": 3, "certname": c,
                                      "payload": {"certname": c,
                                                  "producer_timestamp": node["deactivated"]}}))
    return out


def held_back(rng: random.Random, node: dict) -> tuple[dict, dict | None]:
    """The node as sent at once, and the part held back for --late (its last run and its
    deactivation) when it is one of the late nodes (about half of those with two runs or more)."""
    if len(node["runs"]) < 2 or rng.random() < 0.5:
        return node, None
    early = dict(node, runs=node["runs"][:-1], deactivated=None)
    late = dict(node, runs=node["runs"][-1:])
    return early, late


def send(feeds: dict[str, list[dict]]) -> list[str]:
    """Sends each PuppetDB its commands, each from a thread of its own, then waits until every
    queue is empty and collects package garbage; returns the errors."""
    errors: list[str] = []

    def feed(url: str, cmds: list[dict]) -> None:
        try:
            for cmd in cmds:
                load.submit(url, cmd)
        except load.LoadError as err:
            errors.append(f"{url}: {err}")

    threads = [threading.Thread(target=feed, args=item) for item in feeds.items()]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    if errors:
        return errors
    try:
        for url in feeds:
            load.wait_queue_empty(url)
            collect_package_garbage(url)
    except load.LoadError as err:
        return [str(err)]
    return []


def send_late(path: str) -> int:
    """--send-late: sends what --late held back, then removes the file."""
    with open(path, encoding="utf-8") as held:
        feeds = json.load(held)["feeds"]
    errors = send(feeds)
    if errors:
        print("generate.py: " + "\n".join(errors), file=sys.stderr)
        return 1
    Path(path).unlink()
    sent = {url: len(cmds) for url, cmds in feeds.items()}
    print(f"late runs sent: {sent}")
    return 0


def delivery_order(rng: random.Random, per_node: list[list[dict]]) -> list[dict]:
    """One PuppetDB's commands: nodes interleaved at random, each node's own commands in order,
    except that a fifth of the nodes arrive as a backlog (their commands in any order)."""
    queues = []
    for cmds in per_node:
        cmds = list(cmds)
        if len(cmds) > 1 and rng.random() < 0.2:
            rng.shuffle(cmds)
        if cmds:
            queues.append(cmds)
    out = []
    while queues:
        q = rng.choice(queues)
        out.append(q.pop(0))
        if not q:
            queues.remove(q)
    return out


def collect_package_garbage(base: str, timeout: float = 60) -> None:
    """Runs PuppetDB's package collection now; waits out a clean already under way (503)."""
    body = json.dumps({"command": "clean", "version": 1, "payload": ["gc_packages"]}).encode()
    deadline = time.monotonic() + timeout
    while True:
        status, answer = load.http("POST", f"{base}/pdb/admin/v1/cmd", body)
        if status == 200:
            return
        if status != 503 or time.monotonic() > deadline:
            raise load.LoadError(f"{base}: gc_packages: HTTP {status}: {answer[:300]}")
        time.sleep(0.5)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int)
    parser.add_argument("--backends", help="name=url,... (2 to 4)")
    parser.add_argument("--union", help="the PuppetDB sent every command")
    parser.add_argument("--out")
    parser.add_argument("--nodes", type=int, default=16)
    parser.add_argument("--late", help="hold the late runs back, written to this file")
    parser.add_argument("--send-late", help="send the late runs this file holds")
    args = parser.parse_args()
    if args.send_late:
        return send_late(args.send_late)
    if args.seed is None or not args.backends or not args.union or not args.out:
        parser.error("--seed, --backends, --union and --out are required (or --send-late)")
    backends = []
    for part in args.backends.split(","):
        name, _, url = part.partition("=")
        backends.append({"name": name, "url": url.rstrip("/")})
    names = [b["name"] for b in backends]
    rng = random.Random(args.seed)
    start = dt.datetime.now(dt.timezone.utc).replace(microsecond=0) - dt.timedelta(hours=3)
    nodes = [plan_node(rng, f"s{args.seed}-b{len(names)}-n{i}.{DOMAIN}", names, start)
             for i in range(args.nodes)]
    # Its own generator, so the nodes and their runs are the same with and without --late.
    late_rng = random.Random(f"late-{args.seed}")
    parts = [held_back(late_rng, node) if args.late else (node, None) for node in nodes]

    def feeds_of(part_nodes: list[dict], order: random.Random) -> dict[str, list[dict]]:
        per_backend: dict[str, list[list[dict]]] = {n: [] for n in names}
        union: list[list[dict]] = []
        for node in part_nodes:
            cmds = commands(node)
            for name in names:
                per_backend[name].append([cmd for to, cmd in cmds if name in to])
            union.append([cmd for _, cmd in cmds])
        feeds = {b["url"]: delivery_order(order, per_backend[b["name"]]) for b in backends}
        feeds[args.union.rstrip("/")] = delivery_order(order, union)
        return feeds

    feeds = feeds_of([early for early, _ in parts], rng)
    errors = send(feeds)
    if errors:
        print("generate.py: " + "\n".join(errors), file=sys.stderr)
        return 1
    late = [late for _, late in parts if late is not None]
    if args.late:
        with open(args.late, "w", encoding="utf-8") as held:
            json.dump({"feeds": feeds_of(late, late_rng)}, held)
    sent = {url: len(cmds) for url, cmds in feeds.items()}
    with open(args.out, "w", encoding="utf-8") as out:
        json.dump({"format": 1, "seed": args.seed, "backends": backends,
                   "union": args.union.rstrip("/"), "domain": DOMAIN,
                   "prefix": f"s{args.seed}-b{len(names)}-", "commands_sent": sent,
                   "nodes": nodes}, out, indent=1)
    moved = sum(1 for n in nodes if len(n["held_by"]) > 1)
    held = f", the last run of {len(late)} held back" if args.late else ""
    print(f"seed {args.seed} over {len(names)} backends: {len(nodes)} nodes ({moved} held by "
          f"several), commands sent {sent}{held}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
