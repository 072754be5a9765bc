"""Puppetboard 7.x in front of pdbmux, itself in front of the two e2e PuppetDBs.

Every expected value comes from fixture.json (support.Estate applies the merge rules to it) or
from the backends queried directly; never from pdbmux's answers. Pages are fetched the way a
browser and Puppetboard's DataTables code fetch them: the page, then each JSON endpoint it loads.
"""

from __future__ import annotations

import datetime as dt
import html
import json
import re
import urllib.parse
from collections import Counter

import pytest
import requests
from pypuppetdb import connect
from pypuppetdb.QueryBuilder import EqualsOperator

from support import (Estate, Http, Tables, environment_selector, js_var, links, node_links,
                     overview_numbers, parse_ts, pdb_query, status_cell)

ENV_PATH = {"production": "", "staging": "/staging", "*": "/%2A"}


def env_path(env: str) -> str:
    """The URL prefix Puppetboard uses for env (the default environment has none)."""
    return ENV_PATH[env]


def once(items, what: str) -> Counter:
    counts = Counter(items)
    dup = {k: v for k, v in counts.items() if v != 1}
    assert not dup, f"{what}: listed more than once: {dup}"
    return counts


def shown_time(ts: str) -> str:
    """A PuppetDB timestamp as Puppetboard prints a parsed datetime."""
    return str(parse_ts(ts))


def datatables(start: int = 0, length: int = 100, column: int = 0, direction: str = "desc") -> dict:
    """The query parameters DataTables sends with a server-side table."""
    return {"draw": "1", "start": str(start), "length": str(length),
            "order[0][column]": str(column), "order[0][dir]": direction}


def cell_html_link(cell: str) -> tuple[str, str]:
    """(href, text) of the first link in an HTML snippet of a JSON table cell."""
    m = re.search(r'<a [^>]*href="([^"]*)"[^>]*>([^<]*)</a>', cell)
    assert m, f"no link in {cell!r}"
    return html.unescape(m.group(1)), html.unescape(m.group(2)).strip()


def report_hash_of(href: str) -> str:
    return href.rstrip("/").split("/")[-1].split("#")[0]


# --- overview ---------------------------------------------------------------------------------

def check_overview_rows(text: str, estate: Estate, certnames: list[str]) -> None:
    """The overview's table: every node not `unchanged`, once, with its merged status, the link to
    its owner's latest report, and that report's event counts."""
    table = Tables(text).by_id("main-table")
    rows = {}
    for row in table.rows:
        certname = row[1].links[0][1]
        assert certname not in rows, f"overview lists {certname} twice"
        rows[certname] = row
    want = [c for c in certnames if estate.status(c) != "unchanged"]
    assert sorted(rows) == sorted(want)
    for c in want:
        check_status_cell(rows[c][0], estate, c)


def check_status_cell(cell, estate: Estate, certname: str) -> None:
    """Status label and report link (the event counts beside them: test_node_list_event_counts)."""
    status, href, _ = status_cell(cell)
    assert status == estate.status(certname), f"{certname}: status"
    if status == "unreported":
        return
    latest = estate.latest_report(certname)
    assert report_hash_of(href) == latest["hash"], (
        f"{certname}: the status links to {href}, not to its owner's ({estate.owner(certname)}) "
        f"latest report {latest['hash']}")


def test_pages_load_their_assets_from_puppetboard_itself(board: Http):
    """OFFLINE_MODE: the CSS and JavaScript come from Puppetboard's own static files, so the
    pages render on a machine without internet access (`make demo` included)."""
    text = board.get("/").text
    external = re.findall(r'<(?:script|link)\b[^>]*(?:src|href)="(https?://[^"]+)"', text)
    assert not external, f"assets loaded from elsewhere: {external}"
    for asset in re.findall(r'(?:src|href)="(/static/[^"]+\.(?:js|css))"', text):
        board.get(asset)


