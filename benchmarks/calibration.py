"""How well does the cost model predict a step? Predicted against measured, per compressor and rate.

Why: the adaptive policy is only as good as ``planning.costmodel.predict_step``. This
benchmark runs the same two-worker job as :mod:`benchmarks.adaptive` once per compressor,
each run walking the emulated link through fixed rates (default 1000, 200, 50 Mbit/s, a
fixed number of steps each) after an unmeasured warm-up at the first rate (a fresh job's
first ~50 steps run slower), and compares, for every (compressor, rate):

* measured: the step timer's ``forward + backward + optimizer`` (backward includes the
  communication it waited for), mean over the last 50 steps of the phase (the telemetry's
  window), i.e. exactly the span the cost model predicts; input loading is left out of both;
* predicted: ``predict_step`` fed with this run's own inputs -- forward, backward compute
  (``backward - exposed_comm``) and optimizer time measured in the same phase (so the error
  is the model's account of communication, codec and overlap, not the CPU's speed drifting
  between phases), the DDP bucket layout and the calibrated encode/decode costs from the
  telemetry's ``profile`` (the job runs in adaptive mode with a scripted decision, so the
  loop calibrates codecs as it does for the policy while the compressor stays fixed), and
  the link as a gloo all-reduce on the testbed measures it at that rate, plus the testbed
  shaper's known burst (``Link.burst_bytes``: each step's first ~64 kB pass at line rate
  after the link idled through forward), with the cost model's host terms measured as the
  worker measures them: the straggler wait from this phase's compute jitter (the report's
  ``compute_jitter_seconds``) and the link's wake-up cost (``wake_s``, the probe's
  late-joined small all-reduce, here 40 rounds). ``error_no_burst`` in the JSON is the same
  model without the burst, i.e. what the policy predicts (probes cannot see a burst);
  ``error_alpha_beta_only`` is the model without the host terms (the previous model).

The error is ``predicted / measured - 1``; the target is within 25 %.

    python -m benchmarks.calibration --json-out benchmarks/results/calibration.json

Needs root (network namespaces); every timed run holds ``/tmp/gradwire-bench.lock``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Sequence

from benchmarks.adaptive import (
    FIXED_CHOICES,
    JobRun,
    Phase,
    boundaries,
    parse_label,
    run_job,
    train_config,
    write_results,
)
from benchmarks.machine import bench_lock, foreign_load, wait_for_quiet
from benchmarks.testbed import Testbed, measure_allreduce, tbf_burst_bytes
from planning.controller import step_profile
from planning.costmodel import alpha_beta_from_bandwidth, predict_step
from planning.protocol import ModelProfile
from planning.sections import LR_SCHEDULES
from planning.spec import make_spec

DEFAULT_RATES = (1000.0, 200.0, 50.0)
TARGET = 0.25
LINK_PROBE_BYTES = 4 << 20
#: More wake-up rounds than a training probe's 8: the mean of a heavy tail needs them.
WAKE_ROUNDS = 40


# --------------------------------------------------------------------------- measuring


def measure_links(tb: Testbed, rates: Sequence[float]) -> dict[float, dict[str, float]]:
    """Bandwidth (bytes/s) and latency a gloo all-reduce sees at each rate: the model's link."""
    links = {}
    for mbit in rates:
        tb.set_rate(mbit)
        small = measure_allreduce(tb, nbytes=4096, iters=9, wake_rounds=WAKE_ROUNDS)
        large = measure_allreduce(tb, nbytes=LINK_PROBE_BYTES, iters=3)
        # Ring all-reduce of b bytes on 2 workers: t = 2α + b·β (docs/cost-model.md).
        # The fastest of the repeats: a late wake-up of either process only ever adds time.
        latency, large_s = min(small.seconds), min(large.seconds)
        links[mbit] = {"bandwidth_bytes_per_second": LINK_PROBE_BYTES / max(1e-9, large_s - latency),
                       "latency_s": latency, "mbit_seen": 2 * (2 - 1) / 2 * LINK_PROBE_BYTES * 8 / large_s / 1e6,
                       "burst_bytes": tbf_burst_bytes(mbit), "wake_s": small.wake_s}
        print(f"[calibration] link at {mbit:g} Mbit/s: gloo sees {links[mbit]['mbit_seen']:.0f} Mbit/s, "
              f"latency {latency * 1e3:.2f} ms, wake-up {links[mbit]['wake_s'] * 1e3:.2f} ms", flush=True)
    return links


