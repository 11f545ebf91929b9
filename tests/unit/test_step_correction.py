"""The policy's step times corrected by the job's measured ones (``planning.step_correction``),
on synthetic traces with a frozen clock: plain floats, no torch."""

from __future__ import annotations

import dataclasses
import math

import pytest

from planning.costmodel import ElementCost, StepProfile, alpha_beta_from_bandwidth, predict_step
from planning.link_levels import Stretch, steps_mix
from planning.policy import Keep, Measurements, PolicyConfig, PolicyState, Switch, decide
from planning.spec import CompressorSpec, make_spec
from planning.step_correction import MIN_TIMED_STEPS, Correction, correction_for, record_residual, residuals

MBIT600, GBIT10, MBIT50 = 600e6 / 8, 1.25e9, 6.25e6
LATENCY, WORKERS = 1e-4, 4
SHAPES = [(1024, 1024), (1024,)] * 4 + [(10, 1024), (10,)]
PROFILE = StepProfile.build(SHAPES, forward_s=0.03, backward_s=0.06, optimizer_s=0.005, bucket_cap_bytes=4 * 2**20,
                            default_codec=ElementCost(per_element_s=2e-9, fixed_s=50e-6))
CFG = PolicyConfig(critical_initial_steps=0, allowed=("none", "fp16", "acpsgd"))
FACTOR = CFG.level_shift_factor
ACPSGD16, FP16 = make_spec("acpsgd", rank=16), make_spec("fp16")
#: ACP-SGD r16 loses 20 % of a step's progress (δ = 1 − 0.447² = 0.8); the casts their round-off.
ERRORS = {f"acpsgd-r{r}": (1 + r / 4) ** -0.5 for r in (1, 2, 4, 8, 16, 32, 64)}


def predicted(spec: CompressorSpec, bandwidth: float) -> float:
    """The cost model's step at ``bandwidth`` as the policy builds the link (α from the latency)."""
    link = alpha_beta_from_bandwidth(bandwidth, LATENCY / (2 * (WORKERS - 1)))
    return predict_step(spec, PROFILE, WORKERS, link).step_s


def report(spec: CompressorSpec, bandwidth: float, step: int, measured_s: float | None,
           measured_steps: int = 50) -> Measurements:
    return Measurements(bandwidth, LATENCY, WORKERS, PROFILE, spec, step=step, errors=ERRORS, running=spec.label,
                        measured_step_s=measured_s, measured_steps=measured_steps)


def test_a_residual_is_averaged_per_label_and_a_label_not_run_takes_the_least() -> None:
    corrections = record_residual((), "fp16", 0.12, 0.10, GBIT10, FACTOR)
    assert residuals(corrections) == {"fp16": pytest.approx(0.02)}
    corrections = record_residual(corrections, "fp16", 0.10, 0.10, GBIT10, FACTOR, weight=0.5)
    assert residuals(corrections)["fp16"] == pytest.approx(0.01)
    corrections = record_residual(corrections, "acpsgd-r16", 0.15, 0.10, GBIT10, FACTOR)
    assert [c.label for c in corrections] == ["fp16", "acpsgd-r16"]
    assert correction_for(corrections, "acpsgd-r16", GBIT10, FACTOR) == pytest.approx(0.05)
    assert correction_for(corrections, "none", GBIT10, FACTOR) == pytest.approx(0.01)  # the part every choice pays
    assert correction_for(corrections, "acpsgd-r4", GBIT10, FACTOR) == pytest.approx(0.05)  # its compressor's
    assert correction_for((), "none", GBIT10, FACTOR) == 0.0
    overpriced = (Correction("none", -0.05, MBIT50), Correction("fp16", -0.01, MBIT50))
    assert correction_for(overpriced, "acpsgd-r4", MBIT50, FACTOR) == 0.0  # overpriced links say nothing of it
    for name, args in (("measured_s", (math.nan, 0.1, GBIT10)), ("predicted_s", (0.1, -1.0, GBIT10)),
                       ("bandwidth", (0.1, 0.1, 0.0)), ("bandwidth", (0.1, 0.1, math.nan))):
        with pytest.raises(ValueError, match=f"^{name}"):
            record_residual((), "fp16", *args, FACTOR)


