"""Issue 17.10: a job whose worker runs out of memory must be told so.

A coordinator with its own local Ray head runs a real Ray Train job whose (user-code) model
keeps allocating memory. The head's memory monitor is set just above what the machine uses
now (``RAY_memory_usage_threshold``), so it kills the growing worker after a gigabyte or so:
the real OOM path of Ray and Ray Train, without ever driving the machine near exhaustion
(the model stops growing at a fixed cap, and the monitor acts only on this head's workers).
The job must end failed with a reason that says out of memory, which worker, the node's
memory figures and what to change, not "A worker health check failed". The same for a job
whose runner actor itself (the fake runner, holding memory) is the one killed.
"""

from __future__ import annotations

import re
import textwrap
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest
from support.api import SMALLEST_SPEC, TERMINAL, job_of, post, wait_state
from support.servers import CoordinatorProcess

from coordinator import raylocal

pytestmark = pytest.mark.slow

REAL = "workers.runner:run_job"
FAKE = "tests.support.fake_runner:run_job"
#: Above the baseline, room for the head, the coordinator, the job's runner, the Train
#: controller and one idle worker (~3 GB measured) before the monitor fires.
HEADROOM_BYTES = 3.5e9
#: The model stops growing here: if the monitor never fires the job simply succeeds.
CAP_BYTES = 4 * 2**30
CHUNK_BYTES = 128 * 2**20


def _used_fraction_and_total() -> tuple[float, int]:
    """The node's used memory as Ray's memory monitor counts it (total minus available)."""
    info = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
    total = int(info["MemTotal"].split()[0]) * 1024
    available = int(info["MemAvailable"].split()[0]) * 1024
    return 1 - available / total, total


@pytest.fixture
def memory_hog(tmp_path: Path) -> tuple[Path, str]:
    """(working_dir, package): a model that holds another 128 MB on every forward pass."""
    root = tmp_path / "user-code"
    name = f"gwhog_{uuid.uuid4().hex[:8]}"
    (root / name).mkdir(parents=True)
    (root / name / "__init__.py").write_text("")
    (root / name / "factories.py").write_text(textwrap.dedent(f'''
        import time

        import torch
        from torch import nn
        from torch.utils.data import TensorDataset

        class Hog(nn.Module):
            def __init__(self):
                super().__init__()
                self.linear = nn.Linear(8, 4)
                self.held = []

            def forward(self, x):
                if len(self.held) * {CHUNK_BYTES} < {CAP_BYTES}:
                    self.held.append(torch.ones({CHUNK_BYTES // 4}))  # touched: resident at once
                time.sleep(0.05)
                return self.linear(x)

        def model():
            return Hog()

        def data(seed):
            g = torch.Generator().manual_seed(seed)
            x = torch.randn(512, 8, generator=g)
            y = torch.randint(0, 4, (512,), generator=g)
            return TensorDataset(x[:448], y[:448]), TensorDataset(x[448:], y[448:])
    '''))
    return root, name


@contextmanager
def coordinator_with_memory_monitor(data_dir: Path, runner: str) -> Iterator[CoordinatorProcess]:
    """A coordinator on its own local head, whose memory monitor fires ``HEADROOM_BYTES``
    above what the machine uses now."""
    used, total = _used_fraction_and_total()
    threshold = used + HEADROOM_BYTES / total
    assert threshold < 0.8, f"the machine already uses {used:.0%} of its memory; not safe to run"
    coordinator = CoordinatorProcess(data_dir, env={
        "GRADWIRE_LAUNCHER": "ray", "GRADWIRE_RUNNER": runner, "GRADWIRE_RAY_PORT": str(raylocal.free_port()),
        "GRADWIRE_RAY_NUM_CPUS": "2", "GRADWIRE_POLL_INTERVAL_S": "0.2", "GRADWIRE_HISTORY_INTERVAL_S": "0",
        # Read by the raylet of the coordinator's own head (it inherits this environment).
        "RAY_memory_usage_threshold": f"{threshold:.4f}", "RAY_memory_monitor_refresh_ms": "100"})
    try:
        yield coordinator.start(timeout_s=180)
    finally:
        coordinator.stop()
        raylocal.stop_head(data_dir)


@pytest.mark.timeout(360)
def test_a_worker_killed_for_memory_fails_the_job_with_an_out_of_memory_reason(tmp_path, memory_hog):
    working_dir, package = memory_hog
    with coordinator_with_memory_monitor(tmp_path / "coordinator", REAL) as coordinator:
        url = coordinator.url
        job = post(url, {
            "name": "hog", "model": f"{package}.factories:model", "dataset": f"{package}.factories:data",
            "steps": 2000, "batch_size": 8, "workers": 1, "report_interval_s": 0.3,
            "checkpoints": {"max_failures": 0}, "runtime_env": {"working_dir": str(working_dir)},
            "compression": {"mode": "fixed", "compressor": "fp16"}})
        failed = wait_state(url, job["id"], TERMINAL, timeout_s=300)
        print("reason:", failed["reason"])
        assert failed["state"] == "failed", (failed, coordinator.log())
        reason = failed["reason"]
        assert reason.startswith("WorkerOutOfMemoryError: out of memory: "), reason
        assert re.search(r"rank 0 .*on node \d+\.\d+\.\d+\.\d+", reason), reason  # which worker, where
        assert " used / " in reason, reason  # the node's memory figures, as Ray measured them
        assert "batch_size" in reason and "workers per node" in reason, reason  # what to change
        assert "health check" not in reason, reason
        assert job_of(url, job["id"])["step"] > 0  # it trained until the memory ran out


@pytest.mark.timeout(300)
def test_a_runner_actor_killed_for_memory_fails_the_job_with_an_out_of_memory_reason(tmp_path):
    # Ray answers calls to an actor its memory monitor killed with OutOfMemoryError (not a
    # RayActorError), and soon forgets the dead actor's name: the reason used to be "runner
    # actor job-… not found on the Ray cluster".
    with coordinator_with_memory_monitor(tmp_path / "coordinator", FAKE) as coordinator:
        url = coordinator.url
        job = post(url, {**SMALLEST_SPEC, "name": "hog-memory", "steps": 2000, "workers": 1,
                         "report_interval_s": 0.3})
        failed = wait_state(url, job["id"], TERMINAL, timeout_s=150)
        print("reason:", failed["reason"])
        assert failed["state"] == "failed", (failed, coordinator.log())
        assert failed["reason"].startswith("out of memory: Ray killed the job's runner actor on node "), failed
        assert " used / " in failed["reason"] and "batch_size" in failed["reason"], failed
