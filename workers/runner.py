"""Run one training job: on Ray Train (``run_job``) or with plain torch multiprocessing (``run_local``).

Both validate the job before any worker starts (bad model/dataset/batch combinations are
refused with a clear ``ValueError``), run ``workers.loop`` on every worker and return the
summary of docs/step.md ("The run summary") (rank 0's), plus ``checkpoint_path`` where the final checkpoint
(with every rank's own record) lies.
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
import uuid
from pathlib import Path
from typing import Any, Callable

from planning.config import TrainConfig
from workers.runtime_env import inherited_code, uploaded

#: Lowered so ray.train.report does not block ~2 s per call (see Ray Train v2 health checks).
os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.2")
#: How often a running elastic job (``workers: "min..max"``) checks whether more workers fit
#: now (Ray Train's ``elastic_resize_monitor_interval_s``, 60 s by default), from the
#: environment of the process that runs the job: ``benchmarks/cluster.py`` sets 15 s, so a
#: returning node is used within seconds rather than a minute.
ELASTIC_RESIZE_ENV = "GRADWIRE_ELASTIC_RESIZE_INTERVAL_S"


def validate(config: TrainConfig, *, import_here: bool = True) -> None:
    """Refuse a job that cannot run, before any worker starts: bad built-in combinations, and
    (``import_here``) user factories that do not import in this process."""
    from workers.data import validate_combination
    from workers.usercode import check_importable

    if config.external:
        raise ValueError("external: this job's training runs elsewhere (gradwire.ray.prepare); nothing to launch")
    if import_here:
        check_importable(config)
    if not config.data.user_code:
        shape_as = "cnn" if config.model.user_code else config.model.name
        validate_combination(shape_as, config.data.dataset, config.data.batch_size, config.max_workers, seq_len=config.data.seq_len)


def run_job(
    config: TrainConfig,
    *,
    storage_path: str | None = None,
    resume: bool = True,
    progress_actor: str | None = None,
    run_name: str | None = None,
) -> dict[str, Any]:
    """Run ``config`` with ``ray.train.torch.TorchTrainer`` in the Ray cluster this process is connected to.

    Blocks until the run ends; raises if it failed. ``resume``: a run of the same
    ``run_name`` under ``storage_path`` continues from its latest checkpoint.
    """
    import ray
    import ray.train
    from ray.train.torch import TorchConfig, TorchTrainer

    from workers.failure_cause import WorkerOutOfMemoryError, out_of_memory_kill
    from workers.loop import train_loop_per_worker

    validate(config, import_here=False)
    runtime_env = config.runtime_env.to_ray() if config.runtime_env else None
    if not ray.is_initialized():
        ray.init(address=os.environ.get("RAY_ADDRESS", "auto"), include_dashboard=False, log_to_driver=False,
                 runtime_env=runtime_env)
    # Inside the job's runner actor (or a driver given it in ray.init) every child inherits
    # the job's runtime_env; otherwise it goes on the probe task and the workers themselves.
    worker_env = uploaded(runtime_env) if runtime_env and not inherited_code() else None
    check_user_code_on_ray(config, worker_env)
    storage = storage_path or str(Path(tempfile.gettempdir()) / "gradwire-runs")
    name = run_name or f"{config.name}-{uuid.uuid4().hex[:8]}"
    if not resume:
        name = f"{name}-{uuid.uuid4().hex[:6]}"
    workers = config.workers if isinstance(config.workers, int) else tuple(config.workers)
    trainer = TorchTrainer(
        train_loop_per_worker,
        train_loop_config={"train": config.model_dump(mode="json"), "progress_actor": progress_actor},
        torch_config=TorchConfig(backend="nccl" if config.use_gpu else "gloo"),
        scaling_config=ray.train.ScalingConfig(num_workers=workers, use_gpu=config.use_gpu, **_elastic_options(workers)),
        run_config=ray.train.RunConfig(
            name=name,
            storage_path=storage,
            failure_config=ray.train.FailureConfig(max_failures=config.checkpoints.max_failures),
            checkpoint_config=ray.train.CheckpointConfig(num_to_keep=config.checkpoints.keep),
            worker_runtime_env=worker_env,
        ),
    )
    try:
        result = trainer.fit()
        if result.error is not None:
            raise result.error
    except Exception as error:
        # Ray Train says only that a health check failed when a worker was killed for memory.
        if (kill := out_of_memory_kill(error)) is None:
            raise
        raise WorkerOutOfMemoryError(kill.describe()) from error
    return _summary_from(Path(result.checkpoint.path) if result.checkpoint else None, result.metrics)


def check_user_code_on_ray(config: TrainConfig, runtime_env: dict[str, Any] | None = None) -> None:
    """Build the job's model, data and loss once in a Ray worker process, which has the same
    ``runtime_env`` as the training workers will (inherited from this actor or driver), so a
    user factory that does not import or returns the wrong type fails the job at once, naming
    the path and the error, rather than after Ray Train has started (and, with
    ``max_failures``, restarted) worker groups that all fail the same way."""
    if not (config.model.user_code or config.data.user_code or config.model.loss):
        return
    import ray
    from ray.exceptions import RayTaskError

    from workers.usercode import build_workload, check_importable

    def check(cfg: TrainConfig) -> None:
        check_importable(cfg)
        build_workload(cfg)

    probe = ray.remote(num_cpus=0, max_retries=0)(check)
    if runtime_env:
        probe = probe.options(runtime_env=runtime_env)
    try:
        ray.get(probe.remote(config))
    except RayTaskError as exc:
        cause = exc.cause if isinstance(exc.cause, BaseException) else None
        raise (cause or exc) from None


def _elastic_options(workers: int | tuple[int, int]) -> dict[str, float]:
    interval = os.environ.get(ELASTIC_RESIZE_ENV)
    if interval is None or isinstance(workers, int):
        return {}
    return {"elastic_resize_monitor_interval_s": float(interval)}


def _summary_from(checkpoint_dir: Path | None, metrics: dict[str, Any] | None) -> dict[str, Any]:
    summary: dict[str, Any] = dict(metrics or {})
    if checkpoint_dir is not None and (checkpoint_dir / "summary.json").exists():
        summary = json.loads((checkpoint_dir / "summary.json").read_text())
    summary["checkpoint_path"] = str(checkpoint_dir) if checkpoint_dir else None
    return summary


def rank_records(checkpoint_path: str) -> list[dict[str, Any]]:
    """Each rank's own record (step → compressor, applied decisions) from a final checkpoint."""
    directory = Path(checkpoint_path)
    records = sorted(directory.glob("record*.json"), key=lambda p: int(p.stem.removeprefix("record")))
    return [json.loads(path.read_text()) for path in records]


