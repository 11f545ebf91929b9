"""Error-feedback memory: what compression left out, added back to the next gradient.

Kept as its own object (as GRACE does) so every lossy compressor shares one
implementation of accumulate / save / restore / hand-over, keyed by parameter name.
"""

from __future__ import annotations

from typing import Any

import torch


class ErrorFeedback:
    """Per-parameter residuals ``e``.

    :meth:`accumulate` turns the residual buffer into ``M = g + e`` *in place*; the
    compressor then subtracts what it sent, leaving the new residual in the same buffer.
    After the first step no memory is allocated and the gradient bucket is never cloned.
    """

    def __init__(self) -> None:
        self._residuals: dict[str, torch.Tensor] = {}

    def accumulate(self, key: str, grad: torch.Tensor) -> torch.Tensor:
        """Return ``grad + e`` for ``key``, stored in (and aliasing) the residual buffer."""
        residual = self._residuals.get(key)
        if residual is None or residual.shape != grad.shape or residual.device != grad.device:
            residual = grad.detach().clone(memory_format=torch.contiguous_format)
            self._residuals[key] = residual
            return residual
        return residual.add_(grad)

    def get(self, key: str) -> torch.Tensor | None:
        return self._residuals.get(key)

    def set(self, key: str, residual: torch.Tensor) -> None:
        self._residuals[key] = residual

    def take(self) -> dict[str, torch.Tensor]:
        """Hand over every residual and forget them (used when the compressor is switched)."""
        residuals, self._residuals = self._residuals, {}
        return residuals

    def peek(self) -> dict[str, torch.Tensor]:
        """The residuals by parameter, left in place."""
        return dict(self._residuals)

    def state_dict(self) -> dict[str, Any]:
        return {key: value.detach().cpu().clone() for key, value in self._residuals.items()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self._residuals = {key: value.clone() for key, value in state.items()}

    def __len__(self) -> int:
        return len(self._residuals)
