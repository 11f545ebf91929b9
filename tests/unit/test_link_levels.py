"""An oscillating link (``planning.link_levels``) and the policy's choice on the mix of its
levels, on synthetic traces with a frozen clock: plain floats, no torch."""

from __future__ import annotations

import dataclasses
import math

import pytest

from planning.costmodel import ElementCost, StepProfile, alpha_beta_from_bandwidth, candidates, predict_step
from planning.link_levels import level_mix, record_level, record_stretch
from planning.policy import Measurements, PolicyConfig, PolicyState, Switch, decide
from planning.progress import seconds_per_progress
from planning.spec import CompressorSpec, make_spec

GBIT10, MBIT50 = 1.25e9, 6.25e6
LATENCY, WORKERS = 1e-4, 4
SHAPES = [(1024, 1024), (1024,)] * 4 + [(10, 1024), (10,)]
PROFILE = StepProfile.build(SHAPES, forward_s=0.03, backward_s=0.06, optimizer_s=0.005, bucket_cap_bytes=4 * 2**20,
                            default_codec=ElementCost(per_element_s=2e-9, fixed_s=50e-6))
DEFAULTS = PolicyConfig(critical_initial_steps=0)
#: Errors of a plausible spectrum (every low rank loses some of the gradient, rank 1 most).
ERRORS = {s.label: (1 + s.rank / 4) ** -0.5 for s in candidates(("acpsgd", "powersgd")) if s.rank is not None}


def test_a_level_changes_when_both_the_side_and_the_bandwidth_move() -> None:
    history = ()
    for t, bandwidth in enumerate([100e6, 900e6, 80e6, 120e6]):  # swings that leave the choice uncompressed
        history = record_level(history, bandwidth, False, float(t), 10 * t, 2.0, 60.0)
    assert len(history) == 1 and history[0].since == 0.0 and history[0].bandwidth == 120e6
    # A lossy choice tried at the same bandwidth and dropped (the policy learning): no new level.
    history = record_level(history, 110e6, True, 4.0, 40, 2.0, 60.0)
    assert len(history) == 1 and history[0].lossy
    history = record_level(history, 100e6, False, 5.0, 50, 2.0, 60.0)
    assert len(history) == 1 and not history[0].lossy
    history = record_level(history, 20e6, True, 6.0, 60, 2.0, 60.0)
    assert [(level.since, level.since_step, level.lossy, level.bandwidth) for level in history] == [
        (0.0, 0, False, 100e6), (6.0, 60, True, 20e6)]
    # Back up with the side (a real move), then lossy again at 110 Mbit/s: the link has moved
    # from where the lossy level began, so nothing is undone; the level in progress takes the
    # side, and later changes of side at that bandwidth begin no level.
    history = record_level(history, 100e6, False, 7.0, 70, 2.0, 60.0)
    assert len(history) == 3
    for t, lossy in ((8.0, True), (9.0, False), (10.0, True), (11.0, False)):
        history = record_level(history, 110e6, lossy, t, int(10 * t), 2.0, 60.0)
    assert [(level.since, level.lossy, level.anchor) for level in history] == [
        (0.0, False, 100e6), (6.0, True, 20e6), (7.0, False, 100e6)]


def test_a_blip_of_the_reading_with_a_trial_on_it_is_undone() -> None:
    """A 2.5x dip with the policy trying a lossy choice on it, then the reading back within the
    factor of both levels' anchors and the side back: one level, as if the dip had not been."""
    history = record_level((), 100e6, False, 0.0, 0, 2.0, 60.0)
    history = record_level(history, 40e6, True, 1.0, 10, 2.0, 60.0)
    assert len(history) == 2
    history = record_level(history, 60e6, False, 2.0, 20, 2.0, 60.0)
    assert [(level.since, level.lossy, level.anchor, level.bandwidth) for level in history] == [(0.0, False, 100e6, 60e6)]
    # The side back but the link not back (2.2x from where the first level began): kept as two
    # levels of one side, which count as one side's stretch, not as a change.
    levels, stretches = (), ()
    for t, bandwidth, lossy in ((0.0, 100e6, False), (1.0, 40e6, True), (2.0, 45e6, False), (3.0, 10e6, True)):
        levels = record_level(levels, bandwidth, lossy, t, int(10 * t), 2.0, 60.0)
        stretches = record_stretch(stretches, bandwidth, t, int(10 * t), 2.0, 60.0)
    assert [level.lossy for level in levels] == [False, False, True]
    assert level_mix(levels, stretches, 3.5, 35, 8.0, 2, 1.0) is None  # one change of side, two needed


