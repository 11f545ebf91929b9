"""What a run and a scenario come to: switches, bandwidth by phase, verdicts (a run's target and
time to it: :mod:`benchmarks.adaptive.targets`; times paired by seed and the best fixed choice:
:mod:`benchmarks.adaptive.pairing`; how far drawing the runs or the seeds again moves a verdict:
:mod:`benchmarks.adaptive.intervals`).
"""

from __future__ import annotations

import math
from statistics import median_high
from typing import Any, Iterable, Sequence

from benchmarks.adaptive.intervals import ratio_intervals, seed_draws
from benchmarks.adaptive.jobs import JobRun
from benchmarks.adaptive.pairing import best_fixed, is_adaptive, median_run, or_inf, paired_ratio
from benchmarks.adaptive.scenarios import ADAPTIVE, Phase, boundaries
from benchmarks.adaptive.targets import by_seed, hit_step

# --------------------------------------------------------------------------- results of a run


def switches(run: JobRun) -> list[dict[str, Any]]:
    """Compressor changes, timed like ``total_s`` (seconds since the report of step 1)."""
    origin = run.wall_at(1)
    out = []
    for switch in run.summary.get("switches", []):
        step = int(switch["step"])
        out.append({"at_s": round(run.wall_at(step) - origin, 3), "step": step, "to": switch["to"],
                    "reason": switch.get("reason", "")})
    return out


def bandwidth_by_phase(run: JobRun, phases: Sequence[Phase]) -> list[float | None]:
    """Median telemetry bandwidth (Mbit/s) over the second half of each phase: does it track?"""
    out: list[float | None] = []
    start = 1
    for end in boundaries(phases):
        middle = (start + end) // 2
        values = sorted(r["bandwidth_bytes_per_second"] * 8e-6 for r in run.reports
                        if middle <= r["step"] <= end and r.get("bandwidth_bytes_per_second"))
        out.append(round(median_high(values), 1) if values else None)
        start = end
    return out


def eval_points(run: JobRun, curve: Sequence[tuple[int, float]]) -> list[list[float]]:
    """``[[step, wall_s, held-out loss], ...]``; wall_s from the report of step 1, like total_s."""
    origin = run.wall_at(1)
    return [[step, round(run.wall_at(step) - origin, 3), round(loss, 5)] for step, loss in curve]


def running_over_estimate(reports: Sequence[dict[str, Any]]) -> list[float]:
    """Per report of a low-rank choice: its running error over its own estimate (the raw
    gradient's best rank-r error). What error feedback and a warm start cost beyond the best case;
    ``benchmarks.adaptive_replay`` takes the median as its default."""
    out = []
    for report in reports:
        label, error = step_label(report), report.get("compression_error")
        estimate = (report.get("compression_error_estimates") or {}).get(label)
        if report.get("compressor_rank") and error is not None and estimate and estimate > 0.05:
            out.append(round(error / estimate, 3))
    return out


def step_label(report: dict[str, Any]) -> str:
    """Telemetry's compressor as a label (``acpsgd-r4``)."""
    name = report.get("compressor") or "?"
    if report.get("compressor_rank"):
        return f"{name}-r{report['compressor_rank']}"
    if report.get("ratio"):
        return f"{name}-{report['ratio']:g}"
    return name


def run_result(run: JobRun, phases: Sequence[Phase], curve: Sequence[tuple[int, float]]) -> dict[str, Any]:
    """One run's JSON entry, without the target (set once uncompressed training has run)."""
    evals = eval_points(run, curve)
    errors = [r["compression_error"] for r in run.reports if r.get("compression_error") is not None]
    efficiencies = [r["update_efficiency"] for r in run.reports if r.get("update_efficiency") is not None]
    return {
        "time_to_target_s": None,
        "total_s": round(run.wall_at(sum(p.steps for p in phases)) - run.wall_at(1), 3),
        "final_eval": evals[-1][2],
        "eval": evals,
        "switches": switches(run),
        "foreign_cores": run.foreign_cores,
        "bandwidth_mbit": bandwidth_by_phase(run, phases),
        "compression_error_median": round(median_high(errors), 4) if errors else None,
        "update_efficiency_median": round(median_high(efficiencies), 4) if efficiencies else None,
        "quality_overhead": run.summary.get("quality_overhead"),
        "link_drops_read": run.summary.get("link_drops_read"),
        "error_ratios": _median_only(running_over_estimate(run.reports)),
        "final_loss": run.summary["final_loss"],
    }


