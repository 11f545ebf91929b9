"""Judge kept runs of the adaptive benchmark again on larger held-out sets.

Why: the verdict's resolution. Near the target every run's held-out curve scatters (0.01-0.05
between evaluations, about a trend that falls ~0.005 over the last 30 steps), so which
evaluation first lies at or below ``none``'s value at 90 % of the steps is decided by the
scatter as much as by the compressor. Part of that scatter is the held-out sample (the
benchmark evaluates 512); the rest is the trajectory itself (the weights differ from run to
run). This re-evaluates every kept checkpoint on the first N samples of the same split for
several N (the synthetic split is drawn sample by sample, so 512 of 4096 are the benchmark's
512), with each run's wall times from its kept telemetry, and judges each N by the benchmark's
own rules (``benchmarks.adaptive.targets`` and ``.results``): which share of the scatter a larger set removes,
and how the per-seed hits and the ratios move with it.

    python -m benchmarks.adaptive --keep DIR --json-out RESULT.json ...   # the runs, kept
    python -m benchmarks.adaptive.rejudge RESULT.json DIR --samples 512 1024 2048 4096 --json-out OUT.json

With kept reference runs of ``none`` (``--references``; the benchmark keeps its own under
``DIR/reference``) each N is judged a second time, against the references' targets
(``against_reference``). ``--also RESULT2 DIR2`` (repeatable) adds another run of the benchmark on
other seeds: each scenario's runs of both are judged together, as one run on all the seeds would be.

    python -m benchmarks.adaptive.rejudge RESULT.json DIR --also RESULT2.json DIR2 --samples 512 --json-out OUT.json

Per N and scenario: the best fixed choice, each label's ratio to it, each label's hit step per
seed, each label's final against ``none``'s, and the scatter of each seed's ``none`` curve about a
quadratic trend over steps 150-300 (``none_scatter``); each label's worst ratio over the scenarios
(``worst_ratio``). At the benchmark's own N the judgement the files were judged by must reproduce
them (``reproduces``, on that judgement's row: every run's time to target as stored).
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from benchmarks.adaptive.finals_floor import uncompressed_floor
from benchmarks.adaptive.jobs import HeldOut, JobRun
from benchmarks.adaptive.report import floor_line, seed_draws_table
from benchmarks.adaptive.results import combine_repeats, eval_points, scenario_verdict, worst_ratios
from benchmarks.adaptive.scenarios import HELD_OUT_SAMPLES, parse_schedule
from benchmarks.adaptive.targets import judge_by_seed
from benchmarks.adaptive.time_floor import time_floor_line, uncompressed_time_floor
from benchmarks.adaptive.together import check_together, seeds_of
from benchmarks.outputs import write_whole
from planning.config import TrainConfig

#: The steps over which a ``none`` curve's scatter is measured (the target lies within them).
SCATTER_FROM_STEP = 150


def kept_run(keep: Path, scenario: str, seed: Any, repeat_index: int, label: str, total_s: float) -> tuple[Path, JobRun]:
    """The kept directory of one run, ``DIR/<scenario>/seed<S>-repeat<R>/<label>-<attempt>``, and
    its reports; of a run repeated for foreign load, the attempt whose reports span the stored
    total time."""
    attempts = sorted((keep / scenario / f"seed{seed}-repeat{repeat_index}").glob(f"{label}-[0-9]*"))
    if not attempts:
        raise FileNotFoundError(f"no kept run of {label} in {keep / scenario / f'seed{seed}-repeat{repeat_index}'}")
    runs = [(path, _job_run(path, label)) for path in attempts]
    return min(runs, key=lambda pair: abs(_span_s(pair[1]) - total_s))


def _span_s(run: JobRun) -> float:
    """Wall seconds from the end of step 1 to the last report (a run's ``total_s``)."""
    return run.wall_at(run.reports[-1]["step"]) - run.wall_at(1)


def _job_run(path: Path, label: str) -> JobRun:
    reports = [json.loads(line) for line in (path / "telemetry.jsonl").read_text().splitlines() if line.strip()]
    if not reports:
        raise ValueError(f"{path}: no reports in telemetry.jsonl")
    return JobRun(label=label, reports=reports, summary={})


def evaluate(path: Path, run: JobRun, sizes: Sequence[int], held_out: HeldOut) -> dict[int, list[list[float]]]:
    """``{N: [[step, wall_s, held-out loss on the first N samples], ...]}`` of one kept run,
    as the benchmark writes a run's ``eval`` (:func:`benchmarks.adaptive.results.eval_points`)."""
    return {n: eval_points(run, curve) for n, curve in held_out.prefix_curves(path / "checkpoints", sizes).items()}


def none_scatter(curve: Sequence[Sequence[float]]) -> float | None:
    """The standard deviation of a curve's losses about a quadratic trend in the step, over
    steps from :data:`SCATTER_FROM_STEP` (None with fewer than five points there)."""
    import numpy as np

    points = [(step, loss) for step, _, loss in curve if step >= SCATTER_FROM_STEP]
    if len(points) < 5:
        return None
    steps, losses = np.array(points).T
    residual = losses - np.polyval(np.polyfit(steps, losses, 2), steps)
    return round(float(residual.std(ddof=3)), 4)


def _reference_dirs(references: Path, steps: int) -> list[tuple[int, Path]]:
    """(seed, directory) of each kept reference run with ``steps`` steps."""
    return [(int(path.parent.name.removeprefix("seed").split("-order")[0]), path)
            for path in sorted((references / f"{steps}steps").glob("seed*-order*/none-0"))]


def kept_references(references: Path, steps: int) -> list[tuple[Any, Path, JobRun]]:
    """The kept reference runs of ``none`` with ``steps`` steps (``benchmarks.adaptive.cli.run_references``:
    ``DIR/<steps>steps/seed<S>-order<K>/none-0``) as (seed, directory, reports)."""
    return [(seed, path, _job_run(path, "none")) for seed, path in _reference_dirs(references, steps)]


@dataclass(frozen=True)
class Source:
    """One run of the benchmark: its result file (scenarios and job), the directory it kept its
    runs in, and its kept reference runs of ``none`` (None: judged against ``none``'s own
    targets only)."""

    result: Path
    doc: dict[str, Any]
    keep: Path
    references: Path | None

    @property
    def scenarios(self) -> dict[str, Any]:
        return self.doc["scenarios"]  # type: ignore[no-any-return]


def check_sources(names: Sequence[str], sources: Sequence[Source]) -> None:
    """Runs from several sources are judged together only where every source kept every one of
    ``names``, their result files can be judged together (``together.check_together``: the
    same job but its seeds, schedule and labels, on seeds of their own; the target rule may
    differ, as every run is judged anew) and either every source or none kept references of
    each of its seeds. A ValueError naming the files if not, before anything is evaluated (a
    rejudge takes minutes)."""
    for name in names:
        for source in sources:
            if name in source.scenarios and not (source.keep / name).is_dir():
                raise ValueError(f"{name}: not kept in {source.result} (under {source.keep}); "
                                 "name the scenarios every run kept with --scenario")
    check_together(names, [(source.result, source.doc) for source in sources], same_targets=False)  # each run judged anew
    first = sources[0]
    for name in names:
        for source in sources:
            scenario = source.scenarios[name]
            seeds = seeds_of(scenario)
            steps = sum(p.steps for p in parse_schedule(scenario["schedule_text"]))
            kept = {seed for seed, _ in _reference_dirs(source.references, steps)} if source.references else set()
            if (source.references is None) != (first.references is None) or (source.references and not seeds <= kept):
                raise ValueError(f"{name}: kept references of seeds {sorted(kept)} for {source.result}, of its seeds "
                                 f"{sorted(seeds)} (every seed of every run needs them, or none does)")


def rejudge_scenario(name: str, sources: Sequence[Source], sizes: Sequence[int],
                     evaluated: dict[Path, dict[int, list[list[float]]]] | None = None) -> dict[str, Any]:
    """Every kept run of scenario ``name`` in the ``sources`` (checked by :func:`check_sources`),
    evaluated at each of ``sizes`` and judged together per size against ``none``'s own targets
    and, where the sources kept reference runs, against theirs (``against_reference``).
    ``evaluated``: reference curves already evaluated, by directory (every scenario of a step
    count shares its references).

    Several sources: runs of the same scenario on other seeds, in the order given (give them
    in the order of their seeds to match one run's order). Each seed's target and uncompressed
    final come from its own runs, so a run's figures do not change; only the medians over seeds
    do. Why: eight seeds know a median final to about ±1 %, the criterion's own margin, and a
    later run on fresh seeds adds to an earlier one instead of replacing it."""
    evaluated = {} if evaluated is None else evaluated
    phases = parse_schedule(sources[0].scenarios[name]["schedule_text"])
    steps = sum(p.steps for p in phases)
    held_outs: dict[Any, HeldOut] = {}

    def held_out(seed: Any, path: Path) -> HeldOut:
        if seed not in held_outs:
            cfg = TrainConfig.model_validate(json.loads((path / "config.json").read_text()))
            held_outs[seed] = HeldOut(cfg, max(sizes))
        return held_outs[seed]

    runs: dict[str, list[tuple[dict[str, Any], dict[int, list[list[float]]]]]] = {}
    reference_curves: list[tuple[Any, dict[int, list[list[float]]]]] = []
    for source in sources:
        for label, entry in source.scenarios[name]["runs"].items():
            runs.setdefault(label, [])
            seen: dict[Any, int] = {}
            for stored in entry.get("repeats") or [entry]:
                seed = stored.get("seed")
                index = seen[seed] = seen.get(seed, -1) + 1
                path, run = kept_run(source.keep, name, seed, index, label, stored["total_s"])
                runs[label].append((stored, evaluate(path, run, sizes, held_out(seed, path))))
                print(f"[rejudge] {name} {label} seed {seed} run {index + 1}: {path}", flush=True)
        judged_seeds = seeds_of(source.scenarios[name])
        for seed, path, run in kept_references(source.references, steps) if source.references else []:
            if seed in judged_seeds:
                if path not in evaluated:
                    evaluated[path] = evaluate(path, run, sizes, held_out(seed, path))
                    print(f"[rejudge] reference seed {seed}: {path}", flush=True)
                reference_curves.append((seed, evaluated[path]))
    targets_from = {source.scenarios[name].get("target_from") == "reference none runs" for source in sources}
    by_size: dict[str, Any] = {}
    for n in sizes:
        own, judged = judgement(runs, n, phases, ())
        by_size[str(n)] = own
        against = None
        if reference_curves:
            references = [{"seed": seed, "eval": curves[n], "final_eval": curves[n][-1][2]} for seed, curves in reference_curves]
            own["against_reference"], against = judgement(runs, n, phases, references)
        if n == HELD_OUT_SAMPLES and len(targets_from) == 1:  # files judged by different rules: no one check
            matching, row = (against, own.get("against_reference")) if targets_from == {True} else (judged, own)
            if matching is not None and row is not None:  # on the row of the judgement the files were judged by
                stored_times = [r["time_to_target_s"] for label in runs for r, _ in runs[label]]
                new_times = [r["time_to_target_s"] for label in matching for r in matching[label]]
                row["reproduces"] = all(_same_time(a, b) for a, b in zip(stored_times, new_times))
    return by_size


def judgement(runs: dict[str, list[tuple[dict[str, Any], dict[int, list[list[float]]]]]], n: int,
              phases: Sequence[Any], references: Sequence[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, list[dict[str, Any]]]]:
    """The runs on ``n`` held-out samples judged against the ``references`` (none: ``none``'s own)
    by the benchmark's rules: the figures a size's row shows, and the judged runs."""
    judged: dict[str, list[dict[str, Any]]] = {}
    for label, pairs in runs.items():
        judged[label] = []
        for stored, curves in pairs:
            result = {**copy.deepcopy(stored), "eval": curves[n], "final_eval": curves[n][-1][2]}
            result["switches"] = stored["switches"] if isinstance(stored.get("switches"), list) else []
            judged[label].append(result)
    used = judge_by_seed(judged, phases, references)
    entries = {label: combine_repeats(results) for label, results in judged.items()}
    verdict = scenario_verdict(entries)
    steps = sum(p.steps for p in phases)
    floor = {"uncompressed_floor": uncompressed_floor(judged["none"], references),
             "uncompressed_time_floor": uncompressed_time_floor([{**r, "steps": steps} for r in references])} if references else {}
    return {**floor,
        "targets_by_seed": {str(seed): round(t, 5) for seed, t in used.items()},
        "best_fixed": verdict["best_fixed"], "ratio_to_best": verdict["ratio_to_best"],
        "final_vs_none": verdict["final_eval_vs_none"],
        "hit_steps": {label: {str(r["seed"]): r["hit_step"] for r in results} for label, results in judged.items()},
        "times_by_seed": {label: {str(r["seed"]): r["time_to_target_s"] for r in results} for label, results in judged.items()},
        "finals_by_seed": {label: {str(r["seed"]): r["final_vs_none"] for r in results} for label, results in judged.items()},
        **({"seed_draws": verdict["seed_draws"]} if "seed_draws" in verdict else {}),
        "none_scatter": {str(r["seed"]): none_scatter(r["eval"]) for r in judged.get("none", [])},
    }, judged


def _same_time(stored: float | None, now: float | None) -> bool:
    if stored is None or now is None:
        return stored is None and now is None
    return math.isclose(stored, now, abs_tol=2e-3)


def markdown(doc: dict[str, Any]) -> str:
    """One table per scenario and target: a row per held-out size."""
    lines: list[str] = []
    for name, by_size in doc["scenarios"].items():
        lines += _table(f"**{name}**, against `none`'s own targets", by_size)
        against = {n: row["against_reference"] for n, row in by_size.items() if "against_reference" in row}
        if against:
            lines += _table(f"**{name}**, against the reference runs' targets", against)
            lines += [f"{n} held-out samples: {floor_line(row['uncompressed_floor'])}"
                      for n, row in against.items() if row.get("uncompressed_floor")] + [""]
            lines += [f"{n} held-out samples: {time_floor_line(row['uncompressed_time_floor'])}"
                      for n, row in against.items() if row.get("uncompressed_time_floor")] + [""]
        for title, rows in (("`none`'s own targets", by_size), ("the reference runs' targets", against)):
            for n, row in rows.items():
                if row.get("seed_draws"):
                    lines += [f"{n} held-out samples, against {title}:", "", *seed_draws_table(row["seed_draws"])]
    for n, worst in doc.get("worst_ratio", {}).items():
        for key, title in (("against_reference", "against the reference runs' targets"), ("own", "against `none`'s own targets")):
            if key in worst:
                ratios = ", ".join(f"{label} {'miss' if r is None else f'{r:.3f}'}" for label, r in worst[key].items())
                lines.append(f"Worst ratio over the scenarios, {n} held-out samples, {title}: {ratios}")
        lines.append("")
    return "\n".join(lines)


def _table(title: str, by_size: dict[str, Any]) -> list[str]:
    """The rows of one scenario's judgement by held-out size, under ``title``."""
    lines: list[str] = []
    labels = list(next(iter(by_size.values()))["ratio_to_best"])
    lines += [title, "",
              "| held-out samples | best fixed | " + " | ".join(f"{label}: ratio / hits by seed / final" for label in labels)
              + " | `none`'s scatter (median over seeds) |",
              "|---:|---|" + "---|" * len(labels) + "---:|"]
    for n, row in by_size.items():
        cells = []
        for label in labels:
            ratio = row["ratio_to_best"][label]
            hits = ",".join("-" if h is None else str(h) for h in row["hit_steps"][label].values())
            cells.append(f"{'miss' if ratio is None else f'{ratio:.3f}'} / {hits} / {row['final_vs_none'][label]:+.1%}")
        scatter = [s for s in row["none_scatter"].values() if s is not None]
        mark = {True: " (reproduces the result file)", False: " (does NOT reproduce the result file)"}.get(row.get("reproduces"), "")
        lines.append(f"| {n}{mark} | {row['best_fixed']} | " + " | ".join(cells)
                     + f" | {round(statistics.median(scatter), 4) if scatter else '-'} |")
    lines.append("")
    return lines


def read_source(result: Path, keep: Path, references: Path | None = None) -> Source:
    """A run of the benchmark to judge again: ``references`` default to ``KEEP/reference`` where
    it exists. OSError or ValueError where the result is not one of the benchmark's."""
    if references is None and (keep / "reference").is_dir():
        references = keep / "reference"
    doc = json.loads(result.read_text())
    if not isinstance(doc, dict) or not isinstance(doc.get("scenarios"), dict):
        raise ValueError("no \"scenarios\" object")
    return Source(result=result, doc=doc, keep=keep, references=references)


def worst_by_size(scenarios: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Each label's worst ratio over the scenarios, per held-out size: against ``none``'s own
    targets and, where every scenario was judged against references too, against theirs."""
    sizes = next(iter(scenarios.values())).keys() if scenarios else []
    out: dict[str, Any] = {}
    for n in sizes:
        rows = [by_size[n] for by_size in scenarios.values()]
        out[n] = {"own": worst_ratios(rows)}
        if all("against_reference" in row for row in rows):
            out[n]["against_reference"] = worst_ratios(row["against_reference"] for row in rows)
    return out


def _where(source: Source) -> dict[str, str | None]:
    """A source as the output names it."""
    return {"result": str(source.result), "keep": str(source.keep),
            "references": None if source.references is None else str(source.references)}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.adaptive.rejudge", description=__doc__.split("\n\n")[0])
    parser.add_argument("result", type=Path, help="the benchmark's --json-out of the kept runs")
    parser.add_argument("keep", type=Path, help="the benchmark's --keep directory of the same runs")
    parser.add_argument("--also", nargs=2, action="append", type=Path, default=[], metavar=("RESULT", "KEEP"),
                        help="another run of the benchmark on other seeds (its result and --keep directory; "
                             "its references under KEEP/reference): its runs of the same scenarios are judged "
                             "together with the first's")
    parser.add_argument("--samples", type=int, nargs="+", default=[HELD_OUT_SAMPLES, 4 * HELD_OUT_SAMPLES])
    parser.add_argument("--scenario", action="append", default=None, help="only these scenarios (default: every one kept)")
    parser.add_argument("--references", type=Path, default=None,
                        help="kept reference runs of none of the first result (default: KEEP/reference where it "
                             "exists); each size is judged against their targets too")
    parser.add_argument("--json-out", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.references is not None and not args.references.is_dir():
        parser.error(f"--references: no directory {args.references}")
    if any(n < 1 for n in args.samples):
        parser.error("--samples: every size must be >= 1")
    sources: list[Source] = []
    for result, keep in [(args.result, args.keep), *map(tuple, args.also)]:
        try:
            sources.append(read_source(result, keep, args.references if not sources else None))
        except (OSError, ValueError) as exc:
            print(f"cannot read {result} as a result of benchmarks.adaptive: {exc}", file=sys.stderr)
            return 2
    first = sources[0]
    unknown = sorted(set(args.scenario or []) - set(first.scenarios))
    if unknown:
        print(f"--scenario: {', '.join(unknown)} not in {args.result} (it has {', '.join(first.scenarios)})", file=sys.stderr)
        return 2
    names = [name for name in first.scenarios if (first.keep / name).is_dir() and (args.scenario is None or name in args.scenario)]
    if not names:
        print(f"no scenario of {args.result} is kept under {args.keep}", file=sys.stderr)
        return 2
    sizes = sorted(set(args.samples))
    doc: dict[str, Any] = {**_where(first), "samples": sizes, "scenarios": {}}
    if args.also:
        doc["also"] = [_where(source) for source in sources[1:]]
    evaluated: dict[Path, dict[int, list[list[float]]]] = {}
    try:
        check_sources(names, sources)
        for name in names:
            doc["scenarios"][name] = rejudge_scenario(name, sources, sizes, evaluated)
    except KeyError as exc:
        print(f"cannot judge the kept runs again: a stored scenario or run has no field {exc}", file=sys.stderr)
        return 2
    except (OSError, ValueError, TypeError) as exc:
        print(f"cannot judge the kept runs again: {exc}", file=sys.stderr)
        return 2
    doc["worst_ratio"] = worst_by_size(doc["scenarios"])
    table = markdown(doc)
    print(table)
    if args.json_out:
        write_whole(args.json_out, json.dumps(doc, indent=1) + "\n")
        write_whole(args.json_out.with_suffix(".md"), table + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
