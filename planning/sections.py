"""The sections of a job's configuration, each validated once: ``model``, ``data``,
``optimizer``, ``compression``, ``probing``, ``checkpoints``.

``planning.config.JobFields`` puts them together (with the run-wide fields); the
coordinator's REST ``JobSpec``, ``gradwire train``/``submit`` and every worker use these same
models, so a section that validates in one validates in all. The names of built-in models
and datasets and the form of a user factory's import path are here too.

The compressor's rank is ``compression.compressor_rank`` (``rank`` is still accepted there):
a job also has process ranks and a world size, and the two must not be confused.

Torch-free (pydantic only): the coordinator imports it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any, Literal, get_args

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    field_validator,
    model_validator,
)

from planning import registry
from planning.spec import make_spec

MODEL_NAMES: tuple[str, ...] = (
    "mlp", "cnn", "resnet18", "resnet50", "resnet152", "vgg16", "bert-base", "bert-large",
)
DATASET_NAMES: tuple[str, ...] = ("synthetic", "digits")
#: Models that take token sequences rather than images.
SEQUENCE_MODELS = frozenset({"bert-base", "bert-large"})

#: ``package.module:attribute`` (the attribute may be dotted, ``module:Class.factory``): the
#: form of a user factory's import path, the convention of setuptools entry points.
IMPORT_PATH = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")
#: ``data.dataset`` of an external job (the user's own loop holds the data; gradwire never sees it).
EXTERNAL_DATASET = "external"

#: A job name becomes part of a directory name (Ray Train's run directory) and of log lines:
#: letters, digits, ``.``, ``_`` and ``-``, starting with a letter or digit — no path
#: separators, no ``..``, no control characters.
JOB_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"

AUTO_CHECKPOINTS_PER_RUN = 10
MAX_AUTO_CHECKPOINT_STEPS = 500
#: Default ``checkpoints.max_failures``: a crashed worker (or node) is survived three times
#: per run; an error that repeats on every attempt (a bug, a NaN loss) still fails the job,
#: after three restarts, instead of looping for ever.
DEFAULT_MAX_FAILURES = 3
#: Bounds of a compressor's rank (the low-rank factorisation's, not a process rank).
MAX_COMPRESSOR_RANK = 4096

def is_import_path(value: str) -> bool:
    """True for ``package.module:factory`` (checked by form only: nothing is imported)."""
    return bool(IMPORT_PATH.match(value))


def _malformed(value: str) -> ValueError:
    return ValueError(f"import path {value!r} is malformed: write 'package.module:factory' "
                      "(dotted Python identifiers, one colon)")


def _name_or_import_path(value: str, names: tuple[str, ...], what: str) -> str:
    """A built-in name, or an import path of the right form; the message says which forms work."""
    if value in names or is_import_path(value):
        return value
    if ":" in value:
        raise _malformed(value)
    raise ValueError(f"unknown {what} {value!r}; choose one of {', '.join(names)} "
                     "or give an import path 'package.module:factory'")


def _known_compressor(value: str) -> str:
    why = registry.unknown_name(value)
    if why:
        raise ValueError(why)
    return value


def auto_checkpoint_every(total_steps: int) -> int:
    """The default checkpoint interval: about ten checkpoints per run, at least one every
    :data:`MAX_AUTO_CHECKPOINT_STEPS` steps. A crash then costs at most a tenth of the run
    (and never more than that many steps), while saving, which pauses every rank, happens a
    bounded number of times however short the run."""
    return max(1, min(math.ceil(total_steps / AUTO_CHECKPOINTS_PER_RUN), MAX_AUTO_CHECKPOINT_STEPS))


class _Section(BaseModel):
    """Unknown fields are an error, not silently dropped (a typo must not change a job), and
    no float may be NaN or infinite."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class ModelConfig(_Section):
    """What is trained, and the loss it is trained with."""

    #: A built-in model name, or ``package.module:factory``: a callable taking no arguments
    #: that returns the ``nn.Module`` to train (the user's code, see ``runtime_env``).
    name: str = Field(default="mlp", max_length=512, description=(
        f"built-in ({', '.join(MODEL_NAMES)}) or 'package.module:factory' returning an nn.Module"))
    #: ``package.module:factory`` returning the loss, called as ``loss(outputs, targets)``
    #: (e.g. ``torch.nn:MSELoss``); None: cross-entropy.
    loss: str | None = Field(default=None, max_length=512)

    @field_validator("name")
    @classmethod
    def _known_model(cls, value: str) -> str:
        return _name_or_import_path(value, MODEL_NAMES, "model")

    @field_validator("loss")
    @classmethod
    def _loss_path(cls, value: str | None) -> str | None:
        if value is not None and not is_import_path(value):
            raise _malformed(value)
        return value

    @property
    def user_code(self) -> bool:
        """The model comes from the user's code (an import path)."""
        return is_import_path(self.name)


