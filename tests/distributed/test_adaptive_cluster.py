"""The time-to-target benchmark's jobs on the emulated Ray cluster (``benchmarks.adaptive --cluster``).

Real parts only: two Ray nodes in network namespaces joined by a shaped veth link, the
coordinator beside the head, a job submitted over REST. Skipped, with the reason, where the
cluster cannot be made here.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import adaptive
from benchmarks import cluster as cl
from benchmarks.adaptive.on_cluster import HISTORY_INTERVAL_S, ClusterBackend
from benchmarks.machine import ForeignLoad

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("emulated_cluster_available")]


@pytest.mark.timeout(400)
def test_a_benchmark_job_runs_through_the_coordinator_and_keeps_every_checkpoint(tmp_path: Path) -> None:
    phases = adaptive.parse_schedule("1000:20,50:10")
    args = adaptive.parse_args(["--cluster"])
    cfg = adaptive.train_config(args, adaptive.fixed_compression("none"), steps=30, checkpoint_every=10)
    with cl.Cluster(nodes=2, mbit=1000, history_interval_s=HISTORY_INTERVAL_S) as cluster:
        backend = ClusterBackend(cluster)
        everything, foreign = ForeignLoad(), ForeignLoad(backend.own_pids)
        run = backend.run(cfg, phases, tmp_path / "run", label="none")
        cores_seen, cores_foreign = everything.cores(), foreign.cores()
        foreign.close()
        assert backend.own_pids()  # Ray, the coordinator and Prometheus run in the cluster's namespaces
        # every checkpoint is kept in Ray's storage (the default keeps two); the held-out curve
        # evaluates each (the storage goes with the cluster)
        assert run.checkpoint is not None
        curve = adaptive.HeldOut(cfg, samples=64).curve(run.checkpoint.parent)

    steps = [r["step"] for r in run.reports]
    assert steps == sorted(steps) and steps[-1] == 30 and len(steps) >= 5
    walls = [r["wall_time"] for r in run.reports]
    assert walls == sorted(walls)
    assert {r["compressor"] for r in run.reports} == {"none"}
    # the rate went to 50 Mbit/s once the coordinator's record showed step 20
    assert len(run.rate_changes) == 1 and run.rate_changes[0][0] >= 20 and run.rate_changes[0][2] == 50
    assert [step for step, _ in curve] == [10, 20, 30]
    assert all(0 < loss < 10 for _, loss in curve)
    assert run.summary["final_loss"] > 0
    # the training ran in the cluster's processes: counted as the benchmark's own, not foreign
    assert cores_seen - cores_foreign > 0.3, (cores_seen, cores_foreign)
