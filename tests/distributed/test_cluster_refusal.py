"""Without the rights to make network namespaces, ``benchmarks.cluster`` refuses clearly.

As root the command runs with every capability dropped (``setpriv``), which is what an
unprivileged user has; as another user it runs as it is. Either way it must exit with 2 and
say why, before creating anything.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def unprivileged(argv: list[str]) -> list[str]:
    if os.geteuid() != 0:
        return argv
    if shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv (util-linux): cannot drop the capabilities")
    return ["setpriv", "--bounding-set=-all", "--inh-caps=-all", *argv]


@pytest.mark.parametrize("command", [["up", "--nodes", "2"], ["scenario", "--quick"], ["demo"]])
def test_without_namespace_rights_the_cluster_refuses_with_the_reason(command: list[str]) -> None:
    proc = subprocess.Popen(unprivileged([sys.executable, "-m", "benchmarks.cluster", *command]), cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    said, _ = proc.communicate(timeout=60)
    assert proc.returncode == 2, said
    assert "namespace" in said and ("root" in said or "not permitted" in said), said
    assert "Traceback" not in said
    netns = Path("/run/netns")
    assert not [p for p in (netns.iterdir() if netns.exists() else []) if p.name.startswith(f"gw-{proc.pid}-")]


def test_gradwire_demo_network_refuses_with_the_reason_and_says_what_to_run() -> None:
    proc = subprocess.run(unprivileged([sys.executable, "-m", "coordinator.cli", "demo", "--network"]), cwd=ROOT,
                          capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT),
                                                                            "COLUMNS": "200"})
    said = proc.stdout + proc.stderr
    assert proc.returncode == 2, said
    assert "needs root and network namespaces" in said and "gradwire demo" in said
    assert "Traceback" not in said
