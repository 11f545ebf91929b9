"""PowerSGD (Vogels et al., 2019): rank-r power iteration with error feedback, 2 all-reduces per step.

Algorithm, per bucket (acp-sgd.md "PowerSGD"), for every compressed matrix with residual e
and warm-started Q (m×r, the same seeded start on every rank):

1. M = G + e                      (in the residual buffer: no clone of the bucket)
2. P = M Q                        all P's and the bucket's uncompressed tensors in ONE all-reduce
3. P̂ = orth(P)                    batched QR over same-shape factors
4. Q = Mᵀ P̂                       all Q's in ONE all-reduce (round 2 waits for round 1)
5. approx = P̂ Qᵀ / N → gradient;  e ← M − approx;  keep Q as next step's warm start
"""

from __future__ import annotations

from typing import Sequence

import torch

from compressors.base import AllReduce, BucketJob, GradSlot
from compressors.fusion import FusedBuffer, pack_uncompressed, split_slots, unpack_mean
from compressors.lowrank import LowRankCompressor, orthonormal_columns


class PowerSGD(LowRankCompressor):
    def encode_decode(self, buffer: torch.Tensor, slots: Sequence[GradSlot], world_size: int) -> BucketJob:
        compressed, plain = split_slots(slots, self.compresses)
        factors = [self.factors.get(slot) for slot in compressed]
        # 1. M = G + e, held in the residual buffer.
        ms = [self.memory.accumulate(slot.key, slot.matrix) for slot in compressed]
        # 2. P = M Q, fused with the uncompressed tensors.
        round1 = FusedBuffer(
            [(m.shape[0], f.q.shape[1]) for m, f in zip(ms, factors)] + [(s.grad.numel(),) for s in plain],
            dtype=buffer.dtype,
            device=buffer.device,
        )
        ps, plain_views = round1.views[: len(ms)], round1.views[len(ms) :]
        for m, f, p in zip(ms, factors, ps):
            torch.mm(m, f.q, out=p)
        pack_uncompressed(plain_views, plain)
        yield AllReduce(round1.flat)
        unpack_mean(plain_views, plain, world_size)
        if not ms:
            return
        # 3. P̂ = orth(P) (scale-free, so the sum needs no division).
        p_hats = orthonormal_columns(ps)
        # 4. Q = Mᵀ P̂, all-reduced.
        round2 = FusedBuffer([(m.shape[1], f.q.shape[1]) for m, f in zip(ms, factors)], dtype=buffer.dtype, device=buffer.device)
        for m, p_hat, q in zip(ms, p_hats, round2.views):
            torch.mm(m.t(), p_hat, out=q)
        yield AllReduce(round2.flat)
        # 5. Decompress into the bucket; the residual is what the mean approximation missed.
        for slot, m, p_hat, q, f in zip(compressed, ms, p_hats, round2.views, factors):
            q.div_(world_size)
            gradient = slot.matrix
            torch.mm(p_hat, q.t(), out=gradient)
            m.sub_(gradient)
            f.q = q.clone()
