"""How much a compressor loses, measured while training runs: the policy's quality signal.

Two figures, both the *relative compression error* ``ε = ‖x − C(x)‖ / ‖x‖`` of the whole
gradient (uncompressed tensors count in ``‖x‖`` with no error):

* **the running compressor's**, every step, by :class:`ErrorMeter` inside the comm hook:
  ``x = g + e_old`` (gradient plus error-feedback residual: what the compressor actually
  compresses) and ``x − C(x) = e_new``, the residual it leaves. Error-feedback compressors
  leave ``e_new`` in their memory, so this costs two reductions per tensor (``‖g + e_old‖²``
  before encoding, ``‖e_new‖²`` when the step completes), no copy. For fp16/bf16 the cast's
  own error is measured the same way (one cast per tensor); ``none`` is exactly 0.
* **the group's**, by :func:`group_error`: the same ratio for the *mean* over ranks,
  ``‖ē‖ / ‖x̄‖``, which is what training applies (the update is ``x̄ − ē`` for every
  compressor). On more than one rank this, not a rank's own ratio, is the quality signal: a
  low-rank compressor's factors are shared, so rank i keeps ``e_i = x_i − C(x̄)``, which
  holds how its gradient differs from the mean; those differences cancel in the mean and are
  never sent, so they pile up, and a rank's own ratio tends to 1 whatever the rank (measured
  on the CNN with PowerSGD rank 4: 0.998 on 2 ranks against 0.646 for the mean, and 0.640 on
  one rank). ``‖x̄‖`` needs every rank's data, so each rank keeps the same
  ``GROUP_COORDINATES`` seeded coordinates of ``x`` and of ``x − C(x)`` per step, and one
  small all-reduce between steps sums them: a ratio estimate from a uniform sample of the
  gradient's coordinates, 24 KB (x, x − C(x) and g) in one all-reduce per exchange.
* **the group's update efficiency**, by :func:`group_error` from the same exchange: the
  cosine of the applied update ``ū = x̄ − ē`` with the fresh mean gradient ``ḡ``
  (:func:`update_efficiency`: why the cosine). The policy judges a running choice by it
  (``planning.progress``), not by ``ε``: ``ε`` compares what is lost with ``x = g + e``, which
  holds the residual of earlier steps, and across compressors it ranks the damage the wrong
  way round where their residuals differ. Measured on the CNN (one rank, 300 steps, median
  over steps 100-300, ``benchmarks/results/quality_signal.md``): ACP-SGD r16 ε 0.57, cosine
  0.66; PowerSGD r4 ε 0.73, cosine 0.76; training agrees with the cosine (held-out loss 0.3904
  against 0.3843; uncompressed 0.3809). The exchange carries ``g`` at the coordinates too.
* **every candidate's estimate**, every few steps, by :func:`estimate_errors` on a sample of
  this step's gradient matrices (the way L-GreCo measures per-layer error): PowerSGD's best
  rank-r error from one spectrum per matrix for all ranks at once (its warm-started power
  iteration approaches it from above); ACP-SGD's from projecting on the top-r subspaces of the
  same matrices one step before (its factor is a step old: ``ACPSGD.lost_energy``; the meter
  keeps the two consecutive steps), top-k's from one ``topk``, scaled sign's in closed form
  ``1 − ‖x‖₁² / (d·‖x‖²)``, the casts' by casting. The estimate runs on the raw gradient,
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
import zlib
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, NamedTuple, Sequence

import torch
import torch.distributed as dist

from compressors.allreduce import CastAllReduce
from compressors.base import Compressor, ErrorFeedbackCompressor, GradSlot, kernel_class
from compressors.measured_cycle import MeasuredCycle, MeasuredStep, cycle_steps, relative_error
from planning import registry, wire
from planning.spec import CompressorSpec

_HALF = (torch.float16, torch.bfloat16)

#: Coordinates of the whole gradient every rank keeps per step for :func:`group_error`
#: (spread over the tensors in proportion to their size, the same ones on every rank).
GROUP_COORDINATES = 1024


def largest_within(tensors: Mapping[str, torch.Tensor], budget: int) -> list[str]:
    """The keys of ``tensors`` largest first, each kept while the elements kept stay within
    ``budget`` (a smaller tensor may still fit after a larger one did not)."""
    kept = []
    for key, tensor in sorted(tensors.items(), key=lambda item: item[1].numel(), reverse=True):
        if tensor.numel() <= budget:
            kept.append(key)
            budget -= tensor.numel()
    return kept


class GradientSample(NamedTuple):
    """One step's gradient matrices for :func:`estimate_errors` (largest first) and the same
    parameters' gradients the step before (None where that step had none): ACP-SGD's estimate
    projects on the step before's subspaces (``ACPSGD.lost_energy``)."""

    tensors: list[torch.Tensor]
    previous: list[torch.Tensor | None]


