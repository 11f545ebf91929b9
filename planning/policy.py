"""Adaptive choice of compressor and rank: a pure function from measurements to a decision.

The coordinator (torch-free) and rank 0 of a job without a coordinator call
:func:`decide` with each telemetry report. It reads no clock and does no I/O: the time is
passed in as ``now`` and everything it remembers between calls lives in the returned
:class:`PolicyState`, so it can be tested on synthetic traces with a fake clock.

Algorithm of :func:`decide`:

1. **Smooth the link** (``planning.link_smoothing``). Bandwidth is averaged in log space with
   a time-based EWMA (half-life ``bandwidth_half_life_s``), so ±30 % noise moves the estimate
   by a few percent; ``level_shift_reports`` samples in a row off by more than
   ``level_shift_factor`` on one side move it at once (a real collapse is followed within two
   reports, a lone spike is ignored), and so does one report that brings a drop the workers
   read on every rank (``Measurements.link_drop_step``). Latency uses a plain EWMA with the same weight.
2. **Detect a critical regime** (Accordion's signal): the relative change of the gradient norm
   between reports ``|‖g_t‖ − ‖g_{t−1}‖| / ‖g_{t−1}‖ ≥ critical_grad_change`` starts one that
   lasts ``critical_hold_s``; the first ``critical_initial_steps`` steps are critical too.
3. **Quality guard.** Always: the compressor is allowed and a low rank lies in
   ``[min_rank, max_rank]``. In a critical regime, additionally: low-rank compressors need
   rank ≥ ``min(critical_rank_factor · min_rank, max_rank)``, and top-k and sign (lossy without
   a rank to raise) are excluded; none/fp16/bf16 stay allowed. If nothing allowed passes the
   critical guard, the ordinary guard applies.
4. **Predict** every candidate that passes the guard, and the current choice, with
   :func:`planning.costmodel.predict_step` at the smoothed link (``planning.scoring``), and
   weigh it by its measured compression error (``Measurements.errors``, from
   ``compressors.quality``):
   the objective is progress per second, ``δ(ε) / step_s`` (:mod:`planning.progress`),
   i.e. the candidate with the least *time per unit of progress* ``τ = step_s / δ`` wins
   (ties go to the less lossy one). Estimates are calibrated by what the running
   compressor really loses (``Measurements.running_efficiency``: the running choice's
   measured update efficiency, the cosine of its update with the gradient, averaged per
   label in the state and judged as the error whose contraction it is;
   :func:`planning.progress.calibrated_errors`). A lossy candidate with no error is not
   chosen while other candidates have one; with no errors at all, ``τ`` is the step time
   (the policy of before the quality signal). **An oscillating link** is judged on the mix
   of its levels (``planning.link_levels``): each report records which side the policy would
   be on for the link as it stands, lossy or uncompressed (``planning.hysteresis.side``); a level changes
   when that side and the averaged bandwidth move together. While the last
   ``oscillation_shifts`` changes came within ``oscillation_window_dwells`` dwells of one
   another (and the sides' levels lie ``level_shift_factor²`` apart), every candidate's step
   time is averaged over the link's stretches in that span, weighted by the steps run at
   each, so the policy settles on the one choice that serves the mix instead of following
   each phase late.
5. **Hysteresis.** If the current choice fails the guard, switch at once (quality first).
   Otherwise switch only when the predicted gain ``(τ_current − τ_best) / τ_current`` (the
   share of time to accuracy saved) exceeds ``gain_threshold`` (``known_error_gain_threshold``
   to one of ``none`` and the casts, whose error is known, that the job has not left before,
   unless from a lossy choice that steps faster: ``planning.hysteresis.threshold``) and at least ``min_dwell_s``
   passed since the last switch, counted again from when it took effect (the first report
   of a step it ran; on a slow link the workers apply a decision seconds after it is made).
   ``τ_current`` gives the running choice the benefit of the doubt: its averaged efficiency
   plus one standard error of its noisy samples. A choice made on an estimate alone (it had
   not run) is on trial: once two exchanges have measured it, the dwell no longer holds it.
   A lossy candidate the job has not run is chosen over the best one judged on record (one
   that ran, or ``none`` and the casts, whose error is known) only when it is predicted to save
   more than ``gain_threshold`` of that one's time per progress
   (``planning.hysteresis.explore_on_clear_gain``). A move between ``none`` and the casts to
   one that sends more bytes must also pass its threshold over the link's stretches of the
   last oscillation window (:func:`planning.recent_link.loses_on_recent_link`): a link that
   dropped lately may drop again.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Iterable

from planning import hysteresis, registry
from planning.hysteresis import without_dwell
from planning.link import describe_rate
from planning.link_levels import LevelMix, level_mix, record_level, record_stretch, steps_mix
from planning.link_smoothing import fold_sample
from planning.policy_types import Keep, Links, Measurements, PolicyConfig, PolicyState, Scored, Switch, Verdict
from planning.progress import calibrated_errors, record_running, record_spread
from planning.recent_link import loses_on_recent_link
from planning.scoring import bandwidth_of, least_tau, link_at, link_now, predicted_step, score
from planning.spec import CompressorSpec
from planning.step_correction import LINK_SENSITIVE, MAX_RESIDUAL, MIN_TIMED_STEPS, record_residual

__all__ = ["Keep", "Measurements", "PolicyConfig", "PolicyState", "Switch", "Verdict", "adopt_settings", "decide",
           "guard_failure", "without_dwell"]


# --------------------------------------------------------------------------------------------
# Step 1: smoothing
# --------------------------------------------------------------------------------------------


def _smooth_link(state: PolicyState, m: Measurements, cfg: PolicyConfig, now: float) -> PolicyState:
    """Fold this report's bandwidth and latency into the averages (step 1)."""
    folded = fold_sample(state.link, m.bandwidth_bytes_per_second, m.latency_s, now, cfg.link_smoothing,
                         m.link_drop_step)
    return dataclasses.replace(state, link=folded)


