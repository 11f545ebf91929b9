"""The paper's evaluation (ICDCS'23 ACP-SGD), reproduced at small scale on the emulated network.

Methods: ``ssgd`` (DDP all-reduce, compressor ``none``), ``signsgd``, ``topk`` (ratio 0.01),
``powersgd`` (ours), ``torch_powersgd`` (PyTorch's ``powerSGD_hook``) and ``acpsgd``, on
ResNet-50, ResNet-152, BERT-Base and a BERT-Large-like model, 2 (and 4) workers, each worker
in its own network namespace of ``benchmarks/testbed.py`` with a ``tc`` rate limit.

Why a benchmark-side rank runner (``_rank``) instead of ``workers.rank_main``: every method,
PyTorch's hook included, must be timed by the same code; the paper's statistics need every
iteration's time (5 blocks of 10 after 10 warm-up), which the job summary (window means) does
not keep; and the BERT-Large-like model needs a layer-count override that ``TrainConfig`` has
no field for. The runner reuses the worker's parts -- ``workers.models``, ``workers.data``,
``compressors.GradientSync`` with its ``pipelining`` switch, ``workers.timing.StepTimer``,
``workers.probe.probe_link`` -- and is only the timed data/forward/backward/optimizer steps.

Scaling (this machine: 2 shared CPU cores, no GPU; the parameter *shapes* -- what the
compressors see and what goes over the link -- are the paper's, except BERT-Large's depth):

=============  ===========================  ==================  =====  ================
workload       model here                   paper               rank   bytes S-SGD/step
=============  ===========================  ==================  =====  ================
ResNet-50      batch 8, 32 px, 1000 classes batch 64, 224 px    4      102 MB
ResNet-152     batch 4, 32 px, 1000 classes batch 32, 224 px    4      241 MB
BERT-Base      batch 4, seq 32              batch 32, seq 64    32     438 MB
BERT-Large     8 of 24 layers, batch 2,     batch 8, seq 64     32     ~530 MB
               seq 32 (hidden 1024, 16 heads, FFN 4096: BERT-Large's layer shapes)
=============  ===========================  ==================  =====  ================

PyTorch's ``powerSGD_hook`` on gloo: it ``.wait()``s on its second all-reduce inside the
completion callback of the first, which runs on a gloo worker thread; with several buckets in
flight that thread blocks while the collective it waits for is queued behind another bucket's,
and the job deadlocks. So ``torch_powersgd`` runs with ONE bucket (``bucket_cap_mb`` 10000):
its whole PowerSGD runs after backward, unpipelined -- that is how it can run on gloo at all.
Our ``powersgd`` (same algorithm and bytes, pipelined over 25 MB buckets) is the fair
PowerSGD baseline; both are reported.

Regimes: from a calibration run per model (S-SGD with pipelining off on a fast link, so
backward compute is clean) and the byte formulas, the script computes (a) the rate where
S-SGD's communication is ~4× its compute and (b) the rate where PowerSGD's communication
equals backward compute, and runs there; acceptance (a)-(c) is evaluated on those cells.

    python benchmarks/paper.py --quick   # ResNet-50 (6 methods) + BERT-Base (S-SGD, ACP-SGD at (a);
                                         # the PowerSGD family at (b)), 5 + 2×2 iterations, < 10 min
    python benchmarks/paper.py           # + the 100/500/2000 Mbit/s grid for all four models,
                                         # ResNet-50 on 4 workers, ablations (a few hours)

Finished configurations are cached (``--cache-dir``), so an interrupted run resumes, and
re-running the same command re-renders the reports without measuring again.

Every measured configuration holds ``/tmp/gradwire-bench.lock`` (flock) so it never runs
at the same time as another engineer's benchmark. Needs root for the network namespaces.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `benchmarks` is not an installed package
    sys.path.insert(0, str(ROOT))

METHODS: tuple[str, ...] = ("ssgd", "signsgd", "topk", "powersgd", "torch_powersgd", "acpsgd")
COMPRESSOR_OF = {"ssgd": "none", "signsgd": "signsgd", "topk": "topk", "powersgd": "powersgd", "acpsgd": "acpsgd"}
TOPK_RATIO = 0.01
LOCK_PATH = "/tmp/gradwire-bench.lock"
TORCH_ONE_BUCKET_MB = 10_000.0
#: gloo on the testbed sees 3-10 % less than the tc rate (headers, ring): used to pick rates.
LINK_EFFICIENCY = 0.94
A_RATIO = 4.0  # regime (a): S-SGD communication ≈ 4× compute (acceptance asks for >= 3×)
CALIBRATION_MBIT = 10_000.0
RETRY_PAUSE_S = 30.0
CALIBRATION_PROTOCOL_STEPS = (5, 1, 6)
#: One colour per method in every plot.
METHOD_COLOURS = {"ssgd": "#4c72b0", "signsgd": "#dd8452", "topk": "#937860", "powersgd": "#55a868",
                  "torch_powersgd": "#8172b3", "acpsgd": "#c44e52"}
PHASES = ("data", "forward", "backward", "exposed_comm", "optimizer", "compress", "communicate", "decompress")


@dataclass(frozen=True)
class Workload:
    """A paper workload scaled to this machine (see the module docstring for why)."""

    name: str
    model: str
    batch_size: int
    rank: int
    seq_len: int = 32
    image_size: int = 32
    layers: int | None = None  # BERT depth override
    paper: str = ""

    @property
    def is_bert(self) -> bool:
        return self.model.startswith("bert")

    def build_kwargs(self) -> dict[str, Any]:
        """``build_model`` keywords: the paper's heads (1000 ImageNet classes, 2 for BERT)."""
        from workers.models import default_num_classes

        kwargs: dict[str, Any] = {"num_classes": default_num_classes(self.model)}
        if self.is_bert:
            kwargs["seq_len"] = self.seq_len
            if self.layers:
                kwargs["num_layers"] = self.layers
        else:
            kwargs["image_size"] = self.image_size
        return kwargs

    def describe(self) -> str:
        if self.is_bert:
            depth = f"{self.layers} layers, " if self.layers else ""
            return f"{depth}batch {self.batch_size}, seq {self.seq_len}, rank {self.rank}"
        return f"batch {self.batch_size}, {self.image_size} px, rank {self.rank}"


WORKLOADS: dict[str, Workload] = {
    "resnet50": Workload("resnet50", "resnet50", batch_size=8, rank=4, paper="batch 64, 224 px, rank 4"),
    "resnet152": Workload("resnet152", "resnet152", batch_size=4, rank=4, paper="batch 32, 224 px, rank 4"),
    "bert-base": Workload("bert-base", "bert-base", batch_size=4, rank=32, seq_len=32, paper="batch 32, seq 64, rank 32"),
    "bert-large": Workload("bert-large", "bert-large", batch_size=2, rank=32, seq_len=32, layers=8,
                           paper="24 layers, batch 8, seq 64, rank 32"),
}


@dataclass(frozen=True)
class Protocol:
    """Iterations of one measured configuration: warm-up, then ``repeats`` blocks of ``iters``."""

    warmup: int = 10
    repeats: int = 5
    iters: int = 10

    @property
    def steps(self) -> int:
        return self.warmup + self.repeats * self.iters


