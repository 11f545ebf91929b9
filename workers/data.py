"""Datasets and per-rank loaders for the training loop.

Two datasets, for two purposes:

* ``synthetic`` measures throughput and runs anywhere: seeded random inputs shaped for the
  model (3x32x32 images by default, flat 3072-vectors for the MLP, BERT token ids). Labels
  come from a fixed random "teacher" (a linear map of the 4x4-pooled image, or a bag-of-tokens
  score), so the task is learnable and a test can watch the loss fall. Samples are generated
  on access from (seed, split, index), so a ResNet-50 run at 224x224 costs no memory and
  every rank sees the same sample for the same index.
* ``digits`` checks accuracy: scikit-learn's 8x8 handwritten digits (1,797 images, 10
  classes, shipped inside the package, so it works offline), normalised, with a fixed
  stratified 80/20 train/test split. The MLP sees flat 64-vectors, the small CNN 1x8x8
  images, and ResNets/VGG-16 (which downsample 32x) images upsampled to 1x32x32.

``input_spec(model, dataset)`` tells the loop how to build a matching model
(``build_model(model, **input_spec(model, dataset))``), ``validate_combination`` rejects bad
jobs before any worker starts, and ``make_loader`` / ``InfiniteLoader`` give each rank a
distinct shard through ``DistributedSampler``. ``batch_size`` is always per worker.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from functools import lru_cache
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset, DistributedSampler, TensorDataset

from planning.sections import DATASET_NAMES, MODEL_NAMES, SEQUENCE_MODELS

__all__ = [
    "SPLITS",
    "SyntheticImages",
    "SyntheticTokens",
    "InfiniteLoader",
    "batches_per_epoch",
    "build_dataset",
    "dataset_size",
    "digits_split_indices",
    "input_spec",
    "make_loader",
    "validate_combination",
]

SPLITS: tuple[str, ...] = ("train", "test")

#: What kind of input each dataset can provide; synthetic data shapes itself to the model.
DATASET_KINDS: dict[str, frozenset[str]] = {
    "synthetic": frozenset({"image", "sequence"}),
    "digits": frozenset({"image"}),
}

SYNTHETIC_SAMPLES: dict[str, int] = {"train": 4096, "test": 1024}
SYNTHETIC_IMAGE_CLASSES = 10
SYNTHETIC_SEQUENCE_CLASSES = 2
SYNTHETIC_IMAGE_CHANNELS = 3
SYNTHETIC_IMAGE_SIZE = 32
#: Synthetic sets up to this size are generated once and kept in memory (3x32x32 images:
#: 50 MB for the 4096 training samples); larger ones (224-pixel images) are made per access.
SYNTHETIC_CACHE_BYTES = 128 * 1024 * 1024
#: BERT's WordPiece vocabulary size and its [CLS] token id: sequences look like BERT input.
VOCAB_SIZE = 30522
CLS_TOKEN_ID = 101
MAX_SEQ_LEN = 512

DIGITS_CLASSES = 10
DIGITS_TOTAL = 1797
DIGITS_TEST_FRACTION = 0.2
#: The split never depends on the job's seed, so test accuracy is comparable across runs.
DIGITS_SPLIT_SEED = 0
#: Digits stay 8x8 for these models; the rest get them upsampled to 32x32.
NATIVE_DIGITS_MODELS = frozenset({"mlp", "cnn"})
UPSAMPLED_DIGITS_SIZE = 32

# Stream tags keep the teacher's random numbers apart from the samples'.
_TEACHER_STREAM, _SAMPLE_STREAM = 0, 1


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
        full = len(_digits_split()[split][1])
    else:
        full = SYNTHETIC_SAMPLES[split]
    if num_samples is None:
        return full
    if num_samples < 1:
        raise ValueError(f"num_samples must be >= 1, got {num_samples}")
    return num_samples if dataset == "synthetic" else min(num_samples, full)


def batches_per_epoch(num_samples: int, batch_size: int, world_size: int) -> int:
    """Full per-worker batches in one epoch (the sampler and loader both drop remainders)."""
    return (num_samples // world_size) // batch_size


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
# Synthetic data
# ---------------------------------------------------------------------------------------------


def _seed(*keys: int) -> int:
    """A 64-bit seed from several integers, well mixed (neighbouring keys give unrelated streams)."""
    return int(np.random.SeedSequence([int(k) for k in keys]).generate_state(1, dtype=np.uint64)[0])


def _generator(*keys: int) -> torch.Generator:
    return torch.Generator().manual_seed(_seed(*keys))


class _SeededSamples(Dataset):
    """Base for synthetic sets: sample ``i`` is a pure function of (seed, split, i)."""

    def __init__(self, num_samples: int, seed: int, split: str) -> None:
        if seed < 0:
            raise ValueError(f"seed must be >= 0, got {seed}")
        self.num_samples = num_samples
        self.seed = seed
        self.split_id = SPLITS.index(split)
        self._cache: list[tuple[torch.Tensor, torch.Tensor]] | None = None

    def __len__(self) -> int:
        return self.num_samples

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Sample ``index``; a set that fits :data:`SYNTHETIC_CACHE_BYTES` is generated whole on
        first access and then served from memory, so input generation costs next to nothing
        beside a training step (generating one sample takes ~0.1 ms, a batch of 64 ~8 ms)."""
        if self._cache is None and self._cacheable():
            self._cache = [self.sample(i) for i in range(self.num_samples)]
        if self._cache is not None:
            if not 0 <= index < self.num_samples:
                raise IndexError(f"index {index} out of range for {self.num_samples} samples")
            return self._cache[index]
        return self.sample(index)

    def _cacheable(self) -> bool:
        inputs, _ = self.sample(0)
        return inputs.numel() * inputs.element_size() * self.num_samples <= SYNTHETIC_CACHE_BYTES

    def sample(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Generate sample ``index`` from (seed, split, index) alone."""
        raise NotImplementedError

    def _sample_generator(self, index: int) -> torch.Generator:
        if not 0 <= index < self.num_samples:
            raise IndexError(f"index {index} out of range for {self.num_samples} samples")
        return _generator(_SAMPLE_STREAM, self.seed, self.split_id, index)


def _pool4x4(image: torch.Tensor) -> torch.Tensor:
    """Average pool (C, H, W) to (C, 4, 4); a reshape when H and W divide by 4 (much faster
    on CPU than ``adaptive_avg_pool2d``, which matters: it runs once per sample)."""
    channels, height, width = image.shape
    if height % 4 or width % 4:
        return F.adaptive_avg_pool2d(image, (4, 4))
    return image.view(channels, 4, height // 4, 4, width // 4).mean(dim=(2, 4))


class SyntheticImages(_SeededSamples):
    """Noisy images labelled by a fixed linear teacher on their 4x4 average pool.

    Each image is a random 4x4 grid of blobs (upsampled) plus unit pixel noise. The teacher
    reads the coarse structure only, so the MLP, the CNN and the ResNets can all learn it
    quickly; its columns have unit norm, so the classes are balanced in distribution.
    ``flatten`` returns vectors for the MLP.
    """

    def __init__(
        self,
        num_samples: int,
        *,
        seed: int = 0,
        split: str = "train",
        channels: int = SYNTHETIC_IMAGE_CHANNELS,
        image_size: int = SYNTHETIC_IMAGE_SIZE,
        num_classes: int = SYNTHETIC_IMAGE_CLASSES,
        flatten: bool = False,
    ) -> None:
        super().__init__(num_samples, seed, split)
        self.shape = (channels, image_size, image_size)
        self.flatten = flatten
        teacher = torch.randn(channels * 16, num_classes, generator=_generator(_TEACHER_STREAM, seed))
        self.teacher = teacher / teacher.norm(dim=0, keepdim=True)

    def sample(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        generator = self._sample_generator(index)
        channels, size, _ = self.shape
        coarse = torch.randn(1, channels, 4, 4, generator=generator)
        image = F.interpolate(coarse, size=(size, size), mode="nearest")[0]
        image += torch.randn(self.shape, generator=generator)
        label = torch.argmax(_pool4x4(image).flatten() @ self.teacher)
        return (image.flatten() if self.flatten else image), label


class SyntheticTokens(_SeededSamples):
    """Uniform random token ids after a [CLS] token, labelled by a bag-of-tokens teacher."""

    def __init__(
        self,
        num_samples: int,
        *,
        seed: int = 0,
        split: str = "train",
        seq_len: int = 64,
        vocab_size: int = VOCAB_SIZE,
        num_classes: int = SYNTHETIC_SEQUENCE_CLASSES,
    ) -> None:
        super().__init__(num_samples, seed, split)
        self.seq_len = seq_len
        self.vocab_size = vocab_size
        self.token_scores = torch.randn(vocab_size, num_classes, generator=_generator(_TEACHER_STREAM, seed))

    def sample(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        tokens = torch.randint(self.vocab_size, (self.seq_len,), generator=self._sample_generator(index))
        tokens[0] = CLS_TOKEN_ID
        label = torch.argmax(self.token_scores[tokens[1:]].sum(0))
        return tokens, label


# ---------------------------------------------------------------------------------------------
# Digits
# ---------------------------------------------------------------------------------------------


@lru_cache(maxsize=1)
def digits_split_indices() -> tuple[np.ndarray, np.ndarray]:
    """Indices into ``load_digits()`` of the train and test splits: stratified, fixed 80/20."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    labels = load_digits().target
    train, test = train_test_split(
        np.arange(len(labels)), test_size=DIGITS_TEST_FRACTION, random_state=DIGITS_SPLIT_SEED, stratify=labels
    )
    return train, test


@lru_cache(maxsize=1)
def _digits_split() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Both splits as (features in [0, 1] standardised with train statistics, labels).

    One scalar mean/std (not per pixel: border pixels are always 0 and have no spread).
    """
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = digits.data.astype(np.float32) / 16.0
    y = digits.target.astype(np.int64)
    train, test = digits_split_indices()
    mean, std = x[train].mean(), x[train].std()
    return {"train": ((x[train] - mean) / std, y[train]), "test": ((x[test] - mean) / std, y[test])}


def _digits_dataset(model: str, split: str, num_samples: int | None, image_size: int | None) -> TensorDataset:
    features, labels = _digits_split()[split]
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


# ---------------------------------------------------------------------------------------------
# Public constructors and loaders
# ---------------------------------------------------------------------------------------------


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


def _sampler(dataset: Dataset, rank: int, world_size: int, seed: int, epoch: int, shuffle: bool) -> DistributedSampler:
    """Equal, disjoint shards per rank (drop_last), reshuffled per epoch identically on all ranks."""
    sampler = DistributedSampler(
        dataset, num_replicas=world_size, rank=rank, shuffle=shuffle, seed=seed, drop_last=True
    )
    sampler.set_epoch(epoch)
    return sampler


def make_loader(
    dataset: Dataset,
    batch_size: int,
    rank: int,
    world_size: int,
    seed: int,
    epoch: int = 0,
    *,
    shuffle: bool = True,
    drop_last: bool = True,
) -> DataLoader:
    """One epoch of ``rank``'s shard in batches of ``batch_size``.

    ``drop_last`` (default) keeps every batch full so all ranks take the same number of
    equally sized steps; pass ``False`` for evaluation.
    """
    sampler = _sampler(dataset, rank, world_size, seed, epoch, shuffle)
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler, drop_last=drop_last)


class InfiniteLoader(Iterator[Any]):
    """Endless batches for step-based training: epoch after epoch of this rank's shard.

    ``start_step`` resumes mid-epoch after a checkpoint, without reading the skipped batches:
    the same (seed, epoch) gives the same shuffle, so step ``s`` always gets the same batch.
    ``epoch`` is the epoch of the batch most recently returned (the starting epoch before any).
    """

    def __init__(
        self,
        dataset: Dataset,
        batch_size: int,
        rank: int,
        world_size: int,
        seed: int,
        *,
        start_step: int = 0,
    ) -> None:
        self.dataset = dataset
        self.batch_size = batch_size
        self.rank = rank
        self.world_size = world_size
        self.seed = seed
        self.steps_per_epoch = batches_per_epoch(len(dataset), batch_size, world_size)  # type: ignore[arg-type]
        if self.steps_per_epoch == 0:
            raise ValueError(
                f"per-worker batch_size {batch_size} is larger than each worker's shard "
                f"({len(dataset)} samples / {world_size} workers)"  # type: ignore[arg-type]
            )
        self.epoch, skip = divmod(start_step, self.steps_per_epoch)
        self._batches = self._epoch_batches(skip)

    def _epoch_batches(self, skip: int) -> Iterator[Any]:
        sampler = _sampler(self.dataset, self.rank, self.world_size, self.seed, self.epoch, shuffle=True)
        indices = list(sampler)
        index_batches: Sequence[list[int]] = [
            indices[i * self.batch_size:(i + 1) * self.batch_size] for i in range(skip, self.steps_per_epoch)
        ]
        return iter(DataLoader(self.dataset, batch_sampler=index_batches))

    def __next__(self) -> Any:
        try:
            return next(self._batches)
        except StopIteration:
            self.epoch += 1
            self._batches = self._epoch_batches(0)
            return next(self._batches)
