"""``/healthz``: is the web process up, and can it reach Ray and the database."""

from __future__ import annotations

import shutil
from pathlib import Path

from fastapi import APIRouter, Depends, Request

from coordinator.api.deps import get_service
from coordinator.schemas import Health
from coordinator.service import JobService

router = APIRouter(tags=["health"])

#: Less free space than this under the data dir and the next write may fail: say so now.
MIN_FREE_BYTES = 1_000_000


def _disk(data_dir: Path) -> str:
    try:
        free = shutil.disk_usage(data_dir).free
    except OSError as exc:
        return f"error: cannot inspect the data dir: {exc.strerror or exc}"
    return "ok" if free >= MIN_FREE_BYTES else f"error: only {free} bytes free under {data_dir}"


@router.get("/healthz", response_model=Health)
def healthz(request: Request, service: JobService = Depends(get_service)) -> Health:
    ray, database = service.launcher.status, service.store.health()
    if database == "ok":
        database = _disk(service.settings.data_dir)
    usable = database == "ok" and (service.settings.launcher == "none" or ray == "connected")
    return Health(status="ok" if usable else "degraded", version=request.app.version,
                  launcher=service.settings.launcher, ray=ray, database=database,
                  jobs=service.store.counts_by_state())
