"""Tensor fusion: many small payloads in one flat buffer, so a bucket needs one collective.

The factors of every matrix in a bucket and the bucket's uncompressed tensors are views
into one contiguous buffer; one all-reduce moves them all (design.md §2).
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
