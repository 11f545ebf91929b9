"""Torch-free wire models shared by the workers and the coordinator.

The coordinator converts a REST ``JobSpec`` into a :class:`TrainConfig` and hands it to
``workers.loop.train_loop_per_worker``; rank 0 of a running job posts :class:`Telemetry`
and polls :class:`Decision`. Keeping these here (pydantic only, no torch) lets the web
process import them without pulling in torch or Ray.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from compressors.spec import COMPRESSOR_NAMES, make_spec

PHASES: tuple[str, ...] = ("data", "forward", "backward", "exposed_comm", "optimizer")
HOOK_PHASES: tuple[str, ...] = ("compress", "communicate", "decompress")
ALL_PHASES: tuple[str, ...] = PHASES + HOOK_PHASES

MODEL_NAMES: tuple[str, ...] = (
    "mlp", "cnn", "resnet18", "resnet50", "resnet152", "vgg16", "bert-base", "bert-large",
)
DATASET_NAMES: tuple[str, ...] = ("synthetic", "digits")
#: Models that take token sequences rather than images.
SEQUENCE_MODELS = frozenset({"bert-base", "bert-large"})


class _Strict(BaseModel):
    """Unknown fields are an error, not silently dropped: a typo must not change a job."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class CompressionConfig(_Strict):
    """How a job compresses gradients: a fixed choice, or adaptive within bounds."""

    mode: Literal["fixed", "adaptive"] = "fixed"
    compressor: str = "acpsgd"
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
        if value not in COMPRESSOR_NAMES:
            raise ValueError(f"unknown compressor {value!r}; choose one of {', '.join(COMPRESSOR_NAMES)}")
        return value

    @field_validator("allowed")
    @classmethod
    def _known_allowed(cls, value: list[str] | None) -> list[str] | None:
        if value is None:
            return None
        if not value:
            raise ValueError("must name at least one compressor")
        for name in value:
            if name not in COMPRESSOR_NAMES:
                raise ValueError(f"unknown compressor {name!r}; choose from {', '.join(COMPRESSOR_NAMES)}")
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
        if self.compressor in ("powersgd", "acpsgd") and self.rank is not None:
            params["rank"] = self.rank
        if self.compressor == "topk" and self.ratio is not None:
            params["ratio"] = self.ratio
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


class JobFields(_Strict):
    """What a user says about a training job (the coordinator's JobSpec extends this too)."""

    name: str = Field(default="job", min_length=1, max_length=128)
    model: str = "mlp"
    dataset: str = "synthetic"
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
    checkpoint_every: int = Field(default=0, ge=0, le=10_000_000)
    max_failures: int = Field(default=0, ge=-1, le=1000)
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
        if value not in MODEL_NAMES:
            raise ValueError(f"unknown model {value!r}; choose one of {', '.join(MODEL_NAMES)}")
        return value

    @field_validator("dataset")
    @classmethod
    def _known_dataset(cls, value: str) -> str:
        if value not in DATASET_NAMES:
            raise ValueError(f"unknown dataset {value!r}; choose one of {', '.join(DATASET_NAMES)}")
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
        return self

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


class Decision(_Strict):
    """The compressor every rank should use; ``version`` grows with each change."""

    version: int = Field(default=0, ge=0)
    compressor: str
    params: dict[str, Any] = {}
    reason: str = ""
    predicted_gain: float | None = None

    @model_validator(mode="after")
    def _valid_compressor(self) -> "Decision":
        make_spec(self.compressor, **self.params)
        return self
