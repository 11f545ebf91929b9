"""Which tensors a compressor compresses, and how many bytes a step puts on the wire.

Torch-free, so the compressors, the cost model, the coordinator and the benchmarks all
use one formula. ``GradientSync.stats().bytes_sent`` is checked against it in tests.

A gradient of shape ``(n, *rest)`` is viewed as an ``n × m`` matrix with ``m = prod(rest)``.
Bytes are for gradients of ``element_bytes`` an element (default 4: fp32, as in the paper):
every compressor sends its floats (factors, values, scales, uncompressed tensors) in the
gradients' dtype; fp16/bf16 always send 2 bytes; top-k indices are int32 and sign bits bits.
"""

from __future__ import annotations

import math
from typing import Iterable, Sequence

from planning.spec import CompressorSpec

FP32_BYTES = 4
INDEX_BYTES = 4  # int32 indices for top-k
SCALE_BYTES = 4  # one scale per tensor for sign compression (fp32 gradients: one element)

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


def tensor_wire_bytes(spec: CompressorSpec, shape: Shape, element_bytes: int = FP32_BYTES) -> float:
    """Average bytes per step this rank contributes to collectives for one gradient."""
    size = numel(shape)
    if spec.name == "none":
        return element_bytes * size
    if spec.name in ("fp16", "bf16"):
        return 2 * size
    if not is_compressed(spec, shape):
        return element_bytes * size
    if spec.name == "signsgd":
        return math.ceil(size / 8) + element_bytes  # the bits and one scale
    if spec.name == "topk":
        return (element_bytes + INDEX_BYTES) * topk_count(spec, size)
    n, m = matrix_dims(shape)
    r = effective_rank(spec, shape)
    if spec.name == "powersgd":
        return element_bytes * r * (n + m)
    if spec.name == "acpsgd":
        # P-steps send n×r, Q-steps m×r: the average of the two.
        return element_bytes * r * (n + m) / 2
    raise AssertionError(f"no byte formula for {spec.name}")


def wire_bytes(spec: CompressorSpec, shapes: Iterable[Shape], world_size: int, *, element_bytes: int = FP32_BYTES) -> float:
    """Bytes this rank passes into collectives per step (average over steps).

    ``world_size`` does not change what one rank sends in a ring all-reduce or all-gather
    input; it is part of the signature so that a compressor whose payload depends on it
    can say so. ``element_bytes``: the gradients' element size (8 fp64, 4 fp32, 2 bf16/fp16).
    """
    if world_size < 1:
        raise ValueError(f"world_size: must be >= 1, got {world_size}")
    if element_bytes not in (2, 4, 8):
        raise ValueError(f"element_bytes: must be 2, 4 or 8, got {element_bytes}")
    return float(sum(tensor_wire_bytes(spec, tuple(shape), element_bytes) for shape in shapes))


def why_nothing_compressed(spec: CompressorSpec, shapes: Iterable[Shape]) -> str | None:
    """Why ``spec`` compresses none of ``shapes`` (a sentence), or None if it compresses some.

    For the warning a user gets when a lossy compressor would only send plain all-reduce.
    """
    shapes = [tuple(shape) for shape in shapes]
    if spec.name in ("none", "fp16", "bf16") or any(is_compressed(spec, shape) for shape in shapes):
        return None
    if not shapes:
        return f"{spec.label} has no gradients to compress (no parameter requires grad)"
    largest = max(shapes, key=numel)
    if spec.min_compress_numel and numel(largest) < spec.min_compress_numel:
        return (f"{spec.label} compresses none of the {len(shapes)} gradients: the largest, {largest} "
                f"({numel(largest)} elements), is below min_compress_numel={spec.min_compress_numel}")
    matrices = [shape for shape in shapes if len(shape) >= 2]
    if not matrices:
        return f"{spec.label} compresses none of the {len(shapes)} gradients: low-rank needs 2-D or larger gradients, all are 1-D"
    best = max(matrices, key=lambda shape: numel(shape) / (sum(matrix_dims(shape)) * effective_rank(spec, shape)))
    n, m = matrix_dims(best)
    r = effective_rank(spec, best)
    return (f"{spec.label} compresses none of the {len(shapes)} gradients: a rank-{r} factorisation must at "
            f"least halve a matrix ({MIN_COMPRESSION_RATE}·r·(n+m) < n·m), and the best candidate, {best} "
            f"as {n}×{m}, gives {MIN_COMPRESSION_RATE * r * (n + m)} ≥ {n * m}; lower the rank or leave it uncompressed")
