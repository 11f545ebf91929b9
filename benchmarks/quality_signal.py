"""Which running figure ranks the compressors as training does: relative error ε or update efficiency η?

Why: the adaptive policy judges a choice that has run by a figure measured while it runs
(``planning.progress``). The relative error ``ε = ‖e_new‖ / ‖x‖`` (``x = g + e_old``) ranked
ACP-SGD rank 16 above PowerSGD rank 4 on the adaptive benchmark's CNN, and training the other
way round. This benchmark trains the same CNN once per fixed choice and, every step, computes
from the full tensors (not the meter's sample):

* ``ε = ‖e_new‖ / ‖g + e_old‖``, the relative compression error;
* ``η = ⟨u, g⟩ / ‖g‖²`` with ``u = g + e_old − e_new`` the update applied: the share of an
  uncompressed step's first-order loss decrease the step makes (what the policy now uses);
* ``ρ = ‖e_new‖ / ‖g‖``, the residual held back in units of one step's gradient;
* ``cos²(u, g) = ⟨u, g⟩² / (‖u‖² ‖g‖²)``: the share of an uncompressed step's loss decrease a
  step along ``u`` at its best length makes (curvature ``L·I``), which also charges ``u`` for
  what it adds off ``g``; for a projection ``C`` it is ``1 − ε²``, the contraction the policy
  gives a candidate by its estimate;
* ``cos(m_u, m_g)``: the same cosine between the optimizer's momentum buffers, ``m_u ← β m_u + u``
  (what SGD with momentum β applies) and ``m_g ← β m_g + g`` (what it would apply from the raw
  gradients of the same trajectory). Why: error feedback delays what a step leaves out rather
  than dropping it, and momentum averages ``1/(1 − β)`` steps, so a step's own cosine may price
  a compressor's loss above what the optimizer's applied direction loses;

* with ``--noise-scale``, the gradient noise ratio ``b = B_noise / B`` along the choice's
  trajectory (McCandlish et al. 2018, "An Empirical Model of Large-Batch Training", appendix A:
  the raw gradients of each batch's two halves against the whole batch's, numerator and
  denominator averaged over steps with weight 0.1), and ``(1 + b) / (1/cos + b)``: the share of
  an uncompressed step's progress a step of cosine ``cos`` makes when the compressor's loss
  counts only against the part of the step count that noise does not set (the analyses of
  error-feedback SGD: the compression enters the terms a noise-free run pays, ``S_min``, and
  not the noise term ``S_min · B_noise / B``). Why: the policy prices a choice by ``1/cos``
  (``planning.progress``) and PowerSGD r4 at ~1.3x the steps, while it crosses the
  adaptive benchmark's target at ``none``'s evaluation; is noise what the price leaves out?
  Two extra backward passes a step (the halves), outside the hook, so the trajectory is the same.

and the held-out loss of the final model. For the low-rank choices also each step's error
estimate as the adaptive policy computes it (``compressors.quality.estimate_errors`` on the raw
gradient, with the step before's for ACP-SGD's stale factor) and the best rank-r error beside it,
each with the share ``cos / δ(estimate)`` (the cosine, the policy's η; ``δ = 1 − ε²``) the running
compressor kept of it: the calibration ``planning.progress`` carries across a family's ranks. One process (world size 1, batch 64 = the
benchmark's 2 × 32, a one-process gloo group), so the group's mean is the rank's own; the
benchmark's schedule (SGD with momentum 0.9, lr 0.02 decayed to 0 along a cosine, 300 steps).
Medians over steps 100-300 (the first steps are the critical regime the policy guards anyway).

    python -m benchmarks.quality_signal --json-out benchmarks/results/quality_signal.json
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from benchmarks.outputs import publish

#: The benchmark's momentum (``benchmarks.adaptive``'s job: SGD, momentum 0.9).
MOMENTUM = 0.9

DEFAULT_CHOICES = ("none", "fp16", "powersgd-r2", "powersgd-r4", "powersgd-r8", "powersgd-r16",
                   "acpsgd-r4", "acpsgd-r8", "acpsgd-r16", "acpsgd-r32")


def run_choice(label: str, args: argparse.Namespace) -> dict[str, Any]:
    """Train ``label`` for ``args.steps`` steps; its per-step figures' medians and final held-out loss."""
    import torch
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel

    from benchmarks.adaptive.scenarios import parse_label
    from benchmarks.compressor_cost import single_process_group
    from compressors import GradientSync, build
    from compressors.quality import estimate_errors, update_efficiency
    from planning.spec import make_spec
    from workers.data import build_dataset, input_spec
    from workers.loaders import make_loader
    from workers.models import build_model

    torch.manual_seed(args.seed)
    started = time.monotonic()
    with single_process_group():
        model = build_model(args.model, **input_spec(args.model, "synthetic"))
        ddp = DistributedDataParallel(model, bucket_cap_mb=args.bucket_cap_mb)
        name, params = parse_label(label)
        sync = GradientSync(build(name, **params)).install(ddp)
        optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=MOMENTUM)
        schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.steps)
        train = build_dataset("synthetic", model=args.model, split="train", seed=args.seed)
        test = build_dataset("synthetic", model=args.model, split="test", seed=args.seed)
        shapes = {key: p.shape for key, p in model.named_parameters()}

        def flat(tensors: dict[str, torch.Tensor]) -> torch.Tensor:
            return torch.cat([tensors[k].reshape(-1).double() if k in tensors
                              else torch.zeros(shapes[k].numel(), dtype=torch.float64) for k in sorted(shapes)])

        def kept_residuals() -> dict[str, torch.Tensor]:
            kept = sync.compressor.residuals() if hasattr(sync.compressor, "residuals") else {}
            return {k.removeprefix("module."): v.clone() for k, v in kept.items()}

        spec = sync.compressor.spec
        # the low-rank choices' estimates, and the best rank-r error (PowerSGD's) beside each
        best_case = make_spec("powersgd", rank=spec.rank) if spec.rank is not None else None
        figures: list[tuple[float, float, float, float]] = []
        estimates: list[tuple[float, float]] = []  # (as the policy estimates it, the best case)
        raw_before: list[torch.Tensor] | None = None
        momentum_u: torch.Tensor | None = None  # β-averaged applied updates and raw gradients
        momentum_g: torch.Tensor | None = None
        horizon_cosines: list[float] = []
        noise = _NoiseRatio() if args.noise_scale else None
        epoch, batches = 0, iter(make_loader(train, batch_size=args.batch_size, rank=0, world_size=1, seed=args.seed))
        for _ in range(args.steps):
            batch = next(batches, None)
            if batch is None:
                epoch += 1
                batches = iter(make_loader(train, batch_size=args.batch_size, rank=0, world_size=1, seed=args.seed,
                                           epoch=epoch))
                batch = next(batches)
            inputs, targets = batch
            if noise is not None:
                noise.observe(*_half_batch_gradients(model, inputs, targets))
            kept_old = kept_residuals()
            optimizer.zero_grad()
            F.cross_entropy(ddp(inputs), targets).backward()
            kept_new = kept_residuals()
            e_old, e_new = flat(kept_old), flat(kept_new)
            update = flat({k: p.grad for k, p in model.named_parameters()})
            if best_case is not None:
                # each matrix's raw gradient, g = u + e_new − e_old, as the meter samples it
                raw = [p.grad + _as_shape(kept_new.get(k), p.grad) - _as_shape(kept_old.get(k), p.grad)
                       for k, p in sorted(model.named_parameters()) if p.dim() >= 2]
                if raw_before is not None:  # one call: the two share each matrix's singular values
                    # (one spec per label: estimate_errors sums what each spec loses into its label)
                    errors = estimate_errors(raw, list({s.label: s for s in (spec, best_case)}.values()), raw_before)
                    estimates.append((errors[spec.label], errors[best_case.label]))
                raw_before = raw
            grad = update + e_new - e_old
            g_sq, along = float(grad @ grad), float(update @ grad)
            cos_sq = (update_efficiency(grad + e_old, e_new, grad) or 0.0) ** 2  # x = g + e_old, lost = e_new
            figures.append((float(e_new.norm() / (grad + e_old).norm()), along / g_sq,
                            float(e_new.norm()) / g_sq ** 0.5, cos_sq))
            momentum_u = update.clone() if momentum_u is None else MOMENTUM * momentum_u + update
            momentum_g = grad.clone() if momentum_g is None else MOMENTUM * momentum_g + grad
            horizon_cosines.append(update_efficiency(momentum_u, torch.zeros_like(momentum_u), momentum_g) or 0.0)
            optimizer.step()
            schedule.step()
        model.eval()
        held_out = make_loader(test, batch_size=args.held_out, rank=0, world_size=1, seed=args.seed, shuffle=False,
                               drop_last=False)
        inputs, targets = next(iter(held_out))
        with torch.no_grad():
            loss = float(F.cross_entropy(model(inputs), targets))
    tail = figures[args.skip_steps:]
    return {"held_out_loss": round(loss, 5),
            "error_median": round(statistics.median(f[0] for f in tail), 4),
            "efficiency_median": round(statistics.median(f[1] for f in tail), 4),
            "residual_over_gradient_median": round(statistics.median(f[2] for f in tail), 4),
            "cos_squared_median": round(statistics.median(f[3] for f in tail), 4),
            "momentum_cos_median": round(statistics.median(horizon_cosines[args.skip_steps:]), 4),
            "estimate_median": _median_at(estimates, 0, args.skip_steps - 1),
            "best_case_estimate_median": _median_at(estimates, 1, args.skip_steps - 1),
            **({} if noise is None else noise.summary(args.skip_steps)),
            "wall_s": round(time.monotonic() - started, 1)}


