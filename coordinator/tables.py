"""The coordinator's tables: what a job, its events, its decisions and its telemetry history
look like in the database.

Kept apart from :mod:`coordinator.store` so that the schema can be read (and migrated) in one
place and the store's module is about transactions and caching, not column types. ORM rows
never leave :mod:`coordinator.store`: it turns them into :class:`coordinator.records.JobRecord`
and pydantic read models.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import JSON, Float, ForeignKey, Integer, String, UniqueConstraint
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    """The metadata of every coordinator table (``Base.metadata.create_all`` makes them)."""


class JobRow(Base):
    """One job: its spec and state, and its latest telemetry report (the snapshot)."""

    __tablename__ = "jobs"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str] = mapped_column(String(128))
    state: Mapped[str] = mapped_column(String(16), index=True)
    reason: Mapped[str] = mapped_column(String(2000), default="")
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    worker_token: Mapped[str] = mapped_column(String(128))
    policy_mode: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[float] = mapped_column(Float)
    started_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    finished_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    updated_at: Mapped[float] = mapped_column(Float)
    #: Logical CPUs/GPUs the launcher set aside for this job while it runs.
    reserved_cpus: Mapped[float] = mapped_column(Float, default=0.0)
    reserved_gpus: Mapped[float] = mapped_column(Float, default=0.0)
    # The latest telemetry report (the "snapshot"); report_seq counts reports.
    report_seq: Mapped[int] = mapped_column(Integer, default=0)
    reported_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    step: Mapped[int] = mapped_column(Integer, default=0)
    steps: Mapped[int | None] = mapped_column(Integer, nullable=True)
    loss: Mapped[float | None] = mapped_column(Float, nullable=True)
    samples_per_second: Mapped[float | None] = mapped_column(Float, nullable=True)
    bandwidth: Mapped[float | None] = mapped_column(Float, nullable=True)
    latency: Mapped[float | None] = mapped_column(Float, nullable=True)
    phase_seconds: Mapped[dict[str, float]] = mapped_column(JSON, default=dict)
    bytes_sent_per_step: Mapped[float | None] = mapped_column(Float, nullable=True)
    world_size: Mapped[int | None] = mapped_column(Integer, nullable=True)
    grad_norm: Mapped[float | None] = mapped_column(Float, nullable=True)
    compressor: Mapped[str] = mapped_column(String(32))
    #: The compressor's rank; its SQL column keeps the name ``rank`` (existing databases).
    compressor_rank: Mapped[int | None] = mapped_column("rank", Integer, key="compressor_rank", nullable=True)
    ratio: Mapped[float | None] = mapped_column(Float, nullable=True)
    #: The worker's ModelProfile (JSON), for the policy's cost model and the compression ratio.
    profile: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    decision_version: Mapped[int] = mapped_column(Integer, default=0)
    last_history_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    summary: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)


class EventRow(Base):
    """Everything a watcher should hear about, in order: kind is state, decision or policy."""

    __tablename__ = "events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    at: Mapped[float] = mapped_column(Float)
    kind: Mapped[str] = mapped_column(String(16))
    data: Mapped[dict[str, Any]] = mapped_column(JSON)


class DecisionRow(Base):
    """One versioned decision of a job (version 0 is the spec's compression)."""

    __tablename__ = "decisions"
    __table_args__ = (UniqueConstraint("job_id", "version"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    version: Mapped[int] = mapped_column(Integer)
    compressor: Mapped[str] = mapped_column(String(32))
    params: Mapped[dict[str, Any]] = mapped_column(JSON)
    reason: Mapped[str] = mapped_column(String(2000))
    predicted_gain: Mapped[float | None] = mapped_column(Float, nullable=True)
    source: Mapped[str] = mapped_column(String(16))
    at: Mapped[float] = mapped_column(Float)


class TelemetryRow(Base):
    """A downsampled telemetry point of a job (the history its charts show)."""

    __tablename__ = "telemetry"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    at: Mapped[float] = mapped_column(Float)
    step: Mapped[int] = mapped_column(Integer)
    point: Mapped[dict[str, Any]] = mapped_column(JSON)
