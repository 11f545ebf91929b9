"""The simulator's outputs: markdown, the scale plot, and written reasons where prediction and paper differ.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

from benchmarks.outputs import write_whole
from benchmarks.simulate.model import METHODS, method_spec
from benchmarks.simulate.scale import GPU_COMPUTE, NETWORKS, network_link

# --------------------------------------------------------------------------- output


def write_markdown(path: Path, result: Mapping[str, Any]) -> None:
    lines = ["# Scale simulator (α-β pipelined buckets, `planning.costmodel`)", ""]
    v = result["validation_summary"]
    if v.get("runs"):
        lines += [
            "## Validation against the real small-scale runs (`paper.json`)", "",
            f"{v['runs']} runs; mean |error| {v['mean_abs_error']:.1%}, median {v['median_abs_error']:.1%}, "
            f"{v['within_20pct']:.0%} within 20 %. Runs that no other process disturbed (other CPU ≤ "
            f"{v['undisturbed']['max_other_cores']:g} cores): {v['undisturbed']['runs']}"
            + (f", mean |error| {v['undisturbed']['mean_abs_error']:.1%}, {v['undisturbed']['within_20pct']:.0%} within 20 %."
               if v['undisturbed']['runs'] else "."), "",
            "| method | runs | mean abs error | max abs error |", "|---|---:|---:|---:|",
        ]
        for method, s in v["by_method"].items():
            lines.append(f"| {method} | {s['runs']} | {s['mean_abs_error']:.1%} | {s['max_abs_error']:.1%} |")
        lines += ["", "| model | method | N | Mbit/s | cap MB | pipe | rank | measured s | predicted s | error | other CPU |",
                  "|---|---|---:|---:|---:|---|---:|---:|---:|---:|---:|"]
        for r in result["validation"]:
            lines.append(
                f"| {r['model']} | {r['method']} | {r['workers']} | {r['mbit']:g} | {r['bucket_cap_mb']:g} | "
                f"{'on' if r['pipelining'] else 'off'} | {r['rank'] or ''} | {r['measured_s']:.3f} | "
                f"{r['predicted_s']:.3f} | {r['error']:+.1%} | {r.get('other_cpu_cores') or 0:.2f} |")
        lines.append("")
    s = result["speedups"]
    lines += [
        f"## ACP-SGD speedup at {s['workers']} workers (predicted) vs the paper's averages", "",
        "| model | network | over S-SGD | over PowerSGD | over torch powerSGD_hook |", "|---|---|---:|---:|---:|",
    ]
    for c in s["cases"]:
        lines.append(f"| {c['model']} | {c['network']} | {c['over_ssgd']:.2f}× | {c['over_powersgd']:.2f}× | "
                     f"{c['over_torch_powersgd']:.2f}× |")
    for net, m in s.get("by_network", {}).items():
        lines.append(f"| mean | {net} | {m['over_ssgd']:.2f}× | {m['over_powersgd']:.2f}× | |")
    if s["mean"]:
        lines.append(f"| **mean** | 1GbE+10GbE | **{s['mean']['over_ssgd']:.2f}×** (paper 4.06×) | "
                     f"**{s['mean']['over_powersgd']:.2f}×** (paper 1.43×) | |")
    lines += ["", *[f"- {note}" for note in result.get("notes", [])], ""]
    lines += ["## Predicted iteration time (s) at paper scale", "",
              "| model | network | N | " + " | ".join(METHODS) + " |",
              "|---|---|---:|" + "---:|" * len(METHODS)]
    grid: dict[tuple[str, str, int], dict[str, float]] = {}
    for r in result["scale"]:
        grid.setdefault((r["model"], r["network"], r["workers"]), {})[r["method"]] = r["iter_s"]
    for (model, net, n), times in grid.items():
        lines.append(f"| {model} | {net} | {n} | " + " | ".join(f"{times[m]:.3f}" for m in METHODS) + " |")
    lines += ["", "## Assumptions", ""] + [f"- {a}" for a in result["assumptions"]] + [""]
    write_whole(path, "\n".join(lines))


def plot(path: Path, rows: Sequence[Mapping[str, Any]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = sorted({r["model"] for r in rows})
    nets = list(NETWORKS)
    fig, axes = plt.subplots(len(models), len(nets), figsize=(4.2 * len(nets), 3.4 * len(models)), squeeze=False)
    for i, model in enumerate(models):
        for j, net in enumerate(nets):
            ax = axes[i][j]
            for method in METHODS:
                pts = sorted((r["workers"], r["samples_per_s"]) for r in rows
                             if r["model"] == model and r["network"] == net and r["method"] == method)
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=method)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_title(f"{model}, {net}")
            ax.set_xlabel("workers")
            ax.set_ylabel("samples/s (predicted)")
            ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.suptitle("Predicted throughput at paper scale (assumed V100-class compute)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def explain(s: Mapping[str, Any], shapes_by_model: Mapping[str, Sequence[Sequence[int]]]) -> list[str]:
    """Written reasons where the predicted and the paper's average speedups differ by > 30 %.

    The numbers quoted are computed here from the same model, so the text stays true when
    the inputs change.
    """
    from planning.costmodel import all_reduce_s
    from planning.wire import wire_bytes

    notes = []
    if not s.get("mean"):
        return notes
    n = s["workers"]
    per_net = s.get("by_network", {})
    for key, label in (("over_ssgd", "S-SGD"), ("over_powersgd", "PowerSGD")):
        ours, paper = s["mean"][key], s["paper"][key]
        diff = ours / paper - 1
        nets = ", ".join(f"{net} {m[key]:.2f}×" for net, m in per_net.items())
        head = f"Speedup over {label}: predicted mean {ours:.2f}× vs the paper's {paper:.2f}× ({diff:+.0%}; {nets})"
        if abs(diff) <= 0.30:
            notes.append(head + ": within 30 %.")
            continue
        if key == "over_ssgd":
            parts = []
            for model, shapes in shapes_by_model.items():
                gpu = GPU_COMPUTE[model]
                comm = all_reduce_s(wire_bytes(method_spec("ssgd"), shapes, n), n, network_link("1GbE"))
                compute = gpu["forward_s"] + gpu["backward_s"] + gpu["optimizer_s"]
                parts.append(f"{model}: {comm:.1f} s of all-reduce vs {compute:.2f} s of compute")
            notes.append(
                head + ". Why: on 1 GbE at 32 workers S-SGD is overwhelmingly communication-bound ("
                + "; ".join(parts) + " per step), so ACP-SGD's 33-117× fewer bytes give speedups far above the "
                "paper's average, and they dominate this two-network mean. The paper's default network is 10 GbE "
                f"(where this model predicts {per_net.get('10GbE', {}).get(key, float('nan')):.2f}×), and its "
                "average spans more settings (4 models, 8-64 GPUs, 100 Gb IB, batch sweeps) including "
                "compute-bound ones. The model also assumes a perfect ring at line rate with no congestion "
                "or NCCL protocol overhead.")
        else:
            notes.append(
                head + ". Why: in this model PowerSGD overlaps both of its rounds with backward bucket by bucket, "
                "so at 10 GbE its 2× larger payload and extra round mostly hide behind backward, and its second "
                "orthogonalisation costs little on the assumed GPU codec. The gap grows where PowerSGD's rounds no "
                "longer fit under backward (1 GbE, BERT) or where compression runs after backward (PyTorch's hook on "
                "gloo here: 1.7-2.2× slower than ACP-SGD in the real runs).")
    notes.append(
        "Small-scale validation vs paper scale: the emulated 2-worker veth link has almost no latency "
        "(the probes' α fits are 0-2 ms and noise-dominated) and one ring step; the paper's 32-GPU ring pays 2(N−1)α per all-reduce, "
        "PowerSGD twice per bucket (two dependent rounds), and the all-gather methods (N−1)·b·β, which grows "
        "with N. The validation therefore checks the bucket/overlap/codec mechanics, not the latency terms.")
    return notes


