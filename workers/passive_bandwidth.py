"""Between active probes: the bandwidth the communication hook's own collectives imply.

It costs nothing, but the hook's timings include waiting for stragglers and contention with
compute, so :class:`PassiveBandwidth` is a fallback and a trend signal; the active probe
(:mod:`workers.probe`) stays the anchor that gives it α.
"""

from __future__ import annotations

import math
from collections import deque
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
        sample = implied_beta(kind, world_size, self.alpha_s, nbytes, seconds)
        if sample is None:
            return False
        self._recent.append(sample)
        beta = min(self._recent)
        prev = self.beta_s_per_byte
        self.beta_s_per_byte = beta if prev is None else prev + self.smoothing * (beta - prev)
        self.observations += 1
        return True

    def observe_aligned(self, nbytes: float, seconds: float, kind: CollectiveKind = "all_reduce",
                        world_size: int = 2) -> bool:
        """Fold in a collective that a barrier lined the ranks up for (a recovery check,
        :func:`workers.probe.check_link`); return whether it was used.

        Its time has no wait for a late peer in it, so it needs no filter: it replaces the
        window of recent observations (whose smallest would otherwise hide a drop behind the
        faster steps timed before the estimate went blind) and enters the average directly.
        """
        recent = list(self._recent)
        self._recent.clear()
        if self.observe(nbytes, seconds, kind, world_size):
            return True
        self._recent.extend(recent)
        return False

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
