"""Shapes, element counts and the matrix view of a gradient (torch-free).

A gradient of shape ``(n, *rest)`` is viewed as an ``n × m`` matrix with ``m = prod(rest)``
(docs/compressors.md, "The matrix view"). The byte formulas of every compressor
(``planning/codecs/``) and the kernels (``compressors/``) share these helpers.
"""

from __future__ import annotations

import math
from typing import Sequence

Shape = Sequence[int]

FP32_BYTES = 4
INDEX_BYTES = 4  # int32 indices for top-k
SCALE_BYTES = 4  # one scale per tensor for sign compression (fp32 gradients: one element)


def numel(shape: Shape) -> int:
    return math.prod(shape) if len(shape) else 1


def matrix_dims(shape: Shape) -> tuple[int, int]:
    """``(n, m)`` of the matrix view of a gradient of this shape."""
    if len(shape) == 0:
        return 1, 1
    return shape[0], numel(shape[1:])