def test_production_overview(board: Http, estate: Estate):
    """`/`: the production figures come from /nodes and /resources extract counts (folded, each node counted from its owner)."""
    text = board.get("/").text
    nodes = estate.catalog_nodes("production")
    resources = estate.owned_resources(nodes)
    got = overview_numbers(text)
    assert (got["population"], got["resources"]) == (len(nodes), resources), (
        f"production overview: population/resources (expected {len(nodes)} nodes: {nodes})")
    assert got["avg"] == int(format(resources / len(nodes), ".0f"))
    statuses = Counter(estate.status(c) for c in nodes)
    for status in ("failed", "noop", "changed", "unchanged", "unreported"):
        assert got[status] == statuses[status], f"overview: nodes with status {status}"
    check_overview_rows(text, estate, nodes)


def test_all_environments_overview(board: Http, estate: Estate):
    """`/%2A/`: population MBeans: distinct active certnames, resources counted once."""
    text = board.get("/%2A/").text
    active = estate.active_certnames()
    resources = estate.population_resources()
    got = overview_numbers(text)
    assert got["population"] == len(active), f"num-nodes: distinct active certnames {active}"
    assert got["resources"] == resources, "num-resources: each node's resources counted once"
    assert got["avg"] == int(format(resources / len(active), ".0f"))
    statuses = Counter(estate.status(c) for c in active)
    for status in ("failed", "noop", "changed", "unchanged", "unreported"):
        assert got[status] == statuses[status], f"all-environments overview: status {status}"
    check_overview_rows(text, estate, active)


def test_radiator(board: Http, estate: Estate):
    nodes = estate.catalog_nodes("production")
    stats = board.json("/radiator", headers={"Accept": "application/json"})
    statuses = Counter(estate.status(c) for c in nodes)
    for status in ("failed", "noop", "changed", "unchanged", "unreported"):
        assert stats[status] == statuses[status], f"radiator: {status}"


def test_daily_reports_chart(board: Http, estate: Estate):
    """The chart's extract count … group_by status folds the backends' counts, a report stored
    in both backends counted once (docs/merging.md, "History counted once")."""
    days = board.json("/daily_reports_chart.json")["result"]
    first = dt.datetime.strptime(days[0]["day"], "%Y-%m-%d").replace(tzinfo=dt.timezone.utc)
    end = dt.datetime.strptime(days[-1]["day"], "%Y-%m-%d").replace(
        tzinfo=dt.timezone.utc) + dt.timedelta(days=1)
    want = Counter(r["status"] for r in estate.distinct_reports("production")
                   if first <= parse_ts(r["producer_timestamp"]) < end)
    got = Counter()
    for day in days:
        for status in ("changed", "unchanged", "failed"):
            got[status] += day[status]
    assert got == Counter({s: want[s] for s in ("changed", "unchanged", "failed")})


# --- nodes --------------------------------------------------------------------------------------

@pytest.mark.parametrize("env", ["*", "production", "staging"])
def test_node_list(board: Http, estate: Estate, env: str):
    """`/<env>/nodes`: every active node of env exactly once, with its merged status."""
    text = board.get(f"{env_path(env)}/nodes").text
    want = estate.active_certnames() if env == "*" else estate.catalog_nodes(env)
    table = Tables(text).by_id("main-table")
    rows = {}
    for row in table.rows:
        certname = row[1].links[0][1]
        assert certname not in rows, f"{env} node list shows {certname} twice"
        rows[certname] = row
    assert sorted(rows) == sorted(want)
    for c in want:
        check_status_cell(rows[c][0], estate, c)


def test_node_list_event_counts(board: Http, estate: Estate):
    """The counts beside each node's status come from /event-counts with
    ["=","latest_report?",true] and summarize_by=certname: a node's latest report is the one a
    single PuppetDB holding the whole estate would call latest, its owner's (docs/merging.md, "Who owns a node"), so a report
    left in a backend where the node is now deactivated must not add to it."""
    text = board.get("/%2A/nodes").text
    wrong = []
    for row in Tables(text).by_id("main-table").rows:
        certname = row[1].links[0][1]
        if estate.status(certname) == "unreported":
            continue
        _, _, counts = status_cell(row[0])
        want = estate.event_counts(certname)
        want = [want["failures"], want["successes"], want["skips"], want["noops"]]
        if counts != want:
            wrong.append(f"{certname} (active in {estate.active_backends(certname)}, owner "
                         f"{estate.owner(certname)}): shown {counts}, expected {want}")
    assert not wrong, ("event counts [failures, successes, skips, noops] of each node's latest "
                       "report:\n" + "\n".join(wrong))


