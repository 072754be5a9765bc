#!/usr/bin/env python3
"""Load a synthetic estate of N nodes, split across two PuppetDBs and whole into a third.

Usage: estate.py --backends pdb-a=URL,pdb-b=URL --union URL [--nodes 2000] [--shared 0.2]
                 [--facts 150] [--reports 1] [--out estate.json]

The estate is deterministic in shape (only its timestamps follow the clock): certnames
`node-NNNNN.<env>.bench.test`, environments production (80%) and staging, a `shared` fraction of
the nodes held by both backends (a migration in progress). Of the shared nodes, the newer report
is alternately on the first and the second backend; every 10th has the same report stored in
both (an agent that reported to both), half of those with the newer facts on the second backend
(an ownership tie broken by fresher facts). 4% of the nodes held by one backend only are
deactivated there. Each node sends facts (`--facts` facts: the core facts an agent reports plus
custom ones), a catalog (12-16 resources, with edges) and its reports (`--reports` per backend,
one per earlier run two hours apart, with events for changed and failed runs; a node that
reported to both stored every one in both). The union PuppetDB is sent every command, oldest first, so it holds
what one PuppetDB would if every agent had reported to it.

Commands are submitted over the command API (`POST /pdb/cmd/v1`) by a pool of workers, each
owning a disjoint set of certnames and sending them in order; the loader then waits for every
backend's queue_depth to reach 0 and checks the node counts. --out writes what was loaded:
node counts per backend, shared nodes, and which certnames exercise which case, for the benchmark.

Python 3 standard library only.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime as dt
import json
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid

DOMAIN = "bench.test"
PRODUCER = f"puppet.{DOMAIN}"
UUID_NS = uuid.UUID("3f6b0c1e-2d4a-4c51-8b9e-6a0d5e0b1c2d")
NOW = dt.datetime.now(dt.timezone.utc).replace(microsecond=0)


class LoadError(Exception):
    pass


def ts(minutes_ago: float) -> str:
    t = NOW - dt.timedelta(minutes=minutes_ago)
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{t.microsecond // 1000:03d}Z"


def uid(*parts) -> str:
    return str(uuid.uuid5(UUID_NS, "/".join(str(p) for p in parts)))


# --- the estate -----------------------------------------------------------------------------------

def plan_estate(nodes: int, shared: float) -> list[dict]:
    """One entry per node: certname, environment, which backends hold it and how."""
    n_shared = int(round(nodes * shared))
    rest = nodes - n_shared
    n_first = rest // 2
    estate = []
    for i in range(nodes):
        env = "staging" if i % 5 == 4 else "production"
        node = {"i": i, "certname": f"node-{i:05d}.{env}.{DOMAIN}", "env": env}
        if i < n_shared:
            k = i
            node["holders"] = [0, 1]
            if k % 10 == 0:
                # The same report in both; every other one with fresher facts on the second.
                node["case"] = "same-report-facts-newer-second" if k % 20 == 0 else "same-report"
                node["newer"] = 1 if k % 20 == 0 else 0
            else:
                node["case"] = "newer-second" if k % 2 else "newer-first"
                node["newer"] = k % 2
        elif i < n_shared + n_first:
            node["holders"] = [0]
            node["case"] = "first-only"
        else:
            node["holders"] = [1]
            node["case"] = "second-only"
        if len(node["holders"]) == 1 and i % 25 == 7:
            node["case"] += "-deactivated"
            node["deactivated"] = True
        estate.append(node)
    return estate


def facts_values(node: dict, holder: int, n_facts: int) -> dict:
    i = node["i"]
    short = node["certname"].split(".")[0]
    ip = f"10.{(i >> 16) & 255}.{(i >> 8) & 255}.{i & 255}"
    values = {
        "kernel": "Linux",
        "kernelrelease": f"6.1.0-{20 + i % 5}-amd64",
        "kernelversion": "6.1.0",
        "hardwaremodel": "x86_64",
        "architecture": "amd64",
        "osfamily": "Debian" if i % 7 else "RedHat",
        "operatingsystem": "Debian" if i % 7 else "Rocky",
        "hostname": short,
        "fqdn": node["certname"],
        "domain": node["certname"].split(".", 1)[1],
        "ipaddress": ip,
        "is_virtual": i % 3 != 0,
        "virtual": "kvm" if i % 3 else "physical",
        "processorcount": 1 + i % 16,
        "memorysize_mb": 2048.0 + 512 * (i % 8),
        "uptime_seconds": 3600 * (i % 500) + 17,
        "puppetversion": "7.23.0",
        "timezone": "UTC",
        "bench_holder": ["first", "second"][holder],
        "os": {"name": "Debian", "family": "Debian",
               "release": {"major": "12", "minor": str(i % 6), "full": f"12.{i % 6}"}},
        "networking": {"hostname": short, "fqdn": node["certname"], "ip": ip,
                       "interfaces": {"eth0": {"ip": ip, "mtu": 1500},
                                      "lo": {"ip": "127.0.0.1", "mtu": 65536}}},
        "processors": {"count": 1 + i % 16, "models": ["Intel Xeon"] * (1 + i % 4)},
        "mountpoints": {"/": {"size_bytes": 10 ** 10 + i, "filesystem": "ext4"}},
        "role": ["web", "db", "cache", "worker"][i % 4],
    }
    k = 0
    while len(values) < n_facts:
        values[f"custom_fact_{k:03d}"] = (f"value-{(i * 31 + k) % 97}" if k % 3 else
                                          (i + k) % 1000 if k % 2 else bool((i + k) % 2))
        k += 1
    return values


def catalog(node: dict, at: str, version: str, key: str) -> dict:
    i = node["i"]
    resources = [
        {"type": "Stage", "title": "main", "exported": False, "tags": ["stage"], "parameters": {}},
        {"type": "Class", "title": "Settings", "exported": False, "tags": ["class"],
         "parameters": {}},
        {"type": "Class", "title": "Main", "exported": False, "tags": ["class"], "parameters": {}},
        {"type": "Class", "title": "Role::" + ["Web", "Db", "Cache", "Worker"][i % 4],
         "exported": False, "tags": ["class"], "parameters": {}},
    ]
    edges = [("Stage", "main", "Class", "Settings"), ("Stage", "main", "Class", "Main")]
    for k in range(8 + i % 5):
        title = f"/etc/bench/file-{k}.conf"
        resources.append({"type": "File", "title": title, "exported": False,
                          "tags": ["file", "class"], "file": "/etc/puppetlabs/site.pp",
                          "line": 10 + k, "parameters": {"ensure": "file", "mode": "0644"}})
        edges.append(("Class", "Main", "File", title))
    if i % 10 == 3:
        resources.append({"type": "Sshkey", "title": node["certname"], "exported": True,
                          "tags": ["sshkey"], "parameters": {"type": "ssh-ed25519"}})
    return {
        "certname": node["certname"], "version": version, "environment": node["env"],
        "transaction_uuid": uid("txn", key), "catalog_uuid": uid("catalog", key),
        "code_id": None, "producer_timestamp": at, "producer": PRODUCER,
        "resources": resources,
        "edges": [{"source": {"type": a, "title": b}, "target": {"type": c, "title": d},
                   "relationship": "contains"} for a, b, c, d in edges],
    }


def report(node: dict, end_minutes_ago: float, kind: str, key: str, version: str) -> dict:
    end = ts(end_minutes_ago)
    t = ts(end_minutes_ago + 0.2)
    resources = []
    if kind in ("changed", "failed"):
        resources.append({"skipped": False, "timestamp": t, "resource_type": "File",
                          "resource_title": "/etc/bench/file-0.conf",
                          "file": "/etc/puppetlabs/site.pp", "line": 10,
                          "containment_path": ["Stage[main]", "Main", "File[/etc/bench/file-0.conf]"],
                          "corrective_change": False,
                          "events": [{"status": "success", "timestamp": t, "property": "mode",
                                      "old_value": "0600", "new_value": "0644",
                                      "message": "mode changed", "corrective_change": False}]})
    if kind == "failed":
        resources.append({"skipped": False, "timestamp": t, "resource_type": "File",
                          "resource_title": "/etc/bench/file-1.conf",
                          "file": "/etc/puppetlabs/site.pp", "line": 11,
                          "containment_path": ["Stage[main]", "Main", "File[/etc/bench/file-1.conf]"],
                          "corrective_change": False,
                          "events": [{"status": "failure", "timestamp": t, "property": "ensure",
                                      "old_value": "absent", "new_value": "file",
                                      "message": "could not write", "corrective_change": False}]})
    return {
        "certname": node["certname"], "environment": node["env"], "puppet_version": "7.23.0",
        "report_format": 12, "configuration_version": version, "start_time": ts(end_minutes_ago + 0.5),
        "end_time": end, "producer_timestamp": end, "producer": PRODUCER,
        "resources": resources, "metrics": [], "logs": [],
        "noop": False, "noop_pending": False, "corrective_change": False,
        "transaction_uuid": uid("txn", key), "catalog_uuid": uid("catalog", key), "code_id": None,
        "cached_catalog_status": "not_used", "status": "unchanged" if kind == "unchanged" else kind,
    }


def run_commands(node: dict, holder: int, ago: float, key: str, n_facts: int,
                 history: int = 1) -> list[tuple]:
    """(producer time, command, version, payload) for the latest agent run of `node` against
    `holder`, after `history - 1` earlier runs' reports, two hours apart."""
    kinds = ["unchanged", "changed", "unchanged", "failed", "unchanged"]
    kind = kinds[(node["i"] + holder) % 5]
    version = str(int((NOW - dt.timedelta(minutes=ago)).timestamp()))
    earlier = []
    for k in range(history - 1, 0, -1):
        then = ago + 120 * k
        earlier.append((ts(then), "store_report", 8,
                        report(node, then, kinds[(node["i"] + holder + k) % 5], f"{key}/{k}",
                               str(int((NOW - dt.timedelta(minutes=then)).timestamp())))))
    facts = {"certname": node["certname"], "environment": node["env"],
             "producer_timestamp": ts(ago + 0.9), "producer": PRODUCER,
             "values": facts_values(node, holder, n_facts)}
    return earlier + [
        (ts(ago + 0.9), "replace_facts", 5, facts),
        (ts(ago + 0.8), "replace_catalog", 9, catalog(node, ts(ago + 0.8), version, key)),
        (ts(ago), "store_report", 8, report(node, ago, kind, key, version)),
    ]


