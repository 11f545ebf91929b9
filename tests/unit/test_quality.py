"""The quality signal: the running compressor's error and the candidates' estimates, against
their definitions (compressors.quality).

The running error is checked on one simulated rank (``run_in_lockstep``), where the bucket
the compressor leaves behind is exactly C(g + e_old), so ‖(g + e_old) − C(g + e_old)‖ /
‖g + e_old‖ can be computed independently of the meter. Then on a real one-process gloo
group through ``GradientSync`` (the hook's two calls).
"""

from __future__ import annotations

import math
import time

import pytest
import torch
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

from compressors import GradientSync, build
from compressors.base import GradSlot, run_in_lockstep
from compressors.quality import ErrorMeter, estimate_errors, group_error, update_efficiency
from planning.costmodel import candidates
from planning.spec import make_spec

SHAPES = {"conv.weight": (16, 4, 3, 3), "conv.bias": (16,), "fc.weight": (48, 64), "fc.bias": (48,)}
CHOICES = [("none", {}), ("fp16", {}), ("bf16", {}), ("signsgd", {}), ("topk", {"ratio": 0.05}),
           ("powersgd", {"rank": 2}), ("acpsgd", {"rank": 2}), ("acpsgd", {"rank": 8})]


def _bucket(seed: int) -> tuple[torch.Tensor, list[GradSlot]]:
    gen = torch.Generator().manual_seed(seed)
    sizes = [math.prod(s) for s in SHAPES.values()]
    buffer = torch.randn(sum(sizes), generator=gen)
    slots, offset = [], 0
    for (key, shape), size in zip(SHAPES.items(), sizes):
        slots.append(GradSlot(key=key, grad=buffer[offset:offset + size].view(shape), offset=offset))
        offset += size
    return buffer, slots


def _metered_step(meter: ErrorMeter, compressor, step: int) -> None:
    """One step of ``_bucket(step)`` on one simulated rank, with the meter's two hook calls."""
    buffer, slots = _bucket(step)
    meter.bucket(slots, compressor)
    run_in_lockstep([compressor.process(buffer, slots, 1)])
    compressor.end_step()
    meter.step_done(compressor)


def _reference_error(compressor, buffer: torch.Tensor, slots: list[GradSlot]) -> tuple[float, torch.Tensor]:
    """(ε by definition, the bucket after the step) for one step on one rank."""
    residuals = compressor.residuals()
    x = buffer.clone()
    for slot in slots:
        if slot.key in residuals:
            x[slot.offset:slot.offset + slot.grad.numel()] += residuals[slot.key].reshape(-1)
    run_in_lockstep([compressor.process(buffer, slots, 1)])
    compressor.end_step()
    return float(torch.linalg.vector_norm(x - buffer) / torch.linalg.vector_norm(x)), buffer


@pytest.mark.parametrize("name,params", CHOICES, ids=[make_spec(n, **p).label for n, p in CHOICES])
def test_running_error_is_the_relative_compression_error_of_each_step(name, params):
    compressor, meter = build(name, **params), ErrorMeter()
    seen = []
    for step in range(4):  # later steps carry error feedback: x = g + e_old
        reference_buffer, reference_slots = _bucket(step)
        reference = build(name, **params)
        reference.load_state_dict(compressor.state_dict())
        expected, _ = _reference_error(reference, reference_buffer, reference_slots)
        _metered_step(meter, compressor, step)
        assert meter.last == pytest.approx(expected, rel=1e-4, abs=1e-7)
        seen.append(meter.last)
    if name == "none":
        assert seen == [0.0] * 4
    elif name in ("fp16", "bf16"):
        assert 0 < max(seen) < (1e-3 if name == "fp16" else 1e-2)
    else:
        assert 0.05 < min(seen) < 1.0


def test_warm_up_steps_have_no_error_and_the_meter_times_itself():
    compressor, meter = build("acpsgd", rank=2, warmup_steps=1), ErrorMeter()
    errors = []
    for step in range(2):
        _metered_step(meter, compressor, step)
        errors.append(meter.last)
    assert errors[0] is None and errors[1] > 0.1  # nothing compressed in the warm-up step
    assert meter.seconds > 0 and meter.steps == 2


def _svd_error(matrix: torch.Tensor, rank: int) -> float:
    u, s, vh = torch.linalg.svd(matrix.double(), full_matrices=False)
    approx = (u[:, :rank] * s[:rank]) @ vh[:rank]
    return float(torch.linalg.norm(matrix.double() - approx) / torch.linalg.norm(matrix.double()))


