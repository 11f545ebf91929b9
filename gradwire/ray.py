"""gradwire for Ray Train scripts (``TorchTrainer``'s ``train_loop_per_worker``).

::

    import gradwire.ray
    ...
    model = gradwire.ray.prepare(model, compression="acpsgd", rank=4)   # was: ray.train.torch.prepare_model(model)
    ...
            optimizer.step()
            gradwire.ray.step(loss)
"""

from __future__ import annotations

from typing import Any

from torch import nn
from torch.nn.parallel import DistributedDataParallel

from gradwire._current import close, current, set_current, step

__all__ = ["prepare", "step", "close", "current"]


def prepare(model: nn.Module, compression: Any = None, *, rank: int | None = None, coordinator: Any = None,
            token: str | None = None, name: str | None = None, steps: int | None = None,
            bucket_cap_mb: float = 25.0, **options: Any) -> DistributedDataParallel:
    """``ray.train.torch.prepare_model(model)`` (device placement, DDP) with GradientSync
    installed on it, and this worker's gradwire session started.

    ``compression``: a compressor name (``"acpsgd"``, ``"powersgd"``, ``"topk"``, ...),
    ``"adaptive"``, or a job's ``compression`` block as a dict; ``rank`` for the low-rank ones.
    ``coordinator``: URL of a gradwire coordinator (default ``GRADWIRE_URL``), ``token`` its
    bearer token. ``name`` (default: the Ray Train run's name) and ``steps`` describe the job.
    ``options``: ``sync_every``, ``report_interval_s``, ``probe_interval_s``, ``keep_heap``
    (fix the C heap's thresholds, as the built-in loop does: ``workers.heap``; off by default).
    """
    import ray.train
    import ray.train.torch
    import torch.distributed as dist

    from workers.session import start

    def wrap(module: nn.Module) -> DistributedDataParallel:
        prepared = ray.train.torch.prepare_model(module, parallel_strategy_kwargs={"bucket_cap_mb": bucket_cap_mb})
        if isinstance(prepared, DistributedDataParallel):
            return prepared
        # prepare_model leaves a one-worker run unwrapped; GradientSync needs DDP's hook.
        return DistributedDataParallel(prepared, bucket_cap_mb=bucket_cap_mb)

    if not dist.is_initialized():
        raise RuntimeError("gradwire.ray.prepare runs inside TorchTrainer's train_loop_per_worker")
    run_name = name or ray.train.get_context().get_experiment_name() or "ray-train"
    session = start(model, device=ray.train.torch.get_device(), wrap=wrap, compression=compression, rank=rank,
                    coordinator=coordinator, token=token, name=run_name, steps=steps, bucket_cap_mb=bucket_cap_mb,
                    **options)
    set_current(session)
    return session.ddp