# --------------------------------------------------------------------------- without Ray


def run_local(
    config: TrainConfig,
    *,
    checkpoint_dir: str | None = None,
    progress: Callable[[dict[str, Any]], Any] | None = None,
) -> dict[str, Any]:
    """Run the same loop on ``config.workers`` local processes (gloo), without Ray; for debugging."""
    import torch.multiprocessing as mp

    _put_local_code_on_path(config)
    validate(config)
    world_size = config.max_workers
    root = Path(checkpoint_dir or tempfile.mkdtemp(prefix="gradwire-local-"))
    context = mp.get_context("spawn")
    reports = context.Queue()
    results = context.Queue()
    port = _free_port()
    processes = [
        context.Process(target=_local_worker, args=(rank, world_size, port, config.model_dump(mode="json"), str(root), reports, results))
        for rank in range(world_size)
    ]
    for process in processes:
        process.start()
    summary: dict[str, Any] | None = None
    error: str | None = None
    try:
        while any(p.is_alive() for p in processes) or not results.empty():
            _drain(reports, progress)
            try:
                rank, ok, payload = results.get(timeout=0.2)
            except Exception:  # noqa: BLE001 - queue.Empty
                continue
            if not ok:
                error = error or f"rank {rank} failed:\n{payload}"
            elif rank == 0:
                summary = payload
        _drain(reports, progress)
    finally:
        for process in processes:
            process.join(timeout=30)
            if process.is_alive():
                process.kill()
    if error or summary is None:
        raise RuntimeError(error or "training processes ended without a summary")
    latest = (root / "latest").read_text().strip() if (root / "latest").exists() else None
    summary["checkpoint_path"] = str(root / latest) if latest else None
    return summary


def _put_local_code_on_path(config: TrainConfig) -> None:
    """Without Ray, a job's local ``working_dir`` and ``py_modules`` go on ``sys.path`` (and
    on ``PYTHONPATH``, for the spawned ranks): what Ray's runtime_env does for them on a
    cluster. Remote URIs and ``pip`` need Ray."""
    import sys

    env = config.runtime_env
    if env is None:
        return
    if env.pip or any("://" in entry for entry in [env.working_dir or "", *(env.py_modules or [])]):
        raise ValueError("runtime_env: pip and remote URIs need Ray (run without --no-ray)")
    paths = ([str(Path(env.working_dir).resolve())] if env.working_dir else []) + [
        str(Path(module).resolve().parent) for module in env.py_modules or []]
    for path in reversed(paths):
        if path not in sys.path:
            sys.path.insert(0, path)
    os.environ["PYTHONPATH"] = os.pathsep.join(paths + [p for p in [os.environ.get("PYTHONPATH")] if p])
    os.environ.update(env.env_vars or {})


def _drain(reports: Any, progress: Callable[[dict[str, Any]], Any] | None) -> None:
    while True:
        try:
            report = reports.get_nowait()
        except Exception:  # noqa: BLE001 - queue.Empty
            return
        if progress is not None:
            progress(report)


def _local_worker(rank: int, world_size: int, port: int, config: dict[str, Any], root: str, reports: Any, results: Any) -> None:
    import traceback

    try:
        summary = run_rank(TrainConfig.model_validate(config), rank, world_size, f"tcp://127.0.0.1:{port}",
                           checkpoint_root=Path(root), progress=reports.put)
        results.put((rank, True, summary))
    except BaseException:  # noqa: BLE001 - reported to the parent, which raises
        results.put((rank, False, traceback.format_exc()))


def run_rank(
    config: TrainConfig,
    rank: int,
    world_size: int,
    init_method: str,
    *,
    checkpoint_root: Path | None = None,
    progress: Callable[[dict[str, Any]], Any] | None = None,
) -> dict[str, Any]:
    """Run one rank of a job in this process (gloo), e.g. inside a network namespace of the testbed."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    from workers.envs import LocalWorkerEnv
    from workers.loop import run_training

    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world_size, timeout=timedelta(minutes=5))
    try:
        env = LocalWorkerEnv(rank, world_size, torch.device("cpu"), checkpoint_root, progress=progress)
        return run_training(config, env)
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
