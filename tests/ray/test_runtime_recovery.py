"""A worker process killed mid-run: Ray Train restarts the group, which resumes from the checkpoint.

The job (MLP on the real digits set, ACP-SGD rank 4, a checkpoint every 50 steps,
``max_failures=1``) runs in a thread. The test watches Ray Train's own record of the
checkpoints it has registered (``checkpoint_manager_snapshot.json`` in the run directory),
keeps a copy of each (Ray keeps only the last two), and once the first one is registered
sends SIGKILL to one of the job's two ``RayTrainWorker`` processes. Their pids come from
the GCS actor table (``ray._private.state.actors()``, filtered by class name and this
driver's job id): the state API of ``ray.util.state`` needs a dashboard, which the test
cluster does not run. Nothing inside the training loop knows about the test.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import ray
import torch
from raytrain_support import config, progress_actor

from workers import checkpoint as ckpt
from workers.runner import rank_records, run_job

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

STEPS, EVERY = 600, 50


def registered_checkpoints(run_dir: Path) -> dict[str, int]:
    """Checkpoint directory name -> step, for every checkpoint Ray Train has registered."""
    try:
        snapshot = json.loads((run_dir / "checkpoint_manager_snapshot.json").read_text())
    except (OSError, ValueError):  # not written yet, or caught mid-write
        return {}
    results = snapshot.get("checkpoint_results", [])
    return {r["checkpoint_dir_name"]: int(r["metrics"]["step"]) for r in results if "step" in r.get("metrics", {})}


def train_workers(job_id: str) -> list[dict[str, Any]]:
    from ray._private import state

    return [a for a in state.actors().values()
            if a["ActorClassName"] == "RayTrainWorker" and a["State"] == "ALIVE" and a["JobID"] == job_id]


def test_killed_worker_restarts_the_group_from_the_checkpoint_with_sync_state(ray_session, tmp_path):
    storage, run_name = tmp_path / "runs", "recover"
    run_dir, copies_dir = storage / run_name, tmp_path / "copies"
    name, sink = progress_actor()
    cfg = config(run_name, dataset="digits", steps=STEPS, checkpoint_every=EVERY, max_failures=1,
                 report_interval_s=0.05, compression={"mode": "fixed", "compressor": "acpsgd", "rank": 4})
    outcome: dict[str, Any] = {}

    def job() -> None:
        try:
            outcome["summary"] = run_job(cfg, storage_path=str(storage), run_name=run_name, progress_actor=name)
        except BaseException as exc:  # noqa: BLE001 - asserted below
            outcome["error"] = exc

    thread = threading.Thread(target=job, daemon=True)
    thread.start()
    job_id = ray.get_runtime_context().get_job_id()
    copies: dict[int, Path] = {}  # step -> our copy of that registered checkpoint
    killed: dict[str, Any] = {}
    deadline = time.monotonic() + 240
    try:
        while thread.is_alive() and time.monotonic() < deadline:
            for directory, step in registered_checkpoints(run_dir).items():
                if step not in copies and (run_dir / directory).is_dir():
                    try:
                        shutil.copytree(run_dir / directory, copies_dir / directory)
                        copies[step] = copies_dir / directory
                    except (OSError, shutil.Error):  # rotated away meanwhile: the next one will do
                        shutil.rmtree(copies_dir / directory, ignore_errors=True)
            if not killed and copies:
                workers = train_workers(job_id)
                if len(workers) == 2:
                    victim = max(workers, key=lambda a: a["Pid"])
                    os.kill(victim["Pid"], signal.SIGKILL)
                    killed = {"pid": victim["Pid"], "after_step": max(copies)}
            time.sleep(0.05)
        thread.join(timeout=max(1.0, deadline - time.monotonic()))
        reports = ray.get(sink.drain.remote())
    finally:
        ray.kill(sink)
    assert not thread.is_alive(), "the job did not finish in time"
    assert killed, "no checkpoint was registered before the job ended: nothing to kill after"
    assert "error" not in outcome, f"the job failed instead of recovering: {outcome.get('error')!r}"
    summary = outcome["summary"]

    # 1. steps are continuous: resumed exactly at a checkpoint registered before the kill
    resumed_at = summary["start_step"]
    assert summary["steps"] == STEPS
    assert killed["after_step"] <= resumed_at < STEPS and resumed_at % EVERY == 0
    assert resumed_at in copies, f"resumed at {resumed_at}, registered before the kill: {sorted(copies)}"
    for record in rank_records(summary["checkpoint_path"]):
        assert sorted(int(s) for s in record["step_compressors"]) == list(range(resumed_at, STEPS))

    # 2. a restart really happened (a new worker group reported, resumed from that checkpoint)
    #    and the loss carried on. The group id, not a step going back, marks the restart: the
    #    kill can come before any report past the checkpoint reached the sink.
    initial_loss = reports[0]["loss"]
    groups = list(dict.fromkeys(r["worker_group"] for r in reports))
    assert len(groups) == 2 and None not in groups, f"expected one restart, saw worker groups {groups}"
    restart = next(i for i, r in enumerate(reports) if r["worker_group"] == groups[1])
    before, after = reports[:restart], reports[restart:]
    assert {r["resumed_from_step"] for r in before} == {None}
    assert {r["resumed_from_step"] for r in after} == {resumed_at}
    assert after[0]["step"] == resumed_at + 1
    near_checkpoint = [r["loss"] for r in before if resumed_at - EVERY < r["step"] <= resumed_at]
    assert near_checkpoint, "no report near the checkpoint before the kill"
    assert after[0]["loss"] < 0.5 * initial_loss, (initial_loss, after[0]["loss"])  # not a fresh model
    assert after[0]["loss"] < 3 * max(near_checkpoint)  # same regime as where it stopped
    assert summary["final_loss"] < 0.5 * initial_loss

    # 3. GradientSync state came back: the checkpoint's residuals are real, and the counters
    #    of the hook (steps, ACP-SGD's P/Q alternation) continue over the restart
    saved = [torch.load(copies[resumed_at] / ckpt.rank_file(r), weights_only=False)["sync"] for r in range(2)]
    for state in saved:
        residuals = state["compressor"]["memory"]
        assert residuals and any(float(t.norm()) > 0 for t in residuals.values())
        assert state["stats"]["steps"] == resumed_at
    assert any(not torch.equal(saved[0]["compressor"]["memory"][k], saved[1]["compressor"]["memory"][k])
               for k in saved[0]["compressor"]["memory"])  # each rank got its own back, not a copy
    final = Path(summary["checkpoint_path"])
    for rank in range(2):
        state = torch.load(final / ckpt.rank_file(rank), weights_only=False)["sync"]
        assert state["stats"]["steps"] == STEPS  # restored count + steps after the restart
        assert state["compressor"]["steps_done"] == STEPS
