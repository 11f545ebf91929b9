"""Gradient compressors as PyTorch DDP communication hooks.

Public API (see docs/compressors.md, "Public API")::

    from compressors import build, GradientSync
    comp = build("acpsgd", rank=4)
    sync = GradientSync(comp)
    sync.install(ddp_model)

``build`` and ``GradientSync`` are handed out lazily so that ``import planning.spec``
(used by the torch-free coordinator) does not import torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["build", "GradientSync", "Compressor"]

if TYPE_CHECKING:  # pragma: no cover
    from compressors.base import Compressor, build
    from compressors.sync import GradientSync


def __getattr__(name: str) -> Any:
    if name in ("build", "Compressor"):
        from compressors import base

        return getattr(base, name)
    if name == "GradientSync":
        from compressors.sync import GradientSync

        return GradientSync
    raise AttributeError(f"module 'compressors' has no attribute {name!r}")
