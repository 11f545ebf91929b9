"""The policy's link average (``planning.link_smoothing``) on synthetic samples."""

from __future__ import annotations

import math

import pytest

from planning.link_smoothing import LinkAverage, LinkSmoothing, ewma_weight, fold_sample

HOW = LinkSmoothing(half_life_s=5.0, shift_factor=2.0, shift_reports=2)


def test_a_sample_one_half_life_later_moves_the_log_average_halfway() -> None:
    first = fold_sample(LinkAverage(), 100e6, 0.001, 0.0, HOW)
    assert (first.bandwidth, first.latency, first.at) == (100e6, 0.001, 0.0)
    folded = fold_sample(first, 150e6, 0.003, 5.0, HOW)
    assert ewma_weight(0.0, 5.0, 5.0) == pytest.approx(0.5)
    assert folded.bandwidth == pytest.approx(math.sqrt(100e6 * 150e6))
    assert folded.latency == pytest.approx(0.002)


def test_a_lone_outlier_is_held_and_a_confirmed_shift_jumps_to_the_geometric_mean() -> None:
    steady = fold_sample(LinkAverage(), 100e6, 0.001, 0.0, HOW)
    held = fold_sample(steady, 10e6, 0.002, 1.0, HOW)
    assert held.bandwidth == 100e6 and held.at == 0.0 and held.pending == (10e6,)
    spike = fold_sample(held, 1000e6, 0.002, 2.0, HOW)  # the other side: the earlier one is dropped
    assert spike.bandwidth == 100e6 and spike.pending == (1000e6,)
    low = fold_sample(fold_sample(spike, 10e6, 0.002, 3.0, HOW), 40e6, 0.004, 4.0, HOW)
    assert low.bandwidth == pytest.approx(20e6) and low.pending == () and low.latency == 0.004


def test_an_infinite_link_one_worker_replaces_the_average() -> None:
    steady = fold_sample(LinkAverage(), 100e6, 0.001, 0.0, HOW)
    assert fold_sample(steady, math.inf, 0.0, 1.0, HOW).bandwidth == math.inf


def test_a_drop_the_workers_read_moves_the_average_at_once_and_only_once() -> None:
    """A report that brings a new ``link_drop_step`` is the drop's level, not a lone sample; the
    same drop step on later reports, a rise, or a small change is folded as before."""
    steady = fold_sample(LinkAverage(), 1000e6, 0.001, 0.0, HOW, drop_step=None)
    dropped = fold_sample(steady, 50e6, 0.002, 1.0, HOW, drop_step=45)
    assert (dropped.bandwidth, dropped.latency, dropped.at, dropped.pending) == (50e6, 0.002, 1.0, ())
    assert dropped.drop_step == 45
    # The next report repeats the drop step: a lone spike back up is held as before.
    spike = fold_sample(dropped, 1000e6, 0.002, 1.1, HOW, drop_step=45)
    assert spike.bandwidth == 50e6 and spike.pending == (1000e6,) and spike.drop_step == 45
    # The same drop step again with a sample far below: no longer new, so held for confirmation.
    lower = fold_sample(dropped, 5e6, 0.002, 1.2, HOW, drop_step=45)
    assert lower.bandwidth == 50e6 and lower.pending == (5e6,)
    # A report without the field keeps the drop step it saw (a coordinator's older worker).
    assert fold_sample(dropped, 50e6, 0.002, 1.3, HOW, drop_step=None).drop_step == 45
    # A new drop step with a sample not a shift below the average is folded as usual.
    mild = fold_sample(steady, 800e6, 0.001, 5.0, HOW, drop_step=50)
    assert mild.bandwidth == pytest.approx(math.sqrt(1000e6 * 800e6)) and mild.drop_step == 50
    # ... and with a sample above the average (no drop to take) it is held as a rise would be.
    up = fold_sample(steady, 5000e6, 0.001, 1.0, HOW, drop_step=50)
    assert up.bandwidth == 1000e6 and up.pending == (5000e6,)
