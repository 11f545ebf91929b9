"""Top-k sparsification with error feedback, (value, index) pairs all-gathered.

Kernel: ``compressors/topk.py``. Bytes ``(element + 4)·k`` with ``k = max(1, ratio·numel)``.
"""

from __future__ import annotations

from planning.codec import RATIO, Codec, CompressorSpec, TensorLoad
from planning.shapes import INDEX_BYTES, Shape, numel


def topk_count(spec: CompressorSpec, count: int) -> int:
    """Number of entries top-k keeps out of ``count`` (at least one)."""
    assert spec.ratio is not None
    return max(1, min(count, int(spec.ratio * count)))


class TopK(Codec):
    name = "topk"
    kernel = "compressors.topk:TopK"
    collective = "all_gather"
    params = (RATIO,)
    error_feedback = True
    lossiness = 5
    too_lossy_when_critical = True

    def compressed_bytes(self, spec: CompressorSpec, shape: Shape, element_bytes: int) -> float:
        return (element_bytes + INDEX_BYTES) * topk_count(spec, numel(shape))

    def compressed_load(self, spec: CompressorSpec, shape: Shape, world_size: int, wire: float) -> TensorLoad:
        size = numel(shape)
        kept = topk_count(spec, size)
        return TensorLoad(0.0, 0.0, wire, 3 * size, 0.0, size + world_size * kept)


TOPK = TopK()
