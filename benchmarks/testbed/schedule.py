"""A link rate walked through a schedule in a background thread while a job runs.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Sequence

from benchmarks.testbed.bed import Testbed
from benchmarks.testbed.netns import validate_mbit

# --------------------------------------------------------------------------- rate schedules


@dataclass
class RateSchedule:
    """A background thread that walks a list of (mbit, seconds), changing the rate live.

    ``changes`` records (wall time from ``time.time()``, mbit) at each change, so a run's
    measurements can be lined up with the rate that was set. ``error`` holds the exception
    that stopped the thread, if one did.
    """

    steps: list[tuple[float, float]]
    changes: list[tuple[float, float]] = field(default_factory=list)
    error: BaseException | None = None
    _stop: threading.Event = field(default_factory=threading.Event, repr=False)
    _thread: threading.Thread | None = field(default=None, repr=False)

    def stop(self) -> None:
        """Stop after the current step (the rate stays where it is)."""
        self._stop.set()

    def join(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def done(self) -> bool:
        return self._thread is not None and not self._thread.is_alive()

    def __enter__(self) -> "RateSchedule":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
        self.join()


def run_schedule(tb: Testbed, steps: Sequence[tuple[float, float]]) -> RateSchedule:
    """Start changing ``tb``'s rate along ``steps`` = [(mbit, seconds), ...] in a thread."""
    schedule = RateSchedule(steps=[(validate_mbit(m), float(s)) for m, s in steps])

    def walk() -> None:
        try:
            for mbit, seconds in schedule.steps:
                if schedule._stop.is_set():
                    return
                tb.set_rate(mbit)
                schedule.changes.append((time.time(), mbit))
                if schedule._stop.wait(seconds):
                    return
        except BaseException as exc:  # recorded for the caller; a thread cannot raise to it
            schedule.error = exc

    schedule._thread = threading.Thread(target=walk, name="gw-rate-schedule", daemon=True)
    schedule._thread.start()
    return schedule