PAPER_PROTOCOL = Protocol(10, 5, 10)
#: Cheaper protocols for configurations whose predicted time exceeds the per-cell budget
#: (S-SGD of BERT at 100 Mbit/s takes ~35 s an iteration). Even block lengths keep ACP-SGD's
#: P- and Q-steps balanced; warm-up >= 3 lets PyTorch's hook start compressing first.
FALLBACK_PROTOCOLS = (Protocol(6, 5, 6), Protocol(4, 3, 4), Protocol(3, 2, 2))
CALIBRATION_PROTOCOL = Protocol(*CALIBRATION_PROTOCOL_STEPS)
ABLATION_PROTOCOL = Protocol(4, 3, 4)
GRID_MBITS = {"resnet50": (100.0, 500.0, 2000.0), "bert-base": (100.0, 500.0, 2000.0),
              "resnet152": (500.0, 2000.0), "bert-large": (500.0, 2000.0)}
FUSION_CAPS_MB = (1e-4, 1.0, 5.0, 25.0, 100.0, 1000.0)  # 1e-4: one tensor per bucket (fusion off)
MIN_FUSED_CAP_MB = 1.0  # buckets of this size or more hold many tensors: fusion on
RANK_SWEEP = {"resnet50": (1, 2, 4, 8, 16), "bert-base": (8, 16, 32, 64)}
QUICK_PROTOCOL = Protocol(5, 2, 2)  # PyTorch's hook needs ~5 steps to settle (allocations)


@dataclass(frozen=True)
class Cell:
    """One measured configuration; its JSON is the cache key."""

    workload: str
    method: str
    workers: int
    mbit: float
    bucket_cap_mb: float = 25.0
    pipelining: bool = True
    rank: int | None = None  # None: the workload's rank
    protocol: Protocol = PAPER_PROTOCOL
    tag: str = "grid"
    seed: int = 0
    #: DDP's gradient_as_bucket_view: gradients live in the bucket buffers, so DDP does not
    #: copy every bucket into .grad after backward (~15 ms per 100 MB on one core, all exposed).
    bucket_view: bool = True

    @property
    def effective_cap_mb(self) -> float:
        return TORCH_ONE_BUCKET_MB if self.method == "torch_powersgd" else self.bucket_cap_mb

    def key(self) -> str:
        payload = json.dumps({**asdict(self), "tag": None}, sort_keys=True)
        return hashlib.sha1(payload.encode()).hexdigest()[:16]


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
CODEC_BUCKET_CAP_MB = Cell.__dataclass_fields__["bucket_cap_mb"].default


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


# =========================================================================== the parent


@contextlib.contextmanager
def bench_lock(path: str = LOCK_PATH) -> Iterator[float]:
    """Hold the shared benchmark lock (another engineer's benchmarks take it too); yields wait s."""
    started = time.monotonic()
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield time.monotonic() - started
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


