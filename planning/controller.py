"""The one adaptive controller: the worker's in-process mode and the coordinator both use it.

Torch-free. Turns what rank 0 reports (:class:`~planning.protocol.Telemetry` with its
:class:`~planning.protocol.ModelProfile`) into the cost model's inputs, runs the pure
``planning.policy.decide`` and keeps its state, the versioned :class:`~planning.decision.Decision`
in force, and the operator's pin. Rank 0 without a coordinator holds one
(``workers.control.InProcessPolicy``); the coordinator holds one per job
(``coordinator.decisions.DecisionLoop``, which adds the job's policy mode and the store), so a
job adapts the same way with or without a coordinator (``tests/unit/test_one_controller.py``).
"""

from __future__ import annotations

import dataclasses

from planning import costmodel, registry
from planning.decision import Decision, DecisionSource, decision_for, switch_params
from planning.policy import Keep, Measurements, PolicyConfig, PolicyState, Switch, decide, without_dwell
from planning.progress import contraction
from planning.protocol import ModelProfile, Telemetry
from planning.sections import CompressionConfig
from planning.spec import CompressorSpec

__all__ = ["AdaptiveController", "decision_for", "initial_decision", "policy_config", "policy_measurements",
           "step_profile"]

WAITING = "waiting for a model profile and a bandwidth measurement"


def policy_config(compression: CompressionConfig) -> PolicyConfig:
    """The policy's bounds from a job's compression settings."""
    return PolicyConfig(
        allowed=tuple(compression.allowed or registry.names()),
        min_rank=compression.min_rank,
        max_rank=compression.max_rank,
        gain_threshold=compression.gain_threshold,
        min_dwell_s=compression.min_dwell_s,
    )


def initial_decision(compression: CompressionConfig, at: float | None = None) -> Decision:
    """Version 0: exactly the compression the job's workers start with."""
    return Decision(version=0, compressor=compression.compressor, params=compression.compressor_params(),
                    reason=f"job spec ({compression.mode})", source="config", at=at)


def step_profile(profile: ModelProfile, candidates: tuple[CompressorSpec, ...]) -> costmodel.StepProfile:
    """Cost-model profile from a reported one; codec costs for every candidate that has one."""
    codec: dict[str, costmodel.CodecModel] = {}
    for spec in candidates:
        if spec.label in profile.codec_s:
            codec[spec.label] = costmodel.CodecCost(step_s=profile.codec_s[spec.label])
        elif spec.name in profile.codec_per_element_s:
            codec[spec.label] = costmodel.ElementCost(per_element_s=profile.codec_per_element_s[spec.name])
    return costmodel.StepProfile.build(
        profile.shapes,
        forward_s=profile.forward_s,
        backward_s=profile.backward_s,
        optimizer_s=profile.optimizer_s,
        buckets=profile.buckets or None,
        codec_costs=codec,
    )


def policy_measurements(telemetry: Telemetry, profile: costmodel.StepProfile | None,
                        current: CompressorSpec) -> Measurements | None:
    """The policy's inputs from one report, or None while a profile or a bandwidth is missing.

    The report's compute jitter (σ) goes into the profile: the straggler term changes as the
    machine gets busier, while the rest of the profile is measured once.
    """
    if profile is None or telemetry.bandwidth_bytes_per_second is None:
        return None
    if telemetry.compute_jitter_seconds is not None:
        profile = dataclasses.replace(profile, compute_jitter_s=telemetry.compute_jitter_seconds)
    running_spec = telemetry.running_spec()
    running = running_spec.label if running_spec is not None else None
    return Measurements(
        bandwidth_bytes_per_second=telemetry.bandwidth_bytes_per_second,
        latency_s=telemetry.latency_seconds or 0.0,
        wake_s=telemetry.link_wake_seconds or 0.0,
        world_size=telemetry.world_size,
        profile=profile,
        current=current,
        grad_norm=telemetry.grad_norm,
        step=telemetry.step,
        errors=dict(telemetry.compression_error_estimates) or None,
        running=running,
        running_efficiency=_running_efficiency(telemetry, running),
        measured_step_s=telemetry.step_wall_seconds,
        measured_steps=None if telemetry.timed_steps is None else telemetry.timed_steps - 1,
        link_drop_step=telemetry.link_drop_step,
    )


def _running_efficiency(telemetry: Telemetry, label: str | None) -> tuple[str, float] | None:
    """(label, δ) of the compressor that ran the reported step (``label``): its measured update
    efficiency η, or, from a worker that reports none, ``1 − ε²`` of its relative compression
    error (``planning.progress.contraction``); None if the report has neither."""
    if label is None:
        return None
    if telemetry.update_efficiency is not None:
        return label, telemetry.update_efficiency
    if telemetry.compression_error is not None:
        return label, contraction(telemetry.compression_error)
    return None


def _fresh_state(current: Decision) -> PolicyState:
    """A controller that starts mid-job (a coordinator restart, a resumed worker) counts the
    dwell from the decision in force if the policy made it, and again from the first report
    of a step it ran (it may not have taken effect yet: ``planning.policy`` step 5)."""
    if current.version > 0 and current.source == "policy" and current.at is not None:
        return PolicyState(last_switch_at=current.at, awaiting=current.spec.label)
    return PolicyState()


