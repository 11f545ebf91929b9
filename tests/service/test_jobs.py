"""Jobs over real HTTP: submit, telemetry into status and /metrics, decisions, cancel, events."""

import json

import httpx
import pytest
from support.api import ADAPTIVE_SPEC, ALL_PHASES, PROFILE, SMALLEST_SPEC, report, submit, telemetry, worker_headers

STATUS_FIELDS = {"id", "name", "state", "step", "steps", "loss", "compressor", "compressor_rank",
                 "bandwidth_bytes_per_second", "phase_seconds"}


def test_submit_answers_201_queued_and_lists_the_job(coordinator):
    response = httpx.post(f"{coordinator.url}/v1/jobs", json=SMALLEST_SPEC)
    assert response.status_code == 201
    job = response.json()
    assert job["state"] == "queued"
    listed = httpx.get(f"{coordinator.url}/v1/jobs").json()
    assert [j["id"] for j in listed] == [job["id"]]
    assert "worker_token" not in listed[0]
    status = httpx.get(f"{coordinator.url}/v1/jobs/{job['id']}").json()
    assert STATUS_FIELDS <= status.keys()
    assert "worker_token" not in status
    assert httpx.get(f"{coordinator.url}/v1/jobs", params={"state": "running"}).json() == []


def test_telemetry_updates_the_job_status(coordinator):
    job = submit(coordinator.url)
    response = report(coordinator.url, job, 7)
    assert response.status_code == 200
    assert response.json()["version"] == 0  # fixed mode: the spec's decision stays
    status = httpx.get(f"{coordinator.url}/v1/jobs/{job['id']}").json()
    expected = telemetry(7)
    assert status["state"] == "running"
    assert status["reason"] == "telemetry received"
    assert (status["step"], status["steps"], status["loss"]) == (7, 40, expected["loss"])
    assert (status["compressor"], status["compressor_rank"]) == ("acpsgd", 4)
    assert status["bandwidth_bytes_per_second"] == 5e8
    assert status["phase_seconds"] == expected["phase_seconds"]
    assert status["step_seconds"] == pytest.approx(0.015)  # data + forward + backward + optimizer


def test_metrics_has_every_phase_of_the_job(coordinator):
    job = submit(coordinator.url)
    report(coordinator.url, job, 5)
    report(coordinator.url, job, 10, compressor="powersgd", compressor_rank=8)
    text = httpx.get(f"{coordinator.url}/metrics").text
    for phase in ALL_PHASES:
        assert f'gradwire_step_phase_seconds_count{{job="{job["id"]}",phase="{phase}"}} 2.0' in text
    jid = job["id"]
    assert f'gradwire_train_loss{{job="{jid}"}}' in text
    assert f'gradwire_network_bandwidth_bytes_per_second{{job="{jid}"}} 5e+08' in text
    assert f'gradwire_network_latency_seconds{{job="{jid}"}} 0.0002' in text
    assert f'gradwire_samples_per_second{{job="{jid}"}} 640.0' in text
    # 5 more steps at 12345 bytes per rank per step on 2 ranks
    assert f'gradwire_comm_bytes_total{{compressor="powersgd",job="{jid}"}} 123450.0' in text
    assert f'gradwire_compressor_info{{compressor="powersgd",compressor_rank="8",job="{jid}"}} 1.0' in text
    assert 'compressor="acpsgd",compressor_rank="4",job="' + jid + '"' not in text  # the old info series is gone
    assert f'gradwire_step_seconds_count{{compressor="acpsgd",job="{jid}"}} 1.0' in text
    assert 'gradwire_jobs{state="running"} 1.0' in text


def test_compression_ratio_needs_the_model_profile(coordinator):
    job = submit(coordinator.url)
    report(coordinator.url, job, 1, profile=PROFILE)
    text = httpx.get(f"{coordinator.url}/metrics").text
    line = next(row for row in text.splitlines() if row.startswith("gradwire_compression_ratio{"))
    # acpsgd r4 on a 1024x1024 matrix (+ an uncompressed bias): 4 B x 4 x 2048 / 2 per step
    assert line == f'gradwire_compression_ratio{{compressor="acpsgd",job="{job["id"]}"}} ' + str(
        (1024 * 1024 + 1024) / (4 * 1024 + 1024))


