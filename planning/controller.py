"""The adaptive decision loop shared by the in-process policy and the coordinator.

Torch-free. Turns what rank 0 reports (:class:`~planning.protocol.Telemetry` with its
:class:`~planning.protocol.ModelProfile`) into the cost model's inputs, runs the pure
``planning.policy.decide`` and keeps its state and the versioned decision. The worker
(no coordinator) and the coordinator (one per job) each hold one :class:`AdaptiveController`,
so both adapt the same way.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from planning import costmodel
from planning.policy import Keep, Measurements, PolicyConfig, PolicyState, Switch, decide
from planning.protocol import Decision, ModelProfile, Telemetry
from planning.sections import CompressionConfig
from planning.spec import COMPRESSOR_NAMES, CompressorSpec, make_spec, spec_to_dict


def policy_config(compression: CompressionConfig) -> PolicyConfig:
    """The policy's bounds from a job's compression settings."""
    return PolicyConfig(
        allowed=tuple(compression.allowed or COMPRESSOR_NAMES),
        min_rank=compression.min_rank,
        max_rank=compression.max_rank,
        gain_threshold=compression.gain_threshold,
        min_dwell_s=compression.min_dwell_s,
    )


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
        running_error=_running_error(telemetry),
    )


def _running_error(telemetry: Telemetry) -> tuple[str, float] | None:
    """(label, error) of the compressor that ran the reported step, if the report has both."""
    if telemetry.compression_error is None or not telemetry.compressor:
        return None
    params = {k: v for k, v in (("rank", telemetry.compressor_rank), ("ratio", telemetry.ratio)) if v is not None}
    return make_spec(telemetry.compressor, **params).label, telemetry.compression_error


def decision_for(spec: CompressorSpec, version: int, reason: str, gain: float | None = None) -> Decision:
    data = spec_to_dict(spec)
    name = data.pop("name")
    return Decision(version=version, compressor=name, params=data, reason=reason, predicted_gain=gain)


@dataclass
class Outcome:
    """What one observation led to: the decision in force and whether it is new."""

    decision: Decision
    changed: bool
    reason: str


class AdaptiveController:
    """Holds the policy state and the current decision of one job."""

    def __init__(self, compression: CompressionConfig, *, start: CompressorSpec | None = None) -> None:
        self.config = policy_config(compression)
        first = start or make_spec(compression.compressor, **compression.compressor_params())
        self.decision = decision_for(first, 0, "initial choice from the job spec")
        self.state = PolicyState()
        self.pinned = False
        self._profile: ModelProfile | None = None
        self._candidates = costmodel.candidates(
            self.config.allowed, self.config.min_rank, self.config.max_rank, self.config.topk_ratios
        )
        self._step_profile: costmodel.StepProfile | None = None

    @property
    def current_spec(self) -> CompressorSpec:
        return make_spec(self.decision.compressor, **self.decision.params)

    def pin(self, spec: CompressorSpec, reason: str = "pinned by the user") -> Decision:
        """Fix the choice: the policy stops deciding until :meth:`release`."""
        self.pinned = True
        return self._set(spec, reason, None)

    def release(self) -> None:
        self.pinned = False

    def observe(self, telemetry: Telemetry, now: float) -> Outcome:
        """Feed one report; returns the decision in force afterwards."""
        if telemetry.profile is not None:
            self._profile = telemetry.profile
            self._step_profile = step_profile(telemetry.profile, self._candidates)
        if self.pinned:
            return Outcome(self.decision, False, "pinned")
        measurements = policy_measurements(telemetry, self._step_profile, self.current_spec)
        if measurements is None:
            return Outcome(self.decision, False, "waiting for a model profile and a bandwidth measurement")
        verdict, self.state = decide(self.state, measurements, self.config, now)
        if isinstance(verdict, Switch):
            return Outcome(self._set(verdict.spec, verdict.reason, verdict.gain), True, verdict.reason)
        assert isinstance(verdict, Keep)
        return Outcome(self.decision, False, verdict.reason)

    def _set(self, spec: CompressorSpec, reason: str, gain: float | None) -> Decision:
        self.decision = decision_for(spec, self.decision.version + 1, reason, gain)
        return self.decision