# --------------------------------------------------------------------------------------------
# Steps 2-3: critical regime and quality guard
# --------------------------------------------------------------------------------------------


def _critical_regime(
    state: PolicyState, m: Measurements, cfg: PolicyConfig, now: float
) -> tuple[str | None, PolicyState]:
    """Why this report is in a critical regime (``None`` if it is not), and the new state."""
    critical_until = state.critical_until
    why = None
    if m.grad_norm is not None and state.last_grad_norm:
        change = abs(m.grad_norm - state.last_grad_norm) / state.last_grad_norm
        if change >= cfg.critical_grad_change:
            critical_until = now + cfg.critical_hold_s
            why = f"gradient norm changed {change:.0%} since the last report"
    if why is None and critical_until is not None and now < critical_until:
        why = f"critical regime holds {critical_until - now:.0f} s more"
    if why is None and m.step is not None and m.step < cfg.critical_initial_steps:
        why = f"step {m.step} is within the first {cfg.critical_initial_steps} steps"
    last_norm = m.grad_norm if m.grad_norm is not None else state.last_grad_norm
    return why, dataclasses.replace(state, critical_until=critical_until, last_grad_norm=last_norm)


def guard_failure(spec: CompressorSpec, cfg: PolicyConfig, critical: bool) -> str | None:
    """Why ``spec`` fails the quality guard, or ``None`` when it passes (see step 3)."""
    if spec.name not in cfg.allowed:
        return f"{spec.name} is not among the allowed compressors"
    description = registry.codec(spec.name)
    if spec.rank is not None:
        low = cfg.critical_min_rank if critical else cfg.min_rank
        if not low <= spec.rank <= cfg.max_rank:
            regime = "in a critical regime " if critical else ""
            return f"rank {spec.rank} is outside [{low}, {cfg.max_rank}] {regime}".rstrip()
    elif critical and description.too_lossy_when_critical:
        return f"{spec.name} is too lossy for a critical regime"
    return None


