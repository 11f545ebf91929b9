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
   reports, a lone spike is ignored). Latency uses a plain EWMA with the same weight.
2. **Detect a critical regime** (Accordion's signal): the relative change of the gradient norm
   between reports ``|‖g_t‖ − ‖g_{t−1}‖| / ‖g_{t−1}‖ ≥ critical_grad_change`` starts one that
   lasts ``critical_hold_s``; the first ``critical_initial_steps`` steps are critical too.
3. **Quality guard.** Always: the compressor is allowed and a low rank lies in
   ``[min_rank, max_rank]``. In a critical regime, additionally: low-rank compressors need
   rank ≥ ``min(critical_rank_factor · min_rank, max_rank)``, and top-k and sign (lossy without
   a rank to raise) are excluded; none/fp16/bf16 stay allowed. If nothing allowed passes the
   critical guard, the ordinary guard applies.
4. **Predict** every candidate that passes the guard, and the current choice, with
   :func:`planning.costmodel.predict_step` at the smoothed link, and weigh it by its
   measured compression error (``Measurements.errors``, from ``compressors.quality``):
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
   be on for the link as it stands, lossy or uncompressed (:func:`_side`); a level changes
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
   unless from a lossy choice that steps faster: :func:`_threshold`) and at least ``min_dwell_s``
   passed since the last switch, counted again from when it took effect (the first report
   of a step it ran; on a slow link the workers apply a decision seconds after it is made).
   ``τ_current`` gives the running choice the benefit of the doubt: its averaged efficiency
   plus one standard error of its noisy samples. A choice made on an estimate alone (it had
   not run) is on trial: once two exchanges have measured it, the dwell no longer holds it.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Union

from planning import registry
from planning.costmodel import (
    DEFAULT_TOPK_RATIOS,
    Link,
    StepProfile,
    alpha_beta_from_bandwidth,
    candidates,
    predict_step,
)
from planning.link import describe_rate
from planning.link_levels import (
    LevelHistory,
    LevelMix,
    StretchHistory,
    level_mix,
    record_level,
    record_stretch,
    steps_mix,
)
from planning.link_smoothing import LinkAverage, LinkSmoothing, fold_sample
from planning.progress import (
    Measured,
    Spread,
    calibrated_errors,
    contraction,
    error_of,
    error_of_efficiency,
    record_running,
    record_spread,
    seconds_per_progress,
    standard_error,
    standard_error_weight,
)
from planning.spec import CompressorSpec
from planning.step_correction import (
    LINK_SENSITIVE,
    MAX_RESIDUAL,
    MIN_TIMED_STEPS,
    Corrections,
    correction_for,
    record_residual,
)


