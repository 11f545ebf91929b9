"""The candidate set of the adaptive policy: every (compressor, rank/ratio) option.

Torch-free. Which compressors and parameter values come from the registry's descriptions
(``Codec.variants``, ``Codec.lossiness``), so a registered compressor is a candidate too.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Iterable

from planning import registry
from planning.codec import CompressorSpec, Sweep, candidate_ranks
from planning.spec import make_spec

__all__ = ["DEFAULT_TOPK_RATIOS", "candidate_ranks", "candidates"]

DEFAULT_TOPK_RATIOS: tuple[float, ...] = (0.01, 0.001)


@lru_cache(maxsize=256)
def _candidates(allowed: tuple[str, ...], min_rank: int, max_rank: int, ratios: tuple[float, ...],
                registry_version: int) -> tuple[CompressorSpec, ...]:
    for name in allowed:
        if registry.unknown_name(name):
            raise ValueError(f"allowed: unknown compressor {name!r}")
    bounds = Sweep(min_rank, max_rank, ratios)
    out: list[CompressorSpec] = []
    for description in registry.by_lossiness():
        if description.name in allowed:
            out.extend(make_spec(description.name, **params) for params in description.variants(bounds))
    return tuple(out)


def candidates(
    allowed: Iterable[str],
    min_rank: int = 1,
    max_rank: int = 64,
    ratios: Iterable[float] = DEFAULT_TOPK_RATIOS,
) -> tuple[CompressorSpec, ...]:
    """Every (compressor, rank/ratio) option, least lossy first (``Codec.lossiness``).

    A compressor without parameters once; one with a rank at :func:`candidate_ranks` (highest
    first); one with a ratio at each ratio (largest first). Only names in ``allowed``.
    """
    return _candidates(tuple(allowed), int(min_rank), int(max_rank), tuple(float(q) for q in ratios),
                       registry.version())
