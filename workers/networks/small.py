"""Small networks for tests and quick jobs: an MLP and a two-layer CNN.

They train in seconds on a CPU, yet each has proper weight matrices (the MLP's first layer is
64x256 on digits), so the low-rank compressors have something to compress.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class MLP(nn.Module):
    """Flatten -> two hidden ReLU layers -> classes.

    Small enough for unit tests, yet its first layer is a proper matrix (e.g. 64x256 on
    digits), so low-rank compressors have something to compress.
    """

    def __init__(self, in_features: int, num_classes: int, hidden: int = 256) -> None:
        super().__init__()
        self.hidden1 = nn.Linear(in_features, hidden)
        self.hidden2 = nn.Linear(hidden, hidden)
        self.head = nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.flatten(x, 1)
        x = F.relu(self.hidden1(x))
        x = F.relu(self.hidden2(x))
        return self.head(x)


class SmallCNN(nn.Module):
    """Two conv layers, adaptive pooling to 4x4, two linear layers.

    The adaptive pool makes the parameter shapes independent of the image size, so the same
    network runs on 8x8 digits and 32x32 synthetic images (any size >= 2).
    """

    def __init__(self, in_channels: int, num_classes: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, 32, kernel_size=3, padding=1)
        self.conv2 = nn.Conv2d(32, 64, kernel_size=3, padding=1)
        self.pool = nn.AdaptiveAvgPool2d((4, 4))
        self.fc1 = nn.Linear(64 * 4 * 4, 128)
        self.head = nn.Linear(128, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(x, 2)
        x = F.relu(self.conv2(x))
        x = torch.flatten(self.pool(x), 1)
        x = F.relu(self.fc1(x))
        return self.head(x)