@dataclass
class _StepSums:
    #: 0-dim tensors, summed once at the end of the step (one host sync, not one per tensor)
    total_sq: list[torch.Tensor] = field(default_factory=list)  # ‖g + e_old‖² of every tensor
    lost_sq: list[torch.Tensor] = field(default_factory=list)  # ‖x − C(x)‖² of the casts
    keys: list[str] = field(default_factory=list)  # tensors whose residual after encoding is x − C(x)
    warm: bool = False  # a warm-up step (plain all-reduce): no compression to measure
    measured: bool = True  # False: a step the meter skips (ErrorMeter.measure_before)
    #: By tensor key: its sampled coordinates, x there, x − C(x) there (None: read from the
    #: residual once the step completed) and g there, for :func:`group_error`.
    at_coordinates: dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor]] = field(
        default_factory=dict)


class ErrorMeter:
    """The running compressor's relative error per step, fed by ``GradientSync``'s hook.

    ``bucket`` is called for each bucket on the autograd thread before the compressor
    encodes it; ``step_done`` once the step's last bucket completed (no bucket of the next
    step can start before). ``last`` is the latest step's ε; ``seconds`` the time spent here,
    so the overhead can be reported.

    What :func:`group_error` reads is :attr:`cycle`, the latest measured steps pooled over
    the compressor's ``Codec.cycle_steps`` (ACP-SGD's P- and Q-step: ``compressors.measured_cycle``).
    """

    def __init__(self, sample_elements: int = 1_000_000, *, total_elements: int | None = None,
                 coordinates: int = GROUP_COORDINATES) -> None:
        self.last: float | None = None
        #: The group's ε (:func:`group_error`) from the latest exchange, and the label of the
        #: compressor that ran the steps it measured (a switch may follow the exchange).
        self.group_last: float | None = None
        #: The group's update efficiency (:func:`update_efficiency`, a cosine) of those steps.
        self.group_efficiency: float | None = None
        self.group_label: str | None = None
        #: Elements of all trained parameters (``GradientSync.trained_elements``): spreads the
        #: sampled coordinates over the tensors; None spreads ``coordinates`` over each tensor.
        self.total_elements = total_elements
        self.coordinates = coordinates
        #: The latest measured steps of one label, at most its cycle (emptied by a warm-up
        #: step or a step not measured): what :func:`group_error` pools.
        self.cycle = MeasuredCycle()
        self._indices: dict[tuple[str, int], torch.Tensor] = {}
        self._device_indices: dict[tuple[str, int, torch.device], torch.Tensor] = {}
        #: Steps until the next exchange reads the meter (:meth:`measure_before`); None:
        #: measure every step.
        self._until_exchange: int | None = None
        self.seconds = 0.0
        self.steps = 0
        #: After :meth:`request_sample`, the next two steps keep copies of their gradient
        #: matrices (the largest first, up to ``sample_elements`` in all, chosen in the first
        #: step; the second copies only those): the second's are the sample for
        #: :func:`estimate_errors`, the first's its step before.
        self.sample_elements = sample_elements
        self.sample: GradientSample | None = None
        self._sample_steps_left = 0
        self._pending_sample: dict[str, torch.Tensor] = {}
        self._sample_before: dict[str, torch.Tensor] = {}
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
            # Only the last cycle before an exchange is measured; else only a requested sample is taken.
            sums.measured = self._until_exchange is None or self._until_exchange <= cycle_steps(compressor)
            for slot in slots:
                if self._sample_steps_left and slot.grad.dim() >= 2 and (
                        self._sample_steps_left == 2 or slot.key in self._sample_before):
                    kept = torch.float32 if slot.grad.dtype in _HALF else slot.grad.dtype  # svdvals needs it
                    self._pending_sample[slot.key] = slot.grad.detach().to(dtype=kept, copy=True)
                if not sums.measured:
                    continue
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
                lost = None
                if compressed and cast is not None:
                    lost = grad - grad.to(cast).to(grad.dtype)
                    sums.lost_sq.append(torch.dot(lost, lost))
                elif compressed and feedback:
                    sums.keys.append(slot.key)  # its residual after encoding is x − C(x)
                if not warm:
                    self._keep_coordinates(slot.key, grad, residual, lost, compressed and feedback)
        self.seconds += time.perf_counter() - started

    def step_done(self, compressor: Compressor) -> None:
        started = time.perf_counter()
        sums, self._sums = self._sums, _StepSums()
        if not sums.measured:
            self.cycle.clear()  # the next measured step starts a cycle: its steps are consecutive
        else:
            with torch.no_grad():
                lost = list(sums.lost_sq)
                if sums.keys and isinstance(compressor, ErrorFeedbackCompressor):
                    residuals = compressor.memory.peek()
                    lost += [torch.dot(residuals[k].reshape(-1), residuals[k].reshape(-1)) for k in sums.keys if k in residuals]
                total = float(torch.stack(sums.total_sq).double().sum()) if sums.total_sq else 0.0
                lost_sq = float(torch.stack(lost).double().sum()) if lost else 0.0
                sample = None if sums.warm else self._gather_coordinates(sums, compressor)
            self.last = None if sums.warm else relative_error(lost_sq, total)
            if sums.warm:
                self.cycle.clear()
            else:
                self.cycle.extend(MeasuredStep(compressor.label, cycle_steps(compressor), sample, lost_sq, total))
        self._count_down()
        self._advance_sample()
        self.steps += 1
        self.seconds += time.perf_counter() - started

    def _advance_sample(self) -> None:
        """After a completed step of a requested sample: the first step's largest matrices
        within the budget become the step before (and the parameters the second step copies);
        the second step's, with them, the sample (none when it copied no matrix)."""
        if not self._sample_steps_left:
            return
        self._sample_steps_left -= 1
        pending, self._pending_sample = self._pending_sample, {}
        chosen = largest_within(pending, self.sample_elements)
        if self._sample_steps_left:  # the first of the two
            self._sample_before = {key: pending[key] for key in chosen}
            if not chosen:  # no matrix fits: the second step would have none either
                self._sample_steps_left = 0
            return
        if chosen:
            self.sample = GradientSample([pending[key] for key in chosen],
                                         [self._sample_before.get(key) for key in chosen])
        self._sample_before = {}

    def discard_step(self) -> None:
        """Forget a step that was undone (non-finite on some rank): it measured nothing, and a
        requested sample is taken from the next step instead (its step before stays the step
        before the undone one, whose factor ACP-SGD's next step uses). The measured steps before it
        stay: an undone step leaves the compressor's state (ACP-SGD's turn) as it was."""
        self._sums, self._pending_sample = _StepSums(), {}
        self.last = None
        self._count_down()

    def _count_down(self) -> None:
        if self._until_exchange:
            self._until_exchange -= 1

    def _keep_coordinates(self, key: str, grad: torch.Tensor, residual: torch.Tensor | None,
                          lost: torch.Tensor | None, lost_in_residual: bool) -> None:
        """Keep x = g + e_old, x − C(x) and g at ``key``'s coordinates (x − C(x) from the
        residual at :meth:`step_done` when the compressor leaves it there)."""
        where = self._coordinates_on(key, grad.numel(), grad.device)
        g_at = grad[where].double()
        x_at = g_at.clone()
        if residual is not None and residual.numel() == grad.numel():
            x_at += residual.reshape(-1)[where].double()
        lost_at = None if lost_in_residual else (lost[where].double() if lost is not None else torch.zeros_like(x_at))
        self._sums.at_coordinates[key] = (where, x_at, lost_at, g_at)

    def measure_before(self, steps: int) -> None:
        """The next exchange reads the meter after ``steps`` more steps: measure only the
        last cycle of them (then every step until called again). The exchange every
        ``sync_every`` steps reads only that cycle, so the other steps need not pay for the
        meter (a requested gradient sample is still taken). With ``steps`` below the cycle
        (``sync_every = 1`` and ACP-SGD) successive exchanges share a step: their samples are
        correlated, and the policy's standard error of them comes out too small."""
        self._until_exchange = max(0, steps)

    def coordinate_count(self) -> int:
        """Coordinates drawn so far over all tensors (a sample holds three times as many values: x, x − C(x) and g)."""
        return sum(where.numel() for where in self._indices.values())

    def _coordinates(self, key: str, numel: int) -> torch.Tensor:
        """The sampled coordinates of tensor ``key``: drawn from a generator seeded by the key,
        so every rank draws the same ones (with replacement: O(k), not O(numel))."""
        found = self._indices.get((key, numel))
        if found is None:
            share = numel / self.total_elements if self.total_elements else 1.0
            count = max(1, min(numel, round(self.coordinates * share)))
            generator = torch.Generator().manual_seed(zlib.crc32(key.encode()))
            found = self._indices[(key, numel)] = torch.randint(numel, (count,), generator=generator)
        return found

    def _coordinates_on(self, key: str, numel: int, device: torch.device) -> torch.Tensor:
        """:meth:`_coordinates` on ``device``, copied there once. Why: indexing a GPU tensor
        with a host index copies the index to the device, and the host waits for that copy,
        once per tensor and step; the H200 run measured the meter at 26-37 ms of host time per
        measured step (README, "GPU figures"), before this cache (not measured since)."""
        found = self._device_indices.get((key, numel, device))
        if found is None:
            found = self._device_indices[(key, numel, device)] = self._coordinates(key, numel).to(device)
        return found

    def _gather_coordinates(self, sums: _StepSums, compressor: Compressor) -> torch.Tensor | None:
        """``[x..., x − C(x)..., g...]`` at the coordinates, tensors in key order (the same on
        every rank whatever order the buckets came in)."""
        if not sums.at_coordinates:
            return None
        residuals = compressor.memory.peek() if isinstance(compressor, ErrorFeedbackCompressor) else {}
        xs, losts, gs = [], [], []
        for key in sorted(sums.at_coordinates):
            where, x_at, lost_at, g_at = sums.at_coordinates[key]
            if lost_at is None:
                residual = residuals.get(key)
                lost_at = residual.reshape(-1)[where].double() if residual is not None else torch.zeros_like(x_at)
            xs.append(x_at)
            losts.append(lost_at)
            gs.append(g_at)
        return torch.cat(xs + losts + gs)

    def request_sample(self) -> None:
        """Keep the next two steps' gradient matrices (call between steps): the second is the
        sample, the first its step before."""
        self._sample_steps_left = 2

    @property
    def sampling(self) -> bool:
        """A requested sample's steps are still to come."""
        return self._sample_steps_left > 0

    def take_sample(self) -> GradientSample:
        """The latest sample (then forgotten; empty when there is none)."""
        sample, self.sample = self.sample, None
        return sample if sample is not None else GradientSample([], [])



