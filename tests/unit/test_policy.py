"""The adaptive policy on synthetic bandwidth traces with a fake clock (plain floats)."""

from __future__ import annotations

import dataclasses
import math
import random
from typing import Callable, Optional

import pytest

from planning.costmodel import ElementCost, StepProfile, alpha_beta_from_bandwidth, predict_step
from planning.hysteresis import link_dropped_since_switch, switch, threshold
from planning.link_levels import Level
from planning.link_smoothing import LinkAverage
from planning.policy import (
    Keep,
    Measurements,
    PolicyConfig,
    PolicyState,
    Switch,
    decide,
    without_dwell,
)
from planning.policy_types import Scored
from planning.spec import CompressorSpec, make_spec
from planning.step_correction import Correction

GBIT10 = 1.25e9  # bytes/s
MBIT50 = 6.25e6
LATENCY = 1e-4
WORKERS = 4
REPORT_EVERY = 2.0

SHAPES = [(1024, 1024), (1024,)] * 4 + [(10, 1024), (10,)]
# A slow codec (2 ns an element pass): compression costs >10 % at 10 Gb/s and pays at 50 Mb/s.
PROFILE = StepProfile.build(
    SHAPES, forward_s=0.03, backward_s=0.06, optimizer_s=0.005, bucket_cap_bytes=4 * 2**20,
    default_codec=ElementCost(per_element_s=2e-9, fixed_s=50e-6),
)
CFG = PolicyConfig(allowed=("none", "fp16", "powersgd", "acpsgd"), critical_initial_steps=0)
UNCOMPRESSED = {"none", "fp16", "bf16"}


def measure(bandwidth: float, current: CompressorSpec, grad_norm: float | None = None, step: int | None = None) -> Measurements:
    return Measurements(bandwidth, LATENCY, WORKERS, PROFILE, current, grad_norm=grad_norm, step=step)


def run_trace(
    bandwidth_at: Callable[[float], float],
    until: float,
    current: CompressorSpec = make_spec("none"),
    cfg: PolicyConfig = CFG,
    grad_norm_at: Callable[[float], Optional[float]] = lambda t: None,
) -> tuple[list[tuple[float, Switch]], CompressorSpec]:
    """Feed one report every REPORT_EVERY seconds; the workers apply each Switch at once."""
    state = PolicyState()
    switches = []
    now = 0.0
    while now <= until:
        decision, state = decide(state, measure(bandwidth_at(now), current, grad_norm_at(now)), cfg, now)
        if isinstance(decision, Switch):
            switches.append((now, decision))
            current = decision.spec
        now += REPORT_EVERY
    return switches, current


def test_profile_makes_the_scenario_meaningful():
    fast, slow = alpha_beta_from_bandwidth(GBIT10, LATENCY), alpha_beta_from_bandwidth(MBIT50, LATENCY)
    none, acp = make_spec("none"), make_spec("acpsgd", rank=1)
    assert predict_step(none, PROFILE, WORKERS, fast).step_s < 0.9 * predict_step(acp, PROFILE, WORKERS, fast).step_s
    assert predict_step(none, PROFILE, WORKERS, slow).step_s > 10 * predict_step(acp, PROFILE, WORKERS, slow).step_s


def test_steady_fast_link_keeps_no_compression():
    switches, current = run_trace(lambda t: GBIT10, until=120)
    assert switches == [] and current.name == "none"


def test_bandwidth_collapse_switches_to_low_rank_and_recovery_switches_back_after_dwell():
    collapse, recovery = 60.0, 70.0
    trace = lambda t: MBIT50 if collapse <= t < recovery else GBIT10  # noqa: E731
    switches, current = run_trace(trace, until=200)
    assert len(switches) == 2
    (t1, down), (t2, up) = switches
    assert collapse <= t1 <= collapse + 2 * REPORT_EVERY  # confirmed by the second slow report
    assert down.spec.name in ("acpsgd", "powersgd") and down.gain > 0.5
    assert down.new_step_s < down.current_step_s
    assert "50 Mb/s" in down.reason
    assert t2 >= t1 + CFG.min_dwell_s  # the link recovered at 70 s; the dwell holds until 90 s
    assert up.spec.name in UNCOMPRESSED and current.name in UNCOMPRESSED


