"""The policy's hysteresis: when a predicted gain is enough to switch, and what a switch
leaves behind (step 5 of ``planning.policy``).

Pure functions of the scored candidates (``planning.policy_types.Scored``) and the policy's
state: the threshold a gain must pass (:func:`threshold`, with the small one between choices
whose error is known and the undo of a refuted move), the side of the link the policy is on
(:func:`side`, what an oscillating link's levels record), the doubt in the running choice's
favour, the dwell (:func:`switch_took_effect`, :func:`trial_measured`, :func:`link_dropped_since_switch`,
:func:`without_dwell`), the margin an estimate needs over what the job has on record
(:func:`explore_on_clear_gain`, :func:`judged_on_record`) and the state a switch leaves
(:func:`switch`).
"""

from __future__ import annotations

import dataclasses
import math

from planning import registry
from planning.policy_types import Measurements, PolicyConfig, PolicyState, Scored, Switch
from planning.progress import contraction, error_of_efficiency, standard_error, standard_error_weight
from planning.spec import CompressorSpec
from planning.step_correction import residuals


def _lossy(spec: CompressorSpec) -> bool:
    """Whether ``spec`` is a lossy compressor (not ``none`` or a cast, whose error is known)."""
    return registry.is_lossy(spec.name)


def side(best: Scored, current: Scored, threshold: float) -> bool:
    """Which side the policy would be on for the link as it stands, dwell aside: the best
    option's when it saves more than ``threshold`` of the current choice's time per progress
    (the policy would switch to it), else the current choice's (it would keep it). True: a
    lossy compressor.

    Why not the best option's side alone: on a steady fast link the sides lie within a few per
    cent of each other (ACP-SGD r16 predicted 4-7 % ahead of ``none`` at readings of
    0.7-4 Gbit/s, fp16 and ``none`` within 3 %), and the reading's swings flipped the better
    one back and forth a dozen times in 17 s of the benchmark's steady-fast run; only a move
    the policy would make is a change of side.
    """
    return _lossy(best.spec) if gain(current, best) > threshold else _lossy(current.spec)


def threshold(current: Scored, best: Scored, state: PolicyState, cfg: PolicyConfig) -> float:
    """The predicted gain a switch from ``current`` to ``best`` must exceed:
    ``known_error_gain_threshold`` (2 %) to a choice whose error is known (``none`` and the
    casts) that the job has not left for another such choice, from another such choice or
    from a lossy one whose step is at most that 2 % shorter than its own; ``gain_threshold``
    (10 %) otherwise — back to a choice the job left, to a lossy one, from a lossy one that
    steps faster. The smaller of the two where a job sets ``gain_threshold`` lower.

    Why less to a known error: the threshold keeps the policy from moving on a gain its inputs
    cannot resolve, and the least resolved input is what a lossy choice would lose (an
    estimate, or an average of noisy efficiency samples: the CNN's scatter 0.5-0.9 from one
    exchange to the next), where a wrong move costs progress later steps do not give back. A
    choice whose error is known risks none of that: between ``none``, fp16 and bf16 only the
    step time is at stake, and from a lossy choice to a known error that steps as fast the
    move loses nothing either way (equal time goes to the less lossy choice; the lossy one's
    measured loss already has one standard error of doubt in its favour). On this machine's
    steady 1 Gbit/s link fp16's steps ran 2.8 % faster than ``none``'s (8 paired runs, steps
    15-210; the cost model predicted 3.5 %) and the 10 % kept ``none`` all run; after the
    testbed's link came back, PowerSGD r8 (error 0.17-0.28) stepped as fast as fp16, fp16 was
    predicted 3.6-9.7 % ahead by progress, and the 10 % kept the lossy choice for 17 s.
    "As fast" within the 2 %: a lossy trial begun as the link came back ran its steps at the
    fast rate, level with fp16's to the noise of their step corrections, and whether the small
    threshold applied had been a coin toss on which prediction came out a millisecond ahead.

    Why the full threshold back, and for every label left (not only the last): where two such
    choices cross, a noisy reading moves their predictions by more than a few per cent either
    way. With 2 % both ways the policy traded ``none`` and fp16 once per dwell for as long as
    the link sat there (every one of 60 synthetic traces of a link read ±30 % about 2.8 or
    3.2 Gbit/s), and with 4 % back it still did in 58 of 240; ``none`` → fp16 → bf16 → ``none``
    would pass 2 % at every hop (the casts are predicted alike, so what moves between them is
    their step corrections' difference). So each known-error choice gets one cheap move to
    it; after that the band is the 10 % that held the start choice before. A first move that
    the step correction then measures as a loss is held no more than that 10 %, as the start
    choice was (``tests/unit/test_policy.py``, the noisy crossing).

    Why a move to a lossy choice leaves nothing behind: the band is against noise where two
    known-error choices cross; a job that moved from fp16 to PowerSGD because the link fell,
    and sees it come back, is not at that crossing. Counted as left, fp16 then took the full
    10 % from PowerSGD r8, which its quality gain (4-9 %) did not reach, and the testbed's job
    compressed to its end on a link that had come back (a clean-clone CI run, session 24).
    """
    small = min(cfg.known_error_gain_threshold, cfg.gain_threshold)
    cheap = not _lossy(best.spec) and best.label not in state.left and (
        not _lossy(current.spec) or best.step_s * (1 - small) <= current.step_s)
    return small if cheap or _undo(current, best, state) else cfg.gain_threshold


