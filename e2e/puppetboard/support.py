"""Support for the Puppetboard e2e tests: the fixture estate's expectations, HTTP helpers, and
parsers for what Puppetboard renders.

Expectations come from fixture.json (what e2e/fixture/load.py sent and what the backends computed
from it) or from the backends queried directly, never from pdbmux's answers. The merge rules
applied here are docs/merging.md's:

- Each kind of node data has its owner among the backends where the node is active ("Who owns
  a node"): the one whose copy was produced last, a tie going to configured order. The node
  record and its latest report: the newer report_timestamp (a null one older than any), then
  the newer facts, then the newer catalog producer_timestamp; facts (/facts, /facts/<name>,
  /factsets, inventory): the newer factset producer_timestamp; the catalog (/catalogs,
  /resources, /edges): the newer catalog producer_timestamp. Receive times are never compared.
- /reports, /events: union; a report stored in two backends is one record (dedupe on hash) and
  counted once by include_total and aggregates ("History counted once").
- Population MBeans ("Metrics"): num-nodes = distinct active certnames; num-resources = resources
  counted once, from each node's owner over every node state.
"""

from __future__ import annotations

import datetime as dt
import html
import json
import re
import urllib.parse
from html.parser import HTMLParser

import requests

STATUS_OF_KIND = {"changed": "changed", "failed": "failed", "noop": "noop",
                  "unchanged": "unchanged"}


def parse_ts(value: str | None) -> dt.datetime | None:
    if value is None:
        return None
    return dt.datetime.strptime(value, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=dt.timezone.utc)


# --- the estate -------------------------------------------------------------------------------

