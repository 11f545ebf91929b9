"""Paper-scale replay of the adaptive policy: a SIMULATION, not a measurement.

Why: this machine runs two CPU workers on links of a few hundred Mbit/s; the question of
issue 14 at paper scale is where the policy turns compression off, which rank it picks, and
how long it takes to a target compared with every fixed choice, for 8-64 GPUs on a link that
changes (25 Gbit/s with stretches at 1 Gbit/s). Here the SAME policy code
(``planning.policy.decide``, default bounds, default hysteresis: 10 % gain, 30 s dwell, a
report every 2 s) is driven by the validated cost model of :mod:`benchmarks.simulate`
through a bandwidth trace: by default on its assumed V100-class compute (with the
CPU-measured backward shape) and GPU codec from ``compressor_cost.json`` ÷ an assumed speed-up
(that module's ASSUMED list); with ``--gpu-check FILE`` on the compute and codec that
``benchmarks.gpu_check`` measured on a GPU, the casts fp16/bf16 then among the candidates.

Progress uses the policy's own model (``planning.progress``): a step with relative error ε
is worth ``δ = 1 − ε²`` of an uncompressed step. The errors are measured, not assumed: one
backward of the real model (synthetic batch, CPU) gives a sample of gradient matrices, and
``compressors.quality.estimate_errors`` gives every candidate's error on it. The running
error a compressor would show is that estimate times ``--running-over-estimate`` (capped at 1);
the default is the ratio measured on this repository's CNN by ``benchmarks.adaptive``
(``--from-benchmark``), else 1. Or, with ``--running-exponent k``, a low-rank choice's running
error is ``estimate ** k`` (the relation ``planning.progress.calibrated_errors`` assumed until
session 18, when a share of the best case's δ replaced it; k measured 0.15-0.42 on the CNN's
dwells); top-k and sign keep their
estimate then. A choice whose running error is 1 makes no progress: its time is null.

The target: uncompressed training's progress at 90 % of the steps it takes through the whole
trace. Every fixed candidate and the adaptive policy run until they reach it, and so does a
clairvoyant switcher (:meth:`Replay.clairvoyant`: the best choice of every step, switched for
free): its ratio to the best fixed choice is the least any policy could show on the trace.

Said plainly: a policy judged on its own cost and progress model proves that its decisions
follow from that model (where it turns compression off, which rank), not a speedup. The
measured judgement is ``benchmarks.adaptive``.

    python -m benchmarks.adaptive_replay --json-out benchmarks/results/adaptive_replay.json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from statistics import median_high
from typing import Any, Mapping, Sequence

from benchmarks.outputs import publish
from benchmarks.rate_pairs import parse_rate_pairs
from benchmarks.repo import REPO_ROOT
from benchmarks.simulate import (
    CASTS,
    GPU_CODEC_FIXED_S,
    GPU_CODEC_SPEEDUP,
    GPU_COMPUTE,
    NETWORKS,
    bucket_segments,
    gpu_codec,
    layout_for,
    ready_fractions,
)
from planning.costmodel import Link, StepProfile, predict_step
from planning.policy import Measurements, PolicyConfig, PolicyState, Switch, decide
from planning.progress import contraction, rank_of
from planning.spec import CompressorSpec, make_spec

#: Gbit/s for seconds: 25 Gbit/s with two stretches at 1 Gbit/s.
DEFAULT_TRACE = "25:300,1:120,25:300,1:120,25:300"
#: Compressors whose codec cost compressor_cost.json measured on the CPU (÷ an assumed GPU
#: speed-up); the casts' cost is a memory pass whose CPU time says little about a GPU's.
ALLOWED = ("none", "acpsgd", "powersgd", "topk", "signsgd")
#: With a GPU check (``--gpu-check``) every codec is measured on the GPU, the casts too.
ALLOWED_MEASURED = ALLOWED + CASTS
#: The simulator's method for each compressor: its own name, but uncompressed is ``ssgd``.
METHOD_OF = {name: ("ssgd" if name == "none" else name) for name in ALLOWED_MEASURED}
REPORT_EVERY_S = 2.0
#: A run that needs more than this many times the target's steps counts as never reaching it.
MAX_STEPS_OVER_TARGET = 20
#: α per ring step for the trace's rates (NCCL over TCP on Ethernet, as benchmarks.simulate assumes).
ALPHA_S = NETWORKS["10GbE"]["alpha_s"]


@dataclass(frozen=True)
class Stretch:
    gbit: float
    seconds: float


def parse_trace(text: str) -> list[Stretch]:
    """``"25:300,1:120"`` -> stretches of (Gbit/s, seconds)."""
    return [Stretch(gbit, seconds) for gbit, seconds in parse_rate_pairs(text, field="trace", form="GBIT:SECONDS", amount=float)]


def rate_at(trace: Sequence[Stretch], t: float) -> float:
    """Gbit/s at time ``t`` (the last rate holds after the trace ends)."""
    for stretch in trace:
        if t < stretch.seconds:
            return stretch.gbit
        t -= stretch.seconds
    return trace[-1].gbit


def link_of(gbit: float) -> Link:
    return Link(alpha=ALPHA_S, beta=8.0 / (gbit * 1e9))


#: Batch of the one measured backward: BERT-Base at the paper's 32 (a gradient of B·L tokens has
#: rank <= B·L, so a small batch would make low ranks look lossless); ResNet-50 at 8 (its batch
#: of 64 at 224 px does not fit this machine's time; conv gradients sum over positions too).
ERROR_BATCH = {"resnet50": 8, "bert-base": 32}


def measured_errors(model: str, specs: Sequence[CompressorSpec], batch: int = 2) -> dict[str, float]:
    """Every candidate's estimated error on real backwards of ``model`` (synthetic batches, CPU):
    the sample is the second of two batches' gradients, the first its step before (ACP-SGD's
    estimate projects on the step before's subspaces; both at the same weights here)."""
    import torch
    import torch.nn.functional as F

    from compressors.quality import estimate_errors, largest_within
    from workers.data import build_dataset, input_spec
    from workers.models import build_model

    torch.manual_seed(0)
    kwargs = input_spec(model, "synthetic", seq_len=64, image_size=224 if model != "bert-base" else None)
    net = build_model(model, **kwargs)
    data = build_dataset("synthetic", model=model, split="train", seed=0, seq_len=64,
                         image_size=kwargs.get("image_size"))
    steps = []
    for first in (0, batch):  # the step before, then the sample's step
        net.zero_grad()
        inputs = torch.stack([data[i][0] for i in range(first, first + batch)])
        targets = torch.tensor([int(data[i][1]) for i in range(first, first + batch)])
        F.cross_entropy(net(inputs), targets).backward()
        steps.append({name: p.grad.detach().clone() for name, p in net.named_parameters()
                      if p.grad is not None and p.grad.dim() >= 2})
    before, now = steps
    chosen = largest_within(now, 4_000_000)
    return estimate_errors([now[key] for key in chosen], specs, [before[key] for key in chosen])


