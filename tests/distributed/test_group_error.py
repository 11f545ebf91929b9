"""The group's compression error (compressors.quality.group_error) on two real gloo ranks with
different data, against its definition ‖ē‖ / ‖x̄‖ computed from every rank's full tensors.

Why it matters: with shared low-rank factors a rank's residual ``e_i = x_i − C(x̄)`` keeps how
its gradient differs from the mean, so a rank's own ratio drifts towards 1 whatever the rank;
the mean's ratio is what training applies.

ACP-SGD's figures are pooled over its cycle, a P-step and the Q-step after it
(``planning.codec.Codec.cycle_steps``): the reference pools the same two steps.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
from harness import run_ranks
from torch.nn.parallel import DistributedDataParallel as DDP

from compressors import GradientSync, build
from compressors.measured_cycle import cycle_steps
from compressors.quality import ErrorMeter, group_error

STEPS = 8
CHOICES = {"none": ("none", {}), "powersgd-r2": ("powersgd", {"rank": 2}), "acpsgd-r2": ("acpsgd", {"rank": 2}),
           "topk-0.05": ("topk", {"ratio": 0.05})}


def _flat(tensors: dict[str, torch.Tensor], shapes: dict[str, torch.Size]) -> torch.Tensor:
    return torch.cat([tensors[k].reshape(-1).double() if k in tensors else torch.zeros(shapes[k].numel(), dtype=torch.float64)
                      for k in sorted(shapes)])


def _errors(rank: int, world: int, name: str, params: dict) -> list[tuple[float | None, float | None, float | None, float | None, float | None]]:
    """Per step: (group_error, ‖ē‖/‖x̄‖ from the full tensors, this rank's own ratio, the
    group's update efficiency, cos(x̄ − ē, ḡ) from the full tensors); both references
    pooled over the compressor's cycle of steps ending with this one (None before a whole
    cycle ran)."""
    torch.manual_seed(0)  # the same initial model on every rank
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))
    local = copy.deepcopy(model)  # this rank's own gradient g_i, outside DDP
    ddp = DDP(model, bucket_cap_mb=0.001)
    sync = GradientSync(build(name, **params)).install(ddp)
    sync.error_meter = meter = ErrorMeter(total_elements=sync.trained_elements, coordinates=200_000)
    shapes = {key: p.shape for key, p in model.named_parameters()}
    gen = torch.Generator().manual_seed(100 + rank)  # different data on every rank
    out, sums_by_step = [], []
    for _ in range(STEPS):
        inputs, targets = torch.randn(16, 32, generator=gen), torch.randint(0, 10, (16,), generator=gen)
        before = sync.compressor.residuals() if hasattr(sync.compressor, "residuals") else {}
        e_old = _flat({k.removeprefix("module."): v for k, v in before.items()}, shapes)
        local.zero_grad()
        nn.functional.cross_entropy(local(inputs), targets).backward()
        g = _flat({k: p.grad for k, p in local.named_parameters()}, shapes)
        x = g + e_old
        model.zero_grad()
        nn.functional.cross_entropy(ddp(inputs), targets).backward()
        after = sync.compressor.residuals() if hasattr(sync.compressor, "residuals") else {}
        e_new = _flat({k.removeprefix("module."): v for k, v in after.items()}, shapes)
        own = meter.last
        measured = group_error(meter)
        sums = torch.cat([x, e_new, g])
        dist.all_reduce(sums)
        sums_by_step.append(sums.chunk(3))
        cycle = cycle_steps(sync.compressor)
        if len(sums_by_step) < cycle:
            out.append((measured, None, own, meter.group_efficiency, None))
            continue
        x_sum, e_sum, g_sum = (torch.cat(part) for part in zip(*sums_by_step[-cycle:]))
        update = x_sum - e_sum
        efficiency = float(update @ g_sum / (update.norm() * g_sum.norm()))
        out.append((measured, float(e_sum.norm() / x_sum.norm()), own, meter.group_efficiency, efficiency))
    return out


@pytest.mark.parametrize("label", CHOICES)
def test_the_group_error_is_the_mean_residual_over_the_mean_input(label):
    name, params = CHOICES[label]
    ranks = run_ranks(_errors, 2, name, params)
    assert [r[0] for r in ranks[0]] == [r[0] for r in ranks[1]]  # one figure for the group
    assert [r[3] for r in ranks[0]] == [r[3] for r in ranks[1]]
    if label.startswith("acpsgd"):  # a whole cycle is two steps: nothing to read after the first
        assert ranks[0][0][0] is None and ranks[0][0][3] is None and ranks[0][0][1] is None
        ranks = [steps[1:] for steps in ranks]
    for measured, exact, _own, efficiency, exact_efficiency in ranks[0]:
        assert measured is not None and efficiency is not None and exact is not None and exact_efficiency is not None
        # Each tensor's coordinates are drawn with replacement (capped at its size here): the
        # cross terms of ⟨ū, ḡ⟩ cancel, so its sampled figure scatters more than ε's (±0.08 seen
        # for the first-order share ⟨ū, ḡ⟩/‖ḡ‖², the figure before the cosine).
        assert efficiency == pytest.approx(min(1.0, max(0.0, exact_efficiency)), abs=0.1)
        if label == "none":
            assert measured == 0.0 and exact == 0.0 and efficiency == pytest.approx(1.0, abs=1e-12)  # a cosine: round-off
            continue
        assert measured == pytest.approx(exact, rel=0.05, abs=1e-3)  # 200k sampled coordinates of 2762
    mean_gap = sum(r[3] - min(1.0, max(0.0, r[4])) for r in ranks[0]) / len(ranks[0])
    assert abs(mean_gap) < 0.03  # no bias: what the policy's running average sees
    if label == "powersgd-r2":  # shared factors: a rank's own ratio overstates the loss
        last_measured, _, last_own, _, _ = ranks[0][-1]
        assert last_own is not None and last_own > last_measured + 0.05
