"""``build`` / ``make_spec`` validation and the torch-free wire formulas, against their definitions."""

from __future__ import annotations

import math

import pytest

from compressors import build
from planning.spec import (
    COMPRESSOR_NAMES,
    DEFAULT_RANK,
    DEFAULT_RATIO,
    make_spec,
    spec_from_dict,
    spec_to_dict,
)
from planning.wire import effective_rank, is_compressed, matrix_dims, topk_count, wire_bytes

# A conv weight, its bias, a compressible linear weight, its bias, and a tiny matrix.
SHAPES = [(16, 8, 3, 3), (16,), (32, 144), (32,), (10, 32), (10,), (3, 4)]
NUMEL = [math.prod(s) for s in SHAPES]


def field_of(error: ValueError) -> str:
    """The field a validation message names first (``"rank: must be ..."`` -> ``"rank"``)."""
    return str(error).split(":", 1)[0]


# -- build() accepts every name ------------------------------------------------------------


@pytest.mark.parametrize("name", COMPRESSOR_NAMES)
def test_build_accepts_every_documented_name(name):
    compressor = build(name)
    assert compressor.name == name
    assert compressor.spec == make_spec(name)


def test_default_parameters_are_set_only_where_they_apply():
    assert build("powersgd").spec.rank == DEFAULT_RANK
    assert build("acpsgd").spec.rank == DEFAULT_RANK
    assert build("topk").spec.ratio == DEFAULT_RATIO
    for name in ("none", "fp16", "bf16", "signsgd"):
        spec = build(name).spec
        assert spec.rank is None and spec.ratio is None
    assert build("topk").spec.rank is None
    assert build("acpsgd").spec.ratio is None


def test_valid_boundaries_are_accepted():
    assert build("topk", ratio=1).spec.ratio == 1.0
    assert build("topk", ratio=1e-6).spec.ratio == 1e-6
    assert build("powersgd", rank=1).spec.rank == 1
    assert build("acpsgd", rank=4096).spec.rank == 4096
    assert build("acpsgd", warmup_steps=0).spec.warmup_steps == 0
    assert build("signsgd", min_compress_numel=0).spec.min_compress_numel == 0


# -- build() refuses bad input with a ValueError naming the field ----------------------------


@pytest.mark.parametrize("name", ["zip", "", "PowerSGD", "acp-sgd", None, 3])
def test_build_refuses_unknown_name_naming_the_field(name):
    with pytest.raises(ValueError) as info:
        build(name)
    assert field_of(info.value) == "name"


BAD_PARAMETERS = [
    ("powersgd", {"rank": 0}, "rank"),
    ("acpsgd", {"rank": 0}, "rank"),
    ("acpsgd", {"rank": -3}, "rank"),
    ("acpsgd", {"rank": 4097}, "rank"),
    ("acpsgd", {"rank": 2.5}, "rank"),
    ("acpsgd", {"rank": "4"}, "rank"),
    ("powersgd", {"rank": True}, "rank"),
    ("acpsgd", {"rank": False}, "rank"),
    ("topk", {"ratio": 0}, "ratio"),
    ("topk", {"ratio": 0.0}, "ratio"),
    ("topk", {"ratio": 1.5}, "ratio"),
    ("topk", {"ratio": -0.1}, "ratio"),
    ("topk", {"ratio": float("nan")}, "ratio"),
    ("topk", {"ratio": float("inf")}, "ratio"),
    ("topk", {"ratio": True}, "ratio"),
    ("topk", {"ratio": "0.1"}, "ratio"),
    ("acpsgd", {"warmup_steps": -1}, "warmup_steps"),
    ("none", {"warmup_steps": -5}, "warmup_steps"),
    ("signsgd", {"min_compress_numel": -1}, "min_compress_numel"),
    ("topk", {"rank": 4}, "rank"),  # rank is not a top-k parameter
    ("signsgd", {"rank": 4}, "rank"),
    ("none", {"rank": 4}, "rank"),
    ("powersgd", {"ratio": 0.1}, "ratio"),  # ratio is not a low-rank parameter
    ("acpsgd", {"ratio": 0.1}, "ratio"),
    ("fp16", {"ratio": 0.1}, "ratio"),
    ("acpsgd", {"rnak": 4}, "rnak"),  # a typo is refused, not ignored
]


@pytest.mark.parametrize(("name", "params", "field"), BAD_PARAMETERS)
def test_build_refuses_out_of_range_parameter_naming_the_field(name, params, field):
    with pytest.raises(ValueError) as info:
        build(name, **params)
    assert field_of(info.value) == field, str(info.value)
    # The torch-free validation used by the coordinator says exactly the same.
    with pytest.raises(ValueError) as spec_info:
        make_spec(name, **params)
    assert str(spec_info.value) == str(info.value)


