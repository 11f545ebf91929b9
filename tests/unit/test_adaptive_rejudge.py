"""``python -m benchmarks.adaptive.rejudge``: kept runs evaluated again on larger held-out sets."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from support.kept_runs import job, keep_run

from benchmarks import adaptive
from benchmarks.adaptive.rejudge import main, none_scatter
from benchmarks.adaptive.results import combine_repeats, eval_points, run_result
from benchmarks.adaptive.scenarios import HELD_OUT_SAMPLES, parse_schedule
from benchmarks.adaptive.targets import judge_by_seed

SCHEDULE = "1000:150"  # 150 steps: an evaluation every 15, the target at step 135
LARGER = 1100  # beyond the synthetic test split's 1024: the split is drawn larger


def kept_scenario(keep: Path, references: int = 0, seeds: tuple[int, ...] = (0,), schedule: str = SCHEDULE) -> dict[str, Any]:
    """Three labels on each of ``seeds``, kept, and the result the benchmark would have written
    of them; with ``references``, that many reference runs of ``none`` a seed kept as the
    benchmark keeps them, whose targets judge the result."""
    phases = parse_schedule(schedule)
    repeats: dict[str, list[dict[str, Any]]] = {}
    kept_references = []
    for seed in seeds:
        cfg = job(seed)
        held_out = adaptive.HeldOut(cfg, HELD_OUT_SAMPLES)
        for label, wobble in (("none", 0.0), ("fp16", 0.01), ("adaptive", 0.02)):
            path = keep / "steady" / f"seed{seed}-repeat0" / f"{label}-0"
            path.mkdir(parents=True)
            run = keep_run(path, cfg, wobble)
            result = {**run_result(run, phases, held_out.curve(path / "checkpoints")), "seed": seed, "foreign_cores": 0.0}
            repeats.setdefault(label, []).append(result)
        for index in range(references):
            path = keep / "reference" / "150steps" / f"seed{seed}-order{index}" / "none-0"
            path.mkdir(parents=True)
            run = keep_run(path, cfg, 0.005 * (index + 1))
            evals = eval_points(run, held_out.curve(path / "checkpoints"))
            kept_references.append({"seed": seed, "eval": evals, "final_eval": evals[-1][2]})
    judge_by_seed(repeats, phases, kept_references)
    runs = {label: combine_repeats(results) for label, results in repeats.items()}
    scenario: dict[str, Any] = {"schedule_text": schedule, "runs": runs}
    if kept_references:
        scenario["target_from"] = "reference none runs"
    return {"scenarios": {"steady": scenario}}


def test_a_larger_held_out_set_keeps_the_benchmarks_samples_first(tmp_path: Path) -> None:
    cfg = job(seed=3)
    run = tmp_path / "run"
    run.mkdir()
    keep_run(run, cfg, 0.05)
    checkpoint = run / "checkpoints" / "checkpoint_000008"
    small, large = adaptive.HeldOut(cfg, 64), adaptive.HeldOut(cfg, LARGER)
    assert large.losses(checkpoint).shape == (LARGER,)
    assert torch.allclose(small.losses(checkpoint), large.losses(checkpoint)[:64], rtol=1e-5)
    assert small(checkpoint) == pytest.approx(float(large.losses(checkpoint)[:64].mean()), rel=1e-6)


def test_kept_runs_are_judged_again_at_each_size_reproducing_the_result_at_the_benchmarks_own(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    keep = tmp_path / "keep"
    result = tmp_path / "result.json"
    result.write_text(json.dumps(kept_scenario(keep)))
    out = tmp_path / "rejudged.json"
    larger_size = HELD_OUT_SAMPLES + 256
    assert main([str(result), str(keep), "--samples", str(HELD_OUT_SAMPLES), str(larger_size), "--json-out", str(out)]) == 0
    doc = json.loads(out.read_text())
    own, larger = doc["scenarios"]["steady"][str(HELD_OUT_SAMPLES)], doc["scenarios"]["steady"][str(larger_size)]
    assert own["reproduces"] is True and "reproduces" not in larger
    for row in (own, larger):
        assert row["ratio_to_best"][row["best_fixed"]] == 1.0 and row["best_fixed"] in ("none", "fp16")
        assert set(row["hit_steps"]) == {"none", "fp16", "adaptive"}
        assert row["hit_steps"]["none"]["0"] is not None and row["hit_steps"]["none"]["0"] <= 135  # its own target
    assert own["hit_steps"] == {label: {"0": entry["hit_step"]} for label, entry in
                                json.loads(result.read_text())["scenarios"]["steady"]["runs"].items()}
    assert "reproduces the result file" in capsys.readouterr().out and out.with_suffix(".md").exists()


def test_kept_reference_runs_judge_each_size_a_second_time(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A result judged against reference runs (as the benchmark judges by default) is reproduced
    by the judgement against the kept references, found under the keep directory; the
    judgement against ``none``'s own targets comes beside it."""
    keep = tmp_path / "keep"
    result = tmp_path / "result.json"
    stored = kept_scenario(keep, references=3)
    stored["scenarios"]["steady-again"] = stored["scenarios"]["steady"]  # a second scenario on the same references
    (keep / "steady-again").symlink_to(keep / "steady")
    result.write_text(json.dumps(stored))
    out = tmp_path / "rejudged.json"
    assert main([str(result), str(keep), "--samples", str(HELD_OUT_SAMPLES), "--json-out", str(out)]) == 0
    assert capsys.readouterr().out.count("[rejudge] reference seed 0") == 3  # evaluated once for both scenarios
    doc = json.loads(out.read_text())
    assert doc["scenarios"]["steady-again"] == doc["scenarios"]["steady"]
    assert doc["references"] == str(keep / "reference")
    row = doc["scenarios"]["steady"][str(HELD_OUT_SAMPLES)]
    against = row["against_reference"]
    assert against["reproduces"] is True and "reproduces" not in row  # on the row of the judgement the file was judged by
    assert against["hit_steps"] == {label: {"0": entry["hit_step"]} for label, entry in stored["scenarios"]["steady"]["runs"].items()}
    assert against["targets_by_seed"] != row["targets_by_seed"]  # the references' median, not none's own value
    assert row["final_vs_none"]["none"] == 0.0 and against["final_vs_none"] == {
        label: entry["final_vs_none"] for label, entry in stored["scenarios"]["steady"]["runs"].items()}
    assert row["hit_steps"]["none"]["0"] is not None and row["hit_steps"]["none"]["0"] <= 135
    assert "against the reference runs' targets" in out.with_suffix(".md").read_text()
    # The finals rule applied to seed 0's four uncompressed runs (the judged none and three references).
    assert against["uncompressed_floor"]["seeds"] == 1 and "uncompressed_floor" not in row
    assert "An uncompressed run by the same finals rule" in out.with_suffix(".md").read_text()
    with pytest.raises(SystemExit):
        main([str(result), str(keep), "--references", str(tmp_path / "absent")])
    assert "--references: no directory" in capsys.readouterr().err


