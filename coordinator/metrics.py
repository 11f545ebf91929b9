"""Every Prometheus metric the coordinator exports, in one place (docs/coordinator.md, "Metrics").

Names carry the ``gradwire_`` prefix and base units; labels stay low-cardinality: ``job``
(the job id), ``phase``, ``compressor`` (and ``compressor_rank`` on the info series). Each app gets its
own registry, so tests can run several coordinators in one process. A finished job's series
are removed ``grace_s`` after it ends, so dashboards see the end and Prometheus forgets it.

Note for scrape configs: the ``job`` label clashes with Prometheus' own target label; scrape
the coordinator with ``honor_labels: true`` to keep ours (else it arrives as ``exported_job``).
"""

from __future__ import annotations

import threading
from typing import Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from coordinator.schemas import JOB_STATES
from planning import registry
from planning.protocol import Telemetry, step_seconds
from planning.spec import make_spec
from planning.wire import wire_bytes

# No ``*_created`` companion series: they would double the series count for nothing we use.
disable_created_metrics()

# 1 ms .. ~65 s, doubling: covers a tiny MLP step on CPU and a large model on a slow link.
_SECONDS_BUCKETS = tuple(0.001 * 2**i for i in range(17))


class _JobsByState(Collector):
    """``gradwire_jobs{state}`` read from the store at scrape time, so it is right even
    just after a restart."""

    def __init__(self, counts: Callable[[], dict[str, int]]) -> None:
        self._counts = counts

    def collect(self) -> Iterable[Metric]:
        family = GaugeMetricFamily("gradwire_jobs", "Jobs by state", labels=["state"])
        counts = self._counts()
        for state in JOB_STATES:
            family.add_metric([state], counts.get(state, 0))
        yield family


