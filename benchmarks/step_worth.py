"""What a step of each fixed choice is worth in uncompressed steps, measured on the adaptive
benchmark's kept runs, beside the price the progress model gives it.

Why: the adaptive policy prices a step of a choice that has run at ``δ = η``, its measured
update efficiency (``planning.progress``), so PowerSGD r4 at η ≈ 0.74 must be 1.35x faster than
``none`` to pay; yet on the benchmark its runs reach the target at ``none``'s evaluation (README,
session 40, item 2). This is the measure a better price must meet, per choice, with its scatter
over seeds, kept as a tool rather than a session's analysis.

How, per seed: the uncompressed curve is the median of the held-out losses of the seed's
uncompressed runs (the judged ``none`` run and the kept reference runs of ``none``: the same
initial weights and held-out set, other data orders), fitted as a quadratic of log loss in log
step from step ``FIT_FROM_STEP`` (it smooths the evaluations' scatter and reaches past the last
step for a run ahead of it). A run's held-out loss at each evaluation from ``--from-step`` on is
placed on that curve: ``s'``, the uncompressed step that reaches it; ``s' / s`` is the run's
worth at step ``s``, the median over its evaluations the run's. Per choice: the median and
quartiles over seeds, beside its η (the median of its reports' update efficiency from step
``ETA_FROM_STEP``). The measure's own scatter: each reference run judged the same way against
the curve of the seed's other uncompressed runs (``reference (left out)``); a choice whose worth
lies within that row's quartiles is not told apart from ``none`` by this measure.

The fixed runs train the same way in every scenario (the link sets only their wall time), so one
scenario's runs serve (``--scenario``, default ``steady-slow``). Evaluation only, on this
machine's CPU (about a minute a seed at 1024 samples beside CI in session 41; not timed alone).

    python -m benchmarks.adaptive --keep DIR --json-out RESULT.json ...   # the runs, kept
    python -m benchmarks.step_worth DIR [DIR ...] --samples 1024 --json-out benchmarks/results/step_worth.json
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from benchmarks.outputs import publish

#: The uncompressed curve is fitted from this step (the first evaluations fall too steeply for
#: a quadratic in log-log to follow them and the later ones).
FIT_FROM_STEP = 60
#: How far past the fitted runs' last step the curve is followed for a run ahead of them.
REACH = 2.0
#: A run's update efficiency is its reports' median from this step (the first steps are the
#: critical regime the policy guards anyway; ``benchmarks.quality_signal`` skips as many).
ETA_FROM_STEP = 100
#: The row of the measure's own scatter.
LEFT_OUT = "reference (left out)"

Curve = list[tuple[int, float]]


def median_curve(curves: Sequence[Curve]) -> Curve:
    """The median loss at each step every one of ``curves`` was evaluated at."""
    common = set.intersection(*(set(step for step, _ in curve) for curve in curves))
    by_step = [dict(curve) for curve in curves]
    return [(step, statistics.median(c[step] for c in by_step)) for step in sorted(common)]


def fit_log_log(curve: Curve, from_step: int = FIT_FROM_STEP) -> np.ndarray:
    """Coefficients of log loss as a quadratic in log step, fitted from ``from_step`` on; a
    ValueError when fewer than three evaluations (or a loss that is not positive) lie there."""
    points = [(step, loss) for step, loss in curve if step >= from_step]
    if len(points) < 3 or any(loss <= 0 for _, loss in points):
        raise ValueError(f"curve: needs three positive losses from step {from_step}, got {points!r}")
    steps, losses = zip(*points)
    return np.polyfit(np.log(steps), np.log(losses), 2)


def step_reaching(fit: np.ndarray, loss: float, first: float, last: float) -> float | None:
    """The least step in ``[first, last]`` at which the fitted curve falls to ``loss``, linearly
    interpolated in log step on a fine grid; None when it does not get that low there.

    Only the curve's falling part counts: a quadratic in log-log turns up past its minimum, and a
    loss below that minimum is not reached by the fitted run at any step."""
    grid = np.exp(np.linspace(math.log(first), math.log(last), 4000))
    values = np.exp(np.polyval(fit, np.log(grid)))
    if values[0] <= loss:
        return float(grid[0])
    below = np.nonzero(values <= loss)[0]
    if below.size == 0:
        return None
    i = int(below[0])
    x0, x1, y0, y1 = math.log(grid[i - 1]), math.log(grid[i]), values[i - 1], values[i]
    return float(math.exp(x0 + (x1 - x0) * (y0 - loss) / (y0 - y1)))


def run_worth(uncompressed: Sequence[Curve], run: Curve, from_step: int) -> float | None:
    """The median over ``run``'s evaluations from ``from_step`` on of ``s' / s``: the step at which
    the fitted median of ``uncompressed`` reaches the run's loss at step ``s``, over ``s``. None
    when no evaluation is placed (none from ``from_step``, or every one below the reach)."""
    fit = fit_log_log(median_curve(uncompressed))
    last = max(step for curve in uncompressed for step, _ in curve)
    ratios = []
    for step, loss in run:
        if step < from_step:
            continue
        reached = step_reaching(fit, loss, FIT_FROM_STEP / 2, REACH * last)
        if reached is not None:
            ratios.append(reached / step)
    return statistics.median(ratios) if ratios else None


def efficiency(telemetry: Path, from_step: int = ETA_FROM_STEP) -> float | None:
    """The median update efficiency η of a run's reports from ``from_step`` (None: none reported)."""
    values = []
    for line in telemetry.read_text().splitlines():
        if line.strip():
            report = json.loads(line)
            if report.get("step", 0) >= from_step and report.get("update_efficiency") is not None:
                values.append(float(report["update_efficiency"]))
    return statistics.median(values) if values else None


