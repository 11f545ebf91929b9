"""Validation: every real small-scale run of ``paper.json`` re-predicted, and the prediction errors.
"""

from __future__ import annotations

import statistics
from typing import Any, Mapping, Sequence

from benchmarks.simulate.model import METHODS, Compute, predict
from planning.costmodel import (
    CodecCost,
    Link,
)

# --------------------------------------------------------------------------- validation


def _shapes_for(row: Mapping[str, Any], paper: Mapping[str, Any]) -> list[tuple[int, ...]]:
    return [tuple(s) for s in paper["workloads"][row["model"]]["shapes"]]


def codec_share_factor(workers: int, cpu_cores: int | None) -> float:
    """Wall seconds per CPU second of a codec on the measuring host.

    The runs time codecs as CPU time (``compressors.sync``), and the ranks (one CPU thread
    each, as ``benchmarks.paper`` runs them) run theirs at about the same moment (their collectives
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
    links = links_by_setting(rows)
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
            # Its hook's whole run (encode, both rounds, decode) is one timed span: benchmarks.paper
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


def links_by_setting(rows: Sequence[Mapping[str, Any]]) -> dict[tuple[int, float], Link]:
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


