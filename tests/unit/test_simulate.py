"""The scale simulator (benchmarks.simulate): its predictions behave as physics says they must.

Fast: shapes come from the meta device, predictions are pure Python.
"""

from __future__ import annotations

import pytest

from benchmarks.simulate import (
    GPU_COMPUTE,
    METHODS,
    NETWORKS,
    Compute,
    bucket_segments,
    codec_share_factor,
    layout_for,
    predict,
    scale_grid,
    speedups,
    validate,
)
from planning.costmodel import CodecCost, Link
from workers.models import parameter_shapes

SHAPES = {model: parameter_shapes(model) for model in GPU_COMPUTE}
# A measured-looking ready profile: the first parameters (last to get gradients) are ready last.
READY = {model: [0.1 * (len(s) - i) / len(s) for i in range(len(s))] for model, s in SHAPES.items()}


@pytest.fixture(scope="module")
def grid() -> list[dict]:
    return scale_grid(SHAPES, READY, cost_json=None)


def _gbit(gbit: float, alpha: float = 20e-6) -> Link:
    return Link(alpha=alpha, beta=8 / (gbit * 1e9))


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("model", sorted(GPU_COMPUTE))
def test_iteration_time_never_grows_with_bandwidth(model: str, method: str) -> None:
    compute = Compute(0.05, 0.1, 0.005)
    times = [predict(method, SHAPES[model], compute, 32, _gbit(g), rank=4).step_s for g in (0.1, 1, 10, 100, 1000)]
    assert all(a >= b - 1e-12 for a, b in zip(times, times[1:])), times
    assert times[0] > times[-1]  # and a slower link really costs something


@pytest.mark.parametrize("method", METHODS)
def test_one_worker_has_no_communication(method: str) -> None:
    compute = Compute(0.05, 0.1, 0.005)
    pred = predict(method, SHAPES["resnet50"], compute, 1, _gbit(1), codec=CodecCost(0.0))
    assert pred.comm_s == 0.0
    assert pred.exposed_comm_s == pytest.approx(0.0, abs=1e-12)
    assert pred.step_s == pytest.approx(compute.forward_s + compute.backward_s + compute.optimizer_s)


def test_speedups_are_positive_and_acpsgd_wins_on_slow_links(grid: list[dict]) -> None:
    s = speedups(grid, workers=32)
    assert {(c["model"], c["network"]) for c in s["cases"]} == {(m, n) for m in GPU_COMPUTE for n in ("1GbE", "10GbE")}
    for case in s["cases"]:
        assert case["over_ssgd"] > 0 and case["over_powersgd"] > 0
        if case["network"] == "1GbE":
            assert case["over_ssgd"] > 1.0  # 1 GbE is communication-bound for S-SGD at 32 workers
    assert s["mean"]["over_ssgd"] > 1.0


def test_grid_covers_every_case_with_finite_positive_times(grid: list[dict]) -> None:
    assert len(grid) == len(GPU_COMPUTE) * len(NETWORKS) * 4 * len(METHODS)
    assert all(0 < r["iter_s"] < 1e4 and r["samples_per_s"] > 0 for r in grid)


def test_more_workers_cost_more_for_allgather_methods(grid: list[dict]) -> None:
    """All-gather bytes grow with N (docs/cost-model.md), all-reduce bytes per worker do not."""
    def time_of(method: str, n: int) -> float:
        return next(r["iter_s"] for r in grid if r["model"] == "bert-base" and r["network"] == "10GbE"
                    and r["workers"] == n and r["method"] == method)

    assert time_of("signsgd", 64) > 2 * time_of("signsgd", 8)
    assert time_of("ssgd", 64) < 1.2 * time_of("ssgd", 8)


def test_pipelining_off_is_never_faster() -> None:
    compute = Compute(0.05, 0.1, 0.005, ready_s=tuple(READY["resnet50"]))
    for method in ("ssgd", "acpsgd", "powersgd"):
        on = predict(method, SHAPES["resnet50"], compute, 8, _gbit(1), codec=CodecCost(0.01))
        off = predict(method, SHAPES["resnet50"], compute, 8, _gbit(1), codec=CodecCost(0.01), pipelining=False)
        assert off.step_s >= on.step_s - 1e-12


