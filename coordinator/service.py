"""Jobs as the coordinator owns them: submit, read, cancel, telemetry in, decisions out,
policy pin/release. FastAPI-free; the routes in :mod:`coordinator.api` are thin wrappers.

Errors are domain exceptions (:class:`JobNotFound`, :class:`Conflict`, :class:`Forbidden`)
that the app maps to 404/409/401 with the exception's message as ``detail``.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from typing import Any, Callable

from coordinator.auth import new_job_token, token_matches
from coordinator.decisions import DecisionLoop
from coordinator.launcher import Launcher, RayUnavailable
from coordinator.metrics import CoordinatorMetrics
from coordinator.records import JobRecord
from coordinator.schemas import (
    AdaptivePolicy,
    JobHistory,
    JobSpec,
    PinnedPolicy,
    PolicyView,
    TelemetryPoint,
    WorkerGroupEvent,
)
from coordinator.settings import Settings
from coordinator.store import InvalidTransition, Store
from planning.decision import Decision
from planning.protocol import Telemetry, step_seconds

log = logging.getLogger(__name__)


class JobNotFound(LookupError):
    def __init__(self, job_id: str) -> None:
        super().__init__(f"job {job_id} not found")


class Conflict(RuntimeError):
    """The request is valid but the job's state forbids it (e.g. cancelling a finished job)."""


class InvalidSpec(ValueError):
    """The spec is well-formed but cannot run (the launcher's check); mapped to 422."""


class Forbidden(PermissionError):
    """A worker endpoint was called without this job's token."""


def new_job_id() -> str:
    return secrets.token_hex(6)


