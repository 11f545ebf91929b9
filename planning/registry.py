"""The one list of compressors: name → torch-free description (``planning.codec.Codec``).

Every question about a compressor goes through here: ``planning.spec.make_spec`` (which
parameters it takes), ``planning.wire`` (which tensors, how many bytes), the cost model (its
work model), the policy (its candidates and how lossy it is), job validation (the names) and
``compressors.build`` (its kernel, by import path). Adding a compressor: its description in
``planning/codecs/<name>.py``, its kernel in ``compressors/<name>.py`` and one line in
:data:`_BUILTIN` (docs/compressors.md, "How to add a compressor").

The registry imports the description modules and they import only ``planning.codec`` and
``planning.shapes``; the kernels are named by strings, so nothing here imports torch or
closes an import cycle (``tests/unit/test_registry.py`` checks both).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

from planning.codec import Codec
from planning.codecs.acpsgd import ACPSGD_CODEC
from planning.codecs.cast import BF16, FP16
from planning.codecs.none import NONE
from planning.codecs.powersgd import POWERSGD
from planning.codecs.signsgd import SIGNSGD
from planning.codecs.topk import TOPK

#: The built-in compressors, in order from no compression to the most.
_BUILTIN: tuple[Codec, ...] = (NONE, FP16, BF16, SIGNSGD, TOPK, POWERSGD, ACPSGD_CODEC)

#: The compressor a job uses when it names none (user-facing defaults read it).
DEFAULT_COMPRESSOR = ACPSGD_CODEC.name
#: The uncompressed baseline (compression ratios are against it).
UNCOMPRESSED = NONE.name
#: An adaptive job's first compressor when its spec names none, the first of these it allows
#: (:func:`adaptive_start`). Why a cast: the policy's first decision waits for a model profile of
#: three timed steps, and a cast halves those steps' bytes at an error known in advance (the
#: profile stays valid: no codec runs in the hook); on the benchmark's 50 Mbit/s link each of
#: them took ~115 ms on ``none``. bf16 before fp16: it keeps fp32's range, so no gradient
#: overflows whatever the model. Not a lossy codec: its work would show in backward's wall
#: time, and the profile would count it twice (once more in the cost model's codec time).
ADAPTIVE_START: tuple[str, ...] = (BF16.name, FP16.name, NONE.name)

_codecs: dict[str, Codec] = {codec.name: codec for codec in _BUILTIN}
_version = 0

#: The names of the built-in compressors (``names()`` also has registered ones).
BUILTIN_NAMES: tuple[str, ...] = tuple(codec.name for codec in _BUILTIN)


def names() -> tuple[str, ...]:
    """Every compressor ``build()`` knows, the built-ins first."""
    return tuple(_codecs)


def adaptive_start(allowed: list[str] | tuple[str, ...] | None = None) -> str:
    """The compressor an adaptive job starts on when its spec names none: the first of
    :data:`ADAPTIVE_START` among ``allowed`` (None: every compressor), else the first allowed."""
    for name in ADAPTIVE_START:
        if allowed is None or name in allowed:
            return name
    if not allowed:
        raise ValueError("allowed: must name at least one compressor")
    return allowed[0]


def version() -> int:
    """Changes whenever the registry does (caches that depend on it key on it)."""
    return _version


def codec(name: str) -> Codec:
    """The description of ``name``; ``ValueError`` naming the field when unknown."""
    try:
        return _codecs[name]
    except (KeyError, TypeError):
        raise ValueError(f"name: unknown compressor {name!r}; choose one of {', '.join(_codecs)}") from None


def is_lossy(name: str) -> bool:
    """Whether ``name``'s error is not known in advance: anything but ``none`` and the casts.
    Only a lossy compressor's error has to be measured or estimated, and only its codec runs
    inside the hook (so its work shows in backward's wall time)."""
    return codec(name).known_error is None


def unknown_name(value: object) -> str | None:
    """The message for a name that is not a compressor (without a field prefix), or None."""
    if isinstance(value, str) and value in _codecs:
        return None
    shown = value[:40] if isinstance(value, str) else value
    return f"unknown compressor {shown!r}; choose one of {', '.join(_codecs)}"


def by_lossiness() -> tuple[Codec, ...]:
    """Every compressor, the least lossy first (the policy's tie-break order)."""
    return tuple(sorted(_codecs.values(), key=lambda c: c.lossiness))


def max_rounds() -> int:
    """The most dependent collective rounds any compressor uses per bucket and step."""
    return max(c.rounds for c in _codecs.values())


def register(description: Codec) -> None:
    """Add a compressor (a name already taken is an error)."""
    global _version
    if not isinstance(description, Codec):
        raise TypeError(f"register: expected a Codec, got {type(description).__name__}")
    if description.name in _codecs:
        raise ValueError(f"name: compressor {description.name!r} is already registered")
    _codecs[description.name] = description
    _version += 1


def unregister(name: str) -> None:
    """Remove a registered compressor (built-ins stay)."""
    global _version
    if name in BUILTIN_NAMES:
        raise ValueError(f"name: {name!r} is built in")
    _codecs.pop(name, None)
    _version += 1


@contextmanager
def registered(description: Codec) -> Iterator[Codec]:
    """Register ``description`` for the duration of a ``with`` block (tests, plugins)."""
    register(description)
    try:
        yield description
    finally:
        unregister(description.name)
