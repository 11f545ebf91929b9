"""The embedded Ray head: started as its own process so it outlives the coordinator.

``ray start --head --block`` is spawned in a new session; its pid goes to
``<data_dir>/ray-head.json``. ``--block`` matters: on SIGTERM that process stops exactly the
Ray processes it started, so shutting down never touches another Ray cluster on the machine
(``ray stop`` would kill every Ray process by name). Torch-free and Ray-import-free.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

READY_LINE = "Ray runtime started"


@dataclass(frozen=True)
class LocalHead:
    address: str
    pid: int | None
    started_here: bool


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def _state_file(data_dir: Path) -> Path:
    return data_dir / "ray-head.json"


def _ray_executable() -> str:
    candidate = Path(sys.executable).parent / "ray"
    return str(candidate) if candidate.exists() else "ray"


def use_token_auth() -> None:
    """Token authentication for the local head and every client of it, decided once.

    Ray 2.5x+ turns token auth on for a ``ray start`` head whenever ``~/.ray/auth_token``
    exists (any earlier local ``ray.init()`` writes one), but a client that connects to an
    existing cluster only sends the token when ``RAY_AUTH_MODE=token`` is set. Without this,
    whether the coordinator can reach its own head depended on what ran before it. So: make
    sure the token exists and set the mode in this process; children inherit it.
    """
    if os.environ.get("RAY_AUTH_MODE"):
        return
    subprocess.run([_ray_executable(), "get-auth-token", "--generate"], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    os.environ["RAY_AUTH_MODE"] = "token"
    if "ray" in sys.modules:
        # Ray reads the mode when it is imported; re-read it the way Ray's own local
        # ray.init() does after turning token auth on (Config is internal, hence the guard).
        try:
            from ray._raylet import Config  # type: ignore[attr-defined]

            Config.initialize("")
        except (ImportError, AttributeError):  # pragma: no cover - another Ray version
            pass


def ensure_head(data_dir: Path, port: int, num_cpus: int, *, timeout_s: float = 90.0,
                env: dict[str, str] | None = None) -> LocalHead:
    """Attach to the local head on ``port`` if one answers, else start one and wait for it."""
    use_token_auth()
    address = f"127.0.0.1:{port}"
    if port_open(port):
        return LocalHead(address=address, pid=_recorded_pid(data_dir), started_here=False)
    data_dir.mkdir(parents=True, exist_ok=True)
    log_path = data_dir / "ray-head.log"
    # Explicit free ports for the per-node services whose defaults are fixed numbers, so this
    # head can sit beside another Ray cluster on the same machine.
    cmd = [
        _ray_executable(), "start", "--head", "--block", f"--port={port}", f"--num-cpus={num_cpus}",
        "--node-ip-address=127.0.0.1", "--include-dashboard=false", "--disable-usage-stats",
        f"--dashboard-agent-listen-port={free_port()}",
        f"--dashboard-agent-grpc-port={free_port()}", f"--metrics-export-port={free_port()}",
        f"--runtime-env-agent-port={free_port()}",
    ]
    child_env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", **(env or {})}
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=child_env, start_new_session=True)
    _state_file(data_dir).write_text(json.dumps({"pid": proc.pid, "port": port, "address": address}))
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            _state_file(data_dir).unlink(missing_ok=True)
            raise RuntimeError(f"ray start exited with {proc.returncode}; see {log_path}")
        if READY_LINE in log_path.read_text(errors="replace") and port_open(port):
            return LocalHead(address=address, pid=proc.pid, started_here=True)
        time.sleep(0.2)
    terminate(proc.pid, 10)
    _state_file(data_dir).unlink(missing_ok=True)
    raise TimeoutError(f"local Ray head did not start within {timeout_s:.0f} s; see {log_path}")


def _recorded_pid(data_dir: Path) -> int | None:
    try:
        pid = int(json.loads(_state_file(data_dir).read_text())["pid"])
    except (OSError, ValueError, KeyError):
        return None
    return pid if _is_our_ray_start(pid) else None


def _is_our_ray_start(pid: int) -> bool:
    """Guard against a recycled pid: the process must still be a ``ray start --head``."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return b"start" in cmdline and b"--head" in cmdline and b"--block" in cmdline


def stop_head(data_dir: Path, timeout_s: float = 30.0) -> bool:
    """Stop the head this data dir started (by its recorded pid). True when one was stopped."""
    pid = _recorded_pid(data_dir)
    _state_file(data_dir).unlink(missing_ok=True)
    if pid is None:
        return False
    terminate(pid, timeout_s)
    return True


def terminate(pid: int, timeout_s: float) -> None:
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not _alive(pid):
            return
        time.sleep(0.2)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _alive(pid: int) -> bool:
    try:
        os.waitpid(pid, os.WNOHANG)  # reap it if it is our child
    except ChildProcessError:
        pass
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split()[2]
    except OSError:
        return False
    return state != "Z"
