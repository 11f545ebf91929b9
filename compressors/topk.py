"""Top-k sparsification with error feedback (values + indices, all-gathered).

Per bucket, for every compressed tensor with residual e:

1. p = g + e                             (in the residual buffer)
2. keep the k = ratio·numel largest |p|; e ← p with those entries zeroed
3. one all-gather of [values | uncompressed tensors | indices (int32)] as bytes, the values
   in the gradients' dtype (residuals in fp32 for 16-bit gradients)
4. gradient ← Σ_ranks scatter-add(values at indices) / N   (one index_add_ over the bucket)

Sparse pairs cannot be summed by an all-reduce, hence the all-gather, whose cost grows
with N: Top-k only beats all-reduce when ratio < ~1/N (docs/compressors.md, "Top-k").
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from compressors.base import AllGather, BucketJob, ErrorFeedbackCompressor, GradSlot, compute_dtype
from compressors.fusion import split_slots
from planning.spec import CompressorSpec
from planning.wire import INDEX_BYTES, topk_count


class TopK(ErrorFeedbackCompressor):
    @classmethod
    def lost_energy(cls, spec: CompressorSpec, tensor: torch.Tensor, flat: torch.Tensor, cache: dict[str, Any],
                    previous: torch.Tensor | None = None) -> float:
        """The mass outside the k largest magnitudes: the total less the k largest squares.

        Why ``topk`` and not a sort: the candidates keep 1 % and less, and the k largest of a
        sampled matrix cost a tenth of sorting all of it (131k elements: 0.9 against 10.7 ms,
        on rank 0 between steps); one ``topk`` at the largest k serves every smaller ratio.
        The sums run in float64: the total less the kept can be a small difference."""
        k = topk_count(spec, flat.numel())
        if "top_squares" not in cache or cache["top_squares"].numel() < k:
            squares = flat * flat
            cache["total_square"] = float(torch.sum(squares, dtype=torch.float64))
            cache["top_squares"] = torch.topk(squares, k, sorted=True).values.to(torch.float64)
        return max(0.0, cache["total_square"] - float(torch.sum(cache["top_squares"][:k])))

    def encode_decode(self, buffer: torch.Tensor, slots: Sequence[GradSlot], world_size: int) -> BucketJob:
        compressed, plain = split_slots(slots, self.compresses)
        wire_dtype, dtype = buffer.dtype, compute_dtype(buffer.dtype)
        counts = [topk_count(self.spec, slot.grad.numel()) for slot in compressed]
        total_k = sum(counts)
        value_count = total_k + sum(slot.grad.numel() for slot in plain)
        # Values and raw tensors (in the gradients' dtype) and int32 indices, as bytes; the
        # wider field first, so both start aligned.
        value_bytes, index_bytes = wire_dtype.itemsize * value_count, INDEX_BYTES * total_k
        values_first = wire_dtype.itemsize >= INDEX_BYTES
        payload = torch.empty(value_bytes + index_bytes, dtype=torch.uint8, device=buffer.device)
        value_span = slice(0, value_bytes) if values_first else slice(index_bytes, index_bytes + value_bytes)
        index_span = slice(value_bytes, value_bytes + index_bytes) if values_first else slice(0, index_bytes)
        values = payload[value_span].view(wire_dtype)
        indices = payload[index_span].view(torch.int32)
        offset = 0
        ps = []
        for slot, k in zip(compressed, counts):
            p = self.memory.accumulate(slot.key, slot.grad.view(-1), dtype)
            ps.append(p)
            chosen = torch.topk(p.abs(), k, sorted=False).indices  # an inf/NaN is always chosen
            sent = values[offset : offset + k]
            torch.add(chosen, slot.offset, out=indices[offset : offset + k])  # index into the bucket
            if wire_dtype == dtype:
                torch.index_select(p, 0, chosen, out=sent)
                p.index_fill_(0, chosen, 0.0)
            else:  # the residual keeps what rounding to the wire dtype lost
                sent.copy_(p.index_select(0, chosen))
                p.index_add_(0, chosen, sent.to(dtype), alpha=-1)
            offset += k
        for slot in plain:
            size = slot.grad.numel()
            values[offset : offset + size].copy_(slot.grad.view(-1))
            offset += size

        gathered = yield AllGather(payload)  # (N, len) uint8

        # reshape(-1) makes the rows one contiguous run starting aligned (a single row of a
        # world of 1 is not copied), so the bytes can be read as values / int32 indices.
        all_values = gathered[:, value_span].reshape(-1).view(wire_dtype).view(world_size, value_count)
        self.observe(all_values)
        for slot in compressed:
            slot.grad.zero_()
        if total_k:
            sparse_values = all_values[:, :total_k].reshape(-1).div_(world_size)
            sparse_indices = gathered[:, index_span].reshape(-1).view(torch.int32).long()
            buffer.index_add_(0, sparse_indices, sparse_values)
        offset = total_k
        for slot in plain:
            size = slot.grad.numel()
            torch.mean(all_values[:, offset : offset + size], dim=0, out=slot.grad.view(-1))
            offset += size
        for slot, p in zip(compressed, ps):
            self.keep_residual(slot.key, p)
