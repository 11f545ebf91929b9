"""Small request helpers shared by the service tests."""

from __future__ import annotations

from typing import Any

import httpx

SMALLEST_SPEC: dict[str, Any] = {
    "name": "demo", "model": "mlp", "dataset": "synthetic", "steps": 40, "batch_size": 32,
    "workers": 2, "compression": {"mode": "fixed", "compressor": "acpsgd", "rank": 4},
}

ADAPTIVE_SPEC: dict[str, Any] = {**SMALLEST_SPEC, "name": "adaptive",
                                 "compression": {"mode": "adaptive", "compressor": "acpsgd", "rank": 4}}

#: A model profile as rank 0 sends it once: 4 MB of gradients, measured compute times.
PROFILE: dict[str, Any] = {"shapes": [[1024, 1024], [1024]], "forward_s": 0.002, "backward_s": 0.004}

ALL_PHASES = ("data", "forward", "backward", "exposed_comm", "optimizer", "compress", "communicate", "decompress")


def telemetry(step: int, **overrides: Any) -> dict[str, Any]:
    """A report as rank 0 sends it."""
    report: dict[str, Any] = {
        "step": step, "steps": 40, "loss": 2.0 / (1 + step), "samples_per_second": 640.0,
        "phase_seconds": {"data": 0.001, "forward": 0.004, "backward": 0.009, "exposed_comm": 0.003,
                          "optimizer": 0.001, "compress": 0.0005, "communicate": 0.002, "decompress": 0.0004},
        "bytes_sent_per_step": 12345.0, "bandwidth_bytes_per_second": 5e8, "latency_seconds": 2e-4,
        "compressor": "acpsgd", "compressor_rank": 4, "world_size": 2, "decision_version": 0,
    }
    report.update(overrides)
    return report


def submit(url: str, spec: dict[str, Any] | None = None, token: str | None = None) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    response = httpx.post(f"{url}/v1/jobs", json=spec or SMALLEST_SPEC, headers=headers)
    assert response.status_code == 201, response.text
    return response.json()


def worker_headers(job: dict[str, Any]) -> dict[str, str]:
    return {"Authorization": f"Bearer {job['worker_token']}"}


def report(url: str, job: dict[str, Any], step: int, **overrides: Any) -> httpx.Response:
    return httpx.post(f"{url}/v1/jobs/{job['id']}/telemetry", json=telemetry(step, **overrides),
                      headers=worker_headers(job))


TERMINAL = {"succeeded", "failed", "cancelled"}


def post(url: str, spec: dict[str, Any]) -> dict[str, Any]:
    response = httpx.post(f"{url}/v1/jobs", json=spec, timeout=10)
    assert response.status_code == 201, response.text
    return response.json()


def job_of(url: str, job_id: str) -> dict[str, Any]:
    return httpx.get(f"{url}/v1/jobs/{job_id}", timeout=10).json()


def history_of(url: str, job_id: str) -> dict[str, Any]:
    return httpx.get(f"{url}/v1/jobs/{job_id}/history", timeout=10).json()


def wait_state(url: str, job_id: str, states: set[str], timeout_s: float = 60) -> dict[str, Any]:
    from support.servers import wait_for

    return wait_for(lambda: (j := job_of(url, job_id))["state"] in states and j, timeout_s,
                    f"job {job_id} to become {states}", interval_s=0.2)
