"""The ``gradwire`` command against a real coordinator; ``demo`` end to end on Ray."""

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from support.api import SMALLEST_SPEC, report
from support.servers import REPO_ROOT
from typer.testing import CliRunner

from coordinator.cli import app
from coordinator.raylocal import free_port

runner = CliRunner()


def cli(url, *args):
    return runner.invoke(app, [*args, "--url", url], env={"GRADWIRE_TOKEN": ""}, catch_exceptions=False)


def test_submit_yaml_then_jobs_then_cancel(coordinator, tmp_path):
    spec = tmp_path / "job.yaml"
    spec.write_text("name: from-yaml\nmodel: mlp\nsteps: 40\nworkers: 2\n"
                    "compression: {mode: adaptive, compressor: acpsgd, rank: 4}\n")
    result = cli(coordinator.url, "submit", str(spec))
    assert result.exit_code == 0, result.output
    job_id = result.output.split()[1]
    assert result.output.startswith(f"submitted {job_id} (from-yaml): queued")

    listed = cli(coordinator.url, "jobs")
    assert listed.exit_code == 0 and job_id in listed.output and "from-yaml" in listed.output

    cancelled = cli(coordinator.url, "cancel", job_id)
    assert cancelled.exit_code == 0 and cancelled.output.strip() == f"job {job_id}: cancelled"
    again = cli(coordinator.url, "cancel", job_id)
    assert again.exit_code == 1 and f"409: job {job_id} is already cancelled" in again.output


def test_submit_reports_the_bad_field(coordinator, tmp_path):
    spec = tmp_path / "job.json"
    spec.write_text(json.dumps({**SMALLEST_SPEC, "steps": 0}))
    result = cli(coordinator.url, "submit", str(spec))
    assert result.exit_code == 1
    assert "422: steps: Input should be greater than or equal to 1" in " ".join(result.output.split())
    broken = tmp_path / "broken.yaml"
    broken.write_text("name: [unclosed\n")
    assert cli(coordinator.url, "submit", str(broken)).exit_code == 1


def test_unreachable_coordinator_is_a_clear_error():
    result = cli(f"http://127.0.0.1:{free_port()}", "jobs")
    assert result.exit_code == 1 and "cannot reach the coordinator" in result.output


def test_watch_follows_the_stream_until_the_end(coordinator):
    job = httpx.post(f"{coordinator.url}/v1/jobs", json=SMALLEST_SPEC).json()

    def drive():
        for step in (10, 20, 30):
            time.sleep(0.4)
            report(coordinator.url, job, step)
        httpx.post(f"{coordinator.url}/v1/jobs/{job['id']}/cancel")

    threading.Thread(target=drive, daemon=True).start()
    result = cli(coordinator.url, "watch", job["id"])
    assert result.exit_code == 1  # it ended, but not with success
    assert "30/40" in result.output
    assert f"job {job['id']} (demo): cancelled" in result.output


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


@pytest.fixture
def demo_env(tmp_path):
    return {**os.environ, "GRADWIRE_DATA_DIR": str(tmp_path / "gw"), "GRADWIRE_PORT": str(free_port()),
            "GRADWIRE_RAY_PORT": str(free_port()), "GRADWIRE_RAY_NUM_CPUS": "2",
            "GRADWIRE_RUNNER": "tests.support.fake_runner:run_job", "COLUMNS": "120"}


def _demo(env, *args):
    return subprocess.run([sys.executable, "-m", "coordinator.cli", "demo", "--steps", "40", *args],
                          cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=180)


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_demo_runs_a_job_and_leaves_nothing_running(demo_env):
    result = _demo(demo_env)
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    port = demo_env["GRADWIRE_PORT"]
    assert f"live page:  http://127.0.0.1:{port}/?job=" in out
    assert f"metrics:    http://127.0.0.1:{port}/metrics" in out
    assert "succeeded" in out and "final loss" in out
    data_dir = Path(demo_env["GRADWIRE_DATA_DIR"])
    assert not (data_dir / "coordinator.json").exists() and not (data_dir / "ray-head.json").exists()
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2)


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_demo_keep_then_serve_stop_ray(demo_env):
    result = _demo(demo_env, "--keep")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "gradwire serve --stop-ray" in result.stdout
    data_dir = Path(demo_env["GRADWIRE_DATA_DIR"])
    coordinator_pid = json.loads((data_dir / "coordinator.json").read_text())["pid"]
    head_pid = json.loads((data_dir / "ray-head.json").read_text())["pid"]
    port = demo_env["GRADWIRE_PORT"]
    assert httpx.get(f"http://127.0.0.1:{port}/healthz").json()["ray"] == "connected"

    stop = subprocess.run([sys.executable, "-m", "coordinator.cli", "serve", "--stop-ray"], cwd=REPO_ROOT,
                          env=demo_env, capture_output=True, text=True, timeout=60)
    assert stop.returncode == 0, stop.stderr
    assert "stopped the background coordinator" in stop.stdout and "stopped the local Ray head" in stop.stdout
    assert not _alive(coordinator_pid) and not _alive(head_pid)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_serve_starts_a_local_head_that_outlives_it(demo_env):
    from support.servers import CoordinatorProcess

    data_dir = Path(demo_env["GRADWIRE_DATA_DIR"])
    env = {k: demo_env[k] for k in ("GRADWIRE_RAY_PORT", "GRADWIRE_RAY_NUM_CPUS")}
    coordinator = CoordinatorProcess(data_dir, env=env).start(timeout_s=90)
    head_pid = json.loads((data_dir / "ray-head.json").read_text())["pid"]
    coordinator.stop()
    assert _alive(head_pid), "the Ray head is its own process and keeps running jobs alive"

    again = CoordinatorProcess(data_dir, env=env).start(timeout_s=60)  # attaches to the same head
    assert json.loads((data_dir / "ray-head.json").read_text())["pid"] == head_pid
    again.stop()
    stop = subprocess.run([sys.executable, "-m", "coordinator.cli", "serve", "--stop-ray"], cwd=REPO_ROOT,
                          env={**demo_env, "GRADWIRE_DATA_DIR": str(data_dir)}, capture_output=True, text=True,
                          timeout=60)
    assert "stopped the local Ray head" in stop.stdout
    assert not _alive(head_pid)
