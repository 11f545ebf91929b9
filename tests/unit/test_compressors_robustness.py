"""Robustness pieces of the compression library, in one process (issue 15).

Dtypes and non-finite steps through ``run_in_lockstep`` (simulated ranks, collectives done by
hand), the byte formula per element size, the "nothing compressed" reason, the handshake's
fingerprint and gate, and the checkpoint rules (rank/world checks, full state, folding).
The same behaviours on real 2-rank gloo groups are in tests/distributed/test_real_training.py.
"""

from __future__ import annotations

import math
import threading

import pytest
import torch

from compressors import GradientSync, build, handshake
from compressors import checkpoint as sync_checkpoint
from compressors.base import GradSlot, run_in_lockstep
from planning.spec import make_spec
from planning.wire import why_nothing_compressed, wire_bytes

SHAPES = {"conv.weight": (8, 4, 3, 3), "conv.bias": (8,), "fc.weight": (24, 32), "fc.bias": (24,), "gate.weight": (3, 4)}
CONFIGS = {
    "none": {}, "fp16": {}, "bf16": {}, "signsgd": {}, "topk": {"ratio": 0.2},
    "powersgd": {"rank": 2}, "acpsgd": {"rank": 2},
}
DTYPES = (torch.float64, torch.float32, torch.bfloat16, torch.float16)


def grads_for(rank: int, step: int, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(1000 * rank + step)
    return {key: torch.randn(shape, generator=gen).to(dtype) for key, shape in SHAPES.items()}


class Recorded:
    """Wraps a bucket job and counts the bytes of every collective it yields."""

    def __init__(self, job) -> None:
        self.job, self.bytes = job, 0

    def send(self, value):
        request = self.job.send(value)
        self.bytes += request.tensor.numel() * request.tensor.element_size()
        return request


def step(compressors, grads_per_rank) -> tuple[list[dict[str, torch.Tensor]], list[int]]:
    """One step on len(compressors) simulated ranks, all parameters in one bucket."""
    world = len(compressors)
    buffers, jobs = [], []
    for compressor, grads in zip(compressors, grads_per_rank):
        buffer = torch.cat([g.reshape(-1) for g in grads.values()])
        slots, offset = [], 0
        for key, g in grads.items():
            slots.append(GradSlot(key=key, grad=buffer[offset : offset + g.numel()].view(g.shape), offset=offset))
            offset += g.numel()
        buffers.append((buffer, slots))
        jobs.append(Recorded(compressor.process(buffer, slots, world)))
    run_in_lockstep(jobs)  # type: ignore[arg-type]
    for compressor in compressors:
        compressor.end_step()
    applied = [{s.key: s.grad.clone() for s in slots} for _, slots in buffers]
    return applied, [job.bytes for job in jobs]


def snapshot(compressor) -> dict[str, torch.Tensor]:
    state = compressor.state_dict()
    out = {f"m/{k}": v for k, v in state.get("memory", {}).items()}
    for key, f in state.get("factors", {}).items():
        out[f"q/{key}"] = f["q"]
        out[f"parity/{key}"] = torch.tensor(f["parity"])
        if f["p"] is not None:
            out[f"p/{key}"] = f["p"]
    return out


# -- dtypes ----------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", list(CONFIGS))
def test_every_compressor_returns_the_parameters_dtype_and_sends_the_formulas_bytes(name, dtype):
    compressors = [build(name, **CONFIGS[name]) for _ in range(2)]
    total = [0, 0]
    for t in range(4):  # an even number: ACP-SGD's P- and Q-steps average to the formula
        applied, sent = step(compressors, [grads_for(rank, t, dtype) for rank in range(2)])
        total = [a + b for a, b in zip(total, sent)]
        for key in SHAPES:
            assert applied[0][key].dtype == dtype
            assert torch.isfinite(applied[0][key]).all()
            assert torch.equal(applied[0][key], applied[1][key])
    expected = compressors[0].wire_bytes(list(SHAPES.values()), 2, dtype)
    assert [b / 4 for b in total] == [expected, expected]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", list(CONFIGS))
def test_a_world_of_one_works_for_every_dtype(name, dtype):
    """One rank: the all-gather hands back the payload itself (no copy), odd byte offsets included."""
    grads = grads_for(0, 0, dtype)
    grads["odd"] = torch.randn(12).to(dtype)  # top-k keeps 219 values in all: an odd count of 16-bit ones
    compressor = build(name, **CONFIGS[name])
    for _ in range(2):
        applied, _ = step([compressor], [grads])
        assert all(g.dtype == dtype and torch.isfinite(g).all() for g in applied[0].values())


@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float16), ids=str)
@pytest.mark.parametrize("name", ["signsgd", "topk", "powersgd", "acpsgd"])
def test_16_bit_models_keep_residuals_and_factors_in_fp32(name, dtype):
    compressors = [build(name, **CONFIGS[name]) for _ in range(2)]
    for t in range(2):
        step(compressors, [grads_for(rank, t, dtype) for rank in range(2)])
    state = snapshot(compressors[0])
    assert state and all(v.dtype == torch.float32 for k, v in state.items() if not k.startswith("parity/"))