def test_bucket_segments_follow_measured_ready_times() -> None:
    layout = ((2, 1), (0,))  # DDP fires the last parameters first
    segments = bucket_segments(layout, ready_s=[0.9, 0.3, 0.2], backward_s=1.8)
    assert segments == pytest.approx((0.6, 1.2))  # ready at 0.3 then 0.9, scaled to 1.8 s
    assert bucket_segments(layout, None, 1.0, pipelining=False) == (1.0, 0.0)
    assert len(layout_for(SHAPES["resnet50"], 1e-6)) == len(SHAPES["resnet50"])  # fusion off


def test_validation_reproduces_a_run_the_model_describes_exactly() -> None:
    """A synthetic 'measurement' equal to the model's own prediction validates with zero error."""
    shapes = [[64, 32], [64], [128, 64]]
    link = Link(alpha=1e-4, beta=8 / 100e6)
    compute = Compute(0.01, 0.02, 0.001)
    truth = predict("acpsgd", shapes, compute, 2, link, rank=4, codec=CodecCost(0.003)).step_s
    paper = {
        "workloads": {"toy": {"shapes": shapes, "rank": 4}},
        "calibration": {"toy/2": {"forward_s": 0.01, "backward_s": 0.02, "optimizer_s": 0.001, "ready_s": None}},
        "results": [{"model": "toy", "method": "acpsgd", "workers": 2, "mbit": 100.0, "bucket_cap_mb": 25.0,
                     "pipelining": True, "rank": 4, "iter_s": truth, "exposed_comm_s": 0.0,
                     "phase_s": {"compress": 0.002, "decompress": 0.001},
                     "link": {"alpha_s": 1e-4, "beta_s_per_byte": 8 / 100e6}}],
    }
    rows = validate(paper)
    assert len(rows) == 1 and rows[0]["error"] == pytest.approx(0.0, abs=1e-9)


def _one_run_paper(workers: int, cpu_cores: int | None, codec_s: float, iter_s: float) -> dict:
    shapes = [[64, 32], [64], [128, 64]]
    return {
        "workloads": {"toy": {"shapes": shapes, "rank": 4}},
        "calibration": {f"toy/{workers}": {"forward_s": 0.01, "backward_s": 0.02, "optimizer_s": 0.001, "ready_s": None}},
        "host": {"cpu_cores": cpu_cores} if cpu_cores else {},
        "results": [{"model": "toy", "method": "signsgd", "workers": workers, "mbit": 100.0, "bucket_cap_mb": 25.0,
                     "pipelining": True, "rank": None, "iter_s": iter_s, "exposed_comm_s": 0.0,
                     "phase_s": {"compress": codec_s / 2, "decompress": codec_s / 2},
                     "link": {"alpha_s": 1e-4, "beta_s_per_byte": 8 / 100e6}}],
    }


def test_codecs_of_more_ranks_than_cores_take_proportionally_longer() -> None:
    """4 ranks on 2 cores: each codec CPU second takes two wall seconds; 2 ranks: one."""
    assert codec_share_factor(4, 2) == 2.0
    assert codec_share_factor(2, 2) == 1.0
    assert codec_share_factor(2, 16) == 1.0
    assert codec_share_factor(4, None) == 1.0  # cores not recorded: no correction
    shapes = [[64, 32], [64], [128, 64]]
    link = Link(alpha=1e-4, beta=8 / 100e6)
    shared = predict("signsgd", shapes, Compute(0.01, 0.02, 0.001), 4, link, codec=CodecCost(0.006)).step_s
    [row] = validate(_one_run_paper(4, 2, codec_s=0.003, iter_s=shared))
    assert row["error"] == pytest.approx(0.0, abs=1e-9)
    [uncorrected] = validate(_one_run_paper(4, None, codec_s=0.003, iter_s=shared))
    assert uncorrected["predicted_s"] < row["predicted_s"]


def test_torch_hook_runs_are_predicted_with_paper_py_codec_estimate() -> None:
    """The hook's codec cannot be timed in its run: the validation takes paper.py's estimate."""
    paper = _one_run_paper(2, 2, codec_s=0.0, iter_s=1.0)
    paper["results"][0].update(method="torch_powersgd", rank=4, bucket_cap_mb=10_000.0, codec_estimate_s=0.0)
    [cheap] = validate(paper)
    paper["results"][0]["codec_estimate_s"] = 0.05
    [costly] = validate(paper)
    assert costly["predicted_s"] - cheap["predicted_s"] == pytest.approx(0.05, rel=1e-6)