def test_levels_that_ended_before_the_window_are_forgotten_and_no_link_forgets_all() -> None:
    history = ()
    for t, bandwidth, lossy in ((0.0, 100e6, False), (10.0, 10e6, True), (20.0, 100e6, False), (100.0, 100e6, False)):
        history = record_level(history, bandwidth, lossy, t, None, 2.0, 60.0)
    assert [level.since for level in history] == [20.0]
    assert record_level(history, float("inf"), False, 101.0, None, 2.0, 60.0) == ()
    assert record_level(history, None, False, 101.0, None, 2.0, 60.0) == ()


def histories(reports, keep_s: float = 100.0):
    """Levels and stretches from (time, step, bandwidth) reports; the side is lossy below 100 Mbit/s."""
    levels, stretches = (), ()
    for t, step, bandwidth in reports:
        levels = record_level(levels, bandwidth, bandwidth < 100e6 / 8, float(t), step, 2.0, keep_s)
        stretches = record_stretch(stretches, bandwidth, float(t), step, 2.0, keep_s)
    return levels, stretches


def test_the_mix_weighs_each_stretch_by_its_steps_within_the_span() -> None:
    # 40 steps fast (8 s), 20 steps slow (4 s), twice, then 20 steps fast.
    levels, stretches = histories([(0, 0, GBIT10), (8, 40, MBIT50), (12, 60, GBIT10), (20, 100, MBIT50),
                                   (24, 120, GBIT10)])
    assert level_mix(levels, stretches, 28.0, 140, 100.0, 5, 4.0) is None  # four changes, five needed
    mix = level_mix(levels, stretches, 28.0, 140, 100.0, 4, 4.0)
    assert mix is not None and mix.shifts == 4 and [s.bandwidth for s in mix.stretches] == [
        GBIT10, MBIT50, GBIT10, MBIT50, GBIT10]
    assert mix.shares == pytest.approx([40 / 140, 20 / 140, 40 / 140, 20 / 140, 20 / 140])
    assert mix.describe() == ("link oscillates (4 level changes in 28 s): judged on the mix, "
                              "29% of steps at 50 Mb/s, 71% of steps at 10 Gb/s")
    # A window that starts halfway through the first fast stretch counts half its steps.
    mix = level_mix(levels, stretches, 28.0, 140, 24.0, 3, 4.0)
    assert mix is not None and mix.shares[0] == pytest.approx(20 / 120)
    # Without steps, seconds weigh.
    levels, stretches = histories([(0, None, GBIT10), (8, None, MBIT50), (12, None, GBIT10), (20, None, MBIT50)])
    mix = level_mix(levels, stretches, 24.0, None, 100.0, 3, 4.0)
    assert mix is not None and mix.shares == pytest.approx([8 / 24, 4 / 24, 8 / 24, 4 / 24])
    assert level_mix(levels, stretches, 24.0, None, 0.0, 3, 4.0) is None  # no window (a zero dwell)
    # Changes further apart than the window are a link that changes, not one that oscillates.
    levels, stretches = histories([(t, None, MBIT50 if t % 20 else GBIT10) for t in range(0, 50, 10)])
    assert len(levels) == 5 and level_mix(levels, stretches, 41.0, None, 8.0, 3, 4.0) is None
    assert level_mix(levels, stretches, 41.0, None, 10.0, 3, 4.0) is not None


def test_the_histories_reach_back_as_far_as_a_chain_of_changes() -> None:
    """Changes at 0, 7.9 and 15.8 s, each within the 8 s window of the one before: the link
    oscillates until 23.8 s, which needs the level before the first change (three windows)."""
    reports = [(-1.0, 0, GBIT10), (0.0, 10, MBIT50), (7.9, 80, GBIT10), (15.8, 150, MBIT50), (16.05, 152, MBIT50)]
    levels, stretches = histories(reports, keep_s=3 * 8.0)
    assert level_mix(levels, stretches, 16.05, 152, 8.0, 3, 4.0) is not None
    short, short_stretches = histories(reports, keep_s=2 * 8.0)  # two windows: the first change is gone
    assert level_mix(short, short_stretches, 16.05, 152, 8.0, 3, 4.0) is None
    levels, stretches = histories(reports + [(23.7, 220, MBIT50)], keep_s=3 * 8.0)
    assert level_mix(levels, stretches, 23.7, 220, 8.0, 3, 4.0) is not None
    levels, stretches = histories(reports + [(23.9, 222, MBIT50)], keep_s=3 * 8.0)
    assert level_mix(levels, stretches, 23.9, 222, 8.0, 3, 4.0) is None
    with pytest.raises(ValueError, match="^min_shifts"):
        level_mix(levels, stretches, 23.9, 222, 8.0, 0, 4.0)


