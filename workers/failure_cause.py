"""Name a Ray Train failure that was really an out-of-memory kill, in words a user can act on.

When Ray's memory monitor kills a training worker, Ray Train v2 fails the run with a
``WorkerGroupError`` whose text starts "A worker health check failed" followed by the worker's
metadata; Ray's own explanation (which node, how full its memory was) comes kilobytes later,
past where a job's reason is cut. The cause is in the exception itself, typed: the error's
``worker_failures`` maps each failed rank to a ``WorkerHealthCheckFailedError`` whose
``health_check_failure`` is the ``ray.exceptions.OutOfMemoryError`` the raylet raised for that
worker (``ControllerError.controller_failure`` likewise when the controller's own call saw
it). That is where this module looks, so the answer is about a worker of *this* run. Ray's
state API (``list_actors(...).death_cause``) would say the same, but it needs the dashboard,
which the coordinator's local head does not run, and it lists every job's dead actors.

The figures (node, memory used and limit, the worker's own memory) come from the raylet's
message, whose format is fixed in Ray's C++ (``memory_monitor``/``worker_killing_policy``);
whatever of it does not parse is left out, and Ray's first line is quoted instead. A worker
killed by the kernel's OOM killer rather than Ray's monitor is not recognised: Ray then only
knows that the process died (SIGKILL), not why.

Torch-free; Ray's exception types are imported only when a failure is examined.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

ADVICE = ("Use less memory per worker (a smaller batch_size, seq_len or model) or fewer workers "
          "per node, or give the node more memory.")

_NODE = re.compile(r"Memory on the node \(IP: (?P<ip>[^,)]+), ID: (?P<id>\w+)\) was "
                   r"(?P<used>[\d.]+)GB used / (?P<limit>[\d.]+)GB limit")
_THRESHOLD = re.compile(r"exceeded threshold of \d+B \((?P<percent>[\d.]+)% of")
_PID = re.compile(r"\bpid=(?P<pid>\d+)")


class WorkerOutOfMemoryError(RuntimeError):
    """A training worker was killed because its node ran out of memory (see :meth:`OutOfMemoryKill.describe`)."""


@dataclass(frozen=True)
class OutOfMemoryKill:
    """What Ray said about one process of the run (a worker, or the job's runner) killed for memory."""

    ray_message: str
    rank: int | None = None
    pid: int | None = None

    def _node(self) -> re.Match[str] | None:
        return _NODE.search(self.ray_message)

    def worker_gb(self) -> str | None:
        """The killed worker's own resident memory, from the raylet's list of its victims."""
        if self.pid is None:
            return None
        found = re.search(rf"\bpid={self.pid}, actual memory used=(?P<gb>[\d.]+)GB", self.ray_message)
        return found["gb"] if found else None

    def describe(self, victim: str | None = None) -> str:
        """One paragraph: out of memory, which process (``victim``, by default the worker's
        rank), where, the node's memory, what to do."""
        who = victim or ("a process of this job" if self.rank is None else f"training worker rank {self.rank}")
        details = [f"pid {self.pid}"] if self.pid is not None else []
        if (gb := self.worker_gb()) is not None:
            details.append(f"{gb} GB resident")
        if details:
            who += f" ({', '.join(details)})"
        node = self._node()
        if node is None:
            first_line = self.ray_message.strip().splitlines()[0] if self.ray_message.strip() else ""
            where = f"; Ray said: {first_line[:400]}"
        else:
            threshold = _THRESHOLD.search(self.ray_message)
            kill_at = f", above Ray's kill threshold of {threshold['percent']}%" if threshold else ""
            where = (f" on node {node['ip']} ({node['id'][:12]}): the node's memory was "
                     f"{node['used']}GB used / {node['limit']}GB limit{kill_at}")
        return f"out of memory: Ray killed {who}{where}. {ADVICE}"


def out_of_memory_kill(error: BaseException) -> OutOfMemoryKill | None:
    """The first out-of-memory kill of this run's workers behind ``error``, or None.

    Follows Ray Train's typed links (``worker_failures``, ``health_check_failure``,
    ``controller_failure``), a ``RayTaskError``'s ``cause`` and Python's ``__cause__`` and
    ``__context__``; the rank is the key under which ``worker_failures`` holds the failure.
    """
    from ray.exceptions import OutOfMemoryError

    seen: set[int] = set()
    pending: list[tuple[BaseException, int | None, int | None]] = [(error, None, None)]
    while pending:
        current, rank, pid = pending.pop(0)
        if id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, OutOfMemoryError):
            return OutOfMemoryKill(ray_message=str(current), rank=rank, pid=pid)
        failures = getattr(current, "worker_failures", None)
        if isinstance(failures, dict):
            for key, failure in failures.items():
                if isinstance(failure, BaseException):
                    pending.append((failure, key if isinstance(key, int) else None, None))
        health_check = getattr(current, "health_check_failure", None)
        if isinstance(health_check, BaseException):
            # The health check's own message (without the failure) carries the worker's metadata.
            message = current.args[0] if current.args and isinstance(current.args[0], str) else ""
            found = _PID.search(message)
            pending.append((health_check, rank, int(found["pid"]) if found else pid))
        for link in ("controller_failure", "cause", "__cause__", "__context__"):
            linked = getattr(current, link, None)
            if isinstance(linked, BaseException):
                pending.append((linked, rank, pid))
    return None

