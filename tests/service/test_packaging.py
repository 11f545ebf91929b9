"""``pip install 'gradwire[coordinator]'`` brings neither torch nor Ray, and such a coordinator
works: it serves the API, accepts external jobs and refuses, at submission and saying what to
install, a job it would have to run itself.

The install itself needs a package index (checked by hand, see the report in docs/architecture.md);
here, offline: the dependency lists, and the coordinator in a fresh interpreter where importing
torch or Ray fails as if they were not installed."""

from __future__ import annotations

import re
import subprocess
import sys

import tomllib
from support.servers import REPO_ROOT

HEAVY = ("torch", "ray")


def _requirement_names(requirements: list[str]) -> set[str]:
    return {re.split(r"[\s\[<>=!~;]", requirement, maxsplit=1)[0].lower() for requirement in requirements}


def test_the_core_and_the_coordinator_extra_name_neither_torch_nor_ray():
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    coordinator = _requirement_names(project["dependencies"]) | _requirement_names(extras["coordinator"])
    assert not coordinator & set(HEAVY), coordinator
    assert {"fastapi", "uvicorn", "sqlalchemy", "prometheus-client", "pydantic"} <= coordinator
    assert {"torch", "ray"} <= _requirement_names(extras["workers"])
    # The torch version is written once: in the cpu extra.
    pins = [r for reqs in [project["dependencies"], *extras.values()] for r in reqs if r.startswith("torch==")]
    assert pins == ["torch==2.13.0"]


WITHOUT_TORCH_AND_RAY = r'''
import importlib.abc, sys, tempfile
from pathlib import Path

class NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "ray"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, NotInstalled())

from fastapi.testclient import TestClient
from coordinator.app import create_app
from coordinator.settings import Settings

spec = {"name": "demo", "model": "mlp", "dataset": "synthetic", "steps": 40, "batch_size": 32, "workers": 2}
with tempfile.TemporaryDirectory() as data_dir:
    app = create_app(Settings(data_dir=Path(data_dir), host="127.0.0.1", launcher="ray"))
    with TestClient(app) as client:
        health = client.get("/healthz")
        print("health", health.status_code, health.json()["ray"])
        internal = client.post("/v1/jobs", json=spec)
        print("internal", internal.status_code, internal.text)
        external = client.post("/v1/jobs", json={**spec, "model": "train:Net", "dataset": "external",
                                                 "external": True})
        print("external", external.status_code)
print("loaded", sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "ray")))
'''


def test_a_coordinator_without_torch_and_ray_serves_and_refuses_internal_jobs_clearly():
    done = subprocess.run([sys.executable, "-c", WITHOUT_TORCH_AND_RAY], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = dict(line.split(" ", 1) for line in done.stdout.splitlines() if " " in line)
    assert lines["health"] == "200 unavailable: ray and torch not installed", done.stdout
    assert lines["internal"].startswith("422 "), done.stdout
    assert "this coordinator cannot run jobs: ray and torch not installed" in lines["internal"]
    assert "gradwire[workers]" in lines["internal"]
    assert lines["external"] == "201", done.stdout
    assert lines["loaded"] == "[]", done.stdout
