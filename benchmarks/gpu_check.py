"""The GPU check: every compressor's encode+decode and a per-phase training step, on one GPU.

Why a separate script: GPU machines are lent to some sessions only, for minutes; this is the
one prepared run (under 5 minutes on one GPU) that measures what the CPU benchmarks cannot --
the codec kernels on the device and how a step's time splits between the phases there:

1. ``codecs``: ``benchmarks.compressor_cost``'s measurement (random gradients of the
   paper's ResNet-50 and BERT-Base shapes in 25 MB buckets, every hook on a one-process NCCL
   group, round-robin, each step timed to the device's completion);
2. ``steps``: ResNet-50 (batch 64, 224 px, rank 4) and BERT-Base (batch 32, seq 64, rank 32)
   trained on the GPU by the worker's own step (``workers.loop.train_step``) with each
   compressor's DDP hook (world size 1: the collectives are local, so the codec and the
   bucket hand-offs are what differs), phases timed with CUDA events (``workers.timing``).
3. ``quality``: the same step with the job's quality signal on (the error meter in the hook
   at every step, then one estimate of every default candidate's error on the sample it takes,
   ``compressors.quality``), for ``none`` and ACP-SGD: what the signal costs on the device.

A compressor that fails is recorded (``failed``, with its traceback) and the run goes on; the
file is rewritten after every row, so a run cut short keeps what it measured.

    python -m benchmarks.gpu_check --json-out benchmarks/results/gpu_check.json

``--device cpu`` with small ``--batch``/``--image-size`` runs the same code on the CPU (the
test suite does, so the script cannot rot between GPU sessions).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Sequence

import torch

from benchmarks.compressor_cost import OUR_METHODS, measure_workloads, method_params, single_process_group
from benchmarks.outputs import write_json_and_table
from benchmarks.repo import REPO_ROOT
from compressors import GradientSync
from compressors.base import from_spec
from compressors.quality import ErrorMeter, estimate_errors
from planning.policy import PolicyConfig
from planning.protocol import ALL_PHASES
from planning.spec import make_spec
from workers.probe import synchronize

#: The compressors whose step runs again with the quality signal on: one without error
#: feedback and ACP-SGD, whose meter reads its residuals too.
QUALITY_COMPRESSORS = ("none", "acpsgd")

#: The paper's settings per model: batch, input size, PowerSGD/ACP-SGD rank.
STEP_MODELS: dict[str, dict[str, int]] = {
    "resnet50": {"batch": 64, "image_size": 224, "seq_len": 64, "rank": 4},
    "bert-base": {"batch": 32, "image_size": 32, "seq_len": 64, "rank": 32},
}


def step_breakdown(model_name: str, compressor: str, device: torch.device, *, batch: int, image_size: int,
                   seq_len: int, rank: int, warmup: int, steps: int, quality: bool = False) -> dict[str, Any]:
    """Mean seconds per phase of ``steps`` training steps after ``warmup``, one compressor.

    ``quality``: with the job's quality signal on, as an adaptive job runs it: the error
    meter in the hook at every step (its worst case: a job measures only the cycle before
    each decision exchange), and after the timed steps one estimate of every default
    candidate's error on the sample a step hands it (``compressors.quality``), timed to the
    device's completion."""
    from torch.nn.parallel import DistributedDataParallel

    from workers.data import build_dataset
    from workers.loaders import InfiniteLoader
    from workers.loop import train_step
    from workers.models import build_model, default_num_classes
    from workers.timing import StepTimer

    torch.manual_seed(0)
    shape_kwargs = {"seq_len": seq_len} if model_name.startswith("bert") else {"image_size": image_size}
    model = build_model(model_name, num_classes=default_num_classes(model_name), **shape_kwargs).to(device)
    ddp = DistributedDataParallel(model, bucket_cap_mb=25, device_ids=[device.index] if device.type == "cuda" else None)
    sync = GradientSync(from_spec(make_spec(compressor, **method_params(compressor, rank)))).install(ddp)
    meter = ErrorMeter(total_elements=sync.trained_elements or None) if quality else None
    sync.error_meter = meter
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    dataset = build_dataset("synthetic", model=model_name, seed=0, seq_len=seq_len, image_size=image_size)
    loader = InfiniteLoader(dataset, batch, 0, 1, 0)
    timer = StepTimer(device, window=steps)
    walls = []
    meter_before = (0.0, 0)  # the meter's seconds and steps at the end of the warm-up
    for step in range(warmup + steps):
        if meter is not None and step == warmup:
            meter_before = (meter.seconds, meter.steps)
        started = time.perf_counter()
        train_step(ddp, optimizer, loader, timer, device)
        timer.end_step(step, sync.last_step())  # waits for the step's CUDA events
        walls.append(time.perf_counter() - started)
    means = timer.means()
    row = {"model": model_name, "compressor": sync.compressor.label, "batch": batch,
           "step_s": statistics.fmean(walls[warmup:]), "phase_s": {phase: means[phase] for phase in ALL_PHASES},
           "bytes_per_step": sync.stats().bytes_sent / sync.stats().steps if sync.stats().steps else 0.0}
    if meter is not None:
        timed = meter.steps - meter_before[1]
        row["meter_s_per_step"] = (meter.seconds - meter_before[0]) / timed if timed else None
        meter.request_sample()
        for extra in range(2):  # the sample and its step before (ACP-SGD's estimate uses both)
            train_step(ddp, optimizer, loader, timer, device)
            timer.end_step(warmup + steps + extra, sync.last_step())
        sample = meter.take_sample()
        cfg = PolicyConfig()
        specs = cfg.candidates()
        synchronize(device)
        started = time.perf_counter()
        estimate_errors(sample.tensors, specs, sample.previous)
        synchronize(device)
        row["estimate_s"] = time.perf_counter() - started
        row["estimate_sample_elements"] = sum(t.numel() for t in sample.tensors)
        row["estimate_candidates"] = len(specs)
    return row


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    import platform

    return f"CPU ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


