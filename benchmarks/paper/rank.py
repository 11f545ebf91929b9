"""One rank of a cell, run inside its namespace (``python -m benchmarks.paper _rank``), and the isolated
codec measurement (``_codecs``): DDP with our compressors or PyTorch's PowerSGD hook, timed per phase.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Sequence

from benchmarks.paper.cells import CODEC_BUCKET_CAP_MB, COMPRESSOR_OF, TOPK_RATIO, WORKLOADS, Cell

# =========================================================================== the rank runner


class _TorchPowerSGD:
    """PyTorch's ``powerSGD_hook`` with the bookkeeping ``StepTimer`` needs.

    Records when the last bucket was handed over (so exposed communication is measured as
    for GradientSync), the hook's synchronous part (encode + launch of round 1) as
    ``compress``, and the whole span from hook call to result as ``communicate``. Bytes are
    counted at ``dist.all_reduce``, which the hook calls by module attribute.
    """

    def __init__(self, ddp: Any, rank: int, seed: int) -> None:
        import torch.distributed as dist

        from benchmarks.compressor_cost import torch_powersgd_state
        from compressors.sync import StepRecord

        self._record_type = StepRecord
        self.state = torch_powersgd_state(rank, seed)
        self.bytes_sent = 0
        self._current: Any = None
        self._last: Any = None
        original = dist.all_reduce

        def counted(tensor: Any, *args: Any, **kwargs: Any) -> Any:
            self.bytes_sent += tensor.numel() * tensor.element_size()
            return original(tensor, *args, **kwargs)

        dist.all_reduce = counted  # this benchmark process only
        ddp.register_comm_hook(self, _torch_hook)

    def last_step(self) -> Any:
        return self._last

    def on_bucket(self, bucket: Any) -> Any:
        from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import powerSGD_hook

        started = time.perf_counter()
        if self._current is None:
            self._current = self._record_type(compressor="torch_powersgd", first_bucket_at=started)
        record = self._current
        record.buckets += 1
        last = bucket.is_last()
        if last:
            record.last_bucket_at = started
            self._current = None
        future = powerSGD_hook(self.state, bucket)
        record.compress_s += time.perf_counter() - started

        def done(fut: Any) -> Any:
            record.communicate_s += time.perf_counter() - started
            if last:
                record.done_at = time.perf_counter()
                self._last = record
            return fut.value()

        return future.then(done)


def _torch_hook(state, bucket):  # type: ignore[no-untyped-def]
    """DDP hook ``(state, bucket) -> Future``; unannotated because DDP inspects annotations."""
    return state.on_bucket(bucket)


class _ReadyClock:
    """When each parameter's gradient is accumulated, in seconds after backward began.

    The per-layer backward profile the simulator sums into buckets (why: backward time is
    not proportional to parameter count -- a CNN's early layers are cheap in parameters and
    expensive in compute, and they form the bucket that fires last).
    """

    def __init__(self, params: Sequence[Any]) -> None:
        self.start = 0.0
        self.now = [0.0] * len(params)
        self.total = [0.0] * len(params)
        self.count = 0
        for index, param in enumerate(params):
            param.register_post_accumulate_grad_hook(lambda _p, i=index: self._mark(i))

    def _mark(self, index: int) -> None:
        self.now[index] = time.perf_counter() - self.start

    def begin(self) -> None:
        self.start = time.perf_counter()

    def end(self, keep: bool) -> None:
        if keep:
            self.total = [t + n for t, n in zip(self.total, self.now)]
            self.count += 1

    def means(self) -> list[float]:
        return [t / self.count for t in self.total] if self.count else []


def rank_main(cell: Cell, rank: int, world: int, init: str, out: Path | None) -> None:
    """Run one rank of ``cell``: model, DDP, the method's hook, ``protocol.steps`` timed steps."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel

    from compressors import GradientSync
    from compressors.base import from_spec
    from planning.spec import make_spec
    from workers.data import build_dataset
    from workers.loaders import InfiniteLoader
    from workers.models import build_model
    from workers.probe import probe_link
    from workers.timing import StepTimer

    torch.set_num_threads(1)  # 2 cores, 2 ranks: one each (4 ranks share them)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world, timeout=timedelta(minutes=15))
    try:
        workload = WORKLOADS[cell.workload]
        low_rank = cell.rank or workload.rank
        torch.manual_seed(cell.seed)  # identical weights on every rank: no initial broadcast needed
        model = build_model(workload.model, **workload.build_kwargs())
        check = torch.tensor([sum(float(p.detach().sum(dtype=torch.float64)) for p in model.parameters())], dtype=torch.float64)
        low, high = check.clone(), check.clone()
        dist.all_reduce(low, op=dist.ReduceOp.MIN)
        dist.all_reduce(high, op=dist.ReduceOp.MAX)
        if float(low) != float(high):
            raise RuntimeError("ranks built different initial weights")
        # init_sync=False: DDP would otherwise broadcast 440 MB of BERT weights over a 100 Mbit/s link.
        # broadcast_buffers=False: gradients are what is compared; ResNets' BatchNorm statistics
        # (0.2 MB) broadcast before every forward would add the same constant to every method.
        ddp = DistributedDataParallel(model, bucket_cap_mb=cell.effective_cap_mb, init_sync=False,
                                      broadcast_buffers=False, gradient_as_bucket_view=cell.bucket_view)
        if cell.method == "torch_powersgd":
            hook: Any = _TorchPowerSGD(ddp, low_rank, cell.seed)
        else:
            params = {"rank": low_rank} if cell.method in ("powersgd", "acpsgd") else {}
            if cell.method == "topk":
                params = {"ratio": TOPK_RATIO}
            hook = GradientSync(from_spec(make_spec(COMPRESSOR_OF[cell.method], seed=cell.seed, **params)),
                                pipelining=cell.pipelining).install(ddp)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)  # the paper: plain SGD, fp32
        dataset = build_dataset("synthetic", model=workload.model, seed=cell.seed, seq_len=workload.seq_len,
                                image_size=workload.image_size)
        loader = InfiniteLoader(dataset, workload.batch_size, rank, world, cell.seed)
        link = probe_link(sizes=(64 * 1024, 4 * 1024 * 1024), repeats=3)
        clock = _ReadyClock(list(model.parameters()))
        timer = StepTimer(torch.device("cpu"))
        steps: list[dict[str, float]] = []
        bytes_before = 0.0
        cpu_before, wall_before = time.process_time(), time.perf_counter()
        load_start = os.getloadavg()[0]
        loss = torch.zeros(())
        for step in range(cell.protocol.steps):
            if step == cell.protocol.warmup:
                bytes_before = _bytes_sent(hook)
                cpu_before, wall_before = time.process_time(), time.perf_counter()
            started = time.perf_counter()
            with timer.phase("data"):
                inputs, targets = next(loader)
            with timer.phase("forward"):
                loss = F.cross_entropy(ddp(inputs), targets)
            with timer.phase("backward"):
                optimizer.zero_grad(set_to_none=False)
                clock.begin()
                loss.backward()
            with timer.phase("optimizer"):
                optimizer.step()
            timing = timer.end_step(step, hook.last_step())
            steps.append({"wall_s": time.perf_counter() - started, **timing.seconds})
            clock.end(keep=step >= cell.protocol.warmup)
        measured = cell.protocol.steps - cell.protocol.warmup
        bytes_per_step = (_bytes_sent(hook) - bytes_before) / measured
        cpu_share = (time.process_time() - cpu_before) / (time.perf_counter() - wall_before)
        final_loss = torch.tensor([float(loss.detach())], dtype=torch.float64)
        dist.all_reduce(final_loss)
        if rank == 0 and out is not None:
            out.write_text(json.dumps({
                "steps": steps, "ready_s": clock.means(), "bytes_per_step": bytes_per_step,
                "link": link.to_dict(), "final_loss": float(final_loss) / world,
                "loadavg": [load_start, os.getloadavg()[0]], "rank0_cpu_share": cpu_share,
                "shapes": [list(p.shape) for p in model.parameters()],
                "cpu_cores": len(os.sched_getaffinity(0)),
            }))
        dist.barrier()  # a comm hook is registered: peers must not tear down mid-collective
    finally:
        dist.destroy_process_group()


#: The bucket cap our PowerSGD's codec is measured in apart from communication: the grid's.


def codecs_main(workload_name: str, out: Path) -> None:
    """Time our PowerSGD (25 MB buckets) and PyTorch's hook (one bucket) on a workload's
    shapes, one CPU thread like a rank, on a one-process group (``compressor_cost``)."""
    import torch

    from benchmarks.compressor_cost import powersgd_codecs, single_process_group
    from workers.models import parameter_shapes

    torch.set_num_threads(1)
    workload = WORKLOADS[workload_name]
    shapes = parameter_shapes(workload.model, **workload.build_kwargs())
    with single_process_group():
        measured = powersgd_codecs(shapes, workload.rank, bucket_cap_bytes=CODEC_BUCKET_CAP_MB * 2**20,
                                   label=workload_name)
    out.write_text(json.dumps({"bucket_cap_mb": CODEC_BUCKET_CAP_MB, "rank": workload.rank, "threads": 1,
                               **{f"{name}_s": row["encode_decode_s"] for name, row in measured.items()}}))


def _bytes_sent(hook: Any) -> float:
    return float(hook.bytes_sent if hasattr(hook, "bytes_sent") else hook.stats().bytes_sent)