def test_a_residual_belongs_to_the_level_of_the_link_it_was_measured_at() -> None:
    """A label's residuals are averaged per level; at a level where it has not run only the
    part above 0 of its latest applies (a negative residual is the model overpricing the
    choice's communication where it ran), to the label and to another rank of its compressor."""
    slow = record_residual((), "powersgd-r16", 0.20, 0.25, MBIT50, FACTOR)
    assert slow == (Correction("powersgd-r16", pytest.approx(-0.05), MBIT50),)
    assert correction_for(slow, "powersgd-r16", 1.5 * MBIT50, FACTOR) == pytest.approx(-0.05)  # one level
    assert correction_for(slow, "powersgd-r16", GBIT10, FACTOR) == 0.0
    assert correction_for(slow, "powersgd-r4", GBIT10, FACTOR) == 0.0
    assert correction_for(slow, "powersgd-r4", MBIT50, FACTOR) == pytest.approx(-0.05)
    overhead = record_residual((), "powersgd-r16", 0.27, 0.25, MBIT50, FACTOR)
    assert correction_for(overhead, "powersgd-r16", GBIT10, FACTOR) == pytest.approx(0.02)  # paid at every level
    both = record_residual(slow, "powersgd-r16", 0.05, 0.04, GBIT10, FACTOR)  # not averaged with -0.05
    assert both == (Correction("powersgd-r16", pytest.approx(-0.05), MBIT50),
                    Correction("powersgd-r16", pytest.approx(0.01), GBIT10))
    assert residuals(both) == {"powersgd-r16": pytest.approx(0.01)}  # the latest
    assert correction_for(both, "powersgd-r16", MBIT50, FACTOR) == pytest.approx(-0.05)
    assert correction_for(both, "powersgd-r16", GBIT10, FACTOR) == pytest.approx(0.01)
    assert correction_for(both, "powersgd-r16", MBIT600, FACTOR) == pytest.approx(0.01)  # neither: the latest's
    assert correction_for(both, "fp16", MBIT50, FACTOR) == pytest.approx(0.01)  # not run: the labels' latest
    same = record_residual(both, "powersgd-r16", 0.04, 0.04, 1.5 * GBIT10, FACTOR, weight=0.5)
    assert same[-1] == Correction("powersgd-r16", pytest.approx(0.005), pytest.approx(1.5 ** 0.5 * GBIT10))  # follows
    assert len(same) == 2
    alone = record_residual(record_residual((), "none", 0.02, 0.01, math.inf, FACTOR), "none", 0.02, 0.02, math.inf, FACTOR)
    assert alone == (Correction("none", pytest.approx(0.008), math.inf),)  # one worker: no link, one level
    assert correction_for(alone, "none", math.inf, FACTOR) == pytest.approx(0.008)
    more = record_residual(record_residual(same, "powersgd-r16", 0.1, 0.1, MBIT600, FACTOR), "fp16", 0.1, 0.1,
                           MBIT600, FACTOR)
    more = record_residual(more, "powersgd-r16", 0.1, 0.1, 4 * MBIT600, FACTOR)
    assert [(c.label, c.bandwidth) for c in more] == [  # three levels a label, the latest
        ("powersgd-r16", pytest.approx(1.5 ** 0.5 * GBIT10)), ("powersgd-r16", MBIT600), ("fp16", MBIT600),
        ("powersgd-r16", 4 * MBIT600)]