def test_failures_page(board: Http, estate: Estate):
    text = board.get("/failures").text
    want = [c for c in estate.catalog_nodes("production")
            if estate.winner(c)["latest_report_status"] == "failed"]
    once(node_links(text), "/failures")
    assert sorted(set(node_links(text))) == sorted(want)


def facts_of_node(board: Http, env: str, certname: str) -> dict:
    """The node page's facts table (its AJAX source): name -> value."""
    data = board.json(f"{env_path(env)}/node/{certname}/facts/json")["data"]
    names = [row[0] for row in data]
    once(names, f"facts of {certname}")
    return {row[0]: json.loads(row[1])[1] for row in data}


def test_node_page_second_backend_only(board: Http, estate: Estate):
    """A node only the second backend holds: its page and its facts render."""
    second = estate.order[1]
    certname = next(c for c in estate.active_certnames()
                    if estate.active_backends(c) == [second]
                    and estate.winner(c)["environment"] == "production")
    text = board.get(f"/node/{certname}").text
    details = Tables(text).tables[0]
    assert [c.text.strip() for c in details.rows[0]] == ["Certname", certname], "Details: certname"
    facts = facts_of_node(board, "production", certname)
    want = estate.merged_facts(certname)
    assert facts["ipaddress"] == want["ipaddress"]
    assert facts["e2e_loaded_into"] == second
    assert facts["os"] == want["os"]
    # The provenance fact pdbmux adds to /facts: the backend that holds the node.
    assert facts["pdbmux_source"] == second
    assert set(facts) == {k for k in want if k != "_at"} | {"pdbmux_source"}


def test_node_page_shared_node_shows_owner(board: Http, estate: Estate):
    """A node in both backends: one set of facts, its facts owner's."""
    for certname in estate.active_certnames():
        if len(estate.active_backends(certname)) < 2:
            continue
        env = estate.winner(certname)["environment"]
        board.get(f"{env_path(env)}/node/{certname}")
        facts = facts_of_node(board, env, certname)
        want = estate.merged_facts(certname)
        assert facts["e2e_loaded_into"] == want["e2e_loaded_into"], (
            f"{certname}: facts of the facts owner {estate.owner(certname, kind='facts')}")
        assert facts["e2e_weight"] == want["e2e_weight"]


def test_unknown_node_is_404(board: Http):
    board.get("/node/no-such-node.pdbmux.test", expect=404)


# --- environments -------------------------------------------------------------------------------

def test_environments_listed_and_browsable(board: Http, estate: Estate):
    """An environment only the second backend holds is in the selector and browsable."""
    union = set()
    for name in estate.order:
        union |= {e["name"] for e in pdb_query(estate.urls[name], "environments").json()}
    assert union == estate.environments()
    selector = environment_selector(board.get("/").text)
    assert set(selector) - {"All Environments"} == union
    only_second = {e for e in union
                   if not any(s["environment"] == e for n in estate.nodes.values()
                              for b, s in n["backends"].items() if b == estate.order[0])}
    assert only_second, "the fixture has an environment only the second backend holds"
    for env in only_second:
        text = board.get(f"/{env}/").text
        nodes = estate.catalog_nodes(env)
        got = overview_numbers(text)
        assert (got["population"], got["resources"]) == (len(nodes), estate.owned_resources(nodes))
        for page in ("nodes", "facts", "reports", "inventory", "catalogs", "classes", "radiator",
                     "failures", "query"):
            board.get(f"/{env}/{page}")
        assert sorted(set(node_links(board.get(f"/{env}/nodes").text))) == nodes


# --- facts --------------------------------------------------------------------------------------

def test_facts_page(board: Http, estate: Estate):
    """`/facts`: the union of fact names (fact-names), each once."""
    text = board.get("/facts").text
    names = [urllib.parse.unquote(h[len("/fact/"):]) for h in links(text)
             if h.startswith("/fact/")]
    once(names, "/facts")
    want = {k for values in estate.facts.values() for k in values if k != "_at"}
    want.add("pdbmux_source")  # listed while pdbmux's provenance fact is on
    assert set(names) == want