class Runner:
    """Runs cells on testbeds (one per worker count, its rate changed per cell), with a cache."""

    def __init__(self, cache_dir: Path | None, log: Any = print, *, quiet_cores: float = 0.35,
                 quiet_wait_s: float = 300.0) -> None:
        self.cache_dir = cache_dir
        self.quiet_cores = quiet_cores
        self.quiet_wait_s = quiet_wait_s
        #: Re-measure cached configurations that other processes disturbed (keep the better).
        self.remeasure_disturbed = False
        self.log = log
        self._testbeds: dict[int, Any] = {}
        self._port = 29_600 + os.getpid() % 500
        self.spent_s = 0.0

    def close(self) -> None:
        for tb in self._testbeds.values():
            tb.close()
        self._testbeds.clear()

    def _testbed(self, workers: int, mbit: float) -> Any:
        from benchmarks.testbed import Testbed

        tb = self._testbeds.get(workers)
        if tb is None:
            tb = self._testbeds[workers] = Testbed(hosts=workers, mbit=mbit).start()
        elif tb.mbit != mbit:
            tb.set_rate(mbit)
        return tb

    def run(self, cell: Cell, timeout_s: float, *, retries: int = 0, max_other_cores: float = math.inf) -> dict[str, Any]:
        """Measure ``cell`` (or reuse the cache). A run during which other processes used more
        than ``max_other_cores`` of the CPUs is repeated up to ``retries`` times after a pause;
        the least disturbed attempt is kept, and its disturbance is recorded either way."""
        cached = self.cache_dir / f"{cell.key()}.json" if self.cache_dir else None
        best: dict[str, Any] | None = None
        if cached is not None and cached.exists():
            best = json.loads(cached.read_text())
            # Calibrations are never re-measured: the regimes (and so every other key) depend on them.
            disturbed = best.get("other_cpu_cores", 0.0) > max_other_cores and cell.tag != "calibration"
            if not (self.remeasure_disturbed and disturbed):
                self.log("          (cached)")
                return best
            self.log(f"          cached run was disturbed ({best['other_cpu_cores']:.2f} other cores): measuring again")
        for attempt in range(retries + 1):
            raw = self._attempt(cell, timeout_s)
            raw["attempts"] = attempt + 1
            if best is None or raw["other_cpu_cores"] < best["other_cpu_cores"]:
                best = raw
            if raw["other_cpu_cores"] <= max_other_cores:
                break
            if attempt < retries:
                self.log(f"          other processes used {raw['other_cpu_cores']:.2f} cores meanwhile: "
                         f"pausing {RETRY_PAUSE_S:.0f} s and measuring again")
                time.sleep(RETRY_PAUSE_S)
        assert best is not None
        if cached is not None:
            cached.parent.mkdir(parents=True, exist_ok=True)
            cached.write_text(json.dumps(best))
        return best

    def wake_up_s(self, workers: int, rounds: int = 40) -> float:
        """The probe's ``wake_s`` on this testbed: a small all-reduce joined late by one rank,
        beyond the aligned one's best time (``workers.probe.wake_up_seconds``). Cached."""
        from benchmarks.testbed import measure_allreduce

        def measure() -> dict[str, Any]:
            self._port += 1
            with bench_lock():
                m = measure_allreduce(self._testbed(workers, CALIBRATION_MBIT), nbytes=4096, iters=9, port=self._port,
                                      wake_rounds=rounds)
            return {"wake_s": m.wake_s, "rounds": rounds}

        return float(self._cached(f"wake-{workers}.json", measure)["wake_s"])

    def _cached(self, name: str, measure: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """``measure()``'s JSON result, kept as ``name`` in the cache directory (if any)."""
        cached = self.cache_dir / name if self.cache_dir else None
        if cached is not None and cached.exists():
            return json.loads(cached.read_text())
        result = measure()
        if cached is not None:
            cached.parent.mkdir(parents=True, exist_ok=True)
            cached.write_text(json.dumps(result))
        return result

    def isolated_codecs(self, workload: str) -> dict[str, float]:
        """Encode+decode seconds of our PowerSGD and PyTorch's hook in the layouts the runs
        use, measured apart from any communication (``codecs_main``). Cached."""
        settings = {"workload": asdict(WORKLOADS[workload]), "bucket_cap_mb": CODEC_BUCKET_CAP_MB}
        key = hashlib.sha1(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:12]

        def measure() -> dict[str, Any]:
            with bench_lock(), tempfile.TemporaryDirectory(prefix="gw-codecs-") as tmp:
                wait_for_quiet(self.quiet_cores, self.quiet_wait_s)
                out = Path(tmp) / "codecs.json"
                subprocess.run([sys.executable, "-u", str(Path(__file__).resolve()), "_codecs", "--workload", workload,
                                "--out", str(out)], check=True, timeout=900, stdout=subprocess.DEVNULL)
                return json.loads(out.read_text())

        return self._cached(f"codecs-{workload}-{key}.json", measure)

    def _attempt(self, cell: Cell, timeout_s: float) -> dict[str, Any]:
        from benchmarks.testbed import TestbedError, _collect, worker_env

        self._port += 1
        with bench_lock() as waited, tempfile.TemporaryDirectory(prefix="gw-paper-") as tmp:
            quiet_wait, busy_before = wait_for_quiet(self.quiet_cores, self.quiet_wait_s)
            tb = self._testbed(cell.workers, cell.mbit)
            out = Path(tmp) / "rank0.json"
            init = f"tcp://{tb.address(0)}:{self._port}"
            started, busy0, ours0 = time.monotonic(), _machine_busy_s(), _children_cpu_s()
            procs = [
                tb.run(i, [sys.executable, "-u", str(Path(__file__).resolve()), "_rank", "--cell", json.dumps(asdict(cell)),
                           "--rank", str(i), "--world", str(cell.workers), "--init", init, "--out", str(out)],
                       env=worker_env(tb, i), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                for i in range(cell.workers)
            ]
            try:
                _collect(procs, timeout_s)
            except TestbedError as exc:
                raise RuntimeError(f"{_cell_label(cell)}: {exc}") from exc
            elapsed = time.monotonic() - started
            other = ((_machine_busy_s() - busy0) - (_children_cpu_s() - ours0)) / elapsed
            raw = json.loads(out.read_text())
        raw["elapsed_s"] = elapsed
        raw["lock_wait_s"] = waited
        raw["quiet_wait_s"] = quiet_wait
        raw["busy_cores_before"] = busy_before
        # CPU time of processes that are not this run's ranks (includes the kernel's
        # softirq work of moving our own packets, a few % of a core at these rates).
        raw["other_cpu_cores"] = max(0.0, other)
        self.spent_s += elapsed
        return raw


def wait_for_quiet(max_cores: float, max_wait_s: float, window_s: float = 2.0) -> tuple[float, float]:
    """Wait (up to ``max_wait_s``) until other processes use at most ``max_cores`` of the CPUs.

    Why: other engineers' tests and unlocked jobs share these 2 cores; a measurement started
    while they run is slowed by them. Returns (seconds waited, busy cores last seen).
    """
    started = time.monotonic()
    while True:
        before = _machine_busy_s()
        time.sleep(window_s)
        busy = (_machine_busy_s() - before) / window_s
        waited = time.monotonic() - started
        if busy <= max_cores or waited >= max_wait_s:
            return waited, busy


def _machine_busy_s() -> float:
    """CPU seconds all processes have spent busy since boot (first line of /proc/stat)."""
    with open("/proc/stat") as handle:
        fields = [int(x) for x in handle.readline().split()[1:9]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def _children_cpu_s() -> float:
    """CPU seconds of this process's finished (waited-for) children: our rank processes."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _cell_label(cell: Cell) -> str:
    extra = []
    if cell.bucket_cap_mb != 25.0 and cell.method != "torch_powersgd":
        extra.append(f"cap {cell.bucket_cap_mb:g} MB")
    if not cell.pipelining:
        extra.append("pipelining off")
    if cell.rank:
        extra.append(f"rank {cell.rank}")
    p = cell.protocol
    return (f"{cell.workload:10s} {cell.method:14s} N={cell.workers} {cell.mbit:7g} Mbit/s "
            f"[{p.warmup}+{p.repeats}×{p.iters}] {' '.join(extra)}")


# --------------------------------------------------------------------------- statistics


def summarize(cell: Cell, raw: Mapping[str, Any]) -> dict[str, Any]:
    """The paper's statistic: mean iteration time over ``repeats`` blocks of ``iters``, ± 1.96σ
    of the block means; phases are means over the measured iterations (rank 0)."""
    workload = WORKLOADS[cell.workload]
    measured = raw["steps"][cell.protocol.warmup:]
    blocks = [measured[i * cell.protocol.iters:(i + 1) * cell.protocol.iters] for i in range(cell.protocol.repeats)]
    block_means = [statistics.fmean(s["wall_s"] for s in block) for block in blocks]
    iter_s = statistics.fmean(block_means)
    ci = 1.96 * statistics.stdev(block_means) if len(block_means) > 1 else 0.0
    samples = workload.batch_size * cell.workers
    throughput = [samples / t for t in block_means]
    phase_s = {phase: statistics.fmean(s[phase] for s in measured) for phase in PHASES}
    from workers.timing import compute_jitter_s

    return {
        # σ of one rank's compute per step: the cost model's straggler term (planning.costmodel).
        "compute_jitter_s": compute_jitter_s(measured),
        "model": cell.workload, "method": cell.method, "workers": cell.workers, "mbit": cell.mbit,
        "iter_s": iter_s, "iter_ci_s": ci,
        "samples_per_s": samples / iter_s,
        "samples_ci": 1.96 * statistics.stdev(throughput) if len(throughput) > 1 else 0.0,
        "exposed_comm_s": phase_s["exposed_comm"],
        "phase_s": phase_s,
        "codec_s": phase_s["compress"] + phase_s["decompress"],
        "bytes_per_step": raw["bytes_per_step"],
        "batch_size": workload.batch_size, "rank": cell.rank or (workload.rank if cell.method in ("powersgd", "torch_powersgd", "acpsgd") else None),
        "bucket_cap_mb": cell.effective_cap_mb, "pipelining": cell.pipelining, "tag": cell.tag,
        "protocol": asdict(cell.protocol),
        "link": {k: raw["link"][k] for k in ("alpha_s", "beta_s_per_byte", "bandwidth_bytes_per_second")},
        "link_mbit_seen": 8 * raw["link"]["bandwidth_bytes_per_second"] / 1e6 if raw["link"]["bandwidth_bytes_per_second"] else None,
        "final_loss": raw["final_loss"], "loadavg": raw.get("loadavg"), "elapsed_s": raw.get("elapsed_s"),
        "other_cpu_cores": raw.get("other_cpu_cores"), "rank0_cpu_share": raw.get("rank0_cpu_share"),
        "attempts": raw.get("attempts", 1),
        "cpu_cores": raw.get("cpu_cores"),
    }


def collective_cpu_s(fused: Cell, fused_raw: Mapping[str, Any], unfused: Cell, unfused_raw: Mapping[str, Any],
                     shapes: Sequence[Sequence[int]]) -> float:
    """Host seconds per collective: how much longer a step with one bucket per tensor takes
    than the same step with 25 MB buckets, per extra collective.

    Both are S-SGD with pipelining off on a fast link (the calibration's setting): the same
    bytes and compute, every collective after backward, so the difference is what each
    collective costs the worker's CPU (hook, issue, completion callback) beyond its bytes.
    """
    from benchmarks.simulate import layout_for

    def step_s(cell: Cell, raw: Mapping[str, Any]) -> float:
        return statistics.median(s["forward"] + s["backward"] + s["optimizer"] for s in raw["steps"][cell.protocol.warmup:])

    extra = len(layout_for(shapes, unfused.bucket_cap_mb)) - len(layout_for(shapes, fused.bucket_cap_mb))
    return max(0.0, (step_s(unfused, unfused_raw) - step_s(fused, fused_raw)) / extra) if extra > 0 else 0.0


def calibration_entry(cell: Cell, raw: Mapping[str, Any]) -> dict[str, Any]:
    """Compute of one worker from a run with nothing overlapping backward.

    S-SGD with pipelining off on a fast link: the hook only holds buckets during backward, so
    backward minus exposed communication is backward compute; gradient ready times give its
    per-layer profile.
    """
    measured = raw["steps"][cell.protocol.warmup:]

    def median(key: Any) -> float:  # medians: one disturbed step must not move the regimes
        return statistics.median(key(s) for s in measured)

    forward = median(lambda s: s["data"] + s["forward"])
    backward = median(lambda s: max(0.0, s["backward"] - s["exposed_comm"]))
    optimizer = median(lambda s: s["optimizer"])
    return {
        "forward_s": forward, "backward_s": backward, "optimizer_s": optimizer,
        "compute_s": forward + backward + optimizer,
        "ready_s": raw["ready_s"],
        "other_cpu_cores": raw.get("other_cpu_cores"),
        "protocol": asdict(cell.protocol),
    }


# --------------------------------------------------------------------------- planning


def wire_bytes(method: str, shapes: Sequence[Sequence[int]], rank: int, workers: int) -> float:
    from benchmarks.simulate import method_spec
    from planning.wire import wire_bytes as formula

    return formula(method_spec(method, rank, TOPK_RATIO), [tuple(s) for s in shapes], workers)


def _nice(mbit: float) -> float:
    """Round a rate to 2 significant digits (stable cache keys, readable tables)."""
    if mbit <= 0:
        return mbit
    digits = 1 - int(math.floor(math.log10(mbit)))
    return float(round(mbit, digits))


def regime_rates(workload: Workload, calib: Mapping[str, Any], shapes: Sequence[Sequence[int]], workers: int) -> dict[str, Any]:
    """Rates where (a) S-SGD's communication is ``A_RATIO``× its compute and (b) PowerSGD's
    communication equals backward compute, from the byte formulas and measured compute."""
    ring = 2 * (workers - 1) / workers
    ssgd = wire_bytes("ssgd", shapes, workload.rank, workers)
    psgd = wire_bytes("powersgd", shapes, workload.rank, workers)
    mbit_a = ring * ssgd * 8 / (A_RATIO * calib["compute_s"]) / 1e6 / LINK_EFFICIENCY
    mbit_b = ring * psgd * 8 / calib["backward_s"] / 1e6 / LINK_EFFICIENCY
    return {"a": _nice(mbit_a), "b": _nice(mbit_b), "ssgd_bytes": ssgd, "powersgd_bytes": psgd,
            "acpsgd_bytes": wire_bytes("acpsgd", shapes, workload.rank, workers)}


def predicted_step_s(cell: Cell, calib: Mapping[str, Any], shapes: Sequence[Sequence[int]], cost: Mapping[str, Any] | None) -> float:
    """A rough prediction (cost model, nominal link) to choose the protocol and the timeout."""
    from benchmarks.simulate import COST_NAMES, Compute, predict
    from planning.costmodel import CodecCost, Link

    workload = WORKLOADS[cell.workload]
    compute = Compute(calib["forward_s"], calib["backward_s"], calib["optimizer_s"], tuple(calib["ready_s"]))
    codec_s = 0.0
    if cost is not None:
        # compressor_cost.json times ResNet-50's and BERT-Base's shapes (with 2 threads; ranks
        # here have one): scale by parameter count for the other models of the same family.
        ref = cost.get("bert-base" if workload.is_bert else "resnet50", {})
        params = sum(math.prod(s) for s in shapes)
        ref_params = ref.get("none", {}).get("bytes_per_step", 4 * params) / 4
        codec_s = 1.5 * ref.get(COST_NAMES[cell.method], {}).get("encode_decode_s", 0.0) * params / ref_params
    link = Link(alpha=2e-4, beta=8 / (cell.mbit * 1e6 * LINK_EFFICIENCY))
    pred = predict(cell.method, shapes, compute, cell.workers, link, rank=cell.rank or workload.rank,
                   codec=CodecCost(codec_s), bucket_cap_mb=cell.effective_cap_mb, pipelining=cell.pipelining)
    return pred.step_s * (1.3 if cell.workers > 2 else 1.0)  # >2 ranks share 2 cores


def choose_protocol(step_s: float, budget_s: float, quick: bool) -> Protocol:
    if quick:
        return QUICK_PROTOCOL
    for protocol in (PAPER_PROTOCOL, *FALLBACK_PROTOCOLS):
        if protocol.steps * step_s <= budget_s:
            return protocol
    return FALLBACK_PROTOCOLS[-1]


# --------------------------------------------------------------------------- acceptance


def acceptance(results: Sequence[Mapping[str, Any]], calibration: Mapping[str, Any], workloads: Mapping[str, Any],
               ablations: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
    """Checks (a)-(c) of the issue on the measured rows (ResNet-50 and BERT-Base, 2 workers).

    Communication times use the measured link (median α, β of the runs' own probes at that
    rate) and the byte formulas; compute comes from the model's calibration run.

    (c) asks for fusion and pipelining on, at no particular buffer size. The default cell
    uses 25 MB buckets; when the fusion sweep ran at the same rate, (c) is judged on ACP-SGD's
    fastest *fused* buffer (more than one tensor per bucket, pipelining on), as the paper
    tunes its buffer, and both figures are reported.
    """
    from benchmarks.simulate import _links_by_setting
    from planning.costmodel import all_reduce_s

    links = _links_by_setting(results)
    index = {(r["model"], r["method"], r["workers"], r["mbit"]): r for r in results}
    out: dict[str, Any] = {"a": [], "b": [], "c": []}
    for model in ("resnet50", "bert-base"):
        calib = calibration.get(f"{model}/2")
        info = workloads.get(model)
        if not calib or not info:
            continue
        for (m, method, n, mbit), row in sorted(index.items(), key=lambda kv: kv[0][3]):
            if m != model or n != 2 or method != "ssgd":
                continue
            acp = index.get((model, "acpsgd", 2, mbit))
            link = links[(2, mbit)]
            comm = all_reduce_s(info["bytes"]["ssgd"], 2, link)
            ratio = comm / calib["compute_s"]
            if ratio >= 3 and acp:
                speedup = row["iter_s"] / acp["iter_s"]
                out["a"].append({"model": model, "mbit": mbit, "comm_over_compute": ratio, "speedup": speedup,
                                 "pass": speedup >= 2.5})
        for (m, method, n, mbit), row in index.items():
            if m != model or n != 2 or method != "acpsgd" or row.get("tag") != "regime-b":
                continue
            torch_row = index.get((model, "torch_powersgd", 2, mbit))
            ours_row = index.get((model, "powersgd", 2, mbit))
            link = links[(2, mbit)]
            # PowerSGD's wire time: its bytes in two dependent rounds (2 latency terms).
            comm = all_reduce_s(info["bytes"]["powersgd"], 2, link) + all_reduce_s(0, 2, link)
            ratio = comm / calib["backward_s"]
            if torch_row:
                speedup = torch_row["iter_s"] / row["iter_s"]
                out["b"].append({"model": model, "mbit": mbit, "powersgd_comm_over_backward": ratio,
                                 "speedup_over_torch_powersgd": speedup,
                                 "speedup_over_our_powersgd": ours_row["iter_s"] / row["iter_s"] if ours_row else None,
                                 "pass": speedup >= 1.3})
            share = row["exposed_comm_s"] / row["iter_s"]
            item = {"model": model, "mbit": mbit, "bucket_cap_mb": row.get("bucket_cap_mb"),
                    "exposed_comm_s": row["exposed_comm_s"], "iter_s": row["iter_s"], "share": share,
                    "pass": share <= 0.15}
            fused = [a for a in ablations if a.get("tag") == "fusion" and a["model"] == model and a["method"] == "acpsgd"
                     and a["workers"] == 2 and a["mbit"] == mbit and a.get("pipelining", True)
                     and a["bucket_cap_mb"] >= MIN_FUSED_CAP_MB]
            if fused:
                best = min(fused, key=lambda a: a["iter_s"])
                best_share = best["exposed_comm_s"] / best["iter_s"]
                item["tuned"] = {"bucket_cap_mb": best["bucket_cap_mb"], "exposed_comm_s": best["exposed_comm_s"],
                                 "iter_s": best["iter_s"], "share": best_share}
                item["pass"] = best_share <= 0.15
            out["c"].append(item)
    for key in ("a", "b", "c"):
        out[f"{key}_pass"] = bool(out[key]) and all(item["pass"] for item in out[key])
    return out


# --------------------------------------------------------------------------- reports


def write_markdown(path: Path, doc: Mapping[str, Any]) -> None:
    lines = [f"# Paper reproduction at small scale ({'quick' if doc['quick'] else 'full'} run)", ""]
    lines += [f"Command: `{doc['command']}`", "",
              f"Protocol: {doc['protocol_note']}", "",
              "## Workloads (scaled) and bytes per step per worker (formula)", "",
              "| workload | here | paper | S-SGD MB | PowerSGD MB | ACP-SGD MB (avg) | compute s (2 workers) | backward s |",
              "|---|---|---|---:|---:|---:|---:|---:|"]
    for name, w in doc["workloads"].items():
        c = doc["calibration"].get(f"{name}/2", {})
        lines.append(f"| {name} | {w['here']} | {w['paper']} | {w['bytes']['ssgd'] / 1e6:.1f} | "
                     f"{w['bytes']['powersgd'] / 1e6:.2f} | {w['bytes']['acpsgd'] / 1e6:.2f} | "
                     f"{c.get('compute_s', float('nan')):.3f} | {c.get('backward_s', float('nan')):.3f} |")
    lines += ["", "## Regimes chosen (from calibration and byte formulas)", ""]
    for name, r in doc["regimes"].items():
        lines.append(f"- **{name}**: (a) {r['a']:g} Mbit/s, where S-SGD's communication ≈ {A_RATIO:g}× its compute; "
                     f"(b) {r['b']:g} Mbit/s, where PowerSGD's communication ≈ backward compute.")
    acc = doc["acceptance"]
    lines += ["", "## Acceptance (ResNet-50 and BERT-Base, 2 workers, one run)", ""]
    for item in acc["a"]:
        lines.append(f"- (a) {item['model']} @ {item['mbit']:g} Mbit/s: S-SGD comm/compute = {item['comm_over_compute']:.1f}; "
                     f"ACP-SGD {item['speedup']:.2f}× faster than S-SGD → {'PASS' if item['pass'] else 'FAIL'} (≥ 2.5×)")
    for item in acc["b"]:
        ours = item["speedup_over_our_powersgd"]
        lines.append(f"- (b) {item['model']} @ {item['mbit']:g} Mbit/s: PowerSGD comm/backward = "
                     f"{item['powersgd_comm_over_backward']:.2f}; ACP-SGD {item['speedup_over_torch_powersgd']:.2f}× faster "
                     f"than torch powerSGD_hook ({'' if ours is None else f'{ours:.2f}× than our pipelined PowerSGD'}) "
                     f"→ {'PASS' if item['pass'] else 'FAIL'} (≥ 1.3×)")
    for item in acc["c"]:
        line = (f"- (c) {item['model']} @ {item['mbit']:g} Mbit/s: ACP-SGD exposed comm {item['exposed_comm_s'] * 1e3:.1f} ms "
                f"of {item['iter_s'] * 1e3:.0f} ms = {item['share']:.1%} with {item['bucket_cap_mb']:g} MB buckets")
        tuned = item.get("tuned")
        if tuned:
            line += (f"; with the fusion sweep's fastest buffer, {tuned['bucket_cap_mb']:g} MB: "
                     f"{tuned['exposed_comm_s'] * 1e3:.1f} ms of {tuned['iter_s'] * 1e3:.0f} ms = {tuned['share']:.1%}")
        lines.append(f"{line} → {'PASS' if item['pass'] else 'FAIL'} (≤ 15 %)")
    lines += ["", f"Overall: (a) {_pf(acc['a_pass'])}, (b) {_pf(acc['b_pass'])}, (c) {_pf(acc['c_pass'])}", ""]
    lines += ["## Results", "", _results_table(doc["results"]), ""]
    if doc.get("ablations"):
        lines += ["## Ablations", "", _results_table(doc["ablations"], ablation=True), ""]
    lines += ["## Notes", "", *[f"- {n}" for n in doc["notes"]], ""]
    path.write_text("\n".join(lines))


def _pf(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def _results_table(rows: Sequence[Mapping[str, Any]], ablation: bool = False) -> str:
    head = ("| model | N | Mbit/s | method | cap MB | pipe | rank | iter s (±1.96σ) | samples/s | exposed comm s | "
            "codec s | MB/step | × vs S-SGD | × vs torch PowerSGD | link Mbit/s seen | other CPU cores |")
    out = [head, "|---|---:|---:|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    index = {(r["model"], r["method"], r["workers"], r["mbit"], r["tag"]): r for r in rows}
    ref_index = {(r["model"], r["method"], r["workers"], r["mbit"]): r for r in rows
                 if r["pipelining"] and r["bucket_cap_mb"] in (25.0, TORCH_ONE_BUCKET_MB)}
    for r in sorted(rows, key=lambda r: (r["model"], r["workers"], r["mbit"], r["tag"], METHODS.index(r["method"]),
                                         r["bucket_cap_mb"], r["rank"] or 0, not r["pipelining"])):
        ssgd = ref_index.get((r["model"], "ssgd", r["workers"], r["mbit"]))
        torch_row = ref_index.get((r["model"], "torch_powersgd", r["workers"], r["mbit"]))
        vs_ssgd = f"{ssgd['iter_s'] / r['iter_s']:.2f}" if ssgd else ""
        vs_torch = f"{torch_row['iter_s'] / r['iter_s']:.2f}" if torch_row else ""
        seen = f"{r['link_mbit_seen']:.0f}" if r.get("link_mbit_seen") else ""
        out.append(f"| {r['model']} | {r['workers']} | {r['mbit']:g} | {r['method']} | {r['bucket_cap_mb']:g} | "
                   f"{'on' if r['pipelining'] else 'off'} | {r['rank'] or ''} | {r['iter_s']:.3f} ± {r['iter_ci_s']:.3f} | "
                   f"{r['samples_per_s']:.1f} | {r['exposed_comm_s']:.3f} | {r['codec_s']:.3f} | "
                   f"{r['bytes_per_step'] / 1e6:.2f} | {vs_ssgd} | {vs_torch} | {seen} | "
                   f"{r.get('other_cpu_cores') or 0:.2f} |")
    del index
    return "\n".join(out)


def plot_phases(path: Path, rows: Sequence[Mapping[str, Any]]) -> None:
    """Per-phase stacked bars per method: one panel per (model, workers, bandwidth)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = sorted({(r["model"], r["workers"], r["mbit"]) for r in rows})
    if not panels:
        return
    cols = 4
    nrows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(4.2 * cols, 3.3 * nrows), squeeze=False)
    colours = {"data+forward": "#4c72b0", "backward compute": "#55a868", "exposed comm": "#c44e52", "optimizer": "#8172b2"}
    for ax, (model, n, mbit) in zip(axes.flat, panels):
        sel = {r["method"]: r for r in rows if (r["model"], r["workers"], r["mbit"]) == (model, n, mbit)}
        methods = [m for m in METHODS if m in sel]
        bottoms = [0.0] * len(methods)
        for label, colour in colours.items():
            values = []
            for m in methods:
                p = sel[m]["phase_s"]
                values.append({"data+forward": p["data"] + p["forward"],
                               "backward compute": max(0.0, p["backward"] - p["exposed_comm"]),
                               "exposed comm": p["exposed_comm"], "optimizer": p["optimizer"]}[label])
            ax.bar(range(len(methods)), values, bottom=bottoms, color=colour, label=label)
            bottoms = [b + v for b, v in zip(bottoms, values)]
        ax.set_xticks(range(len(methods)))
        ax.set_xticklabels([m.replace("torch_powersgd", "torch_psgd") for m in methods], rotation=35, fontsize=7)
        ax.set_title(f"{model}, N={n}, {mbit:g} Mbit/s", fontsize=9)
        ax.set_ylabel("s / iteration")
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c, label=label) for label, c in colours.items()]
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), fontsize=8)
    fig.tight_layout(rect=(0, 0.06 if nrows > 1 else 0.1, 1, 1))
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_speedup(path: Path, rows: Sequence[Mapping[str, Any]]) -> None:
    """Speedup over S-SGD vs bandwidth, per model (2 workers), each method one line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = sorted({r["model"] for r in rows if r["workers"] == 2})
    if not models:
        return
    fig, axes = plt.subplots(1, len(models), figsize=(4.4 * len(models), 3.6), squeeze=False)
    for ax, model in zip(axes[0], models):
        base = {r["mbit"]: r["iter_s"] for r in rows if r["model"] == model and r["workers"] == 2 and r["method"] == "ssgd"}
        for method in METHODS:
            pts = sorted((r["mbit"], base[r["mbit"]] / r["iter_s"]) for r in rows
                         if r["model"] == model and r["workers"] == 2 and r["method"] == method and r["mbit"] in base)
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=method,
                        color=METHOD_COLOURS[method])
        ax.set_xscale("log")
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_title(model)
        ax.set_xlabel("link Mbit/s")
        ax.set_ylabel("speedup over S-SGD")
        ax.grid(alpha=0.3)
    handles = [plt.Line2D([], [], color=c, marker="o", label=m) for m, c in METHOD_COLOURS.items()]
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), fontsize=8)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_ablations(path: Path, rows: Sequence[Mapping[str, Any]]) -> None:
    """Fusion buffer sweep, pipelining on/off, rank sweep (iteration time)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = sorted({r["model"] for r in rows})
    if not models:
        return
    fig, axes = plt.subplots(len(models), 3, figsize=(13, 3.4 * len(models)), squeeze=False)
    for i, model in enumerate(models):
        sel = [r for r in rows if r["model"] == model]
        ax = axes[i][0]
        for method in ("ssgd", "powersgd", "acpsgd"):
            pts = sorted((r["bucket_cap_mb"], r["iter_s"]) for r in sel if r["tag"] == "fusion" and r["method"] == method)
            if pts:
                ax.plot([max(p[0], 1e-2) for p in pts], [p[1] for p in pts], marker="o", label=method,
                        color=METHOD_COLOURS[method])
        ax.set_xscale("log")
        ax.set_xlabel("bucket_cap_mb (0.01 = fusion off: one tensor per bucket)")
        ax.set_ylabel("s / iteration")
        ax.set_title(f"{model}: tensor fusion")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
        ax = axes[i][1]
        labels, values = [], []
        for r in sorted((r for r in sel if r["tag"] in ("pipelining", "fusion") and r["bucket_cap_mb"] == 25.0),
                        key=lambda r: (r["method"], not r["pipelining"])):
            labels.append(f"{r['method']} {'on' if r['pipelining'] else 'off'}\n{r['mbit']:g} Mbit/s")
            values.append(r["iter_s"])
        bars = ax.bar(range(len(values)), values, color=[METHOD_COLOURS[label.split()[0]] for label in labels])
        for bar, label in zip(bars, labels):
            if " off" in label:
                bar.set_hatch("//")
        ax.set_xticks(range(len(values)))
        ax.set_xticklabels(labels, fontsize=7)
        ax.set_title(f"{model}: pipelining on/off")
        ax = axes[i][2]
        for method in ("powersgd", "acpsgd"):
            pts = sorted((r["rank"], r["iter_s"]) for r in sel if r["tag"] == "rank" and r["method"] == method)
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=method,
                        color=METHOD_COLOURS[method])
        ax.set_xscale("log", base=2)
        ax.set_xlabel("rank")
        ax.set_title(f"{model}: rank sweep")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# --------------------------------------------------------------------------- the plan