class Estate:
    """fixture.json, with the merge rules applied (see the module docstring)."""

    def __init__(self, fixture: dict):
        self.fixture = fixture
        self.order = [b["name"] for b in fixture["backends"]]
        self.urls = {b["name"]: b["url"].rstrip("/") for b in fixture["backends"]}
        self.nodes = fixture["nodes"]
        self.reports = fixture["reports"]
        self.facts: dict[tuple[str, str], dict] = {}  # (backend, certname) -> newest fact values
        self.catalogs: dict[tuple[str, str], dict] = {}  # (backend, certname) -> newest catalog
        self.report_payloads: dict[tuple[str, str, str], dict] = {}  # (backend, certname, end)
        for cmd in fixture["commands"]:
            key = (cmd["backend"], cmd["certname"])
            payload = cmd["payload"]
            if cmd["command"] == "replace_facts":
                old = self.facts.get(key)
                if old is None or parse_ts(payload["producer_timestamp"]) >= old["_at"]:
                    self.facts[key] = dict(payload["values"], _at=parse_ts(payload["producer_timestamp"]))
            elif cmd["command"] == "replace_catalog":
                old = self.catalogs.get(key)
                if old is None or parse_ts(payload["producer_timestamp"]) >= parse_ts(
                        old["producer_timestamp"]):
                    self.catalogs[key] = payload
            elif cmd["command"] == "store_report":
                self.report_payloads[(cmd["backend"], cmd["certname"], payload["end_time"])] = payload

    # nodes

    def state(self, backend: str, certname: str) -> dict | None:
        return self.nodes[certname]["backends"].get(backend)

    def active_backends(self, certname: str) -> list[str]:
        per = self.nodes[certname]["backends"]
        return [b for b in self.order if b in per and per[b]["active"]]

    def owner(self, certname: str, active_only: bool = True, kind: str = "node") -> str | None:
        """The backend owning `kind` ("node", "facts" or "catalog") of the node's data among the
        backends where it is active (or, with `active_only=False`, every backend holding it):
        the one whose copy of that kind was produced last, then configured order."""
        per = self.nodes[certname]["backends"]
        holders = [b for b in self.order if b in per and (per[b]["active"] or not active_only)]
        fields = {"node": ["report_timestamp", "facts_producer_timestamp",
                           "catalog_producer_timestamp"],
                  "facts": ["facts_producer_timestamp"],
                  "catalog": ["catalog_producer_timestamp"]}[kind]

        def freshness(b: str):
            out = []
            for field in fields:
                t = parse_ts(per[b].get(field))
                out += [t is not None, t or dt.datetime.min.replace(tzinfo=dt.timezone.utc)]
            return tuple(out)

        best = None
        for b in holders:  # configured order: a full tie keeps the first
            if best is None or freshness(b) > freshness(best):
                best = b
        return best

    def active_certnames(self) -> list[str]:
        return sorted(c for c in self.nodes if self.owner(c) is not None)

    def winner(self, certname: str, kind: str = "node") -> dict:
        """The state of the backend owning `kind` of the node's data."""
        return self.state(self.owner(certname, kind=kind), certname)

    def catalog_nodes(self, env: str) -> list[str]:
        """Active certnames whose merged node record has catalog_environment = env ('*': any) and
        a catalog."""
        out = []
        for c in self.active_certnames():
            w = self.winner(c, "catalog")
            if w["catalog_producer_timestamp"] is not None and env in ("*", w["environment"]):
                out.append(c)
        return out

    def fact_nodes(self, env: str) -> list[str]:
        """Active certnames whose facts owner holds facts in env ('*': any)."""
        return [c for c in self.active_certnames()
                if (self.owner(c, kind="facts"), c) in self.facts
                and env in ("*", self.winner(c, "facts")["environment"])]

    def owned_resources(self, certnames) -> int:
        return sum(self.winner(c, "catalog")["catalog_resources"] for c in certnames)

    def population_resources(self) -> int:
        """num-resources: every node's catalog resources, from its catalog owner over every node state
        (a deactivated node's catalog still counts, as in one PuppetDB)."""
        total = 0
        for c in self.nodes:
            owner = self.owner(c, active_only=False, kind="catalog")
            if owner is not None:
                total += self.state(owner, c).get("catalog_resources") or 0
        return total

    def merged_facts(self, certname: str) -> dict:
        return self.facts[(self.owner(certname, kind="facts"), certname)]

    def merged_catalog(self, certname: str) -> dict:
        return self.catalogs[(self.owner(certname, kind="catalog"), certname)]

    def status(self, certname: str) -> str:
        """What Puppetboard shows for the merged node (its UNRESPONSIVE_HOURS set wide enough)."""
        kind = self.winner(certname)["latest_report_kind"]
        return "unreported" if kind is None else STATUS_OF_KIND[kind]

    def latest_report(self, certname: str) -> dict | None:
        """The owner's newest report (fixture.json's report entry, with its hash)."""
        owner = self.owner(certname)
        ts = self.winner(certname)["report_timestamp"]
        if ts is None:
            return None
        found = [r for r in self.reports if r["backend"] == owner and r["certname"] == certname
                 and r["end_time"] == ts]
        assert len(found) == 1, f"fixture: {len(found)} reports of {certname} in {owner} at {ts}"
        return found[0]

    def report_events(self, report: dict) -> list[str]:
        """Event statuses of a fixture report, as PuppetDB records them (a skipped resource with no
        events gets one `skipped` event)."""
        payload = self.report_payloads[(report["backend"], report["certname"], report["end_time"])]
        statuses = []
        for res in payload["resources"]:
            if res["events"]:
                statuses += [e["status"] for e in res["events"]]
            elif res["skipped"]:
                statuses.append("skipped")
        return sorted(statuses)

    def event_counts(self, certname: str) -> dict:
        """failures/successes/skips/noops of the owner's latest report (the node list's counts)."""
        report = self.latest_report(certname)
        statuses = self.report_events(report) if report else []
        return {"failures": statuses.count("failure"), "successes": statuses.count("success"),
                "skips": statuses.count("skipped"), "noops": statuses.count("noop")}

    # reports

    def env_reports(self, env: str) -> list[dict]:
        """Every (backend, report) entry of env ('*': all): a report stored in two backends twice."""
        return [r for r in self.reports if env in ("*", r["environment"])]

    def distinct_reports(self, env: str) -> list[dict]:
        """env's reports, each once (the first backend's entry of a report stored in two)."""
        return list({r["hash"]: r for r in reversed(self.env_reports(env))}.values())[::-1]

    def env_report_hashes(self, env: str) -> set[str]:
        return {r["hash"] for r in self.env_reports(env)}

    def environments(self) -> set[str]:
        return {s["environment"] for n in self.nodes.values() for s in n["backends"].values()}


