"""When to measure the link: the active probe at start, then at an interval, and recovery
checks in between, all within one cost budget.

Why a budget: a probe all-reduces megabytes that training would rather send; on a slow link
one costs a second or more. :class:`ProbeScheduler` keeps the total cost of probes and checks
within a share (2%) of the run's elapsed time. It reads no clock itself, so it is tested with
a fake one and every rank can feed it the same agreed numbers.

Why checks: while a job compresses, its payloads are too small for the passive estimate to
time, so after a drop the reading stays at the slow rate until the next probe, and a probe
priced at the slow rate comes seconds later. A check (one timed message,
:func:`workers.probe.check_link`) costs a fraction of a probe, so the budget allows one a few
times as often, and while one could see a rise it stands in for the interval's probe
(:meth:`ProbeScheduler.next_measurement`); one that sees the link come back calls for a probe
at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

#: Recovery checks may come this many times as often as probes (the budget still bounds them).
CHECKS_PER_PROBE_INTERVAL = 4

#: While checks stand in for the interval's probes, a probe still comes once this many
#: intervals have passed since the last: it re-measures what a check does not (the latency, a
#: collective's wake-up on an idle link) and re-anchors a reading that only checks moved
#: (a check has no warm-up, so a shaper's burst can pass part of its message free). Rare: a
#: probe on a slow link costs several checks' budget, and one just before the link comes back
#: delays the check that would see it (the testbed's 10 s slow phase at a 2 s interval: none).
PROBE_EVERY_INTERVALS_WHILE_CHECKING = 10


@dataclass
class ProbeScheduler:
    """Decides when the next active probe may run; the caller supplies the clock.

    A probe is due at start (before any has run), and afterwards when ``probe_interval_s``
    has passed since the last one AND running one more (predicted to cost as much as the
    last) keeps the total probe cost within ``max_cost_fraction`` of the elapsed run time.
    The start probe is exempt from the budget (nothing has elapsed yet) but counts
    towards it, so later probes wait until the run has earned it back.

    A recovery check is due (:meth:`check_due`) after a probe has run, when
    ``probe_interval_s / CHECKS_PER_PROBE_INTERVAL`` has passed since the last probe or check
    and the check's expected cost fits the same budget. Where a check could see something,
    :meth:`next_measurement` asks for a check instead of the interval's probe (and for a
    probe only every ``PROBE_EVERY_INTERVALS_WHILE_CHECKING`` intervals).

    ``now`` is any monotonic clock reading (for the interval); ``elapsed_s`` is the run's
    time so far (for the budget). Every rank must take the same decision, or the probe's
    collectives do not match: decide on rank 0 and broadcast it, or feed all ranks the
    same agreed numbers.
    """

    probe_interval_s: float = 60.0
    max_cost_fraction: float = 0.02
    last_probe_at: float | None = None
    last_cost_s: float = 0.0
    total_cost_s: float = 0.0
    probes: int = 0
    last_check_at: float | None = None
    checks: int = 0

    def __post_init__(self) -> None:
        if not self.probe_interval_s > 0:
            raise ValueError(f"probe_interval_s: must be > 0, got {self.probe_interval_s}")
        if not 0 < self.max_cost_fraction < 1:
            raise ValueError(f"max_cost_fraction: must be in (0, 1), got {self.max_cost_fraction}")

    def due(self, now: float, elapsed_s: float, expected_cost_s: float | None = None) -> bool:
        """Whether to probe now.

        ``expected_cost_s`` is what the next probe will cost, by default as much as the last;
        pass more when the link got slower since (the probe's transfers take longer).
        """
        if self.last_probe_at is None:
            return True
        if now - self.last_probe_at < self.probe_interval_s:
            return False
        cost = self.last_cost_s if expected_cost_s is None else expected_cost_s
        return self.total_cost_s + cost <= self.max_cost_fraction * elapsed_s

    def next_measurement(self, now: float, elapsed_s: float, probe_cost_s: float,
                         check_cost_s: float | None) -> Literal["probe", "check"] | None:
        """What to measure of the link now, if anything.

        ``check_cost_s`` is the expected cost of a recovery check where one could see
        something (the caller's passive estimate is blind and the link may have risen), else
        None. Where one could, a check stands in for the interval's probe: it re-measures the
        link at a fraction of the cost (its timing moves the passive reading either way, and
        one that sees a rise calls for a probe at once). Probes at the interval on a blind,
        slow link had spent the budget a check needed: on the testbed, the start probe
        (0.17 s) and two probes at 20 Mbit/s (0.12 s, 0.23 s) left no room for a check for 8 s
        of the 10 s slow phase, and in one CI run none at all before the link came back.
        """
        if check_cost_s is None or self.last_probe_at is None:
            return "probe" if self.due(now, elapsed_s, probe_cost_s) else None
        if (now - self.last_probe_at >= PROBE_EVERY_INTERVALS_WHILE_CHECKING * self.probe_interval_s
                and self.due(now, elapsed_s, probe_cost_s)):
            return "probe"
        return "check" if self.check_due(now, elapsed_s, check_cost_s) else None

    def record(self, now: float, cost_s: float) -> None:
        """Note that a probe finished at ``now`` after ``cost_s`` seconds."""
        if cost_s < 0:
            raise ValueError(f"cost_s: must be >= 0, got {cost_s}")
        self.last_probe_at = now
        self.last_cost_s = cost_s
        self.total_cost_s += cost_s
        self.probes += 1

    def check_due(self, now: float, elapsed_s: float, expected_cost_s: float) -> bool:
        """Whether a recovery check may run now (never before the first probe: a check
        compares the link with the probe's reading)."""
        if self.last_probe_at is None:
            return False
        last = self.last_probe_at if self.last_check_at is None else max(self.last_probe_at, self.last_check_at)
        if now - last < self.probe_interval_s / CHECKS_PER_PROBE_INTERVAL:
            return False
        return self.total_cost_s + expected_cost_s <= self.max_cost_fraction * elapsed_s

    def record_check(self, now: float, cost_s: float) -> None:
        """Note that a recovery check finished at ``now`` after ``cost_s`` seconds (it counts
        towards the budget, not towards the next probe's interval or predicted cost)."""
        if cost_s < 0:
            raise ValueError(f"cost_s: must be >= 0, got {cost_s}")
        self.last_check_at = now
        self.total_cost_s += cost_s
        self.checks += 1

    def defer(self, now: float) -> None:
        """A due probe was not needed (nothing it could tell would change a decision): ask
        again one interval from ``now``, at no cost."""
        self.last_probe_at = now

    def earliest_elapsed_for_next(self) -> float:
        """The elapsed run time from which the budget allows the next probe."""
        return (self.total_cost_s + self.last_cost_s) / self.max_cost_fraction
