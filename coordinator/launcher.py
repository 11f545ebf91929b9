"""Runs jobs on Ray so that they keep running when the coordinator process stops.

Each job gets a detached, named Ray actor (:class:`JobRunner`, name ``job-<id>``, namespace
``gradwire`` by default). The actor calls ``workers.runner.run_job`` in a thread and keeps
the outcome until the coordinator has read it, so a job that ends while the coordinator is
down is still reported correctly afterwards. The actor asks for no CPUs itself; the Ray
Train workers it starts take one CPU each (one GPU each with ``use_gpu``).

Ray and the worker runtime are imported inside the methods here, never at module import, so
``import coordinator.app`` stays free of torch and Ray.
"""

from __future__ import annotations

import importlib
import logging
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from coordinator import raylocal
from coordinator.settings import Settings
from planning.config import TrainConfig
from workers.runtime_env import uploaded

log = logging.getLogger(__name__)

ACTOR_PREFIX = "job-"


@dataclass(frozen=True)
class Capacity:
    cpus: float
    gpus: float


@dataclass(frozen=True)
class RunStatus:
    """What the launcher knows about a launched job right now."""

    state: Literal["running", "succeeded", "failed", "missing"]
    summary: dict[str, Any] | None = None
    error: str | None = None


class Launcher(Protocol):
    """What the supervisor needs from a job runner (Ray here; a fake in tests)."""

    @property
    def status(self) -> str: ...

    def connect(self) -> None: ...
    def validate(self, config: TrainConfig) -> str | None: ...
    def capacity(self) -> Capacity | None: ...
    def launch(self, job_id: str, config: TrainConfig) -> None: ...
    def poll(self, job_id: str) -> RunStatus: ...
    def cancel(self, job_id: str) -> None: ...
    def release(self, job_id: str) -> None: ...
    def live_jobs(self) -> set[str]: ...
    def sweep(self) -> None: ...
    def close(self) -> None: ...


class RayUnavailable(RuntimeError):
    """The Ray cluster stopped answering (head lost, GCS unreachable): the supervisor reports
    it and reconnects; nothing about the jobs is decided until it can see the cluster again."""


class NullLauncher:
    """Records jobs but runs nothing (``GRADWIRE_LAUNCHER=none``): an external runner such as
    ``gradwire train --coordinator`` reports on them. Jobs stay queued until telemetry arrives."""

    status = "disabled"

    def connect(self) -> None:
        pass

    def validate(self, config: TrainConfig) -> str | None:
        return None  # the external runner checks what it runs

    def capacity(self) -> Capacity | None:
        return None  # never launches

    def launch(self, job_id: str, config: TrainConfig) -> None:  # pragma: no cover - never called
        raise RuntimeError("this coordinator runs no jobs (launcher=none)")

    def poll(self, job_id: str) -> RunStatus:
        return RunStatus("running")

    def cancel(self, job_id: str) -> None:
        pass

    def release(self, job_id: str) -> None:
        pass

    def live_jobs(self) -> set[str]:
        return set()

    def sweep(self) -> None:
        pass

    def close(self) -> None:
        pass


class JobRunner:
    """The detached actor behind one job (decorated with ``ray.remote`` lazily, at launch).

    ``start`` returns at once and runs the job in a thread, so ``status`` stays answerable and
    no call from the coordinator is ever in flight for long (a caller that dies mid-call would
    otherwise leave the outcome with nobody to read it).
    """

    def __init__(self, runner: str, config: dict[str, Any], storage_path: str) -> None:
        self._runner = runner
        self._config = config
        self._storage_path = storage_path
        self._thread: threading.Thread | None = None
        self._outcome: dict[str, Any] = {"state": "running"}
        self._started_at = time.time()

    def start(self) -> bool:
        if self._thread is None:  # idempotent: a re-launch after a crash just re-attaches
            self._thread = threading.Thread(target=self._run, name="gradwire-job", daemon=True)
            self._thread.start()
        return True

    def _run(self) -> None:
        try:
            module_name, _, func_name = self._runner.partition(":")
            run_job = getattr(importlib.import_module(module_name), func_name)
            config = TrainConfig.model_validate(self._config)
            summary = run_job(config, storage_path=self._storage_path, resume=True)
            self._outcome = {"state": "succeeded", "summary": _jsonable(summary)}
        except BaseException as exc:  # noqa: BLE001 - every failure must reach the coordinator
            logging.getLogger("gradwire.runner").error("job failed:\n%s", traceback.format_exc())
            self._outcome = {"state": "failed", "error": f"{type(exc).__name__}: {exc}"[:2000]}

    def status(self) -> dict[str, Any]:
        return dict(self._outcome, started_at=self._started_at)