@dataclass(frozen=True)
class PolicyConfig:
    """Bounds and hysteresis of the adaptive policy (validated on construction)."""

    #: Default: every compressor in the registry.
    allowed: tuple[str, ...] = field(default_factory=registry.names)
    min_rank: int = 1
    max_rank: int = 64
    topk_ratios: tuple[float, ...] = DEFAULT_TOPK_RATIOS
    #: Switch only for a predicted step-time saving above this fraction of the current step.
    gain_threshold: float = 0.10
    #: The same between choices whose error is known (``none`` and the casts): see :func:`_threshold`.
    known_error_gain_threshold: float = 0.02
    #: Seconds that must pass after a switch before the next one (quality fixes excepted).
    min_dwell_s: float = 30.0
    bandwidth_half_life_s: float = 5.0
    level_shift_factor: float = 2.0
    level_shift_reports: int = 2
    #: Relative gradient-norm change between reports that starts a critical regime.
    critical_grad_change: float = 0.5
    critical_hold_s: float = 30.0
    critical_initial_steps: int = 100
    critical_rank_factor: int = 4
    #: The link oscillates while its last this many changes of level (the side the policy would
    #: be on, lossy or not, moving with the bandwidth) each came within
    #: ``oscillation_window_dwells`` dwells of the one before; candidates are then judged on
    #: the mix of the link's stretches (``planning.link_levels.level_mix``).
    oscillation_shifts: int = 3
    oscillation_window_dwells: float = 4.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "allowed", tuple(self.allowed))
        object.__setattr__(self, "topk_ratios", tuple(float(q) for q in self.topk_ratios))
        if not self.allowed:
            raise ValueError("allowed: must name at least one compressor")
        for name in self.allowed:
            if registry.unknown_name(name):
                raise ValueError(f"allowed: unknown compressor {name!r}")
        if not 1 <= self.min_rank <= self.max_rank:
            raise ValueError(f"min_rank: must be in [1, max_rank={self.max_rank}], got {self.min_rank}")
        if any(not 0 < q <= 1 for q in self.topk_ratios):
            raise ValueError(f"topk_ratios: each must be in (0, 1], got {self.topk_ratios}")
        for name in ("gain_threshold", "known_error_gain_threshold", "min_dwell_s", "critical_hold_s", "critical_grad_change"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name}: must be >= 0, got {getattr(self, name)!r}")
        if not self.bandwidth_half_life_s > 0:
            raise ValueError(f"bandwidth_half_life_s: must be > 0, got {self.bandwidth_half_life_s!r}")
        if not self.level_shift_factor > 1:
            raise ValueError(f"level_shift_factor: must be > 1, got {self.level_shift_factor!r}")
        if self.level_shift_reports < 1:
            raise ValueError(f"level_shift_reports: must be >= 1, got {self.level_shift_reports}")
        if self.critical_rank_factor < 1:
            raise ValueError(f"critical_rank_factor: must be >= 1, got {self.critical_rank_factor}")
        if self.oscillation_shifts < 2:
            raise ValueError(f"oscillation_shifts: must be >= 2, got {self.oscillation_shifts}")
        if not self.oscillation_window_dwells >= 0:
            raise ValueError(f"oscillation_window_dwells: must be >= 0, got {self.oscillation_window_dwells!r}")

    @property
    def link_smoothing(self) -> LinkSmoothing:
        """How the link's samples are averaged (step 1)."""
        return LinkSmoothing(self.bandwidth_half_life_s, self.level_shift_factor, self.level_shift_reports)

    @property
    def oscillation_window_s(self) -> float:
        """How far back level shifts count towards an oscillating link (step 4)."""
        return self.oscillation_window_dwells * self.min_dwell_s

    def candidates(self) -> tuple[CompressorSpec, ...]:
        """Every candidate within these bounds (``planning.costmodel.candidates``)."""
        return candidates(self.allowed, self.min_rank, self.max_rank, self.topk_ratios)

    @property
    def critical_min_rank(self) -> int:
        """The lowest rank allowed in a critical regime."""
        return min(self.max_rank, self.critical_rank_factor * self.min_rank)


@dataclass(frozen=True)
class Measurements:
    """One report's view of the job: link, cluster size, model, and what runs now.

    ``latency_s`` is what the telemetry reports (``workers.link_estimate.LinkEstimate.latency_s``):
    the time of a zero-byte all-reduce on the whole group, ``2(N−1)·α``, not α itself.
    ``wake_s`` is the probe's wake-up cost of a collective on an idle link
    (``planning.costmodel.Link.wake_s``).
    """

    bandwidth_bytes_per_second: float
    latency_s: float
    world_size: int
    profile: StepProfile
    current: CompressorSpec
    grad_norm: float | None = None
    step: int | None = None
    wake_s: float = 0.0
    #: Relative compression error by candidate label (``compressors.quality.estimate_errors``);
    #: None: unknown, judge by step time alone.
    errors: Mapping[str, float] | None = None
    #: (label, δ) of the compressor that ran the reported step: its measured update
    #: efficiency, a cosine (``compressors.quality.update_efficiency``), else ``1 − ε²`` of its
    #: relative error (``planning.progress.contraction``).
    running_efficiency: tuple[str, float] | None = None
    #: The label of the compressor that ran the reported step (None: not reported). It
    #: differs from ``current`` between a switch and the step the workers apply it at.
    running: str | None = None
    #: The measured mean wall seconds per step over the last ``measured_steps`` steps, all
    #: run by ``running`` (``Telemetry.step_wall_seconds``; None: not reported): what
    #: calibrates the predicted step times. ``measured_steps`` counts the intervals the mean
    #: spans, one fewer than the window's ``Telemetry.timed_steps``.
    measured_step_s: float | None = None
    measured_steps: int | None = None
    #: Seconds to add to each label's predicted step (``planning.step_correction``): what
    #: :func:`decide` keeps in its state replaces a caller's value (as the calibrated errors do).
    step_corrections: Corrections = ()


