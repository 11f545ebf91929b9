"""Issue 17.2: losing the Ray head must not take the coordinator down.

A coordinator with its own embedded local head runs a job; the head's whole process group is
killed (what a crashed head node looks like). The coordinator must stay up past Ray's 60 s
driver give-up, ``/healthz`` must say the head is lost (not "connected"), the job must end
failed with a reason saying the head was lost, and after the coordinator has restarted its
local head a new job must run to the end.
"""

from __future__ import annotations

import os
import signal
import time

import httpx
import pytest
from support.api import SMALLEST_SPEC
from support.servers import CoordinatorProcess, healthy, wait_for

from coordinator import raylocal

pytestmark = pytest.mark.slow

FAKE = "tests.support.fake_runner:run_job"
TERMINAL = {"succeeded", "failed", "cancelled"}
#: Ray's driver terminates its process this long after the GCS went away.
RAY_DRIVER_GIVE_UP_S = 60


def _job(url: str, job_id: str) -> dict:
    return httpx.get(f"{url}/v1/jobs/{job_id}", timeout=10).json()


def _spec(name: str, steps: int) -> dict:
    return {**SMALLEST_SPEC, "name": name, "steps": steps, "report_interval_s": 0.3}


@pytest.mark.timeout(420)
def test_the_coordinator_survives_losing_its_ray_head_and_restarts_it(tmp_path):
    data_dir = tmp_path / "coordinator"
    coordinator = CoordinatorProcess(data_dir, env={
        "GRADWIRE_LAUNCHER": "ray", "GRADWIRE_RUNNER": FAKE, "GRADWIRE_RAY_PORT": str(raylocal.free_port()),
        "GRADWIRE_RAY_NUM_CPUS": "2", "GRADWIRE_POLL_INTERVAL_S": "0.2", "GRADWIRE_HISTORY_INTERVAL_S": "0"})
    try:
        coordinator.start(timeout_s=180)
        url = coordinator.url
        job = httpx.post(f"{url}/v1/jobs", json=_spec("on-the-lost-head", 100_000), timeout=10).json()
        wait_for(lambda: _job(url, job["id"])["step"] > 0, 120, "the first report")

        head_pid = raylocal._recorded_pid(data_dir)
        assert head_pid is not None
        os.killpg(head_pid, signal.SIGKILL)  # the head and every Ray process it started
        killed_at = time.monotonic()

        lost = wait_for(lambda: (h := healthy(url)) and h["ray"].startswith("lost") and h, 60,
                        "/healthz to report the lost head")
        assert lost["status"] == "degraded"
        assert "restarting the local Ray head" in lost["ray"]

        failed = wait_for(lambda: (j := _job(url, job["id"]))["state"] in TERMINAL and j, 240,
                          "the job on the lost head to end")
        assert failed["state"] == "failed"
        assert failed["reason"].startswith("the Ray head was lost at "), failed["reason"]
        assert failed["reason"].endswith("the job's runner did not survive it")

        wait_for(lambda: (h := healthy(url)) and h["ray"] == "connected", 180, "the restarted head")
        again = httpx.post(f"{url}/v1/jobs", json=_spec("on-the-new-head", 20), timeout=10).json()
        done = wait_for(lambda: (j := _job(url, again["id"]))["state"] in TERMINAL and j, 120,
                        "the job on the restarted head")
        assert done["state"] == "succeeded", done

        # Past the point where Ray's driver would have terminated the coordinator's process.
        time.sleep(max(0.0, RAY_DRIVER_GIVE_UP_S + 5 - (time.monotonic() - killed_at)))
        assert coordinator.proc is not None and coordinator.proc.poll() is None, coordinator.log()
        health = healthy(url)
        assert health is not None and (health["status"], health["ray"]) == ("ok", "connected")
    finally:
        coordinator.stop()
        raylocal.stop_head(data_dir)