def test_adaptive_job_gets_a_versioned_decision(coordinator):
    job = submit(coordinator.url, ADAPTIVE_SPEC)
    url = f"{coordinator.url}/v1/jobs/{job['id']}"
    first = httpx.get(f"{url}/decision", headers=worker_headers(job)).json()
    assert isinstance(first.pop("at"), float)  # the decision the store keeps: when it was made
    assert first == {"version": 0, "compressor": "acpsgd", "params": {"warmup_steps": 0, "rank": 4},
                     "reason": "job spec (adaptive)", "predicted_gain": None, "source": "config"}
    # without the model profile the policy cannot predict anything: keep
    assert report(coordinator.url, job, 5, bandwidth_bytes_per_second=40e9 / 8).json()["version"] == 0
    # with it, at 40 Gb/s, no compression is predicted faster: a switch, with reason and gain
    answer = report(coordinator.url, job, 10, bandwidth_bytes_per_second=40e9 / 8, profile=PROFILE).json()
    assert answer["version"] == 1
    decision = httpx.get(f"{url}/decision", headers=worker_headers(job)).json()
    assert decision == answer
    assert (decision["compressor"], decision["params"], decision["source"]) == ("none", {}, "policy")
    assert decision["reason"].startswith("none predicted") and "vs acpsgd-r4" in decision["reason"]
    assert 0.1 < decision["predicted_gain"] < 1
    # the profile is remembered: later reports need not repeat it
    assert report(coordinator.url, job, 15, bandwidth_bytes_per_second=40e9 / 8).json()["version"] == 1
    history = httpx.get(f"{url}/history").json()
    assert [(d["version"], d["source"]) for d in history["decisions"]] == [(0, "config"), (1, "policy")]
    assert httpx.get(url).json()["decision_version"] == 1
    assert f'gradwire_policy_switches_total{{job="{job["id"]}"}} 1.0' in httpx.get(f"{coordinator.url}/metrics").text


def test_history_is_downsampled(start_coordinator):
    server = start_coordinator(history_interval_s=3600)
    job = submit(server.url)
    for step in range(1, 6):
        report(server.url, job, step)
    report(server.url, job, 6, compressor="powersgd", compressor_rank=2)  # a change is always kept
    report(server.url, job, 40)  # so is the last step
    points = httpx.get(f"{server.url}/v1/jobs/{job['id']}/history").json()["telemetry"]
    assert [p["step"] for p in points] == [1, 6, 40]
    assert httpx.get(f"{server.url}/v1/jobs/{job['id']}").json()["step"] == 40  # the snapshot has every report


def test_cancel_a_queued_job_and_then_conflicts(coordinator):
    job = submit(coordinator.url)
    response = httpx.post(f"{coordinator.url}/v1/jobs/{job['id']}/cancel")
    assert response.status_code == 200
    assert (response.json()["state"], response.json()["reason"]) == ("cancelled", "cancelled by operator")
    again = httpx.post(f"{coordinator.url}/v1/jobs/{job['id']}/cancel")
    assert again.status_code == 409
    assert again.json() == {"detail": f"job {job['id']} is already cancelled"}
    late = report(coordinator.url, job, 3)
    assert late.status_code == 409
    assert late.json() == {"detail": f"job {job['id']} is cancelled; telemetry is no longer accepted"}
    history = httpx.get(f"{coordinator.url}/v1/jobs/{job['id']}/history").json()
    assert [(t["from_state"], t["to_state"]) for t in history["transitions"]] == [(None, "queued"), ("queued", "cancelled")]


def _read_events(url, stop_after):
    events = []
    with httpx.stream("GET", url, timeout=10) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        name = None
        for line in response.iter_lines():
            if line.startswith("event:"):
                name = line.split(":", 1)[1].strip()
            elif line.startswith("data:"):
                events.append((name, json.loads(line.split(":", 1)[1])))
                if stop_after(events):
                    break
    return events


def test_event_stream_sends_snapshot_then_live_reports_and_ends(coordinator):
    job = submit(coordinator.url, ADAPTIVE_SPEC)
    report(coordinator.url, job, 1)
    url = f"{coordinator.url}/v1/jobs/{job['id']}/events"
    import threading

    def feed():
        import time

        time.sleep(0.8)
        report(coordinator.url, job, 2, loss=0.5)
        httpx.post(f"{coordinator.url}/v1/jobs/{job['id']}/cancel")

    threading.Thread(target=feed, daemon=True).start()
    events = _read_events(url, lambda evs: evs[-1][0] == "end")
    names = [name for name, _ in events]
    assert names[0] == "snapshot"
    snapshot = events[0][1]
    assert snapshot["job"]["id"] == job["id"] and [p["step"] for p in snapshot["telemetry"]] == [1]
    telemetry_events = [data for name, data in events if name == "telemetry"]
    assert telemetry_events[-1]["point"]["step"] == 2 and telemetry_events[-1]["point"]["loss"] == 0.5
    assert ("state", "cancelled") in [(n, d.get("to_state")) for n, d in events if n == "state"]
    assert events[-1][0] == "end" and events[-1][1]["state"] == "cancelled"


def test_health(coordinator):
    health = httpx.get(f"{coordinator.url}/healthz").json()
    assert health["status"] == "ok" and health["launcher"] == "none" and health["ray"] == "disabled"


def test_openapi_docs_are_served(coordinator):
    assert httpx.get(f"{coordinator.url}/docs").status_code == 200
    paths = httpx.get(f"{coordinator.url}/openapi.json").json()["paths"]
    for path in ("/v1/jobs", "/v1/jobs/{job_id}", "/v1/jobs/{job_id}/cancel", "/v1/jobs/{job_id}/events",
                 "/v1/jobs/{job_id}/policy", "/v1/jobs/{job_id}/telemetry", "/v1/jobs/{job_id}/decision",
                 "/metrics", "/healthz"):
        assert path in paths
