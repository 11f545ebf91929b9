"""Compressor names, validated parameters and the collective each one needs.

This module is torch-free on purpose: the coordinator (which never imports torch)
validates job specs and runs the adaptive policy with it, and ``build()`` uses the
same validation, so a bad parameter is refused with the same message everywhere.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Literal, Mapping

CompressorName = Literal["none", "fp16", "bf16", "signsgd", "topk", "powersgd", "acpsgd"]

#: Every compressor ``build()`` knows, in order from no compression to the most.
COMPRESSOR_NAMES: tuple[str, ...] = ("none", "fp16", "bf16", "signsgd", "topk", "powersgd", "acpsgd")

#: The collective a compressor's payload travels in. Sign bits and sparse (value, index)
#: pairs cannot be summed, so those two need an all-gather; the rest keep all-reduce.
COLLECTIVE: Mapping[str, Literal["all_reduce", "all_gather"]] = {
    "none": "all_reduce",
    "fp16": "all_reduce",
    "bf16": "all_reduce",
    "signsgd": "all_gather",
    "topk": "all_gather",
    "powersgd": "all_reduce",
    "acpsgd": "all_reduce",
}

#: All-reduce rounds per step (PowerSGD's second round waits on the first).
ROUNDS_PER_STEP: Mapping[str, int] = {name: 2 if name == "powersgd" else 1 for name in COMPRESSOR_NAMES}

LOW_RANK = frozenset({"powersgd", "acpsgd"})
ERROR_FEEDBACK = frozenset({"signsgd", "topk", "powersgd", "acpsgd"})

# Which optional parameter each compressor accepts (besides the common ones).
_SPECIFIC: Mapping[str, frozenset[str]] = {
    "none": frozenset(),
    "fp16": frozenset(),
    "bf16": frozenset(),
    "signsgd": frozenset(),
    "topk": frozenset({"ratio"}),
    "powersgd": frozenset({"rank"}),
    "acpsgd": frozenset({"rank"}),
}
_COMMON = frozenset({"warmup_steps", "min_compress_numel", "seed"})

DEFAULT_RANK = 4
DEFAULT_RATIO = 0.01
DEFAULT_MIN_COMPRESS_NUMEL = 0
MAX_RANK = 4096


@dataclass(frozen=True)
class CompressorSpec:
    """A validated compressor choice. Build one with :func:`make_spec`.

    ``rank`` is set only for low-rank compressors and ``ratio`` only for top-k, so two
    specs compare equal exactly when they would behave the same.
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

    @property
    def collective(self) -> str:
        return COLLECTIVE[self.name]

    def params(self) -> dict[str, Any]:
        """The keyword arguments that rebuild this spec with ``make_spec(name, **params)``."""
        out = {k: v for k, v in dataclasses.asdict(self).items() if k != "name" and v is not None}
        return out


def _require_int(field: str, value: Any, low: int, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        else:
            raise ValueError(f"{field}: must be an integer, got {value!r}")
    if value < low or (high is not None and value > high):
        bound = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise ValueError(f"{field}: must be {bound}, got {value}")
    return value


def make_spec(name: str, **params: Any) -> CompressorSpec:
    """Validate a compressor name and its parameters.

    Raises ``ValueError`` whose message starts with the offending field, e.g.
    ``"rank: must be in [1, 4096], got 0"`` or ``"name: unknown compressor 'zip'"``.
    """
    if not isinstance(name, str) or name not in COMPRESSOR_NAMES:
        raise ValueError(f"name: unknown compressor {name!r}; choose one of {', '.join(COMPRESSOR_NAMES)}")
    allowed = _SPECIFIC[name] | _COMMON
    unknown = sorted(set(params) - allowed)
    if unknown:
        raise ValueError(
            f"{unknown[0]}: not a parameter of {name!r} (it takes {', '.join(sorted(allowed))})"
        )
    values: dict[str, Any] = {}
    if name in LOW_RANK:
        values["rank"] = _require_int("rank", params.get("rank", DEFAULT_RANK), 1, MAX_RANK)
    if name == "topk":
        ratio = params.get("ratio", DEFAULT_RATIO)
        if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not math.isfinite(ratio):
            raise ValueError(f"ratio: must be a number in (0, 1], got {ratio!r}")
        if not 0 < ratio <= 1:
            raise ValueError(f"ratio: must be in (0, 1], got {ratio}")
        values["ratio"] = float(ratio)
    values["warmup_steps"] = _require_int("warmup_steps", params.get("warmup_steps", 0), 0, 10**9)
    values["min_compress_numel"] = _require_int(
        "min_compress_numel", params.get("min_compress_numel", DEFAULT_MIN_COMPRESS_NUMEL), 0
    )
    values["seed"] = _require_int("seed", params.get("seed", 0), 0, 2**63 - 1)
    return CompressorSpec(name=name, **values)


def spec_from_dict(data: Mapping[str, Any]) -> CompressorSpec:
    """Inverse of ``{"name": spec.name, **spec.params()}`` (used by checkpoints and the wire)."""
    data = dict(data)
    if "name" not in data:
        raise ValueError("name: missing")
    return make_spec(data.pop("name"), **data)


def spec_to_dict(spec: CompressorSpec) -> dict[str, Any]:
    return {"name": spec.name, **spec.params()}