def combine_repeats(repeats: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One label's entry from its runs over the seeds (and repeats), judged already.

    The run at the median time to target (a miss counts as the longest) stands for the label:
    its curve, switches, final and figures are the entry's. ``final_vs_none`` is the median of
    each run's final against ``none``'s on its seed; ``repeats`` lists each run's figures;
    ``first_run`` keeps the first run's curve, target and link changes, so a plot can draw every
    label on one seed's held-out set. Each run in ``repeats`` keeps its held-out curve (since
    session 42), so that another reading of the runs (a time read off a fitted curve, say) can be
    taken from the result file alone, without evaluating the kept checkpoints again. Why the median over seeds: a seed's trajectory decides
    the finish (fp16 reached the target on three seeds of five), and with one seed a run's step
    times still moved by up to 17 % between runs on this machine.
    """
    middle = median_run(repeats)
    first = repeats[0]
    entry = {**middle,
             "first_run": {key: first[key] for key in ("seed", "target", "eval", "rate_changes_s", "total_s") if key in first},
             "repeats": [{"seed": r.get("seed"), "time_to_target_s": r["time_to_target_s"], "hit_step": r.get("hit_step"),
                          "total_s": r["total_s"], "final_eval": r["final_eval"], "foreign_cores": r["foreign_cores"],
                          "switches": len(r["switches"]), **({"final_vs_none": r["final_vs_none"]} if "final_vs_none" in r else {}),
                          "eval": r["eval"]}
                         for r in repeats]}
    if all("final_vs_none" in r for r in repeats):
        entry["final_vs_none"] = median_high(r["final_vs_none"] for r in repeats)
    return entry


def curve_spread(repeats: Sequence[dict[str, Any]]) -> float:
    """Largest difference in held-out loss at one step between repeats (0: the curve repeats)."""
    curves = [{step: loss for step, _, loss in r["eval"]} for r in repeats]
    steps = set().union(*curves)
    return round(max((max(c[s] for c in curves if s in c) - min(c[s] for c in curves if s in c) for s in steps),
                     default=0.0), 5)


def none_curve_spread(none_runs: Sequence[dict[str, Any]]) -> float | None:
    """:func:`curve_spread` of ``none`` between runs of one seed, the largest over the seeds
    (0: its curve repeats); None when no seed ran twice (nothing to compare)."""
    spreads = [curve_spread(runs) for runs in by_seed(none_runs).values() if len(runs) >= 2]
    return max(spreads) if spreads else None


def _median_only(values: list[float]) -> list[float]:
    return [median_high(values)] if values else []


def scenario_verdict(runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Adaptive against the best fixed choice and against uncompressed.

    ``ratio_to_best`` pairs runs by seed (:func:`paired_ratio`): a label's time on a seed over
    the best fixed choice's on the same seed, the median over the seeds. Why paired: each seed
    has its own target, so times of different seeds do not compare. The best fixed choice is
    one no other fixed choice beats by that measure (:func:`best_fixed`).
    """
    fixed = [label for label in runs if not is_adaptive(label)]
    best = best_fixed(runs, fixed)
    out: dict[str, Any] = {"best_fixed": best, "best_fixed_time_to_target_s": runs[best]["time_to_target_s"],
                           "ratio_to_best": {label: paired_ratio(runs[label], runs[best]) for label in runs}}
    out["final_eval_vs_none"] = {label: r["final_vs_none"] if "final_vs_none" in r
                                 else round(r["final_eval"] / runs["none"]["final_eval"] - 1, 4) for label, r in runs.items()}
    if ADAPTIVE in runs:
        out["adaptive_final_eval_vs_none"] = out["final_eval_vs_none"][ADAPTIVE]
    interval = ratio_intervals(runs)
    if interval is not None:
        out["ratio_interval"] = interval
    drawn = seed_draws(runs)
    if drawn is not None:
        out["seed_draws"] = drawn
    return out


