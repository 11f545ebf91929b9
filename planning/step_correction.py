"""How far the cost model's step time lies from the job's measured one, per compressor.

Torch-free and pure (``planning.policy.decide`` keeps the :data:`Corrections` in its state).

Why: the policy compares candidates by their predicted step times, and a prediction that is
off for one candidate and not another decides the comparison. On the benchmark's oscillating
link (session 20, ``README.md``) the policy settled on PowerSGD r8, which the cost model
priced at 0.0458 s/step on the mix of the link's levels and fp16 at 0.0523; measured, both
ran at ~0.052, so fp16, which loses nothing, was the better choice, but it looked less than
the switching threshold ahead. The running choice's step time is measured all along
(``Telemetry.step_wall_seconds``: the mean wall time from the end of one step to the end of
the next over the worker's recent steps), so each report gives a residual, measured minus
predicted, for the choice that ran, and the policy adds each label's averaged residual to its
predictions. Wall time, not the sum of the timed phases: the work between the phases (the
decision exchange, link probes and checks, reports, checkpoints) is paid per step too: in
sessions 20-21's oscillating runs 0.005-0.009 s a step, 10-15 % of it (fp16 0.005-0.006,
PowerSGD r8 0.007-0.008, ``none`` 0.009), and not alike by every choice.

Additive, not a ratio: what the model misses for a compressed choice is time every step
pays whatever the link does (Python around the hook and the optimizer, loading data, the work
between the phases, a codec's cost profiled on another compressor's steps). In session 21's
runs (wall time against the model over windows at one level of the link, median per label)
PowerSGD r8's residual was +0.005 s at 1000 Mbit/s and +0.007 s at 50, ACP-SGD r8's 0.000 at
both. Not so for a choice whose step depends on the link: fp16 −0.001 s at 1000 and −0.019
at 50, ``none`` −0.002 and −0.056. There the model prices communication at the averaged
reading of the slow link, which sat below its rate, so their residual is a property of the
level (see "Per level of the link" below). A label that has not run is given the least
residual of those that have, the part every choice pays as far as the job knows it (another
rank of a compressor that ran takes that compressor's latest residual instead: it runs the
same code around the hook); what a label adds to that is measured once it runs (an optimistic start, as the quality estimates are: a pessimistic one would
keep it from ever running).

**Per level of the link.** A label's residuals are averaged per level of the link they were
measured at (bandwidths within the policy's level-shift factor; its latest three levels): the
residual of a choice whose step depends on the link is a property of the level, and on an
oscillating link each level's prediction in the mix takes its own. At a level where the label
has not run, only the part of its latest residual above 0 is applied:
a negative residual is the model overpricing that choice's communication at the level it ran
at, which says nothing of the same choice at another (the reasoning that already kept another
label's negative residual from a label that had not run). Why (session 38): in the cluster
scenario (``tests/distributed/test_cluster.py``), PowerSGD r64 ran through the 20 Mbit/s
stretch, whose averaged reading sat at 15-16 Mbit/s, below the link's rate, so its measured
step (0.49-0.51 s) lay 0.03 s under the model's (0.52-0.58 s). Carried to the 2 Gbit/s link
that followed, the residual took r64's prediction there (~0.016 s) down to the floor of half
of it, 0.008 s, ahead of fp16's 0.010 s, and the job stayed on r64 for the 600 fast steps
while it measured 0.034 s a step against fp16's ~0.020 (seen in the policy's verdicts of a
run here; the CI runs of sessions 36 and 37 failed with the same switches. In a run whose slow
reading sat at 19.8 Mbit/s the job went back to fp16 within two reports of the rise).

The prediction a residual is taken against covers the same steps as the measurement: the
mean is over up to 50 steps, which on the oscillating link span both levels, so each is
predicted at the link's stretches those steps ran at (``planning.link_levels.steps_mix``).
"""

from __future__ import annotations

import math
from typing import NamedTuple

from planning.link_levels import same_level
from planning.progress import compressor_of


class Correction(NamedTuple):
    """One label's averaged residual (seconds per step: measured minus predicted) and the
    bandwidth (bytes/s) of the level of the link it was measured at."""

    label: str
    residual: float
    bandwidth: float


#: One :class:`Correction` per label that ran and level of the link it ran at, latest last.
Corrections = tuple[Correction, ...]

