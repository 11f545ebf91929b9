"""Saving and restoring a training run: model, optimizer, LR schedule, every rank's
``GradientSync`` state, RNG, the step and the decision in force (the layout and the
world-size fold are ``workers.checkpoint``)."""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from compressors import GradientSync
from planning.protocol import Decision
from planning.spec import spec_to_dict
from workers import checkpoint as ckpt
from workers.control import SwitchAgreement
from workers.envs import WorkerEnv

log = logging.getLogger(__name__)


@dataclass
class RankRecord:
    """What this rank itself saw: which compressor each step used, and when decisions applied."""

    rank: int
    step_compressors: dict[int, str] = field(default_factory=dict)
    applied: list[dict[str, Any]] = field(default_factory=list)


def save(env: WorkerEnv, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
          scheduler: Any, sync: GradientSync, agreement: SwitchAgreement, record: RankRecord,
          metrics: dict[str, Any], final: bool = False) -> None:
    def write(directory: Path) -> None:
        torch.save({"sync": sync.state_dict(), "rng": ckpt.rng_state()}, directory / ckpt.rank_file(env.rank))
        (directory / f"record{env.rank}.json").write_text(json.dumps(asdict(record)))
        if env.rank == 0:
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                        "step": step, "decision_version": agreement.version,
                        "decision": spec_to_dict(sync.compressor.spec)}, directory / ckpt.TRAINER_FILE)
            ckpt.write_meta(directory, step, env.world_size, {"final": final})
            if final:
                (directory / "summary.json").write_text(json.dumps(metrics, default=str))

    env.save_checkpoint({k: v for k, v in metrics.items() if isinstance(v, (int, float, str))} | {"step": step}, write)


def resume(env: WorkerEnv, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
            scheduler: Any, sync: GradientSync) -> tuple[int, Decision | None]:
    """Restore the latest checkpoint into the live objects; returns (start step, decision in force)."""

    def read(directory: Path) -> tuple[int, Decision | None]:
        trainer = torch.load(directory / ckpt.TRAINER_FILE, weights_only=False, map_location=env.device)
        model.load_state_dict(trainer["model"])
        optimizer.load_state_dict(trainer["optimizer"])
        scheduler.load_state_dict(trainer["scheduler"])
        sync.load_state_dict(ckpt.load_sync_state(directory, env.rank, env.world_size), device=env.device)
        rank_path = directory / ckpt.rank_file(env.rank)
        if ckpt.read_meta(directory)["world_size"] == env.world_size and rank_path.exists():
            ckpt.set_rng_state(torch.load(rank_path, weights_only=False)["rng"])
        saved = dict(trainer["decision"])
        name = saved.pop("name")
        decision = Decision(version=trainer["decision_version"], compressor=name, params=saved, reason="resumed from checkpoint")
        log.info("rank %d: resumed at step %d with %s", env.rank, trainer["step"], sync.compressor.label)
        return int(trainer["step"]), decision

    restored = env.load_checkpoint(read)
    return restored if restored is not None else (0, None)