def commands(estate: list[dict], n_facts: int,
             history: int) -> tuple[list[list[tuple]], list[tuple], list[tuple]]:
    """Per backend (index 0, 1): (certname, commands...) lists; the union's; the late facts."""
    per_backend: list[list[tuple]] = [[], []]
    union: list[tuple] = []
    late_facts: list[tuple] = []  # (backend, certname, command): fresher facts sent last
    for node in estate:
        i, case = node["i"], node["case"]
        sent: list[list[tuple]] = [[], []]
        union_cmds: list[tuple] = []
        if case.startswith("same-report"):
            ago = 20 + i % 30
            both = run_commands(node, 0, ago, f"{i}/same", n_facts, history)
            for h in (0, 1):
                sent[h] += both
            union_cmds += both
            if node["newer"] == 1:
                fresher = dict(both[0][3], producer_timestamp=ts(ago - 1))
                late_facts.append((1, node["certname"], ("replace_facts", 5, fresher)))
                union_cmds.append((ts(ago - 1), "replace_facts", 5, fresher))
        else:
            for h in node["holders"]:
                newer = node.get("newer", h)
                ago = (10 + i % 40) if h == newer else (60 + i % 40)
                cmds = run_commands(node, h, ago, f"{i}/{h}", n_facts, history)
                sent[h] += cmds
                union_cmds += cmds
        if node.get("deactivated"):
            h = node["holders"][0]
            cmd = (ts(2), "deactivate_node", 3,
                   {"certname": node["certname"], "producer_timestamp": ts(2)})
            sent[h].append(cmd)
            union_cmds.append(cmd)
        for h in (0, 1):
            if sent[h]:
                per_backend[h].append((node["certname"], [c[1:] for c in sent[h]]))
        union_cmds.sort(key=lambda c: c[0])
        union.append((node["certname"], [c[1:] for c in union_cmds]))
    return per_backend, union, late_facts


