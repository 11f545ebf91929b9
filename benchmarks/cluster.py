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
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `benchmarks` is not an installed package
    sys.path.insert(0, str(ROOT))

from benchmarks.adaptive import (  # noqa: E402
    LOCK_PATH,
    Phase,
    bench_lock,
    boundaries,
    cap_gso,
    foreign_load,
    parse_schedule,
    wait_for_quiet,
)
from benchmarks.testbed import (  # noqa: E402
    Testbed,
    TestbedError,
    _alive,
    _kill_pids,
    _pids_in,
    _sh,
    cleanup_stale,
    set_link_rate,
    worker_env,
)
from coordinator import raylocal  # noqa: E402
from coordinator.client import ApiError, Client  # noqa: E402

#: Inside node 0's namespace ports are our own: fixed numbers cannot clash with anything.
RAY_PORT = 6379
COORDINATOR_PORT = 8321
PROMETHEUS_PORT = 9090
MGMT_IF = "gwmgmt"  # node 0's end of the management link
MGMT_BASE = "10.214"
STATE_DIR = Path(tempfile.gettempdir()) / "gradwire-cluster"
PROMETHEUS = "/usr/bin/prometheus"
#: Ray's object store per node: small, the jobs here pass no large objects.
OBJECT_STORE_BYTES = 100 * 1024 * 1024
TERMINAL = ("succeeded", "failed", "cancelled")
#: The head declares a node dead after 3 missed health checks 1 s apart (Ray's default: 5
#: checks 3 s apart, ~15-30 s). Why: a killed node must be seen as gone before it returns,
#: or Ray Train restarts the group at the old size and waits for the node to come back.
HEAD_HEALTH_CHECKS = {"RAY_health_check_period_ms": "1000", "RAY_health_check_timeout_ms": "1000",
                      "RAY_health_check_failure_threshold": "3"}
#: Every node's Ray processes: an elastic job looks for more room every 15 s (Ray Train's
#: default, 60 s, would keep a returned node idle for a minute), and a worker group that
#: cannot be placed (Ray Train still counts a lost node for up to 20 s) gives up after 15 s
#: and is planned again (default 60 s).
NODE_ENV = {"GRADWIRE_ELASTIC_RESIZE_INTERVAL_S": "15", "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S": "15"}

QUICK_SCHEDULE = "2000:150,20:120,2000:600"
DEFAULT_SCHEDULE = "2000:400,20:300,2000:1200"
NODE_LOSS_SCHEDULE = "1000:5000"
#: The killed node returns ``restore_after_s`` after the job has shrunk, or this long after
#: the kill if it never does.
RESTORE_ANYWAY_S = 120.0
#: The scenario job's bounds: a quality bound of rank 64 for ACP-SGD, besides fp16 and none.
#: Why: with the MLP at batch 32 on these CPUs, ACP-SGD at rank 4-16 beats fp16 and none even
#: at 2 Gbit/s (its encode+decode costs ~3 ms), so when the link recovers there is nothing
#: faster and less lossy to return to; at rank 64 its encode+decode (~10 ms here) makes fp16
#: the faster choice on a fast link, while on a 20 Mbit/s link it is 2x faster than fp16.
SCENARIO_ALLOWED = ("none", "fp16", "acpsgd")
SCENARIO_RANK = 64


class ClusterError(RuntimeError):
    """The cluster cannot start here, or one of its parts failed."""


# --------------------------------------------------------------------------- availability


def available() -> tuple[bool, str]:
    """Whether a cluster can start on this machine, and if not, why (clear, for the CLI and tests)."""
    ok, why = Testbed.available()
    if not ok:
        return False, why
    if not Path(raylocal._ray_executable()).exists() and shutil.which("ray") is None:
        return False, "the `ray` command is not installed (pip install 'ray[train]')"
    if not Path(PROMETHEUS).exists():
        return False, f"{PROMETHEUS} not found (Debian package 'prometheus')"
    return True, "root, network namespaces, tc, ray and prometheus are available"


# --------------------------------------------------------------------------- the cluster


