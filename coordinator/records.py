"""What the domain code holds of a job: :class:`JobRecord` (a job row, frozen) and
:class:`StoredEvent` (one entry of a job's event log).

Why a module of its own: the routes, the job service and the supervisor all pass jobs around,
and none of them should need the store (SQLAlchemy, transactions) to name the type. The
store (:mod:`coordinator.store`) builds these from its rows; nothing else does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from coordinator.schemas import TERMINAL_STATES, JobSpec, JobStatus, TelemetryPoint
from planning.protocol import ModelProfile, step_seconds


@dataclass(frozen=True)
class JobRecord:
    """A job row as the domain code sees it (including the fields the API never shows)."""

    id: str
    name: str
    state: str
    reason: str
    spec: JobSpec
    worker_token: str
    policy_mode: str
    created_at: float
    started_at: float | None
    finished_at: float | None
    updated_at: float
    reserved_cpus: float
    reserved_gpus: float
    report_seq: int
    reported_at: float | None
    step: int
    steps: int | None
    loss: float | None
    samples_per_second: float | None
    bandwidth: float | None
    latency: float | None
    phase_seconds: dict[str, float]
    bytes_sent_per_step: float | None
    world_size: int | None
    grad_norm: float | None
    compressor: str
    compressor_rank: int | None
    ratio: float | None
    profile: ModelProfile | None
    decision_version: int
    last_history_at: float | None
    summary: dict[str, Any] | None

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL_STATES

    @property
    def step_seconds(self) -> float | None:
        return step_seconds(self.phase_seconds)

    def status(self) -> JobStatus:
        return JobStatus(
            id=self.id, name=self.name, state=self.state, reason=self.reason,  # type: ignore[arg-type]
            created_at=self.created_at, started_at=self.started_at, finished_at=self.finished_at,
            updated_at=self.updated_at, step=self.step, steps=self.steps, loss=self.loss,
            samples_per_second=self.samples_per_second, compressor=self.compressor,
            compressor_rank=self.compressor_rank,
            ratio=self.ratio, bandwidth_bytes_per_second=self.bandwidth, latency_seconds=self.latency,
            phase_seconds=dict(self.phase_seconds), step_seconds=self.step_seconds,
            bytes_sent_per_step=self.bytes_sent_per_step, world_size=self.world_size,
            workers=self.spec.workers, decision_version=self.decision_version,
            policy_mode=self.policy_mode,  # type: ignore[arg-type]
            spec=self.spec, summary=self.summary,
        )

    def live_point(self) -> TelemetryPoint | None:
        """The latest report as a chart point (the live page gets every report, not only
        the downsampled ones)."""
        if self.reported_at is None:
            return None
        return TelemetryPoint(
            at=self.reported_at, step=self.step, loss=self.loss,
            samples_per_second=self.samples_per_second, bandwidth_bytes_per_second=self.bandwidth,
            latency_seconds=self.latency, compressor=self.compressor,
            compressor_rank=self.compressor_rank, ratio=self.ratio,
            phase_seconds=dict(self.phase_seconds), step_seconds=self.step_seconds,
        )


@dataclass(frozen=True)
class StoredEvent:
    """One entry of a job's event log; ``id`` orders the log, so a watcher resumes after it."""

    id: int
    job_id: str
    at: float
    kind: str
    data: dict[str, Any]
