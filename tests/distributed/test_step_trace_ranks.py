"""``GRADWIRE_STEP_TRACE`` on a real two-rank job (gloo, local processes): every rank traces
every step, and the ranks' traces pair into one run."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.step_trace import load, run_figures, runs
from planning.config import TrainConfig
from workers.runner import run_local
from workers.step_trace import TRACE_ENV


@pytest.mark.timeout(240)
def test_every_rank_traces_every_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv(TRACE_ENV, str(tmp_path / "steps"))
    cfg = TrainConfig.model_validate({"name": "traced", "steps": 6, "workers": 2, "model": {"name": "mlp"},
                                      "data": {"dataset": "digits", "batch_size": 32},
                                      "compression": {"mode": "fixed", "compressor": "powersgd", "compressor_rank": 2}})
    summary = run_local(cfg, checkpoint_dir=str(tmp_path / "ckpt"))
    assert summary["steps"] == 6
    traces = load(tmp_path / "steps")
    assert sorted(t.rank for t in traces) == [0, 1]
    for trace in traces:
        assert trace.job == {"name": "traced", "mode": "fixed", "compressor": "powersgd-r2", "seed": cfg.seed}
        assert sorted(trace.steps) == list(range(6))
        starts = [trace.steps[s]["started"] for s in range(6)]
        assert starts == sorted(starts)
        for line in trace.steps.values():
            assert line["compressor"] == "powersgd-r2" and line["bytes"] > 0
            assert line["train"] > 0 and line["phases"]["backward"] > 0 and line["phases"]["forward"] > 0
            assert line["train"] >= line["phases"]["forward"] + line["phases"]["backward"]
    (run,) = runs(traces)
    figures = run_figures(run, 1, 6)
    # the ranks meet in every step's collectives: each starts its steps within a step of the other
    assert figures["wall"] > 0 and abs(figures["r1 lag"]) < figures["wall"]
