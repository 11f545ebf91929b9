"""Which tensors a compressor compresses, and how many bytes a step puts on the wire.

Torch-free, so the compressors, the cost model, the coordinator and the benchmarks all
use one formula. ``GradientSync.stats().bytes_sent`` is checked against it in tests. Each
compressor's own rule and formula live in its description (``planning/codecs/``); this
module is the one entry point to them.

A gradient of shape ``(n, *rest)`` is viewed as an ``n × m`` matrix with ``m = prod(rest)``.
Bytes are for gradients of ``element_bytes`` an element (default 4: fp32, as in the paper):
every compressor sends its floats (factors, values, scales, uncompressed tensors) in the
gradients' dtype; fp16/bf16 always send 2 bytes; top-k indices are int32 and sign bits bits.
"""

from __future__ import annotations

from typing import Iterable

from planning import registry
from planning.codec import CompressorSpec
from planning.codecs.lowrank import MIN_COMPRESSION_RATE, effective_rank
from planning.codecs.topk import topk_count
from planning.shapes import FP32_BYTES, INDEX_BYTES, SCALE_BYTES, Shape, matrix_dims, numel

__all__ = [
    "FP32_BYTES", "INDEX_BYTES", "MIN_COMPRESSION_RATE", "SCALE_BYTES", "Shape", "effective_rank",
    "is_compressed", "matrix_dims", "numel", "tensor_wire_bytes", "topk_count", "why_nothing_compressed",
    "wire_bytes",
]


def is_compressed(spec: CompressorSpec, shape: Shape) -> bool:
    """Whether ``spec`` compresses a gradient of ``shape``; otherwise it travels as fp32
    (docs/compressors.md, "Which tensors are compressed")."""
    return registry.codec(spec.name).compresses(spec, shape)


def tensor_wire_bytes(spec: CompressorSpec, shape: Shape, element_bytes: int = FP32_BYTES) -> float:
    """Average bytes per step this rank contributes to collectives for one gradient."""
    return registry.codec(spec.name).tensor_bytes(spec, shape, element_bytes)


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
    description = registry.codec(spec.name)
    return float(sum(description.tensor_bytes(spec, tuple(shape), element_bytes) for shape in shapes))


def why_nothing_compressed(spec: CompressorSpec, shapes: Iterable[Shape]) -> str | None:
    """Why ``spec`` compresses none of ``shapes`` (a sentence), or None if it compresses some.

    For the warning a user gets when a lossy compressor would only send plain all-reduce.
    """
    description = registry.codec(spec.name)
    listed = [tuple(shape) for shape in shapes]
    if description.compresses_everything or any(description.compresses(spec, shape) for shape in listed):
        return None
    if not listed:
        return f"{spec.label} has no gradients to compress (no parameter requires grad)"
    return description.why_nothing_compressed(spec, listed)
