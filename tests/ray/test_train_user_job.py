"""``gradwire train examples/spirals-job.yaml``: the example JobSpec of user code runs on the
session's Ray cluster from a driver that did not get the job's runtime_env in ``ray.init``
(this test process), so the runner uploads the user package for its workers itself."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from coordinator.cli import app

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

REPO = Path(__file__).resolve().parents[2]


def test_the_user_code_example_trains_on_ray(ray_session, tmp_path, monkeypatch):
    import sys

    monkeypatch.setenv("RAY_ADDRESS", ray_session)
    monkeypatch.chdir(REPO)  # the spec's py_modules path is relative to the working directory
    assert "gw_example" not in sys.modules
    out = tmp_path / "summary.json"
    result = CliRunner().invoke(app, ["train", "examples/spirals-job.yaml", "--steps", "60", "--mode", "fixed",
                                      "--storage-path", str(tmp_path / "runs"), "--summary", str(out)])
    assert result.exit_code == 0, result.output
    summary = json.loads(out.read_text())
    assert (summary["model"], summary["dataset"]) == ("gw_example.models:make_model", "gw_example.data:spirals")
    assert summary["steps"] == 60 and summary["world_size"] == 2
    assert summary["eval_loss"] > 0 and 0 <= summary["eval_accuracy"] <= 1
    assert "gw_example" not in sys.modules  # imported by the workers only
