"""``python -m benchmarks.adaptive``; ``--cluster`` runs the jobs on the emulated Ray cluster.

The cluster is imported here, not in :mod:`.cli`: ``benchmarks.cluster`` builds on this
package (its schedules and testbed helpers), so only this entry point, which no module
imports, may depend on both.
"""

import argparse
import sys
from contextlib import contextmanager
from typing import Iterator

from benchmarks.adaptive.cli import local_backend, main
from benchmarks.adaptive.jobs import Backend


@contextmanager
def backend_for(args: argparse.Namespace, first_rate: float) -> Iterator[Backend]:
    """Local processes, or (``--cluster``) jobs submitted to the coordinator of an emulated
    2-node Ray cluster, started here and stopped at the end."""
    if not args.cluster:
        with local_backend(args, first_rate) as backend:
            yield backend
        return
    from benchmarks.adaptive.on_cluster import HISTORY_INTERVAL_S, ClusterBackend
    from benchmarks.cluster.nodes import Cluster

    print("[adaptive] starting the emulated Ray cluster (2 nodes, coordinator, Prometheus)", flush=True)
    with Cluster(nodes=2, mbit=first_rate, history_interval_s=HISTORY_INTERVAL_S) as cluster:
        print(f"[adaptive] cluster up; coordinator {cluster.url}", flush=True)
        yield ClusterBackend(cluster)


if __name__ == "__main__":
    sys.exit(main(backends=backend_for))
