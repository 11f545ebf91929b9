"""The embedded database: jobs, their events (state transitions, decisions, policy changes),
versioned decisions and a downsampled telemetry history.

SQLite under ``<data_dir>`` by default; any SQLAlchemy URL works. Every public write method is
one transaction, so a crash or a refused input never leaves a half-written job behind. Callers
validate before they write (see :mod:`coordinator.schemas`); this module trusts its arguments.
Rows leave this module as pydantic read models or :class:`JobRecord`, never as ORM objects.

The tables are in :mod:`coordinator.tables`, the engine in :mod:`coordinator.database`, the
record types in :mod:`coordinator.records`; this module is the transactions and the caches.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from dataclasses import replace
from typing import Any, Iterator

from sqlalchemy import bindparam, delete, func, select
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from coordinator.database import is_storage_fault, make_engine
from coordinator.records import JobRecord, StoredEvent
from coordinator.schemas import (
    TERMINAL_STATES,
    DecisionRecord,
    JobSpec,
    TelemetryPoint,
    Transition,
    WorkerGroupEvent,
)
from coordinator.tables import Base, DecisionRow, EventRow, JobRow, TelemetryRow
from planning.protocol import ModelProfile

# Which state may follow which. Anything else is a bug or a race we refuse to record.
ALLOWED_TRANSITIONS: dict[str | None, frozenset[str]] = {
    None: frozenset({"queued"}),
    "queued": frozenset({"running", "failed", "cancelled"}),
    "running": frozenset({"succeeded", "failed", "cancelled"}),
}


#: Columns a telemetry report may change: the hot path writes them all with one prepared
#: UPDATE (SQLAlchemy caches its compiled form), from the job's cached record.
_REPORT_COLUMNS = ("state", "reason", "started_at", "updated_at", "reported_at", "last_history_at", "step",
                   "steps", "loss", "samples_per_second", "bandwidth", "latency", "phase_seconds",
                   "bytes_sent_per_step", "world_size", "grad_norm", "compressor", "compressor_rank", "ratio",
                   "decision_version")
_JOBS = JobRow.__table__
_REPORT_UPDATE = (
    _JOBS.update().where(_JOBS.c.id == bindparam("p_job_id"))  # type: ignore[attr-defined]
    .values({name: bindparam(f"p_{name}") for name in _REPORT_COLUMNS} | {"report_seq": _JOBS.c.report_seq + 1})
)
_PROFILE_UPDATE = _JOBS.update().where(_JOBS.c.id == bindparam("p_job_id")).values(profile=bindparam("p_profile"))  # type: ignore[attr-defined]


class StoreUnavailable(RuntimeError):
    """The database refused a write (disk full, read-only file system, I/O error). Nothing of
    the request was written; the message says what the database reported."""


class InvalidTransition(RuntimeError):
    def __init__(self, job_id: str, from_state: str, to_state: str) -> None:
        super().__init__(f"job {job_id} is {from_state}; it cannot become {to_state}")
        self.from_state = from_state
        self.to_state = to_state


def _record(row: JobRow) -> JobRecord:
    values = {name: getattr(row, name) for name in JobRecord.__dataclass_fields__ if name != "spec"}
    values["phase_seconds"] = dict(row.phase_seconds or {})
    values["profile"] = ModelProfile.model_validate(row.profile) if row.profile else None
    return JobRecord(spec=JobSpec.model_validate(row.spec), **values)


def _decision(row: DecisionRow) -> DecisionRecord:
    return DecisionRecord(
        version=row.version, compressor=row.compressor, params=dict(row.params), reason=row.reason,
        predicted_gain=row.predicted_gain, source=row.source, at=row.at,  # type: ignore[arg-type]
    )


class Store:
    """Typed access to the coordinator's tables. Thread-safe: writes are serialised by a lock
    (SQLite allows one writer anyway), reads run concurrently."""

    def __init__(self, url: str) -> None:
        self.engine = make_engine(url)
        Base.metadata.create_all(self.engine)
        self._write_lock = threading.RLock()
        # Write-through caches of job rows and latest decisions. Sound because this process
        # is the only writer (coordinator.datadir locks the data dir) and every write goes
        # through this class; they spare the telemetry path its reads.
        self._jobs: dict[str, JobRecord] = {}
        self._decisions: dict[str, DecisionRecord] = {}
        self._pending: list[Any] = []
        #: What the database said when the last write failed; None once a write succeeds.
        self.write_error: str | None = None

    def close(self) -> None:
        self.engine.dispose()

    def health(self) -> str:
        """``ok``, or why the last write failed (what ``/healthz`` shows)."""
        return "ok" if self.write_error is None else f"error: {self.write_error}"

    @contextmanager
    def _read(self) -> Iterator[Session]:
        with Session(self.engine, expire_on_commit=False) as session:
            yield session

    @contextmanager
    def _write(self) -> Iterator[Session]:
        """One transaction; a database fault becomes :class:`StoreUnavailable` (rolled back).
        Records handed to :meth:`_remember` inside it reach the cache only once it committed."""
        with self._write_lock:
            self._pending = []
            try:
                with Session(self.engine, expire_on_commit=False) as session, session.begin():
                    yield session
            except DBAPIError as exc:
                self._pending = []
                if not is_storage_fault(exc):
                    raise
                self.write_error = str(exc.orig).splitlines()[0][:200]
                raise StoreUnavailable(f"the database cannot be written: {self.write_error}") from None
            except BaseException:
                self._pending = []
                raise
            for item in self._pending:
                if isinstance(item, JobRecord):
                    self._jobs[item.id] = item
                else:
                    self._decisions[item[0]] = item[1]
            self._pending = []
            self.write_error = None

    def _remember(self, record: JobRecord) -> JobRecord:
        """Cache ``record`` once the current transaction commits (see :meth:`_write`)."""
        self._pending.append(record)
        return record

    def _cached(self, job_id: str, s: Session | None = None) -> JobRecord | None:
        record = self._jobs.get(job_id)
        if record is None:
            if s is None:
                with self._read() as session:
                    row = session.get(JobRow, job_id)
            else:
                row = s.get(JobRow, job_id)
            if row is None:
                return None
            record = self._jobs.setdefault(job_id, _record(row))
        return record

    # ---- jobs ----------------------------------------------------------------------------

    def create_job(self, *, job_id: str, spec: JobSpec, worker_token: str, policy_mode: str,
                   decision: DecisionRecord, now: float) -> JobRecord:
        """Insert a queued job with its first decision (version 0: the spec's compression)."""
        with self._write() as s:
            row = JobRow(
                id=job_id, name=spec.name, state="queued", reason="waiting for the launcher",
                spec=spec.model_dump(mode="json"), worker_token=worker_token, policy_mode=policy_mode,
                created_at=now, updated_at=now, steps=spec.steps, compressor=decision.compressor,
                compressor_rank=decision.params.get("rank"), ratio=decision.params.get("ratio"),
                decision_version=decision.version, phase_seconds={},
                reserved_cpus=0.0, reserved_gpus=0.0, report_seq=0, step=0,
            )
            s.add(row)
            s.flush()
            self._add_event(s, job_id, now, "state", Transition(
                at=now, from_state=None, to_state="queued", reason="submitted").model_dump())
            self._add_decision(s, job_id, decision)
            return self._remember(_record(row))

    def get_job(self, job_id: str) -> JobRecord | None:
        return self._cached(job_id)

    def list_jobs(self, *, state: str | None = None, limit: int = 200) -> list[JobRecord]:
        query = select(JobRow).order_by(JobRow.created_at.desc()).limit(limit)
        if state:
            query = query.where(JobRow.state == state)
        with self._read() as s:
            return [_record(row) for row in s.scalars(query)]

    def jobs_in(self, *states: str) -> list[JobRecord]:
        """Jobs in these states, oldest first (the launch queue's order)."""
        query = select(JobRow).where(JobRow.state.in_(states)).order_by(JobRow.created_at)
        with self._read() as s:
            return [_record(row) for row in s.scalars(query)]

    def counts_by_state(self) -> dict[str, int]:
        with self._read() as s:
            return dict(s.execute(select(JobRow.state, func.count()).group_by(JobRow.state)).all())

    def transition(self, job_id: str, to_state: str, reason: str, now: float, *,
                   expect: str | None = None, **columns: Any) -> JobRecord:
        """Move a job to ``to_state`` and record the transition, refusing illegal moves.
        ``expect`` guards against races: the move happens only from that state."""
        with self._write() as s:
            row = s.get(JobRow, job_id)
            if row is None:
                raise KeyError(job_id)
            if to_state not in ALLOWED_TRANSITIONS.get(row.state, frozenset()) or (
                expect is not None and row.state != expect
            ):
                raise InvalidTransition(job_id, row.state, to_state)
            from_state, row.state, row.reason, row.updated_at = row.state, to_state, reason, now
            if to_state == "running":
                row.started_at = now
            if to_state in TERMINAL_STATES:
                row.finished_at = now
                row.reserved_cpus = row.reserved_gpus = 0.0
            for name, value in columns.items():
                setattr(row, name, value)
            self._add_event(s, job_id, now, "state", Transition(
                at=now, from_state=from_state, to_state=to_state, reason=reason).model_dump())  # type: ignore[arg-type]
            return self._remember(_record(row))

    def update_job(self, job_id: str, **columns: Any) -> JobRecord:
        """Change bookkeeping columns (reason, reservations) without an event."""
        with self._write() as s:
            row = s.get(JobRow, job_id)
            if row is None:
                raise KeyError(job_id)
            for name, value in columns.items():
                setattr(row, name, value)
            return self._remember(_record(row))

    def record_report(self, job_id: str, *, snapshot: dict[str, Any], history: TelemetryPoint | None,
                      decision: DecisionRecord | None, start_running: bool, now: float,
                      max_rows: int, stale: bool = False) -> JobRecord:
        """Apply one telemetry report: the snapshot, maybe a history row, maybe a new decision,
        and queued → running when a worker is evidently running. One transaction, one UPDATE
        of the job row (the hot path of the coordinator: no ORM load, no re-read).
        ``stale``: a report measured before the latest one stored; it counts and may add a
        history row, but does not overwrite the snapshot."""
        with self._write() as s:
            job = self._cached(job_id, s)
            if job is None:
                raise KeyError(job_id)
            values: dict[str, Any] = {} if stale else dict(snapshot)
            if start_running and job.state == "queued":
                values.update(state="running", started_at=now, reason="telemetry received")
                self._add_event(s, job_id, now, "state", Transition(
                    at=now, from_state="queued", to_state="running", reason="telemetry received").model_dump())
            values["updated_at"] = now
            if not stale:
                values["reported_at"] = history.at if history is not None else now
            if history is not None:
                values["last_history_at"] = now
                s.add(TelemetryRow(job_id=job_id, at=history.at, step=history.step,
                                   point=history.model_dump(mode="json")))
                self._thin_history(s, job_id, max_rows)
            if decision is not None:
                self._add_decision(s, job_id, decision)
                values["decision_version"] = decision.version
            profile = values.pop("profile", None)
            if profile:
                values["profile"] = ModelProfile.model_validate(profile)
            new = replace(job, report_seq=job.report_seq + 1, **values)
            params = {f"p_{name}": getattr(new, name) for name in _REPORT_COLUMNS}
            s.connection().execute(_REPORT_UPDATE, {"p_job_id": job_id, **params})
            if profile:
                s.connection().execute(_PROFILE_UPDATE, {"p_job_id": job_id, "p_profile": profile})
            return self._remember(new)

    def set_decision(self, job_id: str, decision: DecisionRecord, *, policy_mode: str,
                     now: float) -> JobRecord:
        """Store an operator's decision (pin) or a policy change, with its event."""
        with self._write() as s:
            row = s.get(JobRow, job_id)
            if row is None:
                raise KeyError(job_id)
            row.policy_mode, row.updated_at = policy_mode, now
            self._add_event(s, job_id, now, "policy", {"mode": policy_mode, "at": now})
            if decision.version > row.decision_version:
                self._add_decision(s, job_id, decision)
                row.decision_version = decision.version
            return self._remember(_record(row))

    # ---- decisions, history, events ------------------------------------------------------

    def latest_decision(self, job_id: str) -> DecisionRecord | None:
        cached = self._decisions.get(job_id)
        if cached is not None:
            return cached
        query = (select(DecisionRow).where(DecisionRow.job_id == job_id)
                 .order_by(DecisionRow.version.desc()).limit(1))
        with self._read() as s:
            row = s.scalars(query).first()
            return self._decisions.setdefault(job_id, _decision(row)) if row else None

    def decisions(self, job_id: str) -> list[DecisionRecord]:
        query = select(DecisionRow).where(DecisionRow.job_id == job_id).order_by(DecisionRow.version)
        with self._read() as s:
            return [_decision(row) for row in s.scalars(query)]

    def telemetry(self, job_id: str) -> list[TelemetryPoint]:
        query = (select(TelemetryRow).where(TelemetryRow.job_id == job_id)
                 .order_by(TelemetryRow.at, TelemetryRow.id))
        with self._read() as s:
            return [TelemetryPoint.model_validate(row.point) for row in s.scalars(query)]

    def worker_groups(self, job_id: str) -> list[WorkerGroupEvent]:
        return [WorkerGroupEvent.model_validate(e.data) for e in self.events_after(job_id, 0) if e.kind == "workers"]

    def last_worker_group(self, job_id: str) -> str | None:
        """The id of the worker group that reported last (from the newest ``workers`` event)."""
        query = (select(EventRow).where(EventRow.job_id == job_id, EventRow.kind == "workers")
                 .order_by(EventRow.id.desc()).limit(1))
        with self._read() as s:
            row = s.scalars(query).first()
            return str(row.data["worker_group"]) if row else None

    def add_worker_group(self, job_id: str, group: WorkerGroupEvent) -> None:
        """Record that a worker group (the first, or a restarted one) began reporting."""
        with self._write() as s:
            self._add_event(s, job_id, group.at, "workers", group.model_dump(mode="json"))

    def transitions(self, job_id: str) -> list[Transition]:
        return [Transition.model_validate(e.data) for e in self.events_after(job_id, 0) if e.kind == "state"]

    def events_after(self, job_id: str, after_id: int) -> list[StoredEvent]:
        query = (select(EventRow).where(EventRow.job_id == job_id, EventRow.id > after_id)
                 .order_by(EventRow.id))
        with self._read() as s:
            return [StoredEvent(e.id, e.job_id, e.at, e.kind, dict(e.data)) for e in s.scalars(query)]

    def last_event_id(self, job_id: str) -> int:
        with self._read() as s:
            return s.scalar(select(func.max(EventRow.id)).where(EventRow.job_id == job_id)) or 0

    @staticmethod
    def _add_event(s: Session, job_id: str, at: float, kind: str, data: dict[str, Any]) -> None:
        s.add(EventRow(job_id=job_id, at=at, kind=kind, data=data))

    def _add_decision(self, s: Session, job_id: str, d: DecisionRecord) -> None:
        if d.source is None or d.at is None:  # the coordinator's decisions always say both
            raise ValueError(f"decision v{d.version}: a stored decision needs its source and time")
        self._pending.append((job_id, d))
        s.add(DecisionRow(job_id=job_id, version=d.version, compressor=d.compressor, params=d.params,
                          reason=d.reason, predicted_gain=d.predicted_gain, source=d.source, at=d.at))
        self._add_event(s, job_id, d.at, "decision", d.model_dump(mode="json"))

    @staticmethod
    def _thin_history(s: Session, job_id: str, max_rows: int) -> None:
        """Past ``max_rows``, drop every second row of the older half: the history stays
        bounded and keeps covering the whole run, at a coarser grain for older parts."""
        count = s.scalar(select(func.count()).where(TelemetryRow.job_id == job_id)) or 0
        if count <= max_rows:
            return
        ids = list(s.scalars(select(TelemetryRow.id).where(TelemetryRow.job_id == job_id)
                             .order_by(TelemetryRow.id).limit(count // 2)))
        doomed = ids[1::2]
        s.execute(delete(TelemetryRow).where(TelemetryRow.id.in_(doomed)))
