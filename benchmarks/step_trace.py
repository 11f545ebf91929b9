"""Every rank's steps side by side, from the traces ``GRADWIRE_STEP_TRACE`` makes (``workers.step_trace``).

    GRADWIRE_STEP_TRACE=/tmp/steps python -m benchmarks.adaptive --scenario steady-slow ...
    python -m benchmarks.step_trace /tmp/steps --steps 50:299 --windows 0,1,4,10,50,300

Why: to say where one job's time goes against another's (an adaptive run against the fixed
choice it settles on), by rank, by phase and by stretch of steps, from the same runs the
benchmark judged. A run is a rank-0 trace and, for each other rank, the trace of that rank whose
first step started nearest to it; runs are grouped by label (``adaptive`` for an adaptive job,
else the compressor it ran). Each figure is the median over a label's runs of the run's mean
over ``--steps``, in milliseconds a step: the wall time between rank 0's step starts, the work
around the step and the timer's phases on each rank, and how much later than rank 0 each rank
started its steps (a negative lag: rank 0 is the late one, and its peers wait for it in the
collectives). ``--windows`` gives rank 0's wall seconds per stretch of steps, the start apart.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from workers.step_trace import AROUND_STEP


@dataclass(frozen=True)
class RankTrace:
    """One rank's trace file: the job's first line and its steps by number."""

    rank: int
    job: dict[str, Any]
    steps: dict[int, dict[str, Any]]

    @property
    def label(self) -> str:
        return "adaptive" if self.job.get("mode") == "adaptive" else str(self.job.get("compressor"))

    @property
    def first_start(self) -> float:
        return self.steps[min(self.steps)]["started"]


def load(folder: Path) -> list[RankTrace]:
    """Every trace file in ``folder`` that holds at least one step."""
    traces = []
    for path in sorted(folder.glob("rank*-*.jsonl")):
        lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        if len(lines) < 2:
            continue
        rank = int(path.name.removeprefix("rank").split("-")[0])
        traces.append(RankTrace(rank, lines[0], {line["step"]: line for line in lines[1:]}))
    if not traces:
        raise ValueError(f"folder: no step traces in {folder} (set GRADWIRE_STEP_TRACE to it for the runs)")
    return traces


def runs(traces: Sequence[RankTrace]) -> list[list[RankTrace]]:
    """Each rank-0 trace with, per other rank, the trace of the same job that started nearest to it."""
    out = []
    for first in (t for t in traces if t.rank == 0):
        peers = [min((t for t in traces if t.rank == rank and t.job == first.job),
                     key=lambda t: abs(t.first_start - first.first_start), default=None)
                 for rank in sorted({t.rank for t in traces} - {0})]
        out.append([first, *(p for p in peers if p is not None)])
    return out


def run_figures(run: Sequence[RankTrace], lo: int, hi: int) -> dict[str, float]:
    """One run's means over steps ``lo..hi-1`` (those every rank traced), in milliseconds."""
    steps = [s for s in range(lo, hi) if all(s in t.steps for t in run)]
    if len(steps) < 2:
        raise ValueError(f"steps: fewer than two steps in {lo}:{hi} in a run of {run[0].label}")
    first = run[0].steps
    figures = {"wall": (first[steps[-1]]["started"] - first[steps[0]]["started"]) / (len(steps) - 1) * 1e3}
    for trace in run:
        for key in AROUND_STEP:
            figures[f"r{trace.rank} {key}"] = statistics.fmean(trace.steps[s].get(key, 0.0) for s in steps) * 1e3
        for phase in trace.steps[steps[0]]["phases"]:
            figures[f"r{trace.rank} {phase}"] = statistics.fmean(trace.steps[s]["phases"][phase] for s in steps) * 1e3
        if trace.rank:
            figures[f"r{trace.rank} lag"] = statistics.median(trace.steps[s]["started"] - first[s]["started"] for s in steps) * 1e3
    return figures


def step_start(trace: RankTrace, step: int) -> float | None:
    """When ``step`` started; for the step after the last traced one, when the last one ended."""
    if step in trace.steps:
        return float(trace.steps[step]["started"])
    last = trace.steps.get(step - 1)
    if last is None or step - 1 != max(trace.steps):
        return None
    return float(last["started"]) + sum(last.get(key, 0.0) for key in AROUND_STEP)


def window_seconds(trace: RankTrace, edges: Sequence[int]) -> list[float | None]:
    """Wall seconds from the start of step ``a`` to that of step ``b`` for each pair of edges
    (the last edge may be the step count: the end of the last step)."""
    out: list[float | None] = []
    for a, b in zip(edges, edges[1:]):
        start, end = step_start(trace, a), step_start(trace, b)
        out.append(end - start if start is not None and end is not None else None)
    return out


def summary(traces: Sequence[RankTrace], lo: int, hi: int, edges: Sequence[int] = ()) -> str:
    """The markdown tables: per label, the median over its runs of each figure; then the windows."""
    by_label: dict[str, list[list[RankTrace]]] = defaultdict(list)
    for run in runs(traces):
        by_label[run[0].label].append(run)
    labels = sorted(by_label)
    figures = {label: [run_figures(run, lo, hi) for run in by_label[label]] for label in labels}
    keys = list(dict.fromkeys(k for label in labels for f in figures[label] for k in f))
    lines = [f"Steps {lo}..{hi - 1}, ms a step, median over runs (runs: "
             + ", ".join(f"{label} {len(by_label[label])}" for label in labels) + ")", "",
             "| figure | " + " | ".join(labels) + " |", "|---|" + "---:|" * len(labels)]
    for key in keys:
        cells = [statistics.median(values) if (values := [f[key] for f in figures[label] if key in f]) else None
                 for label in labels]
        lines.append(f"| {key} | " + " | ".join("-" if c is None else f"{c:.3f}" for c in cells) + " |")
    if len(edges) > 1:
        lines += ["", "Rank 0's wall seconds from step to step, median over runs", "",
                  "| label | " + " | ".join(f"{a}..{b}" for a, b in zip(edges, edges[1:])) + " |",
                  "|---|" + "---:|" * (len(edges) - 1)]
        for label in labels:
            rows = [window_seconds(run[0], edges) for run in by_label[label]]
            cells = [statistics.median(v) if (v := [x for r in rows if (x := r[i]) is not None]) else None
                     for i in range(len(edges) - 1)]
            lines.append(f"| {label} | " + " | ".join("-" if c is None else f"{c:.3f}" for c in cells) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.step_trace", description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path, help="the folder GRADWIRE_STEP_TRACE named")
    parser.add_argument("--steps", default="50:299", help="LO:HI, the steps to average (HI excluded)")
    parser.add_argument("--windows", default="", help="step edges for rank 0's wall time per stretch, e.g. 0,4,50,300")
    args = parser.parse_args(argv)
    try:
        lo, hi = (int(x) for x in args.steps.split(":"))
        edges = [int(x) for x in args.windows.split(",")] if args.windows else []
    except ValueError:
        parser.error(f"--steps takes LO:HI and --windows comma-separated steps, got {args.steps!r} and {args.windows!r}")
    try:
        print(summary(load(args.folder), lo, hi, edges))
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
