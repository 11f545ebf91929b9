"""What a compressor is, without torch: its validated spec, its parameters and the base of
every compressor's description (:class:`Codec`).

Each compressor has one description module in ``planning/codecs/`` (a :class:`Codec`
subclass: name, parameters, collective and rounds, byte formula, the cost model's work
model, how lossy it is for the policy, and the import path of its torch kernel in
``compressors/``) and one entry in ``planning/registry.py``. Everything else (``make_spec``,
``planning.wire``, the cost model, the policy, ``compressors.build``, job validation) asks
the registry, so a new compressor is its two modules plus that entry (docs/compressors.md,
"How to add a compressor").

This module imports only the standard library and ``planning.shapes``: the description
modules and the registry sit above it, so nothing here can close an import cycle.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

from planning.shapes import Shape, numel

DEFAULT_RANK = 4
DEFAULT_RATIO = 0.01
DEFAULT_MIN_COMPRESS_NUMEL = 0
MAX_RANK = 4096

Collective = Literal["all_reduce", "all_gather"]


@dataclass(frozen=True)
class CompressorSpec:
    """A validated compressor choice. Build one with :func:`planning.spec.make_spec`.

    ``rank`` is set only for compressors that take a rank and ``ratio`` only for those that
    take a ratio, so two specs compare equal exactly when they would behave the same.
    """

    name: str
    rank: int | None = None
    ratio: float | None = None
    warmup_steps: int = 0
    min_compress_numel: int = DEFAULT_MIN_COMPRESS_NUMEL
    seed: int = 0

    @property
    def label(self) -> str:
        """Short human label: ``acpsgd-r4``, ``topk-0.01``, ``none``."""
        if self.rank is not None:
            return f"{self.name}-r{self.rank}"
        if self.ratio is not None:
            return f"{self.name}-{self.ratio:g}"
        return self.name

    def params(self) -> dict[str, Any]:
        """The keyword arguments that rebuild this spec with ``make_spec(name, **params)``."""
        return {k: v for k, v in dataclasses.asdict(self).items() if k != "name" and v is not None}


def require_int(field: str, value: Any, low: int, high: int | None = None) -> int:
    """``value`` as an int in ``[low, high]``, else ``ValueError`` starting with ``field``."""
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        else:
            raise ValueError(f"{field}: must be an integer, got {value!r}")
    if value < low or (high is not None and value > high):
        bound = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise ValueError(f"{field}: must be {bound}, got {value}")
    return value


def require_ratio(field: str, value: Any) -> float:
    """``value`` as a float in (0, 1], else ``ValueError`` starting with ``field``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{field}: must be a number in (0, 1], got {value!r}")
    if not 0 < value <= 1:
        raise ValueError(f"{field}: must be in (0, 1], got {value}")
    return float(value)


class Sweep(NamedTuple):
    """The bounds the adaptive policy sweeps a compressor's parameter within."""

    min_rank: int
    max_rank: int
    ratios: tuple[float, ...]


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


@dataclass(frozen=True)
class Param:
    """A compressor-specific parameter: its default, its validation and the policy's sweep.

    The two kinds are the ``CompressorSpec`` fields ``rank`` and ``ratio``; a compressor
    names the ones it takes in :attr:`Codec.params`.
    """

    name: Literal["rank", "ratio"]
    default: float

    def check(self, value: Any) -> Any:
        if self.name == "rank":
            return require_int("rank", value, 1, MAX_RANK)
        return require_ratio("ratio", value)

    def sweep(self, bounds: Sweep) -> tuple[Any, ...]:
        """The values the adaptive policy tries, the least lossy first."""
        if self.name == "rank":
            return candidate_ranks(bounds.min_rank, bounds.max_rank)
        return tuple(sorted(set(bounds.ratios), reverse=True))


RANK = Param("rank", DEFAULT_RANK)
RATIO = Param("ratio", DEFAULT_RATIO)


class TensorLoad(NamedTuple):
    """One gradient's share of its bucket, for the cost model: bytes per round and codec
    work per phase, in element passes (docs/cost-model.md, "The work model")."""

    round1_bytes: float  # fused into the bucket's first all-reduce
    round2_bytes: float  # a second, dependent all-reduce (PowerSGD's Q factors)
    gather_bytes: float  # all-gather payload
    encode: float  # element passes before the first round
    between: float  # element passes between the two rounds
    decode: float  # element passes after the last round


