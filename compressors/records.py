"""What GradientSync reports: its errors, its cumulative counters and the record of one step."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from compressors import handshake


class GradientSyncError(RuntimeError):
    """A compressor failed inside the communication hook; raised from ``backward()``."""


class NothingCompressedWarning(UserWarning):
    """A lossy compressor would send every gradient of the model uncompressed."""


@dataclass(frozen=True)
class SyncStats:
    """Cumulative counters for this rank (``GradientSync.stats()``)."""

    steps: int = 0
    bytes_sent: int = 0
    compress_s: float = 0.0
    communicate_s: float = 0.0
    decompress_s: float = 0.0


@dataclass
class StepRecord:
    """What the hook saw during one step; the worker's timer reads it (one timing mechanism).

    ``last_bucket_at`` is when autograd handed over the last bucket, i.e. when backward's
    compute ended; whatever backward() waits after that is exposed communication.
    ``compress_s`` / ``decompress_s`` are CPU seconds of the threads that ran the codec;
    ``communicate_s`` is wall time from issuing each collective to its completion.
    """

    compressor: str
    first_bucket_at: float = 0.0
    last_bucket_at: float = 0.0
    done_at: float = 0.0
    buckets: int = 0
    bytes_sent: int = 0
    compress_s: float = 0.0
    communicate_s: float = 0.0
    decompress_s: float = 0.0
    _open: int = field(default=0, repr=False)
    _handed_last: bool = field(default=False, repr=False)
    _gate: handshake.StepGate = field(default_factory=handshake.StepGate.opened, repr=False)
    #: Residuals carried over a switch and added in this step: put back if the step is non-finite.
    _carried: dict[str, torch.Tensor] = field(default_factory=dict, repr=False)
    _results_finite: list[torch.Tensor] | None = field(default=None, repr=False)