@dataclass(frozen=True)
class PolicyState:
    """What :func:`decide` remembers between calls; start with ``PolicyState()``."""

    #: The link's averaged bandwidth and latency (``planning.link_smoothing``).
    link: LinkAverage = LinkAverage()
    #: The levels the averaged link went through lately, and its stretches (``planning.link_levels``).
    levels: LevelHistory = ()
    stretches: StretchHistory = ()
    last_grad_norm: float | None = None
    critical_until: float | None = None
    last_switch_at: float | None = None
    #: The label switched to, until a report shows a step it ran: the dwell restarts then.
    awaiting: str | None = None
    #: The label switched to on an estimate alone (it had no running measurement then), until
    #: the next switch: its dwell ends early once it has been measured (see :func:`_trial_measured`).
    trial: str | None = None
    #: The known-error labels (``none``, the casts) that switches moved away from for another
    #: of them, since the last release or change of world size: going back to one takes the full
    #: threshold (:func:`_threshold`). A move to a lossy choice records nothing.
    left: tuple[str, ...] = ()
    #: The last switch, (from, to), when it went between two known-error choices and was no
    #: undo itself (:func:`_undo`); None after any other switch.
    last_move: tuple[str, str] | None = None
    switches: int = 0
    #: Averaged running efficiency of every label that has run (``planning.progress``).
    measured: Measured = ()
    #: The variance of each label's efficiency samples (``planning.progress.record_spread``).
    spread: Spread = ()
    #: Each label's averaged measured-minus-predicted step time (``planning.step_correction``).
    corrections: Corrections = ()


@dataclass(frozen=True)
class Keep:
    """Stay with the current choice. ``predicted_step_s``: the cost model's step time with
    the correction the job's measured step times give (``planning.step_correction``)."""

    reason: str
    predicted_step_s: float | None = None


@dataclass(frozen=True)
class Switch:
    """Change to ``spec``; ``gain`` is the predicted fraction of time per progress saved (of
    step time when no errors are measured; may be < 0 when the quality guard forces a
    slower choice). The step times are the cost model's with the correction the job's
    measured step times give (``planning.step_correction``)."""

    spec: CompressorSpec
    gain: float
    current_step_s: float
    new_step_s: float
    reason: str


#: What :func:`decide` returns; ``planning.controller`` turns a ``Switch`` into the next
#: versioned ``planning.decision.Decision``.
Verdict = Union[Keep, Switch]


# --------------------------------------------------------------------------------------------
# Step 1: smoothing
# --------------------------------------------------------------------------------------------


def _smooth_link(state: PolicyState, m: Measurements, cfg: PolicyConfig, now: float) -> PolicyState:
    """Fold this report's bandwidth and latency into the averages (step 1)."""
    folded = fold_sample(state.link, m.bandwidth_bytes_per_second, m.latency_s, now, cfg.link_smoothing)
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


@dataclass(frozen=True)
class _Scored:
    """A candidate's predicted step and its time per unit of progress (step 4)."""

    spec: CompressorSpec
    label: str
    step_s: float  # predicted and corrected by the measured, averaged over the links it is judged on
    error: float | None
    tau: float  # seconds per uncompressed-step-equivalent of progress

    def describe(self, verb: str = "") -> str:
        lost = "" if self.error is None else f", error {self.error:.3g}"
        return f"{self.label} {verb}{self.step_s:.4g} s/step{lost}"


#: The links a candidate is judged on, each with its share of the steps (one link: share 1;
#: an oscillating link: the mix of its levels, ``planning.link_levels``).
Links = tuple[tuple[float, Link], ...]


def _predicted_step(spec: CompressorSpec, m: Measurements, links: Links) -> float:
    """The cost model's step time of ``spec``, averaged over ``links`` by their shares."""
    return math.fsum(share * predict_step(spec, m.profile, m.world_size, link).step_s for share, link in links)


def _score(spec: CompressorSpec, m: Measurements, links: Links) -> _Scored:
    """``spec``'s step time, the prediction corrected by what the job measured
    (``planning.step_correction``), and its time per progress. A correction never takes more
    than half of a prediction away: a measured mean the link's smoothing placed on the wrong
    level can lie far below the model for a while."""
    predicted = _predicted_step(spec, m, links)
    step_s = max(0.5 * predicted, predicted + correction_for(m.step_corrections, spec.label))
    if m.errors is None:
        return _Scored(spec, spec.label, step_s, None, step_s)
    error = error_of(spec.label, spec.name, m.errors)
    tau = math.inf if error is None else seconds_per_progress(step_s, error)
    return _Scored(spec, spec.label, step_s, error, tau)


def _best(options: Iterable[CompressorSpec], m: Measurements, links: Links) -> _Scored | None:
    """The option with the least time per progress; ``min`` keeps the first (least lossy) of
    equal ones. None when no option can be judged (every one lossy and unmeasured)."""
    scored = [_score(spec, m, links) for spec in options]
    judged = [s for s in scored if math.isfinite(s.tau)]
    return min(judged, key=lambda s: s.tau) if judged else None