def update_efficiency(x: torch.Tensor, lost: torch.Tensor, grad: torch.Tensor) -> float | None:
    """``cos(u, g) = ⟨u, g⟩ / (‖u‖‖g‖)`` of the applied update ``u = x − lost`` with the fresh
    gradient ``g``, clamped to [0, 1] (1 up to round-off for ``none``, nearly 1 for the casts; None
    when ``u`` or ``g`` is 0; 0 for an update against the gradient).

    Why the cosine and not the first-order share ``⟨u, g⟩ / ‖g‖²`` (the figure until session
    15): the share counts an update's length, and error feedback pays old residual out on top
    of the gradient, so ACP-SGD's longer updates (‖u‖²/‖g‖² 1.09 at rank 16 against PowerSGD
    r4's 1.03 on the CNN) scored nearly as well as PowerSGD's while they trained worse; the
    share put ACP-SGD r8, r16 and PowerSGD r4 within 6 % of one another at 50 Mbit/s and the
    policy settled on ACP-SGD r8 (final held-out loss +9.8 %). The cosine is blind to length:
    medians over steps 100-300 of one rank (``benchmarks/results/quality_signal.md``, the
    square root of its cos² column) PowerSGD r4 0.76, ACP-SGD r16 0.66, r8 0.56, r4 0.38, the
    order of their held-out losses. Its square, the share at the best step length, priced a
    cast's step against a low rank's too dearly (the cluster scenario's MLP left ACP-SGD r64,
    cos² 0.33, for an fp16 step 2.3x slower). Clamped: a sampled estimate can stray."""
    update = x - lost
    norms = math.sqrt(float(torch.dot(grad, grad)) * float(torch.dot(update, update)))
    if not norms > 0 or not math.isfinite(norms):
        return None
    value = float(torch.dot(update, grad)) / norms
    return min(1.0, max(0.0, value)) if math.isfinite(value) else None


