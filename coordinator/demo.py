"""``gradwire demo``: the whole system in one command, for a fresh checkout.

1. Start what is missing, in the background: a local Ray head (its own process) and a
   coordinator (``gradwire serve``, SQLite under ``./.gradwire``). A coordinator already
   answering on the port is reused and left alone.
2. Submit a small job: an MLP on synthetic data, 2 CPU workers, adaptive compression.
3. Print the live page and /metrics URLs, show progress, end with a summary table.
4. Stop what step 1 started, unless ``--keep``; ``gradwire serve --stop-ray`` stops it later.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console

from coordinator import raylocal
from coordinator.client import Client
from coordinator.console import summary_table, watch
from coordinator.settings import Settings
from planning import registry

DEMO_SPEC: dict[str, Any] = {
    "name": "demo",
    "model": "mlp",
    "dataset": "synthetic",
    "steps": 150,
    "batch_size": 64,
    "workers": 2,
    "report_interval_s": 1.0,
    "compression": {"mode": "adaptive", "compressor": registry.DEFAULT_COMPRESSOR, "compressor_rank": 4},
}


@dataclass
class Background:
    """What the demo started (and must stop unless ``--keep``)."""

    coordinator_pid: int | None = None
    head_started: bool = False
    notes: list[str] = field(default_factory=list)


def coordinator_file(data_dir: Path) -> Path:
    return data_dir / "coordinator.json"


def _healthy(url: str) -> dict[str, Any] | None:
    try:
        response = httpx.get(f"{url}/healthz", timeout=2.0)
        return response.json() if response.status_code == 200 else None
    except httpx.HTTPError:
        return None


def start_background(settings: Settings, console: Console, started: Background) -> None:
    """Start what is missing, recording each thing in ``started`` as soon as it runs, so an
    interrupted start is cleaned up too."""
    url = f"http://127.0.0.1:{settings.port}"
    if _healthy(url):
        started.notes.append(f"reusing the coordinator already running at {url}")
        return
    with console.status("starting a local Ray head…"):
        head = raylocal.ensure_head(settings.data_dir, settings.ray_port, settings.local_ray_cpus)
    started.head_started = head.started_here
    log_path = settings.data_dir / "coordinator.log"
    env = {**os.environ, "GRADWIRE_RAY_ADDRESS": head.address, "GRADWIRE_PORT": str(settings.port),
           "GRADWIRE_DATA_DIR": str(settings.data_dir)}
    with open(log_path, "a") as log:
        proc = subprocess.Popen([sys.executable, "-m", "coordinator.cli", "serve"], stdout=log,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                start_new_session=True)
    started.coordinator_pid = proc.pid
    coordinator_file(settings.data_dir).write_text(json.dumps({"pid": proc.pid, "url": url}))
    with console.status("starting the coordinator…"):
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"the coordinator exited with {proc.returncode}; see {log_path}")
            health = _healthy(url)
            if health and health["ray"] == "connected":
                return
            time.sleep(0.3)
    raise TimeoutError(f"the coordinator did not come up; see {log_path}")


def stop_coordinator(data_dir: Path, timeout_s: float = 20.0) -> bool:
    """Stop a coordinator that ``demo --keep`` left running (by its recorded pid)."""
    path = coordinator_file(data_dir)
    try:
        pid = int(json.loads(path.read_text())["pid"])
    except (OSError, ValueError, KeyError):
        return False
    path.unlink(missing_ok=True)
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    if b"coordinator.cli" not in cmdline:
        return False  # the pid was recycled by another program
    raylocal.terminate(pid, timeout_s)
    return True


def run_demo(settings: Settings, *, keep: bool, steps: int, console: Console) -> int:
    spec = dict(DEMO_SPEC, steps=steps)
    url = f"http://127.0.0.1:{settings.port}"
    started = Background()
    try:
        start_background(settings, console, started)
        for note in started.notes:
            console.print(f"[dim]{note}[/]")
        client = Client(url, settings.token_value)
        job = client.submit(spec)
        console.print(f"submitted job [bold]{job['id']}[/] ({spec['model']}, {spec['workers']} workers, "
                      f"adaptive compression, {steps} steps)")
        console.print(f"live page:  [link]{url}/?job={job['id']}[/link]")
        console.print(f"metrics:    [link]{url}/metrics[/link]")
        console.print(f"API docs:   [link]{url}/docs[/link]")
        final = watch(client, job["id"], console)
        console.print(summary_table(client.history(job["id"])))
        return 0 if final["state"] == "succeeded" else 1
    finally:
        if keep:
            console.print(f"[bold]--keep[/]: the coordinator ({url}) and the Ray head keep running; "
                          "stop both with [bold]gradwire serve --stop-ray[/]")
        else:
            if started.coordinator_pid is not None:
                stop_coordinator(settings.data_dir)
            if started.head_started:
                raylocal.stop_head(settings.data_dir)
