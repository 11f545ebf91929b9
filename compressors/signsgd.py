"""EF-SignSGD: scaled sign with error feedback, sign bits packed 8 per byte, all-gathered.

Per bucket, for every compressed tensor with residual e:

1. p = g + e                               (in the residual buffer)
2. c = (‖p‖₁ / numel) · sign(p)  (sign(0) := +1, so one bit suffices); e ← p − c
3. one all-gather of [scales | uncompressed tensors | packed sign bits] as bytes, the floats
   in the gradients' dtype (residuals and the decode in fp32 for 16-bit gradients)
4. gradient ← Σ_ranks scale_r · sign_r / N

Bytes per step: ceil(numel/8) + one element per tensor. Signs cannot be summed, hence the all-gather.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import torch

from compressors.base import AllGather, BucketJob, ErrorFeedbackCompressor, GradSlot, compute_dtype
from compressors.fusion import split_slots
from planning.spec import CompressorSpec

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


def unpack_signs(packed: torch.Tensor, count: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """(..., nbytes) uint8 → (..., count) ``dtype`` of ±1."""
    bits = (packed.unsqueeze(-1) >> _shifts(packed.device)) & 1
    bits = bits.flatten(-2)[..., :count]
    return bits.to(dtype).mul_(2).sub_(1)


class EFSignSGD(ErrorFeedbackCompressor):
    @classmethod
    def lost_energy(cls, spec: CompressorSpec, tensor: torch.Tensor, flat: torch.Tensor, cache: dict[str, Any],
                    previous: torch.Tensor | None = None) -> float:
        """The scaled sign's closed form: ``‖x‖² − ‖x‖₁² / numel``."""
        l1 = float(torch.sum(flat.abs()))
        return max(0.0, float(torch.sum(flat * flat)) - l1 * l1 / flat.numel())

    def encode_decode(self, buffer: torch.Tensor, slots: Sequence[GradSlot], world_size: int) -> BucketJob:
        compressed, plain = split_slots(slots, self.compresses)
        wire_dtype, dtype = buffer.dtype, compute_dtype(buffer.dtype)
        element = wire_dtype.itemsize
        sign_bytes = [math.ceil(slot.grad.numel() / 8) for slot in compressed]
        float_count = len(compressed) + sum(slot.grad.numel() for slot in plain)
        # Float fields (in the gradients' dtype) first, so their byte offsets stay aligned.
        payload = torch.empty(element * float_count + sum(sign_bytes), dtype=torch.uint8, device=buffer.device)
        floats = payload[: element * float_count].view(wire_dtype)
        scales = floats[: len(compressed)]
        offset = element * float_count
        ps = []
        for index, (slot, nbytes) in enumerate(zip(compressed, sign_bytes)):
            p = self.memory.accumulate(slot.key, slot.grad.view(-1), dtype)
            ps.append(p)
            scale = p.abs().mean()
            positive = p >= 0
            scales[index] = scale
            if wire_dtype != dtype:  # the scale as it travels, so error feedback keeps its rounding
                scale = scales[index].to(dtype)
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

        # reshape(-1) makes the rows one contiguous run, so the bytes can be read as floats.
        all_floats = gathered[:, : element * float_count].reshape(-1).view(wire_dtype).view(world_size, float_count)
        self.observe(all_floats)  # every rank's scales and uncompressed tensors
        weights = all_floats[:, : len(compressed)].to(dtype) / world_size  # (N, tensors)
        offset = element * float_count
        for index, (slot, nbytes) in enumerate(zip(compressed, sign_bytes)):
            signs = unpack_signs(gathered[:, offset : offset + nbytes], slot.grad.numel(), dtype)  # (N, numel)
            out = slot.grad.view(-1)
            if out.dtype == dtype:
                torch.mv(signs.t(), weights[:, index], out=out)
            else:
                out.copy_(torch.mv(signs.t(), weights[:, index]))
            offset += nbytes
        float_offset = len(compressed)
        for slot in plain:
            size = slot.grad.numel()
            torch.mean(all_floats[:, float_offset : float_offset + size], dim=0, out=slot.grad.view(-1))
            float_offset += size
        for slot, p in zip(compressed, ps):
            self.keep_residual(slot.key, p)