def _workload_info(name: str, workers: int, shapes: Sequence[Sequence[int]]) -> dict[str, Any]:
    w = WORKLOADS[name]
    return {
        "here": w.describe(), "paper": w.paper, "rank": w.rank, "shapes": [list(s) for s in shapes],
        "parameters": sum(math.prod(s) for s in shapes),
        "bytes": {m: wire_bytes(m, shapes, w.rank, workers) for m in METHODS},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd")
    rank_parser = sub.add_parser("_rank", help=argparse.SUPPRESS)
    rank_parser.add_argument("--cell", required=True)
    rank_parser.add_argument("--rank", type=int, required=True)
    rank_parser.add_argument("--world", type=int, required=True)
    rank_parser.add_argument("--init", required=True)
    rank_parser.add_argument("--out", type=Path)
    codecs_parser = sub.add_parser("_codecs", help=argparse.SUPPRESS)
    codecs_parser.add_argument("--workload", required=True, choices=list(WORKLOADS))
    codecs_parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--quick", action="store_true",
                        help=f"ResNet-50 + BERT-Base, 2 workers, regimes (a) and (b) only, protocol "
                             f"{QUICK_PROTOCOL.warmup} warm-up + {QUICK_PROTOCOL.repeats}×{QUICK_PROTOCOL.iters}")
    parser.add_argument("--models", nargs="+", choices=list(WORKLOADS))
    parser.add_argument("--mbits", nargs="+", type=float,
                        help="grid bandwidths for every model (default: 100 500 2000 Mbit/s for ResNet-50 and "
                             "BERT-Base, 500 2000 for ResNet-152 and BERT-Large, whose S-SGD at 100 Mbit/s "
                             "takes 20-45 s an iteration)")
    parser.add_argument("--four-workers", action=argparse.BooleanOptionalAction, default=None,
                        help="also ResNet-50 with 4 workers (full run default: on)")
    parser.add_argument("--ablations", action=argparse.BooleanOptionalAction, default=None,
                        help="fusion sweep, pipelining off, rank sweep (full run default: on)")
    parser.add_argument("--grid", action=argparse.BooleanOptionalAction, default=None,
                        help="the bandwidth grid (full run default: on)")
    parser.add_argument("--grid-models", nargs="+", choices=list(WORKLOADS),
                        help="models that get the bandwidth grid (default: every model of --models)")
    parser.add_argument("--ablation-models", nargs="+", choices=["resnet50", "bert-base"],
                        help="models that get the ablations (default: ResNet-50 and BERT-Base, if in --models)")
    parser.add_argument("--cell-budget-s", type=float, default=90.0,
                        help="predicted seconds above which a cell uses a shorter protocol (full run)")
    parser.add_argument("--cache-dir", type=Path, default=Path(tempfile.gettempdir()) / "gradwire-paper-cache",
                        help="finished cells are kept here and reused (delete it, or --no-cache, to re-measure)")
    parser.add_argument("--no-cache", action="store_true")
    parser.add_argument("--remeasure-disturbed", action="store_true",
                        help="measure cached configurations again if other processes disturbed them")
    parser.add_argument("--retries", type=int, help="re-measure a disturbed configuration up to this often "
                        "(default 1; 0 with --quick)")
    parser.add_argument("--quiet-wait-s", type=float,
                        help="before each measurement, wait up to this long for other processes to calm down "
                             "(default 120; 20 with --quick)")
    parser.add_argument("--max-other-cores", type=float, default=0.35,
                        help="CPU cores other processes may use during a measurement before it counts as disturbed")
    parser.add_argument("--json-out", type=Path, help="default benchmarks/results/paper.json (paper_quick.json with --quick)")
    args = parser.parse_args(argv)
    if args.cmd == "_rank":
        rank_main(_cell_from_json(args.cell), args.rank, args.world, args.init, args.out)
        return 0
    if args.cmd == "_codecs":
        codecs_main(args.workload, args.out)
        return 0
    return run_benchmark(args, argv)


