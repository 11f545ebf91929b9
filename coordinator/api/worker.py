"""Worker-facing routes: rank 0 posts telemetry and reads the current decision.
Authenticated with the job's own token (``Authorization: Bearer <job_token>``)."""

from __future__ import annotations

from fastapi import APIRouter, Depends

from coordinator.api.deps import get_service, worker_job
from coordinator.service import JobService
from coordinator.store import JobRecord
from coordinator.schemas import TelemetryReport
from workers.protocol import Decision

router = APIRouter(prefix="/v1/jobs", tags=["workers"])


@router.post("/{job_id}/telemetry", response_model=Decision)
def post_telemetry(telemetry: TelemetryReport, job: JobRecord = Depends(worker_job),
                   service: JobService = Depends(get_service)) -> Decision:
    """Record a report; answers with the decision in force."""
    return service.ingest(job.id, telemetry)


@router.get("/{job_id}/decision", response_model=Decision)
def get_decision(job: JobRecord = Depends(worker_job), service: JobService = Depends(get_service)) -> Decision:
    d = service.current_decision(job.id)
    return Decision(version=d.version, compressor=d.compressor, params=d.params, reason=d.reason,
                    predicted_gain=d.predicted_gain)