def fact_rows(board: Http, path: str) -> list[tuple[str, object]]:
    """A fact page's table (its AJAX source): (certname, value) rows; value None when the value
    column is absent (a value page)."""
    out = []
    for row in board.json(path)["data"]:
        certname = cell_html_link(row[0])[1]
        value = json.loads(row[1])[1] if len(row) > 1 else None
        out.append((certname, value))
    return out


@pytest.mark.parametrize("env", ["production", "*"])
def test_fact_pages(board: Http, estate: Estate, env: str):
    prefix = env_path(env)
    board.get(f"{prefix}/fact/kernel")
    board.get(f"{prefix}/fact/kernel/Linux")
    nodes = estate.fact_nodes(env)
    rows = fact_rows(board, f"{prefix}/fact/kernel/json")
    once([c for c, _ in rows], "kernel")
    assert sorted(c for c, _ in rows) == nodes
    assert {v for _, v in rows} == {"Linux"}
    rows = fact_rows(board, f"{prefix}/fact/kernel/Linux/json")
    assert sorted(c for c, _ in rows) == nodes
    rows = fact_rows(board, f"{prefix}/fact/e2e_weight/json")
    once([c for c, _ in rows], "e2e_weight")
    assert dict(rows) == {c: estate.merged_facts(c)["e2e_weight"] for c in nodes}
    # Where each node's facts come from: the owner's e2e_loaded_into (or `all`).
    for value in estate.order + ["all"]:
        rows = fact_rows(board, f"{prefix}/fact/e2e_loaded_into/{value}/json")
        want = [c for c in nodes if estate.merged_facts(c)["e2e_loaded_into"] == value]
        assert sorted(c for c, _ in rows) == want, f"e2e_loaded_into = {value}"
    # The provenance fact's value page (Puppetboard asks /facts/pdbmux_source with the value and
    # the environment in the query): the nodes whose facts each backend answers for, those
    # loaded into every backend included (their e2e_loaded_into is `all`, no backend's name).
    for value in estate.order:
        rows = fact_rows(board, f"{prefix}/fact/pdbmux_source/{value}/json")
        want = [c for c in nodes if estate.owner(c, kind="facts") == value]
        assert want, f"no node's facts come from {value}"
        assert sorted(c for c, _ in rows) == want, f"pdbmux_source = {value}"


def test_fact_only_the_second_backend_has(board: Http, estate: Estate):
    holders = sorted(c for c in estate.active_certnames()
                     if "e2e_staging_only" in estate.merged_facts(c))
    assert holders
    rows = fact_rows(board, "/%2A/fact/e2e_staging_only/json")
    assert sorted(c for c, _ in rows) == holders
    rows = fact_rows(board, "/staging/fact/e2e_staging_only/json")
    assert sorted(c for c, _ in rows) == holders


def test_structured_fact_path(board: Http, estate: Estate):
    rows = fact_rows(board, "/fact/os.release.full/json")
    nodes = estate.fact_nodes("production")
    assert dict(rows) == {c: estate.merged_facts(c)["os"]["release"]["full"] for c in nodes}


# --- reports ------------------------------------------------------------------------------------

def reports_json(board: Http, env: str, **paging) -> dict:
    path = "/reports/json" if env == "production" else f"{env_path(env)}/reports/json"
    return board.json(path, params=datatables(**paging))


def report_rows(data: dict) -> list[tuple[str, str, str]]:
    """(end time as shown, certname, hash) of each row of /reports/json."""
    out = []
    for row in data["data"]:
        end = re.sub(r"<[^>]+>", "", row[0]).strip()
        href, _ = cell_html_link(row[1])
        certname = cell_html_link(row[2])[1]
        out.append((end, certname, report_hash_of(href)))
    return out


