"""The dataset: three interleaved noisy spirals in the plane (train and held-out splits)."""

from __future__ import annotations

import math

import torch
from torch.utils.data import TensorDataset

CLASSES = 3


def _spirals(count: int, generator: torch.Generator) -> TensorDataset:
    labels = torch.randint(CLASSES, (count,), generator=generator)
    radius = torch.rand(count, generator=generator)
    angle = radius * 2 * math.pi + labels * (2 * math.pi / CLASSES)
    points = torch.stack([radius * torch.cos(angle), radius * torch.sin(angle)], dim=1)
    points += 0.03 * torch.randn(points.shape, generator=generator)
    return TensorDataset(points, labels)


def spirals(seed: int, train_size: int = 4096, held_out_size: int = 1024) -> tuple[TensorDataset, TensorDataset]:
    """The factory a job's ``dataset`` names: ``spirals(seed)`` -> (train, held_out)."""
    generator = torch.Generator().manual_seed(seed)
    return _spirals(train_size, generator), _spirals(held_out_size, generator)
