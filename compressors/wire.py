"""Which tensors a compressor compresses, and how many bytes a step puts on the wire.

Torch-free, so the compressors, the cost model, the coordinator and the benchmarks all
use one formula. ``GradientSync.stats().bytes_sent`` is checked against it in tests.

A gradient of shape ``(n, *rest)`` is viewed as an ``n × m`` matrix with ``m = prod(rest)``.
Bytes assume fp32 gradients (4 bytes an element), as in the paper.
"""

from __future__ import annotations

import math
from typing import Iterable, Sequence

from compressors.spec import CompressorSpec

FP32_BYTES = 4
INDEX_BYTES = 4  # int32 indices for top-k
SCALE_BYTES = 4  # one fp32 scale per tensor for sign compression

# A low-rank factorisation is used only when it at least halves a matrix's bytes
# (PyTorch's powerSGD_hook uses the same min_compression_rate of 2).
MIN_COMPRESSION_RATE = 2

Shape = Sequence[int]


def numel(shape: Shape) -> int:
    return math.prod(shape) if len(shape) else 1


def matrix_dims(shape: Shape) -> tuple[int, int]:
    """``(n, m)`` of the matrix view of a gradient of this shape."""
    if len(shape) == 0:
        return 1, 1
    return shape[0], numel(shape[1:])


def effective_rank(spec: CompressorSpec, shape: Shape) -> int:
    n, m = matrix_dims(shape)
    assert spec.rank is not None
    return min(spec.rank, n, m)


def topk_count(spec: CompressorSpec, count: int) -> int:
    """Number of entries top-k keeps out of ``count`` (at least one)."""
    assert spec.ratio is not None
    return max(1, min(count, int(spec.ratio * count)))


def is_compressed(spec: CompressorSpec, shape: Shape) -> bool:
    """Whether ``spec`` compresses a gradient of ``shape``; otherwise it travels as fp32.

    - none/fp16/bf16 treat every tensor alike (they are "compressed" by their cast).
    - signsgd/topk compress every tensor with at least ``min_compress_numel`` entries.
    - powersgd/acpsgd compress matrices (2-D or more) whose factors at least halve the bytes;
      1-D tensors (biases, norms) go uncompressed.
    """
    size = numel(shape)
    if spec.name in ("none", "fp16", "bf16"):
        return True
    if size < max(1, spec.min_compress_numel):
        return False
    if spec.name in ("signsgd", "topk"):
        return True
    if len(shape) < 2:
        return False
    n, m = matrix_dims(shape)
    r = effective_rank(spec, shape)
    return MIN_COMPRESSION_RATE * r * (n + m) < n * m


def tensor_wire_bytes(spec: CompressorSpec, shape: Shape) -> float:
    """Average bytes per step this rank contributes to collectives for one gradient."""
    size = numel(shape)
    if spec.name == "none":
        return FP32_BYTES * size
    if spec.name in ("fp16", "bf16"):
        return 2 * size
    if not is_compressed(spec, shape):
        return FP32_BYTES * size
    if spec.name == "signsgd":
        return math.ceil(size / 8) + SCALE_BYTES
    if spec.name == "topk":
        return (FP32_BYTES + INDEX_BYTES) * topk_count(spec, size)
    n, m = matrix_dims(shape)
    r = effective_rank(spec, shape)
    if spec.name == "powersgd":
        return FP32_BYTES * r * (n + m)
    if spec.name == "acpsgd":
        # P-steps send n×r, Q-steps m×r: the average of the two.
        return FP32_BYTES * r * (n + m) / 2
    raise AssertionError(f"no byte formula for {spec.name}")


def wire_bytes(spec: CompressorSpec, shapes: Iterable[Shape], world_size: int) -> float:
    """Bytes this rank passes into collectives per step (average over steps).

    ``world_size`` does not change what one rank sends in a ring all-reduce or all-gather
    input; it is part of the signature so that a compressor whose payload depends on it
    can say so.
    """
    if world_size < 1:
        raise ValueError(f"world_size: must be >= 1, got {world_size}")
    return float(sum(tensor_wire_bytes(spec, tuple(shape)) for shape in shapes))
