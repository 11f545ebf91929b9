"""Measuring cells: testbeds per worker count, the ranks under the benchmark lock after a quiet-wait,
the foreign load of each attempt, retries of disturbed ones, and the cache of finished cells.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import subprocess
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable

from benchmarks.machine import ForeignLoad, bench_lock, wait_for_quiet
from benchmarks.paper.cells import CALIBRATION_MBIT, CODEC_BUCKET_CAP_MB, RETRY_PAUSE_S, WORKLOADS, Cell
from benchmarks.repo import module_command, repo_env
from benchmarks.testbed import Testbed, TestbedError, collect_outputs, measure_allreduce, worker_env


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
                wait_for_quiet(self.quiet_wait_s, self.quiet_cores, window_s=2.0)
                out = Path(tmp) / "codecs.json"
                subprocess.run(module_command("benchmarks.paper", "_codecs", "--workload", workload, "--out", str(out)),
                               env={**os.environ, **repo_env()}, check=True, timeout=900, stdout=subprocess.DEVNULL)
                return json.loads(out.read_text())

        return self._cached(f"codecs-{workload}-{key}.json", measure)

    def _attempt(self, cell: Cell, timeout_s: float) -> dict[str, Any]:
        self._port += 1
        with bench_lock() as waited, tempfile.TemporaryDirectory(prefix="gw-paper-") as tmp:
            quiet_wait, busy_before = wait_for_quiet(self.quiet_wait_s, self.quiet_cores, window_s=2.0)
            tb = self._testbed(cell.workers, cell.mbit)
            out = Path(tmp) / "rank0.json"
            init = f"tcp://{tb.address(0)}:{self._port}"
            meter = ForeignLoad()
            procs = [
                tb.run(i, module_command("benchmarks.paper", "_rank", "--cell", json.dumps(asdict(cell)), "--rank", str(i),
                                         "--world", str(cell.workers), "--init", init, "--out", str(out)),
                       env={**worker_env(tb, i), **repo_env()}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                for i in range(cell.workers)
            ]
            try:
                collect_outputs(procs, timeout_s)
            except TestbedError as exc:
                raise RuntimeError(f"{cell_label(cell)}: {exc}") from exc
            elapsed, other = meter.elapsed_s(), meter.cores()
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


def cell_label(cell: Cell) -> str:
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


