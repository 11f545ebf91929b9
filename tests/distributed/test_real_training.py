"""What real training hands the compressors, on real 2-rank gloo groups (issue 15).

- fp64, bf16 and fp16 models: every compressor trains, hands back gradients in the
  parameters' dtype, identical on both ranks, within the dtype's precision of the fp32 run on
  the same (rounded) gradients, and sends the bytes the formula gives for that dtype.
- A step whose gradient is inf/NaN on ONE rank: non-finite gradients on BOTH ranks, the
  compressor state exactly as before that step, and every later step bit-identical to a run
  that never had it; with a real ``GradScaler`` both ranks skip the step and go on.
- Checkpoints: the state names its rank and world; another rank's state is refused with both
  ranks named; the DDP-tutorial pattern (rank 0 saves one file, every rank loads it) with
  ``full_state_dict()`` resumes bit-exactly, and folds when the world size changes.
- Misuse: a switch on one rank only raises a clear error on both ranks (no SIGABRT, no hang),
  also when the payload sizes would match; a model with nothing to compress warns once.
- DDP options (gradient_as_bucket_view, static_graph, find_unused_parameters, no_sync
  accumulation) and ``torch.compile`` (aot_eager) train with the hook as plain DDP does.
"""

from __future__ import annotations

import io
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
from harness import run_ranks
from test_sync import BUCKET_MB, CONFIGS, LOSSY, PROBE_SHAPES, GradProbe, cnn_batch, probe_grads, small_cnn
from torch.nn.parallel import DistributedDataParallel as DDP

from compressors import GradientSync, build
from compressors.quality import ErrorMeter
from compressors.sync import NothingCompressedWarning

DTYPES = {"fp64": torch.float64, "bf16": torch.bfloat16, "fp16": torch.float16}
#: Unit roundoff of each dtype (what one rounding can lose, relative).
EPS = {"fp64": 2.0**-53, "fp32": 2.0**-24, "bf16": 2.0**-8, "fp16": 2.0**-11}
STEPS = 4


def state_of(sync: GradientSync) -> dict[str, torch.Tensor]:
    """The compressor's residuals and factors (and P/Q parity), flattened by name, copied."""
    state = sync.compressor.state_dict()
    out = {f"memory/{k}": v.clone() for k, v in state.get("memory", {}).items()}
    for key, factors in state.get("factors", {}).items():
        out[f"q/{key}"] = factors["q"].clone()
        if factors["p"] is not None:
            out[f"p/{key}"] = factors["p"].clone()
        out[f"parity/{key}"] = torch.tensor(factors["parity"])
    return out