# --- HTTP ---------------------------------------------------------------------------------------

class Http:
    """A requests session against one base URL, with failure messages that say where to look."""

    def __init__(self, base: str, what: str, log: str | None = None):
        self.base = base.rstrip("/")
        self.what = what
        self.log = log
        self.session = requests.Session()

    def url(self, path: str) -> str:
        return self.base + path

    def get(self, path: str, expect: int | None = 200, **kw) -> requests.Response:
        kw.setdefault("timeout", 60)
        kw.setdefault("allow_redirects", False)
        r = self.session.get(self.url(path), **kw)
        if expect is not None:
            assert r.status_code == expect, self.explain(r, f"expected {expect}")
        return r

    def post(self, path: str, data: dict, expect: int | None = 200, **kw) -> requests.Response:
        kw.setdefault("timeout", 60)
        r = self.session.post(self.url(path), data=data, **kw)
        if expect is not None:
            assert r.status_code == expect, self.explain(r, f"expected {expect}")
        return r

    def json(self, path: str, **kw):
        r = self.get(path, **kw)
        try:
            return r.json()
        except ValueError:
            raise AssertionError(self.explain(r, "not JSON")) from None

    def explain(self, r: requests.Response, why: str) -> str:
        msg = (f"{self.what}: {r.request.method} {r.url} -> {r.status_code} ({why})\n"
               f"body: {r.text[:1500]}")
        if self.log:
            msg += f"\n{self.what}'s log (the PuppetDB request and traceback behind a 500): {self.log}"
            try:
                with open(self.log, errors="replace") as f:
                    msg += "\n---- its last 40 lines ----\n" + "".join(f.readlines()[-40:])
            except OSError:
                pass
        return msg


def pdb_query(base: str, endpoint: str, query=None, **params) -> requests.Response:
    """GET /pdb/query/v4/<endpoint> on a PuppetDB API (a backend or pdbmux)."""
    if query is not None:
        params["query"] = json.dumps(query)
    r = requests.get(f"{base.rstrip('/')}/pdb/query/v4/{endpoint}", params=params, timeout=60)
    assert r.status_code == 200, f"GET {r.url} -> {r.status_code}: {r.text[:500]}"
    return r


# --- HTML ---------------------------------------------------------------------------------------

class Cell:
    def __init__(self, attrs: dict):
        self.attrs = attrs
        self.text = ""
        self.links: list[tuple[str, str]] = []  # (href, text)
        self.spans: list[tuple[dict, str]] = []  # (attrs, text)

    def __repr__(self):
        return f"Cell({self.text.strip()!r}, links={self.links})"


class Table:
    def __init__(self, attrs: dict):
        self.attrs = attrs
        self.head: list[str] = []
        self.rows: list[list[Cell]] = []


