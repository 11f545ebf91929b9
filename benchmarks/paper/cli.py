"""``python -m benchmarks.paper``: the command line, and the plan of cells it measures.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Sequence

from benchmarks.outputs import write_whole
from benchmarks.paper.acceptance import acceptance
from benchmarks.paper.cells import (
    ABLATION_PROTOCOL,
    CALIBRATION_MBIT,
    CALIBRATION_PROTOCOL,
    CODEC_BUCKET_CAP_MB,
    FALLBACK_PROTOCOLS,
    FUSION_CAPS_MB,
    GRID_MBITS,
    METHODS,
    PAPER_PROTOCOL,
    QUICK_PROTOCOL,
    RANK_SWEEP,
    WORKLOADS,
    Cell,
    Protocol,
    cell_from_json,
)
from benchmarks.paper.rank import codecs_main, rank_main
from benchmarks.paper.report import notes, pass_fail, plot_ablations, plot_phases, plot_speedup, write_markdown
from benchmarks.paper.runner import Runner, cell_label
from benchmarks.paper.stats import (
    add_codec_estimates,
    calibration_entry,
    choose_protocol,
    collective_cpu_s,
    predicted_step_s,
    regime_rates,
    summarize,
    wire_bytes,
)
from benchmarks.repo import REPO_ROOT
from benchmarks.testbed import Testbed

# --------------------------------------------------------------------------- the plan


def workload_info(name: str, workers: int, shapes: Sequence[Sequence[int]]) -> dict[str, Any]:
    w = WORKLOADS[name]
    return {
        "here": w.describe(), "paper": w.paper, "rank": w.rank, "shapes": [list(s) for s in shapes],
        "parameters": sum(math.prod(s) for s in shapes),
        "bytes": {m: wire_bytes(m, shapes, w.rank, workers) for m in METHODS},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.paper", description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd")
    rank_parser = sub.add_parser("_rank", help=argparse.SUPPRESS)
    rank_parser.add_argument("--cell", required=True)
    rank_parser.add_argument("--rank", type=int, required=True)
    rank_parser.add_argument("--world", type=int, required=True)
    rank_parser.add_argument("--init", required=True)
    rank_parser.add_argument("--out", type=Path)
    codecs_parser = sub.add_parser("_codecs", help=argparse.SUPPRESS)
    codecs_parser.add_argument("--workload", required=True, choices=list(WORKLOADS))
    codecs_parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--quick", action="store_true",
                        help=f"ResNet-50 + BERT-Base, 2 workers, regimes (a) and (b) only, protocol "
                             f"{QUICK_PROTOCOL.warmup} warm-up + {QUICK_PROTOCOL.repeats}×{QUICK_PROTOCOL.iters}")
    parser.add_argument("--models", nargs="+", choices=list(WORKLOADS))
    parser.add_argument("--mbits", nargs="+", type=float,
                        help="grid bandwidths for every model (default: 100 500 2000 Mbit/s for ResNet-50 and "
                             "BERT-Base, 500 2000 for ResNet-152 and BERT-Large, whose S-SGD at 100 Mbit/s "
                             "takes 20-45 s an iteration)")
    parser.add_argument("--four-workers", action=argparse.BooleanOptionalAction, default=None,
                        help="also ResNet-50 with 4 workers (full run default: on)")
    parser.add_argument("--ablations", action=argparse.BooleanOptionalAction, default=None,
                        help="fusion sweep, pipelining off, rank sweep (full run default: on)")
    parser.add_argument("--grid", action=argparse.BooleanOptionalAction, default=None,
                        help="the bandwidth grid (full run default: on)")
    parser.add_argument("--grid-models", nargs="+", choices=list(WORKLOADS),
                        help="models that get the bandwidth grid (default: every model of --models)")
    parser.add_argument("--ablation-models", nargs="+", choices=["resnet50", "bert-base"],
                        help="models that get the ablations (default: ResNet-50 and BERT-Base, if in --models)")
    parser.add_argument("--cell-budget-s", type=float, default=90.0,
                        help="predicted seconds above which a cell uses a shorter protocol (full run)")
    parser.add_argument("--cache-dir", type=Path, default=Path(tempfile.gettempdir()) / "gradwire-paper-cache",
                        help="finished cells are kept here and reused (delete it, or --no-cache, to re-measure)")
    parser.add_argument("--no-cache", action="store_true")
    parser.add_argument("--remeasure-disturbed", action="store_true",
                        help="measure cached configurations again if other processes disturbed them")
    parser.add_argument("--retries", type=int, help="re-measure a disturbed configuration up to this often "
                        "(default 1; 0 with --quick)")
    parser.add_argument("--quiet-wait-s", type=float,
                        help="before each measurement, wait up to this long for other processes to calm down "
                             "(default 120; 20 with --quick)")
    parser.add_argument("--max-other-cores", type=float, default=0.35,
                        help="CPU cores other processes may use during a measurement before it counts as disturbed")
    parser.add_argument("--json-out", type=Path, help="default benchmarks/results/paper.json (paper_quick.json with --quick)")
    args = parser.parse_args(argv)
    if args.cmd == "_rank":
        rank_main(cell_from_json(args.cell), args.rank, args.world, args.init, args.out)
        return 0
    if args.cmd == "_codecs":
        codecs_main(args.workload, args.out)
        return 0
    return run_benchmark(args, argv)


def run_benchmark(args: argparse.Namespace, argv: list[str] | None) -> int:
    from workers.models import parameter_shapes

    ok, why = Testbed.available()
    if not ok:
        print(f"testbed unavailable: {why}", file=sys.stderr)
        return 2
    quick = args.quick
    if args.retries is None:
        args.retries = 0 if quick else 1
    models = args.models or (["resnet50", "bert-base"] if quick else list(WORKLOADS))
    four = (not quick) if args.four_workers is None else args.four_workers
    ablations = (not quick) if args.ablations is None else args.ablations
    grid = (not quick) if args.grid is None else args.grid
    json_out = args.json_out or REPO_ROOT / "benchmarks/results" / ("paper_quick.json" if quick else "paper.json")
    cost_path = REPO_ROOT / "benchmarks/results/compressor_cost.json"
    cost = json.loads(cost_path.read_text()) if cost_path.exists() else None
    runner = Runner(None if args.no_cache else args.cache_dir, quiet_cores=args.max_other_cores,
                    quiet_wait_s=args.quiet_wait_s if args.quiet_wait_s is not None else (20.0 if quick else 120.0))
    runner.remeasure_disturbed = args.remeasure_disturbed
    started = time.monotonic()
    results: list[dict[str, Any]] = []
    ablation_rows: list[dict[str, Any]] = []
    calibration: dict[str, Any] = {}
    codecs: dict[str, dict[str, float]] = {}
    wake_s: dict[int, float] = {}
    regimes: dict[str, Any] = {}
    workloads: dict[str, Any] = {}
    shapes: dict[str, list[tuple[int, ...]]] = {}

    def measure(cell: Cell, into: list[dict[str, Any]], protocol: Protocol | None = None) -> dict[str, Any]:
        calib = calibration[f"{cell.workload}/{cell.workers}"]
        step = predicted_step_s(cell, calib, shapes[cell.workload], cost)
        cell = replace(cell, protocol=protocol or choose_protocol(step, args.cell_budget_s, quick))
        print(f"  run     {cell_label(cell)} (predicted {step:.2f} s/iter)", flush=True)
        raw = runner.run(cell, timeout_s=300 + 4 * step * cell.protocol.steps, retries=args.retries,
                         max_other_cores=args.max_other_cores)
        row = summarize(cell, raw)
        row["predicted_plan_s"] = step
        into.append(row)
        print(f"          {row['iter_s']:.3f} ± {row['iter_ci_s']:.3f} s/iter, exposed {row['exposed_comm_s']:.3f} s, "
              f"{row['bytes_per_step'] / 1e6:.2f} MB/step, link {row['link_mbit_seen'] or 0:.0f} Mbit/s, "
              f"other load {row['other_cpu_cores']:.2f} cores", flush=True)
        return row

    try:
        # 1. Calibration: compute per model (and worker count) with nothing overlapping backward.
        worker_counts = {m: ([2, 4] if (four and m == "resnet50") else [2]) for m in models}
        for model in models:
            shapes[model] = [tuple(s) for s in parameter_shapes(WORKLOADS[model].model, **WORKLOADS[model].build_kwargs())]
            workloads[model] = workload_info(model, 2, shapes[model])
            for n in worker_counts[model]:
                cell = Cell(model, "ssgd", n, CALIBRATION_MBIT, pipelining=False, protocol=CALIBRATION_PROTOCOL,
                            tag="calibration")
                print(f"calibrate {cell_label(cell)}", flush=True)
                raw = runner.run(cell, timeout_s=900, retries=args.retries, max_other_cores=args.max_other_cores)
                calibration[f"{model}/{n}"] = calibration_entry(cell, raw)
                c = calibration[f"{model}/{n}"]
                unfused = replace(cell, bucket_cap_mb=FUSION_CAPS_MB[0])
                print(f"calibrate {cell_label(unfused)}", flush=True)
                unfused_raw = runner.run(unfused, timeout_s=900, retries=args.retries, max_other_cores=args.max_other_cores)
                c["collective_cpu_s"] = collective_cpu_s(cell, raw, unfused, unfused_raw, shapes[model])
                print(f"          forward {c['forward_s']:.3f} s, backward {c['backward_s']:.3f} s, "
                      f"optimizer {c['optimizer_s']:.3f} s, host CPU per collective {c['collective_cpu_s'] * 1e3:.2f} ms",
                      flush=True)
            codecs[model] = runner.isolated_codecs(model)
            print(f"codecs {model} apart from communication: PowerSGD ({CODEC_BUCKET_CAP_MB:g} MB buckets) "
                  f"{codecs[model]['powersgd_s']:.3f} s, torch powerSGD_hook (one bucket) "
                  f"{codecs[model]['torch_powersgd_s']:.3f} s", flush=True)
            for n in worker_counts[model]:
                if n not in wake_s:
                    wake_s[n] = runner.wake_up_s(n)
                    print(f"link wake-up with {n} workers: {wake_s[n] * 1e3:.2f} ms", flush=True)
        # 2. Regimes, from measured compute and the byte formulas.
        for model in models:
            regimes[model] = regime_rates(WORKLOADS[model], calibration[f"{model}/2"], shapes[model], 2)
            print(f"regimes {model}: (a) {regimes[model]['a']:g} Mbit/s, (b) {regimes[model]['b']:g} Mbit/s", flush=True)
        # 3. Acceptance cells: all methods at (a); the PowerSGD family at (b). Cheapest first.
        accept_models = [m for m in ("resnet50", "bert-base") if m in models]
        for model in accept_models:
            # --quick: BERT-Base's slow compressors (Top-k, EF-SignSGD: seconds of CPU codec) and
            # its PowerSGD are left out at (a), to stay within minutes; ResNet-50 runs all six.
            methods_a = ("ssgd", "acpsgd") if (quick and model == "bert-base") else METHODS
            for method in methods_a:
                measure(Cell(model, method, 2, regimes[model]["a"], tag="regime-a"), results)
            for method in ("powersgd", "torch_powersgd", "acpsgd"):
                measure(Cell(model, method, 2, regimes[model]["b"], tag="regime-b"), results)
        # 4. The bandwidth grid (and 4 workers for ResNet-50).
        if grid:
            for model in [m for m in models if not args.grid_models or m in args.grid_models]:
                for mbit in args.mbits or GRID_MBITS[model]:
                    for method in METHODS:
                        measure(Cell(model, method, 2, float(mbit)), results)
            if four and "resnet50" in models:
                for method in METHODS:
                    measure(Cell("resnet50", method, 4, 500.0), results)
        # 5. Ablations at regime (b), where overlap and fusion matter most (S-SGD's pipelining
        #    at (a), where S-SGD is affordable); a shorter protocol: they show trends.
        if ablations:
            ablate = None if quick else ABLATION_PROTOCOL
            for model in [m for m in accept_models if not args.ablation_models or m in args.ablation_models]:
                mbit = regimes[model]["b"]
                for cap in FUSION_CAPS_MB:
                    for method in ("powersgd", "acpsgd"):
                        measure(Cell(model, method, 2, mbit, bucket_cap_mb=cap, tag="fusion"), ablation_rows, ablate)
                for method in ("powersgd", "acpsgd"):
                    measure(Cell(model, method, 2, mbit, pipelining=False, tag="pipelining"), ablation_rows, ablate)
                for pipelining in (True, False):
                    measure(Cell(model, "ssgd", 2, regimes[model]["a"], pipelining=pipelining, tag="pipelining"),
                            ablation_rows, ablate)
                for r in RANK_SWEEP[model]:
                    for method in ("powersgd", "acpsgd"):
                        measure(Cell(model, method, 2, mbit, rank=r, tag="rank"), ablation_rows, ablate)
    finally:
        runner.close()

    add_codec_estimates(results + ablation_rows, codecs, cost)
    for model in models:
        if "resnet50" == model and four:
            workloads[model]["bytes_4_workers"] = {m: wire_bytes(m, shapes[model], WORKLOADS[model].rank, 4) for m in METHODS}
    accept = acceptance(results, calibration, workloads, ablation_rows)
    protocol_note = (
        f"quick: {QUICK_PROTOCOL.warmup} warm-up + {QUICK_PROTOCOL.repeats} × {QUICK_PROTOCOL.iters} iterations per "
        "configuration (fewer than the paper's 10 + 5 × 10, to finish in minutes)" if quick else
        f"the paper's {PAPER_PROTOCOL.warmup} warm-up + {PAPER_PROTOCOL.repeats} × {PAPER_PROTOCOL.iters} iterations, "
        f"except configurations predicted to take over {args.cell_budget_s:g} s, which use "
        + ", ".join(f"{p.warmup} + {p.repeats} × {p.iters}" for p in FALLBACK_PROTOCOLS)
        + f" (each row's `protocol` says which); ablations use {ABLATION_PROTOCOL.warmup} + "
        f"{ABLATION_PROTOCOL.repeats} × {ABLATION_PROTOCOL.iters}")
    protocol_note += "; iter s = mean of the block means, ± 1.96 σ of the block means; samples/s = batch × workers / iter s."
    doc = {
        "quick": quick,
        "command": "python -m benchmarks.paper " + " ".join(argv if argv is not None else sys.argv[1:]),
        "protocol_note": protocol_note,
        "results": results,
        "ablations": ablation_rows,
        "calibration": calibration,
        # Encode+decode apart from communication, in the runs' layouts (torch_powersgd's codec estimate).
        "codec_calibration": codecs,
        # The probe's wake-up cost of a collective on an idle link, by worker count
        # (planning.costmodel.Link.wake_s), measured at the calibration rate. The CPU cores
        # the ranks share (4 ranks on 2 run codecs at half speed): each run records its own
        # (`cpu_cores`); this machine's count stands in for runs cached before they did.
        "host": {"wake_s": {str(n): w for n, w in wake_s.items()}, "cpu_cores": len(os.sched_getaffinity(0))},
        "regimes": regimes,
        "workloads": workloads,
        "acceptance": accept,
        "wall_s": time.monotonic() - started,
        "notes": notes(),
    }
    json_out.parent.mkdir(parents=True, exist_ok=True)
    write_whole(json_out, json.dumps(doc, indent=2))
    stem = json_out.with_suffix("")
    write_markdown(stem.with_suffix(".md"), doc)
    plot_phases(Path(f"{stem}_phases.png"), results)
    plot_speedup(Path(f"{stem}_speedup.png"), results)
    if ablation_rows:
        plot_ablations(Path(f"{stem}_ablations.png"), ablation_rows)
    print(f"wrote {json_out} ({doc['wall_s'] / 60:.1f} min); acceptance: (a) {pass_fail(accept['a_pass'])}, "
          f"(b) {pass_fail(accept['b_pass'])}, (c) {pass_fail(accept['c_pass'])}")
    return 0