@pytest.mark.parametrize("env", ["production", "staging", "*"])
def test_reports_json_total_and_rows(board: Http, estate: Estate, pdbmux: Http, env: str):
    """recordsTotal is X-Records: every distinct report once, as one PuppetDB holding the estate
    counts them (a report stored in both backends once), and the rows hold each once (dedupe on
    hash), newest first."""
    entries = estate.env_reports(env)
    distinct = estate.distinct_reports(env)
    query = None if env == "*" else ["and", ["=", "environment", env]]
    direct = sum(int(pdb_query(estate.urls[n], "reports", query, include_total="true",
                               limit=1).headers["X-Records"]) for n in estate.order)
    assert direct == len(entries), "fixture.json vs the backends' own X-Records"
    data = reports_json(board, env)
    assert data["recordsTotal"] == len(distinct), (
        f"{env}: recordsTotal = X-Records = the distinct reports ({len(distinct)}); "
        f"{len(entries)} stored")
    got = pdb_query(pdbmux.base, "reports", query, include_total="true", limit=1,
                    order_by=json.dumps([{"field": "end_time", "order": "desc"}]))
    assert int(got.headers["X-Records"]) == len(distinct), "pdbmux's X-Records"
    rows = report_rows(data)
    once([h for _, _, h in rows], f"{env} reports")
    assert {h for _, _, h in rows} == estate.env_report_hashes(env)
    by_hash = {r["hash"]: r for r in entries}
    assert [e for e, _, _ in rows] == sorted((shown_time(by_hash[h]["end_time"]) for _, _, h in rows),
                                              reverse=True), "ordered by end_time desc"
    for end, certname, h in rows:
        assert (end, certname) == (shown_time(by_hash[h]["end_time"]), by_hash[h]["certname"])


def test_reports_json_paging(board: Http, estate: Estate):
    """DataTables paging: offset/limit cut from the merged, re-sorted union."""
    ends = sorted((shown_time(r["end_time"]) for r in
                   {r["hash"]: r for r in estate.env_reports("production")}.values()),
                  reverse=True)
    for start in (0, 5, len(ends) - 3):
        rows = report_rows(reports_json(board, "production", start=start, length=5))
        assert [e for e, _, _ in rows] == ends[start:start + 5], f"window start={start}"


def test_reports_of_a_node_stored_in_both(board: Http, estate: Estate):
    """A node whose reports are in both backends: rows and recordsTotal count each once."""
    certname = next(c for c in estate.active_certnames()
                    if sum(1 for r in estate.reports if r["certname"] == c) >
                    len({r["hash"] for r in estate.reports if r["certname"] == c}))
    entries = [r for r in estate.reports if r["certname"] == certname]
    data = board.json(f"/reports/{certname}/json", params=datatables())
    assert data["recordsTotal"] == len({r["hash"] for r in entries})
    assert sorted(h for _, _, h in report_rows(data)) == sorted({r["hash"] for r in entries})


def check_report_page(board: Http, estate: Estate, report: dict) -> None:
    env = report["environment"]
    prefix = "" if env == "production" else env_path(env)
    text = board.get(f"{prefix}/report/{report['certname']}/{report['hash']}").text
    summary = Tables(text).tables[0]
    assert summary.rows[0][0].links[0][1] == report["certname"]
    payload = estate.report_payloads[(report["backend"], report["certname"], report["end_time"])]
    assert summary.rows[0][1].text.strip() == payload["configuration_version"]
    events = js_var(text, "events")
    assert sorted(e["status"] for e in events) == estate.report_events(report), (
        "the report's events, once each")
    logs = js_var(text, "logs")
    assert [entry["message"] for entry in logs] == [entry["message"] for entry in payload["logs"]]


def test_report_pages(board: Http, estate: Estate):
    shared = [r for r in estate.reports
              if sum(1 for o in estate.reports if o["hash"] == r["hash"]) > 1]
    assert shared, "the fixture has a report stored in both backends"
    # A report stored in both backends, with events: its events are not doubled.
    check_report_page(board, estate, max(shared, key=lambda r: len(estate.report_events(r))))
    # A report only the second backend holds, and one in the second backend's own environment.
    second = estate.order[1]
    only_second = [r for r in estate.reports if r["backend"] == second
                   and all(o["backend"] == second for o in estate.reports
                           if o["hash"] == r["hash"])]
    check_report_page(board, estate, next(r for r in only_second
                                          if r["environment"] == "production"
                                          and estate.report_events(r)))
    staging = next(r for r in only_second if r["environment"] != "production")
    check_report_page(board, estate, staging)
    # Looked up in the wrong environment: Puppetboard's query finds nothing.
    board.get(f"/report/{staging['certname']}/{staging['hash']}", expect=404)


# --- inventory ----------------------------------------------------------------------------------

