"""The finals rule applied to uncompressed runs: how often a run that loses nothing scores
above the issue's margin, on the seeds at hand.

Why a module of its own: it reads the verdict's "vs none" (``benchmarks.adaptive.results``)
against the runs of ``none`` that set each seed's uncompressed final
(``benchmarks.adaptive.targets``); the benchmark's result, its merge and the re-judging of kept
runs (``benchmarks.adaptive.rejudge``) all report it.
"""

from __future__ import annotations

import random
from statistics import median, median_high
from typing import Any, Sequence

from benchmarks.adaptive.intervals import INTERVAL_DRAWS, INTERVAL_QUANTILES, quantile, share
from benchmarks.adaptive.targets import FINAL_MARGIN, by_seed


def uncompressed_floor(none_runs: Sequence[dict[str, Any]], references: Sequence[dict[str, Any]] = (),
                       margin: float = FINAL_MARGIN, draws: int = INTERVAL_DRAWS, seed: int = 0) -> dict[str, Any] | None:
    """How an uncompressed run fares by the finals rule: where "vs none" lands for a run that
    loses nothing, on these seeds.

    Each of a seed's uncompressed runs (the judged ``none`` runs and the references) is set
    against the median of the seed's others, as a judged run is set against the median of all
    of them (``targets.uncompressed_finals``); a draw takes one such run a seed and the median
    over the seeds (the upper median), as the verdict's "vs none" does
    (``results.combine_repeats``). Returns the 5th-95th percentile of that median over
    ``draws`` draws (``interval``, a share: 0.01 is +1 %), the share of draws above ``margin``
    (``above_margin``) and the seeds with two runs or more (``seeds``); None without such a
    seed. Deterministic for a given ``seed``.

    Why: the finals of one seed's uncompressed runs, which differ only in the order of the
    training samples, lay 2.4-6.9 % apart on seeds 16-19 (one run's sd against the seed's
    others: 2.9 %), and fp16, whose error is 2e-4, scored +2.0 % on those seeds. A verdict of
    +2 % on four seeds says nothing of a compressor unless an uncompressed run would rarely
    score it; this says how often one does, from the runs at hand.
    """
    grouped = [runs for runs in by_seed([*none_runs, *references]).values() if len(runs) >= 2]
    if not grouped:
        return None
    offsets = [[run["final_eval"] / median([o["final_eval"] for j, o in enumerate(runs) if j != i]) - 1
                for i, run in enumerate(runs)] for runs in grouped]
    rng = random.Random(seed)
    medians = [median_high([rng.choice(seed_offsets) for seed_offsets in offsets]) for _ in range(draws)]
    return {"interval": [quantile(medians, q, digits=4) for q in INTERVAL_QUANTILES],
            "above_margin": share(medians, lambda m: m > margin), "margin": margin, "seeds": len(grouped)}


def scenario_floor(scenario: dict[str, Any]) -> dict[str, Any] | None:
    """:func:`uncompressed_floor` of a stored scenario: its ``none`` runs (each seed's run in the
    entry's ``repeats``) and its reference runs; None without references (the finals are then
    judged against the ``none`` run itself)."""
    references = scenario.get("references") or []
    none = scenario["runs"].get("none")
    if not references or none is None:
        return None
    return uncompressed_floor(none.get("repeats") or [none], references)
