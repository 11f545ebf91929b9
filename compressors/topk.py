"""Top-k sparsification with error feedback (values + indices, all-gathered).

Per bucket, for every compressed tensor with residual e:

1. p = g + e                             (in the residual buffer)
2. keep the k = ratio·numel largest |p|; e ← p with those entries zeroed
3. one all-gather of [values (fp32) | uncompressed tensors (fp32) | indices (int32)] as int32
4. gradient ← Σ_ranks scatter-add(values at indices) / N   (one index_add_ over the bucket)

Sparse pairs cannot be summed by an all-reduce, hence the all-gather, whose cost grows
with N: Top-k only beats all-reduce when ratio < ~1/N (acp-sgd.md).
"""

from __future__ import annotations

from typing import Sequence

import torch

from compressors.base import AllGather, BucketJob, ErrorFeedbackCompressor, GradSlot
from compressors.fusion import split_slots
from compressors.wire import topk_count


class TopK(ErrorFeedbackCompressor):
    def encode_decode(self, buffer: torch.Tensor, slots: Sequence[GradSlot], world_size: int) -> BucketJob:
        compressed, plain = split_slots(slots, self.compresses)
        counts = [topk_count(self.spec, slot.grad.numel()) for slot in compressed]
        total_k = sum(counts)
        plain_numel = sum(slot.grad.numel() for slot in plain)
        # Values and raw tensors are fp32 bit patterns in an int32 payload, indices follow.
        payload = torch.empty(2 * total_k + plain_numel, dtype=torch.int32, device=buffer.device)
        values = payload[: total_k + plain_numel].view(torch.float32)
        indices = payload[total_k + plain_numel :]
        offset = 0
        for slot, k in zip(compressed, counts):
            p = self.memory.accumulate(slot.key, slot.grad.view(-1))
            chosen = torch.topk(p.abs(), k, sorted=False).indices
            torch.index_select(p, 0, chosen, out=values[offset : offset + k])
            torch.add(chosen, slot.offset, out=indices[offset : offset + k])  # index into the bucket
            p.index_fill_(0, chosen, 0.0)
            offset += k
        for slot in plain:
            size = slot.grad.numel()
            values[offset : offset + size].copy_(slot.grad.view(-1))
            offset += size

        gathered = yield AllGather(payload)  # (N, len)

        all_values = gathered[:, : total_k + plain_numel].contiguous().view(torch.float32)
        for slot in compressed:
            slot.grad.zero_()
        if total_k:
            sparse_values = all_values[:, :total_k].reshape(-1).div_(world_size)
            sparse_indices = gathered[:, total_k + plain_numel :].reshape(-1).long()
            buffer.index_add_(0, sparse_indices, sparse_values)
        offset = total_k
        for slot in plain:
            size = slot.grad.numel()
            torch.mean(all_values[:, offset : offset + size], dim=0, out=slot.grad.view(-1))
            offset += size