def test_steps_that_go_back_start_the_histories_afresh() -> None:
    """A job resumed from a checkpoint reports earlier steps: weights by steps across the jump
    would be negative, so the policy forgets the levels and follows the link."""
    state, current = PolicyState(), make_spec("none")
    for report, step in enumerate(range(0, 300, 10)):
        m = Measurements(oscillating(step), LATENCY, WORKERS, PROFILE, current, step=step, errors=ERRORS)
        decision, state = decide(state, m, DEFAULTS, 2.0 * report)
        current = decision.spec if isinstance(decision, Switch) else current
    assert "link oscillates" in decision.reason and len(state.levels) > 3
    m = Measurements(GBIT10, LATENCY, WORKERS, PROFILE, current, step=30, errors=ERRORS)
    decision, state = decide(state, m, DEFAULTS, 60.0)
    assert len(state.levels) == 1 and len(state.stretches) == 1 and "link oscillates" not in decision.reason


def test_a_level_that_spans_both_rates_is_weighed_by_its_stretches() -> None:
    """Compressing, the policy saw the link come back without a move worth a switch: its level
    stays lossy across the rise, but the mix weighs the fast stretch at the fast rate."""
    levels, stretches = (), ()
    for t, step, bandwidth, lossy in ((0, 0, GBIT10, False), (8, 40, MBIT50, True), (12, 60, GBIT10, False),
                                      (20, 100, MBIT50, True), (24, 120, GBIT10, True)):
        levels = record_level(levels, bandwidth, lossy, float(t), step, 2.0, 100.0)
        stretches = record_stretch(stretches, bandwidth, float(t), step, 2.0, 100.0)
    assert len(levels) == 4 and len(stretches) == 5 and levels[-1].bandwidth == GBIT10
    mix = level_mix(levels, stretches, 28.0, 140, 100.0, 3, 4.0)
    assert mix is not None and math.fsum(share for share, s in zip(mix.shares, mix.stretches)
                                         if s.bandwidth == MBIT50) == pytest.approx(40 / 140)


def test_levels_on_the_two_sides_closer_than_the_separation_are_no_oscillation() -> None:
    """A dip of the fast link's reading with a lossy trial on it, then the drop (fast-slow-fast)."""
    levels, stretches = (), ()
    for t, bandwidth in ((0, 1336e6), (1, 548e6), (4, 1150e6), (7, 51e6)):
        levels = record_level(levels, bandwidth / 8, bandwidth < 600e6, float(t), 20 * t, 2.0, 100.0)
        stretches = record_stretch(stretches, bandwidth / 8, float(t), 20 * t, 2.0, 100.0)
    assert len(levels) == 4 and level_mix(levels, stretches, 8.0, 160, 8.0, 3, 4.0) is None
    assert level_mix(levels, stretches, 8.0, 160, 8.0, 3, 2.0) is not None


def test_an_uncompressed_level_begun_part_way_up_the_readings_climb_is_judged_by_its_reports() -> None:
    """The benchmark's oscillating link as rank 0 read it (session 25): the averaged reading
    at 1.5 Gbit/s, 48 Mbit/s, 1.5 Gbit/s, 48 Mbit/s, then climbing back through 171 and 798
    Mbit/s to 2 Gbit/s. The last level began at 171 Mbit/s, less than the separation (4x)
    above the slow levels; its reports' mean passes it after three reports and the mix holds."""
    levels, stretches = (), ()
    trace = [(0.0, 1.5e9, False), (1.0, 48e6, True), (2.0, 1.5e9, False), (3.0, 48e6, True), (4.0, 171e6, False),
             (4.1, 171e6, False)]
    for t, bits, lossy in trace:
        levels = record_level(levels, bits / 8, lossy, t, int(20 * t), 2.0, 100.0)
        stretches = record_stretch(stretches, bits / 8, t, int(20 * t), 2.0, 100.0)
    assert len(levels) == 5 and levels[-1].anchor == 171e6 / 8
    assert level_mix(levels, stretches, 4.1, 82, 8.0, 3, 4.0) is None  # two reports at 171: not yet apart
    for t, bits in ((4.2, 798e6), (4.3, 2e9)):
        levels = record_level(levels, bits / 8, False, t, int(20 * t), 2.0, 100.0)
        stretches = record_stretch(stretches, bits / 8, t, int(20 * t), 2.0, 100.0)
    assert len(levels) == 5 and levels[-1].anchor == 171e6 / 8  # still the level begun at 171
    assert levels[-1].typical == pytest.approx((171e6 * 171e6 * 798e6 * 2e9) ** 0.25 / 8)
    mix = level_mix(levels, stretches, 4.3, 86, 8.0, 3, 4.0)
    assert mix is not None and mix.shifts == 4