def test_a_drop_since_the_switch_ends_an_uncompressed_choice_s_dwell():
    """The link fell 10 s after a move to ``none`` (the link had come back at 60 s): the
    dwell (30 s) does not hold ``none`` on the slow link (``link_dropped_since_switch``)."""
    trace = lambda t: MBIT50 if 20 <= t < 60 or t >= 80 else GBIT10  # noqa: E731
    switches, current = run_trace(trace, until=120)
    assert [s.spec.name in UNCOMPRESSED for _, s in switches] == [False, True, False], switches
    (t1, _), (t2, _), (t3, down) = switches
    assert 60 <= t2 <= 64 and 80 <= t3 <= 84 < t2 + CFG.min_dwell_s
    assert "the link dropped to another level since the last switch: its dwell ends early" in down.reason
    assert current.name not in UNCOMPRESSED


def test_only_a_drop_since_the_switch_ends_the_dwell_and_only_an_uncompressed_choice_s():
    """``link_dropped_since_switch``: the level in progress began after the switch took
    effect, the policy would compress there, and the choice in force does not."""
    def level(since: float, lossy: bool) -> Level:
        return Level(since, None, GBIT10, GBIT10, lossy=lossy, log_mean=math.log(GBIT10))

    lossy, cast = make_spec("powersgd", rank=4), make_spec("fp16")
    dropped = PolicyState(last_switch_at=10.0, levels=(level(0.0, False), level(12.0, True)))
    assert link_dropped_since_switch(dropped, cast)
    assert not link_dropped_since_switch(dropped, lossy)  # already compressing
    rose = PolicyState(last_switch_at=10.0, levels=(level(0.0, True), level(12.0, False)))
    assert not link_dropped_since_switch(rose, lossy) and not link_dropped_since_switch(rose, cast)
    before = PolicyState(last_switch_at=10.0, levels=(level(0.0, False), level(8.0, True)))
    assert not link_dropped_since_switch(before, cast)  # the switch knew that level
    assert not link_dropped_since_switch(PolicyState(levels=dropped.levels), cast)  # no switch yet
    assert not link_dropped_since_switch(PolicyState(last_switch_at=10.0, levels=(level(12.0, True),)), cast)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("exponent", [6.5, 7.0, 7.25, 7.5, 7.75, 8.0, 8.5, 8.55, 8.6, 9.0, 9.5])
def test_noisy_bandwidth_does_not_flap(seed: int, exponent: float):
    # 8.55 and 8.6 (2.8 and 3.2 Gbit/s): where none and fp16 cross on this profile; with the
    # 2 % threshold between them both ways (session 23) these traces traded the two once a dwell.
    # A second move is allowed only as the one cheap correction of a lossy first pick: to a
    # choice whose error is known that steps as fast, within 2 % (planning.hysteresis.threshold;
    # 3 of 220 such traces, 20 seeds), and never back to a choice it left.
    rng = random.Random(seed)
    level = 10**exponent
    switches, _ = run_trace(lambda t: level * rng.uniform(0.7, 1.3), until=900)
    moves = [(t, s.spec.label) for t, s in switches]
    assert len(switches) <= 2 and len({label for _, label in moves}) == len(moves), moves
    if len(switches) == 2:
        first, second = switches[0][1], switches[1][1]
        assert first.spec.name not in UNCOMPRESSED and second.spec.name in UNCOMPRESSED, moves
        assert second.new_step_s * (1 - CFG.known_error_gain_threshold) <= second.current_step_s, moves


def test_single_outlier_report_is_ignored():
    switches, _ = run_trace(lambda t: MBIT50 if t == 40 else GBIT10, until=120)
    assert switches == []


