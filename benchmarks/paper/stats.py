"""From raw rank records to the paper's statistics, and the planning that needs them: regimes' rates,
predicted step times, protocols, and the codec estimate of PyTorch's hook.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict
from typing import Any, Mapping, Sequence

from benchmarks.paper.cells import (
    A_RATIO,
    CODEC_BUCKET_CAP_MB,
    FALLBACK_PROTOCOLS,
    LINK_EFFICIENCY,
    PAPER_PROTOCOL,
    PHASES,
    QUICK_PROTOCOL,
    TOPK_RATIO,
    WORKLOADS,
    Cell,
    Protocol,
    Workload,
)
from benchmarks.simulate import COST_NAMES, Compute, layout_for, method_spec, predict

# --------------------------------------------------------------------------- statistics


def summarize(cell: Cell, raw: Mapping[str, Any]) -> dict[str, Any]:
    """The paper's statistic: mean iteration time over ``repeats`` blocks of ``iters``, ± 1.96σ
    of the block means; phases are means over the measured iterations (rank 0)."""
    workload = WORKLOADS[cell.workload]
    measured = raw["steps"][cell.protocol.warmup:]
    blocks = [measured[i * cell.protocol.iters:(i + 1) * cell.protocol.iters] for i in range(cell.protocol.repeats)]
    block_means = [statistics.fmean(s["wall_s"] for s in block) for block in blocks]
    iter_s = statistics.fmean(block_means)
    ci = 1.96 * statistics.stdev(block_means) if len(block_means) > 1 else 0.0
    samples = workload.batch_size * cell.workers
    throughput = [samples / t for t in block_means]
    phase_s = {phase: statistics.fmean(s[phase] for s in measured) for phase in PHASES}
    from workers.timing import compute_jitter_s

    return {
        # σ of one rank's compute per step: the cost model's straggler term (planning.costmodel).
        "compute_jitter_s": compute_jitter_s(measured),
        "model": cell.workload, "method": cell.method, "workers": cell.workers, "mbit": cell.mbit,
        "iter_s": iter_s, "iter_ci_s": ci,
        "samples_per_s": samples / iter_s,
        "samples_ci": 1.96 * statistics.stdev(throughput) if len(throughput) > 1 else 0.0,
        "exposed_comm_s": phase_s["exposed_comm"],
        "phase_s": phase_s,
        "codec_s": phase_s["compress"] + phase_s["decompress"],
        "bytes_per_step": raw["bytes_per_step"],
        "batch_size": workload.batch_size, "rank": cell.rank or (workload.rank if cell.method in ("powersgd", "torch_powersgd", "acpsgd") else None),
        "bucket_cap_mb": cell.effective_cap_mb, "pipelining": cell.pipelining, "tag": cell.tag,
        "protocol": asdict(cell.protocol),
        "link": {k: raw["link"][k] for k in ("alpha_s", "beta_s_per_byte", "bandwidth_bytes_per_second")},
        "link_mbit_seen": 8 * raw["link"]["bandwidth_bytes_per_second"] / 1e6 if raw["link"]["bandwidth_bytes_per_second"] else None,
        "final_loss": raw["final_loss"], "loadavg": raw.get("loadavg"), "elapsed_s": raw.get("elapsed_s"),
        "other_cpu_cores": raw.get("other_cpu_cores"), "rank0_cpu_share": raw.get("rank0_cpu_share"),
        "attempts": raw.get("attempts", 1),
        "cpu_cores": raw.get("cpu_cores"),
    }


def collective_cpu_s(fused: Cell, fused_raw: Mapping[str, Any], unfused: Cell, unfused_raw: Mapping[str, Any],
                     shapes: Sequence[Sequence[int]]) -> float:
    """Host seconds per collective: how much longer a step with one bucket per tensor takes
    than the same step with 25 MB buckets, per extra collective.

    Both are S-SGD with pipelining off on a fast link (the calibration's setting): the same
    bytes and compute, every collective after backward, so the difference is what each
    collective costs the worker's CPU (hook, issue, completion callback) beyond its bytes.
    """

    def step_s(cell: Cell, raw: Mapping[str, Any]) -> float:
        return statistics.median(s["forward"] + s["backward"] + s["optimizer"] for s in raw["steps"][cell.protocol.warmup:])

    extra = len(layout_for(shapes, unfused.bucket_cap_mb)) - len(layout_for(shapes, fused.bucket_cap_mb))
    return max(0.0, (step_s(unfused, unfused_raw) - step_s(fused, fused_raw)) / extra) if extra > 0 else 0.0


def calibration_entry(cell: Cell, raw: Mapping[str, Any]) -> dict[str, Any]:
    """Compute of one worker from a run with nothing overlapping backward.

    S-SGD with pipelining off on a fast link: the hook only holds buckets during backward, so
    backward minus exposed communication is backward compute; gradient ready times give its
    per-layer profile.
    """
    measured = raw["steps"][cell.protocol.warmup:]

    def median(key: Any) -> float:  # medians: one disturbed step must not move the regimes
        return statistics.median(key(s) for s in measured)

    forward = median(lambda s: s["data"] + s["forward"])
    backward = median(lambda s: max(0.0, s["backward"] - s["exposed_comm"]))
    optimizer = median(lambda s: s["optimizer"])
    return {
        "forward_s": forward, "backward_s": backward, "optimizer_s": optimizer,
        "compute_s": forward + backward + optimizer,
        "ready_s": raw["ready_s"],
        "other_cpu_cores": raw.get("other_cpu_cores"),
        "protocol": asdict(cell.protocol),
    }


# --------------------------------------------------------------------------- planning


def wire_bytes(method: str, shapes: Sequence[Sequence[int]], rank: int, workers: int) -> float:
    from planning.wire import wire_bytes as formula

    return formula(method_spec(method, rank, TOPK_RATIO), [tuple(s) for s in shapes], workers)


def _nice(mbit: float) -> float:
    """Round a rate to 2 significant digits (stable cache keys, readable tables)."""
    if mbit <= 0:
        return mbit
    digits = 1 - int(math.floor(math.log10(mbit)))
    return float(round(mbit, digits))


def regime_rates(workload: Workload, calib: Mapping[str, Any], shapes: Sequence[Sequence[int]], workers: int) -> dict[str, Any]:
    """Rates where (a) S-SGD's communication is ``A_RATIO``× its compute and (b) PowerSGD's
    communication equals backward compute, from the byte formulas and measured compute."""
    ring = 2 * (workers - 1) / workers
    ssgd = wire_bytes("ssgd", shapes, workload.rank, workers)
    psgd = wire_bytes("powersgd", shapes, workload.rank, workers)
    mbit_a = ring * ssgd * 8 / (A_RATIO * calib["compute_s"]) / 1e6 / LINK_EFFICIENCY
    mbit_b = ring * psgd * 8 / calib["backward_s"] / 1e6 / LINK_EFFICIENCY
    return {"a": _nice(mbit_a), "b": _nice(mbit_b), "ssgd_bytes": ssgd, "powersgd_bytes": psgd,
            "acpsgd_bytes": wire_bytes("acpsgd", shapes, workload.rank, workers)}


def predicted_step_s(cell: Cell, calib: Mapping[str, Any], shapes: Sequence[Sequence[int]], cost: Mapping[str, Any] | None) -> float:
    """A rough prediction (cost model, nominal link) to choose the protocol and the timeout."""
    from planning.costmodel import CodecCost, Link

    workload = WORKLOADS[cell.workload]
    compute = Compute(calib["forward_s"], calib["backward_s"], calib["optimizer_s"], tuple(calib["ready_s"]))
    codec_s = 0.0
    if cost is not None:
        # compressor_cost.json times ResNet-50's and BERT-Base's shapes (with 2 threads; ranks
        # here have one): scale by parameter count for the other models of the same family.
        ref = cost.get("bert-base" if workload.is_bert else "resnet50", {})
        params = sum(math.prod(s) for s in shapes)
        ref_params = ref.get("none", {}).get("bytes_per_step", 4 * params) / 4
        codec_s = 1.5 * ref.get(COST_NAMES[cell.method], {}).get("encode_decode_s", 0.0) * params / ref_params
    link = Link(alpha=2e-4, beta=8 / (cell.mbit * 1e6 * LINK_EFFICIENCY))
    pred = predict(cell.method, shapes, compute, cell.workers, link, rank=cell.rank or workload.rank,
                   codec=CodecCost(codec_s), bucket_cap_mb=cell.effective_cap_mb, pipelining=cell.pipelining)
    return pred.step_s * (1.3 if cell.workers > 2 else 1.0)  # >2 ranks share 2 cores


def choose_protocol(step_s: float, budget_s: float, quick: bool) -> Protocol:
    if quick:
        return QUICK_PROTOCOL
    for protocol in (PAPER_PROTOCOL, *FALLBACK_PROTOCOLS):
        if protocol.steps * step_s <= budget_s:
            return protocol
    return FALLBACK_PROTOCOLS[-1]


def add_codec_estimates(rows: list[dict[str, Any]], codecs: Mapping[str, Mapping[str, float]],
                         cost: Mapping[str, Any] | None) -> None:
    """For torch_powersgd rows (whose codec cannot be separated from communication inside
    PyTorch's hook): our PowerSGD's codec measured in the runs on the same model × the
    torch/ours ratio measured apart from communication in the runs' layouts (``codecs``;
    compressor_cost.json's 25 MB-bucket ratio where a model has none). Other rows: their own
    measured codec."""
    for row in rows:
        row["codec_estimate_s"] = row["codec_s"]
        if row["method"] != "torch_powersgd":
            continue
        isolated = codecs.get(row["model"])
        same = [r for r in rows if r["model"] == row["model"] and r["method"] == "powersgd"
                and r["workers"] == row["workers"] and r.get("rank") == row.get("rank")]
        # The ratio is measured in the grid's layout: ours from runs in that layout, where any.
        in_layout = [r for r in same if r.get("pipelining", True)
                     and r["bucket_cap_mb"] == (isolated or {}).get("bucket_cap_mb", CODEC_BUCKET_CAP_MB)]
        ours = [r["codec_s"] for r in (in_layout or same)]
        ratio = 1.0
        ref = (cost or {}).get("bert-base" if row["model"].startswith("bert") else "resnet50", {})
        if isolated:
            ratio = isolated["torch_powersgd_s"] / isolated["powersgd_s"]
        elif ref.get("powersgd") and ref.get("torch_powersgd"):
            ratio = ref["torch_powersgd"]["encode_decode_s"] / ref["powersgd"]["encode_decode_s"]
        row["codec_ratio_to_powersgd"] = ratio
        row["codec_estimate_s"] = statistics.fmean(ours) * ratio if ours else 0.0


