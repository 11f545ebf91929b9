"""Error-feedback memory: what compression left out, added back to the next gradient.

Kept as its own object (as GRACE does) so every lossy compressor shares one
implementation of accumulate / save / restore / hand-over, keyed by parameter name.
"""

from __future__ import annotations

from typing import Any

import torch


class ErrorFeedback:
    """Per-parameter residuals ``e``, double-buffered.

    :meth:`accumulate` writes ``M = g + e`` into a second buffer kept per parameter, leaving
    the committed ``e`` untouched; the compressor subtracts what it sent from ``M`` and
    :meth:`commit` makes it the residual, keeping the previous one as the spare. So a step
    can be undone exactly (:meth:`restore`) until the next one writes into the spare: that
    is how a non-finite (skipped) step leaves no trace. After two steps no memory is
    allocated and the gradient bucket is never cloned; the price is a second residual-sized
    buffer per parameter.

    Residuals are kept in :func:`~compressors.base.compute_dtype` of the gradient (fp32 for
    16-bit gradients).
    """

    def __init__(self) -> None:
        self._residuals: dict[str, torch.Tensor] = {}
        self._spare: dict[str, torch.Tensor] = {}

    def accumulate(self, key: str, grad: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
        """Return ``grad + e`` for ``key`` in a work buffer of ``dtype`` (default: the grad's)."""
        dtype = dtype or grad.dtype
        residual = self._residuals.get(key)
        if residual is None or residual.shape != grad.shape or residual.device != grad.device or residual.dtype != dtype:
            return grad.detach().to(dtype=dtype, memory_format=torch.contiguous_format, copy=True)
        spare = self._spare.get(key)
        if spare is None or spare.shape != residual.shape or spare.dtype != dtype or spare.device != residual.device:
            spare = torch.empty_like(residual, memory_format=torch.contiguous_format)
        return torch.add(residual, grad, out=spare)

    def commit(self, key: str, work: torch.Tensor) -> torch.Tensor | None:
        """Make ``work`` the residual of ``key``; return the previous one (now the spare)."""
        prior = self._residuals.get(key)
        self._residuals[key] = work
        if prior is not None:
            self._spare[key] = prior
        else:
            self._spare.pop(key, None)
        return prior

    def restore(self, key: str, prior: torch.Tensor | None) -> None:
        """Undo :meth:`commit`: ``prior`` is the residual again (``None``: there was none)."""
        current = self._residuals.pop(key, None)
        if prior is not None:
            self._residuals[key] = prior
        if current is not None:
            self._spare[key] = current

    def get(self, key: str) -> torch.Tensor | None:
        return self._residuals.get(key)

    def set(self, key: str, residual: torch.Tensor) -> None:
        self._residuals[key] = residual

    def take(self) -> dict[str, torch.Tensor]:
        """Hand over every residual and forget them (used when the compressor is switched)."""
        residuals, self._residuals, self._spare = self._residuals, {}, {}
        return residuals

    def peek(self) -> dict[str, torch.Tensor]:
        """The residuals by parameter, left in place."""
        return dict(self._residuals)

    def state_dict(self) -> dict[str, Any]:
        return {key: value.detach().cpu().clone() for key, value in self._residuals.items()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self._residuals = {key: value.clone() for key, value in state.items()}
        self._spare = {}

    def __len__(self) -> int:
        return len(self._residuals)
