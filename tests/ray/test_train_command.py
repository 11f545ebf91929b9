"""``gradwire train``: one job on the session's Ray cluster (live progress through the named
actor), the same without Ray, and a bad field as a clean CLI error.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from coordinator.cli import app
from planning.protocol import ALL_PHASES
from workers.checkpoint import read_meta

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "mlp-digits.yaml"
SUMMARY_FIELDS = {"steps", "final_loss", "samples_per_second", "phase_seconds", "bytes_sent_per_step",
                  "compressor", "compressor_rank", "world_size", "switches"}
runner = CliRunner()


def check_summary(path: Path, *, steps: int, compressor: str, compressor_rank: int | None) -> dict:
    summary = json.loads(path.read_text())
    assert SUMMARY_FIELDS <= set(summary)
    assert summary["steps"] == steps and summary["world_size"] == 2
    assert (summary["compressor"], summary["compressor_rank"]) == (compressor, compressor_rank)
    assert set(summary["phase_seconds"]) == set(ALL_PHASES)
    assert 0.5 < summary["eval_accuracy"] <= 1.0  # digits: the example learns within a few dozen steps
    return summary


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_train_on_ray_shows_progress_and_writes_the_summary(ray_session, tmp_path, monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", ray_session)
    out = tmp_path / "summary.json"
    result = runner.invoke(app, [
        "train", str(EXAMPLE), "--steps", "40", "--compressor", "powersgd", "--rank", "2",
        "--checkpoint-every", "10", "--set", "checkpoints.keep=3", "--set", "report_interval_s=0.05",
        "--storage-path", str(tmp_path / "runs"), "--summary", str(out)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    summary = check_summary(out, steps=40, compressor="powersgd", compressor_rank=2)
    latest = Path(summary["checkpoint_path"])
    assert latest.is_dir()
    # checkpoints at steps 10, 20, 30 and 40; `checkpoints.keep` 3 keeps the latest three
    kept = sorted(int(read_meta(d)["step"]) for d in latest.parent.glob("checkpoint_*") if d.is_dir())
    assert kept == [20, 30, 40]

    bar = next(line for line in result.output.splitlines() if "40/40" in line)
    assert "powersgd r2" in bar and "loss –" not in bar  # the live bar was fed by rank 0's reports
    for text in ("held-out accuracy", "samples/s", f"summary written to {out}", *ALL_PHASES):
        assert text in result.output

    import ray
    from ray._private import state

    assert ray.is_initialized()  # an existing connection is used and left alone
    job = ray.get_runtime_context().get_job_id()
    leftover = [a for a in state.actors().values() if a["JobID"] == job and a["State"] == "ALIVE"
                and a["Name"].startswith("gradwire-train-progress-")]
    assert leftover == []  # the progress actor is removed at the end


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_train_without_ray_runs_the_adaptive_policy_in_process(tmp_path):
    out = tmp_path / "summary.json"
    result = subprocess.run(
        [sys.executable, "-m", "coordinator.cli", "train", str(EXAMPLE), "--no-ray", "--steps", "30",
         "--mode", "adaptive", "--set", "report_interval_s=0.05", "--set", f"checkpoint_dir={tmp_path / 'ckpt'}",
         "--summary", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stdout + result.stderr
    summary = json.loads(out.read_text())
    check_summary(out, steps=30, compressor=summary["compressor"], compressor_rank=summary["compressor_rank"])
    assert summary["policy_decisions"] >= 1 and summary["policy_reason"]
    assert summary["checkpoint_path"].startswith(str(tmp_path / "ckpt"))
    assert "30/30" in result.stdout and "policy" in result.stdout


@pytest.mark.parametrize(("args", "field"), [
    (["--rank", "0"], "compression.compressor_rank"),
    (["--compressor-rank", "0"], "compression.compressor_rank"),
    (["--compressor", "gzip"], "compression.compressor"),
    (["--workers", "3..1"], "workers"),
    (["--mode", "sometimes"], "compression.mode"),
    (["--batch-size", "0"], "data.batch_size"),
    (["--set", "probe_budget=2"], "probing.budget"),
    (["--set", "data.batch_size=0"], "data.batch_size"),
    (["--set", "compression=5"], "compression"),
    (["--set", "colour=blue"], "colour"),
    (["--steps", "10", "--epochs", "2"], "steps or epochs"),
])
def test_a_bad_field_is_a_cli_error_naming_it(tmp_path, args, field):
    result = runner.invoke(app, ["train", str(EXAMPLE), *args])
    assert result.exit_code == 2, result.output
    assert "invalid spec" in result.output and field in result.output
    assert "Traceback" not in result.output and isinstance(result.exception, SystemExit)


def test_flags_land_in_the_sections_of_a_flat_or_a_sectioned_spec():
    """A flat spec (the form before sections) and the example's sectioned one take the same
    flags to the same TrainConfig: flags and flat ``--set`` names land in their sections."""
    import yaml

    from coordinator.train_cmd import apply_overrides, build_config

    sectioned = yaml.safe_load(EXAMPLE.read_text())
    flat = {"name": "mlp-digits", "model": "mlp", "dataset": "digits", "steps": 200, "batch_size": 32, "lr": 0.05,
            "workers": 2, "checkpoint_every": 100, "report_interval_s": 0.5,
            "compression": {"mode": "fixed", "compressor": "acpsgd", "rank": 4}}
    flags = ({"batch_size": 16, "model": "cnn"}, {"compressor_rank": 8}, ["probe_budget=0.05", "optimizer.lr=0.1"])
    configs = [build_config(apply_overrides(spec, *flags)) for spec in (sectioned, flat)]
    assert configs[0] == configs[1]
    config = configs[0]
    assert (config.model.name, config.data.batch_size, config.data.dataset) == ("cnn", 16, "digits")
    assert (config.compression.compressor_rank, config.probing.budget, config.optimizer.lr) == (8, 0.05, 0.1)
    assert (config.checkpoints.every, config.probing.report_interval_s) == (100, 0.5)


def test_a_missing_or_malformed_spec_is_a_cli_error(tmp_path):
    missing = runner.invoke(app, ["train", str(tmp_path / "nope.yaml")])
    assert missing.exit_code == 2 and "cannot read" in missing.output
    broken = tmp_path / "broken.yaml"
    broken.write_text("model: [mlp\n")
    parsed = runner.invoke(app, ["train", str(broken)])
    assert parsed.exit_code == 2 and "cannot parse" in parsed.output
    listing = tmp_path / "list.yaml"
    listing.write_text("- mlp\n")
    assert runner.invoke(app, ["train", str(listing)]).exit_code == 2