#: Weight of a new report's residual in its label's average at its level. Each report's measurement is
#: itself a mean over up to 50 steps, so consecutive reports overlap; the average follows a
#: change within ~10 reports (1 s in the benchmark).
RESIDUAL_WEIGHT = 0.2

#: A mean over fewer steps is not folded: just after a switch the window restarts, and its
#: first steps carry the switch's own costs (allocating the new compressor's state).
MIN_TIMED_STEPS = 5

#: Nor when the running choice's predicted step differs by more than this share between the
#: levels of the link its steps met (``planning.policy._fold_step_residual`` says why).
LINK_SENSITIVE = 0.10

#: Nor a measured mean further from the prediction than this share of the prediction.
MAX_RESIDUAL = 0.5


#: Levels of the link a label keeps a residual for (the latest): an oscillating link has two.
LEVELS_PER_LABEL = 3


def residuals(corrections: Corrections) -> dict[str, float]:
    """Each label's latest averaged residual, whatever level it was measured at."""
    return {c.label: c.residual for c in corrections}


def record_residual(corrections: Corrections, label: str, measured_s: float, predicted_s: float,
                    bandwidth: float, level_factor: float, weight: float = RESIDUAL_WEIGHT) -> Corrections:
    """``corrections`` with one report's residual of ``label``, measured at ``bandwidth``, folded
    into the label's average at that level (within ``level_factor`` of its bandwidth, which
    follows the reports in log space with the same weight: the averaged reading of one link
    wanders, and a level that did not follow it split into fresh entries of one report each);
    the first report at a level sets it. That entry moves last; a label keeps its latest
    :data:`LEVELS_PER_LABEL` levels. A ValueError naming the field for a step time that is not
    a finite number >= 0 or a bandwidth that is not > 0 (infinite is one worker's: no link)."""
    for name, value in (("measured_s", measured_s), ("predicted_s", predicted_s)):
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"{name}: must be a finite number >= 0, got {value!r}")
    if not bandwidth > 0:  # infinite: one worker, no link
        raise ValueError(f"bandwidth: must be a number > 0, got {bandwidth!r}")
    residual = measured_s - predicted_s
    previous = _at_level(corrections, label, bandwidth, level_factor)
    if previous is not None:
        residual = previous.residual + weight * (residual - previous.residual)
        if math.isfinite(bandwidth) and math.isfinite(previous.bandwidth):
            bandwidth = previous.bandwidth * (bandwidth / previous.bandwidth) ** weight
    kept = [c for c in corrections if c is not previous]
    others = [c for c in kept if c.label == label]
    dropped = others[:max(0, len(others) - (LEVELS_PER_LABEL - 1))]
    return tuple(c for c in kept if not any(c is d for d in dropped)) + (Correction(label, residual, bandwidth),)


def _at_level(corrections: Corrections, label: str, bandwidth: float, level_factor: float) -> Correction | None:
    """``label``'s entry at ``bandwidth``'s level (the latest, should two lie within it)."""
    return next((c for c in reversed(corrections)
                 if c.label == label and same_level(c.bandwidth, bandwidth, level_factor)), None)


def correction_for(corrections: Corrections, label: str, bandwidth: float, level_factor: float) -> float:
    """Seconds to add to ``label``'s predicted step at ``bandwidth``: its averaged residual at
    that level; else its latest at another level, not below 0 (module docstring); else, alike,
    that of the latest measured label of its compressor (another rank runs the same code
    around the hook); else the least of the measured labels' latest residuals, not below 0;
    else 0. Why not below 0: what every step pays beside the model's phases only adds time,
    and a negative residual is the model overpricing that choice's communication at a level
    of the link (``none`` −0.056 s and fp16 −0.019 s at 50 Mbit/s in session 21's runs, whose
    averaged reading sat below the link's rate), which says nothing of another choice, nor of
    this one at another level."""
    own = [c for c in corrections if c.label == label]
    if not own:
        own = [c for c in corrections if compressor_of(c.label) == compressor_of(label)]
    if own:
        here = _at_level(corrections, own[-1].label, bandwidth, level_factor)
        return here.residual if here is not None else max(0.0, own[-1].residual)
    return max(0.0, min(residuals(corrections).values())) if corrections else 0.0
