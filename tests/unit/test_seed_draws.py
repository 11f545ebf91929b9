"""How far drawing the seeds again moves a verdict (``benchmarks.adaptive.intervals.seed_draws``):
checked against the binomial law a median over drawn seeds follows."""

from __future__ import annotations

from math import comb
from typing import Any

import pytest

from benchmarks.adaptive.intervals import seed_draws
from benchmarks.adaptive.report import seed_draws_table
from benchmarks.adaptive.results import scenario_verdict


def entry(times: dict[Any, float | None], finals: dict[Any, float] | None = None) -> dict[str, Any]:
    """A label's entry as ``results.combine_repeats`` writes it: one run a seed."""
    repeats = [{"seed": seed, "time_to_target_s": t, **({"final_vs_none": finals[seed]} if finals else {})}
               for seed, t in times.items()]
    ordered = sorted(times.values(), key=lambda t: float("inf") if t is None else t)
    return {"time_to_target_s": ordered[len(ordered) // 2], "repeats": repeats, "final_eval": 1.0, "final_vs_none": 0.0}


def at_least(k: int, n: int, p: float) -> float:
    """P(Binomial(n, p) >= k)."""
    return sum(comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(k, n + 1))


def test_a_label_as_fast_as_the_best_on_every_seed_never_moves() -> None:
    none = {seed: 10.0 + seed for seed in range(6)}
    drawn = seed_draws({"none": entry(none), "slow": entry({s: 1.1 * t for s, t in none.items()}),
                        "adaptive": entry(dict(none))})
    assert drawn is not None and drawn["seeds"] == 6 and drawn["ratio_margin"] == 1.05
    assert drawn["ratio"]["adaptive"] == [1.0, 1.0] and drawn["ratio_within"]["adaptive"] == 1.0
    assert drawn["ratio"]["slow"] == [1.1, 1.1] and drawn["ratio_within"]["slow"] == 0.0


def test_the_share_within_the_margin_is_the_binomial_chance_that_the_median_seed_is() -> None:
    """Ten seeds, adaptive 0.9x ``none`` on five and 1.2x on the others. The upper median of ten
    drawn seeds is within 1.05 when six or more of them are fast ones: P = 0.377."""
    none = {seed: 10.0 for seed in range(10)}
    adaptive = {seed: 9.0 if seed < 5 else 12.0 for seed in range(10)}
    drawn = seed_draws({"none": entry(none), "adaptive": entry(adaptive)}, draws=4000)
    assert drawn is not None
    assert drawn["ratio_within"]["adaptive"] == pytest.approx(at_least(6, 10, 0.5), abs=0.03)
    assert drawn["ratio"]["adaptive"] == [0.9, 1.2]
    assert seed_draws({"none": entry(none), "adaptive": entry(adaptive)}, draws=4000) == drawn  # deterministic


def test_a_seed_drawn_twice_counts_twice() -> None:
    """Three seeds, adaptive fast on one. Within the margin when the fast seed is drawn at least
    twice of three (P = 7/27); a draw that merged a seed drawn twice into one would be within
    only when every draw is the fast seed (1/27)."""
    none = {"a": 10.0, "b": 10.0, "c": 10.0}
    drawn = seed_draws({"none": entry(none), "adaptive": entry({"a": 9.0, "b": 12.0, "c": 12.0})}, draws=4000)
    assert drawn is not None
    assert drawn["ratio_within"]["adaptive"] == pytest.approx(at_least(2, 3, 1 / 3), abs=0.03)


def test_the_best_fixed_choice_is_picked_again_in_each_draw() -> None:
    """``x`` is best on seeds 0-2, ``y`` on 3-5 (each 0.8x the other there). A draw with more
    of one kind makes that one best: each is best in some draws, so each one's ratio runs from
    1.0 (best) to the other's advantage."""
    none = {seed: 20.0 for seed in range(6)}
    x = {seed: 8.0 if seed < 3 else 10.0 for seed in range(6)}
    y = {seed: 10.0 if seed < 3 else 8.0 for seed in range(6)}
    drawn = seed_draws({"none": entry(none), "x": entry(x), "y": entry(y)})
    assert drawn is not None
    assert drawn["ratio"]["x"] == [1.0, 1.25] and drawn["ratio"]["y"] == [1.0, 1.25]
    assert 0.0 < drawn["ratio_within"]["x"] < 1.0 and drawn["ratio_within"]["none"] == 0.0


def test_the_finals_are_drawn_with_their_seeds() -> None:
    """Finals +2 % on four seeds of eight and 0 % on the others: the upper median of eight drawn
    is within +1 % when five or more are the 0 % seeds."""
    none = {seed: 10.0 for seed in range(8)}
    finals = {seed: 0.02 if seed < 4 else 0.0 for seed in range(8)}
    runs = {"none": entry(none, {seed: 0.0 for seed in none}), "adaptive": entry(dict(none), finals)}
    drawn = seed_draws(runs, draws=4000)
    assert drawn is not None and drawn["final_margin"] == 0.01
    assert drawn["final_vs_none"]["adaptive"] == [0.0, 0.02] and drawn["final_vs_none"]["none"] == [0.0, 0.0]
    assert drawn["final_within"]["adaptive"] == pytest.approx(at_least(5, 8, 0.5), abs=0.03)
    assert drawn["final_within"]["none"] == 1.0
    table = "\n".join(seed_draws_table(drawn))
    assert "| adaptive | 1.000 to 1.000 | 100% | +0.0% to +2.0% |" in table and "at most +1% in" in table


def test_without_finals_per_run_or_with_one_seed_there_is_less_to_draw() -> None:
    two = {"none": entry({0: 10.0, 1: 20.0}), "adaptive": entry({0: 11.0, 1: None})}
    drawn = seed_draws(two)
    assert drawn is not None and "final_vs_none" not in drawn and "final vs none" not in "\n".join(seed_draws_table(drawn))
    assert drawn["ratio"]["adaptive"] == [1.1, None]  # a draw of seed 1 twice is a miss
    assert scenario_verdict(two)["seed_draws"] == drawn
    one = {"none": entry({0: 10.0}), "adaptive": entry({0: 11.0})}
    assert seed_draws(one) is None and "seed_draws" not in scenario_verdict(one)
    unnamed = {"none": entry({None: 10.0}), "adaptive": entry({None: 11.0})}
    assert seed_draws(unnamed) is None  # a one-seed result file of before session 19


def test_the_acceptance_holds_in_a_draw_only_where_every_scenario_meets_it() -> None:
    """Two scenarios on the same ten seeds. Adaptive is within the margin when six or more of
    the ten drawn seeds are ones it is fast on. Fast on the same seeds in both: the scenarios
    pass together as often as one does (the draws pair up). Fast on seeds 0-4 in one and 5-9 in
    the other: never both, as six of one kind leave four of the other."""
    from benchmarks.adaptive.intervals import acceptance_draws

    none = {seed: 10.0 for seed in range(10)}
    finals = {seed: 0.0 for seed in range(10)}
    low = {"none": entry(none, finals), "adaptive": entry({s: 9.0 if s < 5 else 12.0 for s in none}, finals)}
    high = {"none": entry(none, finals), "adaptive": entry({s: 12.0 if s < 5 else 9.0 for s in none}, finals)}
    alone = acceptance_draws([low], "adaptive", draws=4000)
    assert alone is not None and alone["time"] == pytest.approx(at_least(6, 10, 0.5), abs=0.03)
    assert alone["finals"] == 1.0 and alone["both"] == alone["time"]
    assert acceptance_draws([low, low], "adaptive", draws=4000) == {**alone, "scenarios": 2}
    apart = acceptance_draws([low, high], "adaptive", draws=4000)
    assert apart is not None and apart["time"] == 0.0 and apart["both"] == 0.0 and apart["finals"] == 1.0
    shifted = {label: entry({s + 1: t for s, t in none.items()}, {s + 1: 0.0 for s in none}) for label in ("none", "adaptive")}
    assert acceptance_draws([low, shifted], "adaptive") is None  # other seeds: the draws do not pair up
