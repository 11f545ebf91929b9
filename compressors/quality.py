"""How much a compressor loses, measured while training runs: the policy's quality signal.

Two figures, both the *relative compression error* ``ε = ‖x − C(x)‖ / ‖x‖`` of the whole
gradient (uncompressed tensors count in ``‖x‖`` with no error):

* **the running compressor's**, every step, by :class:`ErrorMeter` inside the comm hook:
  ``x = g + e_old`` (gradient plus error-feedback residual: what the compressor actually
  compresses) and ``x − C(x) = e_new``, the residual it leaves. Error-feedback compressors
  leave ``e_new`` in their memory, so this costs two reductions per tensor (``‖g + e_old‖²``
  before encoding, ``‖e_new‖²`` when the step completes), no copy. For fp16/bf16 the cast's
  own error is measured the same way (one cast per tensor); ``none`` is exactly 0.
* **every candidate's estimate**, every few steps, by :func:`estimate_errors` on a sample of
  this step's gradient matrices (the way L-GreCo measures per-layer error): the best rank-r
  error from one ``svdvals`` per matrix for all ranks at once (PowerSGD/ACP-SGD's warm-started
  power iteration approaches it from above), top-k's from one sort, scaled sign's in closed
  form ``1 − ‖x‖₁² / (d·‖x‖²)``, the casts' by casting. The estimate runs on the raw gradient,
  whichever compressor runs, so candidates are compared on the same input.

Why the policy compares candidates by the estimate, not the running figure: the running
error of a warm-started low-rank compressor with error feedback is a different quantity from
the error it would have on a fresh gradient, and mixing them would bias every comparison
towards switching away from what runs. The running figure is exported (telemetry,
Prometheus) so an operator sees what the job loses now.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Iterable, Sequence

import torch

from compressors.allreduce import CastAllReduce
from compressors.base import Compressor, ErrorFeedbackCompressor, GradSlot, kernel_class
from planning import wire
from planning.spec import CompressorSpec

_HALF = (torch.float16, torch.bfloat16)


def _ratio(lost_sq: float, total_sq: float) -> float:
    """``sqrt(lost / total)`` clamped to [0, 1] (rounding can overshoot by an ulp)."""
    if not total_sq > 0 or not math.isfinite(total_sq) or not math.isfinite(lost_sq):
        return 0.0
    return min(1.0, math.sqrt(max(0.0, lost_sq) / total_sq))


@dataclass
class _StepSums:
    #: 0-dim tensors, summed once at the end of the step (one host sync, not one per tensor)
    total_sq: list[torch.Tensor] = field(default_factory=list)  # ‖g + e_old‖² of every tensor
    lost_sq: list[torch.Tensor] = field(default_factory=list)  # ‖x − C(x)‖² of the casts
    keys: list[str] = field(default_factory=list)  # tensors whose residual after encoding is x − C(x)
    warm: bool = False  # a warm-up step (plain all-reduce): no compression to measure


class ErrorMeter:
    """The running compressor's relative error per step, fed by ``GradientSync``'s hook.

    ``bucket`` is called for each bucket on the autograd thread before the compressor
    encodes it; ``step_done`` once the step's last bucket completed (no bucket of the next
    step can start before). ``last`` is the latest step's ε; ``seconds`` the time spent here,
    so the overhead can be reported.
    """

    def __init__(self, sample_elements: int = 1_000_000) -> None:
        self.last: float | None = None
        self.seconds = 0.0
        self.steps = 0
        #: After :meth:`request_sample`, the next step keeps copies of its gradient matrices
        #: (largest first, up to ``sample_elements`` in all) for :func:`estimate_errors`.
        self.sample_elements = sample_elements
        self.sample: list[torch.Tensor] = []
        self._sampling = False
        self._pending_sample: list[torch.Tensor] = []
        self._sums = _StepSums()

    def bucket(self, slots: Sequence[GradSlot], compressor: Compressor) -> None:
        started = time.perf_counter()
        with torch.no_grad():
            feedback = isinstance(compressor, ErrorFeedbackCompressor)
            # The committed residuals e_old, read without settling: the step is in flight and
            # its state may still be undone (a non-finite step), which settling would forbid.
            residuals = compressor.memory.peek() if isinstance(compressor, ErrorFeedbackCompressor) else {}
            warm = compressor.steps_done < compressor.spec.warmup_steps
            cast = compressor.dtype if isinstance(compressor, CastAllReduce) else None
            sums = self._sums
            sums.warm = sums.warm or warm
            for slot in slots:
                grad = slot.grad.detach().reshape(-1)
                if grad.dtype in _HALF:  # sums of squares in fp32 (fp16 would overflow), as residuals are kept
                    grad = grad.float()
                residual = residuals.get(slot.key)
                x_sq = torch.dot(grad, grad)
                if residual is not None and not warm and residual.numel() == grad.numel():
                    # ‖g + e‖² = ‖g‖² + 2⟨g, e⟩ + ‖e‖², without materialising g + e
                    flat = residual.reshape(-1)
                    x_sq = x_sq + 2 * torch.dot(grad, flat) + torch.dot(flat, flat)
                sums.total_sq.append(x_sq)
                compressed = not warm and compressor.compresses(tuple(slot.grad.shape))
                if compressed and cast is not None:
                    lost = grad - grad.to(cast).to(grad.dtype)
                    sums.lost_sq.append(torch.dot(lost, lost))
                elif compressed and feedback:
                    sums.keys.append(slot.key)  # its residual after encoding is x − C(x)
                if self._sampling and slot.grad.dim() >= 2:
                    kept = torch.float32 if slot.grad.dtype in _HALF else slot.grad.dtype  # svdvals needs it
                    self._pending_sample.append(slot.grad.detach().to(dtype=kept, copy=True))
        self.seconds += time.perf_counter() - started

    def step_done(self, compressor: Compressor) -> None:
        started = time.perf_counter()
        sums, self._sums = self._sums, _StepSums()
        with torch.no_grad():
            lost = list(sums.lost_sq)
            if sums.keys and isinstance(compressor, ErrorFeedbackCompressor):
                residuals = compressor.memory.peek()
                lost += [torch.dot(residuals[k].reshape(-1), residuals[k].reshape(-1)) for k in sums.keys if k in residuals]
            total = float(torch.stack(sums.total_sq).double().sum()) if sums.total_sq else 0.0
            lost_sq = float(torch.stack(lost).double().sum()) if lost else 0.0
        self.last = None if sums.warm else _ratio(lost_sq, total)
        if self._pending_sample:
            ordered = sorted(self._pending_sample, key=lambda t: t.numel(), reverse=True)
            kept, budget = [], self.sample_elements
            for tensor in ordered:
                if tensor.numel() <= budget:
                    kept.append(tensor)
                    budget -= tensor.numel()
            self.sample, self._pending_sample = kept, []
        self._sampling = False
        self.steps += 1
        self.seconds += time.perf_counter() - started

    def discard_step(self) -> None:
        """Forget a step that was undone (non-finite on some rank): it measured nothing, and a
        requested sample is taken from the next step instead."""
        self._sums, self._pending_sample = _StepSums(), []
        self.last = None

    def request_sample(self) -> None:
        """Keep the next step's gradient matrices (call between steps)."""
        self._sampling = True

    def take_sample(self) -> list[torch.Tensor]:
        """The latest sampled gradient tensors (then forgotten)."""
        sample, self.sample = self.sample, []
        return sample


