"""What the scenario comes to: Prometheus' record of it, the plot, whether the ranks agreed, the verdict.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from benchmarks.adaptive import boundaries, parse_label
from benchmarks.cluster.errors import ClusterError
from benchmarks.cluster.nodes import Cluster
from benchmarks.cluster.scenario import ScenarioOptions, label_of, run_scenario
from benchmarks.machine import foreign_load
from coordinator.client import Client

# --------------------------------------------------------------------------- Prometheus


def prometheus_record(url: str, job_id: str, start: float, end: float, step_s: float = 1.0) -> dict[str, Any]:
    """What Prometheus scraped for the job: compressors seen, per-phase series, and the range data."""
    import httpx

    def query_range(promql: str) -> list[dict[str, Any]]:
        body = httpx.get(f"{url}/api/v1/query_range", timeout=10,
                         params={"query": promql, "start": start, "end": end, "step": step_s}).json()
        if body.get("status") != "success":
            raise ClusterError(f"Prometheus query {promql!r} failed: {body}")
        return body["data"]["result"]

    info = query_range(f'gradwire_compressor_info{{job="{job_id}"}} == 1')
    compressors = sorted({_info_label(s["metric"]) for s in info})
    phases = query_range(f'sum by (phase) (rate(gradwire_step_phase_seconds_sum{{job="{job_id}"}}[5s]))'
                         f' / sum by (phase) (rate(gradwire_step_phase_seconds_count{{job="{job_id}"}}[5s]))')
    bandwidth = query_range(f'gradwire_network_bandwidth_bytes_per_second{{job="{job_id}"}}')
    return {
        "compressors_seen": compressors,
        "phase_series": len({s["metric"].get("phase") for s in phases}),
        "phases_seen": sorted({s["metric"].get("phase", "") for s in phases}),
        "range": {"start": start, "end": end, "step_s": step_s,
                  "phase_seconds": {s["metric"].get("phase", ""): s["values"] for s in phases},
                  "compressor_info": [{"compressor": _info_label(s["metric"]), "values": s["values"]} for s in info],
                  "bandwidth": bandwidth[0]["values"] if bandwidth else []},
    }


def _info_label(metric: dict[str, str]) -> str:
    name, rank = metric.get("compressor", "?"), metric.get("compressor_rank", "")
    try:
        return label_of(name, {"rank": int(rank)} if rank not in ("", "0", "None") and name in ("powersgd", "acpsgd") else {})
    except ValueError:
        return name


def plot(doc: dict[str, Any], path: Path) -> None:
    """The run as Prometheus recorded it: per-phase step time stacked, the link rate, the switches."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    prom = doc["prometheus"]["range"]
    origin = prom["start"]
    fig, (ax, bx) = plt.subplots(2, 1, figsize=(11, 7), sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    order = ["data", "forward", "backward", "exposed_comm", "optimizer"]
    series = {p: dict((float(t), float(v)) for t, v in prom["phase_seconds"].get(p, []) if v not in ("NaN",))
              for p in order}
    times = sorted({t for values in series.values() for t in values})
    stacks = [[series[p].get(t, 0.0) * 1e3 for t in times] for p in order]
    ax.stackplot([t - origin for t in times], stacks, labels=order, alpha=0.85)
    for s in doc["switches"]:
        ax.axvline(s["at"] - origin, color="black", ls=":", lw=1)
        ax.annotate(f"{s['to']} ({s['source']})", (s["at"] - origin, 1.0), xycoords=("data", "axes fraction"),
                    rotation=90, va="top", ha="right", fontsize=8)
    ax.set_ylabel("ms per step, by phase (Prometheus)")
    ax.legend(loc="upper left", fontsize=8)
    ax.set_title(f"gradwire on a 2-node Ray cluster, emulated link: job {doc['job_id']}")
    rates = doc["rate_changes"]
    xs, ys = [], []
    for change, nxt in zip(rates, rates[1:] + [None]):
        xs += [change["at"] - origin, (nxt["at"] if nxt else prom["end"]) - origin]
        ys += [change["mbit"], change["mbit"]]
    bx.plot(xs, ys, color="tab:blue", label="link rate set (Mbit/s)")
    bw = [(float(t) - origin, float(v) * 8e-6) for t, v in prom["bandwidth"]]
    if bw:
        bx.plot(*zip(*bw), color="tab:orange", label="bandwidth measured (Mbit/s, Prometheus)")
    bx.set_yscale("log")
    bx.set_xlabel("seconds since the job was submitted")
    bx.legend(loc="lower left", fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def ranks_agree(summary: dict[str, Any]) -> bool | None:
    """Whether every rank applied the same decisions at the same steps (the final
    checkpoint's per-rank records); None when the run left no records."""
    from workers.runner import rank_records

    path = summary.get("checkpoint_path")
    if not path or not Path(path).exists():
        return None
    records = rank_records(path)
    if len(records) < 2:
        return None
    applied = [[(a["step"], a["version"]) for a in r["applied"]] for r in records]
    return all(a == applied[0] for a in applied[1:])


def scenario(cluster: Cluster, opts: ScenarioOptions, *, log: Any = print) -> dict[str, Any]:
    """:func:`run_scenario` plus what Prometheus saw, whether the ranks agreed and the
    machine's foreign load; the document of ``scenario --json-out``."""
    load: dict[str, float] = {}
    with foreign_load(load, own_pids=cluster.own_pids):  # the cluster's processes are the scenario's own
        doc = run_scenario(cluster, opts, log=log)
    end = time.time() + 3  # one more scrape after the job ended
    time.sleep(3)
    start = doc["rate_changes"][0]["at"]
    doc["prometheus"] = prometheus_record(cluster.prometheus_url, doc["job_id"], start, end)
    client = Client(cluster.url, cluster.token)
    summary = client.job(doc["job_id"]).get("summary") or {}
    client.close()
    doc["ranks_switch_at_the_same_step"] = ranks_agree(summary) if opts.kill_node_at is None else None
    doc["summary"] = {k: summary.get(k) for k in ("steps", "final_loss", "start_step", "world_size", "compressor", "compressor_rank")}
    doc["foreign_cores"] = load.get("foreign_cores")
    doc["cluster"] = {"nodes": cluster.nodes, "cpus_per_node": 1, "machine_cores": os.cpu_count()}
    doc["verdict"] = verdict(doc, opts)
    return doc


COMPRESSING = ("fp16", "bf16", "signsgd", "topk", "powersgd", "acpsgd")


def _lossiness(label: str) -> tuple[int, float]:
    """An order of how much a choice loses: none < fp16/bf16 < low-rank/top-k/sign by
    smaller rank or ratio (a rough order, used only to read the scenario's verdict)."""

    name, params = parse_label(label)
    if name == "none":
        return (0, 0.0)
    if name in ("fp16", "bf16"):
        return (1, 0.0)
    if "rank" in params:
        return (2, -float(params["rank"]))
    if "ratio" in params:
        return (2, -float(params["ratio"]) * 1e4)
    return (3, 0.0)


def verdict(doc: dict[str, Any], opts: ScenarioOptions) -> dict[str, Any]:
    """The acceptance checks of issue 13, from the document itself."""
    ends = boundaries(opts.schedule)
    slow = min(range(len(opts.schedule)), key=lambda i: opts.schedule[i].mbit)
    slow_start, slow_end = (ends[slow - 1] if slow else 0), ends[slow]
    policy = [s for s in doc["switches"] if s["source"] == "policy" and s["step"] is not None]
    changing = len({p.mbit for p in opts.schedule}) > 1  # a steady link has no drop or rise
    drop = [s for s in policy if changing and slow_start <= s["step"] <= slow_end
            and _lossiness(s["to"]) > _lossiness(s["from"])]
    rise = [s for s in policy if changing and s["step"] > slow_end and _lossiness(s["to"]) < _lossiness(s["from"])]
    changes = doc["rate_changes"]

    def reports_after(switch: dict[str, Any], change: int) -> float | None:
        """Telemetry reports from the rate change to the decision (report interval apart)."""
        if change >= len(changes):
            return None
        return round((switch["at"] - changes[change]["at"]) / opts.report_interval_s, 1)

    out: dict[str, Any] = {
        "succeeded": doc["state"] == "succeeded",
        "switch_to_compression_while_slow": drop[0]["step"] if drop else None,
        "reports_from_drop_to_switch": reports_after(drop[0], slow) if drop else None,
        "switch_to_less_lossy_after_recovery": rise[0]["step"] if rise else None,
        "reports_from_rise_to_switch": reports_after(rise[0], slow + 1) if rise else None,
        "prometheus_compressors": len(doc["prometheus"]["compressors_seen"]),
        "prometheus_all_phases": doc["prometheus"]["phase_series"] >= 5,
    }
    if opts.kill_node_at is not None:
        sizes = [w["world_size"] for w in doc["world_sizes"]]
        out["world_size_down_and_up"] = any(a > b for a, b in zip(sizes, sizes[1:])) and \
            any(a < b for a, b in zip(sizes, sizes[1:]))
        lost = [r["steps_lost"] for r in doc["restarts"]]
        out["restarts"] = len(lost)
        out["steps_lost_max"] = max(lost) if lost else None
        out["steps_lost_within_checkpoint_interval"] = bool(lost) and max(lost) <= opts.checkpoint_every
    return out