def _link_now(state: PolicyState, m: Measurements) -> Links:
    """The averaged link as it stands, share 1."""
    bandwidth, latency = state.link.bandwidth, state.link.latency
    assert bandwidth is not None and latency is not None
    return ((1.0, _link_at(bandwidth, state, m)),)


def _link_at(bandwidth: float, state: PolicyState, m: Measurements) -> Link:
    assert state.link.latency is not None
    return alpha_beta_from_bandwidth(bandwidth, alpha_of(state.link.latency, m.world_size))._replace(wake_s=m.wake_s)


def _lossy(spec: CompressorSpec) -> bool:
    """Whether ``spec`` is a lossy compressor (not ``none`` or a cast, whose error is known)."""
    return registry.is_lossy(spec.name)


def _side(best: _Scored, current: _Scored, threshold: float) -> bool:
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
    return _lossy(best.spec) if _gain(current, best) > threshold else _lossy(current.spec)


def _threshold(current: _Scored, best: _Scored, state: PolicyState, cfg: PolicyConfig) -> float:
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


def _undo(current: _Scored, best: _Scored, state: PolicyState) -> bool:
    """Whether moving to ``best`` undoes the last switch, a move between two known-error
    choices from ``best`` to ``current`` (``PolicyState.last_move``), once both have their own
    measured step time (``planning.step_correction``). The small threshold then holds back as
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
    measured = dict(state.corrections)
    return _reverses_last_move(state, current.label, best.label) and current.label in measured and best.label in measured


def _reverses_last_move(state: PolicyState, from_label: str, to_label: str) -> bool:
    """Whether a move from ``from_label`` to ``to_label`` goes straight back along
    ``state.last_move``."""
    return state.last_move == (to_label, from_label)


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
                     best_now: _Scored) -> tuple[PolicyState, Links, LevelMix | None, _Scored]:
    """Record which side the policy would be on for the link as it stands (lossy or not,
    :func:`_side`; ``best_now``: the best option there), and the links to judge on: the link
    as it stands, or the mix of its stretches when the link oscillates
    (``planning.link_levels``); with the current choice scored on them (with the doubt in
    its favour)."""
    current_now = _score(m.current, _doubt_in_favour(m, state), _link_now(state, m))
    state = _record_level(state, m, cfg, now, _side(best_now, current_now, _threshold(current_now, best_now, state, cfg)))
    mix = level_mix(state.levels, state.stretches, now, m.step, cfg.oscillation_window_s, cfg.oscillation_shifts,
                    cfg.level_shift_factor ** 2)
    if mix is None:
        return state, _link_now(state, m), None, current_now
    links = tuple((share, _link_at(s.bandwidth, state, m)) for share, s in zip(mix.shares, mix.stretches))
    return state, links, mix, _score(m.current, _doubt_in_favour(m, state), links)


def _fold_step_residual(state: PolicyState, m: Measurements, pool: Iterable[CompressorSpec]) -> PolicyState:
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
    links = _link_now(state, m) if mix is None else tuple((share, _link_at(b, state, m)) for share, b in mix)
    predictions = [_predicted_step(spec, m, ((1.0, link),)) for _, link in links]
    if max(predictions) > (1 + LINK_SENSITIVE) * min(predictions):
        return state
    predicted = math.fsum(share * p for (share, _), p in zip(links, predictions))
    if abs(m.measured_step_s - predicted) > MAX_RESIDUAL * predicted:
        return state
    return dataclasses.replace(state, corrections=record_residual(state.corrections, spec.label,
                                                                  m.measured_step_s, predicted))


def alpha_of(all_reduce_latency_s: float, world_size: int) -> float:
    """α from a zero-byte all-reduce's time ``2(N−1)·α`` (ring model; no link for N = 1)."""
    return all_reduce_latency_s / (2 * (world_size - 1)) if world_size > 1 else 0.0