def test_the_window_of_measured_steps_is_weighed_over_the_stretches_it_met() -> None:
    stretches = (Stretch(0.0, 0, GBIT10, GBIT10), Stretch(5.0, 100, MBIT50, MBIT50))
    assert steps_mix(stretches, 130, 50) == ((0.4, GBIT10), (0.6, MBIT50))
    assert steps_mix(stretches, 120, 10) == ((1.0, MBIT50),)
    # The oldest stretch stands for steps before the history begins.
    assert steps_mix(stretches[1:], 120, 50) == ((1.0, MBIT50),)
    assert steps_mix(stretches, None, 50) is None and steps_mix((), 10, 5) is None
    assert steps_mix((Stretch(0.0, None, GBIT10, GBIT10),), 10, 5) is None


def test_a_choice_measured_slower_than_predicted_loses_to_the_one_that_runs_as_predicted() -> None:
    """At 600 Mbit/s the model prices ACP-SGD r16 ahead of fp16 in time per progress, and
    fp16 runs as predicted. When r16 then runs 40 % slower than its prediction, the corrected
    comparison goes back to fp16; with no step times measured the policy keeps r16."""
    assert predicted(ACPSGD16, MBIT600) / 0.8 < predicted(FP16, MBIT600) / (1 + CFG.gain_threshold)

    def trace(measure: bool) -> tuple[PolicyState, list[object]]:
        state, verdicts = PolicyState(), []
        for i in range(5):  # fp16 runs first, as predicted
            m = report(FP16, MBIT600, 10 * i, predicted(FP16, MBIT600) if measure else None)
            _, state = decide(state, m, CFG, float(i))
        for i in range(5, 60):  # then r16 (switched to at t = 0, past the dwell from t = 30 s)
            m = report(ACPSGD16, MBIT600, 10 * i, 1.4 * predicted(ACPSGD16, MBIT600) if measure else None)
            verdict, state = decide(state, m, CFG, float(i))
            verdicts.append(verdict)
        return state, verdicts

    state, verdicts = trace(measure=True)
    corrections = residuals(state.corrections)
    assert corrections["fp16"] == pytest.approx(0.0, abs=1e-12)
    assert corrections["acpsgd-r16"] == pytest.approx(0.4 * predicted(ACPSGD16, MBIT600), rel=1e-6)
    switch = next(v for v in verdicts if isinstance(v, Switch))
    assert switch.spec.label == "fp16"
    assert switch.current_step_s == pytest.approx(1.4 * predicted(ACPSGD16, MBIT600), rel=1e-6)
    _, unmeasured = trace(measure=False)
    assert all(isinstance(v, Keep) for v in unmeasured[25:])


def test_a_mean_over_too_few_steps_or_in_the_warm_up_or_far_off_the_model_is_not_folded() -> None:
    fast = predicted(FP16, GBIT10)
    for m in (report(FP16, GBIT10, 100, fast, measured_steps=MIN_TIMED_STEPS - 1),
              report(make_spec("acpsgd", rank=16, warmup_steps=200), GBIT10, 100, fast),  # ran uncompressed
              report(FP16, GBIT10, 100, 1.6 * fast)):  # a window the average placed on the wrong level
        _, state = decide(PolicyState(), m, CFG, 0.0)
        assert state.corrections == ()
    _, state = decide(PolicyState(), report(FP16, GBIT10, 100, 1.2 * fast), CFG, 0.0)
    assert residuals(state.corrections)["fp16"] == pytest.approx(0.2 * fast)


def test_a_choice_that_runs_as_predicted_through_a_drop_of_the_link_keeps_no_correction() -> None:
    """fp16's step is many times longer at 50 Mbit/s than at 10 Gbit/s, and its measured mean
    covers the last 50 steps, which after a drop span both levels while the average still shows
    the fast link (it waits for a second report to confirm a shift). A mean folded against the
    averaged link would read the slow steps as fp16 running slower than the model, and keep
    that for good; the policy folds only means whose steps met one level (and a report's raw
    reading off the average holds the fold until the shift is confirmed)."""
    def link(step: int) -> float:
        return GBIT10 if step < 300 else MBIT50

    def overhead(step: int) -> float:  # what the model misses on every step: more after the drop
        return (0.1 if step < 300 else 0.2) * predicted(FP16, GBIT10)

    state, corrections = PolicyState(), []
    for report_step in range(10, 700, 10):
        steps = range(max(0, report_step - 50), report_step)
        measured = sum(overhead(s) + predicted(FP16, link(s)) for s in steps) / len(steps)
        _, state = decide(state, report(FP16, link(report_step - 1), report_step, measured, len(steps)), CFG,
                          report_step / 10)
        corrections.append(residuals(state.corrections).get("fp16", 0.0))
    assert corrections[25] == pytest.approx(overhead(0))  # step 260
    assert corrections[-1] == pytest.approx(overhead(300), rel=1e-3)  # folded again on the slow link
    assert overhead(0) - 1e-12 <= min(corrections[25:]) and max(corrections) <= overhead(300) + 1e-12, corrections


