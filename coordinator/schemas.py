"""The REST contract: what clients send (``JobSpec``, ``PinnedPolicy``/``AdaptivePolicy``) and read back.

Validation happens here, at the boundary, so the rest of the coordinator can trust its
inputs. ``JobSpec`` is ``planning.config.JobFields``, the job configuration in sections
that ``gradwire train`` and the workers validate with the same models (the documented API,
shown in ``/docs``), so a spec that passes here always converts to a ``TrainConfig``.
The compressor's rank is ``compressor_rank`` wherever it sits beside process ranks and
world sizes (reports, job status, pins).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from planning import registry
from planning.config import MAX_WORKERS, JobFields, TrainConfig
from planning.decision import Decision
from planning.protocol import ModelProfile, Telemetry
from planning.sections import MAX_COMPRESSOR_RANK
from planning.spec import make_spec

JobState = Literal["queued", "running", "succeeded", "failed", "cancelled"]
JOB_STATES: tuple[str, ...] = ("queued", "running", "succeeded", "failed", "cancelled")
TERMINAL_STATES = frozenset({"succeeded", "failed", "cancelled"})
PolicyMode = Literal["fixed", "adaptive", "pinned"]

_NUMBERS = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class JobSpec(JobFields):
    """A training job as a user submits it: ``planning.config.JobFields`` itself (the same
    sections, bounds and cross-field rules the workers and ``gradwire train`` use, validated
    there once; flat bodies of the pre-section form are folded into their sections). Every
    field but the few in the smallest example of docs/coordinator.md ("The smallest job") has
    a default; unknown fields are refused."""

    def to_train_config(self, *, job_id: str | None = None, job_token: str | None = None,
                        coordinator_url: str | None = None) -> TrainConfig:
        return TrainConfig.model_validate({**dict(self), "job_id": job_id, "job_token": job_token,
                                           "coordinator_url": coordinator_url})


#: Bounds of the integers a report carries: far above any real run, far below SQLite's 2**63.
MAX_REPORTED_STEP = 10**12
MAX_WORLD_SIZE = MAX_WORKERS


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
    compressor_rank: int | None = Field(default=None, ge=1, le=MAX_COMPRESSOR_RANK)
    ratio: float | None = Field(default=None, gt=0, le=1)
    wall_time: float | None = Field(default=None, ge=0)
    resumed_from_step: int | None = Field(default=None, ge=0, le=MAX_REPORTED_STEP)
    link_drop_step: int | None = Field(default=None, ge=0, le=MAX_REPORTED_STEP)
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
    #: The compressor's rank (``rank`` is accepted as its old spelling).
    compressor_rank: int | None = Field(default=None, ge=1, le=MAX_COMPRESSOR_RANK,
                                        validation_alias=AliasChoices("compressor_rank", "rank"))
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
        """Parameters for ``compressors.build`` (whose argument for the compressor rank is ``rank``)."""
        return {k: v for k, v in (("rank", self.compressor_rank), ("ratio", self.ratio)) if v is not None}


class AdaptivePolicy(BaseModel):
    """Hand the job (back) to the adaptive policy."""

    model_config = _NUMBERS

    mode: Literal["adaptive"]


class PolicyView(BaseModel):
    mode: PolicyMode
    compressor: str
    params: dict[str, Any]
    decision_version: int
    #: Why the adaptive policy keeps what runs (or switched), as of the latest report: the predicted
    #: step times and errors it compared, the link it judged on, the threshold or dwell that
    #: held it. What a user watching a job on a link that changed asks first.
    last_verdict: str | None = Field(
        default=None, description="the adaptive policy's reason for its verdict on the job's latest report; "
                                  "null while pinned, for a fixed job, once the job ended, or before the policy's first "
                                  "report since the coordinator started (or since a release); 'waiting ...' while the "
                                  "policy lacks what it decides on (the model's profile, a link reading)")


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
    #: The compressor's rank; history points stored before the rename carry it as ``rank``.
    compressor_rank: int | None = Field(default=None, validation_alias=AliasChoices("compressor_rank", "rank"))
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
    #: The compressor's rank (low-rank compressors), not a process rank.
    compressor_rank: int | None
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
