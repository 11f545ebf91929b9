"""The learning-rate schedules a job may name, against their definitions step by step."""

from __future__ import annotations

import io
import math

import pytest
import torch

from planning.config import TrainConfig
from planning.sections import LR_SCHEDULES
from workers.loop import _lr_schedule

TOTAL = 300


def built(schedule: str, total: int = TOTAL, lr: float = 0.02) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
    """An optimizer of one parameter and the scheduler a job naming ``schedule`` builds for
    ``total`` steps."""
    cfg = TrainConfig(name="s", model="cnn", dataset="synthetic", steps=TOTAL, lr=lr, lr_schedule=schedule)
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)
    return optimizer, _lr_schedule(cfg, optimizer, total)


def rates(schedule: str, total: int = TOTAL, lr: float = 0.02) -> list[float]:
    """The rate in force at each step 0..total of a job naming ``schedule``."""
    optimizer, scheduler = built(schedule, total, lr)
    out = []
    for _ in range(total + 1):
        out.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return out


def test_every_named_schedule_builds() -> None:
    assert set(LR_SCHEDULES) == {"constant", "cosine", "linear", "step"}
    for schedule in LR_SCHEDULES:
        assert rates(schedule)[0] == pytest.approx(0.02)


def test_linear_falls_by_equal_steps_to_zero_at_the_last_step() -> None:
    lr = rates("linear")
    for step in (0, 1, 150, 270, 299, 300):
        assert lr[step] == pytest.approx(0.02 * (1 - step / TOTAL), abs=1e-12)
    assert lr[270] == pytest.approx(0.1 * lr[0])


def test_cosine_at_ninety_percent_keeps_a_fortieth_of_the_rate() -> None:
    # Why the benchmark offers linear: the cosine's rate near its target step is ~4x lower.
    lr = rates("cosine")
    assert lr[270] == pytest.approx(0.02 * (1 + math.cos(math.pi * 0.9)) / 2, rel=1e-9)
    assert lr[270] / lr[0] == pytest.approx(0.0245, abs=5e-4)
    assert lr[-1] == pytest.approx(0.0, abs=1e-12)


def test_linear_resumes_where_its_checkpoint_left_off() -> None:
    """The scheduler's state (what ``workers.trainstate`` saves) carries its length: resumed
    into a job whose step count differs (epochs on another world size), it keeps the first."""
    optimizer, scheduler = built("linear")
    for _ in range(100):
        optimizer.step()
        scheduler.step()
    buffer = io.BytesIO()
    torch.save({"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()}, buffer)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=False)
    resumed_optimizer, resumed = built("linear", 2 * TOTAL)
    resumed_optimizer.load_state_dict(saved["optimizer"])
    resumed.load_state_dict(saved["scheduler"])
    for step in range(100, 150):
        assert resumed_optimizer.param_groups[0]["lr"] == pytest.approx(0.02 * (1 - step / TOTAL), abs=1e-12)
        resumed_optimizer.step()
        resumed.step()
