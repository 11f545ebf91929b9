"""The paper-scale replay's simulation loop (no torch: errors given, a small profile)."""

from __future__ import annotations

import pytest

from benchmarks import adaptive_replay as replay
from planning.costmodel import ElementCost, StepProfile, candidates
from planning.policy import PolicyConfig
from planning.spec import make_spec

SHAPES = [(1024, 1024), (1024,)] * 4 + [(1000, 1024), (1000,)]
PROFILE = StepProfile.build(SHAPES, forward_s=0.03, backward_s=0.06, optimizer_s=0.004,
                            default_codec=ElementCost(per_element_s=2e-10, fixed_s=50e-6))
CFG = PolicyConfig(allowed=replay.ALLOWED)


def errors() -> dict[str, float]:
    out = {}
    for spec in candidates(CFG.allowed):
        out[spec.label] = (0.0 if spec.name == "none" else (1 + spec.rank / 4) ** -0.5 if spec.rank
                           else 0.9 if spec.name == "topk" else 0.8)
    return out


def test_trace_parsing_and_rates():
    trace = replay.parse_trace("25:10,1:5")
    assert [replay.rate_at(trace, t) for t in (0, 9.9, 10, 14.9, 15, 100)] == [25, 25, 1, 1, 1, 1]  # the last rate holds
    with pytest.raises(ValueError, match="^trace"):
        replay.parse_trace("25:0")


def test_the_policy_compresses_only_on_the_slow_stretch_and_beats_every_fixed_choice_there():
    trace = replay.parse_trace("25:120,1:120,25:120")
    e = errors()
    sim = replay.Replay(PROFILE, 32, trace, e, e)
    target = 0.9 * sim.steps_through_trace(make_spec("none"))
    fixed = {s.label: sim.run(target, s)["time_to_target_s"] for s in candidates(CFG.allowed)}
    adaptive = sim.run(target, None, CFG)
    slow = [s for s in adaptive["switches"] if s["gbit"] == 1]
    fast = [s for s in adaptive["switches"] if s["gbit"] == 25]
    assert slow and slow[0]["to"] != "none"  # compresses on the slow stretch
    assert fast and fast[-1]["to"] == "none"  # and turns compression off when the link is fast again
    assert adaptive["time_to_target_s"] < min(fixed.values())
    bound = sim.clairvoyant(target, candidates(CFG.allowed))
    assert bound["time_to_target_s"] <= adaptive["time_to_target_s"]  # no policy beats it
    assert [s["to"] == "none" for s in bound["switches"]] == [True, False, True]  # the best of each stretch
    assert [s["gbit"] for s in bound["switches"]] == [25, 1, 25]


def test_the_running_error_by_exponent_and_a_choice_that_loses_everything():
    e = {"none": 0.0, "acpsgd-r4": 0.25, "topk-0.01": 0.9, "signsgd": 0.8}
    by_exponent = replay.running_errors(e, 1.0, 0.5)
    assert by_exponent == {"none": 0.0, "acpsgd-r4": 0.5, "topk-0.01": 0.9, "signsgd": 0.8}  # only low rank moves
    assert replay.running_errors(e, 2.0, None) == {"none": 0.0, "acpsgd-r4": 0.5, "topk-0.01": 1.0, "signsgd": 1.0}
    # A fixed choice whose running error is 1 makes no progress: it never reaches the target.
    trace = replay.parse_trace("25:60")
    lost = {label: 1.0 if label != "none" else 0.0 for label in errors()}
    sim = replay.Replay(PROFILE, 8, trace, lost, lost)
    target = 0.9 * sim.steps_through_trace(make_spec("none"))
    assert sim.run(target, make_spec("signsgd"))["time_to_target_s"] is None
    assert sim.run(target, make_spec("none"))["time_to_target_s"] > 0


def test_one_setting_reports_every_choice_the_policy_and_the_bound_and_the_table_shows_them():
    e = errors()
    sim = replay.Replay(PROFILE, 32, replay.parse_trace("25:60,1:60"), e, e)
    row = replay.replay_one(sim, candidates(CFG.allowed), CFG)
    fixed = row["fixed_time_to_target_s"]
    assert set(fixed) == {s.label for s in candidates(CFG.allowed)} and fixed[row["best_fixed"]] == min(
        t for t in fixed.values() if t is not None)
    assert row["clairvoyant_over_best_fixed"] <= row["adaptive_over_best_fixed"]
    assert row["clairvoyant_over_best_fixed"] == pytest.approx(
        row["clairvoyant"]["time_to_target_s"] / fixed[row["best_fixed"]], abs=1e-3)
    doc = {"running_over_estimate": 1.0, "running_exponent": None, "runs": {"25:60,1:60": {"toy": {"32": row}}}}
    table = replay.markdown(doc)
    assert "trace `25:60,1:60`" in table and f"| toy | 32 | {row['adaptive']['time_to_target_s']:.0f} |" in table
    assert f"| {row['clairvoyant_over_best_fixed']:.3f} |" in table


