"""``python -m benchmarks.simulate``: validate against ``paper.json``, predict at paper scale, write the results.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Sequence

from benchmarks.outputs import write_whole
from benchmarks.repo import REPO_ROOT
from benchmarks.simulate.model import TOPK_RATIO
from benchmarks.simulate.report import explain, plot, write_markdown
from benchmarks.simulate.scale import GPU_CODEC_FIXED_S, GPU_CODEC_SPEEDUP, GPU_COMPUTE, NETWORKS, scale_grid, speedups
from benchmarks.simulate.validate import validate, validation_summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.simulate", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--paper-json", type=Path, default=REPO_ROOT / "benchmarks/results/paper.json",
                        help="real runs (benchmarks.paper --json-out): validation and measured ready-time profiles")
    parser.add_argument("--cost-json", type=Path, default=REPO_ROOT / "benchmarks/results/compressor_cost.json",
                        help="measured encode+decode seconds per method (benchmarks.compressor_cost)")
    parser.add_argument("--codec-speedup", type=float, default=GPU_CODEC_SPEEDUP,
                        help="assumed GPU/CPU speed ratio of the codec kernels")
    parser.add_argument("--json-out", type=Path, default=REPO_ROOT / "benchmarks/results/simulate.json")
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
            "Backward spread over layers as measured on CPU (per-parameter gradient ready times of benchmarks.paper's "
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
    write_whole(args.json_out, json.dumps(result, indent=2))
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
