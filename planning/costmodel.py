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
second are possible for models of a few hundred tensors.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from functools import lru_cache
from statistics import NormalDist
from typing import Iterable, Mapping, NamedTuple, Sequence, Union

from planning.spec import LOW_RANK, CompressorSpec, make_spec
from planning.wire import (
    FP32_BYTES,
    effective_rank,
    is_compressed,
    matrix_dims,
    numel,
    tensor_wire_bytes,
    topk_count,
)

Shape = Sequence[int]
Layout = tuple[tuple[int, ...], ...]

#: DDP's defaults: ``bucket_cap_mb=25`` and a small first bucket (``_DEFAULT_FIRST_BUCKET_BYTES``)
#: so that the first all-reduce starts early in backward.
DDP_BUCKET_CAP_BYTES = 25 * 1024 * 1024
DDP_FIRST_BUCKET_BYTES = 1024 * 1024

#: A rank-r matrix product touches each element once and does r multiply-adds on it. On BLAS
#: kernels one elementwise pass costs about as much as this many multiply-adds, so the work
#: model counts ``n·m·r`` multiply-adds as ``n·m·r / MACS_PER_ELEMENT_PASS`` element passes.
MACS_PER_ELEMENT_PASS = 16


# --------------------------------------------------------------------------------------------
# Link and collectives
# --------------------------------------------------------------------------------------------


class Link(NamedTuple):
    """α (seconds per message) and β (seconds per byte) of the link between workers.

    ``wake_s``: see the module docstring's host terms.

    ``burst_bytes``: a token-bucket shaper (``tc tbf``, a cloud NIC's rate limit) lets this
    many bytes per rank through at line rate once the link has idled long enough to refill
    the bucket. Steps idle the link during forward and early backward, so the model lets the
    first ``burst_bytes`` each rank sends in a step cost no transfer time. Probes cannot see
    it (they measure the sustained rate); it is 0 unless the shaper is known (the testbed's).
    """

    alpha: float
    beta: float
    burst_bytes: float = 0.0
    #: Extra seconds a collective takes when it starts on an idle link (module docstring).
    wake_s: float = 0.0


def alpha_beta_from_bandwidth(bytes_per_second: float, latency_s: float) -> Link:
    """The α-β link of a measured bandwidth (bytes/s per worker link) and latency (s)."""
    if not bytes_per_second > 0:
        raise ValueError(f"bytes_per_second: must be > 0, got {bytes_per_second!r}")
    if not latency_s >= 0:
        raise ValueError(f"latency_s: must be >= 0, got {latency_s!r}")
    return Link(alpha=float(latency_s), beta=1.0 / float(bytes_per_second))


def ring_coefficients(kind: str, world_size: int) -> tuple[float, float]:
    """(latency factor, byte factor) of a ring collective: ``t = lat·α + bytes·b·β``.

    ``b`` is what one rank passes in (its all-reduce tensor, or its all-gather shard).
    The one place the ring formulas live: the cost model and the link probe's fit use it.
    """
    n = world_size
    if n < 1:
        raise ValueError(f"world_size: must be >= 1, got {n}")
    if kind == "all_reduce":
        return 2.0 * (n - 1), 2.0 * (n - 1) / n
    if kind == "all_gather":
        return float(n - 1), float(n - 1)
    raise ValueError(f"kind: must be 'all_reduce' or 'all_gather', got {kind!r}")


def all_reduce_s(nbytes: float, world_size: int, link: Link) -> float:
    """Ring all-reduce of ``nbytes``: ``2(N−1)·α + 2(N−1)/N · b·β``; zero for one worker."""
    latency, per_byte = ring_coefficients("all_reduce", world_size)
    return latency * link.alpha + per_byte * nbytes * link.beta


def all_gather_s(nbytes_per_worker: float, world_size: int, link: Link) -> float:
    """Ring all-gather, ``b`` bytes from each worker: ``(N−1)·α + (N−1) · b·β``."""
    latency, per_byte = ring_coefficients("all_gather", world_size)
    return latency * link.alpha + per_byte * nbytes_per_worker * link.beta


