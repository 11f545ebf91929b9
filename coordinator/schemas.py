"""The REST contract: what clients send (``JobSpec``, ``PinnedPolicy``/``AdaptivePolicy``) and read back.

Validation happens here, at the boundary, so the rest of the coordinator can trust its
inputs. ``JobSpec`` lists the user-settable fields of ``workers.protocol.TrainConfig``
explicitly (that is the documented API, shown in ``/docs``) and is checked against
``TrainConfig`` once more when it is built, so a spec that passes here always converts.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    ValidationError,
    field_validator,
    model_validator,
)

from compressors.spec import COMPRESSOR_NAMES, make_spec
from workers.protocol import DATASET_NAMES, MODEL_NAMES, CompressionConfig, TrainConfig

JobState = Literal["queued", "running", "succeeded", "failed", "cancelled"]
JOB_STATES: tuple[str, ...] = ("queued", "running", "succeeded", "failed", "cancelled")
TERMINAL_STATES = frozenset({"succeeded", "failed", "cancelled"})
PolicyMode = Literal["fixed", "adaptive", "pinned"]

ModelName = Literal[MODEL_NAMES]  # type: ignore[valid-type]
DatasetName = Literal[DATASET_NAMES]  # type: ignore[valid-type]

_NUMBERS = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class JobSpec(BaseModel):
    """A training job as a user submits it. Every field but the few in the smallest example
    of design.md §4 has a default; unknown fields are refused so a typo never goes unnoticed."""

    model_config = _NUMBERS

    name: str = Field(default="job", min_length=1, max_length=128)
    model: ModelName = "mlp"
    dataset: DatasetName = "synthetic"
    batch_size: int = Field(default=32, ge=1, le=65_536, description="per worker")
    steps: int | None = Field(default=None, ge=1, le=10_000_000, description="or epochs; default 100 steps")
    epochs: int | None = Field(default=None, ge=1, le=100_000)
    seq_len: int = Field(default=64, ge=2, le=4096, description="tokens per sample (sequence models)")
    optimizer: Literal["sgd", "adamw"] = "sgd"
    lr: float = Field(default=0.05, gt=0, le=100)
    momentum: float = Field(default=0.9, ge=0, lt=1)
    weight_decay: float = Field(default=0.0, ge=0, le=1)
    lr_schedule: Literal["constant", "cosine", "step"] = "constant"
    workers: int | tuple[int, int] = Field(default=2, description="a number, or 'min..max' / [min, max] for elastic")
    use_gpu: StrictBool = False
    compression: CompressionConfig = CompressionConfig()
    checkpoint_every: int = Field(default=0, ge=0, le=10_000_000, description="steps between checkpoints; 0 = none")
    max_failures: int = Field(default=0, ge=-1, le=1000)
    probe_interval_s: float = Field(default=60.0, gt=0, le=86_400)
    report_interval_s: float = Field(default=2.0, gt=0, le=3600)
    sync_every: int = Field(default=5, ge=1, le=100_000)
    seed: int = Field(default=0, ge=0, le=2**31 - 1)
    bucket_cap_mb: float = Field(default=25.0, gt=0, le=10_000)

    @field_validator("workers", mode="before")
    @classmethod
    def _workers(cls, value: Any) -> Any:
        """Same parsing and bounds as ``TrainConfig.workers`` (``2``, ``"1..4"``, ``[1, 4]``)."""
        if isinstance(value, bool):
            raise ValueError("must be a number or 'min..max', got a boolean")
        try:
            return TrainConfig.model_validate({"workers": value}).workers
        except ValidationError as exc:
            raise ValueError(_first_message(exc)) from None

    @model_validator(mode="after")
    def _converts(self) -> "JobSpec":
        """Cross-field rules (steps xor epochs, model/dataset fit) live in TrainConfig."""
        try:
            self.to_train_config()
        except ValidationError as exc:
            raise ValueError(_first_message(exc)) from None
        return self

    def to_train_config(self, *, job_id: str | None = None, job_token: str | None = None,
                        coordinator_url: str | None = None) -> TrainConfig:
        return TrainConfig(
            **self.model_dump(exclude={"compression"}),
            compression=self.compression,
            job_id=job_id,
            job_token=job_token,
            coordinator_url=coordinator_url,
        )

    @property
    def min_workers(self) -> int:
        return self.workers if isinstance(self.workers, int) else self.workers[0]


def _first_message(exc: ValidationError) -> str:
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err["loc"])
    message = str(err["msg"]).removeprefix("Value error, ")
    return f"{where}: {message}" if where else message


class PinnedPolicy(BaseModel):
    """Hold the job on one compressor until released."""

    model_config = _NUMBERS

    mode: Literal["pinned"]
    compressor: str
    rank: int | None = Field(default=None, ge=1, le=4096)
    ratio: float | None = Field(default=None, gt=0, le=1)

    @field_validator("compressor")
    @classmethod
    def _known(cls, value: str) -> str:
        if value not in COMPRESSOR_NAMES:
            raise ValueError(f"unknown compressor {value!r}; choose one of {', '.join(COMPRESSOR_NAMES)}")
        return value

    @model_validator(mode="after")
    def _params_fit(self) -> "PinnedPolicy":
        make_spec(self.compressor, **self.params())
        return self

    def params(self) -> dict[str, Any]:
        return {k: v for k, v in (("rank", self.rank), ("ratio", self.ratio)) if v is not None}


class AdaptivePolicy(BaseModel):
    """Hand the job (back) to the adaptive policy."""

    model_config = _NUMBERS

    mode: Literal["adaptive"]


class PolicyView(BaseModel):
    mode: PolicyMode
    compressor: str
    params: dict[str, Any]
    decision_version: int


class DecisionRecord(BaseModel):
    """One stored decision: the wire ``Decision`` plus when and why it was made."""

    version: int
    compressor: str
    params: dict[str, Any]
    reason: str
    predicted_gain: float | None = None
    source: Literal["config", "policy", "pinned", "released"]
    at: float


class Transition(BaseModel):
    at: float
    from_state: JobState | None
    to_state: JobState
    reason: str


class TelemetryPoint(BaseModel):
    """One (downsampled) report of a running job, as the history and the live page keep it."""

    at: float
    step: int
    loss: float | None = None
    samples_per_second: float | None = None
    bandwidth_bytes_per_second: float | None = None
    latency_seconds: float | None = None
    compressor: str | None = None
    rank: int | None = None
    ratio: float | None = None
    phase_seconds: dict[str, float] = {}
    step_seconds: float | None = None


class JobStatus(BaseModel):
    """``GET /v1/jobs/{id}``: the job, its latest report and the compressor in use.
    Times are Unix seconds; ``phase_seconds`` holds mean seconds per phase over the last report."""

    id: str
    name: str
    state: JobState
    reason: str
    created_at: float
    started_at: float | None
    finished_at: float | None
    updated_at: float
    step: int
    steps: int | None
    loss: float | None
    samples_per_second: float | None
    compressor: str
    rank: int | None
    ratio: float | None
    bandwidth_bytes_per_second: float | None
    latency_seconds: float | None
    phase_seconds: dict[str, float]
    step_seconds: float | None
    bytes_sent_per_step: float | None
    world_size: int | None
    workers: int | tuple[int, int]
    decision_version: int
    policy_mode: PolicyMode
    spec: JobSpec
    summary: dict[str, Any] | None = None


class JobCreated(JobStatus):
    """The answer to ``POST /v1/jobs``; the only place the job's worker token is shown (an
    external runner, e.g. ``gradwire train --coordinator``, reports with it)."""

    worker_token: str


class JobHistory(BaseModel):
    job: JobStatus
    telemetry: list[TelemetryPoint]
    decisions: list[DecisionRecord]
    transitions: list[Transition]


class Health(BaseModel):
    status: Literal["ok"]
    version: str
    launcher: Literal["ray", "none"]
    ray: str
    jobs: dict[str, int]