class AdaptiveController:
    """One job's adaptive policy: its state, the decision in force, and the pin."""

    def __init__(self, compression: CompressionConfig, *, current: Decision | None = None) -> None:
        self.config = policy_config(compression)
        self.decision = current or initial_decision(compression)
        self.state = _fresh_state(self.decision)
        self.pinned = False
        #: Reports on which the policy itself ran, and the reason of its last verdict (or why
        #: it did not run); the worker's run summary shows both.
        self.evaluations = 0
        self.last_reason = ""
        self._candidates = costmodel.candidates(
            self.config.allowed, self.config.min_rank, self.config.max_rank, self.config.topk_ratios
        )
        self._profile: ModelProfile | None = None
        self._step_profile: costmodel.StepProfile | None = None
        #: The world size of the last report, and the last bandwidth a report with peers measured.
        self._world_size: int | None = None
        self._bandwidth: float | None = None
        #: The last running figures folded into the policy's averages (see :meth:`_once`).
        self._last_running: tuple[object, ...] | None = None

    @property
    def current_spec(self) -> CompressorSpec:
        return self.decision.spec

    def follow(self, decision: Decision) -> None:
        """Take the decision in force from whoever keeps it (the coordinator's store)."""
        if decision.version != self.decision.version:
            self.decision = decision

    def pin(self, spec: CompressorSpec, now: float) -> Decision:
        """Fix the choice: the policy stops deciding until :meth:`release`."""
        self.pinned = True
        self.state = dataclasses.replace(self.state, last_switch_at=now, awaiting=None)
        return self._next(spec, f"pinned by operator: {spec.label}", None, "pinned", now)

    def release(self) -> None:
        """Back to adaptive: the next report may switch at once (no dwell after a pin)."""
        self.pinned = False
        self.last_reason = ""  # the verdict of before the pin is stale
        self.state = without_dwell(self.state)

    def observe(self, telemetry: Telemetry, now: float, profile: ModelProfile | None = None) -> Decision | None:
        """Feed one report (``profile``: the job's model profile if the report has none);
        returns the new decision when the policy switches, else None."""
        profile = telemetry.profile or profile
        if profile is not None and profile != self._profile:
            if self._profile is not None:
                # Measured again (``workers.reporter.profile_stale``): the step corrections were
                # residuals against the old profile's predictions.
                self.state = dataclasses.replace(self.state, corrections=())
            self._profile, self._step_profile = profile, step_profile(profile, self._candidates)
        if self.pinned:
            self.last_reason = "pinned"
            return None
        telemetry = self._for_world_size(telemetry)
        measurements = policy_measurements(telemetry, self._step_profile, self.current_spec)
        if measurements is None:
            self.last_reason = WAITING
            return None
        measurements = self._once(measurements, telemetry)
        verdict, self.state = decide(self.state, measurements, self.config, now)
        self.evaluations += 1
        self.last_reason = verdict.reason
        if isinstance(verdict, Keep):
            return None
        assert isinstance(verdict, Switch)
        return self._next(verdict.spec, verdict.reason, round(verdict.gain, 4), "policy", now)

    def _once(self, m: Measurements, telemetry: Telemetry) -> Measurements:
        """Each exchange's running figures enter the policy's averages once.

        Rank 0 reports every ``report_interval_s`` (0.1 s in the benchmark), and every report
        carries the latest decision exchange's efficiency and error until the next exchange,
        ``sync_every`` steps later (0.35 s there): folded per report, one noisy sample (the
        sampled η of the CNN scattered from 0.66 to 1 on one rank) counted three or four times,
        and the average followed the last sample or two. A report whose figures equal the last
        folded ones is the same exchange: the policy decides on it without them.
        """
        if m.running_efficiency is None:
            return m
        sample = (*m.running_efficiency, telemetry.compression_error)
        if sample == self._last_running:
            return dataclasses.replace(m, running_efficiency=None)
        self._last_running = sample
        return m

    def _for_world_size(self, t: Telemetry) -> Telemetry:
        """An elastic job's world size changed (a node went away or came back): the choice in
        force was made for the old size, so the policy decides again at once (no dwell), on
        the cost model alone until the new size's step times are measured. A lone
        worker measures no link; its report gets the last bandwidth measured with peers, which
        costs nothing at world size 1 (no collective has a peer) and keeps the policy's estimate
        for when the job grows back."""
        if self._world_size is not None and t.world_size != self._world_size:
            # The step times measured were of the old size too (planning.step_correction).
            self.state = dataclasses.replace(without_dwell(self.state), corrections=())
        self._world_size = t.world_size
        if t.world_size > 1 and t.bandwidth_bytes_per_second is not None:
            self._bandwidth = t.bandwidth_bytes_per_second
        elif t.world_size == 1 and t.bandwidth_bytes_per_second is None and self._bandwidth is not None:
            t = t.model_copy(update={"bandwidth_bytes_per_second": self._bandwidth})
        return t

    def _next(self, spec: CompressorSpec, reason: str, gain: float | None, source: DecisionSource,
              now: float) -> Decision:
        self.decision = Decision(version=self.decision.version + 1, compressor=spec.name, params=switch_params(spec),
                                 reason=reason, predicted_gain=gain, source=source, at=now)
        return self.decision