def test_runs_on_other_seeds_are_judged_together_as_if_one_run_had_made_them(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--also``: a second run of the benchmark on other seeds adds its runs and references to
    the first's; the judgement is the one of a single run on all the seeds."""
    files = {}
    for name, seeds in (("first", (0,)), ("second", (1,)), ("both", (0, 1))):
        files[name] = (tmp_path / f"{name}.json", tmp_path / name)
        files[name][0].write_text(json.dumps(kept_scenario(files[name][1], references=1, seeds=seeds)))
    together, single = tmp_path / "together.json", tmp_path / "single.json"
    size = str(HELD_OUT_SAMPLES)
    assert main([*map(str, files["first"]), "--also", *map(str, files["second"]), "--samples", size, "--json-out", str(together)]) == 0
    assert main([*map(str, files["both"]), "--samples", size, "--json-out", str(single)]) == 0
    merged, whole = json.loads(together.read_text()), json.loads(single.read_text())
    assert merged["scenarios"] == whole["scenarios"] and merged["worst_ratio"] == whole["worst_ratio"]
    row = merged["scenarios"]["steady"][size]
    assert set(row["against_reference"]["hit_steps"]["none"]) == {"0", "1"} and row["against_reference"]["reproduces"] is True
    # Each run's time and final kept by seed, and the two seeds drawn again (deterministic: the same in both).
    stored = {seed: json.loads(files[name][0].read_text())["scenarios"]["steady"]["runs"] for seed, name in (("0", "first"), ("1", "second"))}
    assert row["against_reference"]["times_by_seed"] == {
        label: {seed: stored[seed][label]["time_to_target_s"] for seed in ("0", "1")} for label in stored["0"]}
    assert row["against_reference"]["finals_by_seed"] == {
        label: {seed: stored[seed][label]["final_vs_none"] for seed in ("0", "1")} for label in stored["0"]}
    assert row["against_reference"]["seed_draws"]["seeds"] == 2 and set(row["seed_draws"]["ratio"]) == set(stored["0"])
    assert "2 seeds drawn again with replacement" in together.with_suffix(".md").read_text()
    assert merged["also"] == [{"result": str(files["second"][0]), "keep": str(files["second"][1]),
                               "references": str(files["second"][1] / "reference")}]
    assert "Worst ratio over the scenarios, 512 held-out samples, against the reference runs' targets" in together.with_suffix(".md").read_text()
    capsys.readouterr()
    assert main([*map(str, files["first"]), "--also", *map(str, files["both"])]) == 2  # seed 0 twice
    assert "seed 0 is in both" in capsys.readouterr().err
    other = tmp_path / "other.json", tmp_path / "other"
    other[0].write_text(json.dumps(kept_scenario(other[1], seeds=(2,), schedule="1000:75,100:75")))
    assert main([*map(str, files["first"]), "--also", *map(str, other)]) == 2
    assert "ran '1000:75,100:75'" in capsys.readouterr().err
    unreferenced = tmp_path / "unreferenced.json", tmp_path / "unreferenced"
    unreferenced[0].write_text(json.dumps(kept_scenario(unreferenced[1], seeds=(3,))))
    assert main([*map(str, files["first"]), "--also", *map(str, unreferenced)]) == 2
    assert "kept references of seeds [] for" in capsys.readouterr().err  # a judgement on references needs every seed's
    another_job = {**json.loads(files["second"][0].read_text()), "job": {"lr": 0.5}}
    files["second"][0].write_text(json.dumps(another_job))
    assert main([*map(str, files["first"]), "--also", *map(str, files["second"])]) == 2
    err = capsys.readouterr().err
    assert "ran another job than" in err and "differs in lr" in err
    assert main([*map(str, files["first"]), "--scenario", "stormy"]) == 2
    assert "--scenario: stormy not in" in capsys.readouterr().err


def test_the_scatter_is_measured_about_a_quadratic_trend() -> None:
    trend = [[step, 0.0, 2.0 - 0.004 * step + 1e-5 * step ** 2] for step in range(150, 301, 15)]
    assert none_scatter(trend) == pytest.approx(0.0, abs=1e-4)
    wobbly = [[step, wall, loss + (0.02 if i % 2 else -0.02)] for i, (step, wall, loss) in enumerate(trend)]
    assert 0.015 < (none_scatter(wobbly) or 0.0) < 0.03
    assert none_scatter(trend[:3]) is None


def test_a_missing_keep_or_result_is_a_message_not_a_traceback(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(tmp_path / "absent.json"), str(tmp_path)]) == 2
    assert "cannot read" in capsys.readouterr().err
    result = tmp_path / "result.json"
    result.write_text(json.dumps({"scenarios": {"steady": {"schedule_text": SCHEDULE, "runs": {}}}}))
    assert main([str(result), str(tmp_path / "nothing-kept")]) == 2
    assert "no scenario" in capsys.readouterr().err
    (tmp_path / "keep" / "steady").mkdir(parents=True)
    result.write_text(json.dumps({"scenarios": {"steady": {"schedule_text": SCHEDULE, "runs": {
        "none": {"repeats": [{"seed": 0, "total_s": 1.0, "time_to_target_s": 1.0, "switches": 0}]}}}}}))
    assert main([str(result), str(tmp_path / "keep")]) == 2
    assert "no kept run of none" in capsys.readouterr().err
