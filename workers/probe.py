"""How fast is the link? An active α-β probe, a budgeted schedule for it, a passive estimate.

The cost model (``planning/costmodel.py``) predicts collective times from two numbers:
α, the per-message latency, and β, seconds per byte. For a ring all-reduce of ``b`` bytes
on ``n`` workers (docs/cost-model.md, "The alpha-beta link model")::

    t(b) = 2(n-1)·α + 2(n-1)/n · b·β

Three pieces keep α and β current while training runs:

1. :func:`probe_link` -- the anchor. All-reduces two sizes (a small one that is all latency,
   a large one that is mostly bandwidth), takes the median of a few repeats, solves the two
   equations for α and β, and broadcasts rank 0's answer so every rank holds the same numbers.
   It also times what the α-β fit leaves out: how much longer a small collective takes when
   the peers have been idle waiting for it (``wake_s``), as in a training step.
2. :class:`ProbeScheduler` -- when to probe: at start, then every ``probe_interval_s``, but
   only while the probes' total cost stays within a share (2%) of the run's elapsed time.
   It reads no clock itself, so it is tested with a fake one.
3. :class:`PassiveBandwidth` -- between probes, an EWMA of the bandwidth implied by the
   communication hook's own collective timings. It costs nothing, but the hook's timings
   include waiting for stragglers and contention with compute, so it is a fallback and a
   trend signal; the active probe stays the anchor.

World size 1 has no link: :func:`probe_link` returns at once, without timing, an estimate
with α = β = 0 and ``bandwidth_bytes_per_second = math.inf`` (infinite, not ``None``), so the
cost model's arithmetic needs no special case: every collective costs 0 s, which is true.
Serialise it with :meth:`LinkEstimate.to_dict`, which writes ``None`` for the infinite value
(JSON has no infinity).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Sequence

from planning.costmodel import Link, all_reduce_s, ring_coefficients

if TYPE_CHECKING:  # torch is imported inside probe_link: the rest stays importable without it
    import torch
    import torch.distributed as dist

CollectiveKind = Literal["all_reduce", "all_gather"]

#: Small size: all latency. Large size: at 1 Gbit/s ~34 ms of transfer, enough to measure
#: bandwidth against timer noise, yet a 2-worker probe costs well under a second at 100 Mbit/s.
DEFAULT_SIZES: tuple[int, int] = (4 * 1024, 4 * 1024 * 1024)
FP32_BYTES = 4
#: Probes during training size their large message to this much transfer time at the
#: estimated rate (see :func:`sized_probe`), within these bounds.
PROBE_TRANSFER_S = 0.02
#: At least this much even on a slow link: after the link speeds up tenfold, a probe sized for
#: the old rate must still take long enough to measure the new one (~4 ms at 500 Mbit/s).
MIN_LARGE_PROBE_BYTES = 256 * 1024
MAX_LARGE_PROBE_BYTES = DEFAULT_SIZES[1]
#: A sized probe whose large warm-up takes this many times its target stops there.
PROBE_STOP_FACTOR = 4.0
#: Wake-up rounds per probe and how long the last rank to arrive computes (spins) first.
WAKE_ROUNDS = 8
WAKE_SPIN_S = 0.002


def sized_probe(bytes_per_second: float | None) -> tuple[int, int]:
    """Probe sizes for a link estimated at ``bytes_per_second`` (``None``: not known yet).

    Why: a fixed 4 MiB probe takes ~34 ms at 1 Gbit/s but ~0.7 s at 50 Mbit/s, so on a slow
    link the probe budget allows one only every minute or two, and a job that compresses
    (its payloads too small to time) stays blind to the link recovering. Sized to ~20 ms of
    transfer (and at least :data:`MIN_LARGE_PROBE_BYTES`), a probe costs about the same
    (~70-130 ms) at any rate from 50 Mbit/s up, and ~20 ms is still long against α and
    timer noise. If the estimate is stale (a compressing job cannot time its small payloads)
    the next probe is mis-sized; when its large warm-up takes over ``PROBE_STOP_FACTOR``
    times the target, the probe stops there (``stop_after_s`` of :func:`probe_link`), and
    its result sizes the following one right.
    """
    if bytes_per_second is None or not math.isfinite(bytes_per_second) or bytes_per_second <= 0:
        return DEFAULT_SIZES[0], MAX_LARGE_PROBE_BYTES
    large = int(min(MAX_LARGE_PROBE_BYTES, max(MIN_LARGE_PROBE_BYTES, bytes_per_second * PROBE_TRANSFER_S)))
    return DEFAULT_SIZES[0], large


# --------------------------------------------------------------------------- the α-β model


def all_reduce_seconds(nbytes: float, world_size: int, alpha_s: float, beta_s_per_byte: float) -> float:
    """Predicted time of a ring all-reduce of ``nbytes`` under the α-β model."""
    return all_reduce_s(nbytes, world_size, Link(alpha=alpha_s, beta=beta_s_per_byte))


def fit_alpha_beta(sizes: Sequence[float], seconds: Sequence[float], world_size: int) -> tuple[float, float]:
    """Least-squares (α, β) of the ring all-reduce model from (size, time) points.

    With two sizes this is the exact solution of two equations. Measurements are noisy,
    so the fit is kept physical: β > 0 and α >= 0.

    1. Regress t on x = 2(n-1)/n·b: slope β, intercept 2(n-1)·α.
    2. Slope <= 0 (the large transfer was no slower than the small one -- a link too fast
       for these sizes): take β = t/x at the largest size, an upper bound on β, so the
       bandwidth is under- rather than over-stated.
    3. Intercept < 0: α = 0 and β refitted through the origin.
    """
    if world_size < 2:
        raise ValueError(f"world_size: a link needs >= 2 workers, got {world_size}")
    if len(sizes) != len(seconds) or len(set(sizes)) < 2:
        raise ValueError("need times for at least two distinct sizes")
    if min(seconds) <= 0 or min(sizes) <= 0:
        raise ValueError("sizes and times must be positive")
    lat, per_byte = ring_coefficients("all_reduce", world_size)
    xs = [per_byte * b for b in sizes]
    x_mean, t_mean = statistics.fmean(xs), statistics.fmean(seconds)
    sxx = sum((x - x_mean) ** 2 for x in xs)
    beta = sum((x - x_mean) * (t - t_mean) for x, t in zip(xs, seconds)) / sxx
    if beta <= 0:
        i = max(range(len(xs)), key=xs.__getitem__)
        return 0.0, seconds[i] / xs[i]
    intercept = t_mean - beta * x_mean
    if intercept < 0:
        return 0.0, sum(x * t for x, t in zip(xs, seconds)) / sum(x * x for x in xs)
    return intercept / lat, beta


# --------------------------------------------------------------------------- the estimate


@dataclass(frozen=True)
class LinkEstimate:
    """The link as the α-β model sees it, identical on every rank.

    ``latency_s`` is the predicted time of a zero-byte all-reduce, 2(n-1)·α: what one tiny
    collective costs on this group, the number the dashboards show. ``wake_s`` is how much
    longer, on average, a small collective takes when the peers sat idle waiting for it
    (their communication threads asleep; ``planning.costmodel.Link.wake_s``). ``measured_at`` is
    rank 0's ``time.time()`` when the probe finished; ``cost_s`` is rank 0's wall time
    spent probing (warm-up included), which the :class:`ProbeScheduler` budgets.
    """

    alpha_s: float
    beta_s_per_byte: float
    bandwidth_bytes_per_second: float
    latency_s: float
    measured_at: float
    cost_s: float
    world_size: int = 1
    #: The largest message the probe timed (0: no probe), to budget the next one by.
    probe_bytes: int = 0
    wake_s: float = 0.0

    @classmethod
    def from_fit(cls, alpha_s: float, beta_s_per_byte: float, world_size: int, *,
                 measured_at: float, cost_s: float, probe_bytes: int = 0, wake_s: float = 0.0) -> "LinkEstimate":
        bandwidth = math.inf if beta_s_per_byte == 0 else 1.0 / beta_s_per_byte
        lat, _ = ring_coefficients("all_reduce", world_size)
        return cls(alpha_s=alpha_s, beta_s_per_byte=beta_s_per_byte, bandwidth_bytes_per_second=bandwidth,
                   latency_s=lat * alpha_s, measured_at=measured_at, cost_s=cost_s, world_size=world_size,
                   probe_bytes=probe_bytes, wake_s=wake_s)

    @classmethod
    def no_link(cls, measured_at: float | None = None) -> "LinkEstimate":
        """World size 1: nothing to send, so α = β = 0 and infinite bandwidth."""
        return cls.from_fit(0.0, 0.0, 1, measured_at=time.time() if measured_at is None else measured_at,
                            cost_s=0.0)

    @property
    def has_link(self) -> bool:
        return self.world_size > 1

    def all_reduce_seconds(self, nbytes: float) -> float:
        """Predicted ring all-reduce time of ``nbytes`` on this group."""
        return all_reduce_seconds(nbytes, self.world_size, self.alpha_s, self.beta_s_per_byte)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe fields: infinite bandwidth becomes ``None``."""
        out = dataclasses.asdict(self)
        if math.isinf(out["bandwidth_bytes_per_second"]):
            out["bandwidth_bytes_per_second"] = None
        return out