def _half_batch_gradients(model: Any, inputs: Any, targets: Any) -> tuple[Any, Any]:
    """The raw gradients (flat, float64) of the batch's two halves, by ``torch.autograd.grad``
    on the module itself: no hook runs, no ``.grad`` is touched, and the module's buffers
    (batch-norm statistics) are put back, so the training step that follows is the same (for a
    model without dropout, as the benchmark's CNN: dropout would draw on the random generator here)."""
    import torch
    import torch.nn.functional as F

    params = [p for p in model.parameters() if p.requires_grad]
    buffers = [b.clone() for b in model.buffers()]
    half = inputs.shape[0] // 2
    grads = []
    for part in (slice(0, half), slice(half, 2 * half)):
        loss = F.cross_entropy(model(inputs[part]), targets[part])
        grads.append(torch.cat([g.reshape(-1).double() for g in torch.autograd.grad(loss, params)]))
    with torch.no_grad():
        for buffer, kept in zip(model.buffers(), buffers):
            buffer.copy_(kept)
    return grads[0], grads[1]


class _NoiseRatio:
    """``b = B_noise / B`` from two batch sizes, B/2 (each half) and B (the whole batch):
    ``|G|² ≈ 2‖g_B‖² − ‖g_{B/2}‖²`` and ``tr(Σ)/B ≈ ‖g_{B/2}‖² − ‖g_B‖²`` (unbiased), each
    averaged over steps (weight 0.1) before the ratio, as McCandlish et al. do."""

    WEIGHT = 0.1

    def __init__(self) -> None:
        self.signal: float | None = None
        self.noise: float | None = None
        self.ratios: list[float | None] = []

    def observe(self, first: Any, second: Any) -> None:
        small = (float(first @ first) + float(second @ second)) / 2
        whole = (first + second) / 2
        big = float(whole @ whole)
        signal, noise = 2 * big - small, small - big
        self.signal = signal if self.signal is None else self.signal + self.WEIGHT * (signal - self.signal)
        self.noise = noise if self.noise is None else self.noise + self.WEIGHT * (noise - self.noise)
        # None where the averaged signal is not above 0: noise swamps the estimate of |G|²
        self.ratios.append(self.noise / self.signal if self.signal > 0 else None)

    def summary(self, skip: int) -> dict[str, Any]:
        """The median ratio over the steps after ``skip``, and over each 50 steps (None where
        no step there had an estimate)."""
        def median(ratios: list[float | None]) -> float | None:
            known = [r for r in ratios if r is not None]
            return round(statistics.median(known), 3) if known else None

        windows = {f"{lo}-{lo + 50}": median(self.ratios[lo:lo + 50]) for lo in range(0, len(self.ratios), 50)}
        return {"noise_ratio_median": median(self.ratios[skip:]), "noise_ratio_by_steps": windows}


