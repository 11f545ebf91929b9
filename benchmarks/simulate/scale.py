"""Paper-scale inputs (ASSUMED GPU compute, networks, GPU codec) and the scale grid with ACP-SGD's speedups.
"""

from __future__ import annotations

import statistics
from typing import Any, Iterable, Mapping, Sequence

from benchmarks.simulate.model import METHODS, PAPER_SPEEDUP, Compute, method_spec, predict
from planning.costmodel import (
    ElementCost,
    Link,
    codec_work,
)

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
COST_NAMES = {"ssgd": "none", "fp16": "fp16", "bf16": "bf16", "signsgd": "signsgd", "topk": "topk",
              "powersgd": "powersgd", "torch_powersgd": "torch_powersgd", "acpsgd": "acpsgd"}


def network_link(name: str) -> Link:
    net = NETWORKS[name]
    return Link(alpha=net["alpha_s"], beta=8.0 / (net["gbit"] * 1e9))


def gpu_codec(method: str, shapes: Sequence[Sequence[int]], rank: int, cost_json: Mapping[str, Any] | None,
              model: str, speedup: float = GPU_CODEC_SPEEDUP, fixed_s: float = GPU_CODEC_FIXED_S) -> ElementCost:
    """Per-element GPU codec cost from a codec measurement, ÷ ``speedup``, plus ``fixed_s`` per
    bucket phase.

    ``cost_json`` is ``compressor_cost.json`` (the CPU's measurement: ``speedup`` and
    ``fixed_s`` ASSUMED) or the ``codecs`` of ``benchmarks.gpu_check`` (measured on the GPU:
    pass ``speedup=1`` and ``fixed_s=0``, its launches are in the measured time). Both time one
    step's encode+decode at world size 1 on the paper's shapes; dividing by ``codec_work`` at
    world size 1 gives seconds per element pass, which the cost model then applies at any N
    (so the all-gather methods' decode grows with N) and at any rank of the family.
    """
    spec = method_spec(method, rank)
    work = codec_work(spec, [tuple(s) for s in shapes], 1)
    measured = None
    if cost_json is not None:
        measured = cost_json.get(model, {}).get(COST_NAMES[method], {}).get("encode_decode_s")
    if measured is None or work <= 0:
        return ElementCost(per_element_s=1e-9 / speedup, fixed_s=fixed_s, calibrated=False)
    return ElementCost(per_element_s=measured / work / speedup, fixed_s=fixed_s)


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