@pytest.mark.parametrize("env", ["production", "staging"])
def test_inventory(board: Http, estate: Estate, env: str):
    prefix = env_path(env)
    board.get(f"{prefix}/inventory")
    data = board.json(f"{prefix}/inventory/json")["data"]
    rows = {}
    for row in data:
        href, _ = cell_html_link(row[0])
        certname = href.rsplit("/", 1)[-1]
        assert certname not in rows, f"inventory lists {certname} twice"
        rows[certname] = row
    assert sorted(rows) == estate.fact_nodes(env)
    for certname, row in rows.items():
        facts = estate.merged_facts(certname)
        assert row[1] == facts["networking"]["ip"], f"{certname}: IP address"
        assert row[4] == facts["kernelrelease"], f"{certname}: kernel release"
        # The provenance fact among the inventory's facts (e2e/puppetboard/serve): the backend
        # each node's facts come from.
        assert row[6] == estate.owner(certname, kind="facts"), f"{certname}: source"


# --- metrics ------------------------------------------------------------------------------------

def mbeans(base: str) -> set[str]:
    r = requests.get(f"{base}/metrics/v2/list", timeout=30)
    assert r.status_code == 200, f"{r.url}: {r.status_code}"
    return {f"{domain}:{props}" for domain, beans in r.json()["value"].items() for props in beans}


def test_metrics_page(board: Http, estate: Estate):
    """`/metrics` lists the union of both backends' MBeans (the second one's TLS connector
    included). PuppetDB registers some MBeans lazily, so the union is read before and after."""
    before = set().union(*(mbeans(estate.urls[n]) for n in estate.order))
    text = board.get("/metrics").text
    after = set().union(*(mbeans(estate.urls[n]) for n in estate.order))
    listed = [urllib.parse.unquote(h[len("/metric/"):]) for h in links(text)
              if h.startswith("/metric/")]
    once(listed, "/metrics")
    assert before <= set(listed) <= after, (
        f"missing: {sorted(before - set(listed))[:10]}; unknown: {sorted(set(listed) - after)[:10]}")


def metric_table(board: Http, mbean: str) -> dict[str, str]:
    text = board.get(f"/metric/{urllib.parse.quote(mbean)}").text
    return {row[0].text.strip(): row[1].text.strip() for row in Tables(text).tables[0].rows}


def read_mbean(base: str, mbean: str) -> dict:
    r = requests.get(f"{base}/metrics/v2/read/{urllib.parse.quote(mbean)}", timeout=30)
    assert r.status_code == 200, f"{r.url}: {r.status_code}"
    return r.json()["value"]


def test_metric_pages(board: Http, estate: Estate):
    prefix = "puppetlabs.puppetdb.population"
    assert metric_table(board, f"{prefix}:name=num-nodes")["Value"] == str(
        len(estate.active_certnames())), "num-nodes"
    assert metric_table(board, f"{prefix}:name=num-resources")["Value"] == str(
        estate.population_resources()), "num-resources"
    # Every other metric is merged value by value: a Count sums across backends.
    bean = "puppetlabs.puppetdb.mq:name=global.processed"
    before = sum(read_mbean(estate.urls[n], bean)["Count"] for n in estate.order)
    got = int(metric_table(board, bean)["Count"])
    after = sum(read_mbean(estate.urls[n], bean)["Count"] for n in estate.order)
    assert 0 < before <= got <= after


# --- query page ---------------------------------------------------------------------------------

def run_query(board: Http, endpoint: str, query: str, env: str = "production") -> str:
    prefix = "" if env == "production" else env_path(env)
    form = board.get(f"{prefix}/query").text
    m = re.search(r'name="csrf_token" type="hidden" value="([^"]+)"', form)
    assert m, "no csrf_token on the query page"
    return board.post(f"{prefix}/query", {"csrf_token": m.group(1), "query": query,
                                         "endpoints": endpoint}).text


def query_result(text: str) -> list[dict]:
    m = re.search(r"Number of results: (\d+)", text)
    assert m, "no result on the query page: " + re.sub(r"\s+", " ", text)[-1500:]
    head = Tables(text).by_id("query_table").head
    rows = [dict(zip(head, row)) for row in js_var(text, "data")]
    assert len(rows) == int(m.group(1))
    return rows


