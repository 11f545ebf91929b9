"""The simulator's step model: the benchmark's method names as compressor specs, bucket layouts and
segments, compute, and ``planning.costmodel.predict_step`` fed with them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from planning.costmodel import (
    CodecModel,
    Link,
    StepPrediction,
    StepProfile,
    build_bucket_layout,
    predict_step,
)
from planning.spec import CompressorSpec, make_spec

METHODS: tuple[str, ...] = ("ssgd", "signsgd", "topk", "powersgd", "torch_powersgd", "acpsgd")
#: Methods that cast the gradient to 16 bits (no benchmark of the paper's runs them; a GPU
#: check measures them, and the replay on its figures offers them).
CASTS: tuple[str, ...] = ("fp16", "bf16")
TOPK_RATIO = 0.01
MB = 1024 * 1024
#: DDP's bucket cap when none is given, and its small first bucket (only when none is given).
DEFAULT_BUCKET_CAP_MB = 25.0
DDP_FIRST_BUCKET_MB = 1.0
#: A bucket cap this large means "one bucket" (PyTorch's powerSGD_hook on gloo, see benchmarks.paper).
ONE_BUCKET_MB = 10_000.0

#: The paper's averages (ICDCS'23, abstract): ACP-SGD over S-SGD and over PowerSGD.
PAPER_SPEEDUP = {"ssgd": 4.06, "powersgd": 1.43}


def method_spec(method: str, rank: int = 4, ratio: float = TOPK_RATIO) -> CompressorSpec:
    """The compressor spec whose bytes and codec work a benchmark method has.

    ``torch_powersgd`` (PyTorch's ``powerSGD_hook``) sends exactly PowerSGD's bytes in the
    same two dependent rounds; only its codec cost and (on gloo) its bucketing differ.
    """
    if method == "ssgd":
        return make_spec("none")
    if method in CASTS:
        return make_spec(method)
    if method in ("signsgd",):
        return make_spec("signsgd")
    if method == "topk":
        return make_spec("topk", ratio=ratio)
    if method in ("powersgd", "torch_powersgd"):
        return make_spec("powersgd", rank=rank)
    if method == "acpsgd":
        return make_spec("acpsgd", rank=rank)
    raise ValueError(f"method: unknown {method!r}; choose one of {', '.join(METHODS + CASTS)}")


def layout_for(shapes: Sequence[Sequence[int]], bucket_cap_mb: float, *, ddp_default: bool = False) -> tuple[tuple[int, ...], ...]:
    """DDP's bucket layout for a cap: parameters in reverse order, a bucket closes at the cap.

    An explicit ``bucket_cap_mb`` makes DDP use it for the first bucket too; only DDP's
    default (``ddp_default``) starts with a 1 MiB bucket so that communication starts early.
    """
    first = DDP_FIRST_BUCKET_MB * MB if ddp_default else None
    return build_bucket_layout(shapes, bucket_cap_mb * MB, first_bucket_bytes=first)


def bucket_segments(
    layout: Sequence[Sequence[int]],
    ready_s: Sequence[float] | None,
    backward_s: float,
    *,
    pipelining: bool = True,
) -> tuple[float, ...] | None:
    """Backward compute between consecutive bucket-ready times, scaled to ``backward_s``.

    ``ready_s[i]``: when parameter i's gradient was ready, seconds after backward began
    (measured). A bucket is ready when its last gradient is. Without ready times the cost
    model spreads backward by parameter count (poor for CNNs, whose early layers have few
    parameters but much compute). ``pipelining=False``: nothing is sent before backward has
    ended, i.e. every bucket becomes ready at its end (all compute in the first segment).
    """
    if not layout:
        return None
    if not pipelining:
        return (backward_s,) + (0.0,) * (len(layout) - 1)
    if ready_s is None:
        return None
    ends = [max(ready_s[i] for i in bucket) for bucket in layout]
    segments, previous = [], 0.0
    for end in ends:
        end = max(end, previous)  # a bucket cannot be ready before the one DDP fires before it
        segments.append(end - previous)
        previous = end
    total = sum(segments)
    if total <= 0:
        return None
    return tuple(backward_s * s / total for s in segments)


@dataclass(frozen=True)
class Compute:
    """Compute of one step on one worker: forward (incl. data), backward, optimizer (seconds),
    and the measured ready time of every parameter's gradient (None: spread by size)."""

    forward_s: float
    backward_s: float
    optimizer_s: float
    ready_s: tuple[float, ...] | None = None
    label: str = "measured"
    #: The cost model's host terms (planning.costmodel): σ of compute per step, and host
    #: CPU per collective. 0 where not measured (the paper-scale GPU inputs).
    jitter_s: float = 0.0
    collective_cpu_s: float = 0.0


def predict(
    method: str,
    shapes: Sequence[Sequence[int]],
    compute: Compute,
    workers: int,
    link: Link,
    *,
    rank: int = 4,
    codec: CodecModel | None = None,
    bucket_cap_mb: float = DEFAULT_BUCKET_CAP_MB,
    pipelining: bool = True,
    ddp_default_first_bucket: bool = False,
) -> StepPrediction:
    """Predicted step of ``method`` with ``workers`` workers on ``link``: the cost model, fed.

    ``codec`` is the method's encode+decode cost (default: the cost model's uncalibrated CPU
    guess). ``bucket_cap_mb`` is the fusion buffer, ``pipelining`` the paper's ablation.
    """
    spec = method_spec(method, rank)
    shape_tuple = tuple(tuple(int(d) for d in s) for s in shapes)
    layout = layout_for(shape_tuple, bucket_cap_mb, ddp_default=ddp_default_first_bucket)
    segments = bucket_segments(layout, compute.ready_s, compute.backward_s, pipelining=pipelining)
    profile = StepProfile.build(
        shape_tuple,
        forward_s=compute.forward_s,
        backward_s=compute.backward_s,
        optimizer_s=compute.optimizer_s,
        buckets=layout,
        bucket_backward_s=segments,
        compute_jitter_s=compute.jitter_s,
        collective_cpu_s=compute.collective_cpu_s,
    )
    return predict_step(spec, profile, workers, link, codec=codec)