def _as_shape(residual: Any, grad: Any) -> Any:
    """A kept residual (kept as the compressor's matrix view) in ``grad``'s shape; zeros for none."""
    import torch

    return torch.zeros_like(grad) if residual is None else residual.reshape(grad.shape)


def _median_at(rows: list[tuple[float, float]], column: int, skip: int) -> float | None:
    """Median of ``column`` over ``rows`` after the first ``skip`` (None when there are none)."""
    tail = [row[column] for row in rows[max(0, skip):]]
    return round(statistics.median(tail), 4) if tail else None


def markdown(doc: dict[str, Any]) -> str:
    rows = sorted(doc["choices"].items(), key=lambda item: item[1]["held_out_loss"])
    lines = ["| choice | held-out loss | vs none | ε (median) | ⟨u,g⟩/‖g‖² (median) | cos²(u,g) (median) | cos(u,g) "
             "| cos(m_u,m_g) | 1 − ε² | ρ = ‖e‖/‖g‖ | estimate ε | cos / δ(estimate) | best-case ε | cos / δ(best case) "
             "| b = B_noise/B | (1 + b)/(1/cos + b) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    base = doc["choices"].get("none", {}).get("held_out_loss")
    for label, r in rows:
        versus = f"{r['held_out_loss'] / base - 1:+.1%}" if base else "-"
        lines.append(f"| {label} | {r['held_out_loss']:.4f} | {versus} | {r['error_median']:.3f} | "
                     f"{r['efficiency_median']:.3f} | {r['cos_squared_median']:.3f} | {math.sqrt(r['cos_squared_median']):.3f} | "
                     f"{_cell(r.get('momentum_cos_median'))} | {1 - r['error_median'] ** 2:.3f} | "
                     f"{r['residual_over_gradient_median']:.3f} | {_estimate_cells(r, 'estimate_median')} | "
                     f"{_estimate_cells(r, 'best_case_estimate_median')} | {_noise_cells(r)} |")
    return "\n".join(lines) + "\n"


def _cell(value: float | None) -> str:
    """A figure to three places; a dash where an older result file lacks it."""
    return "-" if value is None else f"{value:.3f}"


def _noise_cells(row: dict[str, Any]) -> str:
    """The noise ratio's median and the share of a step's progress the noise term gives at the
    choice's median cosine; dashes where it was not measured (no ``--noise-scale``)."""
    b = row.get("noise_ratio_median")
    cos = math.sqrt(row["cos_squared_median"])
    if b is None or not cos > 0:
        return "- | -"
    return f"{b:.2f} | {(1 + b) / (1 / cos + b):.3f}"


def _estimate_cells(row: dict[str, Any], key: str) -> str:
    """The estimate's median and the share ``cos / δ(estimate)`` of it the choice kept, with
    ``cos = √cos²``, the policy's η (its calibration: ``planning.progress.efficiency_ratio``,
    which holds the share at 1; here a ratio of medians, not held); dashes for a choice
    without an estimate of this kind."""
    estimate = row.get(key)
    if estimate is None:
        return "- | -"
    return f"{estimate:.3f} | {math.sqrt(row['cos_squared_median']) / max(1e-9, 1 - estimate ** 2):.2f}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.quality_signal", description=__doc__.split("\n\n")[0])
    parser.add_argument("--choices", nargs="+", default=list(DEFAULT_CHOICES))
    parser.add_argument("--model", default="cnn")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--skip-steps", type=int, default=100, help="steps left out of the medians")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--bucket-cap-mb", type=float, default=0.25)
    parser.add_argument("--lr", type=float, default=0.02)
    parser.add_argument("--held-out", type=int, default=512, help="held-out samples")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--noise-scale", action="store_true",
                        help="also measure the gradient noise ratio B_noise/B (two extra backward passes a step)")
    parser.add_argument("--json-out", type=Path, default=None)
    args = parser.parse_args(argv)
    if not 0 <= args.skip_steps < args.steps:
        parser.error(f"--skip-steps: must be in [0, --steps={args.steps}), got {args.skip_steps}")
    import torch

    torch.set_num_threads(1)
    doc: dict[str, Any] = {"choices": {}, "job": {k: v for k, v in vars(args).items() if k != "json_out"}}
    for label in args.choices:
        doc["choices"][label] = result = run_choice(label, args)
        print(f"[quality_signal] {label}: {result}", flush=True)
    doc["job"]["date"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    publish(args.json_out, doc, markdown(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
