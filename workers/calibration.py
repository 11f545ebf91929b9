"""Codec calibration: how long this worker's device takes to encode and decode one step of
each candidate compressor, for the cost model of the adaptive policy."""

from __future__ import annotations

import math
import statistics
from typing import Sequence

import torch

from compressors.base import GradSlot, from_spec, run_in_lockstep
from planning import registry
from planning.buckets import Layout, build_bucket_layout
from planning.config import TrainConfig
from planning.costmodel import codec_work
from planning.spec import make_spec
from workers.timing import codec_clock


def job_layout(model: torch.nn.Module, cfg: TrainConfig) -> tuple[list[tuple[int, ...]], Layout]:
    """The shapes of the parameters DDP reduces (in its order) and the job's bucket layout of
    them: what :func:`calibrate_codecs` times and the model profile describes.

    DDP gives the first bucket 1 MiB only when ``bucket_cap_mb`` is left unset; the loops always
    set it, so every bucket (the first too) has the same cap."""
    shapes = [tuple(p.shape) for p in model.parameters() if p.requires_grad]
    return shapes, build_bucket_layout(shapes, cfg.compression.bucket_cap_mb * 2**20, first_bucket_bytes=None)


def calibrate_codecs(shapes: list[tuple[int, ...]], buckets: Sequence[Sequence[int]], cfg: TrainConfig,
                     world_size: int, device: torch.device | None = None) -> tuple[dict[str, float], dict[str, float]]:
    """Time one step's encode+decode of each compressor family on ``device`` (the worker's;
    default CPU), at world size 1.

    Bucket by bucket, in the job's DDP layout (each bucket's fixed costs count, as in the
    hook), the median of three timed steps after one warm-up (the first run also warms
    PowerSGD's factors), read with :func:`workers.timing.codec_clock` (on CPU the hook's own
    clock, thread CPU time). Returns (seconds by label, seconds per element pass by compressor
    name); the cost model scales the per-element figure to the ranks and ratios not timed.
    """
    device = device or torch.device("cpu")
    clock = codec_clock(device)
    rank = max(cfg.compression.min_rank, min(4, cfg.compression.max_rank))
    allowed = cfg.compression.allowed or list(registry.names())
    seconds: dict[str, float] = {}
    per_element: dict[str, float] = {}
    generator = torch.Generator(device=device).manual_seed(0)  # leaves the training's RNG streams alone
    grads = [torch.randn(shape, device=device, generator=generator) for shape in shapes]
    for name in allowed:
        params = {"rank": rank} if registry.codec(name).takes("rank") else {}
        spec = make_spec(name, **params)
        compressor = from_spec(spec)
        timed = []
        for _ in range(4):
            elapsed = 0.0
            for bucket in buckets:
                buffer = torch.cat([grads[i].reshape(-1) for i in bucket])
                slots, offset = [], 0
                for index in bucket:
                    size = math.prod(shapes[index])
                    slots.append(GradSlot(key=f"p{index}", grad=buffer[offset:offset + size].view(shapes[index]), offset=offset))
                    offset += size
                started = clock()
                run_in_lockstep([compressor.process(buffer, slots, 1)])
                elapsed += clock() - started
            compressor.end_step()
            timed.append(elapsed)
        step_s = statistics.median(timed[1:])
        seconds[spec.label] = step_s
        work = codec_work(spec, shapes, world_size)
        if work > 0:
            per_element[name] = step_s / work
    return seconds, per_element


