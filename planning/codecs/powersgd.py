"""PowerSGD (Vogels et al.): rank-r power iteration, two dependent all-reduces per step.

Kernel: ``compressors/powersgd.py``. Bytes ``element·r·(n+m)`` per compressed matrix.
"""

from __future__ import annotations

from planning.codec import CompressorSpec, TensorLoad
from planning.codecs.lowrank import MACS_PER_ELEMENT_PASS, LowRankCodec, effective_rank
from planning.shapes import FP32_BYTES, Shape, matrix_dims, numel


class PowerSGD(LowRankCodec):
    name = "powersgd"
    kernel = "compressors.powersgd:PowerSGD"
    rounds = 2
    lossiness = 4

    def compressed_bytes(self, spec: CompressorSpec, shape: Shape, element_bytes: int) -> float:
        n, m = matrix_dims(shape)
        return element_bytes * effective_rank(spec, shape) * (n + m)

    def compressed_load(self, spec: CompressorSpec, shape: Shape, world_size: int, wire: float) -> TensorLoad:
        # Encode: M = G + e, orth(Q), P = M Q. Between: orth(P), Q = Mᵀ P̂.
        # Decode: P̂ Qᵀ, e = M − approx, write the gradient.
        size = numel(shape)
        n, m = matrix_dims(shape)
        r = effective_rank(spec, shape)
        product = size * r / MACS_PER_ELEMENT_PASS  # one n×m by m×r (or transposed) product
        orth_q = m * r * r / MACS_PER_ELEMENT_PASS
        orth_p = n * r * r / MACS_PER_ELEMENT_PASS
        return TensorLoad(
            FP32_BYTES * r * n, FP32_BYTES * r * m, 0.0,
            size + orth_q + product, orth_p + product, 2 * size + product,
        )


POWERSGD = PowerSGD()
