"""EF-SignSGD: scaled sign with error feedback, sign bits packed 8 per byte, all-gathered.

Per bucket, for every compressed tensor with residual e:

1. p = g + e                               (in the residual buffer)
2. c = (‖p‖₁ / numel) · sign(p)  (sign(0) := +1, so one bit suffices); e ← p − c
3. one all-gather of [scales (fp32) | uncompressed tensors (fp32) | packed sign bits] as bytes
4. gradient ← Σ_ranks scale_r · sign_r / N

Bytes per step: ceil(numel/8) + 4 per tensor. Signs cannot be summed, hence the all-gather.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch

from compressors.base import AllGather, BucketJob, ErrorFeedbackCompressor, GradSlot
from compressors.fusion import split_slots

_SHIFTS_CACHE: dict[torch.device, torch.Tensor] = {}


def _shifts(device: torch.device) -> torch.Tensor:
    if device not in _SHIFTS_CACHE:
        _SHIFTS_CACHE[device] = torch.arange(7, -1, -1, dtype=torch.uint8, device=device)
    return _SHIFTS_CACHE[device]


def pack_bits(positive: torch.Tensor, out: torch.Tensor) -> None:
    """Pack a 1-D bool tensor into ``out`` (uint8, ceil(n/8)), most significant bit first."""
    padded = torch.zeros(out.numel() * 8, dtype=torch.uint8, device=positive.device)
    padded[: positive.numel()] = positive
    torch.sum(padded.view(-1, 8) << _shifts(positive.device), dim=1, dtype=torch.uint8, out=out)


def unpack_signs(packed: torch.Tensor, count: int) -> torch.Tensor:
    """(..., nbytes) uint8 → (..., count) float of ±1."""
    bits = (packed.unsqueeze(-1) >> _shifts(packed.device)) & 1
    bits = bits.flatten(-2)[..., :count]
    return bits.to(torch.float32).mul_(2).sub_(1)


class EFSignSGD(ErrorFeedbackCompressor):
    def encode_decode(self, buffer: torch.Tensor, slots: Sequence[GradSlot], world_size: int) -> BucketJob:
        compressed, plain = split_slots(slots, self.compresses)
        sign_bytes = [math.ceil(slot.grad.numel() / 8) for slot in compressed]
        float_count = len(compressed) + sum(slot.grad.numel() for slot in plain)
        # fp32 fields first, so their byte offsets stay 4-aligned.
        payload = torch.empty(4 * float_count + sum(sign_bytes), dtype=torch.uint8, device=buffer.device)
        floats = payload[: 4 * float_count].view(torch.float32)
        scales = floats[: len(compressed)]
        offset = 4 * float_count
        for index, (slot, nbytes) in enumerate(zip(compressed, sign_bytes)):
            p = self.memory.accumulate(slot.key, slot.grad.view(-1))
            scale = p.abs().mean()
            positive = p >= 0
            scales[index] = scale
            pack_bits(positive, payload[offset : offset + nbytes])
            # e ← p − scale·sign(p), in place.
            p.sub_(positive.to(p.dtype).mul_(2 * scale).sub_(scale))
            offset += nbytes
        float_offset = len(compressed)
        for slot in plain:
            size = slot.grad.numel()
            floats[float_offset : float_offset + size].copy_(slot.grad.view(-1))
            float_offset += size

        gathered = yield AllGather(payload)  # (N, len) uint8

        # reshape(-1) makes the rows one contiguous run, so the bytes can be read as fp32.
        all_floats = gathered[:, : 4 * float_count].reshape(-1).view(torch.float32).view(world_size, float_count)
        weights = all_floats[:, : len(compressed)] / world_size  # (N, tensors)
        offset = 4 * float_count
        for index, (slot, nbytes) in enumerate(zip(compressed, sign_bytes)):
            signs = unpack_signs(gathered[:, offset : offset + nbytes], slot.grad.numel())  # (N, numel)
            torch.mv(signs.t(), weights[:, index], out=slot.grad.view(-1))
            offset += nbytes
        float_offset = len(compressed)
        for slot in plain:
            size = slot.grad.numel()
            torch.mean(all_floats[:, float_offset : float_offset + size], dim=0, out=slot.grad.view(-1))
            float_offset += size
