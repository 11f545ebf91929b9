"""``/v1/jobs``: submit, list, read, cancel, history and the live event stream."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Query, Request, status
from sse_starlette import EventSourceResponse

from coordinator.api.deps import get_service, get_settings, require_operator, require_operator_stream
from coordinator.schemas import JobCreated, JobHistory, JobSpec, JobState, JobStatus
from coordinator.service import JobService
from coordinator.settings import Settings
from coordinator.stream import job_events

router = APIRouter(prefix="/v1/jobs", tags=["jobs"], dependencies=[Depends(require_operator)])
#: The event stream has its own router: it alone accepts the token as a query parameter.
stream_router = APIRouter(prefix="/v1/jobs", tags=["jobs"], dependencies=[Depends(require_operator_stream)])


@router.post("", status_code=status.HTTP_201_CREATED, response_model=JobCreated)
def submit_job(spec: JobSpec, service: JobService = Depends(get_service)) -> JobCreated:
    job, token = service.submit(spec)
    return JobCreated(**job.status().model_dump(), worker_token=token)


@router.get("", response_model=list[JobStatus])
def list_jobs(state: JobState | None = None, limit: int = Query(default=200, ge=1, le=1000),
              service: JobService = Depends(get_service)) -> list[JobStatus]:
    return [job.status() for job in service.list(state, limit)]


@router.get("/{job_id}", response_model=JobStatus)
def get_job(job_id: str, service: JobService = Depends(get_service)) -> JobStatus:
    return service.get(job_id).status()


@router.post("/{job_id}/cancel", response_model=JobStatus)
def cancel_job(job_id: str, service: JobService = Depends(get_service)) -> JobStatus:
    return service.cancel(job_id).status()


@router.get("/{job_id}/history", response_model=JobHistory)
def job_history(job_id: str, service: JobService = Depends(get_service)) -> JobHistory:
    return service.history(job_id)


@stream_router.get("/{job_id}/events", response_class=EventSourceResponse,
            responses={200: {"content": {"text/event-stream": {}},
                             "description": "snapshot; then every state, decision and policy event; the latest "
                                            "telemetry report at most once per sse_poll_s (with reports/skipped "
                                            "counts); end"}})
def job_event_stream(job_id: str, request: Request, service: JobService = Depends(get_service),
                     settings: Settings = Depends(get_settings)) -> EventSourceResponse:
    service.get(job_id)  # 404 before the stream starts
    return EventSourceResponse(job_events(service, job_id, settings.sse_poll_s, request.is_disconnected),
                               ping=15)