class JobService:
    def __init__(self, store: Store, metrics: CoordinatorMetrics, launcher: Launcher, settings: Settings,
                 clock: Callable[[], float] = time.time, on_submit: Callable[[], None] = lambda: None) -> None:
        self.store = store
        self.metrics = metrics
        self.launcher = launcher
        self.settings = settings
        self.decisions = DecisionLoop()
        self._clock = clock
        self._on_submit = on_submit
        # Read-decide-write sequences (telemetry, policy, cancel) must not interleave per job.
        self._lock = threading.RLock()
        # The worker group that reported last, per job: read from the store once, then kept
        # here (one process owns the data dir), so the ingest path makes no extra query.
        self._last_group: dict[str, str | None] = {}

    # ---- operator side -------------------------------------------------------------------

    def submit(self, spec: JobSpec) -> tuple[JobRecord, str]:
        """Check that the spec can run, then store a queued job with its first decision; the
        supervisor launches it."""
        problem = self.launcher.validate(spec.to_train_config())
        if problem:
            raise InvalidSpec(problem)
        now = self._clock()
        mode = spec.compression.mode
        job = self.store.create_job(
            job_id=new_job_id(), spec=spec, worker_token=new_job_token(), policy_mode=mode,
            decision=DecisionLoop.initial(spec.compression, now), now=now,
        )
        log.info("job %s (%s) submitted", job.id, job.name)
        self._on_submit()
        return job, job.worker_token

    def get(self, job_id: str) -> JobRecord:
        job = self.store.get_job(job_id)
        if job is None:
            raise JobNotFound(job_id)
        return job

    def list(self, state: str | None = None, limit: int = 200) -> list[JobRecord]:
        return self.store.list_jobs(state=state, limit=limit)

    def history(self, job_id: str) -> JobHistory:
        job = self.get(job_id)
        return JobHistory(job=job.status(), telemetry=self.store.telemetry(job_id),
                          decisions=self.store.decisions(job_id), transitions=self.store.transitions(job_id),
                          worker_groups=self.store.worker_groups(job_id))

    def cancel(self, job_id: str) -> JobRecord:
        """Stop the runner, then record ``cancelled``. The Ray call runs without the service
        lock: telemetry is handled on the event loop and must never wait for Ray. A job that
        ended meanwhile makes the recording a :class:`Conflict`."""
        job = self.get(job_id)
        if job.terminal:
            raise Conflict(f"job {job_id} is already {job.state}")
        if job.state == "running":
            try:
                self.launcher.cancel(job_id)
            except RayUnavailable as exc:
                # Recorded anyway: reconciliation stops the runner of a job that is not
                # running once Ray is back (if it survived at all).
                log.warning("job %s cancelled while Ray is unreachable (%s)", job_id, exc)
        return self.finish(job_id, "cancelled", "cancelled by operator")

    def finish(self, job_id: str, state: str, reason: str, summary: dict | None = None) -> JobRecord:
        """Record a terminal state (from cancel, the supervisor or reconciliation)."""
        with self._lock:
            now = self._clock()
            columns: dict[str, Any] = {"summary": summary} if summary is not None else {}
            if summary:
                columns.update(_summary_columns(summary))
            try:
                job = self.store.transition(job_id, state, reason, now, **columns)
            except InvalidTransition as exc:
                raise Conflict(str(exc)) from None
            self.metrics.job_finished(job_id, now)
            self.decisions.forget(job_id)
            log.info("job %s %s: %s", job_id, state, reason)
            return job

    # ---- policy --------------------------------------------------------------------------

    def policy(self, job_id: str) -> PolicyView:
        job = self.get(job_id)
        current = self.current_decision(job_id)
        return PolicyView(mode=job.policy_mode, compressor=current.compressor,  # type: ignore[arg-type]
                          params=current.params, decision_version=current.version,
                          last_verdict=self.decisions.last_verdict(job_id) if job.policy_mode == "adaptive" else None)

    def set_policy(self, job_id: str, request: PinnedPolicy | AdaptivePolicy) -> PolicyView:
        with self._lock:
            job = self.get(job_id)
            if job.terminal:
                raise Conflict(f"job {job_id} is {job.state}; its policy cannot change")
            current = self._latest(job_id)
            now = self._clock()
            if isinstance(request, PinnedPolicy):
                decision = self.decisions.pin(job_id, job.spec.compression, request, current, now)
                self.store.set_decision(job_id, decision, policy_mode="pinned", now=now)
                self.metrics.record_switch(job_id)
            else:
                self.decisions.release(job_id)
                self.store.set_decision(job_id, current, policy_mode="adaptive", now=now)
            return self.policy(job_id)

    # ---- worker side ---------------------------------------------------------------------

    def authorize_worker(self, job_id: str, token: str | None) -> JobRecord:
        job = self.get(job_id)
        if not token_matches(token, job.worker_token):
            raise Forbidden("missing or wrong job token")
        return job

    def current_decision(self, job_id: str) -> Decision:
        self.get(job_id)
        return self._latest(job_id)

    def _latest(self, job_id: str) -> Decision:
        decision = self.store.latest_decision(job_id)
        if decision is None:  # every job is created with version 0; missing means corruption
            raise JobNotFound(job_id)
        return decision

    def ingest(self, job_id: str, t: Telemetry) -> Decision:
        """Apply one report: snapshot, history (downsampled), metrics, maybe a new decision.
        Returns the decision in force, so a worker may skip its next GET.

        A report is stamped with when rank 0 measured it (``wall_time``, never later than
        now), not when it arrived: a report that waited out an unreachable coordinator keeps
        its place in the history. One measured before the latest stored report is *stale*:
        it is counted and may join the history, but does not overwrite the job's snapshot."""
        with self._lock:
            job = self.get(job_id)
            if job.terminal:
                raise Conflict(f"job {job_id} is {job.state}; telemetry is no longer accepted")
            now = self._clock()
            at = min(t.wall_time, now) if t.wall_time is not None else now
            stale = job.reported_at is not None and at < job.reported_at
            self._note_worker_group(job, t, now)
            profile = t.profile or job.profile
            current = self._latest(job_id)
            decision = None if stale else self.decisions.on_report(
                job_id, job.policy_mode, job.spec.compression, current, t, profile, now)
            keep = (job.last_history_at is None or now - job.last_history_at >= self.settings.history_interval_s
                    or t.compressor != job.compressor or t.compressor_rank != job.compressor_rank or _last_step(job, t))
            point = _point(t, at) if keep else None
            self.store.record_report(job_id, snapshot=_snapshot(t, job), history=point, decision=decision,
                                     start_running=True, now=now, max_rows=self.settings.history_max_rows,
                                     stale=stale)
            self.metrics.observe_report(job_id, t, previous_step=job.step,
                                        shapes=profile.shapes if profile else None)
            if decision is not None:
                self.metrics.record_switch(job_id)
                log.info("job %s decision v%d: %s", job_id, decision.version, decision.reason)
            final = decision or current
            if job.spec.external and _last_step(job, t):
                self.finish(job_id, "succeeded", "training finished (reported by the external job's workers)")
            return final

    def _note_worker_group(self, job: JobRecord, t: Telemetry, now: float) -> None:
        """A report from a worker group not seen before: the first one, or a restart (Ray
        Train restarted the group after a crash) that the history and live page show."""
        if t.worker_group is None:
            return
        if job.id not in self._last_group:
            self._last_group[job.id] = self.store.last_worker_group(job.id)
        last = self._last_group[job.id]
        if last == t.worker_group:
            return
        restart = last is not None
        self.store.add_worker_group(job.id, WorkerGroupEvent(
            at=now, worker_group=t.worker_group, restart=restart, resumed_from_step=t.resumed_from_step,
            last_reported_step=job.step, world_size=t.world_size))
        self._last_group[job.id] = t.worker_group
        if restart:
            log.warning("job %s: worker group restarted (resumed from step %s, last reported step %d)",
                        job.id, t.resumed_from_step, job.step)


