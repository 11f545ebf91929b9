"""Torch processes on the testbed's hosts: their environment, waiting for them, and a timed gloo all-reduce.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time
from dataclasses import dataclass
from typing import Sequence

from benchmarks.repo import module_command, repo_env
from benchmarks.testbed.bed import Testbed
from benchmarks.testbed.netns import TestbedError, kill_pids

# --------------------------------------------------------------------------- measuring with gloo


@dataclass(frozen=True)
class AllReduceMeasurement:
    """What a gloo all-reduce across the testbed saw.

    ``mbit_seen`` is the per-link rate implied by the ring model: each rank sends
    2(n-1)/n * nbytes per all-reduce, so rate = 2(n-1)/n * nbytes * 8 / seconds.
    """

    nbytes: int
    world_size: int
    seconds: list[float]
    mbit_set: float
    #: Mean time of the same all-reduce joined late by one rank after computing
    #: (``workers.probe.wake_up_seconds``); None unless ``wake_rounds`` were asked for.
    wake_up_s: float | None = None

    @property
    def wake_s(self) -> float:
        """What the probe reports as ``wake_s``: the late-joined all-reduce beyond the best
        aligned one (0 unless ``wake_rounds`` were asked for)."""
        return max(0.0, self.wake_up_s - min(self.seconds)) if self.wake_up_s is not None else 0.0

    @property
    def median_s(self) -> float:
        return statistics.median(self.seconds)

    @property
    def mbit_seen(self) -> float:
        n = self.world_size
        return 2 * (n - 1) / n * self.nbytes * 8 / self.median_s / 1e6


def worker_env(tb: Testbed, i: int) -> dict[str, str]:
    """Environment for a torch process on host i: gloo on the host's link, one thread."""
    return {"GLOO_SOCKET_IFNAME": tb.interface(i), "OMP_NUM_THREADS": "1"}


def measure_allreduce(
    tb: Testbed,
    nbytes: int = 8 << 20,
    iters: int = 3,
    *,
    port: int = 29500,
    timeout_s: float = 90.0,
    wake_rounds: int = 0,
) -> AllReduceMeasurement:
    """Run one torch process per host, all-reduce ``nbytes`` ``iters`` times, time it; then
    ``wake_rounds`` times as a training step meets it (the probe's wake-up rounds)."""
    init = f"tcp://{tb.address(0)}:{port}"
    procs = []
    for i in range(tb.hosts):
        argv = module_command("benchmarks.testbed", "_allreduce-worker",
                              "--rank", str(i), "--world", str(tb.hosts), "--init", init,
                              "--nbytes", str(nbytes), "--iters", str(iters), "--wake-rounds", str(wake_rounds))
        procs.append(tb.run(i, argv, env={**worker_env(tb, i), **repo_env()}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outputs = collect_outputs(procs, timeout_s)
    result = json.loads(outputs[0].strip().splitlines()[-1])
    return AllReduceMeasurement(nbytes=nbytes, world_size=tb.hosts, seconds=result["seconds"], mbit_set=tb.mbit,
                                wake_up_s=result.get("wake_up_s"))


def collect_outputs(procs: Sequence[subprocess.Popen], timeout_s: float) -> list[str]:
    """Wait for all processes; on a failure or timeout kill the rest and raise with stderr."""
    deadline = time.monotonic() + timeout_s
    outputs = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=max(0.1, deadline - time.monotonic()))
            if proc.returncode != 0:
                raise TestbedError(f"worker exited with {proc.returncode}: {err.strip()[-2000:]}")
            outputs.append(out)
    except subprocess.TimeoutExpired as exc:
        raise TestbedError(f"workers did not finish within {timeout_s:.0f} s") from exc
    finally:
        for proc in procs:
            if proc.poll() is None:
                kill_pids([proc.pid])
                proc.wait()
    return outputs


def allreduce_worker(args: argparse.Namespace) -> None:
    """One rank of :func:`measure_allreduce`: barrier, time one all-reduce, repeat."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=args.init, rank=args.rank, world_size=args.world,
                            timeout=timedelta(seconds=60))
    tensor = torch.ones(max(1, args.nbytes // 4), dtype=torch.float32)
    dist.all_reduce(tensor)  # warm-up: connections and buffers
    seconds = []
    for _ in range(args.iters):
        dist.barrier()
        start = time.perf_counter()
        dist.all_reduce(tensor)
        seconds.append(time.perf_counter() - start)
    wake = None
    if args.wake_rounds:
        from workers.probe import wake_up_seconds

        wake = wake_up_seconds(tensor, None, torch.device("cpu"), args.wake_rounds)
    dist.destroy_process_group()
    print(json.dumps({"rank": args.rank, "seconds": seconds, "wake_up_s": wake}))


