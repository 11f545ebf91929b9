"""Result files on other seeds judged together from their stored figures
(``benchmarks.adaptive.merge_seeds``): the same verdict the rejudge reached by evaluating every
kept checkpoint again, and a message for files that cannot be judged together."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks.adaptive.merge_seeds import main

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
SESSION_41 = [RESULTS / f"adaptive_s41_s{seeds}.json" for seeds in ("32-35", "36-39", "40-43")]


def test_session_41s_batches_merged_from_their_figures_give_the_rejudged_verdict(tmp_path: Path) -> None:
    """Seeds 32-43 ran in three batches; session 41 judged them together with the rejudge, which
    evaluated all 192 runs' checkpoints again (26 minutes). From the three files' stored figures
    the verdict is the same: best fixed choice, every label's ratio and final vs none, every
    run's hit step, each seed's target, the finals rule on the uncompressed runs."""
    out = tmp_path / "merged.json"
    assert main([*map(str, SESSION_41), "--json-out", str(out)]) == 0
    merged = json.loads(out.read_text())
    rejudged = json.loads((RESULTS / "adaptive_s41_merged.json").read_text())
    for name, scenario in merged["scenarios"].items():
        row = rejudged["scenarios"][name]["512"]["against_reference"]
        verdict = scenario["verdict"]
        assert verdict["best_fixed"] == row["best_fixed"]
        assert verdict["ratio_to_best"] == row["ratio_to_best"]
        assert verdict["final_eval_vs_none"] == row["final_vs_none"]
        assert scenario["uncompressed_floor"] == row["uncompressed_floor"]
        assert {label: {str(r["seed"]): r["hit_step"] for r in entry["repeats"]} for label, entry in scenario["runs"].items()} \
            == row["hit_steps"]
        assert scenario["targets_by_seed"] == {seed: pytest.approx(t, abs=1e-5) for seed, t in row["targets_by_seed"].items()}
        assert verdict["seed_draws"]["seeds"] == 12 and set(verdict["seed_draws"]["final_within"]) == set(row["ratio_to_best"])
        time_floor = scenario["uncompressed_time_floor"]  # the seeds' three reference runs, one against another
        assert time_floor["seeds"] == 12 and time_floor["runs_per_seed"] == [3] and 0.0 < time_floor["within"] < 1.0
    assert merged["acceptance_draws"]["label"] == "adaptive" and merged["acceptance_draws"]["scenarios"] == 4
    assert merged["acceptance_draws"]["both"] <= min(merged["acceptance_draws"]["time"], merged["acceptance_draws"]["finals"])
    assert merged["worst_ratio"] == rejudged["worst_ratio"]["512"]["against_reference"]
    assert "The 12 seeds drawn again" in out.with_suffix(".md").read_text()


def test_one_file_merged_alone_keeps_its_own_verdict(tmp_path: Path) -> None:
    out = tmp_path / "alone.json"
    assert main([str(SESSION_41[0]), "--scenario", "steady-slow", "--json-out", str(out)]) == 0
    alone = json.loads(out.read_text())["scenarios"]
    stored = json.loads(SESSION_41[0].read_text())["scenarios"]["steady-slow"]
    assert list(alone) == ["steady-slow"]
    assert alone["steady-slow"]["verdict"]["ratio_to_best"] == stored["verdict"]["ratio_to_best"]
    assert alone["steady-slow"]["verdict"]["final_eval_vs_none"] == stored["verdict"]["final_eval_vs_none"]


def write(path: Path, doc: dict[str, Any]) -> str:
    path.write_text(json.dumps(doc))
    return str(path)


def test_files_that_cannot_be_judged_together_get_a_message(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    first = json.loads(SESSION_41[0].read_text())
    second = json.loads(SESSION_41[1].read_text())
    cases: list[tuple[dict[str, Any], str]] = [(copy.deepcopy(first), "seed 32 is in both")]
    other_job = copy.deepcopy(second)
    other_job["job"]["lr"] = 0.5
    cases.append((other_job, "ran another job than"))
    other_targets = copy.deepcopy(second)
    other_targets["scenarios"]["steady-fast"]["target_from"] = "the judged none run"
    cases.append((other_targets, "took its targets from 'the judged none run'"))
    other_labels = copy.deepcopy(second)
    del other_labels["scenarios"]["oscillating"]["runs"]["fp16"]
    cases.append((other_labels, "ran ['adaptive', 'none', 'powersgd-r4'],"))
    missing = copy.deepcopy(second)
    del missing["scenarios"]["oscillating"]
    cases.append((missing, "oscillating: not in"))
    no_final = copy.deepcopy(second)
    del no_final["scenarios"]["steady-fast"]["runs"]["fp16"]["repeats"][0]["final_eval"]
    cases.append((no_final, "has no field 'final_eval'"))
    no_none = copy.deepcopy(second)
    for entry in no_none["scenarios"].values():
        entry["runs"]["none"]["repeats"] = [r for r in entry["runs"]["none"]["repeats"] if r["seed"] != 36]
        entry["references"] = [r for r in entry["references"] if r["seed"] != 36]
    cases.append((no_none, "seed 36 of fp16 has no uncompressed run to set its final"))
    not_an_object = copy.deepcopy(second)
    not_an_object["job"] = ["cnn"]
    cases.append((not_an_object, "cannot judge the files together"))
    base = write(tmp_path / "first.json", first)
    out = tmp_path / "merged.json"
    for i, (doc, message) in enumerate(cases):
        assert main([base, write(tmp_path / f"case{i}.json", doc), "--json-out", str(out)]) == 2
        assert message in capsys.readouterr().err and not out.exists()  # nothing half-written
    (tmp_path / "broken.json").write_text("{")
    assert main([base, str(tmp_path / "broken.json"), "--json-out", str(out)]) == 2
    assert "cannot read" in capsys.readouterr().err and not out.exists()
    assert main([base, str(tmp_path / "absent.json")]) == 2
    assert "cannot read" in capsys.readouterr().err
    assert main([write(tmp_path / "empty.json", {"scenarios": {}})]) == 2
    assert "holds no scenario" in capsys.readouterr().err
    assert main([base, "--json-out", str(tmp_path / "first.json" / "merged.json")]) == 2  # under a file
    assert "--json-out: cannot write" in capsys.readouterr().err


def test_files_without_an_adaptive_run_merge_without_the_acceptance_draws(tmp_path: Path) -> None:
    fixed = json.loads(SESSION_41[0].read_text())
    for scenario in fixed["scenarios"].values():
        del scenario["runs"]["adaptive"]
    out = tmp_path / "fixed.json"
    assert main([write(tmp_path / "fixed-only.json", fixed), "--json-out", str(out)]) == 0
    merged = json.loads(out.read_text())
    assert merged["acceptance_draws"] is None and merged["commits"] == {str(tmp_path / "fixed-only.json"): None}
    assert "Commits" not in out.with_suffix(".md").read_text()  # none recorded: nothing to list
    second = json.loads(SESSION_41[1].read_text())
    second["job"]["commit"] = "abc1234"
    assert main([str(SESSION_41[0]), write(tmp_path / "recorded.json", second), "--json-out", str(out)]) == 0
    assert "Commits the files' runs ran on: not recorded (1 file), abc1234 (1 file) (several" in out.with_suffix(".md").read_text()
    assert set(merged["scenarios"]["steady-slow"]["verdict"]["ratio_to_best"]) == {"none", "fp16", "powersgd-r4"}
