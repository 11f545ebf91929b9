"""workers.calibration.calibrate_codecs: the worker's encode+decode calibration for the cost model."""

from __future__ import annotations

import itertools

import pytest
import torch

from planning.config import TrainConfig
from planning.costmodel import build_bucket_layout, codec_work
from planning.spec import make_spec
from workers import calibration
from workers.calibration import calibrate_codecs

SHAPES = [(64, 32), (64,), (128, 64), (10, 128)]
BUCKETS = build_bucket_layout(SHAPES, 20_000, first_bucket_bytes=None)
CONFIG = TrainConfig.model_validate({"compression": {"mode": "adaptive", "allowed": ["none", "signsgd", "acpsgd"]}})


def test_every_allowed_compressor_is_timed_once_per_bucket_on_the_devices_clock(monkeypatch):
    """A clock that ticks 1 per reading: each bucket's encode+decode reads as 1 s, so a step
    reads as the number of buckets, and the per-element figure divides that by the cost
    model's work (which is how the policy scales it to other ranks and world sizes)."""
    devices = []

    def ticking_clock(device):
        devices.append(device)
        ticks = itertools.count()
        return lambda: float(next(ticks))

    monkeypatch.setattr(calibration, "codec_clock", ticking_clock)
    seconds, per_element = calibrate_codecs(SHAPES, BUCKETS, CONFIG, world_size=4)
    assert len(BUCKETS) > 1
    assert devices == [torch.device("cpu")]
    acp = make_spec("acpsgd", rank=4)
    assert seconds == {make_spec("none").label: len(BUCKETS), make_spec("signsgd").label: len(BUCKETS),
                       acp.label: len(BUCKETS)}
    assert per_element["acpsgd"] == pytest.approx(len(BUCKETS) / codec_work(acp, SHAPES, 4))


def test_a_real_calibration_measures_positive_seconds_for_each_family():
    seconds, per_element = calibrate_codecs(SHAPES, BUCKETS, CONFIG, world_size=2)
    assert len(seconds) == 3 and all(s > 0 for s in seconds.values())
    assert set(per_element) <= {"none", "signsgd", "acpsgd"} and all(v > 0 for v in per_element.values())
