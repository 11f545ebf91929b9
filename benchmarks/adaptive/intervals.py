"""How far drawing the runs again moves a verdict: bootstrap intervals about each label's
ratio to the best fixed choice (and its final against uncompressed training's).

Two draws, for two questions. :func:`ratio_intervals` draws each seed's rounds again: how far
the machine's run-to-run scatter moves the ratio (three runs a seed, sessions 17-18).
:func:`seed_draws` draws the seeds again: how far another draw of as many seeds could move the
verdict, and in what share of draws it meets the issue's margins (many seeds, one run each,
sessions 40-42).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from statistics import median_high
from typing import Any, Callable, Sequence

from benchmarks.adaptive.pairing import best_fixed, entry_of, is_adaptive, raw_paired_ratio
from benchmarks.adaptive.targets import FINAL_MARGIN, RATIO_MARGIN, by_seed

#: Bootstrap draws behind a ratio's interval, and the interval's quantiles (90 %).
INTERVAL_DRAWS = 2000
INTERVAL_QUANTILES = (0.05, 0.95)


def ratio_intervals(runs: dict[str, dict[str, Any]], draws: int = INTERVAL_DRAWS,
                    seed: int = 0) -> dict[str, list[float | None]] | None:
    """Each label's ratio to the best fixed choice as a bootstrap interval (5th-95th
    percentile): how far recombining the runs moves the verdict.

    Each draw takes the rounds of each seed again with replacement (:func:`_drawn_again`), picks
    the best fixed choice again (:func:`best_fixed`: which choice is best is itself a product
    of the noise, and the least of several noisy fixed times favours them) and takes the paired
    ratio (:func:`paired_ratio`); a bound that is a miss is None. Why: the same run repeated
    differs by up to ±10 % in total time on this machine (``none`` against fp16 on steady-fast
    ranged 0.85-1.25 over 26 result files), and a ratio from three runs a seed hides that.
    What it is not: a 90 % confidence interval. With three runs a seed a draw can only
    recombine the runs there are, so the interval is bounded by the extreme runs and
    understates the spread a new set of runs would show; read it as a floor on the
    uncertainty. None when no seed has two runs of any label (nothing to resample).
    Deterministic for a given ``seed``.
    """
    grouped = {label: by_seed(entry.get("repeats") or [entry]) for label, entry in runs.items()}
    if not any(len(group) >= 2 for seeds in grouped.values() for group in seeds.values()):
        return None
    rng = random.Random(seed)
    fixed = [label for label in runs if not is_adaptive(label)]
    samples: dict[str, list[float]] = {label: [] for label in runs}
    for _ in range(draws):
        drawn = _drawn_again(grouped, rng)
        best = drawn[best_fixed(drawn, fixed)]
        for label, entry in drawn.items():
            samples[label].append(raw_paired_ratio(entry, best))
    return {label: [quantile(values, q) for q in INTERVAL_QUANTILES] for label, values in samples.items()}


def _drawn_again(grouped: dict[str, dict[Any, list[dict[str, Any]]]], rng: random.Random) -> dict[str, dict[str, Any]]:
    """Every label's entry from its runs drawn again with replacement, seed by seed.

    Where every label ran a seed equally often, whole rounds are drawn (a label's i-th run on
    a seed ran in the i-th round, beside the other labels' i-th runs: ``run_scenario`` runs
    every choice once a round), so a round in which the machine was slow moves every label
    alike, as it did; otherwise each label's runs are drawn alone.
    """
    repeats: dict[str, list[dict[str, Any]]] = {label: [] for label in grouped}
    for seed in dict.fromkeys(s for seeds in grouped.values() for s in seeds):
        groups = {label: seeds.get(seed, []) for label, seeds in grouped.items()}
        counts = {len(group) for group in groups.values()}
        if len(counts) == 1:
            n = counts.pop()
            rounds = [rng.randrange(n) for _ in range(n)]
            for label, group in groups.items():
                repeats[label] += [group[i] for i in rounds]
        else:
            for label, group in groups.items():
                repeats[label] += [rng.choice(group) for _ in group]
    return {label: entry_of(chosen) for label, chosen in repeats.items()}


def quantile(values: Sequence[float], q: float, digits: int = 3) -> float | None:
    """The value at index ``floor(q·n)`` of ``values`` in order (the ``q`` quantile to within one
    draw of 2000), rounded to ``digits``; None for a miss (infinite, or no seed to compare)."""
    ordered = sorted(values, key=lambda v: math.inf if math.isnan(v) else v)
    value = ordered[min(len(ordered) - 1, int(q * len(ordered)))]
    return round(value, digits) if math.isfinite(value) else None


@dataclass(frozen=True)
class SeedDraws:
    """What each draw of the seeds came to: the seeds drawn from, and per label the ratio to the
    best fixed choice and the final vs none of every draw (a miss: inf; nothing to compare or
    no final: NaN)."""

    seeds: list[Any]
    ratios: dict[str, list[float]]
    finals: dict[str, list[float]]

    def within(self, label: str, draw: int) -> tuple[bool, bool]:
        """Whether ``label`` met the time margin and the finals margin in draw ``draw``."""
        return self.ratios[label][draw] <= RATIO_MARGIN, self.finals[label][draw] <= FINAL_MARGIN


def draw_seeds(runs: dict[str, dict[str, Any]], draws: int = INTERVAL_DRAWS, seed: int = 0) -> SeedDraws | None:
    """Draw the seeds again ``draws`` times (:func:`seed_draws` says how and why); None with
    fewer than two seeds. Deterministic for a given ``seed``: runs on the same seeds, in the
    same order, are drawn alike, so the draws of several scenarios pair up."""
    grouped = {label: by_seed(entry.get("repeats") or [entry]) for label, entry in runs.items()}
    seeds = list(dict.fromkeys(s for by_label in grouped.values() for s in by_label))
    if len(seeds) < 2 or None in seeds:
        return None
    rng = random.Random(seed)
    fixed = [label for label in runs if not is_adaptive(label)]
    ratios: dict[str, list[float]] = {label: [] for label in runs}
    finals: dict[str, list[float]] = {label: [] for label in runs}
    for _ in range(draws):
        chosen = [rng.choice(seeds) for _ in seeds]
        drawn = {label: entry_of([{**run, "seed": position} for position, s in enumerate(chosen)
                                   for run in by_label.get(s, [])])
                 for label, by_label in grouped.items()}
        best = drawn[best_fixed(drawn, fixed)]
        for label, entry in drawn.items():
            ratios[label].append(raw_paired_ratio(entry, best))
            offsets = [r["final_vs_none"] for r in entry["repeats"] if r.get("final_vs_none") is not None]
            finals[label].append(median_high(offsets) if offsets else math.nan)
    return SeedDraws(seeds=seeds, ratios=ratios, finals=finals)


def seed_draws(runs: dict[str, dict[str, Any]], draws: int = INTERVAL_DRAWS, seed: int = 0) -> dict[str, Any] | None:
    """Each label's ratio to the best fixed choice and its final against uncompressed training's
    over the seeds drawn again with replacement: 5th-95th percentiles, and the share of draws
    within the issue's margins (a ratio at most :data:`RATIO_MARGIN`, a final at most
    :data:`FINAL_MARGIN` above uncompressed; the finals only where every run has its
    ``final_vs_none``).

    A draw takes as many seeds as there are, with replacement, each with every run of every
    label on it (a seed's runs ran beside each other and share its target); a seed drawn twice
    counts twice. The best fixed choice is picked again in each draw (:func:`best_fixed`). Why:
    the verdict is a median over seeds, each seed's time read off the first noisy evaluation
    below its target, and the same code's verdict moved from 0.935 to 1.145 between two batches
    of four seeds (steady-slow, session 41), nearly the same code's from 1.126 to 0.961 between
    two batches of twelve (steady-fast, sessions 40 and 41). Whether a median over N seeds meets
    a 5 % margin is a question of how far it moves with the draw. What it is not: a confidence
    interval of the policy's true ratio (a bootstrap of a median over few seeds is coarse, and
    draws only the seeds there are). None with fewer than two seeds. Deterministic for a given ``seed``.
    """
    drawn = draw_seeds(runs, draws, seed)
    if drawn is None:
        return None
    out: dict[str, Any] = {
        "seeds": len(drawn.seeds), "draws": draws, "ratio_margin": RATIO_MARGIN,
        "ratio": {label: [quantile(v, q) for q in INTERVAL_QUANTILES] for label, v in drawn.ratios.items()},
        "ratio_within": {label: share(v, lambda r: r <= RATIO_MARGIN) for label, v in drawn.ratios.items()}}
    if all(not math.isnan(f) for values in drawn.finals.values() for f in values):  # files before session 42: no finals per run
        out.update({"final_margin": FINAL_MARGIN,
                    "final_vs_none": {label: [quantile(v, q, digits=4) for q in INTERVAL_QUANTILES] for label, v in drawn.finals.items()},
                    "final_within": {label: share(v, lambda f: f <= FINAL_MARGIN) for label, v in drawn.finals.items()}})
    return out


def acceptance_draws(scenarios: Sequence[dict[str, dict[str, Any]]], label: str,
                     draws: int = INTERVAL_DRAWS, seed: int = 0) -> dict[str, Any] | None:
    """The share of seed draws in which ``label`` meets the issue's margins in every scenario at
    once: its time (``time``), its final (``finals``) and both (``both``).

    ``scenarios``: each scenario's runs by label, on the same seeds in the same order, so that a
    draw takes the same seeds in every scenario (:func:`draw_seeds`). Why: the acceptance asks
    for both margins in every scenario, and a share per scenario does not say how often they
    hold together. The finals only where every run has its ``final_vs_none``. None where a
    scenario lacks ``label``, has fewer than two seeds or other seeds.
    """
    if not scenarios or any(label not in runs for runs in scenarios):
        return None
    drawn = [d for d in (draw_seeds(runs, draws, seed) for runs in scenarios) if d is not None]
    if len(drawn) != len(scenarios) or len({tuple(d.seeds) for d in drawn}) != 1:
        return None
    outcomes = [[d.within(label, i) for d in drawn] for i in range(draws)]
    out: dict[str, Any] = {"label": label, "draws": draws, "scenarios": len(scenarios),
                           "time": share([all(t for t, _ in o) for o in outcomes], bool)}
    if not any(math.isnan(f) for d in drawn for f in d.finals[label]):  # files before session 42: no finals per run
        out.update({"finals": share([all(f for _, f in o) for o in outcomes], bool),
                    "both": share([all(t and f for t, f in o) for o in outcomes], bool)})
    return out


def share(values: Sequence[float], within: Callable[[float], bool]) -> float:
    """The share of ``values`` for which ``within`` holds (a NaN, nothing to compare, never
    does), to three places: the share of draws that meet a margin."""
    return round(sum(1 for v in values if not math.isnan(v) and within(v)) / len(values), 3)
