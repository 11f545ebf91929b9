"""``data.shuffle_seed`` on a real two-rank job (gloo, local processes): it orders the training
samples and nothing else a seed draws, so the same job repeats exactly under its own order and
trains differently under another (the adaptive benchmark's reference runs rely on both)."""

from __future__ import annotations

from pathlib import Path

import pytest

from planning.config import TrainConfig
from workers.runner import run_local


def final_loss(tmp_path: Path, name: str, **data: object) -> float:
    cfg = TrainConfig.model_validate({"name": name, "steps": 8, "workers": 2, "seed": 3, "model": {"name": "mlp"},
                                      "data": {"dataset": "digits", "batch_size": 32, **data},
                                      "compression": {"mode": "fixed", "compressor": "none"}})
    return float(run_local(cfg, checkpoint_dir=str(tmp_path / name))["final_loss"])


@pytest.mark.timeout(240)
def test_the_shuffle_seed_orders_the_samples_apart_from_the_seed(tmp_path: Path) -> None:
    default = final_loss(tmp_path, "default")
    assert final_loss(tmp_path, "own-order", shuffle_seed=3) == default  # None means the job's seed
    assert final_loss(tmp_path, "other-order", shuffle_seed=4) != default