class CoordinatorMetrics:
    """Updates the collectors from telemetry and job events; tracks which label sets belong
    to which job so they can be removed together."""

    def __init__(self, job_counts: Callable[[], dict[str, int]], grace_s: float) -> None:
        self.registry = CollectorRegistry()
        self.grace_s = grace_s
        r = self.registry
        self.step_phase_seconds = Histogram(
            "gradwire_step_phase_seconds", "Mean seconds per step spent in each phase, one "
            "observation per telemetry report", ["job", "phase"], buckets=_SECONDS_BUCKETS, registry=r)
        self.step_seconds = Histogram(
            "gradwire_step_seconds", "Mean seconds per training step, one observation per report",
            ["job", "compressor"], buckets=_SECONDS_BUCKETS, registry=r)
        self.samples_per_second = Gauge(
            "gradwire_samples_per_second", "Training throughput over all workers", ["job"], registry=r)
        self.train_loss = Gauge("gradwire_train_loss", "Latest training loss", ["job"], registry=r)
        self.bandwidth = Gauge(
            "gradwire_network_bandwidth_bytes_per_second", "Measured collective bandwidth",
            ["job"], registry=r)
        self.latency = Gauge(
            "gradwire_network_latency_seconds", "Measured collective latency (alpha)", ["job"], registry=r)
        self.link_wake = Gauge(
            "gradwire_network_wake_seconds", "Extra time of a collective on an idle link (the probe's "
            "late-joined all-reduce; the cost model's wake-up term)", ["job"], registry=r)
        self.link_probe = Gauge(
            "gradwire_link_probe_seconds", "Rank 0's wall time spent measuring the link so far (active "
            "probes and recovery checks: what the probe budget bounds)", ["job"], registry=r)
        self.compute_jitter = Gauge(
            "gradwire_compute_jitter_seconds", "Standard deviation of one rank's compute per step "
            "(the cost model's straggler term)", ["job"], registry=r)
        self.comm_bytes = Counter(
            "gradwire_comm_bytes_total", "Bytes all ranks put into collectives",
            ["job", "compressor"], registry=r)
        self.compression_ratio = Gauge(
            "gradwire_compression_ratio", "Uncompressed over compressed bytes per step",
            ["job", "compressor"], registry=r)
        self.compressor_info = Gauge(
            "gradwire_compressor_info", "1 for the compressor (and its compressor_rank) a job uses now",
            ["job", "compressor", "compressor_rank"], registry=r)
        self.compression_error = Gauge(
            "gradwire_compression_error", "Relative compression error ||x - C(x)|| / ||x|| of the "
            "running compressor in its latest measured steps (x: gradient plus error feedback)",
            ["job", "compressor"], registry=r)
        self.update_efficiency = Gauge(
            "gradwire_update_efficiency", "Cosine of the running compressor's latest measured update with "
            "the fresh mean gradient, <u, g> / (||u|| ||g||) (what the adaptive policy judges it by)",
            ["job", "compressor"], registry=r)
        self.compression_error_estimate = Gauge(
            "gradwire_compression_error_estimate", "Each candidate's estimated relative compression "
            "error on a sample of the job's gradients (the adaptive policy's quality input)",
            ["job", "compressor"], registry=r)
        self.policy_switches = Counter(
            "gradwire_policy_switches_total", "Compressor switches decided for a job", ["job"], registry=r)
        r.register(_JobsByState(job_counts))
        # job -> {(metric, labels): child}: every series a job has, with its child cached (the
        # telemetry path sets a dozen series per report; labels() would look each one up).
        self._series: dict[str, dict[tuple[object, tuple[str, ...]], object]] = {}
        self._info: dict[str, tuple[str, ...]] = {}
        self._finished: dict[str, float] = {}
        self._lock = threading.Lock()

    def _labels(self, metric: object, job_id: str, *values: str) -> object:
        series = self._series.setdefault(job_id, {})
        key = (metric, (job_id, *values))
        child = series.get(key)
        if child is None:
            child = series[key] = metric.labels(job_id, *values)  # type: ignore[attr-defined]
        return child

    def observe_report(self, job_id: str, t: Telemetry, *, previous_step: int,
                       shapes: list[list[int]] | None) -> None:
        """Feed one telemetry report (rank 0's means over its last interval)."""
        compressor = t.compressor or "unknown"
        with self._lock:
            self._finished.pop(job_id, None)
            for phase, seconds in t.phase_seconds.items():
                self._labels(self.step_phase_seconds, job_id, phase).observe(seconds)  # type: ignore[attr-defined]
            step = step_seconds(t.phase_seconds)
            if step is not None:
                self._labels(self.step_seconds, job_id, compressor).observe(step)  # type: ignore[attr-defined]
            for gauge, value in ((self.samples_per_second, t.samples_per_second), (self.train_loss, t.loss),
                                 (self.bandwidth, t.bandwidth_bytes_per_second), (self.latency, t.latency_seconds),
                                 (self.link_wake, t.link_wake_seconds), (self.compute_jitter, t.compute_jitter_seconds),
                                 (self.link_probe, t.link_probe_seconds)):
                if value is not None:
                    self._labels(gauge, job_id).set(value)  # type: ignore[attr-defined]
            advanced = max(0, t.step - previous_step)
            if t.bytes_sent_per_step is not None and advanced:
                self._labels(self.comm_bytes, job_id, compressor).inc(  # type: ignore[attr-defined]
                    t.bytes_sent_per_step * advanced * t.world_size)
            ratio = _compression_ratio(t, shapes)
            if ratio is not None:
                self._labels(self.compression_ratio, job_id, compressor).set(ratio)  # type: ignore[attr-defined]
            if t.compression_error is not None:
                self._labels(self.compression_error, job_id, _label(t)).set(t.compression_error)  # type: ignore[attr-defined]
            if t.update_efficiency is not None:
                self._labels(self.update_efficiency, job_id, _label(t)).set(t.update_efficiency)  # type: ignore[attr-defined]
            for candidate, error in t.compression_error_estimates.items():
                self._labels(self.compression_error_estimate, job_id, candidate).set(error)  # type: ignore[attr-defined]
            if t.compressor:
                self._set_info(job_id, compressor, "" if t.compressor_rank is None else str(t.compressor_rank))

    def _set_info(self, job_id: str, compressor: str, compressor_rank: str) -> None:
        old = self._info.get(job_id)
        if old == (compressor, compressor_rank):
            return
        if old is not None:
            self.compressor_info.remove(job_id, *old)
            self._series.get(job_id, {}).pop((self.compressor_info, (job_id, *old)), None)
        self._labels(self.compressor_info, job_id, compressor, compressor_rank).set(1)  # type: ignore[attr-defined]
        self._info[job_id] = (compressor, compressor_rank)

    def record_switch(self, job_id: str) -> None:
        with self._lock:
            self._labels(self.policy_switches, job_id).inc()  # type: ignore[attr-defined]

    def job_finished(self, job_id: str, now: float) -> None:
        with self._lock:
            if job_id in self._series:
                self._finished[job_id] = now

    def sweep(self, now: float) -> None:
        """Drop the series of jobs that ended more than ``grace_s`` ago."""
        with self._lock:
            for job_id, ended in list(self._finished.items()):
                if now - ended < self.grace_s:
                    continue
                for metric, labels in self._series.pop(job_id, {}):
                    try:
                        metric.remove(*labels)  # type: ignore[attr-defined]
                    except KeyError:
                        pass
                self._info.pop(job_id, None)
                del self._finished[job_id]


def _label(t: Telemetry) -> str:
    """The running compressor as a label (``acpsgd-r4``, ``topk-0.01``), as candidates are named."""
    try:
        spec = t.running_spec()
    except ValueError:
        return t.compressor or "unknown"
    return spec.label if spec is not None else "unknown"


def _compression_ratio(t: Telemetry, shapes: list[list[int]] | None) -> float | None:
    if not shapes:
        return None
    try:
        spec = t.running_spec()
        if spec is None:
            return None
        sent = wire_bytes(spec, shapes, t.world_size)
        return wire_bytes(make_spec(registry.UNCOMPRESSED), shapes, t.world_size) / sent if sent else None
    except ValueError:
        return None
