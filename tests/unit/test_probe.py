"""The α-β fit, the 2%-budget probe schedule on a fake clock, and the passive estimator."""

from __future__ import annotations

import json
import math
import random

import pytest

from planning.costmodel import ring_coefficients
from workers.link_estimate import LinkEstimate, all_reduce_seconds, fit_alpha_beta
from workers.passive_bandwidth import DROP_FACTOR, PassiveBandwidth, cycle_sample, drop_threshold, recent_steps_beta
from workers.probe import DEFAULT_SIZES, probe_link
from workers.probe_scheduler import ProbeScheduler

MB = 1e6


# --------------------------------------------------------------------------- the fit


@pytest.mark.parametrize("world_size", [2, 3, 4, 8, 64])
@pytest.mark.parametrize("alpha, bandwidth", [(50e-6, 12.5 * MB), (5e-6, 1.25e9), (1e-3, 1 * MB)])
def test_two_sizes_recover_alpha_and_beta_exactly(world_size: int, alpha: float, bandwidth: float) -> None:
    beta = 1 / bandwidth
    times = [all_reduce_seconds(b, world_size, alpha, beta) for b in DEFAULT_SIZES]
    got_alpha, got_beta = fit_alpha_beta(DEFAULT_SIZES, times, world_size)
    assert got_alpha == pytest.approx(alpha, rel=1e-9)
    assert got_beta == pytest.approx(beta, rel=1e-9)


def test_many_noisy_sizes_recover_alpha_and_beta_closely() -> None:
    rng = random.Random(0)
    alpha, beta, n = 80e-6, 1 / (25 * MB), 4
    sizes = [2**k for k in range(12, 24)] * 5
    times = [all_reduce_seconds(b, n, alpha, beta) * rng.uniform(0.98, 1.02) for b in sizes]
    got_alpha, got_beta = fit_alpha_beta(sizes, times, n)
    assert got_beta == pytest.approx(beta, rel=0.02)
    assert got_alpha == pytest.approx(alpha, rel=0.5)  # latency is a small share of these times


def test_large_no_slower_than_small_gives_a_bandwidth_lower_bound() -> None:
    # A link too fast for these sizes: noise made the large transfer the quicker one.
    alpha, beta = fit_alpha_beta([4096, 4 << 20], [2e-4, 1.9e-4], 2)
    assert alpha == 0.0
    assert beta == pytest.approx(1.9e-4 / (4 << 20))


def test_negative_intercept_is_clamped_to_zero_latency() -> None:
    sizes = [1 << 20, 2 << 20]
    alpha, beta = fit_alpha_beta(sizes, [0.9e-2, 2.0e-2], 2)
    assert alpha == 0.0
    assert beta > 0
    # refitted through the origin (n = 2: x = b), so between the two points' own t/b
    assert 0.9e-2 / sizes[0] <= beta <= 2.0e-2 / sizes[1]


