"""Run the coordinator for a test: in a thread (fast, shares the process) or as a
``gradwire serve`` subprocess (for restarts). Both on a free loopback port, real uvicorn."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from coordinator.raylocal import free_port

REPO_ROOT = Path(__file__).resolve().parents[2]


def wait_for(predicate: Any, timeout_s: float, what: str, interval_s: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval_s)
    raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}")


def healthy(url: str) -> dict[str, Any] | None:
    try:
        response = httpx.get(f"{url}/healthz", timeout=2.0)
    except httpx.HTTPError:
        return None
    return response.json() if response.status_code == 200 else None


class ThreadServer:
    """uvicorn serving ``app`` in a background thread of the test process."""

    def __init__(self, app: Any, port: int | None = None) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning",
                                timeout_graceful_shutdown=2, lifespan="on")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name=f"uvicorn-{self.port}", daemon=True)

    def start(self) -> "ThreadServer":
        self.thread.start()
        wait_for(lambda: self.server.started, 20, "uvicorn to start")
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(15)


class CoordinatorProcess:
    """``python -m coordinator.cli serve`` as a child process, stopped by its pid."""

    def __init__(self, data_dir: Path, *, port: int | None = None, env: dict[str, str] | None = None) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.data_dir = data_dir
        inherited = {k: v for k, v in os.environ.items() if not k.startswith("GRADWIRE_")}
        self.env = {**inherited, "GRADWIRE_DATA_DIR": str(data_dir), "GRADWIRE_PORT": str(self.port),
                    **(env or {})}
        self.log_path = data_dir / f"coordinator-{self.port}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, *, wait_ray: bool = True, timeout_s: float = 60) -> "CoordinatorProcess":
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            # cwd = repo root: Ray hands the driver's cwd to its workers, so test-only runners
            # (tests.support.fake_runner) are importable inside the runner actor.
            self.proc = subprocess.Popen([sys.executable, "-m", "coordinator.cli", "serve"], cwd=REPO_ROOT,
                                         env=self.env, stdout=log, stderr=subprocess.STDOUT)

        def up() -> bool:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"coordinator exited with {self.proc.returncode}:\n{self.log()}")
            health = healthy(self.url)
            return bool(health) and (not wait_ray or health["ray"] == "connected")

        wait_for(up, timeout_s, f"the coordinator at {self.url}")
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-5000:] if self.log_path.exists() else ""

    def stop(self, timeout_s: float = 20) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
