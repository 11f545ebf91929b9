"""The background loop that connects the store to the launcher.

One thread, one round every ``poll_interval_s`` (sooner after a submit):

1. First round only: connect to Ray, then *reconcile* — every job the store calls running
   is re-attached to its live runner actor or marked failed with the reason; runner actors
   the store does not know as running are stopped (they would hold CPUs forever).
2. Poll running jobs; record succeeded/failed with the runner's summary or error.
3. Launch queued jobs, oldest first, while the cluster has CPUs (GPUs) for their workers.
   The queue is FIFO: a job that fits waits behind an older one that does not yet fit, so big
   jobs are not starved; a job larger than the whole cluster waits without blocking others.
4. Drop Prometheus series of jobs that ended more than the grace period ago, and let the
   launcher sweep up what stopped runners left behind (their placement groups).

When Ray goes away (:class:`~coordinator.launcher.RayUnavailable`) the loop reports it — the
running jobs' reason says so, ``/healthz`` says ``lost`` — and goes back to step 1: connect
again (the launcher restarts an embedded local head; an external cluster is waited for),
then reconcile, which fails the jobs whose runner did not survive, saying the head was lost.
"""

from __future__ import annotations

import logging
import threading
import time

from coordinator.launcher import Capacity, Launcher, RayUnavailable
from coordinator.records import JobRecord
from coordinator.service import Conflict, JobService
from coordinator.store import InvalidTransition

log = logging.getLogger(__name__)

#: Seconds between two sweeps for what stopped runners left behind on the cluster.
SWEEP_INTERVAL_S = 2.0


def _needs(job: JobRecord) -> tuple[float, float]:
    workers = job.spec.min_workers
    return float(workers), float(workers if job.spec.use_gpu else 0)


