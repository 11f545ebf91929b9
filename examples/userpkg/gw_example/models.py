"""The model: a small residual MLP for 2-D points (not one of gradwire's built-in models)."""

from __future__ import annotations

import torch
from torch import nn


class SpiralNet(nn.Module):
    def __init__(self, hidden: int = 64, classes: int = 3) -> None:
        super().__init__()
        self.embed = nn.Linear(2, hidden)
        self.block = nn.Sequential(nn.Linear(hidden, hidden), nn.Tanh(), nn.Linear(hidden, hidden))
        self.head = nn.Linear(hidden, classes)

    def forward(self, points: torch.Tensor) -> torch.Tensor:
        hidden = torch.tanh(self.embed(points))
        return self.head(torch.tanh(hidden + self.block(hidden)))


def make_model() -> nn.Module:
    """The factory a job's ``model`` names: no arguments, returns the nn.Module."""
    return SpiralNet()