@dataclass(frozen=True)
class StepCosts:
    """One model's compute per step and where its codec costs come from: ``benchmarks.simulate``'s
    ASSUMED V100-class figures, or a GPU check's measurement (:func:`measured_costs`)."""

    forward_s: float
    backward_s: float
    optimizer_s: float
    rank: int
    #: ``{model: {method: {"encode_decode_s": ...}}}`` (compressor_cost.json or a GPU check's codecs).
    codecs: Mapping[str, Any] | None
    codec_speedup: float
    codec_fixed_s: float
    source: str


def assumed_costs(model: str, cost_json: Mapping[str, Any] | None) -> StepCosts:
    gpu = GPU_COMPUTE[model]
    return StepCosts(gpu["forward_s"], gpu["backward_s"], gpu["optimizer_s"], int(gpu["rank"]), cost_json,
                     GPU_CODEC_SPEEDUP, GPU_CODEC_FIXED_S,
                     f"assumed V100-class compute, CPU codec ÷ {GPU_CODEC_SPEEDUP:g}")


def measured_costs(model: str, gpu_check: Any) -> StepCosts:
    """Compute and codec as ``benchmarks.gpu_check`` measured them on one GPU: forward,
    backward (less its exposed wait on the one-process all-reduce) and optimizer of the
    uncompressed step at the paper's batch; every codec's encode+decode on the paper's shapes
    at the paper's ranks (``benchmarks.compressor_cost.WORKLOADS``, the same as
    :data:`GPU_COMPUTE`'s; a test holds them together). A ValueError saying what the file
    lacks, or that its step was not measured at the paper's batch."""
    if not isinstance(gpu_check, Mapping):
        raise ValueError("not a GPU check's JSON object")
    rows = [r for r in gpu_check.get("steps") or [] if isinstance(r, Mapping)
            and r.get("model") == model and r.get("compressor") == "none"]
    codecs = gpu_check.get("codecs")
    if not rows or not isinstance(codecs, Mapping) or not isinstance(codecs.get(model), Mapping):
        raise ValueError(f"no uncompressed step or codec measurement of {model}")
    row = rows[0]
    if row.get("batch") != GPU_COMPUTE[model]["batch"]:
        raise ValueError(f"{model}'s step ran at batch {row.get('batch')!r}, not the paper's "
                         f"{GPU_COMPUTE[model]['batch']:.0f} (a smoke run?)")
    phases = row.get("phase_s")
    needed = ("forward", "backward", "exposed_comm", "optimizer")
    if not isinstance(phases, Mapping) or not all(isinstance(phases.get(k), (int, float)) for k in needed):
        raise ValueError(f"{model}'s step lacks one of the phases {', '.join(needed)}")
    return StepCosts(phases["forward"], max(0.0, phases["backward"] - phases["exposed_comm"]), phases["optimizer"],
                     int(GPU_COMPUTE[model]["rank"]), codecs, 1.0, 0.0,
                     f"measured on {gpu_check.get('device_name', 'a GPU')}")


