"""gradwire for plain ``torchrun`` scripts (torch.distributed without Ray).

::

    import gradwire.torch
    ...
    model = gradwire.torch.prepare(model, compression="acpsgd", rank=4)   # was: DDP(model)
    ...
        optimizer.step()
        gradwire.torch.step(loss)
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from gradwire._current import close, current, set_current, step

__all__ = ["prepare", "step", "close", "current"]


def _device() -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


def prepare(model: nn.Module, compression: Any = None, *, rank: int | None = None, coordinator: Any = None,
            token: str | None = None, name: str = "torchrun", steps: int | None = None,
            bucket_cap_mb: float = 25.0, **options: Any) -> DistributedDataParallel:
    """``DDP(model)`` on this rank's device (``cuda:LOCAL_RANK``, else CPU) with GradientSync
    installed, and this rank's gradwire session started. Initialises the process group from
    torchrun's environment (``nccl`` on GPU, else ``gloo``) if the script has not. Arguments
    as :func:`gradwire.ray.prepare`; without ``coordinator`` (and ``GRADWIRE_URL``) the run
    reports nowhere and an adaptive ``compression`` is decided in the script itself.
    """
    from workers.session import start

    device = _device()
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    if device.type == "cuda":
        torch.cuda.set_device(device)

    def wrap(module: nn.Module) -> DistributedDataParallel:
        return DistributedDataParallel(module.to(device), device_ids=[device.index] if device.type == "cuda" else None,
                                       bucket_cap_mb=bucket_cap_mb)

    session = start(model, device=device, wrap=wrap, compression=compression, rank=rank, coordinator=coordinator,
                    token=token, name=name, steps=steps, bucket_cap_mb=bucket_cap_mb, **options)
    set_current(session)
    return session.ddp
