"""A torch-free stand-in for ``workers.runner.run_job``, for testing the launcher, queueing,
cancel and restart paths on a real Ray cluster in seconds. It behaves like rank 0 on the
wire: posts Telemetry, reads the Decision, switches, retries when the coordinator is away.

Steps take ``STEP_S`` each; a job named ``fail-me`` raises after a few steps, and one named
``hog-memory`` holds another ``HOG_CHUNK_BYTES`` every step (up to ``HOG_CAP_BYTES``), in the
runner actor itself, for Ray's memory monitor to kill.
"""

from __future__ import annotations

import time
from typing import Any

import httpx

from planning.config import TrainConfig
from planning.protocol import Decision, ModelProfile, Telemetry

STEP_S = 0.05
HOG_CHUNK_BYTES = 128 * 2**20
HOG_CAP_BYTES = 4 * 2**30
#: Sent with the first report, as the real rank 0 does; at the reported 40 Gb/s the policy
#: prefers no compression for this 4 MB model, so adaptive jobs switch once.
PROFILE = ModelProfile(shapes=[[1024, 1024], [1024]], forward_s=0.002, backward_s=0.004)


def run_job(config: TrainConfig, *, storage_path: str | None = None, resume: bool = True) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {config.job_token}"}
    base = f"{config.coordinator_url}/v1/jobs/{config.job_id}"
    decision = Decision(version=0, compressor=config.compression.compressor,
                        params={"rank": config.compression.compressor_rank} if config.compression.compressor_rank else {})
    steps = config.steps or 100
    switches: list[dict[str, Any]] = []
    last_report = 0.0
    profile_sent = False
    loss = 2.0
    held: list[bytes] = []
    with httpx.Client(timeout=2.0, headers=headers) as http:
        for step in range(1, steps + 1):
            time.sleep(STEP_S)
            loss *= 0.99
            if config.name == "fail-me" and step == 5:
                raise RuntimeError("boom at step 5")
            if config.name == "hog-memory" and len(held) * HOG_CHUNK_BYTES < HOG_CAP_BYTES:
                held.append(b"\x01" * HOG_CHUNK_BYTES)  # written, so resident at once
            if time.monotonic() - last_report >= config.probing.report_interval_s or step == steps:
                last_report = time.monotonic()
                telemetry = Telemetry(
                    step=step, steps=steps, loss=loss, samples_per_second=config.data.batch_size / STEP_S,
                    phase_seconds={"data": 0.002, "forward": 0.01, "backward": 0.02, "exposed_comm": 0.01,
                                   "optimizer": 0.003, "compress": 0.001, "communicate": 0.008,
                                   "decompress": 0.001},
                    bytes_sent_per_step=1e5, bandwidth_bytes_per_second=5e9, latency_seconds=1e-4,
                    compressor=decision.compressor, compressor_rank=decision.params.get("rank"),
                    world_size=config.min_workers, decision_version=decision.version,
                    profile=None if profile_sent else PROFILE,
                )
                try:
                    posted = http.post(f"{base}/telemetry", content=telemetry.model_dump_json(),
                                       headers={"content-type": "application/json"})
                    profile_sent = profile_sent or posted.status_code == 200
                    response = http.get(f"{base}/decision")
                    if response.status_code == 200:
                        new = Decision.model_validate(response.json())
                        if new.version > decision.version:
                            switches.append({"step": step, "compressor": new.compressor, **new.params})
                            decision = new
                except httpx.HTTPError:
                    pass  # coordinator away: keep training with the last decision
    return {"steps": steps, "final_loss": loss, "samples_per_second": config.data.batch_size / STEP_S,
            "phase_seconds": {"forward": 0.01}, "compressor": decision.compressor,
            "compressor_rank": decision.params.get("rank"), "world_size": config.min_workers, "switches": switches}
