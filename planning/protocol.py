"""Torch-free wire models shared by the workers and the coordinator.

The coordinator converts a REST ``JobSpec`` into a :class:`TrainConfig` and hands it to
``workers.loop.train_loop_per_worker``; rank 0 of a running job posts :class:`Telemetry`
and polls :class:`Decision`. Keeping these here (pydantic only, no torch) lets the web
process import them without pulling in torch or Ray.
"""

from __future__ import annotations

import math
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from planning import registry
from planning.decision import Decision as Decision  # the one decision type, re-exported for the wire
from planning.spec import make_spec

PHASES: tuple[str, ...] = ("data", "forward", "backward", "exposed_comm", "optimizer")
HOOK_PHASES: tuple[str, ...] = ("compress", "communicate", "decompress")
ALL_PHASES: tuple[str, ...] = PHASES + HOOK_PHASES

MODEL_NAMES: tuple[str, ...] = (
    "mlp", "cnn", "resnet18", "resnet50", "resnet152", "vgg16", "bert-base", "bert-large",
)
DATASET_NAMES: tuple[str, ...] = ("synthetic", "digits")
#: Models that take token sequences rather than images.
SEQUENCE_MODELS = frozenset({"bert-base", "bert-large"})

#: ``package.module:attribute`` (the attribute may be dotted, ``module:Class.factory``): the
#: form of a user factory's import path, the convention of setuptools entry points.
IMPORT_PATH = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")
#: ``dataset`` of an external job (the user's own loop holds the data; gradwire never sees it).
EXTERNAL_DATASET = "external"


def is_import_path(value: str) -> bool:
    """True for ``package.module:factory`` (checked by form only: nothing is imported)."""
    return bool(IMPORT_PATH.match(value))


def _name_or_import_path(value: str, names: tuple[str, ...], what: str) -> str:
    """A built-in name, or an import path of the right form; the message says which forms work."""
    if value in names or is_import_path(value):
        return value
    if ":" in value:
        raise ValueError(f"import path {value!r} is malformed: write 'package.module:factory' "
                         "(dotted Python identifiers, one colon)")
    raise ValueError(f"unknown {what} {value!r}; choose one of {', '.join(names)} "
                     "or give an import path 'package.module:factory'")


def auto_checkpoint_every(total_steps: int) -> int:
    """The default checkpoint interval: about ten checkpoints per run, at least one every
    :data:`MAX_AUTO_CHECKPOINT_STEPS` steps. A crash then costs at most a tenth of the run
    (and never more than that many steps), while saving, which pauses every rank, happens a
    bounded number of times however short the run."""
    return max(1, min(math.ceil(total_steps / AUTO_CHECKPOINTS_PER_RUN), MAX_AUTO_CHECKPOINT_STEPS))


AUTO_CHECKPOINTS_PER_RUN = 10
MAX_AUTO_CHECKPOINT_STEPS = 500
#: Default ``max_failures``: a crashed worker (or node) is survived three times per run; an
#: error that repeats on every attempt (a bug, a NaN loss) still fails the job, after three
#: restarts, instead of looping for ever.
DEFAULT_MAX_FAILURES = 3


