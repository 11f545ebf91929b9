"""``--cluster``: each benchmark job submitted over REST to the coordinator of the emulated Ray
cluster (``benchmarks.cluster``), the way a user runs one, instead of two local processes.

What differs from :func:`benchmarks.adaptive.jobs.run_job`, and why it is still the same job:
the configuration is the same :class:`~planning.config.TrainConfig` (submitted as its
``JobSpec`` fields); Ray Train starts one worker on each of the cluster's two nodes, so the
all-reduce crosses the same kind of shaped veth link; the adaptive policy runs in the
coordinator (``coordinator.service``), not in rank 0, and reaches the workers over REST; the
rate is changed when the coordinator's record of the job shows a phase's last step
(``benchmarks.cluster.scenario.run_scenario``). The wall times are the coordinator's receive
times of the reports it keeps (one per ``HISTORY_INTERVAL_S``); the held-out curve comes from
every checkpoint the run left in Ray's storage (``checkpoints.keep`` null keeps them all).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

from benchmarks.adaptive.jobs import JobRun
from benchmarks.adaptive.scenarios import Phase
from benchmarks.cluster.errors import ClusterError
from benchmarks.cluster.nodes import Cluster
from benchmarks.cluster.scenario import ScenarioOptions, follow_scenario
from planning.config import TrainConfig

#: How often the coordinator keeps a report in a job's history, in seconds: the resolution of
#: a run's wall time by step (the local runs read every report, 0.1 s apart).
HISTORY_INTERVAL_S = 0.1
#: Fields of a TrainConfig that the coordinator sets itself (a JobSpec refuses them).
COORDINATOR_FIELDS = {"checkpoint_dir", "coordinator_url", "job_id", "job_token"}


def job_spec(cfg: TrainConfig) -> dict[str, Any]:
    """``cfg`` as the JobSpec body to submit, keeping every checkpoint (the held-out curve
    evaluates them all afterwards)."""
    spec = cfg.model_dump(mode="json", exclude=COORDINATOR_FIELDS)
    spec["checkpoints"] = {**spec["checkpoints"], "keep": None}
    return spec


def reports_of(telemetry: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The coordinator's history points as the reports :class:`JobRun` reads: ``wall_time`` is
    the time the coordinator received the report; a restarted worker group's repeated steps
    are dropped (the first report of a step stands)."""
    out: list[dict[str, Any]] = []
    for point in sorted(telemetry, key=lambda p: p["at"]):
        if out and point["step"] <= out[-1]["step"]:
            continue
        out.append({"step": point["step"], "wall_time": point["at"], "compressor": point.get("compressor"),
                    "compressor_rank": point.get("compressor_rank"), "ratio": point.get("ratio"),
                    "bandwidth_bytes_per_second": point.get("bandwidth_bytes_per_second")})
    return out


class ClusterBackend:
    """Runs each benchmark job on a started :class:`Cluster` (two nodes) through its coordinator."""

    where = ("the emulated 2-node Ray cluster (benchmarks.cluster): each run a job submitted over REST to "
             "the coordinator, one Ray Train worker per node, the policy in the coordinator")

    def __init__(self, cluster: Cluster, timeout_s: float = 600.0) -> None:
        if cluster.history_interval_s > HISTORY_INTERVAL_S:
            raise ValueError(f"cluster.history_interval_s: at most {HISTORY_INTERVAL_S} s for time to target, "
                             f"got {cluster.history_interval_s}")
        self.cluster = cluster
        self.timeout_s = timeout_s

    def own_pids(self) -> list[int]:
        """Every process of the cluster (Ray nodes, coordinator, Prometheus, training workers):
        the benchmark's own, though not its children."""
        return self.cluster.own_pids()

    def run(self, cfg: TrainConfig, phases: Sequence[Phase], workdir: Path, *, label: str) -> JobRun:
        """Submit ``cfg``, walk the rate through ``phases`` by step, and collect what the job
        left: its reports, summary, rate changes and final checkpoint (under Ray's storage)."""
        workdir.mkdir(parents=True, exist_ok=True)
        opts = ScenarioOptions(schedule=list(phases), timeout_s=self.timeout_s, job=job_spec(cfg))
        doc, job, history = follow_scenario(self.cluster, opts, log=lambda message: None)
        if doc["state"] != "succeeded":
            raise ClusterError(f"{label}: job {doc['job_id']} {doc['state']}: {doc['reason']}")
        summary = job.get("summary") or {}
        if not summary.get("checkpoint_path"):
            raise ClusterError(f"{label}: job {doc['job_id']} left no checkpoint")
        (workdir / "job.json").write_text(json.dumps({"job": job, "history": history, "scenario": doc}, default=str))
        changes = [(int(c["step"]), float(c["at"]), float(c["mbit"])) for c in doc["rate_changes"][1:]]
        return JobRun(label=label, reports=reports_of(history["telemetry"]), summary=summary, rate_changes=changes,
                      checkpoint=Path(summary["checkpoint_path"]))
