"""Torch-free wire messages between the workers and the coordinator.

Rank 0 of a running job posts :class:`Telemetry` (with its :class:`ModelProfile` once) and
polls :class:`Decision`. A job's configuration is ``planning.config`` (the coordinator
converts a REST ``JobSpec`` into a ``TrainConfig`` and hands it to
``workers.loop.train_loop_per_worker``). Keeping these here (pydantic only, no torch) lets
the web process import them without pulling in torch or Ray.
"""

from __future__ import annotations

from typing import Mapping

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from planning.decision import Decision as Decision  # the one decision type, re-exported for the wire
from planning.spec import CompressorSpec, make_spec

PHASES: tuple[str, ...] = ("data", "forward", "backward", "exposed_comm", "optimizer")
HOOK_PHASES: tuple[str, ...] = ("compress", "communicate", "decompress")
ALL_PHASES: tuple[str, ...] = PHASES + HOOK_PHASES
#: The phases that add up to a step (``docs/step.md``): ``exposed_comm`` and the hook's
#: phases are parts of ``backward``, not additions.
STEP_PHASES: tuple[str, ...] = ("data", "forward", "backward", "optimizer")


def step_seconds(phase_seconds: Mapping[str, float]) -> float | None:
    """Seconds of a step from its phase means (the sum over ``STEP_PHASES``); None when none
    of those phases was timed."""
    parts = [phase_seconds[p] for p in STEP_PHASES if p in phase_seconds]
    return sum(parts) if parts else None


class _Strict(BaseModel):
    """Unknown fields are an error, not silently dropped."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelProfile(_Strict):
    """What the cost model needs about a job's model, measured once on a worker."""

    shapes: list[list[int]]
    #: Parameter indices (into ``shapes``) of each DDP bucket, in the order buckets fire.
    buckets: list[list[int]] = []
    forward_s: float = Field(default=0.0, ge=0)
    #: Backward *compute* (measured with uncompressed communication excluded as far as possible).
    backward_s: float = Field(default=0.0, ge=0)
    optimizer_s: float = Field(default=0.0, ge=0)
    #: Calibrated encode+decode seconds per step, by compressor label (e.g. "acpsgd-r4").
    codec_s: dict[str, float] = {}
    #: Calibrated seconds per element pass (costmodel.codec_work), by compressor name, for
    #: labels that were not timed themselves (other ranks of the same compressor).
    codec_per_element_s: dict[str, float] = {}
    device: str = "cpu"

    @model_validator(mode="after")
    def _buckets_name_parameters(self) -> "ModelProfile":
        """Every bucket entry is the index of one of ``shapes`` (the cost model lays buckets
        out by index: an index beyond them is a bad report, not a server error)."""
        for bucket in self.buckets:
            for index in bucket:
                if not 0 <= index < len(self.shapes):
                    raise ValueError(f"buckets: parameter index {index} out of range for {len(self.shapes)} shapes")
        return self


