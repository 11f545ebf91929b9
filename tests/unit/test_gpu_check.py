"""benchmarks.gpu_check, the prepared GPU run, on the CPU: the same code path, small inputs.

GPU machines are lent to few sessions, for minutes; this keeps the script working between
them. Real model, real DDP hooks on a one-process gloo group, a few steps (seconds).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from benchmarks import gpu_check
from planning.protocol import ALL_PHASES
from planning.spec import make_spec
from planning.wire import wire_bytes
from workers.models import default_num_classes, parameter_shapes


def test_a_cpu_run_times_every_phase_and_sends_each_compressors_bytes(tmp_path: Path) -> None:
    out = tmp_path / "gpu_check.json"
    assert gpu_check.main(["--device", "cpu", "--models", "resnet50", "--compressors", "none", "acpsgd",
                           "--batch", "2", "--image-size", "32", "--warmup", "1", "--steps", "1",
                           "--codec-workloads", "--quality-models", "--json-out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["device_name"].startswith("CPU") and doc["quality"] == []
    assert [row["compressor"] for row in doc["steps"]] == ["none", "acpsgd-r4"]
    shapes = parameter_shapes("resnet50", num_classes=default_num_classes("resnet50"), image_size=32)
    for row, spec in zip(doc["steps"], (make_spec("none"), make_spec("acpsgd", rank=4))):
        assert set(row["phase_s"]) == set(ALL_PHASES)
        assert row["phase_s"]["forward"] > 0 and row["phase_s"]["backward"] > 0
        assert row["step_s"] >= row["phase_s"]["forward"] + row["phase_s"]["backward"]
        # Two steps: ACP-SGD's P step and Q step, whose mean the formula gives.
        assert row["bytes_per_step"] == pytest.approx(wire_bytes(spec, shapes, 1))
    assert doc["steps"][0]["bytes_per_step"] == 4 * sum(math.prod(s) for s in shapes)  # fp32, all of it
    assert "| resnet50 | acpsgd-r4 |" in out.with_suffix(".md").read_text()


def test_cuda_without_a_gpu_is_a_clear_cli_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the error path does not apply")
    with pytest.raises(SystemExit) as exit_info:
        gpu_check.main(["--device", "cuda", "--json-out", str(tmp_path / "x.json")])
    assert exit_info.value.code == 2
    assert "no CUDA device here" in capsys.readouterr().err


def test_a_compressor_that_fails_is_recorded_and_the_others_rows_are_kept(tmp_path: Path, monkeypatch) -> None:
    real = gpu_check.step_breakdown

    def breaks_on_acpsgd(model_name, compressor, device, **kwargs):
        if compressor == "acpsgd":
            raise RuntimeError("injected: out of memory")
        return real(model_name, compressor, device, **kwargs)

    monkeypatch.setattr(gpu_check, "step_breakdown", breaks_on_acpsgd)
    out = tmp_path / "gpu_check.json"
    assert gpu_check.main(["--device", "cpu", "--models", "resnet50", "--compressors", "acpsgd", "none",
                           "--batch", "2", "--image-size", "32", "--warmup", "1", "--steps", "1",
                           "--codec-workloads", "--quality-models", "--json-out", str(out)]) == 1
    doc = json.loads(out.read_text())
    assert [row["compressor"] for row in doc["steps"]] == ["none"]
    [failure] = doc["failed"]
    assert (failure["model"], failure["compressor"], failure["error"]) == (
        "resnet50", "acpsgd", "RuntimeError: injected: out of memory")
    assert "in breaks_on_acpsgd" in failure["traceback"]  # where it failed, for a run nobody watched
    assert not list(tmp_path.glob("*.partial"))  # each save replaced the file whole
    assert "FAILED: resnet50 with acpsgd" in out.with_suffix(".md").read_text()


def test_the_quality_signal_runs_in_the_step_and_one_estimate_covers_every_default_candidate(tmp_path: Path) -> None:
    from planning.policy import PolicyConfig

    out = tmp_path / "gpu_check.json"
    assert gpu_check.main(["--device", "cpu", "--models", "resnet50", "--compressors", "none",
                           "--batch", "2", "--image-size", "32", "--warmup", "1", "--steps", "2",
                           "--codec-workloads", "--quality-models", "resnet50", "--json-out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert [row["compressor"] for row in doc["quality"]] == ["none", "acpsgd-r4"]
    cfg = PolicyConfig()
    for row in doc["quality"]:
        assert row["meter_s_per_step"] > 0 and row["estimate_s"] > 0
        assert 0 < row["estimate_sample_elements"] <= 1_000_000  # the meter's sample, largest matrices first
        assert row["estimate_candidates"] == len(cfg.candidates())
    assert "| resnet50 | acpsgd-r4 |" in out.with_suffix(".md").read_text().split("quality signal")[1]
