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
import threading
import time
from contextlib import contextmanager
from typing import Callable, Iterable, Iterator

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


def wait_for_quiet(max_wait_s: float, max_cores: float = QUIET_CORES, window_s: float = 0.5,
                   own_pids: OwnPids | None = None) -> tuple[float, float]:
    """Wait (at most ``max_wait_s``) until processes other than ours keep at most ``max_cores``
    busy (``own_pids``: more processes that count as ours, see :class:`ForeignLoad`).

    Why: others' tests (which hold no lock) can take every core; a measurement started while
    they run is slowed by them. Returns (seconds waited, foreign cores last seen).
    """
    started = time.monotonic()
    while True:
        meter = ForeignLoad(own_pids, sample_every_s=None)
        time.sleep(window_s)
        busy = meter.cores()
        waited = time.monotonic() - started
        if busy <= max_cores or waited >= max_wait_s:
            return waited, busy


#: Names the processes, besides this one and its waited-for children, whose CPU is our own:
#: an emulated cluster's Ray nodes, coordinator and training workers, which are not our children.
OwnPids = Callable[[], Iterable[int]]


def uptime_s() -> float:
    """Seconds since boot (``/proc/uptime``): the clock of a process's start time."""
    with open("/proc/uptime") as handle:
        return float(handle.read().split()[0])


def process_cpu_s(pid: int) -> tuple[float, float] | None:
    """(CPU seconds, start time in seconds since boot) of ``pid`` from ``/proc/<pid>/stat``;
    None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            text = handle.read()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()  # from field 3 (state) on: the name may hold spaces
    tick = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / tick, int(fields[19]) / tick  # utime + stime, starttime


class ProcessesCpu:
    """CPU seconds that the processes ``pids()`` names spent since construction, read from
    ``/proc`` every ``sample_every_s`` in a thread (None: only when asked).

    Why sampled: these processes are not our children, so their CPU never reaches our
    ``getrusage``, and one that exits (a Ray Train worker at the end of its job) takes its
    count with it; sampled every 0.5 s, at most its last half second is lost. A process
    that started after construction counts from 0 (Ray starts training workers during a run).
    """

    def __init__(self, pids: OwnPids, sample_every_s: float | None = 0.5) -> None:
        self._pids = pids
        self._since_boot = uptime_s()
        self._first: dict[int, float] = {}
        self._last: dict[int, float] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.sample()
        self._thread: threading.Thread | None = None
        if sample_every_s is not None:
            self._thread = threading.Thread(target=self._run, args=(sample_every_s,), name="gw-own-cpu", daemon=True)
            self._thread.start()

    def sample(self) -> None:
        with self._lock:
            for pid in self._pids():
                read = process_cpu_s(pid)
                if read is None:
                    continue
                cpu, started = read
                self._first.setdefault(pid, 0.0 if started >= self._since_boot else cpu)
                self._last[pid] = cpu

    def seconds(self) -> float:
        self.sample()
        with self._lock:
            return sum(self._last[pid] - self._first[pid] for pid in self._last)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self, every_s: float) -> None:
        while not self._stop.wait(every_s):
            self.sample()


class ForeignLoad:
    """Cores kept busy since construction by processes other than this one, its waited-for
    children and the processes ``own_pids`` names (the kernel's work moving our own packets
    counts as foreign: a few % of a core)."""

    def __init__(self, own_pids: OwnPids | None = None, sample_every_s: float | None = 0.5) -> None:
        self.started = time.monotonic()
        self._busy = machine_busy_s()
        self._ours = own_cpu_s()
        self._others = ProcessesCpu(own_pids, sample_every_s) if own_pids is not None else None

    def elapsed_s(self) -> float:
        return time.monotonic() - self.started

    def cores(self) -> float:
        wall = max(1e-9, self.elapsed_s())
        others = self._others.seconds() if self._others is not None else 0.0
        return max(0.0, (machine_busy_s() - self._busy) - (own_cpu_s() - self._ours) - others) / wall

    def close(self) -> None:
        if self._others is not None:
            self._others.close()


@contextmanager
def foreign_load(record: dict[str, float], own_pids: OwnPids | None = None) -> Iterator[None]:
    """Set ``record["foreign_cores"]`` (2 decimals) to the foreign load seen while the block ran."""
    meter = ForeignLoad(own_pids)
    try:
        yield
    finally:
        record["foreign_cores"] = round(meter.cores(), 2)
        meter.close()