def group_error(meter: ErrorMeter, group: dist.ProcessGroup | None = None) -> float | None:
    """Collective (every rank of ``group``, between steps): the group's relative error
    ``‖ē‖ / ‖x̄‖`` of the latest measured cycle (``ErrorMeter``: one step, or ACP-SGD's P- and
    Q-step pooled), estimated at the meter's coordinates, also kept as ``meter.group_last``;
    the group's :func:`update_efficiency` of that cycle goes to ``meter.group_efficiency``.
    On one rank the error is the rank's own pooled ``meter.cycle.error``. None when some rank
    has no whole measured cycle (after a warm-up step: they happen on all ranks alike).
    """
    meter.group_label = meter.cycle.label
    sample = meter.cycle.coordinate_sample
    if not dist.is_initialized() or dist.get_world_size(group) == 1:
        meter.group_last = meter.cycle.error
        meter.group_efficiency = None if sample is None else update_efficiency(*sample.chunk(3))
        return meter.group_last
    # One all-reduce of [ranks with a sample, Σ x at the coordinates, Σ (x − C(x)) there,
    # Σ g there]: its length comes from the coordinates every rank has drawn (the same keys
    # on every rank) and the cycle (the same compressor on every rank), so it matches across
    # ranks even where one had no sample, which the count then shows.
    length = 3 * meter.coordinate_count() * meter.cycle.length
    have = sample is not None and sample.numel() == length
    summed = torch.zeros(1 + length, dtype=torch.float64)
    summed[0] = 1.0 if have else 0.0
    if have:
        assert sample is not None
        summed[1:] = sample
    dist.all_reduce(summed, group=group)  # N·x̄, N·ē and N·ḡ (N cancels in both ratios)
    if length == 0 or int(summed[0]) != dist.get_world_size(group):
        meter.group_last = meter.group_efficiency = None
        return None
    x, lost, grad = summed[1:].chunk(3)
    meter.group_last = relative_error(float(torch.dot(lost, lost)), float(torch.dot(x, x)))
    meter.group_efficiency = update_efficiency(x, lost, grad)
    return meter.group_last


