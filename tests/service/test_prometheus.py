"""A real Prometheus server scrapes the coordinator and answers PromQL with our series."""

import pytest
from support.api import ALL_PHASES, report, submit
from support.prometheus import PrometheusServer, prometheus_missing

pytestmark = [pytest.mark.slow, pytest.mark.skipif(prometheus_missing() is not None,
                                                   reason=prometheus_missing() or "")]


@pytest.fixture
def prometheus_for(tmp_path):
    servers = []

    def start(target_url: str) -> PrometheusServer:
        server = PrometheusServer(tmp_path / "prom", [target_url.removeprefix("http://")])
        servers.append(server.start())
        return server

    yield start
    for server in servers:
        server.stop()


def test_prometheus_scrapes_phase_series_per_job(coordinator, prometheus_for):
    job = submit(coordinator.url)
    for step in (5, 10, 15):
        assert report(coordinator.url, job, step).status_code == 200
    prom = prometheus_for(coordinator.url)

    series = prom.wait_query(f'gradwire_step_phase_seconds_count{{job="{job["id"]}"}}', min_series=len(ALL_PHASES))
    assert sorted(s["metric"]["phase"] for s in series) == sorted(ALL_PHASES)
    assert all(float(s["value"][1]) == 3.0 for s in series)

    mean_backward = prom.query(
        f'gradwire_step_phase_seconds_sum{{job="{job["id"]}",phase="backward"}}'
        f' / gradwire_step_phase_seconds_count{{job="{job["id"]}",phase="backward"}}')
    assert float(mean_backward[0]["value"][1]) == pytest.approx(0.009)

    bandwidth = prom.query(f'gradwire_network_bandwidth_bytes_per_second{{job="{job["id"]}"}}')
    assert float(bandwidth[0]["value"][1]) == 5e8
    running = prom.query('gradwire_jobs{state="running"}')
    assert float(running[0]["value"][1]) == 1.0
    assert prom.query('up{job="gradwire"}')[0]["value"][1] == "1"
