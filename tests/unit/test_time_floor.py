"""The time rule applied to uncompressed runs (``benchmarks.adaptive.time_floor``): worked out
by hand on curves whose crossings are known."""

from __future__ import annotations

import pytest

from benchmarks.adaptive.time_floor import time_floor_line, uncompressed_time_floor


def run(seed: int, offset: int, steps: int = 300) -> dict:
    """A run evaluated every 15 steps, at wall k seconds for the k-th evaluation, its held-out
    loss 100 - k + offset (whole numbers: no rounding decides a crossing)."""
    return {"seed": seed, "steps": steps, "eval": [[15 * k, float(k), float(100 - k + offset)] for k in range(1, steps // 15 + 1)]}


def test_runs_that_repeat_each_other_score_one() -> None:
    floor = uncompressed_time_floor([run(seed, 0) for seed in range(4) for _ in range(3)])
    assert floor is not None and floor["interval"] == [1.0, 1.0] and floor["within"] == 1.0
    assert floor["seeds"] == 4 and floor["runs_per_seed"] == [3] and floor["margin"] == 1.05


def test_one_seed_of_three_offset_runs_scores_as_worked_out() -> None:
    """Offsets 0, 1, 2. The target is the third run's loss at step 270 (the 18th evaluation), so
    a run with offset o crosses it at evaluation 18 + o - o_target. Over the six orders the
    contender ÷ best is 16/17, 17/19, 17/16, 19/20, 19/17, 20/19: at most 1.05 in three."""
    floor = uncompressed_time_floor([run(0, 0), run(0, 1), run(0, 2)], draws=4000)
    assert floor is not None
    assert floor["within"] == pytest.approx(0.5, abs=0.04)
    assert floor["interval"] == [round(17 / 19, 3), round(19 / 17, 3)]
    assert "at most 1.05 in" in time_floor_line(floor) and "3 reference runs" in time_floor_line(floor)


def test_a_contender_that_never_reaches_the_target_is_a_miss() -> None:
    """Offsets 0, 0, 5: with the offset run as the contender against a target of offset 0 it
    crosses at evaluation 23, after the last (20): a miss, whenever it is drawn so (a third of
    draws); as the target it lets the others cross at 13."""
    floor = uncompressed_time_floor([run(0, 0), run(0, 0), run(0, 5)], draws=3000)
    assert floor is not None and floor["interval"][1] is None
    assert floor["within"] == pytest.approx(2 / 3, abs=0.04)


def test_without_three_runs_on_a_seed_there_is_no_floor() -> None:
    assert uncompressed_time_floor([run(0, 0), run(0, 1), run(1, 0)]) is None
    assert uncompressed_time_floor([]) is None


def test_the_finish_is_the_descent_after_the_target_against_the_scatter_there() -> None:
    """Every run falls 82 + o -> 80 + o from step 270 to 300 (descent 2) but seed 1's last,
    whose final evaluation lies 5 lower (descent 7): the median of 2, 2, 2, 2, 2, 7 is 2 (a mean
    would be 2.83). Seed 0's offsets 0, 1, 2 have a (sample) variance of 1 at step 270, seed
    1's 0, 0, 0 none: pooled, sqrt(1/2)."""
    steep = run(1, 0)
    steep["eval"][-1][2] -= 5
    floor = uncompressed_time_floor([run(0, 0), run(0, 1), run(0, 2), run(1, 0), run(1, 0), steep])
    assert floor is not None and floor["finish"] == {"descent": 2.0, "scatter": pytest.approx(0.70711, abs=1e-9)}
    assert "falls 2.0000 (median), against a scatter of 0.7071" in time_floor_line(floor)