def test_a_drop_the_workers_read_is_acted_on_at_the_report_that_brings_it():
    """The same slow report switches at once when it carries a new ``link_drop_step`` (every
    rank read the drop over its last steps), where alone it is held as a suspected outlier."""
    fast = dataclasses.replace(measure(GBIT10, make_spec("none")), link_drop_step=None)
    state = PolicyState()
    for now in (0.0, 2.0, 4.0):
        kept, state = decide(state, fast, CFG, now)
        assert isinstance(kept, Keep)
    slow = measure(MBIT50, make_spec("none"))
    held, held_state = decide(state, slow, CFG, 6.0)
    assert isinstance(held, Keep) and held_state.link.bandwidth == pytest.approx(GBIT10)
    assert held_state.link.pending == (MBIT50,)
    read, after = decide(state, dataclasses.replace(slow, link_drop_step=45), CFG, 6.0)
    assert isinstance(read, Switch) and read.spec.name in ("acpsgd", "powersgd"), read
    assert "50 Mb/s" in read.reason and after.link.drop_step == 45
    # Its next reports repeat the step: they do not move the average again (a spike is held).
    _, spiked = decide(after, dataclasses.replace(measure(GBIT10, read.spec), link_drop_step=45), CFG, 7.0)
    assert spiked.link.bandwidth == MBIT50 and spiked.link.pending == (GBIT10,)


def test_critical_regime_raises_the_rank_then_returns():
    current = make_spec("acpsgd", rank=1)
    norms = {20.0: 10.0}  # the gradient norm doubles at t = 20 s, otherwise stays at 5
    cfg = dataclasses.replace(CFG, gain_threshold=0.02)  # rank 1 is only a few % faster than 4
    switches, final = run_trace(
        lambda t: MBIT50, until=200, current=current, cfg=cfg, grad_norm_at=lambda t: norms.get(t, 5.0)
    )
    (t1, up), *rest = switches
    assert t1 == 20.0
    assert up.spec.name == "acpsgd" and up.spec.rank >= CFG.critical_min_rank == 4
    assert up.gain < 0  # quality first: slower, yet taken
    assert "critical" in up.reason and "gradient norm" in up.reason
    # The norm drops back at 22 s (another change): the regime holds until 52 s; after it and
    # the dwell the policy returns to the fastest low rank.
    t2, down = rest[-1]
    assert t2 >= 22.0 + CFG.critical_hold_s and down.spec.rank == 1 and final.rank == 1


def test_first_steps_are_critical():
    cfg = dataclasses.replace(CFG, critical_initial_steps=100, min_rank=2)
    current = make_spec("acpsgd", rank=2)
    decision, _ = decide(PolicyState(), measure(MBIT50, current, step=10), cfg, 0.0)
    assert isinstance(decision, Switch) and decision.spec.rank == 8
    assert "step 10" in decision.reason
    decision, _ = decide(PolicyState(), measure(MBIT50, current, step=500), cfg, 0.0)
    assert isinstance(decision, Keep)


def test_critical_regime_excludes_topk_and_signsgd():
    cfg = dataclasses.replace(CFG, allowed=("none", "topk", "signsgd"), critical_initial_steps=100)
    decision, _ = decide(PolicyState(), measure(MBIT50, make_spec("topk", ratio=0.001), step=0), cfg, 0.0)
    assert isinstance(decision, Switch) and decision.spec.name == "none"
    only_lossy = dataclasses.replace(cfg, allowed=("topk",))  # nothing passes: ordinary guard
    decision, _ = decide(PolicyState(), measure(MBIT50, make_spec("topk", ratio=0.01), step=0), only_lossy, 0.0)
    assert isinstance(decision, Switch) and decision.spec.label == "topk-0.001"
    assert "ignored: no allowed option passes its guard" in decision.reason


