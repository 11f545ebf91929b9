"""Which rank a GradientSync state belongs to, the one-file "full" state, and world-size folding.

A rank's state holds *its own* error-feedback residuals, so it records the rank and world
size that saved it, and loading it anywhere else is refused (``ValueError`` naming both
ranks) instead of resuming silently wrong. The usual DDP pattern (rank 0 saves one file,
every rank loads it) uses :func:`full_state`: every rank's state gathered into one object;
loading it takes this rank's part, or the fold below when the world size changed.

**Folding** (elastic scaling, or a restart on fewer/more ranks): error feedback is the part
of the *mean* gradient that compression has not yet delivered, so what must survive is the
mean of the old ranks' residuals. Every new rank starts with that mean as its residual; the
next step's all-reduce then delivers it exactly once (the mean over new ranks of identical
residuals is that mean). The low-rank factors and ACP-SGD's parity are the same on every old
rank (results of all-reduces), so rank 0's are kept. A folded state fits any rank.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch

#: Marks the object :meth:`GradientSync.full_state_dict` returns.
FULL_STATE_FORMAT = "gradwire.full_sync_state/1"


def is_full_state(state: Mapping[str, Any]) -> bool:
    return state.get("format") == FULL_STATE_FORMAT


def full_state(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """One object holding every rank's state, in rank order."""
    return {"format": FULL_STATE_FORMAT, "world_size": len(parts), "ranks": parts}


def state_for_rank(state: Mapping[str, Any], rank: int, world_size: int) -> dict[str, Any]:
    """The per-rank state ``rank`` of ``world_size`` should load from ``state``.

    A full state gives this rank's part (same world size) or the fold of all parts; a
    per-rank state must be this rank's, saved in a world of this size. Raises ``ValueError``.
    """
    if is_full_state(state):
        parts = list(state["ranks"])
        if len(parts) == world_size:
            return dict(parts[rank])
        return fold_sync_states(parts)
    saved_rank, saved_world = state.get("rank"), state.get("world_size")
    if saved_rank is None:  # folded (fits any rank), or saved before ranks were recorded
        return dict(state)
    if saved_rank != rank:
        raise ValueError(
            f"rank: this GradientSync state was saved by rank {saved_rank} (of {saved_world}) and is being loaded "
            f"on rank {rank}; it holds rank {saved_rank}'s own error-feedback residuals. Load each rank's own "
            "state_dict(), or save GradientSync.full_state_dict() (collective) and load that on every rank"
        )
    if saved_world != world_size:
        raise ValueError(
            f"world_size: this GradientSync state was saved in a world of {saved_world} ranks and is being loaded "
            f"in a world of {world_size}; save GradientSync.full_state_dict(), which folds to the new world size"
        )
    return dict(state)


def fold_sync_states(states: list[Mapping[str, Any]]) -> dict[str, Any]:
    """One GradientSync state for a new world from the old ranks' states (see module doc)."""
    specs = {repr(sorted(s["spec"].items())) for s in states}
    if len(specs) != 1:
        raise ValueError(f"spec: the ranks' states name different compressors ({', '.join(sorted(specs))}); cannot fold them")
    base = dict(states[0])
    compressor = dict(base["compressor"])
    if "memory" in compressor:
        compressor["memory"] = _mean_by_key([s["compressor"].get("memory", {}) for s in states])
    base["compressor"] = compressor
    base["carry"] = _mean_by_key([s.get("carry", {}) for s in states])
    base["rank"], base["world_size"], base["folded_from"] = None, None, len(states)
    return base


def _mean_by_key(dicts: list[Mapping[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
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


def to_device(state: Any, device: torch.device | None) -> Any:
    """``state`` (tensors, nested in dicts) moved to ``device``; as it is for None."""
    if device is None:
        return state
    if isinstance(state, torch.Tensor):
        return state.to(device)
    if isinstance(state, dict):
        return {key: to_device(value, device) for key, value in state.items()}
    return state