def test_estimates_follow_each_candidates_definition():
    gen = torch.Generator().manual_seed(3)
    matrix = torch.randn(40, 8, generator=gen) @ torch.randn(8, 30, generator=gen) + 0.1 * torch.randn(40, 30, generator=gen)
    specs = [make_spec("none"), make_spec("fp16"), make_spec("acpsgd", rank=2), make_spec("powersgd", rank=8),
             make_spec("topk", ratio=0.1), make_spec("signsgd")]
    errors = estimate_errors([matrix], specs)
    assert errors["none"] == 0.0
    assert 0 < errors["fp16"] < 1e-3
    assert errors["acpsgd-r2"] == pytest.approx(_svd_error(matrix, 2), rel=1e-4)
    assert errors["powersgd-r8"] == pytest.approx(_svd_error(matrix, 8), rel=1e-3)
    assert errors["powersgd-r8"] < errors["acpsgd-r2"]  # a higher rank loses less
    flat = matrix.reshape(-1)
    k = int(0.1 * flat.numel())
    kept = flat.abs().topk(k).values
    assert errors["topk-0.1"] == pytest.approx(math.sqrt(1 - float((kept ** 2).sum() / (flat ** 2).sum())), rel=1e-4)
    scaled_sign = flat.abs().mean() * torch.where(flat >= 0, 1.0, -1.0)
    assert errors["signsgd"] == pytest.approx(float((flat - scaled_sign).norm() / flat.norm()), rel=1e-4)


@pytest.mark.parametrize("shape", [(40, 30), (30, 40), (12, 12)])
def test_the_gram_route_gives_the_singular_values_and_vectors(shape):
    """``squared_singular_values`` and ``singular_triplets`` (the estimates' faster route)
    against ``torch.linalg.svd``, wide, tall and square, on a matrix of rank 5: the values
    match, the triplets rebuild the matrix, each top vector spans the SVD's (up to sign), and
    the directions the matrix lacks get no vector."""
    from compressors.lowrank import singular_triplets, squared_singular_values

    gen = torch.Generator().manual_seed(11)
    matrix = torch.randn(shape[0], 5, generator=gen) @ torch.randn(5, shape[1], generator=gen)
    u, s, vh = torch.linalg.svd(matrix.double(), full_matrices=False)
    energy = float(torch.sum(s ** 2))
    assert torch.allclose(squared_singular_values(matrix), s ** 2, atol=1e-9 * energy)
    sigma, left, right = singular_triplets(matrix)
    assert left.shape == (shape[0], min(shape)) and right.shape == (shape[1], min(shape))
    assert torch.allclose(sigma, s, atol=1e-6 * float(s[0]))
    assert torch.allclose((left * sigma) @ right.T, matrix.double(), atol=1e-5)
    for index in range(5):
        assert abs(float(left[:, index] @ u[:, index])) == pytest.approx(1.0, abs=1e-6)
        assert abs(float(right[:, index] @ vh[index])) == pytest.approx(1.0, abs=1e-6)
    held = sigma > float(sigma[0]) * 1e-6
    assert int(held.sum()) == 5
    # a matrix that holds nothing: no singular value, no vector, nothing undefined
    sigma, left, right = singular_triplets(torch.zeros(shape))
    assert not torch.any(sigma) and torch.isfinite(left).all() and torch.isfinite(right).all()
    assert not torch.any(squared_singular_values(torch.zeros(shape)))


def test_topks_estimate_serves_every_ratio_in_either_order():
    """One ``topk`` at the largest k serves the smaller ratios; a larger k asked after a smaller
    one is computed again, not read past the end of the kept values."""
    gen = torch.Generator().manual_seed(12)
    flat = torch.randn(5000, generator=gen)
    squares = torch.sort(flat.double() ** 2, descending=True).values

    def definition(ratio: float) -> float:
        return math.sqrt(float(torch.sum(squares[int(ratio * flat.numel()):]) / torch.sum(squares)))

    small, large = make_spec("topk", ratio=0.01), make_spec("topk", ratio=0.1)
    for order in ([small, large], [large, small]):
        errors = estimate_errors([flat.reshape(50, 100)], order)
        assert errors["topk-0.01"] == pytest.approx(definition(0.01), rel=1e-6)
        assert errors["topk-0.1"] == pytest.approx(definition(0.1), rel=1e-6)