def _cell_from_json(text: str) -> Cell:
    data = json.loads(text)
    data["protocol"] = Protocol(**data["protocol"])
    return Cell(**data)


def run_benchmark(args: argparse.Namespace, argv: list[str] | None) -> int:
    from benchmarks.testbed import Testbed
    from workers.models import parameter_shapes

    ok, why = Testbed.available()
    if not ok:
        print(f"testbed unavailable: {why}", file=sys.stderr)
        return 2
    quick = args.quick
    if args.retries is None:
        args.retries = 0 if quick else 1
    models = args.models or (["resnet50", "bert-base"] if quick else list(WORKLOADS))
    four = (not quick) if args.four_workers is None else args.four_workers
    ablations = (not quick) if args.ablations is None else args.ablations
    grid = (not quick) if args.grid is None else args.grid
    json_out = args.json_out or ROOT / "benchmarks/results" / ("paper_quick.json" if quick else "paper.json")
    cost_path = ROOT / "benchmarks/results/compressor_cost.json"
    cost = json.loads(cost_path.read_text()) if cost_path.exists() else None
    runner = Runner(None if args.no_cache else args.cache_dir, quiet_cores=args.max_other_cores,
                    quiet_wait_s=args.quiet_wait_s if args.quiet_wait_s is not None else (20.0 if quick else 120.0))
    runner.remeasure_disturbed = args.remeasure_disturbed
    started = time.monotonic()
    results: list[dict[str, Any]] = []
    ablation_rows: list[dict[str, Any]] = []
    calibration: dict[str, Any] = {}
    codecs: dict[str, dict[str, float]] = {}
    wake_s: dict[int, float] = {}
    regimes: dict[str, Any] = {}
    workloads: dict[str, Any] = {}
    shapes: dict[str, list[tuple[int, ...]]] = {}

    def measure(cell: Cell, into: list[dict[str, Any]], protocol: Protocol | None = None) -> dict[str, Any]:
        calib = calibration[f"{cell.workload}/{cell.workers}"]
        step = predicted_step_s(cell, calib, shapes[cell.workload], cost)
        cell = replace(cell, protocol=protocol or choose_protocol(step, args.cell_budget_s, quick))
        print(f"  run     {_cell_label(cell)} (predicted {step:.2f} s/iter)", flush=True)
        raw = runner.run(cell, timeout_s=300 + 4 * step * cell.protocol.steps, retries=args.retries,
                         max_other_cores=args.max_other_cores)
        row = summarize(cell, raw)
        row["predicted_plan_s"] = step
        into.append(row)
        print(f"          {row['iter_s']:.3f} ± {row['iter_ci_s']:.3f} s/iter, exposed {row['exposed_comm_s']:.3f} s, "
              f"{row['bytes_per_step'] / 1e6:.2f} MB/step, link {row['link_mbit_seen'] or 0:.0f} Mbit/s, "
              f"other load {row['other_cpu_cores']:.2f} cores", flush=True)
        return row

    try:
        # 1. Calibration: compute per model (and worker count) with nothing overlapping backward.
        worker_counts = {m: ([2, 4] if (four and m == "resnet50") else [2]) for m in models}
        for model in models:
            shapes[model] = [tuple(s) for s in parameter_shapes(WORKLOADS[model].model, **WORKLOADS[model].build_kwargs())]
            workloads[model] = _workload_info(model, 2, shapes[model])
            for n in worker_counts[model]:
                cell = Cell(model, "ssgd", n, CALIBRATION_MBIT, pipelining=False, protocol=CALIBRATION_PROTOCOL,
                            tag="calibration")
                print(f"calibrate {_cell_label(cell)}", flush=True)
                raw = runner.run(cell, timeout_s=900, retries=args.retries, max_other_cores=args.max_other_cores)
                calibration[f"{model}/{n}"] = calibration_entry(cell, raw)
                c = calibration[f"{model}/{n}"]
                unfused = replace(cell, bucket_cap_mb=FUSION_CAPS_MB[0])
                print(f"calibrate {_cell_label(unfused)}", flush=True)
                unfused_raw = runner.run(unfused, timeout_s=900, retries=args.retries, max_other_cores=args.max_other_cores)
                c["collective_cpu_s"] = collective_cpu_s(cell, raw, unfused, unfused_raw, shapes[model])
                print(f"          forward {c['forward_s']:.3f} s, backward {c['backward_s']:.3f} s, "
                      f"optimizer {c['optimizer_s']:.3f} s, host CPU per collective {c['collective_cpu_s'] * 1e3:.2f} ms",
                      flush=True)
            codecs[model] = runner.isolated_codecs(model)
            print(f"codecs {model} apart from communication: PowerSGD ({CODEC_BUCKET_CAP_MB:g} MB buckets) "
                  f"{codecs[model]['powersgd_s']:.3f} s, torch powerSGD_hook (one bucket) "
                  f"{codecs[model]['torch_powersgd_s']:.3f} s", flush=True)
            for n in worker_counts[model]:
                if n not in wake_s:
                    wake_s[n] = runner.wake_up_s(n)
                    print(f"link wake-up with {n} workers: {wake_s[n] * 1e3:.2f} ms", flush=True)
        # 2. Regimes, from measured compute and the byte formulas.
        for model in models:
            regimes[model] = regime_rates(WORKLOADS[model], calibration[f"{model}/2"], shapes[model], 2)
            print(f"regimes {model}: (a) {regimes[model]['a']:g} Mbit/s, (b) {regimes[model]['b']:g} Mbit/s", flush=True)
        # 3. Acceptance cells: all methods at (a); the PowerSGD family at (b). Cheapest first.
        accept_models = [m for m in ("resnet50", "bert-base") if m in models]
        for model in accept_models:
            # --quick: BERT-Base's slow compressors (Top-k, EF-SignSGD: seconds of CPU codec) and
            # its PowerSGD are left out at (a), to stay within minutes; ResNet-50 runs all six.
            methods_a = ("ssgd", "acpsgd") if (quick and model == "bert-base") else METHODS
            for method in methods_a:
                measure(Cell(model, method, 2, regimes[model]["a"], tag="regime-a"), results)
            for method in ("powersgd", "torch_powersgd", "acpsgd"):
                measure(Cell(model, method, 2, regimes[model]["b"], tag="regime-b"), results)
        # 4. The bandwidth grid (and 4 workers for ResNet-50).
        if grid:
            for model in [m for m in models if not args.grid_models or m in args.grid_models]:
                for mbit in args.mbits or GRID_MBITS[model]:
                    for method in METHODS:
                        measure(Cell(model, method, 2, float(mbit)), results)
            if four and "resnet50" in models:
                for method in METHODS:
                    measure(Cell("resnet50", method, 4, 500.0), results)
        # 5. Ablations at regime (b), where overlap and fusion matter most (S-SGD's pipelining
        #    at (a), where S-SGD is affordable); a shorter protocol: they show trends.
        if ablations:
            ablate = None if quick else ABLATION_PROTOCOL
            for model in [m for m in accept_models if not args.ablation_models or m in args.ablation_models]:
                mbit = regimes[model]["b"]
                for cap in FUSION_CAPS_MB:
                    for method in ("powersgd", "acpsgd"):
                        measure(Cell(model, method, 2, mbit, bucket_cap_mb=cap, tag="fusion"), ablation_rows, ablate)
                for method in ("powersgd", "acpsgd"):
                    measure(Cell(model, method, 2, mbit, pipelining=False, tag="pipelining"), ablation_rows, ablate)
                for pipelining in (True, False):
                    measure(Cell(model, "ssgd", 2, regimes[model]["a"], pipelining=pipelining, tag="pipelining"),
                            ablation_rows, ablate)
                for r in RANK_SWEEP[model]:
                    for method in ("powersgd", "acpsgd"):
                        measure(Cell(model, method, 2, mbit, rank=r, tag="rank"), ablation_rows, ablate)
    finally:
        runner.close()

    _add_codec_estimates(results + ablation_rows, codecs, cost)
    for model in models:
        if "resnet50" == model and four:
            workloads[model]["bytes_4_workers"] = {m: wire_bytes(m, shapes[model], WORKLOADS[model].rank, 4) for m in METHODS}
    accept = acceptance(results, calibration, workloads, ablation_rows)
    protocol_note = (
        f"quick: {QUICK_PROTOCOL.warmup} warm-up + {QUICK_PROTOCOL.repeats} × {QUICK_PROTOCOL.iters} iterations per "
        "configuration (fewer than the paper's 10 + 5 × 10, to finish in minutes)" if quick else
        f"the paper's {PAPER_PROTOCOL.warmup} warm-up + {PAPER_PROTOCOL.repeats} × {PAPER_PROTOCOL.iters} iterations, "
        f"except configurations predicted to take over {args.cell_budget_s:g} s, which use "
        + ", ".join(f"{p.warmup} + {p.repeats} × {p.iters}" for p in FALLBACK_PROTOCOLS)
        + f" (each row's `protocol` says which); ablations use {ABLATION_PROTOCOL.warmup} + "
        f"{ABLATION_PROTOCOL.repeats} × {ABLATION_PROTOCOL.iters}")
    protocol_note += "; iter s = mean of the block means, ± 1.96 σ of the block means; samples/s = batch × workers / iter s."
    doc = {
        "quick": quick,
        "command": "python benchmarks/paper.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "protocol_note": protocol_note,
        "results": results,
        "ablations": ablation_rows,
        "calibration": calibration,
        # Encode+decode apart from communication, in the runs' layouts (torch_powersgd's codec estimate).
        "codec_calibration": codecs,
        # The probe's wake-up cost of a collective on an idle link, by worker count
        # (planning.costmodel.Link.wake_s), measured at the calibration rate. The CPU cores
        # the ranks share (4 ranks on 2 run codecs at half speed): each run records its own
        # (`cpu_cores`); this machine's count stands in for runs cached before they did.
        "host": {"wake_s": {str(n): w for n, w in wake_s.items()}, "cpu_cores": len(os.sched_getaffinity(0))},
        "regimes": regimes,
        "workloads": workloads,
        "acceptance": accept,
        "wall_s": time.monotonic() - started,
        "notes": _notes(),
    }
    json_out.parent.mkdir(parents=True, exist_ok=True)
    json_out.write_text(json.dumps(doc, indent=2))
    stem = json_out.with_suffix("")
    write_markdown(stem.with_suffix(".md"), doc)
    plot_phases(Path(f"{stem}_phases.png"), results)
    plot_speedup(Path(f"{stem}_speedup.png"), results)
    if ablation_rows:
        plot_ablations(Path(f"{stem}_ablations.png"), ablation_rows)
    print(f"wrote {json_out} ({doc['wall_s'] / 60:.1f} min); acceptance: (a) {_pf(accept['a_pass'])}, "
          f"(b) {_pf(accept['b_pass'])}, (c) {_pf(accept['c_pass'])}")
    return 0


