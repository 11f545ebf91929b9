"""The quality signal: the group's compression error and update efficiency at every decision exchange, and rank 0's
estimates of the candidates every few seconds within a share of the probe budget.

Glue between ``compressors.quality`` (the measurements, torch) and the telemetry: every rank
hangs an :class:`~compressors.quality.ErrorMeter` on the job's ``GradientSync`` (the group's
error needs every rank's coordinates: :meth:`QualitySignal.exchange`, collective); rank 0
asks its meter for a sample of gradient matrices when an estimate is due, and times
everything it does, so the summary can state the overhead (``overhead()``).

Why a budget: an estimate costs one spectrum per sampled matrix (0.12 s for BERT's largest
on a CPU core: ``compressors.lowrank.squared_singular_values``), and one eigen-decomposition
more of its step before where ACP-SGD is a candidate; at a fixed step interval that would be a fixed share of a fast step
and nothing of a slow one. Like the probe (``workers.probe_scheduler.ProbeScheduler``), it runs at most
every ``probe_interval_s`` and only while its total cost stays within ``budget`` of the run
time; half the job's probe budget is the default. And only when it could matter: the caller
passes a gate (``planning.estimate_gate.estimates_can_matter``: on a fast link with ``none`` running no
estimate could make the policy switch), and a due estimate that cannot matter is deferred one
interval at no cost.
"""

from __future__ import annotations

import time
from typing import Callable

import torch.distributed as dist

from compressors import GradientSync
from compressors.quality import ErrorMeter, estimate_errors, group_error
from planning.config import TrainConfig
from planning.controller import policy_config
from planning.spec import CompressorSpec
from workers.probe_scheduler import ProbeScheduler

#: Share of the job's probe budget the estimates may take.
ESTIMATE_BUDGET_SHARE = 0.5


class QualitySignal:
    """Measures the group's compression error (on every rank); on rank 0 (``estimating``) of
    an adaptive job, estimates the candidates."""

    def __init__(self, cfg: TrainConfig, sync: GradientSync, *, estimating: bool = True) -> None:
        self.meter = ErrorMeter(total_elements=sync.trained_elements or None)
        sync.error_meter = self.meter
        self.candidates: tuple[CompressorSpec, ...] = ()
        self.exchange_s = 0.0
        self.sync_every = cfg.compression.sync_every
        if cfg.compression.mode == "adaptive" and estimating:
            config = policy_config(cfg.compression)
            self.candidates = config.candidates()
        self.scheduler = ProbeScheduler(probe_interval_s=cfg.probing.interval_s,
                                        max_cost_fraction=cfg.probing.budget * ESTIMATE_BUDGET_SHARE)
        self.estimates: dict[str, float] = {}
        self.estimate_s = 0.0
        #: Due estimates deferred because the gate said they could not matter.
        self.deferred = 0
        self.started = time.monotonic()
        self._requested = False

    def after_step(self, can_matter: Callable[[], bool] = lambda: True) -> None:
        """Between steps: run an estimate on a sample (the two steps after a request); request the next one
        when one is due and ``can_matter()`` (asked only then), else defer it one interval."""
        if not self.candidates:
            return
        elapsed = time.monotonic() - self.started
        if self._requested and self.meter.sample is not None:
            started = time.perf_counter()
            sample = self.meter.take_sample()
            self.estimates = estimate_errors(sample.tensors, self.candidates, sample.previous)
            cost = time.perf_counter() - started
            self.estimate_s += cost
            self.scheduler.record(elapsed, cost)
            self._requested = False
        elif self._requested and not self.meter.sampling:  # the steps came and held no matrix
            self._requested = False
            self.scheduler.defer(elapsed)
        elif not self._requested and self.scheduler.due(elapsed, elapsed):
            if can_matter():
                self.meter.request_sample()
                self._requested = True
            else:
                self.scheduler.defer(elapsed)
                self.deferred += 1

    def exchange(self, group: dist.ProcessGroup | None = None) -> None:
        """Collective, every rank at the same step between steps (the decision exchange): the
        group's error and update efficiency of the latest measured cycle of steps
        (``compressors.quality.group_error``)."""
        started = time.perf_counter()
        group_error(self.meter, group)
        self.meter.measure_before(self.sync_every)  # the next exchange reads only the last cycle before it
        self.exchange_s += time.perf_counter() - started

    def running_error(self, label: str) -> float | None:
        """The group's error from the latest exchange if compressor ``label`` ran the steps it
        measured (else None: a switch followed the exchange)."""
        return self.meter.group_last if self.meter.group_label == label else None

    def running_efficiency(self, label: str) -> float | None:
        """The group's update efficiency (a cosine) from the latest exchange if compressor ``label``
        ran the steps it measured (``compressors.quality.update_efficiency``)."""
        return self.meter.group_efficiency if self.meter.group_label == label else None

    def overhead(self) -> dict[str, float]:
        """Seconds spent measuring, and their share of the run so far."""
        elapsed = max(1e-9, time.monotonic() - self.started)
        total = self.meter.seconds + self.estimate_s + self.exchange_s
        return {"meter_s": round(self.meter.seconds, 4), "estimate_s": round(self.estimate_s, 4),
                "exchange_s": round(self.exchange_s, 4),
                "estimates": self.scheduler.probes, "estimates_deferred": self.deferred,
                "share_of_run": round(total / elapsed, 5)}