def test_query_page_ast(board: Http, estate: Estate):
    rows = query_result(run_query(board, "nodes", '["~", "certname", "^both-"]'))
    want = [c for c in estate.active_certnames() if c.startswith("both-")]
    once([r["certname"] for r in rows], "query nodes")
    assert sorted(r["certname"] for r in rows) == want
    for r in rows:
        assert r["report_timestamp"] == estate.winner(r["certname"])["report_timestamp"]
    # facts: one node's owner answers (no wrapping [] needed: Puppetboard adds it).
    second = estate.order[1]
    rows = query_result(run_query(
        board, "facts", f'"and", ["=", "name", "e2e_loaded_into"], ["=", "value", "{second}"]'))
    want = [c for c in estate.active_certnames()
            if estate.merged_facts(c)["e2e_loaded_into"] == second]
    assert sorted(r["certname"] for r in rows) == want


def test_query_page_pql(board: Http, estate: Estate):
    """PQL goes to /pdb/query/v4, which pdbmux translates (a backend's ast_only answer) and
    merges like the entity's own route (docs/merging.md, "PQL and the root endpoint"): the page
    lists every active matching node of the estate, those only the second backend holds
    included."""
    pql = 'nodes[certname] { certname ~ "^b-" }'
    want = sorted(c for c in estate.active_certnames() if c.startswith("b-"))
    assert want, "the second backend's own nodes"
    first = requests.get(f"{estate.urls[estate.order[0]]}/pdb/query/v4", params={"query": pql},
                         timeout=30).json()
    assert first == [], "the first backend alone has none of them"
    text = run_query(board, "pql", pql)
    assert sorted(row["certname"] for row in query_result(text)) == want
    # Nodes both backends hold: each once.
    pql = 'nodes[certname] { certname ~ "^both-" }'
    want = sorted(c for c in estate.active_certnames() if c.startswith("both-"))
    got = sorted(row["certname"] for row in query_result(run_query(board, "pql", pql)))
    assert got == want


def test_query_page_invalid_query_shows_puppetdb_message(board: Http, estate: Estate):
    """A 400 from the backends reaches the page as PuppetDB's own text."""
    query = '["=", "no_such_field", "x"]'
    r = requests.get(f"{estate.urls[estate.order[0]]}/pdb/query/v4/nodes",
                     params={"query": query}, timeout=30)
    assert r.status_code == 400
    text = run_query(board, "nodes", query)
    m = re.search(r'<pre id="invalid_query" class="error_message">(.*?)</pre>', text, re.S)
    assert m, "no 'Invalid query' message"
    assert html.unescape(m.group(1)).strip() == r.text.strip()


# --- catalogs and classes -----------------------------------------------------------------------

def test_catalogs_json(board: Http, estate: Estate):
    """/catalogs/json reads X-Records of a /nodes query: pdbmux counts each node once, from its
    owner, so X-Records is the exact count of distinct nodes."""
    board.get("/catalogs")
    nodes = estate.catalog_nodes("production")
    data = board.json("/catalogs/json", params=datatables(column=0, direction="asc"))
    certnames = [cell_html_link(row[0])[1] for row in data["data"]]
    assert data["recordsTotal"] == len(nodes)
    assert certnames == nodes, "every node with a catalog once, by certname ascending"
    page = board.json("/catalogs/json", params=datatables(start=3, length=4, column=0,
                                                          direction="asc"))
    assert [cell_html_link(row[0])[1] for row in page["data"]] == nodes[3:7]
    assert page["recordsTotal"] == len(nodes)


def check_catalog_page(board: Http, estate: Estate, certname: str) -> None:
    env = estate.winner(certname)["environment"]
    prefix = "" if env == "production" else env_path(env)
    text = board.get(f"{prefix}/catalog/{certname}").text
    tables = Tables(text).tables
    summary, resources, edges = tables[0], tables[1], tables[2]
    catalog = estate.merged_catalog(certname)
    row = summary.rows[0]
    assert row[0].links[0][1] == certname
    assert (row[1].text.strip(), row[2].text.strip()) == (
        catalog["version"], catalog["transaction_uuid"]), (
        f"{certname}: the catalog of its catalog owner {estate.owner(certname, kind='catalog')}")
    shown = sorted(r[0].text.strip() for r in resources.rows)
    assert shown == sorted(f"{r['type']}[{r['title']}]" for r in catalog["resources"])
    assert len(edges.rows) == len(catalog["edges"])


