"""GradientSync's checkpoints: its state (compressor spec and state, carried residuals,
stats), the one-file state of every rank, and loading either (``compressors.checkpoint``
checks the rank and folds across world sizes)."""

from __future__ import annotations

import threading
from dataclasses import asdict
from typing import Any, Callable

import torch
import torch.distributed as dist

from compressors import checkpoint
from compressors.base import Compressor, from_spec
from compressors.records import SyncStats
from planning.spec import spec_from_dict, spec_to_dict


class SyncCheckpoint:
    """The checkpoint half of :class:`compressors.sync.GradientSync` (its only subclass)."""

    _compressor: Compressor
    _pending: Compressor | None
    _carry: dict[str, torch.Tensor]
    _stats: SyncStats
    _lock: threading.Lock
    _switches: int
    process_group: dist.ProcessGroup | None
    stats: Callable[[], SyncStats]
    _rank_and_world: Callable[[], tuple[int, int]]
    _group: Callable[[], dist.ProcessGroup]
    _warn_if_nothing_compressed: Callable[[Compressor], None]

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume exactly: compressor spec and state, carried residuals, stats."""
        carry = {key: value.detach().cpu().clone() for key, value in self._carry.items()}
        if self._pending is None:
            compressor = self._compressor
        else:
            # Save what the next step will see: the pending compressor, with the current
            # one's residuals already carried over (as _begin_step will do).
            compressor = self._pending
            for key, residual in self._compressor.residuals().items():
                residual = residual.detach().cpu()
                carry[key] = carry[key] + residual.view_as(carry[key]) if key in carry else residual.clone()
        rank, world_size = self._rank_and_world()
        return {
            "spec": spec_to_dict(compressor.spec),
            "compressor": compressor.state_dict(),
            "carry": carry,
            "stats": asdict(self.stats()),
            "rank": rank,
            "world_size": world_size,
        }

    def full_state_dict(self, dst: int = 0) -> dict[str, Any] | None:
        """Every rank's :meth:`state_dict` in one object, on rank ``dst`` (None on the others).

        Collective: call it on every rank. For the usual pattern, one file saved by rank 0::

            state = sync.full_state_dict()
            if rank == 0:
                torch.save(state, "sync.pt")
            ...
            sync.load_state_dict(torch.load("sync.pt", weights_only=False))   # every rank
        """
        mine = self.state_dict()
        rank, world_size = self._rank_and_world()
        if world_size == 1:
            return checkpoint.full_state([mine])
        parts: list[dict[str, Any]] | None = [{} for _ in range(world_size)] if rank == dst else None
        dist.gather_object(mine, parts, dst=dist.get_global_rank(self._group(), dst), group=self.process_group)
        return checkpoint.full_state(parts) if parts is not None else None

    def load_state_dict(self, state: dict[str, Any], *, device: torch.device | None = None) -> None:
        """Restore a :meth:`state_dict` (this rank's own, or folded) or a :meth:`full_state_dict`
        (this rank takes its part, or the fold of all parts if the world size changed); the
        compressor in force becomes the saved one. Another rank's state raises ``ValueError``."""
        rank, world_size = self._rank_and_world()
        state = checkpoint.state_for_rank(state, rank, world_size)
        compressor = from_spec(spec_from_dict(state["spec"]))
        compressor.load_state_dict(checkpoint.to_device(state["compressor"], device))
        self._compressor, self._pending = compressor, None
        self._carry = {key: value.to(device) if device else value for key, value in state.get("carry", {}).items()}
        with self._lock:
            self._stats = SyncStats(**state.get("stats", {}))
        self._switches += 1
        self._warn_if_nothing_compressed(compressor)
