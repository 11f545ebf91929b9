"""The adaptive policy's inputs, memory and verdicts: the types ``planning.policy.decide``
takes and returns, and the scored candidate its steps pass between them.

Apart from ``planning.policy`` so that the hysteresis (``planning.hysteresis``), which reads
and writes the same state, can be a module of its own without importing the policy back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Union

from planning import registry
from planning.costmodel import DEFAULT_TOPK_RATIOS, Link, StepProfile, candidates
from planning.link_levels import LevelHistory, StretchHistory
from planning.link_smoothing import LinkAverage, LinkSmoothing
from planning.progress import Measured, Spread
from planning.spec import CompressorSpec
from planning.step_correction import Corrections


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
    #: The same between choices whose error is known (``none`` and the casts): see ``planning.hysteresis.threshold``.
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
    #: ``planning.policy.decide`` keeps in its state replaces a caller's value (as the calibrated errors do).
    step_corrections: Corrections = ()
    #: The latest exchange at which the workers read a drop of the link
    #: (``Telemetry.link_drop_step``; None: none yet): a new one moves the averaged link at once.
    link_drop_step: int | None = None


@dataclass(frozen=True)
class PolicyState:
    """What ``planning.policy.decide`` remembers between calls; start with ``PolicyState()``."""

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
    #: the next switch: its dwell ends early once it has been measured (see ``planning.hysteresis.trial_measured``).
    trial: str | None = None
    #: The known-error labels (``none``, the casts) that switches moved away from for another
    #: of them, since the last release or change of world size: going back to one takes the full
    #: threshold (``planning.hysteresis.threshold``). A move to a lossy choice records nothing.
    left: tuple[str, ...] = ()
    #: The last switch, (from, to), when it went between two known-error choices and was no
    #: undo itself (``planning.hysteresis``); None after any other switch.
    last_move: tuple[str, str] | None = None
    switches: int = 0
    #: Averaged running efficiency of every label that has run (``planning.progress``).
    measured: Measured = ()
    #: The variance of each label's efficiency samples (``planning.progress.record_spread``).
    spread: Spread = ()
    #: Each label's averaged measured-minus-predicted step time, per level of the link it ran at
    #: (``planning.step_correction``).
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


#: What ``planning.policy.decide`` returns; ``planning.controller`` turns a ``Switch`` into the next
#: versioned ``planning.decision.Decision``.
Verdict = Union[Keep, Switch]



@dataclass(frozen=True)
class Scored:
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