def oscillating(step: int) -> float:
    """The benchmark's oscillating link, by the work done: 40 steps fast, 20 slow, repeated."""
    return MBIT50 if step % 60 >= 40 else GBIT10


def run_steps(cfg: PolicyConfig, until_step: int = 1200, steps_per_report: int = 10, every_s: float = 2.0):
    """One report every ``every_s`` seconds of a frozen clock and ``steps_per_report`` steps;
    the workers apply each switch at once. Returns the switches and, for each report's steps,
    the choice that ran and the link it met, and the last verdict's reason."""
    state, current, switches, ran = PolicyState(), make_spec("none"), [], []
    for report, step in enumerate(range(0, until_step, steps_per_report)):
        now = report * every_s
        m = Measurements(oscillating(step), LATENCY, WORKERS, PROFILE, current, step=step, errors=ERRORS)
        decision, state = decide(state, m, cfg, now)
        if isinstance(decision, Switch):
            switches.append((now, decision))
            current = decision.spec
        ran.append((current, oscillating(step)))
    return switches, ran, decision.reason


def seconds_per_progress_run(ran: list[tuple[CompressorSpec, float]]) -> float:
    """What the run's steps cost in time per progress, by the model the policy judges with."""
    def tau(spec: CompressorSpec, bandwidth: float) -> float:
        step_s = predict_step(spec, PROFILE, WORKERS, alpha_beta_from_bandwidth(bandwidth, LATENCY / 6)).step_s
        return seconds_per_progress(step_s, ERRORS.get(spec.label, 0.0))
    return sum(tau(spec, bandwidth) for spec, bandwidth in ran)


def best_fixed_on_the_mix(from_step: int = 0) -> tuple[str, float]:
    """The fixed choice a user would have needed to know: least time per progress over the
    trace's steps from ``from_step`` (two thirds at 10 Gbit/s, one third at 50 Mbit/s)."""
    options = DEFAULTS.candidates()
    costs = {s.label: seconds_per_progress_run([(s, oscillating(step)) for step in range(from_step, 1200, 10)])
             for s in options if s.label in ERRORS or s.name in ("none", "fp16", "bf16")}
    label = min(costs, key=costs.get)
    return label, costs[label]


def test_on_an_oscillating_link_the_policy_settles_on_the_best_fixed_choice_for_the_mix() -> None:
    switches, ran, last_reason = run_steps(DEFAULTS)
    best, _ = best_fixed_on_the_mix()
    assert best not in ("none", "fp16", "bf16")  # the slow third of the steps makes compression pay
    settled = [(t, s.spec.label) for t, s in switches]
    assert len(switches) <= 3 and switches[-1][1].spec.label == best, settled
    assert switches[-1][0] <= 2 * DEFAULTS.min_dwell_s  # within two dwells of the first shift
    assert last_reason.startswith(best) and "is predicted most progress per second" in last_reason
    assert "judged on the mix, 33% of steps at 50 Mb/s, 67% of steps at 10 Gb/s" in last_reason
    # Following each level (no window: never oscillating) keeps switching, and costs more.
    followed, followed_ran, _ = run_steps(dataclasses.replace(DEFAULTS, oscillation_window_dwells=0.0))
    assert len(followed) >= 2 * len(switches), [(t, s.spec.label) for t, s in followed]
    assert seconds_per_progress_run(followed_ran) > 1.05 * seconds_per_progress_run(ran)
    # From its first switch (the first drop, which no policy can foresee) it costs what the best
    # fixed choice costs over the same steps.
    first = int(switches[0][0] / 2.0)
    assert seconds_per_progress_run(ran[first:]) <= 1.05 * best_fixed_on_the_mix(10 * first)[1]


