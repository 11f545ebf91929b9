"""State files of running clusters (so ``rate``/``down`` from another shell find them), and stale ones swept.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.cluster.errors import ClusterError
from benchmarks.testbed import alive, cleanup_stale

STATE_DIR = Path(tempfile.gettempdir()) / "gradwire-cluster"
# --------------------------------------------------------------------------- state files (CLI)


def state_path(pid: int) -> Path:
    return STATE_DIR / f"{pid}.json"


def live_states() -> list[dict[str, Any]]:
    """State of every cluster whose owning process is alive (stale files are removed)."""
    out = []
    for path in sorted(STATE_DIR.glob("*.json")) if STATE_DIR.exists() else []:
        try:
            state = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if alive(int(state["pid"])):
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
        if not alive(int(state["pid"])):
            shutil.rmtree(state.get("workdir", ""), ignore_errors=True)
            path.unlink(missing_ok=True)
    for directory in Path(tempfile.gettempdir()).glob("gwc-*-*"):
        pid = directory.name.split("-")[1]
        if pid.isdigit() and not alive(int(pid)):
            shutil.rmtree(directory, ignore_errors=True)
    return removed


def one_state(pid: int | None) -> dict[str, Any]:
    states = [s for s in live_states() if pid is None or s["pid"] == pid]
    if not states:
        raise ClusterError("no emulated cluster is running (start one with `python -m benchmarks.cluster up`)")
    if len(states) > 1:
        raise ClusterError(f"several clusters run ({', '.join(str(s['pid']) for s in states)}); name one with --pid")
    return states[0]

