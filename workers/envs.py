"""Where the training loop runs: a :class:`WorkerEnv` gives it its rank, device, checkpoint
storage and the place rank 0's live progress goes.

Two environments: :class:`RayWorkerEnv` (a Ray Train worker: checkpoints through
``ray.train.report``, progress to a named Ray actor) and :class:`LocalWorkerEnv` (plain torch
multiprocessing for ``gradwire train --no-ray``: checkpoints in a directory, progress to a
callback). The loop (``workers.loop.run_training``) is the same for both.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any, Callable, Protocol

import torch
import torch.distributed as dist

from workers.control import CallbackSink, TelemetrySink


class WorkerEnv(Protocol):
    """Where the loop runs: rank, device, checkpoints, and where progress goes."""

    rank: int
    world_size: int
    device: torch.device

    def load_checkpoint(self, reader: Callable[[Path], Any]) -> Any | None:
        """Call ``reader`` on the latest checkpoint directory; None if there is none."""

    def save_checkpoint(self, metrics: dict[str, Any], writer: Callable[[Path], None]) -> None:
        """Collective: every rank writes its files with ``writer``; one checkpoint results."""

    def progress_sink(self) -> TelemetrySink | None:
        """Where rank 0's telemetry goes besides the coordinator (live progress), if anywhere."""


class RayWorkerEnv:
    """Ray Train: checkpoints through ``ray.train.report``; progress to a named Ray actor."""

    def __init__(self, progress_actor: str | None = None) -> None:
        import ray.train
        import ray.train.torch

        context = ray.train.get_context()
        self.rank = context.get_world_rank()
        self.world_size = context.get_world_size()
        self.device = ray.train.torch.get_device()
        self._progress_actor = progress_actor

    def load_checkpoint(self, reader: Callable[[Path], Any]) -> Any | None:
        import ray.train

        checkpoint = ray.train.get_checkpoint()
        if checkpoint is None:
            return None
        with checkpoint.as_directory() as directory:
            return reader(Path(directory))

    def save_checkpoint(self, metrics: dict[str, Any], writer: Callable[[Path], None]) -> None:
        import ray.train

        with tempfile.TemporaryDirectory() as directory:
            writer(Path(directory))
            ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(directory))

    def progress_sink(self) -> TelemetrySink | None:
        if self._progress_actor is None or self.rank != 0:
            return None
        import ray

        try:
            actor = ray.get_actor(self._progress_actor)
        except ValueError:
            return None
        return CallbackSink(lambda report: actor.push.remote(report))


class LocalWorkerEnv:
    """Plain torch multiprocessing: checkpoints in a directory, progress to a callback."""

    def __init__(self, rank: int, world_size: int, device: torch.device, checkpoint_root: Path | None,
                 progress: Callable[[dict[str, Any]], Any] | None = None) -> None:
        self.rank, self.world_size, self.device = rank, world_size, device
        self.root = checkpoint_root
        self._progress = progress
        self.saved = 0

    def load_checkpoint(self, reader: Callable[[Path], Any]) -> Any | None:
        if self.root is None or not (self.root / "latest").exists():
            return None
        return reader(self.root / (self.root / "latest").read_text().strip())

    def save_checkpoint(self, metrics: dict[str, Any], writer: Callable[[Path], None]) -> None:
        if self.root is None:
            return
        self.saved += 1
        name = f"checkpoint_{self.saved:06d}"
        directory = self.root / name
        directory.mkdir(parents=True, exist_ok=True)
        writer(directory)
        dist.barrier()
        if self.rank == 0:
            (directory / "metrics.json").write_text(json.dumps(metrics))
            (self.root / "latest").write_text(name)
        dist.barrier()

    def progress_sink(self) -> TelemetrySink | None:
        if self._progress is None or self.rank != 0:
            return None
        return CallbackSink(self._progress)