def test_the_mix_lasts_until_a_whole_window_passed_without_a_change_of_side() -> None:
    cfg = dataclasses.replace(DEFAULTS, min_dwell_s=2.0)  # window 8 s
    state, current = PolicyState(), make_spec("none")
    trace = [GBIT10, MBIT50, MBIT50, GBIT10, GBIT10, MBIT50, MBIT50] + [GBIT10] * 14
    mixed, changes = [], set()
    for second, bandwidth in enumerate(trace):
        m = Measurements(bandwidth, LATENCY, WORKERS, PROFILE, current, step=10 * second, errors=ERRORS)
        decision, state = decide(state, m, cfg, float(second))
        mixed.append("link oscillates" in decision.reason)
        changes |= {level.since for level in state.levels[1:]}
        if isinstance(decision, Switch):
            current = decision.spec
    # Each drop and rise is confirmed by a second report; the rise at 7 s comes after the window.
    assert sorted(changes) == [2.0, 4.0, 6.0, 8.0]
    assert mixed == [False] * 6 + [True] * 11 + [False] * 4  # from the third change to 8 s after the last
    assert current.name == "none"


def test_the_oscillation_bounds_are_validated() -> None:
    with pytest.raises(ValueError, match="^oscillation_shifts"):
        PolicyConfig(oscillation_shifts=1)
    with pytest.raises(ValueError, match="^oscillation_window_dwells"):
        PolicyConfig(oscillation_window_dwells=-1.0)
    assert PolicyConfig(min_dwell_s=30.0).oscillation_window_s == 120.0


def test_swings_within_the_switching_threshold_are_no_change_of_side() -> None:
    """Between 700 and 900 Mbit/s the best lossy choice (ACP-SGD r16) and the best uncompressed
    one (fp16) lie within 10 % of each other on this profile: the better one flips as the
    average swings, but neither side wins by the threshold: no change of side is counted."""
    def swinging(cfg: PolicyConfig) -> tuple[int, list[str]]:
        state, reasons, current = PolicyState(), [], make_spec("fp16")
        for report in range(120):
            bandwidth = (700e6 if (report // 4) % 2 else 900e6) / 8
            m = Measurements(bandwidth, LATENCY, WORKERS, PROFILE, current, step=10 * report, errors=ERRORS)
            decision, state = decide(state, m, cfg, 2.0 * report)
            reasons.append(decision.reason)
        return len(state.levels), reasons

    # The swings are within the bandwidth's factor too; with a finer factor the dead band alone
    # holds them.
    fine = dataclasses.replace(DEFAULTS, level_shift_factor=1.1)
    for cfg in (DEFAULTS, fine):
        levels, reasons = swinging(cfg)
        assert levels == 1 and not any("link oscillates" in r for r in reasons)
    # With neither, the same swings read as a link oscillating between the sides.
    levels, reasons = swinging(dataclasses.replace(fine, gain_threshold=0.0))
    assert levels >= 2 * DEFAULTS.oscillation_shifts and any("link oscillates" in r for r in reasons)


def test_a_move_between_casts_and_none_must_also_pay_on_the_links_recent_stretches() -> None:
    """fp16 runs; ``none`` steps 11 % faster at 10 Gbit/s (this profile) and twice as slow at
    50 Mbit/s. After a slow stretch, the move to ``none`` on the fast link waits until the
    slow stretch has left the oscillation window (8 s here); on a link that was fast all along
    it is made at once."""
    cfg = dataclasses.replace(DEFAULTS, min_dwell_s=2.0)  # window 8 s

    def run(trace: list[float]) -> tuple[list[tuple[float, str]], list[str]]:
        state, current, switches, reasons = PolicyState(), make_spec("fp16"), [], []
        for second, bandwidth in enumerate(trace):
            m = Measurements(bandwidth, LATENCY, WORKERS, PROFILE, current, step=10 * second, errors={})
            decision, state = decide(state, m, cfg, float(second))
            reasons.append(decision.reason)
            if isinstance(decision, Switch):
                switches.append((float(second), decision.spec.label))
                current = decision.spec
        return switches, reasons

    steady, _ = run([GBIT10] * 20)
    assert steady == [(0.0, "none")]  # at once: no dwell to wait out
    switches, reasons = run([MBIT50] * 3 + [GBIT10] * 17)
    assert [label for _, label in switches] == ["none"]
    moved = switches[0][0]
    # The average follows the rise at its second report (4 s), which ends the slow stretch; the
    # move waits on every fast report until that end lies outside the window, and says why.
    held = [r for r in reasons[4:int(moved)] if "the link may drop again" in r]
    assert len(held) == int(moved) - 4 and all("down to 50 Mb/s" in r for r in held), reasons
    assert moved == 4 + cfg.oscillation_window_s, (moved, reasons)
