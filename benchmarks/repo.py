"""Where the repository is, and how a benchmark starts one of its modules in a child process.

Why: the benchmarks run their own entry points in child processes (a rank inside a network
namespace, an isolated codec measurement) as ``python -m benchmarks.NAME``; a child finds the
``benchmarks`` package, and this checkout's ``planning``/``compressors``/``workers``, through
``PYTHONPATH`` rather than through edits of ``sys.path``.
"""

from __future__ import annotations

import os
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
