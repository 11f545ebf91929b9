"""What every rank does at an agreed step, in one place for both training loops.

The built-in loop (:func:`workers.loop.run_training`) and a user's own loop
(:class:`workers.session.TrainingSession`) meet at the same steps and must do the same
collectives in the same order, or the ranks deadlock: the switch agreement (rank 0's proposal,
and on regular steps its link request), the quality signal's and the passive link sample's
exchange (regular steps only; a drop of the link it reads makes the next steps' agreement
eager), the switch itself, then the link measurement rank 0 asked for
(after the switch, so a probe meets the compressor the next steps will run).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from compressors import GradientSync
from compressors.base import from_spec
from planning.decision import Decision
from planning.spec import make_spec
from workers.control import SwitchAgreement
from workers.reporter import Reporter
from workers.timing import StepTimer


@dataclass(frozen=True)
class Agreed:
    """The outcome at one agreed step: the decision every rank received (None: none new), the
    label of the compressor switched to (None: the decision kept the running one) and when
    (``time.monotonic()``, read at the switch: the link measurement after it can take a
    second on a slow link)."""

    decision: Decision | None
    switched_to: str | None
    switched_at: float | None = None


def agree_and_switch(step: int, agreement: SwitchAgreement, reporter: Reporter, sync: GradientSync,
                     timer: StepTimer) -> Agreed:
    """Every rank, at a step where ``agreement.due(step)``: agree, exchange, switch, measure."""
    regular = agreement.regular(step)  # else an early step's exchange: the decision alone
    decision, link_request = agreement.exchange(step, reporter.proposal(),
                                                reporter.link_request() if regular else None)
    if regular and reporter.exchange(step, agreement.group):
        agreement.link_dropped(step)
    switched_to: str | None = None
    switched_at: float | None = None
    if decision is not None:
        spec = make_spec(decision.compressor, **decision.params)
        if spec != sync.compressor.spec:
            sync.switch(from_spec(spec))
            timer.reset_window()  # the phase means restart with the new compressor
            switched_to, switched_at = spec.label, time.monotonic()
    reporter.measure_link(link_request, sync.process_group)
    return Agreed(decision, switched_to, switched_at)


def switch_record(step: int, agreed: Agreed, started_at: float | None = None) -> dict[str, object]:
    """The run summary's entry for a switch (``started_at``: the run's monotonic start, to say
    when in the run it came)."""
    if agreed.decision is None or agreed.switched_to is None or agreed.switched_at is None:
        raise ValueError(f"agreed: no switch to record at step {step}")
    record: dict[str, object] = {"step": step}
    if started_at is not None:
        record["at_s"] = round(agreed.switched_at - started_at, 3)
    record.update(to=agreed.switched_to, version=agreed.decision.version, reason=agreed.decision.reason)
    return record