def _undo(current: Scored, best: Scored, state: PolicyState) -> bool:
    """Whether moving to ``best`` undoes the last switch, a move between two known-error
    choices from ``best`` to ``current`` (``PolicyState.last_move``), once both have their own
    measured step time (``planning.step_correction``; at some level of the link: where one has
    not run, its prediction carries only the part above 0 of its residual). The small threshold then holds back as
    well as forth, once: the undo is no move that can itself be undone, and after it both
    labels count as left.

    Why: the first move between ``none`` and a cast is made on the cost model's prediction,
    and where the link is fast the cast's saving is a few per cent of a step that the model
    does not resolve: on the benchmark's steady-fast link (2-3 Gbit/s readings) the move to
    fp16 was predicted 2.0 % faster and fp16 ran 4.2 % slower than ``none`` (session 25's
    fixed runs, time to target 1.042x), and the full threshold back kept the job on it to its
    end. Measured, the comparison is no longer the noisy prediction the band guards against:
    one undo corrects a move the measurement refuted, and cannot flap.
    """
    measured = residuals(state.corrections)
    return _reverses_last_move(state, current.label, best.label) and current.label in measured and best.label in measured


def _reverses_last_move(state: PolicyState, from_label: str, to_label: str) -> bool:
    """Whether a move from ``from_label`` to ``to_label`` goes straight back along
    ``state.last_move``."""
    return state.last_move == (to_label, from_label)



def without_dwell(state: PolicyState) -> PolicyState:
    """The state with no dwell to wait out, now or when the last switch takes effect, and no
    labels left (after a release from a pin, or a change of world size: the next report may
    switch at once, and what the job left at another size or under a pin is no evidence now)."""
    return dataclasses.replace(state, last_switch_at=None, awaiting=None, left=(), last_move=None)


def switch_took_effect(state: PolicyState, m: Measurements, now: float) -> PolicyState:
    """The dwell counts from the first report of a step the new choice ran.

    Why: the workers apply a decision at a later step, and on a slow link that is seconds
    later (fp16 steps of 0.75 s on the MLP at 20 Mbit/s: ten steps, 7.5 s, more than the
    cluster scenario's 5 s dwell). Counted from the decision, the dwell had passed before the
    new choice ran at all, and its first noisy efficiency sample alone could switch back.
    """
    if state.awaiting is not None and m.running == state.awaiting:
        return dataclasses.replace(state, last_switch_at=now, awaiting=None)
    return state


def trial_measured(state: PolicyState, label: str) -> bool:
    """Whether ``label`` runs on trial (switched to on an estimate alone) and has since been
    measured more than once: then the dwell does not hold it.

    Why: a label that has not run is judged by an estimate, and the estimates err optimistic
    (a family's best case, or another rank's calibration carried over: in steady-slow ACP-SGD r16
    was chosen at an error of 0.26 extrapolated by an exponent and measured 0.61). Once two exchanges have
    measured it, a better choice by the threshold beyond the doubt in its favour means the
    estimate was wrong (or the link changed), and waiting out the dwell only spends time on
    it: 2 s of a 13 s job per wrong trial in the benchmark, in the critical first steps for the
    first pick. One sample is not enough (the CNN's sampled efficiency scatters 0.5-0.9 from
    one exchange to the next; with one sample the doubt has no spread to give). The dwell
    still holds every choice that was measured when it was made, so two measured labels cannot
    flap. "Two exchanges": ``AdaptiveController._once`` folds each decision exchange's
    figures once; a caller of :func:`decide` that passes a figure per report (the paper-scale
    replay) ends a trial after two reports."""
    return state.trial == label and standard_error_weight(state.spread, label) < 1.0


def link_dropped_since_switch(state: PolicyState, current: CompressorSpec) -> bool:
    """Whether the link has dropped to a new level, one where the policy would compress,
    since the last switch took effect, and the choice in force does not compress (``none``
    or a cast): then the dwell does not hold it.

    Why: the dwell keeps the policy from moving again on the same information (a noisy
    reading or efficiency sample taking back a switch); a new level of the link
    (``planning.link_levels.record_level``: the average moved beyond the level factor and the
    side changed) is new information. Held, a cast chosen when the link came back ran on
    when it fell again: on the benchmark's oscillating link (2 s dwell, 40 fast and 20 slow
    steps, ~2 s a period) a cast chosen after the rise at step 60 (at steps 79-89) was still
    held at the drop at step 100, and ran all 20 slow steps, each about twice PowerSGD's step
    there, in six of six runs (session 29, ``benchmarks/results/adaptive_s29_exp_check_budget.*``:
    recovery checks from the start, which saw that rise; not landed).

    Why a drop only, not a rise: the two mistakes cost unalike. An uncompressed choice on a
    slow link pays the whole link every step (fixed fp16 0.058 s a step against PowerSGD r4's
    0.031 at 50 Mbit/s: medians over the stretches of session 28's six oscillating runs), a
    compressing one on a fast link its compression's overhead (0.031 against fp16's 0.028 at
    1 Gbit/s). A link that comes back may fall again within the dwell, as an oscillating one
    does, and the dwell then saves the expensive mistake: with a rise ending the dwell too, the
    policy on the synthetic oscillating link of ``tests/unit/test_link_levels.py`` went from
    compressing to ``none`` 4 s after the first drop, paid the next slow stretch on ``none``,
    and ran 1.17x the time per progress of the best fixed choice over the same steps (the
    test's bound is 1.05x).
    """
    if state.last_switch_at is None or len(state.levels) < 2:
        return False  # the first level recorded is where the link began, not a move
    level = state.levels[-1]
    return level.since > state.last_switch_at and level.lossy and not _lossy(current)