def test_fp64_models_compute_in_fp64():
    """PowerSGD recovers a rank-2 mean to fp64 precision every step (fp32 stops near 1e-6)."""
    gen = torch.Generator().manual_seed(3)
    u, v = torch.randn(24, 2, generator=gen, dtype=torch.float64), torch.randn(32, 2, generator=gen, dtype=torch.float64)
    compressors = [build("powersgd", rank=2) for _ in range(2)]
    for t in range(4):
        grads = []
        for rank in range(2):
            g = grads_for(rank, t, torch.float64)
            g["fc.weight"] = u @ torch.randn(2, 2, generator=gen, dtype=torch.float64) @ v.t()
            grads.append(g)
        mean = (grads[0]["fc.weight"] + grads[1]["fc.weight"]) / 2
        applied, _ = step(compressors, grads)
        assert float((applied[0]["fc.weight"] - mean).abs().max()) < 1e-11 * float(mean.abs().max())
        assert compressors[0].memory.get("fc.weight").dtype == torch.float64


def test_byte_formula_counts_the_element_size():
    shapes = [(24, 32), (24,)]
    for name, params in CONFIGS.items():
        spec = make_spec(name, **params)
        sizes = [wire_bytes(spec, shapes, 2, element_bytes=e) for e in (2, 4, 8)]
        if name in ("fp16", "bf16"):
            assert sizes[0] == sizes[1] == sizes[2]
        else:
            assert sizes[0] < sizes[1] < sizes[2], name
    assert wire_bytes(make_spec("none"), shapes, 2, element_bytes=8) == 8 * (24 * 32 + 24)
    with pytest.raises(ValueError, match="element_bytes"):
        wire_bytes(make_spec("none"), shapes, 2, element_bytes=3)


# -- non-finite steps ----------------------------------------------------------------------------


@pytest.mark.parametrize("poison", ["inf-matrix", "nan-vector"])
@pytest.mark.parametrize("name", ["signsgd", "topk", "powersgd", "acpsgd"])
def test_a_nonfinite_step_is_nonfinite_on_every_rank_and_undone_exactly(name, poison):
    compressors = [build(name, **CONFIGS[name]) for _ in range(2)]
    reference = [build(name, **CONFIGS[name]) for _ in range(2)]
    for t in range(3):
        step(compressors, [grads_for(rank, t, torch.float32) for rank in range(2)])
        step(reference, [grads_for(rank, t, torch.float32) for rank in range(2)])
    before = snapshot(compressors[1])
    bad = [grads_for(rank, 3, torch.float32) for rank in range(2)]
    key = "fc.weight" if poison == "inf-matrix" else "fc.bias"
    bad[1][key].view(-1)[3] = float("inf") if poison == "inf-matrix" else float("nan")
    applied, _ = step(compressors, bad)
    for rank in range(2):
        assert not all(torch.isfinite(g).all() for g in applied[rank].values())
    assert [c.settle() for c in compressors] == [False, False]
    after = snapshot(compressors[1])
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    for t in range(4, 7):  # exact continuation of the run that never had step 3
        got, _ = step(compressors, [grads_for(rank, t, torch.float32) for rank in range(2)])
        expected, _ = step(reference, [grads_for(rank, t, torch.float32) for rank in range(2)])
        for k in SHAPES:
            assert torch.equal(got[0][k], expected[0][k]), (t, k)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_the_finiteness_verdict_is_exact_when_a_sum_of_finite_values_overflows(dtype):
    compressor = build("topk", ratio=0.5)
    big = torch.finfo(dtype).max
    compressor.observe(torch.tensor([big, big, -1.0], dtype=dtype))  # the sum overflows, all finite
    compressor.observe(torch.ones(4, dtype=dtype))
    assert compressor.settle() is True
    for poison in (float("inf"), float("-inf"), float("nan")):
        compressor.observe(torch.tensor([big, big], dtype=dtype))
        compressor.observe(torch.tensor([1.0, poison, 2.0], dtype=dtype))
        assert compressor.settle() is False
    assert compressor.settle() is True  # nothing observed since: a finite (empty) step


# -- nothing to compress -----------------------------------------------------------------------


