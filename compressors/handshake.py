"""The per-step handshake that catches a compressor switch made on some ranks but not others.

Ranks match collectives by the order they are issued. If one rank switched compressor and
another did not, their payloads differ (gloo aborts the process: "Received data size doesn't
match expected size") or, worse, have the same size and are summed into silently different
gradients. So every step starts with one fixed-size all-gather of a 48-byte fingerprint
(hash of the compressor spec, number of switches so far, label) and no payload of the step is
launched until it has completed and every rank has seen the same fingerprint. Every rank
gets every fingerprint, so every rank raises the same clear error before any mismatched
collective. Cost: one 48·world-byte all-gather per step, issued when backward hands over
its first bucket; that bucket's encode runs meanwhile, and its payload waits for the result.
"""

from __future__ import annotations

import hashlib
import json
import threading
from typing import Callable

import torch

from planning.spec import CompressorSpec, spec_to_dict

FINGERPRINT_BYTES = 48
_HASH_BYTES, _COUNT_BYTES = 8, 8
_LABEL_BYTES = FINGERPRINT_BYTES - _HASH_BYTES - _COUNT_BYTES


def fingerprint(spec: CompressorSpec, switches: int) -> torch.Tensor:
    """48 bytes naming ``spec`` and how many switches this rank has made (uint8)."""
    digest = hashlib.blake2b(json.dumps(spec_to_dict(spec), sort_keys=True).encode(), digest_size=_HASH_BYTES).digest()
    label = spec.label.encode()[:_LABEL_BYTES].ljust(_LABEL_BYTES, b"\0")
    raw = digest + int(switches).to_bytes(_COUNT_BYTES, "little", signed=False) + label
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8).clone()


def _describe(row: bytes) -> str:
    switches = int.from_bytes(row[_HASH_BYTES : _HASH_BYTES + _COUNT_BYTES], "little")
    label = row[_HASH_BYTES + _COUNT_BYTES :].rstrip(b"\0").decode(errors="replace")
    return f"{label} after {switches} switch{'es' if switches != 1 else ''}"


def mismatch(gathered: torch.Tensor) -> str | None:
    """None when every rank's fingerprint (rows of ``gathered``) is the same, else the error text."""
    rows = [bytes(row.tolist()) for row in gathered.view(-1, FINGERPRINT_BYTES).cpu()]
    if all(row == rows[0] for row in rows):
        return None
    per_rank = "; ".join(f"rank {rank}: {_describe(row)}" for rank, row in enumerate(rows))
    return (f"ranks disagree on the compressor for this step ({per_rank}). switch() must be called on "
            "every rank between the same two steps; no payload of this step was sent")


class StepGate:
    """Holds a step's first-round launches until the handshake has completed.

    ``submit(go)`` calls ``go(None)`` at once if the gate is open, else queues it; ``open(error)``
    releases the queue in submission order (bucket order on every rank), calling
    ``go(error)`` with the handshake's error, if any. Submission and release share a lock, so
    collectives are issued in the same order on every rank whichever thread releases them.
    """

    def __init__(self) -> None:
        self._lock = threading.RLock()  # a launch may complete inline and submit again
        self._queue: list[Callable[[BaseException | None], None]] = []
        self._opened = False
        self._error: BaseException | None = None

    @classmethod
    def opened(cls) -> "StepGate":
        gate = cls()
        gate._opened = True
        return gate

    def submit(self, go: Callable[[BaseException | None], None]) -> None:
        with self._lock:
            if not self._opened:
                self._queue.append(go)
                return
            go(self._error)

    def open(self, error: BaseException | None) -> None:
        with self._lock:
            self._opened, self._error = True, error
            queue, self._queue = self._queue, []
            for go in queue:
                go(error)
