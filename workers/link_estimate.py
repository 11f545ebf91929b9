"""The link as the α-β model sees it: the fit of α and β to timed all-reduces, and the
:class:`LinkEstimate` every rank holds.

The cost model (``planning/costmodel.py``) predicts collective times from two numbers:
α, the per-message latency, and β, seconds per byte. For a ring all-reduce of ``b`` bytes
on ``n`` workers (docs/cost-model.md, "The alpha-beta link model")::

    t(b) = 2(n-1)·α + 2(n-1)/n · b·β

Why a module of its own: the active probe (:mod:`workers.probe`) produces estimates, and the
loop, the session, the passive estimate and the tests consume them; none of those needs torch
for it, and this module does not import it.

World size 1 has no link: :meth:`LinkEstimate.no_link` has α = β = 0 and
``bandwidth_bytes_per_second = math.inf`` (infinite, not ``None``), so the cost model's
arithmetic needs no special case: every collective costs 0 s, which is true. Serialise it
with :meth:`LinkEstimate.to_dict`, which writes ``None`` for the infinite value (JSON has no
infinity).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from dataclasses import dataclass
from typing import Any, Sequence

from planning.costmodel import Link, all_reduce_s, ring_coefficients


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
