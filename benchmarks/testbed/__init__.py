"""An emulated network on one Linux machine: namespaces, veth links, ``tc`` rate limits.

Why: the adaptive policy must be tested against a link whose speed we know and can change
while a job runs, without a cluster. Each emulated host is a Linux network namespace; with
two hosts a veth pair joins them directly, with more a bridge inside a separate "switch"
namespace does. Each host's link is rate-limited in BOTH directions with ``tbf`` (the host's
egress on its own veth end, its ingress on the peer end), and ``set_rate`` changes it live.

What it can and cannot emulate here:

* rate limits work: ``tbf`` on veth pairs between namespaces (``htb`` would too). A gloo
  all-reduce's payload rate comes out 3-10% under the set rate (``python -m benchmarks.testbed
  verify --mbit 200``): ``tc`` counts Ethernet/IP/TCP headers (~4%), and gloo's ring loses a
  little more at low rates (measured: 1000 -> ~970, 400 -> ~384, 200 -> ~190, 100 -> ~91,
  50 -> ~43 Mbit/s; a plain TCP stream sees 50 -> 48);
* delay, jitter and loss do NOT: this kernel has no ``netem`` qdisc (``tc`` answers
  "Specified qdisc kind is unknown"), so every link has the near-zero latency of a veth;
* shaping ``lo`` inside a single namespace halves each direction's rate (both directions
  share one queue), which is why every host gets its own namespace and its own link.

Safety: every link is created directly inside the namespaces (``ip link add ... netns``),
never in the root namespace, and the 10.213.x.0/24 addresses exist only there, so no
traffic can leave the machine. Everything a testbed creates -- namespaces, links, the
processes it started -- is removed on exit, on an exception, on Ctrl-C and on SIGTERM
(context manager, a SIGTERM handler and ``atexit``). Leftovers of a process that was
killed hard are removed by :func:`cleanup_stale`. Namespace names are
``gw-<creator pid>-<random hex>-<host index>`` (``-sw`` for the switch), so stale ones
are recognised by their creator being dead and a live testbed of another process is
never touched.

Needs root (or CAP_NET_ADMIN + CAP_SYS_ADMIN), ``ip`` and ``tc`` from iproute2.
:meth:`Testbed.available` says whether this machine qualifies and, if not, why.

Modules: :mod:`.netns` (namespace commands, availability, shaping), :mod:`.bed` (the
:class:`Testbed`), :mod:`.lifetime` (removal on exit/SIGTERM), :mod:`.schedule` (a rate walked
in a thread), :mod:`.gloo` (torch processes on the hosts, a timed all-reduce); the names below
are the package's public interface.
"""

from benchmarks.testbed.bed import Testbed
from benchmarks.testbed.gloo import AllReduceMeasurement, collect_outputs, measure_allreduce, worker_env
from benchmarks.testbed.netns import (
    TestbedError,
    alive,
    cleanup_stale,
    kill_pids,
    list_namespaces,
    pids_in,
    set_link_rate,
    sh,
    tbf_burst_bytes,
)
from benchmarks.testbed.schedule import RateSchedule, run_schedule

__all__ = [
    "AllReduceMeasurement", "RateSchedule", "Testbed", "TestbedError", "alive", "cleanup_stale", "collect_outputs",
    "kill_pids", "list_namespaces", "measure_allreduce", "pids_in", "run_schedule", "set_link_rate", "sh",
    "tbf_burst_bytes", "worker_env",
]
