"""Runs of the benchmark on other seeds judged together from the figures their result files
hold: in seconds, with nothing evaluated again.

Why: each run's time to target and its final are its own seed's (its target and uncompressed
final come from the seed's own runs, ``benchmarks.adaptive.targets``), so runs on other seeds
add up; only the medians over the seeds, the best fixed choice and the draws move. The rejudge
(``benchmarks.adaptive.rejudge --also``) judges the same way after evaluating every kept
checkpoint again (about 26 minutes for twelve seeds here), which other held-out sizes need; at
the benchmark's own size it reproduces the stored times (session 41: every run of seeds
32-43), so a verdict over more seeds does not need it.

    python -m benchmarks.adaptive --seeds 44 45 46 47 --json-out B.json ...   # another batch of seeds
    python -m benchmarks.adaptive.merge_seeds A.json B.json C.json --json-out MERGED.json

Per scenario: each label's ratio to the best fixed choice (paired by seed), its hit step and
final per seed, its final against uncompressed training's, the finals rule and the time rule on
the uncompressed runs (``uncompressed_floor``, ``uncompressed_time_floor``) and the seeds drawn
again (``seed_draws``); each label's worst ratio over the scenarios, and the share of draws in
which adaptive meets both of the issue's margins in every scenario at once
(``acceptance_draws``). The files must hold the same job (but its seeds), schedules, labels and
target rule, on seeds of their own (``benchmarks.adaptive.together``); the commit each file's
runs ran on is listed where the file records it.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path
from statistics import median_high
from typing import Any, Sequence

from benchmarks.adaptive.finals_floor import uncompressed_floor
from benchmarks.adaptive.intervals import acceptance_draws
from benchmarks.adaptive.pairing import entry_of
from benchmarks.adaptive.report import floors_and_draws
from benchmarks.adaptive.results import scenario_verdict, worst_ratios
from benchmarks.adaptive.scenarios import ADAPTIVE
from benchmarks.adaptive.targets import FINAL_MARGIN, RATIO_MARGIN, final_against, uncompressed_finals
from benchmarks.adaptive.time_floor import uncompressed_time_floor
from benchmarks.adaptive.together import check_together
from benchmarks.outputs import publish


def merged_scenario(name: str, docs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Scenario ``name`` of several result files (checked by :func:`check_together`) judged as
    one: every label's runs over all the seeds, each with its final against its seed's
    uncompressed final (the median of the seed's ``none`` runs and references, as the benchmark
    sets it), the verdict over them and the finals and time rules on the uncompressed runs."""
    scenarios = [doc["scenarios"][name] for doc in docs]
    labels = list(scenarios[0]["runs"])
    runs = {label: [dict(stored) for s in scenarios for stored in s["runs"][label].get("repeats") or [s["runs"][label]]]
            for label in labels}
    references = [reference for s in scenarios for reference in s.get("references") or []]
    finals = uncompressed_finals(runs["none"], references)
    for label, repeats in runs.items():
        for run in repeats:
            if run.get("seed") not in finals:
                raise ValueError(f"{name}: seed {run.get('seed')} of {label} has no uncompressed run to set its final")
            run["final_vs_none"] = final_against(run["final_eval"], finals[run.get("seed")])
    entries = {label: {**entry_of(repeats), "final_vs_none": median_high(r["final_vs_none"] for r in repeats)}
               for label, repeats in runs.items()}
    targets = {str(seed): target for s in scenarios for seed, target in (s.get("targets_by_seed") or {}).items()}
    return {"schedule_text": scenarios[0]["schedule_text"], "target_from": scenarios[0].get("target_from"),
            "seeds": list(dict.fromkeys(run.get("seed") for run in runs["none"])), "targets_by_seed": targets,
            "verdict": scenario_verdict(entries),
            "uncompressed_floor": uncompressed_floor(runs["none"], references) if references else None,
            "uncompressed_time_floor": uncompressed_time_floor(references),
            "runs": {label: {"repeats": repeats} for label, repeats in runs.items()}}