class Tables(HTMLParser):
    """Every <table> of a page: header texts and body rows of cells (text, links, spans)."""

    def __init__(self, text: str):
        super().__init__(convert_charrefs=True)
        self.tables: list[Table] = []
        self._table = None
        self._row = None
        self._cell = None
        self._in_head = False
        self._th = None
        self._link = None
        self._span = None
        self.feed(text)
        self.close()

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "table":
            self._table = Table(a)
            self.tables.append(self._table)
        elif self._table is None:
            return
        elif tag == "thead":
            self._in_head = True
        elif tag == "tr" and not self._in_head:
            self._row = []
            self._table.rows.append(self._row)
        elif tag == "th" and self._in_head:
            self._th = ""
        elif tag in ("td", "th") and self._row is not None:
            self._cell = Cell(a)
            self._row.append(self._cell)
        elif tag == "a" and self._cell is not None:
            self._link = [a.get("href", ""), ""]
        elif tag == "span" and self._cell is not None:
            self._span = [a, ""]

    def handle_endtag(self, tag):
        if tag == "table":
            self._table = None
        elif tag == "thead":
            self._in_head = False
        elif tag == "th" and self._th is not None:
            self._table.head.append(self._th.strip())
            self._th = None
        elif tag in ("td", "th"):
            self._cell = None
        elif tag == "tr":
            self._row = None
        elif tag == "a" and self._link is not None and self._cell is not None:
            self._cell.links.append((self._link[0], self._link[1].strip()))
            self._link = None
        elif tag == "span" and self._span is not None and self._cell is not None:
            self._cell.spans.append((self._span[0], self._span[1].strip()))
            self._span = None

    def handle_data(self, data):
        if self._th is not None:
            self._th += data
        if self._cell is not None:
            self._cell.text += data
        if self._link is not None:
            self._link[1] += data
        if self._span is not None:
            self._span[1] += data

    def by_id(self, table_id: str) -> Table:
        for t in self.tables:
            if t.attrs.get("id") == table_id:
                return t
        raise AssertionError(f"no table id={table_id!r} among {[t.attrs for t in self.tables]}")


def links(text: str) -> list[str]:
    """Every href of the page, HTML-unescaped."""
    return [html.unescape(h) for h in re.findall(r'href="([^"]*)"', text)]


def node_links(text: str) -> list[str]:
    """Certnames of every link to a node page (/node/<c> or /<env>/node/<c>), in page order."""
    out = []
    for h in links(text):
        m = re.fullmatch(r"(?:/[^/]+)?/node/([^/?#]+)", h)
        if m:
            out.append(urllib.parse.unquote(m.group(1)))
    return out


def environment_selector(text: str) -> dict[str, str]:
    """The environment selector's entries: name -> link target."""
    m = re.search(r'select-environment">(.*?</div>)\s*</div>', text, re.S)
    assert m, "no environment selector (class select-environment) on the page"
    items = re.findall(r'<div class="item" data-value="([^"]*)"><i class="[^"]*"></i>([^<]+)</div>',
                       m.group(1))
    return {name.strip(): html.unescape(value) for value, name in items}


def overview_numbers(text: str) -> dict[str, int]:
    """The overview's figures: population, resources, avg, and the node count per status."""
    out = {}
    for label, key in (("Population", "population"), ("Resources managed", "resources"),
                       ("Avg. resources/node", "avg")):
        m = re.search(r'<h1 class="ui header darkblue no-margin-bottom">\s*(-?\d+)\s*</h1>\s*'
                      r'<span>' + re.escape(label) + r'</span>', text)
        assert m, f"overview: no {label!r} figure"
        out[key] = int(m.group(1))
    for status, count in re.findall(
            r'<a href="[^"]*nodes\?status=(\w+)">\s*<h1 class="[^"]*">\s*(\d+)\s*<small>', text):
        out[status] = int(count)
    return out


def status_cell(cell: Cell) -> tuple[str, str | None, list[int]]:
    """A node row's status cell: (status, report link, [failures, successes, skips, noops])."""
    assert cell.links, f"status cell without a link: {cell}"
    href, label = cell.links[0]
    counts = [int(t) for a, t in cell.spans if "count" in a.get("class", "")]
    return label.lower(), href, counts


def js_var(text: str, name: str):
    """The JSON value of `var <name> = ...;` on one line of a page's script."""
    m = re.search(r"^\s*var " + re.escape(name) + r" = (.*?);?\s*$", text, re.M)
    assert m, f"no `var {name} =` in the page"
    return json.loads(m.group(1))