def expected_max_normal(count: int) -> float:
    """Expected maximum of ``count`` independent standard normals (Blom's approximation).

    0 for one rank, 0.59 for 2 (exact: 0.56), 1.55 for 8, 2.07 for 32, 2.41 for 64: how many
    standard deviations of compute jitter the slowest of ``count`` ranks lags the mean.
    """
    if count < 1:
        raise ValueError(f"count: must be >= 1, got {count}")
    return NormalDist().inv_cdf((count - 0.375) / (count + 0.25)) if count > 1 else 0.0


# --------------------------------------------------------------------------------------------
# Bucket layout
# --------------------------------------------------------------------------------------------


def build_bucket_layout(
    shapes: Sequence[Shape],
    bucket_cap_bytes: float = DDP_BUCKET_CAP_BYTES,
    first_bucket_bytes: float | None = DDP_FIRST_BUCKET_BYTES,
    element_bytes: int = FP32_BYTES,
) -> Layout:
    """A DDP-like bucket layout: parameter indices per bucket, in the order buckets fire.

    Like DDP, parameters are taken in reverse order (the last layer's gradients are ready
    first); a bucket closes once it holds at least its cap, so one large tensor may overflow
    it. The first bucket uses ``first_bucket_bytes`` (DDP: 1 MiB) so communication starts
    early; pass ``None`` to use ``bucket_cap_bytes`` throughout.
    """
    if not bucket_cap_bytes > 0:
        raise ValueError(f"bucket_cap_bytes: must be > 0, got {bucket_cap_bytes!r}")
    buckets: list[tuple[int, ...]] = []
    current: list[int] = []
    size = 0.0
    for index in reversed(range(len(shapes))):
        current.append(index)
        size += numel(shapes[index]) * element_bytes
        cap = first_bucket_bytes if (not buckets and first_bucket_bytes) else bucket_cap_bytes
        if size >= cap:
            buckets.append(tuple(current))
            current, size = [], 0.0
    if current:
        buckets.append(tuple(current))
    return tuple(buckets)


def _complete_layout(buckets: Iterable[Iterable[int]], count: int) -> Layout:
    """Validate a layout; parameters it leaves out are appended as one last bucket.

    The extra bucket keeps ``bytes_per_step`` equal to ``wire_bytes`` over all shapes.
    """
    layout = tuple(tuple(int(i) for i in bucket) for bucket in buckets if len(tuple(bucket)))
    seen: set[int] = set()
    for bucket in layout:
        for index in bucket:
            if not 0 <= index < count:
                raise ValueError(f"buckets: parameter index {index} out of range for {count} shapes")
            if index in seen:
                raise ValueError(f"buckets: parameter index {index} appears twice")
            seen.add(index)
    missing = tuple(i for i in reversed(range(count)) if i not in seen)
    return layout + ((missing,) if missing else ())


# --------------------------------------------------------------------------------------------
# Codec costs
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CodecCost:
    """Calibrated encode+decode seconds for one whole step of one candidate.

    The total is spread over buckets and over the encode / between-round / decode phases in
    proportion to the work model (:func:`codec_work`), so its placement in the step is right
    even though only the sum was measured.
    """

    step_s: float


@dataclass(frozen=True)
class ElementCost:
    """Per-element codec cost: ``seconds = fixed_s + per_element_s · elements`` per bucket phase.

    ``elements`` are element passes as counted by :func:`codec_work`; a worker calibrates
    ``per_element_s`` (and ``fixed_s``, kernel launches and buffer packing) on its own device
    by timing one step's encode+decode and dividing by that count.
    """

    per_element_s: float
    fixed_s: float = 0.0
    calibrated: bool = True


#: UNCALIBRATED default: roughly one CPU core streaming fp32 (≈1 G element passes/s, 50 µs
#: per bucket phase). GPUs are 10-100× faster; use a calibrated cost wherever one exists.
DEFAULT_CPU_CODEC = ElementCost(per_element_s=1e-9, fixed_s=50e-6, calibrated=False)

CodecModel = Union[CodecCost, ElementCost]


class _TensorLoad(NamedTuple):
    """One gradient's share of its bucket: bytes per round and codec work per phase."""

    round1_bytes: float  # fused into the bucket's first collective
    round2_bytes: float  # PowerSGD's Q factors (second, dependent round)
    gather_bytes: float  # all-gather payload (signsgd, topk)
    encode: float  # element passes before the first round
    between: float  # element passes between PowerSGD's rounds
    decode: float  # element passes after the last round