@pytest.mark.parametrize(
    "sizes, times, n, match",
    [
        ([4096, 4096], [1e-4, 1e-4], 2, "two distinct"),
        ([4096], [1e-4], 2, "two distinct"),
        ([4096, 8192], [0.0, 1e-4], 2, "positive"),
        ([4096, 8192], [1e-4, 2e-4], 1, "world_size"),
    ],
)
def test_fit_rejects_unusable_input(sizes: list[int], times: list[float], n: int, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        fit_alpha_beta(sizes, times, n)


def test_ring_coefficients_follow_the_time_model() -> None:
    assert ring_coefficients("all_reduce", 4) == (6.0, 1.5)
    assert ring_coefficients("all_gather", 4) == (3.0, 3.0)
    with pytest.raises(ValueError, match="kind"):
        ring_coefficients("broadcast", 4)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- the estimate


def test_estimate_derives_bandwidth_and_latency() -> None:
    est = LinkEstimate.from_fit(1e-4, 1e-8, 4, measured_at=123.0, cost_s=0.5)
    assert est.bandwidth_bytes_per_second == pytest.approx(1e8)
    assert est.latency_s == pytest.approx(6e-4)  # 2(n-1)·α: a zero-byte all-reduce
    assert est.all_reduce_seconds(1e6) == pytest.approx(6e-4 + 1.5e6 * 1e-8)
    assert est.has_link


def test_no_link_is_free_and_infinite_and_serialises_to_json() -> None:
    est = LinkEstimate.no_link(measured_at=1.0)
    assert (est.alpha_s, est.beta_s_per_byte, est.latency_s, est.cost_s) == (0.0, 0.0, 0.0, 0.0)
    assert math.isinf(est.bandwidth_bytes_per_second)
    assert est.all_reduce_seconds(1e9) == 0.0
    assert not est.has_link
    assert json.loads(json.dumps(est.to_dict(), allow_nan=False))["bandwidth_bytes_per_second"] is None


def test_probe_without_a_process_group_returns_no_link_without_timing() -> None:
    est = probe_link()
    assert not est.has_link and est.cost_s == 0.0 and math.isinf(est.bandwidth_bytes_per_second)


def test_probe_rejects_bad_repeats() -> None:
    with pytest.raises(ValueError, match="repeats"):
        probe_link(repeats=0)


# --------------------------------------------------------------------------- the scheduler


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def advance(self, seconds: float) -> None:
        self.t += seconds


def simulate(scheduler: ProbeScheduler, run_s: float, probe_cost_s: float, step_s: float = 0.5) -> list[float]:
    """A training run that asks before every step; return the elapsed times of the probes."""
    clock, probes = FakeClock(), []
    while clock.t < run_s:
        if scheduler.due(now=clock.t, elapsed_s=clock.t):
            probes.append(clock.t)
            clock.advance(probe_cost_s)
            scheduler.record(now=clock.t, cost_s=probe_cost_s)
            assert scheduler.probes == 1 or scheduler.total_cost_s <= 0.02 * clock.t + 1e-9
        clock.advance(step_s)
    return probes


def test_first_probe_is_due_at_start() -> None:
    assert ProbeScheduler(probe_interval_s=30).due(now=0.0, elapsed_s=0.0)


def test_cheap_probes_follow_the_interval() -> None:
    probes = simulate(ProbeScheduler(probe_interval_s=30), run_s=600, probe_cost_s=0.1)
    gaps = [b - a for a, b in zip(probes, probes[1:])]
    assert probes[0] == 0.0
    assert len(probes) == pytest.approx(600 / 30, abs=1)
    assert all(30 <= g <= 31 for g in gaps)


def test_expensive_probes_are_held_to_two_percent_of_run_time() -> None:
    sched = ProbeScheduler(probe_interval_s=10)
    probes = simulate(sched, run_s=3600, probe_cost_s=2.0)
    assert sched.total_cost_s <= 0.02 * 3600 + 2.0  # the start probe is the only overshoot
    assert sched.total_cost_s >= 0.02 * 3600 - 2 * 2.0  # and the budget is actually used
    assert probes[1] >= 2 * 2.0 / 0.02 - 2.0  # the second waits until two probes are earned


def test_not_due_inside_the_interval_even_with_budget() -> None:
    sched = ProbeScheduler(probe_interval_s=60)
    sched.record(now=100.0, cost_s=0.0)
    assert not sched.due(now=159.9, elapsed_s=1e6)
    assert sched.due(now=160.0, elapsed_s=1e6)


def test_budget_blocks_until_earned_and_says_when() -> None:
    sched = ProbeScheduler(probe_interval_s=1, max_cost_fraction=0.02)
    sched.record(now=1.0, cost_s=1.0)
    assert sched.earliest_elapsed_for_next() == pytest.approx(100.0)
    assert not sched.due(now=99.0, elapsed_s=99.0)
    assert sched.due(now=100.0, elapsed_s=100.0)


def test_a_probe_expected_to_cost_more_waits_for_more_budget() -> None:
    # The link slowed 20x since the last (1 s) probe: the next one will cost ~20 s.
    sched = ProbeScheduler(probe_interval_s=1, max_cost_fraction=0.02)
    sched.record(now=1.0, cost_s=1.0)
    assert sched.due(now=100.0, elapsed_s=100.0)
    assert not sched.due(now=100.0, elapsed_s=100.0, expected_cost_s=20.0)
    assert sched.due(now=1050.0, elapsed_s=1050.0, expected_cost_s=20.0)


def test_probes_are_sized_to_about_twenty_ms_of_transfer_within_bounds() -> None:
    from workers.probe import DEFAULT_SIZES, MAX_LARGE_PROBE_BYTES, MIN_LARGE_PROBE_BYTES, PROBE_TRANSFER_S, sized_probe

    gigabit = 1e9 / 8
    small, large = sized_probe(gigabit)
    assert small == DEFAULT_SIZES[0] and large == int(gigabit * PROBE_TRANSFER_S)  # 2.5 MB, not 4 MiB
    assert sized_probe(100e9 / 8)[1] == MAX_LARGE_PROBE_BYTES  # bounded above
    assert sized_probe(50e6 / 8)[1] == MIN_LARGE_PROBE_BYTES  # never small enough to fit in a burst
    assert sized_probe(None)[1] == sized_probe(math.inf)[1] == MAX_LARGE_PROBE_BYTES


def test_no_check_before_the_first_probe() -> None:
    assert not ProbeScheduler(probe_interval_s=2).check_due(now=100.0, elapsed_s=100.0, expected_cost_s=0.0)


def test_checks_come_four_times_as_often_as_probes_and_count_towards_the_budget() -> None:
    sched = ProbeScheduler(probe_interval_s=2.0, max_cost_fraction=0.05)
    sched.record(now=0.0, cost_s=0.2)  # the start probe
    assert not sched.check_due(now=0.49, elapsed_s=100.0, expected_cost_s=0.04)  # interval / 4 not yet
    assert sched.check_due(now=0.5, elapsed_s=100.0, expected_cost_s=0.04)
    sched.record_check(now=0.54, cost_s=0.04)
    assert not sched.check_due(now=1.0, elapsed_s=100.0, expected_cost_s=0.04)  # 0.5 s from the check
    assert sched.check_due(now=1.04, elapsed_s=100.0, expected_cost_s=0.04)
    assert (sched.checks, sched.probes) == (1, 1)
    assert sched.total_cost_s == pytest.approx(0.24)
    # A check neither restarts the probe's interval nor sets its predicted cost.
    assert sched.last_probe_at == 0.0 and sched.last_cost_s == 0.2
    assert sched.due(now=2.0, elapsed_s=100.0)


def test_checks_are_held_to_the_same_budget_as_probes() -> None:
    """At the slow rate, checks every 0.5 s would take 8 % of the time: the 5 % budget spaces
    them to one per 0.8 s of run time, and probe plus checks stay within it."""
    sched = ProbeScheduler(probe_interval_s=2.0, max_cost_fraction=0.05)
    sched.record(now=0.0, cost_s=0.0)
    clock, checks = FakeClock(), []
    while clock.t < 60:
        if sched.check_due(now=clock.t, elapsed_s=clock.t, expected_cost_s=0.04):
            checks.append(clock.t)
            clock.advance(0.04)
            sched.record_check(now=clock.t, cost_s=0.04)
            assert sched.total_cost_s <= 0.05 * clock.t + 1e-9
        clock.advance(0.07)
    assert len(checks) == pytest.approx(60 * 0.05 / 0.04, rel=0.05)


def test_while_a_check_could_see_a_rise_it_stands_in_for_the_probe() -> None:
    """The testbed's slow phase: start probe 0.17 s, a probe at the drop, then compressing on a
    blind 20 Mbit/s link. Interval probes (0.2 s each) there had left no budget for a check;
    checks (0.04 s) in their place watch the link from the first interval on."""
    sched = ProbeScheduler(probe_interval_s=2.0, max_cost_fraction=0.05)
    assert sched.next_measurement(now=0.0, elapsed_s=0.0, probe_cost_s=0.17, check_cost_s=0.04) == "probe"
    sched.record(now=0.0, cost_s=0.17)
    sched.record(now=6.5, cost_s=0.12)  # at the drop, before compressing
    # Not blind (no check possible): the interval's probe, once the budget allows it.
    assert sched.next_measurement(now=8.6, elapsed_s=8.6, probe_cost_s=0.2, check_cost_s=None) is None
    assert sched.next_measurement(now=10.0, elapsed_s=10.0, probe_cost_s=0.2, check_cost_s=None) == "probe"
    # Blind: a check instead, as often as the checks' interval and the budget allow, never a probe.
    clock, kinds = FakeClock(), []
    clock.t = 8.6
    while clock.t < 16.5:
        kind = sched.next_measurement(now=clock.t, elapsed_s=clock.t, probe_cost_s=0.2, check_cost_s=0.04)
        if kind is not None:
            kinds.append((round(clock.t, 2), kind))
            clock.advance(0.04)
            sched.record_check(now=clock.t, cost_s=0.04)
        clock.advance(0.25)
    assert kinds and {k for _, k in kinds} == {"check"}, kinds
    assert kinds[0][0] < 9.0 and len(kinds) >= 8, kinds
    assert sched.total_cost_s <= 0.05 * clock.t
    # A probe still comes some intervals after the last one (latency and wake-up re-measured).
    from workers.probe_scheduler import PROBE_EVERY_INTERVALS_WHILE_CHECKING as every

    while sched.probes == 2 and clock.t < 6.5 + every * 2.0 + 10:
        if sched.next_measurement(now=clock.t, elapsed_s=clock.t, probe_cost_s=0.2, check_cost_s=0.04) == "probe":
            sched.record(now=clock.t, cost_s=0.2)
        clock.advance(0.25)
    assert sched.probes == 3 and 6.5 + every * 2.0 <= sched.last_probe_at < 6.5 + every * 2.0 + 5, sched  # budget allowing
    assert sched.total_cost_s <= 0.05 * sched.last_probe_at


def test_scheduler_rejects_a_negative_check_cost() -> None:
    with pytest.raises(ValueError, match="cost_s"):
        ProbeScheduler().record_check(now=0.0, cost_s=-0.1)


# --------------------------------------------------------------------------- the recovery check


def _estimate_at(mbit: float, alpha_s: float = 1e-4) -> LinkEstimate:
    return LinkEstimate.from_fit(alpha_s, 8 / (mbit * MB), 2, measured_at=0.0, cost_s=0.2, probe_bytes=256 * 1024)


def test_a_check_implies_the_bandwidth_of_its_transfer_beyond_the_latency() -> None:
    from workers.probe import LinkCheck, implied_bandwidth

    slow = _estimate_at(50)
    nbytes = 256 * 1024
    seconds = all_reduce_seconds(nbytes, 2, slow.alpha_s, 8 / (1000 * MB))  # the link is back at 1000 Mbit/s
    check = LinkCheck(nbytes=nbytes, seconds=seconds, cost_s=seconds)
    assert implied_bandwidth(slow, check) == pytest.approx(1000 * MB / 8)
    assert implied_bandwidth(slow, LinkCheck(nbytes=nbytes, seconds=slow.latency_s, cost_s=0.0)) == math.inf


@pytest.mark.parametrize("now_mbit, rose", [(1000, True), (100, True), (95, False), (50, False), (10, False)])
def test_the_link_rose_when_a_check_implies_twice_the_readings_bandwidth(now_mbit: float, rose: bool) -> None:
    from workers.probe import LinkCheck, link_rose

    slow = _estimate_at(50)
    nbytes = 256 * 1024
    seconds = all_reduce_seconds(nbytes, 2, slow.alpha_s, 8 / (now_mbit * MB))
    assert link_rose(slow, LinkCheck(nbytes=nbytes, seconds=seconds, cost_s=seconds), slow.bandwidth_bytes_per_second) is rose


def test_a_check_is_judged_against_the_reading_it_was_asked_for() -> None:
    """The probe said 1000 Mbit/s, the hook's own timings then 50 (the reading rank 0 sends
    with the request): a check at 1000 is a rise against that reading, not against the probe."""
    from workers.probe import LinkCheck, link_rose

    fast = _estimate_at(1000)
    nbytes = 256 * 1024
    seconds = all_reduce_seconds(nbytes, 2, fast.alpha_s, fast.beta_s_per_byte)
    check = LinkCheck(nbytes=nbytes, seconds=seconds, cost_s=seconds)
    assert not link_rose(fast, check, fast.bandwidth_bytes_per_second)
    assert link_rose(fast, check, reading_bps=50 * MB / 8)


def test_a_shapers_burst_does_not_read_as_a_rise() -> None:
    """The testbed's bucket (64 KiB at 50 Mbit/s) passes that much of a 256 KiB check free:
    the check reads 4/3 of the rate, under the rise factor."""
    from workers.probe import LinkCheck, link_rose

    slow = _estimate_at(50)
    nbytes, burst = 256 * 1024, 64 * 1024
    seconds = all_reduce_seconds(nbytes - burst, 2, slow.alpha_s, slow.beta_s_per_byte)
    assert not link_rose(slow, LinkCheck(nbytes=nbytes, seconds=seconds, cost_s=seconds), slow.bandwidth_bytes_per_second)
    assert not link_rose(LinkEstimate.no_link(), LinkCheck(nbytes=nbytes, seconds=1e-6, cost_s=0.0), 1.0)


@pytest.mark.parametrize("kwargs", [{"probe_interval_s": 0}, {"max_cost_fraction": 0}, {"max_cost_fraction": 1.5}])
def test_scheduler_validates_its_config(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        ProbeScheduler(**kwargs)


def test_scheduler_rejects_negative_cost() -> None:
    with pytest.raises(ValueError, match="cost_s"):
        ProbeScheduler().record(now=0.0, cost_s=-1.0)


# --------------------------------------------------------------------------- the passive estimate


def test_passive_recovers_bandwidth_from_the_ring_formula() -> None:
    alpha, bandwidth, n = 100e-6, 50 * MB, 4
    est = PassiveBandwidth()
    est.anchor(LinkEstimate.from_fit(alpha, 1 / bandwidth, n, measured_at=0.0, cost_s=0.1))
    for nbytes in (1 << 20, 8 << 20, 25 << 20):
        assert est.observe(nbytes, all_reduce_seconds(nbytes, n, alpha, 1 / bandwidth), "all_reduce", n)
    assert est.bytes_per_second == pytest.approx(bandwidth, rel=1e-9)
    assert est.trend() == pytest.approx(1.0)


def test_passive_all_gather_uses_its_own_formula() -> None:
    bandwidth, n, shard = 20 * MB, 4, 4 << 20
    est = PassiveBandwidth()
    assert est.observe(shard, (n - 1) * shard / bandwidth, "all_gather", n)
    assert est.bytes_per_second == pytest.approx(bandwidth)


def test_passive_ignores_small_single_worker_and_latency_only_observations() -> None:
    est = PassiveBandwidth(min_bytes=256 * 1024)
    est.anchor(LinkEstimate.from_fit(1e-3, 1e-8, 2, measured_at=0.0, cost_s=0.1))
    assert not est.observe(4096, 1e-3, "all_reduce", 2)  # too small
    assert not est.observe(1 << 20, 0.1, "all_reduce", 1)  # no link
    assert not est.observe(1 << 20, 1e-3, "all_reduce", 2)  # not slower than latency
    assert not est.observe(1 << 20, 0.0, "all_reduce", 2)
    assert est.bytes_per_second is None and est.observations == 0 and est.trend() is None


def test_passive_ewma_follows_a_drop_and_signals_the_trend() -> None:
    n, nbytes = 2, 8 << 20
    est = PassiveBandwidth(smoothing=0.3)
    est.anchor(LinkEstimate.from_fit(0.0, 1 / (100 * MB), n, measured_at=0.0, cost_s=0.1))
    for _ in range(20):
        est.observe(nbytes, nbytes / (100 * MB), "all_reduce", n)
    est.observe(nbytes, nbytes / (10 * MB), "all_reduce", n)
    after_one = est.bytes_per_second
    assert after_one is not None and 10 * MB < after_one < 100 * MB  # smoothed, not jumped
    for _ in range(30):
        est.observe(nbytes, nbytes / (10 * MB), "all_reduce", n)
    assert est.bytes_per_second == pytest.approx(10 * MB, rel=0.01)
    assert est.trend() == pytest.approx(0.1, rel=0.01)


def test_a_sample_is_a_timings_time_per_byte_and_only_a_fold_moves_the_reading() -> None:
    """Every rank samples its own collectives; what enters the reading is the group's smallest
    sample, folded on rank 0 (``workers.reporter.Reporter.exchange``)."""
    n, nbytes, fast, slow = 2, 1 << 20, 1000 * MB / 8, 50 * MB / 8
    est = PassiveBandwidth(smoothing=0.2)
    sample = est.sample(nbytes, nbytes / fast, "all_reduce", n)
    assert sample == pytest.approx(1 / fast)
    assert est.sample(1024, 1.0, "all_reduce", n) is None  # too small: latency and noise
    assert est.sample(nbytes, 1.0, "all_reduce", 1) is None  # one worker: no link
    assert est.bytes_per_second is None and est.observations == 0
    est.fold(sample)
    assert est.bytes_per_second == pytest.approx(fast)
    est.fold(1 / slow)
    assert est.bytes_per_second == pytest.approx(1 / (1 / fast + 0.2 * (1 / slow - 1 / fast)))
    assert est.observations == 2
    # A cycle's smallest stands for its timings: folded as 3, as far as 3 equal samples.
    one_by_one, at_once = PassiveBandwidth(beta_s_per_byte=1 / fast), PassiveBandwidth(beta_s_per_byte=1 / fast)
    for _ in range(3):
        one_by_one.fold(1 / slow)
    at_once.fold(1 / slow, timings=3)
    assert at_once.bytes_per_second == pytest.approx(one_by_one.bytes_per_second)
    with pytest.raises(ValueError, match="timings"):
        at_once.fold(1 / slow, timings=0)


def test_a_drop_restarts_the_passive_reading_from_its_sample() -> None:
    """A drop every rank read is a new level: the reading is the slow steps' own rate, not an
    average of the two links (folded as three timings it read 97 Mbit/s for 1000 → 50)."""
    est = PassiveBandwidth(beta_s_per_byte=1 / (1000 * MB / 8))
    folded = PassiveBandwidth(beta_s_per_byte=1 / (1000 * MB / 8))
    est.restart(1 / (50 * MB / 8))
    folded.fold(1 / (50 * MB / 8), timings=3)
    assert est.bytes_per_second == pytest.approx(50 * MB / 8) and est.observations == 1
    assert 8 * folded.bytes_per_second / MB == pytest.approx(97, abs=1)
    est.fold(1 / (60 * MB / 8))  # later cycles fold as before
    assert 50 * MB / 8 < est.bytes_per_second < 60 * MB / 8


def test_passive_averages_time_per_byte_not_bandwidth() -> None:
    est = PassiveBandwidth(smoothing=0.5)
    nbytes = 1 << 20
    est.observe(nbytes, nbytes / (1000 * MB), "all_reduce", 2)
    est.observe(nbytes, nbytes / (10 * MB), "all_reduce", 2)
    # β average of 1/1000 and 1/10 (per MB): ~19.8 MB/s, where a bandwidth average says 505
    assert est.bytes_per_second == pytest.approx(2 / (1 / 1000 + 1 / 10) * MB)


FAST, SLOW = 1 / (1000 * MB / 8), 1 / (50 * MB / 8)  # β (s/byte) at 1000 and 50 Mbit/s


def test_a_drop_is_judged_against_the_slower_of_the_reading_and_the_probe() -> None:
    """The passive reading of a fast link scatters above the line rate; a fraction of such a
    reading is no drop."""
    scattered_high = FAST / 5  # 5 Gbit/s read on the 1 Gbit/s link
    assert drop_threshold(scattered_high, FAST) == DROP_FACTOR * FAST
    assert drop_threshold(SLOW, FAST) == DROP_FACTOR * SLOW  # the reading already saw a slower link
    assert drop_threshold(None, FAST) == DROP_FACTOR * FAST  # before the first passive sample
    assert drop_threshold(None, None) == math.inf and drop_threshold(math.inf, 0.0) == math.inf


def test_a_cycle_reads_a_drop_only_when_its_last_steps_were_all_slow_on_every_rank() -> None:
    """The cycle's smallest β is its fastest step: a drop in the middle of a cycle hides behind
    the fast steps before it, and is read from the last ``DROP_STEPS`` steps instead (each
    rank's smallest of them, the smallest over the ranks: ``recent``)."""
    threshold = drop_threshold(FAST, FAST)
    # Steps 40-44: the link fell at step 41. The smallest is step 40's; the last three were slow.
    assert cycle_sample(smallest=FAST, recent=SLOW, threshold=threshold) == (SLOW, True)
    # The whole cycle slow: read as a drop too (the smallest is already slow).
    assert cycle_sample(smallest=SLOW, recent=SLOW, threshold=threshold) == (SLOW, True)
    # One of the last steps fast (slow ones: a pause, a busy core), or the link only 3x slower.
    assert cycle_sample(smallest=FAST, recent=FAST * 1.1, threshold=threshold) == (FAST, False)
    assert cycle_sample(smallest=FAST, recent=FAST * 3, threshold=threshold) == (FAST, False)
    # Fewer timed steps than that on some rank (a compressor whose payloads are too small to
    # time; transfers within the latency term): its recent is 0, so the rank that waited for
    # it does not read its waits as a drop on its own (the group's recent is the minimum).
    waited, untimed = recent_steps_beta([SLOW, SLOW, SLOW]), recent_steps_beta([FAST, FAST])
    assert (waited, untimed) == (SLOW, 0.0) and recent_steps_beta([FAST, SLOW, SLOW, SLOW]) == SLOW
    assert cycle_sample(smallest=FAST, recent=min(waited, untimed), threshold=threshold) == (FAST, False)
    sample, dropped = cycle_sample(smallest=math.inf, recent=math.inf, threshold=threshold)
    assert math.isnan(sample) and not dropped
    # Nothing to judge against (no probe yet): never a drop.
    assert cycle_sample(smallest=FAST, recent=SLOW, threshold=math.inf) == (FAST, False)


def test_passive_validates_smoothing() -> None:
    with pytest.raises(ValueError, match="smoothing"):
        PassiveBandwidth(smoothing=0.0)


@pytest.mark.parametrize("budget", [0.0, 1.0, -0.1])
def test_a_jobs_probe_budget_must_be_a_fraction(budget: float) -> None:
    from planning.config import TrainConfig

    with pytest.raises(ValueError, match="probing.budget"):
        TrainConfig(probe_budget=budget)
    assert TrainConfig().probing.budget == 0.02


def test_a_check_without_the_reading_it_is_judged_against_is_refused() -> None:
    from workers.probe import LinkRequest

    for reading in (None, 0.0, math.nan):
        with pytest.raises(ValueError, match="reading_bps"):
            LinkRequest("check", 256 * 1024, reading_bps=reading)
