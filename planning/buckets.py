"""A DDP-like bucket layout and what each bucket costs: bytes per round and codec work.

Torch-free. Per gradient, the bytes come from ``planning.wire`` and the work model from the
compressor's description (``Codec.load``); this module sums them per bucket for the cost
model (``planning/costmodel.py``) and turns codec work into seconds (:class:`ElementCost`,
:class:`CodecCost`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Iterable, NamedTuple, Sequence, Union

from planning import registry
from planning.codec import CompressorSpec, TensorLoad
from planning.shapes import FP32_BYTES, Shape, numel

Layout = tuple[tuple[int, ...], ...]

#: DDP's defaults: ``bucket_cap_mb=25`` and a small first bucket (``_DEFAULT_FIRST_BUCKET_BYTES``)
#: so that the first all-reduce starts early in backward.
DDP_BUCKET_CAP_BYTES = 25 * 1024 * 1024
DDP_FIRST_BUCKET_BYTES = 1024 * 1024


def build_bucket_layout(
    shapes: Sequence[Shape],
    bucket_cap_bytes: float = DDP_BUCKET_CAP_BYTES,
    first_bucket_bytes: float | None = DDP_FIRST_BUCKET_BYTES,
    element_bytes: int = FP32_BYTES,
) -> Layout:
    """A DDP-like bucket layout: parameter indices per bucket, in the order buckets fire.

    Like DDP, parameters are taken in reverse order (the last layer's gradients are ready
    first); a bucket closes once it holds at least its cap, so one large tensor may overflow
    it. The first bucket uses ``first_bucket_bytes`` (DDP: 1 MiB) so communication starts
    early; pass ``None`` to use ``bucket_cap_bytes`` throughout.
    """
    if not bucket_cap_bytes > 0:
        raise ValueError(f"bucket_cap_bytes: must be > 0, got {bucket_cap_bytes!r}")
    buckets: list[tuple[int, ...]] = []
    current: list[int] = []
    size = 0.0
    for index in reversed(range(len(shapes))):
        current.append(index)
        size += numel(shapes[index]) * element_bytes
        cap = first_bucket_bytes if (not buckets and first_bucket_bytes) else bucket_cap_bytes
        if size >= cap:
            buckets.append(tuple(current))
            current, size = [], 0.0
    if current:
        buckets.append(tuple(current))
    return tuple(buckets)


def complete_layout(buckets: Iterable[Iterable[int]], count: int) -> Layout:
    """Validate a layout; parameters it leaves out are appended as one last bucket.

    The extra bucket keeps ``bytes_per_step`` equal to ``wire_bytes`` over all shapes.
    """
    layout = tuple(tuple(int(i) for i in bucket) for bucket in buckets if len(tuple(bucket)))
    seen: set[int] = set()
    for bucket in layout:
        for index in bucket:
            if not 0 <= index < count:
                raise ValueError(f"buckets: parameter index {index} out of range for {count} shapes")
            if index in seen:
                raise ValueError(f"buckets: parameter index {index} appears twice")
            seen.add(index)
    missing = tuple(i for i in reversed(range(count)) if i not in seen)
    return layout + ((missing,) if missing else ())


# --------------------------------------------------------------------------------------------
# Codec costs
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CodecCost:
    """Calibrated encode+decode seconds for one whole step of one candidate.

    The total is spread over buckets and over the encode / between-round / decode phases in
    proportion to the work model (:func:`codec_work`), so its placement in the step is right
    even though only the sum was measured.
    """

    step_s: float


@dataclass(frozen=True)
class ElementCost:
    """Per-element codec cost: ``seconds = fixed_s + per_element_s · elements`` per bucket phase.

    ``elements`` are element passes as counted by :func:`codec_work`; a worker calibrates
    ``per_element_s`` (and ``fixed_s``, kernel launches and buffer packing) on its own device
    by timing one step's encode+decode and dividing by that count.
    """

    per_element_s: float
    fixed_s: float = 0.0
    calibrated: bool = True


#: UNCALIBRATED default: roughly one CPU core streaming fp32 (≈1 G element passes/s, 50 µs
#: per bucket phase). GPUs are 10-100× faster; use a calibrated cost wherever one exists.
DEFAULT_CPU_CODEC = ElementCost(per_element_s=1e-9, fixed_s=50e-6, calibrated=False)

CodecModel = Union[CodecCost, ElementCost]


def tensor_load(spec: CompressorSpec, shape: Shape, world_size: int) -> TensorLoad:
    """Bytes and work for one gradient (docs/cost-model.md, "The work model"): the
    compressor's own work model (``Codec.load``) at its fp32 byte formula."""
    description = registry.codec(spec.name)
    return description.load(spec, shape, world_size, description.tensor_bytes(spec, shape, FP32_BYTES))


class BucketLoad(NamedTuple):
    numel: int
    round1_bytes: float
    round2_bytes: float
    gather_bytes: float
    encode: float
    between: float
    decode: float


def bucket_loads(
    spec: CompressorSpec, shapes: tuple[tuple[int, ...], ...], layout: Layout, world_size: int
) -> tuple[BucketLoad, ...]:
    """Per-bucket bytes and work; cached (per registry version) because the simulator asks
    again and again."""
    return _bucket_loads(spec, shapes, layout, world_size, registry.version())


@lru_cache(maxsize=4096)
def _bucket_loads(
    spec: CompressorSpec, shapes: tuple[tuple[int, ...], ...], layout: Layout, world_size: int, registry_version: int
) -> tuple[BucketLoad, ...]:
    loads = []
    for bucket in layout:
        parts = [tensor_load(spec, shapes[i], world_size) for i in bucket]
        loads.append(
            BucketLoad(
                sum(numel(shapes[i]) for i in bucket),
                *(math.fsum(p[j] for p in parts) for j in range(6)),
            )
        )
    return tuple(loads)


def codec_work(spec: CompressorSpec, shapes: Iterable[Shape], world_size: int) -> float:
    """Element passes one step's encode+decode does (the ``elements`` of :class:`ElementCost`).

    A worker calibrates ``per_element_s`` as measured seconds divided by this number.
    """
    total = 0.0
    for shape in shapes:
        load = tensor_load(spec, tuple(shape), world_size)
        total += load.encode + load.between + load.decode
    return total