def test_estimates_pool_over_tensors_and_count_uncompressed_ones_as_exact():
    gen = torch.Generator().manual_seed(4)
    big, small = torch.randn(64, 64, generator=gen), torch.randn(3, 4, generator=gen)
    spec = make_spec("acpsgd", rank=4, min_compress_numel=100)  # leaves the 3x4 matrix uncompressed
    pooled = estimate_errors([big, small], [spec])[spec.label]
    alone = estimate_errors([big], [spec])[spec.label]
    lost_sq = alone ** 2 * float((big ** 2).sum())
    assert pooled == pytest.approx(math.sqrt(lost_sq / float((big ** 2).sum() + (small ** 2).sum())), rel=1e-5)
    assert estimate_errors([], [spec]) == {spec.label: 0.0}


def test_every_candidate_of_the_default_bounds_gets_an_estimate():
    specs = candidates(("none", "fp16", "bf16", "signsgd", "topk", "powersgd", "acpsgd"))
    errors = estimate_errors([torch.randn(32, 32)], specs)
    assert set(errors) == {s.label for s in specs}
    assert all(0 <= e <= 1 for e in errors.values())


@pytest.fixture
def one_process_group():
    from benchmarks.compressor_cost import single_process_group  # noqa: PLC0415

    with single_process_group():
        yield


def test_the_hook_measures_the_running_error_and_samples_gradients(one_process_group):
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10)), bucket_cap_mb=0.001)
    sync = GradientSync(build("acpsgd", rank=2)).install(model)
    sync.error_meter = meter = ErrorMeter()
    errors = []
    for step in range(4):
        if step == 2:
            meter.request_sample()
        model.zero_grad()
        nn.functional.cross_entropy(model(torch.randn(16, 32)), torch.randint(0, 10, (16,))).backward()
        errors.append(meter.last)
        assert (meter.sample is None) == (step < 3)  # the sample is the second of the two steps
    assert all(e is not None and 0.05 < e < 1 for e in errors)
    sample = meter.take_sample()
    assert sorted(tuple(t.shape) for t in sample.tensors) == [(10, 64), (64, 32)]
    # each with the same parameter's gradient the step before (ACP-SGD's estimate uses it)
    assert [tuple(t.shape) for t in sample.previous] == [tuple(t.shape) for t in sample.tensors]
    assert not any(torch.equal(before, now) for before, now in zip(sample.previous, sample.tensors))
    assert meter.take_sample() == ([], []) and meter.sample is None
    sync.switch(build("none"))
    model.zero_grad()
    nn.functional.cross_entropy(model(torch.randn(16, 32)), torch.randint(0, 10, (16,))).backward()
    assert meter.last == 0.0


def _mlp_signal(probe_interval_s: float):
    """An MLP on a one-process group with ``none`` running and rank 0's quality signal of an
    adaptive job allowed ``none`` and ACP-SGD up to rank 8: (model, sync, cfg, signal)."""
    from planning.config import TrainConfig
    from workers.quality import QualitySignal

    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10)))
    sync = GradientSync(build("none")).install(model)
    cfg = TrainConfig(name="q", model="mlp", dataset="synthetic", steps=10, workers=1, probe_interval_s=probe_interval_s,
                      compression={"mode": "adaptive", "compressor": "none", "allowed": ["none", "acpsgd"],
                                   "max_rank": 8})
    return model, sync, cfg, QualitySignal(cfg, sync)


def test_rank_zero_estimates_every_candidate_within_its_budget(one_process_group):
    model, sync, cfg, signal = _mlp_signal(1e-6)
    for _ in range(4):
        model.zero_grad()
        nn.functional.cross_entropy(model(torch.randn(16, 32)), torch.randint(0, 10, (16,))).backward()
        signal.after_step()
    assert set(signal.estimates) == {"none", "acpsgd-r8", "acpsgd-r4", "acpsgd-r2", "acpsgd-r1"}
    assert signal.estimates["acpsgd-r1"] > signal.estimates["acpsgd-r8"]
    assert signal.running_error("none") is None  # no exchange yet
    signal.exchange()  # one rank: the group's error is the rank's own
    assert signal.running_error("none") == 0.0 and signal.running_error("acpsgd-r4") is None  # not what ran
    overhead = signal.overhead()
    assert overhead["estimates"] >= 1 and overhead["estimate_s"] > 0 and 0 < overhead["share_of_run"] < 1
    from workers.quality import QualitySignal

    fixed = QualitySignal(cfg.model_copy(update={"compression": cfg.compression.model_copy(update={"mode": "fixed"})}),
                          sync)
    assert fixed.candidates == () and (fixed.after_step() or fixed.estimates) == {}