def estimate_errors(tensors: Iterable[torch.Tensor], specs: Sequence[CompressorSpec]) -> dict[str, float]:
    """Each candidate's relative error ``ε`` on ``tensors`` (pooled: ``sqrt(Σ lost² / Σ ‖x‖²)``).

    A tensor the candidate leaves uncompressed (``wire.is_compressed``) counts with no loss.
    What a compressed one loses is its kernel's ``Compressor.lost_energy``: low-rank, the best
    rank-r approximation's error (Eckart–Young, from ``svdvals``); top-k, the mass outside the
    k largest magnitudes; signsgd, the scaled sign's closed form; the casts (by running them)
    their rounding; none: 0.
    """
    tensors = [t.detach() for t in tensors]
    total = math.fsum(float(torch.sum(t.float() ** 2)) for t in tensors)
    lost: dict[str, float] = {spec.label: 0.0 for spec in specs}
    kernels = {spec.name: kernel_class(spec.name) for spec in specs}
    with torch.no_grad():
        for tensor in tensors:
            shape = tuple(tensor.shape)
            flat = tensor.reshape(-1).to(torch.float32)
            cache: dict[str, torch.Tensor] = {}
            for spec in specs:
                if wire.is_compressed(spec, shape):
                    lost[spec.label] += kernels[spec.name].lost_energy(spec, tensor, flat, cache)
    return {label: round(_ratio(value, total), 6) for label, value in lost.items()}
