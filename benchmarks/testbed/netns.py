"""Network namespaces and their processes, found, killed and removed; whether this machine can make them; ``tbf`` shaping.

Why apart from :class:`~benchmarks.testbed.bed.Testbed`: the emulated cluster (``benchmarks.cluster``)
builds its nodes from the same commands.
"""

from __future__ import annotations

import functools
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
from typing import Iterable, Sequence

PREFIX = "gw-"
_NAME_RE = re.compile(r"^gw-(\d+)-([0-9a-f]+)-(\d+|sw)$")
TBF_LATENCY_MS = 50  # how long a packet may wait in the shaper's queue
_KILL_GRACE_S = 3.0


class TestbedError(RuntimeError):
    """A command that sets up or changes the emulated network failed."""

    __test__ = False  # not a pytest test class, despite the name


# --------------------------------------------------------------------------- commands


def sh(argv: Sequence[str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run one iproute2 command; raise TestbedError with its stderr when it fails."""
    proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=30)
    if check and proc.returncode != 0:
        raise TestbedError(f"{' '.join(argv)}: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc


def in_ns(ns: str, argv: Sequence[str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
    return sh(["ip", "netns", "exec", ns, *argv], check=check)


def list_namespaces() -> list[str]:
    """Names of all network namespaces (``ip netns list``), ours and others'."""
    out = sh(["ip", "netns", "list"], check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def pids_in(ns: str) -> list[int]:
    out = sh(["ip", "netns", "pids", ns], check=False).stdout
    return [int(tok) for tok in out.split() if tok.isdigit()]


def kill_pids(pids: Iterable[int]) -> None:
    """SIGTERM, a short grace, then SIGKILL: for processes inside a namespace we own."""
    pids = [p for p in pids if p != os.getpid()]
    for pid in pids:
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + _KILL_GRACE_S
    while pids and time.monotonic() < deadline:
        pids = [p for p in pids if alive(p)]
        time.sleep(0.05)
    for pid in pids:
        _signal(pid, signal.SIGKILL)


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def alive(pid: int) -> bool:
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


def delete_namespace(ns: str) -> None:
    """Kill what runs inside ``ns`` and delete it; its links go with it."""
    kill_pids(pids_in(ns))
    sh(["ip", "netns", "del", ns], check=False)


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
        if include_live or not alive(int(match.group(1))):
            delete_namespace(ns)
            removed.append(ns)
    return removed


# --------------------------------------------------------------------------- availability

@functools.cache
def check_available() -> tuple[bool, str]:
    if sys.platform != "linux":
        return False, f"network namespaces need Linux, this is {sys.platform}"
    if os.geteuid() != 0:
        return False, "network namespaces need root (euid is not 0)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return False, f"`{tool}` (iproute2) is not installed"
    ns = f"{PREFIX}{os.getpid()}-{secrets.token_hex(3)}-0"
    try:
        sh(["ip", "netns", "add", ns])
        try:
            sh(["ip", "link", "add", "gwa", "netns", ns, "type", "veth", "peer", "name", "gwb", "netns", ns])
            sh(["tc", "-n", ns, "qdisc", "add", "dev", "gwa", "root", *tbf_args(100.0)])
        finally:
            sh(["ip", "netns", "del", ns], check=False)
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


def tbf_args(mbit: float) -> list[str]:
    """``tbf`` parameters for a rate (bucket: :func:`tbf_burst_bytes`)."""
    burst = tbf_burst_bytes(mbit)
    return ["tbf", "rate", f"{max(1, round(mbit * 1000))}kbit", "burst", str(burst), "latency", f"{TBF_LATENCY_MS}ms"]


def set_link_rate(ns: str, dev: str, mbit: float) -> None:
    """Shape one link end (device ``dev`` in namespace ``ns``) to ``mbit``; also usable from a
    process other than the testbed's owner (``benchmarks.cluster rate``)."""
    sh(["tc", "-n", ns, "qdisc", "replace", "dev", dev, "root", *tbf_args(validate_mbit(mbit))])


def validate_mbit(mbit: float) -> float:
    mbit = float(mbit)
    if not mbit > 0 or mbit != mbit or mbit == float("inf"):
        raise ValueError(f"mbit: must be a positive finite rate, got {mbit}")
    return mbit