def markdown(doc: dict[str, Any]) -> str:
    """One table per scenario (ratio, hit step by seed, final vs none), the rules on the
    uncompressed runs and the seeds drawn again under it; each label's worst ratio, the draws of
    the acceptance as a whole, the commits."""
    lines: list[str] = []
    for name, scenario in doc["scenarios"].items():
        verdict = scenario["verdict"]
        lines += [f"**{name}** (`{scenario['schedule_text']}`; seeds {', '.join(map(str, scenario['seeds']))}; targets from "
                  f"{scenario['target_from'] or 'the judged none runs'}; best fixed: {verdict['best_fixed']})", "",
                  "| run | ratio to best fixed | hit step by seed | final vs none |", "|---|---:|---|---:|"]
        for label, entry in scenario["runs"].items():
            ratio = verdict["ratio_to_best"][label]
            hits = ",".join("-" if r.get("hit_step") is None else str(r["hit_step"]) for r in entry["repeats"])
            lines.append(f"| {label} | {'miss' if ratio is None else f'{ratio:.3f}'} | {hits} | "
                         f"{verdict['final_eval_vs_none'][label]:+.1%} |")
        lines.append("")
        lines += floors_and_draws(scenario, verdict)
    worst = ", ".join(f"{label} {'miss' if r is None else f'{r:.3f}'}" for label, r in doc["worst_ratio"].items())
    lines.append(f"Worst ratio over the scenarios: {worst}")
    together = doc.get("acceptance_draws")
    if together:
        line = (f"In the {together['draws']} draws of the seeds, {together['label']} is within {RATIO_MARGIN:g}x the best "
                f"fixed choice in all {together['scenarios']} scenarios at once in {together['time']:.0%}")
        if "finals" in together:
            line += (f", its final within {FINAL_MARGIN:+.0%} of uncompressed in all of them in {together['finals']:.0%}, "
                     f"both in {together['both']:.0%}")
        lines.append(line + ".")
    recorded = list(doc.get("commits", {}).values())
    if any(recorded):
        counts = Counter(recorded)  # in the files' order
        listed = ", ".join(f"{commit or 'not recorded'} ({n} file{'s' if n > 1 else ''})" for commit, n in counts.items())
        lines.append(f"Commits the files' runs ran on: {listed}"
                     + (" (several: judged as one only where their policies decide alike)" if len(counts) > 1 else "") + ".")
    return "\n".join([*lines, ""])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.adaptive.merge_seeds", description=__doc__.split("\n\n")[0])
    parser.add_argument("results", type=Path, nargs="+", help="the benchmark's --json-out files, each on seeds of its own")
    parser.add_argument("--scenario", action="append", default=None, help="only these scenarios (default: every one of the first)")
    parser.add_argument("--json-out", type=Path, default=None)
    args = parser.parse_args(argv)
    files: list[tuple[Path, dict[str, Any]]] = []
    for path in args.results:
        try:
            doc = json.loads(path.read_text())
            if not isinstance(doc, dict) or not isinstance(doc.get("scenarios"), dict):
                raise ValueError("no \"scenarios\" object")
        except (OSError, ValueError) as exc:
            print(f"cannot read {path} as a result of benchmarks.adaptive: {exc}", file=sys.stderr)
            return 2
        files.append((path, doc))
    names = args.scenario or list(files[0][1]["scenarios"])
    if not names:
        print(f"{args.results[0]} holds no scenario to judge", file=sys.stderr)
        return 2
    try:
        check_together(names, files)
        doc = merged(names, files)
        table = markdown(doc)
    except KeyError as exc:
        print(f"cannot judge the files together: a stored scenario or run has no field {exc}", file=sys.stderr)
        return 2
    except (ValueError, TypeError, AttributeError, ZeroDivisionError) as exc:
        print(f"cannot judge the files together: {exc}", file=sys.stderr)
        return 2
    try:
        publish(args.json_out, doc, table)
    except OSError as exc:
        print(f"--json-out: cannot write {args.json_out}: {exc}", file=sys.stderr)
        return 2
    return 0


def merged(names: Sequence[str], files: Sequence[tuple[Path, dict[str, Any]]]) -> dict[str, Any]:
    """The whole judgement of ``names`` over the ``files`` (checked by :func:`check_together`):
    each scenario merged, each label's worst ratio, the draws of the acceptance as a whole, and
    the commit each file's runs ran on where it says."""
    scenarios = {name: merged_scenario(name, [doc for _, doc in files]) for name in names}
    return {"results": [str(path) for path, _ in files],
            "commits": {str(path): doc.get("job", {}).get("commit") for path, doc in files},
            "scenarios": scenarios, "worst_ratio": worst_ratios(s["verdict"] for s in scenarios.values()),
            "acceptance_draws": acceptance_draws([s["runs"] for s in scenarios.values()], ADAPTIVE)}


if __name__ == "__main__":
    raise SystemExit(main())
