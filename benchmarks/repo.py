"""Where the repository is, and how a benchmark starts one of its modules in a child process.

Why: the benchmarks run their own entry points in child processes (a rank inside a network
namespace, an isolated codec measurement) as ``python -m benchmarks.NAME``; a child finds the
``benchmarks`` package, and this checkout's ``planning``/``compressors``/``workers``, through
``PYTHONPATH`` rather than through edits of ``sys.path``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


def module_command(module: str, *args: str) -> list[str]:
    """``python -u -m module args...`` with this interpreter."""
    return [sys.executable, "-u", "-m", module, *args]


def repo_env() -> dict[str, str]:
    """Environment additions that put this checkout first on a child's import path."""
    rest = os.environ.get("PYTHONPATH", "")
    return {"PYTHONPATH": str(REPO_ROOT) + (os.pathsep + rest if rest else "")}


def commit() -> str | None:
    """The commit this checkout is at, with ``+`` where files differ from it (None outside a git
    checkout): a result file says which code its runs ran on, so files of different codes are
    not judged as one (``benchmarks.adaptive.merge_seeds`` lists them)."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short=7", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True,
                              timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO_ROOT,
                               capture_output=True, text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("+" if dirty else "") if head else None