def _same_choice(a: CompressorSpec, b: CompressorSpec) -> bool:
    return (a.name, a.rank, a.ratio) == (b.name, b.rank, b.ratio)


def adopt_settings(candidate: CompressorSpec, current: CompressorSpec) -> CompressorSpec:
    """The candidate with the current spec's common settings (the policy changes only the
    compressor and its rank or ratio)."""
    return dataclasses.replace(
        candidate,
        warmup_steps=current.warmup_steps,
        min_compress_numel=current.min_compress_numel,
        seed=current.seed,
    )


# --------------------------------------------------------------------------------------------
# Steps 4-5: prediction and hysteresis
# --------------------------------------------------------------------------------------------


def _best_move(options: list[CompressorSpec], m: Measurements, links: Links, state: PolicyState,
               cfg: PolicyConfig) -> Scored | None:
    """The option the policy would move to on ``links``: the least time per progress, unless it is an
    estimate alone that does not clearly beat the best option on record
    (``planning.hysteresis.explore_on_clear_gain``), then that one.

    Why the level history records this one's side too, not the plain best's: the side is
    meant to change only with a move the policy would make (``planning.hysteresis.side``). On
    the benchmark's oscillating link (session 33's kept runs, seed 4) ``none``'s measured step
    rose with the first slow steps before the link's reading fell, an unexplored ACP-SGD rank
    became the plain best at the fast reading, and the level in progress turned lossy while the
    policy kept to the casts; when the reading fell a moment later no new level began, the
    "link dropped" release of the dwell did not fire, and ``none`` ran 7 more slow steps
    (0.8 s, each 4x PowerSGD r4's) until the dwell ran out.

    Every option is scored once: the best on record is picked among the same scores."""
    scored = [score(spec, m, links, cfg.level_shift_factor) for spec in options]
    best = least_tau(scored)
    if best is None or hysteresis.judged_on_record(best.spec, state):
        return best
    on_record = least_tau(s for s in scored if hysteresis.judged_on_record(s.spec, state))
    return hysteresis.explore_on_clear_gain(best, on_record, cfg)


def _keep_s(cfg: PolicyConfig) -> float:
    """How far back the link's histories reach: as far as
    :func:`planning.link_levels.level_mix` looks, ``oscillation_shifts`` windows."""
    return cfg.oscillation_shifts * cfg.oscillation_window_s


def _record_stretch(state: PolicyState, m: Measurements, cfg: PolicyConfig, now: float) -> PolicyState:
    """The stretch history with this report's averaged link. Steps that went back (a job
    resumed from a checkpoint) start it and the level history afresh: weights by steps would
    be negative across the jump."""
    levels, stretches = state.levels, state.stretches
    if m.step is not None and stretches and stretches[-1].since_step is not None and m.step < stretches[-1].since_step:
        levels, stretches = (), ()
    stretches = record_stretch(stretches, state.link.bandwidth, now, m.step, cfg.level_shift_factor, _keep_s(cfg))
    return dataclasses.replace(state, levels=levels, stretches=stretches)


def _record_level(state: PolicyState, m: Measurements, cfg: PolicyConfig, now: float,
                  lossy: bool | None) -> PolicyState:
    """The level history with this report (``lossy``: the side the policy would be on; None:
    unknown, the level in progress keeps its side)."""
    if lossy is None:
        if not state.levels:
            return state
        lossy = state.levels[-1].lossy
    return dataclasses.replace(state, levels=record_level(state.levels, state.link.bandwidth, lossy, now, m.step,
                                                          cfg.level_shift_factor, _keep_s(cfg)))


