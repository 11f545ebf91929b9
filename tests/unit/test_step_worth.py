"""``python -m benchmarks.step_worth``: what a fixed choice's step is worth in uncompressed steps."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
from support.kept_runs import job, keep_run

from benchmarks.step_worth import LEFT_OUT, efficiency, kept_seeds, main, run_worth, step_reaching

STEPS = list(range(15, 301, 15))


def uncompressed_loss(step: float) -> float:
    """A held-out curve like the benchmark's: a power law with a bend (quadratic in log-log)."""
    x = math.log(step)
    return math.exp(1.6 - 0.55 * x + 0.01 * x * x)


def curve(worth: float, wobble: float = 0.0) -> list[tuple[int, float]]:
    """A run that at step s reaches what the uncompressed run reaches at ``worth · s``, with its
    evaluations scattered by ``wobble`` (alternating signs)."""
    return [(s, uncompressed_loss(worth * s) * (1 + wobble * (-1) ** i)) for i, s in enumerate(STEPS)]


def test_a_run_along_the_uncompressed_curve_at_a_share_of_its_steps_is_worth_that_share() -> None:
    uncompressed = [curve(1.0, 0.004), curve(1.0, -0.003), curve(1.0, 0.0)]
    for worth in (0.7, 0.85, 1.0, 1.25):
        assert run_worth(uncompressed, curve(worth), from_step=150) == pytest.approx(worth, rel=0.02)


def test_a_run_below_anything_the_curve_reaches_is_not_placed() -> None:
    uncompressed = [curve(1.0), curve(1.0, 0.002), curve(1.0, -0.002)]
    far_ahead = [(s, 0.01) for s in STEPS]
    assert run_worth(uncompressed, far_ahead, from_step=150) is None
    assert run_worth(uncompressed, curve(0.8), from_step=400) is None  # no evaluation from that step


def test_only_the_falling_part_of_the_fitted_curve_counts() -> None:
    """A quadratic in log-log turns up past its minimum (here at step e^5 ≈ 148): a loss below
    the minimum is not reached, one above it is reached where the curve first falls to it."""
    fit = np.array([0.1, -1.0, 3.0])  # log loss = 0.1 x² − x + 3, least at x = 5
    lowest = math.exp(np.polyval(fit, 5.0))
    assert step_reaching(fit, 0.99 * lowest, 10, 1000) is None
    reached = step_reaching(fit, 1.2 * lowest, 10, 1000)
    assert reached is not None and reached < math.exp(5.0)
    assert math.exp(np.polyval(fit, math.log(reached))) == pytest.approx(1.2 * lowest, rel=1e-3)


def test_a_runs_efficiency_is_the_median_of_its_reports_from_step_100(tmp_path: Path) -> None:
    telemetry = tmp_path / "telemetry.jsonl"
    reports = [{"step": 50, "update_efficiency": 0.1}, {"step": 100, "update_efficiency": 0.7},
               {"step": 150, "update_efficiency": None}, {"step": 200, "update_efficiency": 0.8},
               {"step": 250, "update_efficiency": 0.9}]
    telemetry.write_text("".join(json.dumps(r) + "\n" for r in reports))
    assert efficiency(telemetry) == pytest.approx(0.8)
    telemetry.write_text(json.dumps({"step": 120}) + "\n")
    assert efficiency(telemetry) is None


def test_kept_runs_are_evaluated_and_each_choice_and_reference_is_placed(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Kept as the adaptive benchmark keeps them (checkpoints of the CNN, a configuration, a
    report stream): a fixed choice whose run is ``none``'s own checkpoints, copied, is worth one
    uncompressed step within the references' own scatter; every reference is judged against
    the others."""
    keep = tmp_path / "keep"
    cfg = job(seed=2)
    none = keep / "steady-slow" / "seed2-repeat0" / "none-0"
    none.mkdir(parents=True)
    keep_run(none, cfg, 0.0)
    shutil.copytree(none, keep / "steady-slow" / "seed2-repeat0" / "fp16-0")
    for order in range(3):
        reference = keep / "reference" / "150steps" / f"seed2-order{order}" / "none-0"
        reference.mkdir(parents=True)
        keep_run(reference, cfg, 0.01 * (order + 1))
    out = tmp_path / "worth.json"
    assert main([str(keep), "--samples", "64", "--from-step", "105", "--json-out", str(out)]) == 0
    doc = json.loads(out.read_text())
    rows = {row["label"]: row for row in doc["rows"]}
    assert set(rows) == {"fp16", LEFT_OUT} and doc["seeds"] == [2]
    assert rows[LEFT_OUT]["placed"] == 3 and rows["fp16"]["placed"] == 1
    spread = [w for label, w in doc["by_seed"]["2"].items() if label.startswith(LEFT_OUT)]
    assert all(w is not None and w > 0 for w in spread)
    low, high = min(spread + [1.0]), max(spread + [1.0])
    assert low - 0.05 <= rows["fp16"]["worth_median"] <= high + 0.05
    assert "| fp16 |" in out.with_suffix(".md").read_text()


def test_a_directory_without_kept_runs_is_refused_with_a_message(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(tmp_path)]) == 2
    assert "no kept runs of scenario 'steady-slow'" in capsys.readouterr().err
    (tmp_path / "steady-slow").mkdir()
    assert main([str(tmp_path)]) == 2
    assert "no seed with a kept none run" in capsys.readouterr().err


def test_of_a_run_repeated_the_latest_attempt_is_judged_and_the_adaptive_run_left_out(tmp_path: Path) -> None:
    seed_dir = tmp_path / "steady-slow" / "seed5-repeat0"
    for name in ("none-0", "fp16-2", "fp16-10", "adaptive-0", "fp16-notes"):
        (seed_dir / name / "checkpoints").mkdir(parents=True)
    reference = tmp_path / "reference" / "300steps" / "seed5-order1" / "none-0"
    reference.mkdir(parents=True)
    assert kept_seeds(tmp_path, "steady-slow") == {5: {"none": seed_dir / "none-0", "fp16": seed_dir / "fp16-10",
                                                       "reference-1": reference}}
