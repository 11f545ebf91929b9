"""What PowerSGD and ACP-SGD share: rank-r factors of the matrix view, used only where they
at least halve a matrix's bytes (PyTorch's powerSGD_hook uses the same rate of 2)."""

from __future__ import annotations

from planning.codec import RANK, Codec, CompressorSpec
from planning.shapes import Shape, matrix_dims, numel

MIN_COMPRESSION_RATE = 2

#: A rank-r matrix product touches each element once and does r multiply-adds on it. On BLAS
#: kernels one elementwise pass costs about as much as this many multiply-adds, so the work
#: model counts ``n·m·r`` multiply-adds as ``n·m·r / MACS_PER_ELEMENT_PASS`` element passes.
MACS_PER_ELEMENT_PASS = 16


def effective_rank(spec: CompressorSpec, shape: Shape) -> int:
    n, m = matrix_dims(shape)
    assert spec.rank is not None
    return min(spec.rank, n, m)


class LowRankCodec(Codec):
    params = (RANK,)
    error_feedback = True
    # No shared error family: at the same rank ACP-SGD's measured error is above PowerSGD's
    # (the CNN: 0.80 vs 0.71 at rank 4, 0.55 vs 0.30 at rank 16) and their estimates differ in
    # kind (ACP-SGD's projects on the step before's subspaces: compressors.acpsgd). The other
    # family's share is only a prior until a family has run; its own share then prices its
    # ranks (planning.progress.calibrated_errors).

    def compresses(self, spec: CompressorSpec, shape: Shape) -> bool:
        """Matrices (2-D or more) of at least ``min_compress_numel`` elements whose factors at
        least halve the bytes; 1-D tensors (biases, norms) never."""
        if numel(shape) < max(1, spec.min_compress_numel) or len(shape) < 2:
            return False
        n, m = matrix_dims(shape)
        return MIN_COMPRESSION_RATE * effective_rank(spec, shape) * (n + m) < n * m

    def why_nothing_compressed(self, spec: CompressorSpec, shapes: list[tuple[int, ...]]) -> str:
        largest = max(shapes, key=numel)
        if spec.min_compress_numel and numel(largest) < spec.min_compress_numel:
            return super().why_nothing_compressed(spec, shapes)
        matrices = [shape for shape in shapes if len(shape) >= 2]
        if not matrices:
            return (f"{spec.label} compresses none of the {len(shapes)} gradients: low-rank needs 2-D or "
                    "larger gradients, all are 1-D")
        best = max(matrices, key=lambda shape: numel(shape) / (sum(matrix_dims(shape)) * effective_rank(spec, shape)))
        n, m = matrix_dims(best)
        r = effective_rank(spec, best)
        return (f"{spec.label} compresses none of the {len(shapes)} gradients: a rank-{r} factorisation must at "
                f"least halve a matrix ({MIN_COMPRESSION_RATE}·r·(n+m) < n·m), and the best candidate, {best} "
                f"as {n}×{m}, gives {MIN_COMPRESSION_RATE * r * (n + m)} ≥ {n * m}; lower the rank or leave it "
                "uncompressed")