# --------------------------------------------------------------------------- the active probe


def probe_link(
    process_group: "dist.ProcessGroup | None" = None,
    *,
    sizes: Sequence[int] = DEFAULT_SIZES,
    repeats: int = 3,
    warmup: bool = True,
    stop_after_s: float | None = None,
    device: "torch.device | str | None" = None,
    wake_rounds: int = WAKE_ROUNDS,
) -> LinkEstimate:
    """Measure α and β of ``process_group``'s all-reduce; every rank must call it.

    1. World size 1 (or no initialised process group): return :meth:`LinkEstimate.no_link`.
    2. One warm-up all-reduce per size: connections, buffers and caches warm up, and the
       large one drains a token-bucket shaper's burst (else a probe that fits in the burst
       reports the line rate). ``warmup=False`` skips it (for tests).
    3. ``repeats`` rounds over the sizes; before each timing a barrier lines the ranks up,
       and on CUDA a synchronise makes the clock stop when the data has arrived. With
       ``stop_after_s``, if the large warm-up (or, without warm-up, the first round's large
       message) took longer on any rank (the ranks agree by an all-reduce of their times),
       that long transfer is the measurement and no more rounds follow: the link is much
       slower than the probe was sized for.
    4. ``wake_rounds`` times the small message as a training step meets it
       (:func:`wake_up_seconds`): ``wake_s`` is its mean time beyond what the fitted α-β model
       predicts for it (so α's fit noise and ``wake_s`` add up to what a step sees).
    5. Each rank fits (α, β) to the median time of every size; rank 0's fit, wake-up, time
       stamp and cost are broadcast so all ranks return the same estimate.

    ``sizes`` are bytes of fp32 tensors (rounded down to whole elements). ``device`` defaults
    to the current CUDA device for an NCCL group, else the CPU.
    """
    import torch
    import torch.distributed as dist

    if repeats < 1:
        raise ValueError(f"repeats: must be >= 1, got {repeats}")
    if wake_rounds < 0:
        raise ValueError(f"wake_rounds: must be >= 0, got {wake_rounds}")
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size(process_group) == 1:
        return LinkEstimate.no_link()
    world_size = dist.get_world_size(process_group)
    dev = _probe_device(process_group, device)
    started = time.perf_counter()
    tensors = _probe_tensors(sizes, dev)
    nbytes = [t.numel() * t.element_size() for t in tensors]
    times: list[list[float]] = [[] for _ in tensors]
    rounds = repeats
    if warmup:
        for tensor in tensors[:-1]:
            dist.all_reduce(tensor, group=process_group)
        # The large warm-up also drains a shaper's burst, so the timed rounds see the rate.
        drain_s = _timed_all_reduce(tensors[-1], process_group, dev)
        slowest = _slowest(drain_s, process_group, dev) if stop_after_s is not None else 0.0
        if stop_after_s is not None and slowest > stop_after_s:
            # Much slower than sized for: this long transfer is measurement enough.
            times[-1].append(slowest)
            for i, tensor in enumerate(tensors[:-1]):
                times[i].append(_timed_all_reduce(tensor, process_group, dev))
            rounds = 0
    for round_ in range(rounds):
        for i, tensor in enumerate(tensors):
            times[i].append(_timed_all_reduce(tensor, process_group, dev))
        if stop_after_s is not None and round_ == 0 and not warmup and _slowest(times[-1][0], process_group, dev) > stop_after_s:
            break
    alpha, beta = fit_alpha_beta(nbytes, [statistics.median(ts) for ts in times], world_size)
    wake = 0.0
    if wake_rounds:
        cold = wake_up_seconds(tensors[0], process_group, dev, wake_rounds)
        wake = max(0.0, cold - all_reduce_seconds(nbytes[0], world_size, alpha, beta))
    cost = time.perf_counter() - started
    agreed = torch.tensor([alpha, beta, time.time(), cost, wake], dtype=torch.float64, device=dev)
    src = 0 if process_group is None else dist.get_global_rank(process_group, 0)
    dist.broadcast(agreed, src=src, group=process_group)
    alpha, beta, measured_at, cost, wake = agreed.tolist()
    return LinkEstimate.from_fit(alpha, beta, world_size, measured_at=measured_at, cost_s=cost,
                                 probe_bytes=max(nbytes), wake_s=wake)


