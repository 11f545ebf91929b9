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
gradients. What it gives: at equal time the less lossy choice wins; ``none`` (ε = 0) wins
wherever it is as fast; a low rank wins only where it buys more time than it loses steps
(rank 4 at ε = 0.8 must be 2.8x faster than ``none`` to pay). It is a model: the benchmark
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

#: Weight of a new running-error report in its label's average.
RUNNING_WEIGHT = 0.3

Measured = tuple[tuple[str, float], ...]  # (label, averaged running error), latest last


def family(label: str) -> str:
    """Candidates whose estimates err the same way: the ranks (or ratios) of one compressor
    (``Codec.error_family``, by default the compressor's name). ACP-SGD and PowerSGD are two
    families: at the same rank ACP-SGD loses more than PowerSGD (``planning/codecs/lowrank.py``)."""
    name = label.split("-", 1)[0]
    return registry.codec(name).error_family()


def record_running(measured: Measured, label: str, error: float, weight: float = RUNNING_WEIGHT) -> Measured:
    """Fold one report's running error of ``label`` into its average; ``label`` moves last."""
    previous = dict(measured).get(label)
    value = error if previous is None else previous + weight * (error - previous)
    return tuple((k, v) for k, v in measured if k != label) + ((label, value),)


def calibrated_errors(estimates: Mapping[str, float] | None, measured: Measured) -> dict[str, float] | None:
    """The errors the policy judges by.

    The estimates (``compressors.quality.estimate_errors``) are the best a compressor could do
    on the raw gradient; the running compressor, with error feedback and a warm start, loses
    more (measured on this repository's CNN: rank 8's estimate 0.27, the group's running error
    0.54-0.72).
    So: a label that has run is judged by its measured running error; a label of the same
    :func:`family` that has not, by its estimate times the family's measured/estimated ratio
    (from the family's latest measured label), capped at 1; any other by its estimate.
    """
    if estimates is None and not measured:
        return None
    out = dict(estimates or {})
    ratios: dict[str, float] = {}
    for label, error in measured:  # latest last: its ratio wins
        estimate = out.get(label)
        if estimate is not None and estimate > 0:
            ratios[family(label)] = error / estimate
    for label, estimate in list(out.items()):
        if family(label) in ratios:
            out[label] = min(1.0, estimate * ratios[family(label)])
    out.update(dict(measured))
    return out
