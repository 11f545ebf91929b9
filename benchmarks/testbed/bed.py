"""The testbed: ``hosts`` namespaces joined by rate-limited veth links (directly, or through a bridge).
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import threading
from pathlib import Path
from typing import Mapping, Sequence

from benchmarks.testbed.lifetime import register, unregister
from benchmarks.testbed.netns import (
    PREFIX,
    TestbedError,
    check_available,
    delete_namespace,
    in_ns,
    kill_pids,
    set_link_rate,
    sh,
    validate_mbit,
)

_SUBNET_BASE = "10.213"  # private; a random third octet makes the /24 of one testbed
HOST_IF = "gweth{}"  # host i's interface, inside host i's namespace
PORT_IF = "gwport{}"  # the switch's end of host i's link (bridge topology only)
BRIDGE_IF = "gwbr"
MAX_HOSTS = 64

# --------------------------------------------------------------------------- the testbed


class Testbed:
    """``hosts`` emulated machines, each link limited to ``mbit`` Mbit/s both ways.

    Use it as a context manager::

        with Testbed(hosts=2, mbit=100) as tb:
            p0 = tb.run(0, [sys.executable, "worker.py"], env={"GLOO_SOCKET_IFNAME": tb.interface(0)})
            tb.set_rate(20)   # live; running transfers slow down at once

    Topology: 2 hosts are joined by one veth pair (``gweth0`` <-> ``gweth1``); more hosts
    each get a veth to a bridge in a switch namespace, so host-to-host traffic crosses two
    shapers of the same rate (one per host link), as on a switched network.
    """

    __test__ = False  # not a pytest test class, despite the name

    def __init__(self, hosts: int = 2, mbit: float = 100.0) -> None:
        if not 2 <= int(hosts) <= MAX_HOSTS:
            raise ValueError(f"hosts: must be between 2 and {MAX_HOSTS}, got {hosts}")
        self.hosts = int(hosts)
        self._mbit = validate_mbit(mbit)
        self.tag = f"{PREFIX}{os.getpid()}-{secrets.token_hex(3)}"
        self.subnet = _pick_subnet()
        self._namespaces: list[str] = []
        self._procs: list[subprocess.Popen] = []
        self._lock = threading.RLock()
        self._open = False

    # -- lifecycle

    @staticmethod
    def available() -> tuple[bool, str]:
        """Whether namespaces can be created here, and why not (cached; creates a probe ns)."""
        return check_available()

    def __enter__(self) -> "Testbed":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> "Testbed":
        """Create namespaces and links and apply the rate; on any failure undo it all."""
        with self._lock:
            if self._open:
                return self
            register(self)
            self._open = True
            try:
                self._build()
            except BaseException:
                self.close()
                raise
        return self

    def close(self) -> None:
        """Stop the processes started with :meth:`run`, delete namespaces (and their links)."""
        with self._lock:
            if not self._open:
                return
            self._open = False
            for proc in self._procs:
                if proc.poll() is None:
                    kill_pids([proc.pid])
                    proc.wait()
            for ns in reversed(self._namespaces):
                delete_namespace(ns)
            self._namespaces.clear()
        unregister(self)

    # -- queries

    @property
    def mbit(self) -> float:
        """The rate currently set on every link, in Mbit/s (10^6 bit/s)."""
        return self._mbit

    def namespace(self, i: int) -> str:
        return f"{self.tag}-{self._index(i)}"

    def interface(self, i: int) -> str:
        """Host i's network interface inside its namespace (for ``GLOO_SOCKET_IFNAME``)."""
        return HOST_IF.format(self._index(i))

    def address(self, i: int) -> str:
        """Host i's IPv4 address (no prefix length)."""
        return f"{self.subnet}.{self._index(i) + 1}"

    # -- actions

    def set_rate(self, mbit: float, host: int | None = None) -> None:
        """Change the rate, both directions, without tearing anything down: of every link,
        or only of host ``host``'s link (with 2 hosts both share the one veth pair)."""
        mbit = validate_mbit(mbit)
        with self._lock:
            self._require_open()
            ends = self._shaped_interfaces() if host is None else self.link_ends(host)
            for ns, dev in ends:
                set_link_rate(ns, dev, mbit)
            if host is None:
                self._mbit = mbit

    def link_ends(self, i: int) -> list[tuple[str, str]]:
        """(namespace, device) of both shaped ends of host i's link."""
        self._index(i)
        if self.hosts == 2:
            return self._shaped_interfaces()
        return [(self.namespace(i), self.interface(i)), (self._switch_ns(), PORT_IF.format(i))]

    def run(
        self,
        i: int,
        argv: Sequence[str],
        env: Mapping[str, str] | None = None,
        **popen_kwargs: object,
    ) -> subprocess.Popen:
        """Start ``argv`` inside host i's namespace; ``env`` is added to this process's env.

        The process gets its own session, and is terminated when the testbed closes.
        """
        with self._lock:
            self._require_open()
            full_env = {**os.environ, **(env or {})}
            cmd = ["ip", "netns", "exec", self.namespace(i), *argv]
            proc = subprocess.Popen(cmd, env=full_env, start_new_session=True, **popen_kwargs)  # type: ignore[call-overload]
            self._procs.append(proc)
            return proc

    # -- internals

    def _index(self, i: int) -> int:
        if not 0 <= i < self.hosts:
            raise IndexError(f"host index {i} out of range 0..{self.hosts - 1}")
        return i

    def _require_open(self) -> None:
        if not self._open:
            raise TestbedError("the testbed is not running (use `with Testbed(...)` or start())")

    def _switch_ns(self) -> str:
        return f"{self.tag}-sw"

    def _shaped_interfaces(self) -> list[tuple[str, str]]:
        """(namespace, device) of every shaped link end: each direction of each link."""
        ends = [(self.namespace(i), self.interface(i)) for i in range(self.hosts)]
        if self.hosts > 2:
            ends += [(self._switch_ns(), PORT_IF.format(i)) for i in range(self.hosts)]
        return ends

    def _add_namespace(self, ns: str) -> None:
        sh(["ip", "netns", "add", ns])
        self._namespaces.append(ns)
        _disable_ipv6(ns)
        sh(["ip", "-n", ns, "link", "set", "lo", "up"])

    def _build(self) -> None:
        for i in range(self.hosts):
            self._add_namespace(self.namespace(i))
        if self.hosts == 2:
            self._link_pair()
        else:
            self._link_switch()
        for i in range(self.hosts):
            ns, dev = self.namespace(i), self.interface(i)
            sh(["ip", "-n", ns, "addr", "add", f"{self.address(i)}/24", "dev", dev])
            sh(["ip", "-n", ns, "link", "set", dev, "up"])
        self.set_rate(self._mbit)

    def _link_pair(self) -> None:
        sh(["ip", "link", "add", self.interface(0), "netns", self.namespace(0), "type", "veth",
             "peer", "name", self.interface(1), "netns", self.namespace(1)])

    def _link_switch(self) -> None:
        sw = self._switch_ns()
        self._add_namespace(sw)
        sh(["ip", "-n", sw, "link", "add", BRIDGE_IF, "type", "bridge"])
        sh(["ip", "-n", sw, "link", "set", BRIDGE_IF, "up"])
        for i in range(self.hosts):
            port = PORT_IF.format(i)
            sh(["ip", "link", "add", self.interface(i), "netns", self.namespace(i), "type", "veth",
                 "peer", "name", port, "netns", sw])
            sh(["ip", "-n", sw, "link", "set", port, "master", BRIDGE_IF])
            sh(["ip", "-n", sw, "link", "set", port, "up"])


def _disable_ipv6(ns: str) -> None:
    """IPv4 only: gloo then cannot pick an IPv6 link-local address of GLOO_SOCKET_IFNAME."""
    if Path("/proc/sys/net/ipv6").exists():
        for scope in ("all", "default"):
            in_ns(ns, ["sysctl", "-q", "-w", f"net.ipv6.conf.{scope}.disable_ipv6=1"], check=False)


def _pick_subnet() -> str:
    """A 10.213.x prefix not configured in the root namespace (ours live only in namespaces)."""
    used = sh(["ip", "-o", "-4", "addr", "show"], check=False).stdout if shutil.which("ip") else ""
    used += sh(["ip", "-4", "route", "show"], check=False).stdout if shutil.which("ip") else ""
    for _ in range(256):
        prefix = f"{_SUBNET_BASE}.{secrets.randbelow(256)}"
        if f"{prefix}." not in used:
            return prefix
    raise TestbedError(f"no free {_SUBNET_BASE}.x.0/24 subnet")