def wake_up_seconds(tensor: "torch.Tensor", process_group: "dist.ProcessGroup | None", device: "torch.device",
                    rounds: int, spin_s: float = WAKE_SPIN_S) -> float:
    """Mean time of a small all-reduce that the last rank joins after computing.

    Why: the aligned rounds (a barrier, then the collective) find every rank awake and
    measure the link; in a training step the ranks that finished backward first sleep in
    the collective until the last one arrives, and waking them costs more -- on VMs a
    heavy-tailed ~1-2 ms. Each round: a barrier, then every rank spins (busy CPU, like
    backward) for ``spin_s / 2``, except one (a different one each round) for ``spin_s``,
    then all-reduce. The collective can finish only after the last rank's ``spin_s``, so
    the time beyond it is the collective as the last rank meets it. Mean, not median: the
    tail is what a step pays on average.
    """
    import torch.distributed as dist

    rank, world = dist.get_rank(process_group), dist.get_world_size(process_group)
    seconds = []
    for round_ in range(rounds):
        dist.barrier(group=process_group)
        synchronize(device)
        start = time.perf_counter()
        _spin(spin_s if rank == round_ % world else spin_s / 2)
        dist.all_reduce(tensor, group=process_group)
        synchronize(device)
        seconds.append(time.perf_counter() - start - spin_s)
    return max(0.0, statistics.fmean(seconds))


