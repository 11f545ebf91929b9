"""Replay kept runs' telemetry through the adaptive controller, open loop.

Why: a change to the policy is cheapest to judge on what real runs reported. The benchmark
(``python -m benchmarks.adaptive ... --keep DIR``) keeps every run's reports
(``telemetry.jsonl``) and job configuration (``config.json``); this feeds each adaptive run's
reports, in order and at their own wall times, through ``planning.controller.AdaptiveController``
as the code stands, and prints what the policy would decide on them: every switch (time,
step, label, whether it was judged on the mix of an oscillating link), how many reports were
judged on a mix, the step-time corrections it ended with, and the controller's own time a
report (what rank 0 of a job without a coordinator pays between its steps). Open loop: the workers ran what
they ran, so a decision that differs from the run's changes nothing that follows; it shows
where the policy now disagrees with the run, not what a run would now measure. Every rule of
the oscillating-link mix (sessions 20-21) was checked this way first.

    python -m benchmarks.telemetry_replay DIR [--label adaptive] [--json-out FILE]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from benchmarks.outputs import write_whole
from planning.controller import AdaptiveController
from planning.protocol import Telemetry
from planning.sections import CompressionConfig
from planning.step_correction import residuals

MIX_MARK = "link oscillates"


@dataclass
class RunReplay:
    """What the controller decides on one kept run's reports."""

    run: str
    reports: int
    #: (step, label) at each change of the compressor the run's reports name.
    ran: list[tuple[int, str]] = field(default_factory=list)
    #: (seconds into the run, step, label, judged on a mix) of each switch the policy makes now.
    switches: list[tuple[float, int, str, bool]] = field(default_factory=list)
    judged_on_mix: int = 0
    #: Each label's latest step correction (at the level it last ran at).
    corrections: dict[str, float] = field(default_factory=dict)
    last_reason: str = ""
    #: The controller's own time a report (median, ms) and in all, against the run's wall time:
    #: rank 0 of a job without a coordinator pays it between its steps (``workers.control``).
    policy_ms_median: float = 0.0
    policy_s: float = 0.0
    run_s: float = 0.0


def replay_run(run_dir: Path) -> RunReplay:
    """Feed ``run_dir``'s reports through a fresh controller built from its job configuration."""
    config = json.loads((run_dir / "config.json").read_text())
    controller = AdaptiveController(CompressionConfig(**config["compression"]))
    lines = [line for line in (run_dir / "telemetry.jsonl").read_text().splitlines() if line.strip()]
    reports = [Telemetry.model_validate_json(line) for line in lines]
    out = RunReplay(run=str(run_dir), reports=len(reports))
    if not reports:
        return out
    started = reports[0].wall_time or 0.0
    costs: list[float] = []
    for index, report in enumerate(reports):
        running = report.running_spec()
        label = running.label if running is not None else "?"
        if index == 0 or out.ran[-1][1] != label:
            out.ran.append((report.step, label))
        now = (report.wall_time or started) - started
        began = time.perf_counter()
        decision = controller.observe(report, now)
        costs.append(time.perf_counter() - began)
        out.judged_on_mix += MIX_MARK in controller.last_reason
        if decision is not None:
            out.switches.append((round(now, 2), report.step, decision.spec.label, MIX_MARK in decision.reason))
            controller.follow(decision)
    out.corrections = {label: round(value, 5) for label, value in residuals(controller.state.corrections).items()}
    out.last_reason = controller.last_reason
    out.policy_ms_median = round(statistics.median(costs) * 1e3, 3)
    out.policy_s = round(math.fsum(costs), 4)
    out.run_s = round((reports[-1].wall_time or started) - started, 3)
    return out


def kept_runs(root: Path, label: str) -> list[Path]:
    """Every kept run of ``label`` under ``root`` (``<scenario>/<seed-repeat>/<label>-<n>/``,
    or ``root`` itself when it is one run)."""
    if (root / "telemetry.jsonl").is_file():
        return [root]
    return sorted(p.parent for p in root.glob(f"**/{label}-*/telemetry.jsonl"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.telemetry_replay", description=__doc__.split("\n\n")[0])
    parser.add_argument("root", type=Path, help="a benchmark --keep directory, or one run's directory")
    parser.add_argument("--label", default="adaptive", help="which runs to replay (default: adaptive)")
    parser.add_argument("--json-out", type=Path, default=None)
    args = parser.parse_args(argv)
    runs = kept_runs(args.root, args.label)
    if not runs:
        print(f"no kept {args.label} runs (config.json and telemetry.jsonl) under {args.root}", file=sys.stderr)
        return 2
    replays = []
    for run_dir in runs:
        try:
            replay = replay_run(run_dir)
        except (OSError, ValueError, KeyError) as error:
            print(f"{run_dir}: cannot replay: {error}", file=sys.stderr)
            return 2
        replay.run = str(run_dir.relative_to(args.root)) if run_dir != args.root else str(run_dir)
        replays.append(replay)
        print(f"{replay.run}: {replay.reports} reports, "
              f"{replay.judged_on_mix} judged on a mix")
        print(f"  ran:      {replay.ran}")
        print(f"  switches: {replay.switches}")
        if replay.corrections:
            print(f"  step corrections (s): {replay.corrections}")
        share = f", {replay.policy_s / replay.run_s:.1%} of the run's {replay.run_s:.1f} s" if replay.run_s > 0 else ""
        print(f"  policy:   {replay.policy_ms_median:.2f} ms a report (median), {replay.policy_s:.3f} s in all{share}")
    if args.json_out is not None:
        write_whole(args.json_out, json.dumps([asdict(r) for r in replays], indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
