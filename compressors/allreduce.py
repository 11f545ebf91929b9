"""Uncompressed all-reduce ("none", i.e. S-SGD) and its fp16/bf16 casts."""

from __future__ import annotations

from typing import Sequence

import torch

from compressors.base import AllReduce, BucketJob, Compressor, GradSlot, mean_allreduce
from planning.spec import CompressorSpec


class PlainAllReduce(Compressor):
    """DDP's default: all-reduce the fp32 bucket and divide by the world size."""

    def encode_decode(self, buffer: torch.Tensor, slots: Sequence[GradSlot], world_size: int) -> BucketJob:
        return mean_allreduce(buffer, world_size)


class CastAllReduce(Compressor):
    """All-reduce in a 16-bit type: half the bytes, no state.

    The bucket is divided by the world size *before* the cast, so the sum of N values
    cannot overflow fp16 where each one would not (as PyTorch's fp16_compress_hook does).
    """

    #: The 16-bit type the bucket travels in (set by the subclasses below).
    dtype: torch.dtype

    def __init__(self, spec: CompressorSpec, dtype: torch.dtype | None = None) -> None:
        super().__init__(spec)
        if dtype is not None:
            self.dtype = dtype

    def encode_decode(self, buffer: torch.Tensor, slots: Sequence[GradSlot], world_size: int) -> BucketJob:
        compressed = buffer.div_(world_size).to(self.dtype)
        reduced = yield AllReduce(compressed)
        buffer.copy_(reduced)


class Fp16AllReduce(CastAllReduce):
    """``fp16`` (planning/codecs/cast.py)."""

    dtype = torch.float16


class Bf16AllReduce(CastAllReduce):
    """``bf16`` (planning/codecs/cast.py)."""

    dtype = torch.bfloat16