def _actor_dead(state: Any, actor_id: str) -> bool:
    """Whether the GCS actor table calls ``actor_id`` dead (or no longer knows it: an empty
    entry). A failed look-up counts as alive: the sweep then keeps the group and looks again
    at its next round, where removing a group a live job needs could not be undone."""
    try:
        return state.actor_table(actor_id).get("State", "DEAD") == "DEAD"
    except Exception:  # noqa: BLE001 - a GCS hiccup must not end the sweep
        log.warning("could not read actor %s from the GCS; keeping its placement groups this round", actor_id,
                    exc_info=True)
        return False


def _jsonable(value: Any) -> Any:
    import json

    return json.loads(json.dumps(value, default=str))


class RayLauncher:
    """Launches, polls, cancels and re-attaches :class:`JobRunner` actors."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self.status = "connecting"
        self.address: str | None = None
        #: Handles of the runners this process launched or polled. A dead actor's name is gone
        #: from Ray soon after it died, but its handle still answers with the cause of death.
        self._handles: dict[str, Any] = {}

    def connect(self) -> None:
        """Join the configured cluster, or start/attach the embedded local head."""
        address = self._settings.ray_address
        if address is None:
            raylocal.use_token_auth()  # before ray is imported: it reads RAY_AUTH_MODE then
        import ray

        if address is None:
            head = raylocal.ensure_head(self._settings.data_dir, self._settings.ray_port,
                                        self._settings.local_ray_cpus)
            address = head.address
            log.info("local Ray head at %s (%s)", address, "started" if head.started_here else "attached")
        try:
            ray.init(address=address, namespace=self._settings.ray_namespace, log_to_driver=False,
                     logging_level=logging.WARNING, ignore_reinit_error=True)
        except Exception as exc:
            self.status = f"error: {exc}"
            raise
        self.address = ray.get_runtime_context().gcs_address
        self.status = "connected"

    def validate(self, config: TrainConfig) -> str | None:
        """What ``workers.runner.validate`` says about ``config`` (None: it can run). The very
        check ``run_job`` makes before starting workers, made at submit so a spec that cannot
        run (BERT beyond 512 positions, a batch larger than a worker's shard) is a 422 rather
        than a job that fails seconds later. It imports torch, which is why it runs here, in
        the driver process, and never in the web process. User code (import paths) is not
        imported here: it reaches the workers through the job's ``runtime_env``, and the job's
        runner checks it there, failing the job with a reason that names the path."""
        from workers.runner import validate

        try:
            validate(config, import_here=False)
        except ValueError as exc:
            return str(exc)
        return None

    def capacity(self) -> Capacity | None:
        import ray

        total = ray.cluster_resources()
        return Capacity(cpus=float(total.get("CPU", 0)), gpus=float(total.get("GPU", 0)))

    def _name(self, job_id: str) -> str:
        return ACTOR_PREFIX + job_id

    def launch(self, job_id: str, config: TrainConfig) -> None:
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        actor_cls = ray.remote(JobRunner)
        # The job's runtime_env goes on its runner actor (local paths uploaded: an actor takes
        # only URIs); the Train controller and workers the actor starts inherit it (Ray merges
        # a child's runtime_env into its parent's).
        runtime_env = uploaded(config.runtime_env.to_ray()) if config.runtime_env else None
        # On the coordinator's own node: Ray would otherwise put this zero-CPU actor (and with
        # it the Ray Train controller, which follows its driver) on any node, and a job must
        # not die with a worker node that goes away. Hard affinity (a soft one was placed on
        # another node in a 2-node cluster): the coordinator's node is alive while it runs.
        here = NodeAffinitySchedulingStrategy(node_id=ray.get_runtime_context().get_node_id(), soft=False)
        actor = actor_cls.options(
            name=self._name(job_id), namespace=self._settings.ray_namespace, lifetime="detached",
            get_if_exists=True, num_cpus=0, max_restarts=0, runtime_env=runtime_env,
            scheduling_strategy=here,
        ).remote(self._settings.runner, config.model_dump(mode="json"), self._settings.run_storage)
        self._handles[job_id] = actor
        ray.get(actor.start.remote(), timeout=120)

    def _actor(self, job_id: str) -> Any | None:
        import ray

        try:
            actor = ray.get_actor(self._name(job_id), namespace=self._settings.ray_namespace)
        except ValueError:
            return self._handles.get(job_id)
        self._handles[job_id] = actor
        return actor

    def poll(self, job_id: str) -> RunStatus:
        import ray
        from ray.exceptions import GetTimeoutError, OutOfMemoryError, RayActorError

        from workers.failure_cause import OutOfMemoryKill

        actor = self._actor(job_id)
        if actor is None:
            return RunStatus("missing", error=f"runner actor {self._name(job_id)} not found on the Ray cluster")
        try:
            outcome = ray.get(actor.status.remote(), timeout=10)
        except GetTimeoutError:
            return RunStatus("running")
        except OutOfMemoryError as exc:  # Ray's memory monitor killed the runner (not a RayActorError)
            return RunStatus("failed", error=OutOfMemoryKill(str(exc)).describe(victim="the job's runner actor"))
        except RayActorError as exc:
            return RunStatus("failed", error=f"runner actor died: {str(exc).splitlines()[0]}")
        return RunStatus(outcome["state"], summary=outcome.get("summary"), error=outcome.get("error"))

    def cancel(self, job_id: str) -> None:
        """Kill the runner; Ray then stops the Train controller and workers it owns."""
        self.release(job_id)

    def release(self, job_id: str) -> None:
        import ray

        actor = self._actor(job_id)
        self._handles.pop(job_id, None)
        if actor is not None:
            ray.kill(actor, no_restart=True)

    def live_jobs(self) -> set[str]:
        import ray

        names = ray.util.list_named_actors(all_namespaces=True)
        return {
            entry["name"].removeprefix(ACTOR_PREFIX) for entry in names
            if entry["namespace"] == self._settings.ray_namespace and entry["name"].startswith(ACTOR_PREFIX)
        }

    def sweep(self) -> None:
        """Remove placement groups orphaned by a killed runner.

        Cancel kills the runner actor; Ray then kills the Train controller it owns, but the
        controller's placement group is fate-shared with the controller *and* its job — this
        coordinator's driver job, which lives on — so its CPUs stayed reserved until the
        coordinator exited and the next job sat at step 0. (Ray Train's own cleaner actor
        needs the dashboard's state API, which a head without a dashboard lacks.) A group of
        this driver's job whose creating actor is dead has no one left to use it: remove it.

        "Dead" is read from the actor table, not only from the group's ``creator_actor_dead``
        flag: the GCS sets that flag once, for the groups registered when it processes the
        actor's death, and the controller's process outlives that moment (the kill reaches it
        later, seconds later on a loaded node). A controller that sees its workers die in that
        window — this sweep removing its group does that — restarts its worker group
        (``max_failures``) and registers a new group with the flag never set. That group was
        kept for ever: both CPUs held, the next job's group pending, the next job at step 0.
        Groups of a finished driver job (an earlier coordinator process) whose creator is dead
        are removed too: Ray would have, had it known the creator was dead.
        """
        import ray
        from ray._private.state import state
        from ray.core.generated import gcs_pb2
        from ray.util.placement_group import PlacementGroup, remove_placement_group

        job_id = ray.get_runtime_context().get_job_id()
        for raw in state._connect_and_get_accessor().get_placement_group_table():
            pg = gcs_pb2.PlacementGroupTableData.FromString(raw)
            if (pg.state == gcs_pb2.PlacementGroupTableData.REMOVED or pg.is_detached or not pg.creator_actor_id
                    or (pg.creator_job_id.hex() != job_id and not pg.creator_job_dead)):
                continue
            if not pg.creator_actor_dead and not _actor_dead(state, pg.creator_actor_id.hex()):
                continue
            log.warning("removing placement group %s: its creator actor %s is dead", pg.placement_group_id.hex(),
                        pg.creator_actor_id.hex())
            remove_placement_group(PlacementGroup(ray.PlacementGroupID(pg.placement_group_id)))

    def close(self) -> None:
        import ray

        if ray.is_initialized():
            ray.shutdown()  # detached runners keep going
