"""Uncompressed fp32 all-reduce (S-SGD, DDP's default). Kernel: ``compressors/allreduce.py``."""

from __future__ import annotations

from planning.codec import Codec, CompressorSpec, TensorLoad
from planning.shapes import Shape, numel


class NoCompression(Codec):
    name = "none"
    kernel = "compressors.allreduce:PlainAllReduce"
    lossiness = 0
    known_error = 0.0
    compresses_everything = True

    def compressed_bytes(self, spec: CompressorSpec, shape: Shape, element_bytes: int) -> float:
        return element_bytes * numel(shape)

    def compressed_load(self, spec: CompressorSpec, shape: Shape, world_size: int, wire: float) -> TensorLoad:
        return TensorLoad(wire, 0.0, 0.0, 0.0, 0.0, 0.0)


NONE = NoCompression()