def load_gpu_check(path: Path, models: Sequence[str]) -> dict[str, StepCosts]:
    """Every model's :func:`measured_costs` from a GPU check's file, checked before any work;
    a ValueError starting ``--gpu-check: PATH:``."""
    try:
        doc = json.loads(path.read_text())
        return {model: measured_costs(model, doc) for model in models}
    except (OSError, ValueError) as exc:  # json.JSONDecodeError is a ValueError
        raise ValueError(f"--gpu-check: {path}: {exc}") from exc


def load_errors(path: Path, models: Sequence[str], labels: Sequence[str]) -> dict[str, dict[str, float]]:
    """The measured errors of each of ``models`` that an earlier replay's file holds (a model it
    lacks is measured again), each covering ``labels``; a ValueError starting
    ``--errors-from: PATH:`` (a file written without ``--gpu-check`` has no errors for the casts)."""
    try:
        found = json.loads(path.read_text())["models"]
        errors = {model: dict(found[model]["errors"]) for model in models if model in found}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"--errors-from: {path}: not an earlier replay's file ({exc!r})") from exc
    for model, by_label in errors.items():
        missing = sorted(set(labels) - set(by_label))
        if missing:
            raise ValueError(f"--errors-from: {path}: no errors of {', '.join(missing)} for {model}")
    return errors


def profile_for(model: str, shapes: Sequence[Sequence[int]], ready: Sequence[float] | None,
                costs: StepCosts, specs: Sequence[CompressorSpec]) -> StepProfile:
    """benchmarks.simulate's paper-scale profile, with a GPU codec cost for every candidate label."""
    fractions = ready_fractions(ready)
    layout = layout_for(shapes, 25.0, ddp_default=True)
    segments = bucket_segments(layout, tuple(f * costs.backward_s for f in fractions) if fractions else None,
                               costs.backward_s)
    codec = {s.label: gpu_codec(METHOD_OF[s.name], shapes, costs.rank, costs.codecs, model, costs.codec_speedup,
                                costs.codec_fixed_s) for s in specs}
    return StepProfile.build(shapes, forward_s=costs.forward_s, backward_s=costs.backward_s,
                             optimizer_s=costs.optimizer_s, buckets=layout, bucket_backward_s=segments,
                             codec_costs=codec)


