"""The latest measured cycle of the running compressor: what one quality exchange pools.

Why a cycle and not a step: ACP-SGD alternates P- and Q-steps, which lose different parts of
the gradient (on the MLP at rank 64 one step's first-order share ⟨u, g⟩/‖g‖² alternated near 0.3
and 0.75), so an exchange every ``sync_every`` steps read one half or the other by the parity of
the step, and the policy judged the rank by whichever came first. A compressor's
``Codec.cycle_steps`` consecutive measured steps of one label are pooled instead (one step
for every compressor but ACP-SGD). ``compressors.quality.ErrorMeter`` fills the cycle;
``compressors.quality.group_error`` reads it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from compressors.base import Compressor
from planning import registry


def relative_error(lost_sq: float, total_sq: float) -> float:
    """``sqrt(lost / total)`` clamped to [0, 1] (rounding can overshoot by an ulp); 0 when
    ``total`` is 0 or either is not finite."""
    if not total_sq > 0 or not math.isfinite(total_sq) or not math.isfinite(lost_sq):
        return 0.0
    return min(1.0, math.sqrt(max(0.0, lost_sq) / total_sq))


def cycle_steps(compressor: Compressor) -> int:
    """Steps of ``compressor``'s cycle (``planning.codec.Codec.cycle_steps``)."""
    return registry.codec(compressor.name).cycle_steps


@dataclass(frozen=True)
class MeasuredStep:
    """One measured step: what its cycle pools."""

    label: str
    cycle: int  # steps in its compressor's cycle
    sample: torch.Tensor | None  # [x, x − C(x), g] at the coordinates (None: no tensor sampled)
    lost_sq: float  # Σ ‖x − C(x)‖² over the step's tensors
    total_sq: float  # Σ ‖x‖² over the step's tensors


class MeasuredCycle:
    """The latest measured steps of one label, at most its cycle, oldest first."""

    def __init__(self) -> None:
        self._steps: list[MeasuredStep] = []

    def clear(self) -> None:
        """Start afresh (a warm-up step, or a step not measured: a cycle's steps are consecutive)."""
        self._steps = []

    def extend(self, step: MeasuredStep) -> None:
        """Keep ``step`` with the measured steps of its label just before it, at most its
        cycle (a step of another label in between starts the cycle afresh)."""
        same = bool(self._steps) and self._steps[-1].label == step.label
        self._steps = ((self._steps if same else []) + [step])[-step.cycle:]

    @property
    def _complete(self) -> list[MeasuredStep] | None:
        """The steps when they make a whole cycle (``cycle`` steps of one label)."""
        steps = self._steps
        return steps if steps and len(steps) == steps[-1].cycle else None

    @property
    def label(self) -> str | None:
        """The label of the compressor that ran the latest measured step."""
        return self._steps[-1].label if self._steps else None

    @property
    def length(self) -> int:
        """Steps in a whole cycle of the latest measured label (1 before any is measured)."""
        return self._steps[-1].cycle if self._steps else 1

    @property
    def error(self) -> float | None:
        """This rank's ε pooled over the whole cycle, ``sqrt(Σ‖x − C(x)‖² / Σ‖x‖²)``; None
        before a whole cycle is measured."""
        steps = self._complete
        if steps is None:
            return None
        return relative_error(math.fsum(m.lost_sq for m in steps), math.fsum(m.total_sq for m in steps))

    @property
    def coordinate_sample(self) -> torch.Tensor | None:
        """``[x…, x − C(x)…, g…]`` at the coordinates (float64) over the whole cycle, each
        part the cycle's steps in order, so ratios of its parts pool the cycle; None before a
        whole cycle is measured, or when a step of it sampled no tensor."""
        steps = self._complete
        if steps is None or any(m.sample is None for m in steps):
            return None
        parts = [m.sample.chunk(3) for m in steps if m.sample is not None]
        return torch.cat([torch.cat(part) for part in zip(*parts)])
