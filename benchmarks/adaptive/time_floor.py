"""The time rule applied to uncompressed runs: how often one run of uncompressed training scores
above the issue's 1.05 against another, on the seeds at hand.

Why a module of its own: the finals rule has its floor (``benchmarks.adaptive.finals_floor``);
the time rule needs one too. A seed's reference runs of ``none``
(``benchmarks.adaptive.cli.run_references``) differ only in the order of the training samples
and all ran on the fastest link the scenarios have, so any ratio between their times to target
is the rule's own scatter: what a choice exactly as good as the best fixed one could score by
the draw. (It is one figure for every scenario with the same number of steps, printed under
each.) The verdict's time to target is the wall time of the first evaluation at or below the
seed's target (``targets.time_to_target``), evaluations every 15 steps of 300. Under the
cosine schedule the curve scatters about 0.024 between evaluations while its trend falls about
0.005 over the last 30 steps; :func:`finish` measures that fall and how far a seed's runs lie
apart at the target's step, on the runs at hand, so a schedule can be judged by how well its
finish tells runs apart before any policy is judged with it.
"""

from __future__ import annotations

import random
from math import sqrt
from statistics import fmean, median, variance
from typing import Any, Sequence

from benchmarks.adaptive.intervals import INTERVAL_DRAWS, INTERVAL_QUANTILES, quantile, share
from benchmarks.adaptive.pairing import raw_paired_ratio
from benchmarks.adaptive.targets import RATIO_MARGIN, by_seed, target_at, time_to_target


def uncompressed_time_floor(runs: Sequence[dict[str, Any]], margin: float = RATIO_MARGIN,
                            draws: int = INTERVAL_DRAWS, seed: int = 0) -> dict[str, Any] | None:
    """The paired ratio of one uncompressed run's time to target over another's, as the verdict
    takes it, for runs that differ only in their order of the training samples.

    ``runs``: uncompressed runs (``{"seed", "steps", "eval"}``, ``eval`` rows of
    ``[step, wall_s, loss]``): the benchmark passes a seed's reference runs. Each draw takes, on
    every seed with three runs or more, one run as the contender, another as the best fixed
    choice and the median of the others' held-out loss at 90 % of the steps as the seed's target
    (the benchmark's target is the median of three references; here of the one run or more
    left), judges both against it, and takes the median over seeds of contender ÷ best by the
    verdict's own rule (``pairing.raw_paired_ratio``: a seed where both miss left out, only the
    contender: infinite, only the best: 0). Returns the 5th-95th percentile of that median over
    ``draws`` draws (``interval``), the share of draws at most ``margin`` (``within``: one-sided,
    as the verdict's margin is) and the seeds used (``seeds``); None without a seed with three
    runs. Deterministic for a given ``seed``.

    What it is not: the whole verdict's floor. The verdict also picks the best of several
    fixed choices, each a draw of its own, which favours them; this pairs two runs only.
    """
    usable = [seed_runs for seed_runs in by_seed([r for r in runs if r.get("eval")]).values() if len(seed_runs) >= 3]
    if not usable:
        return None
    rng = random.Random(seed)
    medians = []
    for _ in range(draws):
        contender: list[dict[str, Any]] = []
        best: list[dict[str, Any]] = []
        for position, seed_runs in enumerate(usable):
            mine, theirs, *others = rng.sample(seed_runs, len(seed_runs))
            target = median(target_at(r["eval"], r["steps"]) for r in others)
            contender.append({"seed": position, "time_to_target_s": time_to_target(mine["eval"], target)})
            best.append({"seed": position, "time_to_target_s": time_to_target(theirs["eval"], target)})
        medians.append(raw_paired_ratio({"repeats": contender}, {"repeats": best}))
    return {"interval": [quantile(medians, q) for q in INTERVAL_QUANTILES],
            "within": share(medians, lambda m: m <= margin), "margin": margin, "seeds": len(usable),
            "runs_per_seed": sorted({len(seed_runs) for seed_runs in usable}), "finish": finish(usable)}


def finish(seeds: Sequence[Sequence[dict[str, Any]]]) -> dict[str, float]:
    """How well the finish tells runs apart: what the curve still falls after the target's step
    against how far runs of one seed lie apart there.

    ``descent``: the median over runs of the held-out loss at 90 % of the steps less the last
    evaluation's (what a run one evaluation late still has to make up is a part of it);
    ``scatter``: the standard deviation of the loss at 90 % of the steps among a seed's runs,
    pooled over seeds (the root of the mean variance). A scatter several times the descent is
    a finish decided by the draw: which run's curve lies below the target is then a matter of
    its offset, not of how fast it falls. Every seed needs two runs or more (the floor passes
    those with three).
    """
    at_target = [[(target_at(r["eval"], r["steps"]), r["eval"][-1][2]) for r in runs] for runs in seeds]
    descents = [at - last for runs in at_target for at, last in runs]
    variances = [variance([at for at, _ in runs]) for runs in at_target]
    return {"descent": round(median(descents), 5), "scatter": round(sqrt(fmean(variances)), 5)}


def time_floor_line(floor: dict[str, Any]) -> str:
    """:func:`uncompressed_time_floor` in words."""
    low, high = ("miss" if b is None else f"{b:.3f}" for b in floor["interval"])
    per_seed = "/".join(map(str, floor["runs_per_seed"]))
    return (f"An uncompressed run by the same time rule (one of a seed's {per_seed} reference runs of `none` against "
            f"another, the seed's target from the rest, the median over {floor['seeds']} seeds; the references ran on "
            f"the fastest link): {low} to {high} (5th-95th percentile), at most {floor['margin']:g} in "
            f"{floor['within']:.0%} of draws.{finish_text(floor.get('finish'))}")


def finish_text(numbers: dict[str, float] | None) -> str:
    """:func:`finish` in words (nothing for result files written before it)."""
    if not numbers:
        return ""
    return (f" After the target's step the curve falls {numbers['descent']:.4f} (median), against a scatter of "
            f"{numbers['scatter']:.4f} among a seed's runs there.")
