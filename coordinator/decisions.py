"""The adaptive loop: telemetry in, versioned decisions out.

The choice itself is ``planning.policy.decide`` — a pure function of (state, measurements,
config, now) with the cost model and hysteresis inside it (docs/decisions.md, "The policy") — fed exactly as the
in-process policy on rank 0 feeds it (``planning.controller.policy_config`` / ``step_profile``),
so a job adapts the same way with or without a coordinator. This module owns everything
around it, and never decides on its own:

* which jobs the policy steers (``adaptive``; not ``fixed`` or ``pinned``),
* turning a telemetry report into the policy's inputs (``planning.controller.policy_measurements``, shared with the in-process policy), including the
  job's :class:`~planning.protocol.ModelProfile`, sent by rank 0 at least once,
* decision versions, reasons and predicted gains, and the operator's pin/release.

The policy state lives in memory, one entry per job; after a coordinator restart it starts
afresh, with the dwell clock set by the job's latest stored decision.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, replace

from coordinator.schemas import DecisionRecord, PinnedPolicy
from planning import policy
from planning.controller import policy_config, policy_measurements, step_profile
from planning.costmodel import StepProfile, candidates
from planning.protocol import ModelProfile, Telemetry
from planning.sections import CompressionConfig
from planning.spec import CompressorSpec, make_spec, spec_to_dict


@dataclass(frozen=True)
class _JobPolicy:
    """Per job: the policy's own state and the cost-model profile built from the worker's."""

    state: policy.PolicyState
    profile: StepProfile | None = None
    source: ModelProfile | None = None
    #: The world size of the last report, and the last bandwidth a report with peers measured.
    world_size: int | None = None
    bandwidth: float | None = None


def _step_profile(profile: ModelProfile, cfg: CompressionConfig) -> StepProfile:
    """The cost model's view of the job's model, built exactly as the in-process policy does."""
    config = policy_config(cfg)
    return step_profile(profile, candidates(config.allowed, config.min_rank, config.max_rank, config.topk_ratios))


def spec_of(d: DecisionRecord) -> CompressorSpec:
    return make_spec(d.compressor, **d.params)


def _switch_params(spec: CompressorSpec) -> dict[str, object]:
    """Wire params of a mid-run switch: only what selects the compressor (no warm-up again)."""
    return {k: v for k, v in spec_to_dict(spec).items() if k in ("rank", "ratio")}


class DecisionLoop:
    """Turns reports and operator requests into versioned :class:`DecisionRecord` s."""

    def __init__(self) -> None:
        self._jobs: dict[str, _JobPolicy] = {}
        self._lock = threading.Lock()

    @staticmethod
    def initial(cfg: CompressionConfig, now: float) -> DecisionRecord:
        """Version 0: exactly the compression the job's workers start with."""
        return DecisionRecord(
            version=0, compressor=cfg.compressor, params=cfg.compressor_params(),
            reason=f"job spec ({cfg.mode})", predicted_gain=None, source="config", at=now,
        )

    def on_report(self, job_id: str, mode: str, cfg: CompressionConfig, current: DecisionRecord,
                  t: Telemetry, profile: ModelProfile | None, now: float) -> DecisionRecord | None:
        """A new decision when the adaptive policy switches, else None (keep)."""
        if mode != "adaptive":
            return None
        with self._lock:
            job = self._jobs.get(job_id) or _JobPolicy(state=_fresh_state(current))
            if profile is not None and profile != job.source:
                job = replace(job, profile=_step_profile(profile, cfg), source=profile)
            job, t = _for_world_size(job, t)
            inputs = policy_measurements(t, job.profile, spec_of(current))
            if inputs is None:
                self._jobs[job_id] = job
                return None
            action, state = policy.decide(job.state, inputs, policy_config(cfg), now)
            self._jobs[job_id] = replace(job, state=state)
        if isinstance(action, policy.Keep):
            return None
        return DecisionRecord(
            version=current.version + 1, compressor=action.spec.name, params=_switch_params(action.spec),
            reason=action.reason, predicted_gain=round(action.gain, 4), source="policy", at=now,
        )

    def pin(self, job_id: str, request: PinnedPolicy, current: DecisionRecord, now: float) -> DecisionRecord:
        spec = make_spec(request.compressor, **request.params())
        with self._lock:
            job = self._jobs.get(job_id) or _JobPolicy(state=_fresh_state(current))
            self._jobs[job_id] = replace(job, state=replace(job.state, last_switch_at=now))
        return DecisionRecord(
            version=current.version + 1, compressor=spec.name, params=_switch_params(spec),
            reason=f"pinned by operator: {spec.label}", predicted_gain=None, source="pinned", at=now,
        )

    def release(self, job_id: str) -> None:
        """Back to adaptive: the next report may switch at once (no dwell after a pin)."""
        with self._lock:
            job = self._jobs.get(job_id)
            if job is not None:
                self._jobs[job_id] = replace(job, state=replace(job.state, last_switch_at=None))

    def forget(self, job_id: str) -> None:
        with self._lock:
            self._jobs.pop(job_id, None)


def _for_world_size(job: _JobPolicy, t: Telemetry) -> tuple[_JobPolicy, Telemetry]:
    """An elastic job's world size changed (a node went away or came back): the choice in
    force was made for the old size, so the policy decides again at once (no dwell). A lone
    worker measures no link; its report gets the last bandwidth measured with peers, which
    costs nothing at world size 1 (no collective has a peer) and keeps the policy's estimate
    for when the job grows back."""
    if job.world_size is not None and t.world_size != job.world_size:
        job = replace(job, state=replace(job.state, last_switch_at=None))
    job = replace(job, world_size=t.world_size)
    if t.world_size > 1 and t.bandwidth_bytes_per_second is not None:
        job = replace(job, bandwidth=t.bandwidth_bytes_per_second)
    elif t.world_size == 1 and t.bandwidth_bytes_per_second is None and job.bandwidth is not None:
        t = t.model_copy(update={"bandwidth_bytes_per_second": job.bandwidth})
    return job, t


def _fresh_state(current: DecisionRecord) -> policy.PolicyState:
    return policy.PolicyState(last_switch_at=current.at if current.version > 0 and current.source == "policy" else None)
