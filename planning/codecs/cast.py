"""All-reduce in a 16-bit type (fp16, bf16): half the bytes, no state.

Kernel: ``compressors/allreduce.py`` (``Fp16AllReduce``, ``Bf16AllReduce``). Both always
send 2 bytes an element; their error is their unit round-off until a measurement comes.
"""

from __future__ import annotations

from planning.codec import Codec, CompressorSpec, TensorLoad
from planning.shapes import Shape, numel


class CastCodec(Codec):
    compresses_everything = True

    def compressed_bytes(self, spec: CompressorSpec, shape: Shape, element_bytes: int) -> float:
        return 2 * numel(shape)

    def compressed_load(self, spec: CompressorSpec, shape: Shape, world_size: int, wire: float) -> TensorLoad:
        size = numel(shape)
        return TensorLoad(wire, 0.0, 0.0, size, 0.0, size)  # cast down, cast up


class Fp16(CastCodec):
    name = "fp16"
    kernel = "compressors.allreduce:Fp16AllReduce"
    lossiness = 1
    known_error = 2.0 ** -11


class Bf16(CastCodec):
    name = "bf16"
    kernel = "compressors.allreduce:Bf16AllReduce"
    lossiness = 2
    known_error = 2.0 ** -8


FP16 = Fp16()
BF16 = Bf16()