class Replay:
    """Steps of one (model, workers) setting through the trace, with a cache of step times."""

    def __init__(self, profile: StepProfile, workers: int, trace: Sequence[Stretch],
                 errors: Mapping[str, float], running: Mapping[str, float]) -> None:
        self.profile, self.workers, self.trace = profile, workers, trace
        self.errors, self.running = errors, running
        self._steps: dict[tuple[str, float], float] = {}

    def step_s(self, spec: CompressorSpec, gbit: float) -> float:
        key = (spec.label, gbit)
        if key not in self._steps:
            self._steps[key] = predict_step(spec, self.profile, self.workers, link_of(gbit)).step_s
        return self._steps[key]

    def run(self, target: float, spec: CompressorSpec | None, cfg: PolicyConfig | None = None) -> dict[str, Any]:
        """Step until the progress reaches ``target``; ``spec`` fixed, or the policy (``cfg``).
        ``time_to_target_s`` is None when it would take over :data:`MAX_STEPS_OVER_TARGET`
        times the target's steps (a fixed choice that loses everything never gets there)."""
        current = spec or make_spec("none")
        t, progress, steps, state = 0.0, 0.0, 0, PolicyState()
        next_report, switches = 0.0, []
        used: dict[str, float] = {}
        while progress < target:
            if steps > MAX_STEPS_OVER_TARGET * target:
                return {"time_to_target_s": None, "steps": steps, "switches": switches,
                        "seconds_by_choice_and_rate": {k: round(v, 1) for k, v in used.items()}}
            gbit = rate_at(self.trace, t)
            if cfg is not None and t >= next_report:
                m = Measurements(gbit * 1e9 / 8, 2 * (self.workers - 1) * ALPHA_S, self.workers, self.profile, current,
                                 step=steps, errors=self.errors, running=current.label if steps else None,
                                 running_efficiency=(current.label, contraction(self.running[current.label])) if steps else None)
                decision, state = decide(state, m, cfg, t)
                if isinstance(decision, Switch):
                    current = decision.spec
                    switches.append({"at_s": round(t, 1), "gbit": gbit, "to": current.label})
                next_report = t + REPORT_EVERY_S
            dt = self.step_s(current, gbit)
            t += dt
            steps += 1
            progress += contraction(self.running[current.label])
            used[f"{current.label}@{gbit:g}"] = used.get(f"{current.label}@{gbit:g}", 0.0) + dt
        return {"time_to_target_s": round(t, 2), "steps": steps, "switches": switches,
                "seconds_by_choice_and_rate": {k: round(v, 1) for k, v in used.items()}}

    def clairvoyant(self, target: float, specs: Sequence[CompressorSpec]) -> dict[str, Any]:
        """The bound no policy can beat under this model: every step runs the choice with the
        most progress per second at the rate of that moment (it knows the link and the running
        errors, pays nothing to switch and waits no dwell). Its time over the best fixed
        choice's is the least ratio any policy could show on the trace (up to the few steps
        that straddle a change of rate, judged, like every run here, at the rate they start at)."""
        t, progress, steps, last = 0.0, 0.0, 0, None
        switches: list[dict[str, Any]] = []
        useful = [s for s in specs if contraction(self.running[s.label]) > 0]
        while progress < target:
            gbit = rate_at(self.trace, t)
            spec = max(useful, key=lambda s: contraction(self.running[s.label]) / self.step_s(s, gbit))
            if spec.label != last:
                switches.append({"at_s": round(t, 1), "gbit": gbit, "to": spec.label})
                last = spec.label
            t += self.step_s(spec, gbit)
            steps += 1
            progress += contraction(self.running[spec.label])
        return {"time_to_target_s": round(t, 2), "steps": steps, "switches": switches}

    def steps_through_trace(self, spec: CompressorSpec) -> int:
        t, steps = 0.0, 0
        total = sum(s.seconds for s in self.trace)
        while t < total:
            t += self.step_s(spec, rate_at(self.trace, t))
            steps += 1
        return steps


def replay_config(measured: Mapping[str, StepCosts] | None) -> PolicyConfig:
    """The policy's default bounds over the compressors whose GPU codec cost is known."""
    return PolicyConfig(allowed=ALLOWED if measured is None else ALLOWED_MEASURED)


