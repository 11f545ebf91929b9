"""The adaptive policy's view of the link: bandwidth and latency averaged over noisy reports.

Torch-free and pure (``planning.policy.decide``'s step 1). Why not a plain average: a link
probe's sample scatters ±30 % on a steady link, yet a real collapse (a cloud link dropping
to a tenth) must be followed within a couple of reports, while a lone spike must not move
anything. So bandwidth is averaged in log space with a time-based EWMA (irregular reports
weigh by the time since the last one), and a sample off by more than ``shift_factor`` is
held back as a suspected outlier; once ``shift_reports`` such samples in a row lie on the
same side, the average jumps to their geometric mean. A drop the workers read on every rank
over several steps (``Telemetry.link_drop_step``) is no lone sample: the report that brings it
moves the average to its level at once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class LinkSmoothing:
    """How the link's samples are averaged (``planning.policy.PolicyConfig`` holds them)."""

    half_life_s: float
    shift_factor: float
    shift_reports: int


@dataclass(frozen=True)
class LinkAverage:
    """The averaged link, and what the next sample needs to be folded in."""

    bandwidth: float | None = None  # bytes/s, averaged in log space
    latency: float | None = None  # seconds
    at: float | None = None  # when a sample last entered the averages
    pending: tuple[float, ...] = ()  # out-of-band bandwidth samples awaiting confirmation
    drop_step: int | None = None  # the latest drop read by the workers that a report brought


def ewma_weight(since: float | None, now: float, half_life_s: float) -> float:
    """EWMA weight of a new sample: ``1 − 2^(−Δt / half-life)`` (1 for the first)."""
    if since is None:
        return 1.0
    return 1.0 - 0.5 ** (max(0.0, now - since) / half_life_s)


def fold_sample(average: LinkAverage, bandwidth: float, latency: float, now: float,
                how: LinkSmoothing, drop_step: int | None = None) -> LinkAverage:
    """``average`` with one report's bandwidth (bytes/s) and latency (s) folded in.

    ``drop_step``: the latest exchange at which the workers read a drop of the link (None: none
    yet). A report that brings a new one, with a sample more than ``shift_factor`` below the
    average, moves the average to that sample at once.

    Why at once: the workers read a drop only when each rank's last steps were all more than
    4x slower than the link was read at (``workers.passive_bandwidth.cycle_sample``), and
    their reading then restarts from those steps' rate; that is the confirmation the second
    report would give, three steps of every rank where a report is one. Held for a second
    report, the decision came two steps later (seeds 68-71 of the benchmark: reports at steps
    46 and 48 for a drop read at step 45, the switch 3 steps after the read at 11 of 12 moves
    to compression; now 1, session 45), each step at the uncompressed choice's cost on the
    slow link.
    """
    seen = average.drop_step if drop_step is None else drop_step
    previous = average.bandwidth
    if previous is None or math.isinf(bandwidth) or math.isinf(previous):
        # First report, or no link at all (one worker: the probe reports infinite bandwidth).
        return LinkAverage(bandwidth, latency, now, drop_step=seen)
    if max(bandwidth / previous, previous / bandwidth) > how.shift_factor:
        above = bandwidth > previous
        if not above and drop_step is not None and drop_step != average.drop_step:
            return LinkAverage(bandwidth, latency, now, drop_step=seen)  # read on every rank: a level, not an outlier
        pending = tuple(p for p in average.pending if (p > previous) == above) + (bandwidth,)
        if len(pending) < how.shift_reports:
            return LinkAverage(previous, average.latency, average.at, pending, seen)  # suspected outlier: hold
        level = math.exp(math.fsum(math.log(p) for p in pending) / len(pending))
        return LinkAverage(level, latency, now, drop_step=seen)
    w = ewma_weight(average.at, now, how.half_life_s)
    smoothed = math.exp(math.log(previous) + w * (math.log(bandwidth) - math.log(previous)))
    lat = latency if average.latency is None else average.latency + w * (latency - average.latency)
    return LinkAverage(smoothed, lat, now, drop_step=seen)
