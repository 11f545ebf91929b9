"""Metric bookkeeping: a finished job's series disappear after the grace period."""

from prometheus_client import generate_latest
from support.api import telemetry

from coordinator.metrics import CoordinatorMetrics
from planning.protocol import Telemetry


def test_finished_job_series_are_removed_after_the_grace_period():
    metrics = CoordinatorMetrics(lambda: {"succeeded": 1}, grace_s=60)
    metrics.observe_report("job1", Telemetry(**telemetry(5)), previous_step=0, shapes=None)
    metrics.observe_report("job2", Telemetry(**telemetry(5)), previous_step=0, shapes=None)
    metrics.record_switch("job1")
    metrics.job_finished("job1", now=1000.0)
    metrics.sweep(now=1059.0)
    assert 'job="job1"' in generate_latest(metrics.registry).decode()
    metrics.sweep(now=1061.0)
    text = generate_latest(metrics.registry).decode()
    assert 'job="job1"' not in text
    assert 'gradwire_step_phase_seconds_count{job="job2",phase="backward"} 1.0' in text
    assert 'gradwire_jobs{state="succeeded"} 1.0' in text


def test_every_metric_of_the_design_is_exported():
    metrics = CoordinatorMetrics(lambda: {}, grace_s=60)
    metrics.observe_report("j", Telemetry(**telemetry(5), profile={"shapes": [[64, 64]]}), previous_step=0,
                           shapes=[[64, 64]])
    metrics.record_switch("j")
    text = generate_latest(metrics.registry).decode()
    for name in ("step_phase_seconds", "step_seconds", "samples_per_second", "train_loss",
                 "network_bandwidth_bytes_per_second", "network_latency_seconds", "comm_bytes_total",
                 "compression_ratio", "compressor_info", "policy_switches_total", "jobs"):
        assert f"# TYPE gradwire_{name} " in text, name


def test_the_cost_models_host_terms_are_exported_when_reported():
    metrics = CoordinatorMetrics(lambda: {}, grace_s=60)
    metrics.observe_report("j", Telemetry(**telemetry(5)), previous_step=0, shapes=None)
    assert "gradwire_network_wake_seconds{" not in generate_latest(metrics.registry).decode()
    report = Telemetry(**telemetry(6, link_wake_seconds=0.0015, compute_jitter_seconds=0.002,
                                   link_probe_seconds=0.75, link_probes=3, link_checks=9))
    metrics.observe_report("j", report, previous_step=5, shapes=None)
    text = generate_latest(metrics.registry).decode()
    assert 'gradwire_network_wake_seconds{job="j"} 0.0015' in text
    assert 'gradwire_compute_jitter_seconds{job="j"} 0.002' in text
    assert 'gradwire_link_probe_seconds{job="j"} 0.75' in text


def test_compression_error_is_exported_by_compressor_and_bounded_at_the_door():
    import pytest
    from pydantic import ValidationError

    metrics = CoordinatorMetrics(lambda: {}, grace_s=60)
    report = Telemetry(**telemetry(5, compressor="acpsgd", compressor_rank=4, compression_error=0.42,
                                   update_efficiency=0.61,
                                   compression_error_estimates={"acpsgd-r4": 0.4, "none": 0.0}))
    metrics.observe_report("j", report, previous_step=0, shapes=None)
    text = generate_latest(metrics.registry).decode()
    assert 'gradwire_compression_error{compressor="acpsgd-r4",job="j"} 0.42' in text
    assert 'gradwire_update_efficiency{compressor="acpsgd-r4",job="j"} 0.61' in text
    assert 'gradwire_compression_error_estimate{compressor="acpsgd-r4",job="j"} 0.4' in text
    assert 'gradwire_compression_error_estimate{compressor="none",job="j"} 0.0' in text
    for bad in ({"compression_error": 1.5}, {"compression_error": float("nan")},
                {"compression_error_estimates": {"acpsgd-r4": -0.1}}, {"compression_error_estimates": {"": 0.1}}):
        with pytest.raises(ValidationError, match="compression_error"):
            Telemetry(**telemetry(5, **bad))
    for bad_efficiency in (1.2, -0.1, float("nan")):
        with pytest.raises(ValidationError, match="update_efficiency"):
            Telemetry(**telemetry(5, update_efficiency=bad_efficiency))
