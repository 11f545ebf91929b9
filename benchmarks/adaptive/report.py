"""The benchmark's outputs: the plot and the markdown table.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks.adaptive.scenarios import ADAPTIVE
from benchmarks.adaptive.time_floor import time_floor_line

# --------------------------------------------------------------------------- outputs


def plot(doc: dict[str, Any], path: Path) -> None:
    """Held-out loss against wall time per run, one panel per scenario, link rate shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(doc["scenarios"])
    fig, axes = plt.subplots(len(names), 1, figsize=(11, 4.2 * len(names)), squeeze=False)
    for ax, name in zip(axes[:, 0], names):
        scenario = doc["scenarios"][name]
        rate_ax = ax.twinx()
        shaded = scenario["runs"].get(ADAPTIVE) or scenario["runs"]["none"]
        shade = shaded.get("first_run", shaded)  # the runs drawn: every label's first (one seed's held-out set)
        xs, ys = [0.0], [scenario["schedule"][0]["mbit"]]
        for wall, mbit in shade.get("rate_changes_s", []):
            xs += [wall, wall]
            ys += [ys[-1], mbit]
        xs.append(shade["total_s"])
        ys.append(ys[-1])
        rate_ax.fill_between(xs, ys, color="tab:blue", alpha=0.08)
        rate_ax.set_ylim(0, max(p["mbit"] for p in scenario["schedule"]) * 1.15)
        rate_ax.set_ylabel("link rate (Mbit/s), adaptive run")
        for label, run in scenario["runs"].items():
            style = {"lw": 2.4, "color": "black", "zorder": 5} if label == ADAPTIVE else {"lw": 1.0, "alpha": 0.85}
            curve = run.get("first_run", run)["eval"]
            ax.plot([e[1] for e in curve], [e[2] for e in curve], label=label, **style)
        ax.axhline(shade.get("target", scenario["target"]), color="red", ls=":", lw=1, label="target")
        seed = shade.get("seed")
        ax.set_title(f"{name}: held-out loss vs wall time (2 workers, emulated link"
                     f"{'' if seed is None else f'; every run on seed {seed}'})")
        ax.set_xlabel("wall time since step 1 (s)")
        ax.set_ylabel("held-out loss")
        ax.legend(loc="upper right", fontsize=8, ncol=3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def markdown(doc: dict[str, Any]) -> str:
    """One table per scenario, then each run's worst ratio across scenarios."""
    out = []
    for name, scenario in doc["scenarios"].items():
        v = scenario["verdict"]
        by_seed = scenario.get("targets_by_seed")
        targets = (f"targets by seed {', '.join(f'{seed}: {t:.4f}' for seed, t in by_seed.items())}" if by_seed
                   else f"target held-out loss {scenario['target']:.4f}")
        if "target_from" in scenario:
            targets += f" from {scenario['target_from']}"
        how = ("; the row is the run at the median time to target, the ratio paired by seed, vs none the median "
               "over seeds" if by_seed else "")
        if "ratio_interval" in v:
            how += ("; the interval: 5th-95th percentile of the ratio over rounds drawn again with replacement, "
                    "a floor on the uncertainty with three runs a seed, no confidence interval")
        out += [f"**{name}** (`{scenario['schedule_text']}`; {targets}; best fixed: {v['best_fixed']}{how})", "",
                f"| run | time to target s | each run's | ratio to best fixed{' (interval)' if 'ratio_interval' in v else ''} "
                "| total s | final held-out | vs none "
                "| foreign cores | switches |",
                "|---|---:|---|---:|---:|---:|---:|---:|---|"]
        for label, r in scenario["runs"].items():
            ttt = "-" if r["time_to_target_s"] is None else f"{r['time_to_target_s']:.2f}"
            ratio = v["ratio_to_best"][label]
            shown = "-" if ratio is None else f"{ratio:.3f}"
            if label in v.get("ratio_interval", {}):
                shown += " ({}–{})".format(*("miss" if b is None else f"{b:.2f}" for b in v["ratio_interval"][label]))
            moves = ", ".join(f"{s['to']} @ {s['at_s']:.1f} s" for s in r["switches"]) or "-"
            each = ", ".join(("" if x.get("seed") is None else f"s{x['seed']} ")
                             + ("-" if x["time_to_target_s"] is None else f"{x['time_to_target_s']:.2f}")
                             for x in r.get("repeats", []))
            out.append(f"| {label} | {ttt} | {each} | {shown} | {r['total_s']:.2f} | "
                       f"{r['final_eval']:.4f} | {v['final_eval_vs_none'][label]:+.1%} | {r['foreign_cores']} | {moves} |")
        out.append("")
        out += floors_and_draws(scenario, v)
        own = scenario.get("against_own_none")
        if own:
            ratios = ", ".join(f"{label} {'miss' if r is None else f'{r:.3f}'}"
                               for label, r in own["verdict"]["ratio_to_best"].items())
            hits = "; ".join(f"{label} {','.join('-' if h is None else str(h) for h in steps)}"
                             for label, steps in own["hit_steps"].items())
            out += [f"Against `none`'s own target (targets by seed "
                    f"{', '.join(f'{seed}: {t:.4f}' for seed, t in own['targets_by_seed'].items())}): best fixed "
                    f"{own['verdict']['best_fixed']}; ratio to it: {ratios}; hit steps by seed: {hits}.", ""]
    worst = doc["verdict"]["worst_ratio_to_best_fixed"]
    own_worst = doc["verdict"].get("worst_ratio_against_own_none")
    out += ["**Worst ratio to the best fixed choice across scenarios** (- : missed a target)", "",
            "| run | worst ratio |" + (" against `none`'s own targets |" if own_worst else ""),
            "|---|---:|" + ("---:|" if own_worst else "")]
    for label, r in worst.items():
        row = f"| {label} | {'-' if r is None else f'{r:.3f}'} |"
        if own_worst:
            other = own_worst.get(label)
            row += f" {'-' if other is None else f'{other:.3f}'} |"
        out.append(row)
    bounds = doc["verdict"].get("switching_bound") or {}
    if bounds:
        out += ["", "**Clairvoyant switching bound** (each phase run by the fixed choice fastest per step at its rate "
                "in this run's steady scenario, switched for free, in the fewest steps any fixed choice needed): "
                "the least ratio to the best fixed choice any policy could show", "",
                "| scenario | bound | fastest per phase | best fixed (predicted) | adaptive measured |", "|---|---:|---|---|---:|"]
        for name, b in bounds.items():
            measured = doc["scenarios"][name]["verdict"]["ratio_to_best"].get(ADAPTIVE)
            out.append(f"| {name} | {b['ratio']:.3f} | {', '.join(b['fastest_by_phase'])} | {b['best_fixed']} | "
                       f"{'-' if measured is None else f'{measured:.3f}'} |")
    return "\n".join(out) + "\n"


def floor_line(floor: dict[str, Any]) -> str:
    """The finals rule applied to uncompressed runs (``finals_floor.uncompressed_floor``), in words."""
    low, high = floor["interval"]
    return (f"An uncompressed run by the same finals rule (each of a seed's `none` runs against the median of the "
            f"seed's others, one a seed drawn again, the median over {floor['seeds']} seeds): {low:+.1%} to "
            f"{high:+.1%} (5th-95th percentile), above {floor['margin']:+.0%} in {floor['above_margin']:.0%} of draws.")


def floors_and_draws(scenario: dict[str, Any], verdict: dict[str, Any]) -> list[str]:
    """What goes under a scenario's table: the finals rule and the time rule applied to
    uncompressed runs, and the seeds drawn again, each where the scenario has it."""
    lines: list[str] = []
    if scenario.get("uncompressed_floor"):
        lines += [floor_line(scenario["uncompressed_floor"]), ""]
    if scenario.get("uncompressed_time_floor"):
        lines += [time_floor_line(scenario["uncompressed_time_floor"]), ""]
    if verdict.get("seed_draws"):
        lines += seed_draws_table(verdict["seed_draws"])
    return lines


def seed_draws_table(drawn: dict[str, Any]) -> list[str]:
    """How far drawing the seeds again moves the verdict (``intervals.seed_draws``): a table."""
    finals = "final_vs_none" in drawn
    lines = [f"The {drawn['seeds']} seeds drawn again with replacement ({drawn['draws']} draws; the best fixed choice "
             "picked again in each; 5th-95th percentile):", "",
             f"| run | ratio to best fixed | at most {drawn['ratio_margin']:g} in |"
             + (f" final vs none | at most {drawn['final_margin']:+.0%} in |" if finals else ""),
             "|---|---:|---:|" + ("---:|---:|" if finals else "")]
    for label, bounds in drawn["ratio"].items():
        row = (f"| {label} | {' to '.join('miss' if b is None else f'{b:.3f}' for b in bounds)} | "
               f"{drawn['ratio_within'][label]:.0%} |")
        if finals:
            row += (f" {' to '.join(f'{b:+.1%}' for b in drawn['final_vs_none'][label])} | "
                    f"{drawn['final_within'][label]:.0%} |")
        lines.append(row)
    return lines + [""]
