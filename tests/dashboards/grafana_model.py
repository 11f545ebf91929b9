"""Reading the committed Grafana dashboard the way Grafana does, and running its queries on a
real Prometheus the way Grafana would (template variables substituted).

Shared by the dashboard tests; the tests read the committed JSON (what Grafana loads), never
the generator, so a stale or hand-broken file fails them.
"""

from __future__ import annotations

import json
import math
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

REPO_ROOT = Path(__file__).resolve().parents[2]
DASHBOARD_JSON = REPO_ROOT / "dashboards" / "grafana" / "gradwire.json"

#: What Grafana would put for its interval macros; long enough to hold several 0.5 s scrapes.
INTERVAL = "30s"


@dataclass(frozen=True)
class Query:
    """One PromQL expression of the dashboard and where it comes from."""

    where: str  # "panel 'Title' A" or "annotation 'Name'"
    expr: str


def load_dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD_JSON.read_text())


def data_panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    """Panels that query data (rows only group them), including panels inside collapsed rows."""
    panels: list[dict[str, Any]] = []
    for panel in dashboard.get("panels", []):
        if panel.get("type") == "row":
            panels.extend(panel.get("panels", []))
        else:
            panels.append(panel)
    return panels


def queries(dashboard: dict[str, Any]) -> list[Query]:
    """Every panel target and every Prometheus annotation query."""
    found = [Query(f"panel {p['title']!r} {t['refId']}", t["expr"])
             for p in data_panels(dashboard) for t in p.get("targets", [])]
    found += [Query(f"annotation {a['name']!r}", a["expr"])
              for a in dashboard.get("annotations", {}).get("list", []) if a.get("expr")]
    return found


def job_variable(dashboard: dict[str, Any]) -> dict[str, Any]:
    matches = [v for v in dashboard["templating"]["list"] if v.get("name") == "job"]
    assert len(matches) == 1, "the dashboard needs exactly one `job` template variable"
    return matches[0]


def substitute(expr: str, job_id: str, interval: str = INTERVAL) -> str:
    """Grafana's interpolation for our variables: ``$job``/``${job}`` (one job selected; its
    value sits inside ``=~"..."``, and hex job ids need no regex escaping) and the interval
    macros. Any ``$`` left afterwards is a variable Grafana would not know."""
    text = expr.replace("$__rate_interval", interval).replace("$__interval", interval)
    text = re.sub(r"\$\{job(:\w+)?\}|\$job\b", re.escape(job_id), text)
    assert "$" not in text, f"unknown variable left in {text!r}"
    return text


def query_range(prometheus_url: str, promql: str, start: float, end: float, step: float = 1.0) -> list[dict[str, Any]]:
    response = httpx.get(f"{prometheus_url}/api/v1/query_range",
                         params={"query": promql, "start": start, "end": end, "step": step}, timeout=10)
    body = response.json()
    assert body.get("status") == "success", f"Prometheus refused {promql!r}: {body}"
    return body["data"]["result"]


def finite_points(series: list[dict[str, Any]]) -> int:
    """Samples that a panel would draw (NaN from 0/0 rates and infinities draw nothing)."""
    return sum(1 for s in series for _, v in s["values"] if math.isfinite(float(v)))


def empty_queries(prometheus_url: str, dashboard: dict[str, Any], job_id: str, start: float) -> dict[str, str]:
    """Run every query over [start, now] as Grafana would for that time range; returns the
    ones that drew nothing (where -> substituted PromQL)."""
    end = time.time()
    empty: dict[str, str] = {}
    for query in queries(dashboard):
        promql = substitute(query.expr, job_id)
        if finite_points(query_range(prometheus_url, promql, start, end)) == 0:
            empty[query.where] = promql
    return empty


def job_variable_values(prometheus_url: str, dashboard: dict[str, Any]) -> list[str]:
    """The values Grafana's ``label_values(metric, label)`` variable query would offer."""
    match = re.fullmatch(r"\s*label_values\(\s*(.+?)\s*,\s*(\w+)\s*\)\s*", str(job_variable(dashboard)["query"]))
    assert match, f"unexpected variable query {job_variable(dashboard)['query']!r}"
    selector, label = match.groups()
    body = httpx.get(f"{prometheus_url}/api/v1/label/{label}/values", params={"match[]": selector}, timeout=10).json()
    assert body.get("status") == "success", body
    return body["data"]


def wait_until_all_have_data(prometheus_url: str, dashboard: dict[str, Any], job_id: str, start: float,
                             timeout_s: float = 30) -> dict[str, str]:
    """Scrapes lag the last report by up to one interval: poll until every query has data."""
    deadline = time.monotonic() + timeout_s
    while True:
        empty = empty_queries(prometheus_url, dashboard, job_id, start)
        if not empty or time.monotonic() > deadline:
            return empty
        time.sleep(1.0)