def markdown(doc: dict[str, Any]) -> str:
    """The results as the markdown table the README quotes."""
    lines = [f"# GPU check on {doc['device_name']}", "", f"`{doc['command']}`", "",
             "## Encode+decode per step (median, timed to the device's completion)", "",
             "| workload | method | encode+decode ms | MB/step |", "|---|---|---:|---:|"]
    for workload, rows in doc["codecs"].items():
        for method, row in rows.items():
            lines.append(f"| {workload} | {method} | {row['encode_decode_s'] * 1e3:.2f} | {row['bytes_per_step'] / 1e6:.3f} |")
    phases = ("data", "forward", "backward", "exposed_comm", "optimizer", "compress", "decompress")
    lines += ["", "## One training step per compressor (world size 1; phases timed with CUDA events on a GPU; ms)", "",
              "| model | compressor | step | " + " | ".join(phases) + " |", "|---|---|---:|" + "---:|" * len(phases)]
    for row in doc["steps"]:
        lines.append(f"| {row['model']} | {row['compressor']} | {row['step_s'] * 1e3:.1f} | "
                     + " | ".join(f"{row['phase_s'][p] * 1e3:.1f}" for p in phases) + " |")
    lines += ["", "compress/decompress: the hook's host time per step (on a GPU, kernel launches; the kernels "
              "themselves are inside backward and exposed_comm).", ""]
    if doc.get("quality"):
        lines += ["", "## The quality signal (error meter at every step; one estimate of every default candidate)", "",
                  "| model | compressor | step ms with the meter | meter ms/step (host) | estimate ms | sampled elements | candidates |",
                  "|---|---|---:|---:|---:|---:|---:|"]
        for row in doc["quality"]:
            meter = row["meter_s_per_step"]
            lines.append(f"| {row['model']} | {row['compressor']} | {row['step_s'] * 1e3:.1f} | "
                         f"{'-' if meter is None else f'{meter * 1e3:.2f}'} | {row['estimate_s'] * 1e3:.1f} | "
                         f"{row['estimate_sample_elements']} | {row['estimate_candidates']} |")
        lines.append("")
    for failure in doc.get("failed", []):
        lines.append(f"- FAILED: {failure['model']} with {failure['compressor']}: {failure['error']}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu_check", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda", help="cuda, cuda:N, or cpu (a smoke run of the same code)")
    parser.add_argument("--models", nargs="+", default=list(STEP_MODELS), choices=list(STEP_MODELS))
    parser.add_argument("--compressors", nargs="+", default=list(OUR_METHODS), choices=list(OUR_METHODS))
    parser.add_argument("--batch", type=int, help="override every model's batch size (default: the paper's)")
    parser.add_argument("--image-size", type=int, help="override ResNet's input size (default 224)")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--codec-workloads", nargs="*", default=list(STEP_MODELS), choices=list(STEP_MODELS),
                        help="workloads of the codec measurement (none: skip it)")
    parser.add_argument("--codec-steps", type=int, default=6, help="timed rounds of the codec measurement (even)")
    parser.add_argument("--quality-models", nargs="*", default=list(STEP_MODELS), choices=list(STEP_MODELS),
                        help="models whose steps run again with the quality signal on, with "
                             f"{' and '.join(QUALITY_COMPRESSORS)} whatever --compressors says (none: skip it)")
    parser.add_argument("--json-out", type=Path, default=REPO_ROOT / "benchmarks/results/gpu_check.json")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device here (use --device cpu for a smoke run)")
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    if args.codec_steps % 2:
        parser.error("--codec-steps must be even: ACP-SGD alternates P and Q steps")
    started = time.monotonic()
    doc: dict[str, Any] = {"device_name": device_name(device), "torch": torch.__version__,
                           "command": "python -m benchmarks.gpu_check " + " ".join(argv if argv is not None else sys.argv[1:])}
    def save() -> None:
        """Write what is measured so far: a run cut short (the device's time is lent by the
        minute) keeps every row it finished, each file whole."""
        doc["wall_s"] = time.monotonic() - started
        write_json_and_table(args.json_out, doc, markdown(doc))

    def rows(models: Sequence[str], compressors: Sequence[str], quality: bool) -> None:
        """Each (model, compressor)'s step into ``doc`` (``quality``: with the quality signal
        on, into its own table); one that fails is recorded with its traceback and the others
        go on."""
        table, what = ("quality", " with the quality signal") if quality else ("steps", "")
        for model_name in models:
            settings = dict(STEP_MODELS[model_name])
            settings["batch"] = args.batch or settings["batch"]
            settings["image_size"] = args.image_size or settings["image_size"]
            for compressor in compressors:
                try:
                    row = step_breakdown(model_name, compressor, device, warmup=args.warmup, steps=args.steps,
                                         quality=quality, **settings)
                except Exception as exc:  # noqa: BLE001 -- one failing compressor must not lose the others' rows
                    doc["failed"].append({"model": model_name, "compressor": compressor + what,
                                          "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()})
                    print(f"  {model_name:9s} {compressor:12s} FAILED{what}: {type(exc).__name__}: {exc}", flush=True)
                else:
                    doc[table].append(row)
                    extra = f", estimate {row['estimate_s'] * 1e3:.1f} ms" if quality else ""
                    print(f"  {model_name:9s} {row['compressor']:12s} {row['step_s'] * 1e3:8.1f} ms/step{what}{extra}",
                          flush=True)
                save()
                if device.type == "cuda":
                    torch.cuda.empty_cache()

    doc["codecs"], doc["steps"], doc["quality"], doc["failed"] = {}, [], [], []
    with single_process_group(device):
        print(f"codecs on {doc['device_name']}", flush=True)
        doc["codecs"] = measure_workloads(args.codec_workloads, list(OUR_METHODS) + ["torch_powersgd"], 3,
                                          args.codec_steps, device)
        save()
        rows(args.models, args.compressors, quality=False)
        rows(args.quality_models, QUALITY_COMPRESSORS, quality=True)
    print(f"wrote {args.json_out} ({doc['wall_s']:.0f} s)")
    return 1 if doc["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
