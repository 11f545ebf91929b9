"""Progress per second: how the adaptive policy weighs a candidate's speed against its loss.

Torch-free and pure. The model is the one error-feedback convergence results give, not a fit
to the job: a compressor with relative error ``ε = ‖x − C(x)‖ / ‖x‖`` is a ``δ``-contraction
with ``δ = 1 − ε²`` (``‖x − C(x)‖² ≤ (1 − δ)‖x‖²``), and the analyses of EF-SGD (Stich &
Karimireddy 2019; Richtárik et al., EF21, 2021) bound the steps needed to a given accuracy
by the uncompressed count times a factor that grows like ``1/δ``. So one step of a candidate
is worth ``δ`` of an uncompressed step, and the policy maximises

    progress per second = δ(ε) / predicted step time        (equivalently minimises step_s / δ)

Why this form and no fitted constant: a user should not tune anything per model, and the
only per-model input, ``ε``, is measured (``compressors.quality``) on the job's own
gradients. A choice that has run is judged by what it was measured to give: its update
efficiency ``η``, the cosine of its applied update with the gradient
(:func:`error_of_efficiency`), so ``δ = η`` for it. What it gives: at equal time the less
lossy choice wins; ``none`` (ε = 0) wins wherever it is as fast; a low rank wins only where
it buys more time than it loses steps (rank 4 at ε = 0.8 must be 2.8x faster than ``none``
to pay). It is a model: the benchmark
(``benchmarks/adaptive.py``) judges it by measured time to a target held-out loss.
"""

from __future__ import annotations

import math
from typing import Mapping

from planning import registry


def contraction(error: float) -> float:
    """``δ = 1 − ε²``: the share of an uncompressed step's progress a step with error ε makes."""
    if not math.isfinite(error) or error < 0:
        raise ValueError(f"error: must be a finite number >= 0, got {error!r}")
    return max(0.0, 1.0 - min(1.0, error) ** 2)


def error_of_efficiency(efficiency: float) -> float:
    """The error whose :func:`contraction` is a measured update efficiency ``η``:
    ``sqrt(1 − η)``, so that a running choice's worth per step is ``δ = η``.

    Why the running choice is judged by ``η`` (``compressors.quality.update_efficiency``:
    ``cos(ū, ḡ)``, the applied update against the fresh mean gradient) and not by its relative
    error ``ε``: ``ε`` is measured against ``x = g + e``, and how much of ``x`` is old residual
    differs between compressors, so across ACP-SGD and PowerSGD ``ε`` ranked the damage the
    wrong way round. On the benchmark's CNN (one rank, median over steps 100-300; held-out
    loss after 300 steps, uncompressed 0.3809; ``benchmarks/results/quality_signal.md``):
    ACP-SGD r16 ε 0.57 → δ 0.68, cosine 0.66, loss 0.3904; PowerSGD r4 ε 0.73 → δ 0.47,
    cosine 0.76, loss 0.3843; ACP-SGD r4 ε 0.85, cosine 0.38, loss 0.4011. The cosine is no
    model of the loss (PowerSGD r2: cosine 0.64, loss 0.3784, one seed), but it ranks these
    as training does, and ε did not. Passed through ``ε``, the measured choice is judged in the
    same terms as the estimates it is compared with (:func:`calibrated_errors`).
    """
    return math.sqrt(1.0 - as_efficiency(efficiency))


def as_efficiency(value: float) -> float:
    """A measured efficiency clamped to [0, 1] (a sampled η strays past either end); a
    ValueError naming the field if it is not a finite number."""
    if not math.isfinite(value):
        raise ValueError(f"efficiency: must be a finite number, got {value!r}")
    return min(1.0, max(0.0, value))


def seconds_per_progress(step_s: float, error: float) -> float:
    """Seconds per uncompressed-step-equivalent of progress: ``step_s / δ`` (inf when δ = 0)."""
    delta = contraction(error)
    return step_s / delta if delta > 0 else math.inf


def error_of(label: str, name: str, errors: Mapping[str, float] | None) -> float | None:
    """The error to judge ``label`` by: the measured estimate, else the casts' known bound,
    else None (unknown: a lossy candidate without a measurement is not chosen). The known
    bounds are the descriptions' ``Codec.known_error`` (the casts' unit round-off)."""
    if errors is not None and label in errors:
        return errors[label]
    return registry.codec(name).known_error


# --------------------------------------------------------------------------------------------
# Calibration: estimates against what the running compressor really loses
# --------------------------------------------------------------------------------------------

#: Weight of a new running report in its label's average.
RUNNING_WEIGHT = 0.3

Measured = tuple[tuple[str, float], ...]  # (label, averaged running efficiency δ), latest last


