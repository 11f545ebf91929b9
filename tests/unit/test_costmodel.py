"""The step-time cost model: α-β collectives, bucket pipelining, codec placement, candidates."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from planning.costmodel import (
    DEFAULT_CPU_CODEC,
    CodecCost,
    ElementCost,
    Link,
    StepProfile,
    all_gather_s,
    all_reduce_s,
    alpha_beta_from_bandwidth,
    build_bucket_layout,
    candidate_ranks,
    candidates,
    codec_work,
    expected_max_normal,
    predict_step,
)
from planning.spec import COMPRESSOR_NAMES, make_spec
from planning.wire import is_compressed, wire_bytes

REPO = Path(__file__).resolve().parents[2]
FREE = ElementCost(per_element_s=0.0)  # a codec that costs nothing: isolates communication

# A small MLP-like model: a smaller first layer, then four 1024×1024 layers.
SHAPES = [(256, 512), (256,)] + [(1024, 1024), (1024,)] * 4 + [(10, 1024), (10,)]


def profile(**kw) -> StepProfile:
    args = dict(forward_s=0.03, backward_s=0.06, optimizer_s=0.005, bucket_cap_bytes=4 * 2**20)
    args.update(kw)
    return StepProfile.build(SHAPES, **args)


def all_specs():
    yield from candidates(COMPRESSOR_NAMES, 1, 64, (0.001, 0.01, 0.5))
    yield make_spec("topk", ratio=0.01, min_compress_numel=2000)
    yield make_spec("signsgd", min_compress_numel=2000)
    yield make_spec("powersgd", rank=3, min_compress_numel=10_000)


# --- collectives ------------------------------------------------------------------------------


def test_alpha_beta_from_bandwidth():
    link = alpha_beta_from_bandwidth(1.25e9, 2e-5)
    assert link == Link(alpha=2e-5, beta=1 / 1.25e9)
    alpha, beta, burst, wake = link
    assert (alpha, beta, burst, wake) == (2e-5, 8e-10, 0.0, 0.0)  # no burst or wake-up unless measured
    with pytest.raises(ValueError, match="^bytes_per_second"):
        alpha_beta_from_bandwidth(0, 1e-5)
    with pytest.raises(ValueError, match="^latency_s"):
        alpha_beta_from_bandwidth(1e9, -1)


def test_collective_formulas_match_hand_computed_numbers():
    link = Link(alpha=1e-5, beta=1e-9)
    # 2(N−1)α + 2(N−1)/N·b·β = 6e-5 + 1.5e-3
    assert all_reduce_s(1e6, 4, link) == pytest.approx(1.56e-3)
    # (N−1)α + (N−1)·b·β = 3e-5 + 3e-3
    assert all_gather_s(1e6, 4, link) == pytest.approx(3.03e-3)
    assert all_reduce_s(8e6, 16, link) == pytest.approx(30 * 1e-5 + 30 / 16 * 8e-3)
    assert all_reduce_s(1e9, 1, link) == 0.0
    assert all_gather_s(1e9, 1, link) == 0.0


def test_one_worker_has_no_communication():
    link = alpha_beta_from_bandwidth(1e6, 1e-3)  # a terrible link, irrelevant for N=1
    prof = profile()
    for spec in all_specs():
        p = predict_step(spec, prof, 1, link)
        assert p.comm_s == 0.0 and p.exposed_comm_s == pytest.approx(0.0, abs=1e-12)


def test_single_bucket_matches_the_closed_form():
    """One bucket, no codec: t_fwd + max(t_bwd, c_last) + t_opt with c_last = t_bwd + T."""
    shapes = [(256, 256), (256,)]
    prof = StepProfile.build(shapes, forward_s=0.01, backward_s=0.02, optimizer_s=0.003, buckets=[[1, 0]])
    link = Link(alpha=1e-4, beta=1e-8)
    nbytes = 4 * (256 * 256 + 256)
    p = predict_step(make_spec("none"), prof, 8, link)
    assert p.step_s == pytest.approx(0.01 + 0.02 + all_reduce_s(nbytes, 8, link) + 0.003)
    assert p.comm_s == pytest.approx(all_reduce_s(nbytes, 8, link))


def test_two_buckets_follow_the_link_recurrence():
    """c_k = max(τ_k, c_{k−1}) + T_k with backward spread by parameter count."""
    shapes = [(100, 100), (100, 100)]
    prof = StepProfile.build(shapes, forward_s=0.0, backward_s=0.2, buckets=[[1], [0]])
    link = Link(alpha=0.0, beta=1e-6)
    t = all_reduce_s(40_000, 2, link)  # 0.04 s per bucket
    # fast link: bucket 1 done at 0.1 + 0.04 < 0.2, bucket 0 at 0.2 + 0.04
    assert predict_step(make_spec("none"), prof, 2, link).step_s == pytest.approx(0.2 + t)
    slow = Link(alpha=0.0, beta=5e-6)  # 0.2 s per bucket: c_1 = 0.3, c_0 = max(0.2, 0.3) + 0.2
    assert predict_step(make_spec("none"), prof, 2, slow).step_s == pytest.approx(0.5)


def test_a_shapers_burst_is_spent_on_the_steps_first_bytes():
    """Bucket 1 (fires first) sends 40 kB: a 30 kB burst makes 30 kB of it free; the burst
    is then spent, so bucket 0 pays in full."""
    shapes = [(100, 100), (100, 100)]
    prof = StepProfile.build(shapes, forward_s=0.0, backward_s=0.2, buckets=[[1], [0]])
    plain = Link(alpha=0.0, beta=5e-6)  # 0.2 s per bucket: step 0.5 s (see above)
    shaped = Link(alpha=0.0, beta=5e-6, burst_bytes=30_000)
    p = predict_step(make_spec("none"), prof, 2, shaped)
    # c_1 = 0.1 + 10 kB·β = 0.15, c_0 = max(0.2, 0.15) + 0.2 = 0.4
    assert p.step_s == pytest.approx(0.4)
    assert p.comm_s == pytest.approx(predict_step(make_spec("none"), prof, 2, plain).comm_s - 30_000 * 5e-6)
    everything_free = Link(alpha=0.0, beta=5e-6, burst_bytes=1e9)
    assert predict_step(make_spec("none"), prof, 2, everything_free).step_s == pytest.approx(0.2)


# --- host terms: straggler wait, waking the link, CPU per collective ----------------------------


def test_expected_max_normal():
    assert expected_max_normal(1) == 0.0
    assert expected_max_normal(2) == pytest.approx(1 / 3.14159265 ** 0.5, rel=0.05)  # exact: 1/√π
    values = [expected_max_normal(n) for n in (2, 8, 32, 64)]
    assert values == sorted(values)
    assert values[2] == pytest.approx(2.07, abs=0.05)  # tabulated E[max of 32 normals]: 2.07
    with pytest.raises(ValueError, match="^count"):
        expected_max_normal(0)


def test_a_collective_on_an_idle_link_pays_the_wake_up_and_a_queued_one_does_not():
    shapes = [(100, 100), (100, 100)]
    prof = StepProfile.build(shapes, forward_s=0.0, backward_s=0.2, buckets=[[1], [0]])
    # Fast link: both buckets find it idle (bucket 1 done at 0.14 < 0.2): two wake-ups,
    # only the last one is exposed.
    fast = Link(alpha=0.0, beta=1e-6)
    t = all_reduce_s(40_000, 2, fast)
    assert predict_step(make_spec("none"), prof, 2, fast._replace(wake_s=0.003)).step_s == pytest.approx(0.2 + t + 0.003)
    # Slow link: bucket 0 queues behind bucket 1, so only bucket 1 wakes the link.
    slow = Link(alpha=0.0, beta=5e-6, wake_s=0.003)
    assert predict_step(make_spec("none"), prof, 2, slow).step_s == pytest.approx(0.5 + 0.003)
    # One worker has no link to wake.
    assert predict_step(make_spec("none"), prof, 1, slow).step_s == pytest.approx(0.2)


def test_the_slowest_rank_delays_the_last_collective_by_e_n_sigma():
    shapes = [(256, 256), (256,)]
    link = Link(alpha=0.0, beta=1e-8)
    t = all_reduce_s(4 * (256 * 256 + 256), 8, link)
    prof = StepProfile.build(shapes, forward_s=0.01, backward_s=0.02, buckets=[[1, 0]], compute_jitter_s=0.002)
    # One bucket, ready when all compute is done (f = 1): it waits e_N·σ on the link.
    assert predict_step(make_spec("none"), prof, 8, link).step_s == pytest.approx(0.03 + t + expected_max_normal(8) * 0.002)
    assert predict_step(make_spec("none"), prof, 2, link).step_s < predict_step(make_spec("none"), prof, 8, link).step_s
    assert predict_step(make_spec("none"), prof, 1, link).step_s == pytest.approx(0.03)
    # Earlier buckets wait less (√f), and a busy link absorbs the wait.
    two = StepProfile.build([(100, 100), (100, 100)], forward_s=0.1, backward_s=0.2, buckets=[[1], [0]], compute_jitter_s=0.01)
    assert two.straggler_waits(2) == pytest.approx(tuple(expected_max_normal(2) * 0.01 * f ** 0.5 for f in (2 / 3, 1.0)))
    slow = Link(alpha=0.0, beta=5e-6)  # bucket 0 queues behind bucket 1 for 0.1 s > its wait
    bare = StepProfile.build([(100, 100), (100, 100)], forward_s=0.1, backward_s=0.2, buckets=[[1], [0]])
    waited = predict_step(make_spec("none"), two, 2, slow).step_s - predict_step(make_spec("none"), bare, 2, slow).step_s
    assert waited == pytest.approx(two.straggler_waits(2)[0])  # only bucket 1's wait shows


def test_host_cpu_per_collective_runs_on_the_compute_stream():
    """Fusion off (one bucket per tensor) pays the host CPU once per collective; PowerSGD's
    compressed matrices pay it twice (two rounds)."""
    fused = profile(codec_costs={}, default_codec=FREE, collective_cpu_s=0.001)
    unfused = StepProfile.build(SHAPES, forward_s=0.03, backward_s=0.06, optimizer_s=0.005, default_codec=FREE,
                                buckets=[[i] for i in reversed(range(len(SHAPES)))], collective_cpu_s=0.001)
    free_cpu = StepProfile.build(SHAPES, forward_s=0.03, backward_s=0.06, optimizer_s=0.005, default_codec=FREE,
                                 buckets=[[i] for i in reversed(range(len(SHAPES)))])
    fast = Link(alpha=0.0, beta=1e-12)
    none = make_spec("none")
    # On a link that costs (almost) nothing, the step is compute plus the CPU of every collective.
    assert predict_step(none, unfused, 2, fast).step_s == pytest.approx(0.095 + 0.001 * len(SHAPES), abs=1e-5)
    assert predict_step(none, fused, 2, fast).step_s == pytest.approx(0.095 + 0.001 * len(fused.buckets), abs=1e-5)
    assert predict_step(none, free_cpu, 2, fast).step_s == pytest.approx(0.095, abs=1e-5)
    matrices = sum(1 for s in SHAPES if is_compressed(make_spec("powersgd", rank=4), s))
    powersgd = predict_step(make_spec("powersgd", rank=4), unfused, 2, fast).step_s
    assert powersgd == pytest.approx(0.095 + 0.001 * (len(SHAPES) + matrices), abs=1e-5)
    assert predict_step(none, unfused, 1, fast).step_s == pytest.approx(0.095)  # nothing to send


def test_bytes_per_step_equals_wire_bytes():
    prof = profile()
    link = alpha_beta_from_bandwidth(1.25e9, 1e-5)
    for spec in all_specs():
        for world_size in (1, 4, 64):
            p = predict_step(spec, prof, world_size, link)
            assert p.bytes_per_step == pytest.approx(wire_bytes(spec, SHAPES, world_size), rel=1e-12), spec.label


def test_breakdown_adds_up():
    prof = profile()
    for bandwidth in (6.25e6, 1.25e9, 1.25e10):
        link = alpha_beta_from_bandwidth(bandwidth, 1e-4)
        for spec in all_specs():
            p = predict_step(spec, prof, 8, link)
            assert p.compute_s == pytest.approx(0.03 + 0.06 + 0.005)
            assert p.step_s == pytest.approx(p.compute_s + p.codec_s + p.exposed_comm_s)
            assert p.exposed_comm_s <= p.comm_s + 1e-12


# --- pipelining -------------------------------------------------------------------------------


def test_pipelined_buckets_hide_communication_and_a_slow_link_exposes_it():
    prof = profile()
    assert len(prof.buckets) >= 4 and prof.buckets[-1] == (1, 0)  # the small first layer fires last
    fast = predict_step(make_spec("none"), prof, 4, alpha_beta_from_bandwidth(1.25e10, 1e-6))
    assert fast.comm_s > 0
    assert fast.exposed_comm_s < 0.1 * fast.comm_s  # only the last, small bucket's all-reduce
    assert fast.exposed_comm_s < 1e-3 * fast.step_s
    slow = predict_step(make_spec("none"), prof, 4, alpha_beta_from_bandwidth(1.25e7, 1e-6))
    assert slow.exposed_comm_s > 0.5 * slow.comm_s > 0


def test_decode_competes_with_backward_on_the_compute_stream():
    """With no link time every codec second lands on the compute stream: nothing hides it."""
    prof = profile(codec_costs={"fp16": CodecCost(0.05)})
    p = predict_step(make_spec("fp16"), prof, 1, Link(0.0, 0.0))
    assert p.codec_s == pytest.approx(0.05)
    assert p.step_s == pytest.approx(0.03 + 0.06 + 0.05 + 0.005)


def test_powersgd_two_rounds_are_slower_than_acpsgd_on_a_slow_link():
    prof = profile(default_codec=FREE)
    slow = alpha_beta_from_bandwidth(6.25e6, 1e-4)  # 50 Mb/s
    for rank in (1, 4, 16):
        power = predict_step(make_spec("powersgd", rank=rank), prof, 8, slow)
        acp = predict_step(make_spec("acpsgd", rank=rank), prof, 8, slow)
        assert power.step_s > acp.step_s
        assert power.exposed_comm_s > acp.exposed_comm_s
    # Latency-bound link: PowerSGD sends two messages per bucket, ACP-SGD one.
    latency_only = Link(alpha=1e-3, beta=0.0)
    power = predict_step(make_spec("powersgd", rank=4), prof, 8, latency_only)
    acp = predict_step(make_spec("acpsgd", rank=4), prof, 8, latency_only)
    compressed_buckets = sum(any(is_compressed(make_spec("powersgd", rank=4), SHAPES[i]) for i in b) for b in prof.buckets)
    assert compressed_buckets == len(prof.buckets) == 5
    assert power.comm_s - acp.comm_s == pytest.approx(compressed_buckets * 2 * 7 * 1e-3)


def test_second_powersgd_round_waits_for_the_compute_between_rounds():
    shapes = [(512, 512)]
    link = Link(alpha=0.0, beta=1e-7)
    spec = make_spec("powersgd", rank=4)
    base = StepProfile.build(shapes, forward_s=0.0, backward_s=0.01, default_codec=FREE)
    costly = StepProfile.build(shapes, forward_s=0.0, backward_s=0.01, codec_costs={spec.label: CodecCost(1.0)})
    round_s = all_reduce_s(4 * 4 * 512, 2, link)
    assert predict_step(spec, base, 2, link).step_s == pytest.approx(0.01 + 2 * round_s)
    p = predict_step(spec, costly, 2, link)
    assert p.step_s == pytest.approx(0.01 + 2 * round_s + 1.0)  # encode, between, decode in series


# --- codec costs ------------------------------------------------------------------------------


def test_codec_costs_calibrated_and_default():
    prof = profile()
    spec = make_spec("acpsgd", rank=4)
    link = alpha_beta_from_bandwidth(1.25e9, 1e-5)
    default = predict_step(spec, prof, 4, link)
    assert not default.codec_calibrated and not DEFAULT_CPU_CODEC.calibrated
    assert default.codec_s > 0
    total = predict_step(spec, profile(codec_costs={"acpsgd-r4": CodecCost(0.012)}), 4, link)
    assert total.codec_calibrated and total.codec_s == pytest.approx(0.012)
    per_element = ElementCost(per_element_s=2e-10)
    work = codec_work(spec, SHAPES, 4)
    assert predict_step(spec, prof, 4, link, codec=per_element).codec_s == pytest.approx(2e-10 * work)
    assert predict_step(make_spec("none"), prof, 4, link).codec_s == 0.0
    assert codec_work(make_spec("acpsgd", rank=16), SHAPES, 4) > work  # higher rank, more work


# --- layout and profile -----------------------------------------------------------------------


def test_ddp_like_bucket_layout():
    shapes = [(1000,)] * 10  # 4000 bytes each
    layout = build_bucket_layout(shapes, bucket_cap_bytes=10_000, first_bucket_bytes=5_000)
    assert layout == ((9, 8), (7, 6, 5), (4, 3, 2), (1, 0))
    assert build_bucket_layout(shapes, 10_000, None)[0] == (9, 8, 7)
    big = build_bucket_layout([(10,), (3000, 3000), (10,)], bucket_cap_bytes=1000, first_bucket_bytes=None)
    assert big == ((2, 1), (0,))  # a bucket closes once it reaches the cap
    flat = sorted(i for bucket in build_bucket_layout(SHAPES) for i in bucket)
    assert flat == list(range(len(SHAPES)))


def test_profile_validates_and_completes_buckets():
    with pytest.raises(ValueError, match="^buckets: parameter index 1 appears twice"):
        StepProfile.build([(2, 2), (2,)], 0.0, 0.0, buckets=[[1], [1, 0]])
    with pytest.raises(ValueError, match="^buckets: parameter index 5 out of range"):
        StepProfile.build([(2, 2), (2,)], 0.0, 0.0, buckets=[[5]])
    with pytest.raises(ValueError, match="^bucket_backward_s"):
        StepProfile.build([(2, 2), (2,)], 0.0, 0.0, buckets=[[1, 0]], bucket_backward_s=[0.1, 0.2])
    prof = StepProfile.build([(2, 2), (2,), (3,)], 0.0, 0.3, buckets=[[2]])
    assert prof.buckets == ((2,), (1, 0))
    assert prof.backward_segments() == pytest.approx((0.3 * 3 / 9, 0.3 * 6 / 9))
    # worked out once per profile: a profile replaced with other times works them out afresh
    slower = dataclasses.replace(prof, backward_s=0.6, forward_s=0.3, compute_jitter_s=0.01)
    assert slower.backward_segments() == pytest.approx((0.6 * 3 / 9, 0.6 * 6 / 9))
    assert slower.straggler_waits(2) == pytest.approx(
        tuple(expected_max_normal(2) * 0.01 * f ** 0.5 for f in (0.5 / 0.9, 1.0)))
    assert prof.backward_segments() == pytest.approx((0.3 * 3 / 9, 0.3 * 6 / 9))


# --- candidates and speed ---------------------------------------------------------------------


def test_candidates():
    assert candidate_ranks(1, 64) == (64, 32, 16, 8, 4, 2, 1)
    assert candidate_ranks(3, 20) == (20, 16, 8, 4, 3)
    labels = [c.label for c in candidates(COMPRESSOR_NAMES, 2, 8, (0.001, 0.01))]
    assert labels == [
        "none", "fp16", "bf16", "acpsgd-r8", "acpsgd-r4", "acpsgd-r2",
        "powersgd-r8", "powersgd-r4", "powersgd-r2", "topk-0.01", "topk-0.001", "signsgd",
    ]
    assert [c.label for c in candidates(["acpsgd", "none"], 4, 4)] == ["none", "acpsgd-r4"]
    with pytest.raises(ValueError, match="^min_rank"):
        candidates(["acpsgd"], 8, 4)


def test_costmodel_and_policy_do_not_import_torch():
    code = "import planning.costmodel, planning.policy, sys; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True)



@pytest.mark.parametrize("kind,world_size", [("all_reduce", 2), ("all_reduce", 8), ("all_gather", 4)])
def test_implied_beta_solves_the_ring_formula_for_beta(kind: str, world_size: int) -> None:
    from planning.link import Link, all_gather_s, all_reduce_s, implied_beta

    link = Link(alpha=2e-4, beta=8 / 50e6)
    timed = all_reduce_s if kind == "all_reduce" else all_gather_s
    seconds = timed(1e6, world_size, link)
    assert implied_beta(kind, world_size, link.alpha, 1e6, seconds) == pytest.approx(link.beta)
    within_latency = 0.999 * timed(0.0, world_size, link)
    assert implied_beta(kind, world_size, link.alpha, 1e6, within_latency) is None  # nothing left to see
    assert implied_beta(kind, 1, link.alpha, 1e6, seconds) is None  # one worker: no link
    assert implied_beta(kind, world_size, link.alpha, 0.0, seconds) is None