def _add_codec_estimates(rows: list[dict[str, Any]], codecs: Mapping[str, Mapping[str, float]],
                         cost: Mapping[str, Any] | None) -> None:
    """For torch_powersgd rows (whose codec cannot be separated from communication inside
    PyTorch's hook): our PowerSGD's codec measured in the runs on the same model × the
    torch/ours ratio measured apart from communication in the runs' layouts (``codecs``;
    compressor_cost.json's 25 MB-bucket ratio where a model has none). Other rows: their own
    measured codec."""
    for row in rows:
        row["codec_estimate_s"] = row["codec_s"]
        if row["method"] != "torch_powersgd":
            continue
        isolated = codecs.get(row["model"])
        same = [r for r in rows if r["model"] == row["model"] and r["method"] == "powersgd"
                and r["workers"] == row["workers"] and r.get("rank") == row.get("rank")]
        # The ratio is measured in the grid's layout: ours from runs in that layout, where any.
        in_layout = [r for r in same if r.get("pipelining", True)
                     and r["bucket_cap_mb"] == (isolated or {}).get("bucket_cap_mb", CODEC_BUCKET_CAP_MB)]
        ours = [r["codec_s"] for r in (in_layout or same)]
        ratio = 1.0
        ref = (cost or {}).get("bert-base" if row["model"].startswith("bert") else "resnet50", {})
        if isolated:
            ratio = isolated["torch_powersgd_s"] / isolated["powersgd_s"]
        elif ref.get("powersgd") and ref.get("torch_powersgd"):
            ratio = ref["torch_powersgd"]["encode_decode_s"] / ref["powersgd"]["encode_decode_s"]
        row["codec_ratio_to_powersgd"] = ratio
        row["codec_estimate_s"] = statistics.fmean(ours) * ratio if ours else 0.0


