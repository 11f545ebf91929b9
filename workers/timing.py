"""Per-phase step timing: one mechanism for the log, the telemetry and Prometheus.

Phases of a training step (docs/step.md, "Timing phases"): ``data``, ``forward``, ``backward`` (wall time,
including communication that overlapped it), ``exposed_comm`` (waiting for communication
after backward's compute ended) and ``optimizer``; from the communication hook, summed per
step: ``compress``, ``communicate``, ``decompress``.

On CPU phases are timed with ``perf_counter``. On GPU with CUDA events, read one step late
so timing never forces a device synchronisation in the middle of a step.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator, Mapping, Sequence

import torch

from compressors.sync import StepRecord
from planning.protocol import ALL_PHASES, PHASES, step_seconds
from workers.probe import synchronize


def compute_jitter_s(steps: Sequence[Mapping[str, float]]) -> float:
    """Standard deviation over steps of forward + backward compute (backward less exposed
    communication): how unevenly this rank reaches the step's last collective, which the cost
    model turns into the wait for the slowest rank. 0 with fewer than 3 steps."""
    samples = [s["forward"] + s["backward"] - s["exposed_comm"] for s in steps]
    return statistics.stdev(samples) if len(samples) >= 3 else 0.0


def codec_clock(device: torch.device) -> Callable[[], float]:
    """The clock a codec is timed with on ``device``, in seconds.

    CPU: this thread's CPU time, the clock of the communication hook's own codec timing
    (``compressors.sync``), so a calibration and a run's telemetry agree; wall time would
    count another thread's slices of a shared core. GPU: kernels run asynchronously, so the
    clock waits for the device, then reads wall time (for calibrations, never inside a step).
    """
    if device.type == "cpu":
        return time.thread_time

    def device_wall() -> float:
        synchronize(device)
        return time.perf_counter()

    return device_wall


@dataclass(frozen=True)
class StepTiming:
    """Seconds spent in each phase of one step, and when the step ended (wall clock)."""

    step: int
    seconds: dict[str, float]
    ended_at: float  # time.perf_counter() at the end of the step

    @property
    def total_s(self) -> float:
        return step_seconds(self.seconds) or 0.0


class StepTimer:
    """Times the phases of each step; keeps a window of recent steps for means."""

    def __init__(self, device: torch.device, window: int = 50) -> None:
        self.device = device
        self._cuda = device.type == "cuda"
        self._current: dict[str, float] = {}
        self._events: list[tuple[str, torch.cuda.Event, torch.cuda.Event]] = []
        self._backward_end = 0.0
        self.recent: deque[StepTiming] = deque(maxlen=window)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        if name not in PHASES:
            raise ValueError(f"unknown phase {name!r}")
        if self._cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            yield
            end.record()
            self._events.append((name, start, end))
        else:
            started = time.perf_counter()
            yield
            self._current[name] = self._current.get(name, 0.0) + time.perf_counter() - started
        if name == "backward":
            self._backward_end = time.perf_counter()

    def end_step(self, step: int, record: StepRecord | None) -> StepTiming:
        """Close the step: add exposed communication and the hook's sums from ``record``."""
        seconds = dict(self._current)
        if self._cuda:
            torch.cuda.current_stream().synchronize()
            for name, start, end in self._events:
                seconds[name] = seconds.get(name, 0.0) + start.elapsed_time(end) / 1e3
        if record is not None:
            seconds["exposed_comm"] = max(0.0, self._backward_end - record.last_bucket_at) if record.last_bucket_at else 0.0
            seconds["compress"] = record.compress_s
            seconds["communicate"] = record.communicate_s
            seconds["decompress"] = record.decompress_s
        for phase in ALL_PHASES:
            seconds.setdefault(phase, 0.0)
        timing = StepTiming(step=step, seconds=seconds, ended_at=time.perf_counter())
        self.recent.append(timing)
        self._current, self._events = {}, []
        return timing

    def means(self) -> dict[str, float]:
        """Mean seconds per phase over the recent window."""
        if not self.recent:
            return {phase: 0.0 for phase in ALL_PHASES}
        return {phase: sum(t.seconds[phase] for t in self.recent) / len(self.recent) for phase in ALL_PHASES}

    def compute_floor(self) -> dict[str, float]:
        """The least seconds of each compute phase over the window: ``forward``, ``backward``
        (less the communication it waited for: ``backward − exposed_comm``) and ``optimizer``,
        each its smallest over the steps (0 with none timed). What the model profile takes.

        Why the least and not the mean: what else lands on a compute phase only adds to it.
        The run's first step carries one-time work (allocations, kernels' first calls): on the
        benchmark's CNN forward 47 ms and backward's compute 43 ms in step 0, 22 and 11 ms in
        step 1, 11 and 11 ms from step 2 on (session 32's step traces), and the mean of the
        first three steps, the profile the adaptive policy's first decision used, priced every
        candidate with twice the compute; a job that then compressed never measured it again
        (``workers.reporter.profile_stale`` runs only while no codec is in the hook). A busy
        neighbour's slices likewise. The cost model's step correction measures what a
        choice's steps take beyond it (``planning.step_correction``)."""
        if not self.recent:
            return {"forward": 0.0, "backward": 0.0, "optimizer": 0.0}
        steps = [t.seconds for t in self.recent]
        return {"forward": min(s["forward"] for s in steps),
                "backward": min(max(0.0, s["backward"] - s["exposed_comm"]) for s in steps),
                "optimizer": min(s["optimizer"] for s in steps)}

    def compute_jitter_s(self) -> float:
        """:func:`compute_jitter_s` over the window."""
        return compute_jitter_s([t.seconds for t in self.recent])

    def mean_step_s(self) -> float:
        return sum(t.total_s for t in self.recent) / len(self.recent) if self.recent else 0.0

    def wall_step_s(self) -> float | None:
        """Mean wall seconds from the end of one step to the end of the next over the window
        (``len(recent) − 1`` intervals; None with fewer than two steps): all a step costs,
        the work between the timed phases included (the decision exchange, link probes,
        reports, checkpoints). What the adaptive policy compares its predictions with
        (``planning.step_correction``): on the benchmark's CPU workers every choice spent
        0.005-0.009 s a step outside its phases, 10-15 % of the step."""
        if len(self.recent) < 2:
            return None
        return (self.recent[-1].ended_at - self.recent[0].ended_at) / (len(self.recent) - 1)

    def reset_window(self) -> None:
        """Forget recent steps (after a compressor switch the old means no longer apply)."""
        self.recent.clear()