@dataclass
class Cluster:
    """``nodes`` Ray nodes in namespaces joined by links at ``mbit``, coordinator and Prometheus on node 0.

    Use it as a context manager (tests, the scenario) or through the CLI (``up`` stays in the
    foreground and owns the cluster; ``rate`` and ``down`` find it by its state file)::

        with Cluster(nodes=2, mbit=1000) as cluster:
            client = Client(cluster.url, cluster.token)
            cluster.set_rate(50)            # every link; set_rate(50, node=1): node 1's link
    """

    nodes: int = 2
    mbit: float = 1000.0
    keep_workdir: bool = False
    workdir: Path | None = None
    token: str = field(default_factory=lambda: secrets.token_urlsafe(24))
    _tb: Testbed | None = field(default=None, repr=False)
    _mgmt_prefix: str = ""
    _ray: dict[int, Any] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if not 2 <= int(self.nodes) <= 16:
            raise ValueError(f"nodes: must be between 2 and 16, got {self.nodes}")

    # -- addresses

    @property
    def testbed(self) -> Testbed:
        if self._tb is None:
            raise ClusterError("the cluster is not running")
        return self._tb

    def address(self, node: int) -> str:
        """Node ``node``'s address on the shaped network."""
        return self.testbed.address(node)

    @property
    def mgmt_address(self) -> str:
        """Node 0's address on the management link (reachable from the root namespace)."""
        return f"{self._mgmt_prefix}.2"

    @property
    def url(self) -> str:
        """The coordinator, as this machine's root namespace reaches it."""
        return f"http://{self.mgmt_address}:{COORDINATOR_PORT}"

    @property
    def prometheus_url(self) -> str:
        return f"http://{self.mgmt_address}:{PROMETHEUS_PORT}"

    @property
    def ray_address(self) -> str:
        return f"{self.address(0)}:{RAY_PORT}"

    def namespace(self, node: int) -> str:
        return self.testbed.namespace(node)

    # -- lifecycle

    def __enter__(self) -> "Cluster":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self, *, timeout_s: float = 180.0) -> "Cluster":
        """Namespaces, links, Ray head and workers, coordinator, Prometheus; undone on any failure."""
        ok, why = available()
        if not ok:
            raise ClusterError(f"cannot start the emulated cluster: {why}")
        sweep_stale()
        raylocal.use_token_auth()  # Ray's token mode, the same for every node and the coordinator
        self.workdir = Path(tempfile.mkdtemp(prefix=f"gwc-{os.getpid()}-"))
        self._tb = Testbed(hosts=self.nodes, mbit=self.mbit)
        atexit.register(self.close)
        try:
            self._tb.start()
            cap_gso(self._tb)
            self._add_mgmt_link()
            deadline = time.monotonic() + timeout_s
            for node in range(self.nodes):
                self.start_node(node, deadline=deadline)
            self._start_coordinator(deadline)
            self._start_prometheus(deadline)
            self._write_state()
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        """Stop everything (Ray first, so it stops its own processes), delete the namespaces."""
        tb, self._tb = self._tb, None
        if tb is None:
            return
        try:
            for node in sorted(self._ray, reverse=True):
                proc = self._ray[node]
                if proc.poll() is None:
                    _kill_pids([proc.pid])  # `ray start --block` stops what it started on SIGTERM
        finally:
            tb.close()  # kills whatever is left in the namespaces and deletes them (with the veths)
            _state_path(os.getpid()).unlink(missing_ok=True)
            if self.workdir is not None and not self.keep_workdir:
                shutil.rmtree(self.workdir, ignore_errors=True)

    # -- nodes

    def start_node(self, node: int, *, deadline: float | None = None) -> None:
        """Start node ``node``'s Ray process (the head on node 0), wait until it has joined."""
        assert self.workdir is not None
        deadline = deadline or time.monotonic() + 120
        ray = raylocal._ray_executable()
        common = [f"--node-ip-address={self.address(node)}", "--num-cpus=1", "--block", "--disable-usage-stats",
                  f"--object-store-memory={OBJECT_STORE_BYTES}"]
        extra: dict[str, str] = {}
        if node == 0:
            argv = [ray, "start", "--head", f"--port={RAY_PORT}", "--include-dashboard=false",
                    f"--temp-dir={self.workdir / 'ray'}", *common]
            extra = dict(HEAD_HEALTH_CHECKS)
        else:
            argv = [ray, "start", f"--address={self.ray_address}", *common]
        log_path = self.workdir / f"ray-node{node}.log"
        # RAY_ADDRESS: a Ray process that looks for "the" cluster (address "auto") must find
        # ours, not another Ray cluster running on this machine.
        env = {**worker_env(self.testbed, node), "PYTHONPATH": str(ROOT), "RAY_USAGE_STATS_ENABLED": "0",
               "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.2", "RAY_ADDRESS": self.ray_address, **NODE_ENV, **extra}
        with open(log_path, "w") as log:
            self._ray[node] = self.testbed.run(node, argv, env=env, cwd=str(ROOT), stdout=log,
                                               stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        _wait(lambda: raylocal.READY_LINE in log_path.read_text(errors="replace"), deadline,
              f"Ray on node {node} did not start; see {log_path}", self._ray[node], log_path)

    def kill_node(self, node: int) -> list[int]:
        """Node loss: SIGKILL every process in node ``node``'s namespace (its raylet, Ray workers
        and training worker); the links stay. Returns the pids killed."""
        if node == 0:
            raise ValueError("node: the head node (0) holds the coordinator; kill a worker node (>= 1)")
        pids = _pids_in(self.namespace(node))
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 10
        while any(_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        self._ray.pop(node, None)
        return pids

    def set_rate(self, mbit: float, node: int | None = None) -> None:
        """Every link's rate, or only node ``node``'s link (both directions)."""
        self.testbed.set_rate(mbit, host=node)

    # -- internals

    def _add_mgmt_link(self) -> None:
        """The unshaped veth from the root namespace to node 0, in a /30 of its own."""
        tb = self.testbed
        used = _sh(["ip", "-o", "-4", "addr", "show"], check=False).stdout + _sh(["ip", "-4", "route"], check=False).stdout
        third = tb.subnet.rsplit(".", 1)[1]
        prefix = f"{MGMT_BASE}.{third}"
        while f"{prefix}." in used:
            prefix = f"{MGMT_BASE}.{secrets.randbelow(256)}"
        self._mgmt_prefix = prefix
        root_if = f"gwm{secrets.token_hex(4)}"  # unique in the root namespace, <= 15 characters
        ns = tb.namespace(0)
        _sh(["ip", "link", "add", root_if, "type", "veth", "peer", "name", MGMT_IF, "netns", ns])
        try:
            _sh(["ip", "addr", "add", f"{prefix}.1/30", "dev", root_if])
            _sh(["ip", "link", "set", root_if, "up"])
        except TestbedError:
            _sh(["ip", "link", "del", root_if], check=False)
            raise
        _sh(["ip", "-n", ns, "addr", "add", f"{prefix}.2/30", "dev", MGMT_IF])
        _sh(["ip", "-n", ns, "link", "set", MGMT_IF, "up"])

    def _start_coordinator(self, deadline: float) -> None:
        assert self.workdir is not None
        env = {
            "PYTHONPATH": str(ROOT), "GRADWIRE_HOST": "0.0.0.0", "GRADWIRE_PORT": str(COORDINATOR_PORT),
            "GRADWIRE_TOKEN": self.token, "GRADWIRE_RAY_ADDRESS": self.ray_address,
            "GRADWIRE_PUBLIC_URL": f"http://{self.address(0)}:{COORDINATOR_PORT}",
            "GRADWIRE_DATA_DIR": str(self.workdir / "coordinator"), "GRADWIRE_STORAGE_PATH": str(self.workdir / "runs"),
            "GRADWIRE_HISTORY_INTERVAL_S": "0.5", "GRADWIRE_HISTORY_MAX_ROWS": "20000",
            "GRADWIRE_METRICS_GRACE_S": "3600", "OMP_NUM_THREADS": "1",
        }
        log_path = self.workdir / "coordinator.log"
        with open(log_path, "w") as log:
            proc = self.testbed.run(0, [sys.executable, "-m", "coordinator.cli", "serve"], env=env, cwd=str(ROOT),
                                    stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        client = Client(self.url, self.token, timeout=2.0)

        def ready() -> bool:
            try:
                return client.health()["ray"] == "connected"
            except Exception:  # noqa: BLE001 - not up yet
                return False

        try:
            _wait(ready, deadline, f"the coordinator did not come up; see {log_path}", proc, log_path)
        finally:
            client.close()

    def _start_prometheus(self, deadline: float) -> None:
        assert self.workdir is not None
        directory = self.workdir / "prometheus"
        directory.mkdir()
        config = directory / "prometheus.yml"
        # honor_labels keeps gradwire's `job` label (the job id) instead of the scrape job's name.
        config.write_text("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n"
                          "  - job_name: gradwire\n    honor_labels: true\n    static_configs:\n"
                          f"      - targets: ['127.0.0.1:{COORDINATOR_PORT}']\n")
        log_path = directory / "prometheus.log"
        with open(log_path, "w") as log:
            proc = self.testbed.run(0, [PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={directory / 'data'}",
                                        f"--web.listen-address=0.0.0.0:{PROMETHEUS_PORT}", "--log.level=warn"],
                                    stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        import httpx

        def ready() -> bool:
            try:
                return httpx.get(f"{self.prometheus_url}/-/ready", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        _wait(ready, deadline, f"Prometheus did not come up; see {log_path}", proc, log_path)

    def _write_state(self) -> None:
        """What ``rate`` and ``down`` in another shell need: our pid, the link ends, the URLs."""
        tb = self.testbed
        state = {"pid": os.getpid(), "nodes": self.nodes, "url": self.url, "token": self.token,
                 "prometheus_url": self.prometheus_url, "ray_address": self.ray_address,
                 "workdir": str(self.workdir),
                 "links": {str(node): tb.link_ends(node) for node in range(self.nodes)},
                 "namespaces": [tb.namespace(node) for node in range(self.nodes)]}
        STATE_DIR.mkdir(parents=True, exist_ok=True)
        _state_path(os.getpid()).write_text(json.dumps(state, indent=2))


def _wait(ready: Any, deadline: float, message: str, proc: subprocess.Popen, log_path: Path) -> None:
    while not ready():
        if proc.poll() is not None:
            raise ClusterError(f"{message} (exited with {proc.returncode}):\n{_tail(log_path)}")
        if time.monotonic() > deadline:
            raise ClusterError(f"{message} (timed out):\n{_tail(log_path)}")
        time.sleep(0.2)


def _tail(path: Path, chars: int = 2000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return ""


# --------------------------------------------------------------------------- state files (CLI)


def _state_path(pid: int) -> Path:
    return STATE_DIR / f"{pid}.json"


def live_states() -> list[dict[str, Any]]:
    """State of every cluster whose owning process is alive (stale files are removed)."""
    out = []
    for path in sorted(STATE_DIR.glob("*.json")) if STATE_DIR.exists() else []:
        try:
            state = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if _alive(int(state["pid"])):
            out.append(state)
        else:
            path.unlink(missing_ok=True)
    return out


def sweep_stale() -> list[str]:
    """Remove what killed clusters (and testbeds) left: namespaces, their processes and veths
    (by creating pid, never another live one), and their state files and work directories."""
    removed = cleanup_stale()
    for path in sorted(STATE_DIR.glob("*.json")) if STATE_DIR.exists() else []:
        try:
            state = json.loads(path.read_text())
        except (OSError, ValueError):
            path.unlink(missing_ok=True)
            continue
        if not _alive(int(state["pid"])):
            shutil.rmtree(state.get("workdir", ""), ignore_errors=True)
            path.unlink(missing_ok=True)
    for directory in Path(tempfile.gettempdir()).glob("gwc-*-*"):
        pid = directory.name.split("-")[1]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(directory, ignore_errors=True)
    return removed


def _one_state(pid: int | None) -> dict[str, Any]:
    states = [s for s in live_states() if pid is None or s["pid"] == pid]
    if not states:
        raise ClusterError("no emulated cluster is running (start one with `python -m benchmarks.cluster up`)")
    if len(states) > 1:
        raise ClusterError(f"several clusters run ({', '.join(str(s['pid']) for s in states)}); name one with --pid")
    return states[0]


# --------------------------------------------------------------------------- the scenario


@dataclass
class ScenarioOptions:
    """The job and schedule of one scenario run (see ``scenario --help`` for each field)."""

    schedule: list[Phase]
    model: str = "mlp"
    batch_size: int = 32
    start: str = "none"
    allowed: list[str] | None = field(default_factory=lambda: list(SCENARIO_ALLOWED))
    min_rank: int = SCENARIO_RANK
    max_rank: int = SCENARIO_RANK
    gain_threshold: float = 0.10
    min_dwell_s: float = 5.0
    probe_interval_s: float = 3.0
    probe_budget: float = 0.05
    report_interval_s: float = 0.5
    checkpoint_every: int = 0
    kill_node_at: int | None = None
    restore_after_s: float = 10.0
    timeout_s: float = 900.0
    seed: int = 0

    @property
    def steps(self) -> int:
        return sum(p.steps for p in self.schedule)

    def spec(self) -> dict[str, Any]:
        """The JobSpec submitted over REST."""
        compression: dict[str, Any] = {"mode": "adaptive", "compressor": self.start, "min_rank": self.min_rank,
                                       "max_rank": self.max_rank, "gain_threshold": self.gain_threshold,
                                       "min_dwell_s": self.min_dwell_s}
        if self.allowed:
            compression["allowed"] = list(self.allowed)
        elastic = self.kill_node_at is not None
        return {
            "name": "cluster-scenario" + ("-node-loss" if elastic else ""), "model": self.model,
            "dataset": "synthetic", "batch_size": self.batch_size, "steps": self.steps, "lr": 0.02,
            "workers": "1..2" if elastic else 2, "compression": compression, "seed": self.seed,
            "report_interval_s": self.report_interval_s, "probe_interval_s": self.probe_interval_s,
            "probe_budget": self.probe_budget, "checkpoint_every": self.checkpoint_every,
            "max_failures": 10 if elastic else 0,  # a group that cannot be placed counts too
        }


def label_of(compressor: str, params: dict[str, Any] | None) -> str:
    """A compressor and its parameters as the rest of gradwire writes them (``acpsgd-r4``)."""
    from planning.spec import make_spec

    return make_spec(compressor, **(params or {})).label


def run_scenario(cluster: Cluster, opts: ScenarioOptions, *, log: Any = print,
                 on_submitted: Any = None) -> dict[str, Any]:
    """Submit the job, walk the schedule by step (and the node loss), and collect the record.
    ``on_submitted(job_id)`` is called once the coordinator has accepted the job."""
    client = Client(cluster.url, cluster.token, timeout=10.0)
    ends = boundaries(opts.schedule)
    cluster.set_rate(opts.schedule[0].mbit)
    started = time.time()
    job = client.submit(opts.spec())
    job_id = job["id"]
    if on_submitted is not None:
        on_submitted(job_id)
    log(f"[cluster] job {job_id} submitted; live page {cluster.url}/?job={job_id}#token={cluster.token}")
    rate_changes: list[dict[str, Any]] = [{"step": 0, "mbit": opts.schedule[0].mbit, "at": round(started, 3)}]
    world_sizes: list[dict[str, Any]] = []
    node_events: list[dict[str, Any]] = []
    killed_at: float | None = None
    restoring: threading.Thread | None = None
    shrunk_at: float | None = None
    phase = 0
    deadline = time.monotonic() + opts.timeout_s
    while True:
        try:
            job = client.job(job_id)
        except Exception as exc:  # noqa: BLE001 - a slow answer under load: try again
            log(f"[cluster] poll failed: {exc}")
            time.sleep(0.5)
            continue
        step = int(job["step"])
        if job.get("world_size") and (not world_sizes or world_sizes[-1]["world_size"] != job["world_size"]):
            world_sizes.append({"step": step, "world_size": int(job["world_size"]), "at": round(time.time(), 3)})
            log(f"[cluster] step {step}: world size {job['world_size']}")
        while phase + 1 < len(opts.schedule) and step >= ends[phase]:
            phase += 1
            cluster.set_rate(opts.schedule[phase].mbit)
            rate_changes.append({"step": step, "mbit": opts.schedule[phase].mbit, "at": round(time.time(), 3)})
            log(f"[cluster] step {step}: link -> {opts.schedule[phase].mbit:g} Mbit/s")
        if opts.kill_node_at is not None and killed_at is None and step >= opts.kill_node_at:
            pids = cluster.kill_node(1)
            killed_at = time.monotonic()
            node_events.append({"step": step, "event": "killed", "node": 1, "pids": len(pids), "at": round(time.time(), 3)})
            log(f"[cluster] step {step}: killed node 1 ({len(pids)} processes)")
        if killed_at is not None and shrunk_at is None and world_sizes and world_sizes[-1]["world_size"] < 2:
            shrunk_at = time.monotonic()
        since = shrunk_at if shrunk_at is not None else killed_at
        if killed_at is not None and restoring is None and since is not None and \
                time.monotonic() - since >= (opts.restore_after_s if shrunk_at is not None else RESTORE_ANYWAY_S):
            # in a thread: the job is followed (rates, world sizes) while Ray starts on the node
            restoring = threading.Thread(target=_restore, args=(cluster, 1, node_events, step, log),
                                         name="gw-restore-node", daemon=True)
            restoring.start()
        if job["state"] in TERMINAL:
            break
        if time.monotonic() > deadline:
            client.cancel(job_id)
            raise ClusterError(f"the job did not finish within {opts.timeout_s:.0f} s (step {step})")
        time.sleep(0.1)
    if restoring is not None:
        restoring.join()
    history = client.history(job_id)
    client.close()
    doc = {
        "state": job["state"], "reason": job["reason"], "job_id": job_id,
        "schedule": [{"mbit": p.mbit, "steps": p.steps} for p in opts.schedule],
        "rate_changes": rate_changes,
        "switches": switches_of(history, job.get("summary") or {}),
        "world_sizes": world_sizes, "node_events": node_events,
        "job": opts.spec(), "wall_s": round(time.time() - started, 1),
    }
    doc["phases"] = phase_report(history["telemetry"], opts.schedule, doc["switches"])
    doc["restarts"] = restarts(history["telemetry"], opts.checkpoint_every)
    return doc


def restarts(telemetry: list[dict[str, Any]], every: int) -> list[dict[str, Any]]:
    """Where the reported step went back (a worker group restarted from a checkpoint).

    ``last_step`` is the last step reported before, ``first_step`` the first after;
    ``resumed_from`` the checkpoint the group restarted from (the multiple of ``every`` at
    or below ``first_step``: reports come every fraction of a second, fewer steps than
    ``every``), and ``steps_lost`` = ``last_step`` - ``resumed_from`` (a lower bound by
    under one report interval: steps done after the last report are not seen).
    """
    out = []
    for before, after in zip(telemetry, telemetry[1:]):
        if after["step"] < before["step"]:
            resumed = after["step"] // every * every if every else 0
            out.append({"last_step": before["step"], "first_step": after["step"], "resumed_from": resumed,
                        "steps_lost": before["step"] - resumed, "at": after["at"]})
    return out


def _restore(cluster: Cluster, node: int, events: list[dict[str, Any]], step: int, log: Any) -> None:
    events.append({"step": step, "event": "restarting", "node": node, "at": round(time.time(), 3)})
    cluster.start_node(node)
    events.append({"event": "restored", "node": node, "at": round(time.time(), 3)})
    log(f"[cluster] node {node} is back")


def switches_of(history: dict[str, Any], summary: dict[str, Any]) -> list[dict[str, Any]]:
    """Every decision after the first, with the step at which the ranks applied it (the
    workers' summary names the decision version it applied) and the label before and after."""
    applied = {int(s["version"]): int(s["step"]) for s in summary.get("switches", []) if "version" in s}
    decisions = sorted(history["decisions"], key=lambda d: d["version"])
    out = []
    for before, after in zip(decisions, decisions[1:]):
        out.append({"step": applied.get(after["version"]), "version": after["version"],
                    "from": label_of(before["compressor"], before["params"]),
                    "to": label_of(after["compressor"], after["params"]),
                    "source": after["source"], "reason": after["reason"],
                    "predicted_gain": after.get("predicted_gain"), "at": after["at"],
                    "decided_at_step": _step_at(history["telemetry"], after["at"])})
    return out


def _step_at(telemetry: list[dict[str, Any]], at: float) -> int | None:
    """The last reported step at wall time ``at``."""
    steps = [t["step"] for t in telemetry if t["at"] <= at]
    return max(steps) if steps else None


def phase_report(telemetry: list[dict[str, Any]], schedule: Sequence[Phase], switches: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per schedule phase: wall seconds, the median over reports of each per-step phase time,
    the bandwidth the workers measured (median over the phase's second half), the compressor(s)."""
    out = []
    start = 0
    for phase, end in zip(schedule, boundaries(schedule)):
        points = [t for t in telemetry if start < t["step"] <= end]
        seconds = (points[-1]["at"] - points[0]["at"]) if len(points) > 1 else None
        steps = (points[-1]["step"] - points[0]["step"]) if len(points) > 1 else 0
        phases: dict[str, float] = {}
        for name in sorted({k for t in points for k in t.get("phase_seconds", {})}):
            values = sorted(t["phase_seconds"][name] for t in points if name in t.get("phase_seconds", {}))
            phases[name] = round(values[len(values) // 2] * 1e3, 3)  # median: step 1's one-off costs aside
        bandwidth = sorted(t["bandwidth_bytes_per_second"] * 8e-6 for t in points[len(points) // 2:]
                           if t.get("bandwidth_bytes_per_second"))
        out.append({
            "mbit": phase.mbit, "steps": phase.steps,
            "seconds": None if seconds is None else round(seconds, 2),
            "ms_per_step": None if not steps or seconds is None else round(seconds / steps * 1e3, 2),
            "phase_ms": phases,
            "bandwidth_mbit_seen": round(bandwidth[len(bandwidth) // 2], 1) if bandwidth else None,
            "compressors": sorted({_telemetry_label(t) for t in points if t.get("compressor")}),
        })
        start = end
    return out


def _telemetry_label(t: dict[str, Any]) -> str:
    params = {k: t[field] for k, field in (("rank", "compressor_rank"), ("ratio", "ratio")) if t.get(field)}
    try:
        return label_of(t["compressor"], params)
    except ValueError:
        return str(t["compressor"])


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
    with foreign_load(load):
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
    from benchmarks.adaptive import parse_label

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


# --------------------------------------------------------------------------- CLI


def markdown(doc: dict[str, Any]) -> str:
    """The run for the README: switches, then one row per phase of the schedule."""
    lines = [f"job `{doc['job_id']}`: {doc['state']}, {doc['wall_s']:.0f} s from submission to the end; "
             f"machine's foreign load {doc['foreign_cores']} cores of {doc['cluster']['machine_cores']}", "",
             "| switch at step | decided at step | from | to | source | reason |", "|---:|---:|---|---|---|---|"]
    for s in doc["switches"]:
        lines.append(f"| {s['step'] if s['step'] is not None else '-'} | {s['decided_at_step']} | {s['from']} | "
                     f"{s['to']} | {s['source']} | {s['reason']} |")
    lines += ["", "| link set | steps | rate changed at step | bandwidth measured | compressor(s) | s | ms/step | "
              "data | forward | backward | exposed comm | optimizer | compress | communicate | decompress |",
              "|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for phase, change in zip(doc["phases"], doc["rate_changes"]):
        ms = phase["phase_ms"]
        cells = " | ".join(f"{ms.get(k, 0):.1f}" for k in ("data", "forward", "backward", "exposed_comm", "optimizer",
                                                          "compress", "communicate", "decompress"))
        lines.append(f"| {phase['mbit']:g} Mbit/s | {phase['steps']} | {change['step']} | "
                     f"{phase['bandwidth_mbit_seen']} Mbit/s | {', '.join(phase['compressors'])} | {phase['seconds']} | "
                     f"{phase['ms_per_step']} | {cells} |")
    if doc.get("world_sizes"):
        lines += ["", "world size: " + ", ".join(f"{w['world_size']} from step {w['step']}" for w in doc["world_sizes"])]
    if doc.get("restarts"):
        lines += ["restarts: " + ", ".join(f"last step {r['last_step']} -> resumed from {r['resumed_from']} "
                                          f"({r['steps_lost']} steps lost)" for r in doc["restarts"])]
    prom = doc["prometheus"]
    lines += [f"Prometheus: compressors {', '.join(prom['compressors_seen'])}; {prom['phase_series']} phase series "
              f"({', '.join(prom['phases_seen'])}); ranks switched at the same steps: {doc['ranks_switch_at_the_same_step']}",
              "", "verdict: " + json.dumps(doc["verdict"])]
    return "\n".join(lines) + "\n"


def _refuse() -> int | None:
    ok, why = available()
    if not ok:
        print(f"benchmarks.cluster: cannot start the emulated cluster: {why}", file=sys.stderr)
        return 2
    return None


def _up(args: argparse.Namespace) -> int:
    if (code := _refuse()) is not None:
        return code
    with Cluster(nodes=args.nodes, mbit=args.mbit) as cluster:
        print(f"cluster up: {cluster.nodes} nodes at {cluster.mbit:g} Mbit/s, Ray head {cluster.ray_address}")
        print(f"coordinator: {cluster.url}  (GRADWIRE_URL={cluster.url} GRADWIRE_TOKEN={cluster.token})")
        print(f"live page:   {cluster.url}/#token={cluster.token}")
        print(f"prometheus:  {cluster.prometheus_url}")
        print("change a rate: python -m benchmarks.cluster rate MBIT [--node N]; stop: Ctrl-C or "
              "python -m benchmarks.cluster down", flush=True)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            while True:
                time.sleep(1)
        except KeyboardInterrupt:
            print("stopping the cluster")
    return 0


def _rate(args: argparse.Namespace) -> int:
    state = _one_state(args.pid)
    nodes = range(state["nodes"]) if args.node is None else [args.node]
    for node in nodes:
        if str(node) not in state["links"]:
            raise ClusterError(f"node: {node} is not a node of the cluster (0..{state['nodes'] - 1})")
        for ns, dev in state["links"][str(node)]:
            set_link_rate(ns, dev, args.mbit)
    where = "every link" if args.node is None else f"node {args.node}'s link"
    print(f"{where}: {args.mbit:g} Mbit/s")
    return 0


def _down(args: argparse.Namespace) -> int:
    states = live_states() if args.pid is None else [_one_state(args.pid)]
    for state in states:
        os.kill(int(state["pid"]), signal.SIGTERM)
        deadline = time.monotonic() + 60
        while _alive(int(state["pid"])) and time.monotonic() < deadline:
            time.sleep(0.2)
        print(f"stopped the cluster of process {state['pid']}")
    removed = sweep_stale()
    if removed:
        print(f"removed stale namespaces: {', '.join(removed)}")
    if not states and not removed:
        print("no emulated cluster was running")
    return 0


def _scenario(args: argparse.Namespace) -> int:
    if (code := _refuse()) is not None:
        return code
    default = NODE_LOSS_SCHEDULE if args.kill_node_at is not None else QUICK_SCHEDULE if args.quick else DEFAULT_SCHEDULE
    schedule = parse_schedule(args.schedule or default)
    opts = ScenarioOptions(
        schedule=schedule, model=args.model, batch_size=args.batch_size, start=args.start, allowed=args.allowed,
        min_rank=args.min_rank, max_rank=args.max_rank, gain_threshold=args.gain_threshold,
        min_dwell_s=args.min_dwell_s, probe_interval_s=args.probe_interval_s, probe_budget=args.probe_budget,
        report_interval_s=args.report_interval_s,
        checkpoint_every=args.checkpoint_every if args.kill_node_at is None else (args.checkpoint_every or 50),
        kill_node_at=args.kill_node_at, restore_after_s=args.restore_after_s, timeout_s=args.timeout_s,
    )
    print(f"[cluster] waiting for {LOCK_PATH} (other benchmarks measuring) and a quiet machine", flush=True)
    with bench_lock():
        wait_for_quiet(args.max_wait_quiet_s)
        started = time.monotonic()
        with Cluster(nodes=2, mbit=schedule[0].mbit, keep_workdir=args.keep) as cluster:
            print(f"[cluster] up in {time.monotonic() - started:.0f} s (workdir {cluster.workdir})", flush=True)
            doc = scenario(cluster, opts, log=lambda m: print(m, flush=True))
    doc["total_wall_s"] = round(time.monotonic() - started, 1)
    doc["date"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    print(json.dumps({k: doc[k] for k in ("state", "switches", "world_sizes", "phases", "verdict")}, indent=1))
    if args.json_out:
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(json.dumps(doc, indent=1) + "\n")
        args.json_out.with_suffix(".md").write_text(markdown(doc))
        plot(doc, args.plot or args.json_out.with_suffix(".png"))
    print(f"[cluster] done in {doc['total_wall_s']:.0f} s")
    return 0 if doc["state"] == "succeeded" else 1


def _demo(args: argparse.Namespace) -> int:
    """``gradwire demo --network``: the scenario with a live view, for a newcomer.

    The live progress (``coordinator.console.watch``) follows the job while a thread walks
    the rate schedule; the end shows the coordinator's summary and, per phase of the
    schedule, the bandwidth the workers measured, the compressor and the time per phase.
    """
    import threading

    from rich.console import Console
    from rich.table import Table

    from coordinator.console import summary_table, watch

    console = Console()
    ok, why = available()
    if not ok:
        console.print(f"[red]the network demo needs root and network namespaces:[/] {why}\n"
                      "run `gradwire demo` (loopback, no adaptation) or, as root, `gradwire demo --network`")
        return 2
    opts = ScenarioOptions(schedule=parse_schedule(args.schedule))
    submitted = threading.Event()
    holder: dict[str, Any] = {}

    def on_submitted(job_id: str) -> None:
        holder["job_id"] = job_id
        submitted.set()

    def drive(cluster: Cluster) -> None:
        try:
            holder["doc"] = run_scenario(cluster, opts, log=lambda m: console.print(f"[dim]{m}[/]"),
                                         on_submitted=on_submitted)
        except BaseException as exc:  # noqa: BLE001 - shown by the main thread
            holder["error"] = exc
            submitted.set()

    with console.status("starting a 2-node Ray cluster in network namespaces (coordinator, Prometheus)…"):
        cluster = Cluster(nodes=2, mbit=opts.schedule[0].mbit).start()
    try:
        console.print(f"cluster: Ray head {cluster.ray_address}, worker node {cluster.address(1)}, one CPU each, "
                      f"links shaped with tc; schedule {args.schedule} (Mbit/s:steps)")
        thread = threading.Thread(target=drive, args=(cluster,), name="gw-demo-schedule", daemon=True)
        thread.start()
        submitted.wait()
        if "error" in holder:
            raise holder["error"]
        job_id = holder["job_id"]
        console.print(f"live page:  [link]{cluster.url}/?job={job_id}#token={cluster.token}[/link]")
        console.print(f"metrics:    [link]{cluster.url}/metrics[/link]   Prometheus: [link]{cluster.prometheus_url}[/link]")
        client = Client(cluster.url, cluster.token)
        watch(client, job_id, console)
        thread.join()
        if "error" in holder:
            raise holder["error"]
        console.print(summary_table(client.history(job_id)))
        table = Table(title="per phase of the schedule (medians over telemetry reports)")
        for column in ("link set", "measured", "steps", "ms/step", "compressor", "data", "forward", "backward",
                       "exposed comm", "optimizer"):
            table.add_column(column, justify="right")
        for phase in holder["doc"]["phases"]:
            ms = phase["phase_ms"]
            table.add_row(f"{phase['mbit']:g} Mbit/s", f"{phase['bandwidth_mbit_seen'] or 0:g} Mbit/s", str(phase["steps"]),
                          f"{phase['ms_per_step'] or 0:.1f}", ", ".join(phase["compressors"]),
                          *(f"{ms.get(k, 0):.1f}" for k in ("data", "forward", "backward", "exposed_comm", "optimizer")))
        console.print(table)
        client.close()
        if args.keep:
            console.print(f"[bold]--keep[/]: the cluster stays up ({cluster.url}/#token={cluster.token}); Ctrl-C stops it")
            signal.signal(signal.SIGINT, signal.default_int_handler)
            try:
                while True:
                    time.sleep(1)
            except KeyboardInterrupt:
                pass
        return 0 if holder["doc"]["state"] == "succeeded" else 1
    finally:
        with console.status("stopping the cluster…"):
            cluster.close()


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.cluster", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="start a cluster and keep it until Ctrl-C or `down`")
    up.add_argument("--nodes", type=int, default=2)
    up.add_argument("--mbit", type=float, default=1000.0)
    rate = sub.add_parser("rate", help="change the link rate of a running cluster")
    rate.add_argument("mbit", type=float)
    rate.add_argument("--node", type=int, default=None, help="only this node's link (default: every link)")
    rate.add_argument("--pid", type=int, default=None, help="the cluster of this `up` process")
    down = sub.add_parser("down", help="stop running clusters and remove what killed ones left")
    down.add_argument("--pid", type=int, default=None)
    sc = sub.add_parser("scenario", help="the whole loop: REST job, rate schedule, coordinator switches, Prometheus")
    sc.add_argument("--quick", action="store_true", help=f"schedule {QUICK_SCHEDULE} (within 10 minutes)")
    sc.add_argument("--schedule", default=None,
                    help=f"MBIT:STEPS,... (default {DEFAULT_SCHEDULE}; with --kill-node-at {NODE_LOSS_SCHEDULE})")
    sc.add_argument("--model", default="mlp")
    sc.add_argument("--batch-size", type=int, default=32)
    sc.add_argument("--start", default="none", help="the job's first compressor")
    sc.add_argument("--allowed", nargs="+", default=list(SCENARIO_ALLOWED),
                    help="compressors the policy may choose (see SCENARIO_ALLOWED)")
    sc.add_argument("--min-rank", type=int, default=SCENARIO_RANK)
    sc.add_argument("--max-rank", type=int, default=SCENARIO_RANK)
    sc.add_argument("--gain-threshold", type=float, default=0.10)
    sc.add_argument("--min-dwell-s", type=float, default=5.0,
                    help="the policy's dwell, scaled to phases of tens of seconds (job default 30 s)")
    sc.add_argument("--probe-interval-s", type=float, default=3.0)
    sc.add_argument("--probe-budget", type=float, default=0.05,
                    help="probe share of run time, scaled up with the short phases (job default 0.02)")
    sc.add_argument("--report-interval-s", type=float, default=0.5)
    sc.add_argument("--checkpoint-every", type=int, default=0, help="(node loss: default 50)")
    sc.add_argument("--kill-node-at", type=int, default=None,
                    help="kill node 1's Ray processes at this step (workers 1..2), bring it back later")
    sc.add_argument("--restore-after-s", type=float, default=10.0,
                    help="the killed node returns this long after the job has shrunk to the other node")
    sc.add_argument("--timeout-s", type=float, default=900.0)
    sc.add_argument("--max-wait-quiet-s", type=float, default=20.0,
                    help="before the run, wait up to this long for other work to leave the CPUs")
    sc.add_argument("--json-out", type=Path, default=None)
    sc.add_argument("--plot", type=Path, default=None, help="PNG (default: beside --json-out)")
    sc.add_argument("--keep", action="store_true", help="keep the work directory (logs, checkpoints)")
    demo = sub.add_parser("demo", help="the scenario with a live view (what `gradwire demo --network` runs)")
    demo.add_argument("--schedule", default=QUICK_SCHEDULE, help=f"MBIT:STEPS,... (default {QUICK_SCHEDULE})")
    demo.add_argument("--keep", action="store_true", help="keep the cluster up after the job, until Ctrl-C")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        return {"up": _up, "rate": _rate, "down": _down, "scenario": _scenario, "demo": _demo}[args.cmd](args)
    except (ClusterError, TestbedError, ApiError, ValueError) as exc:
        print(f"benchmarks.cluster: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