def test_a_negative_residual_of_a_slow_link_does_not_keep_a_low_rank_on_the_fast_link_after_it() -> None:
    """The cluster scenario's failure (session 38), on a synthetic trace: PowerSGD r16 runs
    through a 20 Mbit/s stretch faster than the model prices it there (the averaged reading
    below the link's rate), then the link rises to 2 Gbit/s, where the model prices it at nearly
    twice fp16's step and it runs slower still. Carried to the fast link, its residual took
    its prediction to half and kept it ahead of fp16; per level, the policy goes back to fp16
    within a few reports of the rise."""
    profile = StepProfile.build(SHAPES, forward_s=0.002, backward_s=0.004, optimizer_s=0.001,
                                bucket_cap_bytes=4 * 2**20, default_codec=ElementCost(per_element_s=3e-9, fixed_s=50e-6))
    cfg = PolicyConfig(critical_initial_steps=0, allowed=("none", "fp16", "powersgd"), min_rank=16, max_rank=16,
                       min_dwell_s=5.0)
    low_rank, slow, fast = make_spec("powersgd", rank=16), 20e6 / 8, 2e9 / 8

    def step_s(spec: CompressorSpec, bandwidth: float) -> float:
        return predict_step(spec, profile, 2, alpha_beta_from_bandwidth(bandwidth, 1e-4 / 2)).step_s

    assert step_s(FP16, fast) < 0.6 * step_s(low_rank, fast)  # fp16 is the faster on the fast link
    assert step_s(low_rank, fast) - 0.45 * step_s(low_rank, slow) < 0.5 * step_s(low_rank, fast)
    assert 0.5 * step_s(low_rank, fast) < step_s(FP16, fast)  # carried, the floor put r16 ahead of fp16

    def report(spec: CompressorSpec, bandwidth: float, step: int, measured_s: float) -> Measurements:
        return Measurements(bandwidth, 1e-4, 2, profile, spec, step=step, errors={"powersgd-r16": 0.01},
                            running=spec.label, measured_step_s=measured_s, measured_steps=10)

    state, t, step = PolicyState(), 0.0, 0
    for _ in range(10):  # fp16 on the fast link, as the model prices it
        step, t = step + 10, t + 0.5
        _, state = decide(state, report(FP16, fast, step, step_s(FP16, fast)), cfg, t)
    for _ in range(30):  # the drop: r16, measured 45 % under the model's price at the averaged reading
        step, t = step + 10, t + 0.5
        _, state = decide(state, report(low_rank, slow, step, 0.55 * step_s(low_rank, slow)), cfg, t)
    assert residuals(state.corrections)["powersgd-r16"] == pytest.approx(-0.45 * step_s(low_rank, slow), rel=0.05)
    verdicts = []
    for _ in range(10):  # the rise: r16 runs twice as slow as the model prices it (not folded: far off)
        step, t = step + 10, t + 0.5
        verdict, state = decide(state, report(low_rank, fast, step, 2 * step_s(low_rank, fast)), cfg, t)
        verdicts.append(verdict)
    switch = next((v for v in verdicts if isinstance(v, Switch)), None)
    assert switch is not None and switch.spec.label == "fp16", [v.reason for v in verdicts]
    assert verdicts.index(switch) <= 3
    assert switch.current_step_s == pytest.approx(step_s(low_rank, fast), rel=1e-6)  # no negative part carried


