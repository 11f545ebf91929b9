"""World-size folding of GradientSync state (workers/checkpoint.py, documented in its module doc).

Error feedback is the part of the *mean* gradient not yet delivered. When a job resumes on
a different number of ranks, every new rank starts from the mean of the old ranks'
residuals, so the mean over new ranks equals the mean over old ranks (nothing is lost or
delivered twice); the low-rank factors, which are identical on all old ranks, are kept.

The states here are real: two simulated ranks run ACP-SGD in lockstep on different
gradients (so residuals differ and factors agree), then are saved the way the loop saves
them (``rank{r}.pt`` + ``meta.json``).
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from compressors import GradientSync, build
from compressors.base import GradSlot, run_in_lockstep
from workers import checkpoint as ckpt

SHAPES = {"layer.weight": (16, 12), "layer.bias": (16,), "head.weight": (4, 16)}


def lockstep_states(world: int = 2, steps: int = 3, *, switch_to: str | None = None) -> list[dict]:
    """GradientSync states of ``world`` simulated ranks after ``steps`` ACP-SGD steps."""
    compressors = [build("acpsgd", rank=2) for _ in range(world)]
    for step in range(steps):
        jobs = []
        for rank, compressor in enumerate(compressors):
            generator = torch.Generator().manual_seed(100 * rank + step)
            total = sum(math.prod(s) for s in SHAPES.values())
            buffer = torch.randn(total, generator=generator)
            slots, offset = [], 0
            for key, shape in SHAPES.items():
                size = math.prod(shape)
                slots.append(GradSlot(key=key, grad=buffer[offset:offset + size].view(shape), offset=offset))
                offset += size
            jobs.append(compressor.process(buffer, slots, world))
        run_in_lockstep(jobs)
        for compressor in compressors:
            compressor.end_step()
    syncs = [GradientSync(c) for c in compressors]
    if switch_to is not None:  # a checkpoint between a switch request and the next step: residuals become "carry"
        for sync in syncs:
            sync.switch(build(switch_to))
    return [sync.state_dict() for sync in syncs]


def save(directory: Path, states: list[dict]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for rank, state in enumerate(states):
        torch.save({"sync": state, "rng": ckpt.rng_state()}, directory / ckpt.rank_file(rank))
    ckpt.write_meta(directory, step=30, world_size=len(states))
    return directory


def mean_of(tensors: list[torch.Tensor]) -> torch.Tensor:
    return torch.stack(tensors).mean(0)


@pytest.mark.parametrize("new_world", [1, 3, 4])
def test_mean_residual_is_conserved_and_factors_are_kept(tmp_path, new_world):
    old = lockstep_states()
    old_memory = [s["compressor"]["memory"] for s in old]
    keys = set(old_memory[0])
    assert keys and all(set(m) == keys for m in old_memory)
    assert not torch.allclose(old_memory[0]["layer.weight"], old_memory[1]["layer.weight"])  # ranks differ

    directory = save(tmp_path / "ckpt", old)
    new = [ckpt.load_sync_state(directory, rank, new_world) for rank in range(new_world)]

    for key in keys:
        old_mean = mean_of([m[key] for m in old_memory])
        new_mean = mean_of([s["compressor"]["memory"][key] for s in new])
        torch.testing.assert_close(new_mean, old_mean)  # conservation
        for state in new:  # every new rank starts from that mean
            torch.testing.assert_close(state["compressor"]["memory"][key], old_mean)
    for state in new:
        assert state["spec"] == old[0]["spec"]
        assert state["compressor"]["steps_done"] == old[0]["compressor"]["steps_done"] == 3
        factors, kept = state["compressor"]["factors"], old[0]["compressor"]["factors"]
        assert set(factors) == set(kept) and kept
        for key in kept:
            torch.testing.assert_close(factors[key]["q"], kept[key]["q"])
            assert factors[key]["parity"] == kept[key]["parity"]
            if kept[key]["p"] is not None:
                torch.testing.assert_close(factors[key]["p"], kept[key]["p"])


def test_factors_agree_on_old_ranks_so_keeping_rank_0s_is_lossless():
    old = lockstep_states()
    for key, factor in old[0]["compressor"]["factors"].items():
        torch.testing.assert_close(factor["q"], old[1]["compressor"]["factors"][key]["q"])


def test_same_world_size_keeps_each_ranks_own_state(tmp_path):
    old = lockstep_states()
    directory = save(tmp_path / "ckpt", old)
    for rank in range(2):
        state = ckpt.load_sync_state(directory, rank, 2)
        for key, value in old[rank]["compressor"]["memory"].items():
            torch.testing.assert_close(state["compressor"]["memory"][key], value)


def test_carried_residuals_of_a_pending_switch_are_folded_too(tmp_path):
    old = lockstep_states(switch_to="none")
    assert old[0]["spec"]["name"] == "none" and old[0]["carry"]  # saved as the next step will see it
    directory = save(tmp_path / "ckpt", old)
    new = [ckpt.load_sync_state(directory, rank, 3) for rank in range(3)]
    for key in old[0]["carry"]:
        old_mean = mean_of([s["carry"][key] for s in old])
        torch.testing.assert_close(mean_of([s["carry"][key] for s in new]), old_mean)


def test_a_key_missing_on_one_rank_counts_as_zero():
    states = lockstep_states()
    del states[1]["compressor"]["memory"]["layer.weight"]
    folded = ckpt.fold_sync_states(states)
    only = states[0]["compressor"]["memory"]["layer.weight"]
    torch.testing.assert_close(folded["compressor"]["memory"]["layer.weight"], only / 2)


def test_a_folded_state_loads_into_gradient_sync():
    states = lockstep_states()
    folded = ckpt.fold_sync_states(states)
    sync = GradientSync(build("powersgd", rank=1))  # replaced by the saved compressor
    sync.load_state_dict(folded)
    assert sync.compressor.label == "acpsgd-r2"
    residuals = sync.compressor.residuals()
    expected = mean_of([s["compressor"]["memory"]["layer.weight"] for s in states])
    torch.testing.assert_close(residuals["layer.weight"].view_as(expected), expected)