# --- HTTP -------------------------------------------------------------------------------------------

def http(method: str, url: str, body: bytes | None = None, timeout: float = 120) -> tuple[int, str]:
    req = urllib.request.Request(url, data=body, method=method)
    if body is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode(errors="replace")
    except (urllib.error.URLError, OSError) as err:
        raise LoadError(f"{method} {url}: {err}") from err


def submit(base: str, certname: str, command: str, version: int, payload: dict) -> None:
    params = urllib.parse.urlencode({"command": command, "version": version,
                                     "certname": certname, "secondsToWaitForCompletion": 60})
    status, body = http("POST", f"{base}/pdb/cmd/v1?{params}", json.dumps(payload).encode())
    answer = json.loads(body) if body.startswith("{") else {}
    # Queued but not processed within the wait (a busy PuppetDB answers 503 "timed_out"): it
    # will be; wait_idle waits for the queue to drain.
    if status == 503 and answer.get("timed_out"):
        return
    if status != 200 or not answer.get("processed"):
        raise LoadError(f"{base}: {command} for {certname}: HTTP {status}: {body[:300]}")


def wait_idle(base: str, timeout: float = 1800) -> None:
    """Waits until the PuppetDB at `base` has processed every queued command."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status, body = http("GET", f"{base}/status/v1/services/puppetdb-status")
        if status == 200 and json.loads(body).get("status", {}).get("queue_depth") == 0:
            return
        time.sleep(1)
    raise LoadError(f"{base}: commands still queued after {timeout:.0f}s")


def send_all(base: str, batches: list[tuple], workers: int) -> None:
    """Each worker sends whole certnames' command lists, in order."""
    def one(batch):
        certname, cmds = batch
        for command, version, payload in cmds:
            submit(base, certname, command, version, payload)
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        for future in [pool.submit(one, b) for b in batches]:
            future.result()


