"""Helpers for the Ray Train tests: a progress actor like ``gradwire train``'s, and job configs.

(This directory has no ``__init__.py`` on purpose: a package named ``ray`` under ``tests/``,
which conftest puts on ``sys.path``, would shadow the real Ray.)
"""

from __future__ import annotations

import uuid
from typing import Any

from planning.config import TrainConfig


def progress_actor() -> tuple[str, Any]:
    """A fresh named progress actor in the session's namespace: (name, handle).

    The class is local so that Ray ships it by value: workers cannot import this module.
    """
    import ray

    class ProgressBuffer:
        """What rank 0 pushes its telemetry to (``RayWorkerEnv.progress_sink``)."""

        def __init__(self) -> None:
            self.reports: list[dict[str, Any]] = []

        def push(self, report: dict[str, Any]) -> None:
            self.reports.append(report)

        def drain(self) -> list[dict[str, Any]]:
            reports, self.reports = self.reports, []
            return reports

    name = f"test-progress-{uuid.uuid4().hex[:8]}"
    handle = ray.remote(num_cpus=0)(ProgressBuffer).options(name=name).remote()
    ray.get(handle.drain.remote())  # up before any worker looks it up
    return name, handle


def config(name: str, **fields: Any) -> TrainConfig:
    """A small 2-worker CPU job (mlp, synthetic data unless told otherwise)."""
    values: dict[str, Any] = {"name": name, "model": "mlp", "steps": 30, "workers": 2, "batch_size": 32}
    values.update(fields)
    return TrainConfig.model_validate(values)
