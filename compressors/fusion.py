"""Tensor fusion: many small payloads in one flat buffer, so a bucket needs one collective.

The factors of every matrix in a bucket and the bucket's uncompressed tensors are views
into one contiguous buffer; one all-reduce moves them all (docs/step.md, "Fusion").
"""

from __future__ import annotations

import math
from typing import Sequence

import torch

from compressors.base import GradSlot


class FusedBuffer:
    """A flat tensor carved into views of the given shapes, in order."""

    def __init__(self, shapes: Sequence[Sequence[int]], *, dtype: torch.dtype, device: torch.device) -> None:
        sizes = [math.prod(shape) for shape in shapes]
        self.flat = torch.empty(sum(sizes), dtype=dtype, device=device)
        self.views: list[torch.Tensor] = []
        offset = 0
        for shape, size in zip(shapes, sizes):
            self.views.append(self.flat[offset : offset + size].view(tuple(shape)))
            offset += size


def to_wire(flat: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """What to send for ``flat``: itself when it is already in the wire ``dtype`` (no copy)."""
    return flat if flat.dtype == dtype else flat.to(dtype)


def from_wire(flat: torch.Tensor, received: torch.Tensor) -> None:
    """Bring a collective's result back into ``flat`` (nothing to do when it was sent as is)."""
    if received is not flat:
        flat.copy_(received)


def round_to(tensor: torch.Tensor, dtype: torch.dtype) -> None:
    """Round ``tensor`` in place to what ``dtype`` can hold (it will travel in ``dtype``), so
    error feedback keeps the rounding error too. A no-op when ``tensor`` is in ``dtype``."""
    if tensor.dtype != dtype:
        tensor.copy_(tensor.to(dtype))


def mm_into(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """``out = a @ b``; ``out`` may be in a lower precision than ``a`` and ``b`` (rounded once)."""
    if out.dtype == a.dtype:
        return torch.mm(a, b, out=out)
    return out.copy_(torch.mm(a, b))


def pack_uncompressed(views: Sequence[torch.Tensor], slots: Sequence[GradSlot]) -> None:
    """Copy uncompressed gradients into their places in a fused buffer."""
    for view, slot in zip(views, slots):
        view.copy_(slot.grad.view(-1))


def unpack_mean(views: Sequence[torch.Tensor], slots: Sequence[GradSlot], world_size: int) -> None:
    """Write the all-reduced (summed) uncompressed gradients back as means."""
    for view, slot in zip(views, slots):
        torch.div(view, world_size, out=slot.grad.view(-1))


def split_slots(slots: Sequence[GradSlot], compresses) -> tuple[list[GradSlot], list[GradSlot]]:
    """Split a bucket's gradients into (compressed matrices, uncompressed tensors)."""
    compressed = [s for s in slots if compresses(tuple(s.grad.shape))]
    plain = [s for s in slots if not compresses(tuple(s.grad.shape))]
    return compressed, plain