class Supervisor:
    def __init__(self, service: JobService, launcher: Launcher, interval_s: float) -> None:
        self.service = service
        self.launcher = launcher
        self.interval_s = interval_s
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.ready = threading.Event()  # set after connect + reconcile
        #: When and why Ray was last lost (None: never, since this process started).
        self.lost: tuple[float, str] | None = None
        self._last_sweep = 0.0

    def start(self) -> None:
        self._thread = threading.Thread(target=self._main, name="gradwire-supervisor", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        self._wake.set()

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def _main(self) -> None:
        while not self._stop.is_set():
            if not self._connect():
                return
            self._guard(self.reconcile)
            self.ready.set()
            try:
                while not self._stop.is_set():
                    self._guard(self.tick)
                    self._wake.wait(self.interval_s)
                    self._wake.clear()
            except RayUnavailable as exc:
                self._ray_lost(str(exc))

    def _connect(self) -> bool:
        """Connect, retrying with backoff; False when asked to stop meanwhile."""
        delay = 1.0
        while not self._stop.is_set():
            try:
                self.launcher.connect()
                return True
            except Exception as exc:  # noqa: BLE001 - keep serving the API; retry Ray later
                log.error("cannot reach Ray (%s); retrying in %.0f s", exc, delay)
                self._stop.wait(delay)
                delay = min(delay * 2, 30.0)
        return False

    def _ray_lost(self, why: str) -> None:
        """Say on every running job what happened; their fate is decided after reconnecting."""
        self.lost = (time.time(), why)
        stamp = time.strftime("%H:%M:%S", time.localtime(self.lost[0]))
        for job in self.service.store.jobs_in("running"):
            self._set_reason(job, f"Ray head lost at {stamp} ({why}); reconnecting to see whether "
                                  "the job survived")

    @staticmethod
    def _guard(step: object) -> None:
        try:
            step()  # type: ignore[operator]
        except RayUnavailable:
            raise
        except Exception:  # noqa: BLE001 - one bad round must not end supervision
            log.exception("supervisor round failed")

    def reconcile(self) -> None:
        store = self.service.store
        running = {job.id: job for job in store.jobs_in("running") if not job.spec.external}
        for job_id in running:
            status = self.launcher.poll(job_id)
            if status.state == "missing":
                if self.lost is not None:
                    stamp = time.strftime("%H:%M:%S", time.localtime(self.lost[0]))
                    reason = (f"the Ray head was lost at {stamp} ({self.lost[1]}); the job's runner "
                              "did not survive it")
                else:
                    reason = (f"{status.error} after a coordinator restart "
                              "(the Ray cluster or the runner was lost)")
                self._finish(job_id, "failed", reason)
            else:
                log.info("job %s re-attached to its runner actor", job_id)
        for job_id in self.launcher.live_jobs() - set(running):
            job = store.get_job(job_id)
            if job is not None and job.state == "queued":
                # Launched just before a crash, before the store heard of it: adopt it.
                cpus, gpus = _needs(job)
                store.update_job(job_id, reserved_cpus=cpus, reserved_gpus=gpus)
                self._mark_running(job, "re-attached to its runner after a coordinator restart")
                continue
            log.warning("stopping runner actor of job %s (job is %s)", job_id, job.state if job else "unknown")
            self.launcher.release(job_id)

    def tick(self) -> None:
        self._poll_running()
        self._launch_queued()
        now = time.time()
        self.service.metrics.sweep(now)
        if now - self._last_sweep >= SWEEP_INTERVAL_S:
            self._last_sweep = now
            self.launcher.sweep()

    def _poll_running(self) -> None:
        for job in self.service.store.jobs_in("running"):
            if job.spec.external:
                continue  # its workers report the end themselves (JobService.ingest)
            status = self.launcher.poll(job.id)
            if status.state == "running":
                continue
            if status.state == "succeeded":
                self._finish(job.id, "succeeded", "training finished", status.summary or {})
            else:
                self._finish(job.id, "failed", status.error or "runner failed")
            self.launcher.release(job.id)

    def _launch_queued(self) -> None:
        # External jobs train elsewhere (gradwire.ray.prepare): nothing to launch, no CPUs held.
        queued = [job for job in self.service.store.jobs_in("queued") if not job.spec.external]
        if not queued:
            return
        capacity = self.launcher.capacity()
        if capacity is None:
            return
        used_cpus = sum(j.reserved_cpus for j in self.service.store.jobs_in("running"))
        used_gpus = sum(j.reserved_gpus for j in self.service.store.jobs_in("running"))
        free = Capacity(capacity.cpus - used_cpus, capacity.gpus - used_gpus)
        for job in queued:
            cpus, gpus = _needs(job)
            if cpus > capacity.cpus or gpus > capacity.gpus:
                self._set_reason(job, f"waiting: needs {cpus:g} CPUs/{gpus:g} GPUs, the cluster has "
                                      f"{capacity.cpus:g}/{capacity.gpus:g}")
                continue
            if cpus > free.cpus or gpus > free.gpus:
                self._set_reason(job, f"queued: needs {cpus:g} CPUs, {max(free.cpus, 0):g} free")
                break
            if self._launch(job, cpus, gpus):
                free = Capacity(free.cpus - cpus, free.gpus - gpus)

    def _launch(self, job: JobRecord, cpus: float, gpus: float) -> bool:
        settings = self.service.settings
        config = job.spec.to_train_config(job_id=job.id, job_token=job.worker_token,
                                          coordinator_url=settings.worker_url)
        try:
            self.launcher.launch(job.id, config)
        except Exception as exc:  # noqa: BLE001 - a bad launch fails this job, not the loop
            log.exception("launching job %s failed", job.id)
            self._finish(job.id, "failed", f"launch failed: {type(exc).__name__}: {exc}")
            return False
        self.service.store.update_job(job.id, reserved_cpus=cpus, reserved_gpus=gpus)
        self._mark_running(job, "running on Ray")
        return True

    def _mark_running(self, job: JobRecord, reason: str) -> None:
        try:
            self.service.store.transition(job.id, "running", reason, time.time(), expect="queued")
        except InvalidTransition:
            pass  # telemetry already moved it to running, or it was cancelled meanwhile
        current = self.service.store.get_job(job.id)
        if current is not None and current.state == "cancelled":
            self.launcher.cancel(job.id)  # cancelled while launching: do not leave it running

    def _set_reason(self, job: JobRecord, reason: str) -> None:
        if job.reason != reason:
            self.service.store.update_job(job.id, reason=reason)

    def _finish(self, job_id: str, state: str, reason: str, summary: dict | None = None) -> None:
        try:
            self.service.finish(job_id, state, reason, summary)
        except Conflict:
            pass  # cancelled meanwhile
