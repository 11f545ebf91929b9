"""Between active probes: the bandwidth the communication hook's own collectives imply.

It costs nothing, but the hook's timings include waiting for stragglers and contention with
compute, so :class:`PassiveBandwidth` is a fallback and a trend signal; the active probe
(:mod:`workers.probe`) stays the anchor that gives it α.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from planning.link import implied_beta
from workers.link_estimate import LinkEstimate

CollectiveKind = Literal["all_reduce", "all_gather"]


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

    Filtering a rank's waits out is the caller's: a collective's time on one rank includes
    waiting for peers that start it later (a straggler, a busy CPU); that wait is never
    negative and is zero on the rank that arrives last, so the smallest :meth:`sample` of a
    cycle's steps over every rank is the transfer itself (``workers.reporter.Reporter.exchange``
    folds that one).
    """

    smoothing: float = 0.2
    min_bytes: int = 256 * 1024
    alpha_s: float = 0.0
    beta_s_per_byte: float | None = None
    anchor_bandwidth: float | None = None
    observations: int = field(default=0)

    def __post_init__(self) -> None:
        if not 0 < self.smoothing <= 1:
            raise ValueError(f"smoothing: must be in (0, 1], got {self.smoothing}")

    def anchor(self, estimate: LinkEstimate) -> None:
        """Take α (and the reference bandwidth for :meth:`trend`) from an active probe."""
        if estimate.has_link:
            self.alpha_s = estimate.alpha_s
            self.anchor_bandwidth = estimate.bandwidth_bytes_per_second

    def observe(self, nbytes: float, seconds: float, kind: CollectiveKind = "all_reduce",
                world_size: int = 2) -> bool:
        """Fold one collective's timing in; return whether it was used."""
        sample = self.sample(nbytes, seconds, kind, world_size)
        if sample is None:
            return False
        self.fold(sample)
        return True

    def sample(self, nbytes: float, seconds: float, kind: CollectiveKind = "all_reduce",
               world_size: int = 2) -> float | None:
        """The β (seconds per byte) one collective's timing implies, or None where it says
        nothing of the bandwidth (too small, one worker, within the latency term)."""
        if world_size < 2 or nbytes < self.min_bytes or seconds <= 0:
            return None
        return implied_beta(kind, world_size, self.alpha_s, nbytes, seconds)

    def fold(self, sample: float, timings: int = 1) -> None:
        """Fold one β sample (from :meth:`sample`, here or on another rank) into the average,
        weighted as ``timings`` of them (the smallest of a cycle's stands for the cycle: it
        moves the average as far as that many equal samples folded one by one would)."""
        if timings < 1:
            raise ValueError(f"timings: must be >= 1, got {timings}")
        prev = self.beta_s_per_byte
        weight = 1 - (1 - self.smoothing) ** timings
        self.beta_s_per_byte = sample if prev is None else prev + weight * (sample - prev)
        self.observations += 1

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