class _Strict(BaseModel):
    """Unknown fields are an error, not silently dropped: a typo must not change a job."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class CompressionConfig(_Strict):
    """How a job compresses gradients: a fixed choice, or adaptive within bounds."""

    mode: Literal["fixed", "adaptive"] = "fixed"
    compressor: str = registry.DEFAULT_COMPRESSOR
    rank: int | None = Field(default=None, ge=1, le=4096)
    ratio: float | None = Field(default=None, gt=0, le=1)
    warmup_steps: int = Field(default=0, ge=0, le=1_000_000)
    #: Compressors the adaptive policy may choose from (default: all).
    allowed: list[str] | None = None
    min_rank: int = Field(default=1, ge=1, le=4096)
    max_rank: int = Field(default=64, ge=1, le=4096)
    #: Hysteresis of the adaptive policy: switch only for a predicted step-time saving above
    #: this fraction, and no sooner than ``min_dwell_s`` after the last switch. The defaults
    #: suit links that change over minutes; a benchmark that compresses a day's changes into
    #: seconds scales the dwell down with it.
    gain_threshold: float = Field(default=0.10, ge=0, le=1)
    min_dwell_s: float = Field(default=30.0, ge=0, le=86_400)

    @field_validator("compressor")
    @classmethod
    def _known_compressor(cls, value: str) -> str:
        why = registry.unknown_name(value)
        if why:
            raise ValueError(why)
        return value

    @field_validator("allowed")
    @classmethod
    def _known_allowed(cls, value: list[str] | None) -> list[str] | None:
        if value is None:
            return None
        if not value:
            raise ValueError("must name at least one compressor")
        for name in value:
            why = registry.unknown_name(name)
            if why:
                raise ValueError(why)
        return value

    @model_validator(mode="after")
    def _consistent(self) -> "CompressionConfig":
        if self.min_rank > self.max_rank:
            raise ValueError("min_rank must not exceed max_rank")
        make_spec(self.compressor, **self.compressor_params())  # same rules as build()
        return self

    def compressor_params(self) -> dict[str, Any]:
        """Parameters for ``compressors.build(self.compressor, **params)``."""
        params: dict[str, Any] = {"warmup_steps": self.warmup_steps}
        description = registry.codec(self.compressor)
        for name in ("rank", "ratio"):  # the job fields that are compressor parameters
            if description.takes(name) and getattr(self, name) is not None:
                params[name] = getattr(self, name)
        return params


class ScheduledDecision(_Strict):
    """A compressor to use from ``step`` on: scripted switches for benchmarks and tests."""

    step: int = Field(ge=0)
    compressor: str
    params: dict[str, Any] = {}

    @model_validator(mode="after")
    def _valid(self) -> "ScheduledDecision":
        make_spec(self.compressor, **self.params)
        return self


class RuntimeEnvConfig(_Strict):
    """How the user's code reaches the workers: the subset of Ray's ``runtime_env`` a job may
    set, with Ray's own field names (https://docs.ray.io/en/latest/ray-core/handling-dependencies.html).

    ``working_dir`` and ``py_modules`` entries are local paths on the coordinator's host
    (Ray zips and uploads them to the cluster when the job starts) or remote URIs of zip
    files (``https://``, ``s3://``, ``gs://``); ``pip`` lists requirement strings installed
    into a virtualenv of the job's own; ``env_vars`` are set in every process of the job.
    """

    working_dir: str | None = Field(default=None, min_length=1, max_length=4096)
    py_modules: list[str] | None = Field(default=None, min_length=1, max_length=64)
    pip: list[str] | None = Field(default=None, min_length=1, max_length=256)
    env_vars: dict[str, str] | None = None

    @field_validator("py_modules", "pip")
    @classmethod
    def _no_empty_entries(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and any(not entry.strip() for entry in value):
            raise ValueError("entries must be non-empty strings")
        return value

    @field_validator("env_vars")
    @classmethod
    def _env_names(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        for name in value or {}:
            if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", name):
                raise ValueError(f"environment variable name {name!r} is not valid")
        return value

    def to_ray(self) -> dict[str, Any]:
        """The dict ``ray.remote(...).options(runtime_env=...)`` takes."""
        return self.model_dump(exclude_none=True)


class JobFields(_Strict):
    """What a user says about a training job (the coordinator's JobSpec extends this too)."""

    name: str = Field(default="job", min_length=1, max_length=128)
    #: A built-in model name, or ``package.module:factory``: a callable taking no arguments
    #: that returns the ``nn.Module`` to train (the user's code, see ``runtime_env``).
    model: str = "mlp"
    #: A built-in dataset name, or ``package.module:factory``: ``factory(seed)`` returns
    #: ``(train, held_out)`` torch ``Dataset``s of ``(input, target)`` items (held_out may be None).
    dataset: str = "synthetic"
    #: ``package.module:factory`` returning the loss, called as ``loss(outputs, targets)``
    #: (e.g. ``torch.nn:MSELoss``); None: cross-entropy.
    loss: str | None = Field(default=None, max_length=512)
    #: Ray runtime environment of the job's processes: how a user factory's code gets there.
    runtime_env: RuntimeEnvConfig | None = None
    #: True: the training runs elsewhere (a Ray Train or torchrun script using
    #: ``gradwire.ray.prepare`` / ``gradwire.torch.prepare``); the coordinator records it,
    #: decides for it and shows it, but launches nothing.
    external: bool = False
    batch_size: int = Field(default=32, ge=1, le=65_536)
    steps: int | None = Field(default=None, ge=1, le=10_000_000)
    epochs: int | None = Field(default=None, ge=1, le=100_000)
    seq_len: int = Field(default=64, ge=2, le=4096)
    optimizer: Literal["sgd", "adamw"] = "sgd"
    lr: float = Field(default=0.05, gt=0, le=100)
    momentum: float = Field(default=0.9, ge=0, lt=1)
    weight_decay: float = Field(default=0.0, ge=0, le=1)
    lr_schedule: Literal["constant", "cosine", "step"] = "constant"
    workers: int | tuple[int, int] = 2
    use_gpu: bool = False
    compression: CompressionConfig = CompressionConfig()
    #: Steps between checkpoints; None: chosen from the run's length
    #: (:func:`auto_checkpoint_every`); 0: no checkpoints but the final one.
    checkpoint_every: int | None = Field(default=None, ge=0, le=10_000_000)
    #: Restarts of the worker group a job survives (-1: any number; 0: the first crash fails it).
    max_failures: int = Field(default=DEFAULT_MAX_FAILURES, ge=-1, le=1000)
    probe_interval_s: float = Field(default=60.0, gt=0, le=86_400)
    #: Most of the run time the link probes may take (they pause training on every rank).
    probe_budget: float = Field(default=0.02, gt=0, lt=1)
    report_interval_s: float = Field(default=2.0, gt=0, le=3600)
    sync_every: int = Field(default=5, ge=1, le=100_000)
    seed: int = Field(default=0, ge=0, le=2**31 - 1)
    bucket_cap_mb: float = Field(default=25.0, gt=0, le=10_000)
    #: False: send every bucket only after backward ends (the paper's "pipelining off" ablation).
    pipelining: bool = True
    #: Scripted compressor switches (overrides the policy when set).
    schedule: list[ScheduledDecision] | None = None
    #: Synthetic image side (e.g. 224 for ImageNet-sized inputs); None = the dataset default.
    image_size: int | None = Field(default=None, ge=8, le=1024)

    @field_validator("model")
    @classmethod
    def _known_model(cls, value: str) -> str:
        return _name_or_import_path(value, MODEL_NAMES, "model")

    @field_validator("dataset")
    @classmethod
    def _known_dataset(cls, value: str) -> str:
        return _name_or_import_path(value, DATASET_NAMES + (EXTERNAL_DATASET,), "dataset")

    @field_validator("loss")
    @classmethod
    def _loss_path(cls, value: str | None) -> str | None:
        if value is not None and not is_import_path(value):
            raise ValueError(f"import path {value!r} is malformed: write 'package.module:factory' "
                             "(dotted Python identifiers, one colon)")
        return value

    @field_validator("workers", mode="before")
    @classmethod
    def _parse_workers(cls, value: Any) -> Any:
        """Accept ``2``, ``"2"``, ``"1..4"`` or ``[1, 4]``."""
        if isinstance(value, str):
            text = value.strip()
            if ".." in text:
                low, _, high = text.partition("..")
                try:
                    return (int(low), int(high))
                except ValueError:
                    raise ValueError(f"must be a number or 'min..max', got {value!r}") from None
            try:
                return int(text)
            except ValueError:
                raise ValueError(f"must be a number or 'min..max', got {value!r}") from None
        return value

    @field_validator("workers")
    @classmethod
    def _valid_workers(cls, value: int | tuple[int, int]) -> int | tuple[int, int]:
        low, high = (value, value) if isinstance(value, int) else value
        if low < 1 or high > 1024 or low > high:
            raise ValueError(f"must be between 1 and 1024 with min <= max, got {value!r}")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> "JobFields":
        if self.steps is None and self.epochs is None:
            object.__setattr__(self, "steps", 100)
        if self.steps is not None and self.epochs is not None:
            raise ValueError("give steps or epochs, not both")
        if self.model in SEQUENCE_MODELS and self.dataset == "digits":
            raise ValueError(f"model {self.model!r} takes token sequences; dataset 'digits' holds images")
        if (self.dataset == EXTERNAL_DATASET) != self.external:
            raise ValueError(f"dataset {EXTERNAL_DATASET!r} is for external jobs (external: true) only, "
                             "and an external job's dataset is 'external'")
        if not self.external and is_import_path(self.dataset) and not is_import_path(self.model):
            raise ValueError(f"dataset {self.dataset!r} is your own: give your own model too (built-in "
                             "models are shaped for the built-in datasets)")
        return self

    @property
    def user_model(self) -> bool:
        """The model comes from the user's code (an import path)."""
        return is_import_path(self.model)

    @property
    def user_dataset(self) -> bool:
        return is_import_path(self.dataset)

    def checkpoint_interval(self, total_steps: int) -> int:
        """Steps between checkpoints for a run of ``total_steps`` (0: none but the final one)."""
        return auto_checkpoint_every(total_steps) if self.checkpoint_every is None else self.checkpoint_every

    @property
    def min_workers(self) -> int:
        return self.workers if isinstance(self.workers, int) else self.workers[0]

    @property
    def max_workers(self) -> int:
        return self.workers if isinstance(self.workers, int) else self.workers[1]


class TrainConfig(JobFields):
    """Everything one training job needs; what every worker receives."""

    #: Where ``--no-ray`` runs keep checkpoints (Ray Train uses its own storage).
    checkpoint_dir: str | None = None
    #: Set by the coordinator: where rank 0 posts telemetry and reads decisions.
    coordinator_url: str | None = None
    job_id: str | None = None
    job_token: str | None = None


class ModelProfile(_Strict):
    """What the cost model needs about a job's model, measured once on a worker."""

    shapes: list[list[int]]
    #: Parameter indices (into ``shapes``) of each DDP bucket, in the order buckets fire.
    buckets: list[list[int]] = []
    forward_s: float = Field(default=0.0, ge=0)
    #: Backward *compute* (measured with uncompressed communication excluded as far as possible).
    backward_s: float = Field(default=0.0, ge=0)
    optimizer_s: float = Field(default=0.0, ge=0)
    #: Calibrated encode+decode seconds per step, by compressor label (e.g. "acpsgd-r4").
    codec_s: dict[str, float] = {}
    #: Calibrated seconds per element pass (costmodel.codec_work), by compressor name, for
    #: labels that were not timed themselves (other ranks of the same compressor).
    codec_per_element_s: dict[str, float] = {}
    device: str = "cpu"


class Telemetry(_Strict):
    """One report from rank 0 of a running job."""

    step: int = Field(ge=0)
    steps: int | None = None
    loss: float | None = None
    samples_per_second: float | None = Field(default=None, ge=0)
    phase_seconds: dict[str, float] = {}
    bytes_sent_per_step: float | None = Field(default=None, ge=0)
    bandwidth_bytes_per_second: float | None = Field(default=None, gt=0)
    latency_seconds: float | None = Field(default=None, ge=0)
    #: How much longer a collective takes when the peers sat idle waiting (the probe's wake_s).
    link_wake_seconds: float | None = Field(default=None, ge=0)
    #: σ of one rank's forward+backward compute per step over the timer's window: the
    #: cost model's straggler term (the slowest rank lags the mean by about e_N·σ).
    compute_jitter_seconds: float | None = Field(default=None, ge=0)
    grad_norm: float | None = Field(default=None, ge=0)
    #: The running compressor's relative error ‖x − C(x)‖ / ‖x‖ in the last step
    #: (``compressors.quality.ErrorMeter``): what the job loses now.
    compression_error: float | None = Field(default=None, ge=0, le=1)
    #: Every candidate's estimated relative error on a sample of this job's gradient
    #: matrices, by label (``acpsgd-r4``): the adaptive policy's quality input.
    compression_error_estimates: dict[str, float] = Field(default={}, max_length=256)
    compressor: str | None = None
    rank: int | None = None
    ratio: float | None = None
    world_size: int = Field(default=1, ge=1)
    decision_version: int = Field(default=0, ge=0)
    wall_time: float | None = None
    profile: ModelProfile | None = None
    #: A random id of the worker group that sends this report, new each time Ray Train
    #: (re)starts the group; the coordinator records a restart when it changes.
    worker_group: str | None = Field(default=None, max_length=64)
    #: The checkpoint step this worker group resumed from (None: it started fresh).
    resumed_from_step: int | None = Field(default=None, ge=0)

    @field_validator("phase_seconds")
    @classmethod
    def _known_phases(cls, value: dict[str, float]) -> dict[str, float]:
        for phase, seconds in value.items():
            if phase not in ALL_PHASES:
                raise ValueError(f"unknown phase {phase!r}; phases are {', '.join(ALL_PHASES)}")
            if seconds < 0:
                raise ValueError(f"phase {phase!r}: seconds must be >= 0")
        return value

    @field_validator("compression_error_estimates")
    @classmethod
    def _bounded_errors(cls, value: dict[str, float]) -> dict[str, float]:
        for label, error in value.items():
            if not 0 < len(label) <= 64:
                raise ValueError(f"compression_error_estimates: label {label[:64]!r} must be 1-64 characters")
            if not 0 <= error <= 1:
                raise ValueError(f"compression_error_estimates[{label!r}]: must be in [0, 1], got {error}")
        return value
