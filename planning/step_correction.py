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
level, and one average per label follows the level the choice last ran at (a known limit:
keeping residuals per level is the next step, ``README.md``). A label that has not run is given the least
residual of those that have, the part every choice pays as far as the job knows it (another
rank of a compressor that ran takes that compressor's latest residual instead: it runs the
same code around the hook); what a label adds to that is measured once it runs (an optimistic start, as the quality estimates are: a pessimistic one would
keep it from ever running).

The prediction a residual is taken against covers the same steps as the measurement: the
mean is over up to 50 steps, which on the oscillating link span both levels, so each is
predicted at the link's stretches those steps ran at (``planning.link_levels.steps_mix``).
"""

from __future__ import annotations

import math

from planning.progress import compressor_of

#: (label, averaged residual in seconds per step: measured minus predicted), latest last.
Corrections = tuple[tuple[str, float], ...]

#: Weight of a new report's residual in its label's average. Each report's measurement is
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


def record_residual(corrections: Corrections, label: str, measured_s: float, predicted_s: float,
                    weight: float = RESIDUAL_WEIGHT) -> Corrections:
    """``corrections`` with one report's residual of ``label`` folded into its average
    (the first report sets it); ``label`` moves last. A ValueError naming the field for a
    step time that is not a finite number >= 0."""
    for name, value in (("measured_s", measured_s), ("predicted_s", predicted_s)):
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"{name}: must be a finite number >= 0, got {value!r}")
    residual = measured_s - predicted_s
    previous = dict(corrections).get(label)
    value = residual if previous is None else previous + weight * (residual - previous)
    return tuple(item for item in corrections if item[0] != label) + ((label, value),)


def correction_for(corrections: Corrections, label: str) -> float:
    """Seconds to add to ``label``'s predicted step: its averaged residual; else that of the
    latest measured label of its compressor (another rank runs the same code around the
    hook); else the least of the measured labels' (the part every choice pays), but not below
    0; else 0. Why not below 0: what every step pays beside the model's phases only adds
    time, and a negative residual is the model overpricing that choice's communication at
    a level of the link (``none`` −0.056 s and fp16 −0.019 s at 50 Mbit/s in session 21's runs,
    whose averaged reading sat below the link's rate), which says nothing of another choice."""
    known = dict(corrections)
    if label in known:
        return known[label]
    kin = [value for other, value in corrections if compressor_of(other) == compressor_of(label)]
    if kin:
        return kin[-1]
    return max(0.0, min(known.values())) if known else 0.0
