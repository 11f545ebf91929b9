"""Between active probes: the bandwidth the communication hook's own collectives imply.

It costs nothing, but the hook's timings include waiting for stragglers and contention with
compute, so :class:`PassiveBandwidth` is a fallback and a trend signal; the active probe
(:mod:`workers.probe`) stays the anchor that gives it α.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal, Sequence

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

    def restart(self, sample: float) -> None:
        """Take one β sample as the new level: a drop of the link every rank read over its last
        steps (:func:`cycle_sample`).

        Why not :meth:`fold` it: an average across a change of level is neither level. Folded as
        ``DROP_STEPS`` timings, the first reading after the benchmark's drop from 1000 to
        50 Mbit/s was 68-88 Mbit/s (its oscillating and fast-slow-fast runs, seeds 68-71), and
        the policy chose its rank at that rate: PowerSGD r8 in three of four oscillating runs,
        where at the slow steps' own rate it chooses r4 (replayed, session 45)."""
        self.beta_s_per_byte = sample
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


#: A cycle reads as a drop of the link when its last ``DROP_STEPS`` timed steps were, on every
#: rank, more than ``DROP_FACTOR`` times slower than the link was read at (the slower of the
#: passive reading and the last probe's rate; ``drop_threshold``). Smaller drops, and shorter
#: ones, are read at the regular pace.
#:
#: Why 4 and 3: at 2x and two steps, the benchmark's 1 Gbit/s link read as dropped up to six
#: times a run where it had not dropped (fast-slow-fast, session 30: the two steps' β implied
#: 280-430 Mbit/s on both ranks, 2.3-3.6x slower than the probe: a busy core, the shaper), and
#: at 4x and two steps still up to three times a steady-fast run (two steps at ~220 Mbit/s on
#: both ranks once; the reading fell from 1.7 Gbit/s to 309 Mbit/s, and the policy ran
#: PowerSGD r8 on the fast link for 155 steps). The drops this path is for are 20x or more
#: (1000 to 50 Mbit/s here, 25 to 1 Gbit/s in the issue's trace) and last.
DROP_FACTOR = 4.0
DROP_STEPS = 3


def drop_threshold(reading_beta: float | None, probed_beta: float | None) -> float:
    """The β (seconds per byte) above which a cycle's last steps read as a drop: ``DROP_FACTOR``
    times the slower of the passive reading and the last probe's β; infinite (never) without
    either.

    Why the slower: on a fast link the passive reading of small buckets scatters far above the
    line rate (2-13 Gbit/s read on a 1 Gbit/s link), and a fraction of such a reading is
    still faster than the link: every cycle would read as a drop."""
    known = [b for b in (reading_beta, probed_beta) if b is not None and math.isfinite(b) and b > 0]
    return DROP_FACTOR * max(known) if known else math.inf


def recent_steps_beta(last_steps: Sequence[float]) -> float:
    """One rank's ``recent`` for :func:`cycle_sample`: the smallest β of its last ``DROP_STEPS``
    timed steps, and 0 with fewer (the group takes the minimum over the ranks).

    Why 0 and not infinite: a rank that timed fewer steps cannot vouch that its last ones were
    slow, and with infinite the group's minimum was the other ranks' alone. In
    ``tests/distributed/test_passive_link.py`` half of the straggler's transfers (1.4-2.5 ms)
    fell within the latency term of the probe's α (1.7 ms) and gave no sample, so the drop was
    left to the rank that waited for it, and its waits (10.6 MB/s) were folded as a drop of the
    link on 2 of 8 runs on an idle machine while the transfer read 300-1500 MB/s (session 38)."""
    return min(last_steps[-DROP_STEPS:]) if len(last_steps) >= DROP_STEPS else 0.0


def cycle_sample(smallest: float, recent: float, threshold: float) -> tuple[float, bool]:
    """The β a cycle contributes to the reading, and whether it read a drop of the link.

    ``smallest``: the cycle's smallest β over its steps and the ranks (the transfer, not a wait:
    :class:`PassiveBandwidth`); ``recent``: the smallest β of each rank's last ``DROP_STEPS``
    timed steps, smallest over the ranks (0 where any rank timed fewer: a drop is read only from
    every rank's steps); ``threshold``:
    :func:`drop_threshold`. All three are the group's (an all-reduce's), so every rank gets the
    same answer.

    A cycle's smallest β is its fastest step: a link that dropped in the middle of a cycle
    is read one exchange late (the exchange at step 45 still read 1 Gbit/s for a drop at
    step 40, its cycle held a fast step; the policy then switched at step 53-59, session 28).
    When all of its last steps were slower than the threshold on every rank, the cycle's sample
    is those steps' β (the reading restarts from it: :meth:`PassiveBandwidth.restart`): a slow
    step or two (a pause, a busy core) is not a drop. ``nan`` where the cycle timed nothing.
    """
    if math.isfinite(recent) and recent > threshold:
        return recent, True
    return (smallest if math.isfinite(smallest) else math.nan), False
