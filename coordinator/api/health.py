"""``/healthz``: is the web process up, and can it reach Ray and the database."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request

from coordinator.api.deps import get_service
from coordinator.schemas import Health
from coordinator.service import JobService

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=Health)
def healthz(request: Request, service: JobService = Depends(get_service)) -> Health:
    return Health(status="ok", version=request.app.version, launcher=service.settings.launcher,
                  ray=service.launcher.status, jobs=service.store.counts_by_state())