def _last_step(job: JobRecord, t: Telemetry) -> bool:
    total = t.steps or job.steps
    return total is not None and t.step >= total


def _snapshot(t: Telemetry, job: JobRecord) -> dict:
    """Columns a report overwrites; fields a report leaves out keep their last value."""
    values: dict = {"step": t.step, "phase_seconds": dict(t.phase_seconds) or job.phase_seconds,
                    "world_size": t.world_size}
    if t.profile is not None:
        values["profile"] = t.profile.model_dump(mode="json")
    optional = {"steps": t.steps, "loss": t.loss, "samples_per_second": t.samples_per_second,
                "bandwidth": t.bandwidth_bytes_per_second, "latency": t.latency_seconds,
                "bytes_sent_per_step": t.bytes_sent_per_step, "grad_norm": t.grad_norm}
    values.update({k: v for k, v in optional.items() if v is not None})
    if t.compressor:
        values.update(compressor=t.compressor, compressor_rank=t.compressor_rank, ratio=t.ratio)
    return values


def _point(t: Telemetry, now: float) -> TelemetryPoint:
    return TelemetryPoint(
        at=now, step=t.step, loss=t.loss, samples_per_second=t.samples_per_second,
        bandwidth_bytes_per_second=t.bandwidth_bytes_per_second, latency_seconds=t.latency_seconds,
        compressor=t.compressor, compressor_rank=t.compressor_rank, ratio=t.ratio,
        phase_seconds=dict(t.phase_seconds),
        step_seconds=step_seconds(t.phase_seconds),
    )


def _summary_columns(summary: dict) -> dict:
    """Final numbers from ``run_job``'s summary, where it has them."""
    out: dict = {}
    if isinstance(summary.get("steps"), int):
        out["step"] = summary["steps"]
    if isinstance(summary.get("final_loss"), (int, float)):
        out["loss"] = float(summary["final_loss"])
    if isinstance(summary.get("samples_per_second"), (int, float)):
        out["samples_per_second"] = float(summary["samples_per_second"])
    if isinstance(summary.get("compressor"), str):
        out["compressor"] = summary["compressor"]
        rank = summary.get("compressor_rank")
        out["compressor_rank"] = rank if isinstance(rank, int) else None
    if isinstance(summary.get("phase_seconds"), dict):
        out["phase_seconds"] = {k: float(v) for k, v in summary["phase_seconds"].items()
                                if isinstance(v, (int, float))}
    return out