def test_why_nothing_compressed_names_sizes_and_rank():
    small = [(3, 4), (3,), (2, 3), (2,)]
    reason = why_nothing_compressed(make_spec("acpsgd", rank=2), small)
    assert reason and "acpsgd-r2" in reason and "4 gradients" in reason and "(3, 4)" in reason and "rank-2" in reason
    assert "1-D" in why_nothing_compressed(make_spec("powersgd", rank=1), [(10,), (4,)])
    assert "min_compress_numel=100" in why_nothing_compressed(make_spec("topk", min_compress_numel=100), small)
    assert why_nothing_compressed(make_spec("acpsgd", rank=2), small + [(64, 64)]) is None
    assert why_nothing_compressed(make_spec("none"), small) is None


# -- misuse: constructor, handshake ----------------------------------------------------------------


def test_gradient_sync_refuses_a_non_compressor_naming_build():
    with pytest.raises(TypeError, match=r"build\('acpsgd'\)"):
        GradientSync("acpsgd")  # type: ignore[arg-type]
    sync = GradientSync(build("none"))
    with pytest.raises(TypeError, match="switch"):
        sync.switch(make_spec("topk"))  # type: ignore[arg-type]


def test_fingerprints_differ_by_spec_and_switch_count_and_the_mismatch_names_every_rank():
    a = handshake.fingerprint(make_spec("acpsgd", rank=2), 0)
    assert a.numel() == handshake.FINGERPRINT_BYTES and a.dtype == torch.uint8
    assert torch.equal(a, handshake.fingerprint(make_spec("acpsgd", rank=2), 0))
    assert handshake.mismatch(torch.stack([a, a])) is None
    for other in (handshake.fingerprint(make_spec("acpsgd", rank=2, seed=1), 0),  # same payload size
                  handshake.fingerprint(make_spec("acpsgd", rank=2), 1),
                  handshake.fingerprint(make_spec("topk"), 0)):
        message = handshake.mismatch(torch.stack([a, other]))
        assert message and "rank 0: acpsgd-r2 after 0 switches" in message and "rank 1:" in message


def test_step_gate_releases_in_submission_order_across_threads_and_passes_its_error():
    gate = handshake.StepGate()
    order: list[int] = []
    gate.submit(lambda error: order.append(0))
    gate.submit(lambda error: order.append(1))
    opener = threading.Thread(target=gate.open, args=(None,))
    opener.start()
    opener.join()
    gate.submit(lambda error: order.append(2))
    assert order == [0, 1, 2]
    failing, seen = handshake.StepGate(), []
    failing.submit(seen.append)
    failing.open(RuntimeError("mismatch"))
    failing.submit(seen.append)
    assert [str(e) for e in seen] == ["mismatch", "mismatch"]


# -- checkpoints ----------------------------------------------------------------------------------


def rank_state(rank: int, world: int, memory: torch.Tensor) -> dict:
    return {"spec": {"name": "topk", "ratio": 0.2}, "compressor": {"steps_done": 3, "memory": {"w": memory}},
            "carry": {}, "stats": {}, "rank": rank, "world_size": world}


def test_another_ranks_state_is_refused_naming_both_ranks():
    with pytest.raises(ValueError, match=r"saved by rank 0 .* loaded on rank 1"):
        sync_checkpoint.state_for_rank(rank_state(0, 2, torch.ones(3)), 1, 2)
    with pytest.raises(ValueError, match="world of 2 ranks .* world of 3"):
        sync_checkpoint.state_for_rank(rank_state(1, 2, torch.ones(3)), 1, 3)
    assert sync_checkpoint.state_for_rank(rank_state(1, 2, torch.ones(3)), 1, 2)["rank"] == 1


def test_a_full_state_gives_each_rank_its_part_or_the_fold():
    full = sync_checkpoint.full_state([rank_state(0, 2, torch.zeros(3)), rank_state(1, 2, torch.full((3,), 4.0))])
    for rank in range(2):
        assert sync_checkpoint.state_for_rank(full, rank, 2)["rank"] == rank
    for rank in range(3):
        folded = sync_checkpoint.state_for_rank(full, rank, 3)
        assert folded["rank"] is None and folded["folded_from"] == 2
        torch.testing.assert_close(folded["compressor"]["memory"]["w"], torch.full((3,), 2.0))
        assert sync_checkpoint.state_for_rank(folded, rank, 3) == folded  # a folded state fits any rank


def test_folding_states_of_different_compressors_is_refused():
    other = rank_state(1, 2, torch.ones(3))
    other["spec"] = {"name": "signsgd"}
    with pytest.raises(ValueError, match="spec: .*different compressors"):
        sync_checkpoint.fold_sync_states([rank_state(0, 2, torch.ones(3)), other])


def test_a_single_process_state_records_rank_0_of_1_and_loads_back():
    sync = GradientSync(build("topk", ratio=0.5))
    state = sync.state_dict()
    assert (state["rank"], state["world_size"], state["spec"]["name"]) == (0, 1, "topk")
    full = sync.full_state_dict()
    assert full is not None and math.isclose(full["world_size"], 1)
    GradientSync(build("none")).load_state_dict(full)