class Telemetry(_Strict):
    """One report from rank 0 of a running job."""

    step: int = Field(ge=0)
    steps: int | None = None
    loss: float | None = None
    samples_per_second: float | None = Field(default=None, ge=0)
    phase_seconds: dict[str, float] = {}
    #: How many recent steps ``phase_seconds`` average (``workers.timing.StepTimer``'s window,
    #: restarted at a switch: all of them ran the reported compressor). None: not reported.
    timed_steps: int | None = Field(default=None, ge=0)
    #: Mean wall seconds from the end of one of those steps to the end of the next
    #: (``timed_steps − 1`` intervals): all a step costs, the work between its phases included.
    step_wall_seconds: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    bytes_sent_per_step: float | None = Field(default=None, ge=0)
    bandwidth_bytes_per_second: float | None = Field(default=None, gt=0)
    latency_seconds: float | None = Field(default=None, ge=0)
    #: How much longer a collective takes when the peers sat idle waiting (the probe's wake_s).
    link_wake_seconds: float | None = Field(default=None, ge=0)
    #: Rank 0's wall time spent measuring the link so far (probes and recovery checks, the
    #: probe budget's spending), and how many of each ran.
    link_probe_seconds: float | None = Field(default=None, ge=0)
    link_probes: int | None = Field(default=None, ge=0)
    link_checks: int | None = Field(default=None, ge=0)
    #: The latest decision exchange (a step) at which every rank read a drop of the link
    #: (``workers.passive_bandwidth.cycle_sample``: each rank's last steps all much slower than
    #: the link was read at); ``bandwidth_bytes_per_second`` restarted from those steps' rate
    #: there. None: no drop read yet. The adaptive policy takes a new one as a level at once.
    link_drop_step: int | None = Field(default=None, ge=0)
    #: σ of one rank's forward+backward compute per step over the timer's window: the
    #: cost model's straggler term (the slowest rank lags the mean by about e_N·σ).
    compute_jitter_seconds: float | None = Field(default=None, ge=0)
    grad_norm: float | None = Field(default=None, ge=0)
    #: The running compressor's relative error ‖x − C(x)‖ / ‖x‖ in the last measured steps
    #: (``compressors.quality.ErrorMeter``: one step, ACP-SGD's P- and Q-step pooled): what
    #: the job loses now.
    compression_error: float | None = Field(default=None, ge=0, le=1)
    #: The cosine of the last measured steps' applied update with the fresh mean gradient,
    #: ⟨ū, ḡ⟩ / (‖ū‖‖ḡ‖) (``compressors.quality.update_efficiency``): what the adaptive
    #: policy judges the running compressor by.
    update_efficiency: float | None = Field(default=None, ge=0, le=1)
    #: Every candidate's estimated relative error on a sample of this job's gradient
    #: matrices, by label (``acpsgd-r4``): the adaptive policy's quality input.
    compression_error_estimates: dict[str, float] = Field(default={}, max_length=256)
    compressor: str | None = None
    #: The compressor's rank (low-rank compressors), not a process rank.
    compressor_rank: int | None = None
    ratio: float | None = None
    world_size: int = Field(default=1, ge=1)
    decision_version: int = Field(default=0, ge=0)
    wall_time: float | None = None
    profile: ModelProfile | None = None
    #: A random id of the worker group that sends this report, new each time Ray Train
    #: (re)starts the group; the coordinator records a restart when it changes.
    worker_group: str | None = Field(default=None, max_length=64)
    #: The checkpoint step this worker group resumed from (None: it started fresh).
    resumed_from_step: int | None = Field(default=None, ge=0)

    @field_validator("phase_seconds")
    @classmethod
    def _known_phases(cls, value: dict[str, float]) -> dict[str, float]:
        for phase, seconds in value.items():
            if phase not in ALL_PHASES:
                raise ValueError(f"unknown phase {phase!r}; phases are {', '.join(ALL_PHASES)}")
            if seconds < 0:
                raise ValueError(f"phase {phase!r}: seconds must be >= 0")
        return value

    @field_validator("compression_error_estimates")
    @classmethod
    def _bounded_errors(cls, value: dict[str, float]) -> dict[str, float]:
        for label, error in value.items():
            if not 0 < len(label) <= 64:
                raise ValueError(f"compression_error_estimates: label {label[:64]!r} must be 1-64 characters")
            if not 0 <= error <= 1:
                raise ValueError(f"compression_error_estimates[{label!r}]: must be in [0, 1], got {error}")
        return value

    def running_spec(self) -> CompressorSpec | None:
        """The compressor that ran the reported step (None: the report names none), built
        from its name, rank and ratio; ``ValueError`` when the registry does not know them."""
        if not self.compressor:
            return None
        params = {k: v for k, v in (("rank", self.compressor_rank), ("ratio", self.ratio)) if v is not None}
        return make_spec(self.compressor, **params)
