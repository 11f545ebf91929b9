"""How a label's runs compare with another's over the seeds: times paired by seed, and which
fixed choice is best by that measure.

Why a module of its own: the verdict (``benchmarks.adaptive.results``) and the intervals drawn
about it (``benchmarks.adaptive.intervals``) must pair and pick by the very same rule.
"""

from __future__ import annotations

import math
from statistics import median_high
from typing import Any, Sequence

from benchmarks.adaptive.scenarios import ADAPTIVE
from benchmarks.adaptive.targets import by_seed


def is_adaptive(label: str) -> bool:
    """Whether a run's label is the adaptive policy's (every other label is a fixed choice)."""
    return label.startswith(ADAPTIVE)


def or_inf(value: float | None) -> float:
    """A time to target with a miss (None) as infinity, so that it sorts last."""
    return math.inf if value is None else value


def median_run(repeats: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The run at the median time to target (the upper one of an even count; a miss counts as
    the longest): the run that stands for a label (``results.combine_repeats``)."""
    return sorted(repeats, key=lambda r: or_inf(r["time_to_target_s"]))[len(repeats) // 2]


def entry_of(repeats: list[dict[str, Any]]) -> dict[str, Any]:
    """A label's entry from its runs (drawn again, or gathered from several result files): the
    runs, and the time of the one at the median (:func:`median_run`), which :func:`best_fixed`
    breaks ties by."""
    return {"repeats": repeats, "time_to_target_s": median_run(repeats)["time_to_target_s"] if repeats else None}


def best_fixed(runs: dict[str, dict[str, Any]], fixed: Sequence[str]) -> str:
    """The best fixed choice, judged by the measure the verdict judges adaptive by.

    Of the fixed choices no other fixed choice beats (none with a :func:`paired_ratio` below 1
    against it; all of them if every one is beaten, a cycle), the one with the least geometric
    mean over seeds of its time to target ÷ ``none``'s on the same seed (a miss: infinite);
    without ``none`` in the scenario, the least median-run time.

    Why: until session 18 the best fixed choice was the one with the least time of the run at
    the median, whose seed differs between labels, so the pick mixed seeds. In session 17's
    oscillating repeats it named PowerSGD r4 (its median run 14.13 s, fp16's 14.30 s on another
    seed) where fp16 is ahead of it on both seeds. Why the geometric mean among the unbeaten:
    with two seeds the paired ratio is the worse seed's, so two choices that each win a seed are
    both unbeaten (steady-fast in the same run: ``none`` 0.2 % ahead of fp16 on seed 0, fp16
    20 % ahead on seed 1), and the geometric mean weighs both seeds.
    """
    def beaten(label: str) -> bool:
        return any(raw_paired_ratio(runs[other], runs[label]) < 1 for other in fixed if other != label)

    contenders = [label for label in fixed if not beaten(label)] or list(fixed)
    if "none" not in runs:
        return min(contenders, key=lambda label: or_inf(runs[label]["time_to_target_s"]))
    reference = times_by_seed(runs["none"])

    def geometric_mean_to_none(label: str) -> float:
        mine = times_by_seed(runs[label])
        ratios = [mine[seed] / reference[seed] for seed in mine.keys() & reference.keys()]
        if not ratios or any(math.isinf(r) or r <= 0 for r in ratios):
            return math.inf
        return math.exp(sum(math.log(r) for r in ratios) / len(ratios))

    return min(contenders, key=lambda label: (geometric_mean_to_none(label), or_inf(runs[label]["time_to_target_s"])))


def times_by_seed(entry: dict[str, Any]) -> dict[Any, float]:
    """A label's time to target per seed, the median of the seed's repeats (a miss: inf).
    The runs of a one-seed result file form one group."""
    return {seed: median_high(or_inf(r["time_to_target_s"]) for r in runs)
            for seed, runs in by_seed(entry.get("repeats") or [entry]).items()}


def paired_ratio(entry: dict[str, Any], best: dict[str, Any]) -> float | None:
    """The median over seeds of ``entry``'s time to target ÷ ``best``'s on the same seed.

    A seed where only ``entry`` missed counts as an infinite ratio, one where only ``best``
    missed as 0, one where both missed is left out. None: no seed to compare, or the median
    is a miss.
    """
    value = raw_paired_ratio(entry, best)
    return round(value, 3) if math.isfinite(value) else None


def raw_paired_ratio(entry: dict[str, Any], best: dict[str, Any]) -> float:
    """:func:`paired_ratio` unrounded, a miss as infinity (and nothing to compare as NaN, which
    is below nothing and above nothing)."""
    mine, theirs = times_by_seed(entry), times_by_seed(best)
    ratios = [0.0 if math.isinf(theirs[seed]) else mine[seed] / theirs[seed]
              for seed in mine.keys() & theirs.keys() if not (math.isinf(mine[seed]) and math.isinf(theirs[seed]))]
    return median_high(ratios) if ratios else math.nan
