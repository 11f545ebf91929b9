"""The committed dashboard JSON has what Grafana needs, names only metrics the coordinator
exports, covers every metric of docs/coordinator.md, and is what ``dashboards/generate.py`` builds."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys

import pytest
import yaml
from grafana_model import DASHBOARD_JSON, REPO_ROOT, data_panels, job_variable, load_dashboard, queries

GENERATOR = REPO_ROOT / "dashboards" / "generate.py"
DATASOURCE_PROVISIONING = REPO_ROOT / "dashboards" / "provisioning" / "datasources" / "prometheus.yml"
#: Visualisations the dashboard may use (core Grafana panel plugins).
PANEL_TYPES = {"timeseries", "state-timeline", "stat", "bargauge", "table", "text"}
#: docs/coordinator.md ("Metrics"), without the ``gradwire_`` prefix.
DESIGN_METRICS = ("step_phase_seconds", "step_seconds", "samples_per_second", "train_loss",
                  "network_bandwidth_bytes_per_second", "network_latency_seconds", "comm_bytes_total",
                  "compression_ratio", "compressor_info", "policy_switches_total", "jobs")

needs_sdk = pytest.mark.skipif(importlib.util.find_spec("grafana_foundation_sdk") is None,
                               reason="grafana-foundation-sdk is not installed (pip install -e '.[test]')")


@pytest.fixture(scope="module")
def dashboard():
    return load_dashboard()


def _datasource_uid() -> str:
    provisioned = yaml.safe_load(DATASOURCE_PROVISIONING.read_text())
    (entry,) = provisioned["datasources"]
    return entry["uid"]


def test_dashboard_has_the_fields_grafana_needs(dashboard):
    assert re.fullmatch(r"[A-Za-z0-9_-]{1,40}", dashboard["uid"])
    assert dashboard["title"]
    assert isinstance(dashboard["schemaVersion"], int) and dashboard["schemaVersion"] >= 36
    uid = _datasource_uid()
    panels = data_panels(dashboard)
    assert len(panels) >= 10
    ids = [p["id"] for p in dashboard["panels"]] + [p["id"] for r in dashboard["panels"] for p in r.get("panels", [])]
    assert all(isinstance(i, int) for i in ids) and len(ids) == len(set(ids)), "panel ids must be unique ints"
    for panel in panels:
        where = f"panel {panel.get('title')!r}"
        assert panel["type"] in PANEL_TYPES, where
        assert panel["title"], where
        grid = panel["gridPos"]
        assert all(isinstance(grid[k], int) for k in "hwxy"), where
        assert grid["h"] > 0 and 0 < grid["w"] and grid["x"] + grid["w"] <= 24, where
        assert panel["datasource"] == {"type": "prometheus", "uid": uid}, where
        assert panel["targets"], where
        ref_ids = [t["refId"] for t in panel["targets"]]
        assert len(ref_ids) == len(set(ref_ids)), where
        for target in panel["targets"]:
            assert target["expr"].strip() and target["refId"], where
            assert target.get("datasource", panel["datasource"]) == panel["datasource"], where


def test_panels_do_not_overlap(dashboard):
    cells: dict[tuple[int, int], str] = {}
    for panel in dashboard["panels"]:
        grid = panel["gridPos"]
        for x in range(grid["x"], grid["x"] + grid["w"]):
            for y in range(grid["y"], grid["y"] + grid["h"]):
                assert (x, y) not in cells, f"{panel['title']!r} overlaps {cells[(x, y)]!r}"
                cells[(x, y)] = panel["title"]


def test_job_variable_and_its_use(dashboard):
    variable = job_variable(dashboard)
    assert variable["type"] == "query"
    assert variable["datasource"] == {"type": "prometheus", "uid": _datasource_uid()}
    assert re.fullmatch(r"label_values\(gradwire_\w+, job\)", variable["query"])
    # Every per-job query filters on the variable; only the coordinator-wide job count does not.
    for query in queries(dashboard):
        if "gradwire_jobs" in query.expr:
            continue
        assert 'job=~"$job"' in query.expr, query.where


def test_policy_switches_are_an_annotation(dashboard):
    (switches,) = [a for a in dashboard["annotations"]["list"] if "policy_switches" in a.get("expr", "")]
    assert switches["enable"] is True
    assert switches["datasource"] == {"type": "prometheus", "uid": _datasource_uid()}


def _exported_names() -> set[str]:
    """Every sample name the coordinator's registry can export (histogram/counter suffixes)."""
    from coordinator.metrics import CoordinatorMetrics

    metrics = CoordinatorMetrics(lambda: {}, grace_s=0)
    names: set[str] = set()
    for metric in metrics.registry.collect():
        suffixes = {"histogram": ("_sum", "_count", "_bucket"), "counter": ("_total",)}.get(metric.type, ("",))
        names.update(metric.name + s for s in suffixes)
    return names


def test_queries_name_only_exported_metrics_and_cover_design(dashboard):
    exported = _exported_names()
    used: set[str] = set()
    for query in queries(dashboard):
        names = set(re.findall(r"\bgradwire_\w+", query.expr))
        assert names <= exported, f"{query.where} names {sorted(names - exported)}, not exported"
        used |= names
    for metric in DESIGN_METRICS:
        assert any(n == f"gradwire_{metric}" or n.startswith(f"gradwire_{metric}_") for n in used), metric


@needs_sdk
def test_committed_json_is_what_the_generator_builds():
    result = subprocess.run([sys.executable, str(GENERATOR), "--check"], capture_output=True, text=True,
                            cwd=REPO_ROOT, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


@needs_sdk
def test_check_fails_on_a_stale_file(tmp_path):
    stale = tmp_path / "gradwire.json"
    stale.write_text(DASHBOARD_JSON.read_text().replace('"Step time by phase"', '"Renamed by hand"'))
    result = subprocess.run([sys.executable, str(GENERATOR), "--check", "--output", str(stale)],
                            capture_output=True, text=True, cwd=REPO_ROOT, timeout=60)
    assert result.returncode == 1
    assert "is stale" in result.stderr and "Renamed by hand" in result.stderr
