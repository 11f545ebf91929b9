"""Checkpoint layout, and what happens to compressor state when the world size changes.

A checkpoint is one directory (Ray Train merges every worker's files into it):

- ``trainer.pt`` (rank 0): model, optimizer and LR-schedule state, the step to resume at,
  the decision in force.
- ``rank{r}.pt`` (every rank): that rank's ``GradientSync.state_dict()`` (error-feedback
  residuals are per rank) and its RNG states.
- ``meta.json`` (rank 0): step and world size, readable without torch.

**World-size change** (elastic scaling or a restart on fewer/more workers): the old ranks'
states are folded into one that fits every new rank (``compressors.checkpoint.fold_sync_states``:
the mean of the residuals, rank 0's factors; the reasoning is in that module's doc).
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from compressors.checkpoint import fold_sync_states

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