def _judge_on_levels(state: PolicyState, m: Measurements, cfg: PolicyConfig, now: float,
                     best_now: Scored) -> tuple[PolicyState, Links, LevelMix | None, Scored]:
    """Record which side the policy would be on for the link as it stands (lossy or not,
    ``planning.hysteresis.side``; ``best_now``: the option it would move to there, :func:`_best_move`), and the links to judge on: the link
    as it stands, or the mix of its stretches when the link oscillates
    (``planning.link_levels``); with the current choice scored on them (with the doubt in
    its favour)."""
    current_now = score(m.current, hysteresis.doubt_in_favour(m, state), link_now(state, m), cfg.level_shift_factor)
    state = _record_level(state, m, cfg, now, hysteresis.side(best_now, current_now, hysteresis.threshold(current_now, best_now, state, cfg)))
    mix = level_mix(state.levels, state.stretches, now, m.step, cfg.oscillation_window_s, cfg.oscillation_shifts,
                    cfg.level_shift_factor ** 2)
    if mix is None:
        return state, link_now(state, m), None, current_now
    links = tuple((share, link_at(s.bandwidth, state, m)) for share, s in zip(mix.shares, mix.stretches))
    return state, links, mix, score(m.current, hysteresis.doubt_in_favour(m, state), links, cfg.level_shift_factor)


def _fold_step_residual(state: PolicyState, m: Measurements, pool: Iterable[CompressorSpec],
                        cfg: PolicyConfig) -> PolicyState:
    """Fold the running choice's measured step time, against the cost model's prediction over
    the same steps, into its correction (``planning.step_correction``). Left as they were by a
    report whose mean covers too few steps, that names a choice neither current nor in the
    pool, that falls within the job's warm-up (its steps ran uncompressed whatever the report
    names), or that comes while the link's average holds back a suspected shift (the link may
    have moved under the window already).

    So does one whose steps met levels of the link at which the choice's predicted step
    differs by more than ``LINK_SENSITIVE``: which steps ran at which level is known only
    from the averaged link, which lags the real one by several steps, and on the benchmark's
    oscillating link fp16's residual over such windows ranged from −0.015 to +0.004 s
    (10th to 90th percentile, ±20 % of its step; session 21's runs), while PowerSGD r8's,
    whose step hardly depends on the link, lay within +0.000 to +0.008 s at either level.

    And not a mean further than ``MAX_RESIDUAL`` of the prediction from it: the residuals seen
    at one level were within 40 % of a step; one far beyond is a window the averaged link placed on the wrong
    level (the link fell before the average did), and folded it would price the choice for good
    (the correction of a label that stops running is kept as it was)."""
    if (m.measured_step_s is None or m.measured_steps is None or m.measured_steps < MIN_TIMED_STEPS
            or m.running is None or state.link.pending):
        return state
    spec = next((c for c in (m.current, *pool) if c.label == m.running), None)
    if spec is None or (m.step is not None and m.step <= spec.warmup_steps):
        return state
    mix = steps_mix(state.stretches, m.step, m.measured_steps)
    links = link_now(state, m) if mix is None else tuple((share, link_at(b, state, m)) for share, b in mix)
    predictions = [predicted_step(spec, m, link) for _, link in links]
    if max(predictions) > (1 + LINK_SENSITIVE) * min(predictions):
        return state
    predicted = math.fsum(share * p for (share, _), p in zip(links, predictions))
    if abs(m.measured_step_s - predicted) > MAX_RESIDUAL * predicted:
        return state
    # The level it was measured at: the steps' links, averaged in log space by their shares (a
    # window that met two stretches is folded only for a choice whose step hardly depends on the
    # link, above). Why not the stretch most of its steps ran at: on a fast link the readings
    # scatter over stretches a factor 2 apart (2-13 Gbit/s on a 1 Gbit/s link), and each would
    # start a level of its own from one report's residual; so recorded, the replay of 20 kept
    # adaptive runs (session 38) changed the switches of 7 (none to fp16 on the steady fast link
    # in two, early moves to fp16 on fast-slow-fast's first fast stretch), where session 37's
    # policy and this one, by the log-mean, make the same switches in all 20.
    bandwidth = math.exp(math.fsum(share * math.log(bandwidth_of(link)) for share, link in links))
    return dataclasses.replace(state, corrections=record_residual(state.corrections, spec.label, m.measured_step_s,
                                                                  predicted, bandwidth, cfg.level_shift_factor))


