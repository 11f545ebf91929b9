"""EF-SignSGD: scaled sign with error feedback, bits all-gathered (docs/compressors.md).

Kernel: ``compressors/signsgd.py``. Bytes ``ceil(numel/8)`` plus one scale per tensor.
"""

from __future__ import annotations

import math

from planning.codec import Codec, CompressorSpec, TensorLoad
from planning.shapes import Shape, numel


class SignSGD(Codec):
    name = "signsgd"
    kernel = "compressors.signsgd:EFSignSGD"
    collective = "all_gather"
    error_feedback = True
    lossiness = 6
    too_lossy_when_critical = True

    def compressed_bytes(self, spec: CompressorSpec, shape: Shape, element_bytes: int) -> float:
        return math.ceil(numel(shape) / 8) + element_bytes  # the bits and one scale

    def compressed_load(self, spec: CompressorSpec, shape: Shape, world_size: int, wire: float) -> TensorLoad:
        size = numel(shape)
        # Encode: add error, scale and sign, residual. Decode: unpack and sum all N workers' signs.
        return TensorLoad(0.0, 0.0, wire, 3 * size, 0.0, (world_size + 1) * size)


SIGNSGD = SignSGD()
