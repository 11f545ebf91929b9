"""The shared machine: the benchmark lock, waiting for quiet CPUs, and the foreign load a run records.

Why: this machine is shared with other developers' tests and benchmarks. Benchmarks that
measure time hold one machine-wide lock (so two of them never measure at once), wait until
other work leaves the CPUs idle before they start, and record the cores that processes other
than their own kept busy meanwhile, so a figure can be read against the load it was taken
under. One reading of ``/proc/stat`` for all of them.
"""

from __future__ import annotations

import fcntl
import os
import resource
import time
from contextlib import contextmanager
from typing import Iterator

#: Every benchmark that measures time holds this lock while it does.
LOCK_PATH = "/tmp/gradwire-bench.lock"
#: A measurement starts once other processes keep fewer than this many cores busy (or after the wait).
QUIET_CORES = 0.3


@contextmanager
def bench_lock(path: str = LOCK_PATH) -> Iterator[float]:
    """Hold the machine-wide benchmark lock (no one else measures meanwhile); yields the seconds waited."""
    started = time.monotonic()
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield time.monotonic() - started
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def machine_busy_s() -> float:
    """CPU seconds all processes have spent busy since boot (first line of ``/proc/stat``).

    Busy = user + nice + system + irq + softirq + steal; idle and iowait are not, and guest
    time is already part of user/nice (the kernel counts it twice in that line).
    """
    with open("/proc/stat") as handle:
        fields = [int(x) for x in handle.readline().split()[1:9]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def own_cpu_s() -> float:
    """CPU seconds of this process and of its finished (waited-for) children."""
    return sum(getattr(usage, f) for usage in (resource.getrusage(resource.RUSAGE_SELF),
                                               resource.getrusage(resource.RUSAGE_CHILDREN))
               for f in ("ru_utime", "ru_stime"))


def busy_cores(window_s: float = 0.5) -> float:
    """How many cores the whole machine keeps busy, averaged over ``window_s``."""
    before = machine_busy_s()
    time.sleep(window_s)
    return (machine_busy_s() - before) / window_s


def wait_for_quiet(max_wait_s: float, max_cores: float = QUIET_CORES, window_s: float = 0.5) -> tuple[float, float]:
    """Wait (at most ``max_wait_s``) until the machine keeps at most ``max_cores`` busy.

    Why: others' tests (which hold no lock) can take every core; a measurement started while
    they run is slowed by them. Returns (seconds waited, busy cores last seen).
    """
    started = time.monotonic()
    while True:
        busy = busy_cores(window_s)
        waited = time.monotonic() - started
        if busy <= max_cores or waited >= max_wait_s:
            return waited, busy


class ForeignLoad:
    """Cores kept busy since construction by processes other than this one and its waited-for
    children (the kernel's work moving our own packets counts as foreign: a few % of a core)."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self._busy = machine_busy_s()
        self._ours = own_cpu_s()

    def elapsed_s(self) -> float:
        return time.monotonic() - self.started

    def cores(self) -> float:
        wall = max(1e-9, self.elapsed_s())
        return max(0.0, (machine_busy_s() - self._busy) - (own_cpu_s() - self._ours)) / wall


@contextmanager
def foreign_load(record: dict[str, float]) -> Iterator[None]:
    """Set ``record["foreign_cores"]`` (2 decimals) to the foreign load seen while the block ran."""
    meter = ForeignLoad()
    try:
        yield
    finally:
        record["foreign_cores"] = round(meter.cores(), 2)