def test_a_due_estimate_that_cannot_matter_is_deferred_at_no_cost(one_process_group):
    """The gate is asked only when an estimate is due; while it says no, nothing is sampled or
    estimated and the estimate waits another interval; once it says yes, the next due one runs."""
    model, sync, cfg, signal = _mlp_signal(1.0)
    asked = []

    def gate(answer: bool):
        def can_matter() -> bool:
            asked.append(answer)
            return answer
        return can_matter

    def step(can_matter) -> None:
        model.zero_grad()
        nn.functional.cross_entropy(model(torch.randn(16, 32)), torch.randint(0, 10, (16,))).backward()
        signal.after_step(can_matter)

    step(gate(False))  # due at start: asked, deferred
    step(gate(False))  # within the interval: not even asked
    assert asked == [False] and signal.deferred == 1 and signal.estimates == {} and signal.meter.sample is None
    assert signal.overhead()["estimates"] == 0 and signal.overhead()["estimates_deferred"] == 1
    time.sleep(1.05)  # two steps of this MLP take milliseconds: the first two came within the interval
    step(gate(True))  # due again: asked, a sample requested (the next step and its step before)
    step(gate(True))  # the step before the sample
    assert signal.estimates == {}
    step(gate(True))  # the estimate runs on the sample
    assert asked == [False, True] and set(signal.estimates) >= {"acpsgd-r8", "acpsgd-r1"}
    assert signal.overhead()["estimates"] == 1 and signal.estimate_s > 0


def test_a_lossy_candidate_the_sample_cannot_resolve_gets_the_nearest_smaller_ranks_estimate():
    """One step's gradient of a linear layer has rank <= the batch: a rank at or above it
    loses nothing on the sample, which is no evidence about the compressor's real error."""
    gen = torch.Generator().manual_seed(5)
    low_rank = torch.randn(64, 6, generator=gen) @ torch.randn(6, 96, generator=gen)  # rank 6
    specs = [make_spec("acpsgd", rank=2), make_spec("acpsgd", rank=4), make_spec("acpsgd", rank=8),
             make_spec("acpsgd", rank=16), make_spec("powersgd", rank=8), make_spec("none"), make_spec("fp16")]
    errors = estimate_errors([low_rank], specs)
    assert errors["acpsgd-r2"] > errors["acpsgd-r4"] > 0
    assert errors["acpsgd-r8"] == errors["acpsgd-r16"] == errors["acpsgd-r4"]  # not 0: r4 bounds their best case
    assert errors["powersgd-r8"] == 0.0  # no smaller rank of its own to stand in: the best case
    assert errors["none"] == 0.0 and errors["fp16"] > 0
    # a candidate that compresses nothing of the sample is exact there, and says so
    assert estimate_errors([torch.randn(4, 4, generator=gen)], [make_spec("acpsgd", rank=8)]) == {"acpsgd-r8": 0.0}


def test_after_an_exchange_the_meter_measures_only_the_step_the_next_one_reads():
    compressor, meter = build("powersgd", rank=2), ErrorMeter(total_elements=sum(math.prod(s) for s in SHAPES.values()))
    kept, errors = [], []
    meter.measure_before(3)  # as after an exchange with sync_every = 3
    for step in range(4):
        if step == 1:
            meter.request_sample()  # a requested gradient sample is taken on a skipped step too
        _metered_step(meter, compressor, step)
        kept.append(meter.cycle.coordinate_sample)
        errors.append(meter.last)
    assert kept[:2] == [None, None] and errors[:2] == [None, None]  # skipped: nothing measured
    sample = meter.take_sample()  # fc.weight and conv.weight of step 2, each with its gradient of step 1
    raw = {step: {slot.key: slot.grad for slot in _bucket(step)[1]} for step in (1, 2)}
    assert [t.shape for t in sample.tensors] == [(48, 64), (16, 4, 3, 3)]  # the largest first
    for key, now, before in zip(("fc.weight", "conv.weight"), sample.tensors, sample.previous):
        assert torch.equal(now, raw[2][key]) and before is not None and torch.equal(before, raw[1][key])
    assert kept[2] is not None and kept[3] is not None and kept[3] is not kept[2]  # then every step
    assert 0.05 < errors[2] < 1 and 0.05 < errors[3] < 1
    assert kept[2].numel() == 3 * sum(max(1, round(1024 * math.prod(s) / meter.total_elements)) for s in SHAPES.values())


