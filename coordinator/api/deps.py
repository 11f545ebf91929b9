"""Dependencies shared by the routers: the service, operator auth and worker auth."""

from __future__ import annotations

from fastapi import Depends, HTTPException, Query, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from coordinator.auth import token_matches
from coordinator.records import JobRecord
from coordinator.service import JobService
from coordinator.settings import Settings

bearer = HTTPBearer(auto_error=False, description="GRADWIRE_TOKEN (operator) or the job's worker token")

UNAUTHORIZED = "missing or wrong bearer token"


async def get_service(request: Request) -> JobService:
    return request.app.state.service


async def get_settings(request: Request) -> Settings:
    return request.app.state.settings


def _unauthorized(detail: str) -> HTTPException:
    return HTTPException(status.HTTP_401_UNAUTHORIZED, detail=detail, headers={"WWW-Authenticate": "Bearer"})


def _check_operator(settings: Settings, presented: str | None) -> None:
    expected = settings.token_value
    if expected is not None and not token_matches(presented, expected):
        raise _unauthorized(UNAUTHORIZED)


async def require_operator(
    settings: Settings = Depends(get_settings),
    credentials: HTTPAuthorizationCredentials | None = Depends(bearer),
) -> None:
    """With ``GRADWIRE_TOKEN`` set, every ``/v1`` operator route needs it, in the
    ``Authorization`` header (a URL would put it in access logs and browser histories)."""
    _check_operator(settings, credentials.credentials if credentials else None)


async def require_operator_stream(
    settings: Settings = Depends(get_settings),
    credentials: HTTPAuthorizationCredentials | None = Depends(bearer),
    access_token: str | None = Query(default=None, max_length=512,
                                     description="for EventSource, which cannot send headers"),
) -> None:
    """The event stream alone may also take the token as ``?access_token=`` (the live page's
    EventSource cannot set headers); the access log redacts it (coordinator.accesslog)."""
    _check_operator(settings, credentials.credentials if credentials else access_token)


async def worker_job(
    job_id: str,
    service: JobService = Depends(get_service),
    credentials: HTTPAuthorizationCredentials | None = Depends(bearer),
) -> JobRecord:
    """Worker routes take the job's own token only (never the operator's)."""
    return service.authorize_worker(job_id, credentials.credentials if credentials else None)
