"""Scale simulator: the α-β pipelined-bucket model of ``planning.costmodel``, at paper scale.

Why: this machine can run 2 (at most 4) workers on emulated links of a few hundred Mbit/s,
while the paper's claims are about 8-64 GPUs on 1/10/100 Gb/s. The cost model the adaptive
policy already uses (``planning.costmodel.predict_step``: buckets ready in reverse layer
order, one compute stream, one link, PowerSGD's two dependent rounds) is fed here with

* **measured per-bucket backward compute**: ``benchmarks/paper.py`` records, in a calibration
  run, when each parameter's gradient becomes ready during backward; those ready times are
  summed into whatever bucket layout a method uses (the paper-scale predictions keep the
  measured *shape* of backward and scale it to an assumed GPU total, see below);
* **measured encode/decode time**: each real run's own ``compress + decompress`` CPU seconds
  for the validation (× :func:`codec_share_factor` where ranks outnumber cores; PyTorch's
  hook, whose codec cannot be timed in its run, by ``paper.py``'s estimate: our PowerSGD's ×
  the torch/ours ratio measured apart in the runs' layouts), and
  ``benchmarks/results/compressor_cost.json`` (same parameter shapes as the paper: ResNet-50
  rank 4, BERT-Base rank 32) turned into seconds per element pass for the paper-scale
  predictions, so the N-dependent decode of the all-gather methods scales;
* **measured links**: α and β fitted in every real run (``workers.probe.probe_link``).

It does two things:

1. ``validate``: re-predict every real small-scale run of ``paper.json`` (same shapes, layout,
   pipelining, link) and report the prediction error (target: within 20 %);
2. ``scale``: predict iteration time of every method for 8-64 workers at 1, 10 and 100 Gb/s on
   ResNet-50 (batch 64, rank 4) and BERT-Base (batch 32, seq 64, rank 32), and ACP-SGD's
   speedups at 32 workers on 1 and 10 GbE beside the paper's averages (4.06×, 1.43×).

ASSUMED (not measured here, no GPU on this machine): V100-class fp32 compute times, GPU
encode/decode = CPU time ÷ ``GPU_CODEC_SPEEDUP`` (+ a launch overhead per bucket phase), and
per-message latencies α of the three networks; all in :data:`GPU_COMPUTE`, :data:`NETWORKS`.

    python benchmarks/simulate.py --paper-json benchmarks/results/paper.json \
        --json-out benchmarks/results/simulate.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `benchmarks` is not an installed package
    sys.path.insert(0, str(ROOT))

from planning.costmodel import (  # noqa: E402
    CodecCost,
    CodecModel,
    ElementCost,
    Link,
    StepPrediction,
    StepProfile,
    build_bucket_layout,
    codec_work,
    predict_step,
)
from planning.spec import CompressorSpec, make_spec  # noqa: E402

METHODS: tuple[str, ...] = ("ssgd", "signsgd", "topk", "powersgd", "torch_powersgd", "acpsgd")
TOPK_RATIO = 0.01
MB = 1024 * 1024
#: DDP's bucket cap when none is given, and its small first bucket (only when none is given).
DEFAULT_BUCKET_CAP_MB = 25.0
DDP_FIRST_BUCKET_MB = 1.0
#: A bucket cap this large means "one bucket" (PyTorch's powerSGD_hook on gloo, see paper.py).
ONE_BUCKET_MB = 10_000.0

#: The paper's averages (ICDCS'23, abstract): ACP-SGD over S-SGD and over PowerSGD.
PAPER_SPEEDUP = {"ssgd": 4.06, "powersgd": 1.43}


def method_spec(method: str, rank: int = 4, ratio: float = TOPK_RATIO) -> CompressorSpec:
    """The compressor spec whose bytes and codec work a benchmark method has.

    ``torch_powersgd`` (PyTorch's ``powerSGD_hook``) sends exactly PowerSGD's bytes in the
    same two dependent rounds; only its codec cost and (on gloo) its bucketing differ.
    """
    if method == "ssgd":
        return make_spec("none")
    if method in ("signsgd",):
        return make_spec("signsgd")
    if method == "topk":
        return make_spec("topk", ratio=ratio)
    if method in ("powersgd", "torch_powersgd"):
        return make_spec("powersgd", rank=rank)
    if method == "acpsgd":
        return make_spec("acpsgd", rank=rank)
    raise ValueError(f"method: unknown {method!r}; choose one of {', '.join(METHODS)}")


def layout_for(shapes: Sequence[Sequence[int]], bucket_cap_mb: float, *, ddp_default: bool = False) -> tuple[tuple[int, ...], ...]:
    """DDP's bucket layout for a cap: parameters in reverse order, a bucket closes at the cap.

    An explicit ``bucket_cap_mb`` makes DDP use it for the first bucket too; only DDP's
    default (``ddp_default``) starts with a 1 MiB bucket so that communication starts early.
    """
    first = DDP_FIRST_BUCKET_MB * MB if ddp_default else None
    return build_bucket_layout(shapes, bucket_cap_mb * MB, first_bucket_bytes=first)


def bucket_segments(
    layout: Sequence[Sequence[int]],
    ready_s: Sequence[float] | None,
    backward_s: float,
    *,
    pipelining: bool = True,
) -> tuple[float, ...] | None:
    """Backward compute between consecutive bucket-ready times, scaled to ``backward_s``.

    ``ready_s[i]``: when parameter i's gradient was ready, seconds after backward began
    (measured). A bucket is ready when its last gradient is. Without ready times the cost
    model spreads backward by parameter count (poor for CNNs, whose early layers have few
    parameters but much compute). ``pipelining=False``: nothing is sent before backward has
    ended, i.e. every bucket becomes ready at its end (all compute in the first segment).
    """
    if not layout:
        return None
    if not pipelining:
        return (backward_s,) + (0.0,) * (len(layout) - 1)
    if ready_s is None:
        return None
    ends = [max(ready_s[i] for i in bucket) for bucket in layout]
    segments, previous = [], 0.0
    for end in ends:
        end = max(end, previous)  # a bucket cannot be ready before the one DDP fires before it
        segments.append(end - previous)
        previous = end
    total = sum(segments)
    if total <= 0:
        return None
    return tuple(backward_s * s / total for s in segments)


@dataclass(frozen=True)
class Compute:
    """Compute of one step on one worker: forward (incl. data), backward, optimizer (seconds),
    and the measured ready time of every parameter's gradient (None: spread by size)."""

    forward_s: float
    backward_s: float
    optimizer_s: float
    ready_s: tuple[float, ...] | None = None
    label: str = "measured"
    #: The cost model's host terms (planning.costmodel): σ of compute per step, and host
    #: CPU per collective. 0 where not measured (the paper-scale GPU inputs).
    jitter_s: float = 0.0
    collective_cpu_s: float = 0.0


def predict(
    method: str,
    shapes: Sequence[Sequence[int]],
    compute: Compute,
    workers: int,
    link: Link,
    *,
    rank: int = 4,
    codec: CodecModel | None = None,
    bucket_cap_mb: float = DEFAULT_BUCKET_CAP_MB,
    pipelining: bool = True,
    ddp_default_first_bucket: bool = False,
) -> StepPrediction:
    """Predicted step of ``method`` with ``workers`` workers on ``link``: the cost model, fed.

    ``codec`` is the method's encode+decode cost (default: the cost model's uncalibrated CPU
    guess). ``bucket_cap_mb`` is the fusion buffer, ``pipelining`` the paper's ablation.
    """
    spec = method_spec(method, rank)
    shape_tuple = tuple(tuple(int(d) for d in s) for s in shapes)
    layout = layout_for(shape_tuple, bucket_cap_mb, ddp_default=ddp_default_first_bucket)
    segments = bucket_segments(layout, compute.ready_s, compute.backward_s, pipelining=pipelining)
    profile = StepProfile.build(
        shape_tuple,
        forward_s=compute.forward_s,
        backward_s=compute.backward_s,
        optimizer_s=compute.optimizer_s,
        buckets=layout,
        bucket_backward_s=segments,
        compute_jitter_s=compute.jitter_s,
        collective_cpu_s=compute.collective_cpu_s,
    )
    return predict_step(spec, profile, workers, link, codec=codec)


# --------------------------------------------------------------------------- paper-scale inputs

#: ASSUMED V100-class fp32 compute per worker at the paper's batch sizes (this machine has no
#: GPU): ResNet-50, batch 64, 224 px ≈ 360 images/s training (public V100 fp32 figures);
#: BERT-Base, batch 32 × seq 64 ≈ 6·85 M·2048 FLOP ≈ 1.05 TFLOP per step at ~50 % of 15.7
#: TFLOP/s. Split forward : backward ≈ 1 : 2. The measured CPU ready-time profile gives how
#: backward is spread over the layers.
GPU_COMPUTE: dict[str, dict[str, float]] = {
    "resnet50": {"forward_s": 0.060, "backward_s": 0.120, "optimizer_s": 0.004, "batch": 64, "rank": 4},
    "bert-base": {"forward_s": 0.045, "backward_s": 0.090, "optimizer_s": 0.010, "batch": 32, "rank": 32},
}
#: ASSUMED: a GPU runs the codec's streaming/matmul kernels this many times faster than the
#: CPU that measured compressor_cost.json (V100 ~900 GB/s vs a few tens of GB/s here), plus a
#: fixed launch cost per bucket phase.
GPU_CODEC_SPEEDUP = 30.0
GPU_CODEC_FIXED_S = 50e-6

#: Networks of the paper with ASSUMED per-message latency α of one ring step (NCCL over TCP on
#: Ethernet: tens of µs; over InfiniBand: a few µs). Bandwidth is the NIC rate per worker.
NETWORKS: dict[str, dict[str, float]] = {
    "1GbE": {"gbit": 1.0, "alpha_s": 50e-6},
    "10GbE": {"gbit": 10.0, "alpha_s": 25e-6},
    "100GbIB": {"gbit": 100.0, "alpha_s": 5e-6},
}
SCALE_WORKERS: tuple[int, ...] = (8, 16, 32, 64)
#: compressor_cost.json names for each method's codec measurement.
COST_NAMES = {"ssgd": "none", "signsgd": "signsgd", "topk": "topk", "powersgd": "powersgd",
              "torch_powersgd": "torch_powersgd", "acpsgd": "acpsgd"}


def network_link(name: str) -> Link:
    net = NETWORKS[name]
    return Link(alpha=net["alpha_s"], beta=8.0 / (net["gbit"] * 1e9))


def gpu_codec(method: str, shapes: Sequence[Sequence[int]], rank: int, cost_json: Mapping[str, Any] | None,
              model: str, speedup: float = GPU_CODEC_SPEEDUP) -> ElementCost:
    """Per-element GPU codec cost from the CPU measurement (compressor_cost.json), ÷ ``speedup``.

    compressor_cost.json times one step's encode+decode at world size 1 on the paper's shapes;
    dividing by ``codec_work`` at world size 1 gives seconds per element pass, which the cost
    model then applies at any N (so the all-gather methods' decode grows with N).
    """
    spec = method_spec(method, rank)
    work = codec_work(spec, [tuple(s) for s in shapes], 1)
    measured = None
    if cost_json is not None:
        measured = cost_json.get(model, {}).get(COST_NAMES[method], {}).get("encode_decode_s")
    if measured is None or work <= 0:
        return ElementCost(per_element_s=1e-9 / speedup, fixed_s=GPU_CODEC_FIXED_S, calibrated=False)
    return ElementCost(per_element_s=measured / work / speedup, fixed_s=GPU_CODEC_FIXED_S)


def ready_fractions(ready_s: Sequence[float] | None) -> tuple[float, ...] | None:
    """Ready times as fractions of the slowest one: the measured shape of backward."""
    if not ready_s:
        return None
    last = max(ready_s)
    return tuple(t / last for t in ready_s) if last > 0 else None


def scale_grid(
    shapes_by_model: Mapping[str, Sequence[Sequence[int]]],
    ready_by_model: Mapping[str, Sequence[float] | None],
    cost_json: Mapping[str, Any] | None,
    *,
    workers: Iterable[int] = SCALE_WORKERS,
    networks: Iterable[str] = tuple(NETWORKS),
    methods: Iterable[str] = METHODS,
    codec_speedup: float = GPU_CODEC_SPEEDUP,
) -> list[dict[str, Any]]:
    """Predicted iteration time of every (model, network, workers, method) at paper scale."""
    rows = []
    for model, shapes in shapes_by_model.items():
        gpu = GPU_COMPUTE[model]
        fractions = ready_fractions(ready_by_model.get(model))
        compute = Compute(gpu["forward_s"], gpu["backward_s"], gpu["optimizer_s"],
                          ready_s=tuple(f * gpu["backward_s"] for f in fractions) if fractions else None,
                          label="assumed V100-class")
        rank = int(gpu["rank"])
        for net in networks:
            link = network_link(net)
            for n in workers:
                for method in methods:
                    codec = gpu_codec(method, shapes, rank, cost_json, model, codec_speedup)
                    # NCCL has no gloo deadlock: PyTorch's hook runs on DDP's default buckets.
                    pred = predict(method, shapes, compute, n, link, rank=rank, codec=codec,
                                   ddp_default_first_bucket=True)
                    rows.append({
                        "model": model, "network": net, "gbit": NETWORKS[net]["gbit"], "workers": n,
                        "method": method, "iter_s": pred.step_s, "compute_s": pred.compute_s,
                        "codec_s": pred.codec_s, "comm_s": pred.comm_s, "exposed_comm_s": pred.exposed_comm_s,
                        "bytes_per_step": pred.bytes_per_step,
                        "samples_per_s": gpu["batch"] * n / pred.step_s,
                    })
    return rows


def speedups(rows: Sequence[Mapping[str, Any]], workers: int = 32, networks: Sequence[str] = ("1GbE", "10GbE")) -> dict[str, Any]:
    """ACP-SGD's predicted speedup over S-SGD and PowerSGD per (model, network), and their mean."""
    table: dict[tuple[str, str, str], float] = {
        (r["model"], r["network"], r["method"]): r["iter_s"] for r in rows if r["workers"] == workers
    }
    cases = []
    for model in sorted({r["model"] for r in rows}):
        for net in networks:
            acp = table.get((model, net, "acpsgd"))
            if acp is None:
                continue
            cases.append({
                "model": model, "network": net,
                "over_ssgd": table[(model, net, "ssgd")] / acp,
                "over_powersgd": table[(model, net, "powersgd")] / acp,
                "over_torch_powersgd": table[(model, net, "torch_powersgd")] / acp,
            })
    keys = ("over_ssgd", "over_powersgd")
    mean = {key: statistics.fmean(c[key] for c in cases) for key in keys} if cases else {}
    by_network = {net: {key: statistics.fmean(c[key] for c in cases if c["network"] == net) for key in keys}
                  for net in networks if any(c["network"] == net for c in cases)}
    return {"workers": workers, "cases": cases, "mean": mean, "by_network": by_network,
            "paper": {"over_ssgd": PAPER_SPEEDUP["ssgd"], "over_powersgd": PAPER_SPEEDUP["powersgd"]}}


# --------------------------------------------------------------------------- validation


def _shapes_for(row: Mapping[str, Any], paper: Mapping[str, Any]) -> list[tuple[int, ...]]:
    return [tuple(s) for s in paper["workloads"][row["model"]]["shapes"]]


def codec_share_factor(workers: int, cpu_cores: int | None) -> float:
    """Wall seconds per CPU second of a codec on the measuring host.

    The runs time codecs as CPU time (``compressors.sync``), and the ranks (one CPU thread
    each, as ``paper.py`` runs them) run theirs at about the same moment (their collectives
    keep them in step), so N ranks on C < N cores get C/N of a core each: 4 ranks on this
    machine's 2 cores take twice as long. Compute needs no such factor: it is measured in
    wall time, at the same worker count.
    """
    return max(1.0, workers / cpu_cores) if cpu_cores else 1.0


def validate(paper: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Re-predict every real run in ``paper.json`` with the cost model; error per run.

    Inputs per run: the model's calibrated compute (forward incl. data, backward compute,
    optimizer), per-parameter ready times and host CPU per collective, the run's own measured
    link (α, β from its probe; the testbed's wake-up cost), compute jitter and encode+decode
    seconds (× :func:`codec_share_factor`), its bucket cap and pipelining flag.
    """
    out = []
    rows = list(paper.get("results", [])) + list(paper.get("ablations", []))
    links = _links_by_setting(rows)
    host = paper.get("host") or {}
    wake = host.get("wake_s", {})
    for row in rows:
        workload = paper["workloads"].get(row["model"])
        calib = (paper.get("calibration") or {}).get(f"{row['model']}/{row['workers']}")
        if workload is None or calib is None or not row.get("link"):
            continue
        link = links[(row["workers"], row["mbit"])]._replace(wake_s=wake.get(str(row["workers"]), 0.0))
        compute = Compute(calib["forward_s"], calib["backward_s"], calib["optimizer_s"],
                          ready_s=tuple(calib["ready_s"]) if calib.get("ready_s") else None,
                          jitter_s=row.get("compute_jitter_s", 0.0), collective_cpu_s=calib.get("collective_cpu_s", 0.0))
        codec_s = max(0.0, row["phase_s"].get("compress", 0.0) + row["phase_s"].get("decompress", 0.0))
        if row["method"] == "torch_powersgd":
            # Its hook's whole run (encode, both rounds, decode) is one timed span: paper.py
            # estimates its codec as our PowerSGD's × the torch/ours ratio measured apart.
            codec_s = row.get("codec_estimate_s", 0.0)
        cores = row.get("cpu_cores") or host.get("cpu_cores")  # the run's own; else the report's machine
        codec = CodecCost(step_s=codec_s * codec_share_factor(row["workers"], cores))
        pred = predict(row["method"], _shapes_for(row, paper), compute, row["workers"], link,
                       rank=row.get("rank") or workload["rank"], codec=codec,
                       bucket_cap_mb=row["bucket_cap_mb"], pipelining=row.get("pipelining", True))
        error = (pred.step_s - row["iter_s"]) / row["iter_s"]
        out.append({
            "model": row["model"], "method": row["method"], "workers": row["workers"], "mbit": row["mbit"],
            "bucket_cap_mb": row["bucket_cap_mb"], "pipelining": row.get("pipelining", True),
            "rank": row.get("rank"), "tag": row.get("tag", ""),
            "measured_s": row["iter_s"], "predicted_s": pred.step_s, "error": error,
            "predicted_exposed_comm_s": pred.exposed_comm_s, "measured_exposed_comm_s": row["exposed_comm_s"],
            "other_cpu_cores": row.get("other_cpu_cores"),
        })
    return out


def _links_by_setting(rows: Sequence[Mapping[str, Any]]) -> dict[tuple[int, float], Link]:
    """One link per (workers, rate): the median α and β of every run's own probe there.

    A single probe's two-point fit is noisy (α from 0 to 2 ms on the same veth); the rate set
    with ``tc`` is the same for all runs of a setting, so their median is the better estimate.
    """
    groups: dict[tuple[int, float], list[Mapping[str, Any]]] = {}
    for row in rows:
        if row.get("link"):
            groups.setdefault((row["workers"], row["mbit"]), []).append(row["link"])
    return {key: Link(alpha=statistics.median(link["alpha_s"] for link in group),
                      beta=statistics.median(link["beta_s_per_byte"] for link in group))
            for key, group in groups.items()}


def validation_summary(rows: Sequence[Mapping[str, Any]], max_other_cores: float = 0.35) -> dict[str, Any]:
    """Error statistics over all runs, and over the runs no other process disturbed."""
    if not rows:
        return {"runs": 0}
    quiet = [r for r in rows if (r.get("other_cpu_cores") or 0.0) <= max_other_cores]
    out = _error_stats(rows)
    out["undisturbed"] = _error_stats(quiet) if quiet else {"runs": 0}
    out["undisturbed"]["max_other_cores"] = max_other_cores
    return out


def _error_stats(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    errors = [abs(r["error"]) for r in rows]
    by_method = {}
    for method in METHODS:
        e = [abs(r["error"]) for r in rows if r["method"] == method]
        if e:
            by_method[method] = {"runs": len(e), "mean_abs_error": statistics.fmean(e), "max_abs_error": max(e)}
    return {
        "runs": len(rows),
        "mean_abs_error": statistics.fmean(errors),
        "median_abs_error": statistics.median(errors),
        "within_20pct": sum(e <= 0.20 for e in errors) / len(errors),
        "by_method": by_method,
    }


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
    path.write_text("\n".join(lines))


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--paper-json", type=Path, default=ROOT / "benchmarks/results/paper.json",
                        help="real runs (paper.py --json-out): validation and measured ready-time profiles")
    parser.add_argument("--cost-json", type=Path, default=ROOT / "benchmarks/results/compressor_cost.json",
                        help="measured encode+decode seconds per method (benchmarks/compressor_cost.py)")
    parser.add_argument("--codec-speedup", type=float, default=GPU_CODEC_SPEEDUP,
                        help="assumed GPU/CPU speed ratio of the codec kernels")
    parser.add_argument("--json-out", type=Path, default=ROOT / "benchmarks/results/simulate.json")
    args = parser.parse_args(argv)

    from workers.models import parameter_shapes

    paper = json.loads(args.paper_json.read_text()) if args.paper_json.exists() else {}
    cost = json.loads(args.cost_json.read_text()) if args.cost_json.exists() else None
    shapes = {model: parameter_shapes(model) for model in GPU_COMPUTE}
    ready: dict[str, Sequence[float] | None] = {}
    for model in GPU_COMPUTE:
        calib = (paper.get("calibration") or {}).get(f"{model}/2") or {}
        same_shapes = [tuple(s) for s in paper.get("workloads", {}).get(model, {}).get("shapes", [])] == shapes[model]
        ready[model] = calib.get("ready_s") if same_shapes else None
    scale = scale_grid(shapes, ready, cost, codec_speedup=args.codec_speedup)
    validation = validate(paper) if paper else []
    summary = validation_summary(validation)
    s = speedups(scale)
    result = {
        "validation": validation,
        "validation_summary": summary,
        "scale": scale,
        "speedups": s,
        "notes": explain(s, shapes),
        "assumptions": [
            "GPU compute (V100-class fp32, NOT measured here): " + "; ".join(
                f"{m}: batch {int(c['batch'])}, forward {c['forward_s'] * 1e3:.0f} ms, backward "
                f"{c['backward_s'] * 1e3:.0f} ms, optimizer {c['optimizer_s'] * 1e3:.0f} ms"
                for m, c in GPU_COMPUTE.items()),
            "Backward spread over layers as measured on CPU (per-parameter gradient ready times of paper.py's "
            "calibration run) where the benchmark used the paper's shapes; else by parameter count.",
            f"GPU codec = CPU per-element cost from compressor_cost.json ÷ {args.codec_speedup:g}, "
            f"+ {GPU_CODEC_FIXED_S * 1e6:.0f} µs per bucket phase (assumed).",
            "Networks (α assumed, β = 1/line rate): " + "; ".join(
                f"{k}: {v['gbit']:g} Gb/s, α = {v['alpha_s'] * 1e6:.0f} µs" for k, v in NETWORKS.items()),
            "Ring collectives: all-reduce 2(N−1)α + 2(N−1)/N·b·β, all-gather (N−1)α + (N−1)·b·β; one NIC per worker; "
            "DDP buckets of 25 MB with a 1 MB first bucket; PyTorch's powerSGD_hook at scale = PowerSGD's "
            "bytes and rounds with its own measured codec cost (NCCL, no gloo deadlock).",
            f"Top-k ratio {TOPK_RATIO}; ranks: ResNet-50 4, BERT-Base 32 (the paper's).",
        ],
    }
    args.json_out.parent.mkdir(parents=True, exist_ok=True)
    args.json_out.write_text(json.dumps(result, indent=2))
    write_markdown(args.json_out.with_suffix(".md"), result)
    plot(args.json_out.with_name(args.json_out.stem + "_scale.png"), scale)
    if summary.get("runs"):
        print(f"validation: {summary['runs']} runs, mean |error| {summary['mean_abs_error']:.1%}, "
              f"{summary['within_20pct']:.0%} within 20 %")
    for c in s["cases"]:
        print(f"{c['model']:9s} {c['network']:6s} N={s['workers']}: ACP-SGD {c['over_ssgd']:.2f}× over S-SGD, "
              f"{c['over_powersgd']:.2f}× over PowerSGD")
    if s["mean"]:
        print(f"mean: {s['mean']['over_ssgd']:.2f}× (paper 4.06×), {s['mean']['over_powersgd']:.2f}× (paper 1.43×)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