def decide(
    state: PolicyState, m: Measurements, cfg: PolicyConfig, now: float
) -> tuple[Verdict, PolicyState]:
    """Keep the current compressor or switch; returns the verdict and the next state."""
    state = _smooth_link(state, m, cfg, now)
    state = _record_stretch(state, m, cfg, now)
    state = _switch_took_effect(state, m, now)
    critical_why, state = _critical_regime(state, m, cfg, now)
    if m.running_efficiency is not None:
        state = dataclasses.replace(state, spread=record_spread(state.spread, state.measured, *m.running_efficiency),
                                    measured=record_running(state.measured, *m.running_efficiency))
    m = dataclasses.replace(m, errors=calibrated_errors(m.errors, state.measured))

    pool = [adopt_settings(c, m.current) for c in cfg.candidates()]
    state = _fold_step_residual(state, m, pool)
    m = dataclasses.replace(m, step_corrections=state.corrections)
    critical = critical_why is not None and any(guard_failure(c, cfg, True) is None for c in pool)
    passing = [c for c in pool if guard_failure(c, cfg, critical) is None]
    best = _best(passing, m, _link_now(state, m)) if passing else None
    if best is None:
        state = _record_level(state, m, cfg, now, None)
        current = _score(m.current, m, _link_now(state, m))
        why = "no candidate passes the quality guard" if not passing else "no passing candidate has a measured error yet"
        return Keep(why, current.step_s), state
    state, links, mix, current = _judge_on_levels(state, m, cfg, now, best)
    if mix is not None:
        mixed = _best(passing, m, links)
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
        return _switch(best.spec, current, best, reason, state, now)
    if _same_choice(best.spec, m.current):
        return Keep(f"{current.describe()} is predicted {objective} ({context})", current.step_s), state

    gain = _gain(current, best)
    saving = "faster" if m.errors is None else "less time per progress"
    comparison = f"{best.describe('predicted ')} vs {current.describe()} ({gain:.1%} {saving}, {context})"
    threshold = _threshold(current, best, state, cfg)
    if gain <= threshold:
        return Keep(f"{comparison}; below the {threshold:.0%} threshold", current.step_s), state
    if state.last_switch_at is not None and now - state.last_switch_at < cfg.min_dwell_s:
        waited = now - state.last_switch_at
        if _trial_measured(state, m.current.label):
            return _switch(best.spec, current, best, f"{comparison}; {m.current.label} was chosen on an estimate "
                           f"and two exchanges have measured it: its dwell ends early ({waited:.0f} s)", state, now)
        return Keep(f"{comparison}; last switch {waited:.0f} s ago (min dwell {cfg.min_dwell_s:.0f} s)",
                    current.step_s), state
    return _switch(best.spec, current, best, comparison, state, now)


def without_dwell(state: PolicyState) -> PolicyState:
    """The state with no dwell to wait out, now or when the last switch takes effect, and no
    labels left (after a release from a pin, or a change of world size: the next report may
    switch at once, and what the job left at another size or under a pin is no evidence now)."""
    return dataclasses.replace(state, last_switch_at=None, awaiting=None, left=(), last_move=None)


def _switch_took_effect(state: PolicyState, m: Measurements, now: float) -> PolicyState:
    """The dwell counts from the first report of a step the new choice ran.

    Why: the workers apply a decision at a later step, and on a slow link that is seconds
    later (fp16 steps of 0.75 s on the MLP at 20 Mbit/s: ten steps, 7.5 s, more than the
    cluster scenario's 5 s dwell). Counted from the decision, the dwell had passed before the
    new choice ran at all, and its first noisy efficiency sample alone could switch back.
    """
    if state.awaiting is not None and m.running == state.awaiting:
        return dataclasses.replace(state, last_switch_at=now, awaiting=None)
    return state


def _trial_measured(state: PolicyState, label: str) -> bool:
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


def _doubt_in_favour(m: Measurements, state: PolicyState) -> Measurements:
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


def _gain(current: _Scored, best: _Scored) -> float:
    """Fraction of the current time per progress that ``best`` is predicted to save (with no
    errors measured, of the current step time)."""
    if not math.isfinite(current.tau):
        return 1.0
    return (current.tau - best.tau) / current.tau if current.tau > 0 else 0.0


def _switch(
    spec: CompressorSpec,
    current: _Scored,
    best: _Scored,
    reason: str,
    state: PolicyState,
    now: float,
) -> tuple[Switch, PolicyState]:
    decision = Switch(spec=spec, gain=_gain(current, best), current_step_s=current.step_s,
                      new_step_s=best.step_s, reason=reason)
    trial = spec.label if spec.label not in dict(state.measured) else None
    left, last_move = state.left, None
    if not _lossy(current.spec) and not _lossy(spec):
        left = tuple(dict.fromkeys((*left, current.label)))
        if not _reverses_last_move(state, current.label, spec.label):  # an undo cannot be undone
            last_move = (current.label, spec.label)
    return decision, dataclasses.replace(state, last_switch_at=now, awaiting=spec.label, trial=trial, left=left,
                                         last_move=last_move, switches=state.switches + 1)
