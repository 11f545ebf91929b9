"""Per-step traces of every rank (``workers.step_trace``) and their side-by-side summary
(``benchmarks.step_trace``), on traces written by the trace writer itself."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.step_trace import load, main, run_figures, runs, summary, window_seconds
from compressors.records import StepRecord
from workers.step_trace import TRACE_ENV, StepTrace


def write_run(folder: Path, pid: int, job: dict, start: float, *, step_s: float, after_s: float, lag_s: float,
              steps: int = 10) -> None:
    """Two ranks of one run: rank 0 spends ``after_s`` after each step; rank 1 starts ``lag_s`` later."""
    for rank in (0, 1):
        trace = StepTrace(folder / f"rank{rank}-{pid + rank}.jsonl", job)
        for step in range(steps):
            started = start + step * step_s + (lag_s if rank else 0.0)
            around = {"agree": 0.001, "train": step_s - 0.002 - (after_s if rank == 0 else 0.0),
                      "after": after_s if rank == 0 else 0.0, "checkpoint": 0.001}
            trace.step(step, started, around, {"forward": 0.004, "backward": 0.005},
                       StepRecord(compressor=job["compressor"], bytes_sent=100))
        trace.close()


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    fixed = {"name": "j", "mode": "fixed", "compressor": "powersgd-r4", "seed": 0}
    adaptive = {"name": "j", "mode": "adaptive", "compressor": "bf16", "seed": 0}
    write_run(tmp_path, 100, fixed, 1000.0, step_s=0.030, after_s=0.0, lag_s=0.0)
    write_run(tmp_path, 200, adaptive, 2000.0, step_s=0.032, after_s=0.002, lag_s=-0.0015)
    write_run(tmp_path, 300, fixed, 3000.0, step_s=0.034, after_s=0.0, lag_s=0.0)
    return tmp_path


def test_each_rank0_trace_is_paired_with_the_peer_of_its_run(folder: Path):
    traces = load(folder)
    assert len(traces) == 6
    paired = runs(traces)
    assert sorted((run[0].label, run[0].first_start, run[1].first_start) for run in paired) == [
        ("adaptive", 2000.0, 2000.0 - 0.0015), ("powersgd-r4", 1000.0, 1000.0), ("powersgd-r4", 3000.0, 3000.0)]


def test_figures_are_the_runs_means_in_milliseconds(folder: Path):
    adaptive = next(run for run in runs(load(folder)) if run[0].label == "adaptive")
    figures = run_figures(adaptive, 2, 9)
    assert figures["wall"] == pytest.approx(32.0)
    assert figures["r0 after"] == pytest.approx(2.0) and figures["r1 after"] == 0.0
    assert figures["r1 lag"] == pytest.approx(-1.5)  # rank 0 is the late one
    assert figures["r0 forward"] == pytest.approx(4.0)
    assert window_seconds(adaptive[0], [0, 5, 9, 20]) == [pytest.approx(0.160), pytest.approx(0.128), None]
    # the step count as the last edge: to the end of the last step (its start plus the work around it)
    assert window_seconds(adaptive[0], [5, 10]) == [pytest.approx(0.160)]


def test_the_summary_takes_the_median_over_a_labels_runs(folder: Path):
    table = summary(load(folder), 0, 10, [0, 5, 10])
    assert "runs: adaptive 1, powersgd-r4 2" in table
    assert "| wall | 32.000 | 32.000 |" in table  # the fixed runs' 30 and 34 ms: median 32
    assert "| r0 after | 2.000 | 0.000 |" in table
    assert "| powersgd-r4 | 0.160 | 0.160 |" in table  # step 10: the end of the last step
    assert "| powersgd-r4 | 0.160 | - |" in summary(load(folder), 0, 10, [0, 5, 11])  # step 11 is beyond it


def test_bad_input_gets_a_message_not_a_traceback(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    assert main([str(tmp_path)]) == 2
    assert "no step traces" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([str(tmp_path), "--steps", "fifty"])


def test_the_trace_is_off_unless_the_environment_names_a_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv(TRACE_ENV, raising=False)
    off = StepTrace.from_env(0, {"mode": "fixed"})
    assert not off.enabled
    off.step(0, 0.0, {"train": 0.1}, {}, None)  # writes nothing, raises nothing
    monkeypatch.setenv(TRACE_ENV, str(tmp_path / "traces"))
    on = StepTrace.from_env(1, {"mode": "fixed"})
    assert on.enabled and on.path is not None and on.path.parent == tmp_path / "traces" and on.path.name.startswith("rank1-")
    with pytest.raises(ValueError, match="around"):
        on.step(0, 0.0, {"lunch": 0.1}, {}, None)
    on.close()
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv(TRACE_ENV, str(tmp_path / "a-file" / "traces"))
    with pytest.raises(ValueError, match=f"{TRACE_ENV}: cannot write step traces"):
        StepTrace.from_env(0, {"mode": "fixed"})
