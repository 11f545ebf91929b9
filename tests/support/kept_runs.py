"""Kept runs as ``benchmarks.adaptive --keep`` leaves them, made small: a real CNN's checkpoints,
its configuration and a report stream, for the tools that read kept runs again
(``benchmarks.adaptive.rejudge``, ``benchmarks.step_worth``)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from benchmarks import adaptive
from benchmarks.adaptive.jobs import JobRun
from planning.config import TrainConfig
from workers.checkpoint import META_FILE, TRAINER_FILE
from workers.data import input_spec
from workers.models import build_model

CHECKPOINTS = (15, 105, 120, 135, 150)  # the benchmark's every 15 steps, thinned to keep the tests short


def job(seed: int = 0) -> TrainConfig:
    return adaptive.train_config(adaptive.parse_args(["--seeds", str(seed)]), {"mode": "fixed", "compressor": "none"}, 150)


def keep_run(path: Path, cfg: TrainConfig, wobble: float) -> JobRun:
    """A kept run as the benchmark leaves it: its configuration, a report every 5 steps and
    checkpoints (:data:`CHECKPOINTS`). The CNN's logits shrink with the step, so the held-out loss falls
    (towards ln 10); ``wobble`` perturbs the weights, so runs differ."""
    generator = torch.Generator().manual_seed(int(wobble * 1000))
    with torch.random.fork_rng():  # the seed's initial weights, as a job draws them: the same kept runs again are the same
        torch.manual_seed(cfg.seed)
        model = build_model(cfg.model.name, **input_spec(cfg.model.name, "synthetic"))
    base = {k: v.clone() for k, v in model.state_dict().items()}
    for step in CHECKPOINTS:
        scale = 3.0 - step / 75
        state = {k: (v * scale + wobble * torch.randn(v.shape, generator=generator) * v.std().nan_to_num()
                     if v.is_floating_point() else v) for k, v in base.items()}
        directory = path / "checkpoints" / f"checkpoint_{step // 15:06d}"
        directory.mkdir(parents=True)
        torch.save({"model": state}, directory / TRAINER_FILE)
        (directory / META_FILE).write_text(json.dumps({"step": step, "world_size": 2, "final": step == 150}))
    reports = [{"step": step, "wall_time": 100.0 + 0.03 * step * (1 + wobble)} for step in range(1, 151, 5)] + \
              [{"step": 150, "wall_time": 100.0 + 4.5 * (1 + wobble)}]
    (path / "telemetry.jsonl").write_text("".join(json.dumps(r) + "\n" for r in reports))
    (path / "config.json").write_text(cfg.model_dump_json())
    return JobRun(label=path.name, reports=reports, summary={"final_loss": 1.0})