def slow_link_state(last_switch_at: float | None) -> PolicyState:
    return PolicyState(link=LinkAverage(MBIT50, LATENCY, 0.0), last_switch_at=last_switch_at)


def test_min_dwell_is_respected():
    state = slow_link_state(last_switch_at=0.0)
    decision, state = decide(state, measure(MBIT50, make_spec("none")), CFG, 10.0)
    assert isinstance(decision, Keep) and "min dwell 30 s" in decision.reason
    decision, state = decide(state, measure(MBIT50, make_spec("none")), CFG, 29.9)
    assert isinstance(decision, Keep)
    decision, state = decide(state, measure(MBIT50, make_spec("none")), CFG, 30.0)
    assert isinstance(decision, Switch)
    assert state.last_switch_at == 30.0 and state.switches == 1


def test_the_dwell_counts_from_the_first_report_of_a_step_the_new_choice_ran():
    """On a slow link the workers apply a decision steps later; the dwell must not pass
    before the new choice has run, or its first noisy sample alone could switch back."""
    state = slow_link_state(last_switch_at=None)
    decision, state = decide(state, measure(MBIT50, make_spec("none")), CFG, 0.0)
    assert isinstance(decision, Switch) and state.awaiting == decision.spec.label
    new = decision.spec
    # 40 s later (past the 30 s dwell) the workers still run none: it has not taken effect
    late = dataclasses.replace(measure(MBIT50, new), running="none")
    _, state = decide(state, late, CFG, 40.0)
    assert state.last_switch_at == 0.0 and state.awaiting == new.label
    # the first report of a step it ran: the dwell starts now
    _, state = decide(state, dataclasses.replace(measure(MBIT50, new), running=new.label), CFG, 45.0)
    assert state.last_switch_at == 45.0 and state.awaiting is None
    # a link that makes none faster again must wait out the dwell from there
    fast_state, fast = dataclasses.replace(state, link=LinkAverage(1e10, LATENCY, 0.0)), dataclasses.replace(measure(1e10, new), running=new.label)
    decision, _ = decide(fast_state, fast, CFG, 60.0)
    assert isinstance(decision, Keep) and "min dwell" in decision.reason
    decision, _ = decide(fast_state, fast, CFG, 75.0)
    assert isinstance(decision, Switch) and decision.spec.name == "none"


def test_gain_threshold_is_respected():
    current = make_spec("acpsgd", rank=4)
    first, _ = decide(slow_link_state(None), measure(MBIT50, current), dataclasses.replace(CFG, gain_threshold=0.0), 1.0)
    assert isinstance(first, Switch)
    gain = first.gain
    assert 0.02 < gain < 0.5
    assert gain == pytest.approx((first.current_step_s - first.new_step_s) / first.current_step_s)
    above = dataclasses.replace(CFG, gain_threshold=gain + 0.01)
    decision, _ = decide(slow_link_state(None), measure(MBIT50, current), above, 1.0)
    assert isinstance(decision, Keep) and "threshold" in decision.reason
    below = dataclasses.replace(CFG, gain_threshold=gain - 0.01)
    decision, _ = decide(slow_link_state(None), measure(MBIT50, current), below, 1.0)
    assert isinstance(decision, Switch) and decision.spec == first.spec


