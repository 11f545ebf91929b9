"""The coordinator's link to Ray, kept in a child process so that losing Ray cannot take the
API down with it.

A Ray driver whose GCS (the head) disappears gives up after ``gcs_rpc_server_reconnect_timeout_s``
(60 s) and *terminates its process* — with the driver inside the coordinator, the whole API
went with it. So :class:`RayBridge` runs :class:`~coordinator.launcher.RayLauncher` in a
spawned child ("gradwire-ray-driver") and forwards each launcher call over a pipe. When the
head goes away, the bridge sees the GCS port close (or a call time out), kills the child and
raises :class:`~coordinator.launcher.RayUnavailable`; the supervisor then reports the loss
(``/healthz``, the running jobs' reason) and reconnects with a fresh child:

* with the embedded local head (no ``--ray-address``) the new child starts a new local head,
  as ``serve`` does at start — the coordinator owns that head, so bringing it back is its job;
* with an external cluster it waits and retries with backoff — that cluster's operator
  restarts it, and jobs that survived (GCS fault tolerance) are re-attached.

Jobs whose runner did not survive are marked failed with the reason saying the head was lost.
"""

from __future__ import annotations

import logging
import multiprocessing
import threading
from typing import Any

from coordinator.launcher import Capacity, RayUnavailable, RunStatus
from coordinator.raylocal import port_open
from coordinator.settings import Settings
from planning.config import TrainConfig

log = logging.getLogger(__name__)

#: Seconds a call may take before the child is deemed stuck (Ray calls inside have their own,
#: shorter timeouts; a GCS that stopped answering makes them hang instead).
CALL_TIMEOUT_S = {"connect": 240.0, "launch": 180.0}
DEFAULT_TIMEOUT_S = 45.0


def _child(conn: Any, settings: Settings) -> None:
    """The driver process: one RayLauncher, one call at a time, until ``close`` or EOF."""
    from coordinator.launcher import RayLauncher

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    launcher = RayLauncher(settings)
    while True:
        try:
            name, args = conn.recv()
        except (EOFError, OSError):
            break
        try:
            result = getattr(launcher, name)(*args)
            if name == "connect":
                result = launcher.address
                import workers.data  # noqa: F401 - torch, for validate(), imported once up front
            conn.send(("ok", result))
        except BaseException as exc:  # noqa: BLE001 - the parent decides what a failure means
            conn.send(("error", f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:2000]))
        if name == "close":
            break


class RayBridge:
    """A :class:`~coordinator.launcher.Launcher` whose Ray driver lives in a child process."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._context = multiprocessing.get_context("spawn")
        self._proc: Any = None
        self._conn: Any = None
        self._lock = threading.Lock()
        self._gcs: tuple[str, int] | None = None
        self._state = "connecting"
        self._lost: str | None = None

    # ---- what /healthz shows -----------------------------------------------------------------

    @property
    def status(self) -> str:
        if self._state == "connected" and not self._gcs_answers():
            self._state = "lost"
            self._lost = f"the Ray head at {self._gcs_text()} stopped answering"
        if self._state == "lost":
            plan = ("restarting the local Ray head" if self._settings.ray_address is None
                    else f"reconnecting to {self._settings.ray_address}")
            return f"lost: {self._lost}; {plan}"
        return self._state

    def _gcs_text(self) -> str:
        return f"{self._gcs[0]}:{self._gcs[1]}" if self._gcs else "?"

    def _gcs_answers(self) -> bool:
        return self._gcs is None or port_open(self._gcs[1], self._gcs[0])

    # ---- the child ---------------------------------------------------------------------------

    def _start_child(self) -> None:
        parent, child = self._context.Pipe()
        proc = self._context.Process(target=_child, args=(child, self._settings), name="gradwire-ray-driver",
                                     daemon=True)
        proc.start()
        child.close()
        self._proc, self._conn = proc, parent

    def _stop_child(self, grace_s: float = 5.0) -> None:
        proc, conn = self._proc, self._conn
        self._proc = self._conn = None
        if conn is not None:
            conn.close()
        if proc is not None:
            proc.join(grace_s)
            if proc.is_alive():
                proc.kill()
                proc.join(5)

    def _lose(self, why: str) -> RayUnavailable:
        self._state, self._lost = "lost", why
        self._stop_child(grace_s=0)
        log.error("Ray connection lost: %s", why)
        return RayUnavailable(why)

    def _call(self, name: str, *args: Any) -> Any:
        with self._lock:
            if self._conn is None or not self._proc.is_alive():
                raise self._lose(self._lost or "the Ray driver process is not running")
            if name != "connect" and not self._gcs_answers():
                raise self._lose(f"the Ray head at {self._gcs_text()} stopped answering")
            try:
                self._conn.send((name, args))
                if not self._conn.poll(CALL_TIMEOUT_S.get(name, DEFAULT_TIMEOUT_S)):
                    raise self._lose(f"Ray did not answer {name} within "
                                     f"{CALL_TIMEOUT_S.get(name, DEFAULT_TIMEOUT_S):.0f} s")
                kind, value = self._conn.recv()
            except (EOFError, OSError, BrokenPipeError):
                raise self._lose(f"the Ray driver process exited (code {self._proc.exitcode})") from None
        if kind == "error":
            raise RuntimeError(value)
        return value

    # ---- the Launcher protocol ---------------------------------------------------------------

    def connect(self) -> None:
        self._stop_child(grace_s=0)
        if self._state != "lost":
            self._state = "connecting"
        self._start_child()
        try:
            address = self._call("connect")
        except RuntimeError:
            self._stop_child(grace_s=0)
            raise
        host, _, port = str(address).rpartition(":")
        self._gcs = (host or "127.0.0.1", int(port))
        self._state, self._lost = "connected", None

    def validate(self, config: TrainConfig) -> str | None:
        """None while Ray is away: ``run_job`` checks again before it starts any worker."""
        try:
            return self._call("validate", config)
        except RayUnavailable:
            return None

    def capacity(self) -> Capacity | None:
        return self._call("capacity")

    def launch(self, job_id: str, config: TrainConfig) -> None:
        self._call("launch", job_id, config)

    def poll(self, job_id: str) -> RunStatus:
        return self._call("poll", job_id)

    def cancel(self, job_id: str) -> None:
        self._call("cancel", job_id)

    def release(self, job_id: str) -> None:
        self._call("release", job_id)

    def live_jobs(self) -> set[str]:
        return self._call("live_jobs")

    def sweep(self) -> None:
        self._call("sweep")

    def close(self) -> None:
        if self._conn is not None and self._proc is not None and self._proc.is_alive():
            try:
                with self._lock:
                    self._conn.send(("close", ()))
                    self._conn.poll(15)
            except (OSError, BrokenPipeError):
                pass
        self._stop_child()