def count_nodes(base: str, state: str) -> int:
    q = json.dumps(["extract", [["function", "count"]], ["=", "node_state", state]])
    status, body = http("GET", f"{base}/pdb/query/v4/nodes?" + urllib.parse.urlencode({"query": q}))
    if status != 200:
        raise LoadError(f"{base}: node count: HTTP {status}: {body[:300]}")
    return json.loads(body)[0]["count"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backends", required=True, help="name=url,name=url (the split estate)")
    ap.add_argument("--union", required=True, help="url of the PuppetDB that gets everything")
    ap.add_argument("--nodes", type=int, default=2000)
    ap.add_argument("--shared", type=float, default=0.2, help="fraction held by both backends")
    ap.add_argument("--facts", type=int, default=150)
    ap.add_argument("--reports", type=int, default=1, help="reports per node and backend")
    ap.add_argument("--workers", type=int, default=6, help="concurrent submitters per PuppetDB")
    ap.add_argument("--out", help="where to write the estate's description (JSON)")
    args = ap.parse_args()
    try:
        backends = []
        for part in args.backends.split(","):
            name, _, url = part.partition("=")
            backends.append({"name": name, "url": url.rstrip("/")})
        if len(backends) != 2:
            raise LoadError("--backends needs exactly two name=url pairs")
        union_url = args.union.rstrip("/")
        estate = plan_estate(args.nodes, args.shared)
        per_backend, union, late_facts = commands(estate, args.facts, max(1, args.reports))
        started = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            jobs = [pool.submit(send_all, b["url"], per_backend[h], args.workers)
                    for h, b in enumerate(backends)]
            jobs.append(pool.submit(send_all, union_url, union, args.workers))
            for job in jobs:
                job.result()
        # Fresher facts last, after the same report reached both: the second backend's receive
        # time (facts_timestamp) is then the newer one.
        for url in [b["url"] for b in backends] + [union_url]:
            wait_idle(url)
        for h, certname, (command, version, payload) in late_facts:
            submit(backends[h]["url"], certname, command, version, payload)
        for url in [b["url"] for b in backends]:
            wait_idle(url)
        n_cmds = sum(len(c) for b in per_backend for _, c in b) + sum(len(c) for _, c in union)
        elapsed = time.monotonic() - started
        counts = {b["name"]: {"active": count_nodes(b["url"], "active"),
                              "any": count_nodes(b["url"], "any")} for b in backends}
        counts["union"] = {"active": count_nodes(union_url, "active"),
                           "any": count_nodes(union_url, "any")}
        expected_union = len(estate)
        if counts["union"]["any"] < expected_union:
            raise LoadError(f"union holds {counts['union']['any']} nodes, expected {expected_union}")
        print(f"estate.py: {n_cmds + len(late_facts)} commands in {elapsed:.0f}s; nodes {counts}")
        if args.out:
            cases: dict[str, list[str]] = {}
            for node in estate:
                cases.setdefault(node["case"], []).append(node["certname"])
            with open(args.out, "w") as f:
                json.dump({"nodes": args.nodes, "shared": args.shared, "facts": args.facts,
                           "reports": args.reports,
                           "loaded_at": ts(0), "backends": backends, "union": union_url,
                           "counts": counts, "cases": cases}, f, indent=1, sort_keys=True)
        return 0
    except LoadError as err:
        print(f"estate.py: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