def test_between_none_and_the_casts_a_small_gain_switches_and_the_dwell_still_holds():
    """At 2.5 Gbit/s fp16 is predicted 8 % faster than ``none``, under the 10 % threshold: the
    threshold guards moves that involve a lossy choice (what it loses is an estimate); to a
    choice whose error is known and that the job has not left, 2 % is enough. Back to one it
    left takes the full threshold (a band against the reading's noise); the dwell still holds."""
    link = alpha_beta_from_bandwidth(3.125e8, LATENCY / (2 * (WORKERS - 1)))
    none, fp16 = make_spec("none"), make_spec("fp16")
    gain = 1 - predict_step(fp16, PROFILE, WORKERS, link).step_s / predict_step(none, PROFILE, WORKERS, link).step_s
    assert 0.02 < gain < CFG.gain_threshold
    state = PolicyState(link=LinkAverage(3.125e8, LATENCY, 0.0))
    decision, after = decide(state, measure(3.125e8, none), CFG, 1.0)
    assert isinstance(decision, Switch) and decision.spec == fp16 and decision.gain == pytest.approx(gain, rel=1e-6)
    assert after.left == ("none",)
    decision, _ = decide(dataclasses.replace(state, last_switch_at=0.0), measure(3.125e8, none), CFG, 1.0)
    assert isinstance(decision, Keep) and "min dwell" in decision.reason
    back, _ = decide(dataclasses.replace(state, left=("bf16", "fp16")), measure(3.125e8, none), CFG, 1.0)
    assert isinstance(back, Keep) and "below the 10% threshold" in back.reason
    assert without_dwell(after).left == ()  # a release or a new world size forgets what was left


def test_every_choice_left_takes_the_full_threshold_and_a_lower_gain_threshold_caps_the_small_one():
    """``none`` → fp16 → bf16 → ``none`` would pass 2 % at every hop; each label left counts. From
    a lossy choice the small threshold holds only to a known error that steps as fast."""
    def scored(label: str, tau: float) -> Scored:
        return Scored(make_spec(label), label, tau, None, tau)

    none, fp16, bf16, acp = scored("none", 1.0), scored("fp16", 0.97), scored("bf16", 0.95), scored("acpsgd", 0.9)
    state = PolicyState(left=("none", "fp16"))
    assert threshold(fp16, bf16, state, CFG) == 0.02  # bf16 was not left
    assert threshold(bf16, none, state, CFG) == threshold(bf16, fp16, state, CFG) == CFG.gain_threshold
    assert threshold(none, acp, PolicyState(), CFG) == CFG.gain_threshold  # to a lossy choice: the full threshold
    # From a lossy choice: cheap to a known error that steps as fast (within the small threshold:
    # two predictions level to their noise), the full threshold if the lossy one steps faster.
    assert threshold(scored("acpsgd", 1.0), fp16, PolicyState(), CFG) == 0.02
    assert threshold(scored("acpsgd", 0.97 * 0.985), fp16, PolicyState(), CFG) == 0.02
    assert threshold(acp, fp16, PolicyState(), CFG) == CFG.gain_threshold
    assert threshold(scored("acpsgd", 1.0), fp16, state, CFG) == CFG.gain_threshold  # fp16 was left before
    low = dataclasses.replace(CFG, gain_threshold=0.01)
    assert threshold(none, fp16, PolicyState(), low) == 0.01 == threshold(bf16, none, state, low)  # never inverted


def test_a_move_between_known_errors_that_the_measured_steps_refute_is_undone_once_at_the_small_threshold():
    """none → fp16 on a predicted 2 %; fp16 then measures slower than ``none`` did: back at the
    small threshold, once both have their own measured step (not on predictions alone). The
    undo is no move of its own to undo, and a later move cannot undo an older one."""
    def scored(label: str, tau: float) -> Scored:
        return Scored(make_spec(label), label, tau, None, tau)

    def move(state: PolicyState, current: Scored, to: Scored) -> PolicyState:
        return switch(to.spec, current, to, "test", state, 0.0)[1]

    none, fp16, bf16 = scored("none", 0.96), scored("fp16", 1.0), scored("bf16", 0.99)
    measured = (Correction("none", 0.0005, 1e9), Correction("fp16", 0.003, 1e9), Correction("bf16", 0.002, 1e9))
    on_fp16 = move(PolicyState(), none, fp16)
    assert on_fp16.left == ("none",) and on_fp16.last_move == ("none", "fp16")
    assert threshold(fp16, none, on_fp16, CFG) == CFG.gain_threshold  # on predictions: the band holds
    on_fp16 = dataclasses.replace(on_fp16, corrections=measured)
    assert threshold(fp16, none, on_fp16, CFG) == CFG.known_error_gain_threshold
    assert threshold(fp16, none, dataclasses.replace(on_fp16, corrections=measured[1:]), CFG) == CFG.gain_threshold
    # After the undo both are left and nothing is to undo: the full threshold either way.
    back = move(on_fp16, fp16, none)
    assert back.left == ("none", "fp16") and back.last_move is None
    assert threshold(none, fp16, back, CFG) == CFG.gain_threshold
    # none → bf16 (never left: cheap), then bf16 → fp16 is no undo: fp16 was left before.
    on_bf16 = move(back, none, bf16)
    assert on_bf16.last_move == ("none", "bf16")
    assert threshold(bf16, fp16, on_bf16, CFG) == CFG.gain_threshold
    assert threshold(bf16, none, on_bf16, CFG) == CFG.known_error_gain_threshold  # the one undo it has
    # A lossy choice in between leaves nothing to undo.
    acp = scored("acpsgd", 0.5)
    via_lossy = move(move(on_fp16, fp16, acp), acp, bf16)
    assert via_lossy.last_move is None and threshold(bf16, none, via_lossy, CFG) == CFG.gain_threshold
    assert without_dwell(on_fp16).last_move is None