def estimate_errors(tensors: Iterable[torch.Tensor], specs: Sequence[CompressorSpec],
                    previous: Sequence[torch.Tensor | None] | None = None) -> dict[str, float]:
    """Each candidate's relative error ``ε`` on ``tensors`` (pooled: ``sqrt(Σ lost² / Σ ‖x‖²)``);
    ``previous``: the same parameters' gradients one step before, in the same order (None, or a
    None entry, where the sample has none).

    A tensor the candidate leaves uncompressed (``wire.is_compressed``) counts with no loss.
    What a compressed one loses is its kernel's ``Compressor.lost_energy``: PowerSGD, the best
    rank-r approximation's error (Eckart–Young, ``compressors.lowrank.squared_singular_values``); ACP-SGD, the error of
    projecting on the step before's top-r subspaces (its factor is a step old; the best rank-r
    error without ``previous``); top-k, the mass outside the k largest magnitudes; signsgd,
    the scaled sign's closed form; the casts (by running them) their rounding; none: 0.
    """
    tensors = [t.detach() for t in tensors]
    previous = list(previous) if previous is not None else [None] * len(tensors)
    if len(previous) != len(tensors):
        raise ValueError(f"previous: must hold one entry per tensor ({len(tensors)}), got {len(previous)}")
    total = math.fsum(float(torch.sum(t.float() ** 2)) for t in tensors)
    lost: dict[str, float] = {spec.label: 0.0 for spec in specs}
    kernels = {spec.name: kernel_class(spec.name) for spec in specs}
    lossy = {spec.label for spec in specs if registry.is_lossy(spec.name)}
    compressing: set[str] = set()
    with torch.no_grad():
        for tensor, tensor_before in zip(tensors, previous):
            shape = tuple(tensor.shape)
            flat = tensor.reshape(-1).to(torch.float32)
            cache: dict[str, Any] = {}
            for spec in specs:
                if wire.is_compressed(spec, shape):
                    compressing.add(spec.label)
                    lost[spec.label] += kernels[spec.name].lost_energy(spec, tensor, flat, cache, tensor_before)
    errors = {label: round(relative_error(value, total), 6) for label, value in lost.items()}
    unresolved = [spec for spec in specs if errors[spec.label] == 0.0 and spec.label in lossy & compressing and total > 0]
    return {**errors, **{spec.label: _stand_in(spec, specs, errors) for spec in unresolved}}


def _size(spec: CompressorSpec) -> float | None:
    """A candidate's rank or ratio: what it keeps (more keeps more of the gradient)."""
    return spec.rank if spec.rank is not None else spec.ratio


def _stand_in(spec: CompressorSpec, specs: Sequence[CompressorSpec], errors: dict[str, float]) -> float:
    """The estimate of a lossy candidate that lost nothing on the sample, which cannot resolve
    it: one step's gradient of a linear layer has rank <= the rank's batch, so every rank at or
    above it reads 0, which says nothing about what error feedback feeds the compressor. It
    gets the estimate of the same compressor's nearest smaller rank (or ratio) that the sample
    does resolve — the best rank-r error never rises with r, so that bounds its own best case
    (calibration then scales it like any estimate of its compressor) — or, when there is none,
    0 (the best case; the running error judges it once it has run)."""
    size = _size(spec)
    below = [errors[other.label] for other in specs if other.name == spec.name and errors[other.label] > 0
             and size is not None and (other_size := _size(other)) is not None and other_size < size]
    return min(below) if below else 0.0