def record_running(measured: Measured, label: str, efficiency: float, weight: float = RUNNING_WEIGHT) -> Measured:
    """Fold one report's running efficiency of ``label`` (``δ``: its measured update
    efficiency η, or ``1 − ε²`` of its relative error) into its average; ``label`` moves last.

    Why ``δ`` is averaged and not the error ``√(1 − δ)``: ``δ`` is what is measured, and the
    square root is concave, so an average of errors sits below the error of the average
    (optimistic), and one sampled η straying to 1 (the 1024-coordinate sample scatters ±0.08)
    would enter as a lossless report, error 0, where in ``δ`` it is one report a little high.

    A low-rank label's change also scales the other low-rank labels' averaged efficiencies by
    the same factor (within ``MAX_DRIFT`` per report, and not above ``MAX_SCALED_EFFICIENCY``).
    Their efficiencies move together as training changes the gradient: in the CNN's
    steady-slow runs PowerSGD r4's cosine fell from 0.86 to 0.64 over 10 s. A measurement kept as it was taken would look better and better beside the fresh one
    of the running rank, and the policy went back to stale ranks every dwell. Casts, top-k and
    sign neither give nor take this drift (a cast's tiny error says nothing about the spectrum).

    Why the factor scales ``δ`` and not the error ``√(1 − δ)`` (as until session 16): a
    multiplied error saturates at 1. In two steady-slow seeds that fall of PowerSGD r4's cosine
    (its error 0.38 → 0.60, 1.6x) took ACP-SGD r4's error from 0.65 to 1: efficiency 0, the
    family's exponent undefined, and ACP-SGD r8 fell back to its best-case estimate (0.08-0.16)
    and was chosen, 7.6 s and 12.8 s into the run. Scaled in ``δ`` the same fall leaves ACP-SGD
    r4 at δ 0.58 · 0.75 = 0.43 (error 0.75): the two labels keep the ratio of worth per step
    they were measured at, which is all the policy compares (``τ = step_s / δ``).
    """
    efficiency = as_efficiency(efficiency)
    previous = dict(measured).get(label)
    value = efficiency if previous is None else previous + weight * (efficiency - previous)
    drift = _efficiency_drift(previous, value) if rank_of(label) is not None else 1.0
    return tuple((k, _scaled(v, drift) if rank_of(k) is not None else v) for k, v in measured
                 if k != label) + ((label, value),)


Spread = tuple[tuple[str, float, float], ...]  # (label, variance of its samples, Σ of its average's squared weights)


def record_spread(spread: Spread, measured: Measured, label: str, efficiency: float,
                  weight: float = RUNNING_WEIGHT) -> Spread:
    """Fold one report's efficiency of ``label`` into the exponentially weighted variance of
    its samples around its average in ``measured`` (the average before this report), by the
    standard update ``v ← (1 − w)(v + w(x − μ)²)``, and into ``Σ wᵢ²`` of the weights its
    average gives the samples (``s ← (1 − w)² s + w²``; the first sample's weight is 1), so that
    :func:`standard_error` is right from the second sample on. A label's first report: (0, 1)."""
    efficiency = as_efficiency(efficiency)
    previous_mean = dict(measured).get(label)
    variance, weights = _spread_of(spread, label) or (0.0, 0.0)
    if previous_mean is None:
        variance, weights = 0.0, 1.0
    else:
        variance = (1 - weight) * (variance + weight * (efficiency - previous_mean) ** 2)
        weights = (1 - weight) ** 2 * weights + weight ** 2
    return tuple(item for item in spread if item[0] != label) + ((label, variance, weights),)


def standard_error(spread: Spread, label: str) -> float:
    """Standard error of ``label``'s averaged efficiency: ``√(v · Σ wᵢ²)``, the spread of a
    weighted average of samples of variance ``v`` (0 for a label not measured)."""
    variance, weights = _spread_of(spread, label) or (0.0, 0.0)
    return math.sqrt(variance * weights)


def standard_error_weight(spread: Spread, label: str) -> float:
    """``Σ wᵢ²`` of ``label``'s averaged efficiency: 1 after its first sample (and for a label
    not measured), below 1 once more than one sample is averaged."""
    entry = _spread_of(spread, label)
    return 1.0 if entry is None else entry[1]


def _spread_of(spread: Spread, label: str) -> tuple[float, float] | None:
    """``label``'s (variance of its samples, Σ of its average's squared weights), or None."""
    return next(((v, s) for k, v, s in spread if k == label), None)


#: The most one report's drift moves another label's efficiency, either way: an average
#: weighted ``RUNNING_WEIGHT`` falls by at most this factor per report, and a rise is held to
#: the same (from an average near 0 a factor is unbounded: 0.02 → 0.16 would be 8x).
MAX_DRIFT = 1.0 / (1.0 - RUNNING_WEIGHT)