class DataConfig(_Section):
    """What is trained on, in batches of what size."""

    #: A built-in dataset name, or ``package.module:factory``: ``factory(seed)`` returns
    #: ``(train, held_out)`` torch ``Dataset``s of ``(input, target)`` items (held_out may be None).
    dataset: str = Field(default="synthetic", max_length=512, description=(
        f"built-in ({', '.join(DATASET_NAMES)}) or 'package.module:factory' whose factory(seed) "
        "returns (train, held_out) Datasets; 'external' for external jobs"))
    #: Samples per step on each worker.
    batch_size: int = Field(default=32, ge=1, le=65_536)
    seq_len: int = Field(default=64, ge=2, le=4096)
    #: Synthetic image side (e.g. 224 for ImageNet-sized inputs); None = the dataset default.
    image_size: int | None = Field(default=None, ge=8, le=1024)
    #: Seed of the order the training samples are drawn in; None = the job's ``seed``, which
    #: also draws the initial weights and a synthetic dataset. Set apart, it gives another run of
    #: the same model on the same data (the adaptive benchmark's reference runs).
    shuffle_seed: int | None = Field(default=None, ge=0, le=2**31 - 1)

    @field_validator("dataset")
    @classmethod
    def _known_dataset(cls, value: str) -> str:
        return _name_or_import_path(value, DATASET_NAMES + (EXTERNAL_DATASET,), "dataset")

    @property
    def user_code(self) -> bool:
        """The dataset comes from the user's code (an import path)."""
        return is_import_path(self.dataset)


#: The learning-rate schedules a job may name (command lines offer the same choices).
LrSchedule = Literal["constant", "cosine", "linear", "step"]
LR_SCHEDULES: tuple[str, ...] = get_args(LrSchedule)


class OptimizerConfig(_Section):
    """The optimizer and its learning-rate schedule."""

    name: Literal["sgd", "adamw"] = "sgd"
    lr: float = Field(default=0.05, gt=0, le=100)
    momentum: float = Field(default=0.9, ge=0, lt=1)
    weight_decay: float = Field(default=0.0, ge=0, le=1)
    lr_schedule: LrSchedule = "constant"


class ScheduledDecision(_Section):
    """A compressor to use from ``step`` on: scripted switches for benchmarks and tests."""

    step: int = Field(ge=0)
    compressor: str
    params: dict[str, Any] = {}

    @model_validator(mode="after")
    def _valid(self) -> "ScheduledDecision":
        make_spec(self.compressor, **self.params)
        return self