def test_the_quality_signal_benchmark_measures_each_figure_by_its_definition():
    """benchmarks.quality_signal on a few steps: uncompressed training has ε = 0 and η = 1;
    a lossy choice loses something (ε > 0) and makes less than a full step (η < 1)."""
    import argparse

    from benchmarks.quality_signal import markdown, run_choice

    args = argparse.Namespace(model="mlp", steps=6, skip_steps=2, batch_size=16, bucket_cap_mb=0.25, lr=0.02,
                              held_out=64, seed=0, noise_scale=False)
    none, lossy = run_choice("none", args), run_choice("powersgd-r1", args)
    # the noise ratio's extra backward passes leave the trajectory as it was
    noisy = run_choice("none", argparse.Namespace(**{**vars(args), "noise_scale": True}))
    assert noisy["held_out_loss"] == none["held_out_loss"] and "noise_ratio_median" not in none
    assert set(noisy["noise_ratio_by_steps"]) == {"0-50"}
    assert none["error_median"] == 0.0 and none["efficiency_median"] == 1.0
    assert none["residual_over_gradient_median"] == 0.0 and none["cos_squared_median"] == pytest.approx(1.0)
    assert 0 < lossy["error_median"] < 1 and lossy["efficiency_median"] < 1 and lossy["residual_over_gradient_median"] > 0
    assert 0 < lossy["cos_squared_median"] < 1
    # the momentum buffers' cosine: 1 without compression, below 1 with a rank-1 one
    assert none["momentum_cos_median"] == pytest.approx(1.0) and 0 < lossy["momentum_cos_median"] < 1
    assert math.isfinite(none["held_out_loss"]) and math.isfinite(lossy["held_out_loss"])
    table = markdown({"choices": {"none": {**noisy, "noise_ratio_median": 0.5}, "powersgd-r1": lossy}})
    assert "| powersgd-r1 |" in table and "| none |" in table
    assert "| 0.50 | 1.000 |" in table  # cos 1: the whole step whatever the noise


def test_the_noise_ratio_is_the_half_batches_noise_over_the_signal():
    """``benchmarks.quality_signal._NoiseRatio`` on synthetic half-batch gradients ``G + n``,
    the noise of each half N(0, σ²) per coordinate: ``tr(Σ)/B`` is half a half's noise
    (``d·σ²/2``), so ``b = d·σ² / (2|G|²)``, here 0.5."""
    from benchmarks.quality_signal import _NoiseRatio

    generator = torch.Generator().manual_seed(0)
    d, sigma = 10_000, 0.1
    signal = torch.full((d,), 0.1, dtype=torch.float64)  # |G|² = 100, d·σ² = 100
    ratio = _NoiseRatio()
    for _ in range(400):
        ratio.observe(*(signal + sigma * torch.randn(d, generator=generator, dtype=torch.float64) for _ in range(2)))
    assert ratio.summary(100)["noise_ratio_median"] == pytest.approx(0.5, rel=0.05)
    # no gradient at all: no estimate of the signal, no ratio
    silent = _NoiseRatio()
    silent.observe(torch.zeros(d, dtype=torch.float64), torch.zeros(d, dtype=torch.float64))
    assert silent.summary(0)["noise_ratio_median"] is None