def test_catalog_pages(board: Http, estate: Estate):
    for certname in estate.catalog_nodes("*"):
        if len(estate.active_backends(certname)) > 1 or estate.winner(
                certname)["environment"] != "production":
            check_catalog_page(board, estate, certname)
    nodes = estate.catalog_nodes("production")
    board.get(f"/catalogs/compare/{nodes[0]}...{nodes[-1]}")


def test_classes(board: Http, estate: Estate):
    """Class pages: per node, the owner's latest report and its events (all in class Main)."""
    board.get("/classes")
    with_events = {c: estate.event_counts(c) for c in estate.catalog_nodes("production")
                   if sum(estate.event_counts(c).values())}

    def class_status(counts):
        return ("failure" if counts["failures"] else "success" if counts["successes"]
                else "noop" if counts["noops"] else "skipped")

    data = board.json("/class_resource/Main/json")["data"]
    rows = {cell_html_link(row[0])[1]: row for row in data}
    assert len(rows) == len(data)
    assert sorted(rows) == sorted(with_events)
    for certname, row in rows.items():
        assert report_hash_of(cell_html_link(row[1])[0]) == estate.latest_report(certname)["hash"]
        assert cell_html_link(row[2])[1].lower() == class_status(with_events[certname])
    data = board.json("/classes/json")["data"]
    assert [cell_html_link(row[0])[1] for row in data] == ["Main"]
    assert int(re.sub(r"<[^>]+>", "", data[0][1]).strip()) == len(with_events)


# --- pypuppetdb directly ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def db(pdbmux: Http):
    parts = urllib.parse.urlsplit(pdbmux.base)
    return connect(host=parts.hostname, port=parts.port, timeout=30)


def test_pypuppetdb_nodes(db, estate: Estate):
    nodes = list(db.nodes())
    once([n.name for n in nodes], "pypuppetdb nodes()")
    assert sorted(n.name for n in nodes) == estate.active_certnames()
    for n in nodes:
        want = parse_ts(estate.winner(n.name)["report_timestamp"])
        assert n.report_timestamp == want, f"{n.name}: report_timestamp of the owner"


def test_pypuppetdb_node_and_catalog(db, estate: Estate):
    shared = [c for c in estate.active_certnames() if len(estate.active_backends(c)) > 1]
    for certname in shared:
        node = db.node(certname)
        assert node.report_timestamp == parse_ts(estate.winner(certname)["report_timestamp"])
        if estate.winner(certname)["catalog_producer_timestamp"] is not None:
            assert db.catalog(certname).version == estate.merged_catalog(certname)["version"]


def test_pypuppetdb_facts(db, estate: Estate):
    facts = list(db.facts(name="kernel"))
    once([f.node for f in facts], "pypuppetdb facts(name='kernel')")
    assert sorted(f.node for f in facts) == estate.fact_nodes("*")
    facts = list(db.facts(name="e2e_weight"))
    assert {f.node: f.value for f in facts} == {
        c: estate.merged_facts(c)["e2e_weight"] for c in estate.fact_nodes("*")}


def test_pypuppetdb_environments_and_fact_names(db, estate: Estate):
    assert sorted(e["name"] for e in db.environments()) == sorted(estate.environments())
    names = db.fact_names()
    once(names, "fact_names()")
    assert "e2e_staging_only" in names


def test_pypuppetdb_reports_and_version(db, estate: Estate):
    certname = next(r["certname"] for r in estate.reports
                    if sum(1 for o in estate.reports if o["hash"] == r["hash"]) > 1)
    reports = list(db.reports(query=EqualsOperator("certname", certname)))
    assert sorted(r.hash_ for r in reports) == sorted(
        {r["hash"] for r in estate.reports if r["certname"] == certname})
    versions = {requests.get(f"{estate.urls[n]}/pdb/meta/v1/version", timeout=10).json()["version"]
                for n in estate.order}
    assert db.current_version() == min(versions, key=lambda v: [int(x) for x in v.split(".")])
    assert db.metric("puppetlabs.puppetdb.population:name=num-nodes")["Value"] == len(
        estate.active_certnames())