def switching_bounds(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """For each scenario whose link changes: the least ratio to the best fixed choice that any
    switching policy could show, from this run's own step times.

    Why: whether adaptive can beat every fixed choice by much is bounded by how much the best
    choice of each phase beats the best single choice, which the machine decides, not the
    policy. A clairvoyant switcher runs each phase with the fixed choice fastest per step at
    that rate (measured in the steady scenario at that rate) and needs the fewest steps any
    fixed choice needed to reach the target here; switching costs it nothing. Its time over the
    best fixed choice's, predicted from the same steady step times, is the bound. Only choices
    that reached the target count; a scenario with a rate no steady scenario ran at gets no
    bound. With several seeds the bound is taken per seed (the steps to each seed's target) and
    the seed at the median bound stands for the scenario (``by_seed`` lists them all).
    """
    per_step: dict[float, dict[str, float]] = {}
    for scenario in doc["scenarios"].values():
        steps = sum(p["steps"] for p in scenario["schedule"])
        if len(scenario["schedule"]) == 1 and steps > 1:  # the first steady scenario at a rate counts
            per_step.setdefault(scenario["schedule"][0]["mbit"], {
                label: r["total_s"] / (steps - 1) for label, r in scenario["runs"].items() if not is_adaptive(label)})
    out: dict[str, dict[str, Any]] = {}
    for name, scenario in doc["scenarios"].items():
        phases = [Phase(p["mbit"], p["steps"]) for p in scenario["schedule"]]
        if len({p.mbit for p in phases}) < 2 or any(p.mbit not in per_step for p in phases):
            continue
        choices = [label for label in scenario["runs"] if not is_adaptive(label)
                   and all(label in per_step[p.mbit] for p in phases)]
        bounds = {}
        for seed in {r.get("seed") for label in choices for r in scenario["runs"][label].get("repeats") or [{}]}:
            hit = {label: step for label in choices
                   if (step := _hit_step_on(scenario["runs"][label], seed, scenario["target"])) is not None}
            if hit:
                bounds[seed] = _clairvoyant(phases, per_step, hit)
        if not bounds:
            continue
        ordered = sorted(bounds, key=lambda seed: bounds[seed]["ratio"])
        out[name] = {**bounds[ordered[len(ordered) // 2]],
                     "by_seed": {str(seed): bound["ratio"] for seed, bound in bounds.items()}}
    return out


def _hit_step_on(entry: dict[str, Any], seed: Any, target: float) -> int | None:
    """The step a label first reached the target on ``seed`` (the median of the seed's repeats).
    Entries of result files without per-run steps: from the entry's own curve and target."""
    steps = [or_inf(r["hit_step"]) for r in entry.get("repeats") or [] if r.get("seed") == seed and "hit_step" in r]
    if not steps:
        return hit_step(entry["eval"], entry.get("target", target))
    step = median_high(steps)
    return None if math.isinf(step) else int(step)


def _clairvoyant(phases: Sequence[Phase], per_step: dict[float, dict[str, float]], hit: dict[str, int]) -> dict[str, Any]:
    """The switching bound of one seed, from the steps each fixed choice needed (``hit``)."""
    fewest = min(hit.values())
    fastest = [min(hit, key=lambda label: per_step[p.mbit][label]) for p in phases]
    clairvoyant = sum(n * per_step[p.mbit][label] for p, n, label in zip(phases, _steps_in(phases, fewest), fastest))
    fixed = {label: sum(n * per_step[p.mbit][label] for p, n in zip(phases, _steps_in(phases, steps)))
             for label, steps in hit.items()}
    best = min(fixed, key=lambda label: fixed[label])
    return {"ratio": round(clairvoyant / fixed[best], 3), "best_fixed": best, "steps_to_target": fewest,
            "fastest_by_phase": fastest}


def _steps_in(phases: Sequence[Phase], steps: int) -> list[int]:
    """How many of the first ``steps`` steps fall in each phase."""
    out, start = [], 0
    for phase in phases:
        out.append(max(0, min(phase.steps, steps - start)))
        start += phase.steps
    return out


def overall_verdict(doc: dict[str, Any]) -> dict[str, Any]:
    """Each run's worst ratio to the scenario's best fixed choice (None: missed a target), the
    same against ``none``'s own targets where the scenarios were judged both ways, and the
    scenarios' switching bounds (:func:`switching_bounds`)."""
    out: dict[str, Any] = {"worst_ratio_to_best_fixed": worst_ratios(s["verdict"] for s in doc["scenarios"].values())}
    own = [s["against_own_none"]["verdict"] for s in doc["scenarios"].values() if "against_own_none" in s]
    if own:
        out["worst_ratio_against_own_none"] = worst_ratios(own)
    out["switching_bound"] = switching_bounds(doc)
    return out


def worst_ratios(verdicts: Iterable[dict[str, Any]]) -> dict[str, float | None]:
    """Each label's largest ``ratio_to_best`` over the verdicts (None once it missed)."""
    worst: dict[str, float | None] = {}
    for verdict in verdicts:
        for label, ratio in verdict["ratio_to_best"].items():
            if label not in worst:
                worst[label] = ratio
            elif worst[label] is not None:
                worst[label] = None if ratio is None else max(worst[label], ratio)  # type: ignore[type-var]
    return worst