def _notes() -> list[str]:
    return [
        "torch_powersgd = PyTorch's powerSGD_hook (start_powerSGD_iter=2, error feedback, warm start, "
        "min_compression_rate=2) with ONE DDP bucket: on gloo the hook waits on its second all-reduce inside "
        "the first one's completion callback (a gloo worker thread), which deadlocks with several buckets in "
        "flight. So its compression and both rounds run after backward, unpipelined. `powersgd` is our "
        "pipelined PowerSGD (same algorithm and bytes) over 25 MB buckets.",
        "Every worker is a process with one CPU thread in its own network namespace; two workers share the "
        "machine's 2 cores, 4 workers share them two to a core (4-worker compute is ~2× slower).",
        "Links: tc tbf on veth pairs (2 workers) or through a bridge (4 workers); no added latency (the kernel "
        "has no netem), so α is a veth's ~0.1 ms. `link Mbit/s seen` is each run's own probe (gloo all-reduce of "
        "64 KiB and 4 MiB).",
        "Calibration per model: S-SGD with pipelining off on a 10 Gbit/s link, 3 + 1 × 4 iterations; backward "
        "compute = backward − exposed communication; gradient ready times per parameter feed the simulator.",
        "DDP runs with init_sync=False (every rank builds the same seeded weights, checked by an all-reduce of "
        "a checksum) so that no 440 MB initial broadcast crosses slow links; broadcast_buffers=False (the "
        "comparison is about gradients: ResNets' 0.2 MB of BatchNorm statistics before every forward would add "
        "the same constant to every method); gradient_as_bucket_view=True for every method (no copy of each "
        "bucket into .grad: ~5 % faster ACP-SGD steps on ResNet-50, S-SGD unchanged, measured).",
        "Exposed communication = time backward() waited after autograd handed over the last bucket "
        "(workers.timing.StepTimer), including the decode of buckets completing then.",
        "Top-k ratio 0.01; plain SGD (lr 0.01), fp32, synthetic data.",
    ]


if __name__ == "__main__":
    sys.exit(main())
