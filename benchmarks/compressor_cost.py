"""Encode+decode cost per step of every compressor, beside PyTorch's own PowerSGD hooks.

Only the gradient *shapes* of ResNet-50 (rank 4) and BERT-Base (rank 32) are needed: the
gradients are random, split into DDP-like 25 MB buckets in reverse parameter order, and
every method runs through its real DDP communication hook on a one-process gloo group
(whose collectives cost next to nothing), so what is timed is the hook's own work:
compression, orthogonalization, error feedback, decompression. Methods run round-robin,
one step each per round, so machine noise hits all of them alike.

:func:`powersgd_codecs` is the same measurement for ``benchmarks.paper``: our PowerSGD
in its 25 MB buckets beside PyTorch's hook in the ONE bucket it runs with there (on gloo),
on any model's shapes. The layout matters: one bucket makes the hook's error feedback clone
and subtract the whole gradient at once, 1.7-2.0× our codec instead of 1.0-1.2× in 25 MB
buckets (measured on this machine's four paper workloads).

``nonfinite_check_s`` is the part of our step spent on the non-finite check (each job's
``observe`` of what it received, and the step's ``settle``), timed around those calls, so it
can be set against encode+decode (target: ≤ 3 %). ``--dtypes fp32 bf16`` also runs every
method on bf16 gradients of the same shapes, in the same rounds (``acpsgd@bf16``): what
keeping state and doing the QR in fp32 costs a 16-bit model.

    python -m benchmarks.compressor_cost --json-out benchmarks/results/compressor_cost.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as torch_psgd

from benchmarks.outputs import write_whole
from compressors import GradientSync, build
from planning.costmodel import DDP_FIRST_BUCKET_BYTES, build_bucket_layout
from workers.models import parameter_shapes
from workers.probe import synchronize

WORKLOADS = {"resnet50": ("resnet50", 4), "bert-base": ("bert-base", 32)}
OUR_METHODS = ("none", "fp16", "bf16", "signsgd", "topk", "powersgd", "acpsgd")
TORCH_METHODS = ("torch_powersgd", "torch_batched_powersgd")
BUCKET_CAP_BYTES = 25 * 1024 * 1024
#: PyTorch's hook all-reduces uncompressed for its first steps (it needs >= 2 with error feedback).
TORCH_START_ITER = 2


class Bucket:
    """Stands in for ``dist.GradBucket`` (which has no Python constructor): the same methods."""

    def __init__(self, index: int, buffer: torch.Tensor, params: list[torch.nn.Parameter], last: bool) -> None:
        self._index, self._buffer, self._params, self._last = index, buffer, params, last
        self._grads, offset = [], 0
        for param in params:
            self._grads.append(buffer[offset : offset + param.numel()].view(param.shape))
            offset += param.numel()

    def index(self) -> int:
        return self._index

    def buffer(self) -> torch.Tensor:
        return self._buffer

    def gradients(self) -> list[torch.Tensor]:
        return self._grads

    def parameters(self) -> list[torch.nn.Parameter]:
        return self._params

    def is_last(self) -> bool:
        return self._last

    def set_buffer(self, tensor: torch.Tensor) -> None:
        self._buffer.copy_(tensor)


@dataclass
class Workload:
    name: str
    rank: int
    shapes: list[tuple[int, ...]]
    params: list[torch.nn.Parameter]
    buckets: list[Bucket]
    source: list[torch.Tensor]  # fresh random gradients, copied in before each step
    device: torch.device = torch.device("cpu")
    dtype: torch.dtype = torch.float32

    def refill(self) -> None:
        for bucket, grads in zip(self.buckets, self.source):
            bucket.buffer().copy_(grads)


def make_workload(name: str, shapes: Sequence[tuple[int, ...]], rank: int, *,
                  bucket_cap_bytes: float = BUCKET_CAP_BYTES, first_bucket_bytes: float | None = DDP_FIRST_BUCKET_BYTES,
                  seed: int = 0, device: torch.device = torch.device("cpu"), dtype: torch.dtype = torch.float32) -> Workload:
    """Random gradients of ``shapes`` in DDP-like buckets of ``bucket_cap_bytes`` (the first
    one ``first_bucket_bytes``: DDP's default 1 MiB; None when a job sets its cap, as benchmarks.paper),
    on ``device``, in ``dtype``. Buckets are laid out as for fp32 (same buckets whatever the dtype)."""
    shapes = [tuple(int(d) for d in shape) for shape in shapes]
    generator = torch.Generator().manual_seed(seed)
    params = [torch.nn.Parameter(torch.empty(shape, device=device, dtype=dtype)) for shape in shapes]
    layout = build_bucket_layout(shapes, bucket_cap_bytes, first_bucket_bytes)
    buckets, source = [], []
    for index, members in enumerate(layout):
        size = sum(math.prod(shapes[i]) for i in members)
        buckets.append(Bucket(index, torch.empty(size, device=device, dtype=dtype), [params[i] for i in members],
                              index == len(layout) - 1))
        source.append(torch.randn(size, generator=generator).to(device=device, dtype=dtype))
    return Workload(name, rank, shapes, params, buckets, source, device, dtype)


HookStep = Callable[[], None]


TOPK_RATIO = 0.01


def method_params(name: str, rank: int) -> dict[str, float]:
    """The parameters a compressor is benchmarked with: the workload's rank, Top-k's 1 %."""
    if name in ("powersgd", "acpsgd"):
        return {"rank": rank}
    return {"ratio": TOPK_RATIO} if name == "topk" else {}


def our_method(workload: Workload, name: str) -> tuple[HookStep, GradientSync, "CheckTimer"]:
    sync = GradientSync(build(name, **method_params(name, workload.rank)))
    sync.bind((f"param{index}", param) for index, param in enumerate(workload.params))
    return (lambda: run_step(workload, sync.hook)), sync, CheckTimer(sync.compressor)


class CheckTimer:
    """Times the non-finite check of one compressor: every ``observe`` and ``settle`` call.

    Wraps the two methods on the instance (the compressor's code is unchanged), so the
    seconds are exactly those calls' own."""

    def __init__(self, compressor) -> None:  # type: ignore[no-untyped-def]
        self.seconds = 0.0
        for method in ("observe", "settle"):
            setattr(compressor, method, self._timed(getattr(compressor, method)))

    def _timed(self, call: Callable) -> Callable:
        def timed(*args, **kwargs):  # type: ignore[no-untyped-def]
            started = time.perf_counter()
            try:
                return call(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - started

        return timed


def torch_powersgd_state(rank: int, seed: int = 0) -> torch_psgd.PowerSGDState:
    """PyTorch's hook as every benchmark runs it: error feedback and warm start (as ours),
    compressing from its 3rd step, and only matrices it shrinks at least 2×."""
    return torch_psgd.PowerSGDState(
        process_group=None, matrix_approximation_rank=rank, start_powerSGD_iter=TORCH_START_ITER,
        min_compression_rate=2, use_error_feedback=True, warm_start=True, random_seed=seed,
    )


def torch_method(workload: Workload, name: str) -> HookStep:
    state = torch_powersgd_state(workload.rank)
    if name == "torch_powersgd":
        return lambda: run_step(workload, lambda bucket: torch_psgd.powerSGD_hook(state, bucket))

    def batched_step() -> None:
        with _batched_hook_fix():
            run_step(workload, lambda bucket: torch_psgd.batched_powerSGD_hook(state, bucket))

    return batched_step


class _batched_hook_fix:
    """PyTorch 2.13's batched_powerSGD_hook passes its 2-D factor to ``_orthogonalize``, which
    asserts on anything but a 3-D batch, so the hook fails on every call. While it runs, let
    ``_orthogonalize`` take a 2-D matrix as a batch of one; the hook is otherwise unchanged."""

    def __enter__(self) -> None:
        self._original = original = torch_psgd._orthogonalize

        def orthogonalize(matrices: torch.Tensor, epsilon: float = 0) -> None:
            original(matrices.unsqueeze(0) if matrices.dim() == 2 else matrices, epsilon)

        torch_psgd._orthogonalize = orthogonalize

    def __exit__(self, *exc: object) -> None:
        torch_psgd._orthogonalize = self._original


def run_step(workload: Workload, hook: Callable[[Bucket], torch.futures.Future]) -> None:
    """One step's buckets, each to completion before the next.

    Sequential on purpose: PyTorch's powerSGD_hook blocks on a collective inside a gloo
    completion callback, which deadlocks gloo when several buckets are in flight.
    """
    for bucket in workload.buckets:
        hook(bucket).wait()


class ByteCounter:
    """Counts the bytes PyTorch's hooks pass into ``dist.all_reduce``."""

    def __init__(self) -> None:
        self.bytes = 0
        self._originals = {}

    def __enter__(self) -> "ByteCounter":
        original = self._originals["all_reduce"] = dist.all_reduce

        def counted(tensor: torch.Tensor, *args, **kwargs):
            self.bytes += tensor.numel() * tensor.element_size()
            return original(tensor, *args, **kwargs)

        dist.all_reduce = counted
        return self

    def __exit__(self, *exc: object) -> None:
        for name, original in self._originals.items():
            setattr(dist, name, original)


@dataclass
class Case:
    """One method on one bucket layout: how to run a step, and who counts its bytes."""

    workload: Workload
    step: HookStep
    sync: GradientSync | None = None  # ours count their own bytes; PyTorch's at dist.all_reduce
    checks: CheckTimer | None = None  # ours: seconds in the non-finite check


def make_case(workload: Workload, method: str) -> Case:
    if method in OUR_METHODS:
        step, sync, checks = our_method(workload, method)
        return Case(workload, step, sync, checks)
    return Case(workload, torch_method(workload, method))


def measure(cases: Mapping[str, Case], warmup: int, steps: int, label: str = "codecs") -> dict[str, dict[str, float]]:
    """Seconds of one step of every case (median and min) and its mean bytes, run round-robin."""
    times: dict[str, list[float]] = {name: [] for name in cases}
    check_times: dict[str, list[float]] = {name: [] for name in cases}
    byte_counts: dict[str, list[int]] = {name: [] for name in cases}
    for round_index in range(warmup + steps):
        for name, case in cases.items():
            case.workload.refill()
            sent_before = case.sync.stats().bytes_sent if case.sync is not None else 0
            checked_before = case.checks.seconds if case.checks is not None else 0.0
            with ByteCounter() as counter:
                synchronize(case.workload.device)  # GPU: time the kernels, not their launches
                started = time.perf_counter()
                case.step()
                synchronize(case.workload.device)
                elapsed = time.perf_counter() - started
            sent = case.sync.stats().bytes_sent - sent_before if case.sync is not None else counter.bytes
            if round_index >= warmup:
                times[name].append(elapsed)
                byte_counts[name].append(sent)
                if case.checks is not None:
                    check_times[name].append(case.checks.seconds - checked_before)
        print(f"  {label}: round {round_index + 1}/{warmup + steps}", file=sys.stderr, flush=True)
    results = {}
    for name in cases:
        results[name] = {
            "encode_decode_s": statistics.median(times[name]),
            "encode_decode_min_s": min(times[name]),
            "bytes_per_step": statistics.fmean(byte_counts[name]),
        }
        if check_times[name]:
            results[name]["nonfinite_check_s"] = statistics.median(check_times[name])
    return results


#: PyTorch's hook in one bucket: the layout ``benchmarks.paper`` runs it with on gloo.
ONE_BUCKET_BYTES = float("inf")


#: Default groups that :func:`single_process_group` ended, kept alive until the interpreter exits.
ENDED_GROUPS: list[Any] = []


@contextlib.contextmanager
def single_process_group(device: torch.device = torch.device("cpu")) -> Iterator[None]:
    """A one-process group (gloo on CPU, NCCL on a GPU): the hooks' collectives run, and cost
    next to nothing. An in-memory store: no port, no environment variables.

    The ended group's object is kept (:data:`ENDED_GROUPS`), not dropped. The hooks' future
    callbacks (ours and PyTorch's PowerSGD hook) hold the group in their closures, and gloo
    frees a completed callback on its own worker thread. When that frees the last reference,
    the group's destructor joins the very thread it runs on: ``std::system_error`` ("Resource
    deadlock avoided"), terminate, abort. CI saw this once: the pytest process died in the
    test after one that had used this group. A group kept here is destroyed at exit, on the
    main thread.
    """
    if device.type == "cuda":
        dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1, device_id=device)
    else:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        ENDED_GROUPS.append(dist.group.WORLD)
        dist.destroy_process_group()


def powersgd_codecs(shapes: Sequence[tuple[int, ...]], rank: int, *, bucket_cap_bytes: float = BUCKET_CAP_BYTES,
                    warmup: int = 3, steps: int = 6, label: str = "powersgd codecs") -> dict[str, dict[str, float]]:
    """Our PowerSGD in ``bucket_cap_bytes`` buckets beside PyTorch's hook in one bucket.

    Why: ``benchmarks.paper`` cannot time the hook's codec apart from its collectives
    (both run inside one future chain), so the simulator takes the hook's codec as our
    measured one × this ratio, measured in the layouts the runs use. Needs a process group.
    """
    cases = {
        "powersgd": make_case(make_workload("ours", shapes, rank, bucket_cap_bytes=bucket_cap_bytes,
                                            first_bucket_bytes=None), "powersgd"),
        "torch_powersgd": make_case(make_workload("torch", shapes, rank, bucket_cap_bytes=ONE_BUCKET_BYTES,
                                                  first_bucket_bytes=None), "torch_powersgd"),
    }
    return measure(cases, warmup, steps, label)


DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "fp64": torch.float64}


def measure_workloads(names: Sequence[str], methods: Sequence[str], warmup: int, steps: int,
                      device: torch.device = torch.device("cpu"),
                      dtypes: Sequence[str] = ("fp32",)) -> dict[str, dict[str, dict[str, float]]]:
    """Every method on each workload of :data:`WORKLOADS`, on ``device`` (needs a process group).

    Other ``dtypes`` than fp32 add our methods on gradients of that dtype to the same rounds,
    named ``method@dtype``."""
    results = {}
    for workload_name in names:
        model, rank = WORKLOADS[workload_name]
        workload = make_workload(workload_name, parameter_shapes(model), rank, device=device)
        cases = {name: make_case(workload, name) for name in methods}
        for dtype_name in dtypes:
            if dtype_name == "fp32":
                continue
            other = make_workload(workload_name, parameter_shapes(model), rank, device=device, dtype=DTYPES[dtype_name])
            cases.update({f"{name}@{dtype_name}": make_case(other, name) for name in methods if name in OUR_METHODS})
        results[workload_name] = measure(cases, warmup, steps, workload_name)
        del workload, cases
    return results


def print_table(results: dict[str, dict[str, dict[str, float]]]) -> None:
    from rich.console import Console
    from rich.table import Table

    for workload, rows in results.items():
        fp32 = rows["none"]["bytes_per_step"]
        reference = rows["torch_powersgd"]["encode_decode_s"]
        table = Table(title=f"{workload}: encode+decode per step (median)")
        for column in ("method", "encode+decode ms", "÷ torch powerSGD_hook", "MB/step", "fewer bytes than fp32",
                       "non-finite check"):
            table.add_column(column, justify="right")
        for name, row in rows.items():
            check = row.get("nonfinite_check_s")
            table.add_row(
                name,
                f"{row['encode_decode_s'] * 1e3:.1f}",
                f"{row['encode_decode_s'] / reference:.2f}×",
                f"{row['bytes_per_step'] / 1e6:.3f}",
                f"{fp32 / row['bytes_per_step']:.1f}×",
                "" if check is None else f"{check * 1e3:.2f} ms ({check / row['encode_decode_s']:.1%})",
            )
        Console().print(table)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.compressor_cost", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json-out", type=Path, help="write results as JSON here")
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    parser.add_argument("--methods", nargs="+", default=list(OUR_METHODS + TORCH_METHODS))
    parser.add_argument("--warmup", type=int, default=3, help="untimed rounds (torch's hook starts compressing at its 3rd)")
    parser.add_argument("--steps", type=int, default=10, help="timed rounds")
    parser.add_argument("--device", default="cpu", help="cpu, or cuda / cuda:N (NCCL group, kernels timed to completion)")
    parser.add_argument("--dtypes", nargs="+", default=["fp32"], choices=list(DTYPES),
                        help="gradient dtypes for our methods (fp32 always; others add method@dtype rows)")
    args = parser.parse_args(argv)
    if args.steps % 2:
        parser.error("--steps must be even: ACP-SGD alternates P and Q steps, so bytes average over pairs")
    if args.warmup < 3:
        parser.error("--warmup must be >= 3: PyTorch's hook all-reduces uncompressed for its first 2 steps")
    for required in ("none", "torch_powersgd"):
        if required not in args.methods:
            args.methods.insert(0, required)
    device = torch.device(args.device)
    with single_process_group(device):
        results = measure_workloads(args.workloads, args.methods, args.warmup, args.steps, device,
                                    dtypes=["fp32", *[d for d in args.dtypes if d != "fp32"]])
    print_table(results)
    if args.json_out:
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        write_whole(args.json_out, json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
