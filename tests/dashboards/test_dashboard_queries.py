"""Every PromQL expression of the committed dashboard returns data from a real Prometheus
scraping a real coordinator: the panels, the annotation and the ``job`` variable's values.

Two sources of data:
- reports posted the way rank 0 posts them (fast: no Ray, no torch), and
- a real short training job on a local Ray cluster through ``workers.runner.run_job``
  (slow), which proves the worker runtime really feeds every series the dashboard reads.

In both, the policy is pinned to another compressor while the job runs, so the switch
annotation and the compressor timeline have something to show whatever the adaptive policy
decides on this machine.
"""

from __future__ import annotations

import importlib.util
import time
import uuid

import httpx
import pytest
from grafana_model import job_variable_values, load_dashboard, wait_until_all_have_data
from support.api import ADAPTIVE_SPEC, PROFILE, report, submit
from support.prometheus import PrometheusServer, prometheus_missing
from support.servers import CoordinatorProcess, wait_for

pytestmark = pytest.mark.skipif(prometheus_missing() is not None, reason=prometheus_missing() or "")

REAL_RUNNER = "workers.runner:run_job"
TERMINAL = {"succeeded", "failed", "cancelled"}
#: Policy the test pins mid-run (a compressor switch the dashboard must show).
PINNED = {"mode": "pinned", "compressor": "powersgd", "rank": 2}


@pytest.fixture
def prometheus_for(tmp_path):
    """Factory: a real Prometheus scraping one coordinator every 0.5 s."""
    servers: list[PrometheusServer] = []

    def start(coordinator_url: str) -> PrometheusServer:
        server = PrometheusServer(tmp_path / f"prom{len(servers)}", [coordinator_url.removeprefix("http://")],
                                  scrape_interval_ms=500)
        servers.append(server.start())
        # Prometheus applies new targets ~5 s after start: wait for the first scrape, or the
        # first reports would fall before it and the rate() panels would see no increase.
        assert server.wait_query('up{job="gradwire"} == 1', timeout_s=30), "Prometheus never scraped"
        return server

    yield start
    for server in servers:
        server.stop()


def _assert_dashboard_has_data(prom: PrometheusServer, job_id: str, start: float) -> None:
    dashboard = load_dashboard()
    empty = wait_until_all_have_data(prom.url, dashboard, job_id, start)
    assert not empty, "queries without data:\n" + "\n".join(f"  {w}: {q}" for w, q in empty.items())
    assert job_id in job_variable_values(prom.url, dashboard)


def test_every_query_has_data_for_reported_telemetry(coordinator, prometheus_for):
    prom = prometheus_for(coordinator.url)
    start = time.time() - 5
    job = submit(coordinator.url, ADAPTIVE_SPEC)
    compressor, rank = "acpsgd", 4
    for i, step in enumerate(range(5, 35, 5)):
        if i == 3:
            response = httpx.put(f"{coordinator.url}/v1/jobs/{job['id']}/policy", json=PINNED, timeout=10)
            assert response.status_code == 200, response.text
            compressor, rank = PINNED["compressor"], PINNED["rank"]
        extra = {"profile": PROFILE} if i == 0 else {}
        posted = report(coordinator.url, job, step, compressor=compressor, compressor_rank=rank, **extra)
        assert posted.status_code == 200, posted.text
        time.sleep(0.6)  # > one scrape interval: each report lands in its own scrape
    _assert_dashboard_has_data(prom, job["id"], start)


# --------------------------------------------------------------------------- a real job


@pytest.fixture
def serve_real(ray_head, tmp_path):
    """A ``gradwire serve`` subprocess running jobs with the real runner on the session's Ray
    cluster, in a Ray namespace of its own."""
    # (The Ray auth mode comes with the environment: raylocal.ensure_head sets RAY_AUTH_MODE.)
    proc = CoordinatorProcess(tmp_path / "coordinator", env={
        "GRADWIRE_RAY_ADDRESS": ray_head, "GRADWIRE_RUNNER": REAL_RUNNER, "GRADWIRE_LAUNCHER": "ray",
        "GRADWIRE_RAY_NAMESPACE": f"gradwire-test-{uuid.uuid4().hex[:8]}", "GRADWIRE_POLL_INTERVAL_S": "0.2",
        "GRADWIRE_HISTORY_INTERVAL_S": "0"})
    try:
        yield proc.start(timeout_s=90)
        for job in httpx.get(f"{proc.url}/v1/jobs", timeout=5).json():
            if job["state"] not in TERMINAL:
                httpx.post(f"{proc.url}/v1/jobs/{job['id']}/cancel", timeout=30)
    except httpx.HTTPError:
        pass
    finally:  # also when it never became ready: the process must not outlive the test
        proc.stop()


@pytest.mark.slow
@pytest.mark.timeout(420)
@pytest.mark.skipif(importlib.util.find_spec("workers.runner") is None, reason="workers.runner not available")
def test_every_query_has_data_for_a_real_job(serve_real, prometheus_for):
    url = serve_real.url
    prom = prometheus_for(url)
    start = time.time() - 5
    # MLP on synthetic data, 2 CPU workers, adaptive compression; enough steps that the test
    # can pin another compressor while it runs, and frequent reports for the rate() panels.
    spec = {**ADAPTIVE_SPEC, "name": "dashboard-real", "steps": 200, "report_interval_s": 0.5}
    response = httpx.post(f"{url}/v1/jobs", json=spec, timeout=10)
    assert response.status_code == 201, response.text
    job_id = response.json()["id"]

    def job() -> dict:
        return httpx.get(f"{url}/v1/jobs/{job_id}", timeout=10).json()

    first = wait_for(lambda: (j := job())["state"] in TERMINAL or (j.get("step") or 0) > 0 and j, 180,
                     "the first telemetry report of the real job", interval_s=0.2)
    assert first["state"] == "running", f"job ended before its first report was seen: {first}\n{serve_real.log()}"
    pinned = httpx.put(f"{url}/v1/jobs/{job_id}/policy", json=PINNED, timeout=10)
    assert pinned.status_code == 200, f"could not pin the policy while the job ran: {pinned.text}"
    final = wait_for(lambda: (j := job())["state"] in TERMINAL and j, 300, "the real job to end", interval_s=0.5)
    assert final["state"] == "succeeded", f"{final}\n{serve_real.log()}"
    assert final["compressor"] == PINNED["compressor"], final
    _assert_dashboard_has_data(prom, job_id, start)