def kept_seeds(keep: Path, scenario: str) -> dict[int, dict[str, Path]]:
    """``{seed: {label: run directory}}`` of the fixed choices' runs of ``scenario`` under
    ``keep`` (the latest attempt of each; the adaptive run left out), with the seed's kept
    reference runs of ``none`` as ``reference-<order>``."""
    seeds: dict[int, dict[str, Path]] = {}
    for seed_dir in sorted((keep / scenario).glob("seed*-repeat0")):
        seed = int(seed_dir.name.removeprefix("seed").split("-")[0])
        runs: dict[str, Path] = {}
        attempts = sorted((*named, run) for run in seed_dir.iterdir()
                          if (named := _label_and_attempt(run.name)) and (run / "checkpoints").is_dir())
        for label, _, run in attempts:
            if label != "adaptive":
                runs[label] = run  # by attempt number: the latest is the last (attempt 10 after 9)
        for reference in sorted(keep.glob(f"reference/*steps/seed{seed}-order*/none-0")):
            runs["reference-" + reference.parent.name.split("-order")[1]] = reference
        if "none" in runs:
            seeds[seed] = runs
    return seeds


def _label_and_attempt(name: str) -> tuple[str, int] | None:
    """``("fp16", 1)`` of a kept run's directory ``fp16-1``; None for any other name."""
    label, _, attempt = name.rpartition("-")
    return (label, int(attempt)) if label and attempt.isdigit() else None


def seed_worths(curves: dict[str, Curve], from_step: int) -> dict[str, float | None]:
    """Each fixed choice's worth on one seed against the seed's uncompressed runs, and each
    reference's against the others (:data:`LEFT_OUT`, one entry per reference)."""
    uncompressed = {label: c for label, c in curves.items() if label == "none" or label.startswith("reference-")}
    out: dict[str, float | None] = {}
    for label, curve in curves.items():
        if label not in uncompressed:
            out[label] = run_worth(list(uncompressed.values()), curve, from_step)
        elif label.startswith("reference-") and len(uncompressed) > 2:
            others = [c for other, c in uncompressed.items() if other != label]
            out[f"{LEFT_OUT} {label.removeprefix('reference-')}"] = run_worth(others, curve, from_step)
    return out