def doubt_in_favour(m: Measurements, state: PolicyState) -> Measurements:
    """The measurements with the current choice judged one standard error better than its
    averaged efficiency (``planning.progress.standard_error``).

    Why: a running choice's efficiency is an average of noisy samples (the first-order share
    on the CNN scattered from 0.5 to 1 from one exchange to the next), and the other labels
    are judged by older averages and by estimates calibrated from them. Within that noise the
    policy flapped between ranks whose time per progress lay 10-14 % apart, each move a gain
    above the threshold that the next samples took back. A switch must now gain the threshold beyond
    the incumbent's own uncertainty; a label measured once has none yet (the dwell guards it).
    """
    label = m.current.label
    if m.errors is None or label not in m.errors or label not in dict(state.measured):
        return m
    optimistic = min(1.0, contraction(m.errors[label]) + standard_error(state.spread, label))
    return dataclasses.replace(m, errors={**m.errors, label: error_of_efficiency(optimistic)})


def judged_on_record(spec: CompressorSpec, state: PolicyState) -> bool:
    """Whether ``spec`` is judged on the job's record rather than an estimate alone: it ran in
    this job (its efficiency or its step time was measured), or its error is known (``none``
    and the casts, whose step time is the cost model's alone until they run)."""
    return (not _lossy(spec) or spec.label in dict(state.measured)
            or spec.label in residuals(state.corrections))


def explore_on_clear_gain(best: Scored, best_on_record: Scored | None, cfg: PolicyConfig) -> Scored:
    """``best``, unless it is a lossy choice the job has not run and it saves no more than
    ``gain_threshold`` of the time per progress of ``best_on_record`` (the best option judged
    on record, :func:`judged_on_record`): then that one.

    Why: an estimate errs optimistic (a family's best case, or a share borrowed from another
    family: ``planning.progress.calibrated_errors``), and the threshold that keeps the policy
    from moving on a gain its inputs cannot resolve held only against the running choice, not
    between two others. On the benchmark's oscillating link (session 33, seed 0) the policy,
    leaving fp16 for a slow stretch, judged on the mix ACP-SGD r8 (never run: error 0.499 by
    PowerSGD's share) 1.6 % ahead of PowerSGD r4 (run for 50 steps: error 0.446, its measured
    step), took ACP-SGD r8, kept it to the end and missed the target that fixed PowerSGD r4
    reached; ACP-SGD's ranks train worse than their update efficiency says (ACP-SGD r16 never
    reached the target on five seeds at an efficiency of 0.72-0.78, PowerSGD r4 on four of
    five at 0.79-0.83: README, "Seeds instead of repeats"). Exploring still happens where the
    estimate promises a clear gain: the first lossy choice on a slow link is predicted far
    ahead of the casts (29 % in the same run)."""
    if best_on_record is None or best_on_record.label == best.label or not _lossy(best.spec):
        return best
    return best if gain(best_on_record, best) > cfg.gain_threshold else best_on_record


def gain(current: Scored, best: Scored) -> float:
    """Fraction of the current time per progress that ``best`` is predicted to save (with no
    errors measured, of the current step time)."""
    if not math.isfinite(current.tau):
        return 1.0
    return (current.tau - best.tau) / current.tau if current.tau > 0 else 0.0



def switch(
    spec: CompressorSpec,
    current: Scored,
    best: Scored,
    reason: str,
    state: PolicyState,
    now: float,
) -> tuple[Switch, PolicyState]:
    decision = Switch(spec=spec, gain=gain(current, best), current_step_s=current.step_s,
                      new_step_s=best.step_s, reason=reason)
    trial = spec.label if spec.label not in dict(state.measured) else None
    left, last_move = state.left, None
    if not _lossy(current.spec) and not _lossy(spec):
        left = tuple(dict.fromkeys((*left, current.label)))
        if not _reverses_last_move(state, current.label, spec.label):  # an undo cannot be undone
            last_move = (current.label, spec.label)
    return decision, dataclasses.replace(state, last_switch_at=now, awaiting=spec.label, trial=trial, left=left,
                                         last_move=last_move, switches=state.switches + 1)
