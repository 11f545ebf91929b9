"""The α-β link model and ring collectives (docs/cost-model.md, "The alpha-beta link model").

Torch-free. The cost model (``planning/costmodel.py``) times every collective with it and the
link probe (``workers/probe.py``) fits α and β with :func:`ring_coefficients`.
"""

from __future__ import annotations

from statistics import NormalDist
from typing import NamedTuple


def describe_rate(bytes_per_second: float) -> str:
    """A link rate in bytes/s as people write it, in bits: ``1.06 Gb/s``, ``50 Mb/s``."""
    bits = 8 * bytes_per_second
    for unit, scale in (("Gb/s", 1e9), ("Mb/s", 1e6), ("kb/s", 1e3)):
        if bits >= scale:
            return f"{bits / scale:.3g} {unit}"
    return f"{bits:.3g} b/s"


class Link(NamedTuple):
    """α (seconds per message) and β (seconds per byte) of the link between workers.

    ``wake_s``: see the module docstring's host terms.

    ``burst_bytes``: a token-bucket shaper (``tc tbf``, a cloud NIC's rate limit) lets this
    many bytes per rank through at line rate once the link has idled long enough to refill
    the bucket. Steps idle the link during forward and early backward, so the model lets the
    first ``burst_bytes`` each rank sends in a step cost no transfer time. Probes cannot see
    it (they measure the sustained rate); it is 0 unless the shaper is known (the testbed's).
    """

    alpha: float
    beta: float
    burst_bytes: float = 0.0
    #: Extra seconds a collective takes when it starts on an idle link (module docstring).
    wake_s: float = 0.0


def alpha_beta_from_bandwidth(bytes_per_second: float, latency_s: float) -> Link:
    """The α-β link of a measured bandwidth (bytes/s per worker link) and latency (s)."""
    if not bytes_per_second > 0:
        raise ValueError(f"bytes_per_second: must be > 0, got {bytes_per_second!r}")
    if not latency_s >= 0:
        raise ValueError(f"latency_s: must be >= 0, got {latency_s!r}")
    return Link(alpha=float(latency_s), beta=1.0 / float(bytes_per_second))


def ring_coefficients(kind: str, world_size: int) -> tuple[float, float]:
    """(latency factor, byte factor) of a ring collective: ``t = lat·α + bytes·b·β``.

    ``b`` is what one rank passes in (its all-reduce tensor, or its all-gather shard).
    The one place the ring formulas live: the cost model and the link probe's fit use it.
    """
    n = world_size
    if n < 1:
        raise ValueError(f"world_size: must be >= 1, got {n}")
    if kind == "all_reduce":
        return 2.0 * (n - 1), 2.0 * (n - 1) / n
    if kind == "all_gather":
        return float(n - 1), float(n - 1)
    raise ValueError(f"kind: must be 'all_reduce' or 'all_gather', got {kind!r}")


def implied_beta(kind: str, world_size: int, alpha_s: float, nbytes: float, seconds: float) -> float | None:
    """β (seconds per byte) that one timed ring collective implies under latency ``alpha_s``:
    the ring formula of :func:`ring_coefficients` solved for β. None when the latency term
    covers the whole time (no transfer left to see: as fast as can be told), and for one
    worker or no bytes (nothing crosses a link)."""
    latency, per_byte = ring_coefficients(kind, world_size)
    if per_byte <= 0 or nbytes <= 0:
        return None
    transfer_s = seconds - latency * alpha_s
    return None if transfer_s <= 0 else transfer_s / (per_byte * nbytes)


def all_reduce_s(nbytes: float, world_size: int, link: Link) -> float:
    """Ring all-reduce of ``nbytes``: ``2(N−1)·α + 2(N−1)/N · b·β``; zero for one worker."""
    latency, per_byte = ring_coefficients("all_reduce", world_size)
    return latency * link.alpha + per_byte * nbytes * link.beta


def all_gather_s(nbytes_per_worker: float, world_size: int, link: Link) -> float:
    """Ring all-gather, ``b`` bytes from each worker: ``(N−1)·α + (N−1) · b·β``."""
    latency, per_byte = ring_coefficients("all_gather", world_size)
    return latency * link.alpha + per_byte * nbytes_per_worker * link.beta


def expected_max_normal(count: int) -> float:
    """Expected maximum of ``count`` independent standard normals (Blom's approximation).

    0 for one rank, 0.59 for 2 (exact: 0.56), 1.55 for 8, 2.07 for 32, 2.41 for 64: how many
    standard deviations of compute jitter the slowest of ``count`` ranks lags the mean.
    """
    if count < 1:
        raise ValueError(f"count: must be >= 1, got {count}")
    return NormalDist().inv_cdf((count - 0.375) / (count + 0.25)) if count > 1 else 0.0


class Burst:
    """What is left of a shaper's burst in one step (see :class:`Link`)."""

    def __init__(self, nbytes: float) -> None:
        self.left = nbytes

    def collective_s(self, kind: str, nbytes: float, world_size: int, link: Link) -> float:
        """The collective's ring time less the transfer time of the burst it uses up."""
        _, per_byte = ring_coefficients(kind, world_size)
        free = min(self.left, per_byte * nbytes)  # of the bytes each rank puts on its link
        self.left -= free
        ring_s = all_reduce_s if kind == "all_reduce" else all_gather_s
        return ring_s(nbytes, world_size, link) - free * link.beta

