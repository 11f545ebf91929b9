"""Model registry: the networks gradwire trains and benchmarks, by name.

``build_model(name, num_classes=...)`` returns a plain ``torch.nn.Module``. The large models
reproduce the parameter *shapes* of the reference implementations exactly (torchvision's
ResNet-18/50/152 and VGG-16, Google's BERT-Base/Large), because gradient compression is
judged on those shapes: the bytes a compressor saves and the time it spends depend on how
many matrices there are and how big each one is, not on the weights' values. torchvision
is not a dependency (it does not import next to this torch build), so the networks are
written with plain ``torch.nn``, one family per module of :mod:`workers.networks`; this
module only maps a name (and the job's input shape) to one of them and checks the request.

Image models take float tensors ``(batch, channels, height, width)``; the MLP flattens
whatever it is given. Sequence models (``SEQUENCE_MODELS``) take ``LongTensor`` token ids
``(batch, seq_len)``. Every model returns logits ``(batch, num_classes)``.

``parameter_shapes(name)`` gives the gradient shapes without allocating any weights (the
model is built on the ``meta`` device), which is what the cost model and benchmarks need.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from planning.sections import MODEL_NAMES, SEQUENCE_MODELS
from workers.networks.bert import BERT_CONFIGS, BERT_MAX_POSITIONS, BERT_NUM_CLASSES, BertClassifier
from workers.networks.resnet import RESNET_CONFIGS, ResNet
from workers.networks.small import MLP, SmallCNN
from workers.networks.vgg import VGG16

__all__ = [
    "MODEL_NAMES",
    "SEQUENCE_MODELS",
    "build_model",
    "count_parameters",
    "default_num_classes",
    "parameter_shapes",
]

#: ResNets and VGG downsample by 32; smaller images would vanish before the head.
MIN_IMAGE_SIZE_LARGE = 32


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
