"""The benchmarks' command lines build valid jobs (no run): a flag missing from one benchmark
that shares another's job builder fails here, not after minutes of measuring."""

from __future__ import annotations

from benchmarks import adaptive, calibration


def test_the_calibration_defaults_build_a_job_that_probes_once() -> None:
    args = calibration.parse_args([])
    cfg = adaptive.train_config(args, calibration.pinned_compression("acpsgd-r4")[0], steps=10)
    assert cfg.probing.interval_s == 86_400.0 and cfg.probing.budget == 0.02
    assert cfg.compression.compressor == "acpsgd" and cfg.compression.compressor_rank == 4


def test_the_adaptive_defaults_build_a_job_with_the_scaled_policy_settings() -> None:
    args = adaptive.parse_args([])
    cfg = adaptive.train_config(args, adaptive.compression_of(adaptive.ADAPTIVE, args), steps=10)
    assert cfg.probing.budget == 0.05 and cfg.probing.interval_s == 2.0
    # The policy's DEFAULT bounds (issue 14: no per-model tuning), only the dwell scaled.
    assert (cfg.compression.min_dwell_s, cfg.compression.min_rank, cfg.compression.max_rank) == (2.0, 1, 64)
    assert cfg.compression.allowed is None or len(cfg.compression.allowed) == 7


def test_every_adaptive_scenario_has_an_evaluation_at_90_percent_of_its_steps() -> None:
    assert set(adaptive.parse_args([]).scenarios) == set(adaptive.SCENARIOS)
    assert list(adaptive.parse_args(["--quick"]).scenarios) == ["fast-slow-fast"]
    runs = {"none": {"eval": [[15 * i, float(i), 2.0 - 0.01 * i] for i in range(1, 21)]}}
    phases = adaptive.parse_schedule(adaptive.SCENARIOS["fast-slow-fast"])
    assert adaptive.target_of(runs, phases) == 2.0 - 0.01 * 18
    assert adaptive.time_to_target(runs["none"]["eval"], 1.85) == 15.0
    assert adaptive.time_to_target(runs["none"]["eval"], 1.0) is None
