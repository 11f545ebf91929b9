"""``RATE:AMOUNT,RATE:AMOUNT`` texts: the link schedules of the benchmarks, parsed in one place.

The adaptive benchmark's scenarios are (Mbit/s, steps) pairs and the replay's traces
(Gbit/s, seconds) pairs; both need the same checks and the same error naming the field.
"""

from __future__ import annotations

from typing import Callable, TypeVar

Amount = TypeVar("Amount", int, float)


def parse_rate_pairs(text: str, *, field: str, form: str, amount: Callable[[str], Amount]) -> list[tuple[float, Amount]]:
    """``"1000:150,50:80"`` -> ``[(1000.0, amount("150")), (50.0, amount("80"))]``; a rate and an
    amount must both be positive. Errors start with ``field`` and show the expected ``form``."""
    pairs = []
    for item in text.split(","):
        rate, _, value = item.strip().partition(":")
        try:
            pair = (float(rate), amount(value))
        except ValueError:
            raise ValueError(f"{field}: expected {form} items, got {item!r}") from None
        if not (pair[0] > 0 and pair[1] > 0):
            raise ValueError(f"{field}: rate and {form.split(':')[1].lower()} must be positive, got {item!r}")
        pairs.append(pair)
    return pairs