#: A scaled efficiency stays below this unless it was measured higher: scaled to 1 a stale
#: label would be judged lossless (error 0), which no measurement said.
MAX_SCALED_EFFICIENCY = 0.99


def _efficiency_drift(previous: float | None, value: float) -> float:
    """The factor an averaged efficiency moved by, ``value / previous`` held within
    ``[1 / MAX_DRIFT, MAX_DRIFT]`` (1 for a first report, and when either is 0: a factor of 0
    would judge every other rank worthless for good)."""
    if previous is None or previous <= 0 or value <= 0:
        return 1.0
    return min(MAX_DRIFT, max(1.0 / MAX_DRIFT, value / previous))


def _scaled(efficiency: float, drift: float) -> float:
    """A stale low-rank label's efficiency scaled by the running label's drift, kept below
    ``MAX_SCALED_EFFICIENCY`` unless it already was above it."""
    return min(efficiency * drift, max(efficiency, MAX_SCALED_EFFICIENCY))


def measured_errors(measured: Measured) -> tuple[tuple[str, float], ...]:
    """The averaged efficiencies as the errors whose contraction they are (what the
    estimates' calibration compares with)."""
    return tuple((label, error_of_efficiency(efficiency)) for label, efficiency in measured)


def family(label: str) -> str:
    """Candidates whose estimates err the same way: the ranks (or ratios) of one compressor
    (``Codec.error_family``, by default the compressor's name). ACP-SGD and PowerSGD are two
    families: at the same rank ACP-SGD loses more than PowerSGD, and once a family has run its
    own share prices its ranks (``planning/codecs/lowrank.py``, :func:`calibrated_errors`)."""
    return registry.codec(compressor_of(label)).error_family()


def compressor_of(label: str) -> str:
    """The compressor's name in a label such as ``acpsgd-r16`` (``CompressorSpec.label``)."""
    return label.split("-", 1)[0]


def rank_of(label: str) -> int | None:
    """The rank in a label such as ``acpsgd-r16`` (``CompressorSpec.label``), else None."""
    _, _, tail = label.partition("-r")
    return int(tail) if tail.isdigit() else None


def rank_fit(points: Mapping[int, float]) -> tuple[float, float] | None:
    """``(a, b)`` of ``ln ε = a + b ln rank``, least squares over the measured ranks of one
    compressor; None with fewer than two ranks. ``b`` is held at or below 0: a higher rank
    never loses more (the truncated spectrum only shrinks)."""
    usable = [(math.log(r), math.log(e)) for r, e in points.items() if r > 0 and e > 0]
    if len({x for x, _ in usable}) < 2:
        return None
    mean_x = sum(x for x, _ in usable) / len(usable)
    mean_y = sum(y for _, y in usable) / len(usable)
    slope = (sum((x - mean_x) * (y - mean_y) for x, y in usable)
             / sum((x - mean_x) ** 2 for x, _ in usable))
    slope = min(0.0, slope)
    return mean_y - slope * mean_x, slope


def efficiency_ratio(estimate: float | None, efficiency: float) -> float | None:
    """``c = δ_running / δ(estimate)``: the share of its best case's worth per step a running
    compressor keeps (``δ(ε) = 1 − ε²``, :func:`contraction`), held to at most 1 (a sampled
    efficiency above the best case says nothing better than the best case). None unless the
    estimate lies in [0, 1).

    The hold at 1 holds for every family: the estimates are each compressor's best case on the
    raw gradient (PowerSGD: the truncated spectrum; top-k: the dropped mass), and error
    feedback's residual only adds to what a step loses, so a sample above it is noise of the
    1024-coordinate sampled η, not a family that runs better than its best case. ACP-SGD's
    (the step before's top-r subspaces) is a proxy, not a bound; measured, its running share
    stayed below it (0.78-0.93 on the CNN, ``compressors.acpsgd.ACPSGD.lost_energy``)."""
    if estimate is None or not 0 <= estimate < 1:
        return None
    return min(1.0, as_efficiency(efficiency) / contraction(estimate))