def grads_of(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


# -- rank functions ------------------------------------------------------------------------------


def _dtype_runs(rank: int, world: int) -> dict:
    """Every compressor on the probe in fp64/bf16/fp16, and in fp32 on the same rounded gradients."""
    out = {}
    for dtype_name, dtype in DTYPES.items():
        for label, (name, params) in CONFIGS.items():
            runs = {}
            for run_dtype in (dtype, torch.float32):
                model = GradProbe(PROBE_SHAPES).to(run_dtype)
                ddp = DDP(model, bucket_cap_mb=BUCKET_MB)
                sync = GradientSync(build(name, **params)).install(ddp)
                applied = []
                for step in range(STEPS):
                    model.zero_grad(set_to_none=True)
                    targets = [t.to(dtype).to(run_dtype) for t in probe_grads("varying", world, step)[rank].values()]
                    ddp(*targets).backward()
                    applied.append(grads_of(model))
                shapes = [p.shape for p in model.parameters()]
                runs[run_dtype] = {"applied": applied, "bytes_per_step": sync.stats().bytes_sent / STEPS,
                                   "wire_bytes": sync.compressor.wire_bytes(shapes, world, run_dtype)}
            out[(dtype_name, label)] = {"run": runs[dtype], "fp32": runs[torch.float32]}
    return out


def _poisoned_grads(rank: int, world: int, step: int, bad_rank: int, bad_step: int, where: str, value: float):
    grads = probe_grads("varying", world, step)[rank]
    if rank == bad_rank and step == bad_step:
        grads[where] = grads[where].clone()
        grads[where].view(-1)[5] = value
    return list(grads.values())


#: (parameter, value, rank): inf in a compressed matrix on rank 1; NaN in a bias sent as is on rank 0.
POISONS = {"inf-matrix": ("fc1_weight", float("inf"), 1), "nan-bias": ("fc1_bias", float("nan"), 0)}
BAD_STEP, NONFINITE_STEPS = 3, 6


def _nonfinite_runs(rank: int, world: int) -> dict:
    """Each compressor with one poisoned step, against a run that skips that step entirely."""
    out = {}
    for label, (name, params) in CONFIGS.items():
        for poison, (where, value, bad_rank) in POISONS.items():
            runs = {}
            for variant in ("poisoned", "skipped"):
                model = GradProbe(PROBE_SHAPES)
                ddp = DDP(model, bucket_cap_mb=BUCKET_MB)
                sync = GradientSync(build(name, **params)).install(ddp)
                applied, states = [], []
                for step in range(NONFINITE_STEPS):
                    if variant == "skipped" and step == BAD_STEP:
                        continue
                    model.zero_grad(set_to_none=True)
                    ddp(*_poisoned_grads(rank, world, step, bad_rank, BAD_STEP, where, value)).backward()
                    applied.append(grads_of(model))
                    states.append(state_of(sync))
                runs[variant] = {"applied": applied, "states": states, "finite": sync.compressor.last_step_finite}
            out[(label, poison)] = runs
    return out


def _metered_runs(rank: int, world: int) -> dict:
    """As :func:`_nonfinite_runs` (inf in a matrix on rank 1), with the quality signal's
    ErrorMeter on, as every adaptive job runs it, for fp32 and bf16 models: the meter reads
    residuals while the step is in flight and must neither settle it early nor fail on 16-bit
    gradients beside fp32 residuals."""
    where, value, bad_rank = POISONS["inf-matrix"]
    out = {}
    for label in LOSSY:
        name, params = CONFIGS[label]
        for dtype_name, dtype in {"fp32": torch.float32, "bf16": torch.bfloat16}.items():
            runs = {}
            for variant in ("poisoned", "skipped"):
                model = GradProbe(PROBE_SHAPES).to(dtype)
                ddp = DDP(model, bucket_cap_mb=BUCKET_MB)
                sync = GradientSync(build(name, **params)).install(ddp)
                sync.error_meter = ErrorMeter()
                applied, states, errors = [], [], []
                for step in range(NONFINITE_STEPS):
                    if variant == "skipped" and step == BAD_STEP:
                        continue
                    model.zero_grad(set_to_none=True)
                    grads = _poisoned_grads(rank, world, step, bad_rank, BAD_STEP, where, value)
                    ddp(*[g.to(dtype) for g in grads]).backward()
                    applied.append(grads_of(model))
                    states.append(state_of(sync))
                    errors.append(sync.error_meter.last)
                runs[variant] = {"applied": applied, "states": states, "errors": errors}
            out[(label, dtype_name)] = runs
    return out


def _grad_scaler_run(rank: int, world: int, label: str) -> dict:
    """A real GradScaler: rank 1's batch at step 2 overflows the scaled gradients; both ranks skip."""
    name, params = CONFIGS[label]
    model = small_cnn(seed=0)
    ddp = DDP(model, bucket_cap_mb=BUCKET_MB)
    GradientSync(build(name, **params)).install(ddp)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu")  # init_scale 2**16, as fp16 AMP starts
    weights, scales, losses = [], [], []
    for step in range(6):
        x, y = cnn_batch(rank, step)
        if rank == 1 and step == 2:
            x = x * 1e36  # its scaled loss (and so its gradients) overflow fp32
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(ddp(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        weights.append({n: p.detach().clone() for n, p in model.named_parameters()})
        scales.append(scaler.get_scale())
        losses.append(float(loss))
    return {"weights": weights, "scales": scales, "losses": losses}


def _grad_scaler_runs(rank: int, world: int) -> dict:
    return {label: _grad_scaler_run(rank, world, label) for label in LOSSY}


def _fresh_cnn(label: str, seed: int = 0):
    name, params = CONFIGS[label]
    model = small_cnn(seed)
    ddp = DDP(model, bucket_cap_mb=BUCKET_MB)
    sync = GradientSync(build(name, **params)).install(ddp)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    return model, ddp, sync, opt


def _train_cnn(rank: int, model, ddp, opt, steps) -> list[dict[str, torch.Tensor]]:
    grads = []
    for step in steps:
        x, y = cnn_batch(rank, step)
        opt.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(ddp(x), y).backward()
        grads.append(grads_of(model))
        opt.step()
    return grads


CHECKPOINTED = ("acpsgd", "powersgd", "topk", "signsgd")
SAVED_AT, TOTAL = 5, 8


def _checkpoint_runs(rank: int, world: int, directory: str) -> dict:
    """The DDP tutorial's pattern: rank 0 saves one file, every rank loads it."""
    out = {}
    for label in CHECKPOINTED:
        model, ddp, sync, opt = _fresh_cnn(label)
        reference = _train_cnn(rank, model, ddp, opt, range(TOTAL))

        model, ddp, sync, opt = _fresh_cnn(label)
        _train_cnn(rank, model, ddp, opt, range(SAVED_AT))
        own = sync.state_dict()
        path = Path(directory) / f"{label}.pt"
        full = sync.full_state_dict()  # collective
        if rank == 0:
            torch.save({"model": ddp.state_dict(), "opt": opt.state_dict(), "sync": full}, path)
        else:
            assert full is None
        dist.barrier()
        checkpoint = torch.load(path, map_location="cpu", weights_only=False)

        model, ddp, sync, opt = _fresh_cnn(label, seed=123)
        ddp.load_state_dict(checkpoint["model"])
        opt.load_state_dict(checkpoint["opt"])
        sync.load_state_dict(checkpoint["sync"])
        resumed = _train_cnn(rank, model, ddp, opt, range(SAVED_AT, TOTAL))

        # Rank 0's own state on every rank: refused on rank 1, naming both ranks.
        buffer = io.BytesIO()
        torch.save(own, buffer)
        shared = [buffer.getvalue()] if rank == 0 else [None]
        dist.broadcast_object_list(shared, src=0)
        rank0_state = torch.load(io.BytesIO(shared[0]), weights_only=False)
        try:
            GradientSync(build("none")).load_state_dict(rank0_state)
            refusal = None
        except ValueError as exc:
            refusal = str(exc)
        out[label] = {"reference": reference[SAVED_AT:], "resumed": resumed, "own": own, "refusal": refusal,
                      "full_ranks": None if full is None else [part["rank"] for part in full["ranks"]]}
    return out


def _load_in_one_rank(rank: int, world: int, directory: str) -> dict:
    """A full state saved by 2 ranks, loaded in a world of 1: the folded mean of the residuals."""
    out = {}
    for label in CHECKPOINTED:
        full = torch.load(Path(directory) / f"{label}.pt", weights_only=False)["sync"]
        sync = GradientSync(build("none"))
        sync.load_state_dict(full)
        try:
            GradientSync(build("none")).load_state_dict(full["ranks"][0])
            refusal = None
        except ValueError as exc:
            refusal = str(exc)
        out[label] = {"memory": sync.compressor.state_dict().get("memory", {}), "label": sync.compressor.label,
                      "refusal": refusal}
    return out


def _one_sided_switch(rank: int, world: int, case: str) -> dict:
    """Switch on one rank only; report what backward raised on each rank."""
    first, second = {
        "different-size": (build("acpsgd", rank=2), build("topk", ratio=0.2)),
        "same-size": (build("acpsgd", rank=2), build("acpsgd", rank=2, seed=7)),
        "same-compressor": (build("acpsgd", rank=2), build("acpsgd", rank=2)),
    }[case]
    model = small_cnn(seed=0)
    ddp = DDP(model, bucket_cap_mb=BUCKET_MB)
    sync = GradientSync(first).install(ddp)
    for step in range(5):
        if step == 3 and rank == 1:
            sync.switch(second)
        x, y = cnn_batch(rank, step)
        try:
            nn.functional.cross_entropy(ddp(x), y).backward()
        except Exception as exc:  # noqa: BLE001 - the behaviour under test
            return {"step": step, "message": str(exc), "typed": repr(sync.error)}
    return {"step": None}


def _one_sided_switches(rank: int, world: int) -> dict:
    return {case: _one_sided_switch(rank, world, case) for case in ("different-size", "same-size", "same-compressor")}


class SmallLayers(nn.Module):
    """Only biases and matrices too small to factorise at rank 2: nothing for low rank to compress."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(4, 3), nn.Linear(3, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x))


def _nothing_compressed(rank: int, world: int) -> dict:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = SmallLayers()
        ddp = DDP(model)
        sync = GradientSync(build("acpsgd", rank=2)).install(ddp)
        for _ in range(2):
            ddp(torch.randn(5, 4)).sum().backward()
        sync.switch(build("acpsgd", rank=2))  # the same compressor again: no second warning
        ddp(torch.randn(5, 4)).sum().backward()
        sync.switch(build("topk", ratio=0.5))  # compresses: no warning
        ddp(torch.randn(5, 4)).sum().backward()
    return {"warnings": [str(w.message) for w in caught if issubclass(w.category, NothingCompressedWarning)]}


class WithUnusedBranch(nn.Sequential):
    """The small CNN (same parameter names, so the same seeded factors) plus a head that forward
    never uses (find_unused_parameters)."""

    def __init__(self, seed: int) -> None:
        super().__init__(*small_cnn(seed))
        self.unused = nn.Linear(10, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for name, module in self._modules.items():
            if name != "unused":
                x = module(x)
        return x


OPTIONS = ("default", "gradient_as_bucket_view", "static_graph", "find_unused_parameters", "no_sync", "compile")
OPTION_STEPS = 4


def _train_with_option(rank: int, label: str, option: str) -> dict:
    name, params = CONFIGS[label]
    model = WithUnusedBranch(seed=0) if option == "find_unused_parameters" else small_cnn(seed=0)
    kwargs = {option: True} if option in ("gradient_as_bucket_view", "static_graph", "find_unused_parameters") else {}
    # torch.compile's DDPOptimizer needs buckets no smaller than DDP's 1 MiB first bucket.
    ddp = DDP(model, bucket_cap_mb=1 if option == "compile" else BUCKET_MB, **kwargs)
    GradientSync(build(name, **params)).install(ddp)
    run = torch.compile(ddp, backend="aot_eager") if option == "compile" else ddp
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    grads = []
    for step in range(OPTION_STEPS):
        opt.zero_grad(set_to_none=True)
        x, y = cnn_batch(rank, step)
        if option == "no_sync":  # two micro-batches: the first accumulates locally, the second syncs
            half = x.shape[0] // 2
            with ddp.no_sync():
                (nn.functional.cross_entropy(run(x[:half]), y[:half]) / 2).backward()
            (nn.functional.cross_entropy(run(x[half:]), y[half:]) / 2).backward()
        else:
            nn.functional.cross_entropy(run(x), y).backward()
        grads.append({n: g for n, g in grads_of(model).items() if not n.startswith("unused.")})
        opt.step()
    unused = None
    if option == "find_unused_parameters":
        unused = [None if p.grad is None else p.grad.clone() for p in model.unused.parameters()]
    weights = {n: p.detach().clone() for n, p in model.named_parameters() if not n.startswith("unused.")}
    return {"grads": grads, "weights": weights, "unused": unused}


OPTION_LABELS = ("none", "signsgd", "topk", "powersgd", "acpsgd")


def _ddp_options(rank: int, world: int) -> dict:
    return {(label, option): _train_with_option(rank, label, option) for label in OPTION_LABELS for option in OPTIONS}


# -- fixtures ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def dtype_runs():
    return run_ranks(_dtype_runs, 2)


@pytest.fixture(scope="module")
def nonfinite_runs():
    return run_ranks(_nonfinite_runs, 2)


@pytest.fixture(scope="module")
def metered_runs():
    return run_ranks(_metered_runs, 2)


@pytest.fixture(scope="module")
def grad_scaler_runs():
    return run_ranks(_grad_scaler_runs, 2)


@pytest.fixture(scope="module")
def checkpoint_runs(tmp_path_factory):
    directory = tmp_path_factory.mktemp("sync-checkpoints")
    two = run_ranks(_checkpoint_runs, 2, str(directory))
    one = run_ranks(_load_in_one_rank, 1, str(directory))
    return two, one[0]


@pytest.fixture(scope="module")
def one_sided_switches():
    return run_ranks(_one_sided_switches, 2, timeout=150)


@pytest.fixture(scope="module")
def option_runs():
    return run_ranks(_ddp_options, 2, timeout=400)


# -- dtypes --------------------------------------------------------------------------------------


@pytest.mark.parametrize("label", list(CONFIGS))
@pytest.mark.parametrize("dtype_name", list(DTYPES))
def test_every_compressor_trains_a_model_of_any_float_dtype(dtype_runs, dtype_name, label):
    dtype = DTYPES[dtype_name]
    per_rank = [r[(dtype_name, label)] for r in dtype_runs]
    for step in range(STEPS):
        for name in PROBE_SHAPES:
            grads = [r["run"]["applied"][step][name] for r in per_rank]
            assert grads[0].dtype == dtype, (step, name)
            assert torch.isfinite(grads[0]).all(), (step, name)
            assert torch.equal(grads[0], grads[1]), (step, name)  # identical on both ranks


@pytest.mark.parametrize("label", list(CONFIGS))
@pytest.mark.parametrize("dtype_name", list(DTYPES))
def test_low_precision_results_are_the_fp32_results_within_the_dtypes_precision(dtype_runs, dtype_name, label):
    """Same (rounded) gradients in fp32 and in the dtype: the applied gradients differ by what the
    dtype's rounding of the payload and of the result can explain, and no more."""
    run = dtype_runs[0][(dtype_name, label)]
    wire = {"fp16": "fp16", "bf16": "bf16"}.get(label, dtype_name)  # a 16-bit cast rounds like its type
    coarsest = max(EPS[dtype_name], EPS[wire], EPS["fp32"])
    # Sign and top-k selection are discontinuous: once the residuals differ by a rounding, a sign
    # or a choice may flip, so only their first step (same inputs, empty state) compares.
    steps = 1 if label in ("signsgd", "topk") else STEPS
    for step in range(steps):
        for name in PROBE_SHAPES:
            got = run["run"]["applied"][step][name].double()
            fp32 = run["fp32"]["applied"][step][name].double()
            scale = float(fp32.abs().max()) + 1e-12
            # Low rank feeds every step's rounding into the next (factors, residuals): allow a few
            # roundings per step; an error of the kind reported (wrong dtype, lost residual) is O(1).
            assert float((got - fp32).abs().max()) <= 16 * (step + 1) * coarsest * scale, (step, name)


@pytest.mark.parametrize("label", list(CONFIGS))
@pytest.mark.parametrize("dtype_name", list(DTYPES))
def test_bytes_sent_equal_the_formula_for_the_dtype_sent(dtype_runs, dtype_name, label):
    for r in dtype_runs:
        run, fp32 = r[(dtype_name, label)]["run"], r[(dtype_name, label)]["fp32"]
        assert run["bytes_per_step"] == run["wire_bytes"]
        assert fp32["bytes_per_step"] == fp32["wire_bytes"]
        if label not in ("fp16", "bf16"):  # they send 16 bits whatever the model's dtype
            assert run["bytes_per_step"] != fp32["bytes_per_step"]


# -- non-finite steps ------------------------------------------------------------------------------


@pytest.mark.parametrize("poison", list(POISONS))
@pytest.mark.parametrize("label", list(CONFIGS))
def test_a_nonfinite_step_on_one_rank_is_nonfinite_on_every_rank(nonfinite_runs, label, poison):
    for r in nonfinite_runs:
        bad = r[(label, poison)]["poisoned"]["applied"][BAD_STEP]
        assert not all(torch.isfinite(g).all() for g in bad.values())
        for step, applied in enumerate(r[(label, poison)]["poisoned"]["applied"]):
            if step != BAD_STEP:
                assert all(torch.isfinite(g).all() for g in applied.values()), step


@pytest.mark.parametrize("poison", list(POISONS))
@pytest.mark.parametrize("label", list(CONFIGS))
def test_a_nonfinite_step_leaves_the_state_as_before_and_later_steps_continue_exactly(nonfinite_runs, label, poison):
    for r in nonfinite_runs:
        poisoned, skipped = r[(label, poison)]["poisoned"], r[(label, poison)]["skipped"]
        before, after = poisoned["states"][BAD_STEP - 1], poisoned["states"][BAD_STEP]
        assert before.keys() == after.keys()
        for key in before:
            assert torch.equal(before[key], after[key]), key
        # Steps after the bad one: bit-identical to the run that never had it.
        assert len(poisoned["applied"]) == len(skipped["applied"]) + 1
        for got, expected in zip(poisoned["applied"][BAD_STEP + 1 :], skipped["applied"][BAD_STEP:]):
            for name in expected:
                assert torch.equal(got[name], expected[name]), name
        for got, expected in zip(poisoned["states"][BAD_STEP + 1 :], skipped["states"][BAD_STEP:]):
            for key in expected:
                assert torch.equal(got[key], expected[key]), key


@pytest.mark.parametrize("dtype_name", ["fp32", "bf16"])
@pytest.mark.parametrize("label", LOSSY)
def test_the_error_meter_leaves_a_nonfinite_step_undone_and_measures_the_finite_ones(metered_runs, label, dtype_name):
    for r in metered_runs:
        poisoned, skipped = r[(label, dtype_name)]["poisoned"], r[(label, dtype_name)]["skipped"]
        before, after = poisoned["states"][BAD_STEP - 1], poisoned["states"][BAD_STEP]
        for key in before:
            assert torch.equal(before[key], after[key]), key
        for got, expected in zip(poisoned["applied"][BAD_STEP + 1 :], skipped["applied"][BAD_STEP:]):
            for name in expected:
                assert torch.equal(got[name], expected[name]), name
        assert poisoned["errors"][BAD_STEP] is None  # an undone step measured nothing
        measured = poisoned["errors"][:BAD_STEP] + poisoned["errors"][BAD_STEP + 1 :]
        assert all(e is not None and 0.0 < e <= 1.0 for e in measured), measured
        assert poisoned["errors"][BAD_STEP + 1 :] == skipped["errors"][BAD_STEP:]


@pytest.mark.parametrize("label", LOSSY)
def test_grad_scaler_skips_the_overflowing_step_on_every_rank_and_training_goes_on(grad_scaler_runs, label):
    rank0, rank1 = (r[label] for r in grad_scaler_runs)
    assert rank0["scales"] == rank1["scales"]
    assert rank0["scales"][2] == rank0["scales"][1] / 2  # step 2 overflowed: the scale was halved...
    for name, weight in rank0["weights"][2].items():  # ...and the optimizer step skipped on both ranks
        assert torch.equal(weight, rank0["weights"][1][name]) and torch.equal(rank1["weights"][2][name], weight)
    for step in range(6):
        for name, weight in rank0["weights"][step].items():
            assert torch.equal(weight, rank1["weights"][step][name]), (step, name)
            assert torch.isfinite(weight).all()
    for step in (3, 4, 5):  # later steps train (the weights move)
        assert any(not torch.equal(w, rank0["weights"][step - 1][n]) for n, w in rank0["weights"][step].items())


# -- checkpoints ----------------------------------------------------------------------------------


@pytest.mark.parametrize("label", CHECKPOINTED)
def test_the_state_records_rank_world_size_and_compressor(checkpoint_runs, label):
    two, _ = checkpoint_runs
    for rank, r in enumerate(two):
        own = r[label]["own"]
        assert (own["rank"], own["world_size"]) == (rank, 2)
        assert own["spec"]["name"] == CONFIGS[label][0]
    assert two[0][label]["full_ranks"] == [0, 1]


@pytest.mark.parametrize("label", CHECKPOINTED)
def test_loading_another_ranks_state_raises_naming_both_ranks(checkpoint_runs, label):
    two, one = checkpoint_runs
    assert two[0][label]["refusal"] is None  # rank 0's own state loads on rank 0
    message = two[1][label]["refusal"]
    assert message and "rank 0" in message and "rank 1" in message and "full_state_dict" in message
    assert "world" in one[label]["refusal"] and "2" in one[label]["refusal"]  # a rank's state in another world


@pytest.mark.parametrize("label", CHECKPOINTED)
def test_one_file_saved_by_rank_0_resumes_every_rank_bit_exactly(checkpoint_runs, label):
    two, _ = checkpoint_runs
    for r in two:
        assert len(r[label]["resumed"]) == len(r[label]["reference"]) == TOTAL - SAVED_AT
        for got, expected in zip(r[label]["resumed"], r[label]["reference"]):
            for name in expected:
                assert torch.equal(got[name], expected[name]), name


@pytest.mark.parametrize("label", CHECKPOINTED)
def test_a_full_state_loaded_in_another_world_size_is_the_folded_mean(checkpoint_runs, label):
    two, one = checkpoint_runs
    assert one[label]["label"] == build(CONFIGS[label][0], **CONFIGS[label][1]).label
    residuals = [r[label]["own"]["compressor"]["memory"] for r in two]
    assert residuals[0] and one[label]["memory"].keys() == residuals[0].keys()
    for key, value in one[label]["memory"].items():
        assert not torch.equal(residuals[0][key], residuals[1][key])
        torch.testing.assert_close(value, (residuals[0][key] + residuals[1][key]) / 2)


# -- misuse ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", ["different-size", "same-size", "same-compressor"])
def test_a_switch_on_one_rank_only_raises_a_clear_error_on_every_rank(one_sided_switches, case):
    for r in one_sided_switches:
        assert r[case]["step"] == 3
        assert "ranks disagree on the compressor" in r[case]["message"]
        assert "rank 0: acpsgd-r2 after 0 switches" in r[case]["message"]
        assert "GradientSyncError" in r[case]["typed"]


def test_a_compressor_that_compresses_nothing_warns_once_naming_why():
    (rank0, rank1) = run_ranks(_nothing_compressed, 2)
    for r in (rank0, rank1):
        assert len(r["warnings"]) == 1, r["warnings"]
        message = r["warnings"][0]
        assert "acpsgd-r2 compresses none of the 4 gradients" in message
        assert "(4, 3)" in message or "(3, 4)" in message or "(2, 3)" in message


# -- DDP options and torch.compile --------------------------------------------------------------------


@pytest.mark.parametrize("option", OPTIONS)
@pytest.mark.parametrize("label", OPTION_LABELS)
def test_ddp_options_and_torch_compile_train_with_the_hook(option_runs, label, option):
    rank0, rank1 = (r[(label, option)] for r in option_runs)
    default = option_runs[0][(label, "default")]
    for step, grads in enumerate(rank0["grads"]):
        assert grads.keys() == default["grads"][step].keys()
        for name, grad in grads.items():
            assert torch.equal(grad, rank1["grads"][step][name]), (step, name)  # identical on both ranks
            # Same training as with DDP's defaults (bucket layouts and summation order may differ).
            torch.testing.assert_close(grad, default["grads"][step][name], rtol=1e-4, atol=1e-5)
    for name, weight in rank0["weights"].items():
        torch.testing.assert_close(weight, default["weights"][name], rtol=1e-4, atol=1e-5)
    if option == "find_unused_parameters":
        for grad in rank0["unused"]:
            assert grad is None or torch.count_nonzero(grad) == 0