def _tensor_load(spec: CompressorSpec, shape: Shape, world_size: int) -> _TensorLoad:
    """Bytes and work for one gradient (see docs/cost-model.md, "The work model", and docs/compressors.md for each algorithm's steps)."""
    size = numel(shape)
    wire = tensor_wire_bytes(spec, shape)
    if spec.name == "none":
        return _TensorLoad(wire, 0.0, 0.0, 0.0, 0.0, 0.0)
    if spec.name in ("fp16", "bf16"):
        return _TensorLoad(wire, 0.0, 0.0, size, 0.0, size)  # cast down, cast up
    if not is_compressed(spec, shape):
        return _TensorLoad(wire, 0.0, 0.0, size, 0.0, size)  # copy into / out of the fused buffer
    if spec.name == "signsgd":
        # Encode: add error, scale and sign, residual. Decode: unpack and sum all N workers' signs.
        return _TensorLoad(0.0, 0.0, wire, 3 * size, 0.0, (world_size + 1) * size)
    if spec.name == "topk":
        kept = topk_count(spec, size)
        return _TensorLoad(0.0, 0.0, wire, 3 * size, 0.0, size + world_size * kept)
    n, m = matrix_dims(shape)
    r = effective_rank(spec, shape)
    product = size * r / MACS_PER_ELEMENT_PASS  # one n×m by m×r (or transposed) product
    if spec.name == "powersgd":
        # Encode: M = G + e, orth(Q), P = M Q. Between: orth(P), Q = Mᵀ P̂.
        # Decode: P̂ Qᵀ, e = M − approx, write the gradient.
        orth_q = m * r * r / MACS_PER_ELEMENT_PASS
        orth_p = n * r * r / MACS_PER_ELEMENT_PASS
        return _TensorLoad(
            FP32_BYTES * r * n, FP32_BYTES * r * m, 0.0,
            size + orth_q + product, orth_p + product, 2 * size + product,
        )
    if spec.name == "acpsgd":
        # Encode (average of P- and Q-steps): orth of the kept factor, X, residual e.
        # Decode: P Q̂ᵀ / N into the gradient.
        orth = (n + m) / 2 * r * r / MACS_PER_ELEMENT_PASS
        return _TensorLoad(wire, 0.0, 0.0, 2 * size + orth + 2 * product, 0.0, size + product)
    raise AssertionError(f"no load model for {spec.name}")


class _BucketLoad(NamedTuple):
    numel: int
    round1_bytes: float
    round2_bytes: float
    gather_bytes: float
    encode: float
    between: float
    decode: float


@lru_cache(maxsize=4096)
def _bucket_loads(
    spec: CompressorSpec, shapes: tuple[tuple[int, ...], ...], layout: Layout, world_size: int
) -> tuple[_BucketLoad, ...]:
    """Per-bucket bytes and work; cached because the simulator asks again and again."""
    loads = []
    for bucket in layout:
        parts = [_tensor_load(spec, shapes[i], world_size) for i in bucket]
        loads.append(
            _BucketLoad(
                sum(numel(shapes[i]) for i in bucket),
                *(math.fsum(p[j] for p in parts) for j in range(6)),
            )
        )
    return tuple(loads)


def codec_work(spec: CompressorSpec, shapes: Iterable[Shape], world_size: int) -> float:
    """Element passes one step's encode+decode does (the ``elements`` of :class:`ElementCost`).

    A worker calibrates ``per_element_s`` as measured seconds divided by this number.
    """
    total = 0.0
    for shape in shapes:
        load = _tensor_load(spec, tuple(shape), world_size)
        total += load.encode + load.between + load.decode
    return total


# --------------------------------------------------------------------------------------------
# Model profile and prediction
# --------------------------------------------------------------------------------------------


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
            _complete_layout(bucket_list, len(shape_tuple))
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
        segments = self.backward_segments()
        total = self.forward_s + math.fsum(segments)
        if scale <= 0 or total <= 0:
            return tuple(0.0 for _ in segments)
        done, waits = self.forward_s, []
        for segment in segments:
            done += segment
            waits.append(scale * math.sqrt(min(1.0, done / total)))
        return tuple(waits)


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
    loads: Sequence[_BucketLoad], codec: CodecModel
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


