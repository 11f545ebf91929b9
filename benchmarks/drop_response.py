"""How the adaptive runs of the benchmark answered each drop of the link, from their kept files.

Why: a run's time to target mixes its response to the link with its own speed (a run's time
scatters ~8 % from process to process here) and the held-out set's noise, so four seeds cannot
show a change of a few steps at each drop. This reads what the response was, run by run, from
the benchmark's ``--keep`` directory: for each drop the workers read (``link_drops_read`` in the
run's summary), the reading rank 0 reported with it (the report whose ``link_drop_step`` names
it; reports from before session 45 carry none, so the first report after the read stands in)
and the step of the first switch after it; and over the run, the steps each label ran (rank 0's
own record of the compressor in force at every step) and how many of the link's slow steps ran
on ``none`` or a cast. The slow steps are those of the scenario's phases below its fastest rate,
read from the result file's schedule.

    python -m benchmarks.adaptive --keep DIR --json-out RESULT.json ...   # the runs, kept
    python -m benchmarks.drop_response RESULT.json DIR [--json-out OUT.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

from benchmarks.adaptive.scenarios import Phase, boundaries
from benchmarks.outputs import write_whole
from planning import registry
from planning.progress import compressor_of

#: Scenarios whose link changes: the only ones with drops to answer.
CHANGING = ("fast-slow-fast", "oscillating")


@dataclass
class DropAnswer:
    """One drop the workers read, and the policy's answer."""

    read_at: int
    reading_mbit: float | None  # rank 0's reading in the report that brought the read
    switched_at: int | None  # the first switch at or after the read (None: none)
    switched_to: str | None


@dataclass
class RunResponse:
    run: str
    drops: list[DropAnswer] = field(default_factory=list)
    #: Steps each label ran, from rank 0's record.
    steps_by_label: dict[str, int] = field(default_factory=dict)
    #: The link's slow steps that ran uncompressed (``none`` or a cast), and all its slow steps.
    uncompressed_slow_steps: int = 0
    slow_steps: int = 0


def slow_steps(phases: Sequence[Phase]) -> set[int]:
    """The steps (0-based, as rank 0's record numbers them) of the phases below the fastest rate."""
    fastest = max(phase.mbit for phase in phases)
    return {step for phase, end in zip(phases, boundaries(phases)) if phase.mbit < fastest
            for step in range(end - phase.steps, end)}


def run_response(run_dir: Path, slow: set[int]) -> RunResponse:
    """One kept adaptive run's answers to the drops it read, and its steps by label."""
    summary = json.loads((run_dir / "summary.json").read_text())
    reports = [json.loads(line) for line in (run_dir / "telemetry.jsonl").read_text().splitlines() if line.strip()]
    checkpoints = sorted((run_dir / "checkpoints").glob("checkpoint_*"))
    record = json.loads((checkpoints[-1] / "record0.json").read_text()) if checkpoints else {"step_compressors": {}}
    ran = {int(step): label for step, label in record["step_compressors"].items()}
    out = RunResponse(run=str(run_dir))
    for label in ran.values():
        out.steps_by_label[label] = out.steps_by_label.get(label, 0) + 1
    out.slow_steps = len(slow & ran.keys())
    out.uncompressed_slow_steps = sum(1 for step in slow if step in ran and not registry.is_lossy(compressor_of(ran[step])))
    for read in summary.get("link_drops_read") or []:
        bringing = [r for r in reports if r.get("link_drop_step") == read] or [r for r in reports if r["step"] > read]
        rate = bringing[0].get("bandwidth_bytes_per_second") if bringing else None
        after = [s for s in summary.get("switches", []) if s["step"] > read]
        out.drops.append(DropAnswer(read, None if rate is None else round(8 * rate / 1e6, 1),
                                    after[0]["step"] if after else None, after[0]["to"] if after else None))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.drop_response", description=__doc__.split("\n\n")[0])
    parser.add_argument("result", type=Path, help="the benchmark's result JSON (for the scenarios' schedules)")
    parser.add_argument("root", type=Path, help="the benchmark's --keep directory of the same run")
    parser.add_argument("--json-out", type=Path, default=None)
    args = parser.parse_args(argv)
    try:
        scenarios = json.loads(args.result.read_text())["scenarios"]
    except (OSError, ValueError, KeyError, TypeError) as error:
        print(f"{args.result}: not a benchmark result file: {error}", file=sys.stderr)
        return 2
    doc: dict[str, list[dict[str, Any]]] = {}
    for name in CHANGING:
        if name not in scenarios:
            continue
        slow = slow_steps([Phase(p["mbit"], p["steps"]) for p in scenarios[name]["schedule"]])
        runs = sorted((args.root / name).glob("seed*/adaptive-*"))
        responses = []
        for run_dir in runs:
            try:
                response = run_response(run_dir, slow)
            except (OSError, ValueError, KeyError) as error:
                print(f"{run_dir}: cannot read: {error}", file=sys.stderr)
                return 2
            response.run = str(run_dir.relative_to(args.root))
            responses.append(response)
            answers = ", ".join(f"read {d.read_at} at {d.reading_mbit} Mbit/s -> {d.switched_to} at {d.switched_at}"
                                for d in response.drops) or "no drop read"
            print(f"{response.run}: {answers}; uncompressed on {response.uncompressed_slow_steps} of "
                  f"{response.slow_steps} slow steps; steps {response.steps_by_label}")
        if responses:
            counts = [r.uncompressed_slow_steps for r in responses]
            print(f"{name}: {len(responses)} runs, uncompressed slow steps median {statistics.median(counts)} "
                  f"(range {min(counts)}-{max(counts)})")
        doc[name] = [asdict(r) for r in responses]
    if args.json_out is not None:
        write_whole(args.json_out, json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
