"""Every rank's timings of every step, one JSON line a step, when ``GRADWIRE_STEP_TRACE`` names a folder.

Why: the telemetry is rank 0's alone, averaged over a window of steps, and a gap between two
jobs (an adaptive run against the fixed choice it settles on) hides there: is it work rank 0
does between steps, a peer that arrives late at the collectives, or the machine's pace? With
each rank's steps side by side (``python -m benchmarks.step_trace FOLDER``) it splits by rank,
by phase and by stretch of steps. Session 31 split the steady-slow scenario's gap so: the steps
before the policy's first decision, rank 0's work between steps (the candidates' estimates, ~30 ms
each, and the policy), and a difference in the steps themselves no larger than between two runs
of the same fixed choice (``benchmarks/results/step_trace_s31.md``).

Each rank of the built-in loop (``workers.loop``) writes ``FOLDER/rank<r>-<pid>.jsonl``: a first
line naming the job (its ``name``, compression ``mode``, the ``compressor`` it starts with, ``seed``), then per
step its ``step``, ``started`` (wall clock, ``time.time()``, to line the ranks up), the
seconds of the work around the training step (``agree``: the switch agreement and what comes
with it; ``train``: the step itself; ``after``: telemetry, rank 0's estimates and policy;
``checkpoint``), the compressor that ran it, its bytes, and the timer's phases
(docs/step.md, "Timing phases"). Unset, nothing is written and a step costs a few clock reads.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import IO, Any, Mapping

from compressors.records import StepRecord
from planning.config import TrainConfig

#: The environment variable naming the folder the ranks write their traces to.
TRACE_ENV = "GRADWIRE_STEP_TRACE"

#: The work around a training step the loop times, in the order it comes.
AROUND_STEP = ("agree", "train", "after", "checkpoint")


class StepTrace:
    """One rank's trace file (or nothing, when ``path`` is None)."""

    def __init__(self, path: Path | None, job: Mapping[str, Any]) -> None:
        self.path = path
        self._out: IO[str] | None = None
        if path is not None:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                self._out = path.open("w", buffering=1)  # a line at a time: a killed rank keeps its steps
            except OSError as exc:
                raise ValueError(f"{TRACE_ENV}: cannot write step traces to {path.parent}: {exc.strerror or exc}") from None
            self._out.write(json.dumps(dict(job)) + "\n")

    @classmethod
    def from_env(cls, rank: int, job: Mapping[str, Any]) -> "StepTrace":
        """The trace ``GRADWIRE_STEP_TRACE`` asks for, if any (the pid keeps two runs in one folder apart)."""
        folder = os.environ.get(TRACE_ENV)
        return cls(Path(folder) / f"rank{rank}-{os.getpid()}.jsonl" if folder else None, job)

    @classmethod
    def for_job(cls, rank: int, cfg: TrainConfig, compressor: str) -> "StepTrace":
        """:meth:`from_env` with the header every loop writes: the job's ``name``, compression
        ``mode``, the ``compressor`` it starts with (a label) and ``seed`` (what
        ``benchmarks.step_trace`` pairs the ranks' traces by)."""
        return cls.from_env(rank, {"name": cfg.name, "mode": cfg.compression.mode, "compressor": compressor,
                                   "seed": cfg.seed})

    @property
    def enabled(self) -> bool:
        return self._out is not None

    def step(self, step: int, started: float, around: Mapping[str, float], phases: Mapping[str, float],
             record: StepRecord | None) -> None:
        """Write one step: ``around`` holds :data:`AROUND_STEP`'s seconds, ``phases`` the timer's."""
        if self._out is None:
            return
        unknown = set(around) - set(AROUND_STEP)
        if unknown:
            raise ValueError(f"around: unknown work {sorted(unknown)}; expected some of {AROUND_STEP}")
        line = {"step": step, "started": round(started, 6), **{k: round(v, 6) for k, v in around.items()},
                "compressor": record.compressor if record else None, "bytes": record.bytes_sent if record else 0,
                "phases": {k: round(v, 6) for k, v in phases.items()}}
        self._out.write(json.dumps(line) + "\n")

    def close(self) -> None:
        if self._out is not None:
            self._out.close()
            self._out = None
