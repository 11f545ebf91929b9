"""Worker-facing routes: rank 0 posts telemetry and reads the current decision.
Authenticated with the job's own token (``Authorization: Bearer <job_token>``).

These are the coordinator's hot path (every rank 0 reports every few seconds; a large
cluster sends thousands of reports a second), so they run on the event loop itself: the
work is in-memory (the store caches job rows) plus one short SQLite transaction, cheaper
than the hop to a worker thread. The answer is serialised once, without FastAPI's second
validation of the response model (the ``Decision`` was validated when it was built; it is
the one the store keeps, ``source`` and ``at`` included)."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response
from fastapi.security import HTTPAuthorizationCredentials

from coordinator.api.deps import bearer, get_service, worker_job
from coordinator.records import JobRecord
from coordinator.schemas import TelemetryReport
from coordinator.service import JobService
from planning.decision import Decision

router = APIRouter(prefix="/v1/jobs", tags=["workers"])


def _json(decision: Decision) -> Response:
    return Response(decision.model_dump_json(), media_type="application/json")


@router.post("/{job_id}/telemetry", response_model=Decision)
async def post_telemetry(job_id: str, telemetry: TelemetryReport, request: Request,
                         credentials: HTTPAuthorizationCredentials | None = Depends(bearer)) -> Response:
    """Record a report; answers with the decision in force."""
    service: JobService = request.app.state.service
    job = service.authorize_worker(job_id, credentials.credentials if credentials else None)
    return _json(service.ingest(job.id, telemetry))


@router.get("/{job_id}/decision", response_model=Decision)
async def get_decision(job: JobRecord = Depends(worker_job), service: JobService = Depends(get_service)) -> Response:
    return _json(service.current_decision(job.id))
