"""An emulated multi-node Ray cluster on one machine, and gradwire's whole loop running on it.

Why: gradwire exists for one scenario -- a job submitted over REST runs on a Ray cluster whose
network changes under it, and the coordinator, from the bandwidth the workers measure,
switches compressor and rank while training runs, with every phase visible in Prometheus.
This module builds that cluster out of :mod:`benchmarks.testbed` namespaces and runs it.

The cluster (:class:`Cluster`, ``python -m benchmarks.cluster up``):

* node i is the network namespace of testbed host i, joined to the others by ``tc tbf``-
  shaped veth links (rates change live, per link: :meth:`Cluster.set_rate`);
* node 0 runs the Ray head (``ray start --head --node-ip-address <its address>``), every
  other node a Ray worker node (``ray start --address``); each offers ONE logical CPU, and
  each Ray Train worker takes one, so Ray Train puts one training worker on each node and
  the gradient all-reduce crosses the shaped links. Every node's raylet (and so every Ray
  worker process it starts) has ``GLOO_SOCKET_IFNAME`` set to the node's own interface;
  Ray Train sets ``MASTER_ADDR`` to rank 0's node address;
* the coordinator (``gradwire serve``) and a real Prometheus (Debian's) run beside the head
  in node 0's namespace: the coordinator is a Ray driver (``ray.init(address=...)``), and a
  Ray driver must run on a Ray node. It listens on all of node 0's addresses with a random
  operator token (the workers' telemetry reaches it over the shaped link, as in a cloud);
  Prometheus scrapes it every second;
* a management veth (unshaped, its own /30) joins node 0 to the root namespace, so this
  machine's browser, the scenario driver and ``curl`` reach the coordinator, its live page
  and Prometheus (:attr:`Cluster.url`, :attr:`Cluster.prometheus_url`).

Every process the cluster starts lives inside one of its namespaces, so deleting them (on
exit, on an exception, on Ctrl-C and SIGTERM; after a hard kill, the next start's stale
sweep :func:`benchmarks.testbed.cleanup_stale`, by creating pid) leaves nothing behind: no
namespaces, veths, Ray processes, coordinator or Prometheus. All addresses (10.213.x.0/24
between nodes, 10.214.x.0/30 for management) exist only on links the cluster created.

What is NOT emulated: latency (this kernel has no ``netem``; a veth has ~0 latency), packet
loss, and real CPUs per node: every node offers one logical CPU to Ray, but all nodes share
this machine's cores (2 here) with the coordinator and Prometheus.

The scenario (:func:`run_scenario`, ``python -m benchmarks.cluster scenario``): submit an
adaptive job over REST, walk the link rate through a schedule by step count (fast -> slow
-> fast, as :mod:`benchmarks.adaptive` does), optionally kill node 1's Ray processes at a
step and bring it back, and record what the coordinator decided, what Prometheus saw and
the world sizes. Needs root, ``ip netns``, ``tc``, ``ray`` and ``prometheus``.

Modules: :mod:`.nodes` (the :class:`Cluster`), :mod:`.state` (state files for the CLI),
:mod:`.scenario` (the scenario and its phase report), :mod:`.results` (Prometheus' record,
plot, verdict), :mod:`.cli` (the command); the names below are the package's public interface.
"""

from benchmarks.cluster.errors import ClusterError
from benchmarks.cluster.nodes import Cluster, available
from benchmarks.cluster.results import prometheus_record, ranks_agree, scenario, verdict
from benchmarks.cluster.scenario import (
    NODE_LOSS_SCHEDULE,
    FollowedJob,
    ScenarioOptions,
    follow_scenario,
    phase_report,
    run_scenario,
)
from benchmarks.cluster.state import STATE_DIR, live_states, sweep_stale

__all__ = [
    "NODE_LOSS_SCHEDULE", "STATE_DIR", "Cluster", "ClusterError", "FollowedJob", "ScenarioOptions", "available",
    "follow_scenario", "live_states",
    "phase_report", "prometheus_record", "ranks_agree", "run_scenario", "scenario", "sweep_stale", "verdict",
]
