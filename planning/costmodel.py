"""Predicted time of one training step for a candidate compressor (torch-free).

The adaptive policy (run by the coordinator's web process, which never imports torch) and the
benchmark scale simulator both ask the same question: *how long would a step take with this
compressor, on this model, over this link?* This module answers it with the α-β time model of
docs/cost-model.md ("The alpha-beta link model"), placed on two servers that each do one thing at a time:

* the **compute stream** runs backward bucket by bucket (buckets become ready in reverse layer
  order), each bucket's encode right after its gradients, and the compute that communication
  triggers (PowerSGD's between-round orthogonalisation and ``Mᵀ P̂``, every bucket's decode);
* the **link** serves one collective at a time, in the order they become ready.

Algorithm of :func:`predict_step` (times relative to the start of backward):

1. Bucket ``k``'s backward segment (measured backward time spread over buckets in proportion
   to their parameter count, unless per-bucket times are given) and its encode run on the
   compute stream; the bucket is ready at ``τ_k``.
2. Its collective starts when both it and the link are ready: ``c_k = max(τ_k, c_{k-1}) + T_k``
   with ``T_k`` from :func:`all_reduce_s` / :func:`all_gather_s`. PowerSGD has two dependent
   rounds: round 2 becomes ready only after round 1 finished *and* the compute between them
   ran, so other buckets' rounds may use the link meanwhile.
3. When a bucket's last round finishes, its decode runs on the compute stream. How decode
   "competes with backward" is modelled simply: compute triggered by communication runs at the
   next bucket boundary, ahead of the remaining backward segments (it delays them; a segment is
   never interrupted). Decode after backward ended is exposed in full.
4. ``t_step = t_fwd + (time both servers are done) + t_opt``. With a single bucket, no codec,
   one round and none of the host terms below, this is exactly ``t_fwd + max(t_bwd, c_last) + t_opt``.

Three host terms, each measured where it arises and 0 unless given, complete the α-β model on
real machines (on this project's 2-core VM testbed they made the step 20-30 % longer than the
bare model for compressed runs, whose payloads are tiny):

* **straggler wait** (``StepProfile.compute_jitter_s``, σ of one rank's compute per step):
  a collective starts when the *last* rank arrives, on average ``e_N·σ`` after the mean,
  where ``e_N`` is the expected maximum of N standard normals (:func:`expected_max_normal`;
  0.56 for 2 ranks, 2.07 for 32). Ranks line up at the end of every step (its last
  collective), so the skew builds up through the step: bucket ``k``'s collective waits
  ``e_N·σ·√f_k``, ``f_k`` the share of forward+backward done when it is ready.
* **waking the link** (``Link.wake_s``): a collective that starts on an idle link costs this
  much more than the α-β time -- the peers' communication threads sleep and must be woken,
  which on VMs has a heavy tail. A collective queued behind a running one pays nothing.
* **host CPU per collective** (``StepProfile.collective_cpu_s``): the hook, issuing the
  collective and its completion callback run on the worker's CPU, i.e. on the compute
  stream. It matters when the bucket layout changes (tensor fusion off: one collective per
  tensor); a worker's measured backward already includes it for its own layout.

Bytes come from :func:`planning.wire.tensor_wire_bytes`, so ``bytes_per_step`` equals
``planning.wire.wire_bytes``. ACP-SGD alternates P-steps (``4·r·n`` bytes) and Q-steps
(``4·r·m``); the model uses the **average step** (``4·r·(n+m)/2`` per matrix), one round.

Pure Python and cached per (spec, shapes, buckets, world size), so thousands of predictions a
second are possible for models of a few hundred tensors. The link model lives in
``planning/link.py``, the bucket layout and per-bucket loads in ``planning/buckets.py`` (each
compressor's work model in its description, ``planning/codecs/``), the candidate set in
``planning/candidates.py``; this module re-exports their public names.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from functools import cached_property
from typing import Iterable, Mapping, Sequence

from planning.buckets import (
    DDP_BUCKET_CAP_BYTES,
    DDP_FIRST_BUCKET_BYTES,
    DEFAULT_CPU_CODEC,
    BucketLoad,
    CodecCost,
    CodecModel,
    ElementCost,
    Layout,
    bucket_loads,
    build_bucket_layout,
    codec_work,
    complete_layout,
)
from planning.candidates import DEFAULT_TOPK_RATIOS, candidate_ranks, candidates
from planning.codec import CompressorSpec
from planning.codecs.lowrank import MACS_PER_ELEMENT_PASS
from planning.link import (
    Burst,
    Link,
    all_gather_s,
    all_reduce_s,
    alpha_beta_from_bandwidth,
    expected_max_normal,
    ring_coefficients,
)
from planning.shapes import Shape, numel

# The cost model's public names, wherever they live (link, bucket layout, candidates).
__all__ = [
    "DDP_BUCKET_CAP_BYTES", "DDP_FIRST_BUCKET_BYTES", "DEFAULT_CPU_CODEC", "DEFAULT_TOPK_RATIOS",
    "MACS_PER_ELEMENT_PASS", "CodecCost", "CodecModel", "ElementCost", "Layout", "Link", "StepPrediction",
    "StepProfile", "all_gather_s", "all_reduce_s", "alpha_beta_from_bandwidth", "build_bucket_layout",
    "candidate_ranks", "candidates", "codec_work", "expected_max_normal", "predict_step", "ring_coefficients",
]


@dataclass(frozen=True)
class StepProfile:
    """What the cost model knows about a model; build one with :meth:`build`.

    ``backward_s`` is backward *compute* (as measured without communication); the model adds
    communication itself. ``codec_costs`` maps a candidate label (``"acpsgd-r4"``) to its
    calibrated cost; labels without one use ``default_codec``. ``compute_jitter_s`` (σ of one
    rank's forward+backward compute per step) and ``collective_cpu_s`` (host CPU per
    collective) are the module docstring's host terms.
    """

    shapes: tuple[tuple[int, ...], ...]
    buckets: Layout
    forward_s: float
    backward_s: float
    optimizer_s: float = 0.0
    bucket_backward_s: tuple[float, ...] | None = None
    codec_costs: Mapping[str, CodecModel] = field(default_factory=dict)
    default_codec: CodecModel = DEFAULT_CPU_CODEC
    compute_jitter_s: float = 0.0
    collective_cpu_s: float = 0.0

    @classmethod
    def build(
        cls,
        shapes: Iterable[Shape],
        forward_s: float,
        backward_s: float,
        optimizer_s: float = 0.0,
        buckets: Iterable[Iterable[int]] | None = None,
        bucket_backward_s: Sequence[float] | None = None,
        codec_costs: Mapping[str, CodecModel] | None = None,
        default_codec: CodecModel = DEFAULT_CPU_CODEC,
        bucket_cap_bytes: float = DDP_BUCKET_CAP_BYTES,
        compute_jitter_s: float = 0.0,
        collective_cpu_s: float = 0.0,
    ) -> "StepProfile":
        """Normalise lists to tuples; without ``buckets``, use a DDP-like layout."""
        shape_tuple = tuple(tuple(int(d) for d in s) for s in shapes)
        bucket_list = list(buckets) if buckets is not None else []
        layout = (
            complete_layout(bucket_list, len(shape_tuple))
            if bucket_list
            else build_bucket_layout(shape_tuple, bucket_cap_bytes)
        )
        per_bucket = None
        if bucket_backward_s is not None:
            per_bucket = tuple(float(t) for t in bucket_backward_s)
            if len(per_bucket) != len(layout):
                raise ValueError(
                    f"bucket_backward_s: {len(per_bucket)} times for {len(layout)} buckets"
                )
        for name, value in (("forward_s", forward_s), ("backward_s", backward_s), ("optimizer_s", optimizer_s),
                            ("compute_jitter_s", compute_jitter_s), ("collective_cpu_s", collective_cpu_s)):
            if not value >= 0:
                raise ValueError(f"{name}: must be >= 0, got {value!r}")
        return cls(
            shapes=shape_tuple,
            buckets=layout,
            forward_s=float(forward_s),
            backward_s=float(backward_s),
            optimizer_s=float(optimizer_s),
            bucket_backward_s=per_bucket,
            codec_costs=dict(codec_costs or {}),
            default_codec=default_codec,
            compute_jitter_s=float(compute_jitter_s),
            collective_cpu_s=float(collective_cpu_s),
        )

    def codec_for(self, spec: CompressorSpec) -> CodecModel:
        return self.codec_costs.get(spec.label, self.default_codec)

    def backward_segments(self) -> tuple[float, ...]:
        """Backward compute per bucket: given, or spread by parameter count."""
        return self._segments

    @cached_property
    def _segments(self) -> tuple[float, ...]:
        """:meth:`backward_segments`, worked out once per profile. Why cached: the policy
        predicts some 40 steps a report from one profile (every candidate, at each level of an
        oscillating link), and summing the shapes' sizes per bucket each time was a third of
        its time (0.66 ms a report at the median on the benchmark's CNN, session 33)."""
        if self.bucket_backward_s is not None:
            return self.bucket_backward_s
        counts = [sum(numel(self.shapes[i]) for i in bucket) for bucket in self.buckets]
        total = sum(counts)
        if total == 0:
            return tuple(self.backward_s / len(counts) for _ in counts) if counts else ()
        return tuple(self.backward_s * c / total for c in counts)

    def straggler_waits(self, world_size: int) -> tuple[float, ...]:
        """Per bucket, how long its first collective waits for the slowest rank on average:
        ``e_N·σ·√f_k`` (module docstring), 0 without jitter or with one rank."""
        scale = expected_max_normal(world_size) * self.compute_jitter_s
        if scale <= 0:
            return tuple(0.0 for _ in self._segments)
        return tuple(scale * root for root in self._done_roots)

    @cached_property
    def _done_roots(self) -> tuple[float, ...]:
        """``√f_k`` per bucket: the share of forward and backward compute done when bucket k is
        ready, square-rooted (:meth:`straggler_waits`); all 0 when there is no compute."""
        segments = self._segments
        total = self.forward_s + math.fsum(segments)
        if total <= 0:
            return tuple(0.0 for _ in segments)
        done, roots = self.forward_s, []
        for segment in segments:
            done += segment
            roots.append(math.sqrt(min(1.0, done / total)))
        return tuple(roots)


@dataclass(frozen=True)
class StepPrediction:
    """Predicted time of one step, broken down.

    ``step_s = compute_s + codec_s + exposed_comm_s``: compute is forward + backward +
    optimizer, codec is every encode/between-round/decode second, and the rest is the time
    the step waited for the link.
    """

    label: str
    step_s: float
    compute_s: float
    comm_s: float  # link busy time, overlapped or not
    exposed_comm_s: float
    codec_s: float
    bytes_per_step: float
    codec_calibrated: bool = True


def _phase_seconds(
    loads: Sequence[BucketLoad], codec: CodecModel
) -> tuple[list[float], list[float], list[float], bool]:
    """Encode, between-round and decode seconds per bucket under a codec cost model."""
    if isinstance(codec, ElementCost):

        def cost(work: float) -> float:
            return codec.fixed_s + codec.per_element_s * work if work > 0 else 0.0

        return (
            [cost(b.encode) for b in loads],
            [cost(b.between) for b in loads],
            [cost(b.decode) for b in loads],
            codec.calibrated,
        )
    total = math.fsum(b.encode + b.between + b.decode for b in loads)
    if total <= 0:
        return [0.0] * len(loads), [0.0] * len(loads), [0.0] * len(loads), True
    scale = codec.step_s / total
    return (
        [b.encode * scale for b in loads],
        [b.between * scale for b in loads],
        [b.decode * scale for b in loads],
        True,
    )


def _link_rounds(spec: CompressorSpec, loads: Sequence[BucketLoad], world_size: int, link: Link) -> list[tuple[float, ...]]:
    """Link seconds of each bucket's rounds (one round, or PowerSGD's two).

    A shaper's burst (``link.burst_bytes``) is spent on the step's first bytes, in the order
    the buckets fire (round 2s come later, so they get what round 1s left).
    """
    burst = Burst(link.burst_bytes)
    firsts = []
    for b in loads:
        first = burst.collective_s("all_reduce", b.round1_bytes, world_size, link) if b.round1_bytes > 0 else 0.0
        if b.gather_bytes > 0:
            first += burst.collective_s("all_gather", b.gather_bytes, world_size, link)
        firsts.append(first)
    return [(first, burst.collective_s("all_reduce", b.round2_bytes, world_size, link)) if b.round2_bytes > 0 else (first,)
            for first, b in zip(firsts, loads)]



def _simulate(
    backward: Sequence[float],
    encode: Sequence[float],
    between: Sequence[float],
    decode: Sequence[float],
    rounds: Sequence[tuple[float, ...]],
    waits: Sequence[float] = (),
    wake_s: float = 0.0,
) -> float:
    """Seconds from the start of backward until compute stream and link are both done.

    A small discrete-event simulation of two servers (see the module docstring). Work is
    committed in order of start time, so every task that is ready before a start is known.
    Compute triggered by communication (between-round work, decode) goes ahead of the next
    backward segment; the link takes rounds first-come first-served. ``waits[k]`` delays
    bucket ``k``'s first round on the link (the slowest rank arrives later); a round that
    finds the link idle takes ``wake_s`` longer.
    """
    count = len(backward)
    compute_free = link_free = 0.0
    next_bucket = 0
    triggered: list[tuple[float, int, int]] = []  # (ready, bucket, finished round) on compute
    on_link: list[tuple[float, int, int]] = []  # (ready, bucket, round) for the link
    while next_bucket < count or triggered or on_link:
        if triggered and (triggered[0][0] <= compute_free or next_bucket >= count):
            compute_start = max(triggered[0][0], compute_free)
        elif next_bucket < count:
            compute_start = compute_free
        else:
            compute_start = math.inf
        link_start = max(on_link[0][0], link_free) if on_link else math.inf
        if link_start <= compute_start:  # ties: let a finished round trigger its compute first
            ready, k, i = heapq.heappop(on_link)
            link_free = link_start + rounds[k][i] + (wake_s if ready > link_free else 0.0)
            heapq.heappush(triggered, (link_free, k, i))
        elif triggered and triggered[0][0] <= compute_start:
            _, k, i = heapq.heappop(triggered)
            if i + 1 < len(rounds[k]):  # between rounds: orthogonalise, next factor
                compute_free = compute_start + between[k]
                heapq.heappush(on_link, (compute_free, k, i + 1))
            else:
                compute_free = compute_start + decode[k]
        else:
            k = next_bucket
            next_bucket += 1
            compute_free = compute_start + backward[k] + encode[k]
            heapq.heappush(on_link, (compute_free + (waits[k] if waits else 0.0), k, 0))
    return max(compute_free, link_free)


def predict_step(
    spec: CompressorSpec,
    profile: StepProfile,
    world_size: int,
    link: Link,
    codec: CodecModel | None = None,
) -> StepPrediction:
    """Predict one step's time with ``spec`` (see the module docstring for the model).

    ``codec`` overrides the profile's cost for this candidate (default: ``profile.codec_for``).
    """
    if world_size < 1:
        raise ValueError(f"world_size: must be >= 1, got {world_size}")
    loads = bucket_loads(spec, profile.shapes, profile.buckets, world_size)
    encode, between, decode, calibrated = _phase_seconds(loads, codec or profile.codec_for(spec))
    codec_s = math.fsum(encode) + math.fsum(between) + math.fsum(decode)
    rounds = _link_rounds(spec, loads, world_size, link)
    if profile.collective_cpu_s > 0 and world_size > 1:
        # Issued by the hook (round 1) or a completion callback (round 2): host CPU.
        cpu = profile.collective_cpu_s
        encode = [e + cpu * ((b.round1_bytes > 0) + (b.gather_bytes > 0)) for e, b in zip(encode, loads)]
        between = [t + cpu * (b.round2_bytes > 0) for t, b in zip(between, loads)]
    backward = profile.backward_segments()
    waits = profile.straggler_waits(world_size)
    span = _simulate(backward, encode, between, decode, rounds, waits, link.wake_s if world_size > 1 else 0.0)
    compute = profile.forward_s + math.fsum(backward) + profile.optimizer_s
    step = profile.forward_s + span + profile.optimizer_s
    return StepPrediction(
        label=spec.label,
        step_s=step,
        compute_s=compute,
        comm_s=math.fsum(t for r in rounds for t in r),
        exposed_comm_s=max(0.0, step - compute - codec_s),
        codec_s=codec_s,
        bytes_per_step=math.fsum(b.round1_bytes + b.round2_bytes + b.gather_bytes for b in loads),
        codec_calibrated=calibrated,
    )
