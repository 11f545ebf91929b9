"""ACP-SGD (Zhang et al., ICDCS 2023): alternate compressed PowerSGD, one all-reduce per step.

Kernel: ``compressors/acpsgd.py``. P-steps send ``n×r``, Q-steps ``m×r``: the byte formula
and the work model are those of the average step.
"""

from __future__ import annotations

from planning.codec import CompressorSpec, TensorLoad
from planning.codecs.lowrank import MACS_PER_ELEMENT_PASS, LowRankCodec, effective_rank
from planning.shapes import Shape, matrix_dims, numel


class ACPSGD(LowRankCodec):
    name = "acpsgd"
    kernel = "compressors.acpsgd:ACPSGD"
    lossiness = 3
    #: A P-step projects the gradient on the previous Q, a Q-step on the previous P; on the
    #: MLP at rank 64 their update efficiencies alternate near 0.3 and 0.75 (η of one step
    #: is half the story: ``compressors.quality.ErrorMeter`` pools the pair).
    cycle_steps = 2

    def compressed_bytes(self, spec: CompressorSpec, shape: Shape, element_bytes: int) -> float:
        n, m = matrix_dims(shape)
        return element_bytes * effective_rank(spec, shape) * (n + m) / 2

    def compressed_load(self, spec: CompressorSpec, shape: Shape, world_size: int, wire: float) -> TensorLoad:
        # Encode (average of P- and Q-steps): orth of the kept factor, X, residual e.
        # Decode: P Q̂ᵀ / N into the gradient.
        size = numel(shape)
        n, m = matrix_dims(shape)
        r = effective_rank(spec, shape)
        product = size * r / MACS_PER_ELEMENT_PASS
        orth = (n + m) / 2 * r * r / MACS_PER_ELEMENT_PASS
        return TensorLoad(wire, 0.0, 0.0, 2 * size + orth + 2 * product, 0.0, size + product)


ACPSGD_CODEC = ACPSGD()
