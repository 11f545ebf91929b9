"""Validated compressor specs: ``make_spec`` and the spec's wire form.

Torch-free on purpose: the coordinator (which never imports torch) validates job specs and
runs the adaptive policy with it, and ``build()`` uses the same validation, so a bad
parameter is refused with the same message everywhere. Which parameters a compressor takes
comes from its description in the registry (``planning/registry.py``).
"""

from __future__ import annotations

from typing import Any, Mapping

from planning import registry
from planning.codec import (
    COMMON_PARAMS,
    DEFAULT_MIN_COMPRESS_NUMEL,
    DEFAULT_RANK,
    DEFAULT_RATIO,
    MAX_RANK,
    CompressorSpec,
    common_values,
)

__all__ = [
    "COMPRESSOR_NAMES", "CompressorSpec", "DEFAULT_MIN_COMPRESS_NUMEL", "DEFAULT_RANK", "DEFAULT_RATIO",
    "MAX_RANK", "make_spec", "spec_from_dict", "spec_to_dict",
]

#: The built-in compressors, in order from no compression to the most
#: (``planning.registry.names()`` also lists registered ones).
COMPRESSOR_NAMES: tuple[str, ...] = registry.BUILTIN_NAMES


def make_spec(name: str, **params: Any) -> CompressorSpec:
    """Validate a compressor name and its parameters.

    Raises ``ValueError`` whose message starts with the offending field, e.g.
    ``"rank: must be in [1, 4096], got 0"`` or ``"name: unknown compressor 'zip'"``.
    """
    description = registry.codec(name)
    allowed = {p.name for p in description.params} | COMMON_PARAMS
    unknown = sorted(set(params) - allowed)
    if unknown:
        raise ValueError(
            f"{unknown[0]}: not a parameter of {name!r} (it takes {', '.join(sorted(allowed))})"
        )
    values: dict[str, Any] = {p.name: p.check(params.get(p.name, p.default)) for p in description.params}
    values.update(common_values(params))
    return CompressorSpec(name=name, **values)


def spec_from_dict(data: Mapping[str, Any]) -> CompressorSpec:
    """Inverse of ``{"name": spec.name, **spec.params()}`` (used by checkpoints and the wire)."""
    data = dict(data)
    if "name" not in data:
        raise ValueError("name: missing")
    return make_spec(data.pop("name"), **data)


def spec_to_dict(spec: CompressorSpec) -> dict[str, Any]:
    return {"name": spec.name, **spec.params()}
