"""The cluster: one Ray node per testbed namespace, node 0 with the Ray head, the coordinator and
Prometheus behind a management link; nodes killed and restarted, links shaped live.
"""

from __future__ import annotations

import atexit
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.adaptive import cap_gso
from benchmarks.cluster.errors import ClusterError
from benchmarks.cluster.state import STATE_DIR, state_path, sweep_stale
from benchmarks.repo import REPO_ROOT
from benchmarks.testbed import Testbed, TestbedError, alive, kill_pids, pids_in, sh, worker_env
from coordinator import raylocal
from coordinator.client import Client

#: Inside node 0's namespace ports are our own: fixed numbers cannot clash with anything.
RAY_PORT = 6379
COORDINATOR_PORT = 8321
PROMETHEUS_PORT = 9090
MGMT_IF = "gwmgmt"  # node 0's end of the management link
MGMT_BASE = "10.214"
PROMETHEUS = "/usr/bin/prometheus"
#: Ray's object store per node: small, the jobs here pass no large objects.
OBJECT_STORE_BYTES = 100 * 1024 * 1024
TERMINAL = ("succeeded", "failed", "cancelled")
#: The head declares a node dead after 3 missed health checks 1 s apart (Ray's default: 5
#: checks 3 s apart, ~15-30 s). Why: a killed node must be seen as gone before it returns,
#: or Ray Train restarts the group at the old size and waits for the node to come back.
HEAD_HEALTH_CHECKS = {"RAY_health_check_period_ms": "1000", "RAY_health_check_timeout_ms": "1000",
                      "RAY_health_check_failure_threshold": "3"}