class Codec:
    """The torch-free description of one compressor; subclass it in ``planning/codecs/``.

    Class attributes say what the compressor is; the methods give its formulas. The defaults
    suit a compressor that compresses every tensor of at least ``min_compress_numel``
    elements and sends the rest as fp32 in the same collective.
    """

    #: The name ``build`` and job specs use.
    name: str
    #: ``"module:attribute"`` of the torch kernel: a ``compressors.base.Compressor`` subclass
    #: taking the spec. A string, so that the torch-free registry does not import torch and the
    #: kernels (which import ``compressors.base``) are not imported by it: no import cycle.
    kernel: str
    #: The collective its payload travels in (sums need all-reduce; signs or sparse pairs
    #: cannot be summed and are all-gathered).
    collective: Collective = "all_reduce"
    #: Dependent collective rounds per bucket and step (``GradientSync`` makes one ordered
    #: process group per round after the first).
    rounds: int = 1
    #: The compressor-specific parameters it accepts (besides the common ones).
    params: tuple[Param, ...] = ()
    #: Whether it keeps error-feedback residuals (a switch carries them over).
    error_feedback: bool = False
    #: Position in the least-lossy-first order: the policy breaks ties between equally fast
    #: candidates by it.
    lossiness: int = 100
    #: Its relative error when it is known without a measurement (the casts' unit round-off);
    #: None: measured (a lossy candidate without a measurement is not chosen).
    known_error: float | None = None
    #: Lossy with no rank to raise: excluded by the policy in a critical regime.
    too_lossy_when_critical: bool = False
    #: Compressors whose error estimates err the same way share a family (default: its name).
    family: str | None = None
    #: Compresses every tensor, whatever its size (the casts): never "compresses nothing".
    compresses_everything: bool = False
    #: Steps after which what it does repeats (ACP-SGD alternates P- and Q-steps: 2). Its
    #: quality is measured over that many consecutive steps: one step sees one half only.
    cycle_steps: int = 1

    def __repr__(self) -> str:
        return f"<codec {self.name}>"

    def takes(self, param: str) -> bool:
        return any(p.name == param for p in self.params)

    def error_family(self) -> str:
        return self.family or self.name

    # -- which tensors, how many bytes --------------------------------------------------
    def compresses(self, spec: CompressorSpec, shape: Shape) -> bool:
        """Whether it compresses a gradient of ``shape``; otherwise it travels as fp32."""
        return self.compresses_everything or numel(shape) >= max(1, spec.min_compress_numel)

    def compressed_bytes(self, spec: CompressorSpec, shape: Shape, element_bytes: int) -> float:
        """Average bytes per step of one compressed gradient (called only when it is compressed)."""
        raise NotImplementedError(f"{self.name}: no byte formula")

    def tensor_bytes(self, spec: CompressorSpec, shape: Shape, element_bytes: int) -> float:
        """Average bytes per step this rank contributes to collectives for one gradient."""
        if not self.compresses(spec, shape):
            return element_bytes * numel(shape)
        return self.compressed_bytes(spec, shape, element_bytes)

    def why_nothing_compressed(self, spec: CompressorSpec, shapes: list[tuple[int, ...]]) -> str:
        """Why none of ``shapes`` (non-empty, none compressed) is compressed: a sentence."""
        largest = max(shapes, key=numel)
        return (f"{spec.label} compresses none of the {len(shapes)} gradients: the largest, {largest} "
                f"({numel(largest)} elements), is below min_compress_numel={spec.min_compress_numel}")

    # -- the cost model's work model --------------------------------------------------------
    def compressed_load(self, spec: CompressorSpec, shape: Shape, world_size: int, wire: float) -> TensorLoad:
        """Bytes and work of one compressed gradient (``wire``: its :meth:`tensor_bytes`)."""
        raise NotImplementedError(f"{self.name}: no work model")

    def load(self, spec: CompressorSpec, shape: Shape, world_size: int, wire: float) -> TensorLoad:
        """Bytes and work of one gradient; an uncompressed one is copied into and out of the
        fused buffer of the first round."""
        if not self.compresses(spec, shape):
            size = numel(shape)
            return TensorLoad(wire, 0.0, 0.0, size, 0.0, size)
        return self.compressed_load(spec, shape, world_size, wire)

    # -- the policy -----------------------------------------------------------------------
    def variants(self, bounds: Sweep) -> list[dict[str, Any]]:
        """The parameter sets the adaptive policy considers, the least lossy first."""
        out: list[dict[str, Any]] = [{}]
        for param in self.params:
            out = [{**partial, param.name: value} for partial in out for value in param.sweep(bounds)]
        return out


#: The parameters every compressor takes, with their validation.
COMMON_PARAMS = frozenset({"warmup_steps", "min_compress_numel", "seed"})


def common_values(params: dict[str, Any]) -> dict[str, Any]:
    """The validated common parameters of a spec."""
    return {
        "warmup_steps": require_int("warmup_steps", params.get("warmup_steps", 0), 0, 10**9),
        "min_compress_numel": require_int(
            "min_compress_numel", params.get("min_compress_numel", DEFAULT_MIN_COMPRESS_NUMEL), 0
        ),
        "seed": require_int("seed", params.get("seed", 0), 0, 2**63 - 1),
    }