def _spin(seconds: float) -> None:
    """Keep the CPU busy for ``seconds`` (sleeping would let the scheduler idle the core)."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def _slowest(seconds: float, process_group: "dist.ProcessGroup | None", device: "torch.device") -> float:
    """The largest of every rank's ``seconds`` (a collective: all ranks then decide alike)."""
    import torch
    import torch.distributed as dist

    value = torch.tensor([seconds], dtype=torch.float64, device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX, group=process_group)
    return float(value)


def _probe_device(process_group: "dist.ProcessGroup | None", device: "torch.device | str | None") -> "torch.device":
    import torch
    import torch.distributed as dist

    if device is not None:
        return torch.device(device)
    if dist.get_backend(process_group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _probe_tensors(sizes: Sequence[int], device: "torch.device") -> list["torch.Tensor"]:
    import torch

    counts = sorted({max(1, int(b) // FP32_BYTES) for b in sizes})
    if len(counts) < 2:
        raise ValueError(f"sizes: need two distinct sizes of at least {FP32_BYTES} bytes, got {tuple(sizes)}")
    return [torch.ones(c, dtype=torch.float32, device=device) for c in counts]


def _timed_all_reduce(tensor: "torch.Tensor", process_group: "dist.ProcessGroup | None",
                      device: "torch.device") -> float:
    import torch.distributed as dist

    dist.barrier(group=process_group)
    synchronize(device)
    start = time.perf_counter()
    dist.all_reduce(tensor, group=process_group)
    synchronize(device)
    return time.perf_counter() - start


def synchronize(device: "torch.device") -> None:
    """Wait for ``device``'s queued work (kernels run asynchronously on accelerators), so a
    wall-clock reading after it includes that work. Nothing to wait for on CPU."""
    import torch

    if device.type != "cpu":
        torch.accelerator.synchronize(device)


# --------------------------------------------------------------------------- when to probe


@dataclass
class ProbeScheduler:
    """Decides when the next active probe may run; the caller supplies the clock.

    A probe is due at start (before any has run), and afterwards when ``probe_interval_s``
    has passed since the last one AND running one more (predicted to cost as much as the
    last) keeps the total probe cost within ``max_cost_fraction`` of the elapsed run time.
    The start probe is exempt from the budget (nothing has elapsed yet) but counts
    towards it, so later probes wait until the run has earned it back.

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

    def record(self, now: float, cost_s: float) -> None:
        """Note that a probe finished at ``now`` after ``cost_s`` seconds."""
        if cost_s < 0:
            raise ValueError(f"cost_s: must be >= 0, got {cost_s}")
        self.last_probe_at = now
        self.last_cost_s = cost_s
        self.total_cost_s += cost_s
        self.probes += 1

    def earliest_elapsed_for_next(self) -> float:
        """The elapsed run time from which the budget allows the next probe."""
        return (self.total_cost_s + self.last_cost_s) / self.max_cost_fraction


# --------------------------------------------------------------------------- passive estimate


@dataclass
class PassiveBandwidth:
    """EWMA of the bandwidth the hook's own collectives imply; a fallback between probes.

    Each observation (bytes one rank passed in, seconds, collective kind, world size) is
    inverted through the same ring model: β = (t - lat·α) / (bytes·b), with α from the last
    active probe (:meth:`anchor`; 0 before one). The average is taken over β, seconds per
    byte, because times add up: two equal transfers at 10 and 1000 MB/s take as long as
    two at ~20 MB/s, and averaging bandwidths would say ~505 MB/s.

    Observations smaller than ``min_bytes``, on one worker, or not slower than the latency
    term are ignored: their time is latency and noise, not bandwidth.

    ``min_of_last`` > 1 filters before averaging: the smallest β of the last that many usable
    observations enters the average. A collective's time on one rank includes waiting for
    peers that start it later (a straggler, a busy CPU); that wait is never negative and is
    zero whenever this rank is the last to arrive, so the smallest of a few consecutive
    observations is the transfer itself. A real drop raises every observation, so it shows
    after ``min_of_last - 1`` more of them.
    """

    smoothing: float = 0.2
    min_bytes: int = 256 * 1024
    alpha_s: float = 0.0
    beta_s_per_byte: float | None = None
    anchor_bandwidth: float | None = None
    observations: int = field(default=0)
    min_of_last: int = 1
    _recent: deque[float] = field(default_factory=deque, repr=False)

    def __post_init__(self) -> None:
        if not 0 < self.smoothing <= 1:
            raise ValueError(f"smoothing: must be in (0, 1], got {self.smoothing}")
        if self.min_of_last < 1:
            raise ValueError(f"min_of_last: must be >= 1, got {self.min_of_last}")
        self._recent = deque(self._recent, maxlen=self.min_of_last)

    def anchor(self, estimate: LinkEstimate) -> None:
        """Take α (and the reference bandwidth for :meth:`trend`) from an active probe."""
        if estimate.has_link:
            self.alpha_s = estimate.alpha_s
            self.anchor_bandwidth = estimate.bandwidth_bytes_per_second

    def observe(self, nbytes: float, seconds: float, kind: CollectiveKind = "all_reduce",
                world_size: int = 2) -> bool:
        """Fold one collective's timing in; return whether it was used."""
        if world_size < 2 or nbytes < self.min_bytes or seconds <= 0:
            return False
        lat, per_byte = ring_coefficients(kind, world_size)
        transfer_s = seconds - lat * self.alpha_s
        if transfer_s <= 0:
            return False
        self._recent.append(transfer_s / (per_byte * nbytes))
        beta = min(self._recent)
        prev = self.beta_s_per_byte
        self.beta_s_per_byte = beta if prev is None else prev + self.smoothing * (beta - prev)
        self.observations += 1
        return True

    @property
    def bytes_per_second(self) -> float | None:
        """The current estimate, or None before the first usable observation."""
        return None if self.beta_s_per_byte is None else 1.0 / self.beta_s_per_byte

    def trend(self) -> float | None:
        """Passive estimate relative to the last active probe (<1: the link got slower)."""
        bw = self.bytes_per_second
        if bw is None or not self.anchor_bandwidth or math.isinf(self.anchor_bandwidth):
            return None
        return bw / self.anchor_bandwidth
