"""Where rank 0's decisions come from, and scripted decisions for benchmarks and tests.

:func:`decision_source` picks, in order: a job's ``compression.schedule`` (scripted
switches, :class:`ScriptedDecisions`), the coordinator (``workers.control.CoordinatorClient``),
the in-process adaptive policy, or the job spec's fixed choice. Other ranks only follow
rank 0's broadcast.
"""

from __future__ import annotations

from planning.config import TrainConfig
from planning.protocol import Decision, Telemetry
from workers.control import CoordinatorClient, DecisionSource, FixedDecision, InProcessPolicy


def decision_source(cfg: TrainConfig, rank: int, initial: Decision) -> DecisionSource:
    """Rank 0's source of decisions (other ranks only follow the broadcast)."""
    if rank != 0:
        return FixedDecision(initial)
    if cfg.compression.schedule:
        return ScriptedDecisions(cfg, initial)
    if cfg.coordinator_url and cfg.job_id:
        return CoordinatorClient(cfg.coordinator_url, cfg.job_id, cfg.job_token)
    if cfg.compression.mode == "adaptive":
        return InProcessPolicy(cfg.compression, initial)
    return FixedDecision(initial)


class ScriptedDecisions:
    """Decisions from ``cfg.compression.schedule``: the entry with the highest step <= the current step."""

    def __init__(self, cfg: TrainConfig, initial: Decision) -> None:
        self._initial = initial
        self._schedule = sorted(cfg.compression.schedule or [], key=lambda entry: entry.step)
        self.step = 0

    def current(self) -> Decision | None:
        chosen = self._initial
        for version, entry in enumerate(self._schedule, start=1):
            if entry.step <= self.step:
                chosen = Decision(version=version, compressor=entry.compressor, params=entry.params,
                                  reason=f"scheduled at step {entry.step}")
        return chosen

    def observe(self, telemetry: Telemetry) -> None:
        self.step = telemetry.step