def test_on_an_oscillating_mix_each_level_takes_its_own_correction_and_floor() -> None:
    """fp16's step measured 30 % under the model at 50 Mbit/s (the slow reading's overpricing)
    and 0.01 s over it at 10 Gbit/s: on a mix of the two, each level's prediction takes its own
    residual; a level where a label has not run takes its residual's part above 0; a correction
    takes no level's prediction below half."""
    from planning.scoring import score

    links = tuple((0.5, alpha_beta_from_bandwidth(b, LATENCY / (2 * (WORKERS - 1)))) for b in (MBIT50, GBIT10))
    slow, fast = predicted(FP16, MBIT50), predicted(FP16, GBIT10)

    def step_s(*corrections: Correction) -> float:
        m = dataclasses.replace(report(FP16, GBIT10, 100, None), step_corrections=corrections)
        return score(FP16, m, links, FACTOR).step_s

    both = (Correction("fp16", -0.3 * slow, MBIT50), Correction("fp16", 0.01, GBIT10))
    assert step_s(*both) == pytest.approx(0.5 * 0.7 * slow + 0.5 * (fast + 0.01))
    assert step_s(both[0]) == pytest.approx(0.5 * 0.7 * slow + 0.5 * fast)  # not run fast: nothing below 0 there
    assert step_s(Correction("fp16", -0.9 * slow, MBIT50)) == pytest.approx(0.5 * 0.5 * slow + 0.5 * fast)


def test_the_steps_mix_of_a_run_whose_steps_went_back_is_none() -> None:
    stretches = (Stretch(0.0, 1000, GBIT10, GBIT10), Stretch(5.0, 1200, MBIT50, MBIT50))
    assert steps_mix(stretches, 300, 50) is None


def test_a_new_world_size_drops_the_corrections_measured_at_the_old_one() -> None:
    from planning.controller import AdaptiveController
    from planning.protocol import ModelProfile, Telemetry
    from planning.sections import CompressionConfig

    profile = ModelProfile(shapes=[[1024, 1024], [1024]], forward_s=0.002, backward_s=0.004)
    controller = AdaptiveController(CompressionConfig(mode="adaptive", compressor="fp16"))

    def observe(step: int, world_size: int, timed_steps: int | None) -> None:
        controller.observe(Telemetry(step=step, world_size=world_size, bandwidth_bytes_per_second=GBIT10,
                                     latency_seconds=1e-4, timed_steps=timed_steps, step_wall_seconds=0.007,
                                     compressor="fp16", profile=profile), float(step))

    observe(200, 4, 50)
    assert [c.label for c in controller.state.corrections] == ["fp16"]
    observe(210, 4, None)
    assert [c.label for c in controller.state.corrections] == ["fp16"]
    observe(220, 3, None)  # a node went: nothing measured at three workers yet
    assert controller.state.corrections == ()


def test_a_report_gives_the_policy_its_mean_wall_time_per_step() -> None:
    """All a step costs, the work between its phases included: the wall time between the ends
    of the window's steps, one interval fewer than its steps."""
    from planning.controller import policy_measurements
    from planning.protocol import Telemetry

    phases = {"data": 0.5, "forward": 0.01, "backward": 0.02, "exposed_comm": 0.003, "optimizer": 0.001,
              "compress": 0.002}
    report = Telemetry(step=60, world_size=2, bandwidth_bytes_per_second=1e8, phase_seconds=phases, timed_steps=50,
                       step_wall_seconds=0.04, compressor="fp16")
    m = policy_measurements(report, PROFILE, FP16)
    assert m is not None and m.measured_steps == 49 and m.running == "fp16"
    assert m.measured_step_s == 0.04
    bare = policy_measurements(Telemetry(step=60, bandwidth_bytes_per_second=1e8), PROFILE, FP16)
    assert bare is not None and bare.measured_step_s is None and bare.measured_steps is None
