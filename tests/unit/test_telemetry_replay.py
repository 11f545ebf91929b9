"""``python -m benchmarks.telemetry_replay``: kept runs' reports through the controller, open loop."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.telemetry_replay import kept_runs, main, replay_run
from planning.protocol import ModelProfile, Telemetry
from planning.sections import CompressionConfig

PROFILE = ModelProfile(shapes=[[1024, 1024], [1024]], forward_s=0.002, backward_s=0.004)
PHASES = {"data": 0.001, "forward": 0.002, "backward": 0.006, "exposed_comm": 0.001, "optimizer": 0.0}
FAST, SLOW = 40e9 / 8, 0.1e9 / 8  # bytes/s: the 4 MB model is best uncompressed / compressed


def keep_run(run_dir: Path, bandwidths: list[float]) -> Path:
    """A kept run as the benchmark writes it: its job configuration and one report a second."""
    run_dir.mkdir(parents=True)
    compression = CompressionConfig(mode="adaptive", compressor="none", min_dwell_s=2.0)
    (run_dir / "config.json").write_text(json.dumps({"compression": compression.model_dump()}))
    reports = [Telemetry(step=10 * (i + 1), bandwidth_bytes_per_second=b, latency_seconds=1e-4, phase_seconds=PHASES,
                         timed_steps=min(50, 10 * (i + 1)), step_wall_seconds=0.008, world_size=2, grad_norm=1.0,
                         compressor="none",
                         wall_time=1000.0 + i, profile=PROFILE if i == 0 else None)
               for i, b in enumerate(bandwidths)]
    (run_dir / "telemetry.jsonl").write_text("".join(r.model_dump_json() + "\n" for r in reports))
    return run_dir


def test_a_kept_run_whose_link_drops_replays_a_switch_to_compression(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    run = keep_run(tmp_path / "fast-slow" / "seed0-repeat0" / "adaptive-0", [FAST] * 12 + [SLOW] * 8)
    keep_run(tmp_path / "fast-slow" / "seed0-repeat0" / "none-0", [FAST] * 3)
    assert kept_runs(tmp_path, "adaptive") == [run]
    replay = replay_run(run)
    assert replay.reports == 20 and replay.ran == [(10, "none")]
    moves = [(step, label) for _, step, label, _ in replay.switches]
    assert moves and moves[-1][0] > 120 and moves[-1][1].split("-")[0] in ("acpsgd", "powersgd", "topk", "signsgd")
    assert set(replay.corrections) == {"none"}  # the running choice's measured step, against the model's
    # the controller's own time: some per report, all of it within the reports' 19 s
    assert replay.run_s == 19.0 and 0 < replay.policy_ms_median and 0 < replay.policy_s < replay.run_s
    assert main([str(tmp_path), "--json-out", str(tmp_path / "replay.json")]) == 0
    out = capsys.readouterr().out
    assert "fast-slow/seed0-repeat0/adaptive-0: 20 reports" in out and "switches:" in out
    assert "ms a report (median)" in out and "of the run's 19.0 s" in out
    assert json.loads((tmp_path / "replay.json").read_text())[0]["reports"] == 20


def test_no_kept_run_or_a_broken_one_is_a_message_not_a_traceback(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(tmp_path)]) == 2
    assert "no kept adaptive runs" in capsys.readouterr().err
    run = keep_run(tmp_path / "s" / "seed0-repeat0" / "adaptive-0", [FAST])
    (run / "telemetry.jsonl").write_text('{"step": -1}\n')
    assert main([str(tmp_path)]) == 2
    assert "cannot replay" in capsys.readouterr().err
