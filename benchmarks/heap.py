"""``python -m benchmarks.heap``: a training step's time on a CPU with the C heap's defaults and
with ``workers.heap.keep_heap``, before and after the adaptive job's codec calibration ran
between two steps (what ``workers.reporter`` does once the first steps are timed).

Each trial is a fresh process (the heap's state is the process's history): the benchmark's CNN
(batch 32, one thread), 20 warm-up steps, the median of 60 steps, then the work between steps
(none, or :func:`workers.calibration.calibrate_codecs` on the model's shapes), then the median
of 60 steps again. The four kinds of trial take turns, ``--rounds`` times, under the machine's
benchmark lock, each with the foreign load it saw.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from benchmarks.machine import bench_lock, foreign_load, wait_for_quiet
from benchmarks.outputs import write_json_and_table
from benchmarks.repo import REPO_ROOT, module_command, repo_env

HEAPS = ("default", "kept")
BETWEEN = ("nothing", "calibration")
WARMUP_STEPS = 20
TIMED_STEPS = 60


def trial(heap: str, between: str) -> dict[str, float]:
    """One trial in this process (``_trial``): the median step before and after ``between``, in ms."""
    import torch

    from planning.buckets import build_bucket_layout
    from planning.config import TrainConfig
    from workers.calibration import calibrate_codecs
    from workers.heap import keep_heap
    from workers.models import build_model

    if heap == "kept":
        keep_heap()
    torch.set_num_threads(1)  # as each of the benchmark's two ranks on two cores
    torch.manual_seed(0)
    cfg = TrainConfig(name="heap", model="cnn", dataset="synthetic", batch_size=32, steps=1, workers=2,
                      compression={"mode": "adaptive", "compressor": "none"}, bucket_cap_mb=0.25)
    model = build_model("cnn", num_classes=10)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    inputs, labels = torch.randn(32, 3, 32, 32), torch.randint(0, 10, (32,))

    def median_step_ms(steps: int) -> float:
        times = []
        for _ in range(steps):
            started = time.perf_counter()
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(inputs), labels).backward()
            optimizer.step()
            times.append(time.perf_counter() - started)
        return 1000 * statistics.median(times)

    median_step_ms(WARMUP_STEPS)
    before = median_step_ms(TIMED_STEPS)
    if between == "calibration":
        shapes = [tuple(p.shape) for p in model.parameters()]
        buckets = build_bucket_layout(shapes, cfg.compression.bucket_cap_mb * 2**20, first_bucket_bytes=None)
        calibrate_codecs(shapes, buckets, cfg, 2)
    return {"before_ms": round(before, 3), "after_ms": round(median_step_ms(TIMED_STEPS), 3)}


def run_trial(heap: str, between: str, max_wait_quiet_s: float = 0.0) -> dict[str, Any]:
    """A trial in a fresh process (once the CPUs went quiet, waiting at most ``max_wait_quiet_s``),
    with the foreign load it saw."""
    wait_for_quiet(max_wait_quiet_s)
    record: dict[str, Any] = {"heap": heap, "between": between}
    with foreign_load(record):
        done = subprocess.run(module_command("benchmarks.heap", "_trial", heap, between), cwd=str(REPO_ROOT),
                              env={**os.environ, **repo_env()}, capture_output=True, text=True, check=True)
    record.update(json.loads(done.stdout.strip().splitlines()[-1]))
    return record


def summarise(trials: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (heap, work between steps): the medians over trials of the step before and after, and their ratio."""
    kinds = {kind: [t for t in trials if (t["heap"], t["between"]) == kind] for kind in itertools.product(HEAPS, BETWEEN)}
    return [_row(heap, between, mine) for (heap, between), mine in kinds.items() if mine]


def _row(heap: str, between: str, trials: list[dict[str, Any]]) -> dict[str, Any]:
    before = statistics.median(t["before_ms"] for t in trials)
    after = statistics.median(t["after_ms"] for t in trials)
    return {"heap": heap, "between": between, "trials": len(trials), "before_ms": round(before, 2),
            "after_ms": round(after, 2), "after_over_before": round(after / before, 3),
            "foreign_cores_max": max(t["foreign_cores"] for t in trials)}


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| C heap | between the steps | trials | step before ms | step after ms | after / before | foreign cores (max) |",
             "|---|---|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['heap']} | {r['between']} | {r['trials']} | {r['before_ms']:.2f} | {r['after_ms']:.2f} | "
              f"{r['after_over_before']:.3f} | {r['foreign_cores_max']} |" for r in rows]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["_trial"]:
        print(json.dumps(trial(argv[1], argv[2])))
        return 0
    parser = argparse.ArgumentParser(prog="python -m benchmarks.heap", description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="trials of each kind (taking turns)")
    parser.add_argument("--max-wait-quiet-s", type=float, default=30.0,
                        help="before each trial, wait up to this long for other work to leave the CPUs")
    parser.add_argument("--json-out", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    trials = []
    with bench_lock():
        for round_index in range(args.rounds):
            for heap in HEAPS:
                for between in BETWEEN:
                    trials.append(run_trial(heap, between, args.max_wait_quiet_s))
                    print(f"[heap] round {round_index + 1}/{args.rounds}: {trials[-1]}", flush=True)
    rows = summarise(trials)
    text = table(rows)
    print(text)
    write_json_and_table(args.json_out, {"trials": trials, "summary": rows}, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