def summarise(by_seed: dict[int, dict[str, float | None]], etas: dict[str, list[float]]) -> list[dict[str, Any]]:
    """One row per choice (and one for the references left out): its worth's median and
    quartiles over seeds, the seeds placed, and its η's median."""
    values: dict[str, list[float]] = {}
    for worths in by_seed.values():
        for label, worth in worths.items():
            key = LEFT_OUT if label.startswith(LEFT_OUT) else label
            if worth is not None:
                values.setdefault(key, []).append(worth)
    rows = []
    for label in sorted(values, key=lambda k: (k == LEFT_OUT, k)):
        v = sorted(values[label])
        quartiles = statistics.quantiles(v, n=4) if len(v) > 1 else [v[0], v[0], v[0]]
        eta = etas.get(label)
        rows.append({"label": label, "worth_median": round(statistics.median(v), 3),
                     "worth_quartiles": [round(quartiles[0], 3), round(quartiles[2], 3)], "placed": len(v),
                     "eta_median": round(statistics.median(eta), 3) if eta else None})
    return rows


def markdown(doc: dict[str, Any]) -> str:
    lines = [f"Step worth in uncompressed steps, {doc['samples']} held-out samples, evaluations from step "
             f"{doc['from_step']}, {len(doc['seeds'])} seeds ({doc['scenario']})", "",
             "| choice | worth (median over seeds) | quartiles | seeds placed | η (median): the policy's price δ |",
             "|---|---:|---:|---:|---:|"]
    for row in doc["rows"]:
        eta = "-" if row["eta_median"] is None else f"{row['eta_median']:.3f}"
        q = row["worth_quartiles"]
        lines.append(f"| {row['label']} | {row['worth_median']:.3f} | {q[0]:.3f}-{q[1]:.3f} | {row['placed']} | {eta} |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.step_worth", description=__doc__.split("\n\n")[0])
    parser.add_argument("keep", type=Path, nargs="+", help="--keep directories of benchmarks.adaptive")
    parser.add_argument("--scenario", default="steady-slow", help="whose fixed runs to judge (default: steady-slow)")
    parser.add_argument("--samples", type=int, default=1024, help="held-out samples (default: 1024)")
    parser.add_argument("--from-step", type=int, default=150, help="evaluations placed from this step (default: 150)")
    parser.add_argument("--json-out", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.samples < 1:
        parser.error("--samples: must be >= 1")
    if args.from_step < 1:
        parser.error("--from-step: must be >= 1")
    seeds: dict[int, dict[str, Path]] = {}
    for keep in args.keep:
        if not (keep / args.scenario).is_dir():
            print(f"{keep}: no kept runs of scenario {args.scenario!r} (not a --keep directory of benchmarks.adaptive?)",
                  file=sys.stderr)
            return 2
        seeds.update(kept_seeds(keep, args.scenario))
    if not seeds:
        print(f"no seed with a kept none run of {args.scenario!r} under {', '.join(map(str, args.keep))}", file=sys.stderr)
        return 2

    from benchmarks.adaptive.jobs import HeldOut
    from planning.config import TrainConfig

    by_seed: dict[int, dict[str, float | None]] = {}
    etas: dict[str, list[float]] = {}
    for seed, runs in sorted(seeds.items()):
        cfg = TrainConfig.model_validate_json((runs["none"] / "config.json").read_text())
        held_out = HeldOut(cfg, args.samples)
        curves = {label: held_out.curve(path / "checkpoints") for label, path in runs.items()}
        by_seed[seed] = seed_worths(curves, args.from_step)
        for label, path in runs.items():
            eta = efficiency(path / "telemetry.jsonl") if (path / "telemetry.jsonl").exists() else None
            if eta is not None and not label.startswith("reference-"):
                etas.setdefault(label, []).append(eta)
        shown = {k: None if v is None else round(v, 3) for k, v in by_seed[seed].items()}
        print(f"seed {seed}: {shown}", file=sys.stderr, flush=True)
    doc = {"scenario": args.scenario, "samples": args.samples, "from_step": args.from_step,
           "keep": [str(k) for k in args.keep], "seeds": sorted(seeds),
           "by_seed": {str(s): w for s, w in sorted(by_seed.items())}, "rows": summarise(by_seed, etas)}
    publish(args.json_out, doc, markdown(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
