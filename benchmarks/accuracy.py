"""Held-out accuracy with and without gradient compression, on real data.

Trains each model on scikit-learn's 8x8 ``digits`` (1,437 train / 360 test images, fixed
stratified split) with 2 data-parallel workers (gloo, CPU), once per compressor, for the
same number of steps from the same seed (same initial weights, same batches), and reports
the held-out accuracy (``eval_accuracy`` of each run's summary), the final training loss
and the bytes each rank sent per step side by side. The jobs run through the real worker
runtime: ``workers.runner.run_local`` (the loop of ``gradwire train --no-ray``: DDP +
GradientSync, two processes), or Ray Train with ``--ray``.

    python -m benchmarks.accuracy --json-out benchmarks/results/accuracy.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from benchmarks.outputs import write_whole
from planning.config import TrainConfig
from planning.sections import LR_SCHEDULES

#: (label, compression settings) in the order they are reported; "none" is the S-SGD baseline.
CHOICES: dict[str, dict[str, Any]] = {
    "none": {"compressor": "none"},
    "acpsgd-r4": {"compressor": "acpsgd", "rank": 4},
    "powersgd-r4": {"compressor": "powersgd", "rank": 4},
}


def job(args: argparse.Namespace, model: str, label: str, seed: int) -> TrainConfig:
    return TrainConfig(
        name=f"accuracy-{model}-{label}-s{seed}", model=model, dataset="digits", steps=args.steps,
        batch_size=args.batch_size, lr=args.lr, momentum=0.9, lr_schedule=args.lr_schedule, workers=2,
        seed=seed, report_interval_s=args.report_interval_s,
        compression={"mode": "fixed", **CHOICES[label]},
    )


def run_one(config: TrainConfig, use_ray: bool) -> tuple[dict[str, Any], list[list[float]]]:
    """One job; returns its summary and the loss curve rank 0 reported ([step, loss] pairs)."""
    curve: list[list[float]] = []

    def progress(report: dict[str, Any]) -> None:
        if report.get("loss") is not None:
            curve.append([report["step"], round(report["loss"], 5)])

    if use_ray:
        from workers.runner import run_job

        return run_job(config, resume=False), curve  # Ray Train: no live curve here
    from workers.runner import run_local

    return run_local(config, progress=progress), curve


def run_all(args: argparse.Namespace) -> list[dict[str, Any]]:
    if args.ray:
        import ray

        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    runs = []
    for model in args.models:
        for seed in args.seeds:
            for label in args.choices:
                config = job(args, model, label, seed)
                started = time.monotonic()
                summary, curve = run_one(config, args.ray)
                wall = time.monotonic() - started
                run = {
                    "model": model, "choice": label, "seed": seed,
                    "eval_accuracy": summary["eval_accuracy"], "final_loss": summary["final_loss"],
                    "bytes_sent_per_step": summary["bytes_sent_per_step"], "steps": summary["steps"],
                    "samples_per_second": summary["samples_per_second"], "wall_s": round(wall, 1),
                    "loss_curve": curve,
                }
                runs.append(run)
                print(f"[accuracy] {model:4s} {label:12s} seed {seed}: accuracy {run['eval_accuracy']:.4f}  "
                      f"loss {run['final_loss']:.4f}  {run['bytes_sent_per_step']:.0f} B/step  ({wall:.0f} s)",
                      flush=True)
    return runs


def table(runs: list[dict[str, Any]], choices: Sequence[str]) -> tuple[list[dict[str, Any]], str]:
    """Rows (model x choice, means over seeds) and the same as a markdown table."""
    rows = []
    for model in dict.fromkeys(r["model"] for r in runs):
        baseline = [r for r in runs if r["model"] == model and r["choice"] == "none"]
        base_bytes = statistics.mean(r["bytes_sent_per_step"] for r in baseline) if baseline else None
        base_acc = statistics.mean(r["eval_accuracy"] for r in baseline) if baseline else None
        for choice in choices:
            mine = [r for r in runs if r["model"] == model and r["choice"] == choice]
            if not mine:
                continue
            accuracy = statistics.mean(r["eval_accuracy"] for r in mine)
            sent = statistics.mean(r["bytes_sent_per_step"] for r in mine)
            rows.append({
                "model": model, "choice": choice, "seeds": len(mine),
                "eval_accuracy": round(accuracy, 4),
                "eval_accuracy_min": round(min(r["eval_accuracy"] for r in mine), 4),
                "eval_accuracy_max": round(max(r["eval_accuracy"] for r in mine), 4),
                "accuracy_vs_none": None if base_acc is None else round(accuracy - base_acc, 4),
                "final_loss": round(statistics.mean(r["final_loss"] for r in mine), 4),
                "bytes_sent_per_step": round(sent),
                "compression_ratio": None if not base_bytes or not sent else round(base_bytes / sent, 1),
            })
    lines = ["| model | compressor | held-out accuracy | vs none | final loss | bytes/step (ratio) |",
             "|---|---|---|---|---|---|"]
    for row in rows:
        spread = "" if row["seeds"] == 1 else f" ({row['eval_accuracy_min']:.3f}–{row['eval_accuracy_max']:.3f})"
        delta = "–" if row["choice"] == "none" or row["accuracy_vs_none"] is None else f"{100 * row['accuracy_vs_none']:+.2f} pt"
        ratio = f" ({row['compression_ratio']}x)" if row["compression_ratio"] and row["choice"] != "none" else ""
        lines.append(f"| {row['model']} | {row['choice']} | {100 * row['eval_accuracy']:.2f}%{spread} | {delta} | "
                     f"{row['final_loss']:.4f} | {row['bytes_sent_per_step']}{ratio} |")
    return rows, "\n".join(lines) + "\n"


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(dict.fromkeys(r["model"] for r in rows))
    choices = list(dict.fromkeys(r["choice"] for r in rows))
    width = 0.8 / len(choices)
    fig, ax = plt.subplots(figsize=(1.8 + 1.6 * len(models) * len(choices) / 2, 3.2))
    for i, choice in enumerate(choices):
        values = [next((100 * r["eval_accuracy"] for r in rows if r["model"] == m and r["choice"] == choice), 0) for m in models]
        bars = ax.bar([x + i * width for x in range(len(models))], values, width, label=choice)
        ax.bar_label(bars, fmt="%.1f", fontsize=7)
    ax.set_xticks([x + width * (len(choices) - 1) / 2 for x in range(len(models))], models)
    ax.set_ylabel("held-out accuracy (%)")
    low = min(100 * r["eval_accuracy"] for r in rows)
    ax.set_ylim(max(0, low - 10), 100)
    ax.set_title("digits, 2 workers, same steps and seed")
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=150)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.accuracy", description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["mlp", "cnn"], choices=["mlp", "cnn"])
    parser.add_argument("--choices", nargs="+", default=list(CHOICES), choices=list(CHOICES))
    parser.add_argument("--steps", type=int, default=300, help="steps per run (~13 epochs of digits at 2x32)")
    parser.add_argument("--batch-size", type=int, default=32, help="per worker")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--lr-schedule", default="cosine", choices=LR_SCHEDULES)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="each compressor runs every seed")
    parser.add_argument("--report-interval-s", type=float, default=0.1, help="loss-curve sampling")
    parser.add_argument("--ray", action="store_true", help="run on a local Ray cluster (Ray Train) instead of run_local")
    parser.add_argument("--json-out", type=Path, default=None)
    parser.add_argument("--plot", type=Path, default=None, help="bar chart PNG of the accuracies")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if "none" not in args.choices:
        args.choices = ["none", *args.choices]  # the baseline every row is compared with
    started = time.monotonic()
    runs = run_all(args)
    rows, markdown = table(runs, args.choices)
    print(markdown)
    doc = {
        "benchmark": "accuracy",
        "command": "python -m benchmarks.accuracy " + " ".join(sys.argv[1:] if argv is None else argv),
        "runner": "ray_train" if args.ray else "run_local",
        "job": {"dataset": "digits", "workers": 2, "steps": args.steps, "batch_size_per_worker": args.batch_size,
                "lr": args.lr, "lr_schedule": args.lr_schedule, "optimizer": "sgd", "momentum": 0.9,
                "seeds": args.seeds, "choices": {c: CHOICES[c] for c in args.choices}},
        "results": rows,
        "runs": runs,
        "wall_s": round(time.monotonic() - started, 1),
    }
    if args.json_out:
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        write_whole(args.json_out, json.dumps(doc, indent=2) + "\n")
    if args.plot:
        plot(rows, args.plot)
    print(f"[accuracy] done in {doc['wall_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
