"""The REST contract: what clients send (``JobSpec``, ``PinnedPolicy``/``AdaptivePolicy``) and read back.

Validation happens here, at the boundary, so the rest of the coordinator can trust its
inputs. ``JobSpec`` lists the user-settable fields of ``planning.protocol.TrainConfig``
explicitly (that is the documented API, shown in ``/docs``) and is checked against
``TrainConfig`` once more when it is built, so a spec that passes here always converts.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    field_validator,
    model_validator,
)

from planning import registry
from planning.decision import Decision
from planning.protocol import (
    DATASET_NAMES,
    MODEL_NAMES,
    JobFields,
    ModelProfile,
    Telemetry,
    TrainConfig,
)
from planning.spec import make_spec

JobState = Literal["queued", "running", "succeeded", "failed", "cancelled"]
JOB_STATES: tuple[str, ...] = ("queued", "running", "succeeded", "failed", "cancelled")
TERMINAL_STATES = frozenset({"succeeded", "failed", "cancelled"})
PolicyMode = Literal["fixed", "adaptive", "pinned"]

# A built-in name or a user factory's import path; the workers' JobFields validators check both forms.
ModelName = str
DatasetName = str
_MODEL_DOC = f"built-in ({', '.join(MODEL_NAMES)}) or 'package.module:factory' returning an nn.Module"
_DATASET_DOC = (f"built-in ({', '.join(DATASET_NAMES)}) or 'package.module:factory' whose factory(seed) "
                "returns (train, held_out) Datasets; 'external' for external jobs")

_NUMBERS = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

#: A job name becomes part of a directory name (Ray Train's run directory) and of log lines:
#: letters, digits, ``.``, ``_`` and ``-``, starting with a letter or digit — no path
#: separators, no ``..``, no control characters.
JOB_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"


class JobSpec(JobFields):
    """A training job as a user submits it: ``planning.protocol.JobFields`` (the same fields,
    bounds and cross-field rules the workers use), with names spelled out as enums for the
    OpenAPI schema and strict types at the REST boundary. Every field but the few in the
    smallest example of docs/coordinator.md ("The smallest job") has a default; unknown fields are refused."""

    model_config = _NUMBERS

    name: str = Field(default="job", min_length=1, max_length=128, pattern=JOB_NAME_PATTERN,
                      description="letters, digits, '.', '_' and '-' (it names the run's directory)")
    model: ModelName = Field(default="mlp", max_length=512, description=_MODEL_DOC)
    dataset: DatasetName = Field(default="synthetic", max_length=512, description=_DATASET_DOC)
    external: StrictBool = False
    use_gpu: StrictBool = False

    @field_validator("workers", mode="before")
    @classmethod
    def _no_bool_workers(cls, value: Any) -> Any:
        if isinstance(value, bool):
            raise ValueError("must be a number or 'min..max', got a boolean")
        return value

    def to_train_config(self, *, job_id: str | None = None, job_token: str | None = None,
                        coordinator_url: str | None = None) -> TrainConfig:
        return TrainConfig(
            **self.model_dump(exclude={"compression", "schedule"}),
            compression=self.compression,
            schedule=self.schedule,
            job_id=job_id,
            job_token=job_token,
            coordinator_url=coordinator_url,
        )


#: Bounds of the integers a report carries: far above any real run, far below SQLite's 2**63.
MAX_REPORTED_STEP = 10**12
MAX_WORLD_SIZE = 1024  # JobFields.workers' bound


class ReportedProfile(ModelProfile):
    """A worker's :class:`~planning.protocol.ModelProfile` as the REST boundary accepts it:
    finite times and tensor dimensions a real model has."""

    model_config = _NUMBERS

    shapes: list[list[Annotated[int, Field(ge=0, le=2**40)]]]
    buckets: list[list[Annotated[int, Field(ge=0, le=2**40)]]] = []


class TelemetryReport(Telemetry):
    """``POST /v1/jobs/{id}/telemetry``: the worker's :class:`~planning.protocol.Telemetry`
    checked strictly at the REST boundary. No float may be NaN or infinite (the model config
    covers every float field, including ones added to ``Telemetry`` later), integers stay
    within bounds a database column holds, and the compressor is one gradwire knows (its name
    becomes a Prometheus label value)."""

    model_config = _NUMBERS

    step: int = Field(ge=0, le=MAX_REPORTED_STEP)
    steps: int | None = Field(default=None, ge=1, le=MAX_REPORTED_STEP)
    world_size: int = Field(default=1, ge=1, le=MAX_WORLD_SIZE)
    decision_version: int = Field(default=0, ge=0, le=MAX_REPORTED_STEP)
    compressor: str | None = None
    rank: int | None = Field(default=None, ge=1, le=4096)
    ratio: float | None = Field(default=None, gt=0, le=1)
    wall_time: float | None = Field(default=None, ge=0)
    resumed_from_step: int | None = Field(default=None, ge=0, le=MAX_REPORTED_STEP)
    profile: ReportedProfile | None = None

    @field_validator("compressor")
    @classmethod
    def _known_compressor(cls, value: str | None) -> str | None:
        why = registry.unknown_name(value) if value is not None else None
        if why:
            raise ValueError(why)
        return value


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
        why = registry.unknown_name(value)
        if why:
            raise ValueError(why)
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


#: A stored decision is the wire decision (``planning.decision.Decision``: one type from the
#: controller through the wire to the store and the REST history, with ``source`` and ``at``).
DecisionRecord = Decision


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


class WorkerGroupEvent(BaseModel):
    """A worker group of the job began reporting: the first, or a restart after a crash (Ray
    Train restarted the group from the job's last checkpoint, see ``max_failures``)."""

    at: float
    worker_group: str
    restart: bool
    #: The checkpoint step the new group resumed from (None: it started from step 0).
    resumed_from_step: int | None = None
    #: The last step the coordinator had heard of before the new group.
    last_reported_step: int
    world_size: int


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
    decisions: list[Decision]
    transitions: list[Transition]
    #: Worker group starts and restarts, oldest first.
    worker_groups: list[WorkerGroupEvent] = []


class Health(BaseModel):
    """``GET /healthz``. ``status`` is ``degraded`` when Ray or the database is not usable
    right now (the API still answers); ``ray`` and ``database`` say why."""

    status: Literal["ok", "degraded"]
    version: str
    launcher: Literal["ray", "none"]
    ray: str
    database: str
    jobs: dict[str, int]
