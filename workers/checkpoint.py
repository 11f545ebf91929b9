"""Checkpoint layout, and what happens to compressor state when the world size changes.

A checkpoint is one directory (Ray Train merges every worker's files into it):

- ``trainer.pt`` (rank 0): model, optimizer and LR-schedule state, the step to resume at,
  the decision in force.
- ``rank{r}.pt`` (every rank): that rank's ``GradientSync.state_dict()`` (error-feedback
  residuals are per rank) and its RNG states.
- ``meta.json`` (rank 0): step and world size, readable without torch.

**World-size change** (elastic scaling or a restart on fewer/more workers): error feedback is
the part of the *mean* gradient that compression has not yet delivered, so what must survive
is the mean of the old ranks' residuals. Every new rank starts with that mean as its
residual; the next step's all-reduce then delivers it exactly once (the mean over new ranks
of identical residuals is that mean). The low-rank factors and ACP-SGD's parity are the same
on every old rank (they are results of all-reduces), so rank 0's are kept; new ranks would
get the same seeded start anyway.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

TRAINER_FILE = "trainer.pt"
META_FILE = "meta.json"


def rank_file(rank: int) -> str:
    return f"rank{rank}.pt"


def rng_state() -> dict[str, Any]:
    state = {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def write_meta(directory: Path, step: int, world_size: int, extra: dict[str, Any] | None = None) -> None:
    (directory / META_FILE).write_text(json.dumps({"step": step, "world_size": world_size, **(extra or {})}))


def read_meta(directory: Path) -> dict[str, Any]:
    return json.loads((directory / META_FILE).read_text())


def load_sync_state(directory: Path, rank: int, world_size: int) -> dict[str, Any]:
    """This rank's GradientSync state; folded from all old ranks if the world size changed."""
    old_world = int(read_meta(directory)["world_size"])
    if old_world == world_size:
        return torch.load(directory / rank_file(rank), weights_only=False)["sync"]
    states = [torch.load(directory / rank_file(r), weights_only=False)["sync"] for r in range(old_world)]
    return fold_sync_states(states)


def fold_sync_states(states: list[dict[str, Any]]) -> dict[str, Any]:
    """One GradientSync state for a new world from the old ranks' states (see module doc)."""
    base = dict(states[0])
    compressor = dict(base["compressor"])
    if "memory" in compressor:
        compressor["memory"] = _mean_by_key([s["compressor"].get("memory", {}) for s in states])
    base["compressor"] = compressor
    base["carry"] = _mean_by_key([s.get("carry", {}) for s in states])
    return base


def _mean_by_key(dicts: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Mean over ranks per key; a rank without a key contributes zero for it."""
    keys = {key for d in dicts for key in d}
    out: dict[str, torch.Tensor] = {}
    for key in keys:
        present = [d[key] for d in dicts if key in d]
        total = torch.zeros_like(present[0])
        for value in present:
            total += value.view_as(total)
        out[key] = total / len(dicts)
    return out