def _exact_step(compressor, step: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(x = g + e_old, x − C(x), g) of step ``step`` on one rank, from the full tensors."""
    buffer, slots = _bucket(step)
    g = buffer.clone().double()
    residuals = compressor.residuals()
    x = g.clone()
    for slot in slots:
        if slot.key in residuals:
            x[slot.offset:slot.offset + slot.grad.numel()] += residuals[slot.key].reshape(-1).double()
    run_in_lockstep([compressor.process(buffer, slots, 1)])
    compressor.end_step()
    return x, x - buffer.double(), g


def test_the_update_efficiency_is_the_cosine_of_the_applied_update_with_the_gradient():
    """cos(x − lost, g): blind to the update's length, not to its direction; clamped to [0, 1];
    None where either vector is 0."""
    g = torch.tensor([3.0, 0.0, 4.0])
    across = torch.tensor([0.0, 5.0, 0.0])  # orthogonal to g, as long
    assert update_efficiency(g, torch.zeros(3), g) == pytest.approx(1.0)  # none: nothing lost
    assert update_efficiency(0.5 * g, torch.zeros(3), g) == pytest.approx(1.0)  # half as long, same direction
    assert update_efficiency(g + across, torch.zeros(3), g) == pytest.approx(1 / math.sqrt(2))  # paid-out residual
    assert update_efficiency(g + across, across, g) == pytest.approx(1.0)  # the residual kept back
    assert update_efficiency(-g, torch.zeros(3), g) == 0.0  # against the gradient
    assert update_efficiency(g, g, g) is None and update_efficiency(g, torch.zeros(3), torch.zeros(3)) is None


def test_acpsgd_is_measured_over_a_p_step_and_the_q_step_after_it_pooled():
    """ACP-SGD's P- and Q-steps lose different parts of the gradient: an exchange every odd
    number of steps would read one or the other by parity. The meter measures the last two
    steps before the exchange and pools them: ε = sqrt(Σ‖x − C(x)‖² / Σ‖x‖²) and
    the cosine of Σ(x − (x − C(x))) with g over the pair: ε on the full tensors, the cosine at the meter's
    own coordinates (what the group's exchange sums)."""
    compressor = build("acpsgd", rank=2)
    meter = ErrorMeter(total_elements=sum(math.prod(s) for s in SHAPES.values()))
    reference = build("acpsgd", rank=2)
    exact = []
    meter.measure_before(3)  # as after an exchange with sync_every = 3: steps 1 and 2 are read
    for step in range(3):
        reference.load_state_dict(compressor.state_dict())
        exact.append(_exact_step(reference, step))
        _metered_step(meter, compressor, step)
        if step < 2:
            assert meter.cycle.error is None and meter.cycle.coordinate_sample is None  # no whole cycle yet
    x, lost, g = (torch.cat(part) for part in zip(*exact[1:]))
    pooled_error = float(lost.norm() / x.norm())
    per_step_error = [float(s[1].norm() / s[0].norm()) for s in exact[1:]]
    assert meter.cycle.error == pytest.approx(pooled_error, rel=1e-4)
    assert meter.last == pytest.approx(per_step_error[1], rel=1e-4)  # the step's own figure stays
    assert group_error(meter) == pytest.approx(pooled_error, rel=1e-4)
    assert meter.group_label == "acpsgd-r2"
    _, slots = _bucket(0)
    offsets = {slot.key: slot.offset for slot in slots}
    at = {key: offsets[key] + meter._coordinates(key, math.prod(SHAPES[key])) for key in sorted(SHAPES)}
    x_at, lost_at, g_at = (torch.cat([step[part][at[key]] for step in exact[1:] for key in sorted(SHAPES)])
                           for part in range(3))
    pooled_efficiency = update_efficiency(x_at, lost_at, g_at)
    assert meter.group_efficiency == pytest.approx(pooled_efficiency, rel=1e-6)  # fp32 gradients
    singles = [update_efficiency(*(torch.cat([step[part][at[key]] for key in sorted(SHAPES)]) for part in range(3)))
               for step in exact[1:]]
    assert all(abs(single - pooled_efficiency) > 1e-3 for single in singles)  # neither step alone
    assert meter.cycle.coordinate_sample is not None
    assert meter.cycle.coordinate_sample.numel() == 2 * 3 * meter.coordinate_count()
    # PowerSGD repeats every step: one step is its whole cycle
    single = ErrorMeter()
    _metered_step(single, build("powersgd", rank=2), 0)
    assert single.cycle.error == single.last and single.cycle.length == 1


def test_a_switch_or_a_warm_up_step_starts_the_cycle_afresh():
    meter = ErrorMeter()
    acp = build("acpsgd", rank=2)
    _metered_step(meter, build("powersgd", rank=2), 0)
    _metered_step(meter, acp, 1)  # a switch: the PowerSGD step is not half of ACP-SGD's cycle
    assert meter.cycle.label == "acpsgd-r2" and meter.cycle.error is None
    _metered_step(meter, acp, 2)
    assert meter.cycle.error is not None
    _metered_step(meter, build("powersgd", rank=2), 3)
    _metered_step(meter, acp, 4)  # ACP-SGD again: not paired with its step before the PowerSGD one
    assert meter.cycle.label == "acpsgd-r2" and meter.cycle.error is None
    warm = build("acpsgd", rank=2, warmup_steps=1)
    _metered_step(meter, warm, 5)  # a warm-up step compresses nothing: no cycle to read
    assert meter.cycle.error is None and meter.cycle.label is None


def test_a_cycle_is_read_only_from_consecutive_steps():
    """An exchange every 3 steps reads steps 1-2, then 4-5: step 4 must not pair with step 2
    across the unmeasured step 3 (two steps of one ACP-SGD turn); a step undone in the window
    leaves it incomplete, so that exchange reads nothing rather than a half cycle."""
    compressor, meter = build("acpsgd", rank=2), ErrorMeter()
    meter.measure_before(3)
    for step in range(3):
        _metered_step(meter, compressor, step)
    assert meter.cycle.error is not None  # steps 1 and 2
    meter.measure_before(3)
    _metered_step(meter, compressor, 3)  # unmeasured
    _metered_step(meter, compressor, 4)
    assert meter.cycle.error is None  # step 4 alone, not paired with step 2
    meter.discard_step()  # step 5 undone on some rank: the exchange after it reads nothing
    assert meter.cycle.error is None
    _metered_step(meter, compressor, 6)  # measured again: the turn after step 4's, a whole cycle
    assert meter.cycle.error is not None


def _stale_projection_error(current: torch.Tensor, before: torch.Tensor, rank: int) -> float:
    """ε of projecting ``current`` on ``before``'s top-``rank`` subspaces, by definition: the
    mean of the right (P-step) and the left (Q-step) projection's lost energy."""
    g, b = current.double(), before.double()
    u, _, vh = torch.linalg.svd(b, full_matrices=False)
    left, right = u[:, :rank], vh[:rank].T
    lost = 0.5 * (float(torch.sum((g - g @ right @ right.T) ** 2)) + float(torch.sum((g - left @ left.T @ g) ** 2)))
    return math.sqrt(lost / float(torch.sum(g * g)))


def test_acpsgds_estimate_projects_on_the_step_befores_subspaces():
    """ACP-SGD's step projects the gradient on the factor the step before produced; its
    estimate takes that factor at its best (the step before's top-r singular vectors)."""
    gen = torch.Generator().manual_seed(6)
    shared = torch.randn(40, 6, generator=gen)
    before = shared @ torch.randn(6, 30, generator=gen) + 0.3 * torch.randn(40, 30, generator=gen)
    now = shared @ torch.randn(6, 30, generator=gen) + 0.3 * torch.randn(40, 30, generator=gen)
    specs = [make_spec("acpsgd", rank=2), make_spec("acpsgd", rank=4), make_spec("powersgd", rank=2)]
    errors = estimate_errors([now], specs, previous=[before])
    assert errors["acpsgd-r2"] == pytest.approx(_stale_projection_error(now, before, 2), rel=1e-4)
    assert errors["acpsgd-r4"] == pytest.approx(_stale_projection_error(now, before, 4), rel=1e-4)
    assert errors["powersgd-r2"] == pytest.approx(_svd_error(now, 2), rel=1e-4)  # refits to this step: unaffected
    assert errors["acpsgd-r2"] > errors["powersgd-r2"]  # a stale subspace is never better than the best one
    # the step before's subspaces are this step's own: the best rank-r error (Eckart–Young, both sides)
    assert estimate_errors([now], specs, previous=[now])["acpsgd-r2"] == pytest.approx(_svd_error(now, 2), rel=1e-4)
    # no step before: the best case
    assert estimate_errors([now], specs, previous=[None])["acpsgd-r2"] == pytest.approx(_svd_error(now, 2), rel=1e-4)
    # subspaces orthogonal to this step's gradient capture nothing of it
    one = torch.zeros(8, 8)
    one[0, 0] = 1.0
    other = torch.zeros(8, 8)
    other[1, 1] = 1.0
    assert estimate_errors([one], [make_spec("acpsgd", rank=1)], previous=[other]) == {"acpsgd-r1": 1.0}
    with pytest.raises(ValueError, match="previous"):
        estimate_errors([now], specs, previous=[])


def test_acpsgds_estimate_is_what_its_kernel_loses_with_that_factor():
    """Against the kernel itself, one rank, no residual yet: an ACP-SGD P-step whose kept
    factor is the step before's top-r right singular vectors loses the right projection's
    energy, a Q-step with the left ones the left projection's; the estimate is their mean."""
    from compressors.acpsgd import P_STEP, Q_STEP
    from compressors.lowrank import Factors

    gen = torch.Generator().manual_seed(7)
    before, now = torch.randn(24, 16, generator=gen), torch.randn(24, 16, generator=gen)
    u, _, vh = torch.linalg.svd(before, full_matrices=False)
    lost = []
    for factors in (Factors(q=vh[:3].T.contiguous(), parity=P_STEP),
                    Factors(q=vh[:3].T.contiguous(), p=u[:, :3].contiguous(), parity=Q_STEP)):
        compressor = build("acpsgd", rank=3)
        compressor.factors.replace("w", factors)
        buffer = now.reshape(-1).clone()
        run_in_lockstep([compressor.process(buffer, [GradSlot(key="w", grad=buffer.view(24, 16))], 1)])
        compressor.end_step()
        lost.append(float(torch.sum((now.reshape(-1) - buffer) ** 2)))
    expected = math.sqrt(sum(lost) / 2 / float(torch.sum(now * now)))
    estimate = estimate_errors([now], [make_spec("acpsgd", rank=3)], previous=[before])["acpsgd-r3"]
    assert estimate == pytest.approx(expected, rel=1e-4)


def test_a_sample_is_two_consecutive_applied_steps_of_the_largest_matrices_within_the_budget():
    """The first step chooses the matrices (largest first within ``sample_elements``) and is
    kept as the step before; the second copies only those. An undone step in between is no
    step: the sample's step before stays the last applied one. A budget no matrix fits gives
    no sample (an empty one would estimate every candidate lossless)."""
    compressor = build("powersgd", rank=2)
    meter = ErrorMeter(sample_elements=48 * 64)  # fc.weight fits, conv.weight (576) not beside it
    meter.request_sample()
    _metered_step(meter, compressor, 1)  # the step before
    buffer, slots = _bucket(9)
    meter.bucket(slots, compressor)  # a step that is then undone (non-finite on some rank)
    meter.discard_step()
    assert meter.sample is None
    _metered_step(meter, compressor, 2)
    sample = meter.take_sample()
    raw = {step: {slot.key: slot.grad for slot in _bucket(step)[1]} for step in (1, 2)}
    assert len(sample.tensors) == 1 and torch.equal(sample.tensors[0], raw[2]["fc.weight"])
    assert torch.equal(sample.previous[0], raw[1]["fc.weight"])
    tiny = ErrorMeter(sample_elements=10)
    tiny.request_sample()
    for step in range(3):
        _metered_step(tiny, compressor, step)
    assert tiny.sample is None and not tiny.sampling and tiny.take_sample() == ([], [])


def test_acpsgds_estimate_counts_no_capture_in_directions_the_step_before_lacks():
    """A step before of rank 1 holds one direction: the rank-4 estimate captures what that
    direction holds of this step and nothing more (its other singular vectors are arbitrary)."""
    gen = torch.Generator().manual_seed(8)
    u, v = torch.randn(20, 1, generator=gen), torch.randn(16, 1, generator=gen)
    before = u @ v.T
    now = torch.randn(20, 16, generator=gen)
    errors = estimate_errors([now], [make_spec("acpsgd", rank=1), make_spec("acpsgd", rank=4)], previous=[before])
    assert errors["acpsgd-r4"] == pytest.approx(errors["acpsgd-r1"], rel=1e-5)
    assert errors["acpsgd-r1"] == pytest.approx(_stale_projection_error(now, before, 1), rel=1e-4)


def test_a_requested_sample_that_holds_no_matrix_does_not_block_the_next_estimate(one_process_group):
    """No sampled matrix fits the budget: the request lapses (and waits an interval) instead of
    waiting for a sample that never comes; with the budget back, the next estimate runs."""
    model, sync, cfg, signal = _mlp_signal(1e-6)
    signal.meter.sample_elements = 1

    def step() -> None:
        model.zero_grad()
        nn.functional.cross_entropy(model(torch.randn(16, 32)), torch.randint(0, 10, (16,))).backward()
        signal.after_step()

    step()  # the estimate is due: a sample requested
    assert signal.meter.sampling
    step()  # its first step chooses no matrix: the request lapses
    assert signal.estimates == {} and not signal.meter.sampling and signal.meter.sample is None
    signal.meter.sample_elements = 1_000_000
    for _ in range(4):
        step()
    assert set(signal.estimates) >= {"acpsgd-r8", "acpsgd-r1"}
