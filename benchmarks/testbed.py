"""An emulated network on one Linux machine: namespaces, veth links, ``tc`` rate limits.

Why: the adaptive policy must be tested against a link whose speed we know and can change
while a job runs, without a cluster. Each emulated host is a Linux network namespace; with
two hosts a veth pair joins them directly, with more a bridge inside a separate "switch"
namespace does. Each host's link is rate-limited in BOTH directions with ``tbf`` (the host's
egress on its own veth end, its ingress on the peer end), and ``set_rate`` changes it live.

What it can and cannot emulate here:

* rate limits work: ``tbf`` on veth pairs between namespaces (``htb`` would too). A gloo
  all-reduce's payload rate comes out 3-10% under the set rate (``python benchmarks/testbed.py
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
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import re
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping, Sequence

PREFIX = "gw-"
_NAME_RE = re.compile(r"^gw-(\d+)-([0-9a-f]+)-(\d+|sw)$")
_SUBNET_BASE = "10.213"  # private; a random third octet makes the /24 of one testbed
HOST_IF = "gweth{}"  # host i's interface, inside host i's namespace
PORT_IF = "gwport{}"  # the switch's end of host i's link (bridge topology only)
BRIDGE_IF = "gwbr"
MAX_HOSTS = 64
TBF_LATENCY_MS = 50  # how long a packet may wait in the shaper's queue
_KILL_GRACE_S = 3.0


class TestbedError(RuntimeError):
    """A command that sets up or changes the emulated network failed."""

    __test__ = False  # not a pytest test class, despite the name


# --------------------------------------------------------------------------- commands


def _sh(argv: Sequence[str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run one iproute2 command; raise TestbedError with its stderr when it fails."""
    proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=30)
    if check and proc.returncode != 0:
        raise TestbedError(f"{' '.join(argv)}: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc


def _in_ns(ns: str, argv: Sequence[str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
    return _sh(["ip", "netns", "exec", ns, *argv], check=check)


def list_namespaces() -> list[str]:
    """Names of all network namespaces (``ip netns list``), ours and others'."""
    out = _sh(["ip", "netns", "list"], check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _pids_in(ns: str) -> list[int]:
    out = _sh(["ip", "netns", "pids", ns], check=False).stdout
    return [int(tok) for tok in out.split() if tok.isdigit()]


def _kill_pids(pids: Iterable[int]) -> None:
    """SIGTERM, a short grace, then SIGKILL: for processes inside a namespace we own."""
    pids = [p for p in pids if p != os.getpid()]
    for pid in pids:
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + _KILL_GRACE_S
    while pids and time.monotonic() < deadline:
        pids = [p for p in pids if _alive(p)]
        time.sleep(0.05)
    for pid in pids:
        _signal(pid, signal.SIGKILL)


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie still "exists"; it holds no namespace, so treat it as gone.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _delete_namespace(ns: str) -> None:
    """Kill what runs inside ``ns`` and delete it; its links go with it."""
    _kill_pids(_pids_in(ns))
    _sh(["ip", "netns", "del", ns], check=False)


def cleanup_stale(*, include_live: bool = False) -> list[str]:
    """Remove testbed namespaces whose creating process is gone; return their names.

    With ``include_live=True`` every namespace with the project's prefix is removed, also
    those of a testbed that is still running in another process: use that only when you
    know no one else on the machine uses a testbed.
    """
    removed = []
    for ns in list_namespaces():
        match = _NAME_RE.match(ns)
        if not match:
            continue
        if include_live or not _alive(int(match.group(1))):
            _delete_namespace(ns)
            removed.append(ns)
    return removed


# --------------------------------------------------------------------------- availability

_AVAILABLE: tuple[bool, str] | None = None


def _check_available() -> tuple[bool, str]:
    if sys.platform != "linux":
        return False, f"network namespaces need Linux, this is {sys.platform}"
    if os.geteuid() != 0:
        return False, "network namespaces need root (euid is not 0)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return False, f"`{tool}` (iproute2) is not installed"
    ns = f"{PREFIX}{os.getpid()}-{secrets.token_hex(3)}-0"
    try:
        _sh(["ip", "netns", "add", ns])
        try:
            _sh(["ip", "link", "add", "gwa", "netns", ns, "type", "veth", "peer", "name", "gwb", "netns", ns])
            _sh(["tc", "-n", ns, "qdisc", "add", "dev", "gwa", "root", *_tbf_args(100.0)])
        finally:
            _sh(["ip", "netns", "del", ns], check=False)
    except (TestbedError, OSError, subprocess.TimeoutExpired) as exc:
        return False, f"cannot create a namespace with a rate-limited veth: {exc}"
    return True, "network namespaces, veth pairs and tc tbf work here"


# --------------------------------------------------------------------------- shaping


def tbf_burst_bytes(mbit: float) -> int:
    """The testbed's ``tbf`` bucket at ``mbit``: ~4 ms of traffic, at least 64 KiB.

    The bucket must hold at least one (GSO) packet or tbf stalls; much more than a few
    milliseconds would let short transfers run at the veth's native speed. What it lets
    through at line rate after an idle spell is the cost model's ``Link.burst_bytes``.
    """
    return max(64 * 1024, int(mbit * 1e6 / 8 * 0.004))


def _tbf_args(mbit: float) -> list[str]:
    """``tbf`` parameters for a rate (bucket: :func:`tbf_burst_bytes`)."""
    burst = tbf_burst_bytes(mbit)
    return ["tbf", "rate", f"{max(1, round(mbit * 1000))}kbit", "burst", str(burst), "latency", f"{TBF_LATENCY_MS}ms"]


def set_link_rate(ns: str, dev: str, mbit: float) -> None:
    """Shape one link end (device ``dev`` in namespace ``ns``) to ``mbit``; also usable from a
    process other than the testbed's owner (``benchmarks.cluster rate``)."""
    _sh(["tc", "-n", ns, "qdisc", "replace", "dev", dev, "root", *_tbf_args(_validate_mbit(mbit))])


def _validate_mbit(mbit: float) -> float:
    mbit = float(mbit)
    if not mbit > 0 or mbit != mbit or mbit == float("inf"):
        raise ValueError(f"mbit: must be a positive finite rate, got {mbit}")
    return mbit


# --------------------------------------------------------------------------- lifetime hooks

_LIVE: set["Testbed"] = set()
_LIVE_LOCK = threading.Lock()
_ATEXIT_DONE = False
_PREV_SIGTERM: object = None


def _on_sigterm(signum: int, frame: object) -> None:
    """Turn SIGTERM into SystemExit so with-blocks unwind and remove their testbeds."""
    raise SystemExit(128 + signum)


def _close_all() -> None:
    for tb in list(_LIVE):
        tb.close()


def _register(tb: "Testbed") -> None:
    """Track a live testbed; the first one installs the atexit and SIGTERM hooks."""
    global _ATEXIT_DONE, _PREV_SIGTERM
    with _LIVE_LOCK:
        if not _ATEXIT_DONE:
            atexit.register(_close_all)
            _ATEXIT_DONE = True
        if not _LIVE and threading.current_thread() is threading.main_thread():
            # Only replace the default action: a program with its own SIGTERM handler
            # presumably exits cleanly, and atexit covers that path.
            if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
                signal.signal(signal.SIGTERM, _on_sigterm)
                _PREV_SIGTERM = signal.SIG_DFL
        _LIVE.add(tb)


def _unregister(tb: "Testbed") -> None:
    global _PREV_SIGTERM
    with _LIVE_LOCK:
        _LIVE.discard(tb)
        if not _LIVE and _PREV_SIGTERM is not None and threading.current_thread() is threading.main_thread():
            if signal.getsignal(signal.SIGTERM) == _on_sigterm:
                signal.signal(signal.SIGTERM, _PREV_SIGTERM)  # type: ignore[arg-type]
            _PREV_SIGTERM = None


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
        self._mbit = _validate_mbit(mbit)
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
        global _AVAILABLE
        if _AVAILABLE is None:
            _AVAILABLE = _check_available()
        return _AVAILABLE

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
            _register(self)
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
                    _kill_pids([proc.pid])
                    proc.wait()
            for ns in reversed(self._namespaces):
                _delete_namespace(ns)
            self._namespaces.clear()
        _unregister(self)

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
        mbit = _validate_mbit(mbit)
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
        _sh(["ip", "netns", "add", ns])
        self._namespaces.append(ns)
        _disable_ipv6(ns)
        _sh(["ip", "-n", ns, "link", "set", "lo", "up"])

    def _build(self) -> None:
        for i in range(self.hosts):
            self._add_namespace(self.namespace(i))
        if self.hosts == 2:
            self._link_pair()
        else:
            self._link_switch()
        for i in range(self.hosts):
            ns, dev = self.namespace(i), self.interface(i)
            _sh(["ip", "-n", ns, "addr", "add", f"{self.address(i)}/24", "dev", dev])
            _sh(["ip", "-n", ns, "link", "set", dev, "up"])
        self.set_rate(self._mbit)

    def _link_pair(self) -> None:
        _sh(["ip", "link", "add", self.interface(0), "netns", self.namespace(0), "type", "veth",
             "peer", "name", self.interface(1), "netns", self.namespace(1)])

    def _link_switch(self) -> None:
        sw = self._switch_ns()
        self._add_namespace(sw)
        _sh(["ip", "-n", sw, "link", "add", BRIDGE_IF, "type", "bridge"])
        _sh(["ip", "-n", sw, "link", "set", BRIDGE_IF, "up"])
        for i in range(self.hosts):
            port = PORT_IF.format(i)
            _sh(["ip", "link", "add", self.interface(i), "netns", self.namespace(i), "type", "veth",
                 "peer", "name", port, "netns", sw])
            _sh(["ip", "-n", sw, "link", "set", port, "master", BRIDGE_IF])
            _sh(["ip", "-n", sw, "link", "set", port, "up"])


def _disable_ipv6(ns: str) -> None:
    """IPv4 only: gloo then cannot pick an IPv6 link-local address of GLOO_SOCKET_IFNAME."""
    if Path("/proc/sys/net/ipv6").exists():
        for scope in ("all", "default"):
            _in_ns(ns, ["sysctl", "-q", "-w", f"net.ipv6.conf.{scope}.disable_ipv6=1"], check=False)


def _pick_subnet() -> str:
    """A 10.213.x prefix not configured in the root namespace (ours live only in namespaces)."""
    used = _sh(["ip", "-o", "-4", "addr", "show"], check=False).stdout if shutil.which("ip") else ""
    used += _sh(["ip", "-4", "route", "show"], check=False).stdout if shutil.which("ip") else ""
    for _ in range(256):
        prefix = f"{_SUBNET_BASE}.{secrets.randbelow(256)}"
        if f"{prefix}." not in used:
            return prefix
    raise TestbedError(f"no free {_SUBNET_BASE}.x.0/24 subnet")


# --------------------------------------------------------------------------- rate schedules


@dataclass
class RateSchedule:
    """A background thread that walks a list of (mbit, seconds), changing the rate live.

    ``changes`` records (wall time from ``time.time()``, mbit) at each change, so a run's
    measurements can be lined up with the rate that was set. ``error`` holds the exception
    that stopped the thread, if one did.
    """

    steps: list[tuple[float, float]]
    changes: list[tuple[float, float]] = field(default_factory=list)
    error: BaseException | None = None
    _stop: threading.Event = field(default_factory=threading.Event, repr=False)
    _thread: threading.Thread | None = field(default=None, repr=False)

    def stop(self) -> None:
        """Stop after the current step (the rate stays where it is)."""
        self._stop.set()

    def join(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def done(self) -> bool:
        return self._thread is not None and not self._thread.is_alive()

    def __enter__(self) -> "RateSchedule":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
        self.join()


def run_schedule(tb: Testbed, steps: Sequence[tuple[float, float]]) -> RateSchedule:
    """Start changing ``tb``'s rate along ``steps`` = [(mbit, seconds), ...] in a thread."""
    schedule = RateSchedule(steps=[(_validate_mbit(m), float(s)) for m, s in steps])

    def walk() -> None:
        try:
            for mbit, seconds in schedule.steps:
                if schedule._stop.is_set():
                    return
                tb.set_rate(mbit)
                schedule.changes.append((time.time(), mbit))
                if schedule._stop.wait(seconds):
                    return
        except BaseException as exc:  # recorded for the caller; a thread cannot raise to it
            schedule.error = exc

    schedule._thread = threading.Thread(target=walk, name="gw-rate-schedule", daemon=True)
    schedule._thread.start()
    return schedule


# --------------------------------------------------------------------------- measuring with gloo


@dataclass(frozen=True)
class AllReduceMeasurement:
    """What a gloo all-reduce across the testbed saw.

    ``mbit_seen`` is the per-link rate implied by the ring model: each rank sends
    2(n-1)/n * nbytes per all-reduce, so rate = 2(n-1)/n * nbytes * 8 / seconds.
    """

    nbytes: int
    world_size: int
    seconds: list[float]
    mbit_set: float
    #: Mean time of the same all-reduce joined late by one rank after computing
    #: (``workers.probe.wake_up_seconds``); None unless ``wake_rounds`` were asked for.
    wake_up_s: float | None = None

    @property
    def wake_s(self) -> float:
        """What the probe reports as ``wake_s``: the late-joined all-reduce beyond the best
        aligned one (0 unless ``wake_rounds`` were asked for)."""
        return max(0.0, self.wake_up_s - min(self.seconds)) if self.wake_up_s is not None else 0.0

    @property
    def median_s(self) -> float:
        return statistics.median(self.seconds)

    @property
    def mbit_seen(self) -> float:
        n = self.world_size
        return 2 * (n - 1) / n * self.nbytes * 8 / self.median_s / 1e6


def worker_env(tb: Testbed, i: int) -> dict[str, str]:
    """Environment for a torch process on host i: gloo on the host's link, one thread."""
    return {"GLOO_SOCKET_IFNAME": tb.interface(i), "OMP_NUM_THREADS": "1"}


def measure_allreduce(
    tb: Testbed,
    nbytes: int = 8 << 20,
    iters: int = 3,
    *,
    port: int = 29500,
    timeout_s: float = 90.0,
    wake_rounds: int = 0,
) -> AllReduceMeasurement:
    """Run one torch process per host, all-reduce ``nbytes`` ``iters`` times, time it; then
    ``wake_rounds`` times as a training step meets it (the probe's wake-up rounds)."""
    init = f"tcp://{tb.address(0)}:{port}"
    procs = []
    for i in range(tb.hosts):
        argv = [sys.executable, "-u", str(Path(__file__).resolve()), "_allreduce-worker",
                "--rank", str(i), "--world", str(tb.hosts), "--init", init,
                "--nbytes", str(nbytes), "--iters", str(iters), "--wake-rounds", str(wake_rounds)]
        procs.append(tb.run(i, argv, env=worker_env(tb, i), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outputs = _collect(procs, timeout_s)
    result = json.loads(outputs[0].strip().splitlines()[-1])
    return AllReduceMeasurement(nbytes=nbytes, world_size=tb.hosts, seconds=result["seconds"], mbit_set=tb.mbit,
                                wake_up_s=result.get("wake_up_s"))


def _collect(procs: Sequence[subprocess.Popen], timeout_s: float) -> list[str]:
    """Wait for all processes; on a failure or timeout kill the rest and raise with stderr."""
    deadline = time.monotonic() + timeout_s
    outputs = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=max(0.1, deadline - time.monotonic()))
            if proc.returncode != 0:
                raise TestbedError(f"worker exited with {proc.returncode}: {err.strip()[-2000:]}")
            outputs.append(out)
    except subprocess.TimeoutExpired as exc:
        raise TestbedError(f"workers did not finish within {timeout_s:.0f} s") from exc
    finally:
        for proc in procs:
            if proc.poll() is None:
                _kill_pids([proc.pid])
                proc.wait()
    return outputs


def _allreduce_worker(args: argparse.Namespace) -> None:
    """One rank of :func:`measure_allreduce`: barrier, time one all-reduce, repeat."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=args.init, rank=args.rank, world_size=args.world,
                            timeout=timedelta(seconds=60))
    tensor = torch.ones(max(1, args.nbytes // 4), dtype=torch.float32)
    dist.all_reduce(tensor)  # warm-up: connections and buffers
    seconds = []
    for _ in range(args.iters):
        dist.barrier()
        start = time.perf_counter()
        dist.all_reduce(tensor)
        seconds.append(time.perf_counter() - start)
    wake = None
    if args.wake_rounds:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository, for workers.probe
        from workers.probe import wake_up_seconds

        wake = wake_up_seconds(tensor, None, torch.device("cpu"), args.wake_rounds)
    dist.destroy_process_group()
    print(json.dumps({"rank": args.rank, "seconds": seconds, "wake_up_s": wake}))


# --------------------------------------------------------------------------- CLI


def _verify(args: argparse.Namespace) -> int:
    ok, why = Testbed.available()
    if not ok:
        print(f"testbed unavailable: {why}", file=sys.stderr)
        return 2
    with Testbed(hosts=args.hosts, mbit=args.mbit) as tb:
        m = measure_allreduce(tb, nbytes=args.mib << 20, iters=args.iters)
    err = (m.mbit_seen - m.mbit_set) / m.mbit_set
    print(f"set {m.mbit_set:.1f} Mbit/s, gloo all-reduce saw {m.mbit_seen:.1f} Mbit/s "
          f"({err:+.1%}; {args.hosts} hosts, {args.mib} MiB, median of {args.iters}: {m.median_s:.3f} s)")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    verify = sub.add_parser("verify", help="measure the rate gloo sees on a fresh testbed")
    verify.add_argument("--mbit", type=float, default=200.0)
    verify.add_argument("--hosts", type=int, default=2)
    verify.add_argument("--mib", type=int, default=16, help="all-reduce size in MiB")
    verify.add_argument("--iters", type=int, default=3)
    sub.add_parser("cleanup", help="remove namespaces left by dead testbed processes")
    worker = sub.add_parser("_allreduce-worker", help=argparse.SUPPRESS)
    worker.add_argument("--rank", type=int, required=True)
    worker.add_argument("--world", type=int, required=True)
    worker.add_argument("--init", required=True)
    worker.add_argument("--nbytes", type=int, required=True)
    worker.add_argument("--iters", type=int, required=True)
    worker.add_argument("--wake-rounds", type=int, default=0)
    args = parser.parse_args(argv)
    if args.cmd == "verify":
        return _verify(args)
    if args.cmd == "cleanup":
        print("\n".join(cleanup_stale()) or "nothing stale")
        return 0
    _allreduce_worker(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
