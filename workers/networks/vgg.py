"""VGG-16 (Simonyan & Zisserman 2015, configuration "D") with the shapes of torchvision's vgg16.

Its 25088x4096 first classifier layer is the gradient that dominates VGG's communication,
which is why the paper's measurements include it.
"""

from __future__ import annotations

import torch
from torch import nn

#: Output channels of each 3x3 convolution; "M" is a 2x2 max pool.
VGG16_LAYOUT: tuple[int | str, ...] = (
    64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M",
)


class VGG16(nn.Module):
    """Thirteen 3x3 conv layers and three fully connected layers (138M parameters).

    The pool before the classifier is adaptive to 7x7, as in torchvision, so the 25088x4096
    first classifier layer (the gradient that dominates VGG's communication) keeps its
    shape at any input size >= 32.
    """

    def __init__(self, num_classes: int, in_channels: int = 3, dropout: float = 0.5) -> None:
        super().__init__()
        self.features = self._make_features(in_channels)
        self.avgpool = nn.AdaptiveAvgPool2d((7, 7))
        self.classifier = nn.Sequential(
            nn.Linear(512 * 7 * 7, 4096),
            nn.ReLU(inplace=True),
            nn.Dropout(dropout),
            nn.Linear(4096, 4096),
            nn.ReLU(inplace=True),
            nn.Dropout(dropout),
            nn.Linear(4096, num_classes),
        )
        self._init_weights()

    @staticmethod
    def _make_features(in_channels: int) -> nn.Sequential:
        layers: list[nn.Module] = []
        channels = in_channels
        for item in VGG16_LAYOUT:
            if item == "M":
                layers.append(nn.MaxPool2d(kernel_size=2, stride=2))
            else:
                layers += [nn.Conv2d(channels, int(item), kernel_size=3, padding=1), nn.ReLU(inplace=True)]
                channels = int(item)
        return nn.Sequential(*layers)

    def _init_weights(self) -> None:
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
                nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, 0.0, 0.01)
                nn.init.zeros_(module.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.avgpool(self.features(x))
        return self.classifier(torch.flatten(x, 1))
