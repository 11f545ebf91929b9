"""benchmarks.compressor_cost: the isolated codec measurement paper.py's simulator input rests on.

Real hooks on a real one-process gloo group, on small shapes (a second or two).
"""

from __future__ import annotations

import math

import pytest

from benchmarks.compressor_cost import ONE_BUCKET_BYTES, make_workload, powersgd_codecs, single_process_group
from planning.spec import make_spec
from planning.wire import wire_bytes

SHAPES = [(256, 128), (256,), (64, 32, 3, 3), (64,), (512, 256), (10, 512)]
RANK = 4


def test_one_bucket_holds_every_gradient_and_capped_buckets_split_them() -> None:
    one = make_workload("one", SHAPES, RANK, bucket_cap_bytes=ONE_BUCKET_BYTES, first_bucket_bytes=None)
    assert len(one.buckets) == 1
    assert one.buckets[0].buffer().numel() == sum(math.prod(s) for s in SHAPES)
    capped = make_workload("capped", SHAPES, RANK, bucket_cap_bytes=200_000, first_bucket_bytes=None)
    assert len(capped.buckets) > 1
    assert sum(b.buffer().numel() for b in capped.buckets) == sum(math.prod(s) for s in SHAPES)
    # DDP fires the last parameters first: the first bucket starts with the last parameter.
    assert capped.buckets[0].parameters()[0] is capped.params[-1]


def test_ours_and_pytorchs_hook_are_timed_on_the_same_bytes() -> None:
    """Both PowerSGDs send P and Q of every compressed matrix plus the vectors uncompressed,
    whatever the layout: equal bytes, the formula's, and a positive time for each."""
    with single_process_group():
        measured = powersgd_codecs(SHAPES, RANK, bucket_cap_bytes=200_000, warmup=3, steps=2, label="test")
    assert set(measured) == {"powersgd", "torch_powersgd"}
    expected = wire_bytes(make_spec("powersgd", rank=RANK), SHAPES, 1)
    for name, row in measured.items():
        assert row["encode_decode_s"] > 0, name
        assert row["bytes_per_step"] == pytest.approx(expected), name
