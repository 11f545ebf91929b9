"""``/healthz``: is the web process up, and can it reach Ray and the database."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request

from coordinator.api.deps import get_service
from coordinator.schemas import Health
from coordinator.service import JobService

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=Health)
def healthz(request: Request, service: JobService = Depends(get_service)) -> Health:
    ray, database = service.launcher.status, service.store.health()
    usable = database == "ok" and (service.settings.launcher == "none" or ray == "connected")
    return Health(status="ok" if usable else "degraded", version=request.app.version,
                  launcher=service.settings.launcher, ray=ray, database=database,
                  jobs=service.store.counts_by_state())