def _link_rounds(spec: CompressorSpec, loads: Sequence[_BucketLoad], world_size: int, link: Link) -> list[tuple[float, ...]]:
    """Link seconds of each bucket's rounds (one round, or PowerSGD's two).

    A shaper's burst (``link.burst_bytes``) is spent on the step's first bytes, in the order
    the buckets fire (round 2s come later, so they get what round 1s left).
    """
    burst = _Burst(link.burst_bytes)
    firsts = []
    for b in loads:
        first = burst.collective_s("all_reduce", b.round1_bytes, world_size, link) if b.round1_bytes > 0 else 0.0
        if b.gather_bytes > 0:
            first += burst.collective_s("all_gather", b.gather_bytes, world_size, link)
        firsts.append(first)
    return [(first, burst.collective_s("all_reduce", b.round2_bytes, world_size, link)) if b.round2_bytes > 0 else (first,)
            for first, b in zip(firsts, loads)]


class _Burst:
    """What is left of a shaper's burst in one step (see :class:`Link`)."""

    def __init__(self, nbytes: float) -> None:
        self.left = nbytes

    def collective_s(self, kind: str, nbytes: float, world_size: int, link: Link) -> float:
        """The collective's ring time less the transfer time of the burst it uses up."""
        _, per_byte = ring_coefficients(kind, world_size)
        free = min(self.left, per_byte * nbytes)  # of the bytes each rank puts on its link
        self.left -= free
        ring_s = all_reduce_s if kind == "all_reduce" else all_gather_s
        return ring_s(nbytes, world_size, link) - free * link.beta


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
    loads = _bucket_loads(spec, profile.shapes, profile.buckets, world_size)
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


# --------------------------------------------------------------------------------------------
# Candidates
# --------------------------------------------------------------------------------------------

DEFAULT_TOPK_RATIOS: tuple[float, ...] = (0.01, 0.001)

# Least lossy first; the policy breaks ties between equally fast candidates by this order.
_ORDER = ("none", "fp16", "bf16", "acpsgd", "powersgd", "topk", "signsgd")


def candidate_ranks(min_rank: int, max_rank: int) -> tuple[int, ...]:
    """Powers of two within ``[min_rank, max_rank]``, plus both bounds, highest first."""
    if min_rank < 1 or min_rank > max_rank:
        raise ValueError(f"min_rank: must be in [1, max_rank={max_rank}], got {min_rank}")
    ranks = {min_rank, max_rank}
    power = 1
    while power <= max_rank:
        if power >= min_rank:
            ranks.add(power)
        power *= 2
    return tuple(sorted(ranks, reverse=True))


@lru_cache(maxsize=256)
def _candidates(allowed: tuple[str, ...], min_rank: int, max_rank: int, ratios: tuple[float, ...]) -> tuple[CompressorSpec, ...]:
    unknown = [name for name in allowed if name not in _ORDER]
    if unknown:
        raise ValueError(f"allowed: unknown compressor {unknown[0]!r}")
    out: list[CompressorSpec] = []
    for name in _ORDER:
        if name not in allowed:
            continue
        if name in LOW_RANK:
            out.extend(make_spec(name, rank=r) for r in candidate_ranks(min_rank, max_rank))
        elif name == "topk":
            out.extend(make_spec(name, ratio=q) for q in sorted(set(ratios), reverse=True))
        else:
            out.append(make_spec(name))
    return tuple(out)


def candidates(
    allowed: Iterable[str],
    min_rank: int = 1,
    max_rank: int = 64,
    ratios: Iterable[float] = DEFAULT_TOPK_RATIOS,
) -> tuple[CompressorSpec, ...]:
    """Every (compressor, rank/ratio) option, least lossy first.

    none, fp16, bf16 and signsgd once each; powersgd and acpsgd at :func:`candidate_ranks`
    (highest rank first); topk at each ratio (largest first). Only names in ``allowed``.
    """
    return _candidates(tuple(allowed), int(min_rank), int(max_rank), tuple(float(q) for q in ratios))