def pinned_compression(label: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Adaptive mode (so the loop calibrates codecs) with a schedule that pins ``label``."""
    name, params = parse_label(label)
    return {"mode": "adaptive", "compressor": name, **params}, [{"step": 0, "compressor": name, "params": params}]


def report_at(run: JobRun, step: int) -> dict[str, Any]:
    """Rank 0's report of ``step`` (the nearest one at or after it)."""
    return next((r for r in run.reports if r["step"] >= step), run.reports[-1])


def phase_reports(run: JobRun, phases: Sequence[Phase]) -> list[dict[str, Any]]:
    """Rank 0's report at the end of each phase: the timer's means over its last 50 steps."""
    return [report_at(run, end) for end in boundaries(phases)]


def wall_step_s(run: JobRun, phases: Sequence[Phase], skip: int = 10) -> list[float]:
    """Median wall-clock step time in each phase, after ``skip`` steps of transition."""
    out, start = [], 0
    by_step = {r["step"]: r["wall_time"] for r in run.reports}
    for end in boundaries(phases):
        deltas = sorted(by_step[s] - by_step[s - 1] for s in range(start + skip + 1, end + 1)
                        if s in by_step and s - 1 in by_step)
        out.append(deltas[len(deltas) // 2] if deltas else float("nan"))
        start = end
    return out


# --------------------------------------------------------------------------- predicting


def profile_of(run: JobRun) -> ModelProfile:
    """The telemetry's model profile (shapes, buckets, calibrated codec costs)."""
    report = next(r for r in run.reports if r.get("profile"))
    return ModelProfile.model_validate(report["profile"])


def predict(label: str, run: JobRun, phases: Sequence[Phase], links: dict[float, dict[str, float]]) -> list[dict[str, Any]]:
    """Predicted and measured span of a step in every measured phase of ``run`` (the first
    phase is the warm-up)."""
    name, params = parse_label(label)
    spec = make_spec(name, **params)
    rows = []
    measured_phases = zip(phases[1:], phase_reports(run, phases)[1:], wall_step_s(run, phases)[1:])
    for phase, report, wall in measured_phases:
        means = report["phase_seconds"]
        profile = profile_of(run).model_copy(update={
            "forward_s": means["forward"],
            "backward_s": max(0.0, means["backward"] - means["exposed_comm"]),
            "optimizer_s": means["optimizer"],
        })
        bare = step_profile(profile, (spec,))
        model = replace(bare, compute_jitter_s=report.get("compute_jitter_seconds") or 0.0)
        link = links[phase.mbit]
        alpha_beta = alpha_beta_from_bandwidth(link["bandwidth_bytes_per_second"], link["latency_s"] / 2)  # 2α on 2 workers
        woken = alpha_beta._replace(wake_s=link["wake_s"])
        predicted = predict_step(spec, model, 2, woken._replace(burst_bytes=link["burst_bytes"]))
        unshaped = predict_step(spec, model, 2, woken)
        # The α-β model alone (no straggler wait, no wake-up), for comparison.
        alpha_beta_only = predict_step(spec, bare, 2, alpha_beta._replace(burst_bytes=link["burst_bytes"]))
        measured = means["forward"] + means["backward"] + means["optimizer"]
        rows.append({
            "compressor": label, "mbit": phase.mbit,
            "measured_s": round(measured, 5), "predicted_s": round(predicted.step_s, 5),
            "error": round(predicted.step_s / measured - 1, 4),
            # The same model without the shaper's burst (what the policy predicts: probes
            # cannot see a burst), for comparison.
            "predicted_no_burst_s": round(unshaped.step_s, 5),
            "error_no_burst": round(unshaped.step_s / measured - 1, 4),
            "predicted_alpha_beta_only_s": round(alpha_beta_only.step_s, 5),
            "error_alpha_beta_only": round(alpha_beta_only.step_s / measured - 1, 4),
            "compute_jitter_s": round(model.compute_jitter_s, 6),
            "measured_wall_step_s": round(wall, 5),
            "measured_exposed_comm_s": round(means["exposed_comm"], 5),
            "predicted_exposed_comm_s": round(predicted.exposed_comm_s, 5),
            "predicted_codec_s": round(predicted.codec_s, 5),
            "measured_codec_s": round(means["compress"] + means["decompress"], 5),
            "codec_calibrated": predicted.codec_calibrated,
            "foreign_cores": run.foreign_cores,
        })
    return rows


# --------------------------------------------------------------------------- outputs


def markdown(rows: list[dict[str, Any]], rates: Sequence[float]) -> str:
    """One row per compressor: measured / predicted ms and the error at each rate."""
    heads = " | ".join(f"{r:g} Mbit/s: measured / predicted ms (error)" for r in rates)
    lines = [f"| compressor | {heads} |", "|---|" + "---:|" * len(rates)]
    for label in dict.fromkeys(row["compressor"] for row in rows):
        cells = []
        for rate in rates:
            row = next(r for r in rows if r["compressor"] == label and r["mbit"] == rate)
            flag = "" if abs(row["error"]) <= TARGET else " **miss**"
            cells.append(f"{row['measured_s'] * 1e3:.1f} / {row['predicted_s'] * 1e3:.1f} ({row['error']:+.0%}){flag}")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    errors = [abs(r["error"]) for r in rows]
    within = sum(e <= TARGET for e in errors)
    lines.append("")
    lines.append(f"Mean absolute error {sum(errors) / len(errors):.1%}, largest {max(errors):.1%}; "
                 f"{within} of {len(errors)} within ±{TARGET:.0%}.")
    return "\n".join(lines) + "\n"


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    """Predicted against measured (log-log), the ±25 % band shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 6))
    markers = {rate: m for rate, m in zip(sorted({r["mbit"] for r in rows}, reverse=True), "o^sDv")}
    labels = list(dict.fromkeys(r["compressor"] for r in rows))
    colors = {label: plt.cm.tab10(i) for i, label in enumerate(labels)}
    for row in rows:
        ax.scatter(row["measured_s"] * 1e3, row["predicted_s"] * 1e3, color=colors[row["compressor"]],
                   marker=markers[row["mbit"]], s=45)
    values = [v * 1e3 for r in rows for v in (r["measured_s"], r["predicted_s"])]
    low, high = min(values) * 0.7, max(values) * 1.4
    ax.plot([low, high], [low, high], color="black", lw=0.8)
    ax.fill_between([low, high], [low * (1 - TARGET), high * (1 - TARGET)], [low * (1 + TARGET), high * (1 + TARGET)],
                    color="grey", alpha=0.15, label=f"±{TARGET:.0%}")
    for label in labels:
        ax.scatter([], [], color=colors[label], label=label)
    for rate, marker in markers.items():
        ax.scatter([], [], color="grey", marker=marker, label=f"{rate:g} Mbit/s")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(low, high)
    ax.set_ylim(low, high)
    ax.set_xlabel("measured step (forward+backward+optimizer), ms")
    ax.set_ylabel("cost model's prediction, ms")
    ax.set_title("Cost model calibration, 2 workers on the emulated link")
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --------------------------------------------------------------------------- main


def run_all(args: argparse.Namespace) -> tuple[list[dict[str, Any]], dict[float, dict[str, float]]]:
    phases = [Phase(args.rates[0], args.warmup_steps)] + [Phase(rate, args.steps_per_rate) for rate in args.rates]
    rows: list[dict[str, Any]] = []
    with Testbed(hosts=2, mbit=phases[0].mbit) as tb, tempfile.TemporaryDirectory(prefix="gw-calibration-") as tmp:
        with bench_lock():
            links = measure_links(tb, args.rates)
        for label in args.compressors:
            compression, schedule = pinned_compression(label)
            cfg = train_config(args, compression, sum(p.steps for p in phases), schedule=schedule)
            load: dict[str, float] = {}
            with bench_lock():
                wait_for_quiet(args.max_wait_quiet_s)
                with foreign_load(load):
                    run = run_job(tb, cfg, phases, Path(args.keep or tmp) / label, label=label)
            run.foreign_cores = load.get("foreign_cores")
            new = predict(label, run, phases, links)
            rows.extend(new)
            print(f"[calibration] {label}: " + ", ".join(
                f"{r['mbit']:g} Mbit/s {r['measured_s'] * 1e3:.1f} vs {r['predicted_s'] * 1e3:.1f} ms ({r['error']:+.0%})"
                for r in new) + f"; foreign load {run.foreign_cores} cores", flush=True)
    return rows, links


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.calibration", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rates", type=float, nargs="+", default=list(DEFAULT_RATES))
    parser.add_argument("--steps-per-rate", type=int, default=80, help=">= 60: the timer's 50-step window must fit")
    parser.add_argument("--warmup-steps", type=int, default=50, help="unmeasured steps at the first rate")
    parser.add_argument("--compressors", nargs="+", default=list(FIXED_CHOICES))
    parser.add_argument("--model", default="cnn")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--image-size", type=int, default=None)
    parser.add_argument("--seq-len", type=int, default=64, help="sequence length (BERT models)")
    parser.add_argument("--bucket-cap-mb", type=float, default=0.25)
    parser.add_argument("--lr", type=float, default=0.02)
    parser.add_argument("--lr-schedule", choices=LR_SCHEDULES, default="constant",
                        help="step times do not depend on it")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sync-every", type=int, default=5)
    parser.add_argument("--max-wait-quiet-s", type=float, default=20.0)
    parser.add_argument("--json-out", type=Path, default=None)
    parser.add_argument("--plot", type=Path, default=None)
    parser.add_argument("--md-out", type=Path, default=None)
    parser.add_argument("--keep", type=Path, default=None)
    args = parser.parse_args(argv)
    args.probe_interval_s = 86_400.0  # one probe at start only: no probe inside a measured phase
    args.report_interval_s = 1e-3  # a report every step: each phase's window ends on its last step
    args.probe_budget = 0.02  # the job default (with one probe only, it never binds)
    if args.steps_per_rate < 60:
        parser.error("--steps-per-rate: must be >= 60")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    ok, why = Testbed.available()
    if not ok:
        print(f"testbed unavailable: {why}", file=sys.stderr)
        return 2
    started = time.monotonic()
    rows, links = run_all(args)
    table = markdown(rows, args.rates)
    print(table)
    doc = {"rates_mbit": args.rates, "links": {f"{k:g}": v for k, v in links.items()}, "target": TARGET,
           "job": {"model": args.model, "batch_size": args.batch_size, "bucket_cap_mb": args.bucket_cap_mb,
                   "lr": args.lr, "steps_per_rate": args.steps_per_rate, "warmup_steps": args.warmup_steps,
                   "workers": 2},
           "rows": rows}
    plot_path = write_results(args, doc, table)
    if plot_path:
        plot(rows, plot_path)
    print(f"[calibration] done in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
