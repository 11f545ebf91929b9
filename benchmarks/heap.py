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


def trial(heap: str, between: str) -> dict[str, Any]:
    """One trial in this process (``_trial``): the median step before and after ``between``, in
    ms, and whether the heap was kept (a "kept" trial where glibc is not the C library fails)."""
    import torch

    from planning.config import TrainConfig
    from workers.calibration import calibrate_codecs, job_layout
    from workers.heap import keep_heap
    from workers.models import build_model

    kept = keep_heap() if heap == "kept" else False
    if heap == "kept" and not kept:
        raise SystemExit("keep_heap() changed nothing here (not glibc, or a value refused): no kept heap to time")
    torch.set_num_threads(1)  # as each of the benchmark's two ranks on two cores
    torch.manual_seed(0)
    cfg = TrainConfig.model_validate({"name": "heap", "model": "cnn", "dataset": "synthetic", "batch_size": 32,
                                      "steps": 1, "workers": 2, "bucket_cap_mb": 0.25,
                                      "compression": {"mode": "adaptive", "compressor": "none"}})
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
        calibrate_codecs(*job_layout(model, cfg), cfg, 2)
    return {"kept": kept, "before_ms": round(before, 3), "after_ms": round(median_step_ms(TIMED_STEPS), 3)}


def run_trial(heap: str, between: str, max_wait_quiet_s: float = 0.0, timeout_s: float = 600.0) -> dict[str, Any]:
    """A trial in a fresh process (once the CPUs went quiet, waiting at most ``max_wait_quiet_s``),
    with the foreign load it saw; raises with the child's error output if it failed."""
    wait_for_quiet(max_wait_quiet_s)
    record: dict[str, Any] = {"heap": heap, "between": between}
    with foreign_load(record):
        done = subprocess.run(module_command("benchmarks.heap", "_trial", heap, between), cwd=str(REPO_ROOT),
                              env={**os.environ, **repo_env()}, capture_output=True, text=True, timeout=timeout_s)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"heap trial {heap}/{between} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    record.update(json.loads(lines[-1]))
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
    """The summary as the markdown table the README quotes."""
    lines = ["| C heap | between the steps | trials | step before ms | step after ms | after / before | foreign cores (max) |",
             "|---|---|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['heap']} | {r['between']} | {r['trials']} | {r['before_ms']:.2f} | {r['after_ms']:.2f} | "
              f"{r['after_over_before']:.3f} | {r['foreign_cores_max']} |" for r in rows]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """The benchmark (or, as ``_trial HEAP BETWEEN``, one trial in this process)."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.heap", description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="trials of each kind (taking turns)")
    parser.add_argument("--max-wait-quiet-s", type=float, default=30.0,
                        help="before each trial, wait up to this long for other work to leave the CPUs")
    parser.add_argument("--json-out", type=Path, default=None)
    commands = parser.add_subparsers(dest="command")
    one = commands.add_parser("_trial", help=argparse.SUPPRESS)
    one.add_argument("heap", choices=HEAPS)
    one.add_argument("between", choices=BETWEEN)
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    if args.command == "_trial":
        print(json.dumps(trial(args.heap, args.between)))
        return 0
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    trials = []
    with bench_lock():
        for round_index in range(args.rounds):
            for heap, between in itertools.product(HEAPS, BETWEEN):
                trials.append(run_trial(heap, between, args.max_wait_quiet_s))
                print(f"[heap] round {round_index + 1}/{args.rounds}: {trials[-1]}", flush=True)
    rows = summarise(trials)
    text = table(rows)
    print(text)
    write_json_and_table(args.json_out, {"trials": trials, "summary": rows}, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