#: Every node's Ray processes: an elastic job looks for more room every 5 s (Ray Train's
#: default, 60 s, would keep a returned node idle for a minute; at 15 s a CI run on an idle
#: machine ended the node-loss job at one worker, the returned node never used: the 4700
#: steps left at one worker took about as long as the node's return plus two looks), and a worker group that
#: cannot be placed (Ray Train still counts a lost node for up to 20 s) gives up after 15 s
#: and is planned again (default 60 s).
NODE_ENV = {"GRADWIRE_ELASTIC_RESIZE_INTERVAL_S": "5", "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S": "15"}


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
    #: The coordinator keeps a job's report in its history at most this often (seconds).
    history_interval_s: float = 0.5
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
                    kill_pids([proc.pid])  # `ray start --block` stops what it started on SIGTERM
        finally:
            tb.close()  # kills whatever is left in the namespaces and deletes them (with the veths)
            state_path(os.getpid()).unlink(missing_ok=True)
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
        env = {**worker_env(self.testbed, node), "PYTHONPATH": str(REPO_ROOT), "RAY_USAGE_STATS_ENABLED": "0",
               "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.2", "RAY_ADDRESS": self.ray_address, **NODE_ENV, **extra}
        with open(log_path, "w") as log:
            self._ray[node] = self.testbed.run(node, argv, env=env, cwd=str(REPO_ROOT), stdout=log,
                                               stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        wait_until(lambda: raylocal.READY_LINE in log_path.read_text(errors="replace"), deadline,
              f"Ray on node {node} did not start; see {log_path}", self._ray[node], log_path)

    def kill_node(self, node: int) -> list[int]:
        """Node loss: SIGKILL every process in node ``node``'s namespace (its raylet, Ray workers
        and training worker); the links stay. Returns the pids killed."""
        if node == 0:
            raise ValueError("node: the head node (0) holds the coordinator; kill a worker node (>= 1)")
        pids = pids_in(self.namespace(node))
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 10
        while any(alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        self._ray.pop(node, None)
        return pids

    def own_pids(self) -> list[int]:
        """Every process running in the cluster's namespaces (Ray nodes and workers, the
        coordinator, Prometheus): a measurement's own load, not foreign
        (``benchmarks.machine.foreign_load(..., own_pids=cluster.own_pids)``)."""
        tb = self._tb
        return [] if tb is None else [pid for node in range(self.nodes) for pid in pids_in(tb.namespace(node))]

    def set_rate(self, mbit: float, node: int | None = None) -> None:
        """Every link's rate, or only node ``node``'s link (both directions)."""
        self.testbed.set_rate(mbit, host=node)

    # -- internals

    def _add_mgmt_link(self) -> None:
        """The unshaped veth from the root namespace to node 0, in a /30 of its own."""
        tb = self.testbed
        used = sh(["ip", "-o", "-4", "addr", "show"], check=False).stdout + sh(["ip", "-4", "route"], check=False).stdout
        third = tb.subnet.rsplit(".", 1)[1]
        prefix = f"{MGMT_BASE}.{third}"
        while f"{prefix}." in used:
            prefix = f"{MGMT_BASE}.{secrets.randbelow(256)}"
        self._mgmt_prefix = prefix
        root_if = f"gwm{secrets.token_hex(4)}"  # unique in the root namespace, <= 15 characters
        ns = tb.namespace(0)
        sh(["ip", "link", "add", root_if, "type", "veth", "peer", "name", MGMT_IF, "netns", ns])
        try:
            sh(["ip", "addr", "add", f"{prefix}.1/30", "dev", root_if])
            sh(["ip", "link", "set", root_if, "up"])
        except TestbedError:
            sh(["ip", "link", "del", root_if], check=False)
            raise
        sh(["ip", "-n", ns, "addr", "add", f"{prefix}.2/30", "dev", MGMT_IF])
        sh(["ip", "-n", ns, "link", "set", MGMT_IF, "up"])

    def _start_coordinator(self, deadline: float) -> None:
        assert self.workdir is not None
        env = {
            "PYTHONPATH": str(REPO_ROOT), "GRADWIRE_HOST": "0.0.0.0", "GRADWIRE_PORT": str(COORDINATOR_PORT),
            "GRADWIRE_TOKEN": self.token, "GRADWIRE_RAY_ADDRESS": self.ray_address,
            "GRADWIRE_PUBLIC_URL": f"http://{self.address(0)}:{COORDINATOR_PORT}",
            "GRADWIRE_DATA_DIR": str(self.workdir / "coordinator"), "GRADWIRE_STORAGE_PATH": str(self.workdir / "runs"),
            "GRADWIRE_HISTORY_INTERVAL_S": str(self.history_interval_s), "GRADWIRE_HISTORY_MAX_ROWS": "20000",
            "GRADWIRE_METRICS_GRACE_S": "3600", "OMP_NUM_THREADS": "1",
        }
        log_path = self.workdir / "coordinator.log"
        with open(log_path, "w") as log:
            proc = self.testbed.run(0, [sys.executable, "-m", "coordinator.cli", "serve"], env=env, cwd=str(REPO_ROOT),
                                    stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        client = Client(self.url, self.token, timeout=2.0)

        def ready() -> bool:
            try:
                return client.health()["ray"] == "connected"
            except Exception:  # noqa: BLE001 - not up yet
                return False

        try:
            wait_until(ready, deadline, f"the coordinator did not come up; see {log_path}", proc, log_path)
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

        wait_until(ready, deadline, f"Prometheus did not come up; see {log_path}", proc, log_path)

    def _write_state(self) -> None:
        """What ``rate`` and ``down`` in another shell need: our pid, the link ends, the URLs."""
        tb = self.testbed
        state = {"pid": os.getpid(), "nodes": self.nodes, "url": self.url, "token": self.token,
                 "prometheus_url": self.prometheus_url, "ray_address": self.ray_address,
                 "workdir": str(self.workdir),
                 "links": {str(node): tb.link_ends(node) for node in range(self.nodes)},
                 "namespaces": [tb.namespace(node) for node in range(self.nodes)]}
        STATE_DIR.mkdir(parents=True, exist_ok=True)
        state_path(os.getpid()).write_text(json.dumps(state, indent=2))


def wait_until(ready: Any, deadline: float, message: str, proc: subprocess.Popen, log_path: Path) -> None:
    while not ready():
        if proc.poll() is not None:
            raise ClusterError(f"{message} (exited with {proc.returncode}):\n{log_tail(log_path)}")
        if time.monotonic() > deadline:
            raise ClusterError(f"{message} (timed out):\n{log_tail(log_path)}")
        time.sleep(0.2)


def log_tail(path: Path, chars: int = 2000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return ""