def replay(args: argparse.Namespace, measured: Mapping[str, StepCosts] | None = None,
           earlier_errors: Mapping[str, Mapping[str, float]] | None = None) -> dict[str, Any]:
    """Every fixed choice, the policy and the clairvoyant bound, per trace, model and worker
    count; ``measured``: :func:`load_gpu_check`'s costs (else the assumed ones),
    ``earlier_errors``: :func:`load_errors`'s (else measured here)."""
    from workers.models import parameter_shapes

    paper = json.loads(args.paper_json.read_text()) if args.paper_json.exists() else {}
    cost = json.loads(args.cost_json.read_text()) if args.cost_json.exists() else None
    traces = {text: parse_trace(text) for text in args.trace or [DEFAULT_TRACE]}
    cfg = replay_config(measured)
    specs = cfg.candidates()
    out: dict[str, Any] = {"traces": list(traces), "running_over_estimate": args.running_over_estimate,
                           "running_exponent": args.running_exponent, "models": {},
                           "gpu_check": str(args.gpu_check) if args.gpu_check else None,
                           "runs": {text: {} for text in traces}}
    for model in args.models:
        shapes = [tuple(s) for s in parameter_shapes(model)]
        calib = (paper.get("calibration") or {}).get(f"{model}/2") or {}
        same = [tuple(s) for s in paper.get("workloads", {}).get(model, {}).get("shapes", [])] == shapes
        costs = assumed_costs(model, cost) if measured is None else measured[model]
        profile = profile_for(model, shapes, calib.get("ready_s") if same else None, costs, specs)
        started = time.monotonic()
        earlier = (earlier_errors or {}).get(model)
        errors = dict(earlier) if earlier else measured_errors(model, specs, ERROR_BATCH.get(model, 8))
        running = running_errors(errors, args.running_over_estimate, args.running_exponent)
        out["models"][model] = {"errors": errors, "error_batch": ERROR_BATCH.get(model, 8), "costs": costs.source,
                                "compute_s": {"forward": round(costs.forward_s, 4), "backward": round(costs.backward_s, 4),
                                              "optimizer": round(costs.optimizer_s, 4)},
                                "estimate_s": round(time.monotonic() - started, 1)}
        for text, trace in traces.items():
            out["runs"][text][model] = {str(workers): replay_one(Replay(profile, workers, trace, errors, running), specs, cfg)
                                        for workers in args.workers}
            for workers, r in out["runs"][text][model].items():
                print(f"[replay] {text} {model} N={workers}: adaptive {r['adaptive']['time_to_target_s']} s, best fixed "
                      f"{r['best_fixed']} {r['fixed_time_to_target_s'][r['best_fixed']]} s "
                      f"({r['adaptive_over_best_fixed']}x; clairvoyant {r['clairvoyant_over_best_fixed']}x)", flush=True)
    return out


def replay_one(sim: Replay, specs: Sequence[CompressorSpec], cfg: PolicyConfig) -> dict[str, Any]:
    """One (trace, model, workers): to the target with every fixed choice, the policy and the bound."""
    target = 0.9 * sim.steps_through_trace(make_spec("none"))
    fixed = {s.label: sim.run(target, s)["time_to_target_s"] for s in specs}
    adaptive = sim.run(target, None, cfg)
    bound = sim.clairvoyant(target, specs)
    best = min(fixed, key=lambda label: math.inf if fixed[label] is None else fixed[label])
    rates = sorted({x.gbit for x in sim.trace})
    return {
        "target_progress": round(target, 1), "fixed_time_to_target_s": fixed, "best_fixed": best,
        "adaptive": adaptive, "adaptive_over_best_fixed": _ratio(adaptive["time_to_target_s"], fixed[best]),
        "clairvoyant": bound, "clairvoyant_over_best_fixed": _ratio(bound["time_to_target_s"], fixed[best]),
        "step_s": {f"{s.label}@{g:g}": round(sim.step_s(s, g), 4) for s in specs for g in rates},
    }


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else round(a / b, 3)


def running_errors(errors: Mapping[str, float], over_estimate: float, exponent: float | None) -> dict[str, float]:
    """The running error each choice shows in the replay: ``estimate ** exponent`` for a
    low-rank choice when an exponent is given, else ``estimate × over_estimate``; capped at 1."""
    return {label: min(1.0, e ** exponent if exponent is not None and rank_of(label) is not None and e > 0
                        else e * over_estimate) for label, e in errors.items()}


