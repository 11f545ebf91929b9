"""``python -m benchmarks.drop_response``: each drop an adaptive run read, and its answer, from kept files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.adaptive.scenarios import Phase
from benchmarks.drop_response import main, run_response, slow_steps

SCHEDULE = [{"mbit": 1000.0, "steps": 4}, {"mbit": 50.0, "steps": 3}, {"mbit": 1000.0, "steps": 3}]
PHASES = [Phase(p["mbit"], p["steps"]) for p in SCHEDULE]


def keep_run(run_dir: Path, ran: list[str], drops: list[int], reports: list[dict], switches: list[dict]) -> Path:
    """An adaptive run as the benchmark keeps it: summary, reports, rank 0's record in its last checkpoint."""
    checkpoint = run_dir / "checkpoints" / "checkpoint_000002"
    checkpoint.mkdir(parents=True)
    (run_dir / "checkpoints" / "checkpoint_000001").mkdir()
    (checkpoint / "record0.json").write_text(json.dumps(
        {"rank": 0, "step_compressors": {str(step): label for step, label in enumerate(ran)}, "applied": []}))
    (run_dir / "summary.json").write_text(json.dumps({"link_drops_read": drops, "switches": switches}))
    (run_dir / "telemetry.jsonl").write_text("".join(json.dumps(r) + "\n" for r in reports))
    return run_dir


def test_the_slow_steps_are_the_phases_below_the_fastest_rate() -> None:
    assert slow_steps(PHASES) == {4, 5, 6}
    assert slow_steps([Phase(50.0, 3)]) == set()  # one rate: nothing slower


def test_a_drop_is_answered_by_the_report_that_names_it_and_the_switch_after(tmp_path: Path,
                                                                           capsys: pytest.CaptureFixture[str]) -> None:
    ran = ["bf16"] * 5 + ["powersgd-r4"] * 2 + ["fp16"] * 3  # the drop at step 4 paid one uncompressed step
    reports = [{"step": 3, "bandwidth_bytes_per_second": 125e6},
               {"step": 5, "bandwidth_bytes_per_second": 5e6, "link_drop_step": 4},
               {"step": 9, "bandwidth_bytes_per_second": 125e6, "link_drop_step": 4}]
    run = keep_run(tmp_path / "fast-slow-fast" / "seed0-repeat0" / "adaptive-0", ran, [4], reports,
                   [{"step": 5, "to": "powersgd-r4"}, {"step": 7, "to": "fp16"}])
    response = run_response(run, slow_steps(PHASES))
    assert [(d.read_at, d.reading_mbit, d.switched_at, d.switched_to) for d in response.drops] == [(4, 40.0, 5, "powersgd-r4")]
    assert response.steps_by_label == {"bf16": 5, "powersgd-r4": 2, "fp16": 3}
    assert (response.uncompressed_slow_steps, response.slow_steps) == (1, 3)
    result = tmp_path / "result.json"
    result.write_text(json.dumps({"scenarios": {"fast-slow-fast": {"schedule": SCHEDULE}, "steady-fast": {}}}))
    assert main([str(result), str(tmp_path), "--json-out", str(tmp_path / "out.json")]) == 0
    out = capsys.readouterr().out
    assert "read 4 at 40.0 Mbit/s -> powersgd-r4 at 5; uncompressed on 1 of 3 slow steps" in out
    assert json.loads((tmp_path / "out.json").read_text())["fast-slow-fast"][0]["uncompressed_slow_steps"] == 1


def test_a_report_from_before_link_drop_step_stands_in_by_its_step(tmp_path: Path) -> None:
    """Runs kept before session 45 carry no ``link_drop_step``: the first report after the read stands in."""
    run = keep_run(tmp_path / "run", ["none"] * 10, [4], [{"step": 3, "bandwidth_bytes_per_second": 125e6},
                                                          {"step": 6, "bandwidth_bytes_per_second": 10e6}], [])
    (answer,) = run_response(run, slow_steps(PHASES)).drops
    assert (answer.reading_mbit, answer.switched_at, answer.switched_to) == (80.0, None, None)


def test_a_file_that_is_not_a_result_is_a_message_not_a_traceback(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "bad.json").write_text("[]")
    assert main([str(tmp_path / "bad.json"), str(tmp_path)]) == 2
    assert "not a benchmark result file" in capsys.readouterr().err