def decide(
    state: PolicyState, m: Measurements, cfg: PolicyConfig, now: float
) -> tuple[Verdict, PolicyState]:
    """Keep the current compressor or switch; returns the verdict and the next state."""
    state = _smooth_link(state, m, cfg, now)
    state = _record_stretch(state, m, cfg, now)
    state = hysteresis.switch_took_effect(state, m, now)
    critical_why, state = _critical_regime(state, m, cfg, now)
    if m.running_efficiency is not None:
        state = dataclasses.replace(state, spread=record_spread(state.spread, state.measured, *m.running_efficiency),
                                    measured=record_running(state.measured, *m.running_efficiency))
    m = dataclasses.replace(m, errors=calibrated_errors(m.errors, state.measured))

    pool = [adopt_settings(c, m.current) for c in cfg.candidates()]
    state = _fold_step_residual(state, m, pool, cfg)
    m = dataclasses.replace(m, step_corrections=state.corrections)
    critical = critical_why is not None and any(guard_failure(c, cfg, True) is None for c in pool)
    passing = [c for c in pool if guard_failure(c, cfg, critical) is None]
    best = _best_move(passing, m, link_now(state, m), state, cfg) if passing else None
    if best is None:
        state = _record_level(state, m, cfg, now, None)
        current = score(m.current, m, link_now(state, m), cfg.level_shift_factor)
        why = "no candidate passes the quality guard" if not passing else "no passing candidate has a measured error yet"
        return Keep(why, current.step_s), state
    state, links, mix, current = _judge_on_levels(state, m, cfg, now, best)
    if mix is not None:
        mixed = _best_move(passing, m, links, state, cfg)
        assert mixed is not None  # whether τ is finite depends on the errors, not on the link
        best = mixed
    assert state.link.bandwidth is not None
    context = f"at {describe_rate(state.link.bandwidth)}, {m.world_size} workers"
    if mix is not None:
        context += f"; {mix.describe()}"
    if critical:
        context += f"; critical regime: {critical_why}"
    elif critical_why is not None:
        context += f"; critical regime ({critical_why}) ignored: no allowed option passes its guard"
    objective = "fastest" if m.errors is None else "most progress per second"

    failure = guard_failure(m.current, cfg, critical)
    if failure is not None:
        reason = f"quality guard: {failure}; {best.describe()} is the {objective} that passes ({context})"
        return hysteresis.switch(best.spec, current, best, reason, state, now)
    if _same_choice(best.spec, m.current):
        return Keep(f"{current.describe()} is predicted {objective} ({context})", current.step_s), state

    gain = hysteresis.gain(current, best)
    saving = "faster" if m.errors is None else "less time per progress"
    comparison = f"{best.describe('predicted ')} vs {current.describe()} ({gain:.1%} {saving}, {context})"
    threshold = hysteresis.threshold(current, best, state, cfg)
    if gain <= threshold:
        return Keep(f"{comparison}; below the {threshold:.0%} threshold", current.step_s), state
    exposed = None if mix is not None else loses_on_recent_link(current, best, m, state, cfg, now, threshold)
    if exposed is not None:
        return Keep(f"{comparison}; {exposed}", current.step_s), state
    if state.last_switch_at is not None and now - state.last_switch_at < cfg.min_dwell_s:
        waited = now - state.last_switch_at
        if hysteresis.trial_measured(state, m.current.label):
            return hysteresis.switch(best.spec, current, best, f"{comparison}; {m.current.label} was chosen on an estimate "
                           f"and two exchanges have measured it: its dwell ends early ({waited:.0f} s)", state, now)
        if hysteresis.link_dropped_since_switch(state, m.current):
            return hysteresis.switch(best.spec, current, best, f"{comparison}; the link dropped to another level since "
                           f"the last switch: its dwell ends early ({waited:.0f} s)", state, now)
        return Keep(f"{comparison}; last switch {waited:.0f} s ago (min dwell {cfg.min_dwell_s:.0f} s)",
                    current.step_s), state
    return hysteresis.switch(best.spec, current, best, comparison, state, now)


