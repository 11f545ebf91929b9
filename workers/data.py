"""Datasets by name, shaped for the model: which dataset can feed which model, the model's
input shape, the checks a job must pass before any worker starts, and the dataset itself.

Two datasets, for two purposes:

* ``synthetic`` measures throughput and runs anywhere: seeded random inputs shaped for the
  model, labelled by a fixed teacher (:mod:`workers.synthetic_data`).
* ``digits`` checks accuracy: scikit-learn's 8x8 handwritten digits with a fixed stratified
  80/20 split (:mod:`workers.digits`). The MLP sees flat 64-vectors, the small CNN 1x8x8
  images, and ResNets/VGG-16 (which downsample 32x) images upsampled to 1x32x32.

``input_spec(model, dataset)`` tells the loop how to build a matching model
(``build_model(model, **input_spec(model, dataset))``), ``validate_combination`` rejects bad
jobs before any worker starts, and ``build_dataset`` returns the split. Each rank's shard
of it comes from :mod:`workers.loaders`. ``batch_size`` is always per worker.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset, TensorDataset

from planning.sections import DATASET_NAMES, MODEL_NAMES, SEQUENCE_MODELS
from workers.digits import DIGITS_CLASSES, digits_splits
from workers.synthetic_data import (
    SPLITS,
    SYNTHETIC_IMAGE_CHANNELS,
    SYNTHETIC_IMAGE_CLASSES,
    SYNTHETIC_IMAGE_SIZE,
    SYNTHETIC_SAMPLES,
    SYNTHETIC_SEQUENCE_CLASSES,
    SyntheticImages,
    SyntheticTokens,
)

__all__ = [
    "build_dataset",
    "dataset_size",
    "input_spec",
    "validate_combination",
]

#: What kind of input each dataset can provide; synthetic data shapes itself to the model.
DATASET_KINDS: dict[str, frozenset[str]] = {
    "synthetic": frozenset({"image", "sequence"}),
    "digits": frozenset({"image"}),
}
#: BERT's positions: the longest token sequence a job may ask for.
MAX_SEQ_LEN = 512

#: Digits stay 8x8 for these models; the rest get them upsampled to 32x32.
NATIVE_DIGITS_MODELS = frozenset({"mlp", "cnn"})
UPSAMPLED_DIGITS_SIZE = 32


# ---------------------------------------------------------------------------------------------
# Checks and shapes
# ---------------------------------------------------------------------------------------------


def _model_kind(model: str) -> str:
    if model not in MODEL_NAMES:
        raise ValueError(f"unknown model {model!r}; choose one of {', '.join(MODEL_NAMES)}")
    return "sequence" if model in SEQUENCE_MODELS else "image"


def _check_dataset(dataset: str) -> None:
    if dataset not in DATASET_NAMES:
        raise ValueError(f"unknown dataset {dataset!r}; choose one of {', '.join(DATASET_NAMES)}")


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose one of {', '.join(SPLITS)}")


def _check_kinds(model: str, dataset: str) -> None:
    """Raise if ``dataset`` cannot feed ``model`` (token ids vs images)."""
    _check_dataset(dataset)
    kind = _model_kind(model)
    if kind not in DATASET_KINDS[dataset]:
        holds = " or ".join(sorted(DATASET_KINDS[dataset]))
        takes = "token sequences" if kind == "sequence" else "images"
        raise ValueError(f"model {model!r} takes {takes} but dataset {dataset!r} holds {holds} data")


def input_spec(model: str, dataset: str, *, seq_len: int = 64, image_size: int | None = None) -> dict[str, int]:
    """Keyword arguments for ``build_model(model, ...)`` that match ``build_dataset(dataset, model=model)``.

    Returns ``num_classes``, ``in_channels``, ``image_size`` and ``seq_len``. ``image_size``
    overrides the default resolution (e.g. 224 for ImageNet-sized synthetic images).
    """
    _check_kinds(model, dataset)
    if dataset == "digits":
        default_size = 8 if model in NATIVE_DIGITS_MODELS else UPSAMPLED_DIGITS_SIZE
        return {"num_classes": DIGITS_CLASSES, "in_channels": 1,
                "image_size": image_size or default_size, "seq_len": seq_len}
    if model in SEQUENCE_MODELS:
        return {"num_classes": SYNTHETIC_SEQUENCE_CLASSES, "in_channels": SYNTHETIC_IMAGE_CHANNELS,
                "image_size": SYNTHETIC_IMAGE_SIZE, "seq_len": seq_len}
    return {"num_classes": SYNTHETIC_IMAGE_CLASSES, "in_channels": SYNTHETIC_IMAGE_CHANNELS,
            "image_size": image_size or SYNTHETIC_IMAGE_SIZE, "seq_len": seq_len}


def dataset_size(dataset: str, split: str = "train", num_samples: int | None = None) -> int:
    """Number of samples ``build_dataset`` would return, without building it."""
    _check_dataset(dataset)
    _check_split(split)
    if dataset == "digits":
        full = len(digits_splits()[split][1])
    else:
        full = SYNTHETIC_SAMPLES[split]
    if num_samples is None:
        return full
    if num_samples < 1:
        raise ValueError(f"num_samples must be >= 1, got {num_samples}")
    return num_samples if dataset == "synthetic" else min(num_samples, full)


def validate_combination(
    model: str,
    dataset: str,
    batch_size: int,
    world_size: int,
    *,
    seq_len: int = 64,
    num_samples: int | None = None,
) -> None:
    """Raise ``ValueError`` naming the problem if this job cannot run; call before starting workers.

    Catches: unknown names, an image model on sequence data or the reverse, a sequence longer
    than BERT's positions, and a per-worker ``batch_size`` larger than a worker's shard of
    the training data (the rank would get no batch at all, and the job would hang or spin).
    """
    _check_kinds(model, dataset)
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if model in SEQUENCE_MODELS and not 2 <= seq_len <= MAX_SEQ_LEN:
        raise ValueError(f"seq_len must be between 2 and {MAX_SEQ_LEN} for {model!r}, got {seq_len}")
    total = dataset_size(dataset, "train", num_samples)
    shard = total // world_size
    if batch_size > shard:
        raise ValueError(
            f"per-worker batch_size {batch_size} is larger than each worker's shard of dataset "
            f"{dataset!r} ({total} training samples / {world_size} workers = {shard} per worker)"
        )


# ---------------------------------------------------------------------------------------------
# Construction
# ---------------------------------------------------------------------------------------------


def _digits_dataset(model: str, split: str, num_samples: int | None, image_size: int | None) -> TensorDataset:
    """The digits split as ``model`` takes it: flat 64-vectors, 1x8x8 images, or upsampled."""
    features, labels = digits_splits()[split]
    if num_samples is not None:
        features, labels = features[:num_samples], labels[:num_samples]
    x = torch.from_numpy(features)
    size = input_spec(model, "digits", image_size=image_size)["image_size"]
    if model == "mlp" and size == 8:
        return TensorDataset(x, torch.from_numpy(labels))
    images = x.view(-1, 1, 8, 8)
    if size != 8:
        images = F.interpolate(images, size=(size, size), mode="bilinear", align_corners=False)
    if model == "mlp":
        images = images.flatten(1)
    return TensorDataset(images.contiguous(), torch.from_numpy(labels))


def build_dataset(
    name: str,
    *,
    model: str,
    split: str = "train",
    seed: int = 0,
    seq_len: int = 64,
    num_samples: int | None = None,
    image_size: int | None = None,
) -> Dataset:
    """The ``split`` of dataset ``name``, shaped for ``model``; items are ``(input, label)``.

    ``seed`` selects the synthetic data (digits' split is fixed). ``num_samples`` sets the
    synthetic size (default 4096 train / 1024 test) or truncates digits. ``image_size``
    overrides the resolution, as in :func:`input_spec`.
    """
    _check_kinds(model, name)
    _check_split(split)
    size = dataset_size(name, split, num_samples)
    if name == "digits":
        return _digits_dataset(model, split, num_samples, image_size)
    spec = input_spec(model, name, seq_len=seq_len, image_size=image_size)
    if model in SEQUENCE_MODELS:
        if not 2 <= seq_len <= MAX_SEQ_LEN:
            raise ValueError(f"seq_len must be between 2 and {MAX_SEQ_LEN}, got {seq_len}")
        return SyntheticTokens(size, seed=seed, split=split, seq_len=seq_len, num_classes=spec["num_classes"])
    return SyntheticImages(
        size, seed=seed, split=split, channels=spec["in_channels"], image_size=spec["image_size"],
        num_classes=spec["num_classes"], flatten=(model == "mlp"),
    )