def gpu_check_doc() -> dict:
    """The shape of ``benchmarks.gpu_check``'s JSON, with round numbers."""
    phases = {"data": 0.1, "forward": 0.014, "backward": 0.026, "exposed_comm": 0.002, "optimizer": 0.0001}
    codecs = {"resnet50": {"none": {"encode_decode_s": 0.0035}, "fp16": {"encode_decode_s": 0.0034},
                           "acpsgd": {"encode_decode_s": 0.023}}}
    return {"device_name": "NVIDIA H200", "codecs": codecs,
            "steps": [{"model": "resnet50", "compressor": "none", "batch": 64, "phase_s": phases},
                      {"model": "resnet50", "compressor": "fp16", "batch": 64, "phase_s": {**phases, "forward": 1.0}}]}


def test_measured_costs_take_the_uncompressed_steps_compute_and_the_gpus_own_codec_times():
    costs = replay.measured_costs("resnet50", gpu_check_doc())
    # backward less the wait at its end for the one-process all-reduce; the fp16 row is not read
    assert (costs.forward_s, costs.backward_s, costs.optimizer_s) == (0.014, pytest.approx(0.024), 0.0001)
    assert (costs.codec_speedup, costs.codec_fixed_s, costs.rank) == (1.0, 0.0, 4)
    assert costs.source == "measured on NVIDIA H200"
    # Each codec's measured time is what the profile charges one step of it at world size 1 on
    # the shapes it was measured on: per element × work, with no fixed part added.
    from planning.buckets import codec_work

    shapes = [(64, 3, 7, 7), (2048, 1000), (1000,)]
    specs = [make_spec("acpsgd", rank=4), make_spec("fp16")]
    profile = replay.profile_for("resnet50", shapes, None, costs, specs)
    for spec, seconds in zip(specs, (0.023, 0.0034)):
        cost = profile.codec_costs[spec.label]
        assert cost.fixed_s == 0.0 and cost.calibrated
        assert cost.per_element_s * codec_work(spec, shapes, 1) == pytest.approx(seconds)


def test_a_gpu_check_file_that_cannot_serve_is_an_error_naming_the_option_and_file(tmp_path):
    import json

    path = tmp_path / "gpu_check.json"
    for content, says in ((json.dumps(gpu_check_doc()), "bert-base"),  # no measurement of the model
                          ("{not json", "Expecting property name"),
                          ("[1, 2]", "not a GPU check"),
                          (json.dumps({**gpu_check_doc(), "steps": [{"model": "resnet50", "compressor": "none",
                                                                     "batch": 2, "phase_s": {}}]}), "batch 2"),
                          (json.dumps({**gpu_check_doc(), "steps": [{"model": "resnet50", "compressor": "none",
                                                                     "batch": 64, "phase_s": {"forward": 0.1}}]}),
                           "lacks one of the phases")):
        path.write_text(content)
        with pytest.raises(ValueError, match=f"^--gpu-check: {path}: .*{says}"):
            replay.load_gpu_check(path, ["resnet50", "bert-base"])
    with pytest.raises(ValueError, match="^--gpu-check: .*missing.json"):
        replay.load_gpu_check(tmp_path / "missing.json", ["resnet50"])


def test_the_cli_refuses_bad_files_before_any_work_with_a_message(tmp_path, capsys):
    import json

    with pytest.raises(SystemExit) as exit_info:
        replay.main(["--gpu-check", str(tmp_path / "missing.json"), "--models", "resnet50"])
    assert exit_info.value.code == 2 and "--gpu-check" in capsys.readouterr().err
    # An earlier replay without --gpu-check has no errors for the casts the measured costs add.
    gpu = tmp_path / "gpu_check.json"
    gpu.write_text(json.dumps(gpu_check_doc()))
    earlier = tmp_path / "earlier.json"
    earlier.write_text(json.dumps({"models": {"resnet50": {"errors": errors()}}}))
    with pytest.raises(SystemExit) as exit_info:
        replay.main(["--gpu-check", str(gpu), "--models", "resnet50", "--errors-from", str(earlier)])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "--errors-from" in err and "fp16" in err


def test_the_ranks_the_costs_are_applied_at_are_those_the_codecs_were_measured_at():
    from benchmarks.compressor_cost import WORKLOADS

    assert {model: rank for model, (_, rank) in WORKLOADS.items()} == {
        model: int(settings["rank"]) for model, settings in replay.GPU_COMPUTE.items()}