# -- specs -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "params", "label"),
    [("none", {}, "none"), ("acpsgd", {"rank": 4}, "acpsgd-r4"), ("powersgd", {"rank": 8}, "powersgd-r8"),
     ("topk", {"ratio": 0.01}, "topk-0.01"), ("signsgd", {}, "signsgd")],
)
def test_spec_label_and_dict_round_trip(name, params, label):
    spec = make_spec(name, warmup_steps=3, seed=7, **params)
    assert spec.label == label
    assert spec_from_dict(spec_to_dict(spec)) == spec
    assert make_spec(spec.name, **spec.params()) == spec


def test_spec_from_dict_without_name_names_the_field():
    with pytest.raises(ValueError) as info:
        spec_from_dict({"rank": 4})
    assert field_of(info.value) == "name"


# -- which tensors are compressed --------------------------------------------------------


def test_matrix_view_of_a_conv_weight_is_out_channels_by_the_rest():
    assert matrix_dims((16, 8, 3, 3)) == (16, 72)
    assert matrix_dims((10,)) == (10, 1)


@pytest.mark.parametrize(
    ("shape", "rank", "compressed"),
    [
        ((9, 8), 2, True),  # 2·2·17 = 68 < 72
        ((8, 8), 2, False),  # 2·2·16 = 64, not < 64: it would not halve the bytes
        ((16, 8, 3, 3), 4, True),  # 16×72: 2·4·88 = 704 < 1152
        ((3, 4), 2, False),
        ((64,), 1, False),  # 1-D tensors always travel uncompressed
        ((8, 12), 8, False),  # r = min(n, m): 2r(n+m) < nm is impossible
    ],
)
def test_low_rank_compresses_only_when_factors_at_least_halve_the_bytes(shape, rank, compressed):
    for name in ("powersgd", "acpsgd"):
        spec = make_spec(name, rank=rank)
        n, m = matrix_dims(shape)
        assert effective_rank(spec, shape) == min(rank, n, m)
        assert is_compressed(spec, shape) is compressed


@pytest.mark.parametrize("n,m", [(1, 1), (2, 3), (5, 5), (8, 12), (40, 7), (100, 100)])
def test_full_rank_factorisation_is_never_compressed(n, m):
    spec = make_spec("powersgd", rank=min(n, m))
    assert not is_compressed(spec, (n, m))


def test_min_compress_numel_leaves_small_tensors_uncompressed():
    spec = make_spec("topk", ratio=0.5, min_compress_numel=100)
    assert not is_compressed(spec, (99,))
    assert is_compressed(spec, (100,))
    spec = make_spec("acpsgd", rank=1, min_compress_numel=1000)
    assert not is_compressed(spec, (30, 30))


# -- bytes per step, from the definitions in docs/compressors.md -----------------------------------


def test_wire_bytes_of_uncompressed_and_cast_allreduce():
    assert wire_bytes(make_spec("none"), SHAPES, 4) == 4 * sum(NUMEL)
    assert wire_bytes(make_spec("fp16"), SHAPES, 4) == 2 * sum(NUMEL)
    assert wire_bytes(make_spec("bf16"), SHAPES, 4) == 2 * sum(NUMEL)


def test_wire_bytes_of_signsgd_is_one_bit_per_entry_plus_a_scale_per_tensor():
    expected = sum(math.ceil(k / 8) + 4 for k in NUMEL)
    assert wire_bytes(make_spec("signsgd"), SHAPES, 2) == expected


def test_wire_bytes_of_topk_is_a_value_and_an_index_per_kept_entry():
    spec = make_spec("topk", ratio=0.1)
    expected = sum(8 * max(1, int(0.1 * k)) for k in NUMEL)
    assert wire_bytes(spec, SHAPES, 2) == expected
    assert topk_count(spec, 5) == 1  # at least one entry
    assert topk_count(make_spec("topk", ratio=1), 37) == 37


def test_wire_bytes_of_low_rank_factors_and_acpsgd_is_half_of_powersgd():
    r = 4
    # Compressed: (16, 72) and (32, 144). Uncompressed: (10, 32) (2·4·42 = 336 ≥ 320), 1-D, (3, 4).
    compressed = [(16, 72), (32, 144)]
    plain = [16, 32, 10 * 32, 10, 12]
    powersgd = sum(4 * r * (n + m) for n, m in compressed) + 4 * sum(plain)
    acpsgd = sum(2 * r * (n + m) for n, m in compressed) + 4 * sum(plain)
    assert wire_bytes(make_spec("powersgd", rank=r), SHAPES, 8) == powersgd
    assert wire_bytes(make_spec("acpsgd", rank=r), SHAPES, 8) == acpsgd
    matrices_only = [(16, 8, 3, 3), (32, 144)]
    assert wire_bytes(make_spec("acpsgd", rank=r), matrices_only, 8) == 0.5 * wire_bytes(
        make_spec("powersgd", rank=r), matrices_only, 8
    )


def test_wire_bytes_refuses_an_empty_world():
    with pytest.raises(ValueError) as info:
        wire_bytes(make_spec("none"), SHAPES, 0)
    assert field_of(info.value) == "world_size"
