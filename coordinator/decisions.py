"""The coordinator's side of adaptation: one :class:`~planning.controller.AdaptiveController`
per job, steered by the job's stored policy mode.

The controller is the one the worker's in-process mode uses (``planning/controller.py``), so a
job adapts the same way with or without a coordinator; it turns a report into the policy's
inputs, runs ``planning.policy.decide``, versions the decision and handles the pin. This
module adds only what the coordinator knows and the worker does not:

* which jobs the policy steers: the job's ``policy_mode`` from the store (``adaptive``; not
  ``fixed`` or ``pinned``), so a pin survives a coordinator restart;
* the decision in force from the store (``JobService`` passes it in), which the controller
  follows, and the job's stored :class:`~planning.protocol.ModelProfile`, sent by rank 0 once.

``JobService`` persists what comes out (``Store.record_report`` / ``set_decision``). The
controllers live in memory; after a coordinator restart one starts afresh from the latest
stored decision, with the dwell clock set by it if the policy made it.
"""

from __future__ import annotations

import threading

from coordinator.schemas import PinnedPolicy
from planning.controller import AdaptiveController, initial_decision
from planning.decision import Decision
from planning.protocol import ModelProfile, Telemetry
from planning.sections import CompressionConfig
from planning.spec import make_spec


class DecisionLoop:
    """A per-job map of adaptive controllers."""

    def __init__(self) -> None:
        self._jobs: dict[str, AdaptiveController] = {}
        self._lock = threading.Lock()

    @staticmethod
    def initial(cfg: CompressionConfig, now: float) -> Decision:
        """Version 0, stored at submit: exactly the compression the job's workers start with."""
        return initial_decision(cfg, at=now)

    def _controller(self, job_id: str, cfg: CompressionConfig, current: Decision) -> AdaptiveController:
        controller = self._jobs.get(job_id)
        if controller is None:
            controller = self._jobs[job_id] = AdaptiveController(cfg, current=current)
        controller.follow(current)
        return controller

    def on_report(self, job_id: str, mode: str, cfg: CompressionConfig, current: Decision,
                  t: Telemetry, profile: ModelProfile | None, now: float) -> Decision | None:
        """A new decision when the adaptive policy switches, else None (keep)."""
        if mode != "adaptive":
            return None
        with self._lock:
            controller = self._controller(job_id, cfg, current)
            if controller.pinned:  # a pin whose write failed: the stored mode is the truth
                controller.release()
            return controller.observe(t, now, profile)

    def pin(self, job_id: str, cfg: CompressionConfig, request: PinnedPolicy, current: Decision,
            now: float) -> Decision:
        spec = make_spec(request.compressor, **request.params())
        with self._lock:
            return self._controller(job_id, cfg, current).pin(spec, now)

    def last_verdict(self, job_id: str) -> str | None:
        """The reason of the policy's verdict on the job's latest report (None before one)."""
        with self._lock:
            controller = self._jobs.get(job_id)
            return (controller.last_reason or None) if controller is not None else None

    def release(self, job_id: str) -> None:
        """Back to adaptive: the next report may switch at once (no dwell after a pin)."""
        with self._lock:
            controller = self._jobs.get(job_id)
            if controller is not None:
                controller.release()

    def forget(self, job_id: str) -> None:
        with self._lock:
            self._jobs.pop(job_id, None)