def calibrated_errors(estimates: Mapping[str, float] | None, measured: Measured) -> dict[str, float] | None:
    """The errors the policy judges by (``measured``: averaged efficiencies, :func:`record_running`).

    The estimates (``compressors.quality.estimate_errors``) are the best a compressor could do
    on the raw gradient; the running compressor, with error feedback and a warm start, keeps
    less of each step. A measured label calibrates the other labels of its :func:`family` by
    the share of its best case it keeps, in worth per step: ``c = δ_running / δ(estimate)``
    (:func:`efficiency_ratio`), and a label of that family that has not run is judged worth
    ``c · δ(its estimate)``.

    Why a share of δ (session 18) and not the exponent ``k`` of ``running = estimate ** k``
    (sessions 9-17): on the CNN ACP-SGD's running error is flat across its ranks (r4 0.66, r8
    0.60, r16 0.61 in the kept runs of session 16), while its estimates fall from 0.25 to 0.08;
    the exponent carried from rank 4 (0.25 → 0.54, k 0.45) priced rank 16 at 0.32 where it ran
    at ~0.5, and every slow stretch longer than ~10 s tried it (steady-slow, seed 1: 1.13x
    PowerSGD r4 in session 17's repeats). The best cases of the ranks that matter are all near
    lossless in δ (r4 0.94, r16 0.99), so a share of δ prices the other ranks near the measured
    one, as they ran; what separates them is the best case where it is far from lossless (a
    rank 1 at ε 0.6, δ 0.64), which the share keeps. The drift (:func:`record_running`) scales
    δ too, so the two agree. A share of ε (session 8) made rank 16 look 3-5x better than it ran.

    - a label that has run is judged by the error of its averaged running efficiency;
    - a rank of a compressor that has run at two or more ranks, by the power law
      ``ε = exp(a) · rank^b`` fitted to those measurements (:func:`rank_fit`);
    - any other label of a family that has run, by ``c`` of the family's latest measured label
      whose estimate is known (in [0, 1); a label without one leaves the share before it);
    - a low-rank label of a family that has not run at all, by ``c`` of the latest measured
      low-rank label of the other family whose estimate is known (session 27). Why: since
      ACP-SGD's estimate is of its own kind (``compressors.acpsgd.ACPSGD.lost_energy``) each
      low-rank family keeps about the same share of its own estimate (the CNN's figures in
      ``benchmarks/results/quality_signal.md``), so one family's share is a fair prior for the
      other. Judged by its bare estimate, ACP-SGD was still tried after PowerSGD had run, and
      kept, in half the oscillating runs of session 27's benchmark (README, "Latest runs
      (session 27)"). Until session 15 this prior was taken too, when ACP-SGD's estimate was the
      best rank-r error: the two shares differed about 2x, and after ACP-SGD r4 had run PowerSGD
      r4 looked as lossy as it and never ran, though it was the best fixed choice at 50 Mbit/s;
    - any other, by its estimate: a family of its own kind that has not run (top-k, sign) is
      tried on its best case, so it can be measured; a pessimistic prior would keep it from
      ever running, and so from ever being measured.
    """
    if estimates is None and not measured:
        return None
    out = dict(estimates or {})
    errors = dict(measured_errors(measured))
    shares: dict[str, float] = {}
    ran = {family(label) for label, _ in measured}
    low_rank_share: float | None = None  # of the latest measured low-rank label with a known estimate
    by_rank: dict[str, dict[int, float]] = {}
    for label, efficiency in measured:  # latest last: its share wins
        share = efficiency_ratio(out.get(label), efficiency)
        rank = rank_of(label)
        if share is not None:
            shares[family(label)] = share
            if rank is not None:
                low_rank_share = share
        if rank is not None:
            by_rank.setdefault(compressor_of(label), {})[rank] = errors[label]
    fits = {name: fit for name, points in by_rank.items() if (fit := rank_fit(points)) is not None}
    for label, estimate in list(out.items()):
        name, rank = compressor_of(label), rank_of(label)
        borrowed = low_rank_share if rank is not None and family(label) not in ran else None
        share = shares.get(family(label), borrowed)
        if name in fits and rank is not None:
            a, b = fits[name]
            out[label] = min(1.0, math.exp(a + b * math.log(rank)))
        elif share is not None and math.isfinite(estimate) and estimate >= 0:
            out[label] = error_of_efficiency(share * contraction(estimate))
    out.update(errors)
    return _monotone_in_rank(out)


def _monotone_in_rank(errors: dict[str, float]) -> dict[str, float]:
    """No rank of a compressor is judged less lossy than a higher rank of it: a lower rank's
    error is at least every higher rank's. The truncated spectrum only shrinks with the rank,
    but the averages of noisy samples, the drift and a fit whose slope is held at 0 can put a
    measured rank 16 above the rank 4 beside it (a benchmark run judged them 0.51 and 0.499 and
    moved to rank 4; raising rank 4 to 0.51 alone leaves that move an 11.5 % gain: the
    incumbent's margin in ``planning.policy`` is what stops it, this keeps the order sane)."""
    out = dict(errors)
    by_compressor: dict[str, list[tuple[int, str]]] = {}
    for label in out:
        rank = rank_of(label)
        if rank is not None:
            by_compressor.setdefault(compressor_of(label), []).append((rank, label))
    for ranks in by_compressor.values():
        floor = 0.0
        for _, label in sorted(ranks, reverse=True):
            floor = out[label] = max(out[label], floor)
    return out