class CompressionConfig(_Section):
    """How a job compresses gradients: a fixed choice, or adaptive within bounds; and how the
    hook's buckets travel and how often the ranks agree on the compressor."""

    mode: Literal["fixed", "adaptive"] = "fixed"
    #: The compressor from step 0: a fixed job's for the whole run, an adaptive job's until the
    #: policy's first decision (unnamed: ``registry.DEFAULT_COMPRESSOR`` when fixed, a cast
    #: when adaptive, ``registry.adaptive_start``).
    compressor: str = registry.DEFAULT_COMPRESSOR
    #: The low-rank compressors' rank (powersgd, acpsgd): ``compressors.build(name, rank=...)``.
    #: Named so it is not read as a process rank; ``rank`` is accepted as its old spelling.
    compressor_rank: int | None = Field(default=None, ge=1, le=MAX_COMPRESSOR_RANK,
                                        validation_alias=AliasChoices("compressor_rank", "rank"))
    ratio: float | None = Field(default=None, gt=0, le=1)
    warmup_steps: int = Field(default=0, ge=0, le=1_000_000)
    #: Compressors the adaptive policy may choose from (default: all).
    allowed: list[str] | None = None
    #: Bounds of the compressor rank the adaptive policy may choose.
    min_rank: int = Field(default=1, ge=1, le=MAX_COMPRESSOR_RANK)
    max_rank: int = Field(default=64, ge=1, le=MAX_COMPRESSOR_RANK)
    #: Hysteresis of the adaptive policy: switch only for a predicted step-time saving above
    #: this fraction, and no sooner than ``min_dwell_s`` after the last switch. The defaults
    #: suit links that change over minutes; a benchmark that compresses a day's changes into
    #: seconds scales the dwell down with it.
    gain_threshold: float = Field(default=0.10, ge=0, le=1)
    min_dwell_s: float = Field(default=30.0, ge=0, le=86_400)
    #: Steps between two agreements of every rank on the compressor in force.
    sync_every: int = Field(default=5, ge=1, le=100_000)
    #: DDP's bucket size: the unit the hook compresses and sends.
    bucket_cap_mb: float = Field(default=25.0, gt=0, le=10_000)
    #: False: send every bucket only after backward ends (the paper's "pipelining off" ablation).
    pipelining: StrictBool = True
    #: Scripted compressor switches (overrides the policy when set).
    schedule: list[ScheduledDecision] | None = None

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, populate_by_name=True)

    @model_validator(mode="before")
    @classmethod
    def _one_rank(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and "rank" in data and "compressor_rank" in data:
            raise ValueError("rank: given twice, as rank and as compressor_rank; give compressor_rank once")
        return data

    @model_validator(mode="before")
    @classmethod
    def _adaptive_start(cls, data: Any) -> Any:
        """An adaptive job that names no compressor starts on a cast (``registry.adaptive_start``),
        not on the fixed default: its first steps run before the policy's first decision."""
        if isinstance(data, Mapping) and data.get("mode") == "adaptive" and data.get("compressor") is None:
            allowed = data.get("allowed")
            if isinstance(allowed, (list, tuple)) and allowed and all(isinstance(n, str) for n in allowed):
                return {**data, "compressor": registry.adaptive_start(list(allowed))}
            if allowed is None:
                return {**data, "compressor": registry.adaptive_start()}
        return data

    @field_validator("compressor")
    @classmethod
    def _known(cls, value: str) -> str:
        return _known_compressor(value)

    @field_validator("allowed")
    @classmethod
    def _known_allowed(cls, value: list[str] | None) -> list[str] | None:
        if value is None:
            return None
        if not value:
            raise ValueError("must name at least one compressor")
        for name in value:
            _known_compressor(name)
        return value

    @model_validator(mode="after")
    def _consistent(self) -> "CompressionConfig":
        if self.min_rank > self.max_rank:
            raise ValueError("min_rank must not exceed max_rank")
        make_spec(self.compressor, **self.compressor_params())  # same rules as build()
        return self

    def compressor_params(self) -> dict[str, Any]:
        """Parameters for ``compressors.build(self.compressor, **params)`` (whose own
        argument for the compressor rank is ``rank``)."""
        description = registry.codec(self.compressor)
        params: dict[str, Any] = {"warmup_steps": self.warmup_steps}
        if description.takes("rank") and self.compressor_rank is not None:
            params["rank"] = self.compressor_rank
        if description.takes("ratio") and self.ratio is not None:
            params["ratio"] = self.ratio
        return params


class ProbingConfig(_Section):
    """How the job measures its link and reports what it measured."""

    #: Seconds between active α-β probes of the all-reduce.
    interval_s: float = Field(default=60.0, gt=0, le=86_400)
    #: Most of the run time the link probes may take (they pause training on every rank).
    budget: float = Field(default=0.02, gt=0, lt=1)
    #: Seconds between two telemetry reports of rank 0.
    report_interval_s: float = Field(default=2.0, gt=0, le=3600)


class CheckpointConfig(_Section):
    """How often the job checkpoints, and how many crashes it survives."""

    #: Steps between checkpoints; None: chosen from the run's length
    #: (:func:`auto_checkpoint_every`); 0: no checkpoints but the final one.
    every: int | None = Field(default=None, ge=0, le=10_000_000)
    #: Restarts of the worker group a job survives (-1: any number; 0: the first crash fails it).
    max_failures: int = Field(default=DEFAULT_MAX_FAILURES, ge=-1, le=1000)
    #: Checkpoints a Ray run keeps in its storage, the latest ones (Ray Train's ``num_to_keep``);
    #: None: every one. Two by default: a restart needs only the latest, and each kept one costs
    #: a copy of the model and optimizer; keep more to evaluate the run's checkpoints afterwards
    #: (``benchmarks.adaptive --cluster`` keeps every one for its held-out curve).
    keep: int | None = Field(default=2, ge=1, le=100_000)

    def interval(self, total_steps: int) -> int:
        """Steps between checkpoints for a run of ``total_steps`` (0: none but the final one)."""
        return auto_checkpoint_every(total_steps) if self.every is None else self.every
