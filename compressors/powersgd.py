"""PowerSGD (Vogels et al., 2019): rank-r power iteration with error feedback, 2 all-reduces per step.

Algorithm, per bucket (docs/compressors.md, "PowerSGD"), for every compressed matrix with residual e
and warm-started Q (m×r, the same seeded start on every rank):

1. M = G + e                      (in the residual buffer: no clone of the bucket)
2. P = M Q                        all P's and the bucket's uncompressed tensors in ONE all-reduce
3. P̂ = orth(P)                    batched QR over same-shape factors
4. Q = Mᵀ P̂                       all Q's in ONE all-reduce (round 2 waits for round 1)
5. approx = P̂ Qᵀ / N → gradient;  e ← M − approx;  keep Q as next step's warm start

Precision: M, the factors and the QR are fp32 for 16-bit models (fp64 for fp64); P and Q
travel in the parameters' dtype.
"""

from __future__ import annotations

from typing import Sequence

import torch

from compressors.base import AllReduce, BucketJob, GradSlot, compute_dtype
from compressors.fusion import FusedBuffer, from_wire, mm_into, pack_uncompressed, split_slots, to_wire, unpack_mean
from compressors.lowrank import Factors, LowRankCompressor, orthonormal_columns


class PowerSGD(LowRankCompressor):
    def encode_decode(self, buffer: torch.Tensor, slots: Sequence[GradSlot], world_size: int) -> BucketJob:
        compressed, plain = split_slots(slots, self.compresses)
        wire_dtype, dtype = buffer.dtype, compute_dtype(buffer.dtype)
        factors = [self.factors.get(slot) for slot in compressed]
        # 1. M = G + e, in the error-feedback work buffer.
        ms = [self.memory.accumulate(slot.key, slot.matrix, dtype) for slot in compressed]
        # 2. P = M Q, fused with the uncompressed tensors.
        round1 = FusedBuffer(
            [(m.shape[0], f.q.shape[1]) for m, f in zip(ms, factors)] + [(s.grad.numel(),) for s in plain],
            dtype=dtype,
            device=buffer.device,
        )
        ps, plain_views = round1.views[: len(ms)], round1.views[len(ms) :]
        for m, f, p in zip(ms, factors, ps):
            torch.mm(m, f.q, out=p)
        pack_uncompressed(plain_views, plain)
        received = yield AllReduce(to_wire(round1.flat, wire_dtype))
        from_wire(round1.flat, received)
        # Only the uncompressed part needs checking here: a non-finite P makes P̂, and so the
        # Q of round 2 (checked below), non-finite too. Halves the check.
        self.observe(round1.flat[sum(p.numel() for p in ps) :])
        unpack_mean(plain_views, plain, world_size)
        if not ms:
            return
        # 3. P̂ = orth(P) (scale-free, so the sum needs no division). Every rank holds the
        #    same P, so a non-finite one takes every rank through round 2 alike.
        p_hats = orthonormal_columns(ps)
        # 4. Q = Mᵀ P̂, all-reduced.
        round2 = FusedBuffer([(m.shape[1], f.q.shape[1]) for m, f in zip(ms, factors)], dtype=dtype, device=buffer.device)
        for m, p_hat, q in zip(ms, p_hats, round2.views):
            torch.mm(m.t(), p_hat, out=q)
        received = yield AllReduce(to_wire(round2.flat, wire_dtype))
        from_wire(round2.flat, received)
        self.observe(round2.flat)
        # 5. Decompress into the bucket; the residual is what the applied gradient (as
        #    rounded into the bucket's dtype) missed.
        for slot, m, p_hat, q, f in zip(compressed, ms, p_hats, round2.views, factors):
            q.div_(world_size)
            gradient = slot.matrix
            mm_into(p_hat, q.t(), gradient)
            m.sub_(gradient)
            self.keep_factors(slot.key, Factors(q=q.clone(), p=f.p, parity=f.parity))
            self.keep_residual(slot.key, m)
