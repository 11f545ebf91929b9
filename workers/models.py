"""Model registry: the networks gradwire trains and benchmarks.

``build_model(name, num_classes=...)`` returns a plain ``torch.nn.Module``. The large models
reproduce the parameter *shapes* of the reference implementations exactly (torchvision's
ResNet-18/50/152 and VGG-16, Google's BERT-Base/Large), because gradient compression is
judged on those shapes: the bytes a compressor saves and the time it spends depend on how
many matrices there are and how big each one is, not on the weights' values. torchvision
is not a dependency (it does not import next to this torch build), so the networks are
written here with plain ``torch.nn``.

Image models take float tensors ``(batch, channels, height, width)``; the MLP flattens
whatever it is given. Sequence models (``SEQUENCE_MODELS``) take ``LongTensor`` token ids
``(batch, seq_len)``. Every model returns logits ``(batch, num_classes)``.

``parameter_shapes(name)`` gives the gradient shapes without allocating any weights (the
model is built on the ``meta`` device), which is what the cost model and benchmarks need.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from planning.sections import MODEL_NAMES, SEQUENCE_MODELS

__all__ = [
    "MODEL_NAMES",
    "SEQUENCE_MODELS",
    "BERT_CONFIGS",
    "build_model",
    "count_parameters",
    "default_num_classes",
    "parameter_shapes",
    "MLP",
    "SmallCNN",
    "ResNet",
    "VGG16",
    "BertClassifier",
]

#: ResNets and VGG downsample by 32; smaller images would vanish before the head.
MIN_IMAGE_SIZE_LARGE = 32


# ---------------------------------------------------------------------------------------------
# Small models for tests and quick jobs
# ---------------------------------------------------------------------------------------------


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


# ---------------------------------------------------------------------------------------------
# ResNet (He et al. 2016), parameter shapes as torchvision's resnet18/50/152
# ---------------------------------------------------------------------------------------------


def _conv3x3(in_planes: int, out_planes: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_planes, out_planes, kernel_size=3, stride=stride, padding=1, bias=False)


def _conv1x1(in_planes: int, out_planes: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_planes, out_planes, kernel_size=1, stride=stride, bias=False)


def _shortcut(in_planes: int, out_planes: int, stride: int) -> nn.Module | None:
    """Projection shortcut where the residual changes shape, identity (None) otherwise."""
    if stride == 1 and in_planes == out_planes:
        return None
    return nn.Sequential(_conv1x1(in_planes, out_planes, stride), nn.BatchNorm2d(out_planes))


class BasicBlock(nn.Module):
    """Two 3x3 convolutions plus the shortcut (ResNet-18/34)."""

    expansion = 1

    def __init__(self, in_planes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = _conv3x3(in_planes, planes, stride)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = _conv3x3(planes, planes)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = _shortcut(in_planes, planes * self.expansion, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + identity)


class Bottleneck(nn.Module):
    """1x1 reduce, 3x3 (carrying the stride, "ResNet v1.5"), 1x1 expand (ResNet-50/101/152)."""

    expansion = 4

    def __init__(self, in_planes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = _conv1x1(in_planes, planes)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = _conv3x3(planes, planes, stride)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = _conv1x1(planes, planes * self.expansion)
        self.bn3 = nn.BatchNorm2d(planes * self.expansion)
        self.downsample = _shortcut(in_planes, planes * self.expansion, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = F.relu(self.bn1(self.conv1(x)))
        out = F.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return F.relu(out + identity)


#: name -> (block type, blocks per stage)
RESNET_CONFIGS: dict[str, tuple[type[BasicBlock] | type[Bottleneck], tuple[int, int, int, int]]] = {
    "resnet18": (BasicBlock, (2, 2, 2, 2)),
    "resnet50": (Bottleneck, (3, 4, 6, 3)),
    "resnet152": (Bottleneck, (3, 8, 36, 3)),
}


class ResNet(nn.Module):
    """ImageNet-style ResNet: 7x7 stem, four stages, global average pool, linear head.

    Module names follow torchvision (``layer3.5.conv2.weight``) so that readers can match
    our per-parameter statistics with published per-layer numbers.
    """

    def __init__(
        self,
        block: type[BasicBlock] | type[Bottleneck],
        blocks: Sequence[int],
        num_classes: int,
        in_channels: int = 3,
    ) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, 64, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        in_planes = 64
        stages = []
        for index, (planes, count) in enumerate(zip((64, 128, 256, 512), blocks)):
            stride = 1 if index == 0 else 2
            stage, in_planes = self._make_stage(block, in_planes, planes, count, stride)
            stages.append(stage)
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(512 * block.expansion, num_classes)
        self._init_weights()

    @staticmethod
    def _make_stage(
        block: type[BasicBlock] | type[Bottleneck], in_planes: int, planes: int, count: int, stride: int
    ) -> tuple[nn.Sequential, int]:
        """A stage: the first block changes resolution/width, the rest keep it."""
        layers = [block(in_planes, planes, stride)]
        in_planes = planes * block.expansion
        layers += [block(in_planes, planes) for _ in range(count - 1)]
        return nn.Sequential(*layers), in_planes

    def _init_weights(self) -> None:
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(module, nn.BatchNorm2d):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(F.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


# ---------------------------------------------------------------------------------------------
# VGG-16 (Simonyan & Zisserman 2015, configuration "D"), shapes as torchvision's vgg16
# ---------------------------------------------------------------------------------------------

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


# ---------------------------------------------------------------------------------------------
# BERT encoder (Devlin et al. 2019) with a sequence-classification head
# ---------------------------------------------------------------------------------------------

#: Architecture hyper-parameters of the published checkpoints.
BERT_CONFIGS: dict[str, dict[str, int]] = {
    "bert-base": {"num_layers": 12, "hidden_size": 768, "num_heads": 12, "intermediate_size": 3072},
    "bert-large": {"num_layers": 24, "hidden_size": 1024, "num_heads": 16, "intermediate_size": 4096},
}
BERT_MAX_POSITIONS = 512
BERT_TYPE_VOCAB = 2
#: Default classes for sequence classification (e.g. sentiment: negative/positive).
BERT_NUM_CLASSES = 2


class BertEmbeddings(nn.Module):
    """Sum of token, position and segment embeddings, then LayerNorm and dropout."""

    def __init__(self, vocab_size: int, hidden: int, max_positions: int, dropout: float) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab_size, hidden)
        self.position_embeddings = nn.Embedding(max_positions, hidden)
        self.token_type_embeddings = nn.Embedding(BERT_TYPE_VOCAB, hidden)
        self.norm = nn.LayerNorm(hidden, eps=1e-12)
        self.dropout = nn.Dropout(dropout)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        x = self.word_embeddings(input_ids) + self.position_embeddings(positions) + self.token_type_embeddings(token_type_ids)
        return self.dropout(self.norm(x))


class BertSelfAttention(nn.Module):
    """Multi-head self-attention with separate query/key/value projections.

    Separate projections (rather than one fused in_proj as ``nn.MultiheadAttention`` has)
    keep BERT's gradient shapes: three hidden x hidden matrices per layer.
    """

    def __init__(self, hidden: int, num_heads: int, dropout: float) -> None:
        super().__init__()
        if hidden % num_heads:
            raise ValueError(f"hidden_size {hidden} is not divisible by num_heads {num_heads}")
        self.num_heads = num_heads
        self.dropout = dropout
        self.query = nn.Linear(hidden, hidden)
        self.key = nn.Linear(hidden, hidden)
        self.value = nn.Linear(hidden, hidden)
        self.output = nn.Linear(hidden, hidden)

    def _split_heads(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, hidden = x.shape
        return x.view(batch, length, self.num_heads, hidden // self.num_heads).transpose(1, 2)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None) -> torch.Tensor:
        q, k, v = (self._split_heads(proj(x)) for proj in (self.query, self.key, self.value))
        dropout = self.dropout if self.training else 0.0
        context = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout)
        context = context.transpose(1, 2).reshape(x.shape)
        return self.output(context)


class BertLayer(nn.Module):
    """Post-LayerNorm transformer layer: attention, add & norm, GELU feed-forward, add & norm."""

    def __init__(self, hidden: int, num_heads: int, intermediate: int, dropout: float) -> None:
        super().__init__()
        self.attention = BertSelfAttention(hidden, num_heads, dropout)
        self.attention_norm = nn.LayerNorm(hidden, eps=1e-12)
        self.intermediate = nn.Linear(hidden, intermediate)
        self.output = nn.Linear(intermediate, hidden)
        self.output_norm = nn.LayerNorm(hidden, eps=1e-12)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None) -> torch.Tensor:
        x = self.attention_norm(x + self.dropout(self.attention(x, attn_mask)))
        feed_forward = self.output(F.gelu(self.intermediate(x)))
        return self.output_norm(x + self.dropout(feed_forward))


class BertClassifier(nn.Module):
    """BERT encoder + pooler (tanh dense on [CLS]) + linear classification head.

    Matches the parameter shapes of ``BertForSequenceClassification``: BERT-Base has
    109,482,240 parameters before the head.
    """

    def __init__(
        self,
        num_classes: int,
        *,
        vocab_size: int = 30522,
        num_layers: int = 12,
        hidden_size: int = 768,
        num_heads: int = 12,
        intermediate_size: int = 3072,
        max_positions: int = BERT_MAX_POSITIONS,
        dropout: float = 0.1,
    ) -> None:
        super().__init__()
        self.max_positions = max_positions
        self.embeddings = BertEmbeddings(vocab_size, hidden_size, max_positions, dropout)
        self.layers = nn.ModuleList(
            BertLayer(hidden_size, num_heads, intermediate_size, dropout) for _ in range(num_layers)
        )
        self.pooler = nn.Linear(hidden_size, hidden_size)
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(hidden_size, num_classes)
        self._init_weights()

    def _init_weights(self) -> None:
        """BERT's initialisation: N(0, 0.02) weights, zero biases, unit LayerNorm."""
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, 0.0, 0.02)
            if isinstance(module, nn.Linear):
                nn.init.zeros_(module.bias)
            elif isinstance(module, nn.LayerNorm):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``attention_mask``: optional (batch, seq_len), 1 for real tokens, 0 for padding."""
        if input_ids.shape[1] > self.max_positions:
            raise ValueError(f"sequence length {input_ids.shape[1]} exceeds {self.max_positions} positions")
        mask = None
        if attention_mask is not None:
            mask = attention_mask[:, None, None, :].to(torch.bool)  # broadcast over heads and queries
        x = self.embeddings(input_ids, token_type_ids)
        for layer in self.layers:
            x = layer(x, mask)
        pooled = torch.tanh(self.pooler(x[:, 0]))
        return self.classifier(self.dropout(pooled))


# ---------------------------------------------------------------------------------------------
# Registry
# ---------------------------------------------------------------------------------------------


def default_num_classes(name: str) -> int:
    """The head size used when none is given: ImageNet's 1000 for the paper's vision models,
    2 for BERT sequence classification, 10 for the small test models."""
    _check_name(name)
    if name in SEQUENCE_MODELS:
        return BERT_NUM_CLASSES
    if name in RESNET_CONFIGS or name == "vgg16":
        return 1000
    return 10


def _check_name(name: str) -> None:
    if name not in MODEL_NAMES:
        raise ValueError(f"unknown model {name!r}; choose one of {', '.join(MODEL_NAMES)}")


def _check_image_size(name: str, image_size: int, minimum: int) -> None:
    if image_size < minimum:
        raise ValueError(f"model {name!r} needs image_size >= {minimum}, got {image_size}")


def _build_bert(name: str, num_classes: int, seq_len: int, vocab_size: int, overrides: dict[str, Any]) -> nn.Module:
    allowed = set(BERT_CONFIGS[name]) | {"max_positions", "dropout"}
    unknown = sorted(set(overrides) - allowed)
    if unknown:
        raise ValueError(f"unknown option(s) {', '.join(unknown)} for {name!r}; allowed: {', '.join(sorted(allowed))}")
    config: dict[str, Any] = {**BERT_CONFIGS[name], "max_positions": BERT_MAX_POSITIONS, **overrides}
    if seq_len > config["max_positions"]:
        raise ValueError(f"seq_len {seq_len} exceeds the {config['max_positions']} positions of {name!r}")
    return BertClassifier(num_classes, vocab_size=vocab_size, **config)


def build_model(
    name: str,
    *,
    num_classes: int,
    in_channels: int = 3,
    image_size: int = 32,
    seq_len: int = 64,
    vocab_size: int = 30522,
    **overrides: Any,
) -> nn.Module:
    """Build model ``name`` with a head of ``num_classes`` outputs.

    ``in_channels``/``image_size`` describe image inputs (the MLP's input width is
    ``in_channels * image_size**2``; the other image models adapt to the size). ``seq_len``
    and ``vocab_size`` describe token inputs. ``overrides`` are for BERT only
    (``num_layers``, ``hidden_size``, ``num_heads``, ``intermediate_size``,
    ``max_positions``, ``dropout``), e.g. a 2-layer BERT for fast tests and benchmarks.
    Raises ``ValueError`` for an unknown name, option or an input the model cannot take.
    """
    _check_name(name)
    if num_classes < 1:
        raise ValueError(f"num_classes must be >= 1, got {num_classes}")
    if name in SEQUENCE_MODELS:
        return _build_bert(name, num_classes, seq_len, vocab_size, overrides)
    if overrides:
        raise ValueError(f"model {name!r} takes no options, got {', '.join(sorted(overrides))}")
    if in_channels < 1:
        raise ValueError(f"in_channels must be >= 1, got {in_channels}")
    if name in RESNET_CONFIGS:
        _check_image_size(name, image_size, MIN_IMAGE_SIZE_LARGE)
        block, blocks = RESNET_CONFIGS[name]
        return ResNet(block, blocks, num_classes, in_channels)
    if name == "vgg16":
        _check_image_size(name, image_size, MIN_IMAGE_SIZE_LARGE)
        return VGG16(num_classes, in_channels)
    if name == "cnn":
        _check_image_size(name, image_size, 2)
        return SmallCNN(in_channels, num_classes)
    _check_image_size(name, image_size, 1)
    return MLP(in_channels * image_size * image_size, num_classes)


def parameter_shapes(name: str, **kwargs: Any) -> list[tuple[int, ...]]:
    """Shapes of ``build_model(name, **kwargs).parameters()``, in that order, allocating nothing.

    The model is built on the ``meta`` device, so ResNet-152 or BERT-Large cost milliseconds
    and no memory. ``num_classes`` defaults to :func:`default_num_classes` (ImageNet's 1000
    for ResNet/VGG, 2 for BERT), the heads the paper's measurements use.
    """
    kwargs.setdefault("num_classes", default_num_classes(name))
    with torch.device("meta"):
        model = build_model(name, **kwargs)
    return [tuple(p.shape) for p in model.parameters()]


def count_parameters(model: nn.Module) -> int:
    """Number of trainable scalars."""
    return sum(math.prod(p.shape) for p in model.parameters() if p.requires_grad)