def markdown(doc: Mapping[str, Any]) -> str:
    exponent = doc.get("running_exponent")
    running = (f"running error = estimate ** {exponent:g} (low-rank; top-k and sign: the estimate)" if exponent is not None
               else f"running error = estimate × {doc['running_over_estimate']:g}")
    lines = []
    for trace, models in doc["runs"].items():
        lines += [f"SIMULATION (cost model of benchmarks.simulate, progress model of planning.progress), "
                  f"trace `{trace}` (Gbit/s:seconds), {running}.", "",
                  "| model | workers | adaptive s | best fixed | best fixed s | adaptive / best | clairvoyant / best | none s "
                  "| adaptive's choices (at Gbit/s) |",
                  "|---|---:|---:|---|---:|---:|---:|---:|---|"]
        for model, by_workers in models.items():
            for workers, r in by_workers.items():
                moves = ", ".join(f"{s['to']} @ {s['at_s']:.0f} s ({s['gbit']:g})" for s in r["adaptive"]["switches"]) or "-"
                fixed = r["fixed_time_to_target_s"]
                lines.append(f"| {model} | {workers} | {_seconds(r['adaptive']['time_to_target_s'])} | {r['best_fixed']} | "
                             f"{_seconds(fixed[r['best_fixed']])} | {_seconds(r['adaptive_over_best_fixed'], '.3f')} | "
                             f"{_seconds(r['clairvoyant_over_best_fixed'], '.3f')} | {_seconds(fixed['none'])} | {moves} |")
        lines.append("")
    return "\n".join(lines)


def _seconds(value: float | None, form: str = ".0f") -> str:
    return "-" if value is None else format(value, form)


def ratio_from_benchmark(path: Path) -> float | None:
    """Median running/estimated error of the adaptive runs' lossy low-rank choices in benchmarks.adaptive's JSON."""
    if not path.exists():
        return None
    doc = json.loads(path.read_text())
    ratios = [r for s in doc.get("scenarios", {}).values() for r in s.get("runs", {}).get("adaptive", {}).get("error_ratios", [])]
    return median_high(ratios) if ratios else None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.adaptive_replay", description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", action="append", default=None, metavar="GBIT:SECONDS,...",
                        help=f"a bandwidth trace; repeat for several (default {DEFAULT_TRACE})")
    parser.add_argument("--models", nargs="+", default=list(GPU_COMPUTE), choices=list(GPU_COMPUTE))
    parser.add_argument("--workers", nargs="+", type=int, default=[8, 32, 64])
    parser.add_argument("--running-over-estimate", type=float, default=None,
                        help="running error / estimated error (default: measured by --from-benchmark, else 1)")
    parser.add_argument("--running-exponent", type=float, default=None,
                        help="a low-rank choice's running error is estimate ** this (0 < k <= 1); "
                             "instead of --running-over-estimate")
    parser.add_argument("--from-benchmark", type=Path, default=REPO_ROOT / "benchmarks/results/adaptive_quick.json")
    parser.add_argument("--paper-json", type=Path, default=REPO_ROOT / "benchmarks/results/paper.json")
    parser.add_argument("--cost-json", type=Path, default=REPO_ROOT / "benchmarks/results/compressor_cost.json")
    parser.add_argument("--gpu-check", type=Path, default=None,
                        help="compute and codec costs measured by benchmarks.gpu_check (its JSON) instead of the "
                             "assumed V100-class figures; the casts fp16/bf16 join the candidates")
    parser.add_argument("--errors-from", type=Path, default=None,
                        help="reuse the measured errors of an earlier replay JSON (skips the backward passes)")
    parser.add_argument("--json-out", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.trace and len(set(args.trace)) < len(args.trace):
        parser.error("--trace: each trace once")
    if args.running_exponent is not None:
        if args.running_over_estimate is not None:
            parser.error("--running-exponent: give it or --running-over-estimate, not both")
        if not 0 < args.running_exponent <= 1:
            parser.error(f"--running-exponent: must be in (0, 1], got {args.running_exponent}")
        args.running_over_estimate = 1.0
    if args.running_over_estimate is None:
        args.running_over_estimate = ratio_from_benchmark(args.from_benchmark) or 1.0
    if not args.running_over_estimate >= 1 or not math.isfinite(args.running_over_estimate):
        parser.error(f"--running-over-estimate: must be a finite number >= 1, got {args.running_over_estimate}")
    try:  # every input file checked before any work
        measured = load_gpu_check(args.gpu_check, args.models) if args.gpu_check is not None else None
        cfg = replay_config(measured)
        labels = [s.label for s in cfg.candidates()]
        earlier = load_errors(args.errors_from, args.models, labels) if args.errors_from is not None else None
    except ValueError as exc:
        parser.error(str(exc))
    doc = replay(args, measured, earlier)
    publish(args.json_out, doc, markdown(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