def test_a_move_to_a_lossy_choice_leaves_no_label_behind():
    """The link falls under fp16: the move to a low-rank compressor is no crossing of two
    known-error choices, so when the link comes back fp16 is a cheap move again."""
    fp16 = make_spec("fp16")
    decision, after = decide(dataclasses.replace(slow_link_state(None), left=("none",)), measure(MBIT50, fp16), CFG, 1.0)
    assert isinstance(decision, Switch) and decision.spec.name in ("acpsgd", "powersgd")
    assert after.left == ("none",)
    lossy = Scored(decision.spec, decision.spec.label, 1.0, None, 1.0)
    back = Scored(fp16, "fp16", 0.95, None, 1.0)
    assert threshold(lossy, back, after, CFG) == CFG.known_error_gain_threshold


def test_rank_outside_bounds_is_fixed_at_once_and_settings_are_kept():
    cfg = dataclasses.replace(CFG, min_rank=2, max_rank=16)
    current = make_spec("acpsgd", rank=1, seed=7, min_compress_numel=100)
    decision, _ = decide(slow_link_state(last_switch_at=0.0), measure(MBIT50, current), cfg, 1.0)
    assert isinstance(decision, Switch) and decision.spec.rank == 2  # within the dwell
    assert (decision.spec.seed, decision.spec.min_compress_numel) == (7, 100)
    assert "quality guard" in decision.reason


def test_decide_is_pure():
    state = slow_link_state(None)
    m = measure(MBIT50, make_spec("none"), grad_norm=3.0)
    assert decide(state, m, CFG, 5.0) == decide(state, m, CFG, 5.0)


def test_one_worker_with_infinite_bandwidth_keeps_no_compression():
    state = PolicyState()
    for now in (0.0, 2.0, 4.0):
        m = Measurements(math.inf, 0.0, 1, PROFILE, make_spec("none"))
        decision, state = decide(state, m, CFG, now)
        assert isinstance(decision, Keep) and state.link.bandwidth == math.inf
    m = Measurements(math.inf, 0.0, 1, PROFILE, make_spec("acpsgd", rank=4))
    decision, _ = decide(state, m, CFG, 6.0)
    assert isinstance(decision, Switch) and decision.spec.name == "none"


def test_config_is_validated():
    with pytest.raises(ValueError, match="^allowed"):
        PolicyConfig(allowed=("zip",))
    with pytest.raises(ValueError, match="^min_rank"):
        PolicyConfig(min_rank=8, max_rank=4)
    with pytest.raises(ValueError, match="^gain_threshold"):
        PolicyConfig(gain_threshold=-0.1)
    assert PolicyConfig(min_rank=4, max_rank=8).critical_min_rank == 8
