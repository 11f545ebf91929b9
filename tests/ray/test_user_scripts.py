"""Existing training scripts with gradwire's three lines, under a coordinator.

``examples/ray_train_spirals.py`` is a TorchTrainer script in the style of Ray's documentation
(``prepare_data_loader``, an epoch loop, ``ray.train.report`` with a checkpoint) with
``gradwire.ray.prepare``/``gradwire.ray.step`` added; ``examples/torchrun_spirals.py`` the same
for ``torchrun``. Each runs as the user would run it, as its own process (the Ray script as a
driver on the session's cluster), and reports to a coordinator through ``GRADWIRE_URL``.
"""

import os
import re
import subprocess
import sys
import threading

import httpx
import pytest
from support.api import history_of
from support.servers import REPO_ROOT, wait_for

pytestmark = pytest.mark.slow

STEP_PHASES = ("data", "forward", "backward", "optimizer")


def spawn(command, env):
    """Start ``command``; its output is collected in a thread (read it after ``wait``)."""
    proc = subprocess.Popen(command, cwd=REPO_ROOT, env={**os.environ, **env}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    lines = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    proc.lines, proc.reader = lines, reader
    return proc


def finish(proc, timeout_s):
    try:
        proc.wait(timeout_s)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        proc.reader.join(10)
    return "".join(proc.lines)


def running_job(url, proc):
    """The script's job once it has reported a step; fails at once if the script died."""
    if proc.poll() is not None:
        raise AssertionError(f"the script exited with {proc.returncode}:\n{finish(proc, 10)[-5000:]}")
    job = the_job(url)
    return job if job and job["step"] > 0 else None


def the_job(url):
    jobs = httpx.get(f"{url}/v1/jobs", timeout=5).json()
    return jobs[0] if jobs else None


def per_rank(output):
    """rank -> (compressor, switches text) from the scripts' last lines."""
    return {int(m[1]): (m[2], m[3]) for m in re.finditer(r"rank (\d+): compressor (\S+), switches (\[.*?\])", output)}


@pytest.mark.timeout(300)
def test_a_ray_train_script_with_gradwire_trains_under_the_coordinator_and_follows_a_pin(
        ray_head, start_coordinator, tmp_path):
    url = start_coordinator(history_interval_s=0).url
    script = spawn([sys.executable, "examples/ray_train_spirals.py", "--workers", "2", "--epochs", "30",
                    "--storage", str(tmp_path / "runs")],
                   {"RAY_ADDRESS": ray_head, "GRADWIRE_URL": url})
    try:
        job = wait_for(lambda: running_job(url, script), 180, "the script's first report")
        pin = httpx.put(f"{url}/v1/jobs/{job['id']}/policy", json={"mode": "pinned", "compressor": "powersgd", "rank": 2},
                        timeout=10)
        assert pin.status_code == 200, pin.text
    finally:
        output = finish(script, 240)
    assert script.returncode == 0, output[-5000:]

    done = httpx.get(f"{url}/v1/jobs/{job['id']}", timeout=5).json()
    assert done["state"] == "succeeded" and done["step"] == done["steps"] == 30 * 32, done
    assert done["spec"]["external"] and done["spec"]["model"]["name"] == "gw_example.models:SpiralNet"
    assert (done["compressor"], done["compressor_rank"]) == ("powersgd", 2)
    for phase in STEP_PHASES:
        assert done["phase_seconds"][phase] > 0, phase
    history = history_of(url, job["id"])
    assert [d["source"] for d in history["decisions"]] == ["config", "pinned"]
    compressors = [p["compressor"] for p in history["telemetry"]]
    assert compressors[0] == "acpsgd" and compressors[-1] == "powersgd"

    ranks = per_rank(output)
    assert sorted(ranks) == [0, 1], output[-3000:]
    for compressor, _switches in ranks.values():  # every worker applied the pin, at the same step
        assert compressor == "powersgd-r2"
    assert len({switches for _, switches in ranks.values()}) == 1 and "'powersgd-r2', 1)" in ranks[0][1]
    metrics = httpx.get(f"{url}/metrics", timeout=5).text
    assert re.search(rf'gradwire_step_phase_seconds_count\{{[^}}]*job="{job["id"]}"', metrics)


@pytest.mark.timeout(240)
def test_a_torchrun_script_with_gradwire_reports_to_the_coordinator(start_coordinator, tmp_path):
    url = start_coordinator(history_interval_s=0).url
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    script = spawn([torchrun, "--nproc-per-node", "2", "examples/torchrun_spirals.py", "--epochs", "6"],
                   {"GRADWIRE_URL": url, "OMP_NUM_THREADS": "1"})
    output = finish(script, 200)
    assert script.returncode == 0, output[-5000:]
    job = the_job(url)
    assert job["state"] == "succeeded" and job["step"] == 6 * 32, job
    assert job["name"] == "torchrun" and job["world_size"] == 2
    for phase in STEP_PHASES + ("communicate",):
        assert job["phase_seconds"][phase] > 0, phase
    assert history_of(url, job["id"])["telemetry"]
    assert sorted(per_rank(output)) == [0, 1]
    accuracy = [float(a) for a in re.findall(r"held-out accuracy ([0-9.]+)", output)]
    # 3 classes: 0.33 at chance; the example seeds its weights, so this run gives 0.88 (3 epochs: 0.44)
    assert len(accuracy) == 2 and min(accuracy) > 0.5
